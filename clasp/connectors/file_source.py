"""`FileSource`: files read by the workers, one partition per file or per byte range of a large file.

Positions are byte offsets: where the next line starts. A range `[start, end)` reads the lines that *begin*
inside it (a line that begins at `end - 1` is read whole, past `end`; one that began before `start` is the
previous range's), so ranges split a file at any byte and every line is read once.

A reader keeps its file open and reads ahead in blocks of `READ_BYTES`, cut into lines in C (one decode and
one split per batch, not a call per line). A block already in the page cache is read on the event loop
(`preadv` with `RWF_NOWAIT`: a read that would wait for the disk fails at once instead); any other read, and the
open, go to a thread (`asyncio.to_thread`). Lines are cut at the byte `\n`: the encoding must be an ASCII
superset (UTF-8, Latin-1, ...). JSON lines in UTF-8 are decoded by orjson where it reads every line of a block
as json would: a block of objects in one call, as a JSON array (`_load_block`), any other a line a call in C; any
other block by json's C scanner over the block decoded once. With
`select`, only the JSON lines that hold one of its byte strings are decoded (with the kernels, each searched for
over the whole block and the lines holding one cut out together and decoded as a block of their own).
"""

from __future__ import annotations

import asyncio
import codecs
import csv
import errno
import glob
import json
import os
import re
from itertools import compress, repeat
from operator import or_
from typing import Any

try:  # a faster decoder of the same values; json's alone when it is absent
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - a dependency, installed with clasp
    _fast_loads = None

from clasp.core import kernels
from clasp.core.connector import Source, SourcePartition

FORMATS = ("lines", "jsonl", "csv")
# json.loads' own scanner (the C one), called without the two Python frames and whitespace matches around it.
_SCAN = json.JSONDecoder().scan_once
# A run of 19 digits may be an integer beyond 64 bits, which orjson reads as a float and json exactly: a block
# with one goes to json (whether the digits are an integer, a string's or a fraction's). Found as a run of 19
# zeros once every digit is one: two passes in C, where a regular expression retries at every digit. Every
# third byte is looked at first: a run of 19 digits holds 6 of them in a row, and a run of 15 or fewer (a
# timestamp in ms has 13) never does, so the common block is passed at a third of the cost. With the C kernels
# (`clasp.core.kernels`) every 19th byte is looked at instead, and the run measured only around a digit there.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_STRIDE, _STRIDE_RUN = 3, b"0" * (19 // 3)
DEFAULT_RANGE_BYTES = 64 << 20  # a file larger than this is read as several partitions
READ_BYTES = 256 << 10  # read ahead at once: a batch of 1,024 lines of up to 256 bytes in one read
NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None


def _range_name(path: str, start: int, end: int, size: int) -> str:
    return path if (start, end) == (0, size) else f"{path}@{start}-{end}"


def _parse_name(name: str) -> tuple[str, int | None, int | None]:
    path, sep, span = name.rpartition("@")
    if sep and "-" in span:
        a, _, b = span.partition("-")
        if a.isdigit() and b.isdigit():
            return path, int(a), int(b)
    return name, None, None


def _scan_block(text: str, values: list) -> bool:
    """The JSON lines of `text` (whole lines, the last one's newline optional) into `values`, if each is a value
    and nothing else: the C scanner called once a line over the block decoded once, no line cut or decoded
    alone. False (and `values` as it was) at the first line that is anything else (blank, padded, CRLF,
    invalid, part of a value) or when a value spans lines: the block then goes line by line, which says what is
    wrong where."""
    out: list = []
    append, scan, pos, n = out.append, _SCAN, 0, len(text)
    try:
        while pos < n:
            value, end = scan(text, pos)
            if end < n and text[end] != "\n":
                return False
            append(value)
            pos = end + 1
    except (StopIteration, ValueError):
        return False
    # The scanner takes a newline inside a value as whitespace: lines that are only a value together (`{"d": [`
    # then `{"e": 2}]}`) would read as one. Each line is one value exactly when there is one value a newline.
    if len(out) != text.count("\n", 0, n - 1) + 1:
        return False
    values.extend(out)
    return True


