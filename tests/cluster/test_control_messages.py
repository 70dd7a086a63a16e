"""A real worker process given bad control messages by its planner (the test plays the planner on a ROUTER):
each is refused, counted in `clasp_bad_messages_total` and answered (an error reply to a request whose id
could be read, else an `error` message), and the worker goes on serving the job it was deployed exactly."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import time
import urllib.request

import msgpack
import pytest
import zmq

from clasp.core import protocol
from clasp.core.routing import build_placement
from tests.conftest import make_lines, wordcount_dag

V = protocol.VERSION


def frame(mtype: str, body) -> bytes:
    """A frame as a faulty planner would build it: no dataclass, no check."""
    return msgpack.packb([V, mtype, body], use_bin_type=True)


# (frame, request id of the error reply, or None for an `error` message; the reason it names)
BAD_CONTROL = [
    (b"\xc1garbage", None, "undecodable"),
    (frame("ckpt_begin", {"req": 11, "job": 1, "ckpt": "one", "boundary": 0}), 11, "bad_field"),
    (frame("deploy", {"req": 12, "job": 2, "placement": {}, "peers": {}}), 12, "missing_field"),
    (frame("deploy", {"req": 13, "job": 2, "dag": {}, "placement": {}, "peers": {"w9": 5}}), 13, "bad_field"),
    (frame("ckpt_begin", {"req": 14, "job": 1, "ckpt": 3, "boundary": -1}), 14, "bad_field"),
    (frame("src_assign", {"req": 15, "job": 1, "parts": [["split"]]}), 15, "bad_field"),
    (frame("restore", {"req": 16, "job": 1, "dag": {}, "placement": {}, "peers": {}, "ckpt": 1,
                       "groups": {"count": ["x"]}, "dir": "/tmp"}), 16, "bad_field"),
    (frame("sink_commit", {"req": 17, "job": 1, "parts": {"p0": "all"}}), 17, "bad_field"),
    (frame("counters", {"req": 18, "job": 1, "below": "x"}), 18, "bad_field"),
    (frame("welcome", {"planner": "p", "heartbeat": -1}), None, "bad_field"),
    (frame("credit", {"job": 1, "records": -500}), None, "bad_field"),
    (frame("leased", {"job": 1, "first": 0, "count": 0}), None, "bad_field"),
    (frame("watermark", {"job": 1, "watermark": 1.0, "levels": ["x"], "round": 1}), None, "bad_field"),
    (frame("shutdown", {"ok": "yes", "detail": ""}), None, "bad_field"),
    (frame("marker", [1, 0, "w9"]), None, "unexpected_type"),
]
# On the worker's state server (a ROUTER any process may ask)
BAD_STATE = [
    (frame("state_get", {"req": 21, "job": 1, "op": "count"}), 21, "missing_field"),
    (frame("state_dump", {"req": 22, "job": 1, "op": 7}), 22, "bad_field"),
]


def bad_counts(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {r: float(v) for r, v in re.findall(r'^clasp_bad_messages_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}


class FakePlanner:
    """The planner's side of the control channel, played on a ROUTER; heartbeats and progress are skipped."""

    def __init__(self, ctx: zmq.Context):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.ident = b""

    def recv(self, *types: str, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                self.ident, data = self.sock.recv_multipart()
                mtype, body = protocol.decode(data)
                if mtype in types:
                    return mtype, body
        pytest.fail(f"no {types} from the worker within {timeout} s")

    def send(self, data: bytes) -> None:
        self.sock.send_multipart([self.ident, data])

    def ask(self, mtype: str, body: dict, req: int):
        self.send(protocol.encode(mtype, {**body, "req": req}))
        _, reply = self.recv("reply")
        assert reply["req"] == req
        return reply


def test_a_worker_refuses_bad_control_messages_answers_them_and_keeps_working(tmp_path):
    ctx = zmq.Context()
    planner = FakePlanner(ctx)
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([sys.executable, "-m", "clasp", "worker", "--planner", f"tcp://127.0.0.1:{planner.port}",
                             "--id", "w0"], stdout=open(log, "a"), stderr=subprocess.STDOUT)
    try:
        _, reg = planner.recv("register")
        planner.send(protocol.encode("welcome", {"planner": "fake", "heartbeat": 0.2}))
        spec = wordcount_dag("control").to_spec()
        placement = build_placement(spec, ["w0"], {"split": {0: 1.0}, "count": {0: 1.0}}, p_max=10)
        deployed = planner.ask("deploy", {"job": 1, "dag": spec.pack(), "placement": placement.to_wire(),
                                          "peers": {"w0": reg["data"]}}, req=1)
        assert deployed["ok"], deployed
        before = bad_counts(reg["metrics"])

        for data, req, reason in BAD_CONTROL:
            planner.send(data)
            mtype, body = planner.recv("reply", "error")
            if req is None:
                assert (mtype, body["reason"]) == ("error", reason), (data, body)
            else:  # the request fails now, not at its asker's timeout
                assert mtype == "reply" and body["req"] == req and not body["ok"], (data, body)
                assert reason in body["error"], body
        state = ctx.socket(zmq.DEALER)
        state.setsockopt(zmq.LINGER, 0)
        state.connect(reg["state"])
        for data, req, reason in BAD_STATE:
            state.send(data)
            assert state.poll(5000), data
            mtype, body = protocol.decode(state.recv())
            assert mtype == "reply" and body["req"] == req and not body["ok"] and reason in body["error"], body

        after = bad_counts(reg["metrics"])
        expected = collections.Counter(reason for _, _, reason in BAD_CONTROL + BAD_STATE)
        assert {r: after.get(r, 0) - before.get(r, 0) for r in expected} == expected
        assert proc.poll() is None and planner.ask("counters", {"job": 1}, req=30)["ok"]

        # Still working: rows pushed to its data socket are counted exactly, its heartbeats go on.
        lines = make_lines(2000, seed=5)
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(reg["data"])
        for i in range(0, len(lines), 500):
            rows = [[0, line, None, i + j] for j, line in enumerate(lines[i:i + 500])]
            push.send(protocol.encode("data", [1, 0, rows]))
        expected_counts = dict(collections.Counter(w for line in lines for w in line.split()))
        deadline = time.monotonic() + 30
        while True:
            dump = planner.ask("state_dump", {"job": 1, "op": "count"}, req=40)
            if dump["ok"] and dump["result"] == expected_counts or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert dump["result"] == expected_counts
        planner.recv("heartbeat", timeout=5)
        assert proc.poll() is None, log.read_text()
        push.close(0)
        state.close(0)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        planner.sock.close(0)
        ctx.term()
