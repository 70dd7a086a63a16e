"""The pure pieces of the runtime: protocol validation, weight-throwing completion, routing tables."""

from __future__ import annotations

import collections

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import protocol
from clasp.core.keygroups import group_counts
from clasp.core.parallelism import largest_remainder
from clasp.core.protocol import ROOT_WEIGHT, ProtocolError
from clasp.core.routing import NUM_KEY_GROUPS, key_group, key_groups_for_shares, weighted_table
from clasp.core.tracking import VECTOR_MIN, Tracker


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
            protocol.decode(frame)
        assert e.value.reason == reason


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_decode_never_raises_anything_but_protocol_error(data):
    try:
        protocol.decode(data)
    except ProtocolError:
        pass


def test_check_rows():
    protocol.check_rows([[0, "v", None, 1, 5], [1, "v", "k", 2, 0]], 2)
    for rows, why in (([[2, "v", None, 1, 5]], "out of range"), ([[0, "v", None, "r", 5]], "integers"),
                      ([[0, "v", None, 1]], "each row"), ([[0, "v", None, 1, -1]], "negative"), ("x", "not a list")):
        with pytest.raises(ProtocolError, match=why):
            protocol.check_rows(rows, 2)


def test_check_and_expand_runs():
    runs = [[0, 100, 7, ["a", "b"]], [1, 5, 3, []]]
    protocol.check_runs(runs, 2)
    assert protocol.expand_runs(runs) == [(0, "a", None, 100, 7), (0, "b", None, 101, 7)]
    for bad in ([[2, 0, 1, []]], [[0, -1, 1, []]], [[0, 0, -1, []]], [[0, 0, 1, "ab"]], [[0, 0, 1]], "x"):
        with pytest.raises(ProtocolError, match="run"):
            protocol.check_runs(bad, 2)


_row = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)),
                 st.one_of(st.none(), st.integers(0, 3), st.text(max_size=2)), st.integers(0, 4),
                 st.sampled_from([0, 1, ROOT_WEIGHT // 3, ROOT_WEIGHT]))


@given(st.lists(st.one_of(_row, _row.map(lambda r: (r[0], r[1], r[1], r[3], r[4]))), min_size=1, max_size=60))
@settings(max_examples=300, deadline=None)
def test_columns_carry_every_row_in_order_per_operator(rows):
    """A cols message, through msgpack, gives back each operator's rows in their order, exactly."""
    groups = protocol.columns(rows)
    mtype, body = protocol.decode(protocol.encode("cols", [1, 0, groups]))
    protocol.check_columns(body[2], 3)
    got = protocol.expand_columns(body[2])
    assert protocol.column_count(body[2]) == len(rows)
    for op in range(3):
        want = [tuple(list(v) if isinstance(v, tuple) else v for v in r) for r in rows if r[0] == op]
        assert [r for r in got if r[0] == op] == want


def test_columns_share_keys_and_runs():
    rows = [(1, w, w, 7, 5) for w in "abcde"] + [(1, "a", "a", 8, 2)]  # 2 runs of 6 rows: run-length coded
    assert protocol.columns(rows) == [[1, [*"abcde", "a"], True, [7, 8], [5, 2], [5, 1]]]
    rows = [(0, "a", None, 1, 5), (0, "b", None, 2, 5)]
    assert protocol.columns(rows) == [[0, ["a", "b"], None, [1, 2], [5, 5], None]]
    assert protocol.columns([(0, 1, "k", 1, 1), (2, 2, "j", 1, 1)]) == [[0, [1], ["k"], [1], [1], None],
                                                                    [2, [2], ["j"], [1], [1], None]]


def test_check_columns():
    protocol.check_columns([[0, ["a"], True, [1], [5], [1]], [1, ["a", "b"], ["k", "j"], [1, 2], [0, 0], None]], 2)
    for groups, why in (([[2, ["a"], None, [1], [1], None]], "out of range"),
                        ([[0, ["a"], None, ["r"], [1], None]], "integers"),
                        ([[0, ["a"], None, [1], [-1], None]], "negative"),
                        ([[0, ["a"], ["k", "j"], [1], [1], None]], "keys"),
                        ([[0, ["a", "b"], None, [1], [1], None]], "one rid per value"),
                        ([[0, ["a", "b"], None, [1], [1], [1]]], "counts"),
                        ([[0, ["a"], None, [1], [1], [0]]], "counts"),
                        ([[0, ["a"], None, [1, 2], [1], None]], "one weight"),
                        ([[0, "a", None, [1], [1], None]], "lists"),
                        ([[0, ["a"], None, [1], [1]]], "each group"), ("x", "not a list")):
        with pytest.raises(ProtocolError, match=why):
            protocol.check_columns(groups, 2)


def split_weight(w: int, k: int) -> list[int]:
    q, r = divmod(w, k)
    return [q + r] + [q] * (k - 1)


@given(st.lists(st.integers(1, 12), min_size=1, max_size=3), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_tracker_completes_exactly_when_all_weight_returns(fanouts, rnd):
    t = Tracker()
    base = t.admit(2, now=0.0)
    # Record `base` fans out level by level; its leaves return in random order, in random batches.
    leaves = [ROOT_WEIGHT]
    for k in fanouts:
        leaves = [c for w in leaves for c in split_weight(w, k)]
    rnd.shuffle(leaves)
    for i, w in enumerate(leaves):
        assert t.completed == 0
        t.returned({base: w}, now=1.0 + i)
    assert t.completed == 1 and t.outstanding == 1
    assert t.cumulative.total == 1
    t.returned({base + 1: ROOT_WEIGHT}, now=2.0)
    assert t.completed == 2 and t.outstanding == 0 and t.overreturned == 0


def test_tracker_extension_and_latency():
    t = Tracker()
    rid = t.admit(1, now=10.0)
    t.extend(rid, ROOT_WEIGHT)
    t.returned({rid: ROOT_WEIGHT}, now=10.5)
    assert t.completed == 0
    t.returned({rid: ROOT_WEIGHT}, now=11.0)
    assert t.completed == 1
    s = t.cumulative.summary()
    assert s["count"] == 1 and 1.0 <= s["p50"] <= 1.06


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
    with pytest.raises(AttributeError):
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
    with pytest.raises(ProtocolError, match="rids and weights") as e:
        protocol.decode_message(protocol.encode("done", [1, {"a": "b"}, []]))
    assert e.value.reason == "bad_body"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 299), st.sampled_from([ROOT_WEIGHT, ROOT_WEIGHT // 2,
                                                                         ROOT_WEIGHT // 4])),
                         min_size=0, max_size=3 * VECTOR_MIN), min_size=1, max_size=8),
       st.integers(0, 150))
def test_large_returns_counted_with_numpy_match_one_by_one(batches, lost_below):
    """`returned` takes a batch of VECTOR_MIN or more with numpy; the result (completions, what is still
    partly open, latencies, overreturns) is the same as applying it record by record."""
    a, b = Tracker(), Tracker()
    for t in (a, b):
        for _ in range(3):
            t.admit(100, now=0.0)
        t.lost_below = lost_below
    rid = [c << 20 | i for c in range(3) for i in range(100)]
    for k, batch in enumerate(batches):
        returns = {rid[i]: w for i, w in batch}
        na = a.returned(returns, now=1.0 + k)
        nb = b._count(b._returned_rids(returns.items(), {}), 1.0 + k)
        assert na == nb
        assert a.partial == b.partial and a.chunks == b.chunks and a.overreturned == b.overreturned
    assert a.completed == b.completed
    assert (a.cumulative.counts == b.cumulative.counts).all()
