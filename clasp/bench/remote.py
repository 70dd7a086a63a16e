"""Word Count on 1 and 2 quota-limited workers: what the remote path costs the cluster
(docs/results-log.md, "Remote path").

`python -m clasp.bench.remote [--cpu-per-worker 0.25] [--rounds 3] [--seconds 8] [--json FILE]`; run as a file,
`PYTHONPATH=OTHER_CHECKOUT python clasp/bench/remote.py` measures another checkout's runtime the same way.
Each round runs WC unthrottled (`clasp.bench.cluster_engine.unthrottled`: the spread placement, key groups
owned by their measured weights, every answer checked) on 1 and on 2 workers, alternating which goes first;
prints a JSON line per run and the medians, lines/s, and 2 / 1. The workers are limited to F CPUs each
(a cgroup quota, as in `clasp.bench.calibrate`), so 2 workers have twice the CPU of one and the ratio measures
what remote chained requests cost, not how many cores the host has free.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from clasp.bench import cluster_engine as ce
from clasp.bench import emit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-per-worker", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json", help="write every run and the medians here")
    args = ap.parse_args(argv)
    runs = []
    try:
        for rnd in range(args.rounds):
            for n in ((1, 2) if rnd % 2 == 0 else (2, 1)):
                r = ce.unthrottled("wc", n, cpu_per_worker=args.cpu_per_worker, seconds=args.seconds)
                if not r["correct"]:
                    raise SystemExit(f"WC on {n} workers: wrong counts")
                cpu = {k: round(v / r["cpu_window_s"], 3) for k, v in r["cpu_s"].items()}
                row = {"round": rnd, "workers": n, "lines_per_s": round(r["throughput"], 1),
                       "cpu_per_s": cpu, "remote": sum(w["remote"] for w in r["per_worker"].values())}
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        ce.shutdown()
    med = {n: statistics.median(r["lines_per_s"] for r in runs if r["workers"] == n) for n in (1, 2)}
    summary = {"cpu_per_worker": args.cpu_per_worker, "rounds": args.rounds, "seconds": args.seconds,
               "median_lines_per_s": {str(n): v for n, v in med.items()}, "two_over_one": round(med[2] / med[1], 3),
               "runs": runs}
    return emit(summary, args.json, unprinted=("runs",))


if __name__ == "__main__":
    sys.exit(main())
