"""Event time in the runtime, the pure parts: a source's settings, the planner's released watermark, and a
keyed time operator as a stateful operator's function.

- `EventTime` is what `Dag.source(..., timestamp=, max_out_of_order=, idle_timeout=)` declares. It is the
  source operator's function (which passes values through and is never called per record by the engine), so
  the settings travel to the workers with the DAG and each partition reader keeps a `PartitionClock`.
- `PushTime` is the push source's partition on the planner: pushed chunks marked as they are dispatched, their
  watermark raised by the largest time the workers that run the push source found in them.
- `ReleasedWatermark` is the planner's: per partition, the watermark its reader had after each chunk it
  sealed. A partition's watermark is *safe* once every chunk it sealed up to the one that raised it is
  complete (processed everywhere: every record of it with a smaller time has reached every operator). The
  job's watermark is the minimum of the safe ones over the partitions not idle (an ended partition, its
  chunks complete, promises nothing more: +inf), and it never goes back (docs/TIME.md).
- `TimedFold` is a keyed time operator (`WindowOperator`, ...) as `fn(state, value) -> (state, outputs)`, so
  the engine runs it like any stateful operator (key-group state, checkpoints, migrations); its outputs are
  tagged `(ON_TIME_OUT, window)` or `(LATE_OUT, record)` for the two pass-through operators behind it.
  `fire_key` runs one key whose deadline the watermark or the clock reached (the shell finds them in its timer
  index), `fire(states, watermark, now)` every such key of `states`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import Any

from clasp.core.eventtime import NEG_INF, POS_INF, PartitionClock, combine
from clasp.core.keyed import TimerContext, TimerFailed, TimerOperator
from clasp.core.windows import Step

_NUMBERS = (int, float)  # timestamps `EventTime.top` compares in C

ON_TIME_OUT, LATE_OUT = 0, 1


class EventTime:
    """A declared source's event time: `timestamp(value)` in seconds, the bound on disorder and the idle
    timeout (seconds of processing time without a record; None: never idle); whether a worker reads its
    partitions aligned in event time, and how far one may run ahead of the lowest (`clasp.core.alignment`)."""

    __slots__ = ("timestamp", "max_out_of_order", "idle_timeout", "align", "max_drift")

    def __init__(self, timestamp: Callable[[Any], float], max_out_of_order: float = 0,
                 idle_timeout: float | None = None, align: bool = True, max_drift: float | None = None):
        if not callable(timestamp):
            raise TypeError(f"timestamp must be a function of a value, not {timestamp!r}")
        if max_out_of_order < 0:
            raise ValueError(f"max_out_of_order must not be negative, not {max_out_of_order!r}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive (or None), not {idle_timeout!r}")
        if max_drift is not None and not max_drift >= 0:
            raise ValueError(f"max_drift must not be negative (or None: no pause), not {max_drift!r}")
        self.timestamp, self.max_out_of_order, self.idle_timeout = timestamp, max_out_of_order, idle_timeout
        self.align, self.max_drift = bool(align), max_drift

    def __call__(self, value: Any) -> list:
        return [value]  # the source operator is a pass-through: one output, whatever the value

    def top(self, values: list) -> float:
        """The largest event time of a batch, in one pass (NEG_INF: none, or every timestamp failed; a NaN
        never counts)."""
        f = self.timestamp
        try:  # in C while every timestamp can be had and compared, ints with ints (no float made each); the
            # top alone made a float. Taken when it is a number that is no NaN (a NaN first would stay the top);
            # anything else (strs, a mix that does not compare) goes a value at a time.
            top = max(map(f, values), default=NEG_INF)
            if type(top) in _NUMBERS and top == top:
                return float(top)
        except Exception:
            pass
        top = NEG_INF
        for v in values:
            try:
                t = float(f(v))
            except Exception:
                continue
            if t > top:
                top = t
        return top


class ReleasedWatermark:
    """The planner's view of one job's source partitions' watermarks (the module docstring)."""

    def __init__(self, parts: Iterable[Hashable]):
        self.pending: dict[Hashable, deque] = {p: deque() for p in parts}  # [chunk, watermark after it]
        self.safe: dict[Hashable, float] = dict.fromkeys(self.pending, NEG_INF)
        self.idle: set[Hashable] = set()
        self.released = NEG_INF

    def sealed(self, part: Hashable, chunk: int, watermark: float) -> None:
        self.pending.setdefault(part, deque()).append([chunk, watermark])
        self.safe.setdefault(part, NEG_INF)
        self.idle.discard(part)

    def raise_mark(self, part: Hashable, chunk: int, watermark: float) -> None:
        """Chunk `chunk` of `part`, still pending, allows at least `watermark` once complete (a chunk no longer
        pending is ignored: complete already, or sealed before a rollback). A partition's safe watermark is the
        largest of its completed chunks' marks, so a chunk's own mark may be below an earlier one's."""
        for entry in reversed(self.pending.get(part, ())):
            if entry[0] == chunk:
                entry[1] = max(entry[1], watermark)
                return
            if entry[0] < chunk:
                return

    def set_idle(self, part: Hashable, idle: bool) -> None:
        (self.idle.add if idle else self.idle.discard)(part)

    def settle(self, is_open: Callable[[int], bool]) -> None:
        """Every partition's safe watermark, from the chunks that completed (in each partition's seal order)."""
        for part, q in self.pending.items():
            while q and not is_open(q[0][0]):
                _, w = q.popleft()
                if w > self.safe[part]:
                    self.safe[part] = w

    def combined(self, ended: Iterable[Hashable] = ()) -> float:
        """The job's watermark now (not below the one released): ended partitions whose chunks are complete
        count as +inf."""
        marks = dict(self.safe)
        for p in ended:
            if p in marks and not self.pending[p]:
                marks[p] = POS_INF
        idle = {p for p in self.idle if not self.pending.get(p)}
        return max(self.released, combine(marks, idle)) if marks else self.released

    def reset(self) -> None:
        """A rollback: the readers reopen at the checkpoint's positions with new clocks; the shell sets
        `released` to the checkpoint's watermark."""
        for q in self.pending.values():
            q.clear()
        self.safe = dict.fromkeys(self.pending, NEG_INF)
        self.idle.clear()
        self.released = NEG_INF


