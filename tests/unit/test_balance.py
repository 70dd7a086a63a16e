"""Load-aware dispatch (`scheduler.Loads`): a stateless source's runs go to the worker with the fewest of its
requests outstanding per unit of share; every record is still sent once, in order within its run, with exact
counts per epoch."""

from __future__ import annotations

import collections
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core import protocol, scheduler
from clasp.core.job_machine import DispatchReady, Progress, Push
from clasp.core.protocol import SEGMENT_RECORDS, Segments
from clasp.core.routing import OperatorPlacement, Placement, build_placement, route_to, spread_placement
from clasp.core.scheduler import Dispatch, Loads
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS
from clasp.runtime.engine import JobEngine
from tests.unit.test_job_machine import new_job

WORKERS = ["w0", "w1", "w2"]


def one_source(shares: dict[str, float]):
    dag = clasp.Dag("b")
    dag.operator("a", lambda v: v)
    spec = dag.to_spec()
    placement = Placement({"a": OperatorPlacement(shares, {w: 1 for w in shares})}, 1, sorted(shares))
    return spec, [route_to(spec, placement, s, None) for s in spec.sources]


def sent_by(d: Dispatch) -> dict[str, list[tuple[int, list]]]:
    """destination -> its runs as (first rid, values), segments decoded."""
    return {w: [(first, v if type(v) is list else protocol.segment_records(v)) for _, first, v in runs]
            for w, runs in d.runs.items()}


shares_st = st.dictionaries(st.sampled_from(WORKERS), st.floats(0.05, 1.0), min_size=1, max_size=3)


@given(shares=shares_st, sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
       rooms=st.lists(st.integers(1, 6000), min_size=1, max_size=5), segmented=st.booleans(),
       start=st.dictionaries(st.sampled_from(WORKERS), st.integers(0, 20000)),
       finished=st.lists(st.tuples(st.sampled_from(WORKERS), st.integers(0, 3000)), max_size=6))
@settings(max_examples=120, deadline=None)
def test_every_record_is_sent_once_in_order_with_exact_counts_whatever_the_loads(shares, sizes, rooms, segmented,
                                                                                 start, finished):
    spec, routes = one_source(shares)
    loads = Loads(spec.sources)
    loads.out.update(start)
    records = [[f"c{c}r{i}" for i in range(n)] for c, n in enumerate(sizes)]
    q = deque([[c << CHUNK_BITS, Segments(protocol.pack_segments(rs)) if segmented else rs, 0]
               for c, rs in enumerate(records)])
    value = {(c << CHUNK_BITS) + i: v for c, rs in enumerate(records) for i, v in enumerate(rs)}
    seen, step = [], 0
    while q:
        before = dict(loads.out)
        d = scheduler.dispatch(q, spec, routes, rooms[step % len(rooms)], loads)
        got = collections.Counter()
        rids = []
        for w, runs in sent_by(d).items():
            assert w in shares  # only the operator's workers
            for first, vals in runs:
                assert vals == [value[first + i] for i in range(len(vals))]  # in order within a run
                assert len(vals) <= SEGMENT_RECORDS
                rids += range(first, first + len(vals))
                got[w] += len(vals)
        rids.sort()
        assert rids == list(range(d.first, d.first + d.count))
        assert d.counts == {e: {0: k} for e, k in collections.Counter(r >> EPOCH_BITS for r in rids).items()}
        assert all(loads.out.get(w, 0) == before.get(w, 0) + got[w] for w in shares)  # counted as sent
        w, k = finished[step % len(finished)] if finished else ("w0", 0)
        loads.report(w.encode(), {0: {0: -k}})
        seen += rids
        step += 1
    assert seen == [(c << CHUNK_BITS) + i for c, n in enumerate(sizes) for i in range(n)]
    assert all(v >= 0 for v in loads.out.values())


