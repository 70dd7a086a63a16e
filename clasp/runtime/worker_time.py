"""The worker's side of event time: windows and timers fired at the watermark the planner releases, and timers at
the processing time this worker reads (docs/TIME.md).

A `watermark` message says every record read with a smaller time has been processed everywhere. The worker
runs each keyed time operator's keys whose deadline it reached and hands their outputs to the operator's
successors as a batch numbered like a source's: a chunk of the readers' lease, sealed at once, so progress,
checkpoints and recovery see them as any records. It does not fire while a checkpoint's barrier is up (the
snapshot must see the state and the outputs on the same side of the cut); the planner sends the watermark
again next tick. It answers `wm_fired` once done, with the records its windows sent to their late outputs so far.

The due keys come from a timer index per key group (`clasp.core.timers.GroupTimers`), kept with the readers:
brought up to date before each firing from the keys the operator changed since (`TimedFold.touched`) and the
key groups that arrived or left (`OpRuntime.replaced`), rebuilt whole for a new engine (a restore). So a firing
costs the due keys, not every key held here.

Processing-time timers (`timers.at_processing(t)`, `t` in seconds of `time.time()`): a job with a `dag.timers`
operator has a task here that every PROCESSING_TICK_S tells its operators the time (`TimedFold.now`, what
`timers.now` reads) and fires them when a processing-time deadline passed, at the watermark they last fired
at. The timers are in the keys' state, so they migrate and are restored with it; one whose time passed while
its key group moved or the job rolled back fires at the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from clasp.core import protocol
from clasp.core.eventtime import NEG_INF
from clasp.core.keyed import TimerOperator
from clasp.core.timed import stages
from clasp.core.timers import PROCESSING, GroupTimers
from clasp.core.tracking import CHUNK_BITS
from clasp.runtime.engine import OperatorError
from clasp.runtime.tasks import ProcessTasks

log = logging.getLogger("clasp.worker.time")
CHUNK_WAIT_S = 2.0
PROCESSING_TICK_S = 0.05


def timer_index(readers, op) -> GroupTimers:
    """The timer index of keyed time operator `op` (an OpRuntime) on this worker, brought up to date."""
    held = readers.timers.get(op.index)
    op.warm_all()
    fold = op.fn
    if held is None or held[0] is not op:  # a new engine: index every group held here
        index = GroupTimers(fold.op.deadline)
        for g, d in enumerate(op.groups):
            if d:
                index.rebuild(g, d)
        op.replaced.clear()
        fold.take_touched()
        readers.timers[op.index] = (op, index)
        return index
    index = held[1]
    groups = op.groups
    for g in op.replaced:
        index.rebuild(g, groups[g])
    op.replaced.clear()
    group_of = op.group_of
    for key in fold.take_touched():
        g = group_of(key)
        index.update(g, key, groups[g].get(key))
    return index


def processing_deadline(readers, op) -> float | None:
    """The earliest processing-time deadline of keyed time operator `op` here, for the clock's tick. Only a
    timers operator has them, and until one of its callbacks sets one here (`TimerOperator.processing`), only
    the key groups indexed already or come since (a restore, a migration) can hold one: the keys its records
    changed since are left for the next firing to index, not indexed every tick."""
    fold = op.fn
    if not isinstance(fold.op, TimerOperator):
        return None
    held = readers.timers.get(op.index)
    if fold.op.processing or held is None or held[0] is not op or op.replaced or op.cold:
        return timer_index(readers, op).earliest(PROCESSING)
    return held[1].earliest(PROCESSING)


class WorkerTime:
    """The worker's event time and timers. `jobs`, `sources`: the worker's tables of job engines and of their
    readers; `send` sends on the control channel; `wake`: the executor loop's event."""

    def __init__(self, jobs: dict, sources: dict, tasks: ProcessTasks, *, send: Callable[[bytes], object],
                 wake: asyncio.Event):
        self.jobs, self.sources, self.tasks, self.send, self.wake = jobs, sources, tasks, send, wake
        self.firing: set[int] = set()  # jobs whose windows are being fired

    def push_marks(self, eng, runs: list) -> None:
        """The largest event time of each pushed chunk's records in these runs, for the planner's watermark
        (`wm_push`): sent ahead of their progress, so the planner has it before any of them can complete, and
        computed here, where the push source runs, so the planner calls no timestamp function (docs/TIME.md)."""
        push = eng.spec.push_time
        if push is None:
            return
        tops: dict[int, float] = {}
        for op, first, values in runs:
            if op == push.index:
                chunk, top = first >> CHUNK_BITS, push.fn.top(values)
                if top > tops.get(chunk, NEG_INF):
                    tops[chunk] = top
        for chunk, top in tops.items():
            self.send(protocol.encode("wm_push", [eng.job, chunk, top]))

    def restored(self, spec, levels: list | None) -> None:
        """A rollback: the windows restored are those of the checkpoint, taken at these watermarks (per
        stage)."""
        for i, d in stages(spec).items():
            spec.operators[i].fn.watermark = float(levels[min(d, len(levels) - 1)]) if levels else NEG_INF

    def attached(self, job: int, readers) -> None:
        """A new engine with readers: a job with processing-time timers gets its clock task."""
        eng = readers.eng
        readers.stages = stages(eng.spec)  # the engine's DAG never changes: found once, not at every firing
        timed = [eng.ops[i].fn for i in readers.stages]
        if any(isinstance(fold.op, TimerOperator) for fold in timed):
            now = time.time()  # before the first record: `timers.now` is never the start of time
            for fold in timed:
                fold.now = max(fold.now, now)
            self.tasks.spawn(self._processing_time(job, readers), f"processing-time timers of job {job}")

    def pending_timer(self, job: int) -> float | None:
        """The earliest processing-time deadline among the job's timers held here that has not fired (for
        `wait_idle`: it returns once every one due by the time it was called fired)."""
        readers, eng = self.sources.get(job), self.jobs.get(job)
        if readers is None or eng is None or readers.eng is not eng:
            return None
        tops = [timer_index(readers, eng.ops[i]).earliest(PROCESSING) for i in readers.stages
                if isinstance(eng.ops[i].fn.op, TimerOperator)]
        return min((t for t in tops if t is not None), default=None)

    async def _processing_time(self, job: int, readers) -> None:
        timed = [readers.eng.ops[i] for i in readers.stages]
        while self.sources.get(job) is readers:
            now = time.time()
            due = False
            for op in timed:
                op.fn.now = max(op.fn.now, now)
                if job not in self.firing:
                    t = processing_deadline(readers, op)
                    due = due or (t is not None and t <= now)
            if due and job not in self.firing:
                self.firing.add(job)
                self.tasks.spawn(self._fire(job, None, None), f"timers of job {job}")
            await asyncio.sleep(PROCESSING_TICK_S)

    def on_watermark(self, msg: protocol.Watermark) -> None:
        job = msg.job
        readers = self.sources.get(job)
        if job not in self.jobs or readers is None:
            return
        if job in self.firing:
            readers.next_watermark = msg  # fired once this firing is done: the planner sends a moved one once
            return
        self.firing.add(job)
        levels = [float(w) for w in msg.levels]
        self.tasks.spawn(self._fire(job, levels, msg.round), f"windows of job {job}")

    async def _fire(self, job: int, levels: list[float] | None, rnd: int | None) -> None:
        """Fire every keyed time operator at its stage's watermark (`levels`; None: at the one it last fired
        at) and the processing time now, stage by stage; answer round `rnd` (None: none)."""
        late = 0
        try:
            eng, readers = self.jobs.get(job), self.sources.get(job)
            stage = readers.stages if eng is not None and readers is not None else {}
            now = time.time()
            for i in sorted(stage, key=stage.get):
                op, fold = eng.ops[i], eng.ops[i].fn
                watermark = levels[min(stage[i], len(levels) - 1)] if levels else fold.watermark
                late += fold.late
                fold.now = max(fold.now, now)
                if not timer_index(readers, op).due(watermark, now):
                    fold.watermark = max(fold.watermark, watermark)
                    continue
                try:  # bounded: a rollback may replace these readers, whose lease then never comes
                    async with asyncio.timeout(CHUNK_WAIT_S):  # not wait_for, which can swallow a cancel
                        chunk = await readers._chunk()
                except TimeoutError:
                    return  # fired next round
                if self.jobs.get(job) is not eng or self.sources.get(job) is not readers:
                    return  # the job was restored or stopped meanwhile
                if eng.cut.boundary is not None or chunk < readers.floor:
                    return  # a barrier came: next round, after it
                # From here to the seal nothing awaits: the state change and its outputs go together.
                fold.watermark = max(fold.watermark, watermark)
                outs: list = []
                for key, state, out in timer_index(readers, op).fire(op.groups, fold.fire_key, watermark, now):
                    op.set_state(key, state)
                    outs.extend(out)
                for key, e in fold.take_failures():  # that key's due timers are spent; the others fired
                    eng.executor.fail(op, OperatorError(f"on_timer of key {key!r}: {e!r}"), None)
                if not outs:
                    continue
                if len(outs) >= 1 << CHUNK_BITS:
                    log.error("job %d: %s fired %d windows at once: more than a chunk holds", job, op.name, len(outs))
                counts = eng.admit_source(op.index, outs, chunk << CHUNK_BITS)
                readers.inflight += len(outs)  # their credit comes back as for a batch read here
                self.send(protocol.pack(protocol.WmOut(job, chunk, len(outs))))  # windows, not read
                self.send(protocol.encode("seal", [job, chunk, len(outs), counts]))
                self.wake.set()
            if rnd is not None:
                self.send(protocol.pack(protocol.WmFired(job, rnd, late)))
        finally:
            self.firing.discard(job)
            readers = self.sources.get(job)
            if readers is not None and readers.next_watermark is not None:
                msg, readers.next_watermark = readers.next_watermark, None
                self.on_watermark(msg)
