"""The two engines of `clasp bench`: `make("sim" | "cluster", ...)`.

Both answer the same calls (`clasp/bench/figures.py`): `policy_placement`, `unthrottled`, `fixed_rate`,
`autoscaled`, `coefficients`, `estimate_seconds`, `describe`; the cluster engine also `migration`. A
policy's placement on a fixed number of workers is planned from the cost model in both (the simulator's
one-worker observation), so the two engines measure the same placement at every point.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from clasp.bench.sim_engine import SimEngine
from clasp.sim.simulator import COSTS_FILE, MEASURED_COSTS_FILE, PAPER_COSTS_FILE, CostError, Costs

UNSUPPORTED = {
    "fig4": "the simulator keeps no state, so local and remote state access cost the same in it",
    "fig8": "migration durations are measured on real processes; the simulator only pauses for a given time",
    "fig9": "the simulator charges the cost file's α, β, γ: there they are an input, not a measurement",
}


FIG9_SIZES = {"quick": [1, 2, 4], "full": list(range(1, 11))}
# Fig. 8's key-count sweep: WC had ~40k distinct words at migration time in the paper.
MIGRATION_KEYS = {"quick": [4_000, 40_000], "full": [4_000, 40_000, 400_000]}


class EngineError(RuntimeError):
    """An engine that cannot run here (no cgroups, a bad cost file)."""


def load_costs(name: str) -> tuple[Costs, str]:
    """`runtime` (the calibrated file if present, else clasp/sim/sim_costs.json), `paper`, or a path."""
    if name == "runtime":
        path = MEASURED_COSTS_FILE if MEASURED_COSTS_FILE.exists() else COSTS_FILE
    elif name == "paper":
        path = PAPER_COSTS_FILE
    else:
        path = Path(name)
    try:
        return Costs.load(path), str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)
    except (OSError, CostError, ValueError) as e:
        raise EngineError(f"cannot load costs {name!r}: {e}") from e


def make(name: str, *, quick: bool, costs: str = "runtime", cpu_per_worker: float | None = None):
    c, source = load_costs(costs)
    sim = SimEngine(c, quick=quick, source=source)
    if name == "sim":
        return sim
    if name == "cluster":
        return ClusterEngine(sim, quick=quick, cpu_per_worker=cpu_per_worker)
    raise EngineError(f"unknown engine {name!r}")


def default_cpu_per_worker(workers: int = 10) -> float:
    """Ten equal slices that leave the planner a core's fifth: 2 cores here give 0.18 CPU per worker."""
    return round(max(0.05, ((os.cpu_count() or 1) - 0.2) / workers), 2)


