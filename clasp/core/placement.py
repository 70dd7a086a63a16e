"""Load derivation, Eq. (5)–(7), and CLASP's reverse-topological next-fit placement, Eq. (8)–(9).

Input is plain data: operator names, edges as (src, dst) pairs, per-operator rates and execution times,
per-edge chained-request rates. Workers are numbered 0, 1, ... in the order next-fit opens them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clasp.core.model import CapacityModel, Edge, edge_flow, keyed_cost, local_cost, table_remote_cost

# A share this small is rounding noise; placing it would only add a fan-out connection.
MIN_FRACTION = 1e-9
# A hard stop for pathological inputs (e.g. γ·g close to W̄): beyond this, next-fit is not converging.
WORKER_HARD_LIMIT = 100_000
WHOLE_LIMIT = 4096  # operators × workers above which the whole-operator candidate is skipped (its cost)
# What the refinement's optional candidates may price, per N log₂ N (`Work.for_size`): the paper's apps on
# ten workers price at most a fifth of it.
REFINE_BUDGET = 4


class NoPlacementError(ValueError):
    """No placement exists for this input under the capacity model (not `clasp.core.routing`'s
    `PlacementError`, a runtime placement that does not fit the DAG or the workers)."""


class InfeasiblePlacement(NoPlacementError):
    """An operator cannot be placed even on a fresh worker (its fan-out cost γ·g alone reaches W̄)."""


class WorkerLimitExceeded(NoPlacementError):
    """The placement needs more workers than allowed."""


class LoadError(ValueError):
    """The observed statistics give nothing to project from (zero throughput)."""


@dataclass
class Work:
    """What a placement cost, counted by the pure code itself: `evaluations` candidate placements priced
    (a next-fit run, a step of a whole-operator cut, a spread), `priced` what they priced in all: their
    σ_o(w) shares and per-edge flows between workers, the size of Eq. (8) for each. `budget` bounds what
    the refinement's optional candidates may price (`for_size`; docs/POLICY.md, "Bounded refinement")."""

    evaluations: int = 0
    priced: int = 0
    budget: float = math.inf

    @classmethod
    def for_size(cls, operators: int, workers: int) -> Work:
        """A counter with the refinement's budget for `operators` × `workers`: REFINE_BUDGET · N log₂ N
        shares and flows, N = operators × workers, at least WHOLE_LIMIT (below it the refinement searches
        every candidate, as it always did)."""
        n = max(operators * workers, WHOLE_LIMIT)
        return cls(budget=REFINE_BUDGET * n * math.log2(n))

    def count(self, fractions: Mapping[str, Mapping[int, float]], edge_rates: Mapping[Edge, float],
              model: CapacityModel) -> None:
        """One evaluation of the placement `fractions`."""
        self.evaluations += 1
        self.priced += priced_size({o: len(pw) for o, pw in fractions.items()}, edge_rates, model)

    def affords(self, cost: int = 0) -> bool:
        """Whether an optional candidate that prices `cost` more stays within the budget."""
        return self.priced + cost <= self.budget


def priced_size(holders: Mapping[str, int], edge_rates: Mapping[Edge, float], model: CapacityModel) -> int:
    """What pricing a placement with `holders` workers per operator costs: its shares, and per edge its
    flows (`edge_flow`: every pair of holders under σ routing, about one per holder local first)."""
    routed = model.local_routed
    flows = 0
    for (src, dst), rate in edge_rates.items():
        if rate > 0:
            a, b = holders.get(src, 0), holders.get(dst, 0)
            flows += a + b if dst in routed else a * b
    return sum(holders.values()) + flows


def scale_factor(input_rate: float, throughput: float) -> float:
    """Eq. (5): s = λ_p / Λ. Raises LoadError when Λ is zero: there is nothing to scale from."""
    if not throughput > 0 or not math.isfinite(throughput):
        raise LoadError(f"throughput is {throughput}: nothing to scale from")
    return input_rate / throughput


@dataclass(frozen=True)
class Load:
    """Projected load: scale s (Eq. 5), rates Ñ_o and Ẽ (Eq. 6), demand D̃_o = Ñ_o·τ̄_o (Eq. 7)."""

    scale: float
    rates: dict[str, float]
    tau_us: dict[str, float]
    edge_rates: dict[Edge, float]

    @property
    def demand(self) -> dict[str, float]:
        """Eq. (7): D̃_o = Ñ_o · τ̄_o."""
        return {o: n * self.tau_us.get(o, 0.0) for o, n in self.rates.items()}

    def scaled(self, factor: float) -> Load:
        """The same load projected by a further factor (τ̄_o stays unscaled)."""
        return Load(self.scale * factor, {o: n * factor for o, n in self.rates.items()}, dict(self.tau_us),
                    {e: r * factor for e, r in self.edge_rates.items()})


