"""The index of a snapshot file: where each key group's blob lies in one worker's file of a checkpoint.

A worker writes its part of checkpoint K as one file (`clasp.runtime.state_store`, docs/RECOVERY.md): the
index, then the groups' blobs back to back in the index's order. Any worker restoring a group after a
rescale or a crash reads the head, the index, and then that group's bytes alone (`group_spans`).

    head   MAGIC (7 bytes), index length (4 bytes, big endian), crc32 of the index (4 bytes)
    index  msgpack [[op, ...], [op position, group, blob length, ...]]

The index stores lengths, not offsets: offsets follow from the order, so two blobs can never overlap.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

import msgpack

MAGIC = b"CLSPSN1"
_HEAD = struct.Struct(">7sII")
HEAD_SIZE = _HEAD.size


class BadIndex(ValueError):
    """A head or index that is truncated, fails its checksum or does not describe a snapshot file."""


def encode_index(entries: Iterable[tuple[str, int, int]]) -> bytes:
    """Head and index of a file whose blobs follow in the order of `entries` (operator, group, length)."""
    ops: dict[str, int] = {}
    rows: list[int] = []
    for op, group, length in entries:
        rows += (ops.setdefault(op, len(ops)), group, length)
    index = msgpack.packb([list(ops), rows], use_bin_type=True)
    return _HEAD.pack(MAGIC, len(index), zlib.crc32(index)) + index


def index_end(head: bytes) -> int:
    """From the file's first `HEAD_SIZE` bytes: where its index ends (the bytes to read for `group_spans`)."""
    if len(head) < HEAD_SIZE:
        raise BadIndex(f"truncated: {len(head)} bytes, a head has {HEAD_SIZE}")
    magic, length, _ = _HEAD.unpack_from(head)
    if magic != MAGIC:
        raise BadIndex("not a snapshot file")
    return HEAD_SIZE + length


def group_spans(head_and_index: bytes) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
    """(operator, group) -> (offset in the file, length), and where the last blob ends (the file's size)."""
    end = index_end(head_and_index)
    if len(head_and_index) < end:
        raise BadIndex(f"truncated index: {len(head_and_index)} bytes of {end}")
    _, _, crc = _HEAD.unpack_from(head_and_index)
    index = head_and_index[HEAD_SIZE:end]
    if zlib.crc32(index) != crc:
        raise BadIndex("index checksum mismatch")
    try:
        ops, rows = msgpack.unpackb(index, raw=False, use_list=True)
        if len(rows) % 3 or not all(isinstance(op, str) for op in ops):
            raise ValueError("malformed rows")
        spans: dict[tuple[str, int], tuple[int, int]] = {}
        at = end
        for i in range(0, len(rows), 3):
            k, group, length = rows[i:i + 3]
            if not (isinstance(k, int) and 0 <= k < len(ops) and isinstance(group, int) and isinstance(length, int)
                    and length >= 0):
                raise ValueError(f"bad row {rows[i:i + 3]}")
            op = ops[k]
            if spans.setdefault((op, group), (at, length)) != (at, length):
                raise ValueError(f"key group {group} of {op!r} twice")
            at += length
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as e:
        raise BadIndex(f"{type(e).__name__}: {e}") from None
    return spans, at
