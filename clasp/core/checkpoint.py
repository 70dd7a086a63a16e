"""Checkpoints of keyed state and recovery, as pure state (no sockets, no event loop, no files).

A checkpoint `k` is a cut through the stream at a record-id *boundary*: its state holds the effect of every
record below the boundary and of none above it. Boundaries fall on admission chunks (`tracking.CHUNK_BITS`):
the planner stops dispatching at a chunk boundary, tells every worker of the job the boundary (the barrier),
and dispatches on. A worker holding a barrier keeps every request of a record at or above the boundary out
of its stateful operators' queues (stateless operators run on: they have no state). Epoch progress
(`clasp.core.tracking`) tells the planner when every record below the boundary is complete, anywhere in the
cluster: that is the alignment (the barrier "has arrived on every input" of every operator, since no request
below it is left anywhere). The planner then asks for the snapshot; each worker writes the key groups it
owns, releases what it held and acknowledges. The checkpoint is complete when every worker of the job acked.

Recovery rolls the whole job back to the newest complete checkpoint: survivors (and new workers) restore
the groups they own in the recovery placement, every request of the aborted era is dropped (its epoch is
below the recovery epoch), the planner resets the tracker for every record at or above the boundary and
replays them from its input log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clasp.core.control import pool_order
from clasp.core.dag import DagSpec
from clasp.core.routing import NUM_KEY_GROUPS, OperatorPlacement, Placement, key_groups_for_shares
from clasp.core.sinks import aligned_operators
from clasp.core.tracking import CHUNK_BITS, Tracker

KEEP_COMPLETE = 2  # complete checkpoints kept on disk (and input kept back to the older one)
GAP_SHARE = 0.25  # of the interval: the least time from one checkpoint's end to the next one's start


@dataclass
class CompleteCheckpoint:
    id: int
    boundary: int  # first chunk *not* in the checkpoint; record ids below boundary << CHUNK_BITS are in it
    groups: dict[str, list[int]]  # stateful operator -> key groups that have a file
    bytes: int = 0
    duration_s: float = 0.0
    # (source operator, partition) -> position at the cut: where a rollback to this checkpoint reopens it
    positions: dict = field(default_factory=dict)
    # the event-time watermark per stage released when the barrier went up: where a rollback's watermark starts
    watermark: list | None = None


@dataclass
class PendingCheckpoint:
    id: int
    boundary: int
    t0: float
    workers: set[str]
    acked: set[str] = field(default_factory=set)
    groups: dict[str, list[int]] = field(default_factory=dict)
    bytes: int = 0
    # operator -> the outputs of records below the boundary: the workers' packed msgpack arrays, as they came
    collected: dict[str, list[bytes]] = field(default_factory=dict)
    positions: dict = field(default_factory=dict)  # the sources' positions at the cut (the barrier's replies)
    watermark: list | None = None  # the watermark per stage released when the barrier went up (event time)


class CheckpointError(Exception):
    """A checkpoint that cannot complete (a worker failed to write, died, or timed out)."""


class Coordinator:
    """The planner's checkpoint bookkeeping for one job: the pending checkpoint, the complete ones kept."""

    def __init__(self, keep: int = KEEP_COMPLETE):
        self.keep = keep
        self.next_id = 1
        self.pending: PendingCheckpoint | None = None
        self.complete: list[CompleteCheckpoint] = []  # oldest first, at most `keep`
        self.counts = {"completed": 0, "failed": 0, "recoveries": 0, "replayed": 0}
        # Outputs the workers handed over with a checkpoint whose manifest could not be written: they are
        # released by the next one that completes, or dropped by a rollback (their records run again).
        self.unreleased: dict[str, list[bytes]] = {}
        self.last_duration = 0.0
        self.last_bytes = 0
        self.failures: list[str] = []

    def begin(self, boundary: int, workers: Sequence[str], now: float) -> PendingCheckpoint:
        if self.pending is not None:
            raise CheckpointError(f"checkpoint {self.pending.id} is still pending")
        if self.complete and boundary < self.complete[-1].boundary:
            raise CheckpointError(f"boundary {boundary} behind checkpoint {self.complete[-1].id}")
        p = PendingCheckpoint(self.next_id, boundary, now, set(workers))
        self.next_id += 1
        self.pending = p
        return p

    def ack(self, ckpt: int, worker: str, groups: Mapping[str, Sequence[int]], nbytes: int,
            collected: Mapping[str, bytes] | None = None) -> bool:
        """One worker wrote its groups of `ckpt`; True when that completes the checkpoint (call `finish`).
        `collected`: operator -> its outputs below the boundary as one packed msgpack array (kept as it came:
        the planner neither decodes nor re-encodes a query's answer)."""
        p = self.pending
        if p is None or p.id != ckpt or worker not in p.workers:
            return False
        if worker in p.acked:
            return p.acked == p.workers
        p.acked.add(worker)
        for op, gs in groups.items():
            p.groups.setdefault(op, []).extend(int(g) for g in gs)
        p.bytes += nbytes
        for op, part in (collected or {}).items():
            p.collected.setdefault(op, []).append(part)
        return p.acked == p.workers

    def finish(self, now: float) -> tuple[CompleteCheckpoint, dict[str, list[bytes]]]:
        """Every worker acked the pending checkpoint: returns it and the outputs it releases to clients (per
        operator, the packed arrays in order). It counts as complete once its manifest is written (`committed`)."""
        p = self.pending
        if p is None or p.acked != p.workers:
            raise CheckpointError("no checkpoint has every ack")
        for op, gs in p.groups.items():
            if len(gs) != len(set(gs)):
                raise CheckpointError(f"checkpoint {p.id}: a key group of {op!r} written twice")
        done = CompleteCheckpoint(p.id, p.boundary, {op: sorted(gs) for op, gs in p.groups.items()}, p.bytes,
                                  now - p.t0, dict(p.positions), p.watermark)
        self.pending = None
        collected, self.unreleased = self.unreleased, {}
        for op, parts in p.collected.items():
            collected[op] = collected.get(op, []) + parts
        return done, collected

    def not_committed(self, collected: dict[str, list[bytes]], reason: str) -> None:
        """The manifest of the checkpoint `finish` returned could not be written: it failed, and the outputs
        it would have released wait for the next one."""
        self.unreleased = collected
        self.counts["failed"] += 1
        self.failures = [*self.failures[-9:], reason]

    def rolled_back(self) -> None:
        """A rollback to the newest complete checkpoint: the records of unreleased outputs run again."""
        self.unreleased = {}

    def committed(self, done: CompleteCheckpoint) -> list[int]:
        """`done`'s manifest is on disk: it is complete, the newest to restore; returns the ids of the
        checkpoints to delete (beyond the `keep` newest)."""
        self.complete.append(done)
        dropped = [c.id for c in self.complete[:-self.keep]]
        self.complete = self.complete[-self.keep:]
        self.counts["completed"] += 1
        self.last_duration, self.last_bytes = done.duration_s, done.bytes
        return dropped

    def fail(self, reason: str) -> int | None:
        """The pending checkpoint failed; returns its id (its files may be deleted) or None."""
        p, self.pending = self.pending, None
        if p is None:
            return None
        self.counts["failed"] += 1
        self.failures = [*self.failures[-9:], f"checkpoint {p.id}: {reason}"]
        return p.id

    def discard(self, ckpt: int) -> None:
        """A complete checkpoint found unreadable (a corrupt file): recovery falls back to the one before."""
        self.complete = [c for c in self.complete if c.id != ckpt]

    def restore_target(self) -> CompleteCheckpoint | None:
        """The checkpoint to roll back to: the newest complete one; None means the job's start (empty state)."""
        return self.complete[-1] if self.complete else None

    def log_floor(self) -> int:
        """The first chunk the input log must still hold: the oldest kept checkpoint's boundary, so that
        recovery can fall back to it when the newest one turns out unreadable."""
        return self.complete[0].boundary if self.complete else 0


