"""A push in segments (`protocol.pack_segments`) through the planner's pure parts: checked without decoding,
queued and dispatched in whole segments whose bytes are the runs' values, logged as the frame it came in and
read back as segments, opened by the worker (a segment it cannot decode reported, not raised). Segments that
compress go as lz4 blocks (`SEG_LZ4`), which only the worker opens."""

from __future__ import annotations

import collections
import itertools
import random
from collections import deque

import lz4.block
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import protocol, scheduler
from clasp.core.limits import LIMITS
from clasp.core.protocol import ProtocolError, Segments
from clasp.core.routing import NUM_KEY_GROUPS, ROUTE_KEYED, ROUTE_TABLE, Route
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS
from clasp.runtime.input_log import InputLog
from clasp.runtime.state_store import FileStore, decode_blob, frame_blob
from tests.unit.test_scheduler import two_source_spec


def test_pack_segments_cuts_a_push_into_arrays_of_consecutive_records():
    records = [f"line {i}" for i in range(5200)]
    segs = protocol.pack_segments(records, compress=False)
    assert [r for s in segs for r in msgpack.unpackb(s)] == records
    s = Segments(segs)
    assert len(s) == 5200 and s.counts == [protocol.SEGMENT_RECORDS] * 10 + [5200 - 10 * protocol.SEGMENT_RECORDS]
    assert s.decoded() == records
    assert Segments(protocol.pack_segments(["a", "b", "c"])).counts == [3]
    assert [protocol.array_count(msgpack.packb(list(range(n)))) for n in (1, 15, 16, 70000)] == [1, 15, 16, 70000]
    assert protocol.array_count(b"") == protocol.array_count(b"\xa1a") == -1


def test_segments_that_compress_go_as_lz4_blocks_and_others_as_they_are():
    records = [f"line {i % 7}" for i in range(1100)]
    segs = protocol.pack_segments(records)
    assert [type(s) for s in segs] == [msgpack.ExtType] * 3 and segs[0].code == protocol.SEG_LZ4
    raw = protocol.pack_segments(records, compress=False)
    assert sum(len(s.data) for s in segs) < 0.5 * sum(map(len, raw))
    assert Segments(segs).counts == [512, 512, 76] and Segments(segs).decoded() == records
    assert [protocol.segment_records(s) for s in segs] == [msgpack.unpackb(s) for s in raw]
    noise = [bytes(random.Random(i).randbytes(64)) for i in range(600)]  # no tenth saved: packed as it is
    assert [type(s) for s in protocol.pack_segments(noise)] == [bytes, bytes]
    protocol.check_segments(segs + protocol.pack_segments(noise))
    _, push = protocol.decode_message(protocol.encode("push", {"req": 1, "job": 1, "segments": segs}))
    assert Segments(push.segments).decoded() == records


def test_a_push_weighs_its_compressed_segments_at_their_packed_size():
    records = [f"{i}:" + "x" * 2000 for i in range(600)]  # ~100 times smaller compressed
    plain, packed = protocol.pack_segments(records, compress=False), protocol.pack_segments(records)
    frame = protocol.encode("push", {"req": 1, "job": 1, "segments": packed})
    assert len(frame) < sum(map(len, plain)) // 50
    weight = protocol.packed_size(len(frame), packed)
    assert weight == len(frame) + sum(map(len, plain)) - sum(len(s.data) for s in packed) > sum(map(len, plain))
    assert protocol.packed_size(100, [b"abc"]) == 100


