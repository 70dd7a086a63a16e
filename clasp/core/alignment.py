"""Event-time aligned reading: in what order a worker reads its partitions of one source on event time, and
which of them pause.

A worker that reads several partitions of a source in turns of a whole batch each hands its operators records
whose event times jump back and forth by a batch's span: a partition's batch runs ahead of the next one's, and a
keyed operator sees, say, a bid before the auction it belongs to (Nexmark Q4: 44 % of the bids at 8 files in
1,024-line turns, 4.6 % in event-time order), which it must hold. Aligned reading, the shell's
`SourceReaders`, fills each batch's room with slices of its partitions, the one with the lowest event time
read first, and hands the slices to the engine as one chunk merged in event-time order (`merged`: no
partition's records reordered, as a Kafka partition's order is kept). A partition more than
`max_drift` ahead of the lowest one pauses, as in Flink's watermark alignment (`withWatermarkAlignment`), but
only partitions that have records now count: one that reads nothing (idle, ended, or waiting for its producer)
holds no other back. Everything here is a function of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import accumulate, chain, islice
from operator import le

from clasp.core import kernels


def turn_order(marks: Mapping[Hashable, float], max_drift: float | None = None) -> list:
    """The partitions to read from, lowest event time (`marks`: the largest time each has read) first, ties in
    the mapping's order; those more than `max_drift` ahead of the lowest are paused, left out (None: none)."""
    order = sorted(marks, key=marks.__getitem__)
    if max_drift is None or not order:
        return order
    bound = marks[order[0]] + max_drift
    return [p for p in order if marks[p] <= bound]


def slice_size(room: int, readers: int) -> int:
    """Records asked of each partition in a pass over `readers` of them, so the pass fills `room` (at least 1)."""
    return max(1, -(-room // max(1, readers)))


def merged(slices: Sequence[Sequence], timestamp: Callable) -> list:
    """The slices' records as one list in event-time order, each slice's records in the order it holds them.

    A record's place is its slice's largest time so far (the running maximum, which never falls within a
    slice), so a stable sort interleaves the slices by time without reordering any: a record that came late
    within its partition stays behind the ones read before it. A time that cannot be had or compared, or a
    NaN, leaves the slices in the order given. With the kernels (`clasp.core.kernels`) a list of lists whose
    times are ints or floats is merged in C."""
    if len(slices) < 2:
        return list(slices[0]) if slices else []
    if kernels.C is not None:
        out = kernels.C.merge_by_time(slices, timestamp)
        if out is not None:
            return out
    records = list(chain.from_iterable(slices))
    places: list = []
    try:
        for s in slices:
            run = running_max(list(map(timestamp, s)))
            # A NaN compares false both ways: the running maximum keeps one only from the slice's first time on.
            if run and run[0] != run[0]:
                return records
            places += run
        order = sorted(range(len(records)), key=places.__getitem__)
    except Exception:
        return records
    return list(map(records.__getitem__, order))


def running_max(times: list) -> list:
    """The largest of `times` so far at each of them: `times` itself when none falls (checked in one pass in C,
    the common slice: a partition in time order), else a call of `max` a time."""
    try:
        if all(map(le, times, islice(times, 1, None))):
            return times
    except Exception:  # two times that do not compare side by side may still each compare with the maximum
        pass
    return list(accumulate(times, max))
