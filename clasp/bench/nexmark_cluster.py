"""The Nexmark queries (Q0-Q5, Q7, Q8) on a real cluster of 1 and 2 workers, beside Bytewax 0.21 on the same events,
every answer checked exactly against the reference (`clasp.apps.nexmark.reference`).

`python -m clasp.bench.nexmark_cluster [--events N] [--workers 1,2] [--queries q0,q5,...] [--rounds R]
[--bytewax-feed json|memory] [--bytewax-processes 1,2] [--bytewax-slack-ms MS] [--json FILE]`. clasp: a local
planner and N worker processes with the defaults (checkpoints every 1 s, CURVE); the events in 8 JSON-lines files
per worker, as many as each Bytewax process gets (`FileSource`; Q3 and Q8 decode only the lines of people and
auctions, `SELECTED_KINDS`, and so does Bytewax), read by the workers, timed by their `dateTime`
(ms) with the generator's bound on disorder; each query as the stages of `clasp/apps/nexmark/queries.py` in a DAG:
maps as operators, keyed stages as `dag.window`, `dag.join` (Q3's unbounded interval join, Q8's window join) or
`dag.timers` (Q4's auctions closing at their expiry, Q8's distinct people), key groups spread over the workers; Q5
and Q7 as two stages of windows (the second timed by `result_time`). Timed: submit to `wait_idle` (the end of the
input fires every window and timer), the cluster already started and the query run once on its first 2,000 events
(untimed: the planner and the workers import the query's module when they unpickle its functions, as Bytewax's
processes import theirs before the go). Bytewax: `clasp/bench/peers/nexmark_bytewax.py`'s dataflow in one process
(`run_main`, one worker), the run timed; with `--bytewax-feed json` (the default) it is given the events' JSON
lines and decodes each (by orjson, as clasp's readers do in `FileSource`; `json.loads` where orjson is absent),
`memory` the decoded dicts.
Bytewax also runs as 1 and 2 processes of one worker each (`--bytewax-processes`, default the `--workers` counts;
`run_bytewax_processes`), as the Word Count bench runs it (`python -m bytewax.run -i/-a`), reading the events from
JSON-lines files with its `DirSource` and decoding them, timed from the go its processes wait for to the last
worker's rows: clasp's N workers are compared with N Bytewax processes. Its processes' readers are not aligned in
event time, so their clock waits `--bytewax-slack-ms` (5 s) beyond the generator's bound, enough for an exact
answer. Each round runs every system once per query, the order alternating between rounds; the figures are medians
over the rounds.

Start-up is not the same on both sides: clasp's time includes deploying the job to the workers, the network
hops between processes and a watermark release per stage, Bytewax's building its dataflow in process. So each
round also runs every query on `--fixed-events` events (default 2,000) and the table gives, besides the whole
run's events/s, the marginal rate `(N - n) / (T_N - T_n)`: what the extra events cost, fixed costs out; and the
CPU per event (clasp: its planner's and workers' CPU seconds over the timed span, from /proc; Bytewax: its
process's), which a shared host disturbs less than wall time. The last lines are each query's ratios, clasp's
rate over Bytewax's and Bytewax's CPU per event over clasp's (above 1: clasp ahead), beside the one Bytewax process
in memory and beside as many Bytewax processes as clasp has workers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path

import clasp
from clasp.apps import nexmark as nx
from clasp.apps.nexmark.generator import max_out_of_order
from clasp.apps.nexmark.queries import (
    auction_fn,
    auction_rows,
    auction_timer,
    category_fn,
    forget,
    max_bids,
    merge_max,
    no_timer,
    once,
)
from clasp.apps.nexmark.reference import Q2_MODULUS, Q3_CATEGORY, Q3_STATES, Q5_SLIDE_MS, WINDOW_MS, euros
from clasp.bench import cpu_seconds
from clasp.connectors import Source
from clasp.connectors.file_source import FileSource
from clasp.local.cluster import LocalCluster
from clasp.windows import IntervalJoin, result_time, sliding, tumbling


def _bid(e: dict):
    return [[e["auction"], e["price"], e["bidder"], e["dateTime"]]] if e["kind"] == "bid" else None


def _most(acc: list, window: list) -> list:
    """[bids, the auctions with that many] over an auction's windows [auction, start, end, bids]."""
    n = window[3]
    if not acc or n > acc[0]:
        return [n, [window[0]]]
    return [n, acc[1] + [window[0]]] if n == acc[0] else acc


