"""Placement time against DAG and cluster size: `python -m clasp.bench.placement_scale` prints JSON.

`clasp.bench.placement` times the placement functions on a line of operators; this times what `clasp place`
does, a policy's `decide` on a PROFILE.json, for the default policy `clasp` and the paper's `clasp-paper`:

- in process, over a grid of operators (10–200) × worker limits (10–2,000): the median wall time of
  `--repeat` decisions, each by a fresh policy (no cached worker-limit search), and what `clasp` evaluated
  (`Work`: candidate placements, and the shares and flows they priced, against N log₂ N, N = operators ×
  workers);
- whole process, `python -m clasp.cli.place PROFILE --max-workers 2000` on the 100-operator profile
  (interpreter start and imports included), the best and the median of `--repeat` runs.

The profiles are seeded random DAGs (`profile`), the paper's α, β, γ, W̄. `--plot FILE` draws the grid,
`--json FILE` writes the result, `--write-profile N FILE` writes the N-operator profile and exits. About a
minute. Results: docs/results-log.md, "Placement at scale".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clasp.bench import emit
from clasp.bench.placement import timed
from clasp.core.model import DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_CAPACITY, DEFAULT_GAMMA
from clasp.core.placement import Work
from clasp.core.policies import POLICIES as REGISTRY
from clasp.core.policies import Decision, Policy, Stats

OPERATORS = (10, 25, 50, 100, 200)
WORKERS = (10, 30, 100, 300, 1000, 2000)
POLICIES = ("clasp", "clasp-paper")
WHOLE = (100, 2000)  # the whole-process case: operators, --max-workers


def profile(operators: int, seed: int = 0, fill: float = 1.5, throughput: float = 1000.0) -> dict:
    """A PROFILE.json object: a seeded random DAG of `operators` operators observed at `throughput` req/s.

    Operator i sends to one of the next three (and with probability 0.1 to a second): sources, fan-in and
    fan-out, one sink. N_o is U(0.75, 1.25) × Λ, dealt evenly over the operator's out-edges; τ̄_o is
    U(250, 550) µs; the paper's α, β, γ, W̄. The input rate makes the execution demand Σ N_o τ̄_o fill
    `fill` workers per operator: at 1.5 the paper's next-fit needs about four per operator (403 for 100),
    and each operator spreads over few enough workers that γ's fan-out still fits."""
    rng = random.Random(seed)
    ops = [f"op{i}" for i in range(operators)]
    pairs: set[tuple[int, int]] = set()
    for i in range(operators - 1):
        pairs.add((i, rng.randrange(i + 1, min(operators, i + 4))))
        if rng.random() < 0.1:
            pairs.add((i, rng.randrange(i + 1, min(operators, i + 4))))
    rate = {o: throughput * rng.uniform(0.75, 1.25) for o in ops}
    tau = {o: rng.uniform(250.0, 550.0) for o in ops}
    out = {i: sum(1 for s, _ in pairs if s == i) for i in range(operators)}
    per_request = sum(rate[o] * tau[o] for o in ops) / throughput
    return {"operators": {o: {"rate": round(rate[o], 3), "tau_us": round(tau[o], 2)} for o in ops},
            "edges": [{"src": ops[s], "dst": ops[d], "rate": round(rate[ops[s]] / out[s], 3)}
                      for s, d in sorted(pairs)],
            "alpha": DEFAULT_ALPHA, "beta": DEFAULT_BETA, "gamma": DEFAULT_GAMMA, "capacity": DEFAULT_CAPACITY,
            "throughput": throughput,
            "input_rate": round(fill * operators * DEFAULT_CAPACITY / per_request, 1),
            "p_max": 8, "instances": operators, "workers": 1}


def decide(policy: str, stats: Stats, max_workers: int) -> tuple[Policy, Decision]:
    """A fresh policy's decision for `stats`, and the policy (what it evaluated: its `work`)."""
    p = REGISTRY[policy]()
    return p, p.decide(list(stats.operators), [(e.src, e.dst) for e in stats.edges], None, stats,
                       max_workers=max_workers)


