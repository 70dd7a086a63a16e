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
