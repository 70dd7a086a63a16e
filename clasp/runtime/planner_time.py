"""The planner's side of event time (`TimeCoordinator`): the job's watermark, released to the workers.

Readers send each partition's watermark after every chunk they seal (its mark, in the seal) and say when a
partition went idle (`wm_idle`); the dispatcher's pushed chunks are marked here (`pushed`), and the workers
running the push source report each chunk's largest time (`wm_push`, ahead of its progress). Every RELEASE_S the
planner settles which chunks completed (`clasp.core.timed.ReleasedWatermark`) and, if the job's watermark (or a
stage's) moved, sends every worker of a job with keyed time operators the watermarks (`watermark`, with a round
number; once a tick also unchanged): a watermark is released only when every record read before it was promised
has been processed everywhere, so no operator sees a record of a smaller time after it. A worker fires its
windows at it (their outputs leased and sealed like a source's batches) and answers `wm_fired`; `wait_idle`
waits until every worker answered a round sent after the last change (the watermark moved, a migration, a
rollback), so the windows the end of a bounded input fires are done when it returns.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from clasp.core import protocol
from clasp.core.eventtime import NEG_INF
from clasp.core.lifecycle import Phase
from clasp.core.timed import EventTime, FiredChunks, PushTime, ReleasedWatermark, follow_stages, stages
from clasp.runtime.planner_link import Link
from clasp.runtime.tasks import wait_event

RELEASE_S = 0.025  # how often a moved watermark is looked for between ticks, when no message says to look sooner


class JobTime:
    """One job's watermark state on the planner."""

    def __init__(self, marks: ReleasedWatermark, stages: dict[int, int], push: PushTime | None = None):
        self.marks = marks
        self.push = push  # the push source's partition (`Dag.push_source`), if any
        self.stages = stages  # keyed time operator -> its stage
        n = max(stages.values(), default=0) + 1
        self.levels = [NEG_INF] * n  # the watermark released to each stage (the first: the sources')
        self.level_round = [0] * n  # the round in which each last moved
        self.fired_chunks = FiredChunks()  # chunks of fired windows, until they are sealed and complete
        self.round = 0
        self.settled_round = 0  # workers must answer a round at least this one for the job to be idle
        self.fired: dict[str, int] = {}  # worker -> the last round it answered
        self.windows = 0  # windows fired (emitted by window operators at a watermark)
        self.late: dict[str, int] = {}  # worker -> records its windows sent to their late outputs
        self.restore_to: list = list(self.levels)  # where the rollback under way starts (`restore_point`)


def _timed(job) -> bool:
    spec = job.spec
    return (spec.push_time is not None or bool(stages(spec))
            or any(isinstance(spec.operators[i].fn, EventTime) for i in spec.readers))


