"""A time-stepped fluid simulator of a CLASP cluster of any size, driving the real policy code.

Pure: no sockets, no wall clock; numpy only; the same inputs and seed give the same result.

Model (docs/SIMULATOR.md): each worker is one server with a capacity of W µs of work per second. A
request of operator o on worker w costs `τ_o + Σ_s f[o→s]·(α·σ_s(w) + β·(1 − σ_s(w)))` µs, i.e. its
execution plus α per chained request to a local successor and β per remote one (in expectation over the
routing σ). Each distinct remote destination costs γ µs per second, charged as a capacity reduction.
Optionally (docs/SIMULATOR.md, "Validation"): a share of β is paid by the receiving worker
(`Costs.receive_share`), each data message costs `Costs.message_us` at both ends (remote rows batched per
destination, flushed on a timer or when full), and stateful operators are routed by measured key-group weights
(`SimConfig.key_skew`), so a hot key group loads its owner as at runtime.
Time advances in steps of `dt`; per step every worker serves queued work up to its budget, draining all
its operator queues by the same fraction (the fluid limit of one FIFO queue), and the outputs arrive in
the successors' queues, split by σ, at the next step. A planner admits records while fewer than `window`
records are in flight, like the runtime's in-flight window. Every simulated second yields the Table 2
metrics as a `clasp.core.control.Observation`; with a `Controller` the simulator feeds it and applies the
policy's placements (optionally pausing all workers for a configured migration time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from clasp.core.control import Controller, Observation, runtime_estimator_config
from clasp.core.estimator import Estimator, WorkerSample
from clasp.core.keygroups import assign_key_groups
from clasp.core.model import FLUSH_PEER_FACTOR, Edge, edge_flow, remote_destinations
from clasp.core.placement import topological_order
from clasp.core.policies import POLICIES, OperatorStats, PlacementResult, uniform_placement

Rate = float | Callable[[float], float] | None
SATURATED = 0.98  # utilization at which a simulated worker reports itself busy, like a CPU-bound one


class CostError(ValueError):
    """A malformed cost-coefficient file."""


_REQUIRED = object()


def _non_negative(d: Mapping, key: str, default: Any = _REQUIRED) -> float | None:
    """Cost-file field `key` as a finite float ≥ 0; `default` where absent (None: absent or null allowed)."""
    v = d.get(key) if default is _REQUIRED else d.get(key, default)
    if v is None and default is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        null = " or null" if default is None else ""
        raise CostError(f"costs field {key!r} must be a finite number ≥ 0{null}, not {v!r}")
    return float(v)


@dataclass(frozen=True)
class Costs:
    """The cost coefficients: α, β (µs per local / remote chained request), γ (µs/s per remote
    destination), W (µs of work per second per worker), and τ_o (µs) per app and operator."""

    alpha: float
    beta: float
    gamma: float
    capacity: float
    tau_us: dict[str, dict[str, float]]
    # The part of β the receiving worker pays (unpacking, queueing); the sender pays the rest. 0 (the
    # default, and what a file without the key means) charges all of β to the sender.
    receive_share: float = 0.0
    # µs per local chained request to a stateless successor that other workers also hold: the runtime then
    # routes through its weighted table (`clasp/runtime/executor.py` `send`) instead of the single-holder fast
    # path that α is measured on. None (the default, and a file without the key) charges α, as before.
    alpha_split: float | None = None
    # µs per data message at each end (the sender's framing and send, the receiver's receive and unpacking),
    # on top of β per row: a worker batches its remote rows per destination and flushes every `flush_delay_s`
    # of wall time while it runs (a fraction u·capacity / 10⁶ of the time at utilization u) or at `max_batch`
    # rows, so a stream of R rows/s to one destination carries min(R, max(R / max_batch,
    # u·capacity / 10⁶ / flush_delay_s)) messages/s. 0 (the default, and a file without the key) charges
    # nothing, as before.
    message_us: float = 0.0
    flush_delay_s: float = 0.001
    max_batch: int = 2000
    # A sender's flush round serves every peer, so each peer's batches come 1 + c·(peers − 1) times as far
    # apart (clasp.core.model.FLUSH_PEER_FACTOR; `clasp.bench.calibrate` fits it).
    flush_peer_factor: float = FLUSH_PEER_FACTOR
    # µs per chained request to a keyed successor whose key groups are not all on the sending worker, local
    # or remote, paid by the sender in place of α or (1 − r)·β: the runtime then routes each output through
    # its keyed table (key function, key-group lookup, hit count; `clasp/runtime/executor.py` `send`) instead
    # of queueing it for a wholly local owner. An extension of ours, not the paper's; None (the default, and
    # a file without the key) charges α and β as before.
    alpha_keyed: float | None = None
    # µs more per remote chained request to a stateless successor held by more than one worker, paid by the
    # sender on top of (1 − r)·β: the weighted-table route (as for α_split) deals out remote outputs too,
    # where a lone remote holder takes the direct path. Ours, not the paper's; 0 (the default, and a file
    # without the key) charges nothing, as before.
    beta_split: float = 0.0
    # Requests into a stateless operator are routed local first (clasp.core.model.edge_flow), as this runtime
    # routes them; false (the default, and the paper's file) routes each by σ of its successor, as the
    # paper's Eq. (8) does.
    local_first: bool = False
    # µs of the planner's CPU per record (accepting it from the client, dispatching it to the sources,
    # completing it): the planner is one process, so the job admits at most PLANNER_CAPACITY / planner_us
    # records per second whatever the workers could do. Ours; the paper has no planner term. 0 (the default,
    # and a file without the key) charges nothing, as before.
    planner_us: float = 0.0
    # µs of the client's CPU per record it pushes: counted only where the client shares a host with the
    # cluster (`SimConfig.host_capacity`). Ours; 0 by default.
    client_us: float = 0.0

    @classmethod
    def from_json_dict(cls, d: Any) -> Costs:
        if not isinstance(d, Mapping):
            raise CostError("costs must be a JSON object")
        values = {key: _non_negative(d, key) for key in ("alpha", "beta", "gamma", "capacity")}
        if values["capacity"] <= 0:
            raise CostError("costs field 'capacity' must be > 0")
        tau = d.get("tau_us")
        if not isinstance(tau, Mapping):
            raise CostError("costs field 'tau_us' must be an object of app → {operator: µs}")
        table: dict[str, dict[str, float]] = {}
        for app, ops in tau.items():
            if not isinstance(ops, Mapping):
                raise CostError(f"costs field 'tau_us.{app}' must be an object of operator → µs")
            for op, v in ops.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                    raise CostError(f"costs field 'tau_us.{app}.{op}' must be a finite number ≥ 0, not {v!r}")
            table[str(app)] = {str(op): float(v) for op, v in ops.items()}
        share = d.get("receive_share", 0.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise CostError(f"costs field 'receive_share' must be a number in [0, 1], not {share!r}")
        flush = d.get("flush_delay_s", 0.001)
        if isinstance(flush, bool) or not isinstance(flush, int | float) or not math.isfinite(flush) or flush <= 0:
            raise CostError(f"costs field 'flush_delay_s' must be a finite number > 0, not {flush!r}")
        batch = d.get("max_batch", 2000)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise CostError(f"costs field 'max_batch' must be an integer ≥ 1, not {batch!r}")
        local_first = d.get("local_first", False)
        if not isinstance(local_first, bool):
            raise CostError(f"costs field 'local_first' must be true or false, not {local_first!r}")
        return cls(values["alpha"], values["beta"], values["gamma"], values["capacity"], table, float(share),
                   _non_negative(d, "alpha_split", None), _non_negative(d, "message_us", 0.0), float(flush), batch,
                   _non_negative(d, "flush_peer_factor", FLUSH_PEER_FACTOR), _non_negative(d, "alpha_keyed", None),
                   _non_negative(d, "beta_split", 0.0), local_first, _non_negative(d, "planner_us", 0.0),
                   _non_negative(d, "client_us", 0.0))

    @classmethod
    def load(cls, path: str | Path) -> Costs:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CostError(f"cannot read costs file {path}: {exc.strerror or exc}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostError(f"costs file {path} is not JSON: {exc}") from None
        return cls.from_json_dict(d)

    def with_coefficients(self, alpha: float, beta: float, gamma: float) -> Costs:
        return replace(self, alpha=alpha, beta=beta, gamma=gamma)


# The cost files are package data of clasp.sim (pyproject.toml), found wherever clasp is installed. A wheel
# unpacks them as plain files, so a Path suits `Costs.load`, `--costs` defaults and calibration's writes.
_DATA = resources.files("clasp.sim")
COSTS_FILE = Path(str(_DATA / "sim_costs.json"))
PAPER_COSTS_FILE = Path(str(_DATA / "sim_costs_paper.json"))
MEASURED_COSTS_FILE = Path(str(_DATA / "sim_costs_measured.json"))
PLANNER_CAPACITY = 1e6  # µs of CPU per second: the planner is one single-threaded process


def share_host(demand: np.ndarray, available: float) -> np.ndarray:
    """What each process gets of `available` CPU when their `demand`s compete for it: all of its demand
    when the sum fits, else a fair share (max-min: no one gets more than it asks, the rest split equally),
    as the kernel's fair scheduler shares a host among runnable processes."""
    demand = np.maximum(np.asarray(demand, dtype=float), 0.0)
    available = max(float(available), 0.0)
    if demand.sum() <= available:
        return demand
    order = np.sort(demand)
    level, left, rest = 0.0, available, len(order)
    for d in order:
        if d * rest > left:
            level = left / rest
            break
        left -= d
        rest -= 1
        level = d
    return np.minimum(demand, level)


