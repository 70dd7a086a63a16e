"""The C kernels of the keyed fast path (clasp/core/_kernels.c) give what their Python versions give, on any
input those take: a pass's outputs gathered by destination, `epochs_of_runs`, the key groups of a batch, the file
reader's test for long runs of digits and `apply_block`, whose operator may fail, return something that is not a
pair, or delete its state; strings and non-negative ints packed and unpacked as msgpack packs and unpacks them; the
check of a batch's record ids and run lengths."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from itertools import repeat
from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clasp.core import kernels, protocol, tracking
from clasp.core.routing import NUM_KEY_GROUPS, key_group
from clasp.runtime import batches
from clasp.runtime.operators import KeyCache

pytestmark = pytest.mark.skipif(kernels.C is None, reason="the C kernels are not built here")


@contextmanager
def python_only():
    """The Python versions, for the block's length."""
    saved, kernels.C = kernels.C, None
    try:
        yield
    finally:
        kernels.C = saved


keys = st.one_of(st.text(max_size=12), st.text(alphabet="abcdefghijklmnopqrstuvwxyz", max_size=12),
                 st.integers(-1 << 70, 1 << 70), st.binary(max_size=6),
                 st.tuples(st.text(max_size=3), st.integers(-1 << 63, (1 << 63) - 1)), st.booleans(), st.none())
# Up to eight destinations, this worker (None) among them: the numpy path compresses up to four, sorts beyond.
owners_of = st.lists(st.sampled_from(["a", "b", None, "c", "d", "e", "f", "g"]), min_size=NUM_KEY_GROUPS,
                     max_size=NUM_KEY_GROUPS)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.lists(keys, max_size=5), st.booleans()), max_size=25),
       owners_of, owners_of)
def test_gathering_a_pass_in_c_is_flattening_and_partitioning_it(batch, owners, then):
    results = [tuple(outs) if as_tuple else outs for _, outs, as_tuple in batch]
    rids = [rid for rid, _, _ in batch]
    counts = list(map(len, results))
    # One target through two routes in turn (a rescale between passes): each pass by its own owners.
    target = SimpleNamespace(key_cache=KeyCache(), owner_table=None)
    for route in (owners, then, list(then)):
        got = batches.gather_outputs(target, results, rids, counts, route)
        with python_only():
            want = batches.gather_outputs(SimpleNamespace(key_cache=KeyCache(), owner_table=None), results, rids,
                                          counts, route)
        assert got == want
        parts, gs = got
        assert list(parts) == list(want[0])  # destinations in the same order
        assert all(type(p[3]) is bytes for p in parts.values()) and type(gs) is bytes


def test_gathering_reports_a_value_that_cannot_be_a_key():
    target = SimpleNamespace(key_cache=KeyCache(), owner_table=None)
    for impl in (nullcontext(), python_only()):
        with impl, pytest.raises(TypeError):
            batches.gather_outputs(target, [["a"], [["unhashable"]]], [1, 2], [1, 1], [None, "b"] * 64)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 1 << 62), st.integers(-2, 5), st.integers(0, 7)), max_size=40),
       st.sampled_from(["lists", "no counts", "no made"]))
def test_epochs_of_runs_in_c_is_the_loop(runs, form):
    rids = [r for r, _, _ in runs]
    counts = None if form == "no counts" else [c for _, c, _ in runs]
    made = None if form == "no made" else [m for _, _, m in runs]
    got = tracking.epochs_of_runs(rids, counts, made)
    with python_only():
        want = tracking.epochs_of_runs(rids, counts, made)
    assert got == want
    assert tracking._epochs_of_runs(rids, counts or repeat(1), made or repeat(0)) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(keys, max_size=60))
def test_key_groups_in_c_are_the_key_groups(batch):
    got = batches.group_bytes(SimpleNamespace(key_cache=KeyCache()), batch)
    with python_only():
        assert batches.group_bytes(SimpleNamespace(key_cache=KeyCache()), batch) == got
    assert all(g == key_group(k) for k, g in zip(batch, got, strict=True) if type(k) is str)


def test_key_groups_report_what_the_cache_raises():
    op = SimpleNamespace(key_cache=KeyCache())
    with pytest.raises(TypeError):
        batches.group_bytes(op, ["fine", ["unhashable"]])