class FiredChunks:
    """The chunks of windows fired at a watermark (each a chunk of a worker's lease) that the next stage may
    still be waiting for, on the planner. A worker announces such a chunk (`wm_out`) and seals it right after,
    on the same channel, but the two are separate messages: the planner may look in between, when the chunk is
    announced and not open in its tracker yet (a chunk opens at its seal). So a chunk is done only once it was
    sealed and is no longer open; announced alone, it is still on its way (it used to count as done there, and
    a stage's watermark passed the windows it held: they went to the late output)."""

    def __init__(self):
        self.open: dict[int, bool] = {}  # chunk -> sealed yet

    def announced(self, chunk: int) -> None:
        self.open.setdefault(chunk, False)

    def sealed(self, chunk: int) -> None:
        if chunk in self.open:
            self.open[chunk] = True

    def settle(self, is_open: Callable[[int], bool]) -> None:
        """Forget the chunks sealed and complete (`is_open`: still open in the tracker)."""
        self.open = {c: s for c, s in self.open.items() if not s or is_open(c)}

    def clear(self) -> None:
        self.open.clear()

    def __bool__(self) -> bool:
        return bool(self.open)


def follow_stages(levels: list[float], rounds: list[int], answered: int, fired_open: bool, rnd: int) -> bool:
    """Raise each stage's watermark (`levels[d]`, moved last in round `rounds[d]`) to the one before it once every
    worker answered a round at least the one in which that moved (`answered`: the least round they answered) and
    no chunk of windows fired is on its way (`fired_open`): every window the stage before fired at or below its
    watermark has been applied by this one. In place; True if a stage moved (in round `rnd`)."""
    moved = False
    for d in range(1, len(levels)):
        if levels[d] < levels[d - 1] and answered >= rounds[d - 1] and not fired_open:
            levels[d], rounds[d], moved = levels[d - 1], rnd, True
    return moved


