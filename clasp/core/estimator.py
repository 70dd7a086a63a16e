"""Online estimation of α, β, γ (Eq. 2) and the maximum worker capacity W̄ (Eq. 3–4) from saturated workers.

The caller feeds one WorkerSample per worker per interval (nominally 1 s); the estimator keeps the short
per-worker history it needs. No clock, no I/O: the same sequence of samples gives the same estimates.

Estimation, per SPEC.md: a worker is saturated when its queue grew in each of the last
`growth_intervals` intervals or its queueing delay exceeds `delay_threshold`, and also (beyond the
paper) when it reports `busy`: it never ran out of work during the interval. Under the planner's
in-flight window a saturated worker's queue stops growing within a second and stays too short for the
delay threshold, so without `busy` the runtime's estimator was almost never fed. Two consecutive saturated
samples of the same worker give one differenced observation ΔE = −αΔR^l − βΔR^r − γΔδ (Eq. 2); the
observations of all workers are pooled. Each regressor is divided by a fixed scale, θ is solved by
recursive least squares with forgetting factor ρ (information form: R ← ρR + xxᵀ, r ← ρr + xy, O(1) per
observation), and rescaled to µs units. Each saturated sample then gives Ŵ (Eq. 3), smoothed into W̄ (Eq. 4).

Measured CPU (beyond the paper): Eq. (2) rests on the saturated worker's capacity W being the same in both
samples, so that ΔE is all the chained-request cost moving. A worker that shares a host, runs under a CPU
quota or is disturbed by anything else gets a different W every second, and that variation moves E and the
request rates together, which drags α, β, γ towards 0. When a worker reports `cpu`, U_w, the CPU time it
actually used (µs/s), it has no unknown W to difference away: a saturated worker satisfies Eq. (1) as
U_w = E_w + αR^l_w + βR^r_w + γδ_w, so each saturated sample on its own is one observation of
U − E = αR^l + βR^r + γδ, in levels. One worker alone then identifies α (the paper's differences need a
change of R^l), and the different mixes of one placement's workers inform α, β, γ together. What a worker
spends beside requests (heartbeats, its event loop) is a few per cent of a saturated worker's CPU and is
carried by α, β, γ; an intercept for it would be confounded with γδ and with α on one worker. Only saturated
samples still: below saturation a remote request costs more (batches hold a few rows), which the linear
Eq. (1) does not model.

Extended model (beyond the paper, clasp.core.model): with the remote requests a worker received (R^r,in) and the
data messages it sent and received (M) reported, θ = [α, β_s, β_r, μ, γ] (Eq. 1 extended). A coefficient is
identified only where its regressor is not (nearly) a combination of the others': its unique share
1 − R²_i = 1 / (C⁻¹)_ii of the pooled observations' correlation matrix C must reach `identifiability`;
a coefficient below it keeps its value (the calibrated prior until it was once identified), and
`EstimatorUpdate.terms` says which. A coefficient must also be determined precisely: its standard error
(from the residual variance of the pooled fit and the inverse information, σ̂²(A⁻¹)_ii) may be at most
`max_relative_error` of its estimate, else it too keeps its value, so a term that is a sliver of every
observed load (μ where the only messages are a few per second) is not fitted to noise.
Capacity is per worker as well (Eq. 3–4 per worker, W_w): each worker's
saturated samples smooth its own W_w, which starts from its CPU allowance (`WorkerSample.cpus` × the prior
per CPU) or the pooled W̄. The flush rate the engine achieves (messages per peer per CPU-second, 1 / the
effective flush delay) is smoothed from saturated senders whose batches held more than one row.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from types import MappingProxyType

import numpy as np

from clasp.core.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_CAPACITY,
    DEFAULT_GAMMA,
    FLUSH_PEER_FACTOR,
    CapacityModel,
    worker_capacity,
)


@dataclass(frozen=True)
class WorkerSample:
    """One worker's metrics over one interval (paper Table 2).

    `queue_length`: Q_w at the end of the interval; `queueing_delay`: mean time a request waited in the
    incoming queue (s); `execution`: E_w = Σ_o N[w,o]·τ̄[w,o] (µs/s); `r_local`, `r_remote`: R^l_w, R^r_w,
    chained requests per second it generated for itself / for other workers; `delta`: δ_w, the number of
    distinct remote workers those reached; `busy`: the worker never ran out of work during the interval
    (a saturation signal of its own, beside queue growth and queueing delay); `cpu`: U_w, the CPU time the
    worker used (µs/s), when it measured it (None: unknown, the paper's setting); `r_received`: remote
    chained requests it received from other workers per second; `messages_out`, `messages_in`: data
    messages per second it sent to and received from other workers; `cpus`: its CPU allowance (a quota,
    or what `clasp worker --cpus` declared). None: not reported.
    """

    queue_length: float
    queueing_delay: float = 0.0
    execution: float = 0.0
    r_local: float = 0.0
    r_remote: float = 0.0
    delta: float = 0.0
    busy: bool = False
    cpu: float | None = None
    r_received: float | None = None
    messages_out: float | None = None
    messages_in: float | None = None
    cpus: float | None = None

    def valid(self) -> bool:
        optional = (self.cpu, self.r_received, self.messages_out, self.messages_in, self.cpus)
        values = (self.queue_length, self.queueing_delay, self.execution, self.r_local, self.r_remote,
                  self.delta) + tuple(v for v in optional if v is not None)
        return all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values)

    @property
    def messages(self) -> float:
        """M_w, data messages sent and received per second (0 where not reported)."""
        return (self.messages_out or 0.0) + (self.messages_in or 0.0)


# The coefficients of the extended Eq. (1), in regression order.
TERMS = ("alpha", "beta", "beta_receive", "mu", "gamma")


@dataclass(frozen=True)
class EstimatorConfig:
    """Estimator settings. Initial values are the paper's converged ones (Faasm, ~400 µs operators).

    `beta` is the whole cost of a remote request, of which the receiver pays `receive_share` (β_r) and the
    sender the rest (β_s); `mu`: µs per data message at either end; `flush_delay`: the engine's (s), the
    prior of the effective one (`Estimator.flush_delay`); `alpha_split`: α on the table route (held: the
    runtime does not report those requests apart); `alpha_keyed`: µs per request routed through the
    keyed table (in place of α or β_s), `beta_split` more per remote request on the table route (both
    held, likewise). `rho`: RLS forgetting factor per observation (memory ≈ 1/(1−ρ) observations); `eta`:
    EMA weight of Eq. (4); `growth_intervals`: consecutive intervals of
    queue growth that mark saturation; `delay_threshold`: queueing delay (s) that marks saturation on its
    own; `scale_*`: the fixed per-term normalization of R^l, R^r (req/s), M (messages/s), δ (workers) and
    E (µs/s); `prior_weight`: how many unit observations the initial coefficients are worth (it decays with
    ρ like any observation); `identifiability`: the smallest unique share 1 − R²_i of a coefficient's
    regressor among the others' for which that coefficient is estimated; `max_relative_error`: the largest
    standard error of an estimate, as a fraction of it, for which it is used; `capacity_per_cpu`: W of one
    whole CPU, which turns a worker's CPU allowance into the prior of its W_w (default: `capacity`).
    """

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    capacity: float = DEFAULT_CAPACITY
    receive_share: float = 0.0
    mu: float = 0.0
    flush_delay: float = 0.001
    flush_peer_factor: float = FLUSH_PEER_FACTOR
    alpha_split: float | None = None
    alpha_keyed: float | None = None
    beta_split: float = 0.0
    rho: float = 0.99
    eta: float = 0.05
    growth_intervals: int = 3
    delay_threshold: float = 0.1
    scale_local: float = 1000.0
    scale_remote: float = 1000.0
    scale_messages: float = 1000.0
    scale_delta: float = 1.0
    scale_execution: float = 100000.0
    prior_weight: float = 1.0
    identifiability: float = 0.01
    max_relative_error: float = 0.25
    capacity_per_cpu: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.rho <= 1:
            raise ValueError(f"rho must be in (0, 1], not {self.rho}")
        if not 0 < self.eta <= 1:
            raise ValueError(f"eta must be in (0, 1], not {self.eta}")
        if self.growth_intervals < 1:
            raise ValueError(f"growth_intervals must be at least 1, not {self.growth_intervals}")
        if not 0 <= self.receive_share <= 1:
            raise ValueError(f"receive_share must be in [0, 1], not {self.receive_share}")
        for name in ("alpha", "beta", "gamma", "mu"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be ≥ 0, not {getattr(self, name)}")
        for name in ("capacity", "scale_local", "scale_remote", "scale_messages", "scale_delta",
                     "scale_execution", "prior_weight", "flush_delay", "max_relative_error"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")


@dataclass(frozen=True)
class EstimatorUpdate:
    """What one interval's samples did to the estimate; `reason` says why, also when nothing changed.

    `beta` is β_s; `terms` says for each coefficient of `TERMS` whether the observations identify it
    ("estimated") or why it keeps its value; `capacities`: W_w of the workers with an estimate of their own
    (from their saturated samples or their CPU allowance); the others have W̄."""

    alpha: float
    beta: float
    gamma: float
    capacity: float
    coefficients_changed: bool
    capacity_changed: bool
    saturated: tuple[Hashable, ...]
    observations: int
    reason: str
    beta_receive: float = 0.0
    mu: float = 0.0
    flush_delay: float = 0.001
    terms: Mapping[str, str] = field(default_factory=dict)
    capacities: Mapping[Hashable, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.coefficients_changed or self.capacity_changed

    @property
    def model(self) -> CapacityModel:
        return CapacityModel(self.alpha, self.beta, self.gamma, self.capacity, self.beta_receive, self.mu,
                             self.flush_delay)


def stall_threshold(cpu_max: tuple[float, float] | None) -> float:
    """Seconds beyond which a timed execution was stalled, not executing, under a CPU quota `cpu_max`
    ((quota, period) in seconds; None: unlimited, nothing is): half of the longest throttled stretch of a
    period, at least 1 ms. A throttled period lands inside whichever request was running, so such a
    sample says nothing of the operator's execution time (τ̄)."""
    if cpu_max is None:
        return math.inf
    quota, period = cpu_max
    return max(1e-3, 0.5 * (period - quota))


def _eliminate(a: list[list[float]], b: list[float]) -> tuple[list[float] | None, float]:
    """Gaussian elimination with partial pivoting on these small systems: (solution or None, determinant)."""
    n = len(b)
    m = [list(map(float, row)) + [float(v)] for row, v in zip(a, b, strict=True)]
    det = 1.0
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(m[i][k]))
        if not abs(m[p][k]) > 1e-300:
            return None, 0.0
        if p != k:
            m[k], m[p] = m[p], m[k]
            det = -det
        det *= m[k][k]
        for i in range(k + 1, n):
            f = m[i][k] / m[k][k]
            if f:
                for j in range(k, n + 1):
                    m[i][j] -= f * m[k][j]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x, det