def lz4_segment(count: int, size: int, block: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(protocol.SEG_LZ4, protocol.SEG_LZ4_HEAD.pack(count, size) + block)


@pytest.mark.parametrize("segment", [
    msgpack.ExtType(protocol.SEG_LZ4, b"\0\0\0\1"),  # no room for its head
    lz4_segment(0, 10, b"x"),  # no records
    lz4_segment(3, LIMITS.max_message + 1, b"x"),  # more than a message unpacked
    [lz4_segment(3, LIMITS.max_message // 2 + 1, b"x")] * 2,  # so are the two together
    msgpack.ExtType(protocol.SEG_LZ4 + 1, protocol.SEG_LZ4_HEAD.pack(3, 10) + b"x"),  # another extension
])
def test_malformed_compressed_segments_are_refused_by_the_push_message(segment):
    segments = segment if type(segment) is list else [segment]
    with pytest.raises(ProtocolError) as e:
        protocol.decode_message(protocol.encode("push", {"req": 4, "job": 1, "segments": segments}))
    assert e.value.reason == "bad_field" and e.value.req == 4


def test_a_compressed_segment_that_does_not_hold_what_its_head_counts_fails_at_the_worker():
    packed = msgpack.packb(["a", "b", "c"])
    good = lz4_segment(3, len(packed), lz4.block.compress(packed, store_size=False))
    short = lz4_segment(4, len(packed), lz4.block.compress(packed, store_size=False))  # counts one too many
    small = lz4_segment(3, len(packed) - 1, lz4.block.compress(packed, store_size=False))  # size too small
    garbage = lz4_segment(2, 50, b"\xff" * 9)
    runs = [[0, 0, good], [0, 3, short], [0, 7, small], [0, 10, garbage]]
    protocol.check_runs(runs, 1)
    failed = protocol.open_runs(runs)
    assert runs == [[0, 0, ["a", "b", "c"]]]
    assert sorted(f[:3] for f in failed) == [[0, 3, 4], [0, 7, 3], [0, 10, 2]]
    assert all("not decodable" in f[3] for f in failed)


@pytest.mark.parametrize("segments", [
    ["text"], [b""], [b"\xc1"], [msgpack.packb([1, 2])[:-1]], [msgpack.packb([1]) * 2], [msgpack.packb([])],
    [msgpack.packb({"a": 1})], [msgpack.packb([1])] * (protocol.MAX_SEGMENTS + 1),
])
def test_malformed_segments_are_refused_by_the_push_message(segments):
    frame = protocol.encode("push", {"req": 4, "job": 1, "segments": segments})
    with pytest.raises(ProtocolError) as e:
        protocol.decode_message(frame)
    assert e.value.reason == "bad_field" and e.value.req == 4 and e.value.detail.startswith("push.")


def test_a_segment_with_a_string_that_is_not_utf8_passes_the_planner_and_fails_at_the_worker():
    bad = b"\x92\xa1a\xa2\xff\xfe"  # ["a", <two bytes that are not UTF-8>]
    _, push = protocol.decode_message(protocol.encode("push", {"req": 1, "job": 1, "segments": [bad]}))
    assert len(Segments(push.segments)) == 2
    with pytest.raises(UnicodeDecodeError):
        Segments(push.segments).decoded()
    good = msgpack.packb(["x", "y"])
    runs = [[0, 10, good], [0, 12, bad], [0, 14, ["z"]]]
    protocol.check_runs(runs, 1)
    failed = protocol.open_runs(runs)
    assert runs == [[0, 10, ["x", "y"]], [0, 14, ["z"]]]
    assert [f[:3] for f in failed] == [[0, 12, 2]] and "not decodable" in failed[0][3]


def test_take_cuts_whole_segments_at_least_one():
    q = deque([[0, Segments([msgpack.packb([i, i + 1]) for i in range(0, 16, 2)]), 0]])  # eight segments of two
    first, part = scheduler.take(q, 5)
    assert (first, part.counts, q[0][2]) == (0, [2, 2], 4)
    first, part = scheduler.take(q, 1)  # less room than a segment: one all the same
    assert (first, part.counts, q[0][2]) == (4, [2], 6)
    first, part = scheduler.take(q, 100)
    assert (first, len(part), part.decoded()) == (6, 10, list(range(6, 16))) and not q


@given(sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
       rooms=st.lists(st.integers(1, 6000), min_size=1, max_size=5),
       table=st.lists(st.sampled_from(["w0", "w1", "w2"]), min_size=1, max_size=7))
@settings(max_examples=80, deadline=None)
def test_segmented_dispatch_sends_every_record_once_in_order_as_the_list_path_counts(sizes, rooms, table):
    spec = two_source_spec()
    records = [[f"c{c}r{i}" for i in range(n)] for c, n in enumerate(sizes)]
    q = deque([[c << CHUNK_BITS, Segments(protocol.pack_segments(rs)), 0] for c, rs in enumerate(records)])
    value = {(c << CHUNK_BITS) + i: v for c, rs in enumerate(records) for i, v in enumerate(rs)}
    seen, step = [], 0
    while q:
        room = rooms[step % len(rooms)]
        step += 1
        d = scheduler.dispatch(q, spec, [Route(ROUTE_TABLE, 0, table=table)], room)
        rids = []
        for dest, runs in d.runs.items():
            assert dest in table
            for op, first, seg in runs:
                assert op == 0 and type(seg) in (bytes, msgpack.ExtType)
                vals = protocol.segment_records(seg)
                assert vals == [value[first + i] for i in range(len(vals))]
                # a segment is one progress epoch: a worker's report counts each epoch it ran whole, not in parts
                assert first >> EPOCH_BITS == (first + len(vals) - 1) >> EPOCH_BITS
                rids += range(first, first + len(vals))
        rids.sort()
        assert rids == list(range(d.first, d.first + d.count))
        assert d.count <= room or len(d.runs) == 1 and sum(map(len, d.runs.values())) == 1  # one segment
        assert d.counts == {e: {0: k} for e, k in collections.Counter(r >> EPOCH_BITS for r in rids).items()}
        seen += rids
    assert seen == [(c << CHUNK_BITS) + i for c, n in enumerate(sizes) for i in range(n)]


def test_two_workers_get_half_of_each_dispatch():
    spec = two_source_spec()
    n = 36 * protocol.SEGMENT_RECORDS  # about 20,000, and no dispatch left with an odd few segments at the end
    q = deque([[3 << CHUNK_BITS, Segments(protocol.pack_segments(list(range(n)))), 0]])
    got = collections.Counter()
    rooms = itertools.cycle((5000, 2500, 3700, 4300))  # whole segments: 4,608, 2,048, 3,584, 4,096, ...
    while q:
        d = scheduler.dispatch(q, spec, [Route(ROUTE_TABLE, 0, table=["w0", "w1"])], next(rooms))
        per = {w: sum(len(protocol.segment_records(s)) for _, _, s in runs) for w, runs in d.runs.items()}
        assert len(per) == 2 and abs(per["w0"] - per["w1"]) <= protocol.SEGMENT_RECORDS, per
        got.update(per)
    assert not q and got["w0"] + got["w1"] == n and abs(got["w0"] - got["w1"]) <= 2 * protocol.SEGMENT_RECORDS


def test_a_keyed_source_routes_segments_decoded():
    spec = two_source_spec()
    owners = ["w0"] * NUM_KEY_GROUPS
    d = scheduler.route_records(spec, [Route(ROUTE_KEYED, 1, owners=owners)], 0,
                                Segments(protocol.pack_segments([1, 2, 0])))
    assert [row[1] for row in d.data["w0"]] == [1, 2] and d.failed == [2]


def test_the_input_log_writes_the_push_frame_and_reads_back_its_segments(tmp_path):
    records = [f"r{i}" for i in range(300)]
    frame = protocol.encode("push", {"req": 9, "job": 1, "segments": protocol.pack_segments(records)})
    back = decode_blob(frame_blob(frame), "x")
    assert type(back) is Segments and back.decoded() == records
    log = InputLog(FileStore(tmp_path), 1, memory_records=0, memory_bytes=0)  # no loop: written inline, spilled
    seg = Segments(protocol.pack_segments(records))
    log.append(5, 0.0, seg, 100, frame)
    assert log.written(5) and log.in_memory_records(5) is None
    assert log.records(5).decoded() == records
    name, at, length = log.where[5]
    assert (tmp_path / "job-1" / "input" / name).read_bytes()[at:at + length] == frame_blob(frame)  # as it came
    old = protocol.encode("push", {"req": 9, "job": 1, "records": records})  # a push of a list, as before
    assert decode_blob(frame_blob(old), "x") == records


def test_a_queue_entry_resumed_within_a_segment_is_sliced_from_its_records():
    q = deque([[0, Segments([msgpack.packb([0, 1, 2]), msgpack.packb([3, 4, 5])]), 1]])
    first, part = scheduler.take(q, 4)
    assert (first, part, q[0][2]) == (1, [1, 2, 3, 4], 5)
    first, part = scheduler.take(q, 4)
    assert (first, part, len(q)) == (5, [5], 0)
