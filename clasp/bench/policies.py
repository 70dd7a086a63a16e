"""Worker counts per policy: `python -m clasp.bench.policies` prints JSON (Fig. 13 style).

For WC and SYN, with this runtime's measured costs and with the paper's, a PROFILE as observed on one
saturated worker is placed by every policy (what `clasp place PROFILE.json --policy P --max-workers 10`
prints) at 10%..100% of a reference rate: the rate CLASP's placement sustains on 10 workers. Each cell gives
the worker count and the Eq. (8) peak load in units of W̄ (above 1: the policy overloads a worker).

`place_sweeps()` is the `clasp place` part (pure computation, no cluster). `live()` runs a 3-worker
LocalCluster: per policy, WC and SYN with autoscaling on and that policy, all input pushed at once
(throughput = records / seconds from the first push to idle; workers = the most the job used); and WC
with local and with remote state (the paper's Fig. 4 baseline, every operator spread over the 3
workers, no autoscaling). `python -m clasp.bench.policies [--table] [--no-live] [--records-wc N] [--records-syn N]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from clasp.core.placement import single_worker_rate
from clasp.core.policies import POLICIES, ClaspPolicy, Stats

POLICY_NAMES = ["clasp", "faasflow", "faasflow-sp", "zhang24", "zhang24-sp"]
LEVELS = [round(0.1 * i, 1) for i in range(1, 11)]
CLUSTER = 10  # workers available, as in the paper's testbed
P_MAX = 10
WORDS_PER_LINE = 15

# This runtime (README "Speed", apps/README): α ≈ 1.3 µs per local and β ≈ 7 µs per remote chained request;
# one Python worker process does at most one core-second of work per second. γ is not measured yet: 5000
# µs/s per remote destination is an assumption (polling and batching one more ZeroMQ peer).
COSTS = {
    "runtime": {"alpha": 1.3, "beta": 7.0, "gamma": 5000.0, "capacity": 1_000_000.0},
    "paper": {"alpha": 38.5, "beta": 275.0, "gamma": 51500.0, "capacity": 850_000.0},
}
# Mean execution time per request (µs): measured here (apps/README) and the paper's ~400 µs operators.
TAU = {
    "runtime": {"wc": {"split": 5.0, "count": 0.5}, "syn": 0.2},
    "paper": {"wc": {"split": 400.0, "count": 400.0}, "syn": 400.0},
}


def app_dag(app: str, costs: str) -> tuple[dict[str, tuple[float, float]], list[tuple[str, str, float]]]:
    """Per input record: operator → (requests, τ̄ µs) and edges (src, dst, chained requests)."""
    if app == "wc":
        tau = TAU[costs]["wc"]
        return ({"split": (1.0, tau["split"]), "count": (float(WORDS_PER_LINE), tau["count"])},
                [("split", "count", float(WORDS_PER_LINE))])
    if app == "syn":
        ops = [f"op{i}" for i in range(10)]
        return ({o: (1.0, TAU[costs]["syn"]) for o in ops},
                [(a, b, 1.0) for a, b in zip(ops[:-1], ops[1:], strict=True)])
    raise ValueError(f"unknown app {app!r}")


def profile(app: str, costs: str, throughput: float | None = None, workers: int = 1) -> dict:
    """A PROFILE.json dict as observed at `throughput` on `workers` (default: one worker at its maximum)."""
    per_record, edges = app_dag(app, costs)
    c = COSTS[costs]
    if throughput is None:
        # The one-worker maximum with everything local: W̄ / (Σ τ̄ + α Σ E) per record.
        unit = Stats.from_json_dict(_profile_dict(per_record, edges, c, 1.0, 1))
        throughput = single_worker_rate(unit.observed_load(), 1.0, unit.model)
    return _profile_dict(per_record, edges, c, throughput, workers)


def _profile_dict(per_record, edges, costs, throughput: float, workers: int) -> dict:
    return {"operators": {o: {"rate": n * throughput, "tau_us": tau} for o, (n, tau) in per_record.items()},
            "edges": [{"src": s, "dst": d, "rate": n * throughput} for s, d, n in edges],
            **costs, "throughput": throughput, "input_rate": throughput, "p_max": P_MAX,
            "instances": P_MAX * workers, "workers": workers}


def reference_rate(d: dict) -> float:
    """The rate CLASP's placement sustains on CLUSTER workers."""
    s = Stats.from_json_dict(d)
    return ClaspPolicy().place_on(list(s.operators), [(e.src, e.dst) for e in s.edges], s, CLUSTER).rate


