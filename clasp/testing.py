"""An in-process reference executor for testing DAGs: `run_local(dag, records)` (like bytewax.testing).

It runs a `clasp.Dag` single-threaded and deterministically with the runtime's semantics, so a user can
unit-test operator logic and the expected answer without starting a cluster. It is not the runtime: no
workers, no placement, no concurrency. Order: each pushed record enters every root that is not a declared
source; then operators run in topological order, each draining its FIFO queue, before the next record is
pushed. After the pushed records, every declared source is read, partition by partition, each value
entering its source's successors the same way (an unbounded source: what it has now).

`IterableSource(values, partitions=n)` is a source over a Python list, for tests and demos.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from clasp.connectors.file_sink import FileSink
from clasp.core.connector import Source, SourcePartition
from clasp.core.dag import Dag, DagError
from clasp.core.eventtime import POS_INF
from clasp.core.outputs import as_outputs
from clasp.core.sinks import SINK_BATCH, partition_name
from clasp.core.timed import TimedFold

_KEY_TYPES = (str, int, bytes)


def outputs_of(result: Any) -> list:
    """An operator's return value as a list of outputs, by the runtime's rule (`clasp.core.outputs`)."""
    return list(as_outputs(result))


def _roundtrip(value: Any, what: str) -> Any:
    # Between processes values travel as msgpack; doing the same here turns tuples into lists and
    # surfaces an unserializable value in the test rather than on a worker.
    try:
        return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises TypeError, OverflowError, ValueError...
        raise DagError(f"{what}: value {value!r:.200} is not msgpack-serializable ({e})") from e


@dataclass
class LocalJob:
    """The outcome of `run_local`: states, collected outputs, request counts and execution times."""

    name: str
    processed: dict[str, int]
    _states: dict[str, dict]
    _collected: dict[str, list]
    _busy_ns: dict[str, int] = field(repr=False)
    errors: list[str] = field(default_factory=list)  # what the sources skipped (a bad JSON line), and where

    def state(self, name: str) -> dict:
        """Key -> state of a stateful operator (a copy, as it would come back from the workers)."""
        if name not in self._states:
            raise KeyError(f"operator {name!r} of dag {self.name!r} is not stateful (or does not exist)")
        return _roundtrip(self._states[name], f"state of {name!r}")

    def collected(self, name: str) -> list:
        """Outputs of a `collect=True` operator, in the order the local run produced them."""
        if name not in self._collected:
            raise KeyError(f"operator {name!r} of dag {self.name!r} was not declared with collect=True")
        return list(self._collected[name])

    @property
    def tau_us(self) -> dict[str, float]:
        """Mean execution time per request of each operator in µs (0.0 for one that never ran)."""
        return {n: (self._busy_ns[n] / c / 1000.0 if c else 0.0) for n, c in self.processed.items()}


class ListSink(FileSink):
    """A sink for tests and demos: what it committed, read back as a list (`values`).

    It keeps its part files (msgpack, so values come back as the runtime carries them) in `directory`, a
    fresh temporary one by default: the workers of a local cluster share it, and `run_local` writes there
    too. Exactly once, as `FileSink`: `values` holds only what a complete checkpoint (or the end of the
    run) committed."""

    def __init__(self, directory: str | None = None):
        super().__init__(directory or tempfile.mkdtemp(prefix="clasp-listsink-"), format="msgpack")

    @property
    def values(self) -> list:
        """Every committed value: partition by partition, each in the order written."""
        return [v for vs in self.read().values() for v in vs]

    def __repr__(self) -> str:
        return f"ListSink({self.directory!r})"
class IterableSource(Source):
    """A source over `values` (a list, copied), dealt round robin into `partitions` partitions; positions are
    indices into a partition. `bounded=False` makes it a stream that never ends (nothing after its values):
    a job on it runs until `job.stop()`."""

    def __init__(self, values: Iterable, partitions: int = 1, bounded: bool = True):
        if partitions < 1:
            raise ValueError(f"IterableSource needs at least one partition, not {partitions}")
        self.values = list(values)
        self.count = partitions
        self._bounded = bounded

    @property
    def bounded(self) -> bool:
        return self._bounded

    @property
    def splits(self) -> bool:
        return True

    def partitions(self) -> list[str]:
        return [f"part-{i}" for i in range(self.count)]

    def open(self, partition: str, position: Any | None) -> SourcePartition:
        i = int(partition.rpartition("-")[2])
        return _ListReader(self.values[i::self.count], int(position or 0), self._bounded)

    def __repr__(self) -> str:
        return f"IterableSource({len(self.values)} values, partitions={self.count})"


class _ListReader(SourcePartition):
    def __init__(self, values: list, position: int, bounded: bool):
        self.values, self.pos, self.bounded = values, position, bounded

    async def next_batch(self, limit: int) -> list:
        out = self.values[self.pos:self.pos + limit]
        self.pos += len(out)
        return out

    def position(self) -> int:
        return self.pos

    @property
    def exhausted(self) -> bool:
        return self.bounded and self.pos >= len(self.values)


def _emit(outs: list, sink: list | None, successors: list) -> None:
    if sink is not None:
        sink.extend(outs)
    for q in successors:
        q.extend(outs)


async def _write_sink(sink, partition: str, values: list) -> None:
    part = sink.open(partition)
    try:
        for i in range(0, len(values), SINK_BATCH):
            await part.write_batch(values[i:i + SINK_BATCH])
        prepared = await part.prepare(1)
        if prepared is not None:
            await part.commit(1, prepared)
    finally:
        await part.close()


def run_local(dag: Dag, records: Iterable = (), *, roundtrip: bool = True) -> LocalJob:
    """Run `dag` over `records` (pushed), then over its declared sources, in this process; return a LocalJob.

    `roundtrip=True` passes every request's value through msgpack first, as the runtime does, so a
    tuple arrives as a list and a non-serializable value fails here. Turn it off only for speed.
    """
    spec = dag.to_spec()
    ops = spec.operators
    order = spec.topological()
    queues: list[deque] = [deque() for _ in ops]
    states: dict[str, dict] = {o.name: {} for o in ops if o.stateful}
    collected: dict[str, list] = {o.name: [] for o in ops if o.collect}
    # A sink operator's input, written to one partition of its sink and committed when the run ends.
    to_sink: dict[str, list] = {o.name: [] for o in ops if o.kind == "sink"}
    processed = {o.name: 0 for o in ops}
    busy = {o.name: 0 for o in ops}
    loop: asyncio.AbstractEventLoop | None = None
    perf = time.perf_counter_ns

    def wait(r):
        # Only async operators and sources get here; one loop serves the whole run.
        nonlocal loop
        if loop is None:
            loop = asyncio.new_event_loop()
        return loop.run_until_complete(r)

    def drain():
        # Every queued request, operators in topological order (a request's outputs run in the same pass).
        for i in order:
            q = queues[i]
            if not q:
                continue
            op = ops[i]
            succ = [queues[s] for s in op.successors]
            sink = collected.get(op.name)
            st = states.get(op.name)
            if op.name in to_sink:
                values = [_roundtrip(v, f"input of {op.name!r}") if roundtrip else v for v in q]
                q.clear()
                processed[op.name] += len(values)
                to_sink[op.name].extend(values)
                continue
            while q:
                if op.batch:  # what is queued, as one batch: the values one pushed record led to
                    values = [_roundtrip(v, f"input of {op.name!r}") if roundtrip else v for v in q]
                    q.clear()
                    t0 = perf()
                    out = op.fn(values)
                    busy[op.name] += perf() - t0
                    processed[op.name] += len(values)
                    _emit(as_outputs(out), sink, succ)
                    continue
                value = q.popleft()
                if roundtrip:
                    value = _roundtrip(value, f"input of {op.name!r}")
                if op.stateful:
                    key = op.key(value)
                    if not isinstance(key, _KEY_TYPES) or isinstance(key, bool):
                        raise DagError(f"operator {op.name!r}: key {key!r} must be str, int or bytes")
                    t0 = perf()
                    res = op.fn(st.get(key), value)
                    t1 = perf()
                    if op.is_async or inspect.isawaitable(res):
                        res = wait(res)
                        t1 = perf()
                    busy[op.name] += t1 - t0
                    try:
                        new_state, out = res
                    except (TypeError, ValueError) as e:
                        raise DagError(f"stateful operator {op.name!r} must return (new_state, outputs), "
                                       f"got {res!r:.200}") from e
                    if new_state is None:
                        st.pop(key, None)
                    else:
                        st[key] = new_state
                else:
                    t0 = perf()
                    out = op.fn(value)
                    t1 = perf()
                    if op.is_async or inspect.isawaitable(out):
                        out = wait(out)
                        t1 = perf()
                    busy[op.name] += t1 - t0
                processed[op.name] += 1
                _emit(as_outputs(out), sink, succ)

    errors: list[str] = []

    def inputs():
        roots = spec.sources
        for rec in records:
            if not roots:
                raise DagError(f"dag {dag.name!r} reads only its declared sources: nothing to push records into")
            yield roots, rec
        for i in spec.readers:
            source = ops[i].connector
            for part in source.partitions():
                reader = source.open(part, None)
                while True:
                    batch = wait(reader.next_batch(1024))
                    errors.extend(reader.take_errors())
                    for v in batch:
                        yield (i,), v
                    if not batch:
                        break
                wait(reader.close())

    try:
        for targets, rec in inputs():
            for s in targets:
                queues[s].append(rec)
            drain()
        # The end of the input: the watermark passes everything, every window and event-time timer fires.
        for i in order:
            fold = ops[i].fn
            if isinstance(fold, TimedFold):
                st = states[ops[i].name]
                for key, new, out in fold.fire(st, POS_INF):
                    if new is None:
                        st.pop(key, None)
                    else:
                        st[key] = new
                    _emit(out, collected.get(ops[i].name), [queues[j] for j in ops[i].successors])
                for _, e in fold.take_failures():
                    raise e  # as a failing operator function's exception does here
                drain()
        run = uuid.uuid4().hex[:12]
        for name, values in to_sink.items():
            wait(_write_sink(spec.by_name(name).connector, partition_name(name, "local", run), values))
    finally:
        if loop is not None:
            loop.close()
    return LocalJob(dag.name, processed, states, collected, busy, errors)
