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
actually used (µs/s), Eq. (1) holds as U_w = E_w + αR^l_w + βR^r_w + γδ_w (+ a constant that differencing
removes) whether or not the worker is saturated, so two consecutive samples with `cpu` give the
observation Δ(E − U) = −αΔR^l − βΔR^r − γΔδ: Eq. (2) with ΔW measured instead of assumed 0, from every
interval (unsaturated ones too), not only saturated ones. W̄ still comes only from saturated samples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

from clasp.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_CAPACITY,
    DEFAULT_GAMMA,
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
    worker used (µs/s), when it measured it (None: unknown, the paper's setting).
    """

    queue_length: float
    queueing_delay: float = 0.0
    execution: float = 0.0
    r_local: float = 0.0
    r_remote: float = 0.0
    delta: float = 0.0
    busy: bool = False
    cpu: float | None = None

    def valid(self) -> bool:
        values = (self.queue_length, self.queueing_delay, self.execution, self.r_local, self.r_remote,
                  self.delta) + ((self.cpu,) if self.cpu is not None else ())
        return all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values)


@dataclass(frozen=True)
class EstimatorConfig:
    """Estimator settings. Initial values are the paper's converged ones (Faasm, ~400 µs operators).

    `rho`: RLS forgetting factor per observation (memory ≈ 1/(1−ρ) observations); `eta`: EMA weight of
    Eq. (4); `growth_intervals`: consecutive intervals of queue growth that mark saturation;
    `delay_threshold`: queueing delay (s) that marks saturation on its own; `scale_*`: the fixed
    per-term normalization of R^l, R^r (req/s), δ (workers) and E (µs/s); `prior_weight`: how many unit
    observations the initial α, β, γ are worth (it decays with ρ like any observation);
    `identifiability`: the smallest normalized determinant det(R)/(tr(R)/3)³ of the pooled observations
    for which α, β, γ are separately identified (below it the samples are collinear).
    """

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    capacity: float = DEFAULT_CAPACITY
    rho: float = 0.99
    eta: float = 0.05
    growth_intervals: int = 3
    delay_threshold: float = 0.1
    scale_local: float = 1000.0
    scale_remote: float = 1000.0
    scale_delta: float = 1.0
    scale_execution: float = 100000.0
    prior_weight: float = 1.0
    identifiability: float = 1e-6

    def __post_init__(self) -> None:
        if not 0 < self.rho <= 1:
            raise ValueError(f"rho must be in (0, 1], not {self.rho}")
        if not 0 < self.eta <= 1:
            raise ValueError(f"eta must be in (0, 1], not {self.eta}")
        if self.growth_intervals < 1:
            raise ValueError(f"growth_intervals must be at least 1, not {self.growth_intervals}")
        for name in ("alpha", "beta", "gamma"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be ≥ 0, not {getattr(self, name)}")
        for name in ("capacity", "scale_local", "scale_remote", "scale_delta", "scale_execution",
                     "prior_weight"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")


@dataclass(frozen=True)
class EstimatorUpdate:
    """What one interval's samples did to the estimate; `reason` says why, also when nothing changed."""

    alpha: float
    beta: float
    gamma: float
    capacity: float
    coefficients_changed: bool
    capacity_changed: bool
    saturated: tuple[Hashable, ...]
    observations: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.coefficients_changed or self.capacity_changed

    @property
    def model(self) -> CapacityModel:
        return CapacityModel(self.alpha, self.beta, self.gamma, self.capacity)


def _det3(m: list[list[float]]) -> float:
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Cramer's rule for the 1×1 to 3×3 SPD systems here (cheaper than elimination); None if singular."""
    n = len(b)
    if n == 1:
        return [b[0] / a[0][0]] if a[0][0] > 0 else None
    if n == 2:
        det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
        if not abs(det) > 1e-300:
            return None
        return [(b[0] * a[1][1] - a[0][1] * b[1]) / det, (a[0][0] * b[1] - b[0] * a[1][0]) / det]
    (a00, a01, a02), (a10, a11, a12), (a20, a21, a22) = a
    c00, c01, c02 = a11 * a22 - a12 * a21, a12 * a20 - a10 * a22, a10 * a21 - a11 * a20
    det = a00 * c00 + a01 * c01 + a02 * c02
    if not abs(det) > 1e-300:
        return None
    b0, b1, b2 = b
    return [(b0 * c00 + b1 * (a02 * a21 - a01 * a22) + b2 * (a01 * a12 - a02 * a11)) / det,
            (b0 * c01 + b1 * (a00 * a22 - a02 * a20) + b2 * (a02 * a10 - a00 * a12)) / det,
            (b0 * c02 + b1 * (a01 * a20 - a00 * a21) + b2 * (a00 * a11 - a01 * a10)) / det]


def _nonnegative_least_squares(a: list[list[float]], b: list[float]) -> list[float] | None:
    """argmin θᵀAθ − 2bᵀθ subject to θ ≥ 0, for SPD A of size 3: the subset of free variables meeting KKT."""
    n = len(b)
    full = _solve(a, b)
    if full is not None and all(v >= 0 for v in full):
        return full  # the common case: the unconstrained optimum is feasible
    for size in range(n - 1, -1, -1):
        for free in combinations(range(n), size):
            theta = [0.0] * n
            if free:
                sub = _solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
                if sub is None or any(v < 0 for v in sub):
                    continue
                for i, v in zip(free, sub, strict=True):
                    theta[i] = v
            gradient = [sum(a[i][j] * theta[j] for j in range(n)) - b[i] for i in range(n)]
            if all(gradient[i] >= -1e-12 * (abs(b[i]) + 1.0) for i in range(n) if i not in free):
                return theta
    return None


@dataclass
class _History:
    queues: deque
    saturated: WorkerSample | None = None  # the last sample to difference with (saturated or with `cpu`)


@dataclass
class Estimator:
    """Pooled RLS estimate of θ = [α, β, γ] and the EMA W̄, fed one sample per worker per interval."""

    config: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        c = self.config
        self.alpha, self.beta, self.gamma, self.capacity = c.alpha, c.beta, c.gamma, c.capacity
        self._scales = (c.scale_local, c.scale_remote, c.scale_delta)
        self._info = [[0.0] * 3 for _ in range(3)]
        self._moment = [0.0] * 3
        self._prior_decay = 1.0
        self._prior = [c.alpha * c.scale_local / c.scale_execution,
                       c.beta * c.scale_remote / c.scale_execution,
                       c.gamma * c.scale_delta / c.scale_execution]
        self._history: dict[Hashable, _History] = {}
        self.observations = 0

    @property
    def model(self) -> CapacityModel:
        return CapacityModel(self.alpha, self.beta, self.gamma, self.capacity)

    def is_saturated(self, worker: Hashable) -> bool:
        """Saturation from the history alone: the queue grew in each of the last `growth_intervals`."""
        h = self._history.get(worker)
        if h is None or len(h.queues) <= self.config.growth_intervals:
            return False
        q = list(h.queues)
        return all(q[i + 1] > q[i] for i in range(len(q) - 1))

    def _observe(self, previous: WorkerSample, sample: WorkerSample) -> bool:
        """Fold one differenced observation (Eq. 2) into the RLS information; False if it carries none."""
        sl, sr, sd = self._scales
        x = (-(sample.r_local - previous.r_local) / sl, -(sample.r_remote - previous.r_remote) / sr,
             -(sample.delta - previous.delta) / sd)
        if x[0] * x[0] + x[1] * x[1] + x[2] * x[2] <= 1e-18:
            return False
        y = sample.execution - previous.execution
        if sample.cpu is not None and previous.cpu is not None:
            y -= sample.cpu - previous.cpu  # ΔW measured: Eq. (2) without assuming the capacity constant
        y /= self.config.scale_execution
        rho = self.config.rho
        info, moment = self._info, self._moment
        for i in range(3):
            row = info[i]
            for j in range(3):
                row[j] = rho * row[j] + x[i] * x[j]
            moment[i] = rho * moment[i] + x[i] * y
        self._prior_decay *= rho
        self.observations += 1
        return True

    def _identified(self) -> bool:
        a = self._info
        trace = a[0][0] + a[1][1] + a[2][2]
        if not trace > 0:
            return False
        return _det3(a) / (trace / 3.0) ** 3 >= self.config.identifiability

    def _solve_coefficients(self) -> tuple[float, float, float] | None:
        c = self.config
        weight = c.prior_weight * self._prior_decay
        a = [[self._info[i][j] + (weight if i == j else 0.0) for j in range(3)] for i in range(3)]
        b = [self._moment[i] + weight * self._prior[i] for i in range(3)]
        theta = _nonnegative_least_squares(a, b)
        if theta is None:
            return None
        sl, sr, sd = self._scales
        out = (theta[0] * c.scale_execution / sl, theta[1] * c.scale_execution / sr,
               theta[2] * c.scale_execution / sd)
        return out if all(math.isfinite(v) and v >= 0 for v in out) else None

    def update(self, samples_by_worker: Mapping[Hashable, WorkerSample]) -> EstimatorUpdate:
        """Feed one interval's samples (one per worker); returns the estimate and what changed, and why."""
        c = self.config
        for w in [w for w in self._history if w not in samples_by_worker]:
            del self._history[w]  # a worker that missed an interval starts its history afresh
        saturated: list[tuple[Hashable, WorkerSample]] = []
        observed = flat = invalid = 0
        for w, sample in samples_by_worker.items():
            if not isinstance(sample, WorkerSample) or not sample.valid():
                invalid += 1
                self._history.pop(w, None)
                continue
            h = self._history.get(w)
            if h is None:
                h = self._history[w] = _History(deque(maxlen=c.growth_intervals + 1))
            h.queues.append(sample.queue_length)
            is_saturated = sample.busy or self.is_saturated(w) or sample.queueing_delay > c.delay_threshold
            measured = sample.cpu is not None
            if is_saturated:
                saturated.append((w, sample))
            if is_saturated or measured:
                previous = h.saturated
                if previous is not None and (previous.cpu is not None) == measured:
                    if self._observe(previous, sample):
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
        if not saturated and not observed and not flat:
            reasons.append("no saturated worker: estimate unchanged")
        elif not observed:
            reasons.append("consecutive samples with unchanged R^l, R^r, δ: α, β, γ unchanged"
                           if flat else "no previous saturated sample to difference with: α, β, γ unchanged")
        elif not self._identified():
            reasons.append("collinear observations do not identify α, β, γ separately: unchanged")
        else:
            theta = self._solve_coefficients()
            if theta is None:
                reasons.append("regression has no non-negative finite solution: α, β, γ unchanged")
            else:
                coefficients_changed = theta != (self.alpha, self.beta, self.gamma)
                self.alpha, self.beta, self.gamma = theta

        capacity_changed = False
        for _, s in saturated:
            w_hat = worker_capacity(s.execution, s.r_local, s.r_remote, s.delta,
                                    self.alpha, self.beta, self.gamma)
            if math.isfinite(w_hat) and w_hat > 0:
                new = (1.0 - c.eta) * self.capacity + c.eta * w_hat
                capacity_changed = capacity_changed or new != self.capacity
                self.capacity = new
        if saturated and not capacity_changed:
            reasons.append("saturated samples give no positive Ŵ: W̄ unchanged")
        if not reasons:
            reasons.append(f"updated from {len(saturated)} saturated worker(s), {observed} observation(s)")
        return EstimatorUpdate(self.alpha, self.beta, self.gamma, self.capacity, coefficients_changed,
                               capacity_changed, tuple(w for w, _ in saturated), observed, "; ".join(reasons))
