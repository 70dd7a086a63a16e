"""Placement and estimator speed: `python -m clasp.bench.placement` prints JSON.

Targets (docs/POLICY.md): 10 operators on up to 10 workers ≤ 5 ms, 100 operators on up to 1,000 workers
≤ 1 s, an estimator update O(1) and ≤ 50 µs.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time

from clasp.core.estimator import Estimator, WorkerSample
from clasp.core.model import CapacityModel
from clasp.core.placement import Load, NoPlacementError, WorkerLimitCache, derive_load, highest_rate_placement, place


def dag(n: int, seed: int = 0) -> tuple[list[str], list[tuple[str, str]], Load]:
    """A seeded line of `n` operators with skip edges (diamonds, fan-in), observed at 1000 req/s."""
    rng = random.Random(seed)
    ops = [f"op{i}" for i in range(n)]
    edges = [(ops[i], ops[i + 1]) for i in range(n - 1)]
    edges += [(ops[i], ops[i + 2]) for i in range(n - 2) if rng.random() < 0.3]
    rates = {o: 1000.0 for o in ops}
    tau = {o: rng.uniform(200, 600) for o in ops}
    edge_rates = {e: rng.uniform(200, 1000) for e in edges}
    return ops, edges, derive_load(rates, tau, edge_rates, 1000.0, 1000.0)


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median wall time (s) of `repeat` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def placement_case(n_ops: int, target_workers: int, model: CapacityModel, repeat: int) -> dict:
    """Time one placement at the rate that needs about `target_workers` workers."""
    ops, edges, observed = dag(n_ops)
    # Pick the rate by scanning down from the pure-execution estimate until it fits the target count.
    per_request = sum(observed.demand.values()) / 1000.0
    rate = target_workers * model.capacity / per_request
    for _ in range(200):
        try:
            if place(ops, edges, observed.scaled(rate / 1000.0), model).workers <= target_workers:
                break
        except NoPlacementError:  # fan-out γ·g past W̄: too spread to place at all
            pass
        rate *= 0.97
    seconds, p = timed(lambda: place(ops, edges, observed.scaled(rate / 1000.0), model), repeat)
    return {"operators": n_ops, "workers": p.workers, "rate": round(rate, 1), "ms": round(seconds * 1e3, 3)}


def limit_case(n_ops: int, workers: int, model: CapacityModel, repeat: int) -> dict:
    """Time the worker-limit binary search (uncached) and a cached lookup."""
    ops, edges, observed = dag(n_ops)
    seconds, found = timed(lambda: highest_rate_placement(ops, edges, observed, 1000.0, model, workers),
                           repeat)
    cache = WorkerLimitCache()
    cache.get_or_search(ops, edges, observed, 1000.0, model, workers)
    cached, _ = timed(lambda: cache.get_or_search(ops, edges, observed, 1000.0, model, workers), repeat)
    return {"operators": n_ops, "max_workers": workers, "workers": found.placement.workers,
            "rate": round(found.rate, 1), "steps": found.steps, "ms": round(seconds * 1e3, 3),
            "cached_ms": round(cached * 1e3, 4)}


def estimator_case(workers: int, intervals: int = 2000) -> dict:
    """Mean cost of `Estimator.update` with `workers` saturated samples per interval."""
    rng = random.Random(1)
    est = Estimator()
    streams = []
    for t in range(intervals + 4):
        samples = {}
        for w in range(workers):
            rl, rr, d = rng.uniform(500, 3000), rng.uniform(100, 800), rng.randint(0, 4)
            e = (700000 - 30 * rl - 350 * rr - 40000 * d) * rng.uniform(0.95, 1.05)
            samples[w] = WorkerSample(t, 0.0, e, rl, rr, d)  # saturated: the queue grows every interval
        streams.append(samples)
    for s in streams[:4]:
        est.update(s)
    t = time.perf_counter()
    for s in streams[4:]:
        est.update(s)
    per_update = (time.perf_counter() - t) / intervals
    return {"workers": workers, "us_per_update": round(per_update * 1e6, 2),
            "us_per_sample": round(per_update * 1e6 / workers, 2)}


def main() -> int:
    model = CapacityModel()
    # With the paper's γ, fan-out caps how far one operator spreads (γ·g < W̄), so 100 operators of this
    # DAG cannot use 1,000 workers at any rate; γ/10 lets the placement reach them.
    spread = CapacityModel(gamma=model.gamma / 10)
    small = placement_case(10, 10, model, repeat=50)
    large = placement_case(100, 1000, spread, repeat=3)
    grid = [placement_case(n, w, spread, repeat=3 if n * w > 10000 else 10)
            for n in (10, 30, 100) for w in (10, 100, 1000)]
    out = {
        "python": sys.version.split()[0],
        "model": {"alpha": model.alpha, "beta": model.beta, "gamma": model.gamma, "capacity": model.capacity},
        "place_10_ops_10_workers": {**small, "target_ms": 5},
        "place_100_ops_1000_workers": {**large, "gamma": spread.gamma, "target_ms": 1000},
        "place_100_ops_paper_gamma_most_workers": placement_case(100, 1000, model, repeat=3),
        "worker_limit_search": [limit_case(10, 10, model, 10), limit_case(100, 1000, spread, 1)],
        "growth_gamma": spread.gamma,
        "growth": grid,
        "estimator": [{**estimator_case(1), "target_us": 50}, estimator_case(10), estimator_case(100, 300)],
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
