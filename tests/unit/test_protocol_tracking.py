"""The pure pieces of the runtime: protocol validation, epoch-progress completion, routing tables."""

from __future__ import annotations

import collections
import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import kernels, protocol
from clasp.core.keygroups import group_counts
from clasp.core.parallelism import largest_remainder
from clasp.core.protocol import ProtocolError
from clasp.core.routing import NUM_KEY_GROUPS, key_group, key_groups_for_shares, weighted_table
from clasp.core.tracking import CHUNK_BITS, EPOCH_BITS, EPOCH_SIZE, Tracker, add_range


def test_encode_decode_roundtrip_and_schema_errors():
    frame = protocol.encode("push", {"req": 3, "job": 1, "records": ["a", 1]})
    assert protocol.decode(frame) == ("push", {"req": 3, "job": 1, "records": ["a", 1]})
    cases = {
        b"\xc1": "undecodable",
        msgpack.packb([1, "push"]): "bad_envelope",
        msgpack.packb([2, "push", {}]): "bad_version",
        msgpack.packb([1, "nope", {}]): "unknown_type",
        msgpack.packb([1, "push", {"req": 1, "job": 1}]): "missing_field",
        msgpack.packb([1, "push", {"req": "1", "job": 1, "records": []}]): "bad_field",
        msgpack.packb([1, "data", {"job": 1}]): "bad_body",
    }
    for frame, reason in cases.items():
        with pytest.raises(ProtocolError) as e:
            protocol.decode_message(frame)
        assert e.value.reason == reason


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_decode_never_raises_anything_but_protocol_error(data):
    try:
        protocol.decode(data)
    except ProtocolError:
        pass


def test_check_rows():
    protocol.check_rows([[0, "v", None, 1], [1, "v", "k", 2]], 2)
    for rows, why in (([[2, "v", None, 1]], "out of range"), ([[0, "v", None, "r"]], "integers"),
                      ([[0, "v", None]], "each row"), ([[0, "v", None, 1, 5]], "each row"),
                      ([[0, "v", None, -1]], "negative"), ("x", "not a list")):
        with pytest.raises(ProtocolError, match=why):
            protocol.check_rows(rows, 2)


def test_check_and_expand_runs():
    runs = [[0, 100, ["a", "b"]], [1, 5, []]]
    protocol.check_runs(runs, 2)
    assert protocol.expand_runs(runs) == [(0, "a", None, 100), (0, "b", None, 101)]
    for bad in ([[2, 0, []]], [[0, -1, []]], [[0, "1", []]], [[0, 0, "ab"]], [[0, 0]], [[0, 0, 1, []]], "x"):
        with pytest.raises(ProtocolError, match="run"):
            protocol.check_runs(bad, 2)


_row = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)),
                 st.one_of(st.none(), st.integers(0, 3), st.text(max_size=2)), st.integers(0, 4))


@given(st.lists(st.one_of(_row, _row.map(lambda r: (r[0], r[1], r[1], r[3]))), min_size=1, max_size=60))
@settings(max_examples=300, deadline=None)
def test_columns_carry_every_row_in_order_per_operator(rows):
    """A cols message, through msgpack, gives back each operator's rows in their order, exactly."""
    groups = protocol.columns(rows)
    mtype, body = protocol.decode(protocol.encode_columns(1, 0, groups))
    protocol.open_columns(body[2], protocol.string_table())
    protocol.check_columns(body[2], 3)
    got = protocol.expand_columns(body[2])
    assert protocol.column_count(body[2]) == len(rows)
    for op in range(3):
        want = [tuple(list(v) if isinstance(v, tuple) else v for v in r) for r in rows if r[0] == op]
        assert [r for r in got if r[0] == op] == want


def test_columns_share_keys_and_runs():
    rows = [(1, w, w, 7) for w in "abcde"] + [(1, "a", "a", 8)]  # 2 runs of 6 rows: run-length coded
    assert protocol.columns(rows) == [[1, [*"abcde", "a"], True, [7, 8], [5, 1]]]
    rows = [(0, "a", None, 1), (0, "b", None, 2)]
    assert protocol.columns(rows) == [[0, ["a", "b"], None, [1, 2], None]]
    assert protocol.columns([(0, 1, "k", 1), (2, 2, "j", 1)]) == [[0, [1], ["k"], [1], None],
                                                              [2, [2], ["j"], [1], None]]