def _long_digits(block: bytes, used: int) -> bool:
    """Whether the first `used` bytes of `block` hold a run of 19 digits or more."""
    if kernels.C is not None:
        return kernels.C.digit_run(block, used, len(_LONG_RUN))
    if block[:used:_STRIDE].translate(_DIGITS_TO_ZERO).find(_STRIDE_RUN) < 0:
        return False
    return block[:used].translate(_DIGITS_TO_ZERO).find(_LONG_RUN) >= 0


# A comma after an object's closing brace: where a line holding two values, or an object cut across lines, would
# give a JSON array another element (`_load_block`).
_CLOSE_COMMA = re.compile(rb"\}[ \t\r]*,")
_OPEN_BRACE = ord("{")


def _close_comma(buf: bytes, used: int) -> bool:
    """Whether the first `used` bytes of `buf` hold `_CLOSE_COMMA` (in the kernels, a memchr a closing brace)."""
    if kernels.C is not None:
        return kernels.C.close_comma(buf, used)
    return _CLOSE_COMMA.search(buf, 0, used) is not None


def _whole_lines(buf: bytes, n: int) -> tuple[int, int]:
    """(bytes, lines) of the first `n` whole lines of `buf` (all of them when it holds fewer), counted in C: the
    line ending nearest the `n`-th line's place at the lines' mean length, then a line at a time from there (a
    memchr a line in the kernels)."""
    if kernels.C is not None:
        return kernels.C.whole_lines(buf, n)
    last = buf.rfind(b"\n") + 1
    k = buf.count(b"\n", 0, last)
    if k <= n:
        return last, k
    cut = buf.rfind(b"\n", 0, last * n // k) + 1
    k = buf.count(b"\n", 0, cut)
    while k < n:
        cut = buf.find(b"\n", cut) + 1
        k += 1
    while k > n:
        cut = buf.rfind(b"\n", 0, cut - 1) + 1
        k -= 1
    return cut, k


def _load_block(buf: bytes, used: int, lines: int, values: list) -> bool:
    """The `lines` whole JSON lines in the first `used` bytes of `buf` into `values` as one JSON array (its
    newlines made commas: one orjson call, no line cut into an object of its own), if each line is an object
    and nothing else. The array is the lines' objects exactly when it has one object a line and the block
    holds no comma after a closing brace: every separator of the array is then a newline, so each element is
    one line. False (and `values` as it was) otherwise: the block then goes line by line (`_load_lines`)."""
    if (_fast_loads is None or buf[0] != _OPEN_BRACE or _close_comma(buf, used)
            or _long_digits(buf, used)):  # a block that does not begin with an object is not decoded twice
        return False
    try:
        # One copy of the block into the array and one for its commas (a slice and two concatenations made four).
        out = _fast_loads(b"".join((b"[", memoryview(buf)[:used - 1], b"]")).replace(b"\n", b","))
    except Exception:  # orjson's JSONDecodeError: a blank or invalid line
        return False
    if len(out) != lines or set(map(type, out)) != {dict}:
        return False
    values.extend(out)
    return True


def _load_lines(lines: list[bytes], block: bytes, used: int, values: list) -> bool:
    """The JSON lines `lines` (UTF-8, the first `used` bytes of `block`) into `values` by orjson, one call a
    line in C, if every line is a value it reads as json does. False (and `values` as it was) when orjson is
    absent, a line is anything else (blank, invalid, NaN, a number json reads and orjson does not) or the
    block has a run of digits orjson might read differently: the block then goes to json."""
    if _fast_loads is None or _long_digits(block, used):
        return False
    try:
        out = list(map(_fast_loads, lines))
    except Exception:  # orjson's JSONDecodeError, a ValueError, at the first line that is not a value
        return False
    values.extend(out)
    return True


def _picked(lines: list[bytes], select: list[bytes]) -> list[bytes]:
    """The lines that hold one of `select`'s byte strings, tested in C (no call in Python a line)."""
    hits = map(bytes.__contains__, lines, repeat(select[0]))
    for s in select[1:]:
        hits = map(or_, hits, map(bytes.__contains__, lines, repeat(s)))
    return list(compress(lines, hits))


class FileSource(Source):
    """Lines of the files matching `path_or_glob` (a path, a glob, or a list of them): `format="lines"` gives
    each line as a str (without its newline), `"jsonl"` each line parsed as JSON (blank lines skipped),
    `"csv"` each row after the file's header as a dict of str. Files larger than `range_bytes` are read as
    byte ranges of about that size, each a partition. The files are listed once, when the job is submitted:
    files that appear later are not read. A line that is not valid JSON (or CSV) is reported as an error of
    the source operator, naming the file and the byte offset, and skipped.

    `select` (`"jsonl"` only): a byte string, or a list of them, that a line's raw bytes (in the file's
    encoding) must hold to be decoded; any other line is skipped undecoded, so it is neither given nor, if it is
    not JSON, reported. A selection that a query's own test of each value narrows further (a kind of event, say)
    leaves its answer as it was, at the cost of a search of the raw line instead of a decode."""

    def __init__(self, path_or_glob: str | os.PathLike | list, format: str = "lines",
                 range_bytes: int = DEFAULT_RANGE_BYTES, encoding: str = "utf-8",
                 select: bytes | list[bytes] | None = None):
        if format not in FORMATS:
            raise ValueError(f"FileSource format {format!r}; accepted: {', '.join(FORMATS)}")
        if range_bytes <= 0:
            raise ValueError(f"range_bytes must be positive, not {range_bytes}")
        if select is not None:
            select = [select] if isinstance(select, bytes) else list(select)
            if format != "jsonl" or not select or not all(isinstance(x, bytes) and x for x in select):
                raise ValueError(f"select is non-empty byte strings, for format 'jsonl'; not {select!r} for "
                                 f"{format!r}")
        self.select = select
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

    @property
    def splits(self) -> bool:
        return True  # a byte range reopens anywhere with a seek

    def open(self, partition: str, position: Any | None) -> FileReader:
        path, start, end = _parse_name(partition)
        if start is None:
            start, end = 0, None  # the whole file, however long it has grown
        return FileReader(path, start, end, position, self.format, self.encoding, self.select)

    def __repr__(self) -> str:
        select = "" if self.select is None else f", select={self.select!r}"
        return f"FileSource({self.patterns!r}, format={self.format!r}{select})"


class FileReader(SourcePartition):
    """One file's byte range `[start, end)` (end None: to the end of the file), from `position`."""

    def __init__(self, path: str, start: int, end: int | None, position: int | None, format: str, encoding: str,
                 select: list[bytes] | None = None):
        self.path, self.start, self.end = path, start, end
        self.format, self.encoding, self.select = format, encoding, select
        self._utf8 = format == "jsonl" and codecs.lookup(encoding).name == "utf-8"  # what orjson reads
        self._pos = int(position) if position is not None else None
        self._done = False
        self._errors: list[str] = []
        self._header: list[str] | None = None
        self._fd: int | None = None
        self._buf = b""  # read ahead: the bytes from `_pos` on
        self._eof = False  # `_buf` reaches the end of the file
        self._nowait = NOWAIT is not None
        self._block: bytearray | None = None  # what `preadv` reads into, kept: a new one each read was zeroed
        self._closed = False

    def position(self) -> int | None:
        return self._pos

    @property
    def exhausted(self) -> bool:
        return self._done

    def take_errors(self) -> list[str]:
        e, self._errors = self._errors, []
        return e

    async def close(self) -> None:
        self._closed = True  # an open still running on its thread (its reader was cancelled) closes the file
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    async def next_batch(self, limit: int) -> list:
        if self._done:
            return []
        if self._fd is None:
            await asyncio.to_thread(self._open)
        values: list = []
        while len(values) < limit and not self._done:
            if not self._take(limit - len(values), values):
                await self._fill()
        return values

    def _open(self) -> None:
        """Open the file; the CSV header; where reading starts (the first line that begins in the range)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                header_end = 0
                if self.format == "csv":
                    header = f.readline()
                    self._header = next(csv.reader([header.decode(self.encoding).rstrip("\r\n")]), [])
                    header_end = f.tell()
                if self._pos is None:
                    first = 0
                    if self.start > 0:
                        f.seek(self.start - 1)
                        f.readline()  # the rest of the line that began before the range (or just its newline)
                        first = f.tell()
                    self._pos = max(first, header_end)
        except BaseException:
            os.close(fd)
            raise
        if self._closed:
            os.close(fd)
        else:
            self._fd = fd

    async def _fill(self) -> None:
        """Read the next block after `_buf`: on the loop when the page cache holds it, else on a thread."""
        at = self._pos + len(self._buf)
        data = None
        if self._nowait:
            block = self._block
            if block is None:
                block = self._block = bytearray(READ_BYTES)
            try:
                n = os.preadv(self._fd, [block], at, NOWAIT)
                data = memoryview(block)[:n]  # copied once, onto what is left of `_buf`
            except BlockingIOError:
                pass
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                self._nowait = False  # a file system without RWF_NOWAIT: threads from now on
        if data is None:
            data = await asyncio.to_thread(os.pread, self._fd, READ_BYTES, at)
        if data:
            self._buf = self._buf + data
        else:
            self._eof = True

    def _take(self, n: int, values: list) -> int:
        """Up to `n` lines of `_buf` into `values` (parsed by the format): the complete lines that begin in
        the range, and the last line of the file without its newline. Returns how many lines were taken; 0
        when `_buf` holds no whole line (more must be read first), unless the range is done."""
        buf, pos, end = self._buf, self._pos, self.end
        final = self._eof
        if end is not None:
            if pos >= end:
                self._done = True
                return 0
            nl = buf.find(b"\n", end - 1 - pos)  # the newline of the line holding byte `end - 1`: the last one
            if nl >= 0:
                buf, final = buf[:nl + 1], True
        if not buf:
            self._done = final
            return 0
        if self._utf8 and (self.select is None or kernels.C is not None):
            used, k = _whole_lines(buf, n)
            if used and self._load_whole(buf, used, k, values):
                self._advance(pos, used, end)
                return k
        lines = buf.split(b"\n", n)
        rest = lines.pop()
        if len(lines) < n and rest and final:  # the file's last line, without a newline
            lines.append(rest)
            rest = b""
        if not lines:
            return 0
        used = len(buf) - len(rest)
        if self.format == "lines":
            text = buf[:used].decode(self.encoding, errors="replace")
            out = text.split("\n")
            if text.endswith("\n"):
                out.pop()
            if "\r" in text:
                out = [v.rstrip("\r") for v in out]
            values.extend(out)
        else:
            picked = lines if self.select is None else _picked(lines, self.select)
            if self._utf8 and _load_lines(picked, buf, used, values):
                pass
            elif self.format != "jsonl" or not _scan_block(
                    (buf[:used] if picked is lines else b"\n".join(picked)).decode(self.encoding, errors="replace"),
                    values):
                self._parse(lines, pos, values)
        self._advance(pos, used, end)
        return len(lines)

    def _load_whole(self, buf: bytes, used: int, lines: int, values: list) -> bool:
        """`_load_block` of the `lines` whole lines in the first `used` bytes of `buf`, or of those `select`
        picks (cut out in C, no bytes object made a line), as a block of their own."""
        if self.select is None:
            return _load_block(buf, used, lines, values)
        picked, m = kernels.C.pick_lines(buf, used, self.select)
        return not m or _load_block(picked, len(picked), m, values)

    def _advance(self, pos: int, used: int, end: int | None) -> None:
        """Past the `used` bytes taken at `pos`."""
        self._pos = pos + used
        self._buf = self._buf[used:]
        if (end is not None and self._pos >= end) or (self._eof and not self._buf):
            self._done = True

    def _parse(self, lines: list[bytes], at: int, values: list) -> None:
        """JSON lines or CSV rows; a line that does not parse is an error naming the file and its offset."""
        enc, jsonl, select = self.encoding, self.format == "jsonl", self.select
        for line in lines:
            start, at = at, at + len(line) + 1
            if select is not None and not any(x in line for x in select):
                continue
            text = line.decode(enc, errors="replace").rstrip("\r")
            if jsonl:
                try:  # the common line, a value and nothing around it: one call into json's C scanner
                    value, end = _SCAN(text, 0)
                    if end == len(text):
                        values.append(value)
                        continue
                except (StopIteration, ValueError):
                    pass
                if not text.strip():
                    continue
                try:  # anything else as json.loads has it: blanks around a value, or the error it names
                    values.append(json.loads(text))
                except ValueError as e:
                    self._errors.append(f"{self.path} at byte {start}: invalid JSON ({e}): {text[:80]!r}")
                continue
            row = next(csv.reader([text]), [])
            if not row:
                continue
            if len(row) != len(self._header):
                self._errors.append(f"{self.path} at byte {start}: {len(row)} fields, the header has "
                                    f"{len(self._header)}: {text[:80]!r}")
                continue
            values.append(dict(zip(self._header, row, strict=True)))
