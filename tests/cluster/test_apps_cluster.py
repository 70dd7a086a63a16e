"""Every app on one shared 2-worker cluster gives exactly its expected answer for a small seeded input."""

from __future__ import annotations

import pytest

import clasp
from clasp.apps import APPS
from clasp.local.cluster import LocalCluster

# Small enough for the suite's budget, large enough that every operator, both workers and (for the
# keyed operators) many keys see traffic.
RECORDS = {"wc": 2000, "sd": 3000, "aa": 3000, "pl": 3000, "nwm": 1500, "etl": 600, "syn": 2000}


@pytest.fixture(scope="module")
def client2(tmp_path_factory):
    with LocalCluster(workers=2, port=0, log_dir=tmp_path_factory.mktemp("apps-cluster2")) as cl, \
            clasp.connect(cl.planner) as c:
        yield c


@pytest.mark.parametrize("name", list(APPS))
def test_app_on_two_workers_gives_its_expected_answer(client2, name):
    app = APPS[name]
    records = app.generate(RECORDS[name], seed=7)
    job = client2.submit(app.build_dag())
    # Small chunks so that several pushes interleave with processing, as in a paced run.
    assert job.push(records, chunk=250) == len(records)
    idle = job.wait_idle(60)
    assert idle["completed"] == len(records) and idle["lost"] == 0
    stats = job.stats(fresh=True)
    assert stats["failed"] == 0, stats["errors"]
    # Deployed on both workers: state() and collected() gather from each of them.
    assert len(stats["workers"]) == 2
    got, want = app.result(job), app.expected(records)
    assert want, f"{name}: the expected answer of the test input is empty"
    assert got == want
    job.cancel()
