"""The scaling-policy interface, the statistics it reads (PROFILE.json) and its results.

A policy is pure: given the DAG (operator names and edges), the current placement (or None) and the
aggregated statistics, it returns a Decision: no change, or a new placement with worker count and
parallelism, and always a reason. CLASP (`clasp.core.policies.clasp`) and the baselines
(`clasp.core.policies.baselines`) implement it; `clasp.core.policies.registry.POLICIES` names them all.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clasp.core.model import FLUSH_PEER_FACTOR, CapacityModel, Edge
from clasp.core.parallelism import placement_parallelism
from clasp.core.placement import (
    Load,
    NoPlacementError,
    derive_load,
    topological_order,
)

PROFILE_FIELDS = ("operators", "edges", "alpha", "beta", "gamma", "capacity", "throughput", "input_rate",
                  "p_max", "instances", "workers", "beta_receive", "mu", "flush_delay", "capacities", "alpha_split",
                  "stateless", "flush_peer_factor", "alpha_keyed", "keyed", "beta_split")


class StatsError(ValueError):
    """Malformed statistics (a PROFILE.json object, see `Stats`); `field` names the offending field (e.g.
    `edges[1].dst`). Not `clasp.core.profiles.ProfileError`, which is about input-rate profiles."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"profile field {field_name!r}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class OperatorStats:
    """Aggregated over workers: N_o, processed requests per second, and τ̄_o, mean execution time (µs)."""

    rate: float
    tau_us: float


@dataclass(frozen=True)
class EdgeStats:
    """E[o→o_s]: chained requests per second from `src` to `dst`."""

    src: str
    dst: str
    rate: float


def _number(d: Mapping, key: str, where: str, *, minimum: float = 0.0, strict: bool = False,
            integer: bool = False, default: Any = None) -> float:
    name = f"{where}.{key}" if where else key
    if key not in d:
        if default is not None:
            return default
        raise StatsError(name, "missing")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise StatsError(name, f"must be a finite number, not {v!r}")
    if integer and v != int(v):
        raise StatsError(name, f"must be an integer, not {v!r}")
    if v < minimum or (strict and v == minimum):
        raise StatsError(name, f"must be {'>' if strict else '≥'} {minimum:g}, not {v!r}")
    return int(v) if integer else float(v)