def _count(state, word):
    """Every kind of result `apply_block` meets: a count, a failure, no state (a delete), a pair that is a list,
    a result that cannot be unpacked, a state changed in place."""
    kind = len(word) % 7
    if kind == 1 and word.startswith("x"):
        raise ValueError(f"no {word}")
    if kind == 2:
        return None, None  # deletes the key
    if kind == 3:
        return [(state or 0) + 1, "out"]
    if kind == 4 and word.startswith("y"):
        return (1, 2, 3)  # too many to unpack: fails
    if kind == 5:
        lst = state if isinstance(state, list) else []
        lst.append(word)  # in place
        return lst, None
    if kind == 6 and word.startswith("z"):
        return None  # not a pair: fails
    return (state or 0) + 1, None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="xyzab", min_size=0, max_size=7), max_size=80),
       st.dictionaries(st.text(alphabet="xyzab", max_size=7), st.one_of(st.none(), st.integers(0, 5)), max_size=6),
       st.booleans())
def test_apply_block_in_c_is_the_loop(words, before, as_list):
    def run():
        op = SimpleNamespace(fn=_count, groups=[{} for _ in range(NUM_KEY_GROUPS)], rested=[b""] * NUM_KEY_GROUPS)
        for k, v in before.items():  # a None state too, as a migrated group may hold
            op.groups[key_group(k)][k] = v
        failed = []
        gs = bytes(key_group(w) for w in words)
        batches.apply_block(op, list(words), list(gs) if as_list else gs,
                            lambda o, e, v: failed.append((type(e).__name__, str(e), v)))
        return op.groups, failed, op.rested

    got = run()
    with python_only():
        want = run()
    assert got == want


def test_apply_block_lets_a_base_exception_through():
    def stop(state, word):
        if word == "b":
            raise KeyboardInterrupt
        return (state or 0) + 1, None

    op = SimpleNamespace(fn=stop, groups=[{}], rested=[None])
    with pytest.raises(KeyboardInterrupt):
        batches.apply_block(op, ["a", "b", "c"], b"\0\0\0", lambda *a: None)
    assert op.groups == [{"a": 1}]


def test_apply_block_leaves_a_group_that_is_not_a_dict_to_python():
    from collections import OrderedDict

    op = SimpleNamespace(fn=lambda s, w: ((s or 0) + 1, None), groups=[{}, OrderedDict()], rested=[None, None])
    batches.apply_block(op, ["a", "b", "a", "b"], b"\0\1\0\1", lambda *a: None)
    assert op.groups == [{"a": 2}, OrderedDict(b=2)]


@given(st.binary(max_size=300))
def test_the_groups_in_a_block_are_its_distinct_bytes(groups):
    assert kernels.C.groups_in(groups) == sorted(set(groups))
    assert kernels.C.groups_in(bytearray(groups)) == sorted(set(groups))


@settings(max_examples=500)
@given(st.lists(st.one_of(st.sampled_from([b"0", b"7", b"9", b"/", b":", b",", b"\n", b"a"]),
                          st.integers(0, 10 ** 30).map(lambda n: str(n).encode())), max_size=60), st.data())
def test_the_file_reader_finds_a_long_run_of_digits_as_python_does(parts, data):
    from clasp.connectors import file_source

    block = b"".join(parts)
    used = data.draw(st.integers(0, len(block)))
    with python_only():
        want = file_source._long_digits(block, used)
    assert file_source._long_digits(block, used) is want
    assert kernels.C.digit_run(bytearray(block), used, 19) is want
    assert kernels.C.digit_run(block, used, 1) is any(48 <= c <= 57 for c in block[:used])
values_of = st.one_of(st.text(max_size=40), st.text(alphabet="abc\u00e9\u4e2d", max_size=8),
                      st.integers(-1 << 63, 1 << 63), st.binary(max_size=4), st.none(), st.floats(allow_nan=False),
                      st.lists(st.text(max_size=2), max_size=2))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(["a", "bb", "é", "x" * 31, "y" * 32, "z" * 255,
                                                                 "w" * 256, "v" * 65536])), max_size=40),
       st.lists(values_of, max_size=6), st.sampled_from([1, 4, 1 << 16]))
