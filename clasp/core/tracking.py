"""End-to-end completion and latency of input records, as pure bookkeeping (time is passed in).

Epoch progress, after timely dataflow's progress tracking (its pointstamps, here per operator): records
are admitted in chunks (one push message) and each chunk is cut into epochs of `EPOCH_SIZE` consecutive
record ids; every request carries its record's id, so its epoch is `rid >> EPOCH_BITS`. The planner
counts what it dispatched to each source operator per epoch; each worker counts per (epoch, operator) the
requests it finished (-1) and the chained requests they produced (+1 at each successor) and reports both
together in one message. An epoch is complete when the planner has sent all its records and every count
is back at zero. Counts are kept per operator, not summed: a request finished on one worker may be
reported before the report of the worker that produced it, which leaves its operator's count below zero
and its parent's above, and the epoch open, until that report comes. Nothing is kept per record.

Records a worker reads from a source enter at that worker, not at the planner: the worker leases ranges of
chunk ids from the planner (`lease`), gives each batch it reads the next chunk of its lease, and reports
the batch *sealed* (`sealed`: its size and the requests it handed to the source's successors), on the same
ordered channel as its progress reports, at the end of the turn of its event loop that read it. A report,
from another worker or from this one, about a leased chunk whose seal has not arrived yet opens the epoch
unsealed: it cannot complete before the seal. A rollback forgets every source chunk at or above the
checkpoint's boundary (its records are read again, as new chunks) and voids the leases: a late report about
them is ignored.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import repeat

import numpy as np

from clasp.core import kernels

CHUNK_BITS = 20  # record id = chunk << CHUNK_BITS | index; a chunk holds at most 2**20 records
EPOCH_BITS = 9  # epoch = record id >> EPOCH_BITS: up to 512 consecutive records of one chunk
EPOCH_SIZE = 1 << EPOCH_BITS
UNSEALED = -1  # an epoch's "records not sent yet" while the reader's seal of its chunk has not arrived


class LatencyHistogram:
    """Log-spaced latency histogram (5% bucket width, 10 µs .. ~3 h) with weighted percentiles."""

    RATIO = 1.05
    LOW = 1e-5

    def __init__(self):
        n = int(np.ceil(np.log(1e4 / self.LOW) / np.log(self.RATIO))) + 1
        self.bounds = self.LOW * self.RATIO ** np.arange(n)
        self._bounds = self.bounds.tolist()  # bisect on a list: a scalar's bucket without numpy's call cost
        self.counts = np.zeros(n + 1, dtype=np.int64)
        self.total = 0
        self.sum = 0.0

    def add(self, latency: float, count: int = 1) -> None:
        i = bisect_left(self._bounds, latency)
        self.counts[i] += count
        self.total += count
        self.sum += latency * count

    def merge(self, other: LatencyHistogram) -> None:
        self.counts += other.counts
        self.total += other.total
        self.sum += other.sum

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100), as the upper bound of its bucket; None when empty."""
        if self.total == 0:
            return None
        rank = q / 100.0 * self.total
        i = int(np.searchsorted(np.cumsum(self.counts), max(rank, 1), side="left"))
        return float(self.bounds[min(i, len(self.bounds) - 1)])

    def summary(self) -> dict:
        return {"count": self.total, "mean": (self.sum / self.total) if self.total else None,
                "p50": self.percentile(50), "p95": self.percentile(95), "p99": self.percentile(99)}


def epochs_of_runs(rids: Iterable[int], counts: Iterable[int] | None, made: Iterable[int] | None,
                   ) -> list[tuple[int, int, int]]:
    """(epoch, requests, children) per stretch of one epoch in runs of record ids: `rids[r]` stands for
    `counts[r]` requests (None: one each) that made `made[r]` children (None: none) (the batch-at-a-time path
    counts progress so, per run rather than per request). In C (`clasp.core.kernels`) for lists."""
    if (kernels.C is not None and type(rids) is list and (counts is None or type(counts) is list)
            and (made is None or type(made) is list)
            and len(rids) <= min(len(counts) if counts is not None else len(rids),
                                 len(made) if made is not None else len(rids))):
        try:
            return kernels.C.epochs_of_runs(rids, counts, made, EPOCH_BITS)
        except (OverflowError, TypeError):  # beyond 64 bits, or not ints: Python's arithmetic
            pass
    return _epochs_of_runs(rids, repeat(1) if counts is None else counts, repeat(0) if made is None else made)


