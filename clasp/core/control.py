"""The planner's monitor–predict–place cycle as pure code: observations in, decisions out (no clock).

Each planner tick gives the `Controller` one `Observation` of a job. It feeds the estimator, checks
the scaling triggers of paper §5.1.1 (input rate changed consistently for 2 s; throughput trailing the
input for 3 s; a warm-up of 10,000 requests first) and, when one fires, asks the policy. The planner
carries a change out with the migration protocol and tells the controller with `placed()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from clasp.core.dag import DagSpec
from clasp.core.estimator import Estimator, EstimatorConfig, EstimatorUpdate, WorkerSample
from clasp.core.placement import NoPlacementError, topological_order
from clasp.core.policies.base import (
    Decision,
    EdgeStats,
    OperatorStats,
    PlacementResult,
    Policy,
    Stats,
    uniform_placement,
)
from clasp.core.routing import NUM_KEY_GROUPS, OperatorPlacement, Placement, key_groups_for_shares

# This runtime's own cost coefficients, measured by `python -m clasp.bench.runtime` on the 2-core machine
# (docs/RUNTIME.md): µs per local / remote chained request, µs/s per remote destination, and the
# µs/s of operator work one single-threaded worker process sustains. The estimator refines them online.
RUNTIME_ALPHA = 1.3
RUNTIME_CAPACITY = 800000.0
# The extended model's priors, from `clasp.bench.calibrate` on this machine (docs/POLICY.md, "Extended model"):
# β (sender and receiver together; `bench.runtime`'s 7.0 counted the messages too), γ 0 (with the messages
# priced, a destination costs its messages), the receiver's share of β, µs per data message at either end,
# and the CPU seconds a saturated sender takes per batch to one peer (the flush delay is 1 ms of wall time).
RUNTIME_BETA = 1.73
RUNTIME_GAMMA = 0.0
RUNTIME_RECEIVE_SHARE = 0.5
RUNTIME_MU = 120.0
RUNTIME_FLUSH_DELAY = 0.00184


def runtime_estimator_config(**overrides) -> EstimatorConfig:
    """The estimator's configuration with this runtime's measured initial values."""
    base = {"alpha": RUNTIME_ALPHA, "beta": RUNTIME_BETA, "gamma": RUNTIME_GAMMA, "capacity": RUNTIME_CAPACITY,
            "receive_share": RUNTIME_RECEIVE_SHARE, "mu": RUNTIME_MU, "flush_delay": RUNTIME_FLUSH_DELAY,
            "scale_local": 100000.0, "scale_remote": 50000.0}
    return EstimatorConfig(**{**base, **overrides})


@dataclass
class ControlConfig:
    """Trigger settings (paper §5.1.1): `rate_change` is the relative change of the input rate that
    counts; it must hold `rate_seconds` ticks in one direction. Throughput below (1 − `lag_tolerance`)
    of the input rate, or a planner queue that does not shrink, for `lag_seconds` ticks is a lag.
    `cooldown_seconds` after a migration let the metrics settle. A job with no input, no throughput and
    no queue for `idle_seconds` (0: never) gives back all but one worker. `drain_seconds` (off by default) adds
    the rate that drains the planner's backlog in that time to the rate planned for; on workers that
    share cores it over-provisions, since more workers then do not mean more capacity."""

    warmup_requests: int = 10_000
    idle_seconds: int = 10
    rate_change: float = 0.15
    rate_seconds: int = 2
    lag_seconds: int = 3
    lag_tolerance: float = 0.05
    cooldown_seconds: int = 2
    drain_seconds: float | None = None


@dataclass
class Observation:
    """One tick of one job: planner rates (λ_p, Λ, Q_p), aggregated operator and edge rates, and the
    Table 2 sample of every active worker."""

    input_rate: float
    throughput: float
    completed: int
    queued: int
    operators: dict[str, OperatorStats]
    edges: dict[tuple[str, str], float]
    workers: dict[str, WorkerSample]
    active: int
    instances: int
    # The worker ids behind policy indices 0..n-1 (`pool_order`); None: the indices are the ids (simulator).
    pool: list | None = None


@dataclass
class ControlStep:
    """What one observation did: the estimator's update, and the policy's decision if it was asked."""

    estimate: EstimatorUpdate
    trigger: str | None = None
    decision: Decision | None = None


SOLVE_EVERY = 10  # observations (ticks) between the estimator's solves while a job does not autoscale


@dataclass
class Controller:
    """Triggers, estimator and policy for one job."""

    operators: list[str]
    edges: list[tuple[str, str]]
    policy: Policy
    p_max: int
    pool: int
    config: ControlConfig = field(default_factory=ControlConfig)
    estimator: Estimator = field(default_factory=lambda: Estimator(runtime_estimator_config()))
    stateless: tuple[str, ...] = ()  # operators whose local requests can take the table route
    keyed: tuple[str, ...] = ()  # operators whose requests take the keyed table route off their owner
    local_first: bool = False  # the runtime routes requests into the stateless operators local first
    current: PlacementResult | None = None
    last: Observation | None = None
    rate_ref: float | None = None
    _up: int = 0
    _down: int = 0
    _lag: int = 0
    _cooldown: int = 0
    _last_queue: int = 0
    _idle: int = 0
    _unsolved_ticks: int = 0

    def observe(self, obs: Observation, decide: bool = True) -> ControlStep:
        """Feed the estimator; with `decide`, check the triggers and ask the policy when one fires. Without
        (autoscaling off), the estimator solves its regression only every SOLVE_EVERY observations: its
        estimate is then only shown (`job.stats()`), and the solve was most of a tick's cost."""
        self._unsolved_ticks += 1
        solve = decide or self._unsolved_ticks >= SOLVE_EVERY
        if solve:
            self._unsolved_ticks = 0
        estimate = self.estimator.update(obs.workers, solve=solve)
        step = ControlStep(estimate)
        self.last = obs
        if not decide:
            return step
        trigger = self._trigger(obs)
        if trigger is None:
            return self._consolidate(obs, step)
        step.trigger = trigger
        step.decision = self.policy.decide(self.operators, self.edges, self.current, self.stats(obs),
                                           max_workers=self.pool)
        d = step.decision
        lagging = obs.throughput < (1 - self.config.lag_tolerance) * obs.input_rate
        if d.change and lagging and d.placement is not None and d.placement.workers < obs.active:
            # A worker-limit placement at the highest rate that fits may need fewer workers than run now;
            # a job that cannot keep up is not scaled in.
            step.decision = Decision.no_change(f"{d.reason}: not scaling in from {obs.active} workers while the "
                                               "throughput trails the input")
        self._reset(obs)
        return step

    def _consolidate(self, obs: Observation, step: ControlStep) -> ControlStep:
        """An idle job has no rates to plan from; after `idle_seconds` it goes back to one worker."""
        idle = obs.input_rate == 0 and obs.throughput == 0 and obs.queued == 0 and obs.active > 1
        self._idle = self._idle + 1 if idle and obs.completed >= self.config.warmup_requests else 0
        if not self.config.idle_seconds or self._idle < self.config.idle_seconds:
            return step
        self._idle = 0
        step.trigger = f"no input for {self.config.idle_seconds} s on {obs.active} workers"
        step.decision = Decision(self.place_on(1), "an idle job keeps one worker")
        return step

    def _reset(self, obs: Observation) -> None:
        self.rate_ref = obs.input_rate
        self._up = self._down = self._lag = 0

    def _trigger(self, obs: Observation) -> str | None:
        c = self.config
        backlog_growing = obs.queued > 0 and obs.queued >= self._last_queue
        self._last_queue = obs.queued
        if obs.completed < c.warmup_requests:
            return None
        if self._cooldown > 0:
            # The rate reference stays the rate the last decision planned for: a change of the input
            # during the cooldown is still a change afterwards (resetting it here swallowed a drop that
            # came while a backlog drained, and the job kept every worker).
            self._cooldown -= 1
            self._up = self._down = self._lag = 0
            return None
        if self.rate_ref is None:
            self.rate_ref = obs.input_rate
        ref = self.rate_ref
        if obs.input_rate > ref * (1 + c.rate_change) and obs.input_rate - ref > 1.0:
            self._up, self._down = self._up + 1, 0
        elif obs.input_rate < ref * (1 - c.rate_change):
            self._up, self._down = 0, self._down + 1
        else:
            self._up = self._down = 0
        lagging = obs.throughput < (1 - c.lag_tolerance) * obs.input_rate or backlog_growing
        self._lag = self._lag + 1 if lagging else 0
        if self._up >= c.rate_seconds or self._down >= c.rate_seconds:
            return (f"input rate changed from {ref:.0f} to {obs.input_rate:.0f} req/s for "
                    f"{max(self._up, self._down)} s")
        if self._lag >= c.lag_seconds:
            return (f"throughput {obs.throughput:.0f} req/s trailed the input {obs.input_rate:.0f} req/s "
                    f"(planner queue {obs.queued}) for {self._lag} s")
        return None

    def stats(self, obs: Observation) -> Stats:
        """The policy's view: observed rates, the estimate, and the rate to plan for (λ_p, plus what
        drains the planner's backlog in `drain_seconds`, when that is configured)."""
        target = obs.input_rate
        if self.config.drain_seconds and obs.queued > 0 and obs.throughput > 0:
            target = max(target, obs.throughput) + obs.queued / self.config.drain_seconds
        e = self.estimator
        operators, edges = steady_rates(self.operators, self.edges, obs.operators, obs.edges, obs.throughput)
        pool = obs.pool if obs.pool is not None else range(self.pool)
        # W_w per policy index: only where the estimator knows workers apart (one W̄ for all otherwise keeps
        # the policy on the paper's single capacity).
        capacities = [e.capacity_of(w) for w in pool]
        capacity = e.capacity
        if len(set(capacities)) <= 1:
            # Equal workers: their one W_w is W̄, also for workers a provider starts (like the ones there:
            # e.g. the same CPU quota), which the policy may plan for beyond the pool's live workers.
            capacity = capacities[0] if capacities else capacity
            capacities = None
        return Stats(operators, [EdgeStats(s, d, r) for (s, d), r in edges.items()],
                     e.alpha, e.beta, e.gamma, capacity, obs.throughput, target, self.p_max,
                     max(obs.instances, 1), max(obs.active, 1), beta_receive=e.beta_receive, mu=e.mu,
                     flush_delay=e.flush_delay, capacities=capacities, alpha_split=e.config.alpha_split,
                     alpha_keyed=e.config.alpha_keyed, keyed=list(self.keyed), beta_split=e.config.beta_split,
                     stateless=list(self.stateless), flush_peer_factor=e.config.flush_peer_factor,
                     local_first=self.local_first)

    def place_on(self, workers: int, pool: list | None = None) -> PlacementResult:
        """The policy's placement for `workers` workers (`Policy.place_on`), from the latest observation;
        `pool`: the worker ids behind the policy's indices now, if they changed since."""
        obs = self.last
        if obs is None:
            obs = Observation(0.0, 0.0, 0, 0, {o: OperatorStats(0.0, 0.0) for o in self.operators}, {}, {}, 1, 0)
        if pool is not None:
            obs = replace(obs, pool=pool)
        try:
            return self.policy.place_on(self.operators, self.edges, self.stats(obs), workers)
        except NoPlacementError as exc:
            # The baselines cannot place without a throughput to scale from (an idle job has none).
            return uniform_placement(self.operators, self.edges, workers, self.p_max, self.estimator.capacity,
                                     f"{exc}: operators spread evenly", self.policy.name)

    def placed(self, result: PlacementResult) -> None:
        """A placement was carried out: it is the current one; let the metrics settle."""
        self.current = result
        self._cooldown = self.config.cooldown_seconds


