"""The application DAG: operators, edges, validation, and the spec that travels to planner and workers."""

from __future__ import annotations

import heapq
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle

from clasp.core.connector import Sink, Source
from clasp.core.joins import IntervalJoin, WindowJoin
from clasp.core.keyed import TimerOperator
from clasp.core.timed import LATE_OUT, ON_TIME_OUT, EventTime, TimedFold, TimedJoin, no_time, pick, side
from clasp.core.windows import WindowOperator

if TYPE_CHECKING:
    import networkx as nx


class DagError(ValueError):
    """A malformed DAG, raised before anything is sent."""


def identity(value):
    """The key function of an operator whose key is the value itself (`key=clasp.identity`): the runtime
    recognizes it and uses the value without calling it."""
    return value


@dataclass(eq=False)
class Operator:
    """One node of a DAG: a stateless function `fn(value) -> outputs` or a stateful `fn(state, value)`."""

    dag: Dag
    name: str
    fn: Callable
    stateful: bool = False
    key: Callable | None = None
    is_async: bool = False
    index: int = -1
    collect: bool = False
    batch: bool = False
    #: The `Source` of an operator added by `Dag.source`, the `Sink` of one added by `Dag.sink`.
    connector: Source | Sink | None = None
    kind: str = "operator"
    #: Where an edge into this operator goes (a window's first operator), and a window's late output.
    entry: Operator | None = None
    late: Operator | None = None

    def __rshift__(self, other: Operator) -> Operator:
        self.dag.edge(self, other)
        return other

    def __repr__(self) -> str:
        return f"Operator({self.name!r}{', stateful' if self.stateful else ''})"


