"""A worker's source readers for one job: the partitions it owns, read in tasks, admitted to the engine.

Each owned partition has a reader (`Source.open(partition, position)`) and a task that asks it for batches
while the worker's window has room, gives each batch the next chunk id of a lease from the planner, hands it
to the engine as the source operator's outputs (`JobEngine.admit_source`) and seals it (`clasp.core.tracking`:
its size and the requests it made): the seals of a turn of the event loop go to the planner together at its
end, on the control channel, and ahead of anything the readers say or reply after them (`_seal`). The
position kept for a partition is the reader's position after the last batch admitted, so it always matches
what the engine was handed:

- at a checkpoint's barrier (`barrier`) the positions are those of the cut (every later batch gets a chunk
  at or above the boundary: leased chunks below it are dropped);
- a partition moving away (`release`) stops after its last admitted batch, a batch read and not yet
  admitted is read again by the next owner;
- a restore reopens every partition at the checkpoint's positions.

Backpressure: a worker's readers together keep at most `window` records in flight (read, not yet complete
in the planner's tracker; the planner returns `credit` as chunks complete; the window is what the worker
completes in the credit's cycle plus WINDOW_S, within LEAST_WINDOW and `--source-window`), so the queues that records
read here fill anywhere in the cluster stay bounded, and a reader simply waits. The window is a batch's room
at a time, given to the readers in turn (the order they asked): partitions of like event-time density then
advance together, and the job's watermark, the least of theirs, with them.

Aligned reading (a source on event time with `align`, the default): one task reads all of this worker's partitions
of the source, a batch's room at a time, in slices taken lowest event time first, a partition more than `max_drift`
ahead of the lowest paused (`clasp.core.alignment`), and admits the slices as one chunk merged in event-time order
(no partition's records reordered), sealed with each partition's mark; the partitions' positions move with that
chunk, so a barrier or a release (which waits for the reads in progress, `turn_lock`) sees positions of admitted
records only, as above, and a partition released before its slice was admitted leaves the slice to its next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time as _time
from collections import deque
from collections.abc import Callable
from typing import Any

from clasp.core import protocol
from clasp.core.alignment import merged, slice_size, turn_order
from clasp.core.credit import CreditCycle, source_window
from clasp.core.eventtime import PartitionClock
from clasp.core.timed import EventTime
from clasp.core.tracking import CHUNK_BITS
from clasp.runtime.engine import JobEngine, OperatorError
from clasp.runtime.tasks import wait_event

log = logging.getLogger("clasp.worker.sources")
BATCH = 1024  # records a reader is asked for at once (a chunk holds one batch)
# Records read here and not complete (per job): what the worker completes in the credit's cycle plus WINDOW_S
# (`credit.source_window`, the rate measured over RATE_S of credit, the cycle by `credit.CreditCycle`), at least
# LEAST_WINDOW and at most WINDOW (`--source-window`). Credit
# comes back as the planner learns that chunks completed, from the progress a busy worker reports every 25 ms:
# a fixed 4 batches took ~10 ms of Nexmark Q2, and the worker then waited, idle, for its idle report's credit;
# a fixed 16 held Word Count's checkpoint barriers ~0.3 s for the records below them to complete.
WINDOW = 16384
LEAST_WINDOW = 4096  # 4 batches
WINDOW_S = 0.05
RATE_S = 0.1
LEASE_CHUNKS = 16  # chunk ids asked for at once
POLL_S = 0.05
LEASE_RETRY_S = 2.0  # an unbounded partition with nothing new: ask again after this
FAILED_S = 1.0  # a partition whose read failed is asked again after this


class Partition:
    __slots__ = ("op", "name", "reader", "task", "position", "ended", "time", "clock", "aligned", "retry_at")

    def __init__(self, op: int, name: str, reader, position: Any, time: EventTime | None = None):
        self.op, self.name, self.reader = op, name, reader
        self.task: asyncio.Task | None = None
        self.position = position
        self.ended = False
        # Event time: the partition's watermark goes to the planner in each seal (docs/TIME.md).
        self.time = time
        self.clock = PartitionClock(time.max_out_of_order, time.idle_timeout) if time is not None else None
        self.aligned = time is not None and time.align  # read by its source's aligned task (`_read_aligned`)
        self.retry_at = 0.0  # (aligned) its last read failed: not read again before this

    def saw(self, batch: list) -> None:
        """A batch read: the clock's watermark after it needs its largest time only (`max_seen`)."""
        if self.clock is not None:
            self.clock.record_batch([self.time.top(batch)], _time.monotonic())

    def went_idle(self) -> bool:
        return self.clock is not None and self.clock.tick(_time.monotonic())