class PushTime:
    """The push source's one partition (`Dag.push_source`), on the planner, which calls no timestamp function:
    the pushed chunks go out in the order they were admitted, and as the dispatcher begins each (`begin`), the
    chunk is marked in a `ReleasedWatermark`, as a reader's seal marks a batch, with no watermark yet. Each worker
    that runs the push source finds the largest time of the records of a chunk it received (`EventTime.top`, one
    pass) and reports it before it reports any of them done, so the planner raises the chunk's mark to it
    (`observed`) before the chunk can complete: the partition's safe watermark, the largest mark of its completed
    chunks, is the largest time pushed up to there minus `max_out_of_order`, as a clock over every record gives.
    A rollback (`reset`) starts afresh, as a reader reopening does: the replayed chunks are marked again."""

    def __init__(self, time: EventTime, part: Hashable):
        self.time, self.part = time, part
        self.reset()

    def reset(self) -> None:
        self.clock = PartitionClock(self.time.max_out_of_order, self.time.idle_timeout)  # for idleness
        self.last = -1  # the last chunk marked (the dispatcher may begin one several times)

    def begin(self, marks: ReleasedWatermark, chunk: int, now: float) -> None:
        if chunk <= self.last:
            return
        self.last = chunk
        self.clock.arrived(now)
        marks.sealed(self.part, chunk, NEG_INF)

    def observed(self, marks: ReleasedWatermark, chunk: int, top: float) -> None:
        """A worker found `top` the largest time of the records of `chunk` it received."""
        marks.raise_mark(self.part, chunk, top - self.time.max_out_of_order)

    def tick(self, marks: ReleasedWatermark, now: float) -> None:
        """No push for `idle_timeout`: the partition stops holding the others back."""
        if self.clock.tick(now):
            marks.set_idle(self.part, True)


