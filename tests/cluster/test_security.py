"""CURVE on every socket, with real processes: who may connect, what others get, and the limits."""

from __future__ import annotations

import os
import random
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest
import zmq

import clasp
from clasp.core import protocol
from clasp.runtime.client import AuthError, ClaspError
from clasp.runtime.security import Keys, KeysError, Security, add_client, init_keys
from tests.conftest import start_cluster, wait_for, wordcount_dag


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 2)
    yield c
    c.stop()


def metric(url: str, name: str, **labels) -> float:
    text = urllib.request.urlopen(url).read().decode()
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}\{{{re.escape(sel)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _clasp(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if k != "CLASP_KEYS"}
    return subprocess.run([sys.executable, "-m", "clasp", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_cluster_is_secure_by_default(cluster):
    info = cluster.info()
    assert info["keys"] and Keys(info["keys"]).dir == cluster.keys_dir
    with clasp.connect(cluster.planner) as c:  # the keys of a cluster this process started: no extra step
        assert c.keys is not None
        job = c.submit(wordcount_dag("secure"))
        job.push(["a b", "a"])
        job.wait_idle(30)
        assert job.state("count") == {"a": 2, "b": 1}
        job.cancel()
    # The same with the directory given explicitly, as another process would.
    with clasp.connect(cluster.planner, keys=info["keys"]) as c:
        assert c.jobs() == []


def test_key_files_are_private_and_open_ones_are_refused(tmp_path):
    d = init_keys(tmp_path / "keys")
    for f in [*d.glob("public/*"), *d.glob("private/*")]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE((d / "private").stat().st_mode) == 0o700
    secret = d / "private" / "server.key_secret"
    secret.chmod(0o644)
    with pytest.raises(KeysError, match="can be read by its group or others"):
        _ = Keys(d).server_pair
    r = _clasp("planner", "--port", "0", "--keys", str(d))
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr
    secret.chmod(0o600)
    (d / "private" / "client.key_secret").chmod(0o640)
    with pytest.raises(KeysError):
        _ = Keys(d).client_pair
    (d / "private" / "client.key_secret").chmod(0o600)
    client_public = Keys(d).client_pair[0]
    assert client_public in Keys(d).allowed()
    (d / "public" / "client.key").chmod(0o666)  # an allow-list entry others could write: not trusted
    assert client_public not in Keys(d).allowed()
    with pytest.raises(KeysError, match="already holds keys"):
        init_keys(d)


def test_binding_a_wildcard_without_keys_exits_2(tmp_path):
    for cmd in (["planner", "--host", "0.0.0.0", "--port", "0"],
                ["worker", "--planner", "tcp://127.0.0.1:9", "--host", "0.0.0.0"]):
        r = _clasp(*cmd)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "clasp keys init" in r.stderr and "--insecure" in r.stderr
    r = _clasp("planner", "--port", "0", "--keys", str(tmp_path / "none"))
    assert r.returncode == 2 and "clasp keys init" in r.stderr


def test_plaintext_client_gets_a_clear_error_quickly(cluster):
    t0 = time.monotonic()
    with pytest.raises(AuthError, match="requires CURVE keys"):
        clasp.connect(cluster.planner, insecure=True, timeout=10)
    assert time.monotonic() - t0 < 5


def test_client_with_a_wrong_key_cannot_submit(cluster, tmp_path):
    # Another cluster's keys: the planner cannot even read its hello.
    other = init_keys(tmp_path / "other")
    t0 = time.monotonic()
    with pytest.raises(AuthError, match="another cluster's keys"):
        clasp.connect(cluster.planner, keys=other, timeout=10)
    assert time.monotonic() - t0 < 8
    # The right server key but a client key the planner does not allow: refused by ZAP.
    bundle = add_client(cluster.keys_dir, "alice")
    with clasp.connect(cluster.planner, keys=bundle) as c:
        assert c.jobs() == []  # allowed while its public key is in the cluster's directory
    before = metric(cluster.metrics["planner"], "clasp_auth_failures_total", socket="planner")
    (cluster.keys_dir / "public" / "alice.key").unlink()  # revoked, with no restart
    with pytest.raises(AuthError, match="refused this client's key"):
        c = clasp.connect(cluster.planner, keys=bundle, timeout=10)
        c.submit(wordcount_dag("intruder"))
    assert metric(cluster.metrics["planner"], "clasp_auth_failures_total", socket="planner") > before
    with clasp.connect(cluster.planner) as c:
        assert c.jobs() == []  # nothing was submitted


def test_worker_with_an_unknown_key_cannot_register(cluster, tmp_path):
    other = init_keys(tmp_path / "rogue")
    before = metric(cluster.metrics["planner"], "clasp_auth_failures_total", socket="planner")
    log = open(tmp_path / "rogue.log", "w")  # noqa: SIM115
    p = subprocess.Popen([sys.executable, "-m", "clasp", "worker", "--planner", cluster.planner, "--id", "rogue",
                          "--keys", str(other)], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert "rogue" in p.stdout.readline()  # it is up and dialling the planner
        wait_for(lambda: metric(cluster.metrics["planner"], "clasp_auth_failures_total", socket="planner") > before,
                 10, what="the planner to count the rogue worker's handshakes")
        time.sleep(2.5)  # a worker registers every 2 s
        with clasp.connect(cluster.planner) as c:
            assert "rogue" not in {w["id"] for w in c.workers()}
        assert p.poll() is None  # it keeps trying; it was never let in
    finally:
        p.terminate()
        p.wait(10)
        log.close()
    assert "CURVE handshake with the server failed" in (tmp_path / "rogue.log").read_text()
    assert cluster.alive()


def _endpoints(cluster) -> dict[str, list[str]]:
    with clasp.connect(cluster.planner) as c:
        workers = c.workers()
        job = c.submit(wordcount_dag("endpoints"), state="remote")
        state_server = job.info["state_server"]
        job.cancel()
    return {"planner": [cluster.planner], "planner_state": [state_server],
            "worker_data": [w["data"] for w in workers], "worker_state": [w["state"] for w in workers]}


def test_random_bytes_to_every_curve_socket_crash_nothing_and_are_counted(cluster):
    rng = random.Random(7)
    endpoints = _endpoints(cluster)
    urls = {"planner": [cluster.metrics["planner"]], "planner_state": [cluster.metrics["planner"]],
            "worker_data": cluster.metrics["workers"], "worker_state": cluster.metrics["workers"]}
    before = {name: [metric(u, "clasp_auth_failures_total", socket=name) for u in urls[name]] for name in endpoints}
    sends = 12
    for eps in endpoints.values():
        for ep in eps:
            host, port = ep.removeprefix("tcp://").rsplit(":", 1)
            for i in range(sends):
                s = socket.create_connection((host, int(port)), timeout=5)
                # Plain garbage, and garbage behind a valid ZMTP greeting asking for CURVE.
                head = b"\xff" + bytes(8) + b"\x7f\x03\x00CURVE" + bytes(47) if i % 2 else b""
                try:
                    s.sendall(head + rng.randbytes(rng.randint(1, 400)))
                    time.sleep(0.01)
                except OSError:
                    pass  # the peer may hang up first
                s.close()
    for name in endpoints:
        def counted(name=name):
            now = [metric(u, "clasp_auth_failures_total", socket=name) for u in urls[name]]
            return sum(now) - sum(before[name]) >= sends * len(endpoints[name])
        wait_for(counted, 10, what=f"the failed handshakes on {name} to be counted")
    assert cluster.alive() and not cluster.events
    with clasp.connect(cluster.planner) as c:
        job = c.submit(wordcount_dag("after-garbage"))
        job.push(["x y x"])
        job.wait_idle(30)
        assert job.state("count") == {"x": 2, "y": 1}
        job.cancel()


def _raw(cluster, ctx) -> zmq.Socket:
    s = Security(cluster.keys_dir).client(ctx.socket(zmq.DEALER))
    s.connect(cluster.planner)
    return s


def test_limits_hold_for_an_authenticated_client(cluster):
    big = os.urandom(9 << 20)

    def heavy(line):  # closes over 9 MiB: over the 8 MiB function payload limit
        return [len(big), line]

    dag = clasp.Dag("heavy")
    dag.operator("f", heavy)
    with clasp.connect(cluster.planner) as c, pytest.raises(ClaspError, match="maximum function payload"):
        c.submit(dag)
    # A client that skips its own check meets the planner's: an error reply, counted.
    ctx = zmq.Context()
    try:
        s = _raw(cluster, ctx)
        spec = dag.to_spec().pack()
        s.send(protocol.encode("submit", {"req": 1, "dag": spec}))
        assert s.poll(10_000)
        _, reply = protocol.decode(s.recv())
        assert not reply["ok"] and "maximum function payload" in reply["error"]
        s.close(0)
    finally:
        ctx.term()
    assert metric(cluster.metrics["planner"], "clasp_limit_rejections_total", limit="function_size") >= 1


def slow(x):
    time.sleep(0.3)
    return x


def test_a_client_pending_requests_are_bounded(cluster):
    from clasp.core.limits import LIMITS

    dag = clasp.Dag("slow")
    dag.operator("slow", slow)
    with clasp.connect(cluster.planner) as c:
        job = c.submit(dag)
        job.push(list(range(20)))
        ctx = zmq.Context()
        try:
            s = _raw(cluster, ctx)
            n = LIMITS.client_pending + 20
            for i in range(n):
                s.send(protocol.encode("wait_idle", {"req": i + 1, "job": job.id, "timeout": 30.0}))
            refused = 0
            deadline = time.monotonic() + 30
            while refused < 20 and time.monotonic() < deadline:
                if s.poll(1000):
                    _, reply = protocol.decode(s.recv())
                    if not reply["ok"]:
                        assert "CLASP_MAX_CLIENT_PENDING" in reply["error"]
                        refused += 1
            assert refused == 20
            s.close(0)
        finally:
            ctx.term()
        job.cancel()
    assert metric(cluster.metrics["planner"], "clasp_limit_rejections_total", limit="client_queue") >= 20
