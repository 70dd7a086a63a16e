"""`Dag.push_source`: the root `push()` feeds, with event time (docs/TIME.md); its records in one process."""

from __future__ import annotations

import pytest

import clasp
import clasp.windows as W
from clasp.core.dag import DagError
from clasp.core.timed import EventTime
from clasp.testing import run_local


def _dag() -> tuple[clasp.Dag, clasp.core.dag.Operator]:
    dag = clasp.Dag("p")
    src = dag.push_source("events", timestamp=lambda e: e[1], max_out_of_order=1.0, idle_timeout=2.0)
    return dag, src


def test_a_push_source_is_a_root_that_push_feeds_and_windows_take_its_timestamp():
    dag, src = _dag()
    win = dag.window("w", W.tumbling(10), key=lambda e: e[0], fold=lambda a, e: a + 1, init=lambda: 0, collect=True)
    src >> win
    spec = dag.to_spec()
    assert spec.push_time is spec.by_name("events") and spec.sources == [spec.push_time.index]
    fn = spec.push_time.fn
    assert isinstance(fn, EventTime) and (fn.max_out_of_order, fn.idle_timeout) == (1.0, 2.0)
    assert fn(["a", 3]) == [["a", 3]]  # a pass-through
    out = run_local(dag, [["a", 1], ["b", 12], ["a", 9], ["a", 10]])
    assert sorted(out.collected("w")) == [["a", 0, 10, 2], ["a", 10, 20, 1], ["b", 10, 20, 1]]


def test_a_dag_has_one_push_source_and_nothing_feeds_it():
    dag, src = _dag()
    with pytest.raises(DagError, match="push source already"):
        dag.push_source("more", timestamp=lambda e: e[1])
    other = dag.operator("other", lambda v: [v])
    with pytest.raises(DagError, match="cannot have an input"):
        other >> src
    with pytest.raises(DagError, match="max_out_of_order"):
        clasp.Dag("q").push_source("e", timestamp=lambda e: e, max_out_of_order=-1)
    plain = clasp.Dag("s")
    plain.operator("x", lambda v: [v])
    assert plain.to_spec().push_time is None