def _q0(e: dict):
    return [[e["auction"], e["bidder"], e["price"], e["dateTime"], e["extra"]]] if e["kind"] == "bid" else None


def _q1(e: dict):
    return [[e["auction"], e["bidder"], euros(e["price"]), e["dateTime"], e["extra"]]] if e["kind"] == "bid" else None


def _q2(e: dict):
    return [[e["auction"], e["price"]]] if e["kind"] == "bid" and e["auction"] % Q2_MODULUS == 0 else None


# Keyed stages read rows [key, event time, value], as the in-process stages of `clasp/apps/nexmark/queries.py`
# do: the functions below hand those stages' functions the value (Q4's take the row itself, in both). A field is
# read by `itemgetter`, a call in C (a key or an event time is had once a record).
_row_key, _row_time = itemgetter(0), itemgetter(1)


def _sellers(e: dict):
    if e["kind"] == "person" and e["state"] in Q3_STATES:
        return [[e["id"], e["dateTime"], [e["name"], e["city"], e["state"]]]]
    return None


def _category_auctions(e: dict):
    return [[e["seller"], e["dateTime"], e["id"]]] if e["kind"] == "auction" and e["category"] == Q3_CATEGORY else None


def _people(e: dict):
    if e["kind"] == "person":
        ts = e["dateTime"]
        return [[e["id"], ts, [e["id"], e["name"], ts - ts % WINDOW_MS]]]
    return None


def _opened(e: dict):
    return [[e["seller"], e["dateTime"], e["id"]]] if e["kind"] == "auction" else None


def _by_person(joined: list):
    person = joined[1][2]  # [id, name, window start]
    return [[joined[0], person[2] + WINDOW_MS - 1, person]]


def _distinct(state, row: list, timers):
    return once(state, row[2], timers)


WARM_UP_EVENTS = 2000  # the untimed run of a query on its cluster before the timed one (`run_clasp`)
# Q3 and Q8 read people and auctions only, 8 % of the events: both systems pick those lines by their kind, as
# `write_events` writes it, before decoding them (clasp's `FileSource(select=...)`, Bytewax's decoding step).
# The queries still test each event's kind, so the answers are the same.
SELECTED_KINDS = {"q3": ("person", "auction"), "q8": ("person", "auction")}


def kind_marks(query: str) -> list[str] | None:
    """The text a JSON line of one of the kinds `query` reads holds, if it reads only some (else None)."""
    kinds = SELECTED_KINDS.get(query)
    return None if kinds is None else [json.dumps({"kind": k})[1:-1] for k in kinds]


