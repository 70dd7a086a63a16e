"""Event time, windows, joins and timers without a runtime (clasp.windows over clasp.core): watermarks and idleness
decided exactly, window and join results equal to a plain computation over arbitrary out-of-order arrivals (within
the bound, and beyond it with allowed lateness), sessions merged, and every operator's states serialized and split
across drivers mid-stream (a checkpoint, a migration) giving the same results."""

from __future__ import annotations

import collections
import math
import pickle
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.windows import (
    DROPPED,
    LATE,
    NEG_INF,
    ON_TIME,
    POS_INF,
    InputWatermarks,
    IntervalJoin,
    KeyedDriver,
    PartitionClock,
    TimerOperator,
    WindowJoin,
    WindowOperator,
    after,
    classify,
    combine,
    session,
    sliding,
    tumbling,
)

cases = settings(max_examples=150, deadline=None)

# ---------------------------------------------------------------------------------------------- watermarks


def test_a_partition_watermark_is_the_largest_time_seen_less_the_bound():
    c = PartitionClock(max_out_of_order=5)
    assert c.watermark == NEG_INF
    assert c.record(100, now=0) is True and c.watermark == 95
    assert c.record(96, now=1) is True and c.watermark == 95  # behind the newest but within the bound
    assert c.record(94, now=2) is False and c.watermark == 95  # beyond it
    assert c.record(110, now=3) is True and c.watermark == 105
    assert PartitionClock.from_state(c.state(), 5).watermark == 105


@cases
@given(st.lists(st.integers(-1000, 1000), max_size=60), st.integers(0, 50), st.integers(1, 7))
def test_partition_watermarks_never_go_back_and_classify_each_record_against_the_one_before_it(times, bound,
                                                                                               batch):
    c, b = PartitionClock(bound), PartitionClock(bound)
    seen = []
    for i, ts in enumerate(times):
        before = c.watermark
        on_time = c.record(ts, now=i)
        seen.append(ts)
        assert c.watermark == max(seen) - bound >= before
        assert on_time == (ts >= before) == (classify(ts, before) == ON_TIME)
    # In batches: the same watermark, and the same records behind it.
    late = []
    for start in range(0, len(times), batch):
        late += [start + i for i in b.record_batch(times[start:start + batch], now=start)]
    assert b.watermark == c.watermark
    assert late == [i for i, ts in enumerate(times) if i and ts < max(times[:i]) - bound]


def test_classify_separates_on_time_late_within_the_lateness_and_dropped():
    assert [classify(ts, 100, 10) for ts in (100, 150, 99, 90, 89.5)] == [ON_TIME, ON_TIME, LATE, LATE, DROPPED]


def test_a_partition_is_idle_after_its_timeout_of_processing_time_and_active_again_with_a_record():
    c = PartitionClock(0, idle_timeout=10)
    assert c.tick(now=0) is False  # the clock starts counting at the first tick when nothing ever came
    assert c.tick(now=9.99) is False
    assert c.tick(now=10) is True and c.idle
    assert c.tick(now=50) is False  # already idle: reported once
    c.record(7, now=51)
    assert not c.idle
    assert c.tick(now=60.9) is False and c.tick(now=61) is True
    never = PartitionClock(0)  # no timeout: never idle
    assert never.tick(now=1e9) is False and not never.idle


def test_an_operator_watermark_is_the_minimum_over_its_active_inputs_and_never_goes_back():
    w = InputWatermarks(["p0", "p1"])
    assert w.update("p0", 50) is None  # p1 has promised nothing yet
    assert w.update("p1", 30) == 30
    assert w.update("p1", 70) == 50
    assert w.update("p1", 60) is None and w.marks["p1"] == 70  # an input's own watermark does not go back
    # p0 goes quiet: marked idle, it no longer holds p1 back.
    assert w.update("p0", 50, idle=True) == 70
    # p0 resumes below: the combined watermark stays, its older records are late downstream.
    assert w.update("p0", 55) is None and w.current == 70
    assert w.update("p0", 90) is None and w.update("p1", 95) == 90
    assert w.remove("p0") == 95
    assert combine({"a": 5, "b": 9}, idle={"a", "b"}) == 9  # everything idle: the largest promise holds
    assert combine({}) == NEG_INF


