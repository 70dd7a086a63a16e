"""A worker SIGKILLed while its job runs.

With checkpoints (the default, `--checkpoint-interval 1`) the job rolls back to its last complete checkpoint
and replays its input: nothing is lost and the results are exact (tests/cluster/test_recovery.py has the chaos
test). With `--checkpoint-interval 0` the old contract holds: the dead worker's key groups restart empty
and the records that had requests on it are lost; every other record must finish, the loss must be
counted and reported, and `wait_idle` must return instead of waiting on records that can never complete.

Each cluster here declares a silent worker dead within 1-1.5 s; its heartbeat (`--heartbeat 0.2`) comes several
times within that, so a survivor held up for a moment on a busy machine is not taken for dead too.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections import Counter

import clasp
from clasp.apps import wc
from tests.conftest import start_cluster, wait_for


def test_a_killed_worker_costs_nothing_with_checkpoints(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale", "--dead-after", "1.5",
                                                               "--heartbeat", "0.2"],
                            restart_workers=False)
    try:
        with clasp.connect(cluster.planner) as client:
            lines = wc.generate(200_000, seed=11)
            job = client.submit(wc.build_dag(), autoscale=False)
            job.scale(3)
            victim = next(w for w in client.workers() if w["id"] == "w2")
            pushed = threading.Thread(target=job.push, args=(lines,))
            pushed.start()
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=30, what="a checkpoint")
            os.kill(victim["pid"], signal.SIGKILL)
            pushed.join()
            summary = job.wait_idle(timeout=90)
            stats = job.stats()
            assert summary == {"pushed": len(lines), "completed": len(lines), "lost": 0}
            assert stats["lost_workers"] == ["w2"] and "w2" not in stats["active_workers"]
            ck = stats["checkpoints"]
            assert ck["recoveries"] == 1 and ck["last_recovery"]["cause"] == "worker w2 died", ck
            assert job.state("count") == dict(wc.expected(lines))
            metrics = urllib.request.urlopen(cluster.metrics["planner"], timeout=5).read().decode()
            assert "clasp_recoveries_total 1.0" in metrics
            assert f"clasp_records_replayed_total {float(ck['replayed'])}" in metrics
            assert 'clasp_checkpoints_total{outcome="completed"}' in metrics
            assert "clasp_checkpoint_duration_seconds_bucket" in metrics and "clasp_checkpoint_bytes{" in metrics
    finally:
        cluster.stop()


def test_a_killed_worker_releases_its_window_and_the_job_finishes(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale", "--dead-after", "1.5",
                                                               "--heartbeat", "0.2",
                                                               "--max-inflight", "5000",
                                                               "--checkpoint-interval", "0"],
                            restart_workers=False)  # a restarted process would get the rows queued for it
    try:
        with clasp.connect(cluster.planner) as client:
            lines = wc.generate(200_000, seed=11)
            job = client.submit(wc.build_dag(), autoscale=False)
            job.scale(3)
            victim = next(w for w in client.workers() if w["id"] == "w2")
            # Frozen before the push, so records are surely queued on it when it dies: a push this fast
            # can finish before any wall-clock delay runs out, and then nothing would be lost.
            os.kill(victim["pid"], signal.SIGSTOP)
            pushed = threading.Thread(target=job.push, args=(lines,))
            pushed.start()
            wait_for(lambda: job.stats()["outstanding"] > 0, timeout=20, what="records held up on w2")
            os.kill(victim["pid"], signal.SIGKILL)
            pushed.join()
            t = time.monotonic()
            summary = job.wait_idle(timeout=90)
            assert time.monotonic() - t < 60
            stats = job.stats()
            assert summary["completed"] + summary["lost"] == len(lines)
            assert stats["completed"] + stats["lost"] == len(lines) and stats["outstanding"] == 0
            assert 0 < stats["lost"] < len(lines) // 2, stats["lost"]  # far more finished than was lost
            assert stats["lost_workers"] == ["w2"] and "w2" not in stats["active_workers"]
            lost = [e for e in stats["errors"] if "lost" in e["error"]]
            assert lost and lost[0]["worker"] == "w2" and f"{stats['lost']} records lost" in lost[0]["error"]
            metrics = urllib.request.urlopen(cluster.metrics["planner"], timeout=5).read().decode()
            assert f"clasp_records_lost_total {float(stats['lost'])}" in metrics
            # The survivors own every key group now: what is pushed next is counted exactly.
            before = job.state("count")
            more = wc.generate(5_000, seed=12)
            job.push(more)
            job.wait_idle(timeout=60)
            after = job.state("count")
            expected = Counter(before)
            expected.update(wc.expected(more))
            assert after == dict(expected)
            assert job.stats()["lost"] == stats["lost"]
    finally:
        cluster.stop()


def test_records_on_no_dead_worker_all_complete(tmp_path_factory):
    """The stateful counter lives on w0 only, the splitter on w0 and w1; w1 dies. Lines split on w1 are
    lost; every line split on w0 completes, and the counts are exactly those of the completed lines'
    words that the dead worker never touched."""
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--dead-after", "1.0",
                                                               "--heartbeat", "0.2",
                                                               "--checkpoint-interval", "0"])
    try:
        with clasp.connect(cluster.planner) as client:
            dag = clasp.Dag("tagged")
            seen = dag.operator("tag", lambda line: line)
            count = dag.operator("count", lambda s, line: ((s or 0) + 1, None), stateful=True,
                                 key=lambda line: line)
            seen >> count
            job = client.submit(dag, placement={"tag": {0: 0.5, 1: 0.5}, "count": {0: 1.0}}, autoscale=False)
            victim = next(w for w in client.workers() if w["id"] == "w1")
            os.kill(victim["pid"], signal.SIGSTOP)  # frozen first, so records queue on it and are lost
            lines = [f"line-{i}" for i in range(40_000)]
            job.push(lines)
            wait_for(lambda: job.stats()["lost_workers"] == ["w1"], timeout=20, what="w1 declared dead")
            os.kill(victim["pid"], signal.SIGKILL)
            summary = job.wait_idle(timeout=60)
            counts = job.state("count")
            assert summary["completed"] + summary["lost"] == len(lines)
            assert summary["lost"] > 0
            # No line was counted twice, every completed line was counted; records are lost a progress epoch at
            # a time (512 records of a push), so a lost epoch's lines that ran before the death may be in it.
            assert set(counts.values()) == {1}
            assert summary["completed"] <= len(counts) < summary["completed"] + summary["lost"]
    finally:
        cluster.stop()
