"""CLASP's worker capacity model: Eq. (1) from observed metrics, Eq. (8) for a candidate placement.

All quantities are in µs of work per second (µs/s); rates are requests per second. Pure functions: no
clock, no I/O.
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
                    alpha: float, beta: float, gamma: float) -> float:
    """Eq. (1): W_w = E_w + α·R^l_w + β·R^r_w + γ·δ_w."""
    return execution + alpha * r_local + beta * r_remote + gamma * delta


def remote_destinations(fractions: Mapping[str, Mapping[int, float]],
                        edge_rates: Mapping[Edge, float]) -> dict[int, set[int]]:
    """δ_w(Φ) as sets: the remote workers each worker's outgoing chained requests reach under Φ (Eq. 8)."""
    reach: dict[int, set[int]] = {}
    for (src, dst), rate in edge_rates.items():
        if rate <= 0:
            continue  # an edge that carries nothing opens no connection
        hosts = [w for w, f in fractions.get(dst, {}).items() if f > 0]
        for w, f in fractions.get(src, {}).items():
            if f > 0:
                reach.setdefault(w, set()).update(h for h in hosts if h != w)
    return reach


def placement_load(fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                   edge_rates: Mapping[Edge, float], alpha: float, beta: float,
                   gamma: float) -> dict[int, float]:
    """Eq. (8): L_w(Φ) = Σ_o φ[o,w] + γ·δ_w(Φ) + Σ_(o→o_s) Ẽ·σ_o(w)·(α·σ_s(w) + β·(1 − σ_s(w)))."""
    load: dict[int, float] = {}
    for o, per_worker in fractions.items():
        d = float(demand.get(o, 0.0))
        for w, f in per_worker.items():
            load[w] = load.get(w, 0.0) + f * d
    for (src, dst), rate in edge_rates.items():
        if rate <= 0:
            continue
        dst_fractions = fractions.get(dst, {})
        for w, f in fractions.get(src, {}).items():
            local = dst_fractions.get(w, 0.0)
            load[w] = load.get(w, 0.0) + rate * f * (alpha * local + beta * (1.0 - local))
    for w, remote in remote_destinations(fractions, edge_rates).items():
        load[w] = load.get(w, 0.0) + gamma * len(remote)
    return load


@dataclass(frozen=True)
class CapacityModel:
    """The coefficients of Eq. (1) and the smoothed maximum worker capacity W̄ of Eq. (4)."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    capacity: float = DEFAULT_CAPACITY

    def worker_load(self, execution: float, r_local: float, r_remote: float, delta: float) -> float:
        """Eq. (1) with this model's α, β, γ."""
        return worker_capacity(execution, r_local, r_remote, delta, self.alpha, self.beta, self.gamma)

    def placement_load(self, fractions: Mapping[str, Mapping[int, float]], demand: Mapping[str, float],
                       edge_rates: Mapping[Edge, float]) -> dict[int, float]:
        """Eq. (8) with this model's α, β, γ."""
        return placement_load(fractions, demand, edge_rates, self.alpha, self.beta, self.gamma)

    def fits(self, load: Mapping[int, float], slack: float = 1e-9) -> bool:
        """L_w ≤ W̄ for every worker (with a relative slack for floating-point rounding)."""
        return all(v <= self.capacity * (1.0 + slack) for v in load.values())