@dataclass(frozen=True)
class SimDag:
    """What the simulator needs of a DAG: operators, edges, per-edge fan-out (chained requests per request
    of the source operator), τ_o in µs and, optionally, stateful operators' key-group weights."""

    name: str
    operators: list[str]
    edges: list[Edge]
    fanout: dict[Edge, float]
    tau_us: dict[str, float]
    # Per stateful operator, the share of its requests in each key group (summing to 1), measured on the
    # app's input: routing then follows key-group ownership as at runtime, so key skew is modelled. An
    # operator without weights is routed by σ alone (its key space taken as uniform).
    key_weights: dict[str, list[float]] = field(default_factory=dict)
    # Stateful operators (their requests are always key-routed, so `Costs.alpha_split` does not apply).
    stateful: frozenset[str] = frozenset()

    def multiplicity(self) -> dict[str, float]:
        """Requests per input record of each operator (1 for a source)."""
        preds: dict[str, list[Edge]] = {o: [] for o in self.operators}
        for e in self.edges:
            preds[e[1]].append(e)
        m: dict[str, float] = {}
        for o in topological_order(self.operators, self.edges):
            m[o] = 1.0 if not preds[o] else sum(m[s] * self.fanout.get((s, o), 0.0) for s, _ in preds[o])
        return m