@dataclass
class Dag:
    """An operator DAG. Build with `operator()` and `edge()` (or `a >> b`); `validate()` before use."""

    name: str
    operators: list[Operator] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)

    def operator(self, name: str, fn: Callable, *, stateful: bool = False, key: Callable | None = None,
                 collect: bool = False, batch: bool = False) -> Operator:
        """Add an operator. `collect=True` keeps its outputs on the workers for `job.collected(name)`.
        `batch=True` (stateless only): `fn` takes a list of values and returns a list of outputs for all of
        them, called once per batch the engine runs (like Bytewax's `flat_map_batch`)."""
        if not isinstance(name, str) or not name:
            raise DagError(f"operator name must be a non-empty string, not {name!r}")
        if any(o.name == name for o in self.operators):
            raise DagError(f"dag {self.name!r}: two operators named {name!r}")
        if not callable(fn):
            raise DagError(f"operator {name!r}: fn {fn!r} is not callable")
        if stateful and key is None:
            raise DagError(f"operator {name!r} is stateful but has no key function (key=...)")
        if key is not None and not callable(key):
            raise DagError(f"operator {name!r}: key {key!r} is not callable")
        is_async = inspect.iscoroutinefunction(fn)
        if batch and (stateful or is_async):
            raise DagError(f"operator {name!r}: batch=True is for stateless, synchronous operators")
        op = Operator(self, name, fn, stateful, key, is_async, len(self.operators), bool(collect), bool(batch))
        self.operators.append(op)
        return op

    def source(self, name: str, source: Source, *, timestamp: Callable | None = None, max_out_of_order: float = 0,
               idle_timeout: float | None = None, align: bool = True, max_drift: float | None = None) -> Operator:
        """Add a partitioned input read by the workers (a `clasp.connectors.Source`): its values enter only its
        own successors, which `>>` connects like any operator's. `timestamp(value)` (seconds) gives its records
        event time: each partition's watermark trails the largest time it read by `max_out_of_order`, and a
        partition that reads nothing for `idle_timeout` seconds stops holding the others back. With `align` (the
        default) a worker reads its partitions of the source lowest event time first, several in one batch merged
        in event-time order, and one more than `max_drift` seconds ahead of the lowest that has records pauses
        (None: none pauses; docs/TIME.md)."""
        if not isinstance(source, Source):
            raise DagError(f"source {name!r}: {source!r} is not a clasp.connectors.Source")
        fn: Callable = identity
        if timestamp is not None:
            try:
                fn = EventTime(timestamp, max_out_of_order, idle_timeout, align, max_drift)
            except (TypeError, ValueError) as e:
                raise DagError(f"source {name!r}: {e}") from None
        op = self.operator(name, fn)
        op.connector, op.kind = source, "source"
        return op

    def push_source(self, name: str, *, timestamp: Callable, max_out_of_order: float = 0,
                    idle_timeout: float | None = None) -> Operator:
        """Add the root that `job.push()` feeds, with event time: `timestamp(value)` (seconds) as in `source()`.
        The pushed records are one partition in the order the planner dispatches them: its watermark trails the
        largest time pushed by `max_out_of_order`, goes idle after `idle_timeout` seconds without a push, and
        reaches the end with `job.end_input()` (docs/TIME.md). At most one per DAG (every root sees every
        pushed record)."""
        if any(isinstance(o.fn, EventTime) and o.kind == "operator" for o in self.operators):
            raise DagError(f"push source {name!r}: the DAG has a push source already")
        try:
            fn = EventTime(timestamp, max_out_of_order, idle_timeout)
        except (TypeError, ValueError) as e:
            raise DagError(f"push source {name!r}: {e}") from None
        return self.operator(name, fn)

    def window(self, name: str, window: Any, key: Callable, fold: Callable, init: Callable[[], Any], *,
               allowed_lateness: float = 0, merge: Callable | None = None, timestamp: Callable | None = None,
               collect: bool = False) -> Operator:
        """Add an event-time window (`clasp.windows.tumbling/sliding/session`) per `key(value)`: each window's
        values folded (`fold(acc, value)` from `init()`), emitted as `[key, start, end, acc]` once the
        watermark passes its end. Edges into the returned operator feed the window; its outputs are the
        windows. Records later than `allowed_lateness` go to `op.late` (`[key, ts, value]`, an operator to
        connect or collect; counted in `job.stats()["event_time"]`). `timestamp` defaults to the event-time
        source's (the DAG's only one)."""
        try:
            op = WindowOperator(window, fold, init, allowed_lateness, merge)
        except (TypeError, ValueError) as e:
            raise DagError(f"window {name!r}: {e}") from None
        return self._keyed_time(name, op, key, timestamp, collect)

    def timers(self, name: str, fn: Callable, on_timer: Callable, key: Callable, *,
               timestamp: Callable | None = None, collect: bool = False) -> Operator:
        """A stateful operator with timers per key: `fn(state, value, timers) -> (state, outputs)` may call
        `timers.at(t, payload)` (event time) or `timers.at_processing(t, payload)` (processing time: `t` in
        seconds of `time.time()`, `timers.now` the time the worker last read), and `on_timer(state, t, payload,
        timers) -> (state, outputs)` runs once the watermark, or the clock, reaches `t`
        (`clasp.windows.TimerOperator`; the timers live in the key's state, so they are checkpointed and
        migrate with it). Edges into the returned operator feed it; its outputs are those of both functions.
        On a DAG without event time its records have no time (`timers.ts` is -inf): processing time only."""
        return self._keyed_time(name, TimerOperator(fn, on_timer), key, timestamp, collect, timeless=True)

    def _keyed_time(self, name: str, op: Any, key: Callable, timestamp: Callable | None, collect: bool,
                    timeless: bool = False) -> Operator:
        if timestamp is None:
            timed = [o.fn for o in self.operators if isinstance(o.fn, EventTime)]
            if len(timed) > 1 or not (timed or timeless):
                raise DagError(f"{name!r}: give timestamp= (the DAG has {len(timed)} event-time sources)")
            timestamp = timed[0].timestamp if timed else no_time
        folded = self.operator(f"{name}.windows", TimedFold(op, key, timestamp), stateful=True, key=key)
        out = self._timed_outputs(name, folded, collect)
        out.entry = folded
        return out

    def join(self, name: str, left: Operator | str, right: Operator | str, window: Any, *, key: Callable | tuple,
             allowed_lateness: float = 0, timestamp: Callable | tuple | None = None,
             collect: bool = False) -> Operator:
        """Join the values of `left` and `right` with equal keys (`key`, or a pair: the left's, the right's) in
        event time: `window` a tumbling or sliding window (every pair of a key in one window, emitted when
        the window fires) or a `clasp.windows.IntervalJoin` (pairs within its bounds, at once). Outputs are
        `[key, left_value, right_value]`; records too late go to `op.late` as in `window()`. `timestamp` (or
        a pair) defaults to the DAG's only event-time source's."""
        keys = key if isinstance(key, tuple) else (key, key)
        if timestamp is None:
            timed = [o.fn for o in self.operators if isinstance(o.fn, EventTime)]
            if len(timed) != 1:
                raise DagError(f"join {name!r}: give timestamp= (the DAG has {len(timed)} event-time sources)")
            timestamp = timed[0].timestamp
        times = timestamp if isinstance(timestamp, tuple) else (timestamp, timestamp)
        try:
            op = window if isinstance(window, IntervalJoin) else WindowJoin(window, allowed_lateness)
        except (TypeError, ValueError) as e:
            raise DagError(f"join {name!r}: {e}") from None
        fn = TimedJoin(op, keys, times)
        folded = self.operator(f"{name}.windows", fn, stateful=True, key=fn.key)
        for tag, src in ((0, left), (1, right)):
            marker = self.operator(f"{name}.{'left' if tag == 0 else 'right'}", side(tag))
            self.edge(src, marker)
            self.edge(marker, folded)
        return self._timed_outputs(name, folded, collect)

    def _timed_outputs(self, name: str, folded: Operator, collect: bool) -> Operator:
        """A keyed time operator's two outputs: `name` (its results) and `name.late`."""
        out = self.operator(name, pick(ON_TIME_OUT), collect=collect)
        late = self.operator(f"{name}.late", pick(LATE_OUT))
        self.edge(folded, out)
        self.edge(folded, late)
        out.late = late
        return out

    def sink(self, name: str, sink: Sink) -> Operator:
        """Add an output (a `clasp.connectors.Sink`) that operators connect into: each value reaching it is
        written to the sink partition of the worker that holds it, committed with the checkpoints."""
        if not isinstance(sink, Sink):
            raise DagError(f"sink {name!r}: {sink!r} is not a clasp.connectors.Sink")
        op = self.operator(name, identity)
        op.connector, op.kind = sink, "sink"
        return op

    def edge(self, src: Operator | str, dst: Operator | str) -> None:
        s, d = self._resolve(src), self._resolve(dst)
        d = d.entry or d
        if d.kind == "source" or isinstance(d.fn, EventTime):
            raise DagError(f"dag {self.name!r}: source {d.name!r} cannot have an input ({s.name} -> {d.name})")
        if s.kind == "sink":
            raise DagError(f"dag {self.name!r}: sink {s.name!r} cannot have an output ({s.name} -> {d.name})")
        if (s.name, d.name) in self.edges:
            raise DagError(f"dag {self.name!r}: duplicate edge {s.name} -> {d.name}")
        if s is d or s.name in _reachable(self._successors(), d.name):
            raise DagError(f"dag {self.name!r}: edge {s.name} -> {d.name} would close a cycle")
        self.edges.append((s.name, d.name))

    def _resolve(self, op: Operator | str) -> Operator:
        if isinstance(op, Operator):
            if op.dag is not self:
                raise DagError(f"operator {op.name!r} belongs to dag {op.dag.name!r}, not {self.name!r}")
            return op
        for o in self.operators:
            if o.name == op:
                return o
        raise DagError(f"dag {self.name!r} has no operator {op!r}")

    def graph(self) -> nx.DiGraph:
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from(o.name for o in self.operators)
        g.add_edges_from(self.edges)
        return g

    def _successors(self) -> dict[str, list[str]]:
        return _successor_lists((o.name for o in self.operators), self.edges)

    def validate(self) -> None:
        """Raise DagError unless this is a non-empty acyclic DAG."""
        if not self.operators:
            raise DagError(f"dag {self.name!r} has no operators")
        cycle = _a_cycle(self._successors())
        if cycle:
            raise DagError(f"dag {self.name!r} has a cycle: " + " -> ".join(cycle))

    def sources(self) -> list[str]:
        dst = {d for _, d in self.edges}
        return [o.name for o in self.operators if o.name not in dst]

    def sinks(self) -> list[str]:
        src = {s for s, _ in self.edges}
        return [o.name for o in self.operators if o.name not in src]

    def successors(self, name: str) -> list[str]:
        return [d for s, d in self.edges if s == name]

    def to_spec(self) -> DagSpec:
        self.validate()
        return DagSpec.from_dag(self)


