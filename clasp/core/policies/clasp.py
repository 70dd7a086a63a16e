"""The CLASP policy (paper §4.3) and its paper-exact variant, over `clasp.core.placement`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from clasp.core.model import CapacityModel, Edge
from clasp.core.parallelism import placement_parallelism
from clasp.core.placement import (
    WHOLE_LIMIT,
    FractionalPlacement,
    LoadError,
    NoPlacementError,
    Work,
    WorkerLimitCache,
    place,
)
from clasp.core.policies.base import Decision, PlacementResult, Policy, Stats, uniform_placement

T = TypeVar("T")


@dataclass
class ClaspConfig:
    """CLASP policy settings: the worker-limit search tolerance (req/s), the relative tolerance within
    which a cached worker-limit placement is reused, and a standing worker limit (None: unlimited)."""

    search_tolerance: float = 50.0
    cache_tolerance: float = 0.05
    max_workers: int | None = None


@dataclass
class ClaspPolicy(Policy):
    """CLASP: reverse-topological next-fit placement under the Eq. (8) capacity model (paper §4.3), with
    the extended model (receivers, messages, per-worker W_w; `clasp.core.model`) and next-fit refined over
    other admissible orders (`clasp.core.placement.place(refine=True)`). `ClaspPaperPolicy` is the paper's."""

    config: ClaspConfig = field(default_factory=ClaspConfig)
    cache: WorkerLimitCache = field(default_factory=WorkerLimitCache)
    name: str = "clasp"
    refine: bool = True
    # What the last `plan` or `place_on` evaluated (docs/POLICY.md, "Bounded refinement").
    work: Work = field(default_factory=Work)

    def __post_init__(self) -> None:
        self.cache.tolerance = self.config.cache_tolerance

    def model_of(self, stats: Stats) -> CapacityModel:
        """The capacity model this policy places with."""
        return stats.model

    def _result(self, p: FractionalPlacement, stats: Stats, rate: float, reason: str, workers: int | None = None,
                ) -> PlacementResult:
        n = max(p.workers, workers or 0)
        scale = rate / stats.throughput if stats.throughput > 0 else 1.0
        parallelism = placement_parallelism(p.fractions, p.demand, scale, stats.instances, stats.p_max)
        load = p.load(self.model_of(stats)) + [0.0] * (n - p.workers)
        return PlacementResult(p.order, n, p.shares, p.fractions, parallelism, load, stats.capacity, rate,
                               self.name, reason)

    def plan(self, stats: Stats, max_workers: int | None = None) -> PlacementResult:
        """The placement CLASP wants for `stats.input_rate` (the worker-limit placement if it needs more)."""
        operators = list(stats.operators)
        edges = [(e.src, e.dst) for e in stats.edges]
        limit = max_workers if max_workers is not None else self.config.max_workers
        load = stats.load_at(stats.input_rate)
        model = self.model_of(stats)
        # The refinement's budget is for as many workers as the execution demand fills (the fewest that
        # can sustain the rate), or the limit where that is fewer.
        filled = max(1, math.ceil(sum(load.demand.values()) / model.capacity))
        self.work = work = Work.for_size(len(operators), filled if limit is None else min(limit, filled))
        try:
            p = place(operators, edges, load, model, limit, refine=self.refine, work=work)
            if self.refine and p.workers > 1 and stats.throughput > 0:
                fewer = self._fewer_by_limit(operators, edges, stats, model, p.workers)
                if fewer is not None:
                    return fewer
            return self._result(p, stats, stats.input_rate,
                                f"{p.workers} worker(s) sustain {stats.input_rate:g} req/s")
        except NoPlacementError as exc:
            if limit is None:
                raise
            found = self.cache.get_or_search(operators, edges, stats.observed_load(), stats.throughput, model,
                                             limit, self.config.search_tolerance, self.refine, work)
            # Next-fit failing does not mean the limit is needed: when the limit placement sustains the
            # rate, fewer workers' limit placements may too (next-fit's fit is not monotone in the rate).
            if self.refine and found.rate >= stats.input_rate:
                fewer = self._fewer_by_limit(operators, edges, stats, model, limit + 1)
                if fewer is not None:
                    return fewer
            return self._result(found.placement, stats, found.rate,
                                f"worker limit {limit} reached ({exc}); highest rate that fits: "
                                f"{found.rate:.0f} req/s", workers=None)

    def _fewer_by_limit(self, operators, edges, stats: Stats, model, workers: int) -> PlacementResult | None:
        """Beyond the paper: whether next-fit fits is not monotone in the rate, so the worker-limit search
        for fewer workers can sustain the rate next-fit needed `workers` for. The fewest n < `workers` whose
        limit placement (cached) sustains the input rate, that placement at the input rate; None if none.
        Counts whose capacities do not hold the execution demand Σ D̃_o at that rate are not searched; of
        the rest, up to FEWER_SCAN of a small DAG and cluster are searched in turn, more from the top down
        (`fewest_from_top`: O(log n) searches, none past the first count that does not sustain the rate)."""
        rate = stats.input_rate
        load = stats.load_at(rate)
        execution = sum(load.demand.values())
        counts, held = [], 0.0
        for n in range(1, workers):
            held += model.capacity_of(n - 1)
            if execution <= held * (1 + 1e-6):
                counts.append(n)

        def sustains(n: int) -> PlacementResult | None:
            if not self.work.affords():
                return None
            try:
                found = self.cache.get_or_search(operators, edges, stats.observed_load(), stats.throughput, model,
                                                 n, self.config.search_tolerance, self.refine, self.work)
            except (NoPlacementError, LoadError):
                return None
            if found.rate >= rate and found.placement.workers <= n:
                at_rate = replace(found.placement, demand=dict(load.demand), edge_rates=dict(load.edge_rates))
                if model.fits(at_rate.load_map(model)):
                    return self._result(at_rate, stats, rate,
                                        f"{n} worker(s) sustain {rate:g} req/s (their limit placement: "
                                        f"{found.rate:.0f} req/s)")
            return None

        if len(counts) <= FEWER_SCAN and len(operators) * workers <= WHOLE_LIMIT:
            return next((r for n in counts if (r := sustains(n)) is not None), None)
        return fewest_from_top(counts, sustains)

    def decide(self, operators: Sequence[str], edges: Sequence[Edge], current: PlacementResult | None,
               stats: Stats, *, max_workers: int | None = None) -> Decision:
        edges = [tuple(e) for e in edges]
        stats = stats.aligned(operators, edges)
        if not stats.throughput > 0:
            return Decision.no_change(f"throughput is {stats.throughput:g}: nothing to scale from")
        if sum(s.rate * s.tau_us for s in stats.operators.values()) <= 0:
            return Decision.no_change("no processing demand observed: nothing to scale from")
        try:
            new = self.plan(stats, max_workers)
        except NoPlacementError as exc:
            return Decision.no_change(f"no placement fits: {exc}")
        if current is not None and current.workers == new.workers and self._still_fits(current, stats):
            return Decision.no_change(f"the current placement on {current.workers} worker(s) still sustains "
                                      f"{stats.input_rate:g} req/s")
        if current is not None and new.rate < stats.input_rate and _moves_little(current, new):
            # At the worker limit every lag re-plans for the highest rate that fits; a migration that moves
            # next to nothing costs a pause and buys nothing measurable.
            return Decision.no_change(f"{new.reason}; the current placement on {current.workers} worker(s) "
                                      f"differs from it by at most {MOVE_TOLERANCE:g} of any operator")
        return Decision(new, new.reason)

    def _still_fits(self, current: PlacementResult, stats: Stats) -> bool:
        """Does the current placement keep every worker's Eq. (8) load within W̄ at the new rate?"""
        if set(current.fractions) != set(stats.operators):
            return False
        load = stats.load_at(stats.input_rate)
        model = self.model_of(stats)
        return model.fits(model.placement_load(current.fractions, load.demand, load.edge_rates))

    def place_on(self, operators: Sequence[str], edges: Sequence[Edge], stats: Stats,
                 workers: int) -> PlacementResult:
        """The worker-limit placement for `workers`: the highest rate that fits (uniform without data)."""
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        edges = [tuple(e) for e in edges]
        stats = stats.aligned(operators, edges)
        demand = sum(s.rate * s.tau_us for s in stats.operators.values())
        self.work = Work.for_size(len(operators), workers)
        if not stats.throughput > 0 or demand <= 0:
            return uniform_placement(list(operators), edges, workers, stats.p_max, stats.capacity,
                                     "no throughput observed: operators spread evenly", self.name)
        try:
            found = self.cache.get_or_search(list(stats.operators), edges, stats.observed_load(),
                                             stats.throughput, self.model_of(stats), workers,
                                             self.config.search_tolerance, self.refine, self.work)
        except (NoPlacementError, LoadError) as exc:
            return uniform_placement(list(operators), edges, workers, stats.p_max, stats.capacity,
                                     f"no placement fits {workers} worker(s) ({exc}): spread evenly",
                                     self.name)
        return self._result(found.placement, stats, found.rate,
                            f"highest rate that fits {workers} worker(s): {found.rate:.0f} req/s",
                            workers=workers)


