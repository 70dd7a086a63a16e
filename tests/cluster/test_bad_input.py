"""Garbage on every socket is dropped and counted; nothing crashes, hangs or loses accepted data."""

from __future__ import annotations

import collections
import random
import re
import time
import urllib.request

import msgpack
import pytest
import zmq

import clasp
from clasp.core import protocol
from clasp.runtime.security import Security
from tests.conftest import make_lines, start_cluster, wordcount_dag


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 2)
    yield c
    c.stop()


def garbage(rng: random.Random) -> list[bytes]:
    valid = protocol.encode("data", [1, 0, [[0, "x", None, 1]]])
    return ([rng.randbytes(rng.randint(0, 300)) for _ in range(150)]
            + [valid[: rng.randint(1, len(valid) - 1)] for _ in range(20)]  # truncated
            + [msgpack.packb([protocol.VERSION, "no_such_type", {}]), msgpack.packb([99, "push", {}]),
               msgpack.packb([protocol.VERSION, "push", {"req": 1}]), msgpack.packb({"not": "a list"}),
               msgpack.packb([protocol.VERSION, "data", [1, 0, [[0, "x", None, "rid"]]]]),
               msgpack.packb([protocol.VERSION, "data", [1, 0, [[99, "x", None, 1]]]]),
               msgpack.packb([protocol.VERSION, "runs", [1, 0, [[0, -3, ["x"]]]]]),
               msgpack.packb([protocol.VERSION, "cols", [1, 0, [[0, ["x", "y"], True, [1], [3]]]]]),
               msgpack.packb([protocol.VERSION, "cols", [1, 0, [[9, ["x"], None, [1], None]]]]),
               msgpack.packb([protocol.VERSION, "done", [1, {"a": "b"}, 0]]),
               msgpack.packb([protocol.VERSION, "done", [1, {3: {0: "x"}}, 0]]),
               msgpack.packb([protocol.VERSION, "heartbeat", {"id": "w0", "sample": {}}]),
               msgpack.packb([protocol.VERSION, "submit", {"req": 5, "dag": {"functions": b"\x80garbage"}}])])


def bad_counts(url: str) -> int:
    text = urllib.request.urlopen(url).read().decode()
    return sum(float(v) for v in re.findall(r'^clasp_bad_messages_total\{reason="[^"]+"\} (\S+)$', text, re.M))


def test_random_bytes_on_every_socket(cluster2):
    rng = random.Random(42)
    with clasp.connect(cluster2.planner) as client:
        # Data accepted before the garbage must survive it.
        lines = make_lines(3000, seed=11)
        job = client.submit(wordcount_dag("garbage"))
        job.push(lines[:1500])
        workers = client.workers()
        ctx = zmq.Context()
        socks = []
        try:
            sec = Security(cluster2.keys_dir)  # garbage from an authenticated peer: past CURVE, to the handlers
            planner = sec.client(ctx.socket(zmq.DEALER))
            planner.connect(cluster2.planner)
            socks.append(planner)
            for w in workers:
                data = sec.client(ctx.socket(zmq.PUSH))
                data.connect(w["data"])
                state = sec.client(ctx.socket(zmq.DEALER))
                state.connect(w["state"])
                socks += [data, state]
            for sock in socks:
                for frame in garbage(rng):
                    sock.send(frame)
                sock.send_multipart([b"two", b"frames"])
            # The planner answers garbage with an error message naming the reason.
            assert planner.poll(5000)
            mtype, body = protocol.decode(planner.recv())
            assert mtype == "error" and body["reason"]
            time.sleep(0.5)
        finally:
            for s in socks:
                s.close(0)
            ctx.term()
        job.push(lines[1500:])
        job.wait_idle(60)
        assert job.state("count") == dict(collections.Counter(w for line in lines for w in line.split()))
        assert cluster2.alive() and not cluster2.events  # no process exited (and none was restarted)
    assert bad_counts(cluster2.metrics["planner"]) >= 150
    for url in cluster2.metrics["workers"]:
        assert bad_counts(url) >= 300  # its data socket and its state server each got the whole set


def _ask(sock, mtype: str, body: dict):
    sock.send(protocol.encode(mtype, {"req": 1, **body}))
    assert sock.poll(5000), f"no answer to {mtype}"
    _, reply = protocol.decode(sock.recv())
    assert reply["ok"], reply
    return reply["result"]


def test_state_server_serves_other_processes(cluster2):
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(wordcount_dag("state-server"))
        job.push(["a b a", "b c"])
        job.wait_idle(30)
        ctx = zmq.Context()
        merged, owner_of_a = {}, None
        try:
            socks = []
            for w in client.workers():
                s = Security(cluster2.keys_dir).client(ctx.socket(zmq.DEALER))
                s.connect(w["state"])
                socks.append(s)
                part = _ask(s, "state_dump", {"job": job.id, "op": "count"})
                merged.update(part)
                if "a" in part:
                    owner_of_a = s
            assert merged == {"a": 2, "b": 2, "c": 1}
            assert _ask(owner_of_a, "state_get", {"job": job.id, "op": "count", "key": "a"}) == 2
            _ask(owner_of_a, "state_put", {"job": job.id, "op": "count", "key": "a", "value": 40})
            job.push(["a"])
            job.wait_idle(30)
            assert job.state("count") == {"a": 41, "b": 2, "c": 1}
            for s in socks:
                s.close(0)
        finally:
            ctx.term()
        job.cancel()
