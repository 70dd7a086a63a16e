"""`Dag.push_source`: the root `push()` feeds, with event time (docs/TIME.md); its records in one process; the
planner's marks of pushed chunks (`PushTime`) against records still open."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
import clasp.windows as W
from clasp.core.dag import DagError
from clasp.core.timed import EventTime, PushTime, ReleasedWatermark
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


BOUND = 3.0


@st.composite
def _pushes(draw) -> list[list[float]]:
    """Chunks of event times, each within BOUND behind the newest before it."""
    top, chunks = 0.0, []
    for _ in range(draw(st.integers(1, 12))):
        chunk = []
        for d in draw(st.lists(st.integers(-3, 5), min_size=1, max_size=6)):
            t = top + d
            chunk.append(t)
            top = max(top, t)
        chunks.append(chunk)
    return chunks


@settings(max_examples=200, deadline=None)
@given(_pushes(), st.data())
def test_the_push_partitions_watermark_never_passes_a_pushed_record_still_open(chunks, data):
    """Chunks begun in order (some begun twice), completed in any order: the released watermark never passes a
    record of a chunk still open, never goes back, and reaches `max - bound` once everything completed, the end
    (+inf) once the input ended."""
    push = PushTime(EventTime(lambda v: v, BOUND), ("events", "push"))
    marks = ReleasedWatermark([push.part])
    open_chunks = set(range(len(chunks)))  # not complete: begun or not
    begun = 0
    released = -math.inf
    while open_chunks:
        running = sorted(c for c in open_chunks if c < begun)
        if begun < len(chunks) and (not running or data.draw(st.booleans())):
            push.begin(marks, begun, chunks[begun], now=0.0)
            if data.draw(st.booleans()):
                push.begin(marks, begun, chunks[begun], now=0.0)  # no room that time: begun again
            begun += 1
        else:
            open_chunks.discard(data.draw(st.sampled_from(running)))
        marks.settle(open_chunks.__contains__)
        w = marks.combined()
        assert w >= released
        marks.released = released = w
        assert all(t >= w for c in open_chunks for t in chunks[c]), "a record still open is behind the watermark"
    assert marks.combined() == max(t for c in chunks for t in c) - BOUND
    assert marks.combined(ended=[push.part]) == math.inf