@pytest.mark.parametrize("impl", ["kernels", "python"])
def test_check_columns(impl, monkeypatch):
    if impl == "python":
        monkeypatch.setattr(kernels, "C", None)
    protocol.check_columns([[0, ["a"], True, [1], [1]], [1, ["a", "b"], ["k", "j"], [1, 2], None]], 2)
    protocol.check_columns([[0, ["a", "b"], True, [1], [2], [5, 127]], [0, ["a"], None, [1], None, None]], 2)
    protocol.check_columns([[0, ["a", "b"], True, [1], [2], bytes([5, 127])]], 2)  # groups as the sender packs them
    for groups, why in (([[2, ["a"], None, [1], None]], "out of range"),
                        ([[0, ["a"], None, ["r"], None]], "integers"),
                        ([[0, ["a"], None, [-1], None]], "negative"),
                        ([[0, ["a"], ["k", "j"], [1], None]], "keys"),
                        ([[0, ["a", "b"], None, [1], None]], "one rid per value"),
                        ([[0, ["a", "b"], None, [1], [1]]], "counts"),
                        ([[0, ["a"], None, [1], [0]]], "counts"),
                        ([[0, "a", None, [1], None]], "lists"),
                        ([[0, ["a"], None, [1]]], "each group"),
                        ([[0, ["a"], None, [1], [1], None, 0]], "each group"), ("x", "not a list"),
                        ([[0, ["a"], True, [1], None, [128]]], "key groups"),
                        ([[0, ["a"], True, [1], None, bytes([128])]], "key groups"),
                        ([[0, ["a", "b"], True, [1], [2], bytes([3])]], "key groups"),
                        ([[0, ["a"], True, [1], None, [-1]]], "key groups"),
                        ([[0, ["a"], True, [1], None, ["3"]]], "key groups"),
                        ([[0, ["a", "b"], True, [1, 2], None, [3]]], "key groups"),
                        ([[0, ["a"], None, [1], None, [3]]], "key groups")):
        with pytest.raises(ProtocolError, match=why):
            protocol.check_columns(groups, 2)


def tree_reports(e: int, fanouts: list[int]) -> list[dict]:
    """The reports of one record's requests, one per finished request: operator i's requests each make
    fanouts[i] requests of operator i + 1, the last operator's none."""
    reports, width = [], 1
    for i, k in enumerate([*fanouts, 0]):
        for _ in range(width):
            reports.append({e: {i: -1, i + 1: k} if k else {i: -1}})
        width *= k
    return reports


