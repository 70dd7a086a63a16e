"""Process failures: a worker's crash does not take the cluster down, and a client whose planner is gone
fails within seconds instead of waiting out its timeout. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import clasp
from clasp.apps import wc
from clasp.local.cluster import LocalCluster, RestartPolicy, describe_exit, restart_delay
from clasp.runtime.client import PlannerUnavailable
from tests.conftest import wait_for

# ----------------------------------------------------------------------------- the restart decision (pure)
POLICY = RestartPolicy(max_restarts=3, window=60.0, backoff=1.0, max_backoff=3.0)


def test_the_first_restart_is_immediate_and_later_ones_back_off():
    assert restart_delay([], 100.0, POLICY) == 0.0
    assert restart_delay([99.0], 100.0, POLICY) == 1.0
    assert restart_delay([98.0, 99.0], 100.0, POLICY) == 2.0
    capped = RestartPolicy(max_restarts=10, backoff=1.0, max_backoff=3.0)
    assert restart_delay([90.0, 95.0, 98.0, 99.0], 100.0, capped) == 3.0


def test_a_crash_loop_is_left_down_and_old_restarts_are_forgotten():
    assert restart_delay([97.0, 98.0, 99.0], 100.0, POLICY) is None  # 3 restarts within the minute
    assert restart_delay([30.0, 98.0, 99.0], 100.0, POLICY) == 2.0  # one of them was over a minute ago
    assert restart_delay([1.0, 2.0, 3.0], 100.0, POLICY) == 0.0
    assert restart_delay([], 0.0, RestartPolicy(max_restarts=0)) is None


def test_exits_are_described_by_code_or_signal():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(0) == "exited with code 0"


class _Exited:
    """What the supervisor reads of a worker process that has exited."""

    def __init__(self, pid: int, code: int):
        self.pid, self.returncode, self.stdout = pid, code, None


def test_the_supervisor_backs_off_gives_up_on_a_crash_loop_and_leaves_clean_exits_down():
    cl = LocalCluster(workers=2, restart_policy=RestartPolicy(max_restarts=2, window=60.0, backoff=1.0))
    cl.worker_ids = ["w0", "w1"]
    due, down = {}, set()
    cl._on_worker_exit(0, _Exited(10, -signal.SIGKILL), due, down, 100.0)
    assert due == {0: 100.0} and cl.events[-1]["action"] == "restart"
    assert cl.events[-1]["message"].startswith("worker w0 (pid 10) was killed by SIGKILL; the planner and the "
                                               "other workers keep running; restarting it")
    cl._restarts["w0"] = [100.0]
    due.clear()
    cl._on_worker_exit(0, _Exited(11, 1), due, down, 101.0)
    assert due == {0: 102.0} and cl.events[-1]["message"].endswith("restarting it in 1 s")
    cl._restarts["w0"].append(102.0)
    due.clear()
    cl._on_worker_exit(0, _Exited(12, 1), due, down, 103.0)
    assert not due and down == {0} and cl.events[-1]["action"] == "give up"
    assert "restarted 2 times within 60 s: leaving it down" in cl.events[-1]["message"]
    cl._on_worker_exit(1, _Exited(13, 0), due, down, 104.0)  # a clean exit: stopped on purpose
    assert not due and down == {0, 1} and cl.events[-1]["action"] == "down"
    off = LocalCluster(workers=1, restart_workers=False)
    off.worker_ids = ["w0"]
    off._on_worker_exit(0, _Exited(14, -signal.SIGSEGV), due, down, 105.0)
    assert not due and off.events[-1]["action"] == "down" and "--no-restart-workers" in off.events[-1]["message"]


# ----------------------------------------------------------------------------- a worker dies
def _pids(client) -> dict[str, int]:
    return {w["id"]: w["pid"] for w in client.workers() if w["alive"]}


def test_a_killed_worker_is_restarted_and_the_cluster_runs_a_new_job_exactly(tmp_path):
    # A worker's death under load: Word Count scaled to 3 workers, 200,000 lines pushed, one worker SIGKILLed 1 s later.
    with LocalCluster(workers=3, port=0, log_dir=tmp_path) as cluster, clasp.connect(cluster.planner) as client:
        planner = cluster.procs[0]
        before = _pids(client)
        job = client.submit(wc.build_dag())
        job.scale(3)
        job.push(wc.generate(200_000, seed=5))
        time.sleep(1.0)
        os.kill(before["w1"], signal.SIGKILL)
        # The restarted process re-registers under the same id; the planner takes it as alive.
        after = wait_for(lambda: (p := _pids(client)).get("w1") not in (None, before["w1"]) and p, timeout=40,
                         what="w1 restarted and registered again")
        assert planner.poll() is None
        assert {w: after[w] for w in ("w0", "w2")} == {w: before[w] for w in ("w0", "w2")}
        assert all(p.poll() is None for p in cluster.procs)
        died = [e for e in cluster.events if e.get("process") == "w1" and e["action"] == "restart"]
        assert died and died[0]["pid"] == before["w1"] and died[0]["code"] == -signal.SIGKILL
        assert "worker w1 (pid" in died[0]["message"] and "killed by SIGKILL" in died[0]["message"]
        assert any(e["action"] == "restarted" and e["pid"] == after["w1"] for e in cluster.events)
        # The job that lost the worker: its answer is not checked here (its lost records are another matter),
        # but the restarted worker is in it again, holding nothing, and answers for it.
        stats = wait_for(lambda: (s := _fresh_stats(job)) and "counters" in s["workers"]["w1"] and s, timeout=30,
                         what="the old job's counters from every worker, the restarted one included")
        assert "counters" in stats["workers"]["w1"] and stats["lost_workers"] == ["w1"]
        job.cancel()
        # A new job on all three workers, the restarted one included, gets the exact answer.
        _exact_on_three(client, seed=6)
        # Again, and this time the worker cannot have its old ports back (as if another process took them):
        # it binds free ones, and the planner and its peers follow it to its new address.
        data = {w["id"]: w["data"] for w in client.workers()}
        cluster._pinned["w1"] = []
        os.kill(after["w1"], signal.SIGKILL)
        wait_for(lambda: _pids(client).get("w1") not in (None, after["w1"]), timeout=40,
                 what="w1 restarted a second time")
        moved = {w["id"]: w["data"] for w in client.workers()}
        assert moved["w1"] != data["w1"] and {w: moved[w] for w in ("w0", "w2")} == {w: data[w] for w in ("w0", "w2")}
        assert sum(e["action"] == "restarted" for e in cluster.events) == 2
        _exact_on_three(client, seed=7)


def _fresh_stats(job) -> dict | None:
    try:
        return job.stats(fresh=True)
    except clasp.ClaspError:
        return None


def _exact_on_three(client, seed: int) -> None:
    lines = wc.generate(20_000, seed=seed)
    job = client.submit(wc.build_dag(), autoscale=False)
    assert sorted(job.info["workers"]) == ["w0", "w1", "w2"]
    job.push(lines)
    assert job.wait_idle(timeout=90)["completed"] == len(lines)
    assert job.state("count") == wc.expected(lines)
    stats = job.stats(fresh=True)
    assert stats["lost"] == 0 and stats["failed"] == 0
    keys = {w: s["counters"]["operators"]["count"]["keys"] for w, s in stats["workers"].items()}
    assert set(keys) == {"w0", "w1", "w2"} and all(k > 0 for k in keys.values())
    job.cancel()


def test_clasp_cluster_logs_a_dead_worker_keeps_running_and_stops_when_the_planner_dies(tmp_path):
    info = tmp_path / "info.json"
    p = subprocess.Popen([sys.executable, "-m", "clasp", "cluster", "--workers", "2", "--port", "0",
                          "--info", str(info), "--log-dir", str(tmp_path / "logs")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
    reader.start()
    try:
        wait_for(info.exists, timeout=40, what="the cluster's --info file")
        published = json.loads(info.read_text())
        planner = published["planner"]
        with clasp.connect(planner, keys=published["keys"]) as client:
            before = _pids(wait_for(lambda: len(_pids(client)) == 2 and client, what="two workers"))
            os.kill(before["w0"], signal.SIGKILL)
            wait_for(lambda: _pids(client).get("w0") not in (None, before["w0"]), timeout=40,
                     what="w0 restarted and registered again")
            workers = _pids(client)
            assert p.poll() is None and workers["w1"] == before["w1"]
            planner_pid = next(x for x in _children(p.pid) if x not in workers.values())
        os.kill(planner_pid, signal.SIGKILL)
        assert p.wait(timeout=20) == 1
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    reader.join(5)
    text = "".join(lines)
    assert f"worker w0 (pid {before['w0']}) was killed by SIGKILL" in text
    assert "restarting it" in text and "worker w0 restarted" in text
    assert f"the planner (pid {planner_pid}) was killed by SIGKILL" in text and "stopping every process" in text
    assert "a process exited; stopping the rest" not in text


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


# ----------------------------------------------------------------------------- the planner dies
def _slow(v):
    time.sleep(0.05)


def test_calls_fail_fast_when_the_planner_is_killed(tmp_path):
    cluster = LocalCluster(workers=1, port=0, log_dir=tmp_path).start()
    try:
        with clasp.connect(cluster.planner) as client:
            dag = clasp.Dag("slow")
            dag.operator("slow", _slow)
            job = client.submit(dag, autoscale=False)
            # A long call on a live planner does not trip anything: 100 records take ~5 s, past the
            # client's liveness window and heartbeat timeout.
            job.push(range(100))
            t = time.monotonic()
            assert job.wait_idle(timeout=60)["completed"] == 100
            assert time.monotonic() - t > 3.0
            job.push(range(2000))  # ~100 s of work
            killed = []

            def kill():
                time.sleep(1.0)
                killed.append(time.monotonic())
                cluster.procs[0].send_signal(signal.SIGKILL)

            threading.Thread(target=kill, daemon=True).start()
            with pytest.raises(PlannerUnavailable, match=f"wait_idle: the clasp planner at {cluster.planner} has "
                                                         "gone away"):
                job.wait_idle(timeout=60)
            assert time.monotonic() - killed[0] < 3.0
            for call in (job.stats, lambda: job.state("slow"), lambda: job.push(range(10)), client.workers):
                t = time.monotonic()
                with pytest.raises(PlannerUnavailable, match="has gone away"):
                    call()
                assert time.monotonic() - t < 3.0
        t = time.monotonic()
        with pytest.raises(PlannerUnavailable, match=f"no clasp planner answers at {cluster.planner}"):
            clasp.connect(cluster.planner)
        assert time.monotonic() - t < 3.0
        # The supervisor saw the planner go, said so, and stopped the rest.
        wait_for(lambda: not cluster.procs, timeout=15, what="the supervisor stopping the cluster")
        assert any(e.get("process") == "planner" and e["action"] == "stop" for e in cluster.events)
    finally:
        cluster.stop()


def test_a_frozen_planner_fails_calls_by_heartbeat(tmp_path):
    # SIGSTOP: the connection stays open but nothing answers, as with a host that went silent.
    cluster = LocalCluster(workers=1, port=0, log_dir=tmp_path).start()
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(wc.build_dag(), autoscale=False)
            planner = cluster.procs[0]
            planner.send_signal(signal.SIGSTOP)
            try:
                t = time.monotonic()
                with pytest.raises(PlannerUnavailable, match="has gone away"):
                    job.stats()
                assert time.monotonic() - t < 6.0
            finally:
                planner.send_signal(signal.SIGCONT)
    finally:
        cluster.stop()


def test_connecting_where_no_planner_listens_fails_fast():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(PlannerUnavailable, match=f"no clasp planner answers at tcp://127.0.0.1:{port}: nothing "
                                                 "accepted a connection"):
        clasp.connect(f"tcp://127.0.0.1:{port}")  # the default timeout is 10 s
    assert time.monotonic() - t < 3.0
    assert issubclass(PlannerUnavailable, clasp.ClaspError)


def test_a_cluster_whose_owner_is_sigkilled_does_not_outlive_it(tmp_path):
    """The planner and workers die with the process that started them (PR_SET_PDEATHSIG): a SIGKILLed
    `clasp run` or test leaves nothing running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    code = ("import sys, time; from clasp.local.cluster import LocalCluster; "
            "cl = LocalCluster(workers=2, port=0).start(); "
            f"open({str(pids)!r} + '.state', 'w').write(str(cl.state_dir)); "
            f"open({str(pids)!r} + '.keys', 'w').write(str(cl.keys_dir)); "
            f"open({str(pids)!r}, 'w').write(' '.join(str(p.pid) for p in cl.procs)); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()):
            assert time.monotonic() < deadline and owner.poll() is None, "the cluster did not start"
            time.sleep(0.1)
        children = [int(p) for p in pids.read_text().split()]
        assert len(children) == 3
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()

    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 15
    while any(running(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in children if running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running after their owner was SIGKILLed: {left}"

    # Its temporary state and keys directories outlived it; the next local cluster's start() sweeps them
    # away, and leaves alone one whose owner lives.
    from clasp.local.cluster import sweep_state_dirs, temporary_state_dir

    state = Path((tmp_path / "pids.state").read_text())
    keys = Path((tmp_path / "pids.keys").read_text()).parent  # its ephemeral CURVE keys: swept the same way
    assert state.is_dir() and keys.is_dir()
    live, fd = temporary_state_dir()
    try:
        removed = sweep_state_dirs()
        assert state in removed and not state.exists()
        assert keys in removed and not keys.exists()
        assert live not in removed and live.is_dir()
    finally:
        os.close(fd)
    assert live in sweep_state_dirs() and not live.exists()


def test_workers_start_beside_the_planner_and_a_port_taken_meanwhile_is_picked_again(tmp_path, monkeypatch):
    """The workers are started with the planner, on the port picked for it; when another process binds that
    port first, the planner exits and the cluster starts again on another port, and runs a job exactly."""
    import clasp.local.cluster as lc

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks = [taken.getsockname()[1]]
    real = lc._free_port
    monkeypatch.setattr(lc, "_free_port", lambda host, port=0: picks.pop(0) if picks and not port
                        else real(host, port))
    spawned = []
    real_spawn = LocalCluster._spawn

    def spawn(self, name, *a, **kw):
        spawned.append((name, self.planner))
        return real_spawn(self, name, *a, **kw)

    monkeypatch.setattr(LocalCluster, "_spawn", spawn)
    try:
        with LocalCluster(workers=2, port=0, log_dir=tmp_path) as cl:
            assert not picks and cl.planner != f"tcp://127.0.0.1:{taken.getsockname()[1]}"
            # Twice the planner and its two workers, the second time on the planner's announced endpoint.
            assert [n for n, _ in spawned] == ["planner", "worker-0", "worker-1"] * 2
            assert [p for _, p in spawned[-2:]] == [cl.planner] * 2
            with clasp.connect(cl.planner) as c:
                job = c.submit(wc.build_dag(), autoscale=False)
                job.push(["a b a", "b a"])
                job.wait_idle(timeout=60)
                assert job.state("count") == {"a": 3, "b": 2}
    finally:
        taken.close()
