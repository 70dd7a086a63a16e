"""End-to-end completion and latency of input records, as pure bookkeeping (time is passed in).

Weight throwing: each admitted record is worth `root` units; workers return units as requests finish
and the record is complete when every unit is back, however its chained requests spread. Records are
admitted in chunks (one push message), so the per-record cost is one dict operation at most.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping

import numpy as np

from clasp.core.protocol import ROOT_WEIGHT

CHUNK_BITS = 20  # record id = chunk << CHUNK_BITS | index; a chunk holds at most 2**20 records
VECTOR_MIN = 64  # returns in one batch from which counting them with numpy pays


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


class Tracker:
    """Which admitted records are complete; latencies of those that completed."""

    def __init__(self, root: int = ROOT_WEIGHT):
        self.root = root
        self.chunks: dict[int, list] = {}  # chunk -> [t_admitted, records still open]
        self.partial: dict[int, int] = {}  # rid -> weight still out, for records partly returned
        self.next_chunk = 0
        self.admitted = 0
        self.completed = 0
        self.lost = 0
        self.overreturned = 0  # weight returned beyond a record's total: a runtime bug if ever > 0
        # After a worker died: records below `fence` were dispatched before the job was re-placed, so
        # some of their weight may have died with it. They are `suspects` (open ones, per chunk) until
        # `lose_suspects`; returns for records below `lost_below` (given up on) are ignored.
        self.fence = 0
        self.suspect_chunks: dict[int, int] = {}
        self.suspects = 0
        self.lost_below = 0
        self.interval = LatencyHistogram()
        self.cumulative = LatencyHistogram()

    @property
    def outstanding(self) -> int:
        return self.admitted - self.completed - self.lost

    def admit(self, n: int, now: float) -> int:
        """Admit n records entering at `now`; returns the first record id (the rest follow)."""
        if not 0 < n <= 1 << CHUNK_BITS:
            raise ValueError(f"chunk of {n} records")
        c = self.next_chunk
        self.next_chunk += 1
        self.chunks[c] = [now, n, n]  # admitted at, still open, size
        self.admitted += n
        return c << CHUNK_BITS

    def extend(self, rid: int, amount: int) -> None:
        """A worker split more ways than the record's weight allowed: it gets `amount` more."""
        if rid >= self.lost_below:
            self.partial[rid] = self.partial.get(rid, self.root) + amount

    def returned(self, returns: Mapping[int, int], now: float) -> int:
        """Apply weight returned by a worker; returns how many records completed."""
        if len(returns) >= VECTOR_MIN and not self.suspect_chunks:
            return self._returned_vector(returns, now)
        return self._count(self._returned_rids(returns.items(), {}), now)

    def _returned_vector(self, returns: Mapping[int, int], now: float) -> int:
        """`returned` for a large batch: the records whose whole weight came back at once (the common case,
        e.g. every record of a one-operator job) are counted per chunk with numpy; the rest one by one."""
        n = len(returns)
        whole = np.fromiter(returns.values(), np.int64, n) == self.root
        if whole.sum() * 2 < n:
            # Mostly parts of records (a record's requests finished on several workers): the masks and the
            # set operations below would cost more than the loop they leave most returns to.
            return self._count(self._returned_rids(returns.items(), {}), now)
        rids = np.fromiter(returns.keys(), np.int64, n)
        if self.lost_below:
            whole &= rids >= self.lost_below
        if self.partial:  # a record partly returned before is not whole now: it goes one by one
            both = self.partial.keys() & returns.keys()
            if both:
                whole &= ~np.isin(rids, np.fromiter(both, np.int64, len(both)))
        chunks, counts = np.unique(rids[whole] >> CHUNK_BITS, return_counts=True)
        done = dict(zip(chunks.tolist(), counts.tolist(), strict=True))
        if not whole.all():
            self._returned_rids([(rid, returns[rid]) for rid in rids[~whole].tolist()], done)
        return self._count(done, now)

    def _returned_rids(self, returns: Iterable[tuple[int, int]], done_chunks: dict[int, int]) -> dict[int, int]:
        """Apply returned (rid, weight) pairs one by one; adds to `done_chunks` (chunk -> records completed)."""
        partial, root = self.partial, self.root
        fence, lost_below = self.fence, self.lost_below
        for rid, w in returns:
            if rid < lost_below:
                continue  # weight of a record already counted as lost: it can no longer complete
            rem = partial.pop(rid, root) - w
            if rem > 0:
                partial[rid] = rem
                continue
            if rem < 0:
                self.overreturned += 1
            c = rid >> CHUNK_BITS
            done_chunks[c] = done_chunks.get(c, 0) + 1
            if rid < fence and c in self.suspect_chunks:
                self.suspect_chunks[c] -= 1
                self.suspects -= 1
        return done_chunks

    def _count(self, done_chunks: dict[int, int], now: float) -> int:
        n = 0
        for c, k in done_chunks.items():
            chunk = self.chunks.get(c)
            if chunk is None:
                continue
            lat = now - chunk[0]
            self.interval.add(lat, k)
            self.cumulative.add(lat, k)
            chunk[1] -= k
            n += k
            if chunk[1] <= 0:
                del self.chunks[c]
        self.completed += n
        return n

    def complete_now(self, rids: Iterable[int], now: float) -> int:
        """Records finished without any worker (e.g. the source's key function failed at the planner)."""
        return self.returned({rid: self.partial.get(rid, self.root) for rid in rids}, now)

    def suspect_below(self, fence: int) -> int:
        """A worker died: every record below `fence` (all dispatched, none above) may have lost weight
        with it. They stop counting as in flight until they complete or `lose_suspects` gives up on them;
        returns how many are open. A second death moves the fence up over everything dispatched since."""
        chunk_of_fence, offset = fence >> CHUNK_BITS, fence & ((1 << CHUNK_BITS) - 1)
        suspects: dict[int, int] = {}
        for c, (_, open_, size) in self.chunks.items():
            if c < chunk_of_fence:
                suspects[c] = open_
            elif c == chunk_of_fence and offset:
                suspects[c] = open_ - (size - offset)  # the rest of the chunk is not dispatched yet
        self.fence = max(self.fence, fence)
        self.suspect_chunks = {c: k for c, k in suspects.items() if k > 0}
        self.suspects = sum(self.suspect_chunks.values())
        return self.suspects

    def lose_suspects(self) -> int:
        """Give up on the suspects still open (no live worker holds anything of them); returns how many."""
        n = self.suspects
        for c, k in self.suspect_chunks.items():
            chunk = self.chunks.get(c)
            if chunk is not None:
                chunk[1] -= k
                if chunk[1] <= 0:
                    del self.chunks[c]
        fence = self.fence
        for rid in [r for r in self.partial if r < fence]:
            del self.partial[rid]
        self.lost += n
        self.lost_below = max(self.lost_below, fence)
        self.fence, self.suspect_chunks, self.suspects = 0, {}, 0
        return n

    def take_interval(self) -> dict:
        """Latency summary of completions since the last call."""
        s = self.interval.summary()
        self.interval = LatencyHistogram()
        return s
