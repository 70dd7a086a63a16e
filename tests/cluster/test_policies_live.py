"""Every policy, and the remote-state baseline, on a live 3-worker cluster: exact Word Count answers."""

from __future__ import annotations

import collections
import time
import urllib.request

import msgpack
import pytest
import zmq

import clasp
from clasp.apps import wc
from clasp.core import protocol
from clasp.runtime.security import Security
from tests.conftest import start_cluster

POLICY_NAMES = ["clasp", "faasflow", "faasflow-sp", "zhang24", "zhang24-sp"]


@pytest.fixture(scope="module")
def live3(tmp_path_factory):
    # A short warm-up so the control loop re-plans within the few seconds a test pushes.
    c = start_cluster(tmp_path_factory, 3, planner_args=["--warmup", "2000"])
    yield c
    c.stop()


@pytest.fixture
def client(live3):
    with clasp.connect(live3.planner) as c:
        yield c


def push_rising(job, lines: list[str], parts: int = 4, pause: float = 0.4) -> None:
    """Push `lines` in chunks that grow, with short sleeps, so the input rate rises over a few seconds."""
    total = sum(range(1, parts + 1))
    start = 0
    for i in range(1, parts + 1):
        end = len(lines) if i == parts else start + len(lines) * i // total
        job.push(lines[start:end])
        start = end
        time.sleep(pause)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_wc_exact_with_each_policy(client, policy):
    lines = wc.generate(24_000, seed=11)
    job = client.submit(wc.build_dag(), autoscale=True, policy=policy)
    assert job.info["policy"] == policy and job.info["autoscale"] is True
    push_rising(job, lines)
    idle = job.wait_idle(timeout=60)
    assert idle["completed"] == len(lines) and idle["lost"] == 0
    assert wc.result(job) == wc.expected(lines)
    stats = job.stats(fresh=True)
    assert stats["failed"] == 0 and stats["outstanding"] == 0
    assert stats["operators"]["split"]["processed"] == len(lines)
    # Every change the policy asked for went through the migration path and completed.
    assert all(not m.get("failed") for m in stats["migrations"])
    job.cancel()


def test_wc_exact_with_remote_state(client):
    lines = wc.generate(20_000, seed=5)
    expected = collections.Counter(wc.expected(lines))
    job = client.submit(wc.build_dag(), autoscale=False, state="remote")
    assert job.info["state"] == "remote"
    push_rising(job, lines, parts=3, pause=0.2)
    assert job.wait_idle(timeout=60)["completed"] == len(lines)
    assert job.state("count") == dict(expected)
    stats = job.stats(fresh=True)
    assert stats["failed"] == 0
    assert stats["operators"]["count"]["processed"] == sum(expected.values())
    # The state lives on the planner: the workers (all three run `count`) hold none of it.
    keys = {w: s["counters"]["operators"]["count"]["keys"] for w, s in stats["workers"].items()}
    assert len(keys) == 3 and set(keys.values()) == {0}
    processed = [s["counters"]["operators"]["count"]["processed"] for s in stats["workers"].values()]
    assert all(p > 0 for p in processed)
    job.cancel()


def test_remote_state_server_validates(live3, client):
    """The state server answers bad requests with an error and counts them; good ones round-trip."""
    job = client.submit(wc.build_dag(), autoscale=False, state="remote")
    endpoint = job.info["state_server"]
    ctx = zmq.Context()
    sock = Security(live3.keys_dir).client(ctx.socket(zmq.DEALER))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)

    def ask(frame: bytes):
        sock.send(frame)
        assert sock.poll(5000), "the state server did not answer"
        return protocol.decode(sock.recv())

    try:
        put = {"req": 1, "job": job.id, "op": "count", "states": {"a": 2, "b": 5}}
        assert ask(protocol.encode("rstate_put_many", put)) == ("reply", {"req": 1, "ok": True, "result": True})
        get = {"req": 2, "job": job.id, "op": "count", "keys": ["a", "b", "zz"]}
        assert ask(protocol.encode("rstate_get_many", get))[1]["result"] == {"a": 2, "b": 5}
        delete = {"req": 3, "job": job.id, "op": "count", "states": {"a": None}}
        assert ask(protocol.encode("rstate_put_many", delete))[1]["ok"] is True
        assert job.state("count") == {"b": 5}
        mtype, body = ask(b"\xc1garbage")
        assert mtype == "error" and body["reason"] == "undecodable"
        mtype, body = ask(msgpack.packb([protocol.VERSION, "rstate_get_many", {"req": 4, "job": job.id}]))
        assert mtype == "reply" and body["req"] == 4 and "missing_field" in body["error"]  # its asker fails now
        mtype, body = ask(protocol.encode("rstate_get_many", {"req": 5, "job": 999, "op": "count", "keys": []}))
        assert mtype == "reply" and not body["ok"] and "unknown_job" in body["error"]
        mtype, body = ask(protocol.encode("rstate_get_many", {"req": 6, "job": job.id, "op": "split", "keys": []}))
        assert not body["ok"] and "stateful" in body["error"]
        mtype, body = ask(protocol.encode("rstate_get_many", {"req": 7, "job": job.id, "op": "count",
                                                              "keys": [[1, 2]]}))
        assert not body["ok"] and "bad_field" in body["error"]
        mtype, body = ask(protocol.encode("stats", {"req": 8, "job": job.id}))
        assert mtype == "error" and body["reason"] == "unexpected_type"
        metrics = urllib.request.urlopen(live3.metrics["planner"], timeout=5).read().decode()
        for reason in ("undecodable", "missing_field", "unknown_job", "bad_field", "unexpected_type"):
            assert f'clasp_bad_messages_total{{reason="{reason}"}}' in metrics
    finally:
        sock.close(0)
        ctx.term()
    job.cancel()


def test_run_takes_policy_and_state():
    from clasp import cli
    from clasp.cli.run import UsageError, plan

    def cfg(*argv):
        return plan(cli.build_parser().parse_args(["run", "wc", *argv]), rate_of=lambda app, cpu: 10_000.0)

    assert cfg("--policy", "zhang24-sp", "--state", "remote")["submit"] == {"policy": "zhang24-sp", "state": "remote"}
    assert cfg()["submit"] == {"policy": None, "state": None}  # the planner's defaults
    with pytest.raises(UsageError, match="--policy must be one of"):
        cfg("--policy", "fastest")
    with pytest.raises(UsageError, match="--state must be local or remote"):
        cfg("--state", "cloud")
    args = cli.build_parser().parse_args(["cluster", "--state", "remote", "--policy", "faasflow"])
    config = cli.cluster_planner_config(args)
    assert (config.state, config.policy) == ("remote", "faasflow")
