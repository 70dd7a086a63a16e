"""Where checkpoints live: files in a state directory (`FileStore`), their format, and the directory's lock.

Layout under the state directory (a shared volume when processes run on several hosts):

    job-<J>/ckpt-<K>/<worker>.snapshot   one worker's part of checkpoint K: the key groups it owned
    job-<J>/ckpt-<K>/COMPLETE.json       written by the planner once every worker acked: the checkpoint exists
    job-<J>/input/<first>.seg            input chunks of the planner's input log, appended from chunk <first> on
    job-<J>/collected/<K>.kg             the collected outputs checkpoint K released (`encode_collected`)
    planner/...                          the planner's own tables
    planner.lock                         held by the planner using the directory (its pid)

A snapshot file is an index (`clasp.core.snapshot_index`: operator, key group and length of each blob, with
its own crc32) followed by one blob per key group. A blob, like an input chunk's or any other file here, is
`MAGIC, codec byte, crc32 of the payload (4 bytes, big endian), payload`: the payload is msgpack of
{key: state}, zlib-compressed when that saves at least a tenth; an input chunk's payload can also be the
push frame that brought it (codec FRAME: the records are its body's `records`). A restore reads the index
of each file `COMPLETE.json` counts (its `workers`) and then only the blobs of the groups it loads, whoever
wrote them. Every checkpoint file is written to a temporary name, fsynced and renamed, so a crash leaves
either the old file or the new one; input chunks are appended to a segment and fdatasynced
(`clasp.runtime.input_log`): a torn one fails its checksum (or its length) and ends the segment; a file of
one chunk, `<chunk>.log`, is the layout before. Checkpoints of the layout before (a file
`<op>.<group>.kg` per key group, a blob) are still read.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import msgpack

from clasp.core.protocol import array_count, array_pieces, map_head, push_records
from clasp.core.snapshot_index import HEAD_SIZE, BadIndex, encode_index, group_spans, index_end

log = logging.getLogger("clasp.state_store")
MAGIC = b"CLSPKG1"
RAW, ZLIB, FRAME = 0, 1, 2
COMPRESS_MIN = 1024  # bytes: below this compression never pays for its CPU
LOCK_FILE = "planner.lock"
SNAPSHOT = ".snapshot"
MANIFEST = "COMPLETE.json"


class CorruptCheckpoint(Exception):
    """A checkpoint file that is missing, truncated or fails its checksum; `path` names it."""

    def __init__(self, path: str, why: str):
        super().__init__(f"checkpoint file {path} is unreadable: {why}")
        self.path = path


class StateStoreError(Exception):
    """The state directory cannot be used (created, written)."""


def encode_blob(obj, compress: bool = True) -> bytes:
    return wrap_blob(msgpack.packb(obj, use_bin_type=True), compress)


def frame_blob(frame: bytes) -> bytes:
    """An input chunk's file holding the push frame that brought it, as it came (nothing re-encoded)."""
    return frame_head(frame) + frame


def frame_head(frame: bytes) -> bytes:
    """What `frame_blob` puts before the frame: written before it, the frame is not copied (megabytes a push)."""
    return MAGIC + bytes([FRAME]) + struct.pack(">I", zlib.crc32(frame))


def wrap_blob(raw: bytes, compress: bool = True) -> bytes:
    """A file around a payload that is msgpack already (a key group's blob), compressed where that pays.
    A checkpoint calls this on the event loop, a group at a time in its packing slices: in a writer thread
    each group cost a few waits for the GIL (up to 5 ms each) while the loop ran requests, and a snapshot
    of 128 groups took a second to write at full load."""
    codec, payload = RAW, raw
    if compress and len(raw) >= COMPRESS_MIN:
        z = zlib.compress(raw, 1)
        if len(z) <= 0.9 * len(raw):
            codec, payload = ZLIB, z
    return MAGIC + bytes([codec]) + struct.pack(">I", zlib.crc32(payload)) + payload


def decode_blob(data: bytes, path: str):
    codec, raw = _payload(data, path)
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True)
        return push_records(obj[2]) if codec == FRAME else obj
    except Exception as e:
        raise CorruptCheckpoint(path, f"{type(e).__name__}: {e}") from None