def measure_app(app: ModuleType, records: int = 2000, seed: int = 0
                ) -> tuple[dict[Edge, float], dict[str, list[float]]]:
    """Per-edge fan-out (outputs of src per request of src) and, per stateful operator, the share of its
    requests in each of the runtime's key groups (`clasp.core.routing.key_group`), counted on a local run."""
    from clasp.core.outputs import as_outputs
    from clasp.core.routing import NUM_KEY_GROUPS, key_group
    from clasp.testing import run_local

    dag = app.build_dag()
    emitted = {o.name: 0 for o in dag.operators}
    groups = {o.name: [0] * NUM_KEY_GROUPS for o in dag.operators if o.stateful and o.key is not None}

    def counting(name: str, fn: Callable, stateful: bool, key: Callable | None) -> Callable:
        # Outputs go to every successor, so counting a request's outputs once gives each edge's count.
        if stateful:
            hist = groups.get(name)

            def wrapped(state, value):
                if hist is not None:
                    hist[key_group(key(value))] += 1
                new_state, out = fn(state, value)
                out = as_outputs(out)
                emitted[name] += len(out)
                return new_state, out
        else:
            def wrapped(value):
                out = as_outputs(fn(value))
                emitted[name] += len(out)
                return out
        return wrapped

    for o in dag.operators:
        o.fn = counting(o.name, o.fn, o.stateful, o.key)
    job = run_local(dag, app.generate(records, seed), roundtrip=False)
    fanout = {(s, d): (emitted[s] / job.processed[s] if job.processed[s] else 0.0) for s, d in dag.edges}
    weights = {name: [c / sum(h) for c in h] for name, h in groups.items() if sum(h) > 0}
    return fanout, weights


def app_dag(app: ModuleType, costs: Costs, records: int = 2000, seed: int = 0) -> SimDag:
    """The SimDag of a benchmark app (a module with the app API of `clasp.apps`, e.g. `get_app("wc")`): its
    topology, measured fan-outs and τ_o from `costs`. The app is passed in, not looked up by name, so the
    simulator does not depend on the apps (docs/ARCHITECTURE.md)."""
    name = app.NAME
    dag = app.build_dag()
    ops = [o.name for o in dag.operators]
    tau = costs.tau_us.get(name)
    if tau is None:
        raise CostError(f"costs have no tau_us for app {name!r}")
    missing = [o for o in ops if o not in tau]
    if missing:
        raise CostError(f"costs tau_us.{name} lacks operator(s) {', '.join(missing)}")
    fanout, weights = measure_app(app, records, seed)
    return SimDag(name, ops, list(dag.edges), fanout, {o: tau[o] for o in ops}, weights,
                  frozenset(o.name for o in dag.operators if o.stateful))


