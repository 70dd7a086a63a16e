"""A job on the planner as one pure state machine: events in, instructions out, in the manner of dask's
`WorkerState.handle_stimulus` and h11's `_state.py`. Its phase (`clasp.core.lifecycle.JobLife`: running,
migrating, barrier, rolling back, orphaned, taken up, retired) decides what the rest of the job's life does,
and that rest is here, in one transition table (`JobMachine.handle`):

- admission (`Push`): a push is refused by a retired job, one whose input ended or one that has no root to
  feed; else its records join the queue (Q_p) and the tracker, charged in bytes (`clasp.core.credit`), and
  it is acknowledged with credit (`Ack`) while the job is within its bound and its chunks are logged
  (`LogChunk` first, `LogWritten` later), deferred otherwise (`Tick` and `LogWritten` release it);
- dispatch (`DispatchReady`): the scheduling engine (`clasp.core.scheduler.dispatch`) takes what the
  in-flight window has room for, as a `scheduler.Dispatch` the shell sends, only in a dispatching phase
  (running, migrating, orphaned) and when the checkpointer does not hold it at a chunk boundary; a
  stateless source's runs go to the least loaded of its workers (`scheduler.Loads`);
- progress (`Progress`): a worker's report closes epochs (`clasp.core.tracking`) and lowers its load;
  during a rollback, or from a worker a rollback retired, it is stale and changes nothing; a retired job
  ignores it;
- every other event (`Migrate`, `Barrier`, `RollBack`, `WorkerDied`, `Retire`, ...) is the phase's.

The machine keeps no data of its own: it owns the transitions over the job the planner holds (`JobData`)
and its components, the tracker, the queue and its bytes, and the bound. The shell (clasp.runtime:
planner, planner_dispatch) feeds it and carries out what it returns. On the per-push and per-report paths
it builds nothing per record, and a progress report's instructions are shared constants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clasp.core import scheduler
from clasp.core.credit import ByteQueue, QueueBound, charge, drain_rate, share
from clasp.core.lifecycle import JobLife, Phase, ResumeDispatch
from clasp.core.tracking import CHUNK_BITS, Tracker

CLIENT_IDLE = 2.0  # s without a push after which a client no longer shares a job's credit


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Push:
    """A client's push of `records`, received in `frame`; `nbytes` (the frame's bytes, its compressed segments
    at their packed size: `protocol.packed_size`) is the charge: no record is measured."""
    client: bytes
    req: int
    records: list
    frame: bytes
    now: float
    nbytes: int


@dataclass(frozen=True, slots=True)
class DispatchReady:
    """The dispatcher's turn for the job: send what the window has room for."""
    now: float


@dataclass(frozen=True, slots=True)
class Progress:
    """A worker's progress report: epoch -> {operator: requests produced minus finished}, and its queued
    work past the push roots in root requests (`behind`)."""
    sender: bytes
    deltas: Mapping
    now: float
    behind: int = 0


@dataclass(frozen=True, slots=True)
class LogWritten:
    """The input log handed back written chunks."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Once a tick (`dt` s since the last): the drain rate, the bound from it, the clients still pushing."""
    dt: float
    now: float


# ----------------------------------------------------------------- instructions
@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the push with this error; nothing was admitted."""
    reason: str


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge push `req` of `client` (`accepted` records) with the credit it may send on."""
    client: bytes
    req: int
    accepted: int
    credit: int


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Write `chunk` (admitted at `t`) to the job's input log; `frame`: the push's frame when it is all of it."""
    chunk: int
    t: float
    records: list
    nbytes: int
    frame: bytes | None


@dataclass(frozen=True, slots=True)
class LoadChunk:
    """The queue's head is a replayed chunk held on disk: read its records in, then dispatch again."""
    chunk: int


@dataclass(frozen=True, slots=True)
class ChunkBegins:
    """The first records of `chunk` are about to leave (event time marks the push partition)."""
    chunk: int


@dataclass(frozen=True, slots=True)
class SendCredit:
    """Source chunks completed: give their readers the credit back (`Tracker.take_credit`)."""


@dataclass(frozen=True, slots=True)
class MaybeIdle:
    """Nothing is outstanding: the job's `wait_idle` calls may be answered (after the shell's checks)."""