def _payload(data: bytes, path: str) -> tuple[int, bytes]:
    """(codec, msgpack payload, decompressed) of a blob, its checksum checked."""
    head = len(MAGIC) + 5
    if len(data) < head or not data.startswith(MAGIC):
        raise CorruptCheckpoint(path, f"truncated or not a checkpoint file ({len(data)} bytes)")
    codec = data[len(MAGIC)]
    (crc,) = struct.unpack(">I", data[len(MAGIC) + 1:head])
    payload = data[head:]
    if zlib.crc32(payload) != crc:
        raise CorruptCheckpoint(path, "checksum mismatch (truncated or corrupted)")
    try:
        return codec, zlib.decompress(payload) if codec == ZLIB else payload
    except zlib.error as e:
        raise CorruptCheckpoint(path, f"{type(e).__name__}: {e}") from None


def encode_collected(collected: Mapping[str, Sequence[bytes]]) -> list:
    """The file of the outputs a checkpoint released, as the pieces to write (`atomic_write`): a blob of the
    map operator -> outputs, each list spliced from the workers' packed arrays (nothing decoded or encoded
    again, nor copied before the write), not compressed: zlib took ~1.5 us an output (for a file a third
    smaller) where the rest of the planner's work for one is a tenth of that."""
    pieces = [map_head(len(collected))]
    for op, parts in collected.items():
        pieces += [msgpack.packb(op, use_bin_type=True), *array_pieces(parts)]
    crc = 0
    for p in pieces:
        crc = zlib.crc32(p, crc)
    return [MAGIC + bytes([RAW]) + struct.pack(">I", crc), *pieces]


def decode_collected(data: bytes, path: str) -> dict[str, list[bytes]]:
    """`encode_collected`'s file (or one of any map operator -> list, as written before) as operator -> [the
    outputs as one packed array], the outputs skipped over, not decoded."""
    _, raw = _payload(data, path)
    u = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1))
    u.feed(raw)
    out = {}
    try:
        for _ in range(u.read_map_header()):
            op = u.unpack()
            start = u.tell()
            u.skip()
            part = bytes(raw[start:u.tell()])
            if type(op) is not str or array_count(part) < 0:
                raise ValueError("not a map of operator -> outputs")
            out[op] = [part]
    except Exception as e:
        raise CorruptCheckpoint(path, f"{type(e).__name__}: {e}") from None
    if u.tell() != len(raw):
        raise CorruptCheckpoint(path, "bytes after the map")
    return out


