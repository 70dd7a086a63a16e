"""The planner's input log: every admitted chunk since the oldest kept checkpoint, for replay on recovery.

Every chunk is written to the state directory when it is admitted (`job-J/input/CHUNK.log`, atomically,
before the push is acknowledged), so a restarted planner has it. Chunks also stay in memory up to
`memory_records` records; beyond that the oldest are dropped from memory and read back only when replayed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from clasp.runtime.state_store import FileStore, decode_blob, encode_blob

log = logging.getLogger("clasp.input_log")


class InputLog:
    def __init__(self, store: FileStore | None, job: int, memory_records: int = 1_000_000):
        self.store, self.job, self.memory_records = store, job, memory_records
        self.entries: dict[int, list] = {}  # chunk -> [admitted at, size, records or None when spilled]
        self.in_memory = 0
        self.spilled = 0  # chunks written to disk, cumulative
        self.spill_errors = 0

    def _rel(self, chunk: int) -> str:
        return f"job-{self.job}/input/{chunk}.log"

    def append(self, chunk: int, t: float, records: list) -> None:
        self.entries[chunk] = [t, len(records), records]
        self.in_memory += len(records)
        durable = False
        if self.store is not None:
            try:
                self.store.write_file(self._rel(chunk), encode_blob(records, compress=False))
                durable = True
            except OSError as err:  # it stays in memory: a worker's death still replays it
                self.spill_errors += 1
                log.error("job %d: could not write input chunk %d: %s", self.job, chunk, err)
        self.entries[chunk].append(durable)
        if self.in_memory > self.memory_records:
            self._spill()

    def load(self, chunk: int, size: int, t: float) -> None:
        """A chunk found on disk by a restarted planner (read back when replayed)."""
        self.entries[chunk] = [t, size, None, True]

    def _spill(self) -> None:
        for e in self.entries.values():
            if self.in_memory <= self.memory_records // 2:
                break
            if e[2] is None or not e[3]:
                continue
            self.in_memory -= e[1]
            e[2] = None
            self.spilled += 1

    def records(self, chunk: int) -> list:
        e = self.entries[chunk]
        if e[2] is not None:
            return e[2]
        rel = self._rel(chunk)
        data = self.store.read_file(rel)
        if data is None:
            raise FileNotFoundError(f"spilled input chunk {rel} is missing")
        return decode_blob(data, rel)

    def sizes_from(self, chunk: int) -> dict[int, tuple[float, int]]:
        return {c: (e[0], e[1]) for c, e in self.entries.items() if c >= chunk}

    def chunks_from(self, chunk: int) -> Iterator[tuple[int, list]]:
        for c in [c for c in self.entries if c >= chunk]:
            yield c, self.records(c)

    def drop_below(self, chunk: int) -> int:
        """Forget the chunks below `chunk` (a kept checkpoint covers them); returns how many records."""
        n = 0
        for c in [c for c in self.entries if c < chunk]:
            t, size, recs, _durable = self.entries.pop(c)
            n += size
            if recs is not None:
                self.in_memory -= size
            if self.store is not None:
                self.store.remove_file(self._rel(c))
        return n

    @property
    def records_kept(self) -> int:
        return sum(e[1] for e in self.entries.values())