def place(d: dict, policy: str, rate: float) -> dict:
    """`clasp place PROFILE --policy P --rate R --max-workers CLUSTER`: worker count and peak load / W̄."""
    s = Stats.from_json_dict(d)
    s.input_rate = rate
    dec = POLICIES[policy]().decide(list(s.operators), [(e.src, e.dst) for e in s.edges], None, s,
                                    max_workers=CLUSTER)
    if dec.placement is None:
        return {"workers": None, "reason": dec.reason}
    return {"workers": dec.workers, "peak_load": round(max(dec.placement.load) / s.capacity, 2)}


def place_sweep(app: str, costs: str) -> dict:
    """Worker counts per policy at every level of the reference rate, for one app and cost set."""
    d = profile(app, costs)
    ref = reference_rate(d)
    # FaaSFlow extrapolates from its source: also from 10 workers observed at the reference rate.
    from_ten = profile(app, costs, throughput=ref, workers=CLUSTER)
    rows = []
    for level in LEVELS:
        rate = level * ref
        cells = {p: place(d, p, rate) for p in POLICY_NAMES}
        cells["faasflow@10"] = place(from_ten, "faasflow", rate)
        rows.append({"level": level, "rate": round(rate, 1), "policies": cells})
    return {"one_worker_rate": round(d["throughput"], 1), "reference_rate": round(ref, 1), "levels": rows}


def place_sweeps() -> dict:
    """The `clasp place` part: every app × cost set."""
    return {f"{app}-{costs}": place_sweep(app, costs) for app in ("wc", "syn") for costs in COSTS}


def table(sweeps: dict) -> str:
    """A markdown table of worker counts (peak load / W̄ in parentheses when above 1)."""
    names = POLICY_NAMES + ["faasflow@10"]
    lines = []
    for case, sweep in sweeps.items():
        lines.append(f"\n{case}: one worker {sweep['one_worker_rate']:g} req/s, "
                     f"reference (CLASP on {CLUSTER}) {sweep['reference_rate']:g} req/s\n")
        lines.append("| level | " + " | ".join(names) + " |")
        lines.append("| --- " * (len(names) + 1) + "|")
        for row in sweep["levels"]:
            cells = []
            for n in names:
                c = row["policies"][n]
                over = f" ({c['peak_load']:.2f})" if c.get("peak_load", 0) > 1 else ""
                cells.append("—" if c["workers"] is None else f"{c['workers']}{over}")
            lines.append(f"| {int(row['level'] * 100)}% | " + " | ".join(cells) + " |")
    return "\n".join(lines)


LIVE_WORKERS = 3
LIVE_RECORDS = {"wc": 200_000, "syn": 600_000}  # about 10 s per run: the control loop acts in each


def live_run(client, app, records: list, **submit) -> dict:
    """One job on the live cluster: push everything, wait for idle; throughput, workers used, answer."""
    job = client.submit(app.build_dag(), **submit)
    t0 = time.perf_counter()
    job.push(records)
    job.wait_idle(600)
    wall = time.perf_counter() - t0
    stats = job.stats(fresh=True)
    workers = max([r["workers"] for r in stats["series"]] + [stats["workers_active"]])
    out = {"records": len(records), "seconds": round(wall, 2), "throughput": round(len(records) / wall, 1),
           "workers_max": workers, "workers_end": stats["workers_active"], "migrations": len(stats["migrations"]),
           "decisions": len(stats["decisions"]), "correct": app.result(job) == app.expected(records),
           "failed": stats["failed"]}
    job.cancel()
    return out


