"""A user's keyed operator with timers, and the driver that runs a keyed time operator over many keys.

`TimerOperator(fn, on_timer)` is the keyed time operator (`clasp.core.windows` describes the protocol) of a user
function `fn(state, value, timers) -> (state, outputs)` that may ask, through `timers`, to be called back for its key
at an event time (`timers.at(t, payload)`) or a processing time (`timers.at_processing(t, payload)`):
`on_timer(state, t, payload, timers) -> (state, outputs)` is called then, in time order (like Bytewax's
`notify_at`, Flink's timers). The timers are kept in the key's state beside the user's.

`KeyedDriver` is the part of a shell that does not need the shell: one operator's states by key, the timer index
beside them, the watermark and the clock it was last told. Records go to `record` (which returns the outputs and
the records for the late output), time to `advance` (which returns the outputs). `states` is what a checkpoint
stores and a migration moves (any subset of keys); `KeyedDriver(op, states, watermark)` takes them back and
rebuilds its index from them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from clasp.core import timers as _timers
from clasp.core.eventtime import NEG_INF
from clasp.core.timers import EVENT, PROCESSING, TimerIndex
from clasp.core.windows import Step


class TimerFailed(Exception):
    """`on_timer` raised (the cause): `step` is the key's state without the timers that were due, and the outputs
    of the callbacks before the failing one, for the shell to keep and go on with the other keys."""

    def __init__(self, step: Step):
        super().__init__("on_timer failed")
        self.step = step


class TimerContext:
    """What a user's function sees of time for its key: the record's event time (None in `on_timer`), the
    watermark, the processing time, and its timers."""

    __slots__ = ("key", "ts", "watermark", "now", "timers", "op")

    def __init__(self, key: Any, ts: float | None, watermark: float, now: float, timers: list,
                 op: TimerOperator | None = None):
        self.key, self.ts, self.watermark, self.now, self.timers = key, ts, watermark, now, timers
        self.op = op

    def at(self, t: float, payload: Any = None) -> None:
        """Call `on_timer` once the watermark reaches `t`."""
        self.timers = _timers.add(self.timers, t, payload, EVENT)

    def at_processing(self, t: float, payload: Any = None) -> None:
        """Call `on_timer` once the processing time reaches `t`."""
        if self.op is not None:
            self.op.processing = True
        self.timers = _timers.add(self.timers, t, payload, PROCESSING)

    def cancel(self, t: float, payload: Any = None, kind: str = EVENT) -> None:
        self.timers = _timers.cancel(self.timers, t, payload, kind)


class TimerOperator:
    def __init__(self, fn: Callable, on_timer: Callable):
        self.fn, self.on_timer = fn, on_timer
        # Whether a callback here ever set a processing-time timer: until one does, a shell's clock need
        # not look for due ones among the keys changed since it last looked (only among those it indexed).
        self.processing = False

    @staticmethod
    def _pack(user: Any, timers: list) -> list | None:
        return None if user is None and not timers else [user, timers]

    def on_record(self, state: list | None, key: Any, ts: float, value: Any, watermark: float, now: float = 0,
                  input: int = 0) -> Step:
        before, timers = state if state else (None, [])
        ctx = TimerContext(key, ts, watermark, now, timers, self)  # `at` and `cancel` make new lists
        user, out = self.fn(before, value, ctx)
        if state and user is before and ctx.timers is timers:
            return Step(state, list(out or ()), [])  # unchanged: the driver has nothing to re-index
        return Step(self._pack(user, ctx.timers), list(out or ()), [])

    def on_records(self, state: list | None, key: Any, items: list, watermark: float, now: float = 0) -> Step:
        """`on_record` over one key's records `items` (`(ts, value, input)`, in arrival order), as the calls one
        after the other would give, with one context for the key: its state packed once, its timers copied only
        when `fn` sets or cancels one. `out` holds `(i, output)` pairs, `i` the position in `items` of the record
        that made it."""
        before, timers = state if state else (None, [])
        ctx = TimerContext(key, None, watermark, now, timers, self)
        fn, user, out = self.fn, before, []
        for i, (ts, value, _) in enumerate(items):
            ctx.ts = ts
            user, made = fn(user, value, ctx)
            if made:
                out.extend((i, o) for o in made)
        if state and user is before and ctx.timers is timers:
            return Step(state, out, [])
        return Step(self._pack(user, ctx.timers), out, [])

    def on_time(self, state: list | None, key: Any, watermark: float, now: float = 0) -> Step:
        user, timers = state if state else (None, [])
        out: list = []
        due, timers = _timers.pop_due(timers, watermark, now)
        while due:
            t, _, payload = due.pop(0)
            ctx = TimerContext(key, None, watermark, now, timers, self)
            try:
                user, more = self.on_timer(user, t, payload, ctx)
            except Exception as e:  # the timers due are spent: a failing one is not called again and again
                raise TimerFailed(Step(self._pack(user, timers), out, [])) from e
            out.extend(more or ())
            # A timer set for a time already passed fires in this same call, in order.
            timers = ctx.timers
            if timers and timers[0][0] <= max(watermark, now):  # sorted by time: none due otherwise
                now_due, timers = _timers.pop_due(timers, watermark, now)
                if now_due:
                    due = sorted(due + now_due, key=_timers.ORDER)
        return Step(self._pack(user, timers), out, [])

    def deadline(self, state: list | None) -> tuple[float | None, float | None]:
        return _timers.deadlines(state[1]) if state else (None, None)

    @staticmethod
    def same_deadline(old: list | None, new: list | None) -> bool:
        """Whether `deadline(new)` is `deadline(old)` for certain, in O(1): the same timers list (`at` and `cancel`
        make new ones), or no timers on either side."""
        a = old[1] if old else None
        b = new[1] if new else None
        return a is b or (not a and not b)


class KeyedDriver:
    """One keyed time operator over its keys: `record` and `advance` return the outputs; `late` counts the records
    sent to the late output (also returned by `record`)."""

    def __init__(self, op: Any, states: dict | None = None, watermark: float = NEG_INF, now: float = NEG_INF):
        self.op = op
        self.states: dict[Hashable, Any] = dict(states or {})
        self.watermark, self.now = watermark, now
        self.late = 0
        self.index = TimerIndex.rebuild(self.states, op.deadline)

    def _store(self, key: Hashable, state: Any) -> None:
        if state is not None and state is self.states.get(key):
            return  # the same object, unchanged (operators never change a state in place)
        if state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = state
        self.index.set(key, self.op.deadline(state) if state is not None else (None, None))

    def record(self, key: Hashable, ts: float, value: Any, input: int = 0) -> tuple[list, list]:
        step = self.op.on_record(self.states.get(key), key, ts, value, self.watermark, self.now, input)
        self._store(key, step.state)
        self.late += len(step.late)
        return step.out, step.late

    def advance(self, watermark: float | None = None, now: float | None = None) -> list:
        """Move the watermark and the clock forward (never back) and run every key whose deadline is due, earliest
        deadline first."""
        if watermark is not None and watermark > self.watermark:
            self.watermark = watermark
        if now is not None and now > self.now:
            self.now = now
        out: list = []
        while (key := self.index.next_due(self.watermark, self.now)) is not None:
            before = self.index.current(key)
            step = self.op.on_time(self.states.get(key), key, self.watermark, self.now)
            self._store(key, step.state)
            out.extend(step.out)
            after_ = self.index.current(key)
            ev, pt = after_
            if (ev is not None and ev <= self.watermark) or (pt is not None and pt <= self.now):
                raise RuntimeError(f"operator {self.op!r} left key {key!r} due at {after_} (was {before}) after "
                                   f"on_time at watermark {self.watermark}, time {self.now}")
        return out
