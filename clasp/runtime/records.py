"""An operator's input queue: requests `(op, value, key, rid)` in FIFO order, held as rows or as column blocks.

The keyed fast paths hand a stateful operator whose key is the value a batch of its requests as two columns (the
values, and one record id per value) instead of one tuple per request: the producer extends two lists in C, the
executor zips them back in C, and no request is a Python object of its own while it waits. A block sits in the
same FIFO as the rows, so order across the two forms is the order of arrival. Everything that works row by row
(migration scans, checkpoint barriers, async and remote-state operators) sees rows: `popleft`, iteration and
`take_rows` expand blocks as they reach them.
"""

from __future__ import annotations

from collections import deque
from itertools import chain, repeat


class Block:
    """A run of requests to operator `op` whose keys are their values: values[pos:], rids[pos:]."""

    __slots__ = ("op", "values", "rids", "pos")

    def __init__(self, op: int, values: list, rids: list):
        self.op, self.values, self.rids, self.pos = op, values, rids, 0

    def __len__(self) -> int:
        return len(self.values) - self.pos

    def rows(self):
        """The remaining requests as rows, built in C."""
        p = self.pos
        vs = self.values if not p else self.values[p:]
        return zip(repeat(self.op), vs, vs, self.rids[p:] if p else self.rids)


class RecordQueue:
    """A FIFO of requests with deque's row interface (`append`, `extend`, `extendleft`, `popleft`, `clear`,
    `len`, iteration, `[0]`) plus `append_block` and `take` for the column fast path."""

    __slots__ = ("_items", "_n", "_blocks")

    def __init__(self):
        self._items: deque = deque()
        self._n = 0  # requests, not items: a block counts its values
        self._blocks = 0  # blocks among the items: with none, `take` moves rows in C

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

    def append_block(self, op: int, values: list, rids: list) -> None:
        """Requests (op, v, v, rid) for v, rid in zip(values, rids): the lists are the queue's from now on."""
        if values:
            self._items.append(Block(op, values, rids))
            self._n += len(values)
            self._blocks += 1

    def clear(self) -> None:
        self._items.clear()
        self._n = self._blocks = 0

    def popleft(self):
        items = self._items
        x = items[0]
        if type(x) is Block:
            p = x.pos
            v = x.values[p]
            row = (x.op, v, v, x.rids[p])
            x.pos = p + 1
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
        if type(x) is Block:
            v = x.values[x.pos]
            return (x.op, v, v, x.rids[x.pos])
        return x

    def __iter__(self):
        for x in self._items:
            if type(x) is Block:
                yield from x.rows()
            else:
                yield x

    def take(self, n: int) -> list:
        """The first `n` requests, out of the queue, as segments in order: a list of rows, or a Block."""
        items = self._items
        if not self._blocks:
            if n >= len(items):
                rows = list(items)
                items.clear()
            else:
                pop = items.popleft
                rows = [pop() for _ in range(n)]
            self._n -= len(rows)
            return [rows] if rows else []
        out: list = []
        rows: list | None = None
        left = n
        while left and items:
            x = items[0]
            if type(x) is Block:
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
                    p = x.pos
                    out.append(Block(x.op, x.values[p:p + left], x.rids[p:p + left]))
                    x.pos = p + left
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