def _nonnegative_least_squares(a: list[list[float]], b: list[float]) -> list[float] | None:
    """argmin θᵀAθ − 2bᵀθ subject to θ ≥ 0, for SPD A of size ≤ 5: the subset of free variables meeting KKT."""
    n = len(b)
    full, _ = _eliminate(a, b)
    if full is not None and all(v >= 0 for v in full):
        return full  # the common case: the unconstrained optimum is feasible
    for size in range(n - 1, -1, -1):
        for free in combinations(range(n), size):
            theta = [0.0] * n
            if free:
                sub, _ = _eliminate([[a[i][j] for j in free] for i in free], [b[i] for i in free])
                if sub is None or any(v < 0 for v in sub):
                    continue
                for i, v in zip(free, sub, strict=True):
                    theta[i] = v
            gradient = [sum(a[i][j] * theta[j] for j in range(n)) - b[i] for i in range(n)]
            if all(gradient[i] >= -1e-12 * (abs(b[i]) + 1.0) for i in range(n) if i not in free):
                return theta
    return None


def unique_shares(info: list[list[float]], terms: list[int]) -> dict[int, float]:
    """1 − R²_i of each term's regressor regressed on the others' (uncentered), from the information
    matrix: with C the correlation matrix over `terms`, R²_i = c_iᵀ C₋ᵢ⁺ c_i (a pseudo-inverse, so exact
    collinearity among some terms leaves the others' shares intact)."""
    if len(terms) == 1:
        return {terms[0]: 1.0}
    m = np.array([[info[i][j] for j in terms] for i in terms], dtype=float)
    d = np.sqrt(np.diag(m))
    c = m / np.outer(d, d)
    out = {}
    for a, i in enumerate(terms):
        rest = [b for b in range(len(terms)) if b != a]
        v = c[rest, a]
        r2 = float(v @ np.linalg.pinv(c[np.ix_(rest, rest)], hermitian=True) @ v)
        out[i] = min(1.0, max(0.0, 1.0 - r2))
    return out