def write_events(events: list[dict], directory: Path, files: int = 4) -> str:
    """The events dealt round robin into `files` JSON-lines files (each as ordered as the stream); their glob."""
    for i in range(files):
        with open(directory / f"events-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events[i::files])
    return str(directory / "events-*.jsonl")


def query_dag(query: str, pattern: str | Source, timestamp: Callable = itemgetter("dateTime")) -> clasp.Dag:
    """A query as a DAG: the stages of `clasp/apps/nexmark/queries.py`, each keyed one a window, join or timers
    operator; Q5 and Q7 as two stages of windows (the second timed by `result_time`). Its answer is collected
    at the operator `answer_operator(query)`. The events come from the JSON-lines files of glob `pattern` (or
    from a source), timed by `timestamp`."""
    dag = clasp.Dag(f"nexmark-{query}")
    if isinstance(pattern, str):
        marks = kind_marks(query)
        select = None if marks is None else [m.encode() for m in marks]
        source = FileSource(pattern, format="jsonl", select=select)
    else:
        source = pattern
    src = dag.source("events", source, timestamp=timestamp, max_out_of_order=max_out_of_order())
    if query in ("q0", "q1", "q2"):
        src >> dag.operator("answer", {"q0": _q0, "q1": _q1, "q2": _q2}[query], collect=True)
    elif query == "q3":
        dag.join("join", src >> dag.operator("sellers", _sellers),
                        src >> dag.operator("auctions", _category_auctions), IntervalJoin(-math.inf, math.inf),
                        key=(_row_key, _row_key), timestamp=(_row_time, _row_time), collect=True)
    elif query == "q4":
        # Rows [key, event time, ...] straight into the timer functions, which read them whole: a call a record.
        src >> dag.operator("auctions_and_bids", auction_rows) >> dag.timers(
            "close", auction_fn, auction_timer, key=_row_key, timestamp=_row_time) >> dag.timers(
            "average", category_fn, no_timer, key=_row_key, timestamp=_row_time, collect=True)
    elif query == "q8":
        join = dag.join("join", src >> dag.operator("people", _people), src >> dag.operator("sellers", _opened),
                        tumbling(WINDOW_MS), key=(_row_key, _row_key), timestamp=(_row_time, _row_time))
        join >> dag.operator("by_person", _by_person) >> dag.timers(
            "distinct", _distinct, forget, key=_row_key, timestamp=_row_time, collect=True)
    else:
        bids = dag.operator("bids", _bid)
        if query == "q7":
            first = dag.window("per_auction", tumbling(WINDOW_MS), key=itemgetter(0), fold=max_bids, init=list,
                               timestamp=itemgetter(3))
            second = dag.window("highest", tumbling(WINDOW_MS), key=itemgetter(1),
                                fold=lambda a, w: merge_max(a, w[3]), init=list, timestamp=result_time, collect=True)
        else:
            first = dag.window("count", sliding(WINDOW_MS, Q5_SLIDE_MS), key=itemgetter(0),
                               fold=lambda a, b: a + 1, init=int, timestamp=itemgetter(3))
            second = dag.window("hottest", tumbling(Q5_SLIDE_MS), key=itemgetter(1), fold=_most, init=list,
                                timestamp=result_time, collect=True)
        src >> bids >> first >> second
    return dag


def answer_operator(query: str) -> str:
    return {"q3": "join", "q4": "average", "q5": "hottest", "q7": "highest", "q8": "distinct"}.get(query, "answer")


def rows(query: str, out: list) -> list[list]:
    """What the answer operator collected, as the reference's rows."""
    if query in ("q0", "q1", "q2"):
        return sorted(out)  # the reference's is the input order; the workers' order is theirs
    if query == "q3":
        return sorted([*seller[2], auction[2]] for _, seller, auction in out)
    if query == "q4":
        last: dict = {}
        for category, n, total, avg in out:  # each category's running average: the one over the most auctions
            if category not in last or n > last[category][1]:
                last[category] = [category, n, total, avg]
        return sorted(last.values())
    if query == "q7":
        return sorted([s, s + WINDOW_MS, *bid] for s, _, _, (_, bids) in out for bid in bids)
    if query == "q8":
        return sorted(out)
    return sorted([s, s + WINDOW_MS, a, n] for s, _, _, (n, auctions) in out for a in auctions)


def reference(query: str, events: list[dict]) -> list[list]:
    want = nx.QUERIES[query](events)
    return sorted(want) if query in ("q0", "q1", "q2") else want


def run_clasp(events: list[dict], query: str, workers: int, files_per_worker: int = 8) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="nexmark-cluster-"))
    cluster = LocalCluster(workers=workers, port=0, log_dir=logs,
                           planner_args=["--no-autoscale", "--heartbeat", "0.2"]).start()
    try:
        with clasp.connect(cluster.planner) as client:
            # The query once on a few events first, untimed, as Bytewax's processes are started and import the
            # query before the go they wait for: the planner and the workers import its module then (the
            # function's unpickling), not in the timed job.
            warm = logs / "warm-up"
            warm.mkdir()
            w0 = time.perf_counter()
            first = client.submit(query_dag(query, write_events(events[:WARM_UP_EVENTS], warm, workers)),
                                  autoscale=False)
            warmed = first.wait_idle(timeout=120)["read"]
            first.cancel()
            warm_up_s = time.perf_counter() - w0
            dag = query_dag(query, write_events(events, logs, files_per_worker * workers))
            pids = [cluster.info()["pids"]["planner"], *cluster.info()["pids"]["workers"]]
            cpu0 = sum(map(cpu_seconds, pids))
            t0 = time.perf_counter()
            job = client.submit(dag, autoscale=False)
            summary = job.wait_idle(timeout=600)
            dt = time.perf_counter() - t0
            cpu = sum(map(cpu_seconds, pids)) - cpu0
            exact = rows(query, job.collected(answer_operator(query))) == reference(query, events)
            stats = job.stats()["event_time"]
            job.cancel()
        return {"query": query, "system": "clasp", "workers": workers, "events": len(events), "read": summary["read"],
                "seconds": round(dt, 3), "events_per_s": round(len(events) / dt), "cpu_s": round(cpu, 2),
                "exact": exact, "windows_fired": stats["windows_fired"], "late": stats["late"],
                "warm_up": {"events": warmed, "seconds": round(warm_up_s, 3)}}
    finally:
        cluster.stop()
        # The logs stay; the events' copies would fill the disk.
        for f in [*logs.glob("events-*.jsonl"), *logs.glob("warm-up/events-*.jsonl")]:
            f.unlink()


