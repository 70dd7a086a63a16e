"""Credit flow between a pushing client and the planner's queue, in bytes (pure: no sockets).

The planner bounds each job's accepted-but-not-dispatched input (Q_p) by a record count and by bytes
(`QueueBound`). A record's bytes are measured cheaply: the length of the msgpack'd `push` frame the
planner already received, plus `RECORD_OVERHEAD` per record for what holding it costs beyond its
encoding (its Python object and its slot in the chunk's list), so the bound tracks memory for small
records too (`charge`). `ByteQueue` keeps each queued chunk's charge, in the queue's order, and gives
back the bytes of the records that leave it.

The client (`PushCredit`) sends a chunk only while the bytes it has in flight fit the credit of the
last acknowledgement, `max_bytes - queued_bytes` when the planner sent it; with nothing in flight it may
always send one chunk (so it never stalls). The planner acknowledges a chunk only while the job is
within its bound (it defers the rest), so one client keeps the queue within the bound plus one chunk.
Chunks are sized in bytes too (`chunk_records`): records per chunk follow the last chunk's measured
bytes per record, so large records make small chunks.

A bound in bytes alone lets an admitted record wait as long as the bound takes to drain (128 MB of
Word Count lines is half a minute on one worker). So the bound is also in time (`--max-queue-delay`):
the planner measures the rate its dispatch drains each job's queue while it holds a backlog
(`drain_rate`, smoothed), and the job's limit is what that rate drains in `max_delay` seconds, within
[`floor`, `max_bytes`] (`QueueBound.limit`). Several clients pushing to one job share its credit
(`credit(..., clients=k)`), so together they overshoot by at most one chunk each.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

DEFAULT_MAX_QUEUED_BYTES = 128 << 20  # per job: the planner's --max-queued-bytes
DEFAULT_MAX_QUEUED = 2_000_000  # per job, records (the planner's max_queue)
DEFAULT_MAX_QUEUE_DELAY = 2.0  # s: what an admitted record may wait in the queue (the planner's --max-queue-delay)
DRAIN_SMOOTHING = 0.3  # weight of the newest second in the drain rate's moving average
RECORD_OVERHEAD = 64  # bytes one queued record costs the planner beyond its msgpack bytes
# The most bytes a client puts in one push (fewer when the bound is small). Each push costs the planner's
# event loop ~0.5 ms whatever its size (its segments' check, admission, the log's hand-back, the ack) and the
# input log's thread a record head, a write and a share of a group's fdatasync: at 1 MB, Word Count paid it
# every ~9,000 lines. The window then holds 8 pushes of 2 MB (the client's memory), and a checkpoint's cut,
# which waits for a chunk's last records to leave the queue, up to one 2 MB chunk's dispatch.
CHUNK_BYTES = 2 << 20
CHUNK_RECORDS = 20000  # the most records in one push (fewer pushes: fewer acks, log files, admissions)
FIRST_CHUNK = 64  # records in a client's first push, before it knows their size


def parse_size(text: str) -> int:
    """A size in bytes, > 0: `N`, or with a suffix K, M or G (powers of 1024), e.g. `128M`; ValueError else."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        v = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise ValueError(f"not a size in bytes (N, NK, NM or NG): {text}") from None
    if v <= 0:
        raise ValueError(f"must be > 0, not {text}")
    return v


def charge(frame_bytes: int, records: int) -> int:
    """The bytes a push of `records` records arriving in a frame of `frame_bytes` bytes costs the queue."""
    return frame_bytes + records * RECORD_OVERHEAD


def share(total: int, size: int, start: int, count: int) -> int:
    """The part of `total` bytes charged to records `start .. start + count - 1` of a chunk of `size`
    records, so that the parts of a chunk taken in any steps sum to `total` exactly."""
    if size <= 0:
        return total
    end = min(start + count, size)
    return total * end // size - total * start // size


