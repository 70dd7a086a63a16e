"""The planner's input log: every admitted chunk since the oldest kept checkpoint, for replay on recovery.

Every chunk is written to the state directory when it is admitted (`job-J/input/CHUNK.log`), before the
push is acknowledged and before any of its records is dispatched (the planner asks `written`), so a
restarted planner has it. Writes go to a thread of their own, off the planner's event loop, and are
group-committed: the thread writes and fdatasyncs each chunk waiting, then fsyncs the directory once for
all of them, and hands the result back to the loop (`notify`). A chunk that arrived as the whole of one
push is written as the push frame the client sent (`state_store.frame_blob`): nothing is encoded or copied again.
A torn file (the planner died while writing it) fails its checksum and is skipped on restart: its push
was not acknowledged. Without a running event loop (a unit test), each write happens inline.

Chunks also stay in memory up to `memory_records` records and `memory_bytes` bytes (their queue charge,
`clasp.core.credit.charge`); beyond either the oldest written chunks are dropped from memory and read
back only when replayed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable

from clasp.runtime.state_store import FileStore, decode_blob, encode_blob, frame_head, fsync_dir

log = logging.getLogger("clasp.input_log")

T, SIZE, RECORDS, DURABLE, NBYTES = range(5)  # the fields of an entry


def _rest(parts: list, n: int) -> list:
    """`parts` without their first `n` bytes."""
    out = []
    for p in parts:
        if n >= len(p):
            n -= len(p)
            continue
        out.append(memoryview(p)[n:] if n else p)
        n = 0
    return out


class InputLog:
    def __init__(self, store: FileStore | None, job: int, memory_records: int = 1_000_000,
                 memory_bytes: int = 128 << 20, notify: Callable[[], None] | None = None):
        self.store, self.job = store, job
        self.memory_records, self.memory_bytes = memory_records, memory_bytes
        self.notify = notify  # called on the loop once written chunks were handed back
        self.entries: dict[int, list] = {}  # chunk -> [admitted at, size, records or None, durable, bytes]
        self.in_memory = 0
        self.in_memory_bytes = 0
        self.spilled = 0  # chunks dropped from memory (they are on disk), cumulative
        self.write_failures = 0  # chunks it could not write (kept in memory instead), cumulative
        self.written_below = 0  # every chunk below this one is written (or failed to be)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._todo: deque[tuple[int, object]] = deque()  # (chunk, frame bytes or records) for the thread
        self._done: list[tuple[int, bool]] = []  # (chunk, durable) from the thread, for the loop
        self._remove: list[int] = []  # chunks whose files the thread deletes (a checkpoint covers them)
        self._cv = threading.Condition()
        self._pending = 0  # chunks handed to the thread and not back from it
        self._thread: threading.Thread | None = None
        self._closed = False
        self._dir_made = False

    def _rel(self, chunk: int) -> str:
        return f"job-{self.job}/input/{chunk}.log"

    def append(self, chunk: int, t: float, records: list, nbytes: int = 0, frame: bytes | None = None) -> None:
        """Admit a chunk (`frame`: the push frame when the chunk is all of its records); it is written
        now (no event loop) or by the writer thread (`written` tells when)."""
        self.entries[chunk] = [t, len(records), records, False, nbytes]
        self.in_memory += len(records)
        self.in_memory_bytes += nbytes
        if self.store is None:
            self._finished(chunk, False)
            return
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._finished(chunk, self._write(chunk, frame if frame is not None else records, True))
                return
        with self._cv:
            self._todo.append((chunk, frame if frame is not None else records))
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"input-log-{self.job}", daemon=True)
                self._thread.start()
            self._cv.notify()

    def written(self, chunk: int) -> bool:
        """Whether `chunk`'s write finished (durable, or failed: it is then in memory only)."""
        return chunk < self.written_below or chunk not in self.entries

    # ----------------------------------------------------------------- the writer thread
    def _write(self, chunk: int, what, sync_dir: bool) -> bool:
        path = self.store.root / self._rel(chunk)
        try:
            if not self._dir_made:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._dir_made = True
            parts = [frame_head(what), what] if isinstance(what, bytes) else [encode_blob(what, compress=False)]
            # Three plain descriptor calls (O_DSYNC: the write returns durable, as after an fdatasync), not
            # a buffered file: each call gives up the GIL and takes it back, and each take-back while the
            # event loop runs costs the loop a forced switch; `open()` adds an fstat, an ioctl, a second
            # write and a flush.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DSYNC, 0o644)
            try:
                left = sum(map(len, parts))
                while left:
                    n = os.writev(fd, parts)
                    left -= n
                    if left:  # a short write (rare): what is left of the parts
                        parts = _rest(parts, n)
            finally:
                os.close(fd)
            if sync_dir:
                fsync_dir(path.parent)
            return True
        except OSError as err:  # it stays in memory: a worker's death still replays it
            log.error("job %d: could not write input chunk %d: %s", self.job, chunk, err)
            return False

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo and not self._remove and not self._closed:
                    self._cv.wait()
                if not self._todo and not self._remove:
                    return
                batch = list(self._todo)
                self._todo.clear()
                remove, self._remove = self._remove, []
            for c in remove:
                self.store.remove_file(self._rel(c))
            if not batch:
                continue
            done = [(c, self._write(c, what, False)) for c, what in batch]
            if any(ok for _, ok in done):
                fsync_dir(self.store.root / f"job-{self.job}" / "input")  # one for the whole group
            with self._cv:
                self._done.extend(done)
                self._pending -= len(done)
                self._cv.notify_all()
            try:
                self._loop.call_soon_threadsafe(self._take_done)
            except RuntimeError:  # the loop is closed: the planner is stopping
                return

    def _take_done(self) -> None:
        with self._cv:
            done, self._done = self._done, []
        for chunk, ok in done:
            self._finished(chunk, ok)
        if done and self.notify is not None:
            self.notify()

    def _finished(self, chunk: int, durable: bool) -> None:
        e = self.entries.get(chunk)
        if e is not None:
            e[DURABLE] = durable
        if not durable and self.store is not None:
            self.write_failures += 1
        self.written_below = max(self.written_below, chunk + 1)
        if self.in_memory > self.memory_records or self.in_memory_bytes > self.memory_bytes:
            self._spill()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every chunk appended so far is written (and hand the results over): for a caller
        that must not race the thread (a test, a shutdown)."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending == 0, timeout)
        self._take_done()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread once it wrote and removed what it was given."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # ----------------------------------------------------------------- the loop's side
    def load(self, chunk: int, size: int, t: float, nbytes: int = 0) -> None:
        """A chunk found on disk by a restarted planner (read back when replayed)."""
        self.entries[chunk] = [t, size, None, True, nbytes]
        self.written_below = max(self.written_below, chunk + 1)

    def _spill(self) -> None:
        for e in self.entries.values():
            if self.in_memory <= self.memory_records // 2 and self.in_memory_bytes <= self.memory_bytes // 2:
                break
            if e[RECORDS] is None or not e[DURABLE]:
                continue
            self.in_memory -= e[SIZE]
            self.in_memory_bytes -= e[NBYTES]
            e[RECORDS] = None
            self.spilled += 1

    def in_memory_records(self, chunk: int) -> list | None:
        """The chunk's records if they are in memory, else None (they are on disk)."""
        return self.entries[chunk][RECORDS]

    def records(self, chunk: int) -> list:
        e = self.entries[chunk]
        if e[RECORDS] is not None:
            return e[RECORDS]
        rel = self._rel(chunk)
        data = self.store.read_file(rel)
        if data is None:
            raise FileNotFoundError(f"spilled input chunk {rel} is missing")
        return decode_blob(data, rel)

    def nbytes(self, chunk: int) -> int:
        return self.entries[chunk][NBYTES]

    def sizes_from(self, chunk: int) -> dict[int, tuple[float, int]]:
        return {c: (e[T], e[SIZE]) for c, e in self.entries.items() if c >= chunk}

    def drop_below(self, chunk: int) -> int:
        """Forget the chunks below `chunk` (a kept checkpoint covers them); returns how many records."""
        n = 0
        for c in [c for c in self.entries if c < chunk]:
            _t, size, recs, _durable, nbytes = self.entries.pop(c)
            n += size
            if recs is not None:
                self.in_memory -= size
                self.in_memory_bytes -= nbytes
            if self.store is not None:
                if self._thread is None:
                    self.store.remove_file(self._rel(c))
                else:
                    with self._cv:
                        self._remove.append(c)
                        self._cv.notify()
        return n

    @property
    def records_kept(self) -> int:
        return sum(e[SIZE] for e in self.entries.values())

