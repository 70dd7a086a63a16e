"""The baselines the paper compares CLASP against (SPEC.md, "Baselines"), behind the same Policy interface.

- FaaSFlowPolicy ("faasflow"): slot-based capacity (P_max executor slots per worker), worker count by linear
  extrapolation from the observed throughput, parallelism from invocation rates, critical-path greedy
  grouping. It knows nothing of chained-request cost.
- Zhang24Policy ("zhang24"): parallelism from a non-linear performance model (scheduling overhead and
  contention), instances assigned greedily by score = 0.5 × data affinity + 0.5 × load balance.
- FaaSFlowSPPolicy / Zhang24SPPolicy ("faasflow-sp", "zhang24-sp"): the baseline's own worker count with
  CLASP's placement on that count.

Every result has CLASP's shape, and its `load` is Eq. (8) with the true α, β, γ at the target rate, so a
load above W̄ shows a worker the baseline overloads. Pure and deterministic, like clasp.core.policies.
docs/BASELINES.md writes down the rules and models as implemented.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clasp.core.model import Edge, placement_load
from clasp.core.parallelism import largest_remainder, placement_parallelism
from clasp.core.placement import NoPlacementError, topological_order
from clasp.core.policies.base import Decision, PlacementResult, Policy, Stats
from clasp.core.policies.clasp import ClaspPolicy

# Floating-point slack for ceil(): 1 worker at 100 req/s with a target of 500 must give exactly 5.
_CEIL_SLACK = 1e-9


def _ceil(x: float) -> int:
    return math.ceil(x - _CEIL_SLACK)


def extrapolated_workers(current_workers: int, input_rate: float, throughput: float) -> int:
    """FaaSFlow's worker count: n_new = ceil(n_cur · λ_p / Λ), at least 1."""
    if not throughput > 0:
        raise ValueError(f"throughput is {throughput}: nothing to extrapolate from")
    return max(1, _ceil(current_workers * input_rate / throughput))


def invocation_parallelism(rates: Mapping[str, float], total: int) -> dict[str, int]:
    """FaaSFlow's parallelism: `total` instances split by invocation rate Ñ_o (not by demand Ñ_o·τ̄_o, which
    is what a slot-based scaler does not see), every operator at least one, by largest remainder."""
    names = list(rates)
    counts = largest_remainder([rates[o] for o in names], max(total, len(names)), [1] * len(names))
    return dict(zip(names, counts, strict=True))


def critical_path(operators: Sequence[str], edges: Sequence[Edge],
                  weight: Mapping[Edge, float]) -> list[Edge]:
    """The edges of the heaviest source-to-sink path under `weight` (ties: earliest in topological order).

    Weights are non-negative, so the longest path can always be extended back to a source; starting every
    operator at 0 gives the same path.
    """
    order = topological_order(operators, edges)
    position = {o: i for i, o in enumerate(order)}
    preds: dict[str, list[Edge]] = {o: [] for o in operators}
    for e in edges:
        preds[e[1]].append(e)
    dist = dict.fromkeys(operators, 0.0)
    via: dict[str, Edge | None] = dict.fromkeys(operators)
    for o in order:
        for e in sorted(preds[o], key=lambda e: position[e[0]]):
            d = dist[e[0]] + weight.get(e, 0.0)
            if d > dist[o]:
                dist[o], via[o] = d, e
    end = max(order, key=lambda o: (dist[o], -position[o]))
    path: list[Edge] = []
    while via[end] is not None:
        e = via[end]
        path.append(e)
        end = e[0]
    return path[::-1]


@dataclass
class Grouping:
    """FaaSFlow's groups (operators to co-locate) and the merges that built them, in order."""

    groups: list[list[str]]
    merges: list[Edge]


