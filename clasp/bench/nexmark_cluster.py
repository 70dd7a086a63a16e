"""Nexmark Q5 (the hottest auctions of each sliding window) and Q7 (the highest bids of each window) on a real
cluster of 1 and 2 workers, beside Bytewax 0.21 on the same events, every answer checked against the reference
(`clasp.apps.nexmark.reference`).

`python -m clasp.bench.nexmark_cluster [--events N] [--workers 1,2] [--queries q5,q7] [--json FILE]`. clasp: a
local planner and N worker processes; the events in 4 JSON-lines files (`FileSource`) read by the workers,
timed by their `dateTime` (ms) with the generator's bound on disorder; each query as two stages of windows
(`dag.window`, as `clasp/apps/nexmark/queries.py`): per auction (key groups spread over the workers), then per
window (the first stage's windows timed by `result_time`). Wall time from submit to `wait_idle` (the end of the
input fires every window). Bytewax: `clasp/bench/peers/nexmark_bytewax.py`'s dataflow in one process
(`run_main`, one worker), wall time of the run. Not the same harness: clasp's number includes deploying the job,
the network hops between processes and a watermark tick per stage, Bytewax's none.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import clasp
from clasp.apps import nexmark as nx
from clasp.apps.nexmark.generator import max_out_of_order
from clasp.apps.nexmark.queries import max_bids, merge_max
from clasp.apps.nexmark.reference import Q5_SLIDE_MS, WINDOW_MS
from clasp.connectors.file_source import FileSource
from clasp.local.cluster import LocalCluster
from clasp.windows import result_time, sliding, tumbling


def _bid(e: dict):
    return [[e["auction"], e["price"], e["bidder"], e["dateTime"]]] if e["kind"] == "bid" else None


def _most(acc: list, window: list) -> list:
    """[bids, the auctions with that many] over an auction's windows [auction, start, end, bids]."""
    n = window[3]
    if not acc or n > acc[0]:
        return [n, [window[0]]]
    return [n, acc[1] + [window[0]]] if n == acc[0] else acc


def write_events(events: list[dict], directory: Path, files: int = 4) -> str:
    """The events dealt round robin into `files` JSON-lines files (each as ordered as the stream); their glob."""
    for i in range(files):
        with open(directory / f"events-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events[i::files])
    return str(directory / "events-*.jsonl")


def query_dag(query: str, pattern: str) -> clasp.Dag:
    """Q5 or Q7 as two stages of windows (as `clasp/apps/nexmark/queries.py`): per auction, then per window."""
    dag = clasp.Dag(f"nexmark-{query}")
    src = dag.source("events", FileSource(pattern, format="jsonl"), timestamp=lambda e: e["dateTime"],
                     max_out_of_order=max_out_of_order())
    bids = dag.operator("bids", _bid)
    if query == "q7":
        first = dag.window("per_auction", tumbling(WINDOW_MS), key=lambda b: b[0], fold=max_bids, init=list,
                           timestamp=lambda b: b[3])
        second = dag.window("highest", tumbling(WINDOW_MS), key=lambda w: w[1],
                            fold=lambda a, w: merge_max(a, w[3]), init=list, timestamp=result_time, collect=True)
    else:
        first = dag.window("count", sliding(WINDOW_MS, Q5_SLIDE_MS), key=lambda b: b[0], fold=lambda a, b: a + 1,
                           init=int, timestamp=lambda b: b[3])
        second = dag.window("hottest", tumbling(Q5_SLIDE_MS), key=lambda w: w[1], fold=_most, init=list,
                            timestamp=result_time, collect=True)
    src >> bids >> first >> second
    return dag


def rows(query: str, out: list) -> list[list]:
    """The second stage's windows [window start, _, _, acc] as the reference's rows."""
    if query == "q7":
        return sorted([s, s + WINDOW_MS, *bid] for s, _, _, (_, bids) in out for bid in bids)
    return sorted([s, s + WINDOW_MS, a, n] for s, _, _, (n, auctions) in out for a in auctions)


def run_clasp(events: list[dict], query: str, workers: int) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="nexmark-cluster-"))
    cluster = LocalCluster(workers=workers, port=0, log_dir=logs,
                           planner_args=["--no-autoscale", "--heartbeat", "0.2"]).start()
    try:
        with clasp.connect(cluster.planner) as client:
            dag = query_dag(query, write_events(events, logs))
            t0 = time.perf_counter()
            job = client.submit(dag, autoscale=False)
            summary = job.wait_idle(timeout=600)
            dt = time.perf_counter() - t0
            exact = rows(query, job.collected(dag.operators[-2].name)) == nx.QUERIES[query](events)
            stats = job.stats()["event_time"]
            job.cancel()
        return {"query": query, "system": "clasp", "workers": workers, "events": len(events), "read": summary["read"],
                "seconds": round(dt, 2), "events_per_s": round(len(events) / dt), "exact": exact,
                "windows_fired": stats["windows_fired"], "late": stats["late"]}
    finally:
        cluster.stop()


def run_bytewax(events: list[dict], query: str) -> dict:
    from bytewax.testing import TestingSink, TestingSource, run_main

    from clasp.bench.peers import nexmark_bytewax as bw

    out: list = []
    flow = bw.build(query, TestingSource(events, batch_size=1000), TestingSink(out), max_out_of_order())
    t0 = time.perf_counter()
    run_main(flow)
    dt = time.perf_counter() - t0
    return {"query": query, "system": "bytewax", "workers": 1, "events": len(events), "seconds": round(dt, 2),
            "events_per_s": round(len(events) / dt), "exact": bw.answer(query, out) == nx.QUERIES[query](events)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--queries", default="q5,q7")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    events = nx.generate(a.events, a.seed)
    results = []
    for q in a.queries.split(","):
        for w in a.workers.split(","):
            results.append(run_clasp(events, q, int(w)))
            print(json.dumps(results[-1]), flush=True)
        if importlib.util.find_spec("bytewax") is not None:
            results.append(run_bytewax(events, q))
            print(json.dumps(results[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
