"""Every typed control message (clasp.core.protocol.MESSAGES): a good one goes through the wire unchanged, a
bad field is refused with ProtocolError (with the request id when it could be read), and any well-typed body
either round-trips or is refused, never with another exception."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clasp.core import protocol
from clasp.core.protocol import MESSAGES, ProtocolError

P = protocol
PLACEMENT = {"epoch": 1, "workers": ["w0"], "operators": {"count": {"shares": {"w0": 1.0}, "instances": {"w0": 1},
                                                                   "key_groups": ["w0"] * 128}}}
DAG = {"name": "wc", "operators": [], "edges": [], "functions": b"\x80\x04"}
# One good message of every type.
EXAMPLES: list[protocol.Message] = [
    P.Submit(1, DAG, {"count": {0: 1.0}}, {"policy": "clasp", "autoscale": False}, {"count": [1.0] * 128}),
    P.Push(2, 1, ["a b", "c"]), P.WaitIdle(3, 1, 2.5), P.StateRequest(4, 1, "count", 1.0), P.Collected(5, 1, "out"),
    P.Stats(6, 1, True), P.Cancel(7, 1), P.Stop(8, 1, 0.0), P.EndInput(9, 1), P.Jobs(10), P.Workers(11),
    P.Scale(12, 1, 3), P.Place(13, 1, {"count": {0: 0.5, 1: 0.5}}), P.Autoscale(14, 1, True), P.Drain(15, "w1"),
    P.Pool(16), P.Register("w1", "h", "tcp://d", "tcp://s", "http://m", 10, 77), P.Leave("w1"),
    P.Heartbeat("w1", {"cpu": 0.5}), P.Reply(17, True, {"x": [1]}), P.Reply(18, False, None, "no"),
    P.Error("bad_field", "deploy.peers"),
    P.Deploy(1, DAG, PLACEMENT, {"w0": "tcp://a:1"}, req=19, state="remote", state_server="tcp://p:2", floor=3,
             run="r1", sources=[["src", "p0", "w0", None]]),
    P.Deploy(1, DAG, PLACEMENT, {}, req=20),
    P.Restore(1, DAG, PLACEMENT, {"w0": "tcp://a:1"}, 4, {"count": [0, 5]}, "/ckpt", req=21, state="local",
              run="r1", sinks={"w0": {"commit": {}, "abort": []}}, sources=[["src", "p0", "w0", 17]],
              watermark=[-math.inf, 3.5]),
    P.MigratePlan(1, {"epoch": 2, "moves": {}}, PLACEMENT, req=22), P.Peers(1, {"w2": "tcp://b:3"}, req=23),
    P.StopJob(1, req=24), P.Counters(1, req=25), P.Counters(1, req=26, below=1 << 40),
    P.StateDump(1, "count", req=27), P.StatePacked(1, "count", req=27), P.CollectedDump(1, "out", req=28),
    P.StateGet(1, "count", ["k", 1], req=29),
    P.StatePut(1, "count", "k", {"n": 1}, req=30), P.CkptBegin(1, 2, 1 << 20, req=31),
    P.CkptSnapshot(1, 2, 1 << 20, "/ckpt", req=32), P.CkptAbort(1, 2, req=33),
    P.SinkCommit(1, {"out-w0": ["out", [[2, {"file": "x"}]]]}, req=34), P.SinkFlush(1, 5, req=35),
    P.SrcAssign(1, [["src", "p0", {"offset": 3}]], req=36), P.SrcRelease(1, [["src", "p0"]], req=37),
    P.RstateGetMany(1, "count", ["a", 2, None], req=38), P.RstatePutMany(1, "count", {"a": 1, "b": None}, req=39),
    P.Welcome("planner-1", 0.5), P.Shutdown(True, "drained"), P.Credit(1, 1024), P.Leased(1, 32, 16),
    P.Watermark(1, 12.5, [12.5, -math.inf], 7), P.Lease(1, 16), P.ReadEnd(1, "src", "p0", 3),
    P.WmIdle(1, "src", "p1"), P.WmFired(1, 7, 0), P.WmOut(1, 40, 3), P.Marker(1, 2, "w0"),
    P.Migrate(1, 2, "w0", [[1, 5, b"\x80", 0, []]], [[0, "x", None, 9]], False),
]


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(MESSAGES.values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: f"{m.TYPE}")
def test_a_good_message_round_trips(msg):
    mtype, back = protocol.decode_message(protocol.pack(msg))
    assert mtype == msg.TYPE and back == msg and type(back) is type(msg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(back, dataclasses.fields(back)[0].name, None)  # a message is what came


def test_positional_messages_keep_their_compact_list_bodies():
    assert protocol.pack(P.Lease(1, 16)) == protocol.encode("lease", [1, 16])
    assert protocol.pack(P.Marker(1, 2, "w0")) == protocol.encode("marker", [1, 2, "w0"])
    assert protocol.pack(P.Migrate(1, 2, "w", [], [], True)) == protocol.encode("migrate", [1, 2, "w", [], [], True])
    # the data path's per-batch bodies stay lists: no object built per batch
    for mtype, body in (("data", [1, 0, []]), ("runs", [1, 0, []]), ("cols", [1, 0, []]), ("done", [1, {}, 0]),
                        ("seal", [1, 3, 10, {0: {0: 10}}]), ("seal", [1, 3, 10, {0: {0: 10}}, ["src", "p0", 1.5]])):
        assert protocol.decode_message(protocol.encode(mtype, body)) == (mtype, body)


def test_a_request_is_sent_with_the_id_its_sender_gives_it():
    msg = P.CkptBegin(1, 2, 3)
    assert msg.req == 0
    sent = dataclasses.replace(msg, req=41)
    assert protocol.decode(protocol.pack(sent)) == ("ckpt_begin", {"req": 41, "job": 1, "ckpt": 2, "boundary": 3})


# (type, body, what the error names); a body with a readable `req` gives the error that id.
BAD = [
    ("deploy", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {"w0": 5}}, "deploy.peers"),
    ("deploy", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "state": "cloud"}, "deploy.state"),
    ("deploy", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "state": "remote"},
     "deploy.state_server"),
    ("deploy", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "sources": [["src", "p0"]]},
     "deploy.sources"),
    ("deploy", {"req": 1, "job": "1", "dag": DAG, "placement": {}, "peers": {}}, "deploy.job"),
    ("restore", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "ckpt": -1, "groups": {},
                 "dir": "/c"}, "restore.ckpt"),
    ("restore", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "ckpt": 1, "groups": {"c": [0.5]},
                 "dir": "/c"}, "restore.groups"),
    ("restore", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "ckpt": 1, "groups": {},
                 "dir": "/c", "sinks": {"w0": []}}, "restore.sinks"),
    ("restore", {"req": 1, "job": 1, "dag": DAG, "placement": {}, "peers": {}, "ckpt": 1, "groups": {},
                 "dir": "/c", "watermark": ["x"]}, "restore.watermark"),
    ("migrate_plan", {"req": 1, "job": 1, "plan": [], "placement": {}}, "migrate_plan.plan"),
    ("peers", {"req": 1, "job": 1, "peers": {"w0": None}}, "peers.peers"),
    ("stop_job", {"req": 1, "job": None}, "stop_job.job"),
    ("counters", {"req": 1, "job": 1, "below": 1.5}, "counters.below"),
    ("state_dump", {"req": 1, "job": 1, "op": b"count"}, "state_dump.op"),
    ("collected_dump", {"req": 1, "job": 1, "op": 3}, "collected_dump.op"),
    ("state_get", {"req": 1, "job": 1, "op": None, "key": "k"}, "state_get.op"),
    ("state_put", {"req": 1, "job": True, "op": "count", "key": "k", "value": 1}, "state_put.job"),
    ("ckpt_begin", {"req": 1, "job": 1, "ckpt": 0, "boundary": 5}, "ckpt_begin.ckpt"),
    ("ckpt_begin", {"req": 1, "job": 1, "ckpt": 2, "boundary": -5}, "ckpt_begin.boundary"),
    ("ckpt_snapshot", {"req": 1, "job": 1, "ckpt": 2, "boundary": 5, "dir": None}, "ckpt_snapshot.dir"),
    ("ckpt_abort", {"req": 1, "job": 1, "ckpt": "2"}, "ckpt_abort.ckpt"),
    ("sink_commit", {"req": 1, "job": 1, "parts": {"p": ["out"]}}, "sink_commit.parts"),
    ("sink_flush", {"req": 1, "job": 1, "seq": 1.0}, "sink_flush.seq"),
    ("src_assign", {"req": 1, "job": 1, "parts": [["src", 0, None]]}, "src_assign.parts"),
    ("src_release", {"req": 1, "job": 1, "parts": [["src", "p0", None]]}, "src_release.parts"),
    ("rstate_get_many", {"req": 1, "job": 1, "op": "count", "keys": [[1, 2]]}, "rstate_get_many.keys"),
    ("rstate_put_many", {"req": 1, "job": 1, "op": "count", "states": []}, "rstate_put_many.states"),
    ("welcome", {"planner": "p", "heartbeat": -0.5}, "welcome.heartbeat"),
    ("welcome", {"planner": "p", "heartbeat": math.inf}, "welcome.heartbeat"),
    ("shutdown", {"ok": 1, "detail": "x"}, "shutdown.ok"),
    ("credit", {"job": 1, "records": -1}, "credit.records"),
    ("leased", {"job": 1, "first": 0, "count": 0}, "leased.count"),
    ("leased", {"job": 1, "first": -3, "count": 4}, "leased.count"),
    ("watermark", {"job": 1, "watermark": 1.0, "levels": [], "round": 1}, "watermark.levels"),
    ("watermark", {"job": 1, "watermark": 1.0, "levels": ["1"], "round": 1}, "watermark.levels"),
    ("watermark", {"job": 1, "watermark": "1", "levels": [1], "round": 1}, "watermark.watermark"),
    ("lease", [1, 0], "lease.chunks"),
    ("lease", [1, 5000], "lease.chunks"),
    ("lease", [1, "16"], "lease.chunks"),
    ("read_end", [1, "src", 0, 3], "read_end.partition"),
    ("wm_idle", [1, None, "p0"], "wm_idle.op"),
    ("wm_fired", [1, 1.5, 0], "wm_fired.round"),
    ("wm_out", [1, 4, 0], "wm_out.records"),
    ("marker", [1, 2, 3], "marker.sender"),
    ("migrate", [1, 2, "w0", [], [], 0], "migrate.more"),
]


@pytest.mark.parametrize("mtype,body,where", BAD, ids=[f"{m}-{w}" for m, _, w in BAD])
def test_a_bad_field_is_a_protocol_error(mtype, body, where):
    with pytest.raises(ProtocolError, match=where) as e:
        protocol.decode_message(protocol.encode(mtype, body))
    assert e.value.reason == "bad_field"
    assert e.value.req == (body.get("req") if isinstance(body, dict) else None)


def test_a_missing_field_or_a_wrong_shape_is_a_protocol_error():
    cases = [(msgpack.packb([1, "deploy", {"req": 9, "job": 1, "dag": {}, "peers": {}}]), "missing_field", 9),
             (msgpack.packb([1, "ckpt_snapshot", {"job": 1, "ckpt": 2, "boundary": 5, "dir": "/c"}]),
              "missing_field", None),
             (msgpack.packb([1, "credit", [1, 5]]), "bad_body", None),
             (msgpack.packb([1, "lease", {"job": 1, "chunks": 16}]), "bad_body", None),
             (msgpack.packb([1, "migrate", [1, 2, "w0", [], []]]), "bad_body", None),
             (msgpack.packb([1, "read_end", ["1", "src", "p0", 3]]), "bad_body", None)]
    for data, reason, req in cases:
        with pytest.raises(ProtocolError) as e:
            protocol.decode_message(data)
        assert (e.value.reason, e.value.req) == (reason, req), data


_SCALARS = {
    str: st.text(max_size=6), int: st.integers(-(1 << 63), (1 << 63) - 1), bool: st.booleans(),
    float: st.floats(allow_nan=False), bytes: st.binary(max_size=6),
}
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 40), 1 << 40), st.text(max_size=4),
                  st.floats(allow_nan=False))
_VALUE = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                      max_leaves=12)
_CONTAINERS = {dict: st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 200)), _VALUE, max_size=4),
               list: st.lists(_VALUE, max_size=4)}


def _field(f: dataclasses.Field):
    types = f.metadata["types"]
    if types is None:
        value = _VALUE
    else:
        value = st.one_of(*(_SCALARS[t] if t in _SCALARS else _CONTAINERS[t] for t in types))
    return st.one_of(st.none(), value) if f.metadata.get("optional") else value


@st.composite
def _messages(draw):
    cls = draw(st.sampled_from(sorted(MESSAGES.values(), key=lambda c: c.TYPE)))
    return cls(**{f.name: draw(_field(f)) for f in dataclasses.fields(cls)})


@given(_messages())
@settings(max_examples=1500, deadline=None)
def test_every_well_typed_message_round_trips_or_is_refused(msg):
    """Whatever the values of the right types: what its check accepts comes back equal, what it refuses is
    refused on receipt too, as a ProtocolError naming the message (and its request id, when it has one)."""
    try:
        msg.check()
    except ProtocolError as e:
        with pytest.raises(ProtocolError) as got:
            protocol.decode_message(protocol.pack(msg))
        assert (got.value.reason, got.value.detail) == (e.reason, e.detail)
        assert got.value.detail.startswith(msg.TYPE + ".")
        assert got.value.req == (msg.req if isinstance(msg, protocol.Call | protocol.Request) else None)
        return
    assert protocol.decode_message(protocol.pack(msg)) == (msg.TYPE, msg)


@example("wm_fired", [0, 0, 0, None])  # one element past its positions: was a ValueError, not a refusal
@given(st.sampled_from(sorted(MESSAGES)), st.one_of(_VALUE, st.dictionaries(st.text(max_size=8), _VALUE)))
@settings(max_examples=1500, deadline=None)
def test_any_body_is_a_message_or_a_protocol_error(mtype, body):
    try:
        got, msg = protocol.decode_message(protocol.encode(mtype, body))
    except ProtocolError:
        return
    assert got == mtype and protocol.decode_message(protocol.pack(msg)) == (mtype, msg)