def _epochs_of_runs(rids: Iterable[int], counts: Iterable[int], made: Iterable[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    cur, used, kids = -1, 0, 0
    for rid, c, m in zip(rids, counts, made, strict=False):  # `counts` or `made` may be an endless repeat()
        e = rid >> EPOCH_BITS
        if e != cur:
            if used:
                out.append((cur, used, kids))
            cur, used, kids = e, 0, 0
        used += c
        kids += m
    if used:
        out.append((cur, used, kids))
    return out


def epoch_counts(rids: Iterable[int]) -> dict[int, int]:
    """How many of the record ids `rids` fall in each epoch: what `epochs_of_runs` gives summed per epoch (a run
    that made no children needs no more). A pass's ids come in a few stretches of one epoch each, so the
    kernel's stretches summed here cost less than a `Counter` (a few µs to build, a pass of ~20 requests)."""
    if kernels.C is None:
        return Counter(map(EPOCH_BITS.__rrshift__, rids))
    out: dict[int, int] = {}
    for e, used, _ in epochs_of_runs(rids if type(rids) is list else list(rids), None, None):
        out[e] = out.get(e, 0) + used
    return out


def epoch_spans(rids: range) -> list[tuple[int, int, int]]:
    """(epoch, first index, end index) of each epoch's stretch of the consecutive record ids `rids` (a source's
    batch): O(epochs), not O(records)."""
    out = []
    i, rid, end = 0, rids.start, rids.stop
    while rid < end:
        e = rid >> EPOCH_BITS
        stop = min(end, (e + 1) << EPOCH_BITS)
        out.append((e, i, i + stop - rid))
        i += stop - rid
        rid = stop
    return out


def add_range(counts: dict[int, dict[int, int]], op: int, first: int, n: int) -> None:
    """Count `n` requests of operator `op` for the records `first .. first + n - 1` into `counts`
    (epoch -> {operator: requests}), epoch by epoch: O(epochs), not O(records)."""
    rid, end = first, first + n
    while rid < end:
        e = rid >> EPOCH_BITS
        stop = min(end, (e + 1) << EPOCH_BITS)
        c = counts.setdefault(e, {})
        c[op] = c.get(op, 0) + stop - rid
        rid = stop


def _merge(counts: dict[int, int], delta: Mapping[int, int]) -> None:
    """Add `delta` to `counts` (operator -> requests outstanding), keeping no zero entry."""
    for op, k in delta.items():
        v = counts.get(op, 0) + k
        if v:
            counts[op] = v
        else:
            counts.pop(op, None)


class Tracker:
    """Which admitted records are complete, epoch by epoch; latencies of those that completed."""

    def __init__(self):
        self.chunks: dict[int, list] = {}  # chunk -> [t_admitted, records still open, size]
        # Open epochs that have started to leave the planner: epoch -> [records not sent yet, size,
        # {operator: requests outstanding}].
        self.epochs: dict[int, list] = {}
        self.next_chunk = 0
        self.admitted = 0
        self.completed = 0
        self.lost = 0
        self.unknown = 0  # counts for an epoch never dispatched: a runtime bug if ever > 0
        # After a worker died: the epochs dispatched below `fence` (a record id) may have lost requests with
        # it. They are `suspect_epochs` until they complete or `lose_suspects` gives up on them;
        # counts for epochs below `lost_below` (given up on) are ignored.
        self.fence = 0
        self.suspect_epochs: set[int] = set()
        self.lost_below = 0
        self.interval = LatencyHistogram()
        self.cumulative = LatencyHistogram()
        # Source chunks: the leased ranges [first, end) still valid (increasing), every sealed chunk's size
        # down to the last checkpoint (`forget_sources_below`), who read it (its credit goes back there).
        self.lease_starts: list[int] = []
        self.lease_ends: list[int] = []
        self.source_sizes: dict[int, int] = {}
        self.readers: dict[int, str] = {}
        self.credit: dict[str, int] = {}  # reader -> records of its chunks completed, not taken yet
        self.read = 0  # of `admitted`, the records read from sources
        # Sealed chunks that hold windows a worker fired at a watermark (`produced`), not records read:
        # tracked alike, left out of `read` and `read_done`.
        self.produced: set[int] = set()
        self.read_done = 0  # of `completed`, those records

    @property
    def outstanding(self) -> int:
        return self.admitted - self.completed - self.lost

    @property
    def suspects(self) -> int:
        """Records of the suspect epochs that were dispatched (they stop counting as in flight)."""
        eps = self.epochs
        return sum(eps[e][1] - max(eps[e][0], 0) for e in self.suspect_epochs if e in eps)

    def admit(self, n: int, now: float) -> int:
        """Admit n records entering at `now`; returns the first record id (the rest follow)."""
        if not 0 < n <= 1 << CHUNK_BITS:
            raise ValueError(f"chunk of {n} records")
        c = self.next_chunk
        self.next_chunk += 1
        self.chunks[c] = [now, n, n]
        self.admitted += n
        return c << CHUNK_BITS

    def lease(self, n: int) -> int:
        """Lease `n` chunk ids to a worker reading a source; returns the first (the rest follow)."""
        if n <= 0:
            raise ValueError(f"lease of {n} chunks")
        first = self.next_chunk
        self.next_chunk += n
        self.lease_starts.append(first)
        self.lease_ends.append(first + n)
        return first

    def leased(self, chunk: int) -> bool:
        """Whether `chunk` is in a valid lease (not rolled back)."""
        i = bisect_right(self.lease_starts, chunk) - 1
        return i >= 0 and chunk < self.lease_ends[i]

    def sealed(self, chunk: int, n: int, counts: Mapping[int, Mapping[int, int]], now: float,
               reader: str | None = None) -> int:
        """A worker read `n` records as source chunk `chunk` and handed them to the source's successors,
        `counts` of them to each (epoch -> {operator: requests}). A chunk outside every valid lease, or
        sealed already, is ignored. Returns how many records completed."""
        if chunk in self.source_sizes or not self.leased(chunk) or not 0 < n <= 1 << CHUNK_BITS:
            return 0
        self.source_sizes[chunk] = n
        if reader is not None:
            self.readers[chunk] = reader
        self.chunks[chunk] = [now, n, n]
        self.admitted += n
        if chunk not in self.produced:
            self.read += n
        epochs = self.epochs
        touched = []
        rid = first = chunk << CHUNK_BITS
        end = first + n
        while rid < end:
            e = rid >> EPOCH_BITS
            stop = min(end, (e + 1) << EPOCH_BITS)
            ep = epochs.get(e)
            if ep is None:
                epochs[e] = [0, stop - rid, {}]
            else:  # opened unsealed by a report that overtook the seal
                ep[0], ep[1] = 0, stop - rid
            touched.append(e)
            rid = stop
        for e, c in counts.items():
            ep = epochs.get(e)
            if ep is not None:
                _merge(ep[2], c)
        return self._complete(touched, now)

    def take_credit(self) -> dict[str, int]:
        """Per reader, the records of its source chunks that completed since the last call."""
        c, self.credit = self.credit, {}
        return c

    def forget_sources_below(self, chunk: int) -> None:
        """A checkpoint at `chunk` is complete: no rollback goes below it, the sizes kept for one can go."""
        for c in [c for c in self.source_sizes if c < chunk and c not in self.chunks]:
            del self.source_sizes[c]
            self.produced.discard(c)

    def _epoch_size(self, e: int) -> int:
        first = e << EPOCH_BITS
        size = self.chunks[first >> CHUNK_BITS][2]
        return min(EPOCH_SIZE, size - (first & ((1 << CHUNK_BITS) - 1)))

    def dispatched(self, first: int, n: int, counts: Mapping[int, Mapping[int, int]], now: float) -> int:
        """Records `first .. first + n - 1` left the planner (the contiguous part of one chunk a dispatch
        took), `counts` of them sent to each source operator (epoch -> {operator: requests}); a record
        sent nowhere (its key function failed) is done. Returns how many records completed."""
        epochs, lost_below = self.epochs, self.lost_below
        touched = []
        rid, end = first, first + n
        while rid < end:
            e = rid >> EPOCH_BITS
            stop = min(end, (e + 1) << EPOCH_BITS)
            if e >= lost_below:
                ep = epochs.get(e)
                if ep is None:
                    size = self._epoch_size(e)
                    ep = epochs[e] = [size, size, {}]
                ep[0] -= stop - rid
                touched.append(e)
            rid = stop
        for e, c in counts.items():
            ep = epochs.get(e)
            if ep is None:
                continue
            _merge(ep[2], c)
        return self._complete(touched, now)

    def progress(self, deltas: Mapping[int, Mapping[int, int]], now: float) -> int:
        """Apply a worker's report, epoch -> {operator: requests produced minus finished there}; returns
        how many records completed."""
        epochs, lost_below = self.epochs, self.lost_below
        balanced = []  # most epochs of a report stay open: only those that balance go on to `_complete`
        for e, d in deltas.items():
            ep = epochs.get(e)
            if ep is None:
                c = (e << EPOCH_BITS) >> CHUNK_BITS
                if e < lost_below:
                    continue
                if c not in self.chunks and c not in self.source_sizes and self.leased(c):
                    ep = epochs[e] = [UNSEALED, 0, {}]  # its reader's seal is on its way
                else:
                    if c in self.chunks:
                        self.unknown += 1
                    continue  # an epoch given up on, or rolled back and not dispatched again yet
            counts = ep[2]
            _merge(counts, d)
            if not counts and not ep[0]:
                balanced.append(e)
        return self._complete(balanced, now) if balanced else 0

    def _complete(self, touched: list[int], now: float) -> int:
        epochs, chunks = self.epochs, self.chunks
        n = 0
        for e in touched:
            ep = epochs.get(e)
            if ep is None or ep[0] or ep[2]:
                continue
            del epochs[e]
            size = ep[1]
            c = e >> (CHUNK_BITS - EPOCH_BITS)
            chunk = chunks[c]
            lat = now - chunk[0]
            self.interval.add(lat, size)
            self.cumulative.add(lat, size)
            chunk[1] -= size
            if chunk[1] <= 0:
                del chunks[c]
                reader = self.readers.pop(c, None)
                if reader is not None:
                    self.credit[reader] = self.credit.get(reader, 0) + chunk[2]
            if c in self.source_sizes and c not in self.produced:
                self.read_done += size
            self.suspect_epochs.discard(e)
            n += size
        self.completed += n
        return n

    def open_epochs(self) -> dict[int, dict[int, int]]:
        """Every open epoch's outstanding requests per operator (a copy, for statistics and tests)."""
        return {e: dict(ep[2]) for e, ep in self.epochs.items()}

    def oldest_chunk(self) -> int | None:
        """The oldest chunk still open (source chunks are sealed out of order: not the first in `chunks`)."""
        return min(self.chunks, default=None)

    def suspect_below(self, fence: int) -> int:
        """A worker died: every epoch dispatched below record id `fence` (all dispatched records are below
        it) may have lost requests with it. They stop counting as in flight until they complete or
        `lose_suspects` gives up on them; returns how many dispatched records they hold. A second death
        moves the fence up over everything dispatched since."""
        self.fence = max(self.fence, fence)
        limit = (self.fence + EPOCH_SIZE - 1) >> EPOCH_BITS
        self.suspect_epochs = {e for e in self.epochs if e < limit}
        return self.suspects

    def lose_suspects(self) -> int:
        """Give up on the suspect epochs still open (no live worker holds anything of them): every record of
        them counts as lost, those not dispatched yet included (they will run, uncounted). Returns how many."""
        n = 0
        for e in self.suspect_epochs:
            ep = self.epochs.pop(e, None)
            if ep is None:
                continue
            size = ep[1]
            c = e >> (CHUNK_BITS - EPOCH_BITS)
            chunk = self.chunks.get(c)
            if chunk is not None:
                chunk[1] -= size
                if chunk[1] <= 0:
                    del self.chunks[c]
                    self.readers.pop(c, None)
            n += size
        self.lost += n
        self.lost_below = max(self.lost_below, (self.fence + EPOCH_SIZE - 1) >> EPOCH_BITS)
        self.fence, self.suspect_epochs = 0, set()
        return n

    def rollback(self, boundary: int, chunks: Mapping[int, tuple[float, int]]) -> tuple[int, int]:
        """Make every record of the chunks at or above `boundary` open again, as admitted (`chunks`: chunk
        -> (admission time, size), every chunk admitted from `boundary` on): their epochs start over.
        Returns (records reopened, of those the ones that had completed)."""
        first_epoch = boundary << (CHUNK_BITS - EPOCH_BITS)
        self.epochs = {e: ep for e, ep in self.epochs.items() if e < first_epoch}
        self.suspect_epochs = {e for e in self.suspect_epochs if e < first_epoch}
        uncompleted = reopened = 0
        # Source chunks at or above the boundary are read again from the checkpoint's positions, as new
        # chunks of new leases: these are forgotten, and every lease is void.
        for c in [c for c in self.source_sizes if c >= boundary]:
            size = self.source_sizes.pop(c)
            old = self.chunks.pop(c, None)
            done = size - (old[1] if old is not None else 0)
            self.admitted -= size
            self.completed -= done
            if c in self.produced:
                self.produced.discard(c)
            else:
                self.read -= size
                self.read_done -= done
            self.readers.pop(c, None)
        self.lease_starts, self.lease_ends = [], []
        for c, (t, size) in chunks.items():
            if c < boundary:
                continue
            old = self.chunks.get(c)
            uncompleted += size - (old[1] if old is not None else 0)
            reopened += size
            self.chunks[c] = [t, size, size]
        self.chunks = dict(sorted(self.chunks.items()))
        self.completed -= uncompleted
        return reopened, uncompleted

    def take_interval(self) -> dict:
        """Latency summary of completions since the last call."""
        s = self.interval.summary()
        self.interval = LatencyHistogram()
        return s