class TimeCoordinator:
    """The planner's handlers for the readers' watermark messages and the workers' firings, its tick, and
    what checkpoints and `wait_idle` ask of event time. What it asks of the planner is passed in: `jobs`
    (the planner's table), `reading_job(id)` (a job, also while it deploys), `workers_of(job)` (its serving
    workers), `changed(job)` (what `wait_idle` waits on moved)."""

    def __init__(self, link: Link, jobs: dict, *, reading_job: Callable, workers_of: Callable, changed: Callable):
        self.link, self.jobs = link, jobs
        self._reading_job, self._job_workers, self._check_waiters = reading_job, workers_of, changed
        self.timed = asyncio.Event()  # set when a job on event time appears (`run` waits for one)
        self.nudged = asyncio.Event()  # set by a message a watermark may move on (`nudge`)

    def _job_time(self, job) -> JobTime | None:
        t = getattr(job, "time", None)
        if t is None and not getattr(job, "untimed", False):
            if not _timed(job):
                job.untimed = True  # its DAG never changes: asked once (the dispatcher asks per chunk)
                return None
            spec = job.spec
            timed = {spec.operators[i].name for i in spec.readers if isinstance(spec.operators[i].fn, EventTime)}
            parts = [k for k in job.src.parts if k[0] in timed] if job.src is not None else []
            push = PushTime(spec.push_time.fn, (spec.push_time.name, "push")) if spec.push_time else None
            t = job.time = JobTime(ReleasedWatermark(parts + ([push.part] if push else [])), stages(spec), push)
            self.timed.set()
        return t

    def nudge(self) -> None:
        """A message a watermark may move on came (a chunk's progress or seal, a partition's end or idleness, a
        worker's firing): the release loop looks at once, not up to RELEASE_S later. A query's end waits on a
        chain of them (the last chunks complete, the watermark goes to the end, each stage fires in turn), and
        a tick at each link was ~45 ms of a 2,000-event Nexmark Q4 run."""
        self.nudged.set()

    def may_move(self, ident: bytes, body: object) -> None:
        """The tail of the handler of a message after which a watermark may move (a chunk's progress, a partition's
        end): `nudge`."""
        self.nudge()

    def pushed(self, job, chunk: int) -> None:
        """The dispatcher begins a pushed chunk: marked in the push partition, its watermark raised as the
        workers running the push source report the chunk's largest time (`wm_push`), safe once it and every
        chunk before it are complete. Nothing here is per record."""
        t = self._job_time(job)
        if t is not None and t.push is not None:
            t.push.begin(t.marks, chunk, time.monotonic())

    def on_wm_push(self, ident: bytes, body: list) -> None:
        job = self.jobs.get(body[0])
        t = self._job_time(job) if job is not None else None
        if t is not None and t.push is not None and type(body[1]) is int and isinstance(body[2], int | float):
            t.push.observed(t.marks, body[1], float(body[2]))

    def on_wm_idle(self, ident: bytes, msg: protocol.WmIdle) -> None:
        job = self._reading_job(msg.job)
        t = self._job_time(job) if job is not None else None
        if t is not None:
            t.marks.set_idle((msg.op, msg.partition), True)
            self.nudge()

    def on_wm_out(self, ident: bytes, msg: protocol.WmOut) -> None:
        """A sealed chunk held windows a worker fired, not records it read: the source counts leave it out."""
        job = self._reading_job(msg.job)
        t = self._job_time(job) if job is not None else None
        if t is not None and job.tracker.leased(msg.chunk):
            job.tracker.produced.add(msg.chunk)  # its seal comes right behind
            t.fired_chunks.announced(msg.chunk)
            t.windows += msg.records

    def on_seal(self, ident: bytes, body: list) -> None:
        """A worker sealed a chunk (after the sources' handler took it): each reader's partition on event time
        whose records it holds marks it with its watermark after the chunk (`check_seal` checked the marks); if
        it held windows fired here, its completion is the tracker's from now on."""
        job = self._reading_job(body[0])
        if job is None:
            return
        if len(body) > 4:
            t = self._job_time(job)
            if t is not None:
                for op, part, w in body[4:]:
                    t.marks.sealed((str(op), str(part)), body[1], float(w))
        else:
            t = getattr(job, "time", None)
            if t is not None:
                t.fired_chunks.sealed(body[1])
                self.nudge()

    def on_wm_fired(self, ident: bytes, msg: protocol.WmFired) -> None:
        job = self.jobs.get(msg.job)
        t = self._job_time(job) if job is not None else None
        if t is not None:
            w = ident.decode(errors="replace")
            t.fired[w] = max(t.fired.get(w, -1), msg.round)
            t.late[w] = msg.late
            self._check_waiters(job)
            self.nudge()  # the next stage may follow

    def _watermark_now(self, job, t: JobTime) -> float:
        chunks = job.tracker.chunks
        t.marks.settle(chunks.__contains__)
        ended = set(job.src.ended) if job.src is not None else set()
        if t.push is not None and job.input_ended and not job.queued:
            ended.add(t.push.part)  # every pushed chunk is marked: +inf once they are complete
        return t.marks.combined(ended)

    async def run(self) -> None:
        """Between ticks: a job's watermark goes out as soon as it moves (its sources' chunks completed, or every
        worker fired a stage and the windows it fired are complete), not a tick later, so a stage costs the
        time its windows take, not a tick each: looked for when a message it may move on comes (`nudge`), and
        every RELEASE_S."""
        while True:
            if not any(getattr(job, "time", None) is not None for job in self.jobs.values()):
                self.timed.clear()  # no job runs on event time: nothing to look for, no wake-up every RELEASE_S
                await self.timed.wait()
            await wait_event(self.nudged, RELEASE_S)
            self.nudged.clear()
            for job in list(self.jobs.values()):
                if getattr(job, "time", None) is not None:
                    self.tick(job, moved_only=True)

    def tick(self, job, moved_only: bool = False) -> None:
        """Once a tick: release the job's watermark to its workers (again, if unchanged: a key group that
        arrived since fires there); `moved_only`: only if it moved."""
        t = self._job_time(job)
        if t is None or job.id not in self.jobs:
            return
        if job.life.phase is Phase.BARRIER:
            return  # a barrier is being set up: the checkpoint's watermark is the one released before it
        restoring = job.life.restoring
        if t.push is not None:
            t.push.tick(t.marks, time.monotonic())
        w = self._watermark_now(job, t)
        rnd = t.round + 1
        levels, rounds = list(t.levels), list(t.level_round)
        moved = w > levels[0]
        if moved:
            levels[0], rounds[0] = w, rnd
        # A stage follows the one before it once every worker fired that one at its watermark and the
        # windows it fired are complete (processed by the next stage, on time there).
        serving = self._job_workers(job)
        answered = min((t.fired.get(x, -1) for x in serving), default=-1)
        t.fired_chunks.settle(job.tracker.chunks.__contains__)
        moved = follow_stages(levels, rounds, answered, bool(t.fired_chunks), rnd) or moved
        if moved_only and not moved:
            return
        t.round, t.levels, t.level_round = rnd, levels, rounds
        if moved or job.life.migrating or restoring:
            t.settled_round = t.round
        t.marks.released = w
        if restoring or w == -math.inf or not t.stages:
            return  # a job with no keyed time operator fires nothing: its workers need no watermark
        frame = protocol.pack(protocol.Watermark(job.id, w, levels, t.round))
        for worker in serving:
            self.link.post(worker.encode(), frame)

    def pending(self, job) -> int:
        """1 while the job's watermark is not released yet or a worker has not fired at it since the last
        change (for `wait_idle`), else 0."""
        t = getattr(job, "time", None)
        if t is None or not t.stages:
            return 0  # no keyed time operator: no worker fires at the watermark, nothing waits on it
        if self._watermark_now(job, t) > t.marks.released or any(x < t.levels[0] for x in t.levels):
            return 1
        if t.marks.released == -math.inf:
            return 0  # nothing to fire yet
        return int(any(t.fired.get(w, -1) < t.settled_round for w in self._job_workers(job)))

    def released_levels(self, job) -> list | None:
        """The watermark per stage released now, kept by a checkpoint as its barrier goes up (no watermark is
        sent while a barrier is being set up): every window fired in the checkpoint's cut was fired at or below
        it, and every record below it read before it was released is in the cut. A rollback starts from it."""
        t = self._job_time(job)
        return None if t is None else list(t.levels)

    def restore_point(self, job, kept: list | None) -> list | None:
        """The watermarks (per stage) a rollback starts from (for the restore message): those `kept` by the
        checkpoint it restores (in its COMPLETE.json, so also after a planner restart), else from the start."""
        t = self._job_time(job)
        if t is None:
            return None
        t.restore_to = list(kept) if kept is not None and len(kept) == len(t.levels) else [NEG_INF] * len(t.levels)
        return t.restore_to

    def rolled_back(self, job) -> None:
        t = getattr(job, "time", None)
        if t is not None:
            t.marks.reset()
            if t.push is not None:
                t.push.reset()
            t.levels = list(t.restore_to)
            t.marks.released = t.levels[0]
            t.fired_chunks.clear()
            t.settled_round = t.round + 1

    def stats(self, job) -> dict | None:
        """`job.stats()["event_time"]`: the released watermark, each keyed time operator's and every
        partition's (None: none yet, "end": every record is in), the windows fired and the records the windows
        sent to their late outputs (counted by each worker process: a record read again after a recovery may
        count twice)."""
        t = getattr(job, "time", None)
        if t is None:
            return None

        def show(w: float):
            return None if w == -math.inf else "end" if w == math.inf else w

        m = t.marks
        ops = job.spec.operators
        return {"watermark": show(m.released), "windows_fired": t.windows, "late": sum(t.late.values()),
                "operators": {ops[i].name: show(t.levels[d]) for i, d in sorted(t.stages.items())},
                "idle": sorted(f"{o}/{p}" for o, p in m.idle),
                "partitions": {f"{o}/{p}": show(w) for (o, p), w in m.safe.items()}}

    def metrics(self, jobs: list):
        """Prometheus: each event-time job's watermark, windows fired and late records."""
        wm = GaugeMetricFamily("clasp_watermark_seconds", "The event-time watermark released to the workers "
                               "(+Inf once every input ended)", labels=["job"])
        fired = CounterMetricFamily("clasp_windows_fired", "Windows emitted at a watermark", labels=["job"])
        late = CounterMetricFamily("clasp_late_records", "Records the windows sent to their late outputs",
                                   labels=["job"])
        for j in jobs:
            t = getattr(j, "time", None)
            if t is not None:
                if t.marks.released > -math.inf:
                    wm.add_metric([str(j.id)], t.marks.released)
                fired.add_metric([str(j.id)], t.windows)
                late.add_metric([str(j.id)], sum(t.late.values()))
        yield from (wm, fired, late)