def grid_case(operators: int, max_workers: int, repeat: int) -> list[dict]:
    stats = Stats.from_json_dict(profile(operators))
    rows = []
    for name in POLICIES:
        seconds, (p, decision) = timed(lambda name=name: decide(name, stats, max_workers), repeat)
        n = operators * max_workers
        rows.append({"operators": operators, "max_workers": max_workers, "policy": name,
                     "ms": round(seconds * 1e3, 2), "workers": decision.workers,
                     "rate": round(decision.placement.rate, 1), "evaluations": p.work.evaluations,
                     "priced": p.work.priced, "priced_per_n_log_n": round(p.work.priced / (n * math.log2(n)), 4)})
    return rows


def whole_process(path: str, max_workers: int, repeat: int) -> dict:
    """Wall time of `python -m clasp.cli.place PATH --max-workers N` per policy (best and median)."""
    out = {}
    for name in POLICIES:
        times, workers = [], None
        for _ in range(repeat):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "clasp.cli.place", path, "--max-workers", str(max_workers),
                                   "--policy", name], capture_output=True, text=True, check=True, timeout=600)
            times.append(time.perf_counter() - t)
            workers = json.loads(proc.stdout)["workers"]
        out[name] = {"best_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
                     "workers": workers}
    return out


def plot(result: dict, path: str) -> None:
    from clasp.bench.figures import _plt, _save

    plt = _plt()
    rows = result["grid"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    style = {"clasp": "-", "clasp-paper": "--"}
    for color, limit in enumerate((100, 2000)):
        for name in POLICIES:
            pts = sorted((r["operators"], r["ms"]) for r in rows if r["policy"] == name and r["max_workers"] == limit)
            axes[0].plot(*zip(*pts, strict=True), style[name], color=f"C{color}", marker="o",
                         label=f"{name}, ≤ {limit} workers")
    axes[0].set(xlabel="operators", ylabel="placement time (ms, in process)", yscale="log",
                title="against DAG size")
    for color, ops in enumerate((10, 100, 200)):
        for name in POLICIES:
            pts = sorted((r["max_workers"], r["ms"]) for r in rows if r["policy"] == name and r["operators"] == ops)
            axes[1].plot(*zip(*pts, strict=True), style[name], color=f"C{color + 2}", marker="o",
                         label=f"{name}, {ops} operators")
    axes[1].set(xlabel="worker limit (--max-workers)", ylabel="placement time (ms, in process)", xscale="log",
                yscale="log", title="against cluster size")
    mine = sorted((r["operators"] * r["max_workers"], r["priced"]) for r in rows if r["policy"] == "clasp")
    axes[2].scatter(*zip(*mine, strict=True), s=14, label="clasp: shares and flows priced")
    ns = sorted({n for n, _ in mine})
    budget = [Work.for_size(1, n).budget for n in ns]
    axes[2].plot(ns, budget, ":", color="gray", label="budget of the optional candidates, 4 N log₂ N")
    axes[2].set(xlabel="N = operators × worker limit", ylabel="priced", xscale="log", yscale="log",
                title="what the refinement evaluated")
    for ax in axes:
        ax.legend(fontsize=7)
    whole = result["whole_process"]
    fig.suptitle(f"clasp place, {WHOLE[0]} operators, --max-workers {WHOLE[1]}, whole process: "
                 + ", ".join(f"{n} {w['best_s']:.2f} s ({w['workers']} workers)" for n, w in whole.items()),
                 fontsize=10)
    _save(plt, fig, Path(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per point (median; whole process: best too)")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--plot", help="draw the grid into this PNG")
    ap.add_argument("--write-profile", nargs=2, metavar=("OPERATORS", "FILE"),
                    help="write the OPERATORS-operator profile to FILE and exit")
    ap.add_argument("--replot", metavar="JSON", help="draw --plot from this earlier result instead of measuring")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), args.plot)
        return 0
    if args.write_profile:
        n, path = args.write_profile
        Path(path).write_text(json.dumps(profile(int(n)), indent=1) + "\n")
        return 0
    grid = []
    for ops in OPERATORS:
        for limit in WORKERS:
            grid += grid_case(ops, limit, args.repeat)
            print(f"{ops} operators, ≤ {limit} workers: "
                  + ", ".join(f"{r['policy']} {r['ms']:.1f} ms" for r in grid[-len(POLICIES):]),
                  file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "PROFILE.json")
        Path(path).write_text(json.dumps(profile(WHOLE[0])))
        whole = whole_process(path, WHOLE[1], args.repeat)
    result = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "repeat": args.repeat,
              "whole_process": whole, "grid": grid}
    if args.plot:
        plot(result, args.plot)
    return emit(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
