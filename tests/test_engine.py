"""The worker engine without sockets: weight exhaustion and migration hold/extract/install, step by step."""

from __future__ import annotations

import clasp
from clasp.protocol import ROOT_WEIGHT
from clasp.routing import build_placement
from workers.engine import HOLD, JobEngine


def fanout_dag() -> clasp.Dag:
    dag = clasp.Dag("fan")
    a = dag.operator("a", lambda v: [v, v + 1, v + 2])
    b = dag.operator("b", lambda s, v: ((s or 0) + v, None), stateful=True, key=lambda v: v)
    a >> b
    return dag


def drain(eng: JobEngine) -> None:
    while eng.run_round():
        pass


def test_exhausted_weight_parks_children_until_the_planner_extends():
    spec = fanout_dag().to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"a": {0: 1}, "b": {0: 1}}, 10))
    eng.enqueue_rows([(0, 10, None, 7, 2)])  # weight 2 cannot split three ways
    drain(eng)
    returns, extends = eng.take_returns()
    assert returns == {7: 2} and len(extends) == 1 and extends[0][:2] == [7, ROOT_WEIGHT]
    assert eng.ops[1].processed == 0  # nothing ran before the planner answered
    eng.release_parked(extends[0][2])
    drain(eng)
    returns, _ = eng.take_returns()
    assert returns == {7: ROOT_WEIGHT}  # the children returned exactly the extension
    assert eng.ops[1].state == {10: 10, 11: 11, 12: 12}


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
    loser.enqueue_rows([(1, key, key, 1, 5)])
    drain(loser)  # the old owner ran one request for `key`; a second one waits in its queue
    loser.enqueue_rows([(1, key, key, 2, 5)])
    g = loser.ops[1].group_of(key)
    gainer.begin_migration(new, {1: set(moved)})
    gainer.receive(1, [[1, key, key, 3, 5]])  # a new-epoch request overtakes the state: it is held
    drain(gainer)
    assert gainer.ops[1].processed == 0 and gainer.held[1][g]
    loser.begin_migration(new, {})
    out = list(loser.extract())
    units = [u for d, u, _ in out if u is not None and d == "w1"]
    unit = next(u for u in units if u[1] == g)
    assert unit[2] == {key: key} and [r[3] for r in unit[3]] == [2]  # state and the queued request move
    assert key not in loser.ops[1].state
    gainer.install(units, [])
    gainer.release_groups({1: moved})
    assert [r[3] for r in gainer.ops[1].queue] == [2, 3]  # the old owner's request runs first
    drain(gainer)
    assert gainer.ops[1].state[key] == 3 * key
    assert not gainer.held and all(HOLD not in (r[3] or []) for r in gainer.ops[0].routes)


def spin(us: float):
    """An operator that computes for `us` µs of CPU time."""
    from time import thread_time

    def fn(v):
        end = thread_time() + us * 1e-6
        while thread_time() < end:
            pass
        return None
    return fn


def sleepy(v):
    import time

    time.sleep(0.0005)  # blocks the executor without using the CPU


def one_op_engine(fn, cpu: bool) -> JobEngine:
    from workers.engine import exec_clock

    dag = clasp.Dag("timed")
    dag.operator("a", fn)
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"a": {0: 1}}, 10))
    eng.clock = exec_clock(cpu)
    return eng


def test_both_execution_clocks_measure_cpu_work_and_only_the_wall_clock_counts_blocking():
    for cpu in (False, True):
        eng = one_op_engine(spin(50), cpu)
        eng.enqueue_rows([(0, i, None, i, 1) for i in range(400)])
        drain(eng)
        tau_us = eng.ops[0].exec_time / eng.ops[0].processed * 1e6
        assert 45 <= tau_us <= 80, (cpu, tau_us)  # ≥ the 50 µs it spun, up to scheduling noise
        eng.fold_histograms()
        assert sum(eng.ops[0].hist) == 400  # every request counted once however few were timed
    blocked = {}
    for cpu in (False, True):
        eng = one_op_engine(sleepy, cpu)
        eng.enqueue_rows([(0, i, None, i, 1) for i in range(40)])
        drain(eng)
        blocked[cpu] = eng.ops[0].exec_time / eng.ops[0].processed * 1e6
    assert blocked[False] >= 500 and blocked[True] < 100


def test_timing_period_keeps_the_clock_cheap_relative_to_the_request():
    from workers.engine import MAX_TIMING_SHIFT, exec_clock

    for cpu in (False, True):
        clock = exec_clock(cpu)
        masks = [clock.timing_mask(c) for c in (0.5, 2, 10, 100, 10_000)]
        assert masks == sorted(masks, reverse=True) and masks[-1] == 0
        assert all(m + 1 <= 1 << MAX_TIMING_SHIFT and (m + 1) & m == 0 for m in masks)  # powers of two
        # the CPU clock costs more per read, so it samples at least as sparsely
    assert exec_clock(True).timing_mask(2) >= exec_clock(False).timing_mask(2)