@dataclass(frozen=True, slots=True)
class Moved:
    """Records completed and nothing can leave for it now: what waits on the job's progress (a checkpoint's
    alignment) looks again, and the dispatcher is not woken."""


RESUME, CREDIT, IDLE, MOVED = ResumeDispatch(), SendCredit(), MaybeIdle(), Moved()
# What a report that completed records asks for, by (a dispatch could send now, source credit to give
# back, nothing outstanding): constants, so that a report allocates no instruction. A report that leaves
# the window without room for half a batch, or the queue empty, wakes no dispatch step: two in three of
# them used to, to send nothing.
_COMPLETED = {(go, credit, idle): (RESUME if go else MOVED,) + (CREDIT,) * credit + (IDLE,) * idle
              for go in (False, True) for credit in (False, True) for idle in (False, True)}


class Checkpointer(Protocol):
    """What the machine asks of the job's checkpointer (`clasp.runtime.planner_job`)."""

    enabled: bool

    def written(self, chunk: int) -> bool: ...

    def may_dispatch(self, job: Any) -> bool: ...


class JobData(Protocol):
    """The job as the planner holds it (`clasp.runtime.planner_job.PlannerJob`): what the machine moves."""

    id: int
    spec: Any
    tracker: Tracker
    queue: deque
    queued: int
    queue_bytes: ByteQueue
    queued_bytes: int
    deferred_acks: deque
    counters: dict
    clients: dict
    limit: int
    drain: float | None
    drained: int
    backlog: bool
    routes: list
    loads: scheduler.Loads
    window: int
    batch: int
    inflight: int
    errors: Any
    input_ended: bool
    retired: set
    ckpt: Checkpointer


