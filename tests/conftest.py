"""What both suites share: the cluster fixtures of tests/cluster/ (real planner and worker processes on free
ports), a word-count DAG and its input, and `wait_for`. tests/unit/ runs no planner or worker process
(tests/unit/conftest.py refuses to start one)."""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

import clasp
from clasp.local.cluster import LocalCluster


def start_cluster(tmp_path_factory, workers: int, **kw) -> LocalCluster:
    logs = tmp_path_factory.mktemp(f"cluster{workers}")
    return LocalCluster(workers=workers, port=0, log_dir=logs, **kw).start()


@pytest.fixture(scope="session")
def cluster1(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 1)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def cluster3(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 3)
    yield c
    c.stop()


@pytest.fixture
def client3(cluster3):
    with clasp.connect(cluster3.planner) as c:
        yield c


@pytest.fixture
def client1(cluster1):
    with clasp.connect(cluster1.planner) as c:
        yield c


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll until predicate() is truthy; returns its value or fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class WorkerSigkill:
    """A cluster of real processes (checkpoints every 0.3 s, a 0.2 s heartbeat) on which a test SIGKILLs one
    worker mid-job, with a client: `with WorkerSigkill(tmp_path_factory) as run:` submit on `run.client`, then
    `run.started(job, first_output)` (a checkpoint completed and the job produced something), `run.kill()` (a
    worker drawn with `seed`) and, once the test fed it what comes after the kill, `run.recovered(job)`."""

    def __init__(self, tmp_path_factory, workers: int = 3, seed: int = 2):
        self.cluster = start_cluster(tmp_path_factory, workers, planner_args=[
            "--no-autoscale", "--checkpoint-interval", "0.3", "--heartbeat", "0.2"])
        self.rng = random.Random(seed)
        self.client: clasp.Client | None = None

    def __enter__(self) -> WorkerSigkill:
        try:
            self.client = clasp.connect(self.cluster.planner)
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.client.close()
        finally:
            self.cluster.stop()

    def started(self, job, first_output: Callable[[], Any]) -> None:
        wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=30, what="a first checkpoint")
        wait_for(first_output, timeout=30, what="a first output")

    def kill(self) -> str:
        victim = self.rng.choice([w for w in self.client.workers() if w["alive"]])
        os.kill(victim["pid"], signal.SIGKILL)
        return victim["id"]

    def recovered(self, job) -> None:
        wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=30, what="the recovery")

    def kill_midway(self, job, first_output: Callable[[], Any], records: int, timeout: float = 120) -> None:
        """`started`, a kill while the job's `records` are not all done, `recovered`, and the job idle having
        read every record and lost none."""
        self.started(job, first_output)
        assert job.stats()["completed"] < records, "the input was done before the kill"
        self.kill()
        self.recovered(job)
        summary = job.wait_idle(timeout=timeout)
        assert summary["read"] == records and summary["lost"] == 0


def make_lines(n: int, seed: int, vocab: int = 20000) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(vocab)))  # Zipf-like, as word frequencies are
    return [" ".join(rng.choices(words, cum_weights=cum, k=rng.randint(10, 20))) for _ in range(n)]


def split(line):
    return line.split()


def count(state, word):
    return (state or 0) + 1, None


def wordcount_dag(name: str = "wordcount") -> clasp.Dag:
    dag = clasp.Dag(name)
    s = dag.operator("split", split)
    c = dag.operator("count", count, stateful=True, key=lambda w: w)
    s >> c
    return dag
