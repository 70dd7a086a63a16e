"""The worker's half of live migration (paper §4.4, docs/SCALING.md), in one place: per job engine, what it
holds, forwards, takes out and installs (`Handover`); per worker, the protocol of a plan: markers, the state
sent in slices, what arrives installed, the reply to the planner (`Migrator`). The plan's decisions are pure,
in clasp.core.migration (`WorkerMigration`, `incoming_groups`, `groups_from`, `request_owner`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from time import perf_counter, thread_time
from typing import Protocol

from clasp.core import protocol
from clasp.core.dag import DagSpec
from clasp.core.migration import MigrationPlan, WorkerMigration, groups_from, incoming_groups, request_owner
from clasp.core.protocol import ProtocolError
from clasp.core.routing import Placement
from clasp.runtime.barrier import Barrier
from clasp.runtime.net import DirectSend
from clasp.runtime.operators import OpRuntime, unpack_group
from clasp.runtime.outbox import HOLD, Outbox
from clasp.runtime.tasks import ProcessTasks

SCAN_ROWS = 512  # queued requests a migration scans between two pause points
# Seconds of migration work (taking out and serializing key groups) between two turns of the event loop.
# Short, because under a CPU quota a stretch that outlasts the period's allowance stalls for the rest of it.
MIGRATE_SLICE_S = 0.0005
MIGRATE_SLICE_ROWS = 1000  # queued requests one migrate message carries at most (with their groups' state)
MIGRATE_SLICE_BYTES = 256 << 10  # and bytes of state, about: decoding it stays well under a millisecond


class Handover:
    """One engine's half of a migration. `ops` is the engine's operator list (made once); `outbox` and `cut`
    its routes and batches and its checkpoint's barrier, which rows placed here pass."""

    def __init__(self, ops: list[OpRuntime], me: str, outbox: Outbox, cut: Barrier):
        self.ops, self.me, self.outbox, self.cut = ops, me, outbox, cut
        # During a migration: op index -> key group -> requests held until the group's state arrives.
        self.held: dict[int, dict[int, list]] = {}
        self.held_since = 0.0  # when the groups in `held` began to wait (perf_counter)
        self.group_hold = 0.0  # the longest any key group waited in this migration (s)
        self.future: list[tuple[int, list]] = []  # rows of an epoch whose plan has not arrived yet
        # The migration in progress and what the worker keeps for it: the planner's request, when it began,
        # its statistics (the reply's).
        self.migration: WorkerMigration | None = None
        self.req = 0
        self.t0 = 0.0
        self.stats: dict = {}
        self.packed_on_move = 0  # key groups a migration had to pack (not at rest), cumulative
        self.dropped: list[dict] = []  # the state of key groups that moved away, freed in idle time
        self.early: list[protocol.Marker] = []  # markers and migrate messages that overtook their plan
        self.queued_plans: list[protocol.MigratePlan] = []  # plans that arrived while one was still running
        self.before: Placement | None = None  # the placement the migration in progress started from

    def begin(self, before: Placement, incoming: dict[int, set[int]]) -> list[tuple[int, list]]:
        """Hold the requests for the key groups in `incoming` (op index -> groups whose state is on its way
        here) from now on; returns the rows that came early for the new epoch, to be received again."""
        self.held = {op: {g: [] for g in groups} for op, groups in incoming.items() if groups}
        self.held_since, self.group_hold = perf_counter(), 0.0
        self.before = before
        future, self.future = self.future, []
        return future

    def release(self, groups: dict[int, list[int]]) -> bool:
        """The state of these key groups is installed: their held requests join the queues after what
        came with the state. Returns whether nothing is held any more."""
        self.hold_local()
        for op_index, gs in groups.items():
            h = self.held.get(op_index)
            if h is None:
                continue
            queue = self.ops[op_index].queue
            for g in gs:
                rows = h.pop(g, None)
                if rows is not None:
                    queue.extend(rows)
                    self.group_hold = max(self.group_hold, perf_counter() - self.held_since)
            if not h:
                del self.held[op_index]
        return not self.held

    def hold_local(self) -> None:
        """Requests this worker routed to a held group itself join that group's held rows."""
        rows = self.outbox.pending.pop(HOLD, None)
        if rows:
            self.place(rows, None)

    def place(self, rows, placement: Placement | None) -> None:
        """Row by row (only during or just after a migration): hold, queue, or forward to the owner under
        `placement` (None: nothing is forwarded)."""
        held, ops, cut = self.held, self.ops, self.cut
        for r in rows:
            op = ops[r[0]]
            h = held.get(op.index)
            if h is not None:
                waiting = h.get(op.group_of(r[2]))
                if waiting is not None:
                    waiting.append(r)
                    continue
            d = self.owner(op, r, placement) if placement is not None else None
            if d is not None and self.extracting_later(op, r):
                d = None
            if d is None:
                if op.index in cut.held and r[3] >= cut.boundary:
                    cut.held[op.index].append(r)
                else:
                    op.queue.append(r)
            else:
                self.outbox.add(d, r)

    def extracting_later(self, op: OpRuntime, row) -> bool:
        """An old-epoch row for something this worker is giving away but has not taken out yet: it queues
        here and leaves with the group, behind the rows queued before it. Forwarded at once, it could
        reach the new owner after rows of the new epoch that the new owner holds for the same key."""
        mig = self.migration
        return (self.before is not None and mig is not None and not mig.sent
                and self.owner(op, row, self.before) is None)

    def owner(self, op: OpRuntime, row, placement: Placement) -> str | None:
        """The worker that should run `row` under `placement`; None when it is this one (a stateless
        operator's requests all have one owner: `row` may be None)."""
        return request_owner(placement.operators[op.name], self.me, op.group_of(row[2]) if op.stateful else None)

    def held_rows(self) -> list[list]:
        """The requests held for key groups on their way here, a list of rows per group."""
        return [r for h in self.held.values() for r in h.values()]

    def extract(self, placement: Placement):
        """Take out every state object and queued request this worker no longer owns, group by group.

        Yields (destination, unit, None) with unit = [op index, key group, msgpack blob of {key: state},
        its key count, rows of that group] (a group at rest as its blob, any other serialized as it is taken),
        then (destination, None, rows) for the requests of stateless operators handed over; and, while the
        queues are scanned (first), pause points (None, None, None). The caller may yield to the event loop
        at any of them: during the scan nothing of this job runs, and after it no request of a group being
        taken out can run here any more (they are out of the queues, and markers guarantee no more come)."""
        me = self.me
        loose: dict[str, list] = {}
        pending_units = []
        # A backlog of many thousand requests is scanned in pieces, a pause point (None, None, None) after
        # each SCAN_ROWS, where the caller may turn the event loop: nothing of this job runs meanwhile (every
        # operator is busy), requests arriving join the queues after what the scan keeps.
        for op in self.ops:
            op.busy = True
        try:
            for op in self.ops:
                p = placement.operators[op.name]
                rows_of: dict[int, list] = {}
                if op.queue:
                    rows = list(op.queue)
                    op.queue.clear()
                    if op.stateful:
                        keep = []
                        owners, group_of = p.key_groups, op.group_of
                        for i, r in enumerate(rows, 1):
                            g = group_of(r[2])
                            if owners[g] == me:
                                keep.append(r)
                            else:
                                rows_of.setdefault(g, []).append(r)
                            if not i % SCAN_ROWS:
                                yield None, None, None
                    else:
                        d = self.owner(op, None, placement)
                        keep = rows if d is None else []
                        if d is not None:
                            loose.setdefault(d, []).extend(rows)
                    op.queue.extendleft(reversed(keep))
                    # The moved requests are then held by their units alone, so each is freed once its slice is
                    # sent rather than all of them at the end of the scan's frame (O(requests) in one step).
                    rows = keep = None
                if op.stateful:
                    for g, d in enumerate(p.key_groups):
                        if d != me and (op.groups[g] or g in op.cold or g in rows_of):
                            pending_units.append((d, op, g, rows_of.get(g, [])))
        finally:
            for op in self.ops:
                op.busy = False
        rows_of = None
        pending_units.reverse()
        while pending_units:  # popped, so a unit's requests are the caller's alone once it is yielded
            d, op, g, rows = pending_units.pop()
            if op.rested[g] is None and g not in op.cold:
                self.packed_on_move += 1
            blob, n = op.take_group(g, self.dropped)
            unit, rows = [op.index, g, blob, n, rows], None
            yield d, unit, None
        for d, rows in loose.items():
            yield d, None, rows

    def install(self, units: list) -> int:
        """Take over key groups from a peer (state, then their queued requests); returns the number of state
        objects installed (the engine queues the handed-over requests of stateless operators). The state stays
        serialized until first used."""
        n = 0
        for op_index, g, blob, keys, group_rows in units:
            op = self.ops[op_index]
            if keys:
                if g in op.cold or op.groups[g]:  # state of this group here already: merge now
                    if g in op.cold:
                        op.warm(g)
                    op.install_items(g, unpack_group(blob))
                else:
                    op.cold[g] = (blob, keys)
            op.queue.extend(group_rows)
            n += keys
        return n

    def free_one(self) -> bool:
        """Free the state of one key group that moved away; False when none is left."""
        if not self.dropped:
            return False
        self.dropped.pop()
        return True


