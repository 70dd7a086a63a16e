"""The timer index per key group (`clasp.core.timers.GroupTimers`) that the workers fire from: it fires exactly what a
scan of every key fires, through arbitrary records, firings and key groups moving in and out (rebuilt from their
states), and a firing costs the due keys, not the keys held."""

from __future__ import annotations

import time

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.keyed import TimerOperator
from clasp.core.routing import key_group
from clasp.core.timed import TimedFold
from clasp.core.timers import EVENT, PROCESSING, GroupTimers, waited_for

GROUPS = 8


def _set(state, value, timers):
    _, _, ev, pt = value
    if ev is not None:
        timers.at(ev, "e")
    if pt is not None:
        timers.at_processing(pt, "p")
    return (state or 0) + 1, []


def _fired(state, t, payload, timers):
    # Every third firing of a key asks again a little later: on_timer may set timers too.
    if state % 3 == 0:
        (timers.at if payload == "e" else timers.at_processing)(t + 1.5, payload)
    return state + 1, [[timers.key, t, payload]]


def _fold() -> TimedFold:
    return TimedFold(TimerOperator(_set, _fired), key=lambda v: v[0], timestamp=lambda v: v[1])


def _group(key) -> int:
    return key_group(key, GROUPS)


class Indexed:
    """What a worker does: states per key group, the index synced from `touched` and from groups replaced."""

    def __init__(self):
        self.fold = _fold()
        self.groups = [{} for _ in range(GROUPS)]
        self.index = GroupTimers(self.fold.op.deadline)

    def record(self, value) -> list:
        d = self.groups[_group(value[0])]
        new, out = self.fold(d.get(value[0]), value)
        d[value[0]] = new
        return out

    def advance(self, watermark, now) -> list:
        for key in self.fold.take_touched():
            self.index.update(_group(key), key, self.groups[_group(key)].get(key))
        out = []
        for key, new, outs in self.index.fire(self.groups, self.fold.fire_key, watermark, now):
            d = self.groups[_group(key)]
            if new is None:
                d.pop(key, None)
            else:
                d[key] = new
            out.extend(outs)
        return out

    def move(self, g: int) -> None:
        """Key group `g` leaves and comes back through msgpack (a migration there and back, a restore)."""
        blob = msgpack.packb(self.groups[g], use_bin_type=True)
        self.groups[g] = {}
        self.index.rebuild(g, self.groups[g])
        self.groups[g] = msgpack.unpackb(blob, strict_map_key=False)
        self.index.rebuild(g, self.groups[g])


_time = st.one_of(st.none(), st.integers(0, 40).map(float))
_step = st.one_of(
    st.tuples(st.just("record"), st.sampled_from([f"k{i}" for i in range(12)]), _time, _time),
    st.tuples(st.just("advance"), st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.just("move"), st.integers(0, GROUPS - 1)))


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, max_size=80))
def test_the_index_fires_what_a_scan_of_every_key_fires(steps):
    indexed, fold, states = Indexed(), _fold(), {}
    watermark = now = 0.0
    for step in steps:
        if step[0] == "record":
            value = [step[1], 0.0, step[2], step[3]]
            assert indexed.record(value) == fold(states.get(step[1]), value)[1]
            states[step[1]] = fold(states.get(step[1]), value)[0]
        elif step[0] == "advance":
            watermark, now = watermark + step[1], now + step[2]
            want = []
            for key, new, outs in fold.fire(states, watermark, now):
                states[key] = new
                want.extend(outs)
            assert sorted(indexed.advance(watermark, now)) == sorted(want)
        else:
            indexed.move(step[1])
    assert {k: v for d in indexed.groups for k, v in d.items()} == {k: v for k, v in states.items() if v}


def _held(keys: int, due: int) -> tuple[GroupTimers, list[dict], list]:
    """`keys` keys with a timer far ahead, `due` of them also one at 1.0 (event) or 1.0 (processing)."""
    calls = []

    def deadline(state):
        calls.append(1)
        return state[0], state[1]

    groups = [{} for _ in range(GROUPS)]
    for i in range(keys):
        key = f"k{i}"
        groups[_group(key)][key] = [1.0 if i < due else 1e9, 1.0 if due <= i < 2 * due else None]
    index = GroupTimers(deadline)
    for g, d in enumerate(groups):
        index.rebuild(g, d)
    calls.clear()
    return index, groups, calls


def _on_time(state, key, watermark, now):
    return [1e9, None], [key]


def test_a_firing_costs_the_due_keys_not_the_keys_held():
    costs, seconds = {}, {}
    for keys in (1_000, 100_000):
        index, groups, calls = _held(keys, due=10)
        assert index.earliest(EVENT) == 1.0 and index.earliest(PROCESSING) == 1.0
        t = time.perf_counter()
        fired = index.fire(groups, _on_time, 5.0, 5.0)
        seconds[keys] = time.perf_counter() - t
        assert sorted(k for k, _, _ in fired) == sorted(f"k{i}" for i in range(20))
        costs[keys] = len(calls)  # deadlines computed: one per fired key
        assert not index.due(5.0, 5.0)
    assert costs == {1_000: 20, 100_000: 20}
    # And in time: a hundred times the keys, about the same firing (a scan of every key costs 100x).
    assert seconds[100_000] < 20 * seconds[1_000] + 0.005, seconds
    fold_keys = {f"k{i}": [1e9, None] for i in range(100_000)}
    t = time.perf_counter()
    for s in fold_keys.values():
        s[0] <= 5.0  # noqa: B015 (what a scan does per key, at the least)
    scan = time.perf_counter() - t
    print(f"firing 20 due keys: {seconds[1_000] * 1e6:.0f} us among 1,000 keys, "
          f"{seconds[100_000] * 1e6:.0f} us among 100,000; a bare scan of 100,000: {scan * 1e6:.0f} us")


