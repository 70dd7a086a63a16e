"""The worker's side of declared sources (clasp/runtime/sources.py): readers per job, placed by the planner.

Mixed into `clasp.runtime.worker.Worker`, which routes the control messages `leased`, `credit`,
`src_assign` and `src_release` here, and calls these hooks where a job's engine is made, checkpointed,
restored or dropped.
"""

from __future__ import annotations

from collections.abc import Callable

from clasp.core import protocol
from clasp.core.timed import stages
from clasp.runtime.engine import JobEngine
from clasp.runtime.sources import SourceReaders


class SourcesMixin:
    sources: dict[int, SourceReaders]
    source_window: int
    _time_attached: Callable

    def _sources_attach(self, eng: JobEngine, parts: list | None) -> None:
        """A new engine for the job (deploy, restore): its readers, opening the partitions this worker owns
        among `parts` ([[op, partition, owner, position]]). A job with keyed time operators and no declared
        source has readers too, with no partition: they lease the chunk ids of the windows fired here."""
        if not eng.spec.readers and not stages(eng.spec):
            return
        readers = self.sources[eng.job] = SourceReaders(eng, self.dealer.send, self.tasks.spawn, self.wake.set,
                                                        self.source_window)
        readers.assign([[op, part, pos] for op, part, owner, pos in parts or () if owner == self.id])
        self._time_attached(eng.job, readers)

    async def _sources_detach(self, job: int) -> None:
        readers = self.sources.pop(job, None)
        if readers is not None:
            await readers.close()

    def _sources_drop_all(self) -> None:
        for job in list(self.sources):
            self.tasks.spawn(self._sources_detach(job), f"closing the readers of job {job}")

    def _sources_barrier(self, job: int, boundary: int) -> list:
        readers = self.sources.get(job)
        if readers is None:
            return []
        readers.barrier(boundary)
        return readers.positions()

    def _on_leased(self, msg: protocol.Leased) -> None:
        readers = self.sources.get(msg.job)
        if readers is not None:
            readers.on_lease(msg.first, msg.count)

    def _on_credit(self, msg: protocol.Credit) -> None:
        readers = self.sources.get(msg.job)
        if readers is not None:
            readers.on_credit(msg.records)

    def _on_src_assign(self, msg: protocol.SrcAssign) -> bytes:
        readers = self.sources.get(msg.job)
        if readers is None:
            raise ValueError(f"job {msg.job} reads no source here")
        readers.assign(msg.parts)
        return protocol.reply(msg.req, {"worker": self.id})

    async def _on_src_release(self, msg: protocol.SrcRelease) -> bytes:
        readers = self.sources.get(msg.job)
        out = await readers.release(msg.parts) if readers is not None else []
        return protocol.reply(msg.req, {"worker": self.id, "positions": out})
