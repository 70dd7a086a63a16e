"""What CURVE costs: β (remote chained request) and Word Count throughput, CURVE against --insecure.

`python -m clasp.bench.curve [--rounds 3] [--records N] [--lines N] [--json FILE]` prints one JSON object. Each
measurement starts a fresh 2-worker local cluster (`bench.hosts._run`), with ephemeral CURVE keys (the
default) or `insecure=True`; the two modes alternate within each round (A B, B A, ...), so both see the
same machine, and the figures are medians over rounds:

- β as `bench.runtime` defines it: a 10-operator no-op chain alternating between the 2 workers; both
  workers' CPU time per remote chained request beyond the functions (µs);
- Word Count on 2 workers, spread placement, autoscale off (the shuffle makes most chained requests
  remote): lines per second from the first push to idle, the answer checked.

`overhead`: 1 - CURVE / plaintext for throughput, CURVE / plaintext - 1 for β.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

from clasp.bench import emit
from clasp.bench.hosts import _run, lines, wordcount_dag
from clasp.bench.runtime import CHAIN, chain_dag

MODES = {"curve": {}, "insecure": {"insecure": True}}


def beta(mode: str, n: int) -> float:
    r = _run(MODES[mode], chain_dag(), list(range(n)), placement={f"op{i}": {i % 2: 1.0} for i in range(CHAIN)})
    tau = sum(o["tau_us_mean"] for o in r["stats"]["operators"].values()) / CHAIN
    return (r["cpu"] - n * CHAIN * tau * 1e-6) / (n * (CHAIN - 1)) * 1e6


def word_count(mode: str, text: list[str]) -> tuple[float, float]:
    """Lines per second, and both workers' CPU µs per line (less sensitive to a shared machine's noise)."""
    r = _run(MODES[mode], wordcount_dag(), text)
    if r["state"] != dict(collections.Counter(w for line in text[:2000] + text for w in line.split())):
        raise SystemExit(f"word count was wrong ({mode})")
    return len(text) / r["wall"], r["cpu"] / len(text) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=100_000, help="records per remote-chain run (β)")
    ap.add_argument("--lines", type=int, default=100_000, help="lines per Word Count run")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    text = lines(args.lines)
    runs: dict = {m: {"beta_us": [], "wc_lines_per_s": [], "wc_cpu_us_per_line": []} for m in MODES}
    for r in range(args.rounds):
        for mode in ("curve", "insecure") if r % 2 == 0 else ("insecure", "curve"):
            b, (wc, wc_cpu) = beta(mode, args.records), word_count(mode, text)
            runs[mode]["beta_us"].append(round(b, 2))
            runs[mode]["wc_lines_per_s"].append(round(wc, 1))
            runs[mode]["wc_cpu_us_per_line"].append(round(wc_cpu, 2))
            print(f"round {r + 1}/{args.rounds} {mode}: beta {b:.1f} us, wc {wc:.0f} lines/s, {wc_cpu:.1f} us CPU "
                  "per line", file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(v) for k, v in xs.items()} for m, xs in runs.items()}
    c, p = med["curve"], med["insecure"]
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "rounds": args.rounds,
           "records": args.records, "lines": args.lines, "runs": runs, "median": med,
           "overhead": {"wc_throughput": round(1 - c["wc_lines_per_s"] / p["wc_lines_per_s"], 4),
                        "wc_cpu_per_line": round(c["wc_cpu_us_per_line"] / p["wc_cpu_us_per_line"] - 1, 4),
                        "beta": round(c["beta_us"] / p["beta_us"] - 1, 4)}}
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