_INSTALLED = {os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                            sysconfig.get_paths()["platlib"]}}
# This distribution (the `clasp` package, apps included) is installed on every planner and worker, so its
# modules travel by reference, even from an editable install (whose files are outside site-packages).
_SHIPPED_PACKAGE = __name__.split(".")[0]


def _travels_by_value(module_name: str) -> bool:
    """True for a user's own module (its __main__, a test file) that a worker could not import."""
    if module_name == "__main__":
        return True
    if module_name.split(".")[0] == _SHIPPED_PACKAGE or module_name in sys.builtin_module_names:
        return False
    mod = sys.modules.get(module_name)
    path = getattr(mod, "__file__", None)
    if not path:
        return False
    real = os.path.realpath(path)
    return not any(real.startswith(p + os.sep) for p in _INSTALLED)


def _pickle_functions(fns: Iterable[Callable]) -> bytes:
    mods = set()
    for fn in fns:
        name = getattr(fn, "__module__", None)
        if name and _travels_by_value(name) and name != "__main__" and name in sys.modules:
            mods.add(sys.modules[name])
    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return cloudpickle.dumps(list(fns))
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


@dataclass
class OperatorSpec:
    """An operator as the runtime sees it: index, name, flags, successor indices, and its functions."""

    index: int
    name: str
    stateful: bool
    is_async: bool
    successors: list[int]
    fn: Callable
    key: Callable | None
    collect: bool = False
    batch: bool = False
    connector: Any = None
    kind: str = "operator"


