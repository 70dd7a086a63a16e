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

import logging

from clasp.core import protocol
from clasp.core.eventtime import NEG_INF
from clasp.core.timed import TimedFold
from clasp.core.tracking import CHUNK_BITS

log = logging.getLogger("clasp.worker.time")


class TimeMixin:
    def _time_restored(self, spec, watermark: float | None) -> None:
        """A rollback: the windows restored are those of the checkpoint, taken at `watermark`."""
        for o in spec.operators:
            if isinstance(o.fn, TimedFold):
                o.fn.watermark = NEG_INF if watermark is None else float(watermark)

    def _on_watermark(self, body) -> None:
        job = body["job"]
        if job in self.jobs and job in self.sources and job not in self.firing:
            self.firing.add(job)
            self.tasks.spawn(self._fire(job, float(body["watermark"]), body["round"]), f"windows of job {job}")

    async def _fire(self, job: int, watermark: float, rnd: int) -> None:
        late = 0
        try:
            eng, readers = self.jobs.get(job), self.sources.get(job)
            for op in list(eng.ops) if eng is not None else ():
                fold = op.fn
                if not isinstance(fold, TimedFold):
                    continue
                late += fold.late
                op.warm_all()
                if not any(fold.due(d, watermark) for d in op.groups if d):
                    fold.watermark = max(fold.watermark, watermark)
                    continue
                chunk = await readers._chunk()
                if self.jobs.get(job) is not eng or self.sources.get(job) is not readers:
                    return  # the job was restored or stopped meanwhile
                if eng.barrier is not None or chunk < readers.floor:
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
