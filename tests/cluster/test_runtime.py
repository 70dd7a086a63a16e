"""The runtime end to end: real processes, real sockets, exact answers."""

from __future__ import annotations

import asyncio
import collections
import urllib.request

import pytest

import clasp
from clasp.runtime.client import ClaspError, ClaspTimeout
from tests.conftest import count, make_lines, split, wordcount_dag


@pytest.mark.parametrize("n_workers", [1, 3])
def test_wordcount_100k_lines_exact(n_workers, request):
    client = request.getfixturevalue(f"client{n_workers}")
    lines = make_lines(100_000, seed=7)
    expected = collections.Counter(w for line in lines for w in line.split())
    job = client.submit(wordcount_dag(), autoscale=False)
    assert job.push(lines) == 100_000
    idle = job.wait_idle(timeout=120)
    assert idle["completed"] == 100_000
    assert job.state("count") == dict(expected)
    stats = job.stats(fresh=True)
    assert stats["operators"]["split"]["processed"] == 100_000
    assert stats["operators"]["count"]["processed"] == sum(expected.values())
    assert stats["failed"] == 0 and stats["outstanding"] == 0
    assert stats["latency"]["count"] == 100_000 and stats["latency"]["p99"] > 0
    if n_workers == 3:
        # Every worker took part: the placement spreads both operators and the key groups.
        keys = [w["counters"]["operators"]["count"]["keys"] for w in stats["workers"].values()]
        assert len(keys) == 3 and all(k > 0 for k in keys) and sum(keys) == len(expected)
    job.cancel()


def test_dag_defined_in_the_test_with_closures_async_and_collect(client3):
    threshold = 50  # captured by value in the closure below

    async def double(v):
        await asyncio.sleep(0)
        return [v, v]

    def big(v):
        return v if v >= threshold else None

    def running_max(state, v):
        new = max(state or 0, v)
        return new, [v % 7, new]

    dag = clasp.Dag("inline")
    a = dag.operator("double", double)
    b = dag.operator("big", big, collect=True)
    m = dag.operator("max", running_max, stateful=True, key=lambda v: v % 7)
    a >> b >> m
    job = client3.submit(dag)
    job.push(range(100))
    job.wait_idle(60)
    assert sorted(job.collected("big")) == sorted([v for v in range(100) for _ in (0, 1) if v >= threshold])
    assert job.state("max") == {k: max(v for v in range(threshold, 100) if v % 7 == k) for k in range(7)}
    job.cancel()


def test_explicit_placement_every_chained_request_remote(client3):
    n_ops = 6
    dag = clasp.Dag("chain")
    ops = [dag.operator(f"op{i}", lambda v, i=i: v + i) for i in range(n_ops - 1)]
    ops.append(dag.operator("sum", lambda s, v: ((s or 0) + v, None), stateful=True, key=lambda v: v % 3))
    for x, y in zip(ops, ops[1:], strict=False):
        x >> y
    job = client3.submit(dag, placement={f"op{i}": {i % 3: 1.0} for i in range(n_ops - 1)} | {"sum": {2: 1.0}})
    job.push(range(5000))
    job.wait_idle(60)
    shift = sum(range(n_ops - 1))
    expect = collections.Counter()
    for v in range(5000):
        expect[(v + shift) % 3] += v + shift
    assert job.state("sum") == dict(expect)
    stats = job.stats(fresh=True)
    remote = sum(w["counters"]["remote"] for w in stats["workers"].values())
    assert remote == 5000 * (n_ops - 1)  # op(i) -> op(i+1) always crosses workers; the planner's is not chained
    job.cancel()


def test_operator_that_raises_is_recorded_and_the_job_goes_on(client1, cluster1):
    def picky(v):
        if v % 10 == 0:
            raise ValueError(f"no multiples of ten: {v}")
        return v

    dag = clasp.Dag("picky")
    p = dag.operator("picky", picky)
    s = dag.operator("sum", lambda s, v: ((s or 0) + v, None), stateful=True, key=lambda v: 0)
    p >> s
    job = client1.submit(dag)
    job.push(range(1000))
    job.wait_idle(60)
    assert job.state("sum") == {0: sum(v for v in range(1000) if v % 10)}
    stats = job.stats(fresh=True)
    assert stats["failed"] == 100
    assert stats["operators"]["picky"]["errors"] == 100
    from tests.conftest import wait_for

    errors = wait_for(lambda: job.stats()["errors"], what="error samples in stats")
    assert "ValueError: no multiples of ten" in errors[0]["error"] and errors[0]["operator"] == "picky"
    text = urllib.request.urlopen(cluster1.metrics["workers"][0]).read().decode()
    assert f'clasp_operator_errors_total{{job="{job.id}",operator="picky"}} 100.0' in text
    job.cancel()