class Running(Protocol):
    """What `Migrator` uses of an engine's executor (clasp.runtime.executor.Executor)."""

    async_tasks: set


class Engine(Protocol):
    """What `Migrator` uses of a job's engine (clasp.runtime.engine.JobEngine, which imports this module)."""

    job: int
    spec: DagSpec
    epoch: int
    placement: Placement
    handover: Handover
    executor: Running

    def begin_migration(self, placement: Placement, incoming: dict[int, set[int]]) -> None: ...

    def release_groups(self, groups: dict[int, list[int]]) -> None: ...

    def install(self, units: list, rows: list) -> int: ...


class Migrator:
    """The worker's half of every migration. `jobs` is the worker's table of engines; `engine_of(msg)` finds a
    request's (or raises); `peer(wid)` is the data socket to a peer; `flush_data(eng)` sends what an engine
    batched; `send` sends on the control channel; `bad(error, where)` counts a bad message; `busy(t)` tells
    the worker it did work at `t` (idle-time work waits); `wake` wakes its executor loop."""

    def __init__(self, me: str, jobs: dict, tasks: ProcessTasks, *, engine_of: Callable,
                 peer: Callable[[str], DirectSend], flush_data: Callable, send: Callable, bad: Callable,
                 busy: Callable[[float], None], wake: asyncio.Event):
        self.me, self.jobs, self.tasks = me, jobs, tasks
        self.engine_of, self.peer, self.flush_data, self.send, self.bad = engine_of, peer, flush_data, send, bad
        self.busy, self.wake = busy, wake
        self.gc_paused = False  # collection turned off here for a migration in progress

    def on_plan(self, msg: protocol.MigratePlan) -> None:
        """Steps 3-7 for one plan; the reply to the planner is sent when this worker is done."""
        eng = self.engine_of(msg)
        plan = MigrationPlan.from_wire(msg.plan)
        placement = Placement.from_wire(msg.placement, eng.spec)
        if placement.epoch <= eng.epoch:
            raise ValueError(f"plan for epoch {placement.epoch}, job {eng.job} is at {eng.epoch}")
        if eng.handover.migration is not None:
            # The planner sends a newer plan while this one waits when a peer died: stop waiting for the
            # dead (their key groups restart empty), finish this one, then run the next.
            self.forget(eng, plan.dead)
            eng.handover.queued_plans.append(msg)
            self.tasks.spawn(self.progress(eng), f"migration of job {eng.job}")
            return
        eng.handover.migration = WorkerMigration(plan, self.me)
        self.gc_for_migrations()
        eng.handover.req = msg.req
        eng.handover.t0 = perf_counter()
        self.busy(eng.handover.t0)
        eng.handover.stats = {"bytes": 0, "objects": 0, "rows": 0, "received_objects": 0, "busy_ms": 0.0,
                              "pause_ms": 0.0, "pause_cpu_ms": 0.0}
        # Step 3: what was batched under the old epoch leaves first, then the markers that close it.
        self.flush_data(eng)
        marker = protocol.pack(protocol.Marker(eng.job, placement.epoch, self.me))
        for wid in plan.markers_to_send(self.me):
            self.peer(wid).send(marker)
        eng.begin_migration(placement, incoming_groups(plan, eng.spec, self.me))
        early, eng.handover.early = eng.handover.early, []
        for m in early:
            self.on_message(eng, m)
        self.tasks.spawn(self.progress(eng), f"migration of job {eng.job}")

    def forget(self, eng: Engine, dead) -> None:
        mig = eng.handover.migration
        for w in dead:
            if w in mig.awaiting_state:
                eng.release_groups(groups_from(eng.handover.migration.plan, eng.spec, w, self.me))
        mig.forget(dead)

    def on_message(self, eng: Engine, msg: protocol.Marker | protocol.Migrate, decode_s: float = 0.0) -> None:
        """A marker or a migrate message (`decode_s`: the time its decoding took, part of the work)."""
        mig = eng.handover.migration
        epoch, sender = msg.epoch, msg.sender
        if epoch > eng.epoch:
            eng.handover.early.append(msg)  # it overtook our plan
            return
        if mig is None or epoch < mig.plan.epoch:
            self.bad(ProtocolError("stale_migration", f"{msg.TYPE} for epoch {epoch} at epoch {eng.epoch}"), "data")
            return
        if not isinstance(msg, protocol.Migrate):
            mig.marker(sender)
        else:
            # Steps 5-6, group by group: install the state and requests that came, release what was held.
            t, tc = perf_counter(), thread_time()
            eng.handover.stats["received_objects"] += eng.install(msg.units, msg.rows)
            released: dict[int, list[int]] = {}
            for op_index, g, _blob, _keys, _rows in msg.units:
                released.setdefault(op_index, []).append(g)
            if not msg.more:  # the last message from this sender: groups it had nothing of are ours now too
                released = groups_from(mig.plan, eng.spec, sender, self.me)
                mig.received(sender)
            eng.release_groups(released)
            _slice(eng.handover.stats, t - decode_s, tc - decode_s)
            self.busy(perf_counter())
            self.wake.set()
        self.tasks.spawn(self.progress(eng), f"migration of job {eng.job}")

    async def progress(self, eng: Engine) -> None:
        mig = eng.handover.migration
        if mig is None:
            return
        if mig.ready_to_send:
            mig.start_sending()
            stats = eng.handover.stats
            stats["markers_ms"] = (perf_counter() - eng.handover.t0) * 1e3
            if eng.executor.async_tasks:  # drain: let running executions finish before their state moves
                await asyncio.gather(*list(eng.executor.async_tasks), return_exceptions=True)
            # What this worker's own executions batched goes first: a new owner must not run a moved
            # group, and send its outputs on, before the outputs this worker made of that group left.
            self.flush_data(eng)
            if not await self.send_state(eng, mig, stats):
                return  # a recovery replaced this engine: its migration is void
            stats["sent_ms"] = (perf_counter() - eng.handover.t0) * 1e3
            mig.finish_sending()
        if mig.done and eng.handover.migration is mig:
            self.finish(eng)

    async def send_state(self, eng: Engine, mig: WorkerMigration, stats: dict) -> bool:
        """Step 4: what this worker loses, in slices; False if a recovery replaced the engine meanwhile.

        Whole key groups (at rest: as their blobs; else serialized as taken out), sent in slices of about
        MIGRATE_SLICE_S of work with a turn of the event loop in between: the worker keeps running everything
        else, no single step holds it long, and each receiver can release the groups of a slice (and run their
        requests) while later ones are still on their way."""
        epoch = mig.plan.epoch
        chunks: dict[str, list] = {}
        loose: dict[str, list] = {}
        packed_before = eng.handover.packed_on_move
        chunk_rows = chunk_bytes = 0
        t, tc = perf_counter(), thread_time()
        for wid, unit, rows in eng.handover.extract(eng.placement):
            if wid is None:
                pass  # a pause point of the queue scan
            elif wid in mig.plan.dead:
                continue
            elif unit is None:
                loose[wid] = rows
                stats["rows"] += len(rows)
                continue
            else:
                chunks.setdefault(wid, []).append(unit)
                stats["objects"] += unit[3]
                stats["rows"] += len(unit[4])
                chunk_rows += len(unit[4])
                chunk_bytes += len(unit[2])
            # A slice is encoded when it is sent, and decoded by its receiver in one step: groups at rest take no
            # time to gather but could carry megabytes or a whole backlog, so bytes and rows end a slice too.
            if (perf_counter() - t >= MIGRATE_SLICE_S or chunk_rows >= MIGRATE_SLICE_ROWS
                    or chunk_bytes >= MIGRATE_SLICE_BYTES):
                for peer, units in chunks.items():
                    self.send_migrate(eng, peer, epoch, units, [], True)
                chunks, chunk_rows, chunk_bytes = {}, 0, 0
                _slice(stats, t, tc)
                await asyncio.sleep(0)
                t, tc = perf_counter(), thread_time()
                if self.jobs.get(eng.job) is not eng:
                    return False
        for peer, units in chunks.items():
            self.send_migrate(eng, peer, epoch, units, [], True)
        # Handed-over requests of stateless operators last, MIGRATE_SLICE_ROWS a message.
        for peer, rows in loose.items():
            pieces = [rows[i:i + MIGRATE_SLICE_ROWS] for i in range(0, len(rows), MIGRATE_SLICE_ROWS)] or [[]]
            for piece in pieces[:-1]:
                self.send_migrate(eng, peer, epoch, [], piece, True)
                _slice(stats, t, tc)
                await asyncio.sleep(0)
                t, tc = perf_counter(), thread_time()
                if self.jobs.get(eng.job) is not eng:
                    return False
            loose[peer] = pieces[-1]
        for wid in set(mig.plan.sends_to.get(self.me, [])) - set(mig.plan.dead):
            self.send_migrate(eng, wid, epoch, [], loose.pop(wid, []), False)
        _slice(stats, t, tc)
        stats["packed_groups"] = eng.handover.packed_on_move - packed_before
        return True

    def send_migrate(self, eng: Engine, wid: str, epoch: int, units: list, rows: list, more: bool) -> None:
        """Step 4's message to one peer; the last one carries `more=False`."""
        frame = protocol.pack(protocol.Migrate(eng.job, epoch, self.me, units, rows, more))
        self.peer(wid).send(frame, copy=False)
        eng.handover.stats["bytes"] += len(frame)

    def finish(self, eng: Engine) -> None:
        now = perf_counter()
        self.busy(now)
        hold = now - eng.handover.t0
        stats = eng.handover.stats
        pause = stats.get("pause_ms", 0.0) / 1e3
        reply = {"worker": self.me, "epoch": eng.epoch, "pause": pause, "hold": hold,
                 "group_hold": eng.handover.group_hold, **stats}
        self.send(protocol.reply(eng.handover.req, reply))
        eng.handover.migration = None
        self.gc_for_migrations()
        self.wake.set()
        if eng.handover.queued_plans and self.jobs.get(eng.job) is eng:
            self.on_plan(eng.handover.queued_plans.pop(0))

    def gc_for_migrations(self) -> None:
        """No cyclic garbage collection while a migration runs here (as in checkpoints): a full pass over the
        state's objects, tens of ms with millions of them, would land inside one of its slices. Also called
        when idle, so a migration that a recovery voided does not leave collection off."""
        busy = any(e.handover.migration is not None for e in self.jobs.values())
        if busy and not self.gc_paused and gc.isenabled():
            gc.disable()
            self.gc_paused = True
        elif not busy and self.gc_paused:
            gc.enable()
            self.gc_paused = False


def _slice(stats: dict, t0: float, c0: float) -> None:
    """Account one uninterrupted stretch of migration work: its total, and the longest (the pause), by
    the wall clock and by this thread's CPU time (the difference: preemption and CPU-quota throttling)."""
    ms = (perf_counter() - t0) * 1e3
    stats["busy_ms"] += ms
    stats["pause_ms"] = max(stats.get("pause_ms", 0.0), ms)
    stats["pause_cpu_ms"] = max(stats.get("pause_cpu_ms", 0.0), (thread_time() - c0) * 1e3)
