"""`FileSource`: files read by the workers, one partition per file or per byte range of a large file.

Positions are byte offsets: where the next line starts. A range `[start, end)` reads the lines that *begin*
inside it (a line that begins at `end - 1` is read whole, past `end`; one that began before `start` is the
previous range's), so ranges split a file at any byte and every line is read once. Reads are blocking file
I/O on a thread (`asyncio.to_thread`), a batch of lines at a time.
"""

from __future__ import annotations

import asyncio
import csv
import glob
import json
import os
from typing import Any

from clasp.core.connector import Source, SourcePartition

FORMATS = ("lines", "jsonl", "csv")
DEFAULT_RANGE_BYTES = 64 << 20  # a file larger than this is read as several partitions


def _range_name(path: str, start: int, end: int, size: int) -> str:
    return path if (start, end) == (0, size) else f"{path}@{start}-{end}"


def _parse_name(name: str) -> tuple[str, int | None, int | None]:
    path, sep, span = name.rpartition("@")
    if sep and "-" in span:
        a, _, b = span.partition("-")
        if a.isdigit() and b.isdigit():
            return path, int(a), int(b)
    return name, None, None


class FileSource(Source):
    """Lines of the files matching `path_or_glob` (a path, a glob, or a list of them): `format="lines"` gives
    each line as a str (without its newline), `"jsonl"` each line parsed as JSON (blank lines skipped),
    `"csv"` each row after the file's header as a dict of str. Files larger than `range_bytes` are read as
    byte ranges of about that size, each a partition. The files are listed once, when the job is submitted:
    files that appear later are not read. A line that is not valid JSON (or CSV) is reported as an error of
    the source operator, naming the file and the byte offset, and skipped."""

    def __init__(self, path_or_glob: str | os.PathLike | list, format: str = "lines",
                 range_bytes: int = DEFAULT_RANGE_BYTES, encoding: str = "utf-8"):
        if format not in FORMATS:
            raise ValueError(f"FileSource format {format!r}; accepted: {', '.join(FORMATS)}")
        if range_bytes <= 0:
            raise ValueError(f"range_bytes must be positive, not {range_bytes}")
        self.patterns = [os.fspath(p) for p in path_or_glob] if isinstance(path_or_glob, list) else [
            os.fspath(path_or_glob)]
        self.format = format
        self.range_bytes = range_bytes
        self.encoding = encoding

    def files(self) -> list[str]:
        out: list[str] = []
        for p in self.patterns:
            matches = sorted(glob.glob(p)) if glob.has_magic(p) else ([p] if os.path.isfile(p) else [])
            out.extend(os.path.abspath(m) for m in matches if os.path.isfile(m))
        if not out:
            raise FileNotFoundError(f"FileSource: no file matches {self.patterns}")
        return list(dict.fromkeys(out))

    def partitions(self) -> list[str]:
        names = []
        for path in self.files():
            size = os.path.getsize(path)
            n = max(1, -(-size // self.range_bytes))
            step = -(-size // n) if size else 0
            for i in range(n):
                start, end = i * step, min(size, (i + 1) * step) if i < n - 1 else size
                names.append(_range_name(path, start, end, size))
        return names

    def open(self, partition: str, position: Any | None) -> FileReader:
        path, start, end = _parse_name(partition)
        if start is None:
            start, end = 0, None  # the whole file, however long it has grown
        return FileReader(path, start, end, position, self.format, self.encoding)

    def __repr__(self) -> str:
        return f"FileSource({self.patterns!r}, format={self.format!r})"


class FileReader(SourcePartition):
    """One file's byte range `[start, end)` (end None: to the end of the file), from `position`."""

    def __init__(self, path: str, start: int, end: int | None, position: int | None, format: str, encoding: str):
        self.path, self.start, self.end = path, start, end
        self.format, self.encoding = format, encoding
        self._pos = int(position) if position is not None else None
        self._done = False
        self._errors: list[str] = []
        self._header: list[str] | None = None

    def position(self) -> int | None:
        return self._pos

    @property
    def exhausted(self) -> bool:
        return self._done

    def take_errors(self) -> list[str]:
        e, self._errors = self._errors, []
        return e

    async def next_batch(self, limit: int) -> list:
        if self._done:
            return []
        values, pos, done, errors = await asyncio.to_thread(self._read, limit)
        self._pos, self._done = pos, done
        self._errors.extend(errors)
        return values

    def _first_line(self, f) -> int:
        """The offset of the first line that begins at or after `start`."""
        if self.start == 0:
            return 0
        f.seek(self.start - 1)
        f.readline()  # the rest of the line that began before the range (or just its newline)
        return f.tell()

    def _read(self, limit: int) -> tuple[list, int, bool, list[str]]:
        values: list = []
        errors: list[str] = []
        with open(self.path, "rb") as f:
            if self.format == "csv" and self._header is None:
                f.seek(0)
                header = f.readline()
                self._header = next(csv.reader([header.decode(self.encoding).rstrip("\r\n")]), [])
                header_end = f.tell()
            else:
                header_end = 0
            pos = self._pos
            if pos is None:
                pos = max(self._first_line(f), header_end)
            end = self.end
            f.seek(pos)
            readline = f.readline
            fmt, enc = self.format, self.encoding
            done = False
            while len(values) < limit:
                if end is not None and pos >= end:
                    done = True
                    break
                line = readline()
                if not line:
                    done = True
                    break
                at = pos
                pos += len(line)
                text = line.decode(enc, errors="replace").rstrip("\r\n")
                if fmt == "lines":
                    values.append(text)
                elif fmt == "jsonl":
                    if not text.strip():
                        continue
                    try:
                        values.append(json.loads(text))
                    except ValueError as e:
                        errors.append(f"{self.path} at byte {at}: invalid JSON ({e}): {text[:80]!r}")
                else:
                    row = next(csv.reader([text]), [])
                    if not row:
                        continue
                    if len(row) != len(self._header):
                        errors.append(f"{self.path} at byte {at}: {len(row)} fields, the header has "
                                      f"{len(self._header)}: {text[:80]!r}")
                        continue
                    values.append(dict(zip(self._header, row, strict=True)))
            if not done and end is not None and pos >= end:
                done = True
            return values, pos, done, errors
