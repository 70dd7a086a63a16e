"""Operators that take a batch (`batch=True`) and keys that are the value (`key=clasp.identity`), on real
clusters, checked against counts made here."""

from __future__ import annotations

import collections

import pytest

import clasp
from clasp.apps import wc
from tests.conftest import wait_for


def split_all(lines):
    """A batch operator: every word of every line of the batch."""
    return [w for line in lines for w in wc.split(line)]


def count(state, word):
    return (state or 0) + 1, None


def first_seen(state, word):
    """Emits a word the first time its key group's owner sees it."""
    return True, (None if state else word)


def batch_dag() -> clasp.Dag:
    dag = clasp.Dag("batch-wc")
    s = dag.operator("split", split_all, batch=True)
    c = dag.operator("count", count, stateful=True, key=clasp.identity)
    n = dag.operator("new", first_seen, stateful=True, key=clasp.identity, collect=True)
    s >> c
    s >> n
    return dag


@pytest.mark.parametrize("n_workers", [1, 3])
def test_a_batch_operator_and_identity_keys_count_exactly(n_workers, request):
    client = request.getfixturevalue(f"client{n_workers}")
    lines = wc.generate(30_000, seed=5)
    expected = collections.Counter(w for line in lines for w in wc.split(line))
    job = client.submit(batch_dag(), autoscale=False)
    if n_workers > 1:
        job.scale(n_workers)
    job.push(lines)
    idle = job.wait_idle(timeout=120)
    assert idle["completed"] == len(lines) and idle["lost"] == 0
    assert job.state("count") == dict(expected)
    assert sorted(job.collected("new")) == sorted(expected)  # each distinct word once
    stats = job.stats(fresh=True)
    assert stats["operators"]["split"]["processed"] == len(lines)
    assert stats["operators"]["count"]["processed"] == sum(expected.values())
    job.cancel()


def explode(values):
    if any(v < 0 for v in values):
        raise ValueError("a negative value in the batch")
    return [v * 10 for v in values]


def test_a_failing_batch_is_an_operator_error_and_its_records_complete(client1):
    dag = clasp.Dag("batch-fail")
    e = dag.operator("explode", explode, batch=True)
    s = dag.operator("sum", lambda st, v: ((st or 0) + v, None), stateful=True, key=lambda v: v % 7)
    e >> s
    job = client1.submit(dag, autoscale=False)
    job.push(list(range(1000)))
    assert job.wait_idle(timeout=60)["completed"] == 1000
    total = sum(job.state("sum").values())
    assert total == sum(v * 10 for v in range(1000))
    job.push([-1])
    assert job.wait_idle(timeout=60)["completed"] == 1001
    assert job.stats(fresh=True)["failed"] == 1
    # errors reach the planner with the next heartbeat
    wait_for(lambda: any("negative value" in err["error"] for err in job.stats()["errors"]), timeout=10,
             what="the batch's error reported")
    assert sum(job.state("sum").values()) == total  # the failed batch changed nothing
    job.cancel()


def test_batch_is_for_stateless_synchronous_operators():
    dag = clasp.Dag("bad")
    with pytest.raises(clasp.DagError, match="batch=True"):
        dag.operator("c", count, stateful=True, key=clasp.identity, batch=True)

    async def slow(values):
        return values

    with pytest.raises(clasp.DagError, match="batch=True"):
        dag.operator("a", slow, batch=True)
    assert clasp.identity("x") == "x"


def test_run_local_runs_batch_operators_with_the_same_answers():
    from clasp.testing import run_local

    lines = wc.generate(2_000, seed=9)
    expected = collections.Counter(w for line in lines for w in wc.split(line))
    job = run_local(batch_dag(), lines)
    assert job.state("count") == dict(expected)
    assert sorted(job.collected("new")) == sorted(expected)
    assert job.processed["split"] == len(lines)