def derive_load(rates: Mapping[str, float], tau_us: Mapping[str, float], edge_rates: Mapping[Edge, float],
                throughput: float, input_rate: float) -> Load:
    """Eq. (5)–(7): project observed N_o and E[o→o_s] from throughput Λ to the target input rate λ_p."""
    s = scale_factor(input_rate, throughput)
    return Load(s, {o: s * float(n) for o, n in rates.items()}, {o: float(tau_us.get(o, 0.0)) for o in rates},
                {e: s * float(r) for e, r in edge_rates.items()})


def _adjacency(operators: Sequence[str], edges: Sequence[Edge], edge_rates: Mapping[Edge, float]):
    index = {o: i for i, o in enumerate(operators)}
    if len(index) != len(operators):
        raise NoPlacementError("operator names are not unique")
    succ: dict[str, list[tuple[str, float]]] = {o: [] for o in operators}
    pred: dict[str, list[tuple[str, float]]] = {o: [] for o in operators}
    for s, d in edges:
        if s not in index or d not in index:
            raise NoPlacementError(f"edge {s} -> {d} names an unknown operator")
        rate = float(edge_rates.get((s, d), 0.0))
        succ[s].append((d, rate))
        pred[d].append((s, rate))
    # Heaviest edge first; declaration order breaks ties so the order is deterministic.
    for table in (succ, pred):
        for o in table:
            table[o].sort(key=lambda x: (-x[1], index[x[0]]))
    return index, succ, pred


def topological_order(operators: Sequence[str], edges: Sequence[Edge]) -> list[str]:
    """Kahn's order (declaration order among ready operators); raises NoPlacementError naming a cycle."""
    index = {o: i for i, o in enumerate(operators)}
    indegree = dict.fromkeys(operators, 0)
    out: dict[str, list[str]] = {o: [] for o in operators}
    for s, d in edges:
        if s not in index or d not in index:
            raise NoPlacementError(f"edge {s} -> {d} names an unknown operator")
        out[s].append(d)
        indegree[d] += 1
    ready = sorted((o for o in operators if indegree[o] == 0), key=index.__getitem__)
    order = []
    while ready:
        o = ready.pop(0)
        order.append(o)
        for d in out[o]:
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
        ready.sort(key=index.__getitem__)
    if len(order) != len(operators):
        rest = sorted((o for o in operators if indegree[o] > 0), key=index.__getitem__)
        raise NoPlacementError("the edges close a cycle through " + ", ".join(rest))
    return order


def placement_order(operators: Sequence[str], edges: Sequence[Edge],
                    edge_rates: Mapping[Edge, float] | None = None) -> list[str]:
    """Reverse-topological depth-first order from the sinks, heaviest edge first, postponing an operator
    until all its successors are placed (SPEC.md, Fig. 6: E, C, B, D, A)."""
    topo = topological_order(operators, edges)
    _, succ, pred = _adjacency(operators, edges, edge_rates or {})
    placed: set[str] = set()
    active: set[str] = set()
    order: list[str] = []

    def visit(o: str) -> None:
        if o in placed or o in active:
            return
        active.add(o)
        for s, _ in succ[o]:
            if s not in placed:
                visit(s)
        # A successor still unplaced is on the current path; it revisits o once it is placed.
        if all(s in placed for s, _ in succ[o]):
            placed.add(o)
            order.append(o)
            for p, _ in pred[o]:
                visit(p)
        active.discard(o)

    for o in operators:
        if not succ[o]:
            visit(o)
    for o in reversed(topo):  # defensive: anything the traversal left behind, in a valid order
        visit(o)
    return order


@dataclass
class FractionalPlacement:
    """A placement Φ: σ_o(w) per operator and worker index, with the demand it was made for. The policies
    turn it into a `PlacementResult`; the runtime's placement (worker ids, key groups, epoch) is
    `clasp.core.routing.Placement`."""

    order: list[str]
    workers: int
    fractions: dict[str, dict[int, float]]
    demand: dict[str, float]
    edge_rates: dict[Edge, float]
    remaining: list[float] = field(default_factory=list)

    @property
    def shares(self) -> dict[str, dict[int, float]]:
        """φ[o,w] = σ_o(w) · D̃_o."""
        return {o: {w: f * self.demand.get(o, 0.0) for w, f in pw.items()}
                for o, pw in self.fractions.items()}

    def load(self, model: CapacityModel) -> list[float]:
        """Eq. (8) for every worker 0..workers-1."""
        per = self.load_map(model)
        return [per.get(w, 0.0) for w in range(self.workers)]

    def load_map(self, model: CapacityModel) -> dict[int, float]:
        """Eq. (8) per worker that carries any load."""
        return model.placement_load(self.fractions, self.demand, self.edge_rates)


