"""CLASP's worker capacity model: Eq. (1) from observed metrics, Eq. (8) for a candidate placement.

All quantities are in µs of work per second (µs/s); rates are requests per second. Pure functions: no
clock, no I/O.

The paper's Eq. (1) charges a remote chained request to its sender only (β) and has one capacity W̄ for
every worker. This runtime's receivers pay a share of each remote request too, and every batch of remote
requests costs a message at both ends (docs/SIMULATOR.md), and workers may differ (a CPU quota,
a shared host). The extended model (docs/POLICY.md, "Extended model") adds β_r per received remote
request, μ per message, and a capacity W_w per worker. Messages follow from how the engine batches: a
saturated worker flushes each destination's batch once per flush delay of its CPU time, so a pair of
workers exchanges min(rows, F_w) messages per second, F_w = W_w / 10⁶ / flush delay. A local request
that takes the runtime's table route costs α_split. With β_r = 0, μ = 0, no α_split and no per-worker
capacities it is the paper's model exactly (`CapacityModel.paper()`, policy `clasp-paper`).

Routing (`edge_flow`): the paper's Eq. (8) sends a request of o on w to worker d with probability σ_s(d),
whoever sent it. This runtime routes a stateless successor local first (ours, docs/POLICY.md, "Local-first
routing"): a worker keeps what its own share of the successor takes and sends only the surplus, to the
workers short of theirs. Every term below follows from the flows, so the model prices either routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Edge = tuple[str, str]

# Paper's converged values (Faasm, 8-core workers, ~400 µs operators); defaults until the runtime measures.
DEFAULT_ALPHA = 38.5
DEFAULT_BETA = 275.0
DEFAULT_GAMMA = 51500.0
DEFAULT_CAPACITY = 850000.0


def execution_cost(rates: Mapping[str, float], tau_us: Mapping[str, float]) -> float:
    """E_w = Σ_o N[w,o]·τ̄[w,o], the execution term of Eq. (1)."""
    return sum(float(n) * float(tau_us.get(o, 0.0)) for o, n in rates.items())


def worker_capacity(execution: float, r_local: float, r_remote: float, delta: float,
                    alpha: float, beta: float, gamma: float, r_received: float = 0.0, messages: float = 0.0,
                    beta_receive: float = 0.0, mu: float = 0.0) -> float:
    """Eq. (1), extended: W_w = E_w + α·R^l_w + β_s·R^r,out_w + β_r·R^r,in_w + μ·M_w + γ·δ_w.

    The paper's form is β_r = μ = 0 (its β is the sender's β_s)."""
    return (execution + alpha * r_local + beta * r_remote + beta_receive * r_received + mu * messages
            + gamma * delta)


def edge_flow(src: Mapping[int, float], dst: Mapping[int, float], local_first: bool = False,
              ) -> dict[tuple[int, int], float]:
    """The share of an edge's chained requests that worker w sends to worker d (w = d: kept local).

    Proportional (the paper's Eq. 8): σ_o(w)·σ_s(d). Local first (ours, for a stateless successor): w keeps
    min(σ_o(w), σ_s(w)) and deals its surplus σ_o(w) − σ_s(w) out to the workers short of their share, in
    proportion to the shortfall σ_s(d) − σ_o(d): every holder still gets its σ_s, with the least remote
    traffic. A successor not placed yet (no share anywhere) is proportional: all of it remote, nobody's."""
    src = {w: f for w, f in src.items() if f > 0}
    dst = {d: f for d, f in dst.items() if f > 0}
    flows: dict[tuple[int, int], float] = {}
    if local_first and dst:
        short = {d: f - src.get(d, 0.0) for d, f in dst.items() if f > src.get(d, 0.0) + 1e-12}
        total_short = sum(short.values())
        for w, f in src.items():
            keep = min(f, dst.get(w, 0.0))
            if keep > 0:
                flows[(w, w)] = keep
            surplus = f - keep
            if surplus > 1e-12 and total_short > 0:
                for d, s in short.items():
                    flows[(w, d)] = surplus * s / total_short
        return flows
    for w, f in src.items():
        for d, fd in dst.items():
            flows[(w, d)] = f * fd
    return flows


def remote_destinations(fractions: Mapping[str, Mapping[int, float]],
                        edge_rates: Mapping[Edge, float], local_first: frozenset = frozenset(),
                        ) -> dict[int, set[int]]:
    """δ_w(Φ) as sets: the remote workers each worker's outgoing chained requests reach under Φ (Eq. 8);
    edges into an operator of `local_first` are routed local first (`edge_flow`)."""
    reach: dict[int, set[int]] = {}
    for (src, dst), rate in edge_rates.items():
        if rate <= 0:
            continue  # an edge that carries nothing opens no connection
        for (w, d), share in edge_flow(fractions.get(src, {}), fractions.get(dst, {}), dst in local_first).items():
            if d != w and share > 0:
                reach.setdefault(w, set()).add(d)
    return reach


def pair_rates(fractions: Mapping[str, Mapping[int, float]], edge_rates: Mapping[Edge, float],
               local_first: frozenset = frozenset()) -> dict[tuple[int, int], float]:
    """Remote chained requests per second from worker w to worker d ≠ w (`edge_flow`)."""
    rows: dict[tuple[int, int], float] = {}
    for (src, dst), rate in edge_rates.items():
        if rate <= 0:
            continue
        for (w, d), share in edge_flow(fractions.get(src, {}), fractions.get(dst, {}), dst in local_first).items():
            if d != w:
                rows[(w, d)] = rows.get((w, d), 0.0) + rate * share
    return rows


# How much a sender's flush interval grows per peer beyond the first (the flush round sends to every peer):
# measured by `clasp.bench.calibrate` (`flush_peer_factor`, 0.21 on 2026-12-03; Word Count's splitter sending to
# 4 peers batched each once per 2.8 ms of its CPU against 1.9 ms for one peer, 0.17).
FLUSH_PEER_FACTOR = 0.2


def message_load(fractions: Mapping[str, Mapping[int, float]], edge_rates: Mapping[Edge, float], mu: float,
                 flush_rate, peer_factor: float = 0.0, local_first: frozenset = frozenset()) -> dict[int, float]:
    """μ·M_w: each pair exchanges min(rows, F_w / (1 + c·(n_w − 1))) messages per second (F_w =
    `flush_rate(w)` of the sender, n_w its peers, c `peer_factor`), paid by the sender and the receiver."""
    load: dict[int, float] = {}
    if not mu:
        return load
    pairs = pair_rates(fractions, edge_rates, local_first)
    peers: dict[int, int] = {}
    for w, _ in pairs:
        peers[w] = peers.get(w, 0) + 1
    for (w, d), rows in pairs.items():
        cost = mu * min(rows, flush_rate(w) / (1.0 + peer_factor * (peers[w] - 1)))
        load[w] = load.get(w, 0.0) + cost
        load[d] = load.get(d, 0.0) + cost
    return load


def local_cost(alpha: float, alpha_split: float | None, table_routed: frozenset, dst: str, table: bool) -> float:
    """α for a local chained request, or α_split where it takes the runtime's table route: to a stateless
    successor to which its worker also sends elsewhere (`table`: more than one destination)."""
    if alpha_split is not None and table and dst in table_routed:
        return alpha_split
    return alpha


def table_remote_cost(beta_split: float, table_routed: frozenset, dst: str, table: bool) -> float:
    """β_split for a remote chained request that takes the table route, to a stateless successor to which
    its worker sends to more than one destination (`table`; the weighted table deals out local and remote
    outputs alike); 0 otherwise, a lone remote destination being the direct path. Beyond the paper."""
    return beta_split if beta_split and table and dst in table_routed else 0.0


def keyed_cost(alpha_keyed: float | None, keyed_routed: frozenset, dst: str, local: float) -> float | None:
    """α_keyed, what a chained request into a keyed successor whose groups are not all on the sender
    (σ_s(w) < 1) costs the sender in place of α or β_s: the runtime's keyed table route, local or remote
    alike; None where the request takes another route. Beyond the paper."""
    return alpha_keyed if alpha_keyed is not None and local < 1.0 and dst in keyed_routed else None


TERMS = ("execution", "local", "remote_out", "remote_in", "messages", "destinations")


def load_terms(fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
               edge_rates: Mapping[Edge, float], alpha: float, beta: float,
               gamma: float, beta_receive: float = 0.0, alpha_split: float | None = None,
               table_routed: frozenset = frozenset(), alpha_keyed: float | None = None,
               keyed_routed: frozenset = frozenset(), beta_split: float = 0.0,
               local_first: frozenset = frozenset()) -> dict[int, dict[str, float]]:
    """Eq. (8) term by term per worker (`TERMS`, messages 0 here: `message_load` adds them), with x(w, d)
    an edge's share from w to d (`edge_flow`; the paper's σ_o(w)·σ_s(d), local first into an operator of
    `local_first`): execution Σ_o φ[o,w]; local Σ Ẽ·x(w, w)·α (α_split on the table route); remote_out
    Σ Ẽ·(σ_o(w) − x(w, w))·β_s; remote_in Σ Ẽ·Σ_(v≠w) x(v, w)·β_r; destinations γ·δ_w(Φ).
    A remote request on the table route (its sender has more than one destination for that successor)
    costs β_split more (`table_remote_cost`). Into a keyed successor of `keyed_routed` not wholly on w
    (σ_s(w) < 1) a request costs its sender α_keyed instead of α or β_s (`keyed_cost`), in local and
    remote_out by where it goes."""
    terms: dict[int, dict[str, float]] = {}

    def at(w: int) -> dict[str, float]:
        t = terms.get(w)
        if t is None:
            t = terms[w] = dict.fromkeys(TERMS, 0.0)
        return t

    for o, per_worker in fractions.items():
        d = float(demand.get(o, 0.0))
        for w, f in per_worker.items():
            at(w)["execution"] += f * d
    for (src, dst), rate in edge_rates.items():
        if rate <= 0:
            continue
        dst_fractions = fractions.get(dst, {})
        flows = edge_flow(fractions.get(src, {}), dst_fractions, dst in local_first)
        kept: dict[int, float] = {}
        fan: dict[int, int] = {}  # destinations per sender, itself included
        for (w, d), share in flows.items():
            fan[w] = fan.get(w, 0) + 1
            if w == d:
                kept[w] = share
            elif beta_receive:
                at(d)["remote_in"] += rate * share * beta_receive
        for w, f in fractions.get(src, {}).items():
            if f <= 0:
                continue
            table = fan.get(w, 0) > 1
            local, remote = kept.get(w, 0.0), f - kept.get(w, 0.0)
            t = at(w)
            k = keyed_cost(alpha_keyed, keyed_routed, dst, dst_fractions.get(w, 0.0))
            if k is None:
                t["local"] += rate * local * local_cost(alpha, alpha_split, table_routed, dst, table)
                t["remote_out"] += rate * remote * (beta + table_remote_cost(beta_split, table_routed, dst, table))
            else:
                t["local"] += rate * local * k
                t["remote_out"] += rate * remote * k
    for w, remote in remote_destinations(fractions, edge_rates, local_first).items():
        at(w)["destinations"] += gamma * len(remote)
    return terms


def placement_load(fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                   edge_rates: Mapping[Edge, float], alpha: float, beta: float,
                   gamma: float, beta_receive: float = 0.0, alpha_split: float | None = None,
                   table_routed: frozenset = frozenset()) -> dict[int, float]:
    """Eq. (8), extended: L_w(Φ) = Σ_o φ[o,w] + γ·δ_w(Φ) + Σ_(o→o_s) Ẽ·σ_o(w)·(α·σ_s(w) + β_s·(1 − σ_s(w)))
    + Σ_(o→o_s) Ẽ·σ_s(w)·(1 − σ_o(w))·β_r, the last term the requests w receives from other workers.

    With `beta_receive` 0 and no `alpha_split` this is the paper's Eq. (8); the message term is
    `message_load`."""
    return {w: sum(t.values()) for w, t in load_terms(fractions, demand, edge_rates, alpha, beta, gamma,
                                                      beta_receive, alpha_split, table_routed).items()}


@dataclass(frozen=True)
class CapacityModel:
    """The coefficients of Eq. (1) and the smoothed maximum worker capacity W̄ of Eq. (4).

    `beta` is β_s, what the sender pays per remote request. Extensions (0 / None: the paper's model):
    `beta_receive` β_r per remote request received; `mu` µs per message, sent or received; `flush_delay`
    the engine's flush delay (s), which sets F_w, and `flush_peer_factor` how it grows per extra peer;
    `capacities` W_w per worker index (placement indices; workers beyond the tuple have W̄); `alpha_split`
    α of a local request that takes the table route, to an operator of `table_routed` (the DAG's stateless
    ones) held by other workers too; `alpha_keyed` what a request into an operator of `keyed_routed` (the
    DAG's keyed ones) costs its sender instead of α or β_s when that operator is not wholly on the sender's
    worker (None: α and β_s as for any request);
    `beta_split` what a remote request to an operator of `table_routed` with several holders costs its
    sender on top of β_s (the same table route); `local_first` that requests into the operators of
    `table_routed` are routed local first, as this runtime routes them (False: the paper's σ_s(d))."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    capacity: float = DEFAULT_CAPACITY
    beta_receive: float = 0.0
    mu: float = 0.0
    flush_delay: float = 0.001
    capacities: tuple[float, ...] | None = None
    alpha_split: float | None = None
    table_routed: frozenset = frozenset()
    flush_peer_factor: float = FLUSH_PEER_FACTOR
    alpha_keyed: float | None = None
    keyed_routed: frozenset = frozenset()
    beta_split: float = 0.0
    local_first: bool = False

    @property
    def local_routed(self) -> frozenset:
        """The operators whose incoming requests are routed local first (`edge_flow`)."""
        return self.table_routed if self.local_first else frozenset()

    def flush_rate(self, worker: int) -> float:
        """F_w: messages per second to one peer of a saturated worker (one batch per flush delay of CPU)."""
        return self.capacity_of(worker) / 1e6 / self.flush_delay

    def peer_cost(self, worker: int) -> float:
        """The most one more peer can cost a worker in messages per second: μ·F_w."""
        return self.mu * self.flush_rate(worker)

    def capacity_of(self, worker: int) -> float:
        """W_w of placement index `worker` (W̄ where no per-worker capacity is known)."""
        caps = self.capacities
        return caps[worker] if caps is not None and 0 <= worker < len(caps) else self.capacity

    def paper(self) -> CapacityModel:
        """The paper's model with this one's α, γ, W̄: a remote request's whole β (β_s + β_r) charged to
        its sender, no message term, one capacity."""
        return CapacityModel(self.alpha, self.beta + self.beta_receive, self.gamma, self.capacity,
                             flush_delay=self.flush_delay)

    @property
    def extended(self) -> bool:
        return bool(self.beta_receive or self.mu or self.capacities or self.alpha_split is not None
                    or self.alpha_keyed is not None or self.beta_split or self.local_routed)

    def worker_load(self, execution: float, r_local: float, r_remote: float, delta: float,
                    r_received: float = 0.0, messages: float = 0.0) -> float:
        """Eq. (1) with this model's coefficients."""
        return worker_capacity(execution, r_local, r_remote, delta, self.alpha, self.beta, self.gamma,
                               r_received, messages, self.beta_receive, self.mu)

    def load_terms(self, fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                   edge_rates: Mapping[Edge, float]) -> dict[int, dict[str, float]]:
        """Eq. (8) term by term per worker (`TERMS`) with this model's coefficients."""
        terms = load_terms(fractions, demand, edge_rates, self.alpha, self.beta, self.gamma, self.beta_receive,
                           self.alpha_split, self.table_routed, self.alpha_keyed, self.keyed_routed,
                           self.beta_split, self.local_routed)
        for w, v in message_load(fractions, edge_rates, self.mu, self.flush_rate, self.flush_peer_factor,
                                 self.local_routed).items():
            terms.setdefault(w, dict.fromkeys(TERMS, 0.0))["messages"] += v
        return terms

    def placement_load(self, fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                       edge_rates: Mapping[Edge, float]) -> dict[int, float]:
        """Eq. (8) with this model's coefficients, the message term included."""
        return {w: sum(t.values()) for w, t in self.load_terms(fractions, demand, edge_rates).items()}

    def fits(self, load: Mapping[int, float], slack: float = 1e-9) -> bool:
        """L_w ≤ W_w for every worker (with a relative slack for floating-point rounding)."""
        return all(v <= self.capacity_of(w) * (1.0 + slack) for w, v in load.items())
