"""The worker's side of declared sources (clasp/runtime/sources.py): readers per job, placed by the planner.

`WorkerSources` is the worker's collaborator for them: the worker routes the control messages `leased`,
`credit`, `src_assign` and `src_release` to it, and it is called where a job's engine is made,
checkpointed, restored or dropped.
"""

from __future__ import annotations

from collections.abc import Callable

from clasp.core import protocol
from clasp.core.timed import stages
from clasp.runtime.engine import JobEngine
from clasp.runtime.sources import SourceReaders
from clasp.runtime.tasks import ProcessTasks


class WorkerSources:
    """`readers`: the worker's table job -> its readers here (shared with its event time); `send` sends on the
    control channel (leases, seals); `wake` wakes the executor loop; `window`: records a job's readers keep
    in flight; `attached(job, readers)` is told of new readers (event time starts its clock)."""

    def __init__(self, me: str, readers: dict[int, SourceReaders], tasks: ProcessTasks, *,
                 send: Callable[[bytes], object], wake: Callable[[], None], window: int,
                 attached: Callable[[int, SourceReaders], None]):
        self.me, self.readers, self.tasks = me, readers, tasks
        self.send, self.wake, self.window, self.attached = send, wake, window, attached

    def attach(self, eng: JobEngine, parts: list | None) -> None:
        """A new engine for the job (deploy, restore): its readers, opening the partitions this worker owns
        among `parts` ([[op, partition, owner, position]]). A job with keyed time operators and no declared
        source has readers too, with no partition: they lease the chunk ids of the windows fired here."""
        if not eng.spec.readers and not stages(eng.spec):
            return
        readers = self.readers[eng.job] = SourceReaders(eng, self.send, self.tasks.spawn, self.wake, self.window)
        readers.assign([[op, part, pos] for op, part, owner, pos in parts or () if owner == self.me])
        self.attached(eng.job, readers)

    async def detach(self, job: int) -> None:
        readers = self.readers.pop(job, None)
        if readers is not None:
            await readers.close()

    def drop_all(self) -> None:
        for job in list(self.readers):
            self.tasks.spawn(self.detach(job), f"closing the readers of job {job}")

    def barrier(self, job: int, boundary: int) -> list:
        readers = self.readers.get(job)
        if readers is None:
            return []
        readers.barrier(boundary)
        return readers.positions()

    def on_leased(self, msg: protocol.Leased) -> None:
        readers = self.readers.get(msg.job)
        if readers is not None:
            readers.on_lease(msg.first, msg.count)

    def on_credit(self, msg: protocol.Credit) -> None:
        readers = self.readers.get(msg.job)
        if readers is not None:
            readers.on_credit(msg.records)

    def on_assign(self, msg: protocol.SrcAssign) -> bytes:
        readers = self.readers.get(msg.job)
        if readers is None:
            raise ValueError(f"job {msg.job} reads no source here")
        readers.assign(msg.parts)
        return protocol.reply(msg.req, {"worker": self.me})

    async def on_release(self, msg: protocol.SrcRelease) -> bytes:
        readers = self.readers.get(msg.job)
        out = await readers.release(msg.parts) if readers is not None else []
        return protocol.reply(msg.req, {"worker": self.me, "positions": out})