@cases
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1000), st.booleans()), max_size=40))
def test_the_combined_watermark_is_the_running_maximum_of_the_minimum_over_active_inputs(updates):
    w = InputWatermarks(range(4))
    marks, idle, best = dict.fromkeys(range(4), NEG_INF), set(), NEG_INF
    for i, mark, is_idle in updates:
        w.update(i, mark, idle=is_idle)
        marks[i] = max(marks[i], mark)
        (idle.add if is_idle else idle.discard)(i)
        active = [m for j, m in marks.items() if j not in idle]
        best = max(best, min(active) if active else max(marks.values()))
        assert w.current == best


# ---------------------------------------------------------------------------------------------- a small harness


def run(op, arrivals, bound, snapshot_at=None, split=1, codec="msgpack"):
    """Drive `op` over `arrivals` [(key, ts, value, input)] from one partition whose watermark lags the newest
    time by `bound`. At `snapshot_at` the states are serialized and taken back by `split` drivers (keys dealt by
    hash, as key groups). Returns (outputs in order, late records)."""
    clock = PartitionClock(bound)
    drivers = [KeyedDriver(op)]
    out, late = [], []

    def owner(key):
        return drivers[hash(key) % len(drivers)]

    for i, (key, ts, value, side) in enumerate(arrivals):
        if i == snapshot_at:
            states = {k: s for d in drivers for k, s in d.states.items()}
            if codec == "msgpack":
                states = dict(msgpack.unpackb(msgpack.packb(list(states.items())), strict_map_key=False))
            else:
                states = pickle.loads(pickle.dumps(states))
            wm = drivers[0].watermark
            drivers = [KeyedDriver(op, {k: s for k, s in states.items() if hash(k) % split == j}, wm)
                       for j in range(split)]
        o, lt = owner(key).record(key, ts, value, side)
        out += o
        late += lt
        clock.record(ts, now=i)
        for d in drivers:
            out += d.advance(clock.watermark)
    for d in drivers:
        out += d.advance(POS_INF)
        assert d.states == {} and len(d.index) == 0
    return out, late


@st.composite
def bounded_arrivals(draw, bound_max=20, sides=1):
    """Records with times in [0, 200) on a few keys, arriving out of order by at most `bound` (each is delayed by
    at most `bound` from its time, and the arrivals are in delayed-time order)."""
    bound = draw(st.integers(0, bound_max))
    recs = draw(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 199), st.integers(1, 9),
                                   st.integers(0, sides - 1), st.integers(0, bound)), max_size=50))
    recs.sort(key=lambda r: (r[1] + r[4], r[4]))
    return bound, [(k, ts, v, s) for k, ts, v, s, _ in recs]


def window_reference(win, arrivals, bound=None, lateness=0):
    """Per (key, start, end), the sorted values the window holds; and the late records. With `bound`, a record is
    folded into a window only if that window was still kept when it arrived (end + lateness > the watermark)."""
    wins, late, top = collections.defaultdict(list), [], NEG_INF
    for key, ts, v, _ in arrivals:
        wm = top - bound if bound is not None else NEG_INF
        kept = [(s, e) for s, e in win.assign(ts) if e + lateness > wm]
        for s, e in kept:
            wins[(key, s, e)].append(v)
        if not kept:
            late.append([key, ts, v])
        top = max(top, ts)
    return {k: sorted(v) for k, v in wins.items()}, late


def last_emitted(out):
    res = {}
    for key, s, e, acc in out:
        res[(key, s, e)] = sorted(acc)
    return res


