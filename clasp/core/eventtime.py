"""Event time: a watermark per source partition, their minimum over an operator's inputs, idle inputs, late records.

A watermark `W` is a promise about the records still to come: every one of them has an event time `>= W`. A window
`[start, end)` is therefore complete once `W >= end`, and a record with `ts < W` is late. A partition's watermark is
the largest event time it has seen minus `max_out_of_order` (records may arrive up to that much behind the newest
one). An operator's watermark is the minimum over its inputs, except inputs that are idle: an input that produced no
record for `idle_timeout` of processing time stops holding the others back (docs/TIME.md). Processing time is always
passed in (`now`), never read from a clock, so every decision here is a function of its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

NEG_INF = -math.inf
POS_INF = math.inf

ON_TIME, LATE, DROPPED = "on_time", "late", "dropped"


def after(t: float) -> float:
    """The smallest watermark that has passed `t` (`W > t`): a deadline "once every record at `t` is in"."""
    return math.nextafter(t, POS_INF)


def classify(ts: float, watermark: float, allowed_lateness: float = 0) -> str:
    """A record against the watermark it met: on time (`ts >= W`), late but still accepted (within
    `allowed_lateness` behind `W`), or dropped (to the late output)."""
    if ts >= watermark:
        return ON_TIME
    return LATE if ts >= watermark - allowed_lateness else DROPPED


class PartitionClock:
    """One source partition's event time. `record(ts, now)` for each record (or `record_batch`), `tick(now)`;
    `state()` / `from_state()` carry the largest event time seen through a checkpoint or a migration."""

    __slots__ = ("max_out_of_order", "idle_timeout", "max_seen", "last_record_at", "idle")

    def __init__(self, max_out_of_order: float = 0, idle_timeout: float | None = None):
        if max_out_of_order < 0:
            raise ValueError(f"max_out_of_order must not be negative, not {max_out_of_order!r}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive (or None: never idle), not {idle_timeout!r}")
        self.max_out_of_order = max_out_of_order
        self.idle_timeout = idle_timeout
        self.max_seen = NEG_INF
        self.last_record_at: float | None = None
        self.idle = False

    @property
    def watermark(self) -> float:
        return self.max_seen - self.max_out_of_order

    def record(self, ts: float, now: float) -> bool:
        """Whether the record was within the bound (not behind the watermark before it); `watermark` after it."""
        on_time = ts >= self.max_seen - self.max_out_of_order
        self.last_record_at, self.idle = now, False
        if ts > self.max_seen:
            self.max_seen = ts
        return on_time

    def record_batch(self, times: list, now: float) -> list[int]:
        """`record` for each time of a batch, in order; the positions of those behind the bound."""
        top, bound, late = self.max_seen, self.max_out_of_order, []
        for i, ts in enumerate(times):
            if ts < top - bound:
                late.append(i)
            elif ts > top:
                top = ts
        if times:
            self.max_seen, self.last_record_at, self.idle = top, now, False
        return late

    def arrived(self, now: float) -> None:
        """Records arrived whose times are counted elsewhere: the partition is not idle."""
        self.last_record_at, self.idle = now, False

    def tick(self, now: float) -> bool:
        """Whether the partition became idle at `now` (no record for `idle_timeout` since the last one, or since
        `now` was first seen: a partition that never produces anything must not hold the others back either)."""
        if self.idle or self.idle_timeout is None:
            return False
        if self.last_record_at is None:
            self.last_record_at = now
        if now - self.last_record_at >= self.idle_timeout:
            self.idle = True
            return True
        return False

    def state(self) -> float:
        return self.max_seen

    @classmethod
    def from_state(cls, max_seen: float, max_out_of_order: float = 0,
                   idle_timeout: float | None = None) -> PartitionClock:
        clock = cls(max_out_of_order, idle_timeout)
        clock.max_seen = max_seen
        return clock


def combine(watermarks: dict[Hashable, float], idle: Iterable[Hashable] = ()) -> float:
    """An operator's watermark over its inputs: the minimum over the active ones. When every input is idle nothing
    is in flight that any of them promised, so the largest of their watermarks holds; no inputs, no promise."""
    idle = set(idle)
    active = [w for i, w in watermarks.items() if i not in idle]
    if active:
        return min(active)
    return max(watermarks.values(), default=NEG_INF)


class InputWatermarks:
    """The watermarks an operator has been sent by each of its inputs (source partitions or upstream channels) and
    their combination, which never goes back: an input that resumes after being idle, below the combined
    watermark, holds back nothing already passed, and its older records are late."""

    __slots__ = ("marks", "idle", "current")

    def __init__(self, inputs: Iterable[Hashable] = ()):
        self.marks: dict[Hashable, float] = dict.fromkeys(inputs, NEG_INF)
        self.idle: set[Hashable] = set()
        self.current = NEG_INF

    def update(self, source: Hashable, watermark: float, idle: bool = False) -> float | None:
        """An input's new watermark (an input's own watermark never goes back either); the combined watermark if
        it advanced, else None."""
        self.marks[source] = max(self.marks.get(source, NEG_INF), watermark)
        (self.idle.add if idle else self.idle.discard)(source)
        return self._recombine()

    def remove(self, source: Hashable) -> float | None:
        """An input that is gone (a partition closed, a channel from a worker that left)."""
        self.marks.pop(source, None)
        self.idle.discard(source)
        return self._recombine()

    def _recombine(self) -> float | None:
        w = combine(self.marks, self.idle)
        if w > self.current:
            self.current = w
            return w
        return None
