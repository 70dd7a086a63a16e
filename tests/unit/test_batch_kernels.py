"""`partition_runs` splits a batch of requests (values, record ids as runs, a key group each) by the owners of
their groups exactly as a loop over the requests would, keeping order and dropping empty runs; `epochs_of_runs`
counts progress per run as a loop over the requests would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.routing import partition_runs

runs = st.lists(st.tuples(st.integers(0, 1 << 20), st.lists(st.integers(0, 7), min_size=1, max_size=6)),
                max_size=30)
# Up to seven destinations: a pass of `compress` each up to COMPRESS_DESTINATIONS, one sort beyond.
owners_of = st.lists(st.sampled_from(["a", "b", None, "c", "d", "e", "f"]), min_size=8, max_size=8)


def _naive(values, rids, dests):
    out: dict = {}
    for v, r, d in zip(values, rids, dests, strict=True):
        vs, rs, cs = out.setdefault(d, ([], [], []))
        vs.append(v)
        if rs and rs[-1][0] == r and rs[-1][1] == len(vs) - 2:  # the same run continues
            rs[-1] = (r, len(vs) - 1)
            cs[-1] += 1
        else:
            rs.append((r, len(vs) - 1))
            cs.append(1)
    return {d: (vs, [r for r, _ in rs], cs) for d, (vs, rs, cs) in out.items()}


@settings(max_examples=500, deadline=None)
@given(runs, owners_of)
def test_partition_runs_is_a_loop_over_the_requests(batch, owners):
    values, rids, counts, groups, dests, per_value_rid = [], [], [], [], [], []
    for i, (rid, gs) in enumerate(batch):
        rids.append(rid)
        counts.append(len(gs))
        for j, g in enumerate(gs):
            values.append((i, j))
            groups.append(g)
            dests.append(owners[g])
            per_value_rid.append((rid, i))  # the run's position keeps equal ids of two runs apart
    parts = partition_runs(values, rids, counts, bytes(groups), owners)
    expected = _naive(values, per_value_rid, dests)
    assert set(parts) == set(expected)
    for d, (vs, rs, cs, gs) in parts.items():
        evs, ers, ecs = expected[d]
        assert vs == evs and cs == ecs and rs == [r for r, _ in ers]
        group_of_value = dict(zip(values, groups, strict=True))
        assert type(gs) is bytes and list(gs) == [group_of_value[v] for v in vs] and all(owners[g] == d for g in gs)
        assert min(cs) > 0 and sum(cs) == len(vs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 14), st.integers(1, 5), st.integers(0, 7)), max_size=40))
def test_epochs_of_runs_counts_what_a_loop_over_the_requests_counts(runs):
    from collections import Counter

    from clasp.core.tracking import EPOCH_BITS, epochs_of_runs

    out = epochs_of_runs([r for r, _, _ in runs], [c for _, c, _ in runs], [m for _, _, m in runs])
    used, made = Counter(), Counter()
    for rid, c, m in runs:
        used[rid >> EPOCH_BITS] += c
        made[rid >> EPOCH_BITS] += m
    got_used, got_made = Counter(), Counter()
    for e, u, m in out:
        got_used[e] += u
        got_made[e] += m
        assert u > 0
    assert got_used == used and got_made == made
    assert all(a[0] != b[0] for a, b in zip(out, out[1:], strict=False))  # one entry per stretch of one epoch


def test_a_throttled_period_inside_a_batch_leaves_the_operators_mean():
    """Under a CPU quota a throttled stretch (here 75 ms, stall threshold 37.5 ms) lands inside a batch once,
    however many requests the batch has: the batch is not a measure of τ̄. Before, a batch of n requests was
    taken unless it passed n stall thresholds, so a pass of 300 absorbed the whole stretch into τ̄."""
    from types import SimpleNamespace

    from clasp.runtime.batches import timed_batch

    op = SimpleNamespace(exec_time=0.0, processed=0, hist=[0] * 15, exec_total=0.0)
    stall = 0.0375
    timed_batch(op, 300e-6, 300, stall)  # 1 µs a request: counted
    assert op.exec_time == 300e-6 and op.processed == 300
    # in the histogram as 300 // TIMING_SAMPLE samples of the mean, each standing for TIMING_SAMPLE requests
    assert op.hist[0] == 296 and sum(op.hist) == 296 and abs(op.exec_total - 296e-6) < 1e-15
    timed_batch(op, 300e-6 + 0.075, 300, stall)  # the same work and a throttled stretch: the mean stands
    assert op.processed == 600 and abs(op.exec_time / op.processed - 1e-6) < 1e-12
    timed_batch(op, 900e-6, 300, stall)  # slower, but by less than a stall: counted
    assert abs(op.exec_time - 1.5e-3) < 1e-12 and op.processed == 900
    unlimited = SimpleNamespace(exec_time=0.0, processed=0, hist=[0] * 15, exec_total=0.0)
    timed_batch(unlimited, 0.2, 10, float("inf"))  # without a quota nothing is a stall
    assert unlimited.exec_time == 0.2
    never = SimpleNamespace(exec_time=0.0, processed=0, hist=[0] * 15, exec_total=0.0)
    timed_batch(never, 1e-3, 10, 0.0)  # a zero threshold keeps every timing out (tests replay budgets so)
    assert never.exec_time == 0.0 and never.processed == 10


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1 << 14), max_size=60))
def test_epoch_counts_sum_what_epochs_of_runs_gives_per_epoch(rids):
    from collections import Counter
    from itertools import repeat

    from clasp.core.tracking import epoch_counts, epochs_of_runs

    want: Counter = Counter()
    for e, used, _ in epochs_of_runs(rids, repeat(1), repeat(0)):
        want[e] += used
    assert epoch_counts(rids) == want


def _answer(v: int):
    """A collected map with every kind of result: none, an empty or a longer list, a tuple, a generator, a failure."""
    if v % 7 == 3:
        raise ValueError("three")
    return (None, [], [v], (v, -v), (x for x in [v, v, v]))[v % 5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=700), st.integers(0, 3 << 9))
def test_a_collected_pass_keeps_each_output_with_its_record_and_counts_each_request(values, offset):
    """`collect_pass` (a stateless operator whose outputs are collected and go nowhere else) on a batch a reader
    admitted across progress epochs: the outputs and their records' ids as one call per value makes them, every
    request counted done in its epoch, a failure reported."""
    from collections import Counter

    import clasp
    from clasp.core.routing import build_placement
    from clasp.core.tracking import EPOCH_BITS
    from clasp.runtime.engine import JobEngine
    from clasp.testing import IterableSource

    dag = clasp.Dag("collect")
    dag.source("n", IterableSource([0])) >> dag.operator("answer", _answer, collect=True)
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
    first = (5 << 20) + offset
    made = eng.admit_source(0, values, first)
    while eng.run_round():
        pass
    want, want_rids, failed = [], [], 0
    for i, v in enumerate(values):
        try:
            outs = list(_answer(v) or ())
        except ValueError:
            failed += 1
            continue
        want.extend(outs)
        want_rids.extend([first + i] * len(outs))
    op = eng.ops[1]
    assert op.collected == want and op.collected_rids == want_rids and op.errors == failed
    done = Counter()
    for e, ops in eng.take_progress().items():
        done[e] += ops.get(1, 0)
    for e, ops in made.items():
        done[e] += ops.get(1, 0)
    assert not +done and not -done  # every request made is counted done in its epoch
    assert set(made) == {(first + i) >> EPOCH_BITS for i in range(len(values))}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 14), st.integers(0, 3000))
def test_epoch_spans_of_a_batch_are_what_epochs_of_runs_gives_its_ids(first, n):
    from itertools import repeat

    from clasp.core.tracking import epoch_spans, epochs_of_runs

    spans = epoch_spans(range(first, first + n))
    assert [(e, b - a) for e, a, b in spans] == [(e, u) for e, u, _ in epochs_of_runs(range(first, first + n),
                                                                                      repeat(1), repeat(0))]
    assert [a for _, a, _ in spans] == [0, *(b for _, _, b in spans)][:len(spans)]  # back to back, from 0


def _two(v: int):
    """A map that drops some values, fails on some and makes one or two outputs of the rest."""
    if v % 7 == 3:
        raise ValueError("three")
    return None if v % 5 == 0 else [v] if v % 2 else [v, v + 100]


def _tally(state, v):
    return (state or 0) + 1, [[v, (state or 0) + 1]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=1200), st.integers(0, 3 << 9), st.sampled_from(["local", "keyed"]))
def test_a_map_after_a_source_runs_its_batch_as_one_call_a_value_would(values, offset, successor):
    """A source's batch reaches the stateless map behind it as a run (its values, consecutive ids from `first`,
    across progress epochs); the map's pass, to a stateless operator here (`map_local`) or to a keyed one
    (`map_keyed`), hands on each output as the child of its record and counts every request in its epoch."""
    from collections import Counter

    import clasp
    from clasp.core.routing import build_placement
    from clasp.runtime.engine import JobEngine
    from clasp.testing import IterableSource

    dag = clasp.Dag("maps")
    last = (dag.operator("last", lambda v: [v], collect=True) if successor == "local" else
            dag.operator("last", _tally, stateful=True, key=lambda v: v % 3, collect=True))
    dag.source("n", IterableSource([0])) >> dag.operator("map", _two) >> last
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
    first = (5 << 20) + offset
    made = eng.admit_source(eng.op("n").index, values, first)
    while eng.run_round():
        pass
    want, want_rids, seen = [], [], Counter()
    for i, v in enumerate(values):
        try:
            outs = _two(v) or []
        except ValueError:
            continue
        for o in outs:
            if successor == "keyed":
                seen[o % 3] += 1
                o = [o, seen[o % 3]]
            want.append(o)
            want_rids.append(first + i)
    op = eng.op("last")
    if successor == "keyed":  # each key's outputs in its records' order; the keys' runs interleave by pass
        got = sorted(zip(op.collected_rids, op.collected, strict=True), key=lambda x: (x[1][0] % 3, x[0]))
        assert [o for _, o in got] == sorted(want, key=lambda o: o[0] % 3)
        assert sorted(op.collected_rids) == sorted(want_rids)
    else:
        assert op.collected == want and op.collected_rids == want_rids
    assert eng.op("map").errors == sum(v % 7 == 3 for v in values)
    done = Counter()
    for e, ops in [*eng.take_progress().items(), *made.items()]:
        for o, k in ops.items():
            done[e, o] += k
    assert not +done and not -done  # every request made is counted done in its epoch, at every operator