WINDOWS = st.one_of(st.builds(tumbling, st.integers(1, 40)),
                    st.integers(1, 40).flatmap(lambda size: st.builds(sliding, st.just(size), st.integers(1, size))))


def collect_op(win, lateness=0):
    return WindowOperator(win, fold=lambda acc, v: acc + [v], init=list, allowed_lateness=lateness)


# ---------------------------------------------------------------------------------------------- windows


def test_sliding_windows_hold_each_time_in_size_over_slide_windows_and_tumbling_in_one():
    assert sliding(10, 5).assign(12) == [(5, 15), (10, 20)]
    assert sliding(10, 5).assign(10) == [(5, 15), (10, 20)]
    assert sliding(10, 3).assign(0) == [(-9, 1), (-6, 4), (-3, 7), (0, 10)]
    assert tumbling(10).assign(-1) == [(-10, 0)] and tumbling(10, offset=3).assign(12) == [(3, 13)]
    with pytest.raises(ValueError):
        sliding(5, 10)
    with pytest.raises(ValueError):
        WindowOperator(session(5), lambda a, v: a, int)  # sessions merge: merge= is required


@cases
@given(WINDOWS, bounded_arrivals())
def test_window_results_equal_a_plain_grouping_for_any_order_within_the_bound(win, bounded):
    bound, arrivals = bounded
    out, late = run(collect_op(win), arrivals, bound)
    expected, _ = window_reference(win, arrivals)
    assert late == []
    assert last_emitted(out) == expected
    # Each window fires once, when the watermark passes its end: a key's in order of end.
    assert len(out) == len(expected)
    for k in "abc":
        assert [o[2] for o in out if o[0] == k] == sorted(o[2] for o in out if o[0] == k)


@cases
@given(WINDOWS, bounded_arrivals(bound_max=60), st.integers(0, 10), st.integers(0, 30))
def test_records_beyond_the_bound_update_kept_windows_within_the_lateness_and_go_late_after(win, bounded,
                                                                                          bound, lateness):
    _, arrivals = bounded  # disordered by up to 60, but the watermark only waits `bound`
    out, late = run(collect_op(win, lateness), arrivals, bound)
    expected, expected_late = window_reference(win, arrivals, bound, lateness)
    assert late == expected_late
    assert last_emitted(out) == expected
    # Every window fires once on time if any record made it in on time, and again for each late record it took.
    emissions = collections.Counter((o[0], o[1], o[2]) for o in out)
    top, want = NEG_INF, collections.Counter()
    on_time = set()
    for key, ts, _, _ in arrivals:
        wm = top - bound
        for s, e in win.assign(ts):
            if e <= wm < e + lateness:
                want[(key, s, e)] += 1
            elif e > wm:
                on_time.add((key, s, e))
        top = max(top, ts)
    for w in on_time:
        want[w] += 1
    assert emissions == want


def session_reference(gap, arrivals):
    by_key = collections.defaultdict(list)
    for key, ts, v, _ in arrivals:
        by_key[key].append((ts, v))
    res = {}
    for key, recs in by_key.items():
        recs.sort()
        run_ = [recs[0]]
        for r in recs[1:]:
            if r[0] - run_[-1][0] < gap:
                run_.append(r)
            else:
                res[(key, run_[0][0], run_[-1][0] + gap)] = sorted(v for _, v in run_)
                run_ = [r]
        res[(key, run_[0][0], run_[-1][0] + gap)] = sorted(v for _, v in run_)
    return res


def session_op(gap, lateness=0):
    return WindowOperator(session(gap), fold=lambda acc, v: acc + [v], init=list, allowed_lateness=lateness,
                          merge=lambda a, b: a + b)