def critical_path_grouping(operators: Sequence[str], edges: Sequence[Edge], edge_rates: Mapping[Edge, float],
                           parallelism: Mapping[str, int], p_max: int) -> Grouping:
    """FaaSFlow's critical-path greedy grouping with slots as the group capacity.

    Every operator starts alone. Repeatedly: find the critical path (the path carrying the most chained
    traffic Ẽ across group boundaries); over its edges, heaviest first, merge the first pair of groups
    whose instances fit in one worker's P_max slots. When none on the path can merge, those edges are
    settled (groups only grow, so they never become mergeable) and the next critical path is taken. Stops
    when no path carries unsettled cross-group traffic.
    """
    topo = topological_order(operators, edges)
    group_of = {o: i for i, o in enumerate(topo)}
    members: dict[int, list[str]] = {i: [o] for i, o in enumerate(topo)}
    size = {i: int(parallelism[o]) for i, o in enumerate(topo)}
    settled: set[Edge] = set()
    merges: list[Edge] = []
    index = {tuple(e): i for i, e in enumerate(edges)}
    while True:
        weight = {e: float(edge_rates.get(e, 0.0)) for e in index
                  if e not in settled and group_of[e[0]] != group_of[e[1]]}
        path = [e for e in critical_path(operators, list(index), weight) if weight.get(e, 0.0) > 0]
        if not path:
            break
        for e in sorted(path, key=lambda e: (-weight[e], index[e])):
            a, b = group_of[e[0]], group_of[e[1]]
            if size[a] + size[b] <= p_max:
                keep, gone = min(a, b), max(a, b)
                members[keep] = sorted(members[keep] + members.pop(gone), key=topo.index)
                size[keep] += size.pop(gone)
                for o in members[keep]:
                    group_of[o] = keep
                merges.append(e)
                break
        else:
            settled.update(path)
    return Grouping([members[g] for g in sorted(members)], merges)


def pack_groups(groups: Sequence[Sequence[str]], parallelism: Mapping[str, int], workers: int,
                p_max: int) -> dict[str, dict[int, int]]:
    """Put each group on the fewest workers with free slots: largest group first; one worker if any has room
    (the fullest that does, keeping emptier ones for bigger groups), else the emptiest workers in turn.
    Within a group, instances are laid out operator by operator, so neighbours share the boundary worker."""
    free = [p_max] * workers
    result: dict[str, dict[int, int]] = {o: {} for g in groups for o in g}
    ranked = sorted(range(len(groups)), key=lambda i: (-sum(parallelism[o] for o in groups[i]), i))
    for i in ranked:
        need = sum(parallelism[o] for o in groups[i])
        fitting = [w for w in range(workers) if free[w] >= need]
        if fitting:
            targets = [min(fitting, key=lambda w: (free[w], w))]
        else:
            targets = sorted((w for w in range(workers) if free[w] > 0), key=lambda w: (-free[w], w))
        slots = iter(w for w in targets for _ in range(free[w]))
        for o in groups[i]:
            for _ in range(parallelism[o]):
                w = next(slots, None)
                if w is None:
                    raise NoPlacementError(f"{need} instances do not fit {workers} worker(s) of {p_max} slots")
                result[o][w] = result[o].get(w, 0) + 1
                free[w] -= 1
    return result


def instance_fractions(parallelism: Mapping[str, Mapping[int, int]]) -> dict[str, dict[int, float]]:
    """σ_o(w) = instances of o on w / P_o: a slot-based runtime routes by instance."""
    out = {}
    for o, pw in parallelism.items():
        total = sum(pw.values())
        out[o] = {w: c / total for w, c in sorted(pw.items()) if c > 0} if total else {}
    return out


def baseline_result(stats: Stats, fractions: dict[str, dict[int, float]],
                    parallelism: dict[str, dict[int, int]], order: list[str], workers: int, rate: float,
                    policy: str, reason: str) -> PlacementResult:
    """A PlacementResult whose shares and Eq. (8) load are computed with the true α, β, γ at `rate`."""
    load = stats.load_at(rate)
    demand = load.demand
    shares = {o: {w: f * demand.get(o, 0.0) for w, f in pw.items()} for o, pw in fractions.items()}
    per = placement_load(fractions, demand, load.edge_rates, stats.alpha, stats.beta, stats.gamma)
    loads = [per.get(w, 0.0) for w in range(workers)]
    peak = max(loads, default=0.0)
    if peak > stats.capacity * (1 + 1e-9):
        reason += f"; Eq. (8) peak load {peak / stats.capacity:.2f}× W̄"
    return PlacementResult(order, workers, shares, fractions, parallelism, loads, stats.capacity, rate,
                           policy, reason)