@given(st.lists(st.integers(0, 4), min_size=1, max_size=3), st.lists(st.integers(0, 4), max_size=3),
       st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_tracker_completes_an_epoch_exactly_when_every_report_of_it_is_in(tree0, tree1, rnd):
    """Epoch 0 (512 records) and epoch 1 (one record) of a chunk: one record of each fans out level by level,
    every other record of epoch 0 finishes at the source. The reports come in a random order (a consumer's
    before its producer's): an epoch completes at its last report, never before."""
    t = Tracker()
    base = t.admit(EPOCH_SIZE + 1, now=0.0)
    counts: dict = {}
    add_range(counts, 0, base, EPOCH_SIZE + 1)
    assert t.dispatched(base, EPOCH_SIZE + 1, counts, now=0.5) == 0
    reports = [(0, r) for r in tree_reports(0, tree0)] + [(1, r) for r in tree_reports(1, tree1)]
    reports.append((0, {0: {0: -(EPOCH_SIZE - 1)}}))
    rnd.shuffle(reports)
    left = collections.Counter(e for e, _ in reports)
    for i, (e, r) in enumerate(reports):
        left[e] -= 1
        t.progress(r, now=1.0 + i)
        assert t.completed == (EPOCH_SIZE if left[0] == 0 else 0) + (1 if left[1] == 0 else 0)
        assert set(t.epochs) == {x for x in (0, 1) if left[x]}
    assert t.outstanding == 0 and t.cumulative.total == EPOCH_SIZE + 1 and not t.chunks and t.unknown == 0


def test_tracker_latency_runs_from_admission_to_the_epochs_completion():
    t = Tracker()
    a = t.admit(3, now=10.0)
    b = t.admit(2, now=10.5)
    t.dispatched(a, 3, {a >> EPOCH_BITS: {0: 3}}, now=10.2)
    t.dispatched(b, 2, {b >> EPOCH_BITS: {0: 2}}, now=10.6)
    assert t.progress({b >> EPOCH_BITS: {0: -2}}, now=12.5) == 2
    assert t.progress({a >> EPOCH_BITS: {0: -3}}, now=11.0) == 3
    s = t.take_interval()
    assert s["count"] == 5 and 1.0 <= s["p50"] <= 1.06 and 2.0 <= s["p95"] <= 2.0 * 1.06
    assert t.take_interval()["count"] == 0 and t.cumulative.total == 5 and t.outstanding == 0


def test_records_sent_nowhere_complete_at_dispatch_and_reports_for_unknown_epochs_are_counted():
    t = Tracker()
    a = t.admit(4, now=0.0)
    # two records' key functions failed: the source got the other two; then their requests finish
    assert t.dispatched(a, 4, {0: {0: 2}}, now=1.0) == 0
    assert t.dispatched(t.admit(2, now=0.0), 2, {}, now=1.0) == 2  # both sent nowhere: done at once
    assert t.progress({0: {0: -2}}, now=2.0) == 4
    t.admit(3, now=0.0)
    assert t.progress({(2 << CHUNK_BITS) >> EPOCH_BITS: {0: -1}}, now=3.0) == 0  # never dispatched
    assert t.unknown == 1 and t.outstanding == 3


@given(st.integers(0, 3), st.integers(0, 3 * EPOCH_SIZE), st.integers(1, 3 * EPOCH_SIZE), st.integers(0, 5))
def test_add_range_counts_each_epoch_of_a_range_once(chunk, offset, n, op):
    first = (chunk << CHUNK_BITS) + offset
    counts: dict = {7 << 20: {op: 1}}  # counts already there are added to
    add_range(counts, op, first, n)
    per_epoch = collections.Counter(rid >> EPOCH_BITS for rid in range(first, first + n))
    assert counts == {7 << 20: {op: 1}, **{e: {op: k} for e, k in per_epoch.items()}}


def test_key_group_is_stable_across_processes_and_types():
    # Defined by crc32, not hash(): the same in every process, whatever PYTHONHASHSEED is.
    import zlib

    assert key_group("hello") == zlib.crc32(b"hello") % NUM_KEY_GROUPS
    assert key_group(1000) == 1000 % NUM_KEY_GROUPS
    assert key_group(b"x") == zlib.crc32(b"x") % NUM_KEY_GROUPS
    assert 0 <= key_group(["a", 1]) < NUM_KEY_GROUPS


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.floats(0.01, 10), min_size=1))
@settings(max_examples=100, deadline=None)
def test_weighted_table_and_key_groups_follow_shares(shares):
    table = weighted_table(shares, size=120)
    counts = collections.Counter(table)
    expected = largest_remainder([shares[w] for w in sorted(shares)], 120)
    assert [counts.get(w, 0) for w in sorted(shares)] == expected
    owners = key_groups_for_shares(shares)
    assert len(owners) == NUM_KEY_GROUPS
    ids = sorted(shares)
    expected_groups = group_counts({i: shares[w] for i, w in enumerate(ids)}, NUM_KEY_GROUPS)
    assert {w: n for w, n in collections.Counter(owners).items()} == {ids[i]: n for i, n in expected_groups.items()}


