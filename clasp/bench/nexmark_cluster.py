"""Nexmark Q7 (the highest bids of each 10 s window) on a real cluster of 1 and 2 workers, beside Bytewax 0.21 on
the same events, every answer checked against the reference (`clasp.apps.nexmark.reference.q7`).

`python -m clasp.bench.nexmark_cluster [--events N] [--workers 1,2] [--json FILE]`. clasp: a local planner and
N worker processes; the events in 4 JSON-lines files (`FileSource`) read by the workers, timed by their
`dateTime` (ms) with the generator's bound on disorder; the bids folded per auction in tumbling windows
(`dag.window`, key groups spread over the workers), then per window the highest of those (a stateful operator
keyed by the window's start, its state the answer). Wall time from submit to `wait_idle` (the end of the input
fires every window). Bytewax: `clasp/bench/peers/nexmark_bytewax.py`'s Q7 dataflow in one process
(`run_main`, one worker), wall time of the run. Not the same harness: clasp's number includes deploying the job
and the network hops between processes, Bytewax's none.
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
from clasp.apps.nexmark.queries import merge_max
from clasp.apps.nexmark.reference import WINDOW_MS
from clasp.connectors.file_source import FileSource
from clasp.local.cluster import LocalCluster
from clasp.windows import tumbling


def _bid(e: dict):
    return [[e["auction"], e["price"], e["bidder"], e["dateTime"]]] if e["kind"] == "bid" else None


def _max_bids(acc: list, bid: list) -> list:
    if not acc or bid[1] > acc[0]:
        return [bid[1], [bid]]
    if bid[1] == acc[0]:
        return [acc[0], acc[1] + [bid]]
    return acc


def _highest(state, window):
    return merge_max(state or [], window[3]), None


def write_events(events: list[dict], directory: Path, files: int = 4) -> str:
    """The events dealt round robin into `files` JSON-lines files (each as ordered as the stream); their glob."""
    for i in range(files):
        with open(directory / f"events-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events[i::files])
    return str(directory / "events-*.jsonl")


def q7_dag(pattern: str) -> clasp.Dag:
    dag = clasp.Dag("nexmark-q7")
    src = dag.source("events", FileSource(pattern, format="jsonl"), timestamp=lambda e: e["dateTime"],
                     max_out_of_order=max_out_of_order())
    bids = dag.operator("bids", _bid)
    per_auction = dag.window("per_auction", tumbling(WINDOW_MS), key=lambda b: b[0], fold=_max_bids, init=list,
                             timestamp=lambda b: b[3])
    highest = dag.operator("highest", _highest, stateful=True, key=lambda w: w[1])
    src >> bids >> per_auction >> highest
    return dag


def q7_rows(state: dict) -> list[list]:
    return sorted([start, start + WINDOW_MS, *bid] for start, (_, bids) in state.items() for bid in bids)


def run_clasp(events: list[dict], workers: int) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="nexmark-cluster-"))
    cluster = LocalCluster(workers=workers, port=0, log_dir=logs,
                           planner_args=["--no-autoscale", "--heartbeat", "0.2"]).start()
    try:
        with clasp.connect(cluster.planner) as client:
            dag = q7_dag(write_events(events, logs))
            t0 = time.perf_counter()
            job = client.submit(dag, autoscale=False)
            summary = job.wait_idle(timeout=600)
            dt = time.perf_counter() - t0
            exact = q7_rows({int(k): v for k, v in job.state("highest").items()}) == nx.QUERIES["q7"](events)
            stats = job.stats()["event_time"]
            job.cancel()
        return {"system": "clasp", "workers": workers, "events": len(events), "read": summary["read"],
                "seconds": round(dt, 2), "events_per_s": round(len(events) / dt), "exact": exact,
                "windows_fired": stats["windows_fired"], "late": stats["late"]}
    finally:
        cluster.stop()


def run_bytewax(events: list[dict]) -> dict:
    from bytewax.testing import TestingSink, TestingSource, run_main

    from clasp.bench.peers import nexmark_bytewax as bw

    rows: list = []
    flow = bw.build("q7", TestingSource(events, batch_size=1000), TestingSink(rows), max_out_of_order())
    t0 = time.perf_counter()
    run_main(flow)
    dt = time.perf_counter() - t0
    return {"system": "bytewax", "workers": 1, "events": len(events), "seconds": round(dt, 2),
            "events_per_s": round(len(events) / dt), "exact": bw.answer("q7", rows) == nx.QUERIES["q7"](events)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    events = nx.generate(a.events, a.seed)
    rows = [run_clasp(events, int(w)) for w in a.workers.split(",")]
    if importlib.util.find_spec("bytewax") is not None:
        rows.append(run_bytewax(events))
    for r in rows:
        print(json.dumps(r))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
