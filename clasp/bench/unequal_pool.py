"""An unequal pool, emulated: `clasp` against `clasp-paper` on workers with different CPU quotas, one run.

`python -m clasp.bench.unequal_pool [--quotas 0.2,0.2,0.4,0.6] [--apps wc,syn] [--policies clasp,clasp-paper]
[--seconds 10] [--warmup 4] [--repeat 2] [--json FILE]`

One LocalCluster whose workers stand for unequal hosts (a cgroup quota each, root). Per repeat, app and
policy (interleaved, so the host's drift hits every policy alike): a job submitted under the policy with
autoscaling off, run saturated for `--warmup` s so the planner's estimator sees the workers, then
`job.scale(n)` onto the whole pool with that policy's placement, and measured unthrottled (the planner's
queue kept full) for `--seconds`. Reported per run: throughput (completed records/s over the window),
each worker's share of the executions and its CPU use against its quota, the placement, and the answer
checked against the app's independent `expected()`. JSON lines on stdout, a summary at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import clasp
from clasp.apps import get_app
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig


def _saturate(job, app, seed: int, until: float, chunk: int = 5000) -> list:
    """Push generated records while the planner's queue is short, until `until`; returns what was pushed."""
    pushed: list = []
    i = 0
    while time.monotonic() < until:
        if job.stats()["queued"] < 4 * chunk:
            batch = app.generate(chunk, seed=seed * 1000 + i)
            job.push(batch)
            pushed += batch
            i += 1
        else:
            time.sleep(0.02)
    return pushed


def run_one(cluster: LocalCluster, app_name: str, policy: str, seconds: float, warmup: float, seed: int) -> dict:
    app = get_app(app_name)
    with clasp.connect(cluster.planner, timeout=60) as client:
        job = client.submit(app.build_dag(), autoscale=False, policy=policy)
        try:
            pushed = _saturate(job, app, seed, time.monotonic() + warmup)
            migration = job.scale(cluster.n_workers)
            start = job.stats(fresh=True)
            t0 = time.monotonic()
            box: dict = {}
            pusher = threading.Thread(target=lambda: box.update(p=_saturate(job, app, seed + 1, t0 + seconds)))
            pusher.start()
            pusher.join()
            end = job.stats(fresh=True)
            elapsed = time.monotonic() - t0
            pushed += box["p"]
            job.wait_idle(timeout=120)
            correct = app.result(job) == app.expected(pushed)
            per = {}
            for w, s in end["workers"].items():
                done = sum(o["processed"] for o in (s.get("counters") or {}).get("operators", {}).values())
                before = sum(o["processed"] for o in
                             (start["workers"].get(w, {}).get("counters") or {}).get("operators", {}).values())
                per[w] = {"executions": done - before, "cpu_us": s.get("cpu_us")}
            total = sum(p["executions"] for p in per.values()) or 1
            for p in per.values():
                p["share"] = round(p["executions"] / total, 4)
            return {"app": app_name, "policy": policy, "throughput": (end["completed"] - start["completed"]) / elapsed,
                    "correct": correct, "workers": per, "placement": end["placement"],
                    "model": end.get("model"), "migration_s": migration.get("duration_s")}
        finally:
            job.cancel()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quotas", default="0.2,0.2,0.4,0.6")
    ap.add_argument("--apps", default="wc,syn")
    ap.add_argument("--policies", default="clasp,clasp-paper")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    quotas = [float(q) for q in args.quotas.split(",")]
    apps = [a for a in args.apps.split(",") if a]
    policies = [p for p in args.policies.split(",") if p]
    rows = []
    with LocalCluster(workers=len(quotas), port=0, cpu_per_worker=quotas,
                      planner_config=PlannerConfig(autoscale=False)) as cluster:
        quota_of = dict(zip(cluster.worker_ids, quotas, strict=True))
        for k in range(args.repeat):
            for app in apps:
                for policy in policies:
                    r = run_one(cluster, app, policy, args.seconds, args.warmup, seed=k * 10 + 1)
                    for w, p in r["workers"].items():
                        p["quota"] = quota_of.get(w)
                    r["repeat"] = k
                    rows.append(r)
                    print(json.dumps({x: r[x] for x in ("repeat", "app", "policy", "throughput", "correct")}
                                     | {"shares": {w: (p["quota"], p["share"]) for w, p in r["workers"].items()}}),
                          flush=True)
    summary: dict = {"quotas": quotas, "seconds": args.seconds, "repeat": args.repeat, "apps": {}}
    for app in apps:
        mean = {p: statistics.fmean(r["throughput"] for r in rows if r["app"] == app and r["policy"] == p)
                for p in policies}
        big = max(quotas)
        small = min(quotas)
        share = {p: {"largest": statistics.fmean(w["share"] for r in rows if r["app"] == app and r["policy"] == p
                                                 for w in r["workers"].values() if w["quota"] == big),
                     "smallest": statistics.fmean(w["share"] for r in rows if r["app"] == app and r["policy"] == p
                                                  for w in r["workers"].values() if w["quota"] == small)}
                 for p in policies}
        summary["apps"][app] = {"throughput": mean, "share_per_worker": share,
                                "correct": all(r["correct"] for r in rows if r["app"] == app)}
    print(json.dumps({"summary": summary}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