def next_due(started: float, ended: float | None, interval: float) -> float:
    """When a job's next checkpoint is due, its last one having begun at `started` (and ended at `ended`,
    None while it runs): `interval` after it began, so checkpoints are `interval` apart whatever each took;
    but never sooner than `GAP_SHARE` of an interval after it ended, so a cluster too slow to complete one
    within the interval still runs without a barrier up for a while between two."""
    due = started + interval
    return due if ended is None else max(due, ended + GAP_SHARE * interval)


# The checkpoint scheduler sleeps until the next checkpoint due (or a job is submitted), but looks again
# within SCHEDULE_TICK while one cannot start (a checkpoint, a migration or a rollback under way) and within
# SCHEDULE_LOOK at most (a job with nothing admitted since its last checkpoint may have input now): polling
# every 50 ms cost the idle planner ~2 ms of CPU a second, half of all it spent.
SCHEDULE_TICK = 0.05
SCHEDULE_LOOK = 0.25


def look_delay(now: float, due: Sequence[float], held: bool, interval: float) -> float:
    """Seconds until the scheduler's next look at `now`: the earliest of the checkpoints `due` (monotonic
    times ahead), at most SCHEDULE_TICK when a job is `held`, and never more than SCHEDULE_LOOK or `interval`."""
    most = min(interval, SCHEDULE_TICK if held else SCHEDULE_LOOK)
    return max(0.0, min(most, *(t - now for t in due)) if due else most)