def run_bytewax(events: list[dict], query: str, feed: str = "json") -> dict:
    from bytewax.testing import TestingSink, TestingSource, run_main

    from clasp.bench.peers import nexmark_bytewax as bw

    out: list = []
    batch = 1000
    # Q8 merges two streams: its clock also waits out the event time a batch spans (10 events per ms).
    bound = max_out_of_order() + (batch // 10 + 1 if query == "q8" else 0)
    items = [json.dumps(e) for e in events] if feed == "json" else events
    flow = bw.build(query, TestingSource(items, batch_size=batch), TestingSink(out), bound, decode=feed == "json",
                    select=kind_marks(query))
    t0, cpu0 = time.perf_counter(), time.process_time()
    run_main(flow)
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"query": query, "system": "bytewax", "workers": 1, "events": len(events), "seconds": round(dt, 3),
            "events_per_s": round(len(events) / dt), "cpu_s": round(cpu, 2),
            "exact": sorted(bw.answer(query, out)) == reference(query, events)}


def run_bytewax_processes(events: list[dict], query: str, processes: int, slack_ms: int,
                          files_per_process: int = 8) -> dict:
    """The query as `processes` Bytewax processes of one worker each (`clasp/bench/peers/nexmark_bytewax_run.py`)
    reading the events from `files_per_process` JSON-lines files a process (enough that Bytewax's hashing of
    files to workers spreads them evenly), timed from the go they wait for to the last worker's rows.
    Bytewax's clock is per key and its readers are not aligned in event time (a worker, or a file, may run
    ahead of another), so it waits `slack_ms` beyond the generator's bound: enough that no event is late and the
    answer is exact, which the run checks."""
    from clasp.bench.peers import nexmark_bytewax as bw
    from clasp.bench.peers.__main__ import recv_answers, run_gated

    def answer(answers, procs, t0: float, cpu0: float) -> tuple[list, float, float]:
        parts = recv_answers(answers, procs)
        dt = time.perf_counter() - t0
        cpu = sum(cpu_seconds(p.pid) for p in procs) + time.process_time() - cpu0  # before they exit
        for p in procs:
            if p.wait(600) != 0:
                raise RuntimeError(f"bytewax exited {p.returncode}")
        return parts, dt, cpu

    directory = Path(tempfile.mkdtemp(prefix="nexmark-bytewax-"))
    try:
        write_events(events, directory, files_per_process * processes)
        env = {"NEXMARK_DIR": str(directory), "NEXMARK_QUERY": query,
               "NEXMARK_BOUND_MS": str(max_out_of_order() + slack_ms)}
        parts, dt, cpu = run_gated("clasp.bench.peers.nexmark_bytewax_run:flow", processes, env, answer)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out = [row for _, rows in sorted(parts) for row in rows]
    return {"query": query, "system": "bytewax-processes", "workers": processes, "events": len(events),
            "seconds": round(dt, 3), "events_per_s": round(len(events) / dt), "cpu_s": round(cpu, 2),
            "exact": sorted(bw.answer(query, out)) == reference(query, events)}