MOVE_TOLERANCE = 0.02  # σ_o(w) changes up to this are not worth a migration at the worker limit
# Counts below next-fit's that `_fewer_by_limit` searches one by one, the fewest first (the paper's apps
# on its ten workers need at most ten); beyond them, or above WHOLE_LIMIT operators × workers, `fewest_from_top`.
FEWER_SCAN = 16


def fewest_from_top(counts: Sequence[int], sustains: Callable[[int], T | None]) -> T | None:
    """`sustains` of the fewest of the ascending `counts` found to sustain the rate, probing from the top:
    the most, then 1, 2, 4, … fewer while they sustain it, then bisecting between the last that did and
    the first that did not: O(log n) probes. More workers sustain more but for next-fit's rounding, so
    once the most counts do not sustain the rate, fewer are not searched (the refinement cannot beat
    next-fit there)."""
    best, fail, ok = None, -1, len(counts)
    step, i = 1, len(counts) - 1
    while i >= 0:
        found = sustains(counts[i])
        if found is None:
            fail = i
            break
        best, ok = found, i
        i, step = ok - step, step * 2
    if best is None:
        return None
    while ok - fail > 1:
        mid = (fail + ok) // 2
        found = sustains(counts[mid])
        if found is None:
            fail = mid
        else:
            best, ok = found, mid
    return best


def _moves_little(current: PlacementResult, new: PlacementResult) -> bool:
    """Same workers and every σ_o(w) within MOVE_TOLERANCE of the current placement's."""
    if current.workers != new.workers or set(current.fractions) != set(new.fractions):
        return False
    return all(abs(current.fractions[o].get(w, 0.0) - new.fractions[o].get(w, 0.0)) <= MOVE_TOLERANCE
               for o in new.fractions for w in set(current.fractions[o]) | set(new.fractions[o]))


@dataclass
class ClaspPaperPolicy(ClaspPolicy):
    """CLASP exactly as the paper has it: Eq. (1), (8), (9) with sender-only β, one W̄, no refinement."""

    name: str = "clasp-paper"
    refine: bool = False

    def model_of(self, stats: Stats) -> CapacityModel:
        return stats.model.paper()
