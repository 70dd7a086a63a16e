"""The planner's sources coordinator: declared sources' partitions owned by workers, leases, seals, stop.

A job whose DAG declares sources (`Dag.source`) has its partitions listed once, at submit, and owned by
the workers holding the source operator's shares (`clasp.core.partitions`): the deploy names each
worker's partitions with their positions. Workers read on their own; the planner only hands out chunk ids
(`lease`), takes each batch's seal into the tracker (one message per batch of up to 1,024 records, never
one per record), returns credit to the readers as their chunks complete, and learns when a bounded
partition has been read to its end (`read_end`). On a migration (rescale, drain, a recovery without
checkpoints) the partitions whose owner changes move with their positions: released by the old owner
(`src_release` answers the position after the last batch it admitted), opened by the new one
(`src_assign`). A checkpoint keeps every partition's position at its cut; a rollback reopens them there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Set
from typing import Any

from clasp.core import protocol
from clasp.core.dag import DagSpec
from clasp.core.lifecycle import Phase
from clasp.core.partitions import moved_partitions, reassign, steal
from clasp.core.routing import Placement
from clasp.core.timed import stages
from clasp.runtime.planner_link import Link

log = logging.getLogger("clasp.planner")

STEAL_RETRY_S = 0.02  # a steal asked for while the job was busy (barrier, migration, rollback): looked at again


class SourceState:
    """A job's declared sources as the planner holds them (`PlannerJob.src`)."""

    def __init__(self, parts: list[tuple[str, str]], bounded: bool, splits: frozenset = frozenset()):
        self.parts = parts  # (source operator, partition), in listing order
        self.splits = splits  # the source operators whose partitions move cheaply (`Source.splits`)
        self.owners: dict[tuple[str, str], str] = {}
        self.positions: dict[tuple[str, str], Any] = {}  # the last known: a handoff's or a checkpoint's
        self.ended: set[tuple[str, str]] = set()  # bounded partitions read to their end
        self.bounded = bounded
        self.stopped = False  # `job.stop()`: the readers stopped
        self.finished = False  # `job.stop()` returned: a later rollback does not read again
        self.deferred: list[tuple[bytes, int]] = []  # lease requests that came during a rollback or barrier
        self.deferred_ends: list[tuple[bytes, protocol.ReadEnd]] = []  # read_end reports that came during a rollback
        self.stealing = False  # a balancing of the partitions left to read is under way (`partitions.steal`)
        self.stolen = 0  # partitions moved by it

    def reading(self) -> int:
        """Partitions that still hold `wait_idle` up: not read to their end (every one, on a stream)."""
        if self.stopped:
            return 0
        return len(self.parts) - len(self.ended) if self.bounded else len(self.parts)

    def wire(self, owners: dict | None = None, positions: dict | None = None) -> list:
        """[[op, partition, owner, position]] for a deploy or a restore."""
        owners = self.owners if owners is None else owners
        positions = self.positions if positions is None else positions
        return [[op, p, owners[(op, p)], positions.get((op, p))] for op, p in self.parts if (op, p) in owners]

    def as_list(self, positions: dict | None = None) -> list:
        positions = self.positions if positions is None else positions
        return [[op, p, positions.get((op, p))] for op, p in self.parts]


def list_partitions(spec: DagSpec) -> SourceState | None:
    """Every declared source's partitions (asked once, here); None for a DAG without declared sources. A DAG
    with keyed time operators and no declared source has none: its workers lease chunk ids for the windows
    they fire all the same."""
    if not spec.readers:
        return SourceState([], True) if stages(spec) else None
    parts = []
    bounded = True
    splits = set()
    for i in spec.readers:
        o = spec.operators[i]
        names = [str(p) for p in o.connector.partitions()]
        if len(set(names)) != len(names):
            raise ValueError(f"source {o.name!r} lists a partition twice")
        parts.extend((o.name, p) for p in names)
        bounded = bounded and bool(o.connector.bounded)
        if o.connector.splits:
            splits.add(o.name)
    return SourceState(parts, bounded, frozenset(splits))


