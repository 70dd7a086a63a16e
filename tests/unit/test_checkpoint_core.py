"""The checkpoint and recovery protocol as pure state (clasp.core.checkpoint): no processes."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.checkpoint import (
    SCHEDULE_LOOK,
    SCHEDULE_TICK,
    CheckpointError,
    Coordinator,
    barrier_holds,
    boundary_reached,
    dispatch_boundary,
    groups_to_restore,
    look_delay,
    recovery_placement,
    split_collected,
)
from clasp.core.routing import NUM_KEY_GROUPS, build_placement
from clasp.core.scheduler import take
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, Tracker, add_range


def _spec():
    dag = clasp.Dag("t")
    a = dag.operator("split", lambda x: x)
    b = dag.operator("count", lambda s, x: ((s or 0) + 1, None), stateful=True, key=lambda x: x)
    a >> b
    return dag.to_spec()


def test_coordinator_completes_on_every_ack_and_keeps_two():
    c = Coordinator()
    p = c.begin(3, ["w0", "w1"], now=10.0)
    assert p.id == 1
    with pytest.raises(CheckpointError):
        c.begin(4, ["w0"], now=10.0)
    assert not c.ack(1, "w0", {"count": [0, 1]}, 100, {"out": b"a"})
    assert not c.ack(2, "w1", {"count": [2]}, 50)  # another checkpoint's ack: ignored
    assert not c.ack(1, "w9", {"count": [2]}, 50)  # not a worker of it
    assert c.ack(1, "w1", {"count": [2]}, 50, {"out": b"b"})
    done, collected = c.finish(now=10.5)
    assert done.groups == {"count": [0, 1, 2]} and done.bytes == 150 and done.duration_s == 0.5
    assert collected == {"out": [b"a", b"b"]}  # the workers' packed outputs, in order, as they came
    assert c.counts["completed"] == 0 and c.restore_target() is None  # not before its manifest is written
    assert c.committed(done) == [] and c.counts["completed"] == 1 and c.restore_target() is done
    for k in (2, 3):
        c.begin(3 + k, ["w0"], now=11.0)
        c.ack(k, "w0", {}, 1)
        dropped = c.committed(c.finish(now=11.0)[0])
    assert dropped == [1] and [x.id for x in c.complete] == [2, 3]
    assert c.restore_target().id == 3 and c.log_floor() == 5
    c.discard(3)
    assert c.restore_target().id == 2
    c.begin(9, ["w0"], now=12.0)
    assert c.fail("w0 died") == 4 and c.pending is None and c.counts["failed"] == 1


def test_a_group_written_twice_fails_the_checkpoint():
    c = Coordinator()
    c.begin(1, ["w0", "w1"], 0.0)
    c.ack(1, "w0", {"count": [5]}, 1)
    c.ack(1, "w1", {"count": [5]}, 1)
    with pytest.raises(CheckpointError):
        c.finish(1.0)


def test_boundaries_fall_on_chunks():
    t = Tracker()
    assert dispatch_boundary([], t) == 0
    b0 = t.admit(10, 0.0)
    b1 = t.admit(10, 0.0)
    assert dispatch_boundary([[b0, list(range(10)), 0]], t) == 0
    assert dispatch_boundary([[b0, list(range(10)), 4]], t) is None
    assert dispatch_boundary([[b1, list(range(10)), 0]], t) == 1
    assert boundary_reached(t, 0) and not boundary_reached(t, 1)
    t.dispatched(b0, 10, {b0 >> EPOCH_BITS: {0: 10}}, 1.0)
    assert not boundary_reached(t, 1)
    t.progress({b0 >> EPOCH_BITS: {0: -10}}, 1.0)
    assert boundary_reached(t, 1) and not boundary_reached(t, 2)


def dispatch_all(t: Tracker, queue: deque, pieces, now: float) -> dict[int, int]:
    """Dispatch the queue to one source operator (0) in pieces of the sizes `pieces` draws (the planner's
    `take`); returns the requests sent per epoch."""
    sent: dict[int, int] = {}
    while queue:
        first, part = take(queue, pieces())
        counts: dict = {}
        add_range(counts, 0, first, len(part))
        t.dispatched(first, len(part), counts, now)
        for e, c in counts.items():
            sent[e] = sent.get(e, 0) + c[0]
    return sent


@given(st.lists(st.integers(1, 1300), min_size=1, max_size=5), st.data())
@settings(max_examples=200, deadline=None)
def test_rollback_then_replay_completes_every_record_once(sizes, data):
    """Chunks of up to three epochs, dispatched in random pieces; some epochs complete, some partly reported,
    then everything below a checkpoint's boundary completes and the job rolls back to it: the reopened epochs
    start from zero (what their old era reported is gone) and the replay completes each record once."""
    t = Tracker()
    bases = [t.admit(n, float(i)) for i, n in enumerate(sizes)]
    log = {b >> CHUNK_BITS: (float(i), n) for i, (b, n) in enumerate(zip(bases, sizes, strict=True))}
    pieces = lambda: data.draw(st.integers(1, 700))  # noqa: E731
    boundary = data.draw(st.integers(0, len(sizes)))
    upto = data.draw(st.integers(boundary, len(sizes)))  # the chunks dispatched before the failure
    sent = dispatch_all(t, deque([[b, [None] * n, 0] for b, n in zip(bases[:upto], sizes[:upto], strict=True)]),
                        pieces, 1.0)
    reported = {e: data.draw(st.integers(0, n)) for e, n in sent.items()}
    t.progress({e: {0: -k} for e, k in reported.items() if k}, 2.0)
    completed_above = sum(n for e, n in sent.items() if reported[e] == n and e >> (CHUNK_BITS - EPOCH_BITS) >= boundary)
    # the checkpoint at `boundary` exists: everything below it is complete
    t.progress({e: {0: reported[e] - k} for e, k in sent.items() if e >> (CHUNK_BITS - EPOCH_BITS) < boundary
                and k > reported[e]}, 3.0)
    assert boundary_reached(t, boundary)
    reopened, uncompleted = t.rollback(boundary, log)
    replay = sum(sizes[boundary:])
    assert (reopened, uncompleted) == (replay, completed_above)
    assert t.outstanding == replay and t.completed == sum(sizes[:boundary])
    assert all(e >> (CHUNK_BITS - EPOCH_BITS) < boundary for e in t.epochs)
    again = dispatch_all(t, deque([[b, [None] * n, 0] for b, n in zip(bases[boundary:], sizes[boundary:],
                                                                     strict=True)]), pieces, 4.0)
    assert sum(again.values()) == replay
    order = list(again.items())
    data.draw(st.randoms(use_true_random=False)).shuffle(order)
    for i, (e, k) in enumerate(order):
        assert t.completed < t.admitted
        t.progress({e: {0: -k}}, 5.0 + i)
    assert t.completed == t.admitted == sum(sizes) and t.outstanding == 0 and not t.epochs and not t.chunks
    assert t.unknown == 0


def test_recovery_placement_moves_the_dead_workers_groups_only():
    spec = _spec()
    workers = ["w0", "w1", "w2"]
    old = build_placement(spec, workers, {"split": {0: 0.5, 1: 0.5}, "count": {0: 0.3, 1: 0.3, 2: 0.4}}, 10)
    new = recovery_placement(spec, old, ["w0", "w2"], {}, old.epoch + 1)
    new.check(spec)
    assert new.epoch == old.epoch + 1
    assert set(new.operators["split"].shares) == {"w0"}
    kg_old, kg_new = old.operators["count"].key_groups, new.operators["count"].key_groups
    assert "w1" not in kg_new and len(kg_new) == NUM_KEY_GROUPS
    assert all(a == b for a, b in zip(kg_old, kg_new, strict=True) if a != "w1")
    with pytest.raises(CheckpointError):
        recovery_placement(spec, old, [], {}, 9)
    mine = groups_to_restore(spec, new, "w2", {"count": list(range(0, NUM_KEY_GROUPS, 2))})
    assert mine["count"] == [g for g in range(0, NUM_KEY_GROUPS, 2) if kg_new[g] == "w2"]


def test_split_collected():
    assert split_collected(["a", "b", "c"], [1, 9, 3], 4) == (["a", "c"], [1, 3], ["b"], [9])


async def _later(s, x):
    return (s or 0) + x, None


def test_a_barrier_holds_async_operators_and_those_whose_outputs_are_seen_whatever_feeds_them():
    dag = clasp.Dag("b")
    split = dag.operator("split", lambda x: x)
    count = dag.operator("count", lambda s, x: ((s or 0) + 1, None), stateful=True, key=lambda x: x)
    slow = dag.operator("slow", _later, stateful=True, key=lambda x: x)
    emit = dag.operator("emit", lambda s, x: (s, x), stateful=True, key=lambda x: x)
    out = dag.operator("out", lambda x: x, collect=True)
    split >> count
    split >> slow
    split >> emit
    emit >> out
    spec = dag.to_spec()
    index = {o.name: o.index for o in spec.operators}
    # `count` reaches nothing: copy on write; `slow` is async, `emit` reaches a collection: both held.
    assert barrier_holds(spec) == {index["slow"], index["emit"]}

    from clasp.testing import IterableSource

    dag = clasp.Dag("s")
    src = dag.source("in", IterableSource([1, 2]))
    count = dag.operator("count", lambda s, x: ((s or 0) + 1, None), stateful=True, key=lambda x: x)
    total = dag.operator("total", lambda s, x: ((s or 0) + 1, None), stateful=True, key=lambda x: 0)
    src >> count >> total
    spec = dag.to_spec()
    # On a declared source as on push: `count` feeds another stateful operator (held), `total` reaches nothing.
    assert barrier_holds(spec) == {o.index for o in spec.operators if o.name == "count"}


def test_outputs_of_an_uncommitted_checkpoint_go_with_the_next_or_are_dropped_by_a_rollback():
    c = Coordinator()
    c.begin(1, ["w0"], now=0.0)
    c.ack(1, "w0", {}, 1, {"out": b"ab"})
    done, collected = c.finish(1.0)
    c.not_committed(collected, "disk full")
    assert c.counts == {**c.counts, "completed": 0, "failed": 1} and c.restore_target() is None
    c.begin(2, ["w0"], now=2.0)
    c.ack(2, "w0", {}, 1, {"out": b"c", "other": b"x"})
    done, collected = c.finish(3.0)
    assert collected == {"out": [b"ab", b"c"], "other": [b"x"]}  # the older outputs first, once
    c.committed(done)
    c.begin(3, ["w0"], now=4.0)
    c.ack(3, "w0", {}, 1, {"out": b"d"})
    c.not_committed(c.finish(5.0)[1], "disk full")
    c.rolled_back()  # "d"'s records run again from checkpoint 2
    c.begin(4, ["w0"], now=6.0)
    c.ack(4, "w0", {}, 1, {})
    assert c.finish(7.0)[1] == {}


def test_a_checkpoint_is_due_an_interval_after_the_last_began_with_a_gap_after_a_long_one():
    from clasp.core.checkpoint import GAP_SHARE, next_due

    assert next_due(10.0, None, 1.0) == 11.0  # while it runs
    assert next_due(10.0, 10.6, 1.0) == 11.0  # it took 0.6 s: the next one is still an interval after
    assert next_due(10.0, 11.3, 1.0) == 11.3 + GAP_SHARE  # it outlasted the interval: a gap, not a whole one


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e6), st.lists(st.floats(0, 10), max_size=5), st.booleans(), st.floats(0.001, 60))
def test_the_scheduler_wakes_by_the_next_checkpoint_due_and_looks_again_soon(now, ahead, held, interval):
    due = [now + a for a in ahead]
    d = look_delay(now, due, held, interval)
    assert 0 <= d <= min(interval, SCHEDULE_TICK if held else SCHEDULE_LOOK)
    assert all(now + d <= t + 1e-9 for t in due)  # never past a checkpoint due
    if not due:
        assert d == min(interval, SCHEDULE_TICK if held else SCHEDULE_LOOK)
    assert look_delay(now, [now - 1.0], held, interval) == 0.0  # one already due: look now
