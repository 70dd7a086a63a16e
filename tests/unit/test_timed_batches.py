"""A keyed time operator's records run a key at a time (`TimedFold.run`, `WindowOperator.on_records`: the batch
path of `clasp.runtime.timed_batches`) give exactly the states, outputs, late records and failures that the same
records run one call at a time give, for windows, joins and timers, with failing folds and timestamps among
them; and the state given to a batch is never changed in place."""

from __future__ import annotations

import math

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.timed import TimedFold, TimedJoin
from clasp.windows import IntervalJoin, TimerOperator, WindowJoin, WindowOperator, session, sliding, tumbling


def _fold(acc, v):
    if v[1] == 13:
        raise ValueError("thirteen")  # a user's fold that fails on some values
    return acc + [v[1]]


def _merge(a, b):
    return a + b


def _count(state, value, timers):
    timers.at(value[0] + 5, "t")
    return (state or 0) + 1, [[timers.key, value[1]]]


def _mixed(state, value, timers):
    """Sets, cancels, forgets, leaves the state as it was or fails, by the value."""
    v = value[1]
    if v == 13:
        raise ValueError("thirteen")
    if v % 4 == 0:
        return state, []
    if v % 4 == 1:
        timers.at(timers.ts + 5, "x")
        return (state or 0) + v, [[timers.key, v]]
    if v % 4 == 2:
        return None, [v, v]
    timers.cancel(timers.ts + 2, "x")
    return state, [v]


def _time(v):
    if v[0] < 0:
        raise ValueError("no time")
    return v[0]


OPS = {
    "tumbling": lambda: WindowOperator(tumbling(10), _fold, list, allowed_lateness=3),
    "sliding": lambda: WindowOperator(sliding(10, 4), _fold, list, allowed_lateness=2),
    "session": lambda: WindowOperator(session(5), _fold, list, allowed_lateness=2, merge=_merge),
    "timers": lambda: TimerOperator(_count, lambda s, t, p, timers: (s, [])),
    "timers_mixed": lambda: TimerOperator(_mixed, lambda s, t, p, timers: (s, [[t, p]])),
}
JOINS = {"window_join": lambda: WindowJoin(tumbling(10), allowed_lateness=2),
         "sliding_window_join": lambda: WindowJoin(sliding(10, 4), allowed_lateness=3),
         "interval_join": lambda: IntervalJoin(-5, 8),
         "unbounded_interval_join": lambda: IntervalJoin(-math.inf, math.inf, allowed_lateness=4)}

records = st.lists(st.tuples(st.integers(-2, 60), st.integers(0, 20), st.integers(0, 1)), max_size=25)


def one_by_one(fold, state, values):
    """What the row-at-a-time path does: a call per value, a failure leaving the state as it was."""
    out, failed = [], []
    for i, v in enumerate(values):
        try:
            state, o = fold(state, v)
        except Exception as e:
            failed.append((i, type(e)))
            continue
        if o:
            out.append((i, o))
    return state, out, failed


def check(make_fold, batches, watermarks):
    a, b = make_fold(), make_fold()
    sa = sb = None
    for values, w in zip(batches, watermarks, strict=True):
        a.watermark = b.watermark = w
        sa, out_a, failed_a = one_by_one(a, sa, values)
        before = msgpack.packb(sb)
        new, out_b, failed_b = b.run(sb, "k", values)
        assert msgpack.packb(sb) == before  # never in place: a checkpoint may be packing it
        moved = b.op.deadline(new) != b.op.deadline(sb)
        sb = new
        assert sb == sa
        assert out_b == out_a
        assert sorted((i, type(e)) for i, e in failed_b) == sorted(failed_a)
        assert b.late == a.late
        # The shell's timer index needs every key whose deadline changed (a change that keeps it, a bid that
        # sets no timer, need not be indexed again). A batch that ends where it began (a timer set, then
        # cancelled) may say nothing where the calls one by one said something.
        touched_b, touched_a = b.take_touched(), a.take_touched()
        assert touched_b <= {"k"} and (touched_b or not moved) and (touched_a or not touched_b)
        # Fire what the watermark passed, as the shell does between passes.
        if sa is not None:
            sa, _ = a.fire_key(sa, "k", w, 0)
            sb, _ = b.fire_key(sb, "k", w, 0)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(OPS)), st.lists(records, max_size=5), st.data())
