"""What `--hosts` costs: the remote chain and Word Count on 2 workers, over loopback and across namespaces.

`python -m clasp.bench.hosts [--rounds R] [--records N] [--lines N] [--json FILE]` prints one JSON object. The
two set-ups alternate within each round, so both see the same machine; the figures are medians over
rounds, and `ratio` is hosts / loopback (below 1: slower across the bridge). Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

import clasp
from clasp.bench import cpu_seconds, emit
from clasp.bench.runtime import CHAIN, chain_dag
from clasp.local.cluster import LocalCluster


def split(line):
    return line.split()


def count(state, word):
    return (state or 0) + 1, None


def wordcount_dag() -> clasp.Dag:
    dag = clasp.Dag("wordcount")
    dag.operator("split", split) >> dag.operator("count", count, stateful=True, key=lambda w: w)
    return dag


def lines(n: int) -> list[str]:
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    return [" ".join(rng.choices(words, k=rng.randint(10, 20))) for _ in range(n)]


def _run(cluster: dict, dag: clasp.Dag, records: list, placement=None, singles: int = 0) -> dict:
    """One job on a fresh 2-worker LocalCluster(**cluster) (`bench.curve` uses it too)."""
    logs = tempfile.mkdtemp(prefix="clasp-bench-hosts-")
    with LocalCluster(workers=2, log_dir=logs, **cluster) as cl, clasp.connect(cl.planner) as c:
        pids = {w["id"]: w["pid"] for w in c.workers()}
        job = c.submit(dag, placement=placement, autoscale=False)
        job.push(records[:2000])  # warm-up: imports, connections, first allocations
        job.wait_idle(60)
        cpu0 = {w: cpu_seconds(p) for w, p in pids.items()}
        t0 = time.perf_counter()
        job.push(records)
        job.wait_idle(600)
        wall = time.perf_counter() - t0
        cpu = sum(cpu_seconds(p) - cpu0[w] for w, p in pids.items())
        stats = job.stats(fresh=True)
        state = job.state("count") if "count" in stats["operators"] else None
        # One record at a time: an idle worker sends at once, so this is the chain's hops end to end.
        single = []
        for r in records[:singles]:
            t = time.perf_counter()
            job.push([r])
            job.wait_idle(10)
            single.append(time.perf_counter() - t)
    return {"wall": wall, "cpu": cpu, "stats": stats, "state": state, "single": single}


def remote_chain(hosts: bool, n: int) -> dict:
    r = _run({"hosts": hosts}, chain_dag(), list(range(n)), placement={f"op{i}": {i % 2: 1.0} for i in range(CHAIN)},
             singles=200)
    return {"executions_per_s": n * CHAIN / r["wall"],
            "worker_cpu_us_per_remote_request": r["cpu"] / (n * (CHAIN - 1)) * 1e6,
            "latency_p50_ms": r["stats"]["latency"]["p50"] * 1e3,
            # push + 9 remote hops + completion, from the client: what the network stack adds per hop shows here.
            "single_record_ms": statistics.median(r["single"]) * 1e3}


def word_count(hosts: bool, text: list[str]) -> dict:
    r = _run({"hosts": hosts}, wordcount_dag(), text)
    # The warm-up counted its lines too.
    expected = collections.Counter(w for line in text[:2000] + text for w in line.split())
    if r["state"] != dict(expected):
        raise SystemExit(f"word count was wrong with hosts={hosts}")
    return {"lines_per_s": len(text) / r["wall"], "latency_p50_ms": r["stats"]["latency"]["p50"] * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=200_000, help="records per remote-chain run")
    ap.add_argument("--lines", type=int, default=100_000, help="lines per Word Count run")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    text = lines(args.lines)
    runs: dict = {b: {"loopback": [], "hosts": []} for b in ("remote_chain", "word_count")}
    for r in range(args.rounds):
        for hosts in (False, True) if r % 2 == 0 else (True, False):
            mode = "hosts" if hosts else "loopback"
            print(f"round {r + 1}/{args.rounds}: {mode}", file=sys.stderr, flush=True)
            runs["remote_chain"][mode].append(remote_chain(hosts, args.records))
            runs["word_count"][mode].append(word_count(hosts, text))
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "rounds": args.rounds}
    for bench, modes in runs.items():
        med = {mode: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for mode, xs in modes.items()}
        rate = "executions_per_s" if bench == "remote_chain" else "lines_per_s"
        out[bench] = {**med, "ratio": med["hosts"][rate] / med["loopback"][rate]}
    chain = out["remote_chain"]
    chain["single_record_ratio"] = chain["hosts"]["single_record_ms"] / chain["loopback"]["single_record_ms"]
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
