"""Live rescaling with records flowing: nothing lost, nothing twice, per-key order kept."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

import clasp
from clasp.apps import sd, wc
from tests.conftest import start_cluster

RESCALES = [1, 3, 2, 4, 1, 3, 4, 2, 1, 4, 3, 1]


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale"])
    yield c
    c.stop()


def push_while_rescaling(cluster, app, records, seed: int, chunk: int = 4000, pause: float = 0.0):
    """Push `records` from one client (`pause` s between chunks) while another rescales the job at random
    moments; returns the job, the migration records, fresh stats and the app's answer."""
    rng = random.Random(seed)
    with clasp.connect(cluster.planner) as pusher, clasp.connect(cluster.planner) as scaler:
        job = pusher.submit(app.build_dag())
        handle = scaler.job(job.id)
        done = threading.Event()
        errors = []

        def push():
            try:
                for i in range(0, len(records), chunk):
                    job.push(records[i:i + chunk])
                    time.sleep(pause)
            except Exception as e:  # surfaced by the assertion below
                errors.append(e)
            finally:
                done.set()

        t = threading.Thread(target=push)
        t.start()
        migrations = []
        for n in RESCALES:
            time.sleep(rng.uniform(0.05, 0.4))
            migrations.append(handle.scale(n))
            if done.is_set() and len(migrations) >= 10:
                break
        t.join()
        assert not errors, errors
        assert len(migrations) >= 10
        job.wait_idle(timeout=180)
        return job, migrations, job.stats(fresh=True), app.result(job)


def test_wordcount_300k_lines_survive_ten_rescales(cluster4):
    lines = wc.generate(300_000, seed=3)
    job, migrations, stats, answer = push_while_rescaling(cluster4, wc, lines, seed=1)
    assert answer == wc.expected(lines)
    words = sum(len(line.split()) for line in lines)
    assert stats["operators"]["split"]["processed"] == len(lines)
    assert stats["operators"]["count"]["processed"] == words  # every chained request exactly once
    assert stats["completed"] == len(lines) and stats["lost"] == 0 and stats["failed"] == 0
    assert all(not m["failed"] for m in migrations)
    assert [m["to_workers"] for m in migrations] == RESCALES[:len(migrations)]
    assert sum(m["objects"] for m in migrations) > 0 and sum(m["key_groups_moved"] for m in migrations) > 0
    assert len(stats["migrations"]) == len(migrations)


def test_spike_detection_keeps_per_key_order_across_rescales(cluster4):
    readings = sd.generate(60_000, seed=4)
    # Paced so that readings keep arriving through all the rescales.
    job, migrations, stats, answer = push_while_rescaling(cluster4, sd, readings, seed=2, chunk=1000, pause=0.05)
    assert answer == sd.expected(readings)
    assert stats["operators"]["moving_average"]["processed"] == len(readings)
    assert stats["operators"]["spike_detect"]["processed"] == len(readings)
    assert all(not m["failed"] for m in migrations)


def test_a_worker_dying_mid_migration_does_not_hang_the_planner(tmp_path_factory):
    # Without checkpoints: the migration waits out its timeout on the frozen worker (with checkpoints the
    # job rolls back instead, tests/cluster/test_recovery.py).
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale", "--dead-after", "1.5",
                                                               "--heartbeat", "0.2",
                                                               "--migration-timeout", "2",
                                                               "--checkpoint-interval", "0"])
    try:
        with clasp.connect(cluster.planner) as client:
            lines = wc.generate(20_000, seed=9)
            job = client.submit(wc.build_dag(), autoscale=False)
            job.push(lines[:10_000])
            job.wait_idle(60)
            victim = next(w for w in client.workers() if w["id"] == "w2")
            os.kill(victim["pid"], signal.SIGSTOP)  # frozen: it gets the plan and never answers
            try:
                t = time.monotonic()
                record = job.scale(2)
                assert time.monotonic() - t < 30
                assert "w2" in record["failed"]
                job.push(lines[10_000:])
                job.wait_idle(timeout=60)  # the cluster keeps serving on the workers that remain
                stats = job.stats()
                assert stats["lost_workers"] == ["w2"]
                assert "w2" not in stats["active_workers"] and stats["workers_alive"] == 2
                assert stats["completed"] + stats["lost"] == len(lines)
                assert any("w2 died" in d["reason"] for d in stats["decisions"])
                # Records pushed after the recovery are all counted: the survivors own every key group.
                before = job.state("count")
                job.push(["recovered recovered"])
                job.wait_idle(30)
                assert job.state("count")["recovered"] == before.get("recovered", 0) + 2
            finally:
                os.kill(victim["pid"], signal.SIGKILL)
    finally:
        cluster.stop()
