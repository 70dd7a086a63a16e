"""Planner ingest: records/s that one client's batched `push()` gets through the planner to the workers.

`python -m clasp.bench.ingest [--records 2000000] [--kind int|line|blob] [--workers 2] [--runs 3] [--time]
[--compare TREE] [--json FILE]` starts a fresh local cluster per run (a one-operator no-op job, as
`clasp.bench.runtime`'s ingest; with `--time` its operator is a push source with event time, `Dag.push_source`,
so the figures include what marking the pushed chunks with their watermark costs), pushes the records in one
call after a warm-up and reports:
`records_per_s` (push start to idle: every record dispatched, executed and completed), `accept_per_s`
(push start until `push()` returned), and the CPU per record of the planner, the workers and the client
(from /proc). `--compare TREE` runs the same measurement against the clasp package of another checkout
(e.g. a `git worktree` of main) in alternation, A B A B ..., each run in its own process with PYTHONPATH
set to its tree, and prints both medians and the pairwise ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The checkout this file is in (the directory holding its `clasp` package): run A of `--compare`.
TREE = os.path.dirname(os.path.dirname(HERE))


def make_records(kind: str, n: int) -> list:
    if kind == "int":
        return list(range(n))
    if kind == "line":  # a Word Count line's size (~60 bytes)
        return [f"{i} the quick brown fox jumps over the lazy dog again and again" for i in range(n)]
    if kind == "blob":
        return [f"{i}:" + "x" * 1000 for i in range(n)]
    raise SystemExit(f"unknown --kind {kind}")


def noop(value):
    return None


def position(value) -> float:
    """The event time of a record under `--time`: its position in the input (records are pushed in order)."""
    return float(value) if isinstance(value, int) else float(value.split(maxsplit=1)[0].split(":")[0])


def one_run(n: int, kind: str, workers: int, inflight: int, extra: list[str] = (), chunk: int = 0,
            timed: bool = False) -> dict:
    """One fresh cluster, one measured push; the figures of this run."""
    # Imported here, not at the top: under `--compare` this file runs with PYTHONPATH set to another checkout,
    # whose clasp is the one measured.
    import clasp
    from clasp.bench.cluster_engine import cpu_seconds
    from clasp.local.cluster import LocalCluster

    records = make_records(kind, n)
    dag = clasp.Dag("sink")
    if timed:
        dag.push_source("pushed", timestamp=position) >> dag.operator("sink", noop)
    else:
        dag.operator("sink", noop)
    logs = tempfile.mkdtemp(prefix="clasp-ingest-")
    with LocalCluster(workers=workers, planner_args=["--max-inflight", str(inflight), "--no-autoscale", *extra],
                      log_dir=logs, provider="static") as cl, clasp.connect(cl.planner) as c:
        pids = {"planner": cl.procs[0].pid, **{f"worker{i}": w["pid"] for i, w in enumerate(c.workers())}}
        job = c.submit(dag, autoscale=False)
        job.push(records[:5000])  # warm-up: imports, connections, first allocations
        job.wait_idle(60)
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        own0 = time.process_time()
        t0 = time.perf_counter()
        job.push(records, chunk) if chunk else job.push(records)
        t_push = time.perf_counter() - t0
        idle = job.wait_idle(600)
        wall = time.perf_counter() - t0
        own = time.process_time() - own0
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        stats = job.stats(fresh=True)
    workers_cpu = sum(v for k, v in cpu.items() if k.startswith("worker"))
    return {"records": n, "kind": kind, "workers": workers, "records_per_s": round(n / wall),
            "accept_per_s": round(n / t_push), "wall_s": round(wall, 3), "push_s": round(t_push, 3),
            "planner_us_per_record": round(cpu["planner"] / n * 1e6, 3),
            "workers_us_per_record": round(workers_cpu / n * 1e6, 3),
            "client_us_per_record": round(own / n * 1e6, 3),
            "completed": stats["completed"], "lost": idle.get("lost", 0),
            "exact": stats["completed"] == n + 5000 and not idle.get("lost")}


def run_in(tree: str, args) -> dict:
    """One run in a process of its own, importing clasp from `tree`."""
    env = {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, os.path.join(HERE, "ingest.py"), "--one", "--records", str(args.records),
            "--kind", args.kind, "--workers", str(args.workers), "--inflight", str(args.inflight),
            "--chunk", str(args.chunk), *(["--time"] if args.time else []),
            *[f"--planner-arg={a}" for a in args.planner_arg]]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"a run in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


FIGURES = ("records_per_s", "accept_per_s", "planner_us_per_record", "workers_us_per_record",
           "client_us_per_record")


def summary(runs: list[dict]) -> dict:
    return {f: statistics.median(r[f] for r in runs) for f in FIGURES} | {
        "exact": all(r["exact"] for r in runs), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clasp.bench.ingest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--kind", default="int", help="int (default), line (~60 B strings) or blob (1 KB strings)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=200_000, help="the planner's --max-inflight")
    ap.add_argument("--planner-arg", action="append", default=[], help="one more planner argument (repeatable)")
    ap.add_argument("--chunk", type=int, default=0, help="push(chunk=...): the most records a push (0: the default)")
    ap.add_argument("--time", action="store_true", help="push into a push source with event time")
    ap.add_argument("--runs", type=int, default=3, help="runs (pairs with --compare)")
    ap.add_argument("--compare", metavar="TREE", help="another checkout to run in alternation (B)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        r = one_run(args.records, args.kind, args.workers, args.inflight, args.planner_arg, args.chunk, args.time)
        print(json.dumps(r), flush=True)
        return 0
    trees = {"A": TREE} | ({"B": os.path.abspath(args.compare)} if args.compare else {})
    runs: dict[str, list] = {k: [] for k in trees}
    for i in range(args.runs):
        for k, tree in trees.items():
            r = run_in(tree, args)
            runs[k].append(r)
            print(json.dumps({"run": i, "tree": k, **r}), file=sys.stderr, flush=True)
    out = {"command": "python -m clasp.bench.ingest " + " ".join(argv if argv is not None else sys.argv[1:]),
           "trees": trees, **{k: summary(v) for k, v in runs.items()}}
    if args.compare:
        out["ratio_A_over_B"] = {f: statistics.median(a[f] / b[f] for a, b in zip(runs["A"], runs["B"],
                                                                                     strict=True))
                                 for f in FIGURES}
    text = json.dumps({k: v for k, v in out.items()}, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0 if all(summary(v)["exact"] for v in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
