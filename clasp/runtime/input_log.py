"""The planner's input log: every admitted chunk since the oldest kept checkpoint, for replay on recovery.

Every chunk is written to the state directory when it is admitted, before the push is acknowledged and
before any of its records is dispatched (the planner asks `written`), so a restarted planner has it. Writes
go to a thread of their own, off the planner's event loop, and are group-committed: the thread appends
each chunk waiting to the job's open segment file (`job-J/input/FIRST.seg`, FIRST its first chunk), then
fdatasyncs it once for all of them, and hands the result back to the loop (`notify`). A chunk that arrived
as the whole of one push is written as the push frame the client sent (`state_store.frame_blob`): nothing
is encoded or copied again. Each record of a segment is a head (`SEG_HEAD`: chunk, records, blob length)
and the chunk's blob, whose checksum covers its payload; a torn tail (the planner died while appending it)
fails it and ends the segment on restart (`stored_chunks`): its push was not acknowledged. A segment is
closed when a checkpoint lets the log drop chunks, and removed once every chunk in it is below the kept
checkpoints: a file per checkpoint interval, not one per push (creating, syncing the directory for and
unlinking a file per push cost the log's thread more than the data). Files `CHUNK.log` of the layout
before (one chunk each) are still read. Without a running event loop (a unit test), each write happens
inline.

Chunks also stay in memory up to `memory_records` records and `memory_bytes` bytes (their queue charge,
`clasp.core.credit.charge`); beyond either the oldest written chunks are dropped from memory and read
back only when replayed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

from clasp.runtime.state_store import MAGIC, FileStore, decode_blob, encode_blob, frame_head, fsync_dir

log = logging.getLogger("clasp.input_log")

T, SIZE, RECORDS, DURABLE, NBYTES = range(5)  # the fields of an entry
SEG_MAGIC = b"CLIN"
SEG_HEAD = struct.Struct(">4sQII")  # magic, chunk, records, length of the blob that follows
SEGMENT = ".seg"


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


def _writev_all(fd: int, parts: list) -> None:
    left = sum(map(len, parts))
    while left:
        n = os.writev(fd, parts)
        left -= n
        if left:  # a short write (rare): what is left of the parts
            parts = _rest(parts, n)


def _blob_intact(blob: memoryview) -> bool:
    """Whether `blob` (`state_store.wrap_blob`'s layout) is whole: its payload matches its checksum."""
    head = len(MAGIC) + 5
    return (len(blob) >= head and blob[:len(MAGIC)] == MAGIC
            and zlib.crc32(blob[head:]) == int.from_bytes(blob[len(MAGIC) + 1:head], "big"))


def stored_chunks(input_dir: Path) -> dict[int, tuple[int, int, tuple[str, int, int] | None]]:
    """The chunks a job's input directory holds: chunk -> (records, bytes, where), `where` the segment file,
    offset and length of its blob (None: a file of its own, the layout before). A segment is read up to its
    first record that is torn or fails its checksum (nothing after it was acknowledged); an unreadable file
    of the layout before is skipped."""
    out: dict[int, tuple[int, int, tuple[str, int, int] | None]] = {}
    for f in sorted(input_dir.glob(f"*{SEGMENT}")):
        try:
            data = f.read_bytes()
        except OSError as e:
            log.error("input segment %s is unreadable and skipped: %s", f, e)
            continue
        at = 0
        while at + SEG_HEAD.size <= len(data):
            magic, chunk, size, length = SEG_HEAD.unpack_from(data, at)
            start = at + SEG_HEAD.size
            if magic != SEG_MAGIC or start + length > len(data):
                log.error("input segment %s is torn at byte %d: the rest is skipped", f, at)
                break
            if not _blob_intact(memoryview(data)[start:start + length]):
                log.error("input segment %s: chunk %d fails its checksum, the rest is skipped", f, chunk)
                break
            out[chunk] = (size, length, (f.name, start, length))
            at = start + length
    for f in input_dir.glob("*.log"):
        try:
            data = f.read_bytes()
            out[int(f.stem)] = (len(decode_blob(data, str(f))), len(data), None)
        except Exception as e:
            log.error("input chunk %s is unreadable and skipped: %s", f, e)
    return dict(sorted(out.items()))


class InputLog:
    def __init__(self, store: FileStore | None, job: int, memory_records: int = 1_000_000,
                 memory_bytes: int = 128 << 20, notify: Callable[[], None] | None = None):
        self.store, self.job = store, job
        self.memory_records, self.memory_bytes = memory_records, memory_bytes
        self.notify = notify  # called on the loop once written chunks were handed back
        self.entries: dict[int, list] = {}  # chunk -> [admitted at, size, records or None, durable, bytes]
        self.where: dict[int, tuple[str, int, int]] = {}  # chunk -> (segment file, offset, length) once written
        self.in_memory = 0
        self.in_memory_bytes = 0
        self.spilled = 0  # chunks dropped from memory (they are on disk), cumulative
        self.write_failures = 0  # chunks it could not write (kept in memory instead), cumulative
        self.written_below = 0  # every chunk below this one is written (or failed to be)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._todo: deque[tuple[int, object]] = deque()  # (chunk, frame bytes or records) for the thread
        self._done: list[tuple[int, tuple | None]] = []  # (chunk, where or None: not durable) for the loop
        self._floor: int | None = None  # the chunks below this one can go (the thread closes and removes)
        self._cv = threading.Condition()
        self._pending = 0  # chunks handed to the thread and not back from it
        self._thread: threading.Thread | None = None
        self._closed = False
        # The writer's (the thread's, or the loop's without one): the open segment, its name and size, and
        # the last chunk of every segment it wrote (removed once that is below the floor).
        self._fd: int | None = None
        self._seg = ""
        self._seg_size = 0
        self._last_of: dict[str, int] = {}

    @property
    def dir(self) -> Path:
        return self.store.root / f"job-{self.job}" / "input"

    def append(self, chunk: int, t: float, records: list, nbytes: int = 0, frame: bytes | memoryview | None = None
               ) -> None:
        """Admit a chunk (`frame`: the push frame when the chunk is all of its records); it is written
        now (no event loop) or by the writer thread (`written` tells when)."""
        self.entries[chunk] = [t, len(records), records, False, nbytes]
        self.in_memory += len(records)
        self.in_memory_bytes += nbytes
        if self.store is None:
            self._finished(chunk, None)
            return
        what = (len(records), frame if frame is not None else records)
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                for c, where in self._write([(chunk, what)]):
                    self._finished(c, where)
                return
        with self._cv:
            self._todo.append((chunk, what))
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"input-log-{self.job}", daemon=True)
                self._thread.start()
            self._cv.notify()

    def written(self, chunk: int) -> bool:
        """Whether `chunk`'s write finished (durable, or failed: it is then in memory only)."""
        return chunk < self.written_below or chunk not in self.entries

    # ----------------------------------------------------------------- the writer
    def _write(self, batch: list) -> list[tuple[int, tuple | None]]:
        """Append the chunks of `batch` [(chunk, (records, frame or records))] to the open segment (a new
        one if none is) and make them durable together; returns (chunk, where or None) each."""
        out: list[tuple[int, tuple | None]] = []
        try:
            new = self._fd is None
            if new:
                first = batch[0][0]
                self.dir.mkdir(parents=True, exist_ok=True)
                self._seg, self._seg_size = f"{first}{SEGMENT}", 0
                self._fd = os.open(self.dir / self._seg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            at = self._seg_size
            for chunk, (size, what) in batch:
                framed = isinstance(what, bytes | memoryview)  # the push frame, or a view of libzmq's copy of it
                blob = [frame_head(what), what] if framed else [encode_blob(what, compress=False)]
                length = sum(map(len, blob))
                # A plain descriptor call per chunk, not a buffered file: each call gives up the GIL and takes it
                # back, and each take-back while the event loop runs costs the loop a forced switch.
                _writev_all(self._fd, [SEG_HEAD.pack(SEG_MAGIC, chunk, size, length), *blob])
                out.append((chunk, (self._seg, at + SEG_HEAD.size, length)))
                at += SEG_HEAD.size + length
                self._last_of[self._seg] = chunk
            self._seg_size = at
            os.fdatasync(self._fd)  # one for the whole group
            if new:
                fsync_dir(self.dir)  # the segment's name
            return out
        except OSError as err:  # they stay in memory: a worker's death still replays them
            log.error("job %d: could not write input chunks %s: %s", self.job, [c for c, _ in batch], err)
            self._close_segment()  # a torn tail ends a segment: later chunks go to a new one
            return [(c, None) for c, _ in batch]

    def _close_segment(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _drop_files(self, floor: int) -> None:
        """Close the open segment (the next chunk starts one) and remove the segments wholly below `floor`."""
        self._close_segment()
        for name in [n for n, last in self._last_of.items() if last < floor]:
            del self._last_of[name]
            self.store.remove_file(f"job-{self.job}/input/{name}")

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._todo and self._floor is None and not self._closed:
                    self._cv.wait()
                if not self._todo and self._floor is None:
                    self._close_segment()
                    return
                batch = list(self._todo)
                self._todo.clear()
                floor, self._floor = self._floor, None
            if floor is not None:
                self._drop_files(floor)
            if not batch:
                continue
            done = self._write(batch)
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
        for chunk, where in done:
            self._finished(chunk, where)
        if done and self.notify is not None:
            self.notify()

    def _finished(self, chunk: int, where: tuple | None) -> None:
        e = self.entries.get(chunk)
        if e is not None:
            e[DURABLE] = where is not None
            if where is not None:
                self.where[chunk] = where
        if where is None and self.store is not None:
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
        else:
            self._close_segment()

    # ----------------------------------------------------------------- the loop's side
    def load(self, chunk: int, size: int, t: float, nbytes: int = 0, where: tuple | None = None) -> None:
        """A chunk found on disk by a restarted planner (read back when replayed); `where`: its place in a
        segment (`stored_chunks`), None for a file of its own."""
        self.entries[chunk] = [t, size, None, True, nbytes]
        if where is not None:
            self.where[chunk] = where
            self._last_of[where[0]] = max(chunk, self._last_of.get(where[0], chunk))
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
        where = self.where.get(chunk)
        if where is None:  # a file of its own (the layout before)
            rel = f"job-{self.job}/input/{chunk}.log"
            data = self.store.read_file(rel)
            if data is None:
                raise FileNotFoundError(f"spilled input chunk {rel} is missing")
            return decode_blob(data, rel)
        name, offset, length = where
        path = self.dir / name
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if len(data) != length:
            raise FileNotFoundError(f"spilled input chunk {chunk} is missing from {path}")
        return decode_blob(data, str(path))

    def nbytes(self, chunk: int) -> int:
        return self.entries[chunk][NBYTES]

    def sizes_from(self, chunk: int) -> dict[int, tuple[float, int]]:
        return {c: (e[T], e[SIZE]) for c, e in self.entries.items() if c >= chunk}

    def drop_below(self, chunk: int) -> int:
        """Forget the chunks below `chunk` (a kept checkpoint covers them); returns how many records. Their
        segments go once nothing at or above `chunk` is in them; the open one is closed."""
        n = 0
        old_files = []
        for c in [c for c in self.entries if c < chunk]:
            _t, size, recs, _durable, nbytes = self.entries.pop(c)
            n += size
            if recs is not None:
                self.in_memory -= size
                self.in_memory_bytes -= nbytes
            if self.where.pop(c, None) is None:
                old_files.append(c)
        if self.store is None:
            return n
        for c in old_files:  # the layout before: a file per chunk (a failed write has none: nothing removed)
            self.store.remove_file(f"job-{self.job}/input/{c}.log")
        if self._thread is None:
            self._drop_files(chunk)
        else:
            with self._cv:
                self._floor = chunk if self._floor is None else max(self._floor, chunk)
                self._cv.notify()
        return n

    @property
    def records_kept(self) -> int:
        return sum(e[SIZE] for e in self.entries.values())
