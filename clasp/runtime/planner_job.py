"""A job as the planner holds it (`PlannerJob`), and its checkpointer: `CheckpointState` (the coordinator's
bookkeeping and the input log) or `CHECKPOINTS_OFF`, the one for a job without checkpoints, which answers
the same questions (may it dispatch, is a chunk written) so that nothing asks "are checkpoints on?" but
the checkpoint coordinator's loop, the job's machine (what to log, which reports are stale) and the
choice of a recovery."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from clasp.core import scheduler
from clasp.core.checkpoint import Coordinator
from clasp.core.control import Controller, Rebalancer
from clasp.core.credit import DEFAULT_MAX_QUEUED_BYTES, ByteQueue, QueueBound
from clasp.core.dag import DagSpec
from clasp.core.job_machine import JobMachine
from clasp.core.lifecycle import JobLife
from clasp.core.routing import Placement
from clasp.core.tracking import CHUNK_BITS, Tracker
from clasp.runtime.input_log import InputLog
from clasp.runtime.planner_sources import SourceState
from clasp.runtime.state_store import CorruptCheckpoint, FileStore, decode_collected


class StageTimes:
    """The complete checkpoints' time per stage (s), summed: `means_ms` per checkpoint."""

    def __init__(self):
        self.n = 0
        self.sums: dict[str, float] = {}

    def add(self, stages: dict[str, float]) -> None:
        self.n += 1
        for k, v in stages.items():
            self.sums[k] = self.sums.get(k, 0.0) + v

    def means_ms(self) -> dict[str, float]:
        return {k: round(v / self.n * 1e3, 2) for k, v in self.sums.items()} if self.n else {}


class CheckpointState:
    """What a job carries for checkpoints (on `PlannerJob.ckpt`)."""

    def __init__(self, store: FileStore, job: int, memory_records: int, memory_bytes: int = 128 << 20,
                 notify=None, released_memory: int = 64 << 20):
        self.coord = Coordinator()
        self.log = InputLog(store, job, memory_records, memory_bytes, notify)
        self.want = False  # stop dispatching at the next chunk boundary
        self.next_at = 0.0  # (monotonic) when the next checkpoint is due: an interval after the last began
        # checkpoint id -> operator -> the collected outputs that complete checkpoint released, as packed
        # msgpack arrays (the workers' or its file's: `collected` answers splice them, never decoded here);
        # None where they are in the file only: past `released_memory` bytes, the oldest are read from their
        # files when asked for, so a job that collects for its whole life does not grow the planner's memory
        # with it (its disk grows, as a file sink's would)
        self.store, self.job, self.released_memory = store, job, released_memory
        self.released_by: dict[int, dict[str, list[bytes]] | None] = {}
        self.replayed = 0
        self.replay_to = 0  # records complete (or lost) before the last rollback: the replay catches up to it
        self.last_recovery: dict | None = None
        self.dying: set[str] = set()  # workers declared dead whose recovery has not run yet
        self.last_pause = 0.0
        self.last_pause_cpu = 0.0
        self.stages = StageTimes()
        self.persisted = b""  # the job's record as last written to the state directory, but its key weights
        # Set when what a checkpoint waits for may have changed (a dispatch step, a worker declared dead):
        # the checkpoint sleeps on it instead of polling the queue and the tracker every millisecond.
        self.moved = asyncio.Event()

    enabled = True

    def poke(self) -> None:
        self.moved.set()

    def release(self, ckpt: int, collected: dict[str, list[bytes]] | None) -> None:
        """Keep the outputs checkpoint `ckpt` released (its file written; None: left in it), leaving the oldest
        in their files past `released_memory` bytes."""
        self.released_by[ckpt] = collected
        total = self.released_in_memory()
        for k in sorted(k for k, v in self.released_by.items() if v is not None)[:-1]:  # the newest stays
            if total <= self.released_memory:
                break
            total -= _size(self.released_by[k])
            self.released_by[k] = None

    def released_in_memory(self) -> int:
        """Bytes of the released outputs held in memory."""
        return sum(_size(v) for v in self.released_by.values() if v is not None)

    def forget_released(self, ckpt: int) -> None:
        """Drop the outputs of a checkpoint rolled back over, and their file."""
        del self.released_by[ckpt]
        self.store.remove_file(self.released_file(ckpt))

    def released_file(self, ckpt: int) -> str:
        return f"job-{self.job}/collected/{ckpt}.kg"

    async def released(self, op: str) -> list[bytes]:
        """`op`'s released outputs, oldest first, as packed msgpack arrays; those only in their files read in a
        thread. A checkpoint rolled back over meanwhile (its file removed) is left out."""
        entries = sorted(self.released_by.items())
        on_disk = [k for k, parts in entries if parts is None]
        if on_disk:
            loaded = await asyncio.to_thread(lambda: {k: self.store.read_file(self.released_file(k)) for k in on_disk})
            entries = [(k, parts) for k, parts in entries if k in self.released_by]
            for i, (k, parts) in enumerate(entries):
                if parts is None:
                    if loaded[k] is None:
                        raise CorruptCheckpoint(self.released_file(k), "the released outputs' file is missing")
                    entries[i] = (k, decode_collected(loaded[k], self.released_file(k)))
        return [x for _, parts in entries for x in parts.get(op, ())]

    def may_dispatch(self, job) -> bool:
        if self.want and job.queue and job.queue[0][2] == 0:
            return False  # at a chunk boundary: the barrier goes in here
        return not job.queue or self.log.written(job.queue[0][0] >> CHUNK_BITS)  # never ahead of the log

    def written(self, chunk: int) -> bool:
        return self.log.written(chunk)

    def recovering(self, job, wid: str) -> bool:
        """Worker `wid` (declared dead) still has a rollback of the job to go through."""
        return wid in self.dying or wid not in job.retired

    def floor(self, placement) -> int:
        """The epoch below which a worker drops what it receives (a deploy's `floor`)."""
        return placement.epoch

    def close(self) -> None:
        self.log.close()


