"""The worker's side of event time: windows fired at the watermark the planner releases (docs/TIME.md).

A `watermark` message says every record read with a smaller time has been processed everywhere. The worker
runs each window operator's keys whose deadline it reached (`TimedFold.fire`, over the key groups held
here) and hands the windows to the operator's successors as a batch numbered like a source's: a chunk of
the readers' lease, sealed at once, so progress, checkpoints and recovery see them as any records. It does
not fire while a checkpoint's barrier is up (the snapshot must see the state and the outputs on the same
side of the cut); the planner sends the watermark again next tick. It answers `wm_fired` once done, with
the records its windows sent to their late outputs so far.
"""

from __future__ import annotations

import asyncio
import logging

from clasp.core import protocol
from clasp.core.eventtime import NEG_INF
from clasp.core.timed import stages
from clasp.core.tracking import CHUNK_BITS

log = logging.getLogger("clasp.worker.time")
CHUNK_WAIT_S = 2.0


class TimeMixin:
    def _time_restored(self, spec, levels: list | None) -> None:
        """A rollback: the windows restored are those of the checkpoint, taken at these watermarks (per
        stage)."""
        for i, d in stages(spec).items():
            spec.operators[i].fn.watermark = float(levels[min(d, len(levels) - 1)]) if levels else NEG_INF

    def _on_watermark(self, body) -> None:
        job = body["job"]
        if job in self.jobs and job in self.sources and job not in self.firing:
            self.firing.add(job)
            levels = [float(w) for w in body["levels"]]
            self.tasks.spawn(self._fire(job, levels, body["round"]), f"windows of job {job}")

    async def _fire(self, job: int, levels: list[float], rnd: int) -> None:
        """Fire every keyed time operator at its stage's watermark, stage by stage."""
        late = 0
        try:
            eng, readers = self.jobs.get(job), self.sources.get(job)
            stage = stages(eng.spec) if eng is not None else {}
            for i in sorted(stage, key=stage.get):
                op, fold = eng.ops[i], eng.ops[i].fn
                watermark = levels[min(stage[i], len(levels) - 1)]
                late += fold.late
                op.warm_all()
                if not any(fold.due(d, watermark) for d in op.groups if d):
                    fold.watermark = max(fold.watermark, watermark)
                    continue
                try:  # bounded: a rollback may replace these readers, whose lease then never comes
                    chunk = await asyncio.wait_for(readers._chunk(), CHUNK_WAIT_S)
                except TimeoutError:
                    return  # fired next round
                if self.jobs.get(job) is not eng or self.sources.get(job) is not readers:
                    return  # the job was restored or stopped meanwhile
                if eng.cut.boundary is not None or chunk < readers.floor:
                    return  # a barrier came: next round, after it
                # From here to the seal nothing awaits: the state change and its outputs go together.
                op.warm_all()
                outs: list = []
                for d in op.groups:
                    if d:
                        for key, state, out in fold.fire(d, watermark):
                            op.set_state(key, state)
                            outs.extend(out)
                if not outs:
                    continue
                if len(outs) >= 1 << CHUNK_BITS:
                    log.error("job %d: %s fired %d windows at once: more than a chunk holds", job, op.name, len(outs))
                counts = eng.admit_source(op.index, outs, chunk << CHUNK_BITS)
                readers.inflight += len(outs)  # their credit comes back as for a batch read here
                self.dealer.send(protocol.encode("wm_out", [job, chunk, len(outs)]))  # windows, not read
                self.dealer.send(protocol.encode("seal", [job, chunk, len(outs), counts]))
                self.wake.set()
            self.dealer.send(protocol.encode("wm_fired", [job, rnd, late]))
        finally:
            self.firing.discard(job)