def test_a_key_run_as_a_batch_equals_its_records_run_one_call_at_a_time(name, batches, data):
    marks = sorted(data.draw(st.lists(st.integers(-5, 70), min_size=len(batches), max_size=len(batches))))
    values = [[[ts, v] for ts, v, _ in b] for b in batches]
    check(lambda: TimedFold(OPS[name](), key=lambda v: "k", timestamp=_time), values, marks)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(JOINS)), st.lists(records, max_size=5), st.data())
def test_a_join_key_run_as_a_batch_equals_its_records_run_one_call_at_a_time(name, batches, data):
    marks = sorted(data.draw(st.lists(st.integers(-5, 70), min_size=len(batches), max_size=len(batches))))
    values = [[[side, [ts, v]] for ts, v, side in b] for b in batches]
    check(lambda: TimedJoin(JOINS[name](), keys=(lambda v: "k", lambda v: "k"), timestamps=(_time, _time)),
          values, marks)


keyed_records = st.lists(st.tuples(st.sampled_from("abc"), st.integers(-2, 60), st.integers(0, 20)), max_size=25)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["timers", "timers_mixed"]), st.lists(keyed_records, max_size=5), st.data())
def test_a_timers_pass_run_a_record_at_a_time_equals_its_records_run_one_call_at_a_time(name, passes, data):
    """`run_rows`, a pass over several keys with the states updated in their dict: the states, outputs, failures
    and re-indexed keys of a call per record, and no state object given to it changed in place."""
    marks = sorted(data.draw(st.lists(st.integers(-5, 70), min_size=len(passes), max_size=len(passes))))
    a, b = (TimedFold(OPS[name](), key=lambda v: v[2], timestamp=_time) for _ in range(2))
    assert b.by_row
    sa: dict = {}
    sb: dict = {}
    for rows, w in zip(passes, marks, strict=True):
        a.watermark = b.watermark = w
        values = [[ts, v, k] for k, ts, v in rows]
        out_a, failed_a = [], []
        for i, v in enumerate(values):
            try:
                new, o = a(sa.get(v[2]), v)
            except Exception as e:
                failed_a.append((i, type(e)))
                continue
            if new is None:
                sa.pop(v[2], None)
            else:
                sa[v[2]] = new
            if o:
                out_a.append((i, o))
        given_states = dict(sb)
        packed = {k: msgpack.packb(s) for k, s in given_states.items()}
        deadlines = {k: b.op.deadline(s) for k, s in sb.items()}
        out_b, failed_b = b.run_rows([sb] * len(values), [v[2] for v in values], values)
        assert {k: msgpack.packb(s) for k, s in given_states.items()} == packed  # never in place
        assert sb == sa
        assert out_b == out_a
        assert [(i, type(e)) for i, e in failed_b] == failed_a
        moved = {k for k in {*deadlines, *sb} if deadlines.get(k, (None, None)) != b.op.deadline(sb.get(k))}
        assert moved <= b.take_touched() <= {v[2] for v in values}
        fired_a, fired_b = a.fire(sa, w), b.fire(sb, w)
        assert fired_a == fired_b
        for key, new, _ in fired_a:
            for states in (sa, sb):
                if new is None:
                    states.pop(key, None)
                else:
                    states[key] = new


def test_a_change_that_keeps_a_keys_deadline_is_not_indexed_again():
    """The shell re-indexes the keys in `touched`: a timers operator's record that sets or cancels no timer (its
    state changed, its timers list the same) and any record of an unbounded interval join (no deadline ever)
    leave it out; a record that sets a timer does not."""
    def bid(state, value, timers):
        if value[1] == "open":
            timers.at(value[0] + 10, "close")
        return (state or 0) + 1, []

    fold = TimedFold(TimerOperator(bid, lambda s, t, p, timers: (None, [])), key=lambda v: "k", timestamp=_time)
    state, _ = fold(None, [1, "open"])
    assert fold.take_touched() == {"k"}
    state, _ = fold(state, [2, "bid"])
    assert state[0] == 2 and fold.take_touched() == set()
    d = {"k": state}
    fold.run_rows([d, d], ["k", "k"], [[3, "bid"], [4, "bid"]])
    assert d["k"][0] == 4 and fold.take_touched() == set()
    fold.run_rows([d], ["k"], [[5, "open"]])
    assert fold.take_touched() == {"k"}
    join = TimedJoin(IntervalJoin(-math.inf, math.inf), keys=(lambda v: "k", lambda v: "k"), timestamps=(_time, _time))
    state, _ = join(None, [0, [1, "person"]])
    state, out = join(state, [1, [2, "auction"]])
    assert out and state is not None and join.take_touched() == set()
