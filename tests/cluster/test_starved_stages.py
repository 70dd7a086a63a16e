"""Windows fed by windows with the planner and the workers starved of CPU (a cgroup quota each, docs/EMULATION.md):
the second stage's watermark must not pass a window the first stage fired that is still on its way. Starved, the
planner takes the workers' messages in bursts and looks for a moved watermark between two of a burst, which may
fall between a worker's announcement of a chunk of fired windows (`wm_out`) and the chunk's seal; the workers,
starved too, are still applying that chunk's windows when the second stage's watermark comes (docs/TIME.md,
"Windows fed by windows: stages"). The interleaving is a matter of timing: this run has it now and then, not
every time (`tests/unit/test_stage_release.py` checks every interleaving of the rule itself)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import clasp
import clasp.windows as W
from clasp.local import cpulimit
from tests.cluster.test_push_time import BOUND, events, push
from tests.conftest import start_cluster

why = cpulimit.available()
SIZE = 0.5  # seconds of event time per window: many firings, each a chance for the interleaving
PLANNER_CPU, PERIOD_US = 0.1, 500_000  # the planner runs 50 ms of every 500
WORKER_CPU = 0.3
SPIN_S = 0.002  # CPU per window of the second stage


def _starve(group, cpus: float, period_us: int = 100_000) -> None:
    """A long period, so the planner stops for most of each: the workers' messages pile up meanwhile, and it
    takes them in bursts after (the kernel's smallest quota is 1 ms, a tenth of the clusters' 10 ms period)."""
    if (group / "cpu.max").exists():
        (group / "cpu.max").write_text(f"{int(cpus * period_us)} {period_us}\n")
    else:
        (group / "cpu.cfs_quota_us").write_text("-1\n")
        (group / "cpu.cfs_period_us").write_text(f"{period_us}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{int(cpus * period_us)}\n")


def _slow_count(acc: int, window: list) -> int:
    """A second stage that takes its time over each window (CPU, as a heavier fold would), so the windows of a
    firing are still queued on a starved worker for a while."""
    end = time.thread_time() + SPIN_S
    while time.thread_time() < end:
        pass
    return acc + 1


@pytest.mark.skipif(why is not None, reason=f"starving the planner and workers needs cgroup CPU quotas: {why}")
def test_starved_processes_send_no_first_stage_window_to_the_second_stage_late(tmp_path_factory):
    evs = events(3000, 11, keys=40)
    cluster = start_cluster(tmp_path_factory, 2, cpu_per_worker=WORKER_CPU, planner_args=["--no-autoscale"])
    try:
        _starve(cluster.cpu_limits.limit(cluster.procs[0].pid, "planner", 0.1), PLANNER_CPU, PERIOD_US)
        with clasp.connect(cluster.planner) as client:
            dag = clasp.Dag("starved-stages")
            src = dag.push_source("events", timestamp=lambda e: e[1], max_out_of_order=BOUND)
            per_key = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda acc, e: acc + 1,
                                 init=lambda: 0)
            keys = dag.window("keys", W.tumbling(SIZE), key=lambda w: w[1], fold=_slow_count, init=lambda: 0,
                              timestamp=W.result_time, collect=True)
            late = dag.operator("late", lambda r: [r], collect=True)
            src >> per_key >> keys
            keys.late >> late
            job = client.submit(dag, autoscale=False)
            t0 = time.monotonic()
            push(job, evs, chunk=20)
            job.end_input()
            job.wait_idle(timeout=120)
            took = time.monotonic() - t0
            stats = job.stats()["event_time"]
            want = Counter(start for _, start in {(k, ts - ts % SIZE) for k, ts in evs})  # keys per window
            assert job.collected("late") == [], f"{len(job.collected('late'))} late in {took:.1f} s: {stats}"
            assert {s: n for s, _, _, n in job.collected("keys")} == dict(want)
            job.cancel()
    finally:
        cluster.stop()
