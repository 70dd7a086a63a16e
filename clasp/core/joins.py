"""Joins of two keyed inputs as keyed time operators (`clasp.core.windows` describes the protocol): a window join
pairs the left and right values of a key that fall in the same window; an interval join pairs a left value at `l`
with every right value at `r` of the same key with `lower <= r - l <= upper`. Both emit `[key, left, right]`;
input 0 is the left, input 1 the right.

A window join emits a window's pairs when the watermark reaches its end (a late record within the allowed
lateness pairs at once with the other side's values already there). An interval join emits a pair as soon as its
second value arrives, and forgets a value once no value still to come can pair with it; with `lower = -inf,
upper = inf` it is the unbounded join of two keyed streams (every left with every right, whichever came first).
"""

from __future__ import annotations

import math
from typing import Any

from clasp.core.eventtime import after
from clasp.core.windows import Sliding, Step, Tumbling, Window, insert_by_end, own_entry

LEFT, RIGHT = 0, 1
# A window in a key's state: [start, end, lefts, rights, fired].
_START, _END, _L, _R, _FIRED = 0, 1, 2, 3, 4


def _side(input: int) -> int:
    if input not in (LEFT, RIGHT):
        raise ValueError(f"a join has inputs 0 (left) and 1 (right), not {input!r}")
    return input


class WindowJoin:
    def __init__(self, window: Window, allowed_lateness: float = 0):
        if not isinstance(window, Tumbling | Sliding):
            raise TypeError(f"a window join takes tumbling or sliding windows, not {window!r}")
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness must not be negative, not {allowed_lateness!r}")
        self.window, self.allowed_lateness = window, allowed_lateness

    def on_record(self, state: list | None, key: Any, ts: float, value: Any, watermark: float, now: float = 0,
                  input: int = LEFT) -> Step:
        side = _side(input)
        windows = list(state) if state else []
        out, accepted = [], False
        for start, end in self.window.assign(ts):
            if end + self.allowed_lateness <= watermark:
                continue
            accepted = True
            entry = own_entry(windows, start, end, lambda: [start, end, [], [], False])  # noqa: B023
            entry[_L + side] = entry[_L + side] + [value]
            if end <= watermark:
                entry[_FIRED] = True
                others = entry[_L + 1 - side]
                out.extend([key, value, o] if side == LEFT else [key, o, value] for o in others)
        return Step(windows or None, out, [] if accepted else [[key, ts, value]])

    def on_records(self, state: list | None, key: Any, items: list, watermark: float, now: float = 0) -> Step:
        """`on_record` over one key's records `items` (`(ts, value, input)`, in arrival order) at one watermark, as
        the calls one after the other would give: the state copied once, each window's sides copied once and
        then appended to, the windows found by their bounds. `out` and `late` hold `(i, record)` pairs, `i` the
        position in `items` of the record that made it."""
        windows = [list(w) for w in state] if state else []
        entries = {(w[_START], w[_END]): w for w in windows}
        mine: set = set()  # the windows whose sides are this call's own lists
        assign, lateness = self.window.assign, self.allowed_lateness
        out: list = []
        late: list = []
        for i, (ts, value, input) in enumerate(items):
            side = _side(input)
            accepted = False
            for bounds in assign(ts):
                end = bounds[1]
                if end + lateness <= watermark:
                    continue
                accepted = True
                entry = entries.get(bounds)
                if entry is None:
                    entry = entries[bounds] = [bounds[0], end, [], [], False]
                    insert_by_end(windows, entry)
                    mine.add(bounds)
                elif bounds not in mine:
                    entry[_L], entry[_R] = list(entry[_L]), list(entry[_R])
                    mine.add(bounds)
                entry[_L + side].append(value)
                if end <= watermark:
                    entry[_FIRED] = True
                    others = entry[_L + 1 - side]
                    out.extend((i, [key, value, o] if side == LEFT else [key, o, value]) for o in others)
            if not accepted:
                late.append((i, [key, ts, value]))
        return Step(windows or None, out, late)

    def on_time(self, state: list | None, key: Any, watermark: float, now: float = 0) -> Step:
        out, kept = [], []
        for w in state or ():
            if not w[_FIRED] and w[_END] <= watermark:
                out.extend([key, lv, rv] for lv in w[_L] for rv in w[_R])
                w = [w[_START], w[_END], w[_L], w[_R], True]
            if w[_END] + self.allowed_lateness > watermark:
                kept.append(w)
        return Step(kept or None, out, [])

    def deadline(self, state: list | None) -> tuple[float | None, None]:
        ts = [w[_END] + self.allowed_lateness if w[_FIRED] else w[_END] for w in state or ()]
        return (min(ts) if ts else None), None


class IntervalJoin:
    """Pairs with `lower <= r - l <= upper`. A value is kept while one still to come can pair with it: a left at
    `l` while `l + upper >= W - allowed_lateness`, a right at `r` while `r - lower >= W - allowed_lateness`; a
    record older than `W - allowed_lateness` goes to the late output."""

    def __init__(self, lower: float, upper: float, allowed_lateness: float = 0):
        if lower > upper:
            raise ValueError(f"an interval join needs lower <= upper, not {lower!r} > {upper!r}")
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness must not be negative, not {allowed_lateness!r}")
        self.lower, self.upper, self.allowed_lateness = lower, upper, allowed_lateness
        # Unbounded on both sides, every value is kept for good: no key ever has a deadline.
        self.forever = lower == -math.inf and upper == math.inf

    def _keeps(self, side: int, ts: float, watermark: float) -> bool:
        # Added, never subtracted from the watermark: the same float sums as `deadline`'s.
        return (ts + self.upper if side == LEFT else ts - self.lower) + self.allowed_lateness >= watermark

    def on_record(self, state: list | None, key: Any, ts: float, value: Any, watermark: float, now: float = 0,
                  input: int = LEFT) -> Step:
        side = _side(input)
        if ts + self.allowed_lateness < watermark:
            return Step(state, [], [[key, ts, value]])
        lefts, rights = state if state else ([], [])
        if side == LEFT:
            out = [[key, value, rv] for rt, rv in rights if self.lower <= rt - ts <= self.upper]
            if self._keeps(LEFT, ts, watermark):
                lefts = lefts + [[ts, value]]
        else:
            out = [[key, lv, value] for lt, lv in lefts if self.lower <= ts - lt <= self.upper]
            if self._keeps(RIGHT, ts, watermark):
                rights = rights + [[ts, value]]
        return Step([lefts, rights] if lefts or rights else None, out, [])

    def on_time(self, state: list | None, key: Any, watermark: float, now: float = 0) -> Step:
        if not state:
            return Step(None, [], [])
        lefts = [e for e in state[0] if self._keeps(LEFT, e[0], watermark)]
        rights = [e for e in state[1] if self._keeps(RIGHT, e[0], watermark)]
        return Step([lefts, rights] if lefts or rights else None, [], [])

    def same_deadline(self, old: list | None, new: list | None) -> bool:
        """Whether `deadline(new)` is `deadline(old)` for certain, in O(1)."""
        return self.forever

    def deadline(self, state: list | None) -> tuple[float | None, None]:
        if not state or self.forever:
            return None, None
        # A value goes once the horizon passes its last partner's time, strictly: after(...).
        ends = [e[0] + self.upper for e in state[0]] + [e[0] - self.lower for e in state[1]]
        t = min(ends) + self.allowed_lateness
        return (None if math.isinf(t) else after(t)), None