def atomic_write(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write (`data`, or its pieces one after the other), fsync, rename; the directory is fsynced too so
    the rename survives a power cut."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.writelines([data] if isinstance(data, bytes) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (new and renamed files) durable; best effort (some filesystems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def check_state_dir(path: str | os.PathLike) -> Path:
    """Create the directory if needed and prove it writable; raises StateStoreError with the reason."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".probe.{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise StateStoreError(f"the state directory {p} cannot be used: {e.strerror or e}") from None
    return p


def user_state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where a planner started by hand keeps its state when it is given no directory: $XDG_STATE_HOME/clasp,
    else ~/.local/state/clasp (the XDG base directory spec ignores an empty or relative XDG_STATE_HOME).
    Per user, not the working directory: a planner restarted from anywhere finds its jobs again."""
    base = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(base) / "clasp"


def lock_state_dir(path: str | os.PathLike) -> int:
    """Take the state directory for this planner until the process ends (an flock, released by the kernel
    however it ends), or raise StateStoreError: two planners taking up and rewriting the same jobs would
    corrupt each other's checkpoints and input logs. Returns the lock's descriptor, to keep open."""
    p = Path(path)
    fd = os.open(p / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateStoreError(f"the state directory {p} is in use by another planner (pid {holder}); give this one "
                              "its own --state-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def snapshot_name(worker: str) -> str:
    """The file name of a worker's part of a checkpoint: a worker id that is no safe file name goes in hex,
    after an `@` that no safe name has (so no two ids share a file)."""
    safe = re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,100}", worker)
    return (worker if safe else "@" + worker.encode().hex()) + SNAPSHOT


def read_snapshot(path: Path) -> Iterator[tuple[str, int, dict]]:
    """Every (operator, group, state) of one snapshot file, in its order."""
    with _Snapshot(path) as snap:
        for op, g in list(snap.spans):
            yield op, g, snap.group(op, g)


class _Snapshot:
    """An open snapshot file and its index; `group` reads one blob by its offset."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None
        try:
            self.fd = os.open(path, os.O_RDONLY)
            size = os.fstat(self.fd).st_size
            head_end = index_end(os.pread(self.fd, HEAD_SIZE, 0))
            if head_end > size:  # read no more than the file holds, whatever a damaged head says
                raise BadIndex(f"truncated: {size} bytes, its index ends at {head_end}")
            self.spans, end = group_spans(os.pread(self.fd, head_end, 0))
        except OSError as e:
            self.close()
            raise CorruptCheckpoint(str(path), e.strerror or str(e)) from None
        except BadIndex as e:
            self.close()
            raise CorruptCheckpoint(str(path), str(e)) from None
        if size < end:
            self.close()
            raise CorruptCheckpoint(str(path), f"truncated: {size} bytes, its index says {end}")

    def group(self, op: str, g: int) -> dict:
        offset, length = self.spans[op, g]
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as e:
            raise CorruptCheckpoint(str(self.path), e.strerror or str(e)) from None
        state = decode_blob(data, str(self.path))
        if not isinstance(state, dict):
            raise CorruptCheckpoint(str(self.path), f"key group {g} of {op!r} is not a map of keys to states")
        return state

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


class FileStore:
    """Checkpoints as files in one directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def ckpt_dir(self, job: int, ckpt: int) -> Path:
        return self.root / f"job-{job}" / f"ckpt-{ckpt}"

    def snapshot_path(self, job: int, ckpt: int, worker: str) -> Path:
        return self.ckpt_dir(job, ckpt) / snapshot_name(worker)

    def write_snapshot(self, job: int, ckpt: int, worker: str, blobs: Iterable[tuple[str, int, bytes]]) -> int:
        """Write `worker`'s part of a checkpoint, (op, group, blob file bytes) items, as one file: one fsync
        for it and one for the directory, whatever the number of groups. Returns the bytes written (none,
        and no file, without a group; the checkpoint's directory is made all the same, so a directory that
        cannot be fails every worker's part, as it would the planner's)."""
        path = self.snapshot_path(job, ckpt, worker)
        path.parent.mkdir(parents=True, exist_ok=True)
        blobs = list(blobs)
        if not blobs:
            return 0
        head = encode_index((op, g, len(b)) for op, g, b in blobs)
        # One bytes, one write: a writer thread takes the GIL back after each write it makes, and waits up
        # to a switch interval (5 ms) for it each time while the event loop runs requests.
        atomic_write(path, b"".join([head, *(b for _, _, b in blobs)]))
        return len(head) + sum(len(b) for _, _, b in blobs)

    def read_groups(self, job: int, ckpt: int, wanted: Mapping[str, Sequence[int]]) -> list[tuple[str, int, dict]]:
        """(operator, group, state) of the `wanted` key groups of complete checkpoint `ckpt`, from the files
        its manifest counts: each file's index once, then each group's blob by its offset."""
        need = {(op, g) for op, gs in wanted.items() for g in gs}
        if not need:
            return []
        d = self.ckpt_dir(job, ckpt)
        out = []
        for path in self._snapshots(d):
            with _Snapshot(path) as snap:
                found = need & snap.spans.keys()
                out += [(op, g, snap.group(op, g)) for op, g in sorted(found)]
            need -= found
        for op, g in sorted(need):
            legacy = d / f"{op}.{g}.kg"
            try:
                data = legacy.read_bytes()
            except FileNotFoundError:
                raise CorruptCheckpoint(str(d), f"no file of it holds key group {g} of {op!r}") from None
            except OSError as e:
                raise CorruptCheckpoint(str(legacy), e.strerror or str(e)) from None
            state = decode_blob(data, str(legacy))
            if not isinstance(state, dict):
                raise CorruptCheckpoint(str(legacy), "not a map of keys to states")
            out.append((op, g, state))
        return out

    def _snapshots(self, d: Path) -> list[Path]:
        """The snapshot files that belong to the checkpoint: those of the workers its manifest names."""
        try:
            workers = json.loads((d / MANIFEST).read_bytes())["workers"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CorruptCheckpoint(str(d / MANIFEST), f"{type(e).__name__}: {e}") from None
        return [p for p in (d / snapshot_name(w) for w in workers) if p.exists()]

    def commit(self, job: int, ckpt: int, meta: dict) -> None:
        d = self.ckpt_dir(job, ckpt)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / MANIFEST, json.dumps(meta).encode())

    def delete(self, job: int, ckpt: int) -> None:
        shutil.rmtree(self.ckpt_dir(job, ckpt), ignore_errors=True)

    def delete_job(self, job: int) -> None:
        shutil.rmtree(self.root / f"job-{job}", ignore_errors=True)

    def write_file(self, rel: str, data: bytes | list) -> int:
        """`data`, or its pieces one after the other; returns the bytes written."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        return len(data) if isinstance(data, bytes) else sum(map(len, data))

    def read_file(self, rel: str) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None

    def remove_file(self, rel: str) -> None:
        try:
            (self.root / rel).unlink()
        except FileNotFoundError:
            pass