def steady_rates(operators: Sequence[str], edges: Sequence[tuple[str, str]], observed: Mapping[str, OperatorStats],
                 edge_rates: Mapping[tuple[str, str], float], throughput: float,
                 ) -> tuple[dict[str, OperatorStats], dict[tuple[str, str], float]]:
    """The N_o and E[o→o_s] of a steady state at throughput Λ, for Eq. (5)-(7): every record enters each
    source once, and each operator's requests per record follow from the observed fan-outs E[o→o_s]/N_o.
    In a steady state these are the observed rates. While queues fill or drain (after a start, a rate
    change or a re-placement) downstream operators lag their sources and Λ, the completions, lags them all:
    the raw rates over Λ overstate the demand per record (×1.5 for Word Count filling its window), and a
    policy planning from them over-provisions. Unobserved fan-outs leave the observation unchanged."""
    preds: dict[str, list[str]] = {o: [] for o in operators}
    for s, d in edges:
        preds[d].append(s)
    per_record: dict[str, float] = {}
    for o in topological_order(operators, edges):
        if not preds[o]:
            per_record[o] = 1.0
            continue
        total = 0.0
        for p in preds[o]:
            n = observed.get(p, OperatorStats(0.0, 0.0)).rate
            if not n > 0:
                return dict(observed), dict(edge_rates)
            total += per_record[p] * edge_rates.get((p, o), 0.0) / n
        per_record[o] = total
    if not throughput > 0:
        return dict(observed), dict(edge_rates)
    ops = {o: OperatorStats(per_record[o] * throughput, observed[o].tau_us if o in observed else 0.0)
           for o in operators}
    out = {(s, d): ops[s].rate * edge_rates.get((s, d), 0.0) / observed[s].rate for s, d in edges
           if (s, d) in edge_rates}
    return ops, out


