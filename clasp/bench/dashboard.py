"""What an open dashboard costs the planner: ingest throughput without and with viewers, A/B alternating.

`python -m clasp.bench.dashboard [--records N] [--pairs K] [--viewers V] [--browser] [--json FILE]` starts
one cluster (a planner, two workers) and one job (the `clasp.bench.runtime` ingest job: one no-op
operator), then pushes N records K × 2 times, alternating: A with nothing watching, B with the page
"open and refreshing". B's viewers do what the page does, through the same endpoints: one server-sent
event stream of the job (`/api/stream?job=ID`) each, plus, every second, a poll of `/api/cluster`,
`/api/jobs` and `/api/jobs/ID` (the polling fallback) — both transports at once, so more than one real
page. With `--browser`, B opens the page in headless Chromium too (its rendering CPU then competes with
the planner on the same cores: a harsher test of the machine than of the planner). The planner's CPU time
is read from /proc. Prints JSON: each run's records/s, the median of the pairwise B/A ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

import clasp
from clasp.bench import cpu_seconds, emit
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig

SETTLE = 1.0  # seconds before each run, A and B alike


def sink(value):
    return None


class Viewers:
    """`n` page-like viewers of one job: an event stream each, and a poll of the three views a second."""

    def __init__(self, base: str, job: int, n: int, browser: bool = False):
        self.base, self.job, self.n, self.browser = base, job, n, browser
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.events = self.polls = 0
        self.driver = None

    def _stream(self) -> None:
        with urllib.request.urlopen(f"{self.base}api/stream?job={self.job}", timeout=30) as s:
            while not self.stop.is_set():
                line = s.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    self.events += 1

    def _poll(self) -> None:
        while not self.stop.wait(1.0):
            for path in ("api/cluster", "api/jobs", f"api/jobs/{self.job}"):
                with urllib.request.urlopen(self.base + path, timeout=30) as r:
                    r.read()
            self.polls += 1

    def __enter__(self):
        self.stop.clear()
        self.threads = [threading.Thread(target=f, daemon=True) for _ in range(self.n) for f in (self._stream,
                                                                                                  self._poll)]
        for t in self.threads:
            t.start()
        if self.browser:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service

            opts = webdriver.ChromeOptions()
            opts.binary_location = "/usr/bin/chromium"
            for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                      "--window-size=1400,1700"):
                opts.add_argument(a)
            self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
            self.driver.get(f"{self.base}#/job/{self.job}")
        time.sleep(SETTLE)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.driver is not None:
            self.driver.quit()
            self.driver = None
        for t in self.threads:
            t.join(5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_500_000, help="records pushed per run")
    ap.add_argument("--pairs", type=int, default=5, help="A/B pairs (A: no viewer, B: viewers)")
    ap.add_argument("--viewers", type=int, default=1, help="page-like viewers in B")
    ap.add_argument("--browser", action="store_true", help="B also opens the page in headless Chromium")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    records = list(range(args.records))
    runs = []
    dag = clasp.Dag("sink")
    dag.operator("sink", sink)
    with LocalCluster(workers=2, planner_config=PlannerConfig(max_inflight=200_000),
                      log_dir=tempfile.mkdtemp(prefix="clasp-bench-")) as cl, clasp.connect(cl.planner) as c:
        planner_pid = cl.procs[0].pid if hasattr(cl, "procs") else None
        job = c.submit(dag)
        job.push(records[:5000])
        job.wait_idle(60)
        for i in range(2 * args.pairs):
            with_viewers = i % 2 == 1
            ctx = Viewers(cl.dashboard, job.id, args.viewers, args.browser) if with_viewers else None
            if ctx:
                ctx.__enter__()  # waits SETTLE s: the first views are built and the streams flow
            else:
                time.sleep(SETTLE)  # the same pause before A
            try:
                cpu0 = cpu_seconds(planner_pid) if planner_pid else None
                t0 = time.perf_counter()
                job.push(records)
                job.wait_idle(600)
                wall = time.perf_counter() - t0
                cpu = cpu_seconds(planner_pid) - cpu0 if planner_pid else None
            finally:
                if ctx:
                    ctx.__exit__(None, None, None)
            run = {"viewers": with_viewers, "records_per_s": args.records / wall, "wall_s": wall,
                   "planner_cpu_us_per_record": cpu / args.records * 1e6 if cpu is not None else None}
            if ctx:
                run.update({"events": ctx.events, "polls": ctx.polls})
            runs.append(run)
            print(f"run {i + 1}: {'B (viewers)' if with_viewers else 'A (none)   '} "
                  f"{run['records_per_s']:,.0f} records/s", file=sys.stderr, flush=True)
    a = [r["records_per_s"] for r in runs if not r["viewers"]]
    b = [r["records_per_s"] for r in runs if r["viewers"]]
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    cpu_a = [r["planner_cpu_us_per_record"] for r in runs if not r["viewers"] and r["planner_cpu_us_per_record"]]
    cpu_b = [r["planner_cpu_us_per_record"] for r in runs if r["viewers"] and r["planner_cpu_us_per_record"]]
    out = {"records": args.records, "pairs": args.pairs, "viewers": args.viewers, "browser": args.browser,
           "runs": runs, "median_a": statistics.median(a), "median_b": statistics.median(b),
           "ratios": ratios, "median_ratio_b_over_a": statistics.median(ratios),
           "planner_cpu_us_per_record": {"a": statistics.median(cpu_a) if cpu_a else None,
                                         "b": statistics.median(cpu_b) if cpu_b else None}}
    return emit(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