@dataclass(frozen=True, slots=True)
class QueueBound:
    """A job's bound on its queue: `max_records` records, `max_bytes` bytes, and (`max_delay` > 0) what
    its dispatch drains in `max_delay` seconds."""

    max_records: int = DEFAULT_MAX_QUEUED
    max_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_delay: float = 0.0

    def within(self, records: int, nbytes: int, limit: int | None = None) -> bool:
        """True while a queue of `records` records and `nbytes` bytes may acknowledge a push (`limit`:
        the job's bytes limit now, `limit()`; default `max_bytes`)."""
        return records <= self.max_records and nbytes <= (self.max_bytes if limit is None else limit)

    def credit(self, nbytes: int, limit: int | None = None, clients: int = 1) -> int:
        """Bytes one of `clients` pushing clients may send beyond what the queue holds now (`nbytes`)."""
        return max(0, (self.max_bytes if limit is None else limit) - nbytes) // max(1, clients)

    def chunk_bytes(self) -> int:
        """The byte size a client aims each push at: an eighth of the bound, at most `CHUNK_BYTES`."""
        return max(1, min(CHUNK_BYTES, self.max_bytes // 8))

    def floor(self) -> int:
        """The least a time bound lets the queue hold: a full window of chunks (8), so that the client's
        pipelining alone never starves the dispatch."""
        return min(self.max_bytes, 8 * self.chunk_bytes())

    def limit(self, drain_rate: float | None) -> int:
        """The bytes the queue may hold: L = min(max_bytes, max(floor, r · max_delay)) for a queue drained
        at r bytes/s; before r is measured, the floor (an unknown rate is not trusted with 128 MB)."""
        if self.max_delay <= 0:
            return self.max_bytes
        if drain_rate is None:
            return self.floor()
        return min(self.max_bytes, max(self.floor(), int(drain_rate * self.max_delay)))


def drain_rate(prev: float | None, drained: int, dt: float, backlog: bool) -> float | None:
    """The queue's drain rate in bytes/s after a tick of `dt` s that dispatched `drained` bytes, over the
    ticks with a backlog throughout (`backlog`; a tick without one leaves it as it was: the dispatch then
    waited for input, which says nothing of how fast it could drain). It falls at once to a slower tick
    and rises as a moving average: what is admitted on a fast tick has to drain on the slow ones after."""
    if not backlog or dt <= 0:
        return prev
    r = drained / dt
    return r if prev is None or r < prev else prev + DRAIN_SMOOTHING * (r - prev)


class ByteQueue:
    """The charge of each chunk of a job's queue, in the queue's order; `total` is the queue's bytes."""

    __slots__ = ("charges", "total")

    def __init__(self) -> None:
        self.charges: deque[int] = deque()
        self.total = 0

    def admit(self, nbytes: int) -> None:
        self.charges.append(nbytes)
        self.total += nbytes

    def taken(self, size: int, offset: int, count: int) -> int:
        """Records `offset .. offset + count - 1` left the head chunk (of `size` records): their bytes
        leave the total, and the chunk's charge leaves with its last record. Returns the bytes."""
        if not self.charges or count <= 0:
            return 0
        out = share(self.charges[0], size, offset, count)
        self.total -= out
        if offset + count >= size:
            self.charges.popleft()  # the chunk's shares taken so far sum to its charge exactly
        return out

    def clear(self) -> None:
        self.charges.clear()
        self.total = 0

    def __len__(self) -> int:
        return len(self.charges)


def source_window(completed: int, seconds: float, least: int, most: int, span: float, cycle: float = 0.0) -> int:
    """A worker's source window (records its readers keep in flight) for readers whose records completed at
    `completed / seconds` a second and came back as credit `cycle` seconds after they were read at the
    quickest: what completes in `cycle + span` seconds, at least `least` and at most `most` (`most` alone
    when it is the smaller). A window that covers only `span` while credit takes longer than that to come
    back keeps the readers waiting on credit, and the rate it then measures is the window's, which sizes
    the next window no larger: between two workers (a record's credit waits for both to report) it sank to
    `least` with the workers half idle. Counting the cycle in, a window the credit limits grows by
    `span / cycle` each measure until the worker, not the credit, sets the rate; one far beyond the rate
    holds records a checkpoint's barrier waits for to no gain."""
    rate = completed / seconds if seconds > 0 else 0.0
    return min(most, max(least, int(rate * (cycle + span))))


class CreditCycle:
    """How long a source's records take to come back as credit: records are admitted in order (`admitted`)
    and credited in order (`credited`, which returns the age of the last record it credits). The quickest
    of these since `take_quickest` is the cycle `source_window` counts in: the report interval and the
    round trips, not the queueing the window itself adds. Records never credited (lost with a worker) are
    dropped oldest first once more are held than are in flight (`credited`'s `inflight`)."""

    __slots__ = ("admits", "held", "quickest")

    def __init__(self) -> None:
        self.admits: deque[list] = deque()  # [when admitted, records of it not credited yet], oldest first
        self.held = 0  # records in `admits`
        self.quickest: float | None = None

    def admitted(self, now: float, records: int) -> None:
        if records > 0:
            self.admits.append([now, records])
            self.held += records

    def credited(self, now: float, records: int, inflight: int | None = None) -> float | None:
        """`records` credited at `now`, the oldest first; `inflight`: the records still in flight after them."""
        age = None
        admits = self.admits
        if inflight is not None:  # more held than in flight: the oldest were lost, not credited
            records += max(0, self.held - records - inflight)
        while records > 0 and admits:
            head = admits[0]
            age = now - head[0]
            took = min(records, head[1])
            head[1] -= took
            records -= took
            self.held -= took
            if not head[1]:
                admits.popleft()
        if age is not None and (self.quickest is None or age < self.quickest):
            self.quickest = age
        return age

    def take_quickest(self) -> float:
        """The quickest cycle since the last take (0.0 if nothing was credited), and a new measure begun."""
        q, self.quickest = self.quickest, None
        return q or 0.0


def chunk_records(target_bytes: int, bytes_per_record: float | None, most: int = CHUNK_RECORDS) -> int:
    """Records for the next push: about `target_bytes` at the last measured `bytes_per_record`
    (`FIRST_CHUNK` before any was measured), between 1 and `most`."""
    if bytes_per_record is None:
        return max(1, min(most, FIRST_CHUNK))
    return max(1, min(most, int(target_bytes // max(bytes_per_record, 1.0))))


class PushCredit:
    """The client's side: what it has in flight (pushes sent, not acknowledged, in order), and the
    credit of the last acknowledgement (None before the first: then one push at a time)."""

    __slots__ = ("window", "inflight", "inflight_bytes", "credit", "target", "per_record")

    def __init__(self, window: int = 8, target_bytes: int = CHUNK_BYTES):
        self.window = window
        self.inflight: deque[tuple[int, int]] = deque()  # (request id, bytes charged)
        self.inflight_bytes = 0
        self.credit: int | None = None
        self.target = target_bytes
        self.per_record: float | None = None

    def may_send(self, nbytes: int) -> bool:
        """Whether a push of `nbytes` may go now: always with nothing in flight, else while the window
        has room and everything in flight since the last acknowledgement fits its credit."""
        if not self.inflight:
            return True
        if len(self.inflight) >= self.window or self.credit is None:
            return False
        return self.inflight_bytes + nbytes <= self.credit

    def sent(self, req: int, nbytes: int, records: int) -> None:
        self.inflight.append((req, nbytes))
        self.inflight_bytes += nbytes
        if records:
            self.per_record = nbytes / records

    def acked(self, req: int, credit: int | None, bound: int | None = None) -> None:
        """The acknowledgement of push `req` (the oldest in flight: acks come in order) with the planner's
        credit and bound then (None from a planner that sends none: the count window alone applies)."""
        while self.inflight:
            r, b = self.inflight.popleft()
            self.inflight_bytes -= b
            if r == req:
                break
        self.credit = credit if credit is not None else (1 << 62)
        if bound:
            self.target = max(1, min(CHUNK_BYTES, bound // 8))

    def forget(self) -> None:
        """Drop what is in flight (a push call that failed); the credit and record size stay."""
        self.inflight.clear()
        self.inflight_bytes = 0

    def next_records(self, most: int = CHUNK_RECORDS) -> int:
        return chunk_records(self.target, self.per_record, most)

    def oldest(self) -> int | None:
        return self.inflight[0][0] if self.inflight else None