@dataclass
class Stats:
    """Aggregated runtime statistics, exactly the fields of PROFILE.json.

    `operators`: N_o and τ̄_o per operator; `edges`: E[o→o_s]; `alpha`, `beta`, `gamma`, `capacity`: the
    capacity model (Eq. 1, W̄); `throughput`: Λ; `input_rate`: λ_p; `p_max`: executor slots per worker;
    `instances`: the current total P_tot; `workers`: the current number of active workers. Optional
    (the extended model, `clasp.core.model`; absent: the paper's): `beta_receive` β_r, `mu` µs per message,
    `flush_delay` the engine's (s), `capacities` W_w per worker index, `alpha_split` α on the table
    route, `stateless` the operators whose local requests can take it, `flush_peer_factor` how a sender's
    flush interval grows per extra peer, `alpha_keyed` what a request into an operator of `keyed` not
    wholly on its sender's worker costs in place of α or β_s (the keyed table route), `beta_split` what a
    remote request to a stateless operator with several holders costs on top of β_s (the table route),
    `local_first` that requests into the `stateless` operators are routed local first (`model.edge_flow`).
    """

    operators: dict[str, OperatorStats]
    edges: list[EdgeStats]
    alpha: float
    beta: float
    gamma: float
    capacity: float
    throughput: float
    input_rate: float
    p_max: int
    instances: int
    workers: int = 1
    beta_receive: float = 0.0
    mu: float = 0.0
    flush_delay: float = 0.001
    capacities: list[float] | None = None
    alpha_split: float | None = None
    stateless: list[str] | None = None
    flush_peer_factor: float = FLUSH_PEER_FACTOR
    alpha_keyed: float | None = None
    keyed: list[str] | None = None
    beta_split: float = 0.0
    local_first: bool = False

    @classmethod
    def from_json_dict(cls, d: Any) -> Stats:
        """Validate a PROFILE.json object; raise StatsError naming the first offending field."""
        if not isinstance(d, Mapping):
            raise StatsError("<profile>", f"must be a JSON object, not {type(d).__name__}")
        ops_raw = d.get("operators")
        if "operators" not in d:
            raise StatsError("operators", "missing")
        if not isinstance(ops_raw, Mapping) or not ops_raw:
            raise StatsError("operators", "must be a non-empty object of name → {rate, tau_us}")
        operators = {}
        for name, o in ops_raw.items():
            where = f"operators.{name}"
            if not isinstance(o, Mapping):
                raise StatsError(where, "must be an object with rate and tau_us")
            operators[str(name)] = OperatorStats(_number(o, "rate", where), _number(o, "tau_us", where))
        if "edges" not in d:
            raise StatsError("edges", "missing")
        if not isinstance(d["edges"], list):
            raise StatsError("edges", "must be a list of {src, dst, rate}")
        edges, seen = [], set()
        for i, e in enumerate(d["edges"]):
            where = f"edges[{i}]"
            if not isinstance(e, Mapping):
                raise StatsError(where, "must be an object with src, dst and rate")
            for end in ("src", "dst"):
                if end not in e:
                    raise StatsError(f"{where}.{end}", "missing")
                if e[end] not in operators:
                    raise StatsError(f"{where}.{end}", f"unknown operator {e[end]!r}")
            if (e["src"], e["dst"]) in seen:
                raise StatsError(where, f"duplicate edge {e['src']} -> {e['dst']}")
            seen.add((e["src"], e["dst"]))
            edges.append(EdgeStats(e["src"], e["dst"], _number(e, "rate", where)))
        try:
            topological_order(list(operators), [(e.src, e.dst) for e in edges])
        except NoPlacementError as exc:
            raise StatsError("edges", str(exc)) from None
        return cls(
            operators, edges,
            alpha=_number(d, "alpha", ""), beta=_number(d, "beta", ""), gamma=_number(d, "gamma", ""),
            capacity=_number(d, "capacity", "", strict=True), throughput=_number(d, "throughput", ""),
            input_rate=_number(d, "input_rate", ""), p_max=_number(d, "p_max", "", minimum=1, integer=True),
            instances=_number(d, "instances", "", integer=True),
            workers=_number(d, "workers", "", minimum=1, integer=True, default=1),
            beta_receive=_number(d, "beta_receive", "", default=0.0), mu=_number(d, "mu", "", default=0.0),
            flush_delay=_number(d, "flush_delay", "", strict=True, default=0.001),
            flush_peer_factor=_number(d, "flush_peer_factor", "", default=FLUSH_PEER_FACTOR),
            capacities=_capacities(d),
            alpha_split=None if d.get("alpha_split") is None else _number(d, "alpha_split", ""),
            stateless=_names(d, "stateless", operators),
            alpha_keyed=None if d.get("alpha_keyed") is None else _number(d, "alpha_keyed", ""),
            keyed=_names(d, "keyed", operators),
            beta_split=_number(d, "beta_split", "", default=0.0), local_first=_flag(d, "local_first"))

    def to_json_dict(self) -> dict:
        """The PROFILE.json object for these statistics."""
        return {"operators": {o: {"rate": s.rate, "tau_us": s.tau_us} for o, s in self.operators.items()},
                "edges": [{"src": e.src, "dst": e.dst, "rate": e.rate} for e in self.edges],
                "alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "capacity": self.capacity,
                "throughput": self.throughput, "input_rate": self.input_rate, "p_max": self.p_max,
                "instances": self.instances, "workers": self.workers, "beta_receive": self.beta_receive,
                "mu": self.mu, "flush_delay": self.flush_delay, "flush_peer_factor": self.flush_peer_factor,
                "capacities": None if self.capacities is None else list(self.capacities),
                "alpha_split": self.alpha_split, "stateless": self.stateless, "alpha_keyed": self.alpha_keyed,
                "keyed": self.keyed, "beta_split": self.beta_split, "local_first": self.local_first}

    @property
    def model(self) -> CapacityModel:
        """The capacity model these statistics carry (the extended one where they have its terms)."""
        return CapacityModel(self.alpha, self.beta, self.gamma, self.capacity, self.beta_receive, self.mu,
                             self.flush_delay, None if self.capacities is None else tuple(self.capacities),
                             self.alpha_split, frozenset(self.stateless or ()), self.flush_peer_factor,
                             self.alpha_keyed, frozenset(self.keyed or ()), self.beta_split, self.local_first)

    def edge_rates(self) -> dict[Edge, float]:
        return {(e.src, e.dst): e.rate for e in self.edges}

    def observed_load(self) -> Load:
        """The load as observed (s = 1), the base every projection scales."""
        return self.load_at(self.throughput)

    def load_at(self, input_rate: float) -> Load:
        """Eq. (5)–(7) for `input_rate`; raises LoadError when the throughput is zero."""
        return derive_load({o: s.rate for o, s in self.operators.items()},
                           {o: s.tau_us for o, s in self.operators.items()}, self.edge_rates(),
                           self.throughput, input_rate)

    def aligned(self, operators: Sequence[str], edges: Sequence[Edge]) -> Stats:
        """These statistics on the DAG's operators and edges: what was not observed yet counts as rate 0."""
        known = set(operators)
        for o in self.operators:
            if o not in known:
                raise StatsError(f"operators.{o}", "not an operator of the DAG")
        edge_set = {tuple(e) for e in edges}
        for i, e in enumerate(self.edges):
            if (e.src, e.dst) not in edge_set:
                raise StatsError(f"edges[{i}]", f"{e.src} -> {e.dst} is not an edge of the DAG")
        rates = self.edge_rates()
        return Stats({o: self.operators.get(o, OperatorStats(0.0, 0.0)) for o in operators},
                     [EdgeStats(s, d, rates.get((s, d), 0.0)) for s, d in edges],
                     self.alpha, self.beta, self.gamma, self.capacity, self.throughput, self.input_rate,
                     self.p_max, self.instances, self.workers, self.beta_receive, self.mu, self.flush_delay,
                     self.capacities, self.alpha_split, self.stateless, self.flush_peer_factor, self.alpha_keyed,
                     self.keyed, self.beta_split, self.local_first)