def next_fit(order: Sequence[str], successors: Mapping[str, Sequence[tuple[str, float]]],
             demand: Mapping[str, float], model: CapacityModel,
             max_workers: int | None = None,
             predecessors: Mapping[str, Sequence[tuple[str, float]]] | None = None,
             held: Mapping[int, float] | None = None) -> tuple[dict[str, dict[int, float]], list[float]]:
    """Next-fit over `order`: Eq. (9) φ_max = (w_rem − γ·g_w)/m_w, opening a worker when the current is full.

    Works in fractions of D̃_o: per unit of fraction the cost is D̃_o·m_w, which also covers an operator
    with D̃_o = 0 whose chained requests still cost α/β. Returns (σ per operator, w_rem per worker).

    Extended (β_r > 0, `predecessors` given): the order places successors first, so a worker that takes a
    share of o also reserves β_r for every request o's predecessors will send it, as if all were remote;
    when a predecessor lands on the same worker, the part that stays local gives its reservation back.
    The sum is the extended Eq. (8) exactly, and no worker, sender or receiver, is ever charged past
    its own W_w. Workers open in index order with W_w = `model.capacity_of(index)`, less what `held`
    keeps back. A new destination costs the sender γ + μ·F_w (its messages at most); what the receiver
    pays for the messages is not reserved here: `place` checks the full Eq. (8) and holds that back.
    A remote request on the table route costs β_split more (`table_remote_cost`), and one into a
    keyed successor not wholly on w α_keyed instead of α or β_s (`keyed_cost`): σ_s is known, since
    successors are placed first.
    """
    alpha, gamma = model.alpha, model.gamma
    beta, beta_r = model.beta, model.beta_receive
    split, routed, local_first = model.alpha_split, model.table_routed, model.local_routed
    kappa, keyed, beta_split = model.alpha_keyed, model.keyed_routed, model.beta_split
    if predecessors is None:
        beta_r = 0.0
    limit = WORKER_HARD_LIMIT if max_workers is None else min(max_workers, WORKER_HARD_LIMIT)
    fractions: dict[str, dict[int, float]] = {}
    remaining: list[float] = []
    connected: list[set[int]] = []

    def open_worker() -> int:
        if len(remaining) >= limit:
            if max_workers is not None and limit == max_workers:
                raise WorkerLimitExceeded(f"placement needs more than {max_workers} workers")
            raise InfeasiblePlacement(f"placement does not converge within {WORKER_HARD_LIMIT} workers")
        w = len(remaining)
        remaining.append(model.capacity_of(w) - (held.get(w, 0.0) if held else 0.0))
        connected.append(set())
        return len(remaining) - 1

    current = open_worker()
    for o in order:
        d = float(demand.get(o, 0.0))
        outs = [(s, fractions[s], rate) for s, rate in successors.get(o, ()) if rate > 0]
        holders = {s: sum(1 for v in fs.values() if v > 0) for s, fs, _ in outs}
        hosts: set[int] = set()
        for _, fs, _ in outs:
            hosts.update(w for w, f in fs.items() if f > 0)
        incoming = sum(r for _, r in predecessors.get(o, ()) if r > 0) if beta_r else 0.0
        mine: dict[int, float] = {}
        left = 1.0
        fresh = False
        while True:
            w = current
            new = [h for h in hosts if h != w and h not in connected[w]]
            # cost(f) of a share f of o here: linear per unit of f, except that a successor routed local
            # first keeps min(f, σ_s(w)) here and sends the rest on, so its terms bend at f = σ_s(w).
            slope = d + beta_r * incoming
            bends: list[tuple[float, str, float, float]] = []  # (σ_s(w), successor, rate, kept part's α)
            for s, fs, rate in outs:
                local = fs.get(w, 0.0)
                k = keyed_cost(kappa, keyed, s, local)
                if k is not None:
                    slope += rate * (k - beta_r * local)
                elif s in local_first and local > 0:
                    bends.append((local, s, rate, alpha))
                else:
                    table = holders[s] > 1
                    a = local_cost(alpha, split, routed, s, table)
                    slope += rate * (a * local + (beta + table_remote_cost(beta_split, routed, s, table))
                                     * (1.0 - local) - beta_r * local)
            per_peer = gamma + model.peer_cost(w)
            room = remaining[w] - per_peer * len(new)
            if bends:
                f, cost_f = _largest_share(slope, bends, left, room, alpha, split, routed, beta, beta_split,
                                           beta_r)
            else:
                if room > 0 and slope > 0:
                    f = min(left, room / slope)
                elif room >= 0 and slope <= 0:
                    f = left
                else:
                    f = 0.0
                cost_f = slope * f
            if f >= left * (1.0 - 1e-12) and f != left:
                f, cost_f = left, cost_f * left / f  # the last sliver rides along; its overload is rounding noise
            placed = f == left or f > MIN_FRACTION
            if placed:
                mine[w] = mine.get(w, 0.0) + f
                remaining[w] -= per_peer * len(new) + cost_f
                connected[w].update(new)
                left -= f
            if left <= 0:
                break
            if fresh and not placed:
                raise InfeasiblePlacement(
                    f"operator {o!r} does not fit on an empty worker: fan-out cost {per_peer * len(new):.0f} "
                    f"and per-share cost {slope:.0f} against capacity {model.capacity_of(w):.0f}")
            current = open_worker()
            fresh = True
        fractions[o] = mine
    return fractions, remaining


