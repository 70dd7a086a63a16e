"""The planner's dispatcher: the incoming request queue of each job and its scheduling engine. Pushes are
admitted (chunked, charged against the job's queue bound, logged by its checkpointer) and acknowledged
with credit once within the bound and written; the dispatch loop sends queued records to the workers
holding the source operators while the job's in-flight window has room (`clasp.core.scheduler`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from clasp.core import protocol, scheduler
from clasp.core.credit import QueueBound, charge, drain_rate, share
from clasp.core.lifecycle import ResumeDispatch
from clasp.core.limits import Limits, check_client_pending
from clasp.core.routing import route_to
from clasp.core.tracking import CHUNK_BITS
from clasp.runtime.net import DirectSend
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, RequestError

CLIENT_IDLE = 2.0  # s without a push after which a client no longer shares a job's credit



class Dispatcher:
    """`jobs` and `pushers` (worker -> its data socket) are the planner's tables; `job_of(msg)`: a
    request's job (or RequestError); `changed(job)`: what `wait_idle` waits on moved. `wake` is set when
    there may be something to dispatch."""

    def __init__(self, link: Link, limits: Limits, bound: QueueBound, jobs: dict, pushers: dict[str, DirectSend],
                 *, max_inflight: int | None, dispatch_batch: int, job_of: Callable, changed: Callable,
                 chunk_begins: Callable = lambda job, chunk: None):
        self.link, self.limits, self.bound = link, limits, bound
        self.jobs, self.pushers = jobs, pushers
        self.max_inflight, self.dispatch_batch = max_inflight, dispatch_batch
        self.job_of, self.changed = job_of, changed
        self.chunk_begins = chunk_begins  # (job, chunk) as the chunk's first records leave
        # (job) once `end_input` is known, before it is answered: the checkpointer makes it durable (its `persist`)
        self.input_ended: Callable = lambda job: None
        self.wake = asyncio.Event()

    def set_routes(self, job: PlannerJob) -> None:
        job.routes = [route_to(job.spec, job.placement, s, None) for s in job.spec.sources]
        job.window, job.batch = scheduler.dispatch_limits(self.max_inflight, self.dispatch_batch,
                                                          scheduler.source_holders(job.spec, job.placement),
                                                          len(job.placement.active_workers()))

    def on_push(self, ident: bytes, msg: protocol.Push, frame: bytes = b"") -> None:
        job = self.job_of(msg)
        if job.life.retired:
            raise RequestError(f"job {job.id} is cancelled")
        if job.input_ended:
            raise RequestError(f"job {job.id}: its input ended (end_input)")
        if not job.spec.sources:
            raise RequestError(f"job {job.id} reads only its declared sources "
                               f"({', '.join(job.spec.operators[i].name for i in job.spec.readers)}): its DAG "
                               "has no other root for push() to feed")
        records = msg.records
        if job.deferred_acks:  # a client that pushes on without waiting for its acks: bounded, refused
            check_client_pending(sum(1 for a in job.deferred_acks if a[0] == ident), self.limits)
        now = time.monotonic()
        job.clients[ident] = now
        total = charge(len(frame), len(records))  # the frame's bytes: no record is measured on its own
        step = 1 << CHUNK_BITS
        base = 0
        for i in range(0, len(records), step):
            part = records[i:i + step] if len(records) > step else records
            base = job.tracker.admit(len(part), now)
            nbytes = share(total, len(records), i, len(part))
            job.queue.append([base, part, 0])
            job.queue_bytes.admit(nbytes)
            # the whole push in one chunk: its frame is what the log writes
            job.ckpt.on_push(base, now, part, nbytes, frame if part is records else None)
            job.queued += len(part)
        job.counters["pushed"] += len(records)
        self.wake.set()
        last = base >> CHUNK_BITS
        if (job.deferred_acks or not self.bound.within(job.queued, job.queued_bytes, job.limit)
                or not job.ckpt.written(last)):
            # backpressure, or the input log has not written it yet: the client waits for this ack
            job.deferred_acks.append((ident, msg.req, len(records), last))
        else:
            self.link.post(ident, self._push_ack(job, msg.req, len(records)))

    def on_end_input(self, ident: bytes, msg: protocol.EndInput) -> None:
        job = self.job_of(msg)
        job.input_ended = True
        self.input_ended(job)  # a planner restarted on the state directory still knows it
        self.changed(job)
        self.link.reply(ident, msg.req, True)

    def release_acks(self, job: PlannerJob) -> None:
        """Acknowledge the deferred pushes, in order, while the job is within its bound and the input log
        has written them."""
        acks = job.deferred_acks
        while acks and self.bound.within(job.queued, job.queued_bytes, job.limit) and job.ckpt.written(acks[0][3]):
            ident, req, count, _ = acks.popleft()
            self.link.post(ident, self._push_ack(job, req, count))

    def log_written(self, job_id: int) -> None:
        """The input log handed back written chunks: their pushes may be acknowledged and dispatched."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.release_acks(job)
            self.wake.set()

    def _push_ack(self, job: PlannerJob, req: int, n: int) -> bytes:
        """A push's acknowledgement, with the credit the client may send on (`clasp.core.credit`)."""
        credit = self.bound.credit(job.queued_bytes, job.limit, len(job.clients))
        return protocol.reply(req, {"accepted": n, "credit": credit, "bound": self.bound.max_bytes})

    # ----------------------------------------------------------------- the scheduling engine
    async def run(self) -> None:
        while True:
            sent = 0
            for job in list(self.jobs.values()):
                sent += self.dispatch(job)
            if sent:
                await asyncio.sleep(0)
                continue
            self.wake.clear()
            await self.wake.wait()

    def carry_out(self, steps: list) -> None:
        """The dispatcher's part of a job's phase change (clasp.core.lifecycle)."""
        if any(isinstance(s, ResumeDispatch) for s in steps):
            self.wake.set()

    def dispatch(self, job: PlannerJob) -> int:
        """Send queued records to the source operators' workers while the in-flight window has room."""
        job.ckpt.poke()  # every change a checkpoint waits for (queue, tracker) wakes the dispatcher first
        if not (job.life.may_dispatch and job.ckpt.may_dispatch(job)):
            return 0
        head = job.queue[0] if job.queue else None
        if head is not None and head[1] is None:  # a replayed chunk, read from the input log when it is due
            head[1] = job.ckpt.log.records(head[0] >> CHUNK_BITS)
        size, offset = (len(head[1]), head[2]) if head else (0, 0)
        if head is not None and not offset:
            self.chunk_begins(job, head[0] >> CHUNK_BITS)
        d = scheduler.dispatch(job.queue, job.spec, job.routes,
                               scheduler.window_room(job.window, job.inflight, job.batch))
        if d is None:
            return 0
        n = d.count
        job.queued -= n
        job.drained += job.queue_bytes.taken(size, offset, n)
        if not job.queued:
            job.backlog = False
        job.counters["dispatched"] += n
        epoch = job.placement.epoch
        for dest, rows in d.data.items():
            self.pushers[dest].send(protocol.encode("data", [job.id, epoch, rows]), copy=False)
        for dest, rs in d.runs.items():
            self.pushers[dest].send(protocol.encode("runs", [job.id, epoch, rs]), copy=False)
        if d.failed:
            job.errors.extend(d.errors)
            job.counters["source_errors"] += len(d.failed)
        if job.tracker.dispatched(d.first, n, d.counts, time.monotonic()) and not job.tracker.outstanding:
            self.changed(job)
        if job.deferred_acks:
            self.release_acks(job)
        return n

    def drain_tick(self, job: PlannerJob, dt: float, now: float) -> None:
        """Once a tick: the queue's drain rate, the job's limit from it, and the clients still pushing."""
        job.drain = drain_rate(job.drain, job.drained, dt, job.backlog and job.queued > 0)
        job.drained = 0
        job.backlog = job.queued > 0
        job.limit = self.bound.limit(job.drain)
        for ident in [i for i, t in job.clients.items() if now - t > CLIENT_IDLE]:
            del job.clients[ident]
        if job.deferred_acks:  # the limit may have grown
            self.release_acks(job)

