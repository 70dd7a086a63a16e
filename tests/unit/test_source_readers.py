"""A worker's source readers (clasp/runtime/sources.py) in process: a reader waiting for chunk ids stops when
it is cancelled, even when the lease arrives in the same turn of the event loop."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.routing import build_placement
from clasp.runtime.engine import JobEngine
from clasp.runtime.sources import SourceReaders
from clasp.testing import IterableSource, _ListReader


def readers() -> SourceReaders:
    dag = clasp.Dag("r")
    dag.source("lines", IterableSource(["a"])) >> dag.operator("split", str.split)
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
    sent: list[bytes] = []
    return SourceReaders(eng, sent.append, lambda coro, name: asyncio.ensure_future(coro), lambda: None)


def test_a_reader_waiting_for_a_lease_stops_when_cancelled_as_the_lease_arrives():
    async def go():
        r = readers()
        task = asyncio.ensure_future(r._chunk())
        await asyncio.sleep(0.01)  # it asked, and waits
        assert not task.done() and r.asked
        r.on_lease(0, 16)  # the lease arrives...
        task.cancel()  # ...as a restore cancels the reader: it must stop, not take a chunk and read on
        await asyncio.gather(task, return_exceptions=True)
        return task.cancelled(), r.lease

    cancelled, lease = asyncio.run(go())
    assert cancelled
    assert lease == list(range(16))  # nothing taken


def test_readers_take_turns_at_the_window_so_their_partitions_advance_together():
    """Reads that never wait (a file in the page cache) must not let one reader take every batch's room as
    credit frees it while the others' partitions fall behind (the job's watermark, the least of theirs, with
    them): the readers take turns, so however the credit comes, no partition is more than a batch ahead."""
    from clasp.runtime.sources import BATCH

    async def go(credits: list[int]):
        dag = clasp.Dag("turns")
        dag.source("n", IterableSource(range(BATCH * 64), partitions=4)) >> dag.operator("id", lambda v: [v])
        spec = dag.to_spec()
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
        r = SourceReaders(eng, [].append, lambda coro, name: asyncio.ensure_future(coro), lambda: None,
                          window=4 * BATCH)
        r.on_lease(0, 1000)
        r.assign([["n", f"part-{i}", None] for i in range(4)])
        spread = []
        for c in credits:
            await asyncio.sleep(0.001)
            assert r.inflight == 4 * BATCH  # the window full: every reader waits for credit
            pos = [p.position or 0 for p in r.parts.values()]
            spread.append(max(pos) - min(pos))
            r.on_credit(c)
        for p in r.parts.values():
            p.task.cancel()
        await asyncio.gather(*(p.task for p in r.parts.values()), return_exceptions=True)
        return spread

    for credits in ([BATCH] * 24, [2 * BATCH, BATCH, 3 * BATCH, 4 * BATCH] * 4):
        assert max(asyncio.run(go(credits))) <= BATCH, credits


class _Lists(IterableSource):
    """A source whose partitions are the lists given, in order."""

    def __init__(self, lists: list[list]):
        super().__init__([], partitions=len(lists))
        self.lists = lists

    def open(self, partition: str, position):
        return _ListReader(self.lists[int(partition.rpartition("-")[2])], int(position or 0), True)


def _read_all(align: bool, values: list | list[list], partitions: int, window: int, max_drift=None):
    """Every partition of an IterableSource on event time read to its end by one worker's readers, each batch
    completing at once; the frames they sent, decoded, and what the engine was handed, in admission order."""
    from clasp.core import protocol

    async def go():
        dag = clasp.Dag("seals")
        source = _Lists(values) if values and type(values[0]) is list else IterableSource(values, partitions=partitions)
        dag.source("n", source, timestamp=float, align=align,
                   max_drift=max_drift) >> dag.operator("id", lambda v: [v])
        spec = dag.to_spec()
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
        admitted: list = []
        admit = eng.admit_source
        eng.admit_source = lambda op, batch, first: admitted.append(list(batch)) or admit(op, batch, first)
        sent: list[bytes] = []
        r = SourceReaders(eng, sent.append, lambda coro, name: asyncio.ensure_future(coro), lambda: None,
                          window=window)
        r.on_lease(0, 1000)
        r.assign([["n", f"part-{i}", None] for i in range(partitions)])
        while not all(p.ended for p in r.parts.values()):
            await asyncio.sleep(0.001)
            r.on_credit(r.inflight)  # every batch read completes: the window reopens
        positions = {p.name: p.position for p in r.parts.values()}
        await r.close()
        return [protocol.decode_message(f) for f in sent], admitted, positions

    return asyncio.run(go())


def _seals(msgs: list) -> tuple[list, dict, int]:
    seals, ends, together = [], {}, 0
    for mtype, body in msgs:
        if mtype == "seal":
            seals.append((body[1:], len(seals)))
        elif mtype == "seals":
            together = max(together, len(body[1]))
            seals.extend([(s, len(seals) + i) for i, s in enumerate(body[1])])
        elif mtype == "read_end":
            ends[body.partition] = len(seals)  # how many seals went before it
    return seals, ends, together


@pytest.mark.parametrize("align", [False, True])
def test_the_seals_of_a_turn_go_together_and_before_the_partitions_end(align):
    """The batches the readers admit in one turn of the event loop are sealed in one `seals` message (each
    chunk once, every record counted, each with its partitions' watermark marks), and a partition's end goes
    after its last seal: the planner never takes a partition as ended with a batch of it unsealed."""
    from clasp.runtime.sources import BATCH

    msgs, _, positions = _read_all(align, list(range(BATCH * 12)), 4, 16 * BATCH)
    seals, ends, together = _seals(msgs)
    assert together > 1 or align  # aligned reading makes one chunk of the partitions' slices at a time
    assert sorted(s[0] for s, _ in seals) == sorted(set(s[0] for s, _ in seals))  # each chunk once
    assert sum(s[1] for s, _ in seals) == BATCH * 12
    assert sorted(ends) == [f"part-{i}" for i in range(4)]
    assert positions == {f"part-{i}": BATCH * 3 for i in range(4)}
    for s, at in seals:
        assert s[3:]
        for op, part, _ in s[3:]:
            assert op == "n" and at < ends[part]


@example(sizes=[2561, 1536], window=4096, max_drift=0)  # the lowest took a turn's room: 2,049 times behind
@example(sizes=[2223, 2818, 1920, 2710, 1457], window=4096, max_drift=0)  # so, 9,983 times behind
@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=5), window=st.sampled_from([1024, 4096, 16384]),
       max_drift=st.sampled_from([None, 0, 50, 500]))
def test_aligned_reading_hands_over_every_record_once_in_event_time_order(sizes, window, max_drift):
    """Partitions of any lengths (each in event-time order), read aligned: every record admitted once, each
    chunk in event-time order, chunks never more than a chunk's overlap apart (a record is behind the largest
    time admitted before it only by what one pass over the partitions spans), each partition's last mark its
    largest time, and its position at its end."""
    from clasp.runtime.sources import BATCH

    n = len(sizes)
    shares = [[float(k * n + i) for k in range(sizes[i])] for i in range(n)]  # partition i: times i, i + n, ...
    msgs, admitted, positions = _read_all(True, shares, n, window, max_drift)
    got = [v for b in admitted for v in b]
    assert sorted(got) == sorted(v for s in shares for v in s)
    assert all(b == sorted(b) for b in admitted)
    assert all(len(b) <= min(n * BATCH, window) for b in admitted)  # a batch's room a partition, in the window
    # Aligned: a record is behind the largest time admitted before it by at most a pass's span over the
    # partitions with records left (a slice of each: n * slice times), whatever their lengths and max_drift (a
    # paused partition keeps its share of the room); reading in turns lags by whole partitions.
    top = float("-inf")
    for b in admitted:
        assert b[0] >= top - n * BATCH
        top = max(top, b[-1])
    seals, ends, _ = _seals(msgs)
    last = {}
    for s, _ in seals:
        for _, part, w in s[3:]:
            last[part] = w
    assert last == {f"part-{i}": v[-1] for i, v in enumerate(shares) if v}
    assert positions == {f"part-{i}": len(v) for i, v in enumerate(shares)}
