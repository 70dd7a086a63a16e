"""The index of a snapshot file (clasp.core.snapshot_index): what it encodes, it decodes; damage is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clasp.core.snapshot_index import HEAD_SIZE, BadIndex, encode_index, group_spans, index_end

ops = st.sampled_from(["count", "sum", "é-op", ""])
entries = st.lists(st.tuples(ops, st.integers(0, 1 << 40), st.integers(0, 1 << 33)),
                   unique_by=lambda e: (e[0], e[1]), max_size=200)


@given(entries)
def test_spans_are_the_blobs_back_to_back_after_the_index(rows):
    head = encode_index(rows)
    assert index_end(head[:HEAD_SIZE]) == len(head)
    spans, end = group_spans(head)
    assert len(spans) == len(rows)
    at = len(head)
    for op, g, length in rows:
        assert spans[op, g] == (at, length)
        at += length
    assert end == at


@given(entries.filter(bool), st.data())
def test_a_truncated_head_or_index_is_refused(rows, data):
    head = encode_index(rows)
    cut = data.draw(st.integers(0, len(head) - 1))
    with pytest.raises(BadIndex):
        group_spans(head[:cut])


@given(entries, st.data())
def test_any_changed_byte_of_head_or_index_is_refused_or_reads_the_same(rows, data):
    """A flip in the magic or the index fails; one in the length field reads a different slice whose crc
    fails too (short of a 2^-32 collision)."""
    head = encode_index(rows)
    i = data.draw(st.integers(0, len(head) - 1))
    bit = data.draw(st.integers(0, 7))
    damaged = head[:i] + bytes([head[i] ^ (1 << bit)]) + head[i + 1:] + b"\0" * 64
    with pytest.raises(BadIndex):
        group_spans(damaged)


def test_the_same_group_twice_or_a_foreign_file_is_refused():
    with pytest.raises(BadIndex, match="twice"):
        group_spans(encode_index([("count", 1, 5), ("count", 1, 7)]))
    with pytest.raises(BadIndex, match="not a snapshot"):
        index_end(b"CLSPKG1" + bytes(HEAD_SIZE))