class TimedFold:
    """A keyed time operator run as a stateful operator's function over the records `timestamp` times. The
    shell tells it the time: `watermark` (the last one this worker fired at) and `now` (the processing time,
    which the shell reads and sets); `touched` collects the keys whose state a record changed, for the shell's
    timer index (`clasp.core.timers.GroupTimers`)."""

    def __init__(self, op: Any, key: Callable, timestamp: Callable):
        self.op, self.key, self.timestamp = op, key, timestamp
        # `same_deadline(old, new)`, where the operator has one: True when a change of state leaves the key's
        # deadline as it was, for certain and in O(1) (a timers operator's bids that keep its timers), so the
        # key is not re-indexed for it.
        self.same_deadline = getattr(op, "same_deadline", None)
        # A timers operator's pass runs a record at a time (`run_rows`), not a key at a time (`run`).
        self.by_row = type(op) is TimerOperator  # a subclass may run its records its own way
        self.watermark = NEG_INF
        self.now = NEG_INF
        self.late = 0  # records sent to the late output here
        self.touched: set = set()
        self.failures: list = []  # (key, the exception) of the timer callbacks that raised, for the shell

    def __call__(self, state: Any, value: Any) -> tuple[Any, list]:
        key = self.key(value)
        ts, value, input = self.item(value)
        step = self.op.on_record(state, key, ts, value, self.watermark, self.now, input)
        return self._took(state, key, step)

    def item(self, value: Any) -> tuple[float, Any, int]:
        """`(ts, value, input)` of one value (raises what its timestamp function raises)."""
        return float(self.timestamp(value)), value, 0

    def _touch(self, key: Hashable, old: Any, new: Any) -> None:
        if new is not old and (self.same_deadline is None or not self.same_deadline(old, new)):
            self.touched.add(key)

    def _took(self, state: Any, key: Hashable, step: Any) -> tuple[Any, list]:
        self._touch(key, state, step.state)
        out = [(ON_TIME_OUT, o) for o in step.out]
        if step.late:
            self.late += len(step.late)
            out.extend((LATE_OUT, r) for r in step.late)
        return step.state, out

    def items(self, values: list) -> tuple[list, list]:
        """(`(ts, value, input)` of each of one key's `values` whose time can be read, the `(i, exception)` of
        those whose timestamp function raised)."""
        f = self.timestamp
        try:  # in C while every time can be had
            return list(zip(map(float, map(f, values)), values, repeat(0))), []
        except Exception:
            pass
        items, failed = [], []
        for i, v in enumerate(values):
            try:
                items.append((float(f(v)), v, 0))
            except Exception as e:
                failed.append((i, e))
        return items, failed

    def run(self, state: Any, key: Hashable, values: list) -> tuple[Any, list, list]:
        """`values`, records of one key in arrival order at one watermark, as many calls would run them: (the
        key's new state, `(i, outputs tagged for the pass-throughs)` of each value `values[i]` with outputs, the
        `(i, exception)` of those that failed, which leave the state as it was). A window operator folds them in
        one pass (`on_records`); when that raises, the values go one by one, so that only the failing one fails."""
        if len(values) == 1:  # most keys of a pass, in a pass of a few records a key: one call, no batch made
            try:
                ts, value, input = self.item(values[0])
                step = self.op.on_record(state, key, ts, value, self.watermark, self.now, input)
            except Exception as e:
                return state, [], [(0, e)]
            new, out = self._took(state, key, step)
            return new, ([(0, out)] if out else []), []
        items, failed = self.items(values)
        if not items:
            return state, [], failed
        pos = None
        if failed:
            gone = {j for j, _ in failed}
            pos = [i for i in range(len(values)) if i not in gone]
        step = None
        batch = getattr(self.op, "on_records", None)
        if batch is not None:
            try:
                step = batch(state, key, items, self.watermark, self.now)
            except Exception:
                step = None
        if step is None:
            step = self._one_by_one(state, key, items, failed, pos)
        self._touch(key, state, step.state)
        if not step.out and not step.late:
            return step.state, [], failed
        outs: dict = {}
        for i, o in step.out:
            outs.setdefault(i, []).append((ON_TIME_OUT, o))
        if step.late:
            self.late += len(step.late)
            for i, r in step.late:
                outs.setdefault(i, []).append((LATE_OUT, r))
        tagged = [(i if pos is None else pos[i], o) for i, o in sorted(outs.items())]
        return step.state, tagged, failed

    def run_rows(self, dicts: list, keys: list, values: list) -> tuple[list, list]:
        """A timers operator's pass a record at a time, in arrival order: `values[i]` of key `keys[i]`, whose state
        is in the dict `dicts[i]`, updated in place. As `run` over each key's records gives, with no batch made
        per key: its function is called once a record however they are batched, and a pass holds a few records a
        key. Returns (`(i, outputs tagged for the pass-throughs)` of each value with outputs, in order; the
        `(i, exception)` of those that failed, which leave their key's state as it was)."""
        op = self.op
        fn, f, touched = op.fn, self.timestamp, self.touched
        ctx = TimerContext(None, None, self.watermark, self.now, None, op)
        sent: list = []
        failed: list = []
        try:  # the times in C while every one can be had; else each record's own, its failure its own
            times = list(map(float, map(f, values)))
        except Exception:
            times = None
        for i, (d, key, value) in enumerate(zip(dicts, keys, values, strict=True)):
            state = d.get(key)
            before, timers = state if state else (None, [])
            ctx.key, ctx.timers = key, timers
            try:
                ctx.ts = times[i] if times is not None else float(f(value))
                user, out = fn(before, value, ctx)
                if out:
                    sent.append((i, [(ON_TIME_OUT, o) for o in out]))
            except Exception as e:
                failed.append((i, e))
                continue
            after_ = ctx.timers
            if state and user is before and after_ is timers:
                continue  # unchanged
            if user is None and not after_:
                d.pop(key, None)
            else:
                d[key] = [user, after_]
            if after_ is not timers and (after_ or timers):
                touched.add(key)
        return sent, failed

    def _one_by_one(self, state: Any, key: Hashable, items: list, failed: list, pos: list | None) -> Step:
        """`items` a call each: one that raises is added to `failed` and leaves the state as it was."""
        out, late = [], []
        on_record, watermark, now = self.op.on_record, self.watermark, self.now
        for i, (ts, value, input) in enumerate(items):
            try:
                step = on_record(state, key, ts, value, watermark, now, input)
            except Exception as e:
                failed.append((i if pos is None else pos[i], e))
                continue
            state = step.state
            if step.out:
                out.extend((i, o) for o in step.out)
            if step.late:
                late.extend((i, r) for r in step.late)
        return Step(state, out, late)

    def take_touched(self) -> set:
        touched, self.touched = self.touched, set()
        return touched

    def fire_key(self, state: Any, key: Hashable, watermark: float, now: float) -> tuple[Any, list]:
        """One due key's `on_time`: (its new state or None, its outputs tagged for the pass-throughs). A user's
        callback that raises costs its timer, not the others': the error goes to `failures` (the shell reports
        them as the operator's errors)."""
        try:
            step = self.op.on_time(state, key, watermark, now)
        except TimerFailed as e:
            self.failures.append((key, e.__cause__))
            step = e.step
        return step.state, [(ON_TIME_OUT, o) for o in step.out]

    def take_failures(self) -> list:
        failures, self.failures = self.failures, []
        return failures

    def fire(self, states: dict, watermark: float, now: float = NEG_INF) -> list[tuple[Hashable, Any, list]]:
        """(key, new state or None, outputs) of every key in `states` with a timer the watermark or the clock
        reached, visiting every key (the cluster's shell keeps an index instead); `states` is left as it is."""
        self.watermark = max(self.watermark, watermark)
        deadline, out = self.op.deadline, []
        for key, s in states.items():
            ev, pt = deadline(s)
            if (ev is not None and ev <= watermark) or (pt is not None and pt <= now):
                out.append((key, *self.fire_key(s, key, watermark, now)))
        return out