@dataclass
class SimConfig:
    """`dt`: step (s); `window`: records in flight the planner allows; `max_queue`: the planner queue an
    unthrottled driver keeps full; `warmup`: seconds excluded from the summary; `latency_samples`: sampled
    record paths per step; `migration_pause`: seconds every worker stops when a placement is applied;
    `p_max`: executor slots per worker reported to the policy; `key_skew`: route a stateful operator by
    key-group ownership weighted by the DAG's measured `key_weights` (as the runtime does, so a hot key
    group loads its owner) instead of by σ over a uniform key space. `window` None is a quarter second of
    the nominal throughput of the workers the placement uses (at least 4 steps per hop of the DAG's depth):
    the runtime's fixed 5,000 would be many seconds of queued work with ~400 µs operators, and too few to
    fill a 10-op chain of 5 ms hops at this runtime's speed."""

    duration: float = 60.0
    dt: float = 0.005
    window: int | None = None
    max_queue: int = 2_000_000
    warmup: float = 2.0
    latency_samples: int = 4
    migration_pause: float = 0.0
    p_max: int = 10
    seed: int = 0
    key_skew: bool = False
    # µs of CPU per second that the planner, the client and every worker share when they run on one host
    # (the emulated cluster: `os.cpu_count()`·10⁶); None gives each its own (a real cluster).
    host_capacity: float | None = None

    def __post_init__(self) -> None:
        if not self.duration > 0:
            raise ValueError(f"duration must be > 0, not {self.duration}")
        if not 0 < self.dt <= 0.1:
            raise ValueError(f"dt must be in (0, 0.1] s, not {self.dt}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be at least 1, not {self.window}")
        if self.migration_pause < 0:
            raise ValueError(f"migration_pause must be ≥ 0, not {self.migration_pause}")
        if self.host_capacity is not None and not self.host_capacity > 0:
            raise ValueError(f"host_capacity must be > 0 µs/s, not {self.host_capacity}")


@dataclass
class SecondMetrics:
    """One simulated second: rates, active workers, per-worker utilization and the Observation."""

    t: int
    input_rate: float
    throughput: float
    workers: int
    utilization: list[float]
    observation: Observation


@dataclass
class SimResult:
    """Summary over the seconds after the warm-up, the per-second series and the policy's decisions."""

    throughput: float
    latency: dict[str, float]
    workers: int
    utilization: list[float]
    seconds: list[SecondMetrics]
    decisions: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"throughput": self.throughput, "latency": dict(self.latency), "workers": self.workers,
                "utilization": list(self.utilization),
                "series": [{"t": s.t, "input_rate": s.input_rate, "throughput": s.throughput,
                            "workers": s.workers} for s in self.seconds],
                "decisions": list(self.decisions)}


def _weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> list[float]:
    if values.size == 0 or not weights.sum() > 0:
        return [0.0 for _ in qs]
    order = np.argsort(values)
    v, cw = values[order], np.cumsum(weights[order])
    return [float(v[min(np.searchsorted(cw, q * cw[-1]), v.size - 1)]) for q in qs]