class ClusterEngine:
    """The emulated cluster: real planner and worker processes (`clasp/bench/cluster_engine.py`), each worker
    under a cgroup CPU quota so that ten of them are ten equal hosts."""

    name = "cluster"

    def __init__(self, sim: SimEngine, *, quick: bool, cpu_per_worker: float | None):
        from clasp.local import cpulimit

        self.sim = sim
        self.quick = quick
        self.cpu_per_worker = cpu_per_worker if cpu_per_worker is not None else default_cpu_per_worker()
        reason = cpulimit.available()
        if reason is not None:
            raise EngineError(f"the cluster engine runs every worker under a CPU quota: {reason}")
        self.seconds = 4.0 if quick else 10.0
        self._coefficient_jobs: dict[str, dict] = {}

    def describe(self) -> dict:
        return {"cpu_per_worker": self.cpu_per_worker, "placements_from": self.sim.describe()}

    def estimate_seconds(self, seconds: float, workers: int) -> float:
        return seconds + 3.0 + 0.3 * workers  # measurement, warm-up job, cluster start amortized

    def policy_placement(self, app: str, policy: str, workers: int):
        return self.sim.policy_placement(app, policy, workers)

    def _run(self, fn, app: str, workers: int, placement, **kw) -> dict:

        r = fn(app, workers, placement=placement.fractions if placement is not None else "spread",
               cpu_per_worker=self.cpu_per_worker, seconds=self.seconds, **kw)
        if not r.get("correct", True):
            raise EngineError(f"{app} on {workers} workers gave a wrong answer")
        return r

    def unthrottled(self, app: str, workers: int, placement=None, state: str = "local") -> dict:
        from clasp.bench import cluster_engine

        return self._run(cluster_engine.unthrottled, app, workers, placement, state=state)

    def fixed_rate(self, app: str, workers: int, rate: float, placement=None) -> dict:
        from clasp.bench import cluster_engine

        return self._run(lambda a, n, **kw: cluster_engine.fixed_rate(a, n, rate, **kw), app, workers, placement)

    def coefficients(self, app: str, workers: int, placement=None) -> dict:
        """The planner's estimate (α, β, γ, W̄) after `app` has run saturated on `workers` workers under
        `placement` (a policy's Placement; None: every operator spread). One job per app is re-placed from
        one worker count to the next, as the paper's Fig. 9 runs each app on 1..10 workers: one fixed
        placement varies R^l, R^r and δ too little to identify α, β and γ, and the estimator leaves them
        alone until the pooled observations do (clasp/core/estimator.py)."""
        from clasp.apps import get_app
        from clasp.bench import cluster_engine

        a = get_app(app)
        ops = [o.name for o in a.build_dag().operators]
        pool = max(FIG9_SIZES["quick" if self.quick else "full"])
        entry = cluster_engine.CLUSTERS.get(pool, self.cpu_per_worker)
        if app not in self._coefficient_jobs:
            for other in self._coefficient_jobs.values():  # points come app by app: the last app is done
                other["job"].cancel()
            self._coefficient_jobs.clear()
            job = entry["client"].submit(a.build_dag(), placement=cluster_engine.spread(ops, 1), autoscale=False)
            self._coefficient_jobs[app] = {"job": job, "records": [], "rate": None}
        run = self._coefficient_jobs[app]
        job = run["job"]
        job.place(placement.fractions if placement is not None else cluster_engine.spread(ops, workers))
        if run["rate"] is None:  # a first small batch sizes the rest
            self._push_batch(a, run, 2000)
        # Saturated for `seconds`: the planner queues what it cannot admit, so pushing it all at once is enough.
        self._push_batch(a, run, int(max(2000, run["rate"] * self.seconds)))
        if a.result(job) != a.expected(run["records"]):
            raise EngineError(f"{app} gave a wrong answer after {len(run['records'])} records")
        m = job.stats(fresh=True).get("model") or {}
        return {k: m.get(k) for k in ("alpha", "beta", "gamma", "capacity", "observations")} | {
            "throughput": run["rate"], "estimator": m.get("reason")}

    @staticmethod
    def _push_batch(a, run: dict, n: int) -> None:
        batch = a.generate(n, len(run["records"]) + 1)
        t0 = time.perf_counter()
        run["job"].push(batch)
        run["job"].wait_idle(600)
        run["rate"] = n / (time.perf_counter() - t0)
        run["records"].extend(batch)

    def autoscaled(self, app: str, policy: str, profile, pool: int, low_rate: float, drain: bool = True,
                   backlog_seconds: float | None = None) -> dict:
        """The planner's own control loop with `policy` on a `pool`-worker cluster, the job starting on one
        worker, input following `profile` (`clasp.runtime.driver.Driver`); the answer is checked, so the run always
        drains, and the planner plans as configured (`drain` and `backlog_seconds` are the simulator's)."""
        from clasp.apps import get_app
        from clasp.bench import cluster_engine
        from clasp.runtime.driver import Driver

        a = get_app(app)
        entry = cluster_engine.CLUSTERS.get(pool, self.cpu_per_worker)
        records = a.generate(profile.volume, 0)
        submitted = time.monotonic()
        job = entry["client"].submit(a.build_dag(), autoscale=True, policy=policy)
        try:
            d = Driver(job, a, records, profile, submitted_at=submitted, drain_timeout=300)
            summary = d.run()
            stats = job.stats(fresh=True)
        finally:
            job.cancel()
        if not d.correct:
            raise EngineError(f"{app} under {policy} gave a wrong answer")
        off = d.series.offset
        lat = summary["latency_ms"]
        return {"series": [{"t": r["t"] - off, "input_rate": r["input_rate"], "throughput": r["throughput"],
                            "workers": r["workers"]} for r in d.series.rows],
                "decisions": [{**x, "t": x["t"] - off} for x in stats["decisions"]],
                "latency": {k: (lat[k] / 1e3 if lat.get(k) is not None else None) for k in ("p50", "p95", "p99")},
                "pushed": d.sent, "completed": stats["completed"],
                "drained_at": (d.idle_at - d.started) if d.idle_at else None}

    def migration(self, ctx, a: int, b: int, keys: int, flowing: bool = False) -> dict:
        """One a → b re-placement of Word Count state of `keys` words (clasp/bench/migration.py), every
        operator spread, on a cluster of the largest worker count under the same quotas; one job per key
        count, its state refilled before every transition, and every word's count checked after it."""
        from clasp.bench import migration
        from clasp.local.cluster import LocalCluster
        from clasp.runtime.client import connect
        from clasp.runtime.config import PlannerConfig

        def start():
            n = 5 if self.quick else 10
            cl = ctx.stack.enter_context(LocalCluster(
                workers=n, port=0, cpu_per_worker=self.cpu_per_worker, log_dir=tempfile.mkdtemp(prefix="clasp-fig8-"),
                planner_config=PlannerConfig(autoscale=False, migration_timeout=120)))
            return ctx.stack.enter_context(connect(cl.planner, timeout=120))

        client = ctx.memo("fig8-client", start)
        current = ctx.cache.get("fig8-job")
        if current is None or current[0] != keys:
            if current is not None:
                current[1].cancel()  # the previous key count's state goes
            current = ctx.cache["fig8-job"] = [keys, client.submit(migration.dag(), autoscale=False), 0]
        _, job, fills = current
        r = migration.transition(job, a, b, keys, flowing)
        current[2] = fills = fills + 1
        exact = migration.exact(job, keys, fills)
        if r["failed"] or not exact:
            raise EngineError(f"migration {a}→{b} at {keys} keys failed or lost state: {r}")
        return {"planner_ms": r["duration_s"] * 1e3, "max_worker_pause_ms": r["max_pause_s"] * 1e3,
                "max_group_hold_ms": r["max_group_hold_s"] * 1e3, "max_worker_duration_ms": r["max_hold_s"] * 1e3,
                "max_worker_pause_cpu_ms": r["max_pause_cpu_s"] * 1e3, "state_bytes": r["bytes"],
                "requests_moved": r["rows"], "key_groups_moved": r["key_groups_moved"],
                "key_groups_packed": r["key_groups_packed"], "exact": exact}