@dataclass
class DagSpec:
    """A validated DAG in index form, shippable as bytes (`pack`) and rebuilt with `unpack`."""

    name: str
    operators: list[OperatorSpec]
    sources: list[int]

    @classmethod
    def from_dag(cls, dag: Dag) -> DagSpec:
        index = {o.name: o.index for o in dag.operators}
        topo = {n: i for i, n in enumerate(_generations(dag._successors()))}
        def succ(o):
            return sorted((index[d] for d in dag.successors(o.name)), key=lambda i: topo[dag.operators[i].name])

        ops = [OperatorSpec(o.index, o.name, o.stateful, o.is_async, succ(o), o.fn, o.key, o.collect, o.batch,
                            o.connector, o.kind)
               for o in dag.operators]
        # `sources` are the roots that `push()` feeds: not the operators reading a declared source.
        return cls(dag.name, ops, [index[s] for s in dag.sources() if dag.operators[index[s]].kind != "source"])

    @property
    def readers(self) -> list[int]:
        """The operators that read a declared source (`Dag.source`): their values enter at the workers."""
        return [o.index for o in self.operators if o.kind == "source"]

    @property
    def push_time(self) -> OperatorSpec | None:
        """The root `push()` feeds with event time (`Dag.push_source`), if any."""
        for i in self.sources:
            if isinstance(self.operators[i].fn, EventTime):
                return self.operators[i]
        return None

    def topological(self) -> list[int]:
        """Operator indices so that every operator comes after its predecessors."""
        succ = _successor_lists(range(len(self.operators)), ((o.index, s) for o in self.operators
                                                             for s in o.successors))
        indegree = _indegrees(succ)
        ready = [n for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            n = heapq.heappop(ready)
            out.append(n)
            for c in succ[n]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(ready, c)
        return out

    def edges(self) -> list[tuple[str, str]]:
        return [(o.name, self.operators[s].name) for o in self.operators for s in o.successors]

    def by_name(self, name: str) -> OperatorSpec:
        for o in self.operators:
            if o.name == name:
                return o
        raise KeyError(name)

    def pack(self) -> dict:
        """A msgpack-ready description: plain fields plus one cloudpickle blob of all functions."""
        fns = []
        for o in self.operators:
            fns.extend([o.fn, o.key, o.connector])
        return {"name": self.name, "sources": self.sources,
                "operators": [{"index": o.index, "name": o.name, "stateful": o.stateful, "async": o.is_async,
                               "collect": o.collect, "batch": o.batch, "successors": o.successors,
                               "kind": o.kind}
                              for o in self.operators],
                "functions": _pickle_functions(fns)}

    @classmethod
    def unpack(cls, d: dict) -> DagSpec:
        """Rebuild from `pack()`; raises DagError on anything malformed (it comes off the wire)."""
        try:
            fns = cloudpickle.loads(d["functions"])
            raw = d["operators"]
            if len(fns) != 3 * len(raw):
                raise DagError("function blob does not match the operator list")
            ops = []
            for i, o in enumerate(raw):
                if o["index"] != i:
                    raise DagError(f"operator {i} has index {o['index']}")
                succ = [int(s) for s in o["successors"]]
                if any(not 0 <= s < len(raw) for s in succ):
                    raise DagError(f"operator {o['name']!r} has a successor out of range")
                if o.get("batch") and (o["stateful"] or o["async"]):
                    raise DagError(f"operator {o['name']!r}: batch=True is for stateless, synchronous operators")
                kind = str(o.get("kind", "operator"))
                if kind not in ("operator", "source", "sink"):
                    raise DagError(f"operator {o['name']!r} has an unknown kind {kind!r}")
                ops.append(OperatorSpec(i, str(o["name"]), bool(o["stateful"]), bool(o["async"]), succ,
                                        fns[3 * i], fns[3 * i + 1], bool(o.get("collect", False)),
                                        bool(o.get("batch", False)), fns[3 * i + 2], kind))
            sources = [int(s) for s in d["sources"]]
            return cls(str(d["name"]), ops, sources)
        except DagError:
            raise
        except Exception as e:  # anything else from an untrusted description becomes a DagError
            raise DagError(f"cannot rebuild the dag: {type(e).__name__}: {e}") from e


# The few graph algorithms a DAG needs, on successor lists: networkx's import is a third of a process's start-up.
def _successor_lists(nodes: Iterable, edges: Iterable[tuple]) -> dict[Any, list]:
    """Each node's successors, in the order their edges were added (an edge once), as a networkx DiGraph."""
    succ: dict[Any, list] = {n: [] for n in nodes}
    for a, b in edges:
        succ.setdefault(b, [])
        if b not in succ.setdefault(a, []):
            succ[a].append(b)
    return succ


def _indegrees(succ: dict[Any, list]) -> dict[Any, int]:
    indegree = dict.fromkeys(succ, 0)
    for children in succ.values():
        for c in children:
            indegree[c] += 1
    return indegree


def _generations(succ: dict[Any, list]) -> list:
    """The nodes in networkx's `topological_sort` order: generation by generation, each in the order its
    nodes were freed (the order successors are sorted in travels to the workers)."""
    indegree = _indegrees(succ)
    generation, out = [n for n, d in indegree.items() if d == 0], []
    while generation:
        out += generation
        freed = []
        for n in generation:
            for c in succ[n]:
                indegree[c] -= 1
                if indegree[c] == 0:
                    freed.append(c)
        generation = freed
    return out


def _reachable(succ: dict[Any, list], start) -> set:
    seen, todo = {start}, [start]
    while todo:
        for c in succ[todo.pop()]:
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _a_cycle(succ: dict[Any, list]) -> list | None:
    """One cycle as its path with the first node again at the end, or None: a depth-first search."""
    done: set = set()
    for root in succ:
        if root in done:
            continue
        path, on_path, stack = [root], {root}, [iter(succ[root])]
        while stack:
            for c in stack[-1]:
                if c in on_path:
                    return path[path.index(c):] + [c]
                if c not in done:
                    path.append(c)
                    on_path.add(c)
                    stack.append(iter(succ[c]))
                    break
            else:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
    return None
