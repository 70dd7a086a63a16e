"""Every Nexmark query on a real 2-worker cluster (`clasp.bench.nexmark_cluster`): events in files read by the
workers in event time, each query's stages as windows, joins and timers, its answer exactly the reference's."""

from __future__ import annotations

import pytest

import clasp
from clasp.apps import nexmark as nx
from clasp.bench.nexmark_cluster import answer_operator, query_dag, reference, rows, write_events
from tests.conftest import start_cluster

EVENTS = 20_000


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    evs = nx.generate(EVENTS, 7)
    return evs, write_events(evs, tmp_path_factory.mktemp("nexmark"))


@pytest.mark.parametrize("query", ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8"])
def test_every_nexmark_query_on_two_workers_equals_the_reference(cluster2, events, query):
    evs, pattern = events
    want = reference(query, evs)
    assert want, "the query has an answer on these events"
    with clasp.connect(cluster2.planner) as client:
        job = client.submit(query_dag(query, pattern), autoscale=False)
        assert job.wait_idle(timeout=120)["read"] == len(evs)
        assert rows(query, job.collected(answer_operator(query))) == want
        assert job.stats()["event_time"]["late"] == 0
        job.cancel()
