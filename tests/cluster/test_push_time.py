"""Event time for pushed records on a real cluster (`Dag.push_source`, docs/TIME.md): the planner marks each pushed
chunk with the push partition's watermark, releases it once the chunks before it are complete, and the windows
downstream close on it. Every window is checked against a direct computation over the input: while pushing (a
window closes before the input ends), at `end_input()`, after a worker's SIGKILL and across a rescale 1 -> 2."""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections import Counter

import pytest

import clasp
import clasp.windows as W
from clasp.testing import IterableSource
from tests.cluster.test_recovery import _connect, _free_port, _start, restart_planner
from tests.conftest import WorkerSigkill, start_cluster, wait_for

SIZE = 2.0  # seconds of event time per window
BOUND = 1.0  # max_out_of_order


def events(n: int, seed: int, keys: int = 30) -> list[list]:
    """[key, ts]: time moves 0.01 s per event, each up to 0.9 s behind the newest (within the bound)."""
    rng = random.Random(seed)
    return [[f"k{rng.randrange(keys)}", round(i * 0.01 - rng.uniform(0, 0.9), 4)] for i in range(n)]


def pushed_windows(name: str = "pushed-count") -> clasp.Dag:
    dag = clasp.Dag(name)
    src = dag.push_source("events", timestamp=lambda e: e[1], max_out_of_order=BOUND)
    win = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda acc, e: acc + 1,
                     init=lambda: 0, collect=True)
    late = dag.operator("late", lambda r: [r], collect=True)
    src >> win
    win.late >> late
    return dag


def reference(evs: list[list]) -> dict:
    return dict(Counter((k, ts - ts % SIZE) for k, ts in evs))


def windows(job) -> dict:
    got = job.collected("counts")
    by_window = {(k, s): v for k, s, e, v in got}
    assert len(got) == len(by_window), "a window was emitted twice"
    assert all(e - s == SIZE for _, s, e, _ in got)
    return by_window


def push(job, evs: list, chunk: int = 500) -> None:
    for i in range(0, len(evs), chunk):
        job.push(evs[i:i + chunk])


def test_windows_after_push_close_on_the_watermark_and_all_fire_at_end_input(cluster1):
    evs = events(4000, 1)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(pushed_windows(), autoscale=False)
        push(job, evs)
        # Without the end of the input, exactly the windows the watermark passed are out: those ending at or
        # before the largest time pushed minus the bound, each complete.
        top = max(ts for _, ts in evs) - BOUND
        closed = {w: n for w, n in reference(evs).items() if w[1] + SIZE <= top}
        wait_for(lambda: len(job.collected("counts")) >= len(closed), timeout=30, what="the closed windows")
        assert windows(job) == closed
        et = job.stats()["event_time"]
        assert et["partitions"] == {"events/push": pytest.approx(top)}
        job.end_input()
        with pytest.raises(clasp.ClaspError, match="input ended"):
            job.push([["k0", 1e6]])
        job.wait_idle(timeout=60)
        assert windows(job) == reference(evs)
        assert job.collected("late") == []
        assert job.stats()["event_time"]["watermark"] == "end"
        job.cancel()


def test_records_behind_the_bound_of_the_push_source_go_to_the_late_output(cluster1):
    first = [[f"k{i % 3}", i * 0.05] for i in range(400)]  # 0 .. 20 s
    behind = [["k0", 1.0], ["k1", 3.5]]  # long closed windows once the watermark passed 18.95 s
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(pushed_windows("pushed-late"), autoscale=False)
        job.push(first)
        wait_for(lambda: (job.stats()["event_time"]["watermark"] or 0) >= 18, timeout=30, what="the watermark")
        job.push(behind)
        job.end_input()
        job.wait_idle(timeout=60)
        assert windows(job) == reference(first)
        assert sorted(job.collected("late")) == sorted([k, ts, [k, ts]] for k, ts in behind)
        assert job.stats()["event_time"]["late"] == 2
        job.cancel()


def test_pushed_windows_exact_after_a_worker_sigkill(tmp_path_factory):
    evs = events(20000, 2)
    with WorkerSigkill(tmp_path_factory) as run:
        job = run.client.submit(pushed_windows("pushed-kill"), autoscale=False)
        push(job, evs[:8000])
        run.started(job, lambda: job.collected("counts"))
        run.kill()
        push(job, evs[8000:])
        run.recovered(job)
        job.end_input()
        summary = job.wait_idle(timeout=120)
        assert summary["lost"] == 0
        assert windows(job) == reference(evs)