@given(shares=shares_st, loads_now=st.dictionaries(st.sampled_from(WORKERS), st.integers(0, 50000)))
@settings(max_examples=100, deadline=None)
def test_the_next_segment_goes_to_the_worker_with_the_least_outstanding_per_share(shares, loads_now):
    spec, routes = one_source(shares)
    loads = Loads(spec.sources)
    loads.out.update(loads_now)
    d = scheduler.route_records(spec, routes, 0, Segments(protocol.pack_segments(list(range(10)))), loads)
    (dest,) = d.runs
    sigma = routes[0].sigma
    low = min(loads_now.get(w, 0) / sigma[w] for w in sigma)
    assert loads_now.get(dest, 0) / sigma[dest] == low
    assert dest == next(w for w in sigma if loads_now.get(w, 0) / sigma[w] == low)  # the first among equals


@given(shares=shares_st, n=st.integers(1, 60), segmented=st.booleans())
@settings(max_examples=100, deadline=None)
def test_with_equal_loads_the_runs_follow_the_shares(shares, n, segmented):
    """No report in between: each worker's records per unit of share stay within one run of the others'."""
    spec, routes = one_source(shares)
    loads = Loads(spec.sources)
    records = list(range(n * SEGMENT_RECORDS))
    part = Segments(protocol.pack_segments(records)) if segmented else records
    d = scheduler.route_records(spec, routes, 0, part, loads)
    sigma = routes[0].sigma
    per = {w: sum(len(v) for _, v in sent_by(d).get(w, [])) / sigma[w] for w in sigma}
    assert max(per.values()) - min(per.values()) <= SEGMENT_RECORDS / min(sigma.values()) + 1e-6
    assert sum(len(v) for runs in sent_by(d).values() for _, v in runs) == len(records)


def test_a_slow_worker_gets_less_and_a_worker_that_left_gets_nothing():
    spec, routes = one_source({"w0": 0.5, "w1": 0.5})
    loads = Loads(spec.sources)
    q = deque([[0, Segments(protocol.pack_segments(list(range(40000)))), 0]])
    got = collections.Counter()
    while q:
        d = scheduler.dispatch(q, spec, routes, 5000, loads)
        for w, runs in sent_by(d).items():
            got[w] += sum(len(v) for _, v in runs)
        # w1 finishes everything it was sent between dispatches, w0 a third of its share of a dispatch
        loads.report(b"w1", {0: {0: -loads.out.get("w1", 0)}})
        loads.report(b"w0", {0: {0: -min(loads.out.get("w0", 0), 800)}})
    assert got["w0"] + got["w1"] == 40000 and got["w1"] >= 3 * got["w0"]
    # w2 left the placement: idle as it is, the route never names it
    placement = spread_placement(spec, ["w0", "w1"], 4)
    loads.out.update({"w0": 10**6, "w1": 10**6, "w2": 0})
    d = scheduler.route_records(spec, [route_to(spec, placement, 0, None)], 0, list(range(3000)), loads)
    assert set(d.runs) <= {"w0", "w1"} and sum(len(r[2]) for rs in d.runs.values() for r in rs) == 3000


def test_a_report_lowers_its_senders_load_only_for_source_operators_and_never_below_zero():
    loads = Loads([0, 2])
    loads.sent("w0", 700)
    loads.sent("w1", 100)
    loads.report(b"w0", {3: {0: -200, 1: 5000, 2: -100}, 4: {0: -50}})  # operator 1 is not a source
    loads.report(b"w1", {3: {1: -7}})
    loads.report(b"w1", {5: {2: -400}})  # a request handed over in a migration: finished where not sent
    assert loads.out == {"w0": 350, "w1": 0}


