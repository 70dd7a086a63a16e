"""`FileSink(directory, format)`: part files committed with the checkpoints, exactly once.

Each sink partition writes a hidden in-progress file (`.NAME.TOKEN.inprogress`); a checkpoint's `prepare`
fsyncs it and renames it to `.NAME.K.pending`, and the checkpoint's `commit` renames that to
`part-NAME-K.EXT`, the only files a reader should look at. A rename is atomic, and a commit that finds the
part file there and no pending file has nothing left to do, so committing again after a failure (on any
worker sharing the directory) never writes a value twice. A checkpoint during which a partition wrote
nothing makes no file. `abort` deletes the partition's in-progress and pending files. Like Flink's FileSink,
one part file per partition and checkpoint: readers take `part-*` files in name order.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import msgpack

from clasp.core.connector import Sink, SinkPartition

FORMATS = {"lines": "txt", "jsonl": "jsonl", "msgpack": "msgpack"}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", name)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # one encoder: json.dumps(**kw) makes one a call


def encode_values(values: list, fmt: str) -> bytes:
    """Values as the bytes a part file of `fmt` holds for them."""
    if not values:
        return b""
    if fmt == "lines":
        return ("\n".join(v if isinstance(v, str) else str(v) for v in values) + "\n").encode()
    if fmt == "jsonl":
        return ("\n".join(map(_JSON.encode, values)) + "\n").encode()
    packer = msgpack.Packer(use_bin_type=True)
    return b"".join(map(packer.pack, values))


def decode_values(data: bytes, fmt: str) -> list:
    if fmt == "lines":
        return data.decode().splitlines()
    if fmt == "jsonl":
        return [json.loads(line) for line in data.decode().splitlines() if line]
    u = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True, max_buffer_size=max(len(data), 1 << 20))
    u.feed(data)
    return list(u)


class FilePartition(SinkPartition):
    def __init__(self, directory: Path, name: str, fmt: str):
        self.dir = directory
        self.name = _safe(name)
        self.fmt = fmt
        self.token = uuid.uuid4().hex[:12]
        self.current: Path | None = None
        self.file = None
        self.count = 0

    def final(self, ckpt: int) -> Path:
        return self.dir / f"part-{self.name}-{ckpt:010d}.{FORMATS[self.fmt]}"

    def _pending(self, ckpt: int) -> Path:
        return self.dir / f".{self.name}.{ckpt:010d}.pending"

    def _write(self, data: bytes) -> None:
        if self.file is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.current = self.dir / f".{self.name}.{self.token}.{self.count}.inprogress"
            self.file = open(self.current, "wb")  # noqa: SIM115 (kept open across batches)
        self.file.write(data)

    async def write_batch(self, values: list) -> None:
        data = encode_values(values, self.fmt)  # an unencodable value fails here, before anything is written
        await asyncio.to_thread(self._write, data)

    def _prepare(self, ckpt: int) -> dict | None:
        if self.file is None:
            return None
        f, self.file = self.file, None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        pending = self._pending(ckpt)
        os.replace(self.current, pending)
        _fsync_dir(self.dir)
        self.count += 1
        return {"pending": pending.name, "final": self.final(ckpt).name}

    async def prepare(self, checkpoint: int) -> Any:
        return await asyncio.to_thread(self._prepare, checkpoint)

    def _commit(self, prepared: dict) -> None:
        pending, final = self.dir / prepared["pending"], self.dir / prepared["final"]
        if pending.exists():
            os.replace(pending, final)
            _fsync_dir(self.dir)
        elif not final.exists():
            raise FileNotFoundError(f"neither {pending} nor {final} exists: the prepared part file is gone")

    async def commit(self, checkpoint: int, prepared: Any) -> None:
        if prepared:
            await asyncio.to_thread(self._commit, prepared)

    def _abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if not self.dir.exists():
            return
        for p in self.dir.iterdir():
            n = p.name
            if n.startswith(f".{self.name}.") and (n.endswith(".inprogress") or n.endswith(".pending")):
                p.unlink(missing_ok=True)

    async def abort(self) -> None:
        await asyncio.to_thread(self._abort)

    async def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class FileSink(Sink):
    """Part files in `directory` (a directory every worker shares), one per sink partition and checkpoint,
    renamed into place when the checkpoint completes: exactly once. `format`: "lines" (each value as text,
    one per line: `str(value)` unless it is a str), "jsonl" (one JSON document per line) or "msgpack" (a
    stream of msgpack values: anything the runtime carries, read back by `read`)."""

    exactly_once = True

    def __init__(self, directory: str | os.PathLike, format: str = "lines"):
        if format not in FORMATS:
            raise ValueError(f"FileSink format {format!r}: one of {', '.join(FORMATS)}")
        self.directory = str(directory)
        self.format = format

    def open(self, partition: str) -> SinkPartition:
        return FilePartition(Path(self.directory), partition, self.format)

    def part_files(self) -> list[Path]:
        """The committed part files, in name order (partition, then checkpoint)."""
        d = Path(self.directory)
        return sorted(d.glob("part-*")) if d.exists() else []

    def read(self) -> dict[str, list]:
        """Every committed value, by part file name, in the order written."""
        return {p.name: decode_values(p.read_bytes(), self.format) for p in self.part_files()}

    def __repr__(self) -> str:
        return f"FileSink({self.directory!r}, format={self.format!r})"
