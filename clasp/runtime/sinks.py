"""The worker's side of sinks (clasp.core.sinks, docs/CONNECTORS.md): values reaching a sink operator go to
this worker's partition of the sink, are prepared with each checkpoint and committed when it completes.

A sink operator keeps the values reaching it with their records (`OpRuntime.sink`); one `SinkWriter` per
sink operator and job takes them out in batches, in order, and writes them to the partition. While a
checkpoint's barrier is up it writes only values of records below the boundary, so that what the snapshot
prepares is exactly the checkpoint's. `WorkerSinks` is the worker's collaborator for them: the worker
routes the control messages `sink_commit` and `sink_flush` to it, and it is called at deploy, barrier,
snapshot and restore (by the worker and by `clasp.runtime.worker_recovery.WorkerCheckpoints`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from clasp.core import protocol
from clasp.core.sinks import SINK_BATCH, SINK_BUFFER, partition_name, take_writable
from clasp.runtime.engine import JobEngine
from clasp.runtime.operators import OperatorError, OpRuntime
from clasp.runtime.tasks import ProcessTasks

log = logging.getLogger("clasp.worker.sinks")


class SinkWriter:
    """One sink operator's partition on this worker, for one job engine."""

    def __init__(self, eng: JobEngine, op: OpRuntime, partition: str, lock: asyncio.Lock, on_room):
        self.eng, self.op = eng, op
        self.sink = eng.spec.operators[op.index].connector
        self.name = partition
        self.lock = lock  # per partition name, shared with whoever commits or aborts it on this worker
        self.part = None  # opened on the first value
        self.fence: int | None = None  # a checkpoint's boundary while its barrier is up
        self.uncommitted: list[list] = []  # [[checkpoint, prepared], ...] prepared and not committed yet
        self.event = asyncio.Event()
        self.on_room = on_room
        self.task: asyncio.Task | None = None
        self.stopped = False
        self.written = 0
        op.sink_wake = self.event.set
        op.sink_room = SINK_BUFFER

    def open(self):
        if self.part is None:
            self.part = self.sink.open(self.name)
        return self.part

    async def run(self) -> None:
        while not self.stopped:
            await self.event.wait()
            self.event.clear()
            async with self.lock:
                if not self.stopped:
                    await self._drain()

    def stop(self) -> None:
        """No more writes: a batch being written finishes (whoever takes the lock next waits for it)."""
        self.stopped = True
        self.event.set()

    async def _drain(self, fence: int | None = -1) -> None:
        """Write what may be written now (below `fence`; by default the writer's own), then let the sink
        operator take requests again if its buffer has room."""
        op = self.op
        own = fence == -1
        while op.collected and not self.stopped:
            # The fence is read again after each take: a barrier that goes up while values are written fences
            # the next take (what was taken before it came is below its boundary: dispatched before it).
            taken, op.collected, op.collected_rids = take_writable(op.collected, op.collected_rids,
                                                                   self.fence if own else fence)
            if not taken:
                break
            for i in range(0, len(taken), SINK_BATCH):
                batch = taken[i:i + SINK_BATCH]
                try:
                    await self.open().write_batch(batch)
                    self.written += len(batch)
                except Exception as e:  # the sink's failure is the batch's: counted and reported, never fatal
                    self.report(e, batch[0], len(batch))
                await asyncio.sleep(0)
        # While a barrier is up, values above it wait here without holding back the requests below it.
        op.sink_room = math.inf if self.fence is not None else SINK_BUFFER
        if op.busy and len(op.collected) < op.sink_room:
            op.busy = False
            self.on_room()

    def report(self, e: BaseException, value, n: int = 1) -> None:
        self.eng.executor.fail(self.op, OperatorError(f"sink {self.op.name!r}: {type(e).__name__}: {e}"), value)
        self.op.errors += n - 1
        self.eng.executor.failed += n - 1
        log.error("job %d sink %s partition %s: %s: %s", self.eng.job, self.op.name, self.name, type(e).__name__, e)

    async def prepare(self, ckpt: int, boundary: int) -> list:
        """Checkpoint `ckpt`: write every value below `boundary`, prepare, lift the fence; returns every
        prepared checkpoint not committed yet."""
        async with self.lock:
            await self._drain(boundary)
            if self.part is not None:
                prepared = await self.part.prepare(ckpt)
                if prepared is not None:
                    self.uncommitted.append([ckpt, prepared])
            self.fence = None
            self.event.set()
            return [list(e) for e in self.uncommitted]

    def committed(self, upto: int) -> None:
        self.uncommitted = [e for e in self.uncommitted if e[0] > upto]