class Simulator:
    """One job on a pool of `pool` identical workers, starting on `placement` (default: every operator
    spread evenly over the pool), fed at `rate` (records/s, a function of simulated time, or None for
    unthrottled), optionally under a `controller` whose decisions it applies."""

    def __init__(self, dag: SimDag, costs: Costs, pool: int, *, rate: Rate = None,
                 placement: PlacementResult | None = None, controller: Controller | None = None,
                 config: SimConfig | None = None):
        if pool < 1:
            raise ValueError(f"pool must be at least 1 worker, not {pool}")
        if placement is not None and placement.workers > pool:
            raise ValueError(f"placement uses {placement.workers} workers, the pool has {pool}")
        self.dag, self.costs, self.pool, self.rate = dag, costs, pool, rate
        self.config = config or SimConfig()
        self.controller = controller
        self.ops = list(dag.operators)
        index = {o: i for i, o in enumerate(self.ops)}
        n = len(self.ops)
        self.fan = np.zeros((n, n))
        for (s, d), f in dag.fanout.items():
            self.fan[index[s], index[d]] = f
        self.tau = np.array([dag.tau_us[o] for o in self.ops], dtype=float)
        self.preds = [[index[s] for s, d in dag.edges if d == o] for o in self.ops]
        self.topo = [index[o] for o in topological_order(self.ops, dag.edges)]
        self.sources = np.array([1.0 if not p else 0.0 for p in self.preds])
        mult = dag.multiplicity()
        self.mult = np.array([mult[o] for o in self.ops], dtype=float)
        has_succ = self.fan.sum(axis=1) > 0
        self.sinks = [i for i, o in enumerate(self.ops) if not has_succ[i] and mult[o] > 0]
        self.sink_mult = sum(mult[self.ops[i]] for i in self.sinks)
        # One worker's cost of a record with every chained request local: a worker's nominal rate. The window
        # is a quarter second of it per worker in use (`_apply`): sized for the pool, a job on one worker of
        # ten would queue seconds of work, and its completions would lag its admissions for as long.
        per_record = sum(mult[o] * (dag.tau_us[o] + costs.alpha * self.fan[i].sum())
                         for i, o in enumerate(self.ops))
        nominal = costs.capacity / per_record if per_record > 0 else math.inf
        # Each hop takes at least one step, so the window must cover the DAG's depth in steps or it,
        # not the workers, would bound the throughput.
        depth = max(len(self.longest_path()), 1)
        self.window_per_worker = nominal * max(0.25, 4 * depth * self.config.dt)
        if placement is None:
            placement = uniform_placement(self.ops, dag.edges, pool, self.config.p_max, costs.capacity,
                                          "operators spread evenly over the pool", "uniform")
        self._apply(placement)

    def longest_path(self) -> list[int]:
        """Operators on the longest source-to-sink path."""
        best: dict[int, list[int]] = {}
        for o in self.topo:
            before = max((best[p] for p in self.preds[o]), key=len, default=[])
            best[o] = before + [o]
        return max(best.values(), key=len, default=[])

    def _apply(self, placement: PlacementResult) -> None:
        """Routing, per-request costs and capacities under `placement`."""
        n = len(self.ops)
        sigma = np.zeros((self.pool, n))
        owners_by_op = getattr(self, "owners", {})
        self.owners: dict[str, list[int]] = {}
        for j, o in enumerate(self.ops):
            shares = {w: f for w, f in placement.fractions.get(o, {}).items() if f > 0 and w < self.pool}
            if not shares:
                shares = {0: 1.0}  # an operator the policy saw no demand for still runs somewhere, as at runtime
            total = sum(shares.values())
            weights = self.dag.key_weights.get(o) if self.config.key_skew else None
            if weights:
                # A keyed operator's requests go to the owners of their key groups, owned by weight as the
                # runtime owns them once it measured them (keygroups.assign_weighted): a worker's share of
                # requests is its groups' weight, σ up to one hot group's granularity.
                owners = assign_key_groups({w: f / total for w, f in shares.items()}, len(weights),
                                           owners_by_op.get(o), weights)
                self.owners[o] = owners
                for g, w in enumerate(owners):
                    sigma[w, j] += weights[g]
                continue
            for w, f in shares.items():
                sigma[w, j] = f / total
        self.placement = placement
        self.sigma = sigma
        self.cum = np.cumsum(sigma, axis=0)
        c = self.costs
        stateless = np.array([o not in self.dag.stateful for o in self.ops], dtype=bool)
        fractions = {o: {w: float(sigma[w, j]) for w in range(self.pool) if sigma[w, j] > 0}
                     for j, o in enumerate(self.ops)}
        local_first = frozenset(o for j, o in enumerate(self.ops) if stateless[j]) if c.local_first else frozenset()
        # [w, o, s, d]: requests of s that reach worker d per request of o served on w, as the runtime routes
        # them (clasp.core.model.edge_flow: by σ_s, or local first into a stateless s).
        route = np.zeros((self.pool, n, n, self.pool))
        for j, o in enumerate(self.ops):
            for k in np.flatnonzero(self.fan[j] > 0):
                flows = edge_flow(fractions[o], fractions[self.ops[k]], self.ops[k] in local_first)
                for (w, d), x in flows.items():
                    route[w, j, k, d] = self.fan[j, k] * x / sigma[w, j]
                for w in np.flatnonzero(sigma[:, j] == 0):  # not o's holder: what reaches it goes by σ
                    route[w, j, k, :] = self.fan[j, k] * sigma[:, k]
        diag = np.arange(self.pool)
        kept = route[diag, :, :, diag]  # [w, o, s]: kept on w
        sent = route.sum(axis=3) - kept  # [w, o, s]: to other workers
        # The table route: a worker that sends one successor's requests to more than one destination.
        table = ((route > 0).sum(axis=3) > 1) & stateless[None, None, :]
        local = kept.sum(axis=2)  # [w, o]: chained requests per request of o on w that stay on w
        self.local_per_req = local
        self.remote_per_req = sent.sum(axis=2)
        # β is split between the two ends of a remote request: the sender pays (1 − r)·β per remote chained
        # request it emits, the receiver r·β per request that arrived from another worker.
        r = c.receive_share
        self.cost = self.tau[None, :] + c.alpha * local + (1 - r) * c.beta * self.remote_per_req
        if c.alpha_split is not None:
            # A local chained request on the table route: α_split instead of α.
            self.cost = self.cost + (c.alpha_split - c.alpha) * (kept * table).sum(axis=2)
        if c.beta_split:
            # A remote request on the table route pays β_split more.
            self.cost = self.cost + c.beta_split * (sent * table).sum(axis=2)
        if c.alpha_keyed is not None:
            stateful = np.array([o in self.dag.stateful for o in self.ops], dtype=float)
            keyed_routed = (sigma < 1 - 1e-12) * stateful[None, :]  # [w, s]: keyed s not wholly on w
            keyed_local = (sigma * keyed_routed) @ self.fan.T  # [w, o]
            keyed_remote = ((1.0 - sigma) * keyed_routed) @ self.fan.T
            self.cost = self.cost + ((c.alpha_keyed - c.alpha) * keyed_local
                                     + (c.alpha_keyed - (1 - r) * c.beta) * keyed_remote)
        # Remote arrivals per request of s on d: Σ_p mult_p Σ_(w≠d) σ_p(w)·route[w, p, s, d] / (into_s σ_s(d)).
        into = (self.mult[:, None] * self.fan).sum(axis=0)
        arrived = np.einsum("wp,p,wpsd->ds", sigma, self.mult, route) - np.einsum("dp,p,dps->ds", sigma, self.mult,
                                                                                 kept)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.arrived_remote = np.where(sigma * into[None, :] > 0, arrived / (sigma * into[None, :]), 0.0)
        if r > 0:
            self.cost = self.cost + r * c.beta * self.arrived_remote
        reach = remote_destinations(fractions, {e: f for e, f in self.dag.fanout.items()}, local_first)
        self.delta = np.array([len(reach.get(w, ())) for w in range(self.pool)], dtype=float)
        # [w, o, d]: chained requests per request of o on w that go to worker d (a worker's remote rows to d
        # per step are done @ this, off the diagonal: `_message_work`), and the arrivals' map.
        self.to_worker = route.sum(axis=2)
        self.route = route.reshape(self.pool * n, n * self.pool)
        self.active = sigma.sum(axis=1) > 0
        self.window = (float(self.config.window) if self.config.window is not None
                       else float(max(50.0, self.window_per_worker * self.active.sum())))
        self.effective = np.where(self.active, np.maximum(c.capacity - c.gamma * self.delta, 0.0), 0.0)

    def run(self) -> SimResult:
        cfg = self.config
        rng = np.random.default_rng(cfg.seed)
        n_ops = len(self.ops)
        steps_per_second = max(1, round(1.0 / cfg.dt))
        dt = 1.0 / steps_per_second
        seconds = math.ceil(cfg.duration)
        queue = np.zeros((self.pool, n_ops))
        planner = 0.0
        admitted_total = completed_total = 0.0
        pause_until = -1.0
        lat_values: list[np.ndarray] = []
        lat_weights: list[np.ndarray] = []
        series: list[SecondMetrics] = []
        decisions: list[dict] = []
        arange = np.arange(n_ops)
        k = cfg.latency_samples
        debt = np.zeros(self.pool)  # message work of the last step, paid from this step's budget
        for sec in range(seconds):
            pushed_s = completed_s = 0.0
            served = np.zeros((self.pool, n_ops))
            busy = np.zeros(self.pool)
            delay_sum = np.zeros(self.pool)
            for step in range(steps_per_second):
                t = sec + step * dt
                if self.rate is None:
                    push = max(0.0, cfg.max_queue - planner)
                else:
                    r = self.rate(t) if callable(self.rate) else self.rate
                    push = max(0.0, float(r)) * dt
                planner += push
                pushed_s += push
                admit = min(planner, max(0.0, self.window - (admitted_total - completed_total)))
                if self.costs.planner_us > 0:
                    admit = min(admit, PLANNER_CAPACITY * dt / self.costs.planner_us)
                planner -= admit
                admitted_total += admit
                queue += self.sigma * (self.sources * admit)[None, :]
                work = (queue * self.cost).sum(axis=1)
                budget = self.effective * dt if t >= pause_until else np.zeros(self.pool)
                if cfg.host_capacity is not None:
                    # The planner and the client take their part of the host first (they run ahead of the
                    # workers they feed; in steady state the client pushes what the planner admits); the
                    # workers' demands share what is left.
                    front = admit * (self.costs.planner_us + self.costs.client_us)
                    budget = share_host(np.minimum(budget, work + debt), cfg.host_capacity * dt - front)
                paid = 0.0
                if self.costs.message_us > 0:
                    paid = np.minimum(budget, debt)
                    budget = budget - paid
                    debt = debt - paid
                    busy += paid
                with np.errstate(divide="ignore", invalid="ignore"):
                    frac = np.where(work > budget, budget / work, 1.0)
                    delay = np.where(self.effective > 0, work / self.effective, 0.0)
                done = queue * frac[:, None]
                queue -= done
                served += done
                busy += np.minimum(work, budget)
                delay_sum += delay
                produced = done.sum(axis=0)
                if self.costs.message_us > 0:
                    with np.errstate(divide="ignore", invalid="ignore"):
                        running = np.where(self.effective > 0,
                                           (paid + np.minimum(work, budget)) / (self.effective * dt), 0.0)
                    debt = debt + self._message_work(done, dt, np.minimum(running, 1.0))
                queue += (done.reshape(-1) @ self.route).reshape(n_ops, self.pool).T
                if self.sink_mult > 0:
                    finished = sum(produced[i] for i in self.sinks) / self.sink_mult
                    completed_s += finished
                    completed_total += finished
                if k and t >= cfg.warmup and admit > 0:
                    lat_values.append(self._sample_latency(rng, delay, k, arange, planner, admit / dt))
                    lat_weights.append(np.full(k, admit / k))
            util = (busy + self.costs.gamma * self.delta * self.active) / self.costs.capacity
            obs = self._observation(pushed_s, completed_s, completed_total, planner, queue, served,
                                    delay_sum / steps_per_second, util)
            series.append(SecondMetrics(sec, pushed_s, completed_s, int(self.active.sum()), util.tolist(), obs))
            if self.controller is not None:
                decision = self._control(obs, sec + 1)
                if decision is not None:
                    decisions.append(decision)
                    if decision["change"]:
                        pause_until = sec + 1 + cfg.migration_pause
                        queue = self._move_queues(queue)
        after = [s for s in series if s.t >= cfg.warmup] or series
        values = np.concatenate(lat_values) if lat_values else np.zeros(0)
        weights = np.concatenate(lat_weights) if lat_weights else np.zeros(0)
        p50, p95, p99 = _weighted_percentiles(values, weights, (0.5, 0.95, 0.99))
        util_mean = np.mean([s.utilization for s in after], axis=0)
        return SimResult(float(np.mean([s.throughput for s in after])), {"p50": p50, "p95": p95, "p99": p99},
                         int(self.active.sum()), [float(u) for u in util_mean], series, decisions)

    def _message_work(self, done: np.ndarray, dt: float, running: np.ndarray) -> np.ndarray:
        """µs of message work per worker for one step in which it served `done` requests, busy a fraction
        `running` of its capacity: each worker's remote rows per destination become messages
        (`Costs.message_us`), paid by sender and receiver."""
        msgs = self._messages(done / dt, running) * dt
        return self.costs.message_us * (msgs.sum(axis=1) + msgs.sum(axis=0))

    def _messages(self, served: np.ndarray, running: np.ndarray) -> np.ndarray:
        c = self.costs
        rate = np.einsum("wo,wod->wd", served, self.to_worker)  # [w, d] remote rows per second
        np.fill_diagonal(rate, 0.0)
        # The flush timer fires every flush_delay_s of wall time while the sender runs: a CPU share
        # capacity / 10⁶ when saturated, times its utilization when not.
        peers = (rate > 0).sum(axis=1, keepdims=True)
        floor = (c.capacity / 1e6 / c.flush_delay_s) * running[:, None] / (1.0 + c.flush_peer_factor
                                                                         * np.maximum(peers - 1, 0))
        return np.minimum(rate, np.maximum(rate / c.max_batch, floor))

    def messages_per_second(self, served: np.ndarray, running: np.ndarray | None = None) -> np.ndarray:
        """[w, d] data messages per second from w to d when w serves `served` requests per second of
        each operator and is busy a fraction `running` (default 1: saturated) of its capacity (the model
        of `Costs.message_us`)."""
        return self._messages(served, np.ones(self.pool) if running is None else np.asarray(running, float))

    def _sample_latency(self, rng: np.random.Generator, delay: np.ndarray, k: int, arange: np.ndarray,
                        planner: float, admit_rate: float) -> np.ndarray:
        """End-to-end latency (s) of `k` records admitted now: a worker per operator drawn from σ, each hop
        its worker's FIFO wait (queued work / capacity) plus its service time, the longest path to a sink,
        plus the wait in the planner queue."""
        u = rng.random((k, len(self.ops)))
        who = np.minimum((u[:, None, :] > self.cum[None, :, :]).sum(axis=1), self.pool - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            service = np.where(self.effective[:, None] > 0, self.cost / self.effective[:, None], 0.0)
        hop = delay[who] + service[who, arange[None, :]]
        finish = np.zeros_like(hop)
        for o in self.topo:
            before = np.max([finish[:, p] for p in self.preds[o]], axis=0) if self.preds[o] else 0.0
            finish[:, o] = before + hop[:, o]
        sinks = self.sinks or list(range(len(self.ops)))
        # Unthrottled, the driver keeps the planner queue full, so its wait says nothing: measure from admission.
        wait = planner / admit_rate if admit_rate > 0 and self.rate is not None else 0.0
        return finish[:, sinks].max(axis=1) + wait

    def _observation(self, pushed: float, completed: float, completed_total: float, planner: float,
                     queue: np.ndarray, served: np.ndarray, delay: np.ndarray, util: np.ndarray) -> Observation:
        """The second's Table 2 per worker, with what the runtime's heartbeat reports beside it: the CPU used
        (work served, messages and destinations), the remote requests received and the data messages."""
        rates = served.sum(axis=0)
        operators = {o: OperatorStats(float(rates[j]), float(self.tau[j])) for j, o in enumerate(self.ops)}
        edges = {e: float(rates[self.ops.index(e[0])] * f) for e, f in self.dag.fanout.items()}
        running = np.minimum(util, 1.0)
        msgs = self._messages(served, running) if self.costs.message_us > 0 else np.zeros((self.pool, self.pool))
        workers = {}
        for w in np.flatnonzero(self.active):
            workers[int(w)] = WorkerSample(float(queue[w].sum()), float(delay[w]),
                                           float(served[w] @ self.tau),
                                           float(served[w] @ self.local_per_req[w]),
                                           float(served[w] @ self.remote_per_req[w]), float(self.delta[w]),
                                           busy=bool(util[w] >= SATURATED), cpu=float(util[w] * self.costs.capacity),
                                           r_received=float(served[w] @ self.arrived_remote[w]),
                                           messages_out=float(msgs[w].sum()), messages_in=float(msgs[:, w].sum()))
        instances = self.placement.instances() or len(self.ops)
        return Observation(pushed, completed, int(completed_total), int(planner), operators, edges, workers,
                           int(self.active.sum()), instances)

    def _control(self, obs: Observation, t: int) -> dict | None:
        step = self.controller.observe(obs)
        if step.trigger is None:
            return None
        d = step.decision
        entry = {"t": t, "trigger": step.trigger, "reason": d.reason, "change": d.change, "workers": d.workers}
        if d.change:
            self._apply(d.placement)
            self.controller.placed(d.placement)
        return entry

    def _move_queues(self, queue: np.ndarray) -> np.ndarray:
        """Requests queued for an operator on a worker that lost it go to its new holders, by σ."""
        lost = np.where(self.sigma > 0, 0.0, queue)
        return queue - lost + self.sigma * lost.sum(axis=0)[None, :]


def make_controller(dag: SimDag, costs: Costs, policy: str, pool: int, p_max: int = 10) -> Controller:
    """A Controller running POLICIES[policy] with an estimator that starts from `costs`' coefficients."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; accepted: {', '.join(POLICIES)}")
    estimator = Estimator(runtime_estimator_config(alpha=costs.alpha, beta=costs.beta, gamma=costs.gamma,
                                                   capacity=costs.capacity, receive_share=costs.receive_share,
                                                   mu=costs.message_us, flush_delay=costs.flush_delay_s,
                                                   flush_peer_factor=costs.flush_peer_factor,
                                                   alpha_split=costs.alpha_split,
                                                   alpha_keyed=costs.alpha_keyed,
                                                   beta_split=costs.beta_split))
    return Controller(list(dag.operators), list(dag.edges), POLICIES[policy](), p_max, pool,
                      estimator=estimator, stateless=tuple(o for o in dag.operators if o not in dag.stateful),
                      keyed=tuple(o for o in dag.operators if o in dag.stateful), local_first=costs.local_first)


def simulate(app: SimDag | ModuleType, workers: int, *, costs: Costs | None = None, policy: str | None = None,
             rate: Rate = None, config: SimConfig | None = None, start_workers: int = 1) -> SimResult:
    """Simulate `app` on `workers` workers: spread evenly over all of them, or, with `policy`, starting
    on `start_workers` (spread evenly) under the control loop with that policy and the pool as its limit."""
    costs = costs or Costs.load(COSTS_FILE)
    dag = app if isinstance(app, SimDag) else app_dag(app, costs)
    config = config or SimConfig()
    controller = None
    placement = None
    if policy is not None:
        controller = make_controller(dag, costs, policy, workers, config.p_max)
        n = min(start_workers, workers)
        placement = uniform_placement(dag.operators, dag.edges, n, config.p_max, costs.capacity,
                                      f"start spread evenly over {n} worker(s)", policy)
        controller.current = placement
    return Simulator(dag, costs, workers, rate=rate, placement=placement, controller=controller,
                     config=config).run()
