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
Eq. (1) does not model. A remote request is paid for at both ends: when the worker reports the remote
requests it received, the regressor for β is the mean of sent and received (Eq. (1) counts sent ones only,
which on a worker that mostly receives, such as the owner of Word Count's hot key, leaves the receiving
half unexplained). W̄ comes from saturated samples as before (Eq. 3–4).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

from clasp.core.model import (
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
    worker used (µs/s), when it measured it (None: unknown, the paper's setting); `r_received`: remote
    chained requests it received from other workers per second (None: not reported).
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

    def valid(self) -> bool:
        values = (self.queue_length, self.queueing_delay, self.execution, self.r_local, self.r_remote,
                  self.delta) + tuple(v for v in (self.cpu, self.r_received) if v is not None)
        return all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in values)


@dataclass(frozen=True)
class EstimatorConfig:
    """Estimator settings. Initial values are the paper's converged ones (Faasm, ~400 µs operators).

    `rho`: RLS forgetting factor per observation (memory ≈ 1/(1−ρ) observations); `eta`: EMA weight of
    Eq. (4); `growth_intervals`: consecutive intervals of queue growth that mark saturation;
    `delay_threshold`: queueing delay (s) that marks saturation on its own; `scale_*`: the fixed
    per-term normalization of R^l, R^r (req/s), δ (workers) and E (µs/s); `prior_weight`: how many unit
    observations the initial α, β, γ are worth (it decays with ρ like any observation);
    `identifiability`: the smallest determinant of the pooled observations' correlation matrix,
    det(R)/Π R_ii, for which α, β, γ are separately identified (below it the samples are collinear).
    """

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    capacity: float = DEFAULT_CAPACITY
    # The extended model's priors (clasp.core.model): the share of β a receiver pays, µs per message, and the
    # engine's flush delay. 0 and 0: the paper's model, β all at the sender.
    receive_share: float = 0.0
    mu: float = 0.0
    flush_delay: float = 0.001
    alpha_split: float | None = None
    rho: float = 0.99
    eta: float = 0.05
    growth_intervals: int = 3
    delay_threshold: float = 0.1
    scale_local: float = 1000.0
    scale_remote: float = 1000.0
    scale_delta: float = 1.0
    scale_execution: float = 100000.0
    prior_weight: float = 1.0
    identifiability: float = 1e-3

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


def _eliminate(a: list[list[float]], b: list[float]) -> tuple[list[float] | None, float]:
    """Gaussian elimination with partial pivoting on these ≤ 3×3 systems: (solution or None, determinant)."""
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
    """argmin θᵀAθ − 2bᵀθ subject to θ ≥ 0, for SPD A of size ≤ 3: the subset of free variables meeting KKT."""
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


def _remote(sample: WorkerSample) -> float:
    """The remote requests a worker pays β for. A remote request costs its sender and its receiver (packing;
    unpacking and queueing) about equally: with receipts reported each end counts half a request, so β
    stays the whole cost of one remote request, what Eq. (1) and (8) charge, whichever worker pays which
    half; without them, the requests sent (Eq. 1)."""
    return sample.r_remote if sample.r_received is None else (sample.r_remote + sample.r_received) / 2


@dataclass
class _History:
    queues: deque
    saturated: WorkerSample | None = None


@dataclass
class Estimator:
    """Pooled RLS estimate of θ = [α, β, γ] and the EMA W̄, fed one sample per worker per interval."""

    config: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        c = self.config
        self.alpha, self.beta, self.gamma, self.capacity = c.alpha, c.beta, c.gamma, c.capacity
        self._scales = (c.scale_local, c.scale_remote, c.scale_delta, c.scale_execution)
        self._info = [[0.0] * 3 for _ in range(3)]  # RLS information over θ = [α, β, γ] (scaled)
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

    def _fold(self, x: tuple[float, float, float], y: float) -> None:
        """R ← ρR + xxᵀ, r ← ρr + xy."""
        rho = self.config.rho
        info, moment = self._info, self._moment
        for i in range(3):
            row = info[i]
            for j in range(3):
                row[j] = rho * row[j] + x[i] * x[j]
            moment[i] = rho * moment[i] + x[i] * y
        self._prior_decay *= rho
        self.observations += 1

    def _observe(self, previous: WorkerSample, sample: WorkerSample) -> bool:
        """Fold one differenced observation (Eq. 2) into the RLS information; False if it carries none."""
        sl, sr, sd, se = self._scales
        x = (-(sample.r_local - previous.r_local) / sl, -(sample.r_remote - previous.r_remote) / sr,
             -(sample.delta - previous.delta) / sd)
        if x[0] * x[0] + x[1] * x[1] + x[2] * x[2] <= 1e-18:
            return False
        self._fold(x, (sample.execution - previous.execution) / se)
        return True

    def _observe_measured(self, sample: WorkerSample) -> bool:
        """Fold one measured sample, U − E = αR^l + βR^r + γδ; False for a worker that sent nothing."""
        sl, sr, sd, se = self._scales
        remote = _remote(sample)
        if sample.r_local <= 0 and remote <= 0:
            return False
        self._fold((sample.r_local / sl, remote / sr, sample.delta / sd), (sample.cpu - sample.execution) / se)
        return True

    def _free(self) -> list[int]:
        """The coefficients the observations bear on: those whose regressor was ever non-zero (a worker
        with δ = 0 in every sample says nothing of γ, which keeps its value)."""
        return [i for i in range(3) if self._info[i][i] > 1e-300]

    def _identified(self) -> bool:
        """Some regressor was non-zero, and the correlation matrix of those that were is far enough from
        singular (scale-free, in (0, 1]): regressors that only move together identify only their sum."""
        free = self._free()
        if not free:
            return False
        a = [[self._info[i][j] for j in free] for i in free]
        _, det = _eliminate(a, [0.0] * len(free))
        return det / math.prod(self._info[i][i] for i in free) >= self.config.identifiability

    def _solve_coefficients(self) -> tuple[float, float, float] | None:
        c = self.config
        sl, sr, sd, se = self._scales
        current = [self.alpha * sl / se, self.beta * sr / se, self.gamma * sd / se]
        weight = c.prior_weight * self._prior_decay
        # A held coefficient's regressor was 0 in every observation, so (R being positive semi-definite)
        # its row and column of R are 0 too: the free ones are solved on their own.
        free = self._free()
        a = [[self._info[i][j] + (weight if i == j else 0.0) for j in free] for i in free]
        b = [self._moment[i] + weight * self._prior[i] for i in free]
        solved = _nonnegative_least_squares(a, b)
        if solved is None:
            return None
        theta = list(current)
        for i, v in zip(free, solved, strict=True):
            theta[i] = v
        out = (theta[0] * se / sl, theta[1] * se / sr, theta[2] * se / sd)
        return out if all(math.isfinite(v) and v >= 0 for v in out) else None

    def update(self, samples_by_worker: Mapping[Hashable, WorkerSample]) -> EstimatorUpdate:
        """Feed one interval's samples (one per worker); returns the estimate and what changed, and why."""
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
        if not saturated:
            reasons.append("no saturated worker: estimate unchanged")
        elif not observed:
            reasons.append("consecutive saturated samples with unchanged R^l, R^r, δ: α, β, γ unchanged" if flat
                           else "saturated workers did no work: α, β, γ unchanged" if idle
                           else "no previous saturated sample to difference with: α, β, γ unchanged")
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
            w_hat = worker_capacity(s.execution, s.r_local, _remote(s), s.delta, self.alpha, self.beta, self.gamma)
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
