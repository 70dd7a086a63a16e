"""The two engines of `clasp bench`: `make("sim" | "cluster", ...)`.

Both answer the same calls (`bench/figures.py`): `policy_placement`, `unthrottled`, `fixed_rate`,
`autoscaled`, `coefficients`, `estimate_seconds`, `describe`; the cluster engine also `migration`. A
policy's placement on a fixed number of workers is planned from the cost model in both (the simulator's
one-worker observation), so the two engines measure the same placement at every point.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.sim_engine import SimEngine
from clasp.simulator import COSTS_FILE, PAPER_COSTS_FILE, CostError, Costs

MEASURED_COSTS_FILE = Path(__file__).resolve().parent / "sim_costs_measured.json"
UNSUPPORTED = {
    "fig4": "the simulator keeps no state, so local and remote state access cost the same in it",
    "fig8": "migration durations are measured on real processes; the simulator only pauses for a given time",
}


class EngineError(RuntimeError):
    """An engine that cannot run here (no cgroups, a bad cost file)."""


def load_costs(name: str) -> tuple[Costs, str]:
    """`runtime` (the calibrated file if present, else bench/sim_costs.json), `paper`, or a path."""
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
    """The emulated cluster: real planner and worker processes (`bench/cluster_engine.py`), each worker
    under a cgroup CPU quota so that ten of them are ten equal hosts."""

    name = "cluster"

    def __init__(self, sim: SimEngine, *, quick: bool, cpu_per_worker: float | None):
        from clasp import cpulimit

        self.sim = sim
        self.quick = quick
        self.cpu_per_worker = cpu_per_worker if cpu_per_worker is not None else default_cpu_per_worker()
        reason = cpulimit.available()
        if reason is not None:
            raise EngineError(f"the cluster engine runs every worker under a CPU quota: {reason}")
        self.seconds = 5.0 if quick else 10.0

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
        from bench import cluster_engine

        return self._run(cluster_engine.unthrottled, app, workers, placement, state=state)

    def fixed_rate(self, app: str, workers: int, rate: float, placement=None) -> dict:
        from bench import cluster_engine

        return self._run(lambda a, n, **kw: cluster_engine.fixed_rate(a, n, rate, **kw), app, workers, placement)

    def coefficients(self, app: str, workers: int) -> dict:
        r = self.unthrottled(app, workers)
        m = r.get("model") or {}
        return {k: m.get(k) for k in ("alpha", "beta", "gamma", "capacity")} | {"throughput": r["throughput"]}