def test_control_messages_are_typed_and_checked_in_one_place():
    frame = protocol.encode("submit", {"req": 2, "dag": {"x": 1}, "options": {"policy": "clasp", "autoscale": False},
                                       "extra": "ignored"})
    mtype, msg = protocol.decode_message(frame)
    assert mtype == "submit" and isinstance(msg, protocol.Submit)
    assert (msg.req, msg.dag, msg.placement, msg.policy, msg.state, msg.autoscale) == (2, {"x": 1}, None, "clasp",
                                                                                       None, False)
    reg = protocol.Register("w1", "h", "tcp://d", "tcp://s", "http://m", 10, 77)
    assert protocol.decode_message(protocol.pack(reg)) == ("register", reg)
    assert protocol.parse("heartbeat", {"id": "w1", "sample": {"a": 1}}) == protocol.Heartbeat("w1", {"a": 1})
    assert protocol.SCHEMAS["register"] == {"id": (str,), "host": (str,), "data": (str,), "state": (str,),
                                            "metrics": (str,), "p_max": (int,), "pid": (int,)}
    assert protocol.pack(protocol.Stats(3, 1)) == protocol.encode("stats", {"req": 3, "job": 1})
    # The data path's list bodies stay lists.
    assert protocol.parse("data", [1, 0, []]) == [1, 0, []]
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.req = 5  # frozen: a message is what came
    with pytest.raises((AttributeError, TypeError)):  # TypeError: Python 3.11's frozen slotted __setattr__
        msg.unknown = 1  # slots: no stray attributes
    bad = [
        ("place", {"req": 1, "job": 1, "placement": {"a": {0: "half"}}}, "place.placement"),
        ("place", {"req": 1, "job": 1, "placement": {"a": [1]}}, "place.placement"),
        ("submit", {"req": 1, "dag": {}, "placement": {"a": {"0": 1.0}}}, "submit.placement"),
        ("submit", {"req": 1, "dag": {}, "options": {"autoscale": "yes"}}, "submit.options.autoscale"),
        ("wait_idle", {"req": 1, "job": 1, "timeout": -1}, "wait_idle.timeout"),
        ("scale", {"req": 1, "job": 1, "workers": True}, "scale.workers"),
    ]
    for mtype, body, where in bad:
        with pytest.raises(ProtocolError, match=where) as e:
            protocol.decode_message(protocol.encode(mtype, body))
        assert e.value.reason == "bad_field"
    assert protocol.parse("done", [1, {3: {0: -2, 1: 5}}, 7]) == [1, {3: {0: -2, 1: 5}}, 7]
    for body, why in (([1, {"a": "b"}, 0], "epochs must be integers"), ([1, {3: [1]}, 0], "epochs must be integers"),
                      ([1, {3: {"op": 1}}, 0], "operators and deltas"), ([1, {3: {0: 1.5}}, 0], "operators and deltas"),
                      ([1, [3], 0], "expected"), ([1, {}, -1], "behind"), ([1, {}, 1.5], "behind")):
        with pytest.raises(ProtocolError, match=why) as e:
            protocol.decode_message(protocol.encode("done", body))
        assert e.value.reason == "bad_body"
    with pytest.raises(ProtocolError, match="expected a list of 3") as e:
        protocol.decode_message(protocol.encode("done", [1, {}]))  # a body without the worker's backlog


def test_a_seal_carries_its_partitions_marks_or_none():
    counts = {0: {1: 10}}
    assert protocol.decode_message(protocol.encode("seal", [1, 3, 10, counts])) == ("seal", [1, 3, 10, counts])
    marked = [1, 3, 10, counts, ["src", "p0", 1.5]]
    assert protocol.decode_message(protocol.encode("seal", marked)) == ("seal", marked)
    for mark in ("p0", ["src", "p0"], ["src", "p0", "1.5"], ["src", "p0", None]):
        with pytest.raises(ProtocolError, match="mark") as e:
            protocol.decode_message(protocol.encode("seal", [1, 3, 10, counts, mark]))
        assert e.value.reason == "bad_body"
    # A chunk of several partitions' slices (aligned reading) carries a mark for each; anything else is refused.
    two = [*marked, ["src", "p1", 2.5]]
    assert protocol.decode_message(protocol.encode("seal", two)) == ("seal", two)
    with pytest.raises(ProtocolError, match="mark"):
        protocol.decode_message(protocol.encode("seal", [*marked, 0]))
    with pytest.raises(ProtocolError, match="expected a list of 4"):
        protocol.decode_message(protocol.encode("seal", [1, 3, 10]))


def test_seals_carry_a_turn_of_seals_each_checked_as_one():
    counts = {0: {1: 10}}
    body = [1, [[3, 10, counts], [4, 10, counts, ["src", "p0", 1.5]]]]
    assert protocol.decode_message(protocol.encode("seals", body)) == ("seals", body)
    for seals, why in (([], "expected"), ([[3, 10]], "each seal"), ([[3, 0, counts]], "expected"),
                       ([[3, 10, counts, ["src", "p0"]]], "mark"), ([[3, 10, {0: {1: "x"}}]], "deltas")):
        with pytest.raises(ProtocolError, match=why) as e:
            protocol.decode_message(protocol.encode("seals", [1, seals]))
        assert e.value.reason == "bad_body"