@cases
@given(st.integers(1, 30), bounded_arrivals())
def test_sessions_equal_runs_of_records_less_than_the_gap_apart_for_any_order_within_the_bound(gap, bounded):
    bound, arrivals = bounded
    out, late = run(session_op(gap), arrivals, bound)
    assert late == []
    assert last_emitted(out) == session_reference(gap, arrivals)
    assert len(out) == len(session_reference(gap, arrivals))  # a session fires once it cannot grow


@cases
@given(st.integers(1, 30), bounded_arrivals(bound_max=60), st.integers(0, 5))
def test_late_records_within_the_lateness_merge_fired_sessions_into_the_answer_a_plain_grouping_gives(
        gap, bounded, bound):
    _, arrivals = bounded
    out, late = run(session_op(gap, lateness=10_000), arrivals, bound)
    assert late == []
    # The answer is every emitted session not covered by a later, larger one (the ones it was merged into).
    final = {}
    for i, (key, s, e, acc) in enumerate(out):
        if not any(k == key and s2 <= s and e <= e2 and (s2, e2) != (s, e) for k, s2, e2, _ in out[i + 1:]):
            final[(key, s, e)] = sorted(acc)
    assert final == session_reference(gap, arrivals)


def test_a_late_record_bridging_two_sessions_merges_them_and_re_emits_the_merged_one():
    op = session_op(6, lateness=100)
    d = KeyedDriver(op)
    d.record("k", 1, 1)
    d.record("k", 10, 2)
    assert d.advance(20) == [["k", 1, 7, [1]], ["k", 10, 16, [2]]]
    out, late = d.record("k", 5, 3)  # [5, 11) bridges [1, 7) and [10, 16)
    assert (out, late) == ([["k", 1, 16, [1, 2, 3]]], [])
    assert d.record("k", 16, 4) == ([], [])  # 16 is on time (>= 20? no: late, but [16, 22) is still kept)
    assert d.advance(121) == [["k", 16, 22, [4]]] and d.states
    assert d.advance(122) == [] and d.states == {}
    assert d.record("k", 5, 4) == ([], [["k", 5, 4]]) and d.late == 1


# ---------------------------------------------------------------------------------------------- checkpoints, migration


OPS = {
    "tumbling": lambda: collect_op(tumbling(10), lateness=5),
    "sliding": lambda: collect_op(sliding(20, 5), lateness=3),
    "session": lambda: session_op(7, lateness=4),
    "window_join": lambda: WindowJoin(tumbling(15), allowed_lateness=5),
    "interval_join": lambda: IntervalJoin(-5, 10, allowed_lateness=2),
}


class Untouched:
    """An operator that checks the one it wraps never changes a state it was given: the runtime's checkpoints
    may still be packing a state an operator returned before."""

    def __init__(self, op):
        self.op = op

    def _checked(self, fn, state, *args):
        before = msgpack.packb(state)
        step = fn(state, *args)
        assert msgpack.packb(state) == before
        return step

    def on_record(self, state, *args):
        return self._checked(self.op.on_record, state, *args)

    def on_time(self, state, *args):
        return self._checked(self.op.on_time, state, *args)

    def deadline(self, state):
        return self.op.deadline(state)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(OPS)), bounded_arrivals(bound_max=30, sides=2), st.integers(0, 10), st.data())
def test_states_serialized_and_split_mid_stream_give_the_same_results_and_are_never_changed(name, bounded, bound,
                                                                                          data):
    _, arrivals = bounded
    op = Untouched(OPS[name]())
    if name not in ("window_join", "interval_join"):
        arrivals = [(k, ts, v, 0) for k, ts, v, _ in arrivals]
    whole = run(op, arrivals, bound)
    at = data.draw(st.integers(0, len(arrivals)))
    split = data.draw(st.integers(1, 3))
    codec = data.draw(st.sampled_from(["msgpack", "pickle"]))
    again = run(op, arrivals, bound, snapshot_at=at, split=split, codec=codec)
    key = lambda o: msgpack.packb(o)  # noqa: E731
    assert sorted(again[0], key=key) == sorted(whole[0], key=key)
    assert again[1] == whole[1]


