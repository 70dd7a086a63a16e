"""Key groups at rest: state packed in idle time moves and checkpoints as its blob, and is never stale.

Engine-level (no sockets) for the invariant itself, over many random seeds with order-sensitive state;
then a real cluster: a settled job's migration packs nothing, and one under way right after new input
still moves exact state.
"""

from __future__ import annotations

import random
import time

import msgpack

import clasp
from clasp.bench import migration
from clasp.core.routing import NUM_KEY_GROUPS, build_placement
from clasp.runtime.engine import JobEngine
from clasp.runtime.worker_migration import SCAN_ROWS
from tests.conftest import start_cluster

BAD = -1  # the value the operator fails on, after changing its state in place


def append_or_fail(state, v):
    """Order-sensitive state: the list of values in arrival order; fails on BAD after appending to it."""
    state = state if state is not None else []
    state.append(v)  # in place, as user code may
    if v[1] == BAD:
        raise ValueError("bad value")
    return state, None


def dag() -> clasp.Dag:
    d = clasp.Dag("rest")
    a = d.operator("a", lambda v: [v])
    b = d.operator("b", append_or_fail, stateful=True, key=lambda v: v[0])
    a >> b
    return d


def drain(eng: JobEngine) -> None:
    while eng.run_round():
        pass


def check_rested(eng: JobEngine) -> int:
    """Every blob at rest decodes to exactly the live group it stands for; returns how many there are."""
    b = eng.ops[1]
    n = 0
    for g, rested in enumerate(b.rested):
        if rested is not None:
            blob, keys = rested
            got = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
            assert got == b.groups[g] and keys == len(got), f"group {g} rests stale"
            n += 1
    return n


def migrate(engines: dict, old, new) -> int:
    """One migration between in-process engines (extract, install, release); returns groups packed on the move."""
    owners_old, owners_new = old.operators["b"].key_groups, new.operators["b"].key_groups
    packed = sum(e.handover.packed_on_move for e in engines.values())
    for wid, e in engines.items():
        e.begin_migration(new, {1: {g for g in range(NUM_KEY_GROUPS)
                                    if owners_new[g] == wid and owners_old[g] != wid}})
    for e in engines.values():
        for dest, unit, rows in e.handover.extract(e.placement):
            engines[dest].install([unit] if unit is not None else [], rows or [])
    for wid, e in engines.items():
        e.release_groups({1: [g for g in range(NUM_KEY_GROUPS) if owners_new[g] == wid and owners_old[g] != wid]})
    return sum(e.handover.packed_on_move for e in engines.values()) - packed


def two_workers():
    """Engines w0 and w1, all state on w0 (`old`), and the placement that moves it all to w1 (`new`)."""
    spec = dag().to_spec()
    ws = ["w0", "w1"]
    old = build_placement(spec, ws, {"a": {0: 1}, "b": {0: 1}}, 10, epoch=0)
    new = build_placement(spec, ws, {"a": {0: 1}, "b": {1: 1}}, 10, epoch=1, previous=old)
    return {w: JobEngine(1, spec, w, old) for w in ws}, old, new


def test_a_group_at_rest_moves_as_its_blob_and_a_request_of_it_drops_the_blob():
    engines, old, new = two_workers()
    e0, b = engines["w0"], engines["w0"].ops[1]
    e0.enqueue_rows([(1, [k, k], k, k) for k in range(500)])
    drain(e0)
    while e0.rest_one():
        pass
    assert not e0.changed() and check_rested(e0) == sum(1 for d in b.groups if d)
    blobs = {g: r[0] for g, r in enumerate(b.rested) if r is not None}
    touched = b.group_of(7)
    e0.enqueue_rows([(1, [7, 999], 7, 999)])
    drain(e0)
    assert b.rested[touched] is None and e0.changed()
    assert all(b.rested[g][0] is blob for g, blob in blobs.items() if g != touched)
    assert migrate(engines, old, new) == 1  # only the touched group had to be packed
    got = engines["w1"].ops[1].state_dict()
    assert got == {k: [[k, k]] + ([[7, 999]] if k == 7 else []) for k in range(500)}
    assert e0.handover.dropped and not any(e0.ops[1].groups)
    while e0.handover.free_one():
        pass
    assert not e0.handover.dropped


def test_state_a_failing_function_changed_in_place_is_not_left_behind_by_its_blob():
    engines, old, new = two_workers()
    e0 = engines["w0"]
    e0.enqueue_rows([(1, [3, 1], 3, 1)])
    drain(e0)
    while e0.rest_one():
        pass
    e0.enqueue_rows([(1, [3, BAD], 3, 2)])  # appends in place, then raises
    drain(e0)
    assert e0.executor.failed == 1 and e0.ops[1].get(3) == [[3, 1], [3, BAD]]
    migrate(engines, old, new)
    assert engines["w1"].ops[1].state_dict() == {3: [[3, 1], [3, BAD]]}


def test_a_checkpoint_snapshot_writes_rested_blobs_as_they_are_and_puts_the_others_to_rest():
    spec = dag().to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"a": {0: 1}, "b": {0: 1}}, 10))
    eng.enqueue_rows([(1, [k, 0], k, k) for k in range(300)])
    drain(eng)
    b = eng.ops[1]
    eng.rest_one()
    first = next(g for g, r in enumerate(b.rested) if r is not None)
    blob = b.rested[first][0]
    snap = {g: blob_ for _, g, _, blob_ in eng.cut.snapshot_groups(eng.placement)}
    assert snap[first] is blob and not eng.changed() and check_rested(eng) == len(snap)
    assert {k: v for g in snap for k, v in msgpack.unpackb(snap[g], strict_map_key=False).items()} == \
        {k: [[k, 0]] for k in range(300)}


