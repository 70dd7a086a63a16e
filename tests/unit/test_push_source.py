"""`Dag.push_source`: the root `push()` feeds, with event time (docs/TIME.md); its records in one process; the
planner's marks of pushed chunks (`PushTime`) against records still open."""

from __future__ import annotations

import math
from decimal import Decimal

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


@settings(max_examples=300, deadline=None)
@given(_pushes(), st.data())
def test_the_push_partitions_watermark_never_passes_a_pushed_record_still_open(chunks, data):
    """Chunks begun in order (some begun twice), each split between two workers that report the largest time of
    their part (once or twice) at any moment before the chunk completes, completed in any order: the released
    watermark never passes a record of a chunk still open, never goes back, and is exactly the largest time of
    the chunks completed in a row from the first minus the bound (what a clock over every record gives), the end
    (+inf) once the input ended. The planner calls no timestamp function: only the workers' `top` does."""
    push = PushTime(EventTime(lambda v: v, BOUND), ("events", "push"))
    marks = ReleasedWatermark([push.part])
    open_chunks = set(range(len(chunks)))  # not complete: begun or not
    unreported: dict[int, list] = {}  # begun chunk -> its parts whose worker has not reported yet
    begun = 0
    released = -math.inf

    def report(c: int, part: list) -> None:
        push.observed(marks, c, push.time.top(part))
        if data.draw(st.booleans()):
            push.observed(marks, c, push.time.top(part))  # again: harmless

    while open_chunks:
        running = sorted(c for c in open_chunks if c < begun)
        action = data.draw(st.sampled_from(["begin", "report", "complete"]))
        reportable = [c for c in running if unreported.get(c)]
        if begun < len(chunks) and (not running or action == "begin"):
            push.begin(marks, begun, now=0.0)
            if data.draw(st.booleans()):
                push.begin(marks, begun, now=0.0)  # no room that time: begun again
            cut = data.draw(st.integers(0, len(chunks[begun])))
            unreported[begun] = [p for p in (chunks[begun][:cut], chunks[begun][cut:]) if p]
            begun += 1
        elif action == "report" and reportable:
            c = data.draw(st.sampled_from(reportable))
            report(c, unreported[c].pop())
        else:
            c = data.draw(st.sampled_from(running))
            for part in unreported.pop(c, []):  # a worker reports its part ahead of the part's progress
                report(c, part)
            open_chunks.discard(c)
        marks.settle(open_chunks.__contains__)
        w = marks.combined()
        assert w >= released
        marks.released = released = w
        assert all(t >= w for c in open_chunks for t in chunks[c]), "a record still open is behind the watermark"
        prefix = min(open_chunks, default=len(chunks))
        assert w == max((t for c in range(prefix) for t in chunks[c]), default=-math.inf) - BOUND
    assert marks.combined() == max(t for c in chunks for t in c) - BOUND
    assert marks.combined(ended=[push.part]) == math.inf


def test_a_report_for_a_chunk_no_longer_pending_moves_nothing():
    """A worker's report that arrives for a chunk already complete, or sealed before a rollback, is ignored; a
    chunk whose timestamps all failed (top -inf) allows nothing more than the chunks before it."""
    push = PushTime(EventTime(lambda v: v, BOUND), ("events", "push"))
    marks = ReleasedWatermark([push.part])
    push.begin(marks, 0, now=0.0)
    push.observed(marks, 0, 10.0)
    marks.settle(lambda c: False)
    assert marks.combined() == 10.0 - BOUND
    push.observed(marks, 0, 50.0)
    push.begin(marks, 1, now=0.0)
    push.observed(marks, 1, push.time.top([]))
    marks.settle(lambda c: False)
    assert marks.combined() == 10.0 - BOUND
    assert EventTime(lambda v: v["ts"]).top([{"ts": 3}, {}, {"ts": 7.5}, {"ts": 1}]) == 7.5


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-10**20, 10**20), st.none(),
                          st.sampled_from(["x", "4.5", "12", "nan", True, b"3"])), max_size=12))
def test_a_batch_top_is_the_largest_time_that_can_be_had_and_never_a_nan(times):
    """A batch's largest time (a reader's watermark after it) skips the values whose timestamp fails and
    the NaNs, wherever they are in the batch, the first place included; a float whatever the mix."""
    want = -math.inf
    for t in times:
        try:
            f = float(t)
        except (TypeError, ValueError):
            continue
        if f > want:
            want = f
    got = EventTime(lambda v: v[0]).top([[t] for t in times])
    assert type(got) is float and got == want
    assert EventTime(lambda v: v).top([Decimal("2.5"), 1]) == 2.5