# ---------------------------------------------------------------------------------------------- joins


@cases
@given(WINDOWS, bounded_arrivals(sides=2))
def test_a_window_join_pairs_every_left_and_right_of_a_key_in_the_same_window(win, bounded):
    bound, arrivals = bounded
    out, late = run(WindowJoin(win), arrivals, bound)
    want = []
    for key, ts, v, side in arrivals:
        if side == 0:
            for k2, ts2, v2, side2 in arrivals:
                if k2 == key and side2 == 1:
                    want += [[key, v, v2]] * len(set(win.assign(ts)) & set(win.assign(ts2)))
    assert late == []
    assert sorted(out) == sorted(want)


@cases
@given(st.integers(-30, 30), st.integers(0, 30), bounded_arrivals(sides=2))
def test_an_interval_join_pairs_every_left_with_each_right_within_its_bounds(lower, width, bounded):
    bound, arrivals = bounded
    upper = lower + width
    out, late = run(IntervalJoin(lower, upper), arrivals, bound)
    want = [[k, v, v2] for k, ts, v, s in arrivals if s == 0
            for k2, ts2, v2, s2 in arrivals if s2 == 1 and k2 == k and lower <= ts2 - ts <= upper]
    assert late == []
    assert sorted(out) == sorted(want)


def test_an_interval_join_forgets_what_nothing_to_come_can_pair_with_and_an_unbounded_join_nothing():
    d = KeyedDriver(IntervalJoin(0, 10))
    d.record("k", 100, "l", 0)
    assert d.advance(110) == [] and d.states  # a right at 110 may still come
    assert d.record("k", 110, "r", 1) == ([["k", "l", "r"]], [])
    d.advance(after(110))
    assert d.states == {}  # the left's last partner time has passed, and the right (lower 0) had no future left
    assert d.record("k", 105, "late", 0) == ([], [["k", 105, "late"]])
    forever = KeyedDriver(IntervalJoin(-math.inf, math.inf))
    forever.record(1, 5, "auction", 1)
    forever.advance(1e12)
    assert forever.record(1, 2e12, "person", 0) == ([[1, "person", "auction"]], [])


# ---------------------------------------------------------------------------------------------- timers


def _echo_timers():
    def fn(state, value, t):
        kind, at = value
        (t.at if kind == "event" else t.at_processing)(at, value)
        return (state or 0) + 1, []

    def on_timer(state, at, payload, t):
        if payload[0] == "event" and payload[1] % 7 == 0 and at < 1000:
            t.at(at, ("event", at + 1000))  # a timer set for a time passed fires in the same call
        return state, [[t.key, at, payload]]

    return TimerOperator(fn, on_timer)


@cases
@given(st.lists(st.tuples(st.sampled_from("xy"), st.sampled_from(["event", "processing"]), st.integers(0, 100)),
                max_size=30),
       st.lists(st.tuples(st.integers(0, 120), st.integers(0, 120)), min_size=1, max_size=10),
       st.integers(0, 30))