class CheckpointsOff:
    """The checkpointer of a job without checkpoints: dispatch never waits for it, nothing is logged, no
    progress report is stale, and a worker's death re-plans the job without rolling it back."""

    enabled = False
    replay_to = 0

    async def released(self, op: str) -> list:
        return []

    def may_dispatch(self, job) -> bool:
        return True

    def poke(self) -> None:
        pass

    def written(self, chunk: int) -> bool:
        return True

    def recovering(self, job, wid: str) -> bool:
        return job.lock.locked()

    def floor(self, placement) -> int:
        return 0

    def close(self) -> None:
        pass


CHECKPOINTS_OFF = CheckpointsOff()  # holds nothing of a job: one serves every job


def _size(collected: dict[str, list[bytes]]) -> int:
    return sum(len(p) for parts in collected.values() for p in parts)



@dataclass
class PlannerJob:
    """A submitted job as the planner holds it."""

    id: int
    spec: DagSpec
    placement: Placement
    tracker: Tracker
    workers: list[str]
    queue: deque = field(default_factory=deque)  # [base_rid, records, offset] not yet dispatched (Q_p)
    queued: int = 0
    queue_bytes: ByteQueue = field(default_factory=ByteQueue)  # the bytes of Q_p, chunk by chunk (clasp.core.credit)
    counters: dict = field(default_factory=lambda: {"pushed": 0, "dispatched": 0, "source_errors": 0})
    series: deque = field(default_factory=lambda: deque(maxlen=3600))
    last: dict = field(default_factory=dict)
    waiters: list = field(default_factory=list)  # [ident, req, deadline, time.time() when called]
    deferred_acks: deque = field(default_factory=deque)  # (client, req, records, last chunk) not acknowledged yet
    limit: int = DEFAULT_MAX_QUEUED_BYTES  # the bytes Q_p may hold now (QueueBound.limit of the drain rate)
    drain: float | None = None  # bytes/s the dispatch drains Q_p at while it holds a backlog (credit.drain_rate)
    drained: int = 0  # bytes dispatched since the last tick
    backlog: bool = False  # Q_p held records throughout the tick so far
    clients: dict = field(default_factory=dict)  # client -> when it last pushed: they share the credit
    routes: list = field(default_factory=list)
    loads: scheduler.Loads = field(default_factory=scheduler.Loads)  # per worker, its source requests outstanding
    window: int = scheduler.WINDOW_MIN  # records in flight and per dispatch (`scheduler.dispatch_limits`)
    batch: int = scheduler.BATCH_MIN
    created: float = field(default_factory=time.time)
    errors: deque = field(default_factory=lambda: deque(maxlen=50))
    autoscale: bool = False
    controller: Controller | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    migrations: list = field(default_factory=list)
    decisions: deque = field(default_factory=lambda: deque(maxlen=200))
    estimate: dict = field(default_factory=dict)
    key_weights: dict = field(default_factory=dict)  # stateful operator -> requests/s per key group (smoothed)
    rebalancer: Rebalancer = field(default_factory=Rebalancer)  # its key groups follow their measured load
    lost_workers: set = field(default_factory=set)  # every worker that died while serving the job
    retired: set = field(default_factory=set)  # of those, the ones not serving it again (no redeploy yet)
    recovering: set = field(default_factory=set)  # declared dead while serving it, the recovery not over
    rejoining: set = field(default_factory=set)  # restarted workers being deployed the job again
    confirming: bool = False  # asking every worker whether it is alive before wait_idle returns
    sweep: tuple | None = None  # (suspects, clean checks in a row) while looking for records lost with a worker
    settled: Placement | None = None  # the placement of the last migration every worker completed
    state: str = "local"  # "remote": stateful operators keep their state in the planner's state server
    ckpt: CheckpointState | CheckpointsOff = CHECKPOINTS_OFF  # checkpoints and the input log, or off
    spec_wire: dict = field(default_factory=dict)  # the DAG as submitted (DagSpec.pack())
    policy: str = "clasp"
    src: SourceState | None = None  # declared sources: partitions, owners, positions (None: push only)
    input_ended: bool = False  # `job.end_input()`: no more pushes
    # Its transitions (clasp.core.job_machine): the planner gives it the planner's bound and the job's phase.
    machine: JobMachine = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.machine = JobMachine(self, QueueBound(), JobLife(False))

    @property
    def life(self) -> JobLife:
        """Its phase (clasp.core.lifecycle)."""
        return self.machine.life

    def clear_queue(self) -> None:
        """Drop every record not dispatched yet (a cancel; a rollback, before it queues the replay)."""
        self.queue.clear()
        self.queue_bytes.clear()
        self.queued = 0

    @property
    def queued_bytes(self) -> int:
        return self.queue_bytes.total

    @property
    def inflight(self) -> int:
        """Records in the window: dispatched, not complete, and not suspected lost with a dead worker."""
        t = self.tracker
        return self.counters["dispatched"] - (t.completed - t.read_done) - t.lost - t.suspects