async def commit_entries(part, entries: list) -> None:
    for k, prepared in sorted(entries, key=lambda e: e[0]):
        await part.commit(k, prepared)


class WorkerSinks:
    """Sink writers of the worker's job engines, and the sink control messages. `me`: the worker's id (it
    names the partitions); `send` sends on the control channel (the answers); `engine_of(msg)` finds a
    request's job engine (or raises); `wake` wakes the executor loop (a sink operator has room again);
    `error_text(what, e)` is what the planner is told of a failure."""

    def __init__(self, me: str, tasks: ProcessTasks, *, send: Callable[[bytes], object],
                 engine_of: Callable[[protocol.JobCall], JobEngine], wake: Callable[[], None],
                 error_text: Callable[[str, BaseException], str]):
        self.me, self.tasks = me, tasks
        self.send, self.engine_of, self.wake, self.error_text = send, engine_of, wake, error_text
        self.writers: dict[tuple[int, int], SinkWriter] = {}  # (job, op index) -> its writer here
        self.locks: dict[str, asyncio.Lock] = {}  # partition name -> lock

    def _writers_of(self, job: int) -> list[SinkWriter]:
        return [w for (j, _), w in self.writers.items() if j == job]

    def attach(self, eng: JobEngine, run: str) -> None:
        """A new engine for a job: a writer for each of its sink operators."""
        for op in eng.ops:
            if not op.sink:
                continue
            name = partition_name(op.name, self.me, run)
            w = SinkWriter(eng, op, name, self.locks.setdefault(name, asyncio.Lock()), self.wake)
            self.writers[(eng.job, op.index)] = w
            w.task = self.tasks.spawn(w.run(), f"sink {op.name} of job {eng.job}")

    def detach(self, job: int) -> list[SinkWriter]:
        """Stop the job's writers (the engine is going); returns them, their partitions still open."""
        out = []
        for key in [k for k in self.writers if k[0] == job]:
            w = self.writers.pop(key)
            w.stop()
            out.append(w)
        return out

    def fence(self, eng: JobEngine, boundary: int) -> None:
        for w in self._writers_of(eng.job):
            if w.eng is eng:
                w.fence = boundary
                w.op.sink_room = math.inf

    def unfence(self, eng: JobEngine) -> None:
        for w in self._writers_of(eng.job):
            if w.eng is eng:
                w.fence = None
                w.event.set()

    async def prepare(self, eng: JobEngine, ckpt: int, boundary: int) -> dict:
        """The snapshot's part: partition -> [sink, [[k, prepared], ...]] for every partition written."""
        out = {}
        for w in self._writers_of(eng.job):
            if w.eng is not eng:
                continue
            entries = await w.prepare(ckpt, boundary)
            if entries:
                out[w.name] = [w.op.name, entries]
        return out

    def on_commit(self, msg: protocol.SinkCommit) -> None:
        """A complete checkpoint's commits of this worker's partitions (`parts`: partition -> [sink,
        entries]); answered once done, off the control loop. A failing commit is reported, the rest made."""
        eng = self.engine_of(msg)
        self.tasks.spawn(self._answer(msg.req, self._commit_parts(eng, msg.parts)), f"sink commit of job {eng.job}")

    def on_flush(self, msg: protocol.SinkFlush) -> None:
        eng = self.engine_of(msg)
        self.tasks.spawn(self._answer(msg.req, self._flush_sinks(eng, msg.seq)), f"sink flush of job {eng.job}")

    async def _answer(self, req: int, work) -> None:
        try:
            failed = await work
        except Exception as e:
            self.send(protocol.reply_error(req, self.error_text("sink", e)))
            return
        self.send(protocol.reply(req, {"worker": self.me, "failed": failed}))

    async def _commit_parts(self, eng: JobEngine, parts: dict) -> list[list[str]]:
        """Commit each partition's prepared checkpoints in order; returns [[partition, error], ...] that failed."""
        locks = self.locks
        mine = {w.name: w for w in self._writers_of(eng.job)}
        failed = []
        for name, (sink_name, entries) in parts.items():
            w = mine.get(name)
            async with locks.setdefault(name, asyncio.Lock()):
                part = w.open() if w is not None else eng.spec.by_name(sink_name).connector.open(name)
                try:
                    await commit_entries(part, entries)
                except Exception as e:
                    failed.append([name, f"{type(e).__name__}: {e}"[:300]])
                    self._sink_error(eng, sink_name, name, "commit", e)
                    continue
                finally:
                    if w is None:
                        await _quietly(part.close())
            if w is not None:
                w.committed(max(e[0] for e in entries))
        return failed

    def _sink_error(self, eng: JobEngine, sink_name: str, partition: str, what: str, e: BaseException) -> None:
        op = eng.op(sink_name)
        eng.executor.fail(op, OperatorError(f"sink {sink_name!r} {what} of {partition}: {type(e).__name__}: {e}"), None)
        log.error("job %d sink %s: %s of %s failed: %s: %s", eng.job, sink_name, what, partition,
                  type(e).__name__, e)

    async def _flush_sinks(self, eng: JobEngine, seq: int) -> list[list[str]]:
        """Checkpoints off: write and commit everything this worker holds for the job's sinks now, as
        flush `seq` (in place of a checkpoint id)."""
        failed = []
        for w in self._writers_of(eng.job):
            if w.eng is not eng:
                continue
            async with w.lock:
                await w._drain(None)
                if w.part is None:
                    continue
                try:
                    prepared = await w.part.prepare(seq)
                    if prepared is not None:
                        await w.part.commit(seq, prepared)
                except Exception as e:
                    failed.append([w.name, f"{type(e).__name__}: {e}"[:300]])
                    self._sink_error(eng, w.op.name, w.name, "commit", e)
        return failed

    async def recover(self, job: int, duties: dict, spec) -> list[str]:
        """A recovery, before the job's new engine: commit what this worker owes (its own partitions' and
        the dead workers' it takes over), then abort everything else written and not committed: its own
        partitions of the old engine and the dead workers' partitions. Returns the partitions whose commit
        failed (the planner keeps them owed)."""
        locks = self.locks
        old = {w.name: w for w in self.detach(job)}
        failed = []
        for name, sink_name, entries in duties.get("commit", []):
            async with locks.setdefault(name, asyncio.Lock()):
                w = old.get(name)
                part = w.open() if w is not None else spec.by_name(sink_name).connector.open(name)
                try:
                    await commit_entries(part, entries)
                except Exception as e:
                    failed.append(name)
                    log.error("job %d sink %s: commit of %s failed in a recovery: %s: %s", job, sink_name, name,
                              type(e).__name__, e)
                finally:
                    if w is None:
                        await _quietly(part.close())
        aborts = [(w.op.name, name, w) for name, w in old.items()]
        aborts += [(s, name, None) for s, name in duties.get("abort", []) if name not in old]
        for sink_name, name, w in aborts:
            async with locks.setdefault(name, asyncio.Lock()):
                part = w.part if w is not None else spec.by_name(sink_name).connector.open(name)
                if part is None:
                    part = spec.by_name(sink_name).connector.open(name)
                await _quietly(part.abort(), f"abort of {name}")
                await _quietly(part.close())
        return failed

    async def stop(self, job: int) -> None:
        """The job is cancelled: drop what its partitions did not commit."""
        for w in self.detach(job):
            async with w.lock:
                if w.part is not None:
                    await _quietly(w.part.abort(), f"abort of {w.name}")
                    await _quietly(w.part.close())


async def _quietly(coro, what: str = "") -> None:
    try:
        await coro
    except Exception as e:  # a connector failing to clean up must not stop a recovery
        if what:
            log.error("sink %s failed: %s: %s", what, type(e).__name__, e)
