"""Runtime speed: local and remote operator chains, planner ingest, per-request cost (alpha, beta).

`python -m clasp.bench.runtime [--records N] [--json FILE]` prints one JSON object. CPU time is read from
/proc for each process, so the per-request costs do not depend on how the 2 cores were shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import clasp
from clasp.bench import cpu_seconds, emit
from clasp.bench.ingest import one_run
from clasp.local.cluster import LocalCluster

CHAIN = 10


def noop(value):
    return value


def chain_dag(n: int = CHAIN) -> clasp.Dag:
    dag = clasp.Dag("syn-chain")
    ops = [dag.operator(f"op{i}", noop) for i in range(n)]
    for a, b in zip(ops, ops[1:], strict=False):
        a >> b
    return dag


def _run(workers: int, dag: clasp.Dag, records: list, placement=None) -> dict:
    logs = tempfile.mkdtemp(prefix="clasp-bench-")
    with LocalCluster(workers=workers, log_dir=logs) as cl, \
            clasp.connect(cl.planner) as c:
        pids = {w["id"]: w["pid"] for w in c.workers()}
        job = c.submit(dag, placement=placement)
        # Warm up (imports, connections, first allocations) outside the measurement.
        job.push(records[:2000])
        job.wait_idle(60)
        cpu0 = {w: cpu_seconds(p) for w, p in pids.items()}
        t0 = time.perf_counter()
        job.push(records)
        t_push = time.perf_counter() - t0
        job.wait_idle(600)
        wall = time.perf_counter() - t0
        cpu = {w: cpu_seconds(p) - cpu0[w] for w, p in pids.items()}
        stats = job.stats(fresh=True)
    return {"wall": wall, "push_wall": t_push, "cpu": cpu, "stats": stats}


def local_chain(n_records: int) -> dict:
    r = _run(1, chain_dag(), list(range(n_records)))
    execs = n_records * CHAIN
    tau = sum(o["tau_us_mean"] for o in r["stats"]["operators"].values()) / CHAIN
    cpu = sum(r["cpu"].values())
    return {"executions_per_s": execs / r["wall"], "records": n_records, "wall_s": r["wall"],
            "worker_cpu_us_per_execution": cpu / execs * 1e6, "tau_us_noop": tau,
            # alpha: what a local hand-off costs beyond the function itself.
            "alpha_us": cpu / execs * 1e6 - tau, "latency": r["stats"]["latency"]}


def remote_chain(n_records: int) -> dict:
    placement = {f"op{i}": {i % 2: 1.0} for i in range(CHAIN)}
    r = _run(2, chain_dag(), list(range(n_records)), placement=placement)
    execs = n_records * CHAIN
    remote = n_records * (CHAIN - 1)
    tau = sum(o["tau_us_mean"] for o in r["stats"]["operators"].values()) / CHAIN
    cpu = sum(r["cpu"].values())
    return {"executions_per_s": execs / r["wall"], "records": n_records, "wall_s": r["wall"],
            "worker_cpu_us_per_execution": cpu / execs * 1e6,
            # beta: the cost of a remote chained request (send side + receive side) beyond the function.
            "beta_us": (cpu - execs * tau * 1e-6) / remote * 1e6, "latency": r["stats"]["latency"]}


def ingest(n_records: int) -> dict:
    """`clasp.bench.ingest`'s measurement, once: integers through a one-operator no-op job on 2 workers."""
    r = one_run(n_records, "int", workers=2, inflight=200_000)
    return {"records_per_s": r["records_per_s"], "push_accept_per_s": r["accept_per_s"], "records": n_records,
            "wall_s": r["wall_s"], "exact": r["exact"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000, help="records per chain run")
    ap.add_argument("--ingest-records", type=int, default=1_000_000)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    for name, fn, n in (("local_chain", local_chain, args.records), ("remote_chain", remote_chain, args.records),
                        ("planner_ingest", ingest, args.ingest_records)):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        out[name] = fn(n)
    out["targets"] = {"local_executions_per_s": 300_000, "remote_executions_per_s": 150_000,
                      "ingest_records_per_s": 300_000}
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
