"""The worker engine without sockets: progress counts and migration hold/extract/install, step by step."""

from __future__ import annotations

import msgpack

import clasp
from clasp.core import protocol
from clasp.core.routing import build_placement
from clasp.core.tracking import EPOCH_SIZE, Tracker
from clasp.runtime.engine import JobEngine
from clasp.runtime.outbox import HOLD


def fanout_dag() -> clasp.Dag:
    dag = clasp.Dag("fan")
    a = dag.operator("a", lambda v: [v, v + 1, v + 2])
    b = dag.operator("b", lambda s, v: ((s or 0) + v, None), stateful=True, key=lambda v: v)
    a >> b
    return dag


def drain(eng: JobEngine) -> None:
    while eng.run_round():
        pass


def nonzero(progress: dict) -> dict:
    """Progress counts without their zero entries (an engine may keep an operator that came back to 0)."""
    return {e: {op: k for op, k in d.items() if k} for e, d in progress.items() if any(d.values())}


def test_a_deep_fan_out_needs_nothing_from_the_planner():
    """Three levels of 30-way fan-out from one record: 27,000 requests at the last operator run at once, with
    no message to the planner but the one progress report, which completes the record's epoch."""
    dag = clasp.Dag("deep")
    a = dag.operator("a", lambda v: [v * 30 + i for i in range(30)])
    b = dag.operator("b", lambda v: [v * 30 + i for i in range(30)])
    c = dag.operator("c", lambda v: [v * 30 + i for i in range(30)])
    d = dag.operator("d", lambda s, v: ((s or 0) + 1, None), stateful=True, key=lambda v: v % 1000)
    a >> b >> c >> d
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {n: {0: 1} for n in "abcd"}, 10))
    t = Tracker()
    rid = t.admit(1, now=0.0)
    t.dispatched(rid, 1, {0: {0: 1}}, now=0.0)
    eng.enqueue_rows([(0, 1, None, rid)])
    drain(eng)
    assert eng.idle() and not eng.outbox.pending and eng.ops[3].processed == 30 ** 3
    assert sum(eng.ops[3].state_dict().values()) == 30 ** 3
    progress = eng.take_progress()
    assert nonzero(progress) == {0: {0: -1}}  # a, b, c and d each made and finished the same number
    assert t.progress(progress, now=1.0) == 1 and t.outstanding == 0 and not t.epochs
    assert eng.take_progress() == {}


def test_moved_group_requests_wait_for_their_state_and_keep_their_order():
    spec = fanout_dag().to_spec()
    old = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {0: 1}}, 10)
    new = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {0: 1, 1: 1}}, 10, epoch=1, previous=old)
    moved = [g for g, (x, y) in enumerate(zip(old.operators["b"].key_groups, new.operators["b"].key_groups,
                                              strict=True)) if x != y]
    assert moved and all(new.operators["b"].key_groups[g] == "w1" for g in moved)
    loser = JobEngine(1, spec, "w0", old)
    gainer = JobEngine(1, spec, "w1", old)
    key = next(k for k in range(1000) if loser.ops[1].group_of(k) in moved)
    loser.enqueue_rows([(1, key, key, 1)])
    drain(loser)  # the old owner ran one request for `key`; a second one waits in its queue
    loser.enqueue_rows([(1, key, key, 2)])
    g = loser.ops[1].group_of(key)
    gainer.begin_migration(new, {1: set(moved)})
    gainer.receive(1, [[1, key, key, 3]])  # a new-epoch request overtakes the state: it is held
    drain(gainer)
    assert gainer.ops[1].processed == 0 and gainer.handover.held[1][g]
    loser.begin_migration(new, {})
    out = list(loser.handover.extract(loser.placement))
    units = [u for d, u, _ in out if u is not None and d == "w1"]
    unit = next(u for u in units if u[1] == g)
    # the group's state as one blob, and the queued request, move
    assert msgpack.unpackb(unit[2], strict_map_key=False) == {key: key} and unit[3] == 1
    assert [r[3] for r in unit[4]] == [2]
    assert key not in loser.ops[1].state_dict()
    gainer.install(units, [])
    assert g in gainer.ops[1].cold and not gainer.ops[1].groups[g]  # decoded when first used
    assert gainer.counters()["operators"]["b"]["keys"] == 1
    gainer.release_groups({1: moved})
    assert [r[3] for r in gainer.ops[1].queue] == [2, 3]  # the old owner's request runs first
    drain(gainer)
    assert not gainer.ops[1].cold
    assert gainer.ops[1].get(key) == 3 * key
    assert not gainer.handover.held and all(HOLD not in (r[3] or []) for r in gainer.ops[0].routes)


