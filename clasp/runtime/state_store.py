"""Where checkpoints live: files in a state directory (`FileStore`), their format, and the directory's lock.

Layout under the state directory (a shared volume when processes run on several hosts):

    job-<J>/ckpt-<K>/<op>.<group>.kg     one key group's state of checkpoint K (written by its owner)
    job-<J>/ckpt-<K>/COMPLETE.json       written by the planner once every worker acked: the checkpoint exists
    job-<J>/input/<chunk>.log            input chunks of the planner's input log
    planner/...                          the planner's own tables
    planner.lock                         held by the planner using the directory (its pid)

A group file is `MAGIC, codec byte, crc32 of the payload (4 bytes, big endian), payload`: the payload is
msgpack of {key: state}, zlib-compressed when that saves at least a tenth; an input chunk's payload can
also be the push frame that brought it (codec FRAME: the records are its body's `records`). Every
checkpoint file is written to a temporary name, fsynced and renamed, so a crash leaves either the old
file or the new one; input chunks are written in place and fdatasynced (`clasp.runtime.input_log`): a
torn one fails its checksum.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path

import msgpack

log = logging.getLogger("clasp.state_store")
MAGIC = b"CLSPKG1"
RAW, ZLIB, FRAME = 0, 1, 2
COMPRESS_MIN = 1024  # bytes: below this compression never pays for its CPU
LOCK_FILE = "planner.lock"


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
    return MAGIC + bytes([FRAME]) + struct.pack(">I", zlib.crc32(frame)) + frame


def wrap_blob(raw: bytes, compress: bool = True) -> bytes:
    """A file around a payload that is msgpack already (a key group's blob), compressed where that pays.
    zlib releases the GIL: checkpoints call this in their writer thread, off the event loop."""
    codec, payload = RAW, raw
    if compress and len(raw) >= COMPRESS_MIN:
        z = zlib.compress(raw, 1)
        if len(z) <= 0.9 * len(raw):
            codec, payload = ZLIB, z
    return MAGIC + bytes([codec]) + struct.pack(">I", zlib.crc32(payload)) + payload


def decode_blob(data: bytes, path: str):
    head = len(MAGIC) + 5
    if len(data) < head or not data.startswith(MAGIC):
        raise CorruptCheckpoint(path, f"truncated or not a checkpoint file ({len(data)} bytes)")
    codec = data[len(MAGIC)]
    (crc,) = struct.unpack(">I", data[len(MAGIC) + 1:head])
    payload = data[head:]
    if zlib.crc32(payload) != crc:
        raise CorruptCheckpoint(path, "checksum mismatch (truncated or corrupted)")
    try:
        raw = zlib.decompress(payload) if codec == ZLIB else payload
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True)
        return obj[2]["records"] if codec == FRAME else obj
    except Exception as e:
        raise CorruptCheckpoint(path, f"{type(e).__name__}: {e}") from None


def atomic_write(path: Path, data: bytes, sync_dir: bool = True) -> None:
    """Write, fsync, rename; the directory is fsynced too so the rename survives a power cut (`sync_dir`
    False: the caller fsyncs it once after a batch of files)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    if sync_dir:
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


class FileStore:
    """Checkpoints as files in one directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def ckpt_dir(self, job: int, ckpt: int) -> Path:
        return self.root / f"job-{job}" / f"ckpt-{ckpt}"

    def group_path(self, job: int, ckpt: int, op: str, group: int) -> Path:
        return self.ckpt_dir(job, ckpt) / f"{op}.{group}.kg"

    def write_group(self, job: int, ckpt: int, op: str, group: int, state: dict) -> int:
        return self.write_blob(job, ckpt, op, group, encode_blob(state))

    def write_blob(self, job: int, ckpt: int, op: str, group: int, blob: bytes) -> int:
        path = self.group_path(job, ckpt, op, group)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
        return len(blob)

    def write_blobs(self, job: int, ckpt: int, blobs) -> int:
        """Write (op, group, file bytes) items of one checkpoint; the directory is fsynced once, after the
        last (its entries are what a restore looks up), not once per file. Returns the bytes written."""
        d = self.ckpt_dir(job, ckpt)
        d.mkdir(parents=True, exist_ok=True)
        n = 0
        for op, group, blob in blobs:
            atomic_write(self.group_path(job, ckpt, op, group), blob, sync_dir=False)
            n += len(blob)
        fsync_dir(d)
        return n

    def read_group(self, job: int, ckpt: int, op: str, group: int) -> dict:
        path = self.group_path(job, ckpt, op, group)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorruptCheckpoint(str(path), e.strerror or str(e)) from None
        state = decode_blob(data, str(path))
        if not isinstance(state, dict):
            raise CorruptCheckpoint(str(path), "not a map of keys to states")
        return state

    def commit(self, job: int, ckpt: int, meta: dict) -> None:
        d = self.ckpt_dir(job, ckpt)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / "COMPLETE.json", json.dumps(meta).encode())

    def delete(self, job: int, ckpt: int) -> None:
        shutil.rmtree(self.ckpt_dir(job, ckpt), ignore_errors=True)

    def delete_job(self, job: int) -> None:
        shutil.rmtree(self.root / f"job-{job}", ignore_errors=True)

    def write_file(self, rel: str, data: bytes) -> int:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        return len(data)

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