def live(records: dict[str, int] | None = None, seed: int = 3) -> dict:
    """Live 3-worker runs: every policy on WC and SYN, and WC with local vs remote state (Fig. 4)."""
    import clasp
    from clasp.apps import get_app
    from clasp.local.cluster import LocalCluster
    from clasp.runtime.config import PlannerConfig

    records = {**LIVE_RECORDS, **(records or {})}
    inputs = {name: get_app(name).generate(n, seed) for name, n in records.items()}
    out: dict = {"workers": LIVE_WORKERS, "policies": {}, "state": {}}
    logs = tempfile.mkdtemp(prefix="clasp-bench-policies-")
    # A warm-up of 5,000 requests: the control loop acts within the first seconds of a run.
    with LocalCluster(workers=LIVE_WORKERS, port=0, log_dir=logs,
                      planner_config=PlannerConfig(warmup=5000)) as cl, \
            clasp.connect(cl.planner, timeout=30) as c:
        for name, recs in inputs.items():
            app = get_app(name)
            live_run(c, app, recs[:5000], autoscale=False)  # warm the processes up outside the measurement
            out["policies"][name] = {p: live_run(c, app, recs, autoscale=True, policy=p) for p in POLICY_NAMES}
        wc_app = get_app("wc")
        for state in ("local", "remote"):
            out["state"][state] = live_run(c, wc_app, inputs["wc"], autoscale=False, state=state)
    local, remote = out["state"]["local"]["throughput"], out["state"]["remote"]["throughput"]
    out["state"]["local_over_remote"] = round(local / remote, 2) if remote else None
    return out


def live_table(result: dict) -> str:
    """Markdown: throughput and workers per policy, and the local / remote state ratio."""
    lines = [f"\nLive, {result['workers']} workers, autoscaling on, all input pushed at once:\n",
             "| app | " + " | ".join(POLICY_NAMES) + " |", "| --- " * (len(POLICY_NAMES) + 1) + "|"]
    for app, cells in result["policies"].items():
        row = [f"{cells[p]['throughput']:,.0f}/s, {cells[p]['workers_max']} w" + ("" if cells[p]["correct"] else " ✗")
               for p in POLICY_NAMES]
        lines.append(f"| {app} ({cells['clasp']['records']:,}) | " + " | ".join(row) + " |")
    st = result["state"]
    lines.append(f"\nWC on {result['workers']} workers, spread, no autoscaling: local state "
                 f"{st['local']['throughput']:,.0f}/s, remote state {st['remote']['throughput']:,.0f}/s, "
                 f"ratio {st['local_over_remote']}x")
    return "\n".join(lines)


def benchmark(live_section: bool = True, records: dict[str, int] | None = None) -> dict:
    """Every section of the benchmark."""
    out = {"place": place_sweeps()}
    if live_section:
        out["live"] = live(records)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Worker counts per policy (clasp place) and live runs per policy.")
    ap.add_argument("--no-live", action="store_true", help="only the clasp place sweeps (under 1 s)")
    ap.add_argument("--table", action="store_true", help="print tables instead of JSON")
    ap.add_argument("--records-wc", type=int, help="WC lines per live run")
    ap.add_argument("--records-syn", type=int, help="SYN records per live run")
    args = ap.parse_args(argv)
    records = {app: n for app, n in (("wc", args.records_wc), ("syn", args.records_syn)) if n}
    result = benchmark(not args.no_live, records)
    if args.table:
        print(table(result["place"]))
        if "live" in result:
            print(live_table(result["live"]))
    else:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