def test_pushed_windows_exact_across_a_rescale_1_to_2(tmp_path_factory):
    evs = events(20000, 3)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    one = {"events": {0: 1.0}, "counts.windows": {0: 1.0}, "counts": {0: 1.0}, "counts.late": {0: 1.0},
           "late": {0: 1.0}}
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(pushed_windows("pushed-rescale"), placement=one)
            push(job, evs[:10000])
            wait_for(lambda: job.collected("counts"), timeout=30, what="a first window")
            assert not job.scale(2)["failed"]
            push(job, evs[10000:])
            job.end_input()
            job.wait_idle(timeout=120)
            assert windows(job) == reference(evs)
            assert job.collected("late") == []
    finally:
        cluster.stop()


def test_a_stage_of_windows_waits_for_the_windows_before_it_not_for_a_tick(tmp_path_factory):
    """With a 2 s tick, the two stages of a window of windows still fire within a tick of the input's end: the
    planner releases a moved watermark as soon as it moves (each stage once the one before fired and its windows
    are complete), not at the next tick (which would take two ticks, 4 s, here)."""
    evs = events(3000, 4)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "2.0"])
    try:
        with clasp.connect(cluster.planner) as client:
            dag = clasp.Dag("stages")
            src = dag.push_source("events", timestamp=lambda e: e[1], max_out_of_order=BOUND)
            per_key = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda acc, e: acc + 1,
                                 init=lambda: 0)
            keys = dag.window("keys", W.tumbling(SIZE), key=lambda w: w[1], fold=lambda acc, w: acc + 1,
                              init=lambda: 0, timestamp=W.result_time, collect=True)
            src >> per_key >> keys
            job = client.submit(dag, autoscale=False)
            push(job, evs)
            job.wait_idle(timeout=60)
            t0 = time.monotonic()
            job.end_input()
            job.wait_idle(timeout=60)
            took = time.monotonic() - t0
            want = Counter(start for _, start in reference(evs))
            assert {s: n for s, _, _, n in job.collected("keys")} == dict(want)
            assert took < 2.0, f"the last windows of two stages took {took:.2f} s"
    finally:
        cluster.stop()


def test_an_idle_push_source_does_not_hold_back_a_declared_sources_windows(cluster1):
    """Nothing is ever pushed: after `idle_timeout` the push partition stops holding the watermark, and the
    declared source's windows all fire at the end of its input (without the timeout they never would)."""
    evs = events(2000, 5)
    with clasp.connect(cluster1.planner) as client:
        dag = clasp.Dag("idle-push")
        pushed = dag.push_source("pushed", timestamp=lambda e: e[1], max_out_of_order=BOUND, idle_timeout=0.5)
        read = dag.source("read", IterableSource(evs, partitions=2), timestamp=lambda e: e[1],
                          max_out_of_order=BOUND)
        win = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda acc, e: acc + 1,
                         init=lambda: 0, timestamp=lambda e: e[1], collect=True)
        pushed >> win
        read >> win
        job = client.submit(dag, autoscale=False)
        job.wait_idle(timeout=60)  # what was read is done; the push partition may still hold the watermark
        wait_for(lambda: job.stats()["event_time"]["idle"] == ["pushed/push"], timeout=30, what="an idle push")
        job.wait_idle(timeout=60)
        assert windows(job) == reference(evs)
        assert job.stats()["event_time"]["watermark"] == "end"
        job.cancel()


def test_a_push_source_without_windows_goes_idle(cluster1):
    """A push source feeding no keyed time operator: no worker fires at its watermark, so `wait_idle` does not
    wait for one (it used to wait for a firing that never came)."""
    evs = events(3000, 6)
    with clasp.connect(cluster1.planner) as client:
        dag = clasp.Dag("push-no-windows")
        counted = dag.operator("count", lambda state, e: ((state or 0) + 1, None), stateful=True, key=lambda e: e[0])
        dag.push_source("events", timestamp=lambda e: e[1], max_out_of_order=BOUND) >> counted
        job = client.submit(dag, autoscale=False)
        push(job, evs)
        assert job.wait_idle(timeout=20)["completed"] == len(evs)
        assert job.state("count") == dict(Counter(k for k, _ in evs))
        job.cancel()