def test_a_failing_callback_spends_its_keys_due_timers_and_the_other_keys_fire():
    def fired(state, t, payload, timers):
        if timers.key == "bad":
            raise ValueError("no")
        return state, [[timers.key, t]]

    fold = TimedFold(TimerOperator(_set, fired), key=lambda v: v[0], timestamp=lambda v: v[1])
    groups = [{} for _ in range(GROUPS)]
    index = GroupTimers(fold.op.deadline)
    for key in ("bad", "good", "also"):
        g = _group(key)
        groups[g][key] = fold(None, [key, 0.0, 1.0, None])[0]
        index.update(g, key, groups[g][key])
    out = {key: (new, outs) for key, new, outs in index.fire(groups, fold.fire_key, 2.0, 0.0)}
    assert out["good"][1] == [(0, ["good", 1.0])] and out["also"][1] == [(0, ["also", 1.0])]
    assert out["bad"] == ([1, []], [])  # its count kept, its timer spent, nothing emitted
    [(key, e)] = fold.take_failures()
    assert key == "bad" and isinstance(e, ValueError)
    assert not index.due(2.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.none() | st.integers(0, 20)), max_size=40),
       st.integers(0, 20), st.lists(st.integers(0, 25), max_size=6))
def test_wait_idle_returns_once_every_timer_due_when_it_was_called_fired(records, called_at, ticks):
    """A worker answers `wait_idle` with its earliest processing-time deadline not fired (`GroupTimers.earliest`):
    the call may return exactly when no timer due at or before the call is left, whatever the ticks fired so
    far, and the re-armed timers (due later than the tick that fired them) never hold it once the clock passed
    the call."""
    fold, index, states = _fold(), GroupTimers(_fold().op.deadline), [{} for _ in range(GROUPS)]
    for key, pt in records:
        g = _group(key)
        states[g][key], _ = fold(states[g].get(key), [key, 0.0, None, pt])
        index.update(g, key, states[g][key])
    for now in sorted(ticks):
        for key, state, _ in index.fire(states, fold.fire_key, float("-inf"), float(now)):
            g = _group(key)
            if state is None:
                states[g].pop(key, None)
            else:
                states[g][key] = state
        left = [t for d in states for s in d.values() for t, kind, _ in (s[1] if s else ()) if kind == PROCESSING]
        assert waited_for(called_at, [index.earliest(PROCESSING)]) == all(t > called_at for t in left)
        if now >= called_at:
            assert waited_for(called_at, [index.earliest(PROCESSING), None])


def test_the_clock_leaves_changed_keys_to_the_firing_until_a_processing_timer_is_set():
    """The worker's processing-time tick finds due timers among the keys indexed so far; the keys records
    changed since are indexed by the next firing, unless a callback here set a processing-time timer (or a
    write from outside may have), when it indexes them first and finds theirs."""
    from types import SimpleNamespace

    import clasp
    from clasp.runtime.operators import OpRuntime
    from clasp.runtime.worker_time import processing_deadline

    def fn(state, value, timers):
        if value[1] == "processing":
            timers.at_processing(value[2], "p")
        else:
            timers.at(value[2], "e")
        return (state or 0) + 1, []

    dag = clasp.Dag("tick")
    dag.timers("t", fn, lambda s, t, p, timers: (s, []), key=lambda v: v[0])
    spec = dag.to_spec()
    op = OpRuntime(next(o for o in spec.operators if isinstance(o.fn, TimedFold)))
    readers = SimpleNamespace(timers={})

    def record(value):
        key = value[0]
        new, _ = op.fn(op.get(key), value)
        op.set_state(key, new)

    assert processing_deadline(readers, op) is None  # the first look indexes every group held here
    record(["a", "event", 10.0])
    assert processing_deadline(readers, op) is None and op.fn.touched == {"a"}  # left for the firing
    record(["b", "processing", 5.0])
    assert processing_deadline(readers, op) == 5.0 and not op.fn.touched
    record(["c", "event", 1.0])
    assert processing_deadline(readers, op) == 5.0 and not op.fn.touched  # processing timers set here: every tick
    fresh = OpRuntime(next(o for o in dag.to_spec().operators if isinstance(o.fn, TimedFold)))
    looked = SimpleNamespace(timers={})
    assert processing_deadline(looked, fresh) is None
    fresh.put_state("d", [1, [[3.0, PROCESSING, "p"]]])  # a write from outside: its timers may be any
    assert processing_deadline(looked, fresh) == 3.0
