"""The two suites: tests/unit/ starts no planner or worker process (its conftest refuses), tests/cluster/ does."""

from __future__ import annotations

from pathlib import Path

import pytest

from clasp.local.cluster import LocalCluster
from tests.unit.conftest import _starts_a_clasp_process


def test_the_guard_knows_a_planner_or_worker_process_from_others():
    assert _starts_a_clasp_process(["python", "-m", "clasp", "planner", "--port", "0"])
    assert _starts_a_clasp_process(["/venv/bin/clasp", "worker", "--planner", "tcp://h:1"])
    assert not _starts_a_clasp_process(["python", "-m", "clasp.cli.place", "profile.json"])
    assert not _starts_a_clasp_process(["python", "-m", "clasp", "bench", "fig2"])
    assert not _starts_a_clasp_process(["lint-imports", "--no-cache"])


def test_a_unit_test_cannot_start_a_cluster():
    cluster = LocalCluster(workers=1, port=0, insecure=True)
    with pytest.raises(AssertionError, match="belongs in tests/cluster/"):
        cluster.start()
    assert not cluster.alive()


def test_every_test_file_is_in_one_of_the_two_suites():
    # `make test` runs tests/unit and tests/cluster: a test file beside them would never run there.
    tests = Path(__file__).resolve().parents[1]
    assert sorted(p.name for p in tests.glob("test_*.py")) == [], "move it to tests/unit/ or tests/cluster/"