def test_timed_requests_longer_than_the_stall_threshold_are_not_execution_time():
    """Under a CPU quota a throttled stretch lands inside a running request: the engine drops timed
    requests longer than `stall`, so τ̄ is the operator's own time, and every request is still counted."""
    import time

    slow = {"n": 0}

    def op(v):
        slow["n"] += 1
        if slow["n"] % 17 == 1:  # a stall, now and then, inside a timed request
            time.sleep(0.004)
        return None

    dag = clasp.Dag("stalls")
    dag.operator("a", op)
    spec = dag.to_spec()
    times = {}
    for stall in (float("inf"), 0.002):
        slow["n"] = 0
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"a": {0: 1}}, 10))
        eng.executor.stall = stall
        eng.enqueue_rows([(0, i, None, i) for i in range(2000)])
        drain(eng)
        assert eng.ops[0].processed == 2000
        times[stall] = eng.ops[0].exec_time / eng.ops[0].processed
    assert times[float("inf")] > 50e-6  # the sleeps counted
    assert times[0.002] < 20e-6  # dropped: what is left is the operator's microseconds


def test_remote_batches_travel_in_columns_and_count_exactly():
    """Word Count split over two engines: every remote batch goes through its `cols` groups (the keyed fast
    path's columns), msgpack and receive_columns (steady state), and a held key group takes the row-by-row
    path; counts are exact."""
    import collections

    from clasp.apps import wc

    spec = wc.build_dag().to_spec()
    placement = build_placement(spec, ["w0", "w1"], {"split": {0: 1, 1: 1}, "count": {0: 1, 1: 1}}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ("w0", "w1")}
    lines = wc.generate(300, 3)
    for i, line in enumerate(lines):
        engines[("w0", "w1")[i % 2]].enqueue_rows([(0, line, None, i)])
    frames = 0
    while any(not e.idle() for e in engines.values()):
        for eng in engines.values():
            drain(eng)
            for dest, (groups, _n) in eng.take_batches().items():
                mtype, body = protocol.decode(protocol.encode_columns(1, eng.epoch, groups))
                protocol.open_columns(body[2], protocol.string_table())
                protocol.check_columns(body[2], len(spec.operators))
                engines[dest].receive_columns(body[1], body[2])
                frames += 1
    want = collections.Counter(w for line in lines for w in wc.split(line))
    got = {**engines["w0"].ops[1].state_dict(), **engines["w1"].ops[1].state_dict()}
    assert frames > 0 and got == dict(want)
    progress = collections.Counter()
    for eng in engines.values():
        for op, k in eng.take_progress()[0].items():
            progress[op] += k
    # every line finished at `split`; `count` finished what `split` made, on whichever worker
    assert +progress == {} and -progress == {0: len(lines)}

    held = JobEngine(1, spec, "w1", placement)
    g = held.ops[1].group_of("held")
    held.handover.held = {1: {g: []}}
    held.receive_columns(placement.epoch, protocol.columns([(1, "held", "held", 5), (1, "x", "x", 5)]))
    assert [r[1] for r in held.handover.held[1][g]] == ["held"] + (["x"] if held.ops[1].group_of("x") == g else [])


def test_a_successor_on_one_other_worker_takes_requests_straight_into_its_batch():
    dag = clasp.Dag("chain")
    a = dag.operator("a", lambda v: v + 1)
    b = dag.operator("b", lambda v: [v, v * 10])
    c = dag.operator("c", lambda v: None)
    a >> b >> c
    spec = dag.to_spec()
    placement = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {1: 1}, "c": {0: 1}}, 10)
    w0, w1 = JobEngine(1, spec, "w0", placement), JobEngine(1, spec, "w1", placement)
    w0.enqueue_rows([(0, v, None, v * 20) for v in range(40)])  # rids over two epochs
    drain(w0)
    groups, n = w0.take_batches()["w1"]
    rows = protocol.expand_columns(groups)
    assert n == 40 and rows == [(1, v + 1, None, v * 20) for v in range(40)] and w0.outbox.remote_requests == 40
    assert w0.ops[0].edge_counts == [40] and w0.outbox.local_requests == 0
    w1.receive_columns(placement.epoch, protocol.columns(rows))
    drain(w1)  # b's two outputs per request go back the same way
    back = protocol.expand_columns(w1.take_batches()["w0"][0])
    assert back == [(2, x, None, v * 20) for v in range(40) for x in (v + 1, (v + 1) * 10)]
    n0 = sum(1 for v in range(40) if v * 20 < EPOCH_SIZE)
    assert 0 < n0 < 40
    assert nonzero(w1.take_progress()) == {0: {1: -n0, 2: 2 * n0}, 1: {1: n0 - 40, 2: 2 * (40 - n0)}}
    assert not w0.outbox.pending and not w1.outbox.pending  # no empty batch is left behind for a flush
    w0.receive_columns(placement.epoch, protocol.columns(back))
    drain(w0)
    n1 = 40 - n0
    assert nonzero(w0.take_progress()) == {0: {0: -n0, 1: n0, 2: -2 * n0}, 1: {0: -n1, 1: n1, 2: -2 * n1}}