class TimedJoin(TimedFold):
    """A two-input keyed time operator (`WindowJoin`, `IntervalJoin`) over `[side, value]` (side 0 the left,
    1 the right), each side with its own key and timestamp functions."""

    def __init__(self, op: Any, keys: tuple, timestamps: tuple):
        super().__init__(op, SideKey(keys), SideKey(timestamps))

    def items(self, values: list) -> tuple[list, list]:
        f = self.timestamp
        try:  # in C while every time can be had (the side's function still called once a value)
            times = map(float, map(f, values))
            return list(zip(times, map(itemgetter(1), values), map(itemgetter(0), values), strict=True)), []
        except Exception:
            pass
        items, failed = [], []
        for i, tagged in enumerate(values):
            try:
                items.append((float(f(tagged)), tagged[1], tagged[0]))
            except Exception as e:
                failed.append((i, e))
        return items, failed

    def item(self, tagged: Any) -> tuple[float, Any, int]:
        return float(self.timestamp(tagged)), tagged[1], tagged[0]


class SideKey:
    """`fns[side](value)` of a `[side, value]`: a join's key (or timestamp) on either of its inputs."""

    def __init__(self, fns: tuple):
        self.fns = fns

    def __call__(self, tagged: Any) -> Any:
        return self.fns[tagged[0]](tagged[1])


def no_time(value: Any) -> float:
    """The event time of a record on a DAG without event time (a timers operator on processing time)."""
    return NEG_INF


def result_time(window: list) -> float:
    """The event time of a fired window `[key, start, end, value]` for a window fed by it: just before its end
    (Flink's `end - 1`), the latest time in it, which the next stage's watermark has not passed yet."""
    return math.nextafter(window[2], NEG_INF)


def stages(spec: Any) -> dict[int, int]:
    """Each keyed time operator's stage (operator index -> how many keyed time operators the longest path from
    a source to it passes): a stage's watermark follows the one before it once the windows that one fired at
    it are complete, so a window fed by windows sees them before it fires (docs/TIME.md)."""
    before = [0] * len(spec.operators)
    out = {}
    for i in spec.topological():
        o = spec.operators[i]
        timed = isinstance(o.fn, TimedFold)
        if timed:
            out[i] = before[i]
        for s in o.successors:
            before[s] = max(before[s], before[i] + timed)
    return out


def side(tag: int) -> Callable[[Any], Any]:
    """The function of the pass-through operator that marks a join's input `tag` (0 left, 1 right)."""
    def mark(value):
        return [[tag, value]]
    mark.__name__ = "left" if tag == 0 else "right"
    return mark


def pick(tag: int) -> Callable[[Any], Any]:
    """The function of the pass-through operator behind a `TimedFold` that keeps the outputs tagged `tag`."""
    def keep(tagged):
        return [tagged[1]] if tagged[0] == tag else None  # one output (a list alone would be its items)
    keep.__name__ = "on_time" if tag == ON_TIME_OUT else "late"
    return keep