def test_state_that_msgpack_cannot_carry_is_named(client1):
    class Opaque:
        pass

    dag = clasp.Dag("opaque")
    dag.operator("keep", lambda s, v: (Opaque() if v == 3 else v, None), stateful=True, key=lambda v: f"k{v}")
    job = client1.submit(dag)
    job.push(range(5))
    job.wait_idle(30)
    with pytest.raises(ClaspError, match=r"key 'k3' is a Opaque, which is not msgpack-serializable"):
        job.state("keep")
    job.cancel()


def test_records_that_msgpack_cannot_carry_are_refused(client1):
    dag = clasp.Dag("refuse")
    dag.operator("id", lambda v: v)
    job = client1.submit(dag)
    with pytest.raises(ClaspError, match="object of type set|not msgpack-serializable"):
        job.push([1, {1, 2}])
    job.cancel()


def test_malformed_dags_raise_before_anything_is_sent():
    dag = clasp.Dag("bad")
    a = dag.operator("a", split)
    b = dag.operator("b", split)
    a >> b
    with pytest.raises(clasp.DagError, match="cycle"):
        b >> a
    with pytest.raises(clasp.DagError, match="two operators named 'a'"):
        dag.operator("a", split)
    with pytest.raises(clasp.DagError, match="stateful but has no key"):
        dag.operator("c", count, stateful=True)
    with pytest.raises(clasp.DagError, match="not callable"):
        dag.operator("d", 42)
    other = clasp.Dag("other")
    x = other.operator("x", split)
    with pytest.raises(clasp.DagError, match="belongs to dag 'other'"):
        dag.edge(a, x)
    with pytest.raises(clasp.DagError, match="no operators"):
        clasp.Dag("empty").to_spec()


def test_no_planner_fails_within_the_timeout():
    import socket
    import time

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(ClaspTimeout, match=f"no clasp planner answers at tcp://127.0.0.1:{port}"):
        clasp.connect(f"tcp://127.0.0.1:{port}", timeout=1.0)
    assert time.monotonic() - t < 3.0


def test_wait_idle_times_out_with_a_clear_error(client1):
    import time

    def slow(v):
        time.sleep(0.05)
        return None

    dag = clasp.Dag("slow")
    dag.operator("slow", slow)
    job = client1.submit(dag)
    job.push(range(60))
    with pytest.raises(ClaspTimeout, match="still has .* records in flight"):
        job.wait_idle(timeout=1.0)
    job.wait_idle(timeout=60)
    job.cancel()


WORKER_METRICS = ["clasp_worker_queue_length", 'clasp_chained_requests_total{kind="local"}',
                  'clasp_chained_requests_total{kind="remote"}', "clasp_remote_destinations",
                  "clasp_requests_processed_total", "clasp_execution_seconds_bucket", "clasp_execution_seconds_sum",
                  "clasp_edge_requests_total", "clasp_operator_errors_total", "clasp_bad_messages_total",
                  "clasp_worker_cpu_seconds_total", "clasp_worker_cpu_rate", "clasp_worker_cpu_bound",
                  "clasp_worker_cpu_quota"]
PLANNER_METRICS = ["clasp_planner_queue_length", "clasp_input_rate", "clasp_throughput", "clasp_workers_alive",
                   "clasp_end_to_end_latency_seconds_bucket", "clasp_end_to_end_latency_seconds_count"]


def test_every_listed_prometheus_name_is_served(client3, cluster3):
    job = client3.submit(wordcount_dag("metrics"))
    job.push(make_lines(500, seed=3))
    job.wait_idle(60)
    planner = urllib.request.urlopen(cluster3.metrics["planner"]).read().decode()
    for name in PLANNER_METRICS:
        assert name in planner, name
    assert "clasp_workers_alive 3.0" in planner
    for url in cluster3.metrics["workers"]:
        text = urllib.request.urlopen(url).read().decode()
        for name in WORKER_METRICS:
            assert name in text, (url, name)
        assert f'clasp_edge_requests_total{{dst="count",job="{job.id}",src="split"}}' in text
        cpu = next(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("clasp_worker_cpu_seconds_total "))
        assert cpu > 0
    job.cancel()
