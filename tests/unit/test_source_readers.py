"""A worker's source readers (clasp/runtime/sources.py) in process: a reader waiting for chunk ids stops when
it is cancelled, even when the lease arrives in the same turn of the event loop."""

from __future__ import annotations

import asyncio

import clasp
from clasp.core.routing import build_placement
from clasp.runtime.engine import JobEngine
from clasp.runtime.sources import SourceReaders
from clasp.testing import IterableSource


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


def test_the_seals_of_a_turn_go_together_and_before_the_partitions_end():
    """The batches the readers admit in one turn of the event loop are sealed in one `seals` message (each
    chunk once, every record counted, each with its partition's watermark mark), and a partition's end goes
    after its last seal: the planner never takes a partition as ended with a batch of it unsealed."""
    from clasp.core import protocol
    from clasp.runtime.sources import BATCH

    async def go():
        dag = clasp.Dag("seals")
        dag.source("n", IterableSource(range(BATCH * 12), partitions=4), timestamp=float) >> dag.operator(
            "id", lambda v: [v])
        spec = dag.to_spec()
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
        sent: list[bytes] = []
        r = SourceReaders(eng, sent.append, lambda coro, name: asyncio.ensure_future(coro), lambda: None,
                          window=16 * BATCH)
        r.on_lease(0, 1000)
        r.assign([["n", f"part-{i}", None] for i in range(4)])
        while not all(p.ended for p in r.parts.values()):
            await asyncio.sleep(0.001)
            r.on_credit(r.inflight)  # every batch read completes: the window reopens
        return [protocol.decode_message(f) for f in sent]

    msgs = asyncio.run(go())
    seals, ends, together = [], {}, 0
    for mtype, body in msgs:
        if mtype == "seal":
            seals.append((body[1:], len(seals)))
        elif mtype == "seals":
            together = max(together, len(body[1]))
            seals.extend([(s, len(seals) + i) for i, s in enumerate(body[1])])
        elif mtype == "read_end":
            ends[body.partition] = len(seals)  # how many seals went before it
    assert together > 1
    assert sorted(s[0] for s, _ in seals) == sorted(set(s[0] for s, _ in seals))  # each chunk once
    assert sum(s[1] for s, _ in seals) == BATCH * 12
    assert sorted(ends) == [f"part-{i}" for i in range(4)]
    for s, at in seals:
        op, part, _ = s[3]
        assert op == "n" and at < ends[part]
