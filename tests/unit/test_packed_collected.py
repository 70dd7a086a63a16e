"""Collected outputs travel packed: each worker's outputs of a checkpoint (or of a `collected_dump`) as one msgpack
array the planner splices, never decodes (`protocol.splice_arrays`), and writes as the file of the outputs the
checkpoint released (`state_store.encode_collected`), read back as packed arrays again (`decode_collected`)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import protocol
from clasp.core.checkpoint import Coordinator
from clasp.core.protocol import ProtocolError
from clasp.runtime.state_store import (
    CorruptCheckpoint,
    FileStore,
    decode_blob,
    decode_collected,
    encode_blob,
    encode_collected,
)

outputs = st.lists(st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=6), st.none(), st.binary(max_size=4),
                             st.lists(st.integers(0, 9), max_size=3)), max_size=40)


def packed(outs: list) -> bytes:
    return msgpack.packb(outs, use_bin_type=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(outputs, max_size=5))
def test_spliced_arrays_decode_as_the_parts_concatenated(lists):
    spliced = protocol.splice_arrays([packed(x) for x in lists])
    assert msgpack.unpackb(spliced, raw=False) == [o for x in lists for o in x]
    assert protocol.decode(protocol.reply(4, spliced)) == ("reply", {"req": 4, "ok": True,
                                                                      "result": [o for x in lists for o in x]})


def test_splice_crosses_each_array_header_size():
    for sizes in ([15, 0], [15, 1], [40_000, 30_000], [65_535, 1], [70_000], []):
        lists = [[f"{i}-{k}" for k in range(n)] for i, n in enumerate(sizes)]
        spliced = protocol.splice_arrays([packed(x) for x in lists])
        assert msgpack.unpackb(spliced) == [o for x in lists for o in x]
        n = sum(sizes)
        assert protocol.array_header(spliced) == (n, 1 if n <= 15 else 3 if n <= 65535 else 5)


@pytest.mark.parametrize("part", [b"", b"\x81\xa1a\x01", packed([1]) + b"\x01", b"\xdc\x00", b"\x92\x01",
                                  "not bytes", None])
def test_a_part_that_is_not_one_packed_array_is_refused(part):
    with pytest.raises(ProtocolError):
        protocol.check_packed_array(part, "collected")


def test_the_released_outputs_file_holds_each_operators_outputs_in_checkpoint_order(tmp_path):
    # Two workers' outputs of two operators, as the coordinator gathers them: written without being decoded,
    # read back as one packed array per operator, whose decoding is every output in order.
    c = Coordinator()
    c.begin(1, ["w0", "w1"], 0.0)
    c.ack(1, "w0", {}, 0, {"out": packed([1, "a"]), "side": packed([[1, 2]])})
    c.ack(1, "w1", {}, 0, {"out": packed([b"\x00", None] * 20)})
    _, collected = c.finish(1.0)
    store = FileStore(tmp_path)
    n = store.write_file("job-1/collected/1.kg", encode_collected(collected))
    data = store.read_file("job-1/collected/1.kg")
    assert n == len(data)
    expected = {"out": [1, "a", *[b"\x00", None] * 20], "side": [[1, 2]]}
    assert decode_blob(data, "1.kg") == expected  # one blob, as any other file of the state directory
    back = decode_collected(data, "1.kg")
    assert {op: msgpack.unpackb(protocol.splice_arrays(parts)) for op, parts in back.items()} == expected
    assert all(len(parts) == 1 for parts in back.values())


def test_a_released_outputs_file_of_the_layout_before_is_read():
    # Decoded outputs, encoded again and compressed: what a planner before wrote.
    outs = {"out": [f"row-{i}" for i in range(2000)]}
    data = encode_blob(outs)
    back = decode_collected(data, "old.kg")
    assert {op: msgpack.unpackb(parts[0]) for op, parts in back.items()} == outs


@pytest.mark.parametrize("payload", [[1, 2], {"out": 3}, {7: [1]}])
def test_a_released_outputs_file_that_is_no_map_of_lists_is_corrupt(payload):
    with pytest.raises(CorruptCheckpoint):
        decode_collected(encode_blob(payload), "bad.kg")


def test_a_torn_released_outputs_file_is_corrupt():
    data = b"".join(encode_collected({"out": [packed(list(range(100)))]}))
    with pytest.raises(CorruptCheckpoint):
        decode_collected(data[:-3], "torn.kg")