@contextlib.contextmanager
def restartable_cluster(tmp_path, checkpoint_interval: float):
    """A planner on a state directory (restartable with `restart_planner`) and 2 workers, as processes:
    yields the process list (the planner first), the planner's arguments and its address."""
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    planner = ["planner", "--port", str(port), "--state-dir", str(tmp_path / "state"), "--no-autoscale",
               "--checkpoint-interval", str(checkpoint_interval), "--heartbeat", "0.2"]
    procs = [_start(planner, tmp_path / "planner.log")]
    procs += [_start(["worker", "--planner", addr, "--id", f"w{i}"], tmp_path / f"w{i}.log") for i in range(2)]
    try:
        yield procs, planner, addr
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _kept_watermark(state_dir, job_id: int) -> float:
    """The first stage's watermark kept by the job's newest complete checkpoint (its COMPLETE.json), or -inf."""
    kept = -math.inf
    for f in (state_dir / f"job-{job_id}").glob("ckpt-*/COMPLETE.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, IndexError):  # one being replaced, or none kept
            kept = max(kept, json.loads(f.read_text())["watermark"][0])
    return kept


def connect_two(addr: str):
    client = wait_for(lambda: _connect(addr), timeout=60, interval=0.5, what="the planner")
    wait_for(lambda: len([w for w in client.workers() if w["alive"]]) == 2, timeout=60, what="2 workers")
    return client


def test_end_input_survives_a_planner_sigkilled_and_restarted(tmp_path):
    """`end_input()` is in the job's durable record: a planner SIGKILLed right after it and started again on the
    same state directory still refuses pushes, its watermark still reaches the end, and every window fires
    exactly once, complete."""
    evs = events(6000, 7)
    with restartable_cluster(tmp_path, 0.5) as (procs, planner, addr):
        with connect_two(addr) as client:
            job = client.submit(pushed_windows("pushed-restart"), autoscale=False)
            job_id = job.id
            push(job, evs)
            job.wait_idle(timeout=60)
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=60, what="a checkpoint")
            job.end_input()
        client, job = restart_planner(procs, planner, tmp_path / "planner.log", addr, job_id)
        with client:
            with pytest.raises(clasp.ClaspError, match="input ended"):
                job.push([["k0", 1e6]])
            job.wait_idle(timeout=60)
            wait_for(lambda: job.stats()["event_time"]["watermark"] == "end", timeout=30, what="the end")
            job.wait_idle(timeout=60)
            assert windows(job) == reference(evs)
            assert job.collected("late") == []


def test_a_restarted_planner_rolls_back_to_the_watermark_its_checkpoint_kept(tmp_path):
    """The watermark a checkpoint's barrier saw is in its COMPLETE.json: a planner SIGKILLed after records behind
    it were pushed, and started again, rolls the job back to that watermark, so the replayed records are late
    again (the late output, once each) instead of opening windows that already fired (emitted twice)."""
    first = [[f"k{i % 3}", i * 0.05] for i in range(400)]  # 0 .. 20 s
    behind = [["k0", 1.0], ["k1", 3.5]]  # windows that fired long before the checkpoint
    with restartable_cluster(tmp_path, 2.0) as (procs, planner, addr):
        with connect_two(addr) as client:
            job = client.submit(pushed_windows("pushed-restart-late"), autoscale=False)
            job_id = job.id
            job.push(first)
            wait_for(lambda: (job.stats()["event_time"]["watermark"] or 0) >= 18, timeout=30, what="the watermark")
            # a complete checkpoint that kept the watermark at 18.95 (the first one may already have, when the
            # push was done by its barrier); nothing is pushed after it until below
            wait_for(lambda: _kept_watermark(tmp_path / "state", job_id) >= 18, timeout=60, interval=0.02,
                     what="a checkpoint above the watermark")
            job.push(behind)  # the next checkpoint is ~2 s after the last began: these are replayed after the restart
        client, job = restart_planner(procs, planner, tmp_path / "planner.log", addr, job_id)
        with client:
            job.end_input()
            job.wait_idle(timeout=60)
            assert windows(job) == reference(first)
            assert sorted(job.collected("late")) == sorted([k, ts, [k, ts]] for k, ts in behind)

