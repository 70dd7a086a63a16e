"""run_local: the reference executor's semantics (fan-out, sources, state, collect, async, round trip)."""

import asyncio

import pytest

import clasp
from clasp.testing import outputs_of, run_local


def test_outputs_rule():
    assert outputs_of(None) == []
    assert outputs_of("ab") == ["ab"]
    assert outputs_of(b"ab") == [b"ab"]
    assert outputs_of({"a": 1}) == [{"a": 1}]
    assert outputs_of(3) == [3]
    assert outputs_of(2.5) == [2.5]
    assert outputs_of(True) == [True]
    assert outputs_of([1, 2]) == [1, 2]
    assert outputs_of((1, 2)) == [1, 2]
    assert outputs_of(x for x in "xy") == ["x", "y"]


def test_word_count_state_and_processed():
    dag = clasp.Dag("wc")
    split = dag.operator("split", lambda line: line.split())
    count = dag.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True, key=lambda w: w)
    split >> count
    job = run_local(dag, ["a b a", "b c", ""])
    assert job.state("count") == {"a": 2, "b": 2, "c": 1}
    assert job.processed == {"split": 3, "count": 5}
    assert set(job.tau_us) == {"split", "count"} and all(v >= 0 for v in job.tau_us.values())
    with pytest.raises(KeyError):
        job.state("split")
    with pytest.raises(KeyError):
        job.collected("count")


def test_every_output_reaches_every_successor_and_every_record_every_source():
    dag = clasp.Dag("fan")
    a = dag.operator("a", lambda v: [v, v * 10])
    b = dag.operator("b", lambda v: v + 1, collect=True)
    c = dag.operator("c", lambda v: -v, collect=True)
    dag.operator("src2", lambda v: str(v), collect=True)
    join = dag.operator("join", lambda v: v, collect=True)
    a >> b
    a >> c
    b >> join
    c >> join
    job = run_local(dag, [1, 2])
    assert job.collected("b") == [2, 11, 3, 21]
    assert job.collected("c") == [-1, -10, -2, -20]
    assert job.collected("src2") == ["1", "2"]
    assert sorted(job.collected("join")) == sorted([2, 11, 3, 21, -1, -10, -2, -20])
    assert job.processed["join"] == 8 and job.processed["src2"] == 2


def test_fifo_per_key_order_and_state_deletion():
    # Keeps a running list per key and deletes it when it sees "end": proves order and deletion.
    def keep(state, v):
        k, x = v
        if x == "end":
            return None, [[k, state]]
        return (state or []) + [x], None

    dag = clasp.Dag("order")
    dag.operator("keep", keep, stateful=True, key=lambda v: v[0], collect=True)
    job = run_local(dag, [["k", 1], ["j", 9], ["k", 2], ["k", 3], ["k", "end"]])
    assert job.collected("keep") == [["k", [1, 2, 3]]]
    assert job.state("keep") == {"j": [9]}


def test_roundtrip_turns_tuples_into_lists_and_rejects_unserializable():
    seen = []
    dag = clasp.Dag("rt")
    dag.operator("emit", lambda v: [(v, v)]) >> dag.operator("see", lambda v: seen.append(v))
    run_local(dag, [1])
    assert seen == [[1, 1]]
    bad = clasp.Dag("bad")
    bad.operator("emit", lambda v: [object()]) >> bad.operator("sink", lambda v: None)
    with pytest.raises(clasp.DagError, match="msgpack"):
        run_local(bad, [1])


def test_bad_key_type_is_reported():
    dag = clasp.Dag("k")
    dag.operator("s", lambda s, v: (1, None), stateful=True, key=lambda v: 1.5)
    with pytest.raises(clasp.DagError, match="key"):
        run_local(dag, [1])


def test_async_functions_are_awaited():
    async def double(v):
        await asyncio.sleep(0)
        return v * 2

    async def total(state, v):
        return (state or 0) + v, None

    dag = clasp.Dag("async")
    dag.operator("double", double) >> dag.operator("total", total, stateful=True, key=lambda v: "all")
    job = run_local(dag, [1, 2, 3])
    assert job.state("total") == {"all": 12}


def test_generator_outputs_and_invalid_dag():
    dag = clasp.Dag("gen")
    dag.operator("g", lambda v: (i for i in range(v)), collect=True)
    assert run_local(dag, [3]).collected("g") == [0, 1, 2]
    with pytest.raises(clasp.DagError):
        run_local(clasp.Dag("empty"), [1])