def test_timers_fire_in_time_order_per_key_when_the_watermark_or_clock_passes_and_survive_a_checkpoint(
        sets, ticks, cut):
    def drive(cut_at):
        d = KeyedDriver(_echo_timers())
        out = []
        for i, (key, kind, at) in enumerate(sets):
            if i == cut_at:
                d = KeyedDriver(d.op, msgpack.unpackb(msgpack.packb(d.states)), d.watermark, d.now)
            d.record(key, 0, [kind, at])
            wm, now = ticks[i % len(ticks)]
            out.append(d.advance(wm, now))
        return out, d

    out, d = drive(None)
    assert drive(cut)[0] == out
    fired = [o for batch in out for o in batch]
    # Within one advance a key's timers fire in time order, per clock; none fires early.
    wm_seen = now_seen = NEG_INF
    for i, batch in enumerate(out):
        wm, now = ticks[i % len(ticks)]
        wm_seen, now_seen = max(wm_seen, wm), max(now_seen, now)
        for kind in ("event", "processing"):
            for key in "xy":
                times = [at for k, at, p in batch if p[0] == kind and k == key]
                assert times == sorted(times)
            times = [at for _, at, p in batch if p[0] == kind]
            assert all(at <= (wm_seen if kind == "event" else now_seen) for at in times)
    # A timer fires at most once per time it was set (setting an unfired one again changes nothing).
    fired_n = collections.Counter((k, tuple(p)) for k, _, p in fired)
    set_n = collections.Counter((k, (kind, at)) for k, kind, at in sets)
    for (k, p), n in fired_n.items():
        parent = (k, (p[0], p[1] - 1000)) if p[1] >= 1000 else (k, p)
        assert n <= set_n[parent]
    # Everything still set is not yet due.
    for state in d.states.values():
        for at, kind, _ in state[1]:
            assert at > (d.watermark if kind == "event" else d.now)
    rest = d.advance(POS_INF, POS_INF)
    assert all(not s[1] for s in d.states.values())
    want = {(k, (kind, at)) for k, kind, at in sets}
    want |= {(k, ("event", at + 1000)) for k, kind, at in sets if kind == "event" and at % 7 == 0}
    assert {(k, tuple(p)) for k, _, p in fired + rest} == want


def test_a_driver_runs_the_keys_with_the_earliest_deadline_first_each_firing_its_windows_in_order():
    rng = random.Random(3)
    d = KeyedDriver(WindowOperator(tumbling(10), lambda a, v: a + v, int))
    for _ in range(500):
        d.record(rng.choice("abcdef"), rng.randrange(1000), 1)
    out = d.advance(500)
    firsts = [o[2] for i, o in enumerate(out) if i == 0 or out[i - 1][0] != o[0]]
    assert firsts == sorted(firsts)
    for k in "abcdef":
        assert [o[2] for o in out if o[0] == k] == sorted({o[2] for o in out if o[0] == k})
    assert sum(o[3] for o in out + d.advance(POS_INF)) == 500


def test_a_quiet_partition_holds_windows_back_until_its_idle_timeout_and_its_old_records_are_late_after():
    """Two source partitions feed one window operator; p1 goes quiet at event time 20 while p0 goes on. Its
    watermark holds the windows back until `idle_timeout` of processing time passes; then they fire on p0's
    alone, and what p1 sends when it resumes, behind them, goes to the late output."""

    def run_with(idle_timeout):
        clocks = {p: PartitionClock(max_out_of_order=2, idle_timeout=idle_timeout) for p in ("p0", "p1")}
        inputs = InputWatermarks(clocks)
        d = KeyedDriver(WindowOperator(tumbling(10), lambda a, v: a + v, int))
        fired, late = [], []
        for now in range(100):  # one processing-time unit per step; p0 sends event time now, p1 until 20
            for p, clock in clocks.items():
                if p == "p0" or now <= 20:
                    d_out, d_late = d.record("k", now, 1)
                    fired += d_out
                    late += d_late
                    clock.record(now, now)
                clock.tick(now)
                inputs.update(p, clock.watermark, clock.idle)
            fired += d.advance(inputs.current)
        # p1 resumes with an old record.
        out, lt = d.record("k", 25, 1)
        return fired, late + lt, inputs.current

    held, late, wm = run_with(idle_timeout=None)
    assert [w[1] for w in held] == [0] and wm == 18 and late == []  # p1's 20 - 2 holds [10, 20) and after
    freed, late, wm = run_with(idle_timeout=5)
    assert [w[1] for w in freed] == list(range(0, 90, 10)) and wm == 97
    assert freed[2] == ["k", 20, 30, 1 + 10]  # p1's record at 20, then p0's 20..29
    assert late == [["k", 25, 1]]
