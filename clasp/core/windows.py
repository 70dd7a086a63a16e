"""Windows: tumbling, sliding and session windows, and the per-key window operator as a state machine.

A keyed time operator (`WindowOperator`, `clasp.core.joins`, `TimerOperator`) is three pure functions of one key's
state: `on_record(state, key, ts, value, watermark, now, input)` and `on_time(state, key, watermark, now)`, each
returning a `Step` (the new state, or None when the key has nothing left; outputs; records for the late output),
and `deadline(state)`: (the watermark, the processing time) at which `on_time` next has something to do. The state
is plain lists and the user's accumulators, so a key group's states are what a checkpoint stores and a migration
moves; a shell keeps the timer index beside them (`clasp.core.timers.TimerIndex`, `clasp.core.keyed.KeyedDriver`).

A window is `[start, end)`. It fires, `[key, start, end, value]`, when the watermark reaches `end`; with
`allowed_lateness` L it is kept until the watermark reaches `end + L`, and every late record folded into it in
the meantime re-emits it with the new value (the last emission of a window is its answer). A record none of whose
windows is still kept goes to the late output as `[key, ts, value]` (Flink's rule: a record that is late for some
of its sliding windows but not all is not late).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple


class Step(NamedTuple):
    """What a keyed time operator did: the key's new state (None: forget the key), outputs, late records."""

    state: Any
    out: list
    late: list


@dataclass(frozen=True, slots=True)
class Tumbling:
    size: float
    offset: float = 0

    def __post_init__(self):
        if not self.size > 0:
            raise ValueError(f"a tumbling window's size must be positive, not {self.size!r}")

    def assign(self, ts: float) -> list[tuple[float, float]]:
        start = ts - (ts - self.offset) % self.size
        return [(start, start + self.size)]


@dataclass(frozen=True, slots=True)
class Sliding:
    size: float
    slide: float
    offset: float = 0

    def __post_init__(self):
        if not self.size > 0 or not self.slide > 0:
            raise ValueError(f"a sliding window's size and slide must be positive, not {self.size!r}, {self.slide!r}")
        if self.slide > self.size:
            raise ValueError(f"a sliding window's slide ({self.slide!r}) must not exceed its size ({self.size!r}): "
                             "records between windows would belong to none")

    def assign(self, ts: float) -> list[tuple[float, float]]:
        """The windows holding `ts`, earliest first."""
        last = ts - (ts - self.offset) % self.slide
        out = []
        start = last
        while start > ts - self.size:
            out.append((start, start + self.size))
            start -= self.slide
        out.reverse()
        return out


@dataclass(frozen=True, slots=True)
class Session:
    """Records less than `gap` apart (per key) share a session: `[first, last + gap)`."""

    gap: float

    def __post_init__(self):
        if not self.gap > 0:
            raise ValueError(f"a session window's gap must be positive, not {self.gap!r}")

    def assign(self, ts: float) -> list[tuple[float, float]]:
        return [(ts, ts + self.gap)]


Window = Tumbling | Sliding | Session


def tumbling(size: float, offset: float = 0) -> Tumbling:
    """Windows `[offset + k·size, offset + (k+1)·size)`: each record in exactly one."""
    return Tumbling(size, offset)


def sliding(size: float, slide: float, offset: float = 0) -> Sliding:
    """Windows of `size` starting every `slide` (aligned to `offset`): each record in `size / slide` of them."""
    return Sliding(size, slide, offset)


def session(gap: float) -> Session:
    """Per-key sessions: a window per run of records less than `gap` apart, merged as records bridge them."""
    return Session(gap)


# A window in a key's state: [start, end, accumulator, fired]; the list sorted by (end, start).
_START, _END, _ACC, _FIRED = 0, 1, 2, 3
_start_of = itemgetter(_START)


def insert_by_end(windows: list, entry: list) -> None:
    i = len(windows)
    while i and (windows[i - 1][_END], windows[i - 1][_START]) > (entry[_END], entry[_START]):
        i -= 1
    windows.insert(i, entry)


def own_entry(windows: list, start: float, end: float, new: Callable[[], list]) -> list:
    """The entry of window `[start, end)` in `windows` (a fresh list of the key's windows), as a copy this call may
    change: a state once returned is never changed in place (a checkpoint may still be packing it)."""
    for i, w in enumerate(windows):
        if w[_START] == start and w[_END] == end:
            windows[i] = list(w)
            return windows[i]
    entry = new()
    insert_by_end(windows, entry)
    return entry