def pool_order(previous: Placement | None, alive: Sequence[str],
               cpus: Mapping[str, float | None] | None = None) -> list[str]:
    """Workers for policy indices 0..n-1: the larger CPU allowances first (next-fit fills index 0 first,
    so an unequal pool is packed onto its largest workers), and among equal ones those active now first
    (they keep their state), then the rest. Allowances, not estimated W_w, order the pool: estimates
    differ by noise between equal workers, and reordering on noise would move state for nothing."""
    active = [w for w in (previous.active_workers() if previous else []) if w in alive]
    order = active + [w for w in alive if w not in active]
    if not cpus:
        return order
    return sorted(order, key=lambda w: -(cpus.get(w) or 0.0))


KEY_WEIGHT_SMOOTHING = 0.2  # EMA weight of one tick's key-group request rates


def key_weights(spec: DagSpec, samples: Mapping[str, dict], job: int,
                previous: Mapping[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Each stateful operator's requests per second per key group, summed over the workers that route to
    it (their heartbeats' `key_groups`) and smoothed over ticks; an operator no worker routed to this
    tick keeps its previous weights. Malformed entries are skipped (a heartbeat is untrusted input)."""
    stateful = {o.name for o in spec.operators if o.stateful}
    sums: dict[str, list[float]] = {}
    for sample in samples.values():
        js = ((sample or {}).get("jobs") or {}).get(job) or {}
        groups = js.get("key_groups") if isinstance(js, dict) else None
        if not isinstance(groups, dict):
            continue
        for op, per in groups.items():
            if op not in stateful or not isinstance(per, dict):
                continue
            row = sums.setdefault(op, [0.0] * NUM_KEY_GROUPS)
            for g, r in per.items():
                if isinstance(g, int) and 0 <= g < NUM_KEY_GROUPS and _number(r) is not None and r >= 0:
                    row[g] += r
    out = {op: list(v) for op, v in (previous or {}).items() if op in stateful}
    for op, row in sums.items():
        old = out.get(op)
        out[op] = row if old is None else [(1 - KEY_WEIGHT_SMOOTHING) * a + KEY_WEIGHT_SMOOTHING * b
                                           for a, b in zip(old, row, strict=True)]
    return out


def to_runtime_placement(spec: DagSpec, result: PlacementResult, pool: Sequence[str],
                         previous: Placement | None, epoch: int,
                         weights: Mapping[str, Sequence[float]] | None = None) -> Placement:
    """A policy's PlacementResult (worker indices) as the runtime's Placement (worker ids), with
    key-group ownership that moves as few groups as possible from `previous`, by the groups' measured
    request `weights` where known (so each owner's requests follow its share)."""
    if result.workers > len(pool):
        raise ValueError(f"placement needs {result.workers} workers, the pool has {len(pool)}")
    ops: dict[str, OperatorPlacement] = {}
    for o in spec.operators:
        fractions = {pool[i]: f for i, f in result.fractions.get(o.name, {}).items() if f > 0}
        if not fractions:
            fractions = {pool[0]: 1.0}  # an operator the policy saw no demand for still has to run somewhere
        total = sum(fractions.values())
        shares = {w: f / total for w, f in fractions.items()}
        par = result.parallelism.get(o.name, {})
        instances = {w: max(1, int(par.get(pool.index(w), 1))) for w in shares}
        kg = None
        if o.stateful:
            prev = previous.operators[o.name].key_groups if previous else None
            kg = key_groups_for_shares(shares, NUM_KEY_GROUPS, prev, (weights or {}).get(o.name))
        ops[o.name] = OperatorPlacement(shares, instances, kg)
    return Placement(ops, epoch, list(pool))


def _number(v) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def observation(spec: DagSpec, samples: Mapping[str, dict], job: int, input_rate: float, throughput: float,
                completed: int, queued: int, placement: Placement, pool: list | None = None) -> Observation:
    """Aggregate the heartbeat samples of a job's active workers into one Observation."""
    rates: dict[str, float] = {o.name: 0.0 for o in spec.operators}
    busy: dict[str, float] = dict.fromkeys(rates, 0.0)
    edges: dict[tuple[str, str], float] = {}
    workers: dict[str, WorkerSample] = {}
    active = placement.active_workers()
    for wid in active:
        sample = samples.get(wid) or {}
        js = (sample.get("jobs") or {}).get(job)
        if not js:
            continue
        for name, o in js["operators"].items():
            if name in rates:
                rates[name] += o["rate"]
                busy[name] += o["rate"] * o["tau_us"]
        for e in js["edges"]:
            key = (e["src"], e["dst"])
            edges[key] = edges.get(key, 0.0) + e["rate"]
        # A worker that worked and never waited for work, or that used all its CPU, was saturated (one that
        # waited all along, blocked since before the interval, reports no idle wait either); older workers
        # report neither. Its CPU time is this job's only when it runs no other job.
        cpu = sample.get("cpu_us") if len(sample.get("jobs") or ()) == 1 else None
        never_waited = sample.get("idle_waits") == 0 and js["exec_us"] > 0
        msgs = js.get("messages") if isinstance(js.get("messages"), dict) else {}
        workers[wid] = WorkerSample(js["queue"], js["queue_delay"], js["exec_us"], js["r_local"], js["r_remote"],
                                    sample.get("delta", 0), busy=never_waited or sample.get("cpu_bound") is True,
                                    cpu=_number(cpu), r_received=_number(js.get("r_in")),
                                    messages_out=_number(msgs.get("sent")), messages_in=_number(msgs.get("received")),
                                    cpus=_number(sample.get("cpus")))
    operators = {n: OperatorStats(rates[n], busy[n] / rates[n] if rates[n] > 0 else 0.0) for n in rates}
    instances = sum(sum(p.instances.values()) for p in placement.operators.values())
    return Observation(input_rate, throughput, completed, queued, operators, edges, workers, len(active), instances,
                       pool)


# ----------------------------------------------------------------- key groups rebalanced by measured load
@dataclass
class RebalanceConfig:
    """When the key groups of a stateful operator move to even out its owners' measured loads (autoscaling
    on or off; the shares σ stay as they are). `margin`: the busiest owner's part of the operator's requests
    over its share σ_o(w) by this much, relative (0.2: 60 % where σ is 50 %), counts as skewed; it must hold
    for `persist` ticks in a row, on weights seen for at least that many ticks, with at least `min_rate`
    requests/s (an idle job's weights are noise). A new ownership is only taken when it removes at least
    `gain` of the excess (a single hot group larger than a share cannot be split: moving it around gains
    nothing). `cooldown`: ticks after any placement change before the next decision."""

    margin: float = 0.2
    persist: int = 3
    min_rate: float = 100.0
    gain: float = 0.5
    cooldown: int = 5


def keyed_excess(shares: Mapping[str, float], owners: Sequence[str], weights: Sequence[float]) -> tuple[str, float]:
    """The busiest owner of a stateful operator's key groups and by how much its part of the measured
    `weights` exceeds its share (relative: 0.5 is half as much again as σ_o(w)); ('', 0.0) without weight."""
    total_share = sum(s for s in shares.values() if s > 0)
    total = sum(weights)
    if total <= 0 or total_share <= 0:
        return "", 0.0
    load: dict[str, float] = {}
    for w, x in zip(owners, weights, strict=True):
        load[w] = load.get(w, 0.0) + x
    worst, excess = "", 0.0
    for w in sorted(load):
        share = shares.get(w, 0.0) / total_share
        over = load[w] / total / share - 1 if share > 0 else float("inf")
        if not worst or over > excess:
            worst, excess = w, over
    return worst, excess


def skewed(spec: DagSpec, placement: Placement, weights: Mapping[str, Sequence[float]],
           config: RebalanceConfig) -> list[tuple[str, str, float]]:
    """(operator, busiest owner, its excess) of every stateful operator whose busiest owner is over its
    share by more than the margin, on weights of at least `min_rate` requests/s."""
    out = []
    for o in spec.operators:
        w = weights.get(o.name)
        if not o.stateful or w is None or len(w) != NUM_KEY_GROUPS or sum(w) < config.min_rate:
            continue
        p = placement.operators[o.name]
        worst, excess = keyed_excess(p.shares, p.key_groups, w)
        if excess > config.margin:
            out.append((o.name, worst, excess))
    return out


def rebalance(spec: DagSpec, placement: Placement, weights: Mapping[str, Sequence[float]],
              config: RebalanceConfig = RebalanceConfig()) -> tuple[Placement, str] | None:
    """The key groups of every skewed stateful operator (`skewed`) re-owned by their measured `weights` with
    the fewest moves (`key_groups_for_shares`), at the next epoch, and why; None when none is skewed or no
    new ownership removes `gain` of its excess."""
    ops = dict(placement.operators)
    reasons = []
    for name, worst, excess in skewed(spec, placement, weights, config):
        p, w = placement.operators[name], weights[name]
        owners = key_groups_for_shares(p.shares, NUM_KEY_GROUPS, p.key_groups, w)
        after = keyed_excess(p.shares, owners, w)[1]
        if after > excess * (1 - config.gain):
            continue
        ops[name] = OperatorPlacement(dict(p.shares), dict(p.instances), owners)
        moved = sum(1 for a, b in zip(p.key_groups, owners, strict=True) if a != b)
        reasons.append(f"{name}: worker {worst} had {excess:.0%} over its share, {after:.0%} at most after "
                       f"moving {moved} key groups")
    if not reasons:
        return None
    return (Placement(ops, placement.epoch + 1, list(placement.workers)),
            "key groups rebalanced by measured load (" + "; ".join(reasons) + ")")


@dataclass
class Rebalancer:
    """One job's key-group rebalancing over control ticks: `rebalance` once an operator has been skewed for
    `persist` ticks in a row, never while the job is held (migrating, checkpointing: the tick is skipped,
    not counted), and not within `cooldown` ticks of a placement change (any: a rebalance, the autoscaler's,
    a recovery; seen as a new epoch)."""

    config: RebalanceConfig = field(default_factory=RebalanceConfig)
    epoch: int | None = None
    _over: int = 0
    _cooldown: int = 0

    def tick(self, spec: DagSpec, placement: Placement, weights: Mapping[str, Sequence[float]],
             migrating: bool) -> tuple[Placement, str] | None:
        """One control tick: the placement to migrate to and why, or None."""
        c = self.config
        if self.epoch != placement.epoch:
            if self.epoch is not None:
                self._cooldown = c.cooldown
            self.epoch, self._over = placement.epoch, 0
        if migrating:  # nothing now; the skew seen so far still counts (a new epoch starts it over)
            return None
        if self._cooldown > 0:
            self._cooldown -= 1
            return None
        if not skewed(spec, placement, weights, c):
            self._over = 0
            return None
        self._over += 1
        if self._over < c.persist:
            return None
        self._over = 0
        return rebalance(spec, placement, weights, c)