@dataclass
class _History:
    queues: deque
    saturated: WorkerSample | None = None


@dataclass
class Estimator:
    """Pooled RLS estimate of θ = [α, β_s, β_r, μ, γ], the pooled EMA W̄ and a W_w per worker, fed one
    sample per worker per interval."""

    config: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        c = self.config
        self.alpha, self.gamma, self.capacity, self.mu = c.alpha, c.gamma, c.capacity, c.mu
        self.beta = (1.0 - c.receive_share) * c.beta  # β_s
        self.beta_receive = c.receive_share * c.beta
        self.flush_delay = c.flush_delay
        self.capacities: dict[Hashable, float] = {}
        self._scales = (c.scale_local, c.scale_remote, c.scale_remote, c.scale_messages, c.scale_delta)
        n = len(TERMS)
        self._info = [[0.0] * n for _ in range(n)]  # RLS information over θ (scaled)
        self._moment = [0.0] * n
        self._response = 0.0  # Σ ρ^k y², for the residual variance
        self._weight = 0.0  # Σ ρ^k: how many observations the information is worth
        self._prior_decay = 1.0
        self._prior = [v * s / c.scale_execution for v, s in zip(self.coefficients, self._scales, strict=True)]
        self._history: dict[Hashable, _History] = {}
        self._held: dict[int, str] = {}
        self.observations = 0
        self._unsolved = 0  # observations folded in since the last solve

    @property
    def coefficients(self) -> tuple[float, ...]:
        """θ in `TERMS` order, µs units."""
        return (self.alpha, self.beta, self.beta_receive, self.mu, self.gamma)

    @property
    def model(self) -> CapacityModel:
        return CapacityModel(self.alpha, self.beta, self.gamma, self.capacity, self.beta_receive, self.mu,
                             self.flush_delay, flush_peer_factor=self.config.flush_peer_factor)

    def capacity_of(self, worker: Hashable) -> float:
        """W_w: the worker's own smoothed capacity, or the pooled W̄ while it has neither a saturated
        sample nor a CPU allowance of its own."""
        return self.capacities.get(worker, self.capacity)

    def terms(self) -> dict[str, str]:
        """Per coefficient: "estimated" when the observations identify it, else why it keeps its value."""
        free = set(self._free())
        return {name: ("estimated" if i in free and i not in self._held else self._held.get(i, "no observation "
                       "of its regressor: prior kept")) for i, name in enumerate(TERMS)}

    def is_saturated(self, worker: Hashable) -> bool:
        """Saturation from the history alone: the queue grew in each of the last `growth_intervals`."""
        h = self._history.get(worker)
        if h is None or len(h.queues) <= self.config.growth_intervals:
            return False
        q = list(h.queues)
        return all(q[i + 1] > q[i] for i in range(len(q) - 1))

    def _fold(self, x: tuple[float, ...], y: float) -> None:
        """R ← ρR + xxᵀ, r ← ρr + xy."""
        rho = self.config.rho
        info, moment = self._info, self._moment
        for i, xi in enumerate(x):
            row = info[i]
            for j, xj in enumerate(x):
                row[j] = rho * row[j] + xi * xj
            moment[i] = rho * moment[i] + xi * y
        self._response = rho * self._response + y * y
        self._weight = rho * self._weight + 1.0
        self._prior_decay *= rho
        self.observations += 1

    def _regressors(self, s: WorkerSample) -> tuple[float, ...]:
        """[R^l, R^r,out, R^r,in, M, δ] scaled; unreported ones 0 (their coefficient is then not observed)."""
        sl, so, si, sm, sd = self._scales
        return (s.r_local / sl, s.r_remote / so, (s.r_received or 0.0) / si, s.messages / sm, s.delta / sd)

    def _observe(self, previous: WorkerSample, sample: WorkerSample) -> bool:
        """Fold one differenced observation (Eq. 2) into the RLS information; False if it carries none."""
        x = tuple(p - c for p, c in zip(self._regressors(previous), self._regressors(sample), strict=True))
        if sum(v * v for v in x) <= 1e-18:
            return False
        self._fold(x, (sample.execution - previous.execution) / self.config.scale_execution)
        return True

    def _observe_measured(self, sample: WorkerSample) -> bool:
        """Fold one measured sample, U − E = αR^l + β_sR^r,out + β_rR^r,in + μM + γδ; False for a worker
        that sent and received nothing."""
        if sample.r_local <= 0 and sample.r_remote <= 0 and not sample.r_received:
            return False
        self._fold(self._regressors(sample), (sample.cpu - sample.execution) / self.config.scale_execution)
        return True

    def _free(self) -> list[int]:
        """The coefficients the observations bear on: those whose regressor was ever non-zero (a worker
        with δ = 0 in every sample says nothing of γ, which keeps its value)."""
        return [i for i in range(len(TERMS)) if self._info[i][i] > 1e-300]

    def _identified(self) -> list[int]:
        """The free coefficients whose regressor's unique share reaches `identifiability`; the others are
        recorded in `_held` with why (regressors that only move together identify only their sum)."""
        free = self._free()
        shares = unique_shares(self._info, free) if free else {}
        limit = self.config.identifiability
        self._held = {i: f"collinear with the others (unique share {shares[i]:.3f} < {limit:g}): value kept"
                      for i in free if shares[i] < limit}
        return [i for i in free if i not in self._held]

    def _solve_coefficients(self, solve: list[int]) -> tuple[float, ...] | None:
        c = self.config
        se = c.scale_execution
        current = [v * s / se for v, s in zip(self.coefficients, self._scales, strict=True)]
        weight = c.prior_weight * self._prior_decay
        # A held coefficient is fixed at its current value: its part of each observation moves to the
        # right-hand side (a coefficient never observed has a zero row and column and drops out).
        held = [i for i in range(len(TERMS)) if i not in solve]
        a = [[self._info[i][j] + (weight if i == j else 0.0) for j in solve] for i in solve]
        b = [self._moment[i] + weight * self._prior[i] - sum(self._info[i][h] * current[h] for h in held)
             for i in solve]
        solved = _nonnegative_least_squares(a, b)
        if solved is None:
            return None
        theta = list(current)
        for i, v in zip(solve, solved, strict=True):
            theta[i] = v
        out = tuple(t * se / s for t, s in zip(theta, self._scales, strict=True))
        return out if all(math.isfinite(v) and v >= 0 for v in out) else None

    def relative_errors(self, theta: tuple[float, ...], solve: list[int]) -> dict[int, float]:
        """Standard error of each solved coefficient of `theta` (µs units) as a fraction of the larger of its
        estimate and its value now (a fit that clamps a coefficient to 0 far below its prior has told it
        apart): σ̂² = residual sum of squares / (observations − coefficients solved), var θ_i = σ̂²(A⁻¹)_ii
        with A the observations' information over `solve`, without the prior's (what the data determine,
        not what the prior already said). Infinite while there are no more observations than coefficients:
        there is no residual to judge by, and a fit of that few fits the noise too."""
        se = self.config.scale_execution
        t = [v * s / se for v, s in zip(theta, self._scales, strict=True)]
        now = [v * s / se for v, s in zip(self.coefficients, self._scales, strict=True)]
        info, moment = self._info, self._moment
        n = len(TERMS)
        rss = (self._response - 2.0 * sum(t[i] * moment[i] for i in range(n))
               + sum(t[i] * info[i][j] * t[j] for i in range(n) for j in range(n)))
        dof = self._weight - len(solve)
        if dof <= 0:
            return {i: math.inf for i in solve}
        a = np.array([[info[i][j] for j in solve] for i in solve], dtype=float)
        try:
            inverse = np.linalg.inv(a)
        except np.linalg.LinAlgError:
            return {i: math.inf for i in solve}
        variance = max(rss, 0.0) / dof
        out = {}
        for k, i in enumerate(solve):
            error = math.sqrt(max(float(inverse[k, k]), 0.0) * variance)
            scale = max(t[i], now[i])
            out[i] = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
        return out

    def _solve_precise(self, solve: list[int]) -> tuple[float, ...] | None:
        """Solve `solve`, then hold (at their values) the coefficients the fit leaves imprecise and solve
        the rest again, until every solved one is within `max_relative_error` (recorded in `_held`)."""
        limit = self.config.max_relative_error
        solve = list(solve)
        while solve:
            theta = self._solve_coefficients(solve)
            if theta is None:
                return None
            errors = self.relative_errors(theta, solve)
            loose = [i for i in solve if errors.get(i, 0.0) > limit]
            if not loose:
                return theta
            for i in loose:
                self._held[i] = (f"standard error {errors[i]:.0%} of its value (> {limit:.0%}): value kept"
                                 if math.isfinite(errors[i]) else "too few observations to judge its precision: "
                                 "value kept")
            solve = [i for i in solve if i not in loose]
        return self.coefficients

    def _capacity_hat(self, s: WorkerSample) -> float:
        """Ŵ of a saturated sample (Eq. 3, extended)."""
        return worker_capacity(s.execution, s.r_local, s.r_remote, s.delta, self.alpha, self.beta, self.gamma,
                               s.r_received or 0.0, s.messages, self.beta_receive, self.mu)

    def _smooth_flush(self, s: WorkerSample) -> None:
        """The effective flush delay from a saturated sender whose batches held more than one row (the
        timer, not the supply of rows, set its message count): per peer it sent messages_out / δ messages
        per second in U / 10⁶ CPU-seconds."""
        if not (s.messages_out and s.delta and s.cpu) or s.r_remote < 2.0 * s.messages_out:
            return
        # Normalized to one peer: the flush round of a sender with δ peers is 1 + c·(δ − 1) times longer.
        observed = (s.cpu / 1e6) / (s.messages_out / s.delta) / (1.0 + self.config.flush_peer_factor * (s.delta - 1))
        if math.isfinite(observed) and observed > 0:
            self.flush_delay = (1.0 - self.config.eta) * self.flush_delay + self.config.eta * observed

    def update(self, samples_by_worker: Mapping[Hashable, WorkerSample], solve: bool = True) -> EstimatorUpdate:
        """Feed one interval's samples (one per worker); returns the estimate and what changed, and why.
        `solve=False` folds the observations in and leaves the regression (its eigen- and least-squares
        solves, the dearest part of a tick) to a later call: the information loses nothing meanwhile."""
        c = self.config
        for w in [w for w in self._history if w not in samples_by_worker]:
            del self._history[w]  # a worker that missed an interval starts its history afresh
        saturated: list[tuple[Hashable, WorkerSample]] = []
        observed = flat = idle = invalid = 0
        for w, sample in samples_by_worker.items():
            if not isinstance(sample, WorkerSample) or not sample.valid():
                invalid += 1
                self._history.pop(w, None)
                continue
            if w not in self.capacities and sample.cpus:
                per_cpu = c.capacity_per_cpu if c.capacity_per_cpu is not None else c.capacity
                self.capacities[w] = sample.cpus * per_cpu
            h = self._history.get(w)
            if h is None:
                h = self._history[w] = _History(deque(maxlen=c.growth_intervals + 1))
            h.queues.append(sample.queue_length)
            is_saturated = sample.busy or self.is_saturated(w) or sample.queueing_delay > c.delay_threshold
            if is_saturated:
                saturated.append((w, sample))
            if sample.cpu is not None:  # measured: every saturated sample is an observation of its own
                h.saturated = None
                if not is_saturated:
                    continue
                if self._observe_measured(sample):
                    observed += 1
                else:
                    idle += 1
            elif is_saturated:
                if h.saturated is not None:
                    if self._observe(h.saturated, sample):
                        observed += 1
                    else:
                        flat += 1
                h.saturated = sample
            else:
                h.saturated = None

        reasons = []
        coefficients_changed = False
        if invalid:
            reasons.append(f"{invalid} sample(s) with negative or non-finite values ignored")
        self._unsolved += observed
        if self._unsolved and not solve:
            reasons.append(f"{self._unsolved} observation(s) folded in, not solved yet: α, β, γ unchanged")
        elif not saturated and not self._unsolved:
            reasons.append("no saturated worker: estimate unchanged")
        elif not self._unsolved:
            reasons.append("consecutive saturated samples with unchanged R^l, R^r, δ: α, β, γ unchanged" if flat
                           else "saturated workers did no work: α, β, γ unchanged" if idle
                           else "no previous saturated sample to difference with: α, β, γ unchanged")
        else:
            self._unsolved = 0
            solve = self._identified()
            if not solve:
                reasons.append("collinear observations do not identify any coefficient: unchanged")
            else:
                theta = self._solve_precise(solve)
                if theta is None:
                    reasons.append("regression has no non-negative finite solution: α, β, γ unchanged")
                else:
                    coefficients_changed = theta != self.coefficients
                    self.alpha, self.beta, self.beta_receive, self.mu, self.gamma = theta
                    collinear = [TERMS[i] for i in sorted(self._held) if self._held[i].startswith("collinear")]
                    loose = [TERMS[i] for i in sorted(self._held) if not self._held[i].startswith("collinear")]
                    if collinear:
                        reasons.append("collinear: " + ", ".join(collinear) + " kept")
                    if loose:
                        reasons.append("not determined precisely: " + ", ".join(loose) + " kept")

        capacity_changed = False
        for w, s in saturated:
            w_hat = self._capacity_hat(s)
            if math.isfinite(w_hat) and w_hat > 0:
                new = (1.0 - c.eta) * self.capacity + c.eta * w_hat
                capacity_changed = capacity_changed or new != self.capacity
                self.capacity = new
                # Its own W_w starts from the pooled W̄ (or its allowance) at its first saturated sample.
                self.capacities[w] = (1.0 - c.eta) * self.capacities.get(w, self.capacity) + c.eta * w_hat
            self._smooth_flush(s)
        if saturated and not capacity_changed:
            reasons.append("saturated samples give no positive Ŵ: W̄ unchanged")
        if not reasons:
            reasons.append(f"updated from {len(saturated)} saturated worker(s), {observed} observation(s)")
        return EstimatorUpdate(self.alpha, self.beta, self.gamma, self.capacity, coefficients_changed,
                               capacity_changed, tuple(w for w, _ in saturated), observed, "; ".join(reasons),
                               self.beta_receive, self.mu, self.flush_delay, MappingProxyType(self.terms()),
                               MappingProxyType(dict(self.capacities)))
