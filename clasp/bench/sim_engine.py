"""The simulator side of the figure harness (`clasp bench FIG --engine sim`).

Every method answers one kind of experiment point of SPEC.md "Experiments" with `clasp.sim.simulator`, which
runs the real policies, estimator and control loop. The emulated cluster answers the same questions in
`clasp/bench/cluster_engine.py`; `clasp/bench/figures.py` is written once against both.

Placements for a policy on a fixed number of workers come from `policy_placement`: the app observed for a
few simulated seconds on one saturated worker, fed to a `Controller` (its estimator starting from the cost
file's α, β, γ, W), then `Controller.place_on(n)`. The cluster engine runs the same placements, so both
engines measure one placement per point.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from clasp.apps import get_app
from clasp.core.control import ControlConfig, Controller
from clasp.core.policies import POLICIES, PlacementResult, uniform_placement
from clasp.core.profiles import Profile
from clasp.sim.simulator import Costs, SimConfig, SimDag, Simulator, app_dag, make_controller

# Simulated seconds per point. Steps are 5 ms; 10 workers x 10 s take about 0.1 s of wall time.
SECONDS = {"quick": 6.0, "full": 20.0}
PROFILE_SECONDS = 5.0  # the one-worker observation placements are planned from
# Autoscaled runs (Fig. 14) plan for the input rate plus what drains the planner's backlog in this many seconds
# (`ControlConfig.drain_seconds`, every policy alike): a placement sized for exactly the input rate never
# works off the backlog that builds up while the triggers wait, and latency would stay at seconds.
DRAIN_SECONDS = 5.0


def warmup_requests(rate: float) -> int:
    """The control loop's warm-up (10,000 requests, §5.1.1), cut to 2 s of input at low rates: with the
    paper's ~400 µs operators a 10% input level is ~100 records/s and 10,000 requests would be minutes."""
    return int(min(10_000, max(200.0, 2.0 * rate)))


@dataclass
class SimEngine:
    """`costs`: the cost file's coefficients; `quick`: shorter simulated runs."""

    costs: Costs
    quick: bool = False
    source: str = ""
    name: str = "sim"
    _dags: dict[str, SimDag] = field(default_factory=dict)
    _profiles: dict[str, Controller] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return SECONDS["quick" if self.quick else "full"]

    def dag(self, app: str) -> SimDag:
        if app not in self._dags:
            self._dags[app] = app_dag(get_app(app), self.costs)
        return self._dags[app]

    def _config(self, duration: float | None = None, **kw) -> SimConfig:
        return SimConfig(duration=duration or self.seconds, warmup=min(2.0, (duration or self.seconds) / 3), **kw)

    def policy_placement(self, app: str, policy: str, workers: int) -> PlacementResult:
        """`policy`'s placement of `app` on exactly `workers` workers, planned from one saturated worker."""
        if app not in self._profiles:
            dag = self.dag(app)
            ctl = make_controller(dag, self.costs, "clasp", workers)
            run = Simulator(dag, self.costs, 1, config=self._config(PROFILE_SECONDS)).run()
            for s in run.seconds[1:]:
                ctl.observe(s.observation, decide=False)
            self._profiles[app] = ctl
        ctl = self._profiles[app]
        ctl.policy = POLICIES[policy]()
        # Unthrottled, the input is whatever the workers take: plan for `workers` times the one-worker rate
        # (Zhang24 sizes its instances for the input rate; CLASP and FaaSFlow plan from the throughput).
        one = ctl.last
        ctl.last = dataclasses.replace(one, input_rate=one.throughput * workers)
        try:
            return ctl.place_on(workers)
        finally:
            ctl.last = one

    def unthrottled(self, app: str, workers: int, placement: PlacementResult | None = None) -> dict:
        """Input as fast as the planner admits it, on `workers` workers under `placement` (None: spread)."""
        r = Simulator(self.dag(app), self.costs, workers, placement=placement, config=self._config()).run()
        return {"throughput": r.throughput, "latency": r.latency, "workers": r.workers}

    def fixed_rate(self, app: str, workers: int, rate: float, placement: PlacementResult | None = None) -> dict:
        """Input at `rate` records/s."""
        r = Simulator(self.dag(app), self.costs, workers, rate=rate, placement=placement,
                      config=self._config()).run()
        return {"throughput": r.throughput, "latency": r.latency, "workers": r.workers}

    def autoscaled(self, app: str, policy: str, profile: Profile, pool: int, low_rate: float,
                   drain: bool = True, backlog_seconds: float | None = DRAIN_SECONDS) -> dict:
        """The job starts on one worker under `policy`'s control loop, input following `profile`; with
        `drain` the run goes on until it has drained (at most half the profile again, plus 10 s);
        `backlog_seconds` is the control loop's `drain_seconds`. Returns the per-second
        series, the decisions, the latency summary, and `drained_at`: when the last record pushed completed
        (None if it did not within the run)."""
        dag = self.dag(app)
        ctl = make_controller(dag, self.costs, policy, pool)
        ctl.config = ControlConfig(warmup_requests=warmup_requests(low_rate), drain_seconds=backlog_seconds)
        # One worker, as the planner starts an autoscaled job (the baselines cannot plan without a throughput).
        start = uniform_placement(list(dag.operators), list(dag.edges), 1, ctl.p_max, self.costs.capacity,
                                  "start on one worker", policy)
        ctl.current = start
        sim = Simulator(dag, self.costs, pool, rate=profile.rate_at, placement=start, controller=ctl,
                        config=SimConfig(duration=profile.duration * 1.5 + 10 if drain else profile.duration,
                                        warmup=0.0))
        r = sim.run()
        pushed = 0.0
        done = 0.0
        drained_at = None
        total = sum(s.input_rate for s in r.seconds)
        for s in r.seconds:
            pushed += s.input_rate
            done += s.throughput
            if drained_at is None and done >= total * 0.999 and s.input_rate == 0:
                drained_at = s.t + 1
        return {"series": [{"t": s.t, "input_rate": s.input_rate, "throughput": s.throughput,
                            "workers": s.workers} for s in r.seconds],
                "decisions": r.decisions, "latency": r.latency, "pushed": pushed, "completed": done,
                "drained_at": drained_at}

    def estimate_seconds(self, seconds: float, workers: int) -> float:
        """Rough wall time of a point of `seconds` simulated seconds on `workers` workers."""
        return 0.02 + seconds * max(workers, 1) * 0.0012

    def describe(self) -> dict:
        return {"alpha": self.costs.alpha, "beta": self.costs.beta, "gamma": self.costs.gamma,
                "capacity": self.costs.capacity, "source": self.source}

