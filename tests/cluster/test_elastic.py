"""The elastic pool with real processes: workers join running jobs, leave them on SIGTERM or `clasp drain`
with exact results, and the local provider starts and stops workers (docs/DEPLOY.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import clasp
from clasp.apps import wc
from clasp.core.pool import PoolConfig, PoolState, demand, max_pool, pool_wish, update_idle
from clasp.runtime.providers import KubernetesProvider
from tests.conftest import start_cluster, wait_for


def start_worker(cluster, wid: str, log_dir) -> subprocess.Popen:
    """A worker started by hand after the cluster, as on another host: `clasp worker --planner ADDR`."""
    args = [sys.executable, "-m", "clasp", "worker", "--planner", cluster.planner, "--id", wid,
            *(["--keys", str(cluster.keys_dir)] if cluster.keys_dir else ["--insecure"])]
    err = open(log_dir / f"{wid}.log", "ab")  # noqa: SIM115
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    return p


def processed_on(job, wid: str) -> int:
    row = job.stats(fresh=True)["workers"].get(wid) or {}
    return sum(o["processed"] for o in (row.get("counters") or {}).get("operators", {}).values())


# ----------------------------------------------------------------- pure decisions
def test_pool_wish_asks_for_demand_and_releases_idle_workers_after_the_cooldown():
    cfg = PoolConfig(min_workers=1, max_workers=4, cooldown=10)
    st = PoolState()
    assert demand(cfg, 3, 1) == 3 and demand(cfg, 9, 1) == 4 and demand(cfg, 1, 2) is None
    assert demand(PoolConfig(), 3, 1) is None and max_pool(PoolConfig(), 2) == 2 and max_pool(cfg, 2) == 4
    st.demands[1] = 3
    assert pool_wish(cfg, st, ["w0"], 0.0).workers == 3
    st.demands.clear()
    update_idle(st, ["w0", "w1", "w2"], {"w0"}, 0.0)
    assert pool_wish(cfg, st, ["w0", "w1", "w2"], 5.0).release == ()
    update_idle(st, ["w0", "w1", "w2"], {"w0"}, 5.0)  # still idle: the clock keeps its start
    wish = pool_wish(cfg, st, ["w0", "w1", "w2"], 10.0)
    assert wish.release == ("w2", "w1") and wish.workers == 1
    assert pool_wish(PoolConfig(min_workers=2, max_workers=4, cooldown=10), st, ["w0", "w1", "w2"], 10.0
                     ).release == ("w2",)
    assert pool_wish(PoolConfig(), st, ["w0", "w1", "w2"], 99.0).release == ()  # static: nothing given back


def test_kubernetes_provider_releases_only_the_top_ordinals():
    k = KubernetesProvider(PoolConfig(1, 4))
    live = ["clasp-worker-0", "clasp-worker-1", "clasp-worker-2", "clasp-worker-3"]
    assert k.restrict(live, ["clasp-worker-3", "clasp-worker-2"]) == ("clasp-worker-3", "clasp-worker-2")
    assert k.restrict(live, ["clasp-worker-1"]) == ()  # the StatefulSet would remove 3 and 2 first
    assert k.release_order(live)["clasp-worker-3"] == 3


# ----------------------------------------------------------------- join
def test_a_worker_started_after_submission_receives_work_after_scale(tmp_path_factory, tmp_path):
    cluster = start_cluster(tmp_path_factory, 1, planner_args=["--no-autoscale"])
    late = None
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(wc.build_dag(), autoscale=False)
            first = wc.generate(5_000, seed=1)
            job.push(first)
            job.wait_idle(timeout=60)
            late = start_worker(cluster, "late", tmp_path)
            wait_for(lambda: "late" in job.stats()["workers"], timeout=30, what="the late worker joining the job")
            record = job.scale(2)
            assert record["to_workers"] == 2 and "late" in job.stats()["active_workers"], record
            second = wc.generate(20_000, seed=2)
            job.push(second)
            job.wait_idle(timeout=60)
            assert processed_on(job, "late") > 0
            assert job.state("count") == wc.expected(first + second)
            assert job.stats()["lost"] == 0
    finally:
        if late is not None:
            late.kill()
            late.wait()
        cluster.stop()


# ----------------------------------------------------------------- leave
def test_sigterm_mid_run_drains_the_worker_exact_results_and_exit_zero(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(wc.build_dag(), autoscale=False)
            job.scale(3)
            lines = wc.generate(150_000, seed=5)
            pushed = threading.Thread(target=job.push, args=(lines,))
            pushed.start()
            wait_for(lambda: job.stats()["completed"] > 20_000, timeout=60, what="the job under way")
            victim = cluster.procs[3]
            assert cluster.worker_ids[2] == "w2"
            victim.send_signal(signal.SIGTERM)
            assert victim.wait(timeout=60) == 0
            pushed.join()
            job.wait_idle(timeout=120)
            stats = job.stats()
            assert stats["lost"] == 0 and stats["completed"] == len(lines)
            assert "w2" not in stats["active_workers"] and "w2" not in stats["workers"]
            assert any("drained" in m["reason"] for m in stats["migrations"])
            assert job.state("count") == wc.expected(lines)
            assert "w2" not in {w["id"] for w in client.workers()}
    finally:
        cluster.stop()


def test_clasp_drain_moves_a_worker_off_and_it_exits_zero(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(wc.build_dag(), autoscale=False)
            job.scale(2)
            lines = wc.generate(20_000, seed=7)
            job.push(lines)
            job.wait_idle(timeout=60)
            env = {**os.environ, "CLASP_KEYS": str(cluster.keys_dir)}
            out = subprocess.run([sys.executable, "-m", "clasp", "drain", "w1", "--planner", cluster.planner],
                                 capture_output=True, text=True, timeout=120, env=env)
            assert out.returncode == 0, out.stderr
            assert "w1 drained" in out.stdout
            assert cluster.procs[2].wait(timeout=30) == 0
            assert job.stats()["active_workers"] == ["w0"]
            assert job.state("count") == wc.expected(lines)
            # The last worker cannot be drained: refused, it keeps running.
            bad = subprocess.run([sys.executable, "-m", "clasp", "drain", "w0", "--planner", cluster.planner],
                                 capture_output=True, text=True, timeout=60, env=env)
            assert bad.returncode == 1 and "last worker" in bad.stderr
            assert cluster.procs[1].poll() is None
    finally:
        cluster.stop()


# ----------------------------------------------------------------- the local provider
def test_the_local_provider_takes_make_runs_job_from_one_worker_to_several_and_back(tmp_path):
    import json

    import pytest

    from clasp.local.cpulimit import available

    why = available()
    if why is not None:
        pytest.skip(f"make run's workers have CPU quotas: {why}")
    out = tmp_path / "run.json"
    # make run's command line (Makefile): one worker at the start, none started beforehand.
    r = subprocess.run([sys.executable, "-m", "clasp", "run", "wc", "--workers", "1", "--max-workers", "4",
                        "--cpu-per-worker", "0.3", "--profile", "gradual", "--max-rate", "20000",
                        "--json", str(out), "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    procs = [row["processes"] for row in doc["series"]]
    s = doc["summary"]
    assert procs[0] == 1 and max(procs) >= 3 and procs[-1] == 1, procs
    assert s["workers_max"] >= 3 and s["correct"] is True
    assert s["provider_started"] >= 2 and s["provider_stopped"] >= 2, s
    assert "provider: started worker" in r.stderr and "released" in r.stderr