def boundary_reached(tracker: Tracker, boundary: int) -> bool:
    """Every record of the chunks below `boundary` is complete (or was given up on)."""
    oldest = tracker.oldest_chunk()
    return oldest is None or oldest >= boundary


def dispatch_boundary(queue: Sequence, tracker: Tracker) -> int | None:
    """The chunk at which dispatching may stop for a barrier: the head of the queue when nothing of it was
    dispatched yet, the next chunk to be admitted when the queue is empty; None in the middle of a chunk."""
    if not queue:
        return tracker.next_chunk
    base, _records, offset = queue[0]
    return base >> CHUNK_BITS if offset == 0 else None


def recovery_placement(spec: DagSpec, old: Placement, alive: Sequence[str], key_weights: Mapping[str, list],
                       epoch: int) -> Placement:
    """`old` with every share and key group of the workers not in `alive` moved onto those that are."""
    if not alive:
        raise CheckpointError("no live worker to recover on")
    ops = {}
    for o in spec.operators:
        p = old.operators[o.name]
        shares = {w: s for w, s in p.shares.items() if w in alive}
        if not shares:
            shares = {pool_order(old, alive)[0]: 1.0}
        total = sum(shares.values())
        shares = {w: v / total for w, v in shares.items()}
        kg = (key_groups_for_shares(shares, NUM_KEY_GROUPS, p.key_groups, key_weights.get(o.name))
              if o.stateful else None)
        ops[o.name] = OperatorPlacement(shares, {w: p.instances.get(w, 1) for w in shares}, kg)
    return Placement(ops, epoch, list(old.workers))


def groups_to_restore(spec: DagSpec, placement: Placement, worker: str,
                      written: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The key groups `worker` owns under `placement` that the checkpoint has a file for, per operator."""
    out = {}
    for o in spec.operators:
        if not o.stateful:
            continue
        have = set(written.get(o.name, ()))
        mine = [g for g, w in enumerate(placement.operators[o.name].key_groups) if w == worker and g in have]
        if mine:
            out[o.name] = mine
    return out


def split_collected(outputs: Sequence, rids: Sequence[int], boundary_rid: int) -> tuple[list, list, list, list]:
    """Collected outputs and their record ids split at a boundary: (below, their rids, at or above, rids)."""
    lo, lo_r, hi, hi_r = [], [], [], []
    for out, rid in zip(outputs, rids, strict=True):
        if rid < boundary_rid:
            lo.append(out)
            lo_r.append(rid)
        else:
            hi.append(out)
            hi_r.append(rid)
    return lo, lo_r, hi, hi_r


def barrier_holds(spec: DagSpec) -> set[int]:
    """The stateful operators whose requests at or above a barrier's boundary wait out of their queues until the
    snapshot (aligned); the other stateful operators run on, keeping a key group's image before the first such
    request changes it (copy on write).

    An async operator cannot keep an image (its calls interleave). Operators whose outputs are seen (they reach
    a sink, a collection or another stateful operator: `clasp.core.sinks.aligned_operators`) align: records
    below the boundary keep coming after the barrier (dispatched or read before it), and a request above it
    that overtook one below at a key would emit from a state the checkpoint does not hold (a running count's
    n). The others run on with copy on write, whatever feeds them (pushed or declared sources)."""
    aligned = aligned_operators(spec)
    return {o.index for o in spec.operators if o.stateful and (o.is_async or o.index in aligned)}