def _share_cost(f: float, piece: float, slope: float, bends, alpha: float, split, routed, beta: float,
                beta_split: float, beta_r: float) -> float:
    """Next-fit's cost of a share f of an operator on one worker, on the piece of [0, 1] between bends
    that holds `piece`: `slope`·f for the linear terms, and per successor routed local first (σ_s(w) = l,
    `bends`) its requests kept here, min(f, l), at α (α_split once f > l puts the route on the table) and
    the surplus f − l sent on at β_s + β_split, less the β_r its kept part gives back. Where the surplus
    goes is not known yet, so it is charged as if on the table route (an upper bound)."""
    cost = slope * f
    for held, s, rate, a in bends:
        if piece <= held:
            cost += rate * f * (a - beta_r)
        else:
            cost += rate * (held * (local_cost(alpha, split, routed, s, True) - beta_r)
                            + (f - held) * (beta + table_remote_cost(beta_split, routed, s, True)))
    return cost


def _largest_share(slope: float, bends, left: float, room: float, *coefficients) -> tuple[float, float]:
    """The largest share f ≤ `left` whose `_share_cost` fits `room`, and that cost ((0, 0) if none does
    or room < 0). The cost is linear on each piece between bends, so each is solved exactly, rightmost
    first (a bend may jump, so the pieces are not one monotone line)."""
    if room < 0:
        return 0.0, 0.0
    points = sorted({0.0, left, *(b for b, *_ in bends if 0.0 < b < left)})
    for lo, hi in reversed(list(zip(points, points[1:], strict=False))):
        mid = (lo + hi) / 2
        c_lo, c_hi = (_share_cost(x, mid, slope, bends, *coefficients) for x in (lo, hi))
        if c_hi <= room:
            return hi, c_hi
        if c_hi > c_lo and c_lo < room:  # c_lo: the piece's right limit at lo
            f = lo + (room - c_lo) / (c_hi - c_lo) * (hi - lo)
            if f > lo:
                return f, _share_cost(f, mid, slope, bends, *coefficients)
    return 0.0, 0.0


def place(operators: Sequence[str], edges: Sequence[Edge], load: Load, model: CapacityModel,
          max_workers: int | None = None, order: Sequence[str] | None = None,
          refine: bool = False, work: Work | None = None) -> FractionalPlacement:
    """Place every operator of the projected `load` with next-fit in reverse-topological order.

    `refine` (beyond the paper) also tries the other admissible orders of `candidate_orders` and keeps
    the best placement (`_Ranked.better`): never more workers, nor a higher peak load, than the paper's order.
    `work` counts what was evaluated; its budget bounds `_fewer_workers`."""
    work = Work() if work is None else work
    edges = [tuple(e) for e in edges]
    if order is None:
        order = placement_order(operators, edges, load.edge_rates)
    _, succ, pred = _adjacency(operators, edges, load.edge_rates)
    demand = load.demand
    rates = {e: load.edge_rates.get(e, 0.0) for e in edges}
    orders = [list(order)]
    if refine:
        orders += [o for o in candidate_orders(operators, edges, load.edge_rates) if o != orders[0]]
    best: _Ranked | None = None
    failure: NoPlacementError | None = None
    for candidate in orders:
        try:
            p = _Ranked(_fit(candidate, succ, pred, demand, rates, model, max_workers, work), model)
        except NoPlacementError as e:
            failure = failure or e
            continue
        if best is None or p.better(best):
            best = p
    if best is None:
        raise failure
    if refine and work.affords():
        return _fewer_workers(operators, edges, load, model, best.placement, work)
    return best.placement