def test_a_migrated_group_stays_serialized_until_used_or_idle_time_decodes_it():
    spec = fanout_dag().to_spec()
    old = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {0: 1}}, 10, epoch=0)
    new = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {1: 1}}, 10, epoch=1, previous=old)
    loser, gainer = JobEngine(1, spec, "w0", old), JobEngine(1, spec, "w1", old)
    loser.enqueue_rows([(1, k, k, k) for k in range(300)])
    drain(loser)
    loser.begin_migration(new, {})
    units = [u for _, u, _ in loser.handover.extract(loser.placement) if u is not None]
    assert sum(u[3] for u in units) == 300 and not loser.ops[1].state_dict()
    gainer.begin_migration(new, {1: {u[1] for u in units}})
    gainer.install(units, [])
    gainer.release_groups({1: [u[1] for u in units]})
    b = gainer.ops[1]
    assert len(b.cold) == len(units) and b.keys() == 300 and not any(b.groups)
    gainer.enqueue_rows([(1, 7, 7, 1000)])  # a request decodes its own group only
    drain(gainer)
    assert b.get(7) == 14 and len(b.cold) == len(units) - 1
    # a group moving on before its first use leaves as the blob it came in
    g = next(iter(b.cold))
    blob = b.cold[g][0]
    assert b.take_group(g, [])[0] is blob
    while gainer.warm_one():
        pass
    assert not b.cold and b.state_dict() == {k: (14 if k == 7 else k) for k in range(300) if b.group_of(k) != g}


def test_an_operator_whose_every_timing_stalls_gets_a_cost_and_rounds_stay_short():
    """Under a tight quota an operator can be slow enough that every timed request looks stalled: it must
    still get a cost (else it counts as free, a scheduling round runs its whole queue, and the event loop,
    heartbeats included, stops for as long: a starved worker was declared dead that way), and a round must
    end by the clock whatever the estimates say."""
    import time

    def slow(v):
        time.sleep(0.001)  # wall time that is not the operator's own, as a throttled stretch would be
        return None

    def slow_count(s, v):
        time.sleep(0.001)
        return (s or 0) + 1, None

    def slow_batch(vs):
        time.sleep(0.001 * len(vs))
        return []

    for name, kw in (("stateless", {"fn": slow}), ("stateful", {"fn": slow_count, "stateful": True,
                                                                 "key": lambda v: v % 7}),
                     ("batch", {"fn": slow_batch, "batch": True})):
        dag = clasp.Dag(f"stalled-{name}")
        dag.operator("a", **kw)
        spec = dag.to_spec()
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"a": {0: 1}}, 10))
        eng.executor.stall = 0.0005
        eng.enqueue_rows([(0, i, None if name != "stateful" else i % 7, i) for i in range(2000)])
        ran = []
        for _ in range(3):
            t0 = time.perf_counter()
            ran.append(eng.run_round())
            assert time.perf_counter() - t0 < 0.5, (name, ran)
        op = eng.ops[0]
        assert op.exec_time > 0, name
        assert sum(ran) < 300 and ran[-1] <= 32, (name, ran)  # the old estimate ran all 2,000 in round one
        drain(eng)
        assert op.processed == 2000, name


def test_a_busy_worker_reports_once_its_push_roots_finished_enough():
    """`roots_finished` counts the push roots' finished requests gathered since the last report (their
    successors' do not count); a busy worker reports at the interval only once they reach
    PROGRESS_MIN_ROOTS, or when overdue, and always where it runs no push root."""
    from clasp.apps import wc
    from clasp.core.scheduler import PROGRESS_MIN_ROOTS, progress_due

    spec = wc.build_dag().to_spec()
    both = build_placement(spec, ["w0"], {"split": {0: 1}, "count": {0: 1}}, 10)
    eng = JobEngine(1, spec, "w0", both)
    assert eng.roots_finished() == 0
    lines = wc.generate(PROGRESS_MIN_ROOTS - 1, 3)
    eng.enqueue_rows([(0, line, None, i) for i, line in enumerate(lines)])
    drain(eng)
    assert eng.roots_finished() == len(lines) and eng.ops[1].processed > len(lines)  # `count` ran more
    assert not progress_due(False, eng.roots_finished())
    assert progress_due(True, eng.roots_finished())
    eng.enqueue_rows([(0, "one more", None, len(lines))])
    drain(eng)
    assert progress_due(False, eng.roots_finished())
    eng.take_progress()
    assert eng.roots_finished() == 0  # counted from the last report

    counts_only = build_placement(spec, ["w0", "w1"], {"split": {1: 1}, "count": {0: 1}}, 10)
    assert JobEngine(1, spec, "w0", counts_only).roots_finished() is None
    assert progress_due(False, None)
