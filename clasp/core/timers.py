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
from operator import itemgetter
from typing import Any

EVENT, PROCESSING = "event", "processing"
KINDS = (EVENT, PROCESSING)
ORDER = itemgetter(0, 1)  # a key's timers in time order, event time before processing time at equal times


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"timer kind must be {EVENT!r} or {PROCESSING!r}, not {kind!r}")


def add(timers: list | None, t: float, payload: Any = None, kind: str = EVENT) -> list:
    """`timers` with one more timer (a timer already set at the same time, kind and payload is set once)."""
    _check_kind(kind)
    timers = list(timers or ())
    entry = [t, kind, payload]
    if entry not in timers:
        bisect.insort(timers, entry, key=ORDER)
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


def waited_for(called_at: float, pending: Iterable[float | None]) -> bool:
    """Whether a `wait_idle` called at `called_at` (processing time) may return as far as processing-time timers
    go: `pending` holds each worker's earliest processing-time deadline not fired yet (None: none). Every timer due
    at or before the call must have fired; one due later never holds it, so a timer an operator re-arms forever
    cannot keep a client waiting."""
    return all(t is None or t > called_at for t in pending)


class TimerIndex:
    """Which keys have a deadline, earliest first, per kind. Entries are replaced, not removed: `set` records a
    key's current deadlines and `next_due` skips the entries that no longer match them."""

    __slots__ = ("_event", "_processing", "_current", "_seq")

    def __init__(self) -> None:
        # One heap per kind, of (deadline, sequence, key); a key's current deadlines in `_current`.
        self._event: list = []
        self._processing: list = []
        self._current: dict[Hashable, tuple[float | None, float | None]] = {}
        self._seq = itertools.count()

    @classmethod
    def rebuild(cls, states: dict, deadline: Callable[[Any], tuple[float | None, float | None]]) -> TimerIndex:
        index = cls()
        for key, state in states.items():
            index.set(key, deadline(state))
        return index

    def set(self, key: Hashable, deadline: tuple[float | None, float | None]) -> None:
        current = self._current
        if current.get(key) == deadline:
            return
        ev, pt = deadline
        if ev is None and pt is None:
            current.pop(key, None)
            return
        current[key] = deadline
        if ev is not None:
            heapq.heappush(self._event, (ev, next(self._seq), key))
        if pt is not None:
            heapq.heappush(self._processing, (pt, next(self._seq), key))

    def current(self, key: Hashable) -> tuple[float | None, float | None]:
        return self._current.get(key, (None, None))

    def __len__(self) -> int:
        return len(self._current)

    def earliest(self, kind: str) -> tuple[float, Hashable] | None:
        """(the earliest deadline of `kind`, its key), or None."""
        if kind == EVENT:
            heap, slot = self._event, 0
        else:
            heap, slot = self._processing, 1
        current = self._current
        while heap:
            t, _, key = heap[0]
            now = current.get(key)
            if now is not None and now[slot] == t:
                return t, key
            heapq.heappop(heap)  # replaced since
        return None

    def next_due(self, watermark: float, now: float) -> Hashable | None:
        """The key with the earliest deadline that is due (event time first at equal times), or None. The key
        stays indexed until `set` gives it new deadlines."""
        # A heap's top, replaced or not, is no later than its earliest deadline: a top not due means none is.
        if self._event and self._event[0][0] <= watermark:
            top = self.earliest(EVENT)
            if top is not None and top[0] <= watermark:
                return top[1]
        if self._processing and self._processing[0][0] <= now:
            top = self.earliest(PROCESSING)
            if top is not None and top[0] <= now:
                return top[1]
        return None

    def keys(self) -> Iterable[Hashable]:
        return self._current.keys()


class GroupTimers:
    """The timer index of one keyed time operator over the key groups a worker holds: a `TimerIndex` per key
    group with a deadline, so a firing visits the due keys only (O(due · log n) and the groups, never every
    key). Derived data beside the states, like `TimerIndex`: a group that arrived (a migration, a restore)
    is indexed again from its states (`rebuild`), a key its operator changed is re-indexed from its new state
    (`update`), and the index never disagrees with a checkpoint or a migration because it is never carried
    by one."""

    __slots__ = ("deadline", "groups")

    def __init__(self, deadline: Callable[[Any], tuple[float | None, float | None]]):
        self.deadline = deadline
        self.groups: dict[int, TimerIndex] = {}

    def rebuild(self, g: int, states: dict) -> None:
        index = TimerIndex.rebuild(states, self.deadline)
        if len(index):
            self.groups[g] = index
        else:
            self.groups.pop(g, None)

    def update(self, g: int, key: Hashable, state: Any) -> None:
        deadline = self.deadline(state) if state is not None else (None, None)
        index = self.groups.get(g)
        if index is None:
            if deadline == (None, None):
                return
            index = self.groups[g] = TimerIndex()
        index.set(key, deadline)
        if not len(index):
            del self.groups[g]

    def due(self, watermark: float, now: float) -> bool:
        return any(index.next_due(watermark, now) is not None for index in self.groups.values())

    def earliest(self, kind: str) -> float | None:
        """The earliest deadline of `kind` over every group (None: none)."""
        tops = [top[0] for index in self.groups.values() if (top := index.earliest(kind)) is not None]
        return min(tops, default=None)

    def fire(self, states: list[dict], on_time: Callable, watermark: float, now: float) -> list[tuple]:
        """(key, new state or None, outputs) of every due key, each once, earliest deadline first within its
        group: `on_time(state, key, watermark, now) -> (state, outputs)`, `states` the groups' dicts (left as
        they are: the shell stores the new states its own way)."""
        out = []
        for g in list(self.groups):
            index, d = self.groups[g], states[g]
            while (key := index.next_due(watermark, now)) is not None:
                new, outs = on_time(d.get(key), key, watermark, now)
                deadline = self.deadline(new) if new is not None else (None, None)
                index.set(key, deadline)
                ev, pt = deadline
                if (ev is not None and ev <= watermark) or (pt is not None and pt <= now):
                    raise RuntimeError(f"key {key!r} is still due at {deadline} after on_time at watermark "
                                       f"{watermark}, time {now}")
                out.append((key, new, outs))
            if not len(index):
                del self.groups[g]
        return out