def _fewer_workers(operators: Sequence[str], edges: Sequence[Edge], load: Load, model: CapacityModel,
                   best: FractionalPlacement, work: Work) -> FractionalPlacement:
    """The refinement's other candidates, for the planned rate: the fewest workers on which a whole-operator
    cut (`whole_fit`) or the spread (`spread_fractions`) fits, where that is fewer than next-fit needs (the
    same candidates as at the worker limit, so the count planned for a rate and the rate found for a count
    agree), up to WHOLE_LIMIT operators × workers. Counts whose capacities do not even hold the execution
    demand are skipped unexamined, and so is the spread where its fan-out alone overflows
    (`spread_overflows`). The cut is one pass (`whole_fit`), the cut of each count that holds it. Within
    `work`'s budget."""
    top = min(best.workers - 1, WHOLE_LIMIT // max(len(operators), 1))
    execution = sum(load.demand.values())
    held, counts = 0.0, []
    for n in range(1, top + 1):
        held += model.capacity_of(n - 1)
        if execution <= held:
            counts.append(n)
    if not counts:
        return best
    order = topological_order(operators, edges)
    cut = whole_fit(order, load, model, counts[-1], work)
    for n in counts:
        if cut is not None and cut.workers <= n:
            return cut
        if spread_overflows(load.edge_rates, model, n):
            continue
        if not work.affords(priced_size(dict.fromkeys(operators, n), load.edge_rates, model)):
            break
        fractions = spread_fractions(operators, n, model)
        spread = FractionalPlacement(list(reversed(order)), n, fractions, dict(load.demand), dict(load.edge_rates))
        work.count(fractions, spread.edge_rates, model)
        if model.fits(spread.load_map(model)):
            return spread
    return best


# Rates probed above the bisection's answer when refining (`highest_rate_placement`): +2 % to +24 %.
SCAN_POINTS = 12
SCAN_STEP = 0.02
HOLD_ROUNDS = 6  # next-fit runs per order while a worker's received messages overflow it


def _fit(order: Sequence[str], succ, pred, demand: Mapping[str, float], rates: dict[Edge, float],
         model: CapacityModel, max_workers: int | None, work: Work) -> FractionalPlacement:
    """Next-fit over `order`, checked against the full Eq. (8): a worker the messages it receives push
    past its W_w has that overflow held back and next-fit runs again (a few rounds, then NoPlacementError)."""
    held: dict[int, float] = {}
    for _ in range(HOLD_ROUNDS):
        try:
            fractions, remaining = next_fit(order, succ, demand, model, max_workers, pred, held)
        except NoPlacementError:
            work.evaluations += 1  # a run that fails part-way priced at most a share per operator and worker
            work.priced += len(order) + (max_workers or 0)
            raise
        p = FractionalPlacement(list(order), len(remaining), fractions, demand, rates, remaining)
        work.count(fractions, rates, model)
        if not model.mu:
            return p
        over = {w: v - model.capacity_of(w) for w, v in enumerate(p.load(model))
                if v > model.capacity_of(w) * (1 + 1e-9)}
        if not over:
            return p
        for w, excess in over.items():
            held[w] = held.get(w, 0.0) + excess * 1.01
    raise NoPlacementError(f"the messages workers receive overflow them after {HOLD_ROUNDS} rounds of next-fit")


def _peak(p: FractionalPlacement, model: CapacityModel) -> float:
    """The highest per-worker load relative to that worker's own capacity."""
    return max((v / model.capacity_of(w) for w, v in enumerate(p.load(model))), default=0.0)


class _Ranked:
    """A candidate placement with what `better` compares, each priced once however often it is compared."""

    def __init__(self, placement: FractionalPlacement, model: CapacityModel) -> None:
        self.placement, self.model = placement, model
        self._peak: float | None = None
        self._remote: float | None = None

    @property
    def peak(self) -> float:
        if self._peak is None:
            self._peak = _peak(self.placement, self.model)
        return self._peak

    @property
    def remote(self) -> float:
        if self._remote is None:
            self._remote = _remote_rate(self.placement, self.model)
        return self._remote

    def better(self, other: _Ranked) -> bool:
        """Fewer workers first, then a lower peak load, then less remote traffic."""
        a, b = self.placement, other.placement
        if a.workers != b.workers:
            return a.workers < b.workers
        if abs(self.peak - other.peak) > 1e-9:
            return self.peak < other.peak
        return self.remote < other.remote - 1e-9


def _remote_rate(p: FractionalPlacement, model: CapacityModel) -> float:
    """Remote chained requests per second under the model's routing (`edge_flow`)."""
    routed = model.local_routed
    return sum(rate * share for (src, dst), rate in p.edge_rates.items()
               for (w, d), share in edge_flow(p.fractions.get(src, {}), p.fractions.get(dst, {}),
                                              dst in routed).items() if w != d)


def spread_fractions(operators: Sequence[str], workers: int, model: CapacityModel) -> dict[str, dict[int, float]]:
    """Every operator on every one of `workers` workers, each worker's share its part of their W_w (even
    where they are equal): with local-first routing each worker then runs whole chains of its own."""
    caps = [model.capacity_of(w) for w in range(workers)]
    total = sum(caps)
    return {o: {w: c / total for w, c in enumerate(caps)} for o in operators}


def spread_overflows(edge_rates: Mapping[Edge, float], model: CapacityModel, workers: int) -> bool:
    """Whether the spread over `workers` workers overflows at every positive rate by its fan-out alone:
    requests into an operator not routed local first go from every worker to every other (σ_s(d) > 0
    everywhere), so each worker has n − 1 destinations and pays γ·(n − 1) of Eq. (8) whatever else it
    does. Pricing the spread (n² flows per such edge) is then skipped: it cannot fit."""
    routed = model.local_routed
    if workers < 2 or not any(r > 0 and dst not in routed for (_, dst), r in edge_rates.items()):
        return False
    fan = model.gamma * (workers - 1)
    return any(fan > model.capacity_of(w) * (1.0 + 1e-9) for w in range(workers))


def candidate_orders(operators: Sequence[str], edges: Sequence[Edge],
                     edge_rates: Mapping[Edge, float]) -> list[list[str]]:
    """Admissible next-fit orders beside the paper's (every operator after all its successors): the
    depth-first order with the lightest edge first, and Kahn's reverse-topological order, which keeps
    operators of one DAG level together."""
    light = {e: -r for e, r in edge_rates.items()}
    out = [placement_order(operators, edges, light), list(reversed(topological_order(operators, edges)))]
    unique: list[list[str]] = []
    for o in out:
        if o not in unique:
            unique.append(o)
    return unique


def single_worker_rate(load: Load, throughput: float, model: CapacityModel, worker: int = 0) -> float:
    """The input rate one worker sustains with every operator on it: W_w / (Σ D + α·Σ E) per unit of s."""
    return workers_rate(load, throughput, model, range(worker, worker + 1))


def workers_rate(load: Load, throughput: float, model: CapacityModel, workers: Sequence[int]) -> float:
    """Σ `single_worker_rate` over `workers`: the worker-limit search's first upper bound."""
    per_unit = (sum(load.demand.values()) + model.alpha * sum(load.edge_rates.values())) / load.scale
    if per_unit <= 0:
        return math.inf
    return sum(model.capacity_of(w) / per_unit * throughput for w in workers)


@dataclass
class LimitSearch:
    """Worker-limit search result: highest rate found to fit, lowest found not to, and the placement."""

    rate: float
    upper: float
    placement: FractionalPlacement
    steps: int


def highest_rate_placement(operators: Sequence[str], edges: Sequence[Edge], observed: Load, throughput: float,
                           model: CapacityModel, max_workers: int, tolerance: float = 50.0,
                           upper: float | None = None, refine: bool = False,
                           work: Work | None = None) -> LimitSearch:
    """Binary-search the highest input rate whose placement fits on `max_workers` workers (SPEC.md).

    `observed` is the load at the observed throughput (s = 1). The first upper bound is one worker's
    maximum rate × `max_workers`; the search stops when the interval is under `tolerance` req/s (or 1% of
    the bound, when the bound itself is that small). `work` counts what was evaluated; the refinement's
    candidates beyond next-fit stay within its budget.
    """
    work = Work() if work is None else work
    if max_workers < 1:
        raise NoPlacementError(f"max_workers must be at least 1, not {max_workers}")
    if not throughput > 0:
        raise LoadError(f"throughput is {throughput}: nothing to scale from")
    if not observed.scale > 0:
        raise LoadError("the observed load must be projected with a positive scale (use s = 1)")
    base = observed if observed.scale == 1 else observed.scaled(1.0 / observed.scale)
    edges = [tuple(e) for e in edges]
    order = placement_order(operators, edges, base.edge_rates)

    def attempt(rate: float) -> FractionalPlacement | None:
        try:
            return place(operators, edges, base.scaled(rate / throughput), model, max_workers, order, refine, work)
        except NoPlacementError:
            return None

    hi = upper if upper is not None else workers_rate(base, throughput, model, range(max_workers))
    if not math.isfinite(hi):
        hi = throughput * 1e6  # nothing costs anything: any rate fits, report a large finite one
    top = attempt(hi)
    if top is not None:
        return LimitSearch(hi, hi, top, 1)
    lo = 0.0
    best = attempt(lo)
    if best is None:
        raise InfeasiblePlacement("nothing fits, not even an idle placement")
    tol = min(tolerance, 0.01 * hi)
    steps = 2

    def bisect(lo: float, hi: float, best: FractionalPlacement) -> tuple[float, float, FractionalPlacement]:
        nonlocal steps
        while hi - lo > tol:
            mid = (lo + hi) / 2
            p = attempt(mid)
            steps += 1
            if p is None:
                hi = mid
            else:
                lo, best = mid, p
        return lo, hi, best

    lo, hi_found, best = bisect(lo, hi, best)
    if refine:
        # Whether next-fit fits is not monotone in the rate once received messages hold capacity back
        # (a higher rate can pack into fewer fragments): probe the rates above the bisection's answer.
        base_rate = lo
        for i in range(1, SCAN_POINTS + 1):
            rate = base_rate * (1 + SCAN_STEP * i)
            if rate >= hi or not work.affords():
                break
            steps += 1
            if (p := attempt(rate)) is not None:
                lo, best, hi_found = rate, p, min(hi, base_rate * (1 + SCAN_STEP * (i + 1)))
        lo, hi_found, best = bisect(lo, hi_found, best)
        # The spread first, so that the whole-operator scan starts above the best rate found so far:
        # whole_fit is not monotone in the rate and scans a window above it.
        for candidate in ("spread", "whole"):
            other = (spread_limit(operators, base, throughput, model, max_workers, hi, tol, work)
                     if candidate == "spread"
                     else whole_limit(operators, edges, base, throughput, model, max_workers, lo, hi, work))
            if other is None:
                continue
            steps += other.steps
            if other.rate > lo * (1 + 1e-9):
                lo, hi_found, best = other.rate, other.upper, other.placement
    return LimitSearch(lo, hi_found, best, steps)


def _bisect_fixed(at, model: CapacityModel, upper: float, tolerance: float, work: Work,
                  cost: int) -> LimitSearch | None:
    """The highest rate in [0, upper] for which the placement `at(rate)` fits Eq. (8), each pricing
    `cost`: as far as `work`'s budget affords (None: nothing fits, or nothing was affordable)."""
    def ok(rate: float) -> FractionalPlacement | None:
        p = at(rate)
        work.count(p.fractions, p.edge_rates, model)
        return p if model.fits(p.load_map(model)) else None

    if not work.affords(2 * cost):
        return None

    if (top := ok(upper)) is not None:
        return LimitSearch(upper, upper, top, 1)
    lo, hi, steps, best = 0.0, upper, 1, ok(0.0)
    if best is None:
        return None
    while hi - lo > tolerance and work.affords(cost):
        mid = (lo + hi) / 2
        steps += 1
        if (p := ok(mid)) is not None:
            lo, best = mid, p
        else:
            hi = mid
    return LimitSearch(lo, hi, best, steps)


def spread_limit(operators: Sequence[str], base: Load, throughput: float, model: CapacityModel, workers: int,
                 upper: float, tolerance: float, work: Work | None = None) -> LimitSearch | None:
    """The highest rate at which every operator spread over `workers` workers (`spread_fractions`) fits
    (the full Eq. 8); None where nothing fits, nor above rate 0 where its fan-out overflows
    (`spread_overflows`).

    Beyond the paper, a candidate of the refinement at the worker limit: where chained requests are cheap
    beside execution, where one chunk's messages overflow its receiver, or where requests are routed local
    first (then a stateless chain sends nothing remote at all), the spread sustains more."""
    if spread_overflows(base.edge_rates, model, workers):
        return None
    fractions = spread_fractions(operators, workers, model)

    def at(rate: float) -> FractionalPlacement:
        load = base.scaled(rate / throughput)
        return FractionalPlacement(list(operators), workers, fractions, dict(load.demand), dict(load.edge_rates))

    work = Work() if work is None else work
    cost = priced_size(dict.fromkeys(operators, workers), base.edge_rates, model)
    return _bisect_fixed(at, model, upper, tolerance, work, cost)


# Rates probed above next-fit's: +1 % to +30 %, then (given the search's upper bound) on up to it, each
# 1 % above the last, at most WHOLE_SCAN_MAX of those.
WHOLE_SCAN, WHOLE_STEP, WHOLE_SCAN_MAX = 30, 0.01, 200


def whole_fit(order: Sequence[str], load: Load, model: CapacityModel, workers: int,
              work: Work | None = None) -> FractionalPlacement | None:
    """Next-fit over `order` (topological: predecessors first) that never splits an operator: one that
    does not fit what is left of the current worker opens the next; one that fits no worker alone is
    spread evenly over as few fresh workers as hold it. None if that needs more than `workers` or the
    result does not fit the full Eq. (8). While placing, requests to operators not yet placed count as
    remote; only their messages are unknown until the end.

    One pass whatever `workers` is: on fewer workers it is this pass if that used no more of them. What
    cannot fit is not priced: spreads whose execution share alone overflows a fresh worker (D̃_o / k >
    W_w), and the rest of the pass once the execution demand left exceeds the capacity left. Without a
    message term a worker's load depends only on the edges of the operators it holds, so each step prices
    the workers it changed (those of the operator and of its predecessors) with their operators' edges."""
    fractions: dict[str, dict[int, float]] = {}
    demand, rates = dict(load.demand), dict(load.edge_rates)
    incident: dict[str, list[int]] = {}
    predecessors: dict[str, list[str]] = {}
    edge_list = list(rates)
    for i, (src, dst) in enumerate(edge_list):
        incident.setdefault(src, []).append(i)
        incident.setdefault(dst, []).append(i)
        predecessors.setdefault(dst, []).append(src)

    def fits(o: str | None = None) -> bool:
        shares, priced = fractions, rates
        if o is not None and not model.mu:
            # Other workers' loads are as last checked, or (those of an edge's far end) priced in part.
            changed = set(fractions[o]).union(*(fractions.get(p, ()) for p in predecessors.get(o, ())))
            held = {x for x, f in fractions.items() if not changed.isdisjoint(f)}
            near = sorted({i for x in held for i in incident.get(x, ())})
            priced = {edge_list[i]: rates[edge_list[i]] for i in near}
            ends = held.union(*(edge_list[i] for i in near))
            shares = {x: f for x, f in fractions.items() if x in ends}
        if work is not None:
            work.count(shares, priced, model)
        return model.fits(model.placement_load(shares, demand, priced))

    def overflows(share: float, worker: int) -> bool:
        return share > model.capacity_of(worker) * (1.0 + 1e-9)

    # left[w]: the capacity of workers w.. (`workers` - 1), against the execution demand still to place
    left = [0.0] * (workers + 1)
    for w in range(workers - 1, -1, -1):
        left[w] = left[w + 1] + model.capacity_of(w)
    to_place = sum(float(demand.get(o, 0.0)) for o in order)
    current, on_current = 0, 0.0
    for o in order:
        if to_place + on_current > left[current] * (1.0 + 1e-6):
            return None
        d = float(demand.get(o, 0.0))
        to_place -= d
        if not overflows(d, current):
            fractions[o] = {current: 1.0}
            if fits(o):
                on_current += d
                continue
            del fractions[o]
        first = current + 1 if any(current in f for f in fractions.values()) else current
        for k in range(1, workers - first + 1):
            if any(overflows(1.0 / k * d, first + i) for i in range(k)):
                continue
            fractions[o] = {first + i: 1.0 / k for i in range(k)}
            if fits(o):
                current, on_current = first + k - 1, 1.0 / k * d
                break
        else:
            return None
    # Reported in reverse, successors first, like every placement's order (the admissible next-fit form).
    p = FractionalPlacement(list(reversed(order)), current + 1, fractions, demand, rates)
    return p if fits() else None


def whole_limit(operators: Sequence[str], edges: Sequence[Edge], base: Load, throughput: float,
                model: CapacityModel, workers: int, above: float, upper: float | None = None,
                work: Work | None = None) -> LimitSearch | None:
    """The highest rate above `above`, up to `upper` (without one: WHOLE_SCAN steps), that `whole_fit`
    places on `workers` workers (None: skipped, or nothing above `above` fits). Whether it fits is not
    monotone in the rate (a different rate cuts the order elsewhere), so the rates are probed, not
    bisected; a cut can sustain far more than next-fit's split chunks (SYN on 5 workers: +36 %), so the
    probes go up to the bound, not a fixed window.

    Beyond the paper, a candidate of the refinement at the worker limit: cutting the DAG between operators
    (FaaSFlow's grouping) sends each boundary's requests over one remote edge, where next-fit's split
    operators route through the table (α_split) and message every holder."""
    if len(operators) * workers > WHOLE_LIMIT or not above > 0:
        return None
    order = topological_order(operators, edges)
    rates = [above * (1 + i * WHOLE_STEP) for i in range(1, WHOLE_SCAN + 1)]
    if upper is not None:
        beyond = rates[-1]
        rates += [r for i in range(1, WHOLE_SCAN_MAX + 1) if (r := beyond * (1 + WHOLE_STEP) ** i) <= upper]
    # From the top down: the first rate that fits is the highest, and the ones below it cannot beat it.
    work = Work() if work is None else work
    for i, rate in reversed(list(enumerate(rates, 1))):
        if not work.affords():
            break
        p = whole_fit(order, base.scaled(rate / throughput), model, workers, work)
        if p is not None:
            return LimitSearch(rate, rate, p, i)
    return None


def _profile_key(base: Load, throughput: float) -> tuple:
    """Per-request profile: demand and chained requests per unit of input rate, all that placement uses."""
    unit = 1.0 / (throughput * base.scale) if throughput > 0 and base.scale > 0 else 0.0
    return ({o: v * unit for o, v in base.demand.items()}, {e: r * unit for e, r in base.edge_rates.items()})


def _close(a: Mapping, b: Mapping, rel: float) -> bool:
    if a.keys() != b.keys():
        return False
    scale = max([abs(v) for v in a.values()] + [abs(v) for v in b.values()] + [1e-12])
    return all(abs(a[k] - b[k]) <= rel * max(abs(a[k]), abs(b[k]), 1e-3 * scale) for k in a)


@dataclass
class WorkerLimitCache:
    """Caches the worker-limit placement (paper: computed once, reused whenever the limit is hit again).

    An entry is reused while the DAG, the limit, the capacity model and the per-request profile stay
    within `tolerance` (relative) of what it was computed for; otherwise it is recomputed.
    """

    tolerance: float = 0.05
    entries: dict[tuple, tuple] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def get_or_search(self, operators: Sequence[str], edges: Sequence[Edge], observed: Load,
                      throughput: float,
                      model: CapacityModel, max_workers: int, search_tolerance: float = 50.0,
                      refine: bool = False, work: Work | None = None) -> LimitSearch:
        """The cached search result for this limit, or a fresh search (then cached)."""
        key = (tuple(operators), tuple(tuple(e) for e in edges), int(max_workers), refine)
        demand, edge_rates = _profile_key(observed, throughput)
        coeffs = {"alpha": model.alpha, "beta": model.beta, "beta_receive": model.beta_receive, "mu": model.mu,
                  "gamma": model.gamma, "capacity": model.capacity}
        coeffs.update({f"capacity_{w}": model.capacity_of(w) for w in range(max_workers)})
        entry = self.entries.get(key)
        if entry is not None:
            c_demand, c_edges, c_coeffs, result = entry
            if (_close(coeffs, c_coeffs, self.tolerance) and _close(demand, c_demand, self.tolerance)
                    and _close(edge_rates, c_edges, self.tolerance)):
                self.hits += 1
                return result
        self.misses += 1
        result = highest_rate_placement(operators, edges, observed, throughput, model, max_workers,
                                        search_tolerance, refine=refine, work=work)
        self.entries[key] = (demand, edge_rates, coeffs, result)
        return result
