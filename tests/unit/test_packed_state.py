"""The planner's answer to `state`: the owners' packed maps spliced into one (`protocol.splice_maps`) decode to
what merging their decoded dicts gave, and a reply carries a packed result as it is (`protocol.Packed`)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import protocol
from clasp.core.protocol import ProtocolError

keys = st.one_of(st.text(max_size=8), st.integers(-2**40, 2**40))
values = st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=5), st.none(), st.floats(allow_nan=False),
                   st.lists(st.integers(-2**63, 2**63 - 1), max_size=3))
# Sizes across each map header: fixmap (<= 15), map16 (<= 65535) and, spliced, map32.
parts = st.lists(st.dictionaries(keys, values, max_size=40), max_size=5)


@settings(max_examples=300, deadline=None)
@given(parts)
def test_spliced_maps_decode_as_the_merged_dicts(ds):
    merged: dict = {}
    for d in ds:
        merged.update(d)
    spliced = protocol.splice_maps([msgpack.packb(d, use_bin_type=True) for d in ds])
    assert msgpack.unpackb(spliced, raw=False, strict_map_key=False) == merged
    mtype, body = protocol.decode(protocol.reply(7, spliced))
    assert (mtype, body) == ("reply", {"req": 7, "ok": True, "result": merged})


def test_splice_crosses_each_header_size():
    for sizes in ([15, 0], [15, 1], [40_000, 30_000], [65_535, 1], [70_000]):
        ds = [{f"{i}-{k}": k for k in range(n)} for i, n in enumerate(sizes)]
        spliced = protocol.splice_maps([msgpack.packb(d) for d in ds])
        assert msgpack.unpackb(spliced) == {k: v for d in ds for k, v in d.items()}
        assert protocol.map_header(spliced) == (sum(sizes), 1 if sum(sizes) <= 15 else 3 if sum(sizes) <= 65535 else 5)


@pytest.mark.parametrize("part", [b"", b"\x91\x01", msgpack.packb([1]), b"\x82\xa1a\x01",
                                  msgpack.packb({"a": 1}) + b"\x01", b"\xde\x00", "not bytes"])
def test_a_part_that_is_not_one_packed_map_is_refused(part):
    with pytest.raises(ProtocolError):
        protocol.splice_maps([msgpack.packb({"x": 1}), part])


def test_a_plain_reply_is_unchanged():
    expected = msgpack.packb([protocol.VERSION, "reply", {"req": 3, "ok": True, "result": b"\x80"}])
    assert protocol.reply(3, b"\x80") == expected
