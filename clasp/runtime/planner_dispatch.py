"""The planner's dispatcher: the shell of each job's machine (`clasp.core.job_machine`) for its input.
It feeds the machine a push, its turn to dispatch, the input log's writes and the tick, and carries out
what the machine decides: the pushes admitted are logged by the job's checkpointer and acknowledged with
the credit the machine computed; the queued records the machine takes (`clasp.core.scheduler`) are sent to
the workers holding the source operators; the dispatch loop gives every job its turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from clasp.core import protocol, scheduler
from clasp.core.credit import QueueBound
from clasp.core.job_machine import (
    Ack,
    ChunkBegins,
    DispatchReady,
    LoadChunk,
    LogChunk,
    LogWritten,
    MaybeIdle,
    Moved,
    Push,
    Refuse,
    SendCredit,
    Tick,
)
from clasp.core.lifecycle import ResumeDispatch
from clasp.core.limits import Limits, check_client_pending
from clasp.core.routing import ROUTE_TABLE, route_to
from clasp.core.scheduler import Dispatch
from clasp.core.tracking import CHUNK_BITS
from clasp.runtime.net import DirectSend
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, RequestError


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
        self.send_credit: Callable = lambda job: None  # (job) its readers' source chunks completed: the sources'
        self.bad: Callable = lambda err: None  # (ProtocolError) counted in the planner's bad-message metric
        self.wake = asyncio.Event()

    def set_routes(self, job: PlannerJob) -> None:
        job.routes = [route_to(job.spec, job.placement, s, None) for s in job.spec.sources]
        job.loads = scheduler.Loads(job.spec.sources)  # the old counts are not the new placement's
        job.window, job.batch = scheduler.dispatch_limits(self.max_inflight, self.dispatch_batch,
                                                          scheduler.source_holders(job.spec, job.placement),
                                                          len(job.placement.active_workers()))

    def on_push(self, ident: bytes, msg: protocol.Push, frame: bytes | memoryview = b"") -> None:
        job = self.job_of(msg)
        if job.deferred_acks:  # a client that pushes on without waiting for its acks: bounded, refused
            check_client_pending(sum(1 for a in job.deferred_acks if a[0] == ident), self.limits)
        records = msg.records if msg.segments is None else self._segments(job, msg.segments)
        nbytes = len(frame) if msg.segments is None else protocol.packed_size(len(frame), msg.segments)
        self.carry_out(job, job.machine.handle(Push(ident, msg.req, records, frame, time.monotonic(), nbytes)))

    def _segments(self, job: PlannerJob, segments: list) -> list | protocol.Segments:
        """A push's checked segments, kept as they came where its records only pass through the planner; a
        keyed source (the planner calls its key function) or a push larger than a chunk has them decoded."""
        records = protocol.Segments(segments)
        if len(records) < 1 << CHUNK_BITS and all(r.kind == ROUTE_TABLE for r in job.routes):
            return records
        try:
            return records.decoded()
        except Exception as e:  # msgpack raises several unrelated types for garbage
            err = protocol.ProtocolError("undecodable", f"push.segments: {type(e).__name__}: {e}")
            self.bad(err)
            raise err from None

    def on_end_input(self, ident: bytes, msg: protocol.EndInput) -> None:
        job = self.job_of(msg)
        job.input_ended = True
        self.input_ended(job)  # a planner restarted on the state directory still knows it
        self.changed(job)
        self.link.reply(ident, msg.req, True)

    def log_written(self, job_id: int) -> None:
        """The input log handed back written chunks: their pushes may be acknowledged and dispatched."""
        job = self.jobs.get(job_id)
        if job is not None:
            self.carry_out(job, job.machine.handle(LogWritten()))

    def carry_out(self, job: PlannerJob, steps) -> int:
        """What the job's machine (clasp.core.job_machine) asks of the dispatcher; returns the records sent."""
        sent = 0
        for s in steps:
            kind = type(s)
            if kind is Dispatch:
                sent += s.count
                epoch = job.placement.epoch
                for dest, rows in s.data.items():
                    self.pushers[dest].send(protocol.encode("data", [job.id, epoch, rows]), copy=False)
                for dest, rs in s.runs.items():
                    self.pushers[dest].send(protocol.encode("runs", [job.id, epoch, rs]), copy=False)
            elif kind is ResumeDispatch:
                self.wake.set()
            elif kind is Ack:
                self.link.post(s.client, protocol.reply(s.req, {"accepted": s.accepted, "credit": s.credit,
                                                                "bound": self.bound.max_bytes}))
            elif kind is MaybeIdle:
                self.changed(job)
            elif kind is Moved:
                job.ckpt.poke()
            elif kind is ChunkBegins:
                self.chunk_begins(job, s.chunk)
            elif kind is SendCredit:
                self.send_credit(job)
            elif kind is LogChunk:
                job.ckpt.log.append(s.chunk, s.t, s.records, s.nbytes, s.frame)
            elif kind is LoadChunk:
                job.queue[0][1] = job.ckpt.log.records(s.chunk)
                sent += self.dispatch(job)
            elif kind is Refuse:
                raise RequestError(s.reason)
        return sent

    # ----------------------------------------------------------------- the scheduling engine
    async def run(self) -> None:
        # A pass per wake-up: a job's machine asks for the next step itself (`ResumeDispatch`) when one could
        # send (a step that sent used to be followed by one that found nothing, half of all steps).
        while True:
            await self.wake.wait()
            self.wake.clear()
            for job in list(self.jobs.values()):
                self.dispatch(job)
            await asyncio.sleep(0)  # the receive loop runs between passes

    def dispatch(self, job: PlannerJob) -> int:
        """Send queued records to the source operators' workers while the in-flight window has room."""
        job.ckpt.poke()  # every change a checkpoint waits for (queue, tracker) wakes the dispatcher first
        return self.carry_out(job, job.machine.handle(DispatchReady(time.monotonic())))

    def drain_tick(self, job: PlannerJob, dt: float, now: float) -> None:
        """Once a tick: the queue's drain rate, the job's limit from it, and the clients still pushing."""
        self.carry_out(job, job.machine.handle(Tick(dt, now)))