def test_the_job_machine_counts_dispatches_and_reports_and_forgets_loads_when_nothing_is_in_flight():
    job = new_job(window=100_000, batch=100_000)
    job.loads = Loads(job.spec.sources)
    sent: list[Dispatch] = []
    seg = protocol.SEGMENT_RECORDS
    for req, n in ((1, 2 * seg), (2, 12 * seg)):
        job.machine.handle(Push(b"c", req, Segments(protocol.pack_segments(list(range(n)))), b"x" * 10, 0.0, 10))
        sent += [s for s in job.machine.handle(DispatchReady(0.1)) if type(s) is Dispatch]
        if req == 1:
            assert job.loads.out == {"w0": seg, "w1": seg}
            job.loads.out["w1"] = 5 * seg  # w1 is behind: w0 gets segments until it is as far behind
    per = {w: sum(protocol.array_count(v) for _, _, v in runs) for w, runs in sent[1].runs.items()}
    assert per == {"w0": 8 * seg, "w1": 4 * seg} and job.loads.out == {"w0": 9 * seg, "w1": 9 * seg}
    assert [r[1] & 0xFFFFF for r in sent[1].runs["w0"][:5]] == [0, seg, 2 * seg, 3 * seg, 4 * seg]
    job.machine.handle(Progress(b"w0", {0: {0: -seg}}, 0.2, 300))
    assert job.loads.out == {"w0": 8 * seg, "w1": 9 * seg} and job.loads.behind == {"w0": 300}
    done = collections.Counter()
    for d in sent:
        for _, first, v in (r for runs in d.runs.values() for r in runs):
            for i in range(protocol.array_count(v)):
                done[(first + i) >> EPOCH_BITS] -= 1
    done[0] += seg  # reported above
    for e, k in done.items():
        job.machine.handle(Progress(b"w1", {e: {0: k}}, 0.3))
    assert job.tracker.outstanding == 0 and job.loads.out == {"w0": 8 * seg, "w1": 0}  # w1 reported w0's too
    job.machine.handle(Push(b"c", 3, [1, 2], b"xx", 0.4, 2))
    job.machine.handle(DispatchReady(0.5))  # nothing was in flight: the old counts went first
    assert sum(job.loads.out.values()) == 2 and job.loads.behind == {}


def test_a_worker_whose_keyed_stage_is_behind_gets_less_though_its_root_keeps_up():
    """The root's own outstanding requests are equal; w0's report says its queue past the root holds six
    segments of root requests' worth of work: the next runs go to w1 until w1 is as far behind."""
    spec, routes = one_source({"w0": 0.5, "w1": 0.5})
    seg = protocol.SEGMENT_RECORDS
    loads = Loads(spec.sources)
    loads.sent("w0", 1000)
    loads.sent("w1", 1000)
    loads.report(b"w0", {0: {0: -1000}}, behind=6 * seg)
    loads.report(b"w1", {0: {0: -1000}}, behind=0)
    d = scheduler.route_records(spec, routes, 0, Segments(protocol.pack_segments(list(range(10 * seg)))), loads)
    per = {w: sum(protocol.array_count(v) for _, _, v in runs) for w, runs in d.runs.items()}
    assert per == {"w1": 8 * seg, "w0": 2 * seg}  # w1 to six segments alone, then they alternate from w0
    loads.report(b"w0", {}, behind=0)  # caught up: its next report says so
    assert loads.behind == {"w0": 0, "w1": 0} and loads.pick(routes[0].sigma) == "w0"
    loads.clear()
    assert loads.out == loads.behind == {}


def test_the_engine_reports_its_work_past_the_roots_in_root_requests():
    dag = clasp.Dag("wc")
    split = dag.operator("split", lambda line: line.split())
    count = dag.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True, key=lambda w: w)
    split >> count
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"split": {0: 1}, "count": {0: 1}}, 10))
    assert eng.behind() == 0  # no timings yet
    split_op, count_op = eng.ops
    split_op.processed, split_op.exec_time = 100, 100 * 4e-6  # 4 µs a line
    count_op.processed, count_op.exec_time = 1000, 1000 * 0.5e-6  # 0.5 µs a word
    assert eng.behind() == 0  # nothing queued
    eng.receive_runs(eng.epoch, [[0, 0, ["a b c"] * 10]])
    assert eng.behind() == 0  # the root's own queue is counted by the planner, not here
    count_op.queue.extend((1, "w", "w", i) for i in range(800))
    assert eng.behind() == 100  # 800 words × 0.5 µs = 100 lines × 4 µs