class JobMachine:
    """One job's transitions: `handle(event)` returns the instructions, in the order the shell carries
    them out. `life`: its phase; `bound`: the planner's queue bound."""

    __slots__ = ("job", "bound", "life")

    def __init__(self, job: JobData, bound: QueueBound, life: JobLife):
        self.job, self.bound, self.life = job, bound, life

    # ----------------------------------------------------------------- what the shell reads
    def may_dispatch(self) -> bool:
        return self.life.may_dispatch and self.job.ckpt.may_dispatch(self.job)

    def stale(self, sender: bytes) -> bool:
        """A report of a rolled-back era: sent during a rollback, or by a worker a rollback retired (it no
        longer holds anything of the job)."""
        if self.life.restoring:
            return True
        return self.job.ckpt.enabled and sender.decode(errors="replace") in self.job.retired

    # ----------------------------------------------------------------- the transitions
    def handle(self, event) -> Sequence:
        """Take `event`; returns the instructions. A phase event the phase does not accept raises
        `lifecycle.InvalidTransition`."""
        step = _STEPS.get(type(event))
        return self.life.handle(event) if step is None else step(self, event)

    def _push(self, ev: Push) -> Sequence:
        job = self.job
        if self.life.phase is Phase.RETIRED:
            return (Refuse(f"job {job.id} is cancelled"),)
        if job.input_ended:
            return (Refuse(f"job {job.id}: its input ended (end_input)"),)
        if not job.spec.sources:
            return (Refuse(f"job {job.id} reads only its declared sources "
                           f"({', '.join(job.spec.operators[i].name for i in job.spec.readers)}): its DAG "
                           "has no other root for push() to feed"),)
        records, now = ev.records, ev.now
        job.clients[ev.client] = now
        total = charge(ev.nbytes, len(records))
        logs = job.ckpt.enabled
        out: list = []
        step = 1 << CHUNK_BITS
        base = 0
        for i in range(0, len(records), step):
            part = records[i:i + step] if len(records) > step else records
            base = job.tracker.admit(len(part), now)
            nbytes = share(total, len(records), i, len(part))
            job.queue.append([base, part, 0])
            job.queue_bytes.admit(nbytes)
            job.queued += len(part)
            if logs:  # the whole push in one chunk: its frame is what the log writes
                out.append(LogChunk(base >> CHUNK_BITS, now, part, nbytes, ev.frame if part is records else None))
        job.counters["pushed"] += len(records)
        if not logs and self._may_go():  # else the log's write, the window or the phase wakes the dispatch
            out.append(RESUME)
        if logs or job.deferred_acks or not self.bound.within(job.queued, job.queued_bytes, job.limit):
            # backpressure, or the input log has not written it yet: the client waits for this ack
            job.deferred_acks.append((ev.client, ev.req, len(records), base >> CHUNK_BITS))
        else:
            out.append(self._ack(ev.client, ev.req, len(records)))
        return out

    def _dispatch(self, ev: DispatchReady) -> Sequence:
        job = self.job
        if not self.may_dispatch():
            return ()
        out: list = []
        head = job.queue[0] if job.queue else None
        size = offset = 0
        if head is not None:
            if head[1] is None:
                return (LoadChunk(head[0] >> CHUNK_BITS),)
            size, offset = len(head[1]), head[2]
            if not offset:
                out.append(ChunkBegins(head[0] >> CHUNK_BITS))
        inflight = job.inflight
        if not inflight and (job.loads.out or job.loads.behind):  # nothing outstanding anywhere: none is behind
            job.loads.clear()
        d = scheduler.dispatch(job.queue, job.spec, job.routes,
                               scheduler.window_room(job.window, inflight, job.batch), job.loads)
        if d is None:
            return out
        n = d.count
        job.queued -= n
        job.drained += job.queue_bytes.taken(size, offset, n)
        if not job.queued:
            job.backlog = False
        job.counters["dispatched"] += n
        out.append(d)
        if d.failed:
            job.errors.extend(d.errors)
            job.counters["source_errors"] += len(d.failed)
        if job.tracker.dispatched(d.first, n, d.counts, ev.now) and not job.tracker.outstanding:
            out.append(IDLE)
        if job.deferred_acks:
            self._release(out)
        if self._may_go():  # the batch, not the window, stopped it (or the chunk ended): another step now
            out.append(RESUME)
        return out

    def _may_go(self) -> bool:
        """Whether a dispatch step could send now: records queued in a dispatching phase, past the input
        log, and the window has room for half a batch (`scheduler.window_room`), or the head is a replayed
        chunk to read in."""
        job = self.job
        return bool(job.queue) and self.may_dispatch() and (
            job.queue[0][1] is None or scheduler.window_room(job.window, job.inflight, job.batch) > 0)

    def _progress(self, ev: Progress) -> Sequence:
        if self.life.phase is Phase.RETIRED or self.stale(ev.sender):
            return ()
        job = self.job
        job.loads.report(ev.sender, ev.deltas, ev.behind)
        t = job.tracker
        if not t.progress(ev.deltas, ev.now):
            return ()
        return _COMPLETED[self._may_go(), bool(t.credit), not t.outstanding and not job.queued]

    def _log_written(self, ev: LogWritten) -> Sequence:
        out = self._release([])
        if self._may_go():
            out.append(RESUME)
        return out

    def _tick(self, ev: Tick) -> Sequence:
        job = self.job
        job.drain = drain_rate(job.drain, job.drained, ev.dt, job.backlog and job.queued > 0)
        job.drained = 0
        job.backlog = job.queued > 0
        job.limit = self.bound.limit(job.drain)
        for client in [c for c, t in job.clients.items() if ev.now - t > CLIENT_IDLE]:
            del job.clients[client]
        return self._release([]) if job.deferred_acks else ()  # the limit may have grown

    def _release(self, out: list) -> list:
        """The deferred acknowledgements, in order, while the job is within its bound and the input log has
        written their chunks."""
        job = self.job
        acks, written = job.deferred_acks, job.ckpt.written
        while acks and self.bound.within(job.queued, job.queued_bytes, job.limit) and written(acks[0][3]):
            client, req, n, _ = acks.popleft()
            out.append(self._ack(client, req, n))
        return out

    def _ack(self, client: bytes, req: int, n: int) -> Ack:
        job = self.job
        return Ack(client, req, n, self.bound.credit(job.queued_bytes, job.limit, len(job.clients)))


_STEPS: dict[type, Callable] = {Push: JobMachine._push, DispatchReady: JobMachine._dispatch,
                                Progress: JobMachine._progress, LogWritten: JobMachine._log_written,
                                Tick: JobMachine._tick}
