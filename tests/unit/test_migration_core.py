"""The migration plan and a worker's progress through it (clasp/core/migration.py), without sockets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.migration import (
    PLANNER,
    MigrationPlan,
    WorkerMigration,
    groups_from,
    incoming_groups,
    plan_migration,
    request_owner,
)
from clasp.core.routing import NUM_KEY_GROUPS, OperatorPlacement, build_placement

WORKERS = ["w0", "w1", "w2", "w3"]


def wc_spec():
    d = clasp.Dag("wc")
    s = d.operator("split", str.split)
    c = d.operator("count", lambda st_, w: ((st_ or 0) + 1, None), stateful=True, key=lambda w: w)
    s >> c
    return d.to_spec()


def spread(spec, n: int, epoch: int, previous=None):
    return build_placement(spec, WORKERS, {"split": {i: 1.0 for i in range(n)}, "count": {i: 1.0 for i in range(n)}},
                           10, epoch=epoch, previous=previous)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4))
def test_the_plan_moves_exactly_the_key_groups_that_change_owner_and_says_who_waits_for_whom(a, b):
    spec = wc_spec()
    old = spread(spec, a, 1)
    new = spread(spec, b, 2, previous=old)
    plan = MigrationPlan.from_wire(plan_migration(spec, old, new, WORKERS).to_wire())
    changed = {g: (x, y) for g, (x, y) in enumerate(zip(old.operators["count"].key_groups,
                                                        new.operators["count"].key_groups, strict=True)) if x != y}
    moved = {g: pair for pair, gs in plan.moves.get("count", {}).items() for g in gs}
    assert moved == changed and plan.moved_groups() == len(changed) <= NUM_KEY_GROUPS
    for (src, dst) in plan.moves.get("count", {}):
        assert dst in plan.sends_to[src] and src in plan.receives_from[dst]
        # a loser of count groups waits for every old holder of split (its predecessor), not for itself
        assert set(plan.markers.get(src, [])) - {PLANNER} == set(old.operators["split"].workers()) - {src}
    for w, senders in plan.markers.items():  # the planner's marker: for a worker that loses the source
        assert (PLANNER in senders) == (w in plan.handoffs.get("split", {}))
    assert plan.participants == sorted(WORKERS)


def test_a_worker_is_done_only_after_its_last_slice_left_and_everything_it_gets_came():
    spec = wc_spec()
    old = spread(spec, 1, 1)
    new = spread(spec, 2, 2, previous=old)
    plan = plan_migration(spec, old, new, WORKERS)
    sender, receiver = WorkerMigration(plan, "w0"), WorkerMigration(plan, "w1")
    assert not sender.ready_to_send or not plan.markers.get("w0")
    for s in plan.markers.get("w0", []):
        sender.marker(s)
    assert sender.ready_to_send
    sender.start_sending()
    # Step 4 yields between slices: another turn of the loop must see the sender as busy, not done.
    assert not sender.ready_to_send and not sender.done
    sender.finish_sending()
    assert sender.done
    assert not receiver.done and receiver.awaiting_state == {"w0"}
    receiver.received("w0")
    assert receiver.done


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.sets(st.sampled_from(WORKERS), max_size=2))
def test_a_worker_waits_for_the_groups_live_senders_move_to_it(a, b, dead):
    spec = wc_spec()
    old = spread(spec, a, 1)
    new = spread(spec, b, 2, previous=old)
    plan = plan_migration(spec, old, new, WORKERS)
    plan.dead = sorted(dead)
    count = next(o.index for o in spec.operators if o.name == "count")
    olds, news = old.operators["count"].key_groups, new.operators["count"].key_groups
    for me in WORKERS:
        want = {g for g in range(NUM_KEY_GROUPS) if news[g] == me and olds[g] != me and olds[g] not in dead}
        assert incoming_groups(plan, spec, me) == ({count: want} if want else {})
        for sender in WORKERS:
            moved = [g for g in range(NUM_KEY_GROUPS) if olds[g] == sender and news[g] == me and sender != me]
            assert sorted(groups_from(plan, spec, sender, me).get(count, [])) == moved


def test_a_request_belongs_to_its_groups_owner_or_the_largest_share():
    keyed = OperatorPlacement({"w0": 1.0, "w1": 1.0}, {"w0": 1, "w1": 1}, ["w0", "w1"] * (NUM_KEY_GROUPS // 2))
    assert request_owner(keyed, "w0", 0) is None and request_owner(keyed, "w0", 1) == "w1"
    stateless = OperatorPlacement({"w0": 0.0, "w1": 0.5, "w2": 0.5}, {"w1": 1, "w2": 1})
    assert request_owner(stateless, "w1", None) is None  # a share here: it runs here
    assert request_owner(stateless, "w0", None) == "w1"  # none here: the largest share, the least id of equals
