"""Event time on a real cluster: sources with timestamps, watermarks released by the planner, windows in
key-group state (docs/TIME.md). Every window count is checked against a direct computation over the input:
out of order within the bound, after a worker's SIGKILL, across a rescale 1 -> 2; late records go to the
window's late output and are counted; an idle partition does not hold the watermark back."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections import Counter
from typing import Any

import clasp
import clasp.windows as W
from clasp.connectors import Source, SourcePartition
from clasp.testing import IterableSource
from tests.conftest import WorkerSigkill, start_cluster, wait_for

SIZE = 2.0  # seconds of event time per window
BOUND = 1.0  # max_out_of_order


def events(n: int, seed: int, keys: int = 40) -> list[list]:
    """[key, ts]: time moves 0.01 s per event, each event up to 0.9 s behind (within the bound)."""
    rng = random.Random(seed)
    return [[f"k{rng.randrange(keys)}", round(i * 0.01 - rng.uniform(0, 0.9), 4)] for i in range(n)]


def slow_ts(e):
    time.sleep(0.00005)  # the input lasts through a kill or a rescale
    return e[1]


def windowed(source, timestamp=None, lateness: float = 0) -> clasp.Dag:
    dag = clasp.Dag("windowed-count")
    src = dag.source("events", source, timestamp=timestamp or (lambda e: e[1]), max_out_of_order=BOUND)
    win = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda acc, e: acc + 1,
                     init=lambda: 0, allowed_lateness=lateness, collect=True)
    late = dag.operator("late", lambda r: [r], collect=True)
    src >> win
    win.late >> late
    return dag


def reference(evs: list[list]) -> Counter:
    return Counter((k, ts - ts % SIZE) for k, ts in evs)


def check(job, evs: list[list]) -> None:
    got = job.collected("counts")
    by_window = {(k, s): v for k, s, e, v in got}
    assert len(got) == len(by_window), "a window was emitted twice"
    assert all(e - s == SIZE for _, s, e, _ in got)
    assert by_window == dict(reference(evs))


def test_windowed_count_out_of_order_within_the_bound_is_exact(cluster1):
    evs = events(6000, 1)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(windowed(IterableSource(evs, partitions=3)), autoscale=False)
        summary = job.wait_idle(timeout=60)
        assert summary["read"] == len(evs)
        check(job, evs)
        assert job.collected("late") == []
        et = job.stats()["event_time"]
        assert et["watermark"] == "end" and len(et["partitions"]) == 3
        assert et["windows_fired"] == len(reference(evs)) and et["late"] == 0
        view = json.loads(urllib.request.urlopen(f"{cluster1.dashboard.rstrip('/')}/api/jobs/{job.id}").read())
        assert view["event_time"]["watermark"] == "end"
        text = urllib.request.urlopen(cluster1.metrics["planner"]).read().decode()
        assert f'clasp_watermark_seconds{{job="{job.id}"}} +Inf' in text
        assert f'clasp_windows_fired_total{{job="{job.id}"}} {float(len(reference(evs)))}' in text
        job.cancel()


def test_windowed_count_exact_after_a_worker_sigkill(tmp_path_factory):
    evs = events(30000, 2)
    with WorkerSigkill(tmp_path_factory) as run:
        job = run.client.submit(windowed(IterableSource(evs, partitions=6), timestamp=slow_ts), autoscale=False)
        run.kill_midway(job, lambda: job.collected("counts"), len(evs))
        check(job, evs)


def test_windowed_count_exact_across_a_rescale_1_to_2(tmp_path_factory):
    evs = events(30000, 3)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    one = {"events": {0: 1.0}, "counts.windows": {0: 1.0}, "counts": {0: 1.0}, "counts.late": {0: 1.0},
           "late": {0: 1.0}}
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(windowed(IterableSource(evs, partitions=4), timestamp=slow_ts), placement=one)
            wait_for(lambda: job.collected("counts"), timeout=30, what="a first window")
            assert job.stats()["completed"] < len(evs), "the input was done before the rescale"
            assert not job.scale(2)["failed"]
            assert len(job.stats()["sources"]["owners"]) == 2
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(evs)
            check(job, evs)
    finally:
        cluster.stop()


class _Partition(SourcePartition):
    exhausted = False

    async def close(self) -> None:
        pass

    def take_errors(self) -> list:
        return []


class _Paced(_Partition):
    """`first`, then (after `pause` seconds, long enough for its watermark to be released) `then`."""

    def __init__(self, first: list, then: list, pause: float, position: Any):
        self.parts, self.pause, self.at = [first, then], pause, int(position or 0)

    async def next_batch(self, limit: int) -> list:
        if self.at >= 2:
            self.exhausted = True
            return []
        if self.at == 1:
            await asyncio.sleep(self.pause)
        self.at += 1
        return self.parts[self.at - 1]

    def position(self) -> Any:
        return self.at


class _PacedSource(Source):
    def __init__(self, first: list, then: list, pause: float):
        self.first, self.then, self.pause = first, then, pause

    @property
    def bounded(self) -> bool:
        return True

    def partitions(self) -> list[str]:
        return ["p"]

    def open(self, partition: str, position: Any | None) -> SourcePartition:
        return _Paced(self.first, self.then, self.pause, position)


def test_late_records_go_to_the_late_output_and_are_counted(cluster1):
    first = [[f"k{i % 5}", i * 0.05] for i in range(1000)]  # 0 .. 50 s: the watermark reaches 48.95 s
    # Then, against that watermark and a lateness of 1.5 s: 48.6 is on time; 47.5 is late for [46, 48), which
    # is kept until 49.5 and emitted again; 45.9 ([44, 46), purged at 47.5) and 10 go to the late output.
    then = [["k1", 48.6], ["k2", 47.5], ["k3", 10.0], ["k4", 45.9], ["k4", 50.5]]
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(windowed(_PacedSource(first, then, 2.5), lateness=1.5), autoscale=False)
        job.wait_idle(timeout=60)
        assert sorted(job.collected("late")) == [["k3", 10.0, ["k3", 10.0]], ["k4", 45.9, ["k4", 45.9]]]
        got = job.collected("counts")
        again = [w for w in got if w[:3] == ["k2", 46.0, 48.0]]
        assert [w[3] for w in again] == [len([e for e in first if e[0] == "k2" and 46 <= e[1] < 48]) + i
                                         for i in (0, 1)]
        final = {(k, s): v for k, s, _, v in got}  # the last emission of a window is its answer
        assert final == dict(reference(first + then[:2] + then[4:]))
        assert job.stats()["event_time"]["late"] == 2
        job.cancel()


class _Quiet(_Partition):
    """A partition of a stream that never has anything."""

    async def next_batch(self, limit: int) -> list:
        return []

    def position(self) -> Any:
        return 0


class _Ticking(_Partition):
    """A stream of ["k", t], t = 0, 0.1, 0.2, ... s, one record per 20 ms of processing time."""

    def __init__(self, position: Any):
        self.i = int(position or 0)

    async def next_batch(self, limit: int) -> list:
        await asyncio.sleep(0.02)
        self.i += 1
        return [["k", round((self.i - 1) * 0.1, 3)]]

    def position(self) -> Any:
        return self.i


class _OneQuiet(Source):
    """Partition "busy" streams `_Ticking` for ever; partition "quiet" never produces a record."""

    @property
    def bounded(self) -> bool:
        return False

    def partitions(self) -> list[str]:
        return ["busy", "quiet"]

    def open(self, partition: str, position: Any | None) -> SourcePartition:
        return _Quiet() if partition == "quiet" else _Ticking(position)


def test_an_idle_partition_does_not_hold_the_watermark(cluster1):
    dag = clasp.Dag("idle")
    src = dag.source("events", _OneQuiet(), timestamp=lambda e: e[1], max_out_of_order=BOUND, idle_timeout=0.5)
    win = dag.window("counts", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda a, e: a + 1, init=lambda: 0,
                     collect=True)
    src >> win
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        # The busy partition never goes idle (a record every 20 ms): only the quiet one is left out.
        wait_for(lambda: len(job.collected("counts")) >= 3, timeout=30, what="windows past the idle partition")
        et = job.stats()["event_time"]
        assert et["idle"] == ["events/quiet"] and et["watermark"] >= 3 * SIZE
        got = sorted(job.collected("counts"))[:3]
        assert got == [["k", s * SIZE, (s + 1) * SIZE, 20] for s in range(3)]
        job.stop(timeout=30)
        job.cancel()


def test_window_join_of_two_sources_equals_every_pair_per_key_and_window(cluster1):
    clicks, views = events(3000, 4, keys=15), events(2000, 5, keys=15)
    dag = clasp.Dag("join")
    left = dag.source("clicks", IterableSource(clicks, partitions=2), timestamp=lambda e: e[1], max_out_of_order=BOUND)
    right = dag.source("views", IterableSource(views, partitions=3), timestamp=lambda e: e[1], max_out_of_order=BOUND)
    joined = dag.join("pairs", left, right, W.tumbling(SIZE), key=lambda e: e[0], timestamp=lambda e: e[1],
                      collect=True)
    assert joined.late is not None
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        job.wait_idle(timeout=60)
        want = Counter((c[0], tuple(c), tuple(v)) for c in clicks for v in views
                       if c[0] == v[0] and c[1] - c[1] % SIZE == v[1] - v[1] % SIZE)
        got = Counter((k, tuple(c), tuple(v)) for k, c, v in job.collected("pairs"))
        assert got == want and sum(want.values()) > 1000
        job.cancel()


def _bucket_count(state, value, timers):
    b = timers.ts - timers.ts % SIZE
    counts = dict(state or [])
    if b not in counts:
        timers.at(b + SIZE, b)  # once every record before the bucket's end is in
    counts[b] = counts.get(b, 0) + 1
    return sorted(counts.items()), []


def _emit_bucket(state, t, b, timers):
    counts = dict(state)
    n = counts.pop(b)
    return (sorted(counts.items()) or None), [[timers.key, b, b + SIZE, n]]


def test_event_time_timers_in_key_group_state_fire_at_the_watermark(cluster1):
    evs = events(5000, 6)
    dag = clasp.Dag("timers")
    src = dag.source("events", IterableSource(evs, partitions=2), timestamp=lambda e: e[1], max_out_of_order=BOUND)
    counted = dag.timers("buckets", _bucket_count, _emit_bucket, key=lambda e: e[0], collect=True)
    src >> counted
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        job.wait_idle(timeout=60)
        got = job.collected("buckets")
        assert len(got) == len({(k, s) for k, s, _, _ in got})
        assert {(k, s): n for k, s, _, n in got} == dict(reference(evs))
        assert job.state("buckets.windows") == {}  # every key's timers fired and its state went
        job.cancel()


def test_a_window_fed_by_a_window_sees_every_window_before_it_fires(tmp_path_factory):
    evs = events(20000, 7)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    try:
        with clasp.connect(cluster.planner) as client:
            dag = clasp.Dag("two-stages")
            src = dag.source("events", IterableSource(evs, partitions=4), timestamp=slow_ts, max_out_of_order=BOUND)
            per_key = dag.window("per_key", W.tumbling(SIZE), key=lambda e: e[0], fold=lambda a, e: a + 1,
                                 init=lambda: 0)
            total = dag.window("total", W.tumbling(SIZE), key=lambda w: "all", fold=lambda a, w: a + w[3],
                               init=lambda: 0, timestamp=W.result_time, collect=True)
            late = dag.operator("late", lambda r: [r], collect=True)
            src >> per_key >> total
            total.late >> late
            job = client.submit(dag, autoscale=False)
            job.wait_idle(timeout=120)
            want = Counter(ts - ts % SIZE for _, ts in evs)
            got = job.collected("total")
            assert job.collected("late") == [] and len(got) == len(want)
            assert {s: n for _, s, _, n in got} == dict(want)
            ops = job.stats()["event_time"]["operators"]
            assert ops == {"per_key.windows": "end", "total.windows": "end"}
    finally:
        cluster.stop()