def test_randomized_rest_migrate_checkpoint_and_fail_keep_every_keys_exact_history():
    """Random interleavings of requests (some failing after an in-place change), idle-time rests, frees and
    decodes, checkpoint snapshots and migrations among three workers, over many seeds: the state is always
    the per-key history an independent model computes, and every blob at rest decodes to its live group."""
    spec = dag().to_spec()
    ws = ["w0", "w1", "w2"]
    for seed in range(40):
        rng = random.Random(seed)
        placement = build_placement(spec, ws, {"a": {0: 1}, "b": {0: 1}}, 10, epoch=0)
        engines = {w: JobEngine(1, spec, w, placement) for w in ws}
        model: dict[int, list] = {}
        rid = 0
        for _step in range(60):
            action = rng.random()
            if action < 0.45:
                rows = []
                for _ in range(rng.randint(1, 40)):
                    k = rng.randrange(200)
                    v = BAD if rng.random() < 0.03 else rid
                    rows.append((k, v))
                    if v != BAD or k in model:  # a failure changes only state that exists (in place)
                        model.setdefault(k, []).append([k, v])
                    rid += 1
                by_owner: dict[str, list] = {}
                owners = placement.operators["b"].key_groups
                for k, v in rows:
                    g = engines["w0"].ops[1].group_of(k)
                    by_owner.setdefault(owners[g], []).append((1, [k, v], k, rid))
                for w, rs in by_owner.items():
                    engines[w].enqueue_rows(rs)
                    drain(engines[w])
            elif action < 0.65:
                e = engines[rng.choice(ws)]
                for _ in range(rng.randint(1, 60)):
                    if not (e.handover.free_one() or e.warm_one() or e.rest_one()):
                        break
            elif action < 0.75:
                e = engines[rng.choice(ws)]
                for _ in e.cut.snapshot_groups(e.placement):
                    pass
            else:
                holders = rng.sample(range(3), rng.randint(1, 3))
                new = build_placement(spec, ws, {"a": {0: 1}, "b": {i: rng.random() + 0.1 for i in holders}}, 10,
                                      epoch=placement.epoch + 1, previous=placement)
                migrate(engines, placement, new)
                placement = new
            for e in engines.values():
                check_rested(e)
        state: dict = {}
        for e in engines.values():
            mine = e.ops[1].state_dict()
            assert not set(mine) & set(state), f"seed {seed}: a key on two workers"
            state.update(mine)
        assert state == model, f"seed {seed}"


def test_a_settled_jobs_migration_packs_nothing_and_one_under_new_input_is_still_exact(tmp_path_factory):
    cl = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale"])
    try:
        with clasp.connect(cl.planner) as c:
            job = c.submit(migration.dag(), autoscale=False)
            migration.spread(job, 1)
            migration.fill(job, 20_000)
            time.sleep(1.0)  # the input paused: the worker puts its key groups to rest in idle time
            r = migration.spread(job, 3)
            assert r["key_groups_moved"] > 0 and r["key_groups_packed"] == 0 and not r["failed"]
            assert migration.exact(job, 20_000, 1)
            # Input still flowing while the next migration runs: what changed is packed on the move.
            words = [f"key{i:07d}" for i in range(20_000)]
            job.push([" ".join(words[i:i + 20]) for i in range(0, 20_000, 20)])
            r = migration.spread(job, 1)
            job.wait_idle(60)
            assert r["key_groups_moved"] > 0 and not r["failed"]
            assert migration.exact(job, 20_000, 2)
    finally:
        cl.stop()


def test_a_backlog_is_scanned_in_pieces_with_nothing_run_between_and_arrivals_kept_after_it():
    engines, old, _ = two_workers()
    spec = dag().to_spec()
    half = build_placement(spec, ["w0", "w1"], {"a": {0: 1}, "b": {0: 1, 1: 1}}, 10, epoch=1, previous=old)
    e0, b = engines["w0"], engines["w0"].ops[1]
    backlog = [(1, [k % 300, k], k % 300, k) for k in range(5000)]
    e0.enqueue_rows(backlog)  # queued, not run: the migration scans them
    e0.begin_migration(half, {})
    owners = half.operators["b"].key_groups
    kept = [r for r in backlog if owners[b.group_of(r[2])] == "w0"]
    stay = next(k for k in range(300) if owners[b.group_of(k)] == "w0")
    pauses, units = 0, []
    for dest, unit, _rows in e0.handover.extract(e0.placement):
        if dest is None:
            pauses += 1
            assert e0.run_round() == 0  # nothing of the job runs while its queues are scanned
            if pauses == 3:
                e0.enqueue_rows([(1, [stay, -2], stay, 99999)])  # arrives mid-scan
        elif unit is not None:
            units.append(unit)
    assert pauses == len(backlog) // SCAN_ROWS
    assert list(b.queue) == kept + [(1, [stay, -2], stay, 99999)]
    moved = [r for u in units for r in u[4]]
    assert sorted(moved, key=lambda r: r[3]) == [r for r in backlog if owners[b.group_of(r[2])] == "w1"]
    for u in units:  # each group's requests in their arrival order
        assert [r[3] for r in u[4]] == sorted(r[3] for r in u[4])
    drain(e0)
    assert b.processed == len(kept) + 1
