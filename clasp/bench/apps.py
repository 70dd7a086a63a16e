"""Unthrottled throughput of every app on one worker: `clasp run APP --profile unthrottled --workers 1`.

`python -m clasp.bench.apps [--apps wc,sd] [--seconds S] [--json FILE]` prints one JSON object: per app the
lines (input records) per second from the first push to idle, the per-second peak, the answer check,
and each operator's mean execution time per request (µs, the workers' exact counters).

Each app first runs a short warm-up job (imports, connections, first allocations, and a rate estimate),
then a measured job sized to last about `--seconds`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import clasp
from clasp.apps import APPS, get_app
from clasp.bench import emit
from clasp.core.profiles import parse_profile
from clasp.local.cluster import LocalCluster
from clasp.runtime.driver import Driver

WARMUP = 10_000


def _drive(client, app, records) -> tuple[dict, dict]:
    job = client.submit(app.build_dag())
    d = Driver(job, app, records, parse_profile("unthrottled"), submitted_at=time.monotonic())
    summary = d.run()
    stats = job.stats(fresh=True)
    job.cancel()
    return summary, stats


def bench_app(client, name: str, seconds: float, seed: int) -> dict:
    app = get_app(name)
    warm, _ = _drive(client, app, app.generate(WARMUP, seed + 1))
    n = int(min(400_000, max(WARMUP, (warm["records_per_s"] or 1000) * seconds)))
    summary, stats = _drive(client, app, app.generate(n, seed))
    return {"lines_per_s": round(summary["records_per_s"], 1), "records": n,
            "seconds": round(summary["duration_s"], 2), "throughput_max": round(summary["throughput_max"], 1),
            "latency_ms": summary["latency_ms"], "correct": summary["correct"],
            "tau_us": {op: round(o.get("tau_us_mean", 0.0), 2) for op, o in stats["operators"].items()},
            "requests": {op: o["processed"] for op, o in stats["operators"].items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--apps", default=",".join(APPS), help="comma-separated app names")
    ap.add_argument("--seconds", type=float, default=8.0, help="about how long each measured run lasts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    names = [a.strip() for a in args.apps.split(",") if a.strip()]
    for n in names:
        get_app(n)
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out: dict = {"machine": machine, "workers": 1, "apps": {}}
    logs = tempfile.mkdtemp(prefix="clasp-bench-apps-")
    with LocalCluster(workers=1, log_dir=logs) as cl, clasp.connect(cl.planner) as c:
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            out["apps"][name] = r = bench_app(c, name, args.seconds, args.seed)
            print(f"  {name}: {r['lines_per_s']:.0f} lines/s, correct={r['correct']}", file=sys.stderr,
                  flush=True)
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
