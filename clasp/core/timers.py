"""Per-key timers at event or processing time, and the index that finds the keys whose timers are due.

A key's timers live in the key's own state, as a sorted list of `[t, kind, payload]` (plain lists: msgpack and
pickle carry them), so they migrate and are checkpointed with the key. An event-time timer at `t` fires once the
watermark reaches `t` (every record before `t` is in; `eventtime.after(t)` for "once `t` itself is in"); a
processing-time timer once the clock passed in as `now` reaches `t`. `TimerIndex` is what a key group's shell keeps
beside the states to find due keys without visiting every key; it is derived data, rebuilt from the states after a
restore or a migration (`TimerIndex.rebuild`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import Any

EVENT, PROCESSING = "event", "processing"
KINDS = (EVENT, PROCESSING)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"timer kind must be {EVENT!r} or {PROCESSING!r}, not {kind!r}")


def add(timers: list | None, t: float, payload: Any = None, kind: str = EVENT) -> list:
    """`timers` with one more timer (a timer already set at the same time, kind and payload is set once)."""
    _check_kind(kind)
    timers = list(timers or ())
    entry = [t, kind, payload]
    if entry not in timers:
        bisect.insort(timers, entry, key=lambda e: (e[0], e[1]))
    return timers


def cancel(timers: list | None, t: float, payload: Any = None, kind: str = EVENT) -> list:
    return [e for e in timers or () if e != [t, kind, payload]]


def pop_due(timers: list | None, watermark: float, now: float) -> tuple[list, list]:
    """(the timers due at this watermark and clock, in time order, event time before processing time at equal
    times; the rest)."""
    due, rest = [], []
    for e in timers or ():
        (due if e[0] <= (watermark if e[1] == EVENT else now) else rest).append(e)
    return due, rest


def deadlines(timers: list | None) -> tuple[float | None, float | None]:
    """(the earliest event-time timer, the earliest processing-time timer), None where there is none."""
    ev = pt = None
    for t, kind, _ in timers or ():  # sorted by time: the first of each kind
        if kind == EVENT:
            if ev is None:
                ev = t
                if pt is not None:
                    break
        elif pt is None:
            pt = t
            if ev is not None:
                break
    return ev, pt


class TimerIndex:
    """Which keys have a deadline, earliest first, per kind. Entries are replaced, not removed: `set` records a
    key's current deadlines and `next_due` skips the entries that no longer match them."""

    __slots__ = ("_heaps", "_current", "_seq")

    def __init__(self) -> None:
        self._heaps: dict[str, list] = {EVENT: [], PROCESSING: []}
        self._current: dict[Hashable, tuple[float | None, float | None]] = {}
        self._seq = itertools.count()

    @classmethod
    def rebuild(cls, states: dict, deadline: Callable[[Any], tuple[float | None, float | None]]) -> TimerIndex:
        index = cls()
        for key, state in states.items():
            index.set(key, deadline(state))
        return index

    def set(self, key: Hashable, deadline: tuple[float | None, float | None]) -> None:
        if self._current.get(key) == deadline:
            return
        if deadline == (None, None):
            self._current.pop(key, None)
            return
        self._current[key] = deadline
        for kind, t in zip(KINDS, deadline, strict=True):
            if t is not None:
                heapq.heappush(self._heaps[kind], (t, next(self._seq), key))

    def current(self, key: Hashable) -> tuple[float | None, float | None]:
        return self._current.get(key, (None, None))

    def __len__(self) -> int:
        return len(self._current)

    def next_due(self, watermark: float, now: float) -> Hashable | None:
        """The key with the earliest deadline that is due (event time first at equal times), or None. The key
        stays indexed until `set` gives it new deadlines."""
        for kind, clock in ((EVENT, watermark), (PROCESSING, now)):
            heap = self._heaps[kind]
            slot = KINDS.index(kind)
            while heap and self._current.get(heap[0][2], (None, None))[slot] != heap[0][0]:
                heapq.heappop(heap)  # replaced since
            if heap and heap[0][0] <= clock:
                return heap[0][2]
        return None

    def keys(self) -> Iterable[Hashable]:
        return self._current.keys()
