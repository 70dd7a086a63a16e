"""Validate the simulator against the emulated cluster: same app, same profile, 1–5 workers.

`python -m bench.validate_sim [--cpu-per-worker F] [--apps wc,syn] [--workers 1,2,3,4,5] [--repeat K]
[--seconds S] [--costs bench/sim_costs_measured.json] [--plot out/validate_sim.png]`

For every app and worker count: unthrottled, every operator spread evenly over the workers, autoscaling off.
Emulated: `bench.cluster_engine.unthrottled` on a LocalCluster whose workers are each limited to F CPUs
(cgroup quota), `--repeat` times (the apps and repetitions interleaved on one cluster per worker count, so
a burst of load from the machine's other users hits all of them alike); the figure is the mean, the spread
(max − min) / mean is reported. Simulated: `simulate(app_dag(app, costs), n, costs=costs,
config=SimConfig(key_skew=True))` with the calibrated cost file (`bench.calibrate`, measured under the
same quota). Prints a JSON line per point (emulated, simulated, ratio = simulated / emulated) and a final
summary line with the largest |ratio − 1|; draws workers against throughput, emulated and simulated lines
per app.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from bench import cluster_engine as ce

COSTS = Path(__file__).resolve().parent / "sim_costs_measured.json"
TOLERANCE = 0.15


def simulated(apps: list[str], workers: list[int], costs, duration: float = 20.0) -> dict[tuple[str, int], float]:
    from clasp.simulator import SimConfig, app_dag, simulate

    out = {}
    for app in apps:
        dag = app_dag(app, costs, records=20_000)  # fan-outs and key-group weights of the app's input
        for n in workers:
            cfg = SimConfig(duration=duration, warmup=2.0, key_skew=True)
            out[(app, n)] = simulate(dag, n, costs=costs, config=cfg).throughput
    return out


def emulated(apps: list[str], workers: list[int], cpu: float, repeat: int, seconds: float) -> dict:
    out: dict[tuple[str, int], list[dict]] = {}
    for n in workers:
        for _ in range(repeat):
            for app in apps:
                r = ce.unthrottled(app, n, cpu_per_worker=cpu, seconds=seconds)
                if not r["correct"]:
                    raise ce.EngineError(f"{app} on {n} workers gave a wrong answer")
                out.setdefault((app, n), []).append(r)
                print(json.dumps({"measured": app, "workers": n, "throughput": round(r["throughput"], 1),
                                  "window_s": r["seconds"]}), file=sys.stderr, flush=True)
        ce.shutdown()
    return out


def plot(path: str, apps: list[str], workers: list[int], points: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, app in enumerate(apps):
        rows = [p for p in points if p["app"] == app]
        x = [p["workers"] for p in rows]
        ax.errorbar(x, [p["emulated"] for p in rows], yerr=[[p["emulated"] - p["emulated_min"] for p in rows],
                                                            [p["emulated_max"] - p["emulated"] for p in rows]],
                    color=f"C{i}", marker="o", label=f"{app} emulated", capsize=3)
        ax.plot(x, [p["simulated"] for p in rows], color=f"C{i}", ls="--", marker="s", label=f"{app} simulated")
    ax.set_xlabel("workers (every operator spread evenly)")
    ax.set_ylabel("throughput, records/s")
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    from clasp.simulator import Costs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-per-worker", type=float, default=None,
                    help="CPU quota per worker (default: the cost file's measured quota)")
    ap.add_argument("--apps", default="wc,syn")
    ap.add_argument("--workers", default="1,2,3,4,5")
    ap.add_argument("--repeat", type=int, default=2, help="emulated runs per point")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per emulated run")
    ap.add_argument("--costs", default=str(COSTS), help="the calibrated cost file")
    ap.add_argument("--plot", default="out/validate_sim.png")
    ap.add_argument("--json", help="also write every point here")
    args = ap.parse_args(argv)
    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    costs = Costs.load(args.costs)
    meta = json.loads(Path(args.costs).read_text()).get("measured", {})
    cpu = args.cpu_per_worker if args.cpu_per_worker is not None else meta.get("cpu_per_worker")
    if cpu is None:
        ap.error("give --cpu-per-worker (the cost file does not say which quota it was measured under)")
    if meta.get("cpu_per_worker") not in (None, cpu):
        print(f"warning: {args.costs} was measured at {meta['cpu_per_worker']} CPU per worker, not {cpu}",
              file=sys.stderr)
    sim = simulated(apps, workers, costs)
    emu = emulated(apps, workers, cpu, args.repeat, args.seconds)
    points = []
    for app in apps:
        for n in workers:
            t = [r["throughput"] for r in emu[(app, n)]]
            mean = statistics.fmean(t)
            p = {"app": app, "workers": n, "emulated": round(mean, 1), "emulated_runs": [round(x, 1) for x in t],
                 "emulated_min": min(t), "emulated_max": max(t), "spread": round((max(t) - min(t)) / mean, 4),
                 "simulated": round(sim[(app, n)], 1), "ratio": round(sim[(app, n)] / mean, 4)}
            points.append(p)
            print(json.dumps({k: v for k, v in p.items() if k not in ("emulated_min", "emulated_max")}), flush=True)
    worst = max(points, key=lambda p: abs(p["ratio"] - 1))
    summary = {"summary": True, "date": datetime.date.today().isoformat(), "cpu_per_worker": cpu,
               "costs": args.costs, "apps": apps, "workers": workers, "repeat": args.repeat,
               "seconds": args.seconds, "max_abs_error": round(abs(worst["ratio"] - 1), 4),
               "worst": {"app": worst["app"], "workers": worst["workers"]},
               "max_spread": max(p["spread"] for p in points),
               "within_15pct": all(abs(p["ratio"] - 1) <= TOLERANCE for p in points)}
    print(json.dumps(summary), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"points": points, "summary": summary}, indent=1))
    if args.plot:
        plot(args.plot, apps, workers, points,
             f"emulated ({cpu} CPU/worker) vs simulated, unthrottled, spread")
    return 0 if summary["within_15pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