class WindowOperator:
    """Fold each key's values into its windows (`fold(acc, value)` from `init()`); `merge(a, b)` joins two
    sessions' accumulators when a record bridges them (required for session windows, as Bytewax's `merger`).
    Both return a new accumulator and leave the ones they are given unchanged: those are still in the state
    returned before, which a checkpoint may be packing."""

    def __init__(self, window: Window, fold: Callable, init: Callable[[], Any], allowed_lateness: float = 0,
                 merge: Callable | None = None):
        if not isinstance(window, Tumbling | Sliding | Session):
            raise TypeError(f"window must be clasp.windows.tumbling/sliding/session, not {window!r}")
        if allowed_lateness < 0:
            raise ValueError(f"allowed_lateness must not be negative, not {allowed_lateness!r}")
        if isinstance(window, Session) and merge is None:
            raise ValueError("session windows merge: give merge(acc_a, acc_b)")
        self.window, self.fold, self.init, self.merge = window, fold, init, merge
        self.allowed_lateness = allowed_lateness

    def on_record(self, state: list | None, key: Any, ts: float, value: Any, watermark: float, now: float = 0,
                  input: int = 0) -> Step:
        if isinstance(self.window, Session):
            windows = list(state) if state else []
            out, accepted = self._session_record(windows, key, ts, value, watermark)
            return Step(windows or None, out, [] if accepted else [[key, ts, value]])
        windows = list(state) if state else []
        out: list = []
        if not self._fold_aligned(windows, set(), key, ts, value, watermark, out):
            return Step(state or None, out, [[key, ts, value]])
        return Step(windows, out, [])

    def on_records(self, state: list | None, key: Any, items: list, watermark: float, now: float = 0
                   ) -> Step | None:
        """`on_record` over one key's records `items` (`(ts, value, input)`, in arrival order) at one watermark, as
        the calls one after the other would give: the state once, each window's entry copied once, the windows
        looked up by their bounds, not searched. The step's `out` and `late` are `(i, record)` pairs, `i` the
        position in `items` of the record that made it. Session windows have no batch form (None): the caller
        runs them record by record."""
        if isinstance(self.window, Session):
            return None
        windows = list(state) if state else []
        own: set = set()  # ids of the entries copied or made here: each copied once
        out: list = []
        late: list = []
        made: list = []
        for i, (ts, value, _) in enumerate(items):
            if not self._fold_aligned(windows, own, key, ts, value, watermark, made):
                late.append((i, [key, ts, value]))
            if made:
                out.extend((i, o) for o in made)
                made.clear()
        return Step(windows if own else state or None, out, late)

    def _fold_aligned(self, windows: list, own: set, key: Any, ts: float, value: Any, watermark: float,
                      out: list) -> bool:
        """Fold a record into its tumbling or sliding windows in `windows` (a key's, all of one size, so sorted by
        start), each entry found by bisection and copied unless its id is in `own` (then added), the outputs of
        windows fired already appended to `out`. False: no window of the record is kept (it is late)."""
        window = self.window
        size, slide, lateness = window.size, window.size if type(window) is Tumbling else window.slide, \
            self.allowed_lateness
        last = ts - (ts - window.offset) % slide  # the last window holding ts; the earlier ones every slide back
        first = last
        while first - slide > ts - size:
            first -= slide
        while first + size + lateness <= watermark:  # purged already, or would be at once
            first += slide
            if first > last:
                return False
        j = bisect_left(windows, first, key=_start_of)
        while first <= last:
            entry = windows[j] if j < len(windows) else None
            if entry is None or entry[_START] != first:
                entry = [first, first + size, self.init(), False]
                windows.insert(j, entry)
                own.add(id(entry))
            elif id(entry) not in own:
                entry = windows[j] = list(entry)
                own.add(id(entry))
            entry[_ACC] = self.fold(entry[_ACC], value)
            if entry[_END] <= watermark:  # fired already: the late record updates it
                entry[_FIRED] = True
                out.append([key, first, entry[_END], entry[_ACC]])
            first += slide
            j += 1
        return True

    def _session_record(self, windows: list, key: Any, ts: float, value: Any, watermark: float) -> tuple[list, bool]:
        start, end = ts, ts + self.window.gap
        bridged = [w for w in windows if w[_START] < end and start < w[_END]]
        if bridged:
            bridged.sort(key=lambda w: w[_START])
            acc = bridged[0][_ACC]
            for w in bridged[1:]:
                acc = self.merge(acc, w[_ACC])
            start, end = min(start, bridged[0][_START]), max(end, max(w[_END] for w in bridged))
            for w in bridged:
                windows.remove(w)
        else:
            if end + self.allowed_lateness <= watermark:
                return [], False
            acc = self.init()
        entry = [start, end, self.fold(acc, value), False]
        insert_by_end(windows, entry)
        if end <= watermark:
            entry[_FIRED] = True
            return [[key, start, end, entry[_ACC]]], True
        return [], True

    def on_time(self, state: list | None, key: Any, watermark: float, now: float = 0) -> Step:
        out, kept = [], []
        for w in state or ():
            if not w[_FIRED] and w[_END] <= watermark:
                out.append([key, w[_START], w[_END], w[_ACC]])
                w = [w[_START], w[_END], w[_ACC], True]
            if w[_END] + self.allowed_lateness > watermark:
                kept.append(w)
        return Step(kept or None, out, [])

    def deadline(self, state: list | None) -> tuple[float | None, None]:
        ts = [w[_END] + self.allowed_lateness if w[_FIRED] else w[_END] for w in state or ()]
        return (min(ts) if ts else None), None