def test_strings_pack_as_msgpack_packs_them_and_unpack_as_it_unpacks_them(words, others, slots):
    table = [None] * slots
    packed = kernels.C.pack_strs(words)
    assert packed == msgpack.packb(words)
    assert kernels.C.unpack_strs(packed, table) == words
    assert kernels.C.unpack_strs(packed, table) == words  # again, from the table where they fit
    mixed = words + others
    packed = msgpack.packb(mixed)
    assert kernels.C.pack_strs(mixed) == (packed if all(type(v) is str for v in mixed) else None)
    got = kernels.C.unpack_strs(packed, table)
    assert got == (mixed if all(type(v) is str for v in mixed) else None)
    assert all(type(v) is str and v is not None for v in got or ())


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=40), st.lists(st.text(alphabet="ab\x7f\x80", max_size=3), max_size=20).map(
    msgpack.packb).flatmap(lambda b: st.sampled_from([b, b[:-1], b + b"\xa0", b[:1] + b"\xc1" + b[2:]]))))
def test_unpacking_any_bytes_is_msgpack_or_left_to_it(data):
    got = kernels.C.unpack_strs(data, [None] * 8)
    if got is not None:
        assert got == msgpack.unpackb(data, raw=False)


def test_strings_that_are_not_text_are_left_to_msgpack():
    assert kernels.C.pack_strs(["a", "\ud800"]) is None  # no UTF-8 form
    assert kernels.C.pack_strs(["a", type("S", (str,), {})("b")]) is None  # a subclass: msgpack's own rules
    assert kernels.C.unpack_strs(b"\x91\xa2\xff\xfe", [None]) is None  # invalid UTF-8: msgpack raises it
    assert kernels.C.unpack_strs(b"\x91\xa1a\x00", [None]) is None  # something after the array
    with pytest.raises(TypeError):
        kernels.C.unpack_strs(b"\x90", [None] * 3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(values_of, max_size=8), min_size=1, max_size=4))
def test_packed_columns_open_as_the_lists_they_were(columns_values):
    groups = [[0, list(vs), True, [7 + i], [len(vs)] if vs else []] for i, vs in enumerate(columns_values)]

    def through_the_wire(sender, receiver):
        with sender:
            frame = protocol.encode_columns(1, 0, groups)
        with receiver:
            body = protocol.decode(frame)[1]
            protocol.open_columns(body[2], protocol.string_table())
        return [g[1:5] for g in body[2]]

    got = through_the_wire(nullcontext(), nullcontext())
    assert got == through_the_wire(python_only(), python_only()) == through_the_wire(nullcontext(), python_only())
    assert got == [[[list(v) if type(v) is tuple else v for v in vs], True, [7 + i], [len(vs)] if vs else []]
                   for i, vs in enumerate(columns_values)]


def test_packed_values_that_do_not_decode_are_a_protocol_error():
    for impl in (nullcontext(), python_only()):
        with impl:
            for bad, why in ((b"\x91\xa2\xff\xfe", "undecodable"), (b"\x92\xa1a", "undecodable"), (b"\xa1a", "array")):
                with pytest.raises(protocol.ProtocolError, match=why):
                    protocol.open_columns([[0, bad, True, [1], [1]]], protocol.string_table())
            for at in (3, 4):  # packed record ids, run lengths
                group = [0, ["a"], True, [1], [1]]
                group[at] = b"\x92\x01"
                with pytest.raises(protocol.ProtocolError, match="undecodable"):
                    protocol.open_columns([group], protocol.string_table())


ints_of = st.one_of(st.integers(0, 300), st.integers(0, (1 << 64) - 1), st.integers(-(1 << 70), 1 << 70),
                    st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 64) - 1,
                                     1 << 64, -1, -33, True, 1.0, "1", None]))


