"""An operator's input queue: requests `(op, value, key, rid)` in FIFO order, held as rows or as columns.

The keyed fast paths hand a stateful operator whose key is the value a batch of its requests as columns (the
values, and their record ids as runs: a line's words share its id) instead of one tuple per request: the producer
extends the values in C and appends one id and count per line, the executor runs the values in a tight loop and
counts progress per run, and no request is a Python object of its own while it waits. A source's batch reaches
the stateless operators after the source here the same way, as a `Run`: the batch's values and its first record
id (the ids are consecutive), so the operator's pass (`take_columns`) gets the values list and a `range` of ids,
and counts progress per epoch, not per record. A block or run sits in the same FIFO as the rows, so order
across the forms is the order of arrival. Everything that works row by row (migration scans, checkpoint
barriers, async and remote-state operators) sees rows: `popleft`, iteration and `take_rows` expand blocks and
runs as they reach them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import accumulate, chain, repeat
from operator import itemgetter

_VALUE, _RID = itemgetter(1), itemgetter(3)


class Block:
    """A run of requests to operator `op` whose keys are their values: values[pos:], their record ids held as
    runs (`rids[r]` for `counts[r]` consecutive values: a line's words share its id), of which the first
    `off` of run `run` are already taken; `groups`, when the sender had them, the key group of each value."""

    __slots__ = ("op", "values", "rids", "counts", "groups", "pos", "run", "off", "ends")

    def __init__(self, op: int, values: list, rids: list, counts: list, groups: list | None = None):
        self.op, self.values, self.rids, self.counts, self.groups = op, values, rids, counts, groups
        self.pos = self.run = self.off = 0
        self.ends: list | None = None  # the runs' cumulative counts, once `head` needs them

    def __len__(self) -> int:
        return len(self.values) - self.pos

    def runs(self) -> tuple[list, list]:
        """The remaining record ids as runs: (ids, counts)."""
        r, off = self.run, self.off
        if not r and not off:
            return self.rids, self.counts
        counts = self.counts[r:]
        counts[0] -= off
        return self.rids[r:], counts

    def values_left(self) -> list:
        return self.values[self.pos:] if self.pos else self.values

    def groups_left(self) -> list | None:
        g = self.groups
        return g[self.pos:] if g is not None and self.pos else g

    def rows(self):
        """The remaining requests as rows, built in C."""
        vs = self.values_left()
        return zip(repeat(self.op), vs, vs, chain.from_iterable(map(repeat, *self.runs())))

    def first(self) -> tuple:
        v = self.values[self.pos]
        return (self.op, v, v, self.rids[self.run])

    def pop(self) -> tuple:
        row = self.first()
        self.pos += 1
        self.off += 1
        if self.off == self.counts[self.run]:
            self.run += 1
            self.off = 0
        return row

    def head(self, k: int) -> Block:
        """A new block of the first `k` (< len) remaining requests, which are taken out of this one: the run
        holding the k-th found by bisection in the runs' cumulative ends (made once a block, in C), not by a
        walk over the runs."""
        ends = self.ends
        if ends is None:
            ends = self.ends = list(accumulate(self.counts))
        r, stop = self.run, self.pos + k
        j = bisect_left(ends, stop, r)  # the run of the last value taken: the first whose end reaches it
        part_counts = self.counts[r:j + 1]
        part_counts[0] -= self.off
        part_counts[-1] -= ends[j] - stop
        part = Block(self.op, self.values[self.pos:stop], self.rids[r:j + 1], part_counts,
                     None if self.groups is None else self.groups[self.pos:stop])
        self.pos = stop
        if ends[j] == stop:
            self.run, self.off = j + 1, 0
        else:
            self.run, self.off = j, self.counts[j] - (ends[j] - stop)
        return part


class Run:
    """Requests (op, v, None, start + i) for `values[i]`, i from `pos` on: a source's batch, whose record ids
    are consecutive, for a stateless operator (no key)."""

    __slots__ = ("op", "values", "start", "pos")

    def __init__(self, op: int, values: list, start: int):
        self.op, self.values, self.start = op, values, start
        self.pos = 0

    def __len__(self) -> int:
        return len(self.values) - self.pos

    def values_left(self) -> list:
        return self.values[self.pos:] if self.pos else self.values

    def rids(self) -> range:
        """The remaining requests' record ids."""
        return range(self.start + self.pos, self.start + len(self.values))

    def rows(self):
        """The remaining requests as rows, built in C."""
        return zip(repeat(self.op), self.values_left(), repeat(None), self.rids())

    def first(self) -> tuple:
        return (self.op, self.values[self.pos], None, self.start + self.pos)

    def pop(self) -> tuple:
        row = self.first()
        self.pos += 1
        return row

    def head(self, k: int) -> Run:
        """A new run of the first `k` (< len) remaining requests, which are taken out of this one."""
        part = Run(self.op, self.values[self.pos:self.pos + k], self.start + self.pos)
        self.pos += k
        return part


_SEGMENTS = (Block, Run)  # what a queue holds besides rows


class RecordQueue:
    """A FIFO of requests with deque's row interface (`append`, `extend`, `extendleft`, `popleft`, `clear`,
    `len`, iteration, `[0]`) plus `append_block`, `append_run`, `take` and `take_columns` for the column fast
    paths."""

    __slots__ = ("_items", "_n", "_blocks")

    def __init__(self):
        self._items: deque = deque()
        self._n = 0  # requests, not items: a block counts its values
        self._blocks = 0  # blocks and runs among the items: with none, `take` moves rows in C

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def append(self, row) -> None:
        self._items.append(row)
        self._n += 1

    def extend(self, rows) -> None:
        items = self._items
        before = len(items)
        items.extend(rows)
        self._n += len(items) - before

    def extendleft(self, rows) -> None:
        items = self._items
        before = len(items)
        items.extendleft(rows)
        self._n += len(items) - before

    def append_block(self, op: int, values: list, rids: list, counts: list, groups: list | None = None) -> None:
        """Requests (op, v, v, rid) for `values` in order, their ids `rids[r]` repeated `counts[r]` times (the
        counts sum to len(values)), and the key group of each if known: the lists are the queue's from now
        on."""
        if values:
            self._items.append(Block(op, values, rids, counts, groups))
            self._n += len(values)
            self._blocks += 1

    def append_run(self, op: int, values: list, start: int) -> None:
        """Requests (op, v, None, start + i) for `values` in order (a list the queue only reads from now on:
        several successors of one source may share it)."""
        if values:
            self._items.append(Run(op, values, start))
            self._n += len(values)
            self._blocks += 1

    def clear(self) -> None:
        self._items.clear()
        self._n = self._blocks = 0

    def popleft(self):
        items = self._items
        x = items[0]
        if type(x) in _SEGMENTS:
            row = x.pop()
            if x.pos == len(x.values):
                items.popleft()
                self._blocks -= 1
        else:
            items.popleft()
            row = x
        self._n -= 1
        return row

    def __getitem__(self, i: int):
        if i != 0:
            raise IndexError("a record queue gives its first request only")
        x = self._items[0]
        if type(x) in _SEGMENTS:
            return x.first()
        return x

    def __iter__(self):
        for x in self._items:
            if type(x) in _SEGMENTS:
                yield from x.rows()
            else:
                yield x

    def take(self, n: int) -> list:
        """The first `n` requests, out of the queue, as segments in order: a list of rows, a Block or a Run."""
        items = self._items
        if not self._blocks:
            if n >= len(items):
                rows = list(items)
                items.clear()
            else:
                rows = list(map(deque.popleft, repeat(items, n)))  # the loop in C
            self._n -= len(rows)
            return [rows] if rows else []
        out: list = []
        rows: list | None = None
        left = n
        while left and items:
            x = items[0]
            if type(x) in _SEGMENTS:
                if rows is not None:
                    out.append(rows)
                    rows = None
                k = len(x)
                if k <= left:
                    items.popleft()
                    self._blocks -= 1
                    out.append(x)
                    left -= k
                else:
                    out.append(x.head(left))
                    left = 0
            else:
                if rows is None:
                    rows = []
                rows.append(items.popleft())
                left -= 1
        if rows is not None:
            out.append(rows)
        self._n -= n - left
        return out

    def take_rows(self, n: int) -> list:
        """The first `n` requests, out of the queue, as rows."""
        parts = self.take(n)
        if len(parts) == 1 and type(parts[0]) is list:
            return parts[0]
        return list(chain.from_iterable(s if type(s) is list else s.rows() for s in parts))

    def take_columns(self, n: int) -> list[tuple[list, range | list]]:
        """The first `n` requests, out of the queue, as columns: (values, record ids) per segment, in order; a
        run's ids as a `range` (a stateless operator's pass needs no key)."""
        out = []
        for s in self.take(n):
            t = type(s)
            if t is Run:
                out.append((s.values_left(), s.rids()))
            elif t is list:
                out.append((list(map(_VALUE, s)), list(map(_RID, s))))
            else:
                rows = list(s.rows())
                out.append((list(map(_VALUE, rows)), list(map(_RID, rows))))
        return out