def _prepared(operators: Sequence[str], edges: Sequence[Edge], stats: Stats) -> tuple[list[Edge], Stats]:
    edges = [tuple(e) for e in edges]
    return edges, stats.aligned(operators, edges)


def _prepared_for(operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                  workers: int) -> tuple[list[Edge], Stats]:
    """place_on's checks: a positive worker count and a throughput to scale from."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    edges, stats = _prepared(operators, edges, stats)
    if not stats.throughput > 0:
        raise NoPlacementError(f"throughput is {stats.throughput:g}: nothing to scale from")
    return edges, stats


@dataclass
class FaaSFlowConfig:
    """FaaSFlow settings: a standing worker limit (None: unlimited)."""

    max_workers: int | None = None


@dataclass
class FaaSFlowPolicy(Policy):
    """FaaSFlow (ASPLOS'22) as the paper runs it: capacity = executor slots, linear worker extrapolation."""

    config: FaaSFlowConfig = field(default_factory=FaaSFlowConfig)
    name: str = "faasflow"

    def worker_count(self, stats: Stats, max_workers: int | None = None) -> int:
        """ceil(n_cur · λ_p / Λ), raised so every operator gets a slot, capped at the worker limit."""
        limit = max_workers if max_workers is not None else self.config.max_workers
        n = max(extrapolated_workers(stats.workers, stats.input_rate, stats.throughput),
                _ceil(len(stats.operators) / stats.p_max))
        return n if limit is None else min(n, limit)

    def plan(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats, workers: int, rate: float,
             reason: str) -> PlacementResult:
        """FaaSFlow's parallelism and grouping on `workers` workers, evaluated at `rate`."""
        if len(operators) > workers * stats.p_max:
            raise NoPlacementError(f"{len(operators)} operators need more than {workers} worker(s) × "
                                 f"{stats.p_max} slots")
        scale = rate / stats.throughput
        rates = {o: scale * stats.operators[o].rate for o in operators}
        per_op = invocation_parallelism(rates, workers * stats.p_max)
        edge_rates = {e: scale * r for e, r in stats.edge_rates().items()}
        grouping = critical_path_grouping(operators, edges, edge_rates, per_op, stats.p_max)
        parallelism = pack_groups(grouping.groups, per_op, workers, stats.p_max)
        order = [o for g in grouping.groups for o in g]
        return baseline_result(stats, instance_fractions(parallelism), parallelism, order, workers, rate,
                               self.name, reason)

    def decide(self, operators: Sequence[str], edges: Sequence[Edge], current: PlacementResult | None,
               stats: Stats, *, max_workers: int | None = None) -> Decision:
        edges, stats = _prepared(operators, edges, stats)
        if not stats.throughput > 0:
            return Decision.no_change(f"throughput is {stats.throughput:g}: nothing to scale from")
        n = self.worker_count(stats, max_workers)
        if current is not None and current.workers == n and set(current.parallelism) == set(operators):
            return Decision.no_change(f"extrapolation keeps {n} worker(s) for {stats.input_rate:g} req/s")
        reason = (f"{stats.workers} worker(s) at {stats.throughput:g} req/s extrapolate to {n} worker(s) of "
                  f"{stats.p_max} slots for {stats.input_rate:g} req/s")
        try:
            result = self.plan(list(operators), edges, stats, n, stats.input_rate, reason)
        except NoPlacementError as exc:
            return Decision.no_change(f"no placement fits: {exc}")
        return Decision(result, result.reason)

    def place_on(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                 workers: int) -> PlacementResult:
        """FaaSFlow on exactly `workers` workers, at the rate it believes they sustain: Λ · n / n_cur."""
        edges, stats = _prepared_for(operators, edges, stats, workers)
        rate = stats.throughput * workers / stats.workers
        return self.plan(list(operators), edges, stats, workers, rate,
                         f"{workers} worker(s) of {stats.p_max} slots, extrapolated to {rate:.0f} req/s")


@dataclass
class Zhang24Config:
    """Zhang24 settings (docs/BASELINES.md): the score weight of data affinity (load balance gets the rest),
    the contention coefficient κ, the scheduling overhead per request in µs (None: the profile's α, the
    per-request dispatch cost a one-worker profiling run sees), the target instance utilization, the cap on
    one operator's instances when the model cannot reach its rate, and a standing worker limit."""

    affinity_weight: float = 0.5
    contention: float = 0.02
    scheduling_overhead_us: float | None = None
    utilization: float = 0.8
    max_instances: int = 1000
    max_workers: int | None = None


def model_throughput(instances: int, tau_us: float, overhead_us: float, contention: float) -> float:
    """Zhang24's performance model: X(k) = 10⁶ · k / ((τ̄ + s) · (1 + κ · (k − 1))) requests per second.

    Each request costs its execution τ̄ plus a scheduling overhead s; k instances contend, stretching every
    request by (1 + κ(k − 1)). X grows with k but saturates at 10⁶ / ((τ̄ + s) κ).
    """
    if instances < 1:
        return 0.0
    per_request = (tau_us + overhead_us) * (1.0 + contention * (instances - 1))
    return math.inf if per_request <= 0 else 1e6 * instances / per_request


def model_parallelism(rate: float, tau_us: float, overhead_us: float, contention: float, utilization: float,
                      cap: int) -> int:
    """The fewest instances k ≤ cap with utilization · X(k) ≥ rate (cap when the model saturates first).

    Closed form: with r = rate (τ̄ + s) / (10⁶ u), k ≥ r (1 − κ) / (1 − κ r) when κ r < 1.
    """
    r = rate * (tau_us + overhead_us) / (1e6 * utilization)
    if r <= 1:
        return 1
    if contention * r >= 1:
        return max(1, cap)
    k = max(1, _ceil(r * (1 - contention) / (1 - contention * r)))
    # The closed form can land one off after rounding; the model itself decides.
    while k > 1 and utilization * model_throughput(k - 1, tau_us, overhead_us, contention) >= rate:
        k -= 1
    while k < cap and utilization * model_throughput(k, tau_us, overhead_us, contention) < rate:
        k += 1
    return min(k, cap)


def affinity(op: str, worker: int, neighbours: Mapping[str, Sequence[tuple[str, float]]],
             placed: Mapping[str, Mapping[int, int]], totals: Mapping[str, int]) -> float:
    """Data affinity of one more instance of `op` on `worker`, in [0, 1]: the share of op's chained traffic
    (in and out, Ẽ-weighted) whose other end already sits on that worker."""
    traffic = sum(rate for _, rate in neighbours.get(op, ()))
    if traffic <= 0:
        return 0.0
    local = sum(rate * placed.get(n, {}).get(worker, 0) / totals[n]
                for n, rate in neighbours.get(op, ()) if totals.get(n))
    return local / traffic


def load_balance(used: Sequence[int], worker: int) -> float:
    """Load-balance term in [0, 1]: how much less loaded `worker` is than the most loaded one, min–max
    normalized over the pool (1 when all are equal). The free-slot share 1 − u/P_max would move by only
    1/P_max per instance and let affinity pack everything, not the spreading the paper reports."""
    low, high = min(used), max(used)
    return 1.0 if high == low else (high - used[worker]) / (high - low)


@dataclass
class Assignment:
    """Zhang24's greedy assignment: instances per operator and worker, and every step (operator, worker)."""

    parallelism: dict[str, dict[int, int]]
    steps: list[tuple[str, int]]


def greedy_assignment(order: Sequence[str], parallelism: Mapping[str, int],
                      neighbours: Mapping[str, Sequence[tuple[str, float]]], workers: int, p_max: int,
                      affinity_weight: float = 0.5) -> Assignment:
    """Assign instances one at a time, operators in `order`, each to the worker with free slots of highest
    score = w · affinity + (1 − w) · load balance. Ties go to the least-loaded worker, then the lowest index:
    a full affinity on a loaded worker exactly offsets a full balance on an empty one, and a scheduler that
    scores for balance breaks that tie towards balance."""
    placed: dict[str, dict[int, int]] = {o: {} for o in order}
    used = [0] * workers
    totals = {o: int(parallelism[o]) for o in order}
    steps: list[tuple[str, int]] = []
    for o in order:
        for _ in range(totals[o]):
            best, best_key = None, None
            for w in range(workers):
                if used[w] >= p_max:
                    continue
                score = (affinity_weight * affinity(o, w, neighbours, placed, totals)
                         + (1 - affinity_weight) * load_balance(used, w))
                key = (score, -used[w])
                if best_key is None or key > best_key:
                    best, best_key = w, key
            if best is None:
                raise NoPlacementError(f"{sum(totals.values())} instances do not fit {workers} worker(s) of "
                                     f"{p_max} slots")
            placed[o][best] = placed[o].get(best, 0) + 1
            used[best] += 1
            steps.append((o, best))
    return Assignment(placed, steps)


def neighbour_traffic(operators: Sequence[str], edges: Sequence[Edge],
                      edge_rates: Mapping[Edge, float]) -> dict[str, list[tuple[str, float]]]:
    """Per operator, its predecessors and successors with the chained-request rate between them."""
    out: dict[str, list[tuple[str, float]]] = {o: [] for o in operators}
    for s, d in edges:
        r = float(edge_rates.get((s, d), 0.0))
        out[s].append((d, r))
        out[d].append((s, r))
    return out


@dataclass
class Zhang24Policy(Policy):
    """Zhang24 (HPCC'24): model-predicted parallelism, greedy affinity and load-balance assignment."""

    config: Zhang24Config = field(default_factory=Zhang24Config)
    name: str = "zhang24"

    def parallelism(self, operators: Sequence[str], stats: Stats, rate: float, cap: int) -> dict[str, int]:
        """P_o per operator from the performance model at `rate`."""
        overhead = self.config.scheduling_overhead_us
        if overhead is None:
            overhead = stats.alpha
        scale = rate / stats.throughput
        return {o: model_parallelism(scale * stats.operators[o].rate, stats.operators[o].tau_us, overhead,
                                     self.config.contention, self.config.utilization, cap)
                for o in operators}

    def pool(self, per_op: Mapping[str, int], stats: Stats, max_workers: int | None) -> int:
        """The workers Zhang24 may spread over: the limit if there is one, else the cluster it has (grown
        only when its instances need more slots)."""
        limit = max_workers if max_workers is not None else self.config.max_workers
        if limit is not None:
            return limit
        return max(stats.workers, _ceil(sum(per_op.values()) / stats.p_max))

    def plan(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats, rate: float,
             max_workers: int | None, exact: bool = False) -> PlacementResult:
        """Predict parallelism, fit it to the pool's slots, assign greedily; `exact`: report `max_workers`."""
        limit = max_workers if max_workers is not None else self.config.max_workers
        cap = self.config.max_instances
        if limit is not None:
            cap = min(cap, limit * stats.p_max)
        per_op = self.parallelism(operators, stats, rate, cap)
        pool = self.pool(per_op, stats, max_workers)
        slots = pool * stats.p_max
        if len(operators) > slots:
            raise NoPlacementError(f"{len(operators)} operators need more than {pool} worker(s) × "
                                 f"{stats.p_max} slots")
        if sum(per_op.values()) > slots:
            # The model asks for more than the pool holds: shrink in proportion, every operator keeping one.
            names = list(per_op)
            fitted = largest_remainder([per_op[o] for o in names], slots, [1] * len(names))
            per_op = dict(zip(names, fitted, strict=True))
        scale = rate / stats.throughput
        edge_rates = {e: scale * r for e, r in stats.edge_rates().items()}
        order = topological_order(operators, edges)
        assignment = greedy_assignment(order, per_op, neighbour_traffic(operators, edges, edge_rates), pool,
                                       stats.p_max, self.config.affinity_weight)
        used = sorted({w for pw in assignment.parallelism.values() for w in pw})
        # Empty workers score alike and ties go to the lowest index, so the used workers are 0..k-1.
        workers = pool if exact else len(used)
        return baseline_result(stats, instance_fractions(assignment.parallelism), assignment.parallelism,
                               order, workers, rate, self.name,
                               f"{sum(per_op.values())} model-predicted instances for {rate:g} req/s "
                               f"spread over {len(used)} of {pool} worker(s)")

    def decide(self, operators: Sequence[str], edges: Sequence[Edge], current: PlacementResult | None,
               stats: Stats, *, max_workers: int | None = None) -> Decision:
        edges, stats = _prepared(operators, edges, stats)
        if not stats.throughput > 0:
            return Decision.no_change(f"throughput is {stats.throughput:g}: nothing to scale from")
        try:
            new = self.plan(list(operators), edges, stats, stats.input_rate, max_workers)
        except NoPlacementError as exc:
            return Decision.no_change(f"no placement fits: {exc}")
        if (current is not None and current.workers == new.workers
                and {o: sum(pw.values()) for o, pw in current.parallelism.items()}
                == {o: sum(pw.values()) for o, pw in new.parallelism.items()}):
            return Decision.no_change(f"the model keeps the same instances on {new.workers} worker(s)")
        return Decision(new, new.reason)

    def place_on(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                 workers: int) -> PlacementResult:
        """Zhang24 with exactly `workers` workers as its pool, at the target input rate."""
        edges, stats = _prepared_for(operators, edges, stats, workers)
        return self.plan(list(operators), edges, stats, stats.input_rate, workers, exact=True)


@dataclass
class SharedPlacementPolicy(Policy):
    """A baseline's worker count with CLASP's placement on that count (the paper's -SP ablation, §5.6).

    The placement is CLASP's worker-limit placement for n workers; its shares and Eq. (8) load are then
    evaluated at the target rate, so a load above W̄ shows the baseline's count is too small.
    """

    baseline: Policy = field(default_factory=FaaSFlowPolicy)
    clasp: ClaspPolicy = field(default_factory=ClaspPolicy)
    name: str = ""

    def worker_count(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                     max_workers: int | None) -> int | None:
        """The baseline's own worker count for `stats.input_rate` (None: the baseline has no placement)."""
        decision = self.baseline.decide(operators, edges, None, stats, max_workers=max_workers)
        return decision.workers

    def on_workers(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                   workers: int, why: str) -> PlacementResult:
        """CLASP's placement on `workers`, re-evaluated at the target rate."""
        edges, stats = _prepared(operators, edges, stats)
        base = self.clasp.place_on(operators, edges, stats, workers)
        rate = stats.input_rate
        if not stats.throughput > 0 or base.rate <= 0:
            base.policy = self.name
            return base
        load = stats.load_at(rate)
        parallelism = placement_parallelism(base.fractions, load.demand, rate / stats.throughput,
                                            stats.instances, stats.p_max)
        return baseline_result(stats, base.fractions, parallelism, base.order, workers, rate, self.name,
                               f"{why}; CLASP's placement for them sustains {base.rate:.0f} req/s")

    def decide(self, operators: Sequence[str], edges: Sequence[Edge], current: PlacementResult | None,
               stats: Stats, *, max_workers: int | None = None) -> Decision:
        n = self.worker_count(operators, edges, stats, max_workers)
        if n is None:
            return Decision.no_change(f"{self.baseline.name} finds no worker count: "
                                      f"{self.baseline.decide(operators, edges, None, stats).reason}")
        if current is not None and current.workers == n and set(current.fractions) == set(operators):
            return Decision.no_change(f"{self.baseline.name} keeps {n} worker(s)")
        result = self.on_workers(operators, edges, stats, n, f"{self.baseline.name} chooses {n} worker(s)")
        return Decision(result, result.reason)

    def place_on(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                 workers: int) -> PlacementResult:
        """Manual scaling fixes the count, so this is CLASP's placement on `workers`."""
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        return self.on_workers(operators, edges, stats, workers, f"{workers} worker(s) requested")


@dataclass
class FaaSFlowSPPolicy(SharedPlacementPolicy):
    """FaaSFlow's extrapolated worker count, CLASP's placement."""

    baseline: Policy = field(default_factory=FaaSFlowPolicy)
    name: str = "faasflow-sp"


@dataclass
class Zhang24SPPolicy(SharedPlacementPolicy):
    """Zhang24's worker count (the workers its greedy assignment uses), CLASP's placement."""

    baseline: Policy = field(default_factory=Zhang24Policy)
    name: str = "zhang24-sp"


BASELINES: dict[str, type[Policy]] = {"faasflow": FaaSFlowPolicy, "zhang24": Zhang24Policy,
                                      "faasflow-sp": FaaSFlowSPPolicy, "zhang24-sp": Zhang24SPPolicy}
