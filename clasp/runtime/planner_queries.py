"""The planner's answers about jobs: which workers serve a job, whether it is idle (`wait_idle` and its
waiters), its state and collected outputs (asked of its workers once it serves), its statistics, and the
lists of jobs and workers. It reads the planner's tables of jobs and workers (shared, never replaced) and
asks workers through the link."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from clasp.core import protocol, scheduler
from clasp.core.limits import Limits, check_client_pending
from clasp.core.scheduler import WorkerInfo
from clasp.core.timers import waited_for
from clasp.runtime.planner_job import PlannerJob
from clasp.runtime.planner_link import Link, NoAnswer, RequestError, WorkerDied

ANSWER_TIMEOUT = 50.0  # s `state` and `collected` wait for a recovering job when the request names none
SETTLE_POLL = 0.05  # s between looks at a recovering job by a request waiting for it
TIMER_POLL = 0.05  # s until an idle job whose processing-time timers due for a waiter have not fired is asked again



class JobQueries:
    """`jobs`, `workers`, `dropped` (worker -> when its data connection dropped) and `refused` (worker ->
    when a new process of it was told to register later) are the planner's own tables. `stats(job,
    counters)`: a job's statistics; `remote_state(job, op)`: an operator's state on the planner's state
    server; `has_sinks(job)` and `settle_sinks(job)`: the sinks coordinator's."""

    def __init__(self, link: Link, limits: Limits, jobs: dict, workers: dict[str, WorkerInfo],
                 dropped: dict[str, float], refused: dict[str, float], *, stats: Callable[..., dict],
                 remote_state: Callable[[int, str], dict], has_sinks: Callable[[PlannerJob], bool],
                 settle_sinks: Callable[[PlannerJob], Awaitable[bool]], time_pending: Callable[[PlannerJob], int]):
        self.link, self.limits = link, limits
        self.jobs, self.workers, self.dropped, self.refused = jobs, workers, dropped, refused
        self.stats, self.remote_state = stats, remote_state
        self.has_sinks, self.settle_sinks = has_sinks, settle_sinks
        self.time_pending = time_pending  # 1 while a released watermark is not fired everywhere yet

    def job(self, msg: Any) -> PlannerJob:
        job = self.jobs.get(msg.job)
        if job is None:
            raise RequestError(f"no job {msg.job}")
        return job

    def on_wait_idle(self, ident: bytes, msg: protocol.WaitIdle) -> None:
        job = self.job(msg)
        check_client_pending(sum(1 for w in job.waiters if w[0] == ident), self.limits)
        # Processing-time timers due by now (the clock the workers fire them by) are waited for, later ones not.
        job.waiters.append([ident, msg.req, time.monotonic() + float(msg.timeout), time.time()])
        self.check_waiters(job)

    def summary(self, job: PlannerJob) -> dict:
        out = {"pushed": job.counters["pushed"], "completed": job.tracker.completed, "lost": job.tracker.lost}
        if job.src is not None and job.src.parts:
            out["read"] = job.tracker.read  # records read from the declared sources
        return out

    def condition(self, job: PlannerJob) -> scheduler.JobCondition:
        """What `scheduler.busy` and `scheduler.unsettled` decide on, for `job` now."""
        c = job.ckpt
        t = job.tracker
        heard = {w: self.workers[w].last_seen for w in job.workers if w in self.workers}
        return scheduler.JobCondition(
            outstanding=t.outstanding + self.time_pending(job), queued=job.queued,
            suspected=scheduler.suspected(self.workers_of(job), self.dropped, heard),
            recovering=tuple(job.recovering), rolling_back=job.life.restoring, orphaned=job.life.orphaned is not None,
            replaying=max(0, c.replay_to - t.completed - t.lost),
            rejoining=(*job.rejoining, *scheduler.expected_rejoins(job.workers, self.refused, time.monotonic())),
            migrating=job.life.migrating, reading=job.src.reading() if job.src is not None else 0)

    def check_waiters(self, job: PlannerJob) -> None:
        """Answer the job's `wait_idle` calls if it is idle, once every worker serving it answered that it is
        alive: one killed a moment ago may not have been noticed yet."""
        if job.waiters and not job.confirming and scheduler.busy(self.condition(job)) is None:
            job.confirming = True
            self.link.background(self._confirm_idle(job), f"idle check of job {job.id}")

    async def _confirm_idle(self, job: PlannerJob) -> None:
        try:
            replies = await asyncio.gather(*(self.link.rpc(w, protocol.Counters(job.id, timers=True), 2.0)
                                             for w in self.workers_of(job)), return_exceptions=True)
            if any(isinstance(r, NoAnswer) for r in replies) or scheduler.busy(self.condition(job)) is not None:
                return  # a worker died (its recovery follows) or the job is busy again: the waiters wait on
            # Idle is not done while a sink has not committed what it was given (tried again each tick).
            admitted = job.tracker.admitted
            if self.has_sinks(job) and (not await self.settle_sinks(job) or job.tracker.admitted != admitted):
                return
        finally:
            job.confirming = False
        if scheduler.busy(self.condition(job)) is not None:
            return
        pending = [r.get("timers") for r in replies if isinstance(r, dict)]
        waiting = []
        for waiter in job.waiters:
            if waited_for(waiter[3], pending):
                self.link.reply(waiter[0], waiter[1], self.summary(job))
            else:
                waiting.append(waiter)
        job.waiters[:] = waiting
        if waiting:  # a timer due by then has not fired: it does within a tick of the worker's clock
            self.link.background(self._look_again(job), f"idle check of job {job.id}")

    async def _look_again(self, job: PlannerJob) -> None:
        await asyncio.sleep(TIMER_POLL)
        self.check_waiters(job)

    def workers_of(self, job: PlannerJob) -> list[str]:
        """The job's workers still serving it: alive, and not retired (declared dead while serving it: one
        that comes back has lost the job's state and takes no part in it; a new process with its id does
        once `_redeploy` gave it the job)."""
        return [w for w in job.workers
                if w not in job.retired and self.workers.get(w) and self.workers[w].alive]

    async def on_state(self, ident: bytes, msg: protocol.StateRequest) -> None:
        job = self.job(msg)
        op = job.spec.by_name(msg.op) if msg.op in {o.name for o in job.spec.operators} else None
        if op is None:
            raise RequestError(f"job {job.id} has no operator {msg.op!r}")
        if not op.stateful:
            raise RequestError(f"operator {op.name!r} is stateless: it has no state")
        if job.state == "remote":
            self.link.reply(ident, msg.req, self.remote_state(job.id, op.name))
            return

        async def dump() -> protocol.Packed:
            owners = sorted(set(job.placement.operators[op.name].key_groups))
            parts = await asyncio.gather(*(self.link.rpc(w, protocol.StatePacked(job.id, op.name))
                                           for w in owners))
            return protocol.splice_maps(parts)  # the owners' maps as they came: no key decoded here

        self.link.reply(ident, msg.req, await self._when_serving(job, msg, dump))

    async def on_collected(self, ident: bytes, msg: protocol.Collected) -> None:
        job = self.job(msg)
        if msg.op not in {o.name for o in job.spec.operators}:
            raise RequestError(f"job {job.id} has no operator {msg.op!r}")

        async def dump() -> protocol.Packed:
            parts = await asyncio.gather(*(self.link.rpc(w, protocol.CollectedDump(job.id, msg.op))
                                           for w in self.workers_of(job)))
            for p in parts:
                protocol.check_packed_array(p, "collected_dump")
            # The released outputs and the workers' as they came, spliced: not one output decoded here.
            return protocol.splice_arrays([*await job.ckpt.released(msg.op), *parts])

        async def locked_dump() -> protocol.Packed:
            async with job.lock:  # not while a checkpoint carries outputs from the workers to the planner
                return await dump()

        answer = await self._when_serving(job, msg, locked_dump if job.ckpt.enabled else dump)
        self.link.reply(ident, msg.req, answer)

    async def _when_serving(self, job: PlannerJob, msg: protocol.StateRequest, ask: Callable) -> Any:
        """`await ask()` (a question to the job's workers) once the job serves: not while a worker of it may
        have died, a recovery is under way or its replay has not caught up (`scheduler.unsettled`); asked
        again when a worker dies before it answers. Within the request's timeout: past it, the error says
        what the job is still doing."""
        deadline = time.monotonic() + (ANSWER_TIMEOUT if msg.timeout is None else msg.timeout)
        while True:
            why = scheduler.unsettled(self.condition(job))
            if why is None:
                try:
                    return await ask()
                except WorkerDied as e:
                    why = f"is recovering: {e}"
            if job.life.retired or self.jobs.get(job.id) is not job:
                raise RequestError(f"job {job.id} was cancelled")
            if time.monotonic() >= deadline:
                raise RequestError(f"timeout: job {job.id} {why}")
            await asyncio.sleep(SETTLE_POLL)

    def on_stats(self, ident: bytes, msg: protocol.Stats):
        job = self.job(msg)
        if msg.fresh:
            return self._fresh_stats(ident, msg, job)
        self.link.reply(ident, msg.req, self.stats(job))
        return None

    async def _fresh_stats(self, ident: bytes, msg: protocol.Stats, job: PlannerJob) -> None:
        """Stats with exact cumulative counters asked of every worker now."""
        workers = self.workers_of(job)
        counters = await asyncio.gather(*(self.link.rpc(w, protocol.Counters(job.id)) for w in workers))
        self.link.reply(ident, msg.req, self.stats(job, dict(zip(workers, counters, strict=True))))

    def on_jobs(self, ident: bytes, msg: protocol.Jobs) -> None:
        self.link.reply(ident, msg.req, [{"job": j.id, "name": j.spec.name, "pushed": j.counters["pushed"],
                                          "completed": j.tracker.completed} for j in self.jobs.values()])

    def on_workers(self, ident: bytes, msg: protocol.Workers) -> None:
        self.link.reply(ident, msg.req, [{"id": w.id, "alive": w.alive, "data": w.data, "state": w.state,
                                          "metrics": w.metrics, "pid": w.pid, "host": w.host}
                                         for w in self.workers.values()])

