"""Planner and worker memory under overload: one big push, large records, an endless generator, 2 × capacity.

`python -m clasp.bench.overload [--case lines:2000000] [--case blobs:300000x2048] [--case endless:30]
[--case rate:2x60] [--max-queued-bytes 128M] [--max-queue-delay S] [--json FILE]` runs each case on a
fresh 1-worker local cluster (no autoscaling) and prints one JSON object per case: the planner's and the
worker's resident memory at the start and at their peak (VmRSS from /proc, sampled every 20 ms), how long
`push()` took, the planner's largest reported queue (records, bytes), the p99 latency of admitted records,
and whether every record was counted exactly.

- `lines:N`: N Word Count lines (`clasp.apps.wc.generate`) in one `push()`; the answer is the word counts.
- `blobs:NxB`: N records of B bytes (`"i:xxxx..."`) in one `push()` (of a generator: the client would
  otherwise hold N × B bytes itself), tallied per `i % 64` by a stateful operator.
- `endless:S`: such records of 2 KiB from a generator that never ends by itself, stopped after S seconds.
- `rate:FxS`: Word Count lines offered at F × the cluster's capacity for S seconds: the capacity is
  measured first on the same cluster (lines/s of an unthrottled push of `CALIBRATE_S` seconds' worth,
  after a warm-up push),
  then a generator yields line i at `t0 + i / (F × capacity)` (lines fall due while `push()` is held
  back and come as fast as it takes them), and stops at `t0 + S`; `offered` counts the lines due by
  then, `pushed` those admitted. The answer is the word counts of the lines admitted.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import clasp
from clasp.apps import wc
from clasp.core.credit import parse_size
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig

GROUPS = 64
POOL = 100_000  # distinct Word Count lines the rate case cycles through
CALIBRATE_S = 8.0  # seconds' worth of lines (at a first guess) pushed to measure the capacity


def tally(state, rec):
    return (state or 0) + 1, None


def group(rec):
    return int(rec.split(":", 1)[0]) % GROUPS


def blob_dag() -> clasp.Dag:
    d = clasp.Dag("blobs")
    d.operator("pass", lambda r: r) >> d.operator("tally", tally, stateful=True, key=group)
    return d


def blob(i: int, size: int) -> str:
    head = f"{i}:"
    return head + "x" * max(0, size - len(head))


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler(threading.Thread):
    def __init__(self, pids: dict[str, int], planner: str, job_id: int):
        super().__init__(daemon=True)
        self.pids, self.planner, self.job_id = pids, planner, job_id
        self.start_rss = {k: rss_mb(p) for k, p in pids.items()}
        self.peak = dict(self.start_rss)
        self.queue = {"records": 0, "bytes": 0}
        self.ticks: dict[float, dict] = {}
        self.halt = threading.Event()

    def run(self):
        with clasp.connect(self.planner) as c:
            job = c.job(self.job_id)
            n = 0
            while not self.halt.is_set():
                for k, p in self.pids.items():
                    self.peak[k] = max(self.peak[k], rss_mb(p))
                if n % 5 == 0:
                    s = job.stats()
                    self.queue["records"] = max(self.queue["records"], s["queued"])
                    self.queue["bytes"] = max(self.queue["bytes"], s["queued_bytes"])
                    for tick in s.get("series", [])[-3:]:  # the planner's per-second view, for the worst second
                        self.ticks[tick["t"]] = tick
                n += 1
                time.sleep(0.02)


def wc_want(pool: list[str], n: int) -> collections.Counter:
    """The word counts of the first n lines of `pool` repeated."""
    full, part = divmod(n, len(pool))
    want: collections.Counter = collections.Counter()
    for j, line in enumerate(pool):
        k = full + (1 if j < part else 0)
        if k:
            for w in wc.split(line):
                want[w] += k
    return want


def paced(pool: list[str], rate: float, seconds: float, due: list) -> Iterator[str]:
    """Lines of `pool` (cycled) at `rate` per second for `seconds`; `due[0]`: lines due by the end."""
    t0 = time.perf_counter()
    i = 0
    while True:
        now = time.perf_counter() - t0
        if now >= seconds:
            due[0] = int(seconds * rate)
            return
        if i >= now * rate:  # ahead of the schedule: wait for the next line's time
            time.sleep(min(0.001, i / rate - now))
            continue
        yield pool[i % len(pool)]
        i += 1


def run_case(case: str, max_bytes: str | None, max_delay: str | None = None) -> dict:
    kind, _, arg = case.partition(":")
    logs = tempfile.mkdtemp(prefix="clasp-overload-")
    bounds = ({"max_queued_bytes": parse_size(max_bytes)} if max_bytes else {}) | (
        {"max_queue_delay": float(max_delay)} if max_delay else {})
    config = PlannerConfig(autoscale=False, **bounds)
    extra: dict = {}
    with LocalCluster(workers=1, port=0, log_dir=logs, provider="static", planner_config=config) as cl, \
            clasp.connect(cl.planner) as c:
        pids = {"planner": cl.procs[0].pid, "worker": c.workers()[0]["pid"]}
        if kind == "lines":
            records = wc.generate(int(arg), 0)
            want = collections.Counter(w for line in records for w in wc.split(line))
            job = c.submit(wc.build_dag(), autoscale=False)
            source, op = records, "count"
        elif kind == "rate":
            factor, _, secs = arg.partition("x")
            pool = wc.generate(POOL, 1)
            job = c.submit(wc.build_dag(), autoscale=False)
            probe = wc.generate(int(CALIBRATE_S * 20_000), 2)  # ~8 s at a first guess of 20,000 lines/s
            warm = wc.generate(40_000, 3)
            job.push(warm)  # warm-up: the first seconds run slower
            job.wait_idle(600)
            t = time.perf_counter()
            job.push(probe)
            job.wait_idle(600)
            capacity = len(probe) / (time.perf_counter() - t)
            due = [0]
            rate = float(factor) * capacity
            source, op = paced(pool, rate, float(secs), due), "count"
            extra = {"capacity_lines_per_s": round(capacity), "offered_lines_per_s": round(rate), "due": due}
            base = collections.Counter(w for line in warm + probe for w in wc.split(line))
        else:
            size = 2048
            if kind == "blobs":
                n, _, b = arg.partition("x")
                size = int(b)
                source = (blob(i, size) for i in range(int(n)))
                want = collections.Counter(i % GROUPS for i in range(int(n)))
            else:
                want = collections.Counter()
                halt = threading.Event()
                threading.Timer(float(arg), halt.set).start()

                def gen():
                    i = 0
                    while not halt.is_set():
                        want[i % GROUPS] += 1
                        yield blob(i, size)
                        i += 1
                source = gen()
            job = c.submit(blob_dag(), autoscale=False)
            op = "tally"
        records = None  # the source (a list) keeps them; nothing else does
        sampler = Sampler(pids, cl.planner, job.id)
        sampler.start()
        t0 = time.perf_counter()
        pushed = job.push(source)
        took = time.perf_counter() - t0
        job.wait_idle(1200)
        wall = time.perf_counter() - t0
        sampler.halt.set()
        sampler.join()
        stats = job.stats(fresh=True)
        state = job.state(op)
        if kind == "rate":
            want = wc_want(pool, pushed) + base
            extra["offered"] = extra.pop("due")[0]
            extra["admitted_share"] = round(pushed / max(1, extra["offered"]), 3)
            extra["admitted_lines_per_s"] = round(pushed / took)  # the capacity while overloaded
        got = collections.Counter({(int(k) if op == "tally" else k): v for k, v in state.items()})
        bound = stats["queue_bound"]
        return {"case": case, "max_queued_bytes": bound["bytes"], "max_queue_delay": bound.get("max_delay"),
                "pushed": pushed, **extra, "push_s": round(took, 2), "idle_s": round(wall, 2),
                "rss_start_mb": {k: round(v, 1) for k, v in sampler.start_rss.items()},
                "rss_peak_mb": {k: round(v, 1) for k, v in sampler.peak.items()},
                "rss_growth_mb": {k: round(sampler.peak[k] - sampler.start_rss[k], 1) for k in pids},
                "max_queue": sampler.queue, "p99_s": stats["latency"].get("p99"),
                "worst_second_p99_s": max((t["p99"] or 0 for t in sampler.ticks.values()), default=None),
                "slowest_second_throughput": min((round(t["throughput"]) for t in sampler.ticks.values()
                                                   if t["queue"]), default=None),
                "p50_s": stats["latency"].get("p50"), "completed": stats["completed"], "lost": stats["lost"],
                "exact": got == want}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clasp.bench.overload", description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="lines:N, blobs:NxB or endless:S (repeatable)")
    ap.add_argument("--max-queued-bytes", help="the planner's bound (default: its own, 128M)")
    ap.add_argument("--max-queue-delay", help="the planner's time bound in seconds (default: its own, 5; 0: off)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = []
    for case in args.case or ["lines:2000000", "blobs:300000x2048", "endless:30", "rate:2x60"]:
        r = run_case(case, args.max_queued_bytes, args.max_queue_delay)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["exact"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