def _flag(d: Mapping, key: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise StatsError(key, f"must be true or false, not {v!r}")
    return v


def _names(d: Mapping, key: str, operators: Mapping) -> list[str] | None:
    raw = d.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list) or any(n not in operators for n in raw):
        raise StatsError(key, "must be a list of operator names, or null")
    return [str(n) for n in raw]


def _capacities(d: Mapping) -> list[float] | None:
    raw = d.get("capacities")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise StatsError("capacities", "must be a list of W_w (µs/s) per worker, or null")
    return [_number({"w": v}, "w", f"capacities[{i}]", strict=True) for i, v in enumerate(raw)]



@dataclass
class PlacementResult:
    """A placement ready for the runtime.

    `order`: operators in placement order; `workers`: worker count; `placement`: op → {worker → φ[o,w]},
    its share of the demand (µs/s); `fractions`: op → {worker → σ_o(w)}, the routing probabilities /
    key-space fractions; `parallelism`: op → {worker → instances}; `load`: Eq. (8) per worker;
    `capacity`: W̄; `rate`: the input rate it was made for.
    """

    order: list[str]
    workers: int
    placement: dict[str, dict[int, float]]
    fractions: dict[str, dict[int, float]]
    parallelism: dict[str, dict[int, int]]
    load: list[float]
    capacity: float
    rate: float
    policy: str = "clasp"
    reason: str = ""

    def to_json_dict(self) -> dict:
        """A JSON-ready dict (worker indices become string keys, as JSON requires)."""
        def keyed(m: Mapping[str, Mapping[int, Any]]) -> dict:
            return {o: {str(w): v for w, v in sorted(pw.items())} for o, pw in m.items()}
        return {"order": list(self.order), "workers": self.workers, "placement": keyed(self.placement),
                "fractions": keyed(self.fractions), "parallelism": keyed(self.parallelism),
                "load": list(self.load), "capacity": self.capacity, "rate": self.rate, "policy": self.policy,
                "reason": self.reason}

    def to_json(self) -> str:
        """The JSON text of `to_json_dict()`."""
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_json_dict(cls, d: Mapping) -> PlacementResult:
        def unkeyed(m: Mapping, cast) -> dict:
            return {o: {int(w): cast(v) for w, v in pw.items()} for o, pw in m.items()}
        placement = unkeyed(d["placement"], float)
        fractions = unkeyed(d["fractions"], float) if "fractions" in d else None
        if fractions is None:
            fractions = {o: {w: v / sum(pw.values()) for w, v in pw.items()} if sum(pw.values()) > 0 else {}
                         for o, pw in placement.items()}
        return cls(list(d["order"]), int(d["workers"]), placement, fractions,
                   unkeyed(d["parallelism"], int), [float(x) for x in d["load"]], float(d["capacity"]),
                   float(d.get("rate", 0.0)), str(d.get("policy", "clasp")), str(d.get("reason", "")))

    def instances(self) -> int:
        return sum(c for pw in self.parallelism.values() for c in pw.values())


@dataclass
class Decision:
    """A policy's answer: `placement` None means no change. `reason` always says why."""

    placement: PlacementResult | None
    reason: str

    @property
    def change(self) -> bool:
        return self.placement is not None

    @property
    def workers(self) -> int | None:
        return None if self.placement is None else self.placement.workers

    @classmethod
    def no_change(cls, reason: str) -> Decision:
        return cls(None, reason)


class Policy(ABC):
    """A scaling policy: worker count, placement and parallelism from statistics. Pure and deterministic."""

    name: str = ""

    @abstractmethod
    def decide(self, operators: Sequence[str], edges: Sequence[Edge], current: PlacementResult | None,
               stats: Stats, *, max_workers: int | None = None) -> Decision:
        """Re-plan for `stats.input_rate`: no change, or a new placement on at most `max_workers` workers."""

    @abstractmethod
    def place_on(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                 workers: int) -> PlacementResult:
        """A placement onto exactly `workers` workers (manual `client.scale(n)`)."""


def uniform_placement(operators: Sequence[str], edges: Sequence[Edge], workers: int, p_max: int,
                      capacity: float, reason: str, policy: str) -> PlacementResult:
    """Every operator spread evenly over `workers`: the only sensible placement without observations."""
    fractions = {o: {w: 1.0 / workers for w in range(workers)} for o in operators}
    parallelism = placement_parallelism(fractions, dict.fromkeys(operators, 1.0), 1.0, 0, p_max)
    shares = {o: dict.fromkeys(range(workers), 0.0) for o in operators}
    return PlacementResult(list(operators), workers, shares, fractions, parallelism, [0.0] * workers,
                           capacity, 0.0, policy, reason)
