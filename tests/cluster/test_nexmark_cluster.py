"""Every Nexmark query on a real 2-worker cluster (`clasp.bench.nexmark_cluster`): events in files read by the
workers in event time, each query's stages as windows, joins and timers, its answer exactly the reference's."""

from __future__ import annotations

import importlib.util
import time

import pytest

import clasp
from clasp.apps import nexmark as nx
from clasp.bench.nexmark_cluster import (
    SELECTED_KINDS,
    answer_operator,
    query_dag,
    reference,
    rows,
    run_bytewax_processes,
    run_clasp,
    write_events,
)
from clasp.testing import IterableSource
from tests.conftest import WorkerSigkill, start_cluster, wait_for

EVENTS = 20_000


def read(query: str, evs: list[dict]) -> int:
    """The events the query's source gives: those of the kinds it selects (Q3, Q8: the others are skipped
    undecoded), else all."""
    kinds = SELECTED_KINDS.get(query)
    return len(evs) if kinds is None else sum(e["kind"] in kinds for e in evs)


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
        assert job.wait_idle(timeout=120)["read"] == read(query, evs)
        assert rows(query, job.collected(answer_operator(query))) == want
        assert job.stats()["event_time"]["late"] == 0
        job.cancel()


@pytest.mark.skipif(importlib.util.find_spec("bytewax") is None, reason="Bytewax not installed (pip install .[peers])")
@pytest.mark.parametrize("query", ["q5", "q8"])
def test_bytewax_as_two_processes_reading_files_answers_exactly(events, query):
    """The bench's Bytewax side as two processes (`-i/-a`), each reading its files: the answer is the reference's
    and the CPU of both processes is counted."""
    evs, _ = events
    r = run_bytewax_processes(evs, query, 2, slack_ms=5000, files_per_process=4)
    assert r["exact"] and r["workers"] == 2 and r["cpu_s"] > 0


def test_the_bench_runs_clasp_after_an_untimed_warm_up_and_answers_exactly(events):
    """The bench's clasp side on its own cluster: the query once on a few events (untimed), then on all of them
    from 8 files a worker; the answer is the reference's and the planner's and workers' CPU is counted."""
    evs, _ = events
    r = run_clasp(evs, "q8", 2, files_per_worker=2)
    assert r["exact"] and r["read"] == read("q8", evs) < len(evs) and r["late"] == 0 and r["cpu_s"] > 0
    assert r["warm_up"]["events"] == read("q8", evs[:2000]) and r["warm_up"]["seconds"] > 0


def slow_date_time(e: dict):
    time.sleep(0.00005)  # the input lasts through a kill or a rescale
    return e["dateTime"]


@pytest.fixture
def q4_events():
    return nx.generate(60_000, 3)


def test_q4_exact_after_a_worker_sigkill(tmp_path_factory, q4_events):
    """Q4's auctions, their early bids, the timers that close them and the categories' sums are key-group state:
    a worker killed mid-input and the job rolled back to a checkpoint, the answer is still the reference's."""
    evs = q4_events
    with WorkerSigkill(tmp_path_factory) as run:
        job = run.client.submit(query_dag("q4", IterableSource(evs, partitions=6), slow_date_time), autoscale=False)
        run.kill_midway(job, lambda: job.collected("average"), len(evs), timeout=180)
        assert rows("q4", job.collected("average")) == reference("q4", evs)
        assert job.stats()["event_time"]["late"] == 0


def test_q4_exact_across_a_rescale_1_to_2(tmp_path_factory, q4_events):
    """Q4 on one worker, spread over two mid-input: the key groups that move carry their auctions' states and
    timers, and the answer is the reference's."""
    evs = q4_events
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    try:
        with clasp.connect(cluster.planner) as client:
            dag = query_dag("q4", IterableSource(evs, partitions=4), slow_date_time)
            one = {o.name: {0: 1.0} for o in dag.operators}
            job = client.submit(dag, placement=one)
            wait_for(lambda: job.collected("average"), timeout=60, what="a first closed auction")
            assert job.stats()["completed"] < len(evs), "the input was done before the rescale"
            moved = job.place({o.name: {0: 0.5, 1: 0.5} for o in dag.operators})  # half the key groups move
            assert not moved["failed"] and moved["key_groups_moved"] > 0 and moved["to_workers"] == 2
            summary = job.wait_idle(timeout=180)
            assert summary["read"] == len(evs)
            assert rows("q4", job.collected("average")) == reference("q4", evs)
            assert job.stats()["event_time"]["late"] == 0
    finally:
        cluster.stop()