def _table(results: list[dict], fixed: list[dict]) -> list[dict]:
    """Per query and system (clasp per worker count): the median whole-run seconds over the rounds, the median
    fixed-size run's, their rates and the ratios to Bytewax's."""
    def med(rs, q, system, w):
        xs = [r["seconds"] for r in rs if r["query"] == q and r["system"] == system and r["workers"] == w]
        return statistics.median(xs) if xs else None

    rows_ = []
    for q in dict.fromkeys(r["query"] for r in results):
        keys = sorted({(r["system"], r["workers"]) for r in results if r["query"] == q})
        n = next(r["events"] for r in results if r["query"] == q)
        n0 = next((r["events"] for r in fixed if r["query"] == q), 0)
        rates = {}
        for system, w in keys:
            t, t0 = med(results, q, system, w), med(fixed, q, system, w)
            cpu = statistics.median(r["cpu_s"] for r in results if r["query"] == q and r["system"] == system
                                    and r["workers"] == w)
            marginal = round((n - n0) / (t - t0)) if t0 is not None and t > t0 else None
            rates[system, w] = {"query": q, "system": system, "workers": w, "seconds": round(t, 3),
                                "events_per_s": round(n / t), "fixed_seconds": t0, "marginal_events_per_s": marginal,
                                "cpu_us_per_event": round(cpu / n * 1e6, 2)}
        for (system, w), r in rates.items():
            # clasp beside Bytewax in one process (in memory) and beside as many Bytewax processes as workers
            for peer, suffix in ((rates.get(("bytewax", 1)), ""), (rates.get(("bytewax-processes", w)), "_processes")):
                if system != "clasp" or peer is None:
                    continue
                r["over_bytewax" + suffix] = round(r["events_per_s"] / peer["events_per_s"], 2)
                r["cpu_over_bytewax" + suffix] = round(peer["cpu_us_per_event"] / r["cpu_us_per_event"], 2)
                if r["marginal_events_per_s"] and peer["marginal_events_per_s"]:
                    r["marginal_over_bytewax" + suffix] = round(
                        r["marginal_events_per_s"] / peer["marginal_events_per_s"], 2)
            rows_.append(r)
    return rows_


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--fixed-events", type=int, default=2_000,
                   help="the small run each round that measures fixed costs (0: none)")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--queries", default=",".join(nx.QUERIES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--bytewax-feed", choices=("json", "memory"), default="json",
                   help="Bytewax given the events' JSON lines to decode (as clasp's readers do theirs) or the dicts")
    p.add_argument("--bytewax-processes", default=None,
                   help="Bytewax also as this many processes reading the events from files (comma-separated; "
                        "default: the --workers counts; empty: none)")
    p.add_argument("--bytewax-slack-ms", type=int, default=5000,
                   help="what Bytewax's processes wait beyond the generator's bound (their readers are not aligned "
                        "in event time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--plot", help="draw clasp / N Bytewax processes per query into this image (needs matplotlib)")
    p.add_argument("--replot", metavar="JSON", help="only draw --plot from a run saved by --json")
    a = p.parse_args(argv)
    if a.replot:
        plot(json.loads(Path(a.replot).read_text())["table"], a.plot)
        return 0
    events = nx.generate(a.events, a.seed)
    small = events[:a.fixed_events]
    has_bytewax = importlib.util.find_spec("bytewax") is not None
    procs = a.workers if a.bytewax_processes is None else a.bytewax_processes
    results: list[dict] = []
    fixed: list[dict] = []
    for rnd in range(a.rounds):
        for q in a.queries.lower().split(","):  # Q4 as q4, as the reference names it
            runs = [("clasp", int(w)) for w in a.workers.split(",")] + ([("bytewax", 1)] if has_bytewax else [])
            runs += [("bytewax-processes", int(n)) for n in procs.split(",") if n and has_bytewax]
            if rnd % 2:
                runs.reverse()
            for system, w in runs:
                for evs, into in ((small, fixed), (events, results)) if small else ((events, results),):
                    if system == "clasp":
                        r = run_clasp(evs, q, w)
                    elif system == "bytewax":
                        r = run_bytewax(evs, q, a.bytewax_feed)
                    else:
                        r = run_bytewax_processes(evs, q, w, a.bytewax_slack_ms)
                    r["round"] = rnd
                    into.append(r)
                    print(json.dumps(r), flush=True)
    table = _table(results, fixed)
    for r in table:
        for suffix, peer in (("", "Bytewax"), ("_processes", f"{r['workers']} Bytewax process(es)")):
            if r["system"] == "clasp" and "over_bytewax" + suffix in r:
                print(f"{r['query']} on {r['workers']} worker(s): clasp / {peer} events/s = "
                      f"{r['over_bytewax' + suffix]:.2f} (whole run), "
                      f"{r.get('marginal_over_bytewax' + suffix, float('nan')):.2f} (marginal); {peer}'s CPU per "
                      f"event / clasp's = {r['cpu_over_bytewax' + suffix]:.2f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": results, "fixed": fixed, "table": table}, indent=1))
    if a.plot:
        plot(table, a.plot)
    return 0 if all(r["exact"] for r in results + fixed) else 1