class SourceReaders:
    """The partitions one worker reads for one job."""

    def __init__(self, eng: JobEngine, send: Callable[[bytes], Any], spawn: Callable, wake: Callable[[], None],
                 window: int = WINDOW):
        self.eng, self.send, self.spawn, self.wake = eng, send, spawn, wake
        self.most = window
        self.window = min(LEAST_WINDOW, window)  # until the rate is known
        self.credited = 0  # records credited since `rate_since`
        self.cycle = CreditCycle()  # how soon the records read here come back as credit
        self.rate_since: float | None = None  # the first credit: the rate is measured from there
        self.parts: dict[tuple[int, str], Partition] = {}
        self.lease: list[int] = []
        self.floor = 0  # chunks below it belong before the last barrier: not used any more
        self.asked = False
        self.leased = asyncio.Event()
        self.inflight = 0
        # Readers waiting for room, in the order they asked: each is granted a batch's room in turn.
        self.waiting: deque[asyncio.Future] = deque()
        self.timers: dict[int, tuple] = {}  # keyed time operator -> (its OpRuntime, its timer index) (worker_time)
        self.next_watermark: protocol.Watermark | None = None  # a watermark that came while firing (worker_time)
        self.stages: dict[int, int] = {}  # keyed time operator -> its stage (worker_time)
        # Seals of the batches admitted in this turn of the event loop, not sent yet (`_seal`, `flush_seals`).
        self.seals: list[list] = []
        self.aligned: dict[int, asyncio.Task] = {}  # source operator -> the task reading its partitions aligned
        self.turn_lock = asyncio.Lock()  # held by an aligned turn while it reads: no reader closed under a read

    # ----------------------------------------------------------------- the planner's instructions
    def assign(self, parts: list) -> None:
        """Open readers for [[op name, partition, position]] and start reading."""
        for name, part, pos in parts:
            op = self.eng.op(name)
            key = (op.index, part)
            if key in self.parts:
                continue
            spec = self.eng.spec.operators[op.index]
            reader = spec.connector.open(part, pos)
            et = spec.fn if isinstance(spec.fn, EventTime) else None
            p = self.parts[key] = Partition(op.index, part, reader, pos, et)
            if not p.aligned:
                p.task = self.spawn(self._read(p), f"reading {name}/{part} of job {self.eng.job}")
            elif op.index not in self.aligned:
                self.aligned[op.index] = self.spawn(self._read_aligned(op.index, et.max_drift),
                                                    f"reading {name} of job {self.eng.job}")

    async def release(self, parts: list) -> list:
        """Stop reading [[op name, partition]]; returns [[op name, partition, position]] as of the last batch
        admitted here."""
        out = []
        self.flush_seals()  # the batches admitted before the positions the reply gives
        for name, part in parts:
            key = (self.eng.op(name).index, part)
            p = self.parts.get(key)
            if p is not None and p.aligned:
                async with self.turn_lock:  # not while a turn reads it; a slice read and not admitted is dropped
                    self.flush_seals()
                    p = self.parts.pop(key, None)
            else:
                p = self.parts.pop(key, None)
            if p is not None:
                await self._stop(p)
                out.append([name, part, p.position])
        return out

    async def close(self) -> None:
        self.flush_seals()
        tasks = list(self.aligned.values())
        self.aligned.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in list(self.parts.values()):
            await self._stop(p)
        self.parts.clear()

    async def _stop(self, p: Partition) -> None:
        if p.task is not None and not p.task.done():
            p.task.cancel()
            await asyncio.gather(p.task, return_exceptions=True)
        try:
            await p.reader.close()
        except Exception as e:  # a reader that fails to close costs a log line, not the move
            log.warning("closing %s of job %d: %s", p.name, self.eng.job, e)

    def positions(self) -> list:
        """[[op name, partition, position]] of every partition read here: at a barrier, those of the cut."""
        ops = self.eng.ops
        return [[ops[p.op].name, p.name, p.position] for p in self.parts.values()]

    def barrier(self, boundary_rid: int) -> None:
        """A checkpoint's barrier at record id `boundary_rid`: later batches get chunks at or above it. The
        seals of the batches admitted so far go first, ahead of the reply that gives their positions."""
        self.flush_seals()
        self.floor = max(self.floor, boundary_rid >> CHUNK_BITS)
        self.lease = [c for c in self.lease if c >= self.floor]

    def on_lease(self, first: int, count: int) -> None:
        self.asked = False
        self.lease.extend(c for c in range(first, first + count) if c >= self.floor)
        self.leased.set()

    def on_credit(self, records: int) -> None:
        self.inflight = max(0, self.inflight - records)
        now = _time.monotonic()
        self.cycle.credited(now, records, self.inflight)
        if self.rate_since is None:
            self.rate_since = now
        else:
            self.credited += records
            if now - self.rate_since >= RATE_S:
                self.window = source_window(self.credited, now - self.rate_since, LEAST_WINDOW, self.most, WINDOW_S,
                                            self.cycle.take_quickest())
                self.credited, self.rate_since = 0, now
        self._grant()

    # ----------------------------------------------------------------- room in the window
    def _room(self) -> int:
        """The room a batch may take now: a whole batch's, or the window's when it is smaller (0: none)."""
        room = self.window - self.inflight
        return min(BATCH, room) if room >= min(BATCH, self.window) else 0

    def _grant(self) -> None:
        """Give the room there is to the readers waiting, in the order they asked."""
        while self.waiting:
            fut = self.waiting[0]
            if fut.done():  # its reader was cancelled
                self.waiting.popleft()
                continue
            take = self._room()
            if not take:
                return
            self.waiting.popleft()
            self.inflight += take
            fut.set_result(take)

    async def _reserve(self) -> int:
        """A batch's room in the window, taken for the caller (counted in `inflight`). Readers take turns: one
        that asks while others wait queues behind them, so a reader whose reads never wait (its file in the page
        cache) cannot take every batch's room as credit frees it while the others' partitions fall behind in
        event time, holding the job's watermark back (every window and timer then waits, its state growing)."""
        take = 0 if self.waiting else self._room()
        if take:
            self.inflight += take
            return take
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted as it was cancelled: the room goes back
                self.inflight -= fut.result()
                self._grant()
            raise

    # ----------------------------------------------------------------- seals
    def _seal(self, seal: list) -> None:
        """Seal a batch just admitted ([chunk, records, counts, mark?]): sent at the end of this turn of the
        event loop, with the seals of the other readers' batches admitted in it (one `seals` message, not
        one a batch), and before anything else this worker says about its readers (a read end, an idle
        partition, the positions of a barrier or a release). A progress report may overtake them: the
        planner's tracker keeps an epoch open until its chunk's seal arrives (`clasp.core.tracking`)."""
        if not self.seals:
            asyncio.get_running_loop().call_soon(self.flush_seals)
        self.seals.append(seal)

    def flush_seals(self) -> None:
        seals, self.seals = self.seals, []
        if len(seals) == 1:
            self.send(protocol.encode("seal", [self.eng.job, *seals[0]]))
        elif seals:
            self.send(protocol.encode("seals", [self.eng.job, seals]))

    # ----------------------------------------------------------------- reading
    async def _chunk(self) -> int:
        """The next chunk id of this worker's lease (asking the planner for more when it runs out)."""
        while True:
            while self.lease and self.lease[0] < self.floor:
                self.lease.pop(0)
            if self.lease:
                if len(self.lease) <= LEASE_CHUNKS // 2 and not self.asked:
                    # the next lease asked for while half of this one is left: no reader waits for it
                    self.asked = True
                    self.send(protocol.pack(protocol.Lease(self.eng.job, LEASE_CHUNKS)))
                return self.lease.pop(0)
            if not self.asked:
                self.asked = True
                self.send(protocol.pack(protocol.Lease(self.eng.job, LEASE_CHUNKS)))
            self.leased.clear()
            if not await wait_event(self.leased, LEASE_RETRY_S):
                self.asked = False  # unanswered (the planner restarted, or the ask crossed a rollback): again

    async def _read(self, p: Partition) -> None:
        while await self._read_one(p):
            await asyncio.sleep(0)  # a read that never waited: the other readers ask for room first (`_reserve`)

    async def _read_one(self, p: Partition) -> bool:
        """Read and admit one batch; False once the partition has ended. The batch's room in the window is
        taken before the read (readers of one worker read concurrently) and what was not used given back."""
        op = self.eng.ops[p.op]
        job = self.eng.job
        take = await self._reserve()
        used = 0
        try:
            try:
                batch = await p.reader.next_batch(take)
            except Exception as e:  # the source's failure is the source operator's error; it is asked again
                self.eng.executor.fail(op, OperatorError(f"source {op.name!r}, partition {p.name!r}: {e!r}"), None)
                await asyncio.sleep(1.0)
                return True
            for err in p.reader.take_errors():
                self.eng.executor.fail(op, OperatorError(f"source {op.name!r}: {err}"), None)
            if not batch:
                if p.reader.exhausted:
                    p.position = p.reader.position()
                    p.ended = True
                    self.flush_seals()  # the partition's last seal (and mark) ahead of its end
                    self.send(protocol.pack(protocol.ReadEnd(job, op.name, p.name, self.eng.floor)))
                    return False
                if p.went_idle():
                    self.flush_seals()
                    self.send(protocol.pack(protocol.WmIdle(job, op.name, p.name)))
                await asyncio.sleep(POLL_S)
                return True
            p.saw(batch)
            self._admit(op, batch, await self._chunk(), (p,))
            used = len(batch)
            return True
        finally:
            self.inflight -= take - used
            self._grant()

    # ----------------------------------------------------------------- aligned reading
    async def _read_aligned(self, op_index: int, max_drift: float | None) -> None:
        """Read this worker's partitions of one source on event time, aligned (the module docstring), while
        any is left to read."""
        while True:
            parts = [p for p in self.parts.values() if p.op == op_index and p.aligned and not p.ended]
            if not parts:
                del self.aligned[op_index]  # a partition assigned from here on starts a new task
                return
            if await self._turn(op_index, max_drift, len(parts)):
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(POLL_S)

    async def _turn(self, op_index: int, max_drift: float | None, parts: int) -> bool:
        """One aligned turn: the room of a batch a partition, as far as the window has it now, filled with slices
        of the partitions, lowest event time first, and admitted as one chunk (the merge puts the slices in
        event-time order, and a chunk, not a batch, costs a pass and a seal); whether it read anything."""
        op = self.eng.ops[op_index]
        take = await self._reserve()
        used = 0
        try:
            while take < BATCH * parts and not self.waiting:
                more = min(self._room(), BATCH * parts - take)
                if not more:
                    break
                self.inflight += more
                take += more
            async with self.turn_lock:  # a release waits for the reads, not for the chunk id
                slices, ends = await self._slices(op_index, take, max_drift)
            # The planner may hold leases back until a move's release is answered: the chunk id is waited for
            # without the lock, and the slices of a partition released meanwhile are left to its next owner,
            # who reads them again from the position of its last admitted chunk (its reader here is closed).
            chunk = await self._chunk() if slices else None
            slices = [(p, b) for p, b in slices if self.parts.get((p.op, p.name)) is p]
            if slices:
                batch = merged([b for _, b in slices], slices[0][0].time.timestamp)
                self._admit(op, batch, chunk, dict.fromkeys(p for p, _ in slices))
                used = len(batch)
            elif chunk is not None:
                self.lease.insert(0, chunk)  # unused; still at or above the floor (`_chunk` drops it otherwise)
            ends = [(p, ended) for p, ended in ends if self.parts.get((p.op, p.name)) is p]
            if ends:
                self.flush_seals()  # a partition's last seal (and mark) ahead of its end or its idleness
                for p, ended in ends:
                    if ended:
                        p.position = p.reader.position()
                        self.send(protocol.pack(protocol.ReadEnd(self.eng.job, op.name, p.name, self.eng.floor)))
                    else:
                        self.send(protocol.pack(protocol.WmIdle(self.eng.job, op.name, p.name)))
            return bool(slices)
        finally:
            self.inflight -= take - used
            self._grant()

    async def _slices(self, op_index: int, room: int, max_drift: float | None) -> tuple[list, list]:
        """Slices [(partition, records)] read for a turn of `room` records, in passes over the partitions that
        have records, lowest event time first (paused ones left out); and [(partition, ended)] of those that
        ended or went idle."""
        op = self.eng.ops[op_index]
        slices, ends, dry = [], [], set()
        while room > 0:
            now = _time.monotonic()
            live = {p: p.clock.max_seen for p in self.parts.values()
                    if p.op == op_index and p.aligned and not p.ended and p not in dry and p.retry_at <= now}
            if not live:
                break
            order = turn_order(live, max_drift)
            # The room is shared by every partition with records, paused or not: a share of the unpaused alone let
            # the lowest take all of it in one slice and run a whole turn past the paused ones, which then lagged
            # more than a pass behind (the passes after this one give them their part once they are lowest).
            size = slice_size(room, len(live))
            for p in order:
                n = min(size, room)
                try:
                    batch = await p.reader.next_batch(n)
                except Exception as e:  # the source's failure is the source operator's error; it is asked again
                    self.eng.executor.fail(op, OperatorError(f"source {op.name!r}, partition {p.name!r}: {e!r}"), None)
                    p.retry_at = _time.monotonic() + FAILED_S
                    continue
                for err in p.reader.take_errors():
                    self.eng.executor.fail(op, OperatorError(f"source {op.name!r}: {err}"), None)
                if batch:
                    p.saw(batch)
                    slices.append((p, batch))
                    room -= len(batch)
                    if len(batch) < n:
                        dry.add(p)  # nothing more now: the pass's others fill the room
                else:
                    dry.add(p)
                    if p.reader.exhausted:
                        p.ended = True
                        ends.append((p, True))
                    elif p.went_idle():
                        ends.append((p, False))
                if room <= 0:
                    break
        return slices, ends

    def _admit(self, op, batch: list, chunk: int, parts) -> None:
        """Admit a batch read from `parts` as chunk `chunk` and seal it, with each partition's watermark after
        it (on event time); their positions move with it. Called with no await since the chunk was taken: the
        batch, its chunk and the positions go together."""
        counts = self.eng.admit_source(op.index, batch, chunk << CHUNK_BITS)
        seal = [chunk, len(batch), counts]
        for p in parts:
            if p.clock is not None:
                seal.append([op.name, p.name, p.clock.watermark])
            p.position = p.reader.position()
        self._seal(seal)
        self.cycle.admitted(_time.monotonic(), len(batch))
        self.wake()