def owners_under(src: SourceState, placement: Placement, serving: list[str], previous: dict,
                 ended: Set[tuple[str, str]] = frozenset()) -> dict:
    """Every partition's owner under `placement`, among the serving workers, moving the fewest; the
    partitions read to their end (`ended`) stay where they are (`partitions.reassign`)."""
    out: dict[tuple[str, str], str] = {}
    by_op: dict[str, list[str]] = {}
    for op, p in src.parts:
        by_op.setdefault(op, []).append(p)
    for op, names in by_op.items():
        shares = {w: s for w, s in placement.operators[op].shares.items() if w in serving and s > 0}
        if not shares:
            shares = {sorted(serving)[0]: 1.0}
        prev = {p: w for (o, p), w in previous.items() if o == op}
        done = {p for o, p in ended if o == op}
        for p, w in reassign(names, shares, prev, done).items():
            out[(op, p)] = w
    return out


class SourcesCoordinator:
    """The planner's handlers for the readers' messages and the moves of partitions. What it asks of the
    planner is passed in: `reading_job(id)` (a job, also while it deploys), `job_of(msg)` (a request's job,
    or RequestError), `workers_of(job)` (its serving workers), `changed(job)` (what `wait_idle` waits on
    moved), `stale(job, ident)` (a message from a worker a rollback voided), `checkpoint(job)` (take one
    now), `busy(job)` (why the job is not idle, if it is not), `summary(job)` (`wait_idle`'s answer)."""

    def __init__(self, link: Link, *, reading_job: Callable, job_of: Callable, workers_of: Callable,
                 changed: Callable, stale: Callable, checkpoint: Callable, busy: Callable, summary: Callable):
        self.link = link
        self._reading_job, self._job, self._job_workers = reading_job, job_of, workers_of
        self._check_waiters, self._stale, self._checkpoint = changed, stale, checkpoint
        self._busy, self._idle_summary = busy, summary

    # ----------------------------------------------------------------- messages from the readers

    def on_lease(self, ident: bytes, msg: protocol.Lease) -> None:
        job = self._reading_job(msg.job)
        if job is None or job.src is None:
            return
        if job.life.restoring or job.life.phase is Phase.BARRIER:
            # Answered once the rollback voided older leases, or once every worker took the checkpoint's
            # barrier: a chunk at or above the boundary read (and its requests sent on) before another worker
            # took the barrier would reach that worker's stateful operators ahead of it, into the cut.
            job.src.deferred.append((ident, msg.chunks))
            return
        self._lease(job, ident, msg.chunks)

    def barrier_sent(self, job) -> None:
        """Every worker took the checkpoint's barrier: the leases asked for meanwhile go out, above it."""
        if job.src is None or job.life.restoring:
            return
        deferred, job.src.deferred = job.src.deferred, []
        for ident, n in deferred:
            self._lease(job, ident, n)

    def _lease(self, job, ident: bytes, n: int) -> None:
        first = job.tracker.lease(n)
        self.link.post(ident, protocol.pack(protocol.Leased(job.id, first, n)))

    def on_seal(self, ident: bytes, body: list) -> None:
        job = self._reading_job(body[0])
        if job is None or self._stale(job, ident):
            return
        t = job.tracker
        if t.sealed(body[1], body[2], body[3], time.monotonic(), ident.decode(errors="replace")):
            if t.credit:
                self.send_credit(job)
            if t.outstanding == 0:
                self._check_waiters(job)

    def on_read_end(self, ident: bytes, msg: protocol.ReadEnd) -> None:
        job = self._reading_job(msg.job)
        if job is None or job.src is None:
            return
        if job.life.restoring and ident.decode(errors="replace") not in job.retired:
            # A partition reopened at the checkpoint's position may be at its end already, and say so before
            # the rollback is over: kept until then, and taken if it comes from the restored era.
            job.src.deferred_ends.append((ident, msg))
            return
        if self._stale(job, ident):
            return
        key = (msg.op, msg.partition)
        if job.src.owners.get(key) == ident.decode(errors="replace"):
            job.src.ended.add(key)
            self._check_waiters(job)
            if not job.src.stealing and self._steals(job, busy_too=True):
                job.src.stealing = True
                self.link.background(self._steal(job), f"balancing the source partitions of job {job.id}")

    def send_credit(self, job) -> None:
        for w, n in job.tracker.take_credit().items():
            self.link.post(w.encode(), protocol.pack(protocol.Credit(job.id, n)))

    # ----------------------------------------------------------------- placement changes
    def _steals(self, job, busy_too: bool = False) -> dict:
        """The moves that even out a bounded source's partitions left to read (`partitions.steal`), for the
        sources whose partitions move cheaply (`Source.splits`); none once it has stopped reading, nor, unless
        `busy_too`, while the job rolls back, migrates or takes a checkpoint's barrier."""
        src = job.src
        if not src.bounded or src.stopped or job.life.retired:
            return {}
        if not busy_too and (job.life.restoring or job.life.migrating or job.life.phase is not Phase.RUNNING):
            return {}
        serving = set(self._job_workers(job))
        readers = {op: sorted(w for w, s in job.placement.operators[op].shares.items() if s > 0 and w in serving)
                   for op in src.splits}
        return steal(src.owners, src.ended, readers)

    async def _steal(self, job) -> None:
        """A worker read all of its partitions: some of a busier worker's move to it, with their positions
        (under the job's lock, so no checkpoint or migration sees a partition between two owners). The end
        that asked for it may come during a checkpoint's barrier, a migration or a rollback (a checkpoint
        every 0.3 s is in its barrier much of the time): it waits for the job to run again, since no other
        end may come to ask."""
        try:
            while self._reading_job(job.id) is job and self._steals(job, busy_too=True):
                async with job.lock:
                    moves = self._steals(job)
                    if moves:
                        await self._move(job, moves, {**job.src.owners, **{k: b for k, (_, b) in moves.items()}})
                        job.src.stolen += len(moves)
                        return
                await asyncio.sleep(STEAL_RETRY_S)
        finally:
            job.src.stealing = False

    async def move_partitions(self, job) -> None:
        """After a migration (under the job's lock): the partitions whose owner changes move, each with the
        position after the last batch its old owner admitted."""
        src = job.src
        if src is None or src.stopped:
            return
        serving = self._job_workers(job)
        if not serving:
            return
        new = owners_under(src, job.placement, serving, src.owners, src.ended)
        moves = moved_partitions(src.owners, new)
        if moves:
            await self._move(job, moves, new)

    async def _move(self, job, moves: dict, new: dict) -> None:
        """Release `moves` ((op, partition) -> (old, new owner)) from their old owners, then open them at
        the positions released on their new ones; `new` is every partition's owner after."""
        src = job.src
        await self._release_partitions(job, {k: a for k, (a, _) in moves.items()})
        by_new: dict[str, list] = {}
        for (op, p), (_, b) in moves.items():
            by_new.setdefault(b, []).append([op, p, src.positions.get((op, p))])
        src.owners = new
        replies = await asyncio.gather(*(self.link.rpc(w, protocol.SrcAssign(job.id, parts))
                                         for w, parts in by_new.items()), return_exceptions=True)
        for w, r in zip(by_new, replies, strict=True):
            if isinstance(r, Exception):
                log.warning("job %d: worker %s did not open its partitions: %s", job.id, w, r)
        log.info("job %d: %d source partition(s) moved: %s", job.id, len(moves),
                 {f"{op}/{p}": f"{a}->{b}" for (op, p), (a, b) in list(moves.items())[:8]})

    async def _release_partitions(self, job, owners: dict) -> None:
        """Ask each owner to stop reading its partitions among `owners` ((op, partition) -> worker); their
        positions become the last known ones. A worker that cannot answer (dead) leaves the last known
        position: with checkpoints its death rolls the job back anyway."""
        src = job.src
        serving = set(self._job_workers(job))
        by_old: dict[str, list] = {}
        for (op, p), w in owners.items():
            if w in serving:
                by_old.setdefault(w, []).append([op, p])
        replies = await asyncio.gather(*(self.link.rpc(w, protocol.SrcRelease(job.id, parts))
                                         for w, parts in by_old.items()), return_exceptions=True)
        for r in replies:
            if isinstance(r, dict):
                for op, p, pos in r["positions"]:
                    src.positions[(op, p)] = pos

    def restore(self, job, placement: Placement, serving: list[str], positions: dict | None) -> tuple:
        """A rollback's partitions: (owners, positions, the restore body's list); nothing while stopped."""
        src = job.src
        positions = dict(positions or {})
        if src.finished:
            return {}, positions, []
        owners = owners_under(src, placement, serving, {k: w for k, w in src.owners.items() if w in serving})
        return owners, positions, src.wire(owners, positions)

    def restored(self, job, owners: dict, positions: dict) -> None:
        """The rollback is done: every partition reopened at the checkpoint's position; older leases void."""
        src = job.src
        src.owners, src.positions, src.ended = owners, positions, set()
        src.stopped = src.finished
        deferred, src.deferred = src.deferred, []
        for ident, n in deferred:
            self._lease(job, ident, n)
        ends, src.deferred_ends = src.deferred_ends, []
        for ident, msg in ends:
            if msg.epoch == job.placement.epoch:  # not a report of the era rolled back
                key = (msg.op, msg.partition)
                if src.owners.get(key) == ident.decode(errors="replace"):
                    src.ended.add(key)

    def stats(self, job) -> dict | None:
        """`job.stats()["sources"]`: partitions, who reads how many, records read and complete."""
        src = job.src
        if src is None or not src.parts:
            return None
        owners: dict[str, int] = {}
        for w in src.owners.values():
            owners[w] = owners.get(w, 0) + 1
        t = job.tracker
        return {"partitions": len(src.parts), "ended": len(src.ended), "bounded": src.bounded,
                "stopped": src.stopped, "owners": owners, "read": t.read, "read_complete": t.read_done,
                "stolen": src.stolen}

    # ----------------------------------------------------------------- stop
    async def on_stop(self, ident: bytes, msg: protocol.Stop) -> None:
        """`job.stop()`: every reader stops (positions kept), what was read completes, a last checkpoint is
        taken (with checkpoints on); answered with what the job read and that checkpoint's id."""
        job = self._job(msg)
        src = job.src
        deadline = time.monotonic() + float(msg.timeout)
        if src is not None and not src.stopped:
            async with job.lock:
                src.stopped = True
                await self._release_partitions(job, dict(src.owners))
                src.owners = {}
        while (why := self._stop_busy(job)) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job.id} did not stop within {msg.timeout} s: it {why}")
            await asyncio.sleep(0.01)
        ckpt = None
        if job.ckpt.enabled:
            while ckpt is None:
                meta = await self._checkpoint(job)
                ckpt = meta["ckpt"] if meta else None
                if ckpt is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"job {job.id}: no last checkpoint within {msg.timeout} s")
                    await asyncio.sleep(0.05)
                if src is not None and not src.stopped:
                    raise RuntimeError(f"job {job.id}: a worker died while it stopped; it reads again from its "
                                       "last checkpoint: call stop() again")
        if src is not None:
            src.finished = True
        self.link.reply(ident, msg.req, {**self._idle_summary(job), "checkpoint": ckpt,
                                         "positions": src.as_list() if src is not None else []})

    def _stop_busy(self, job) -> str | None:
        if job.src is not None and not job.src.stopped:
            raise RuntimeError(f"job {job.id}: a worker died while it stopped; it reads again from its last "
                               "checkpoint: call stop() again")
        return self._busy(job)
