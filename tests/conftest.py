"""One cluster fixture for the integration tests: real planner and worker processes on free ports."""

from __future__ import annotations

import time

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