def plot(table: list[dict], path: str, goal: float = 1.3) -> None:
    """Grouped bars: per query, clasp's events/s over N Bytewax processes' at each worker count N, against the
    goal and parity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r["system"] == "clasp" and "over_bytewax_processes" in r]
    queries = list(dict.fromkeys(r["query"] for r in rows))
    counts = sorted({r["workers"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(queries) + 2), 3.6))
    width = 0.8 / max(len(counts), 1)
    for i, n in enumerate(counts):
        ratio = {r["query"]: r["over_bytewax_processes"] for r in rows if r["workers"] == n}
        xs = [q + (i - (len(counts) - 1) / 2) * width for q in range(len(queries))]
        ax.bar(xs, [ratio.get(q, 0.0) for q in queries], width,
               label=f"{n} worker{'s' if n != 1 else ''} / {n} process{'es' if n != 1 else ''}")
    ax.axhline(goal, color="black", linestyle="--", linewidth=1, label=f"goal {goal}")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="parity")
    ax.set_xticks(range(len(queries)), [q.upper() for q in queries])
    ax.set_ylabel("clasp / Bytewax, events/s")
    ax.set_title("Nexmark: clasp (checkpoints every 1 s, CURVE) against Bytewax 0.21", fontsize=10)
    ax.margins(y=0.2)
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