@settings(max_examples=400, deadline=None)
@given(st.lists(ints_of, max_size=40), st.sampled_from([0, 15, 16, 65536]))
def test_ints_pack_as_msgpack_packs_them_and_unpack_as_it_unpacks_them(values, more):
    values = values + list(range(more))  # the array's three headers
    uints = all(type(v) is int and 0 <= v < 1 << 64 for v in values)
    packed = kernels.C.pack_uints(values)
    assert packed == (msgpack.packb(values) if uints else None)
    if uints:
        got = kernels.C.unpack_uints(packed)
        assert got == values and all(type(v) is int for v in got)
    try:
        data = msgpack.packb(values)
    except OverflowError:  # beyond what msgpack carries
        return
    got = kernels.C.unpack_uints(data)
    assert got == (values if uints else None)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=30), st.lists(st.integers(0, 1 << 40), max_size=20).map(msgpack.packb).flatmap(
    lambda b: st.sampled_from([b, b[:-1], b + b"\x01", b[:1] + b"\xd0" + b[2:], b[:1] + b"\xa1" + b[2:]]))))
def test_unpacking_any_bytes_as_ints_is_msgpack_or_left_to_it(data):
    got = kernels.C.unpack_uints(data)
    if got is not None:
        assert got == msgpack.unpackb(data, raw=False)


@settings(max_examples=600, deadline=None)
@given(st.lists(ints_of, max_size=8),
       st.one_of(st.none(), st.lists(st.one_of(st.integers(-2, 6), ints_of), max_size=8)), st.integers(0, 30))
@example([1, 2], [1 << 62, 1 << 62], 1)  # adds up past a ssize_t
@example([0, 0], [(1 << 63) - 2, (1 << 63) - 2], (1 << 63) - 2)  # a sum past a signed 64-bit int
def test_the_check_of_runs_in_c_is_the_python_one(rids, counts, n):
    if counts is not None and len(counts) == len(rids) and all(type(c) is int and c > 0 for c in counts) and n % 2:
        n = sum(counts)  # half of these add up: the check's last test decides
    if n >= 1 << 63:  # n is a count of values (a C ssize_t in the kernel): runs this long are never received
        with pytest.raises(OverflowError):
            kernels.C.runs_fault(rids, counts, n)
        return
    assert kernels.C.runs_fault(rids, counts, n) == protocol.runs_fault(rids, counts, n)


@settings(max_examples=500)
@given(st.lists(st.sampled_from([b"{", b"}", b",", b" ", b"\t", b"\r", b"\n", b"ab", b"b", b"kind"]), max_size=60),
       st.data())
def test_the_file_readers_cuts_of_a_block_in_c_are_pythons(parts, data):
    from clasp.connectors import file_source

    block = b"".join(parts)
    used = data.draw(st.integers(0, len(block)))
    n = data.draw(st.integers(0, 20))
    marks = data.draw(st.lists(st.sampled_from([b"a", b"ab", b"b\n", b"}", b"kind", b"{}", b"\r,"]), min_size=1,
                               max_size=3))
    with python_only():
        whole, comma = file_source._whole_lines(block, n), file_source._close_comma(block, used)
    assert kernels.C.whole_lines(bytearray(block), n) == whole
    assert kernels.C.close_comma(bytearray(block), used) is comma
    picked = file_source._picked(block[:used].split(b"\n")[:-1], marks)
    assert kernels.C.pick_lines(block, used, marks) == (b"".join(x + b"\n" for x in picked), len(picked))


event_times = st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False), st.sampled_from([-(1 << 53), 1 << 53]))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(event_times, max_size=12), max_size=7),
       st.sampled_from([None, float("nan"), (1 << 53) + 1, "x", True, ValueError]), st.data())
def test_the_merge_of_an_aligned_reads_slices_in_c_is_pythons(slices, odd, data):
    """The same merge, ties to the earlier slice; a time the kernel does not take (a NaN, an int beyond 53 bits, a
    str, a bool, a timestamp function that raises) leaves it to Python."""
    from clasp.core.alignment import merged

    if odd is not None and any(slices):
        i = data.draw(st.integers(0, len(slices) - 1).filter(lambda i: slices[i]))
        slices[i][data.draw(st.integers(0, len(slices[i]) - 1))] = odd
    tagged = [[(t, i, j) for j, t in enumerate(s)] for i, s in enumerate(slices)]

    def timestamp(r):
        if r[0] is ValueError:
            raise ValueError("no time")
        return r[0]

    with python_only():
        want = merged(tagged, timestamp)
    got = kernels.C.merge_by_time(tagged, timestamp)
    assert (got is None) is (odd is not None and any(slices))
    assert merged(tagged, timestamp) == want
    if got is not None:
        assert got == want
