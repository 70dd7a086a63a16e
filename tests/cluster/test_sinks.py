"""Sinks committed with the checkpoints (docs/CONNECTORS.md): real planner and worker processes, real SIGKILLs.

Word Count's running counts, `[word, n]` for each occurrence, go to a sink on 4 workers while a worker is
killed mid-run: the committed output holds each word's counts exactly 1..n once each, against
collections.Counter over the input.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter

import pytest

import clasp
from clasp.connectors import Sink, SinkPartition
from clasp.connectors.file_sink import FileSink
from clasp.core.sinks import SinkBook, partition_name, take_writable
from clasp.local.cluster import RestartPolicy
from clasp.testing import ListSink, run_local
from tests.conftest import start_cluster, wait_for

SEEDS = int(os.environ.get("CLASP_SINK_SEEDS", "1"))  # seeds of the kill test (more: a longer soak)


def split(line):
    return line.split()


def running_count(state, word):
    n = (state or 0) + 1
    return n, [[word, n]]


def split_slowly(value):
    """A line, a Redis entry's `line` field or a Kafka message's bytes, split; at most ~2,000 lines/s per
    worker, so a source's input lasts through the kills."""
    time.sleep(0.0005)
    if isinstance(value, dict):
        value = value["line"]
    if isinstance(value, bytes):
        value = value.decode()
    return value.split()


def count_dag(sink, name: str = "sinks", source=None) -> clasp.Dag:
    """split -> keyed running count emitting [word, n] -> sink; fed by push, or read from `source`."""
    d = clasp.Dag(name)
    s = d.operator("split", split if source is None else split_slowly)
    c = d.operator("count", running_count, stateful=True, key=clasp.identity)
    out = d.sink("out", sink)
    if source is not None:
        d.source("lines", source) >> s
    s >> c >> out
    return d


def lines(n: int, seed: int = 0, vocabulary: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(vocabulary)}" for _ in range(rng.randint(1, 8))) for _ in range(n)]


def unequal_parts(records: list[str], n: int, short: int = 2) -> list[list[str]]:
    """`records` in `n` partitions, the first `short` of 50 lines each (read to their end at once), the
    rest shared by the others."""
    head, rest = records[:50 * short], records[50 * short:]
    return [head[50 * i:50 * (i + 1)] for i in range(short)] + [rest[i::n - short] for i in range(n - short)]


def check_exact(pairs: list, records: list[str]) -> None:
    """Each word's emitted counts are exactly 1..n, once each, n its occurrences in the input."""
    want = Counter(w for line in records for w in line.split())
    got: dict[str, list[int]] = {}
    for word, n in pairs:
        got.setdefault(word, []).append(n)
    dup = {w: ns for w, ns in got.items() if len(ns) != len(set(ns))}
    assert not dup, f"{len(dup)} words with a count written twice, e.g. {list(dup.items())[:3]}"
    bad = {w: (sorted(got.get(w, [])), n) for w, n in want.items() if sorted(got.get(w, [])) != list(range(1, n + 1))}
    assert not bad, f"{len(bad)} words wrong, e.g. {list(bad.items())[:3]}"
    assert set(got) == set(want)


def _kill_one(client, rng) -> str:
    alive = [w for w in client.workers() if w["alive"]]
    victim = rng.choice(alive)
    os.kill(victim["pid"], signal.SIGKILL)
    return victim["id"]


def run_with_kill(cluster, sink, records: list[str], seed: int = 1, name: str = "sinks", kills: int = 1,
                  source=None):
    """Push `records` in steps (or let the workers read them from `source`, which holds them) while workers
    are SIGKILLed mid-run (the second kill while a checkpoint is pending); wait_idle; return the job and its
    stats."""
    rng = random.Random(seed)
    with clasp.connect(cluster.planner) as client:
        job = client.submit(count_dag(sink, name, source), autoscale=False)
        job.scale(4)

        killed = threading.Event()

        def feed():
            with clasp.connect(cluster.planner) as c2:
                j2 = c2.job(job.id)
                head = len(records) * 4 // 5
                for i in range(0, head, 100):  # about 5 s of input: it flows through the kills
                    j2.push(records[i:i + 100])
                    time.sleep(0.05)
                # Then a trickle until the kills are over: every checkpoint has new input, so one is pending
                # often enough for the second kill to land during it however long the first recovery took.
                i = head
                while i < len(records) and not killed.is_set():
                    j2.push(records[i:i + 1])
                    i += 1
                    time.sleep(0.05)
                if i < len(records):
                    j2.push(records[i:])

        feeder = threading.Thread(target=feed if source is None else lambda: None)
        feeder.start()
        wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 2, timeout=30, what="two checkpoints")
        if source is not None:
            assert job.stats()["completed"] < len(records), "the input was done before the kill"
        try:
            for k in range(kills):
                before = job.stats()["checkpoints"]["recoveries"]
                if k % 2:
                    wait_for(lambda: job.stats()["checkpoints"]["pending"] is not None, timeout=20, interval=0.005,
                             what="a pending checkpoint")
                victim = _kill_one(client, rng)
                wait_for(lambda b=before: job.stats()["checkpoints"]["recoveries"] > b, timeout=30,
                         what=f"the recovery from the kill of {victim}")
                wait_for(lambda: len(job.stats()["checkpoints"]["serving"]) == 4, timeout=30,
                         what="the killed worker back, serving the job")
        finally:
            killed.set()
        feeder.join()
        summary = job.wait_idle(timeout=120)
        assert summary["completed"] == len(records) and summary["lost"] == 0, summary
        if source is not None:
            assert summary["read"] == len(records), summary
        stats = job.stats()
        return job, stats


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    # Two SIGKILLs a seed on one cluster: the supervisor's crash-loop guard (five restarts a minute, then the
    # worker stays down) is for a worker that keeps failing, not for kills on purpose.
    c = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"],
                      restart_policy=RestartPolicy(max_restarts=1000, backoff=0.0))
    yield c
    c.stop()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_file_sink_exactly_once_through_worker_kills(cluster4, tmp_path, seed):
    records = lines(12_000, seed=3 + seed)
    sink = FileSink(tmp_path / "out", format="jsonl")
    _job, stats = run_with_kill(cluster4, sink, records, seed=seed, name=f"sinks-{seed}", kills=2)
    assert stats["checkpoints"]["recoveries"] >= 2
    assert stats["sinks"]["owed"] == [] and stats["sinks"]["commits"] > 0, stats["sinks"]
    parts = sink.read()
    assert len({p.split("-")[1] for p in parts}) >= 2  # written by several workers' partitions
    check_exact([v for vs in parts.values() for v in vs], records)
    # Nothing is left in progress or pending once wait_idle returned.
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".")]


def test_list_sink_on_a_cluster_and_in_process(cluster4):
    records = lines(500, seed=5)
    sink = ListSink()
    with clasp.connect(cluster4.planner) as client:
        job = client.submit(count_dag(sink, "listsink"), autoscale=False)
        job.scale(4)
        job.push(records)
        job.wait_idle(timeout=60)
        check_exact(sink.values, records)
        # wait_idle after more input commits that too
        job.push(records)
        job.wait_idle(timeout=60)
        check_exact(sink.values, records + records)
    local = ListSink()
    run_local(count_dag(local, "local"), records)
    check_exact(local.values, records)
    assert local.values == ListSink(local.directory).values


class Wrapped(Sink):
    """Another sink (a ListSink by default) whose partitions are wrapped in `part(inner partition, *args)`."""

    def __init__(self, part, *args, inner=None):
        self.part, self.args, self.inner = part, args, inner or ListSink()

    def open(self, partition):
        return self.part(self.inner.open(partition), *self.args)


class Passing(SinkPartition):
    def __init__(self, inner):
        self.inner = inner

    async def write_batch(self, values):
        await self.inner.write_batch(values)

    async def prepare(self, checkpoint):
        return await self.inner.prepare(checkpoint)

    async def commit(self, checkpoint, prepared):
        await self.inner.commit(checkpoint, prepared)


class FlakyPartition(Passing):
    """Fails every batch holding the word `bad`."""

    async def write_batch(self, values):
        if any(v[0] == "bad" for v in values):
            raise RuntimeError("the sink refused a batch")
        await self.inner.write_batch(values)


def test_a_sink_that_raises_is_reported_not_a_crash(cluster4):
    sink = Wrapped(FlakyPartition)
    with clasp.connect(cluster4.planner) as client:
        job = client.submit(count_dag(sink, "flaky"), autoscale=False)
        job.push(["good word", "bad"])
        job.wait_idle(timeout=60)
        def refused():  # the next heartbeat carries the errors
            stats = job.stats()
            return [e for e in stats["errors"] if "the sink refused a batch" in e["error"]] and stats

        stats = wait_for(refused, timeout=10, what="a heartbeat carrying the sink's error")
        errors = [e for e in stats["errors"] if "the sink refused a batch" in e["error"]]
        assert errors and errors[0]["operator"] == "out", stats["errors"]
        assert stats["operators"]["out"]["errors"] >= 1
        job.push(["good again"])
        job.wait_idle(timeout=60)
        assert sorted(map(tuple, sink.inner.values)) == [("again", 1), ("good", 1), ("good", 2), ("word", 1)]
        assert all(w["alive"] for w in client.workers())


def test_checkpoints_off_commits_at_wait_idle(tmp_path_factory, tmp_path):
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--checkpoint-interval", "0"])
    try:
        records = lines(2000, seed=7)
        sink = FileSink(tmp_path / "o", format="jsonl")
        with clasp.connect(cluster.planner) as client:
            job = client.submit(count_dag(sink, "nockpt"), autoscale=False)
            job.push(records)
            job.wait_idle(timeout=60)
            check_exact([v for vs in sink.read().values() for v in vs], records)
            assert job.stats()["checkpoints"] is None
    finally:
        cluster.stop()


# ----------------------------------------------------------------- the pure bookkeeping
def test_take_writable_respects_the_fence_and_order():
    vals, rids = list("abcdef"), [1, 5, 2, 6, 3, 1]
    batch, keep, keep_r = take_writable(vals, rids, 4)
    assert batch == ["a", "c", "e", "f"] and keep == ["b", "d"] and keep_r == [5, 6]
    batch, keep, keep_r = take_writable(vals, rids, None)
    assert batch is vals and keep == [] and keep_r == []


def test_sink_book_owes_commits_until_acked_and_hands_them_over_in_a_recovery():
    book = SinkBook()
    p0, p1 = partition_name("out", "w0", "r"), partition_name("out", "w1", "r")
    book.completed(1, {"w0": {p0: ["out", [[1, "a"]]]}, "w1": {p1: ["out", [[1, "b"]]]}})
    book.completed(3, {"w1": {p1: ["out", [[2, "c"], [3, "d"]]]}, "w0": {}})
    book.acked(1, "w0")
    assert not book.settled and sorted(book.pending) == [1, 3]
    duties = book.recovery_duties(["w0", "w2"], ["w1"], ["out"], "r")
    # w1's commits (checkpoints 1, 2 and 3, in order) and its partition's abort go to one survivor
    heir = [w for w, d in duties.items() if d["commit"]]
    assert len(heir) == 1
    assert duties[heir[0]]["commit"] == [[p1, "out", [[1, "b"], [2, "c"], [3, "d"]]]]
    assert duties[heir[0]]["abort"] == [["out", p1]]
    book.acked(1, "w1")
    book.acked(3, "w1")
    assert book.settled and book.commits == 3


class SlowPartition(Passing):
    """Every batch takes `delay` seconds to write."""

    def __init__(self, inner, delay):
        super().__init__(inner)
        self.delay = delay

    async def write_batch(self, values):
        import asyncio

        await asyncio.sleep(self.delay)
        await self.inner.write_batch(values)
        self.inner.file.flush()  # so that the test can count what was written


def _written(directory) -> int:
    return sum(p.read_bytes().count(b"\n") for p in directory.iterdir()) if directory.exists() else 0


def test_a_slow_sink_holds_the_input_back(tmp_path_factory, tmp_path):
    """The values waiting for a slow sink stay bounded: its operator stops taking requests, the records stay
    incomplete and the planner's in-flight window stops dispatching (push blocks) instead."""
    from clasp.core.sinks import SINK_BATCH, SINK_BUFFER

    cluster = start_cluster(tmp_path_factory, 1, planner_args=["--no-autoscale", "--checkpoint-interval", "0"])
    try:
        out = tmp_path / "slow"
        records = [f"v{i}" for i in range(30_000)]
        with clasp.connect(cluster.planner) as client:
            slow = Wrapped(SlowPartition, 0.5, inner=FileSink(out, "jsonl"))
            job = client.submit(count_dag(slow, "slow"), autoscale=False)
            job.push(records)
            waiting, queued = [], []
            while (st := job.stats())["completed"] < len(records):
                waiting.append(st["completed"] - _written(out))
                queued.append(st["queued"])
                time.sleep(0.1)
            job.wait_idle(timeout=60)
            check_exact([v for vs in FileSink(out, "jsonl").read().values() for v in vs], records)
        # about 4,000 values/s: seconds, the input held back at the planner meanwhile
        assert len(waiting) > 20 and max(queued) > 0
        assert max(waiting) <= SINK_BUFFER + 2 * SINK_BATCH, max(waiting)
    finally:
        cluster.stop()


class CommitOnceFails(Passing):
    """Each partition fails its first commit."""

    failed = False

    async def commit(self, checkpoint, prepared):
        if not self.failed:
            self.failed = True
            raise OSError("the sink's store is briefly unavailable")
        await self.inner.commit(checkpoint, prepared)


def test_a_failed_commit_is_reported_and_made_again(cluster4):
    records = lines(300, seed=9)
    sink = Wrapped(CommitOnceFails)
    with clasp.connect(cluster4.planner) as client:
        job = client.submit(count_dag(sink, "commit-once-fails"), autoscale=False)
        job.scale(2)
        job.push(records)
        job.wait_idle(timeout=60)
        check_exact(sink.inner.values, records)
        stats = job.stats()
        assert stats["sinks"]["owed"] == []
        assert any("briefly unavailable" in e for e in stats["sinks"]["errors"]), stats["sinks"]


def test_a_barrier_holds_the_requests_above_it_at_a_stateful_operator_that_feeds_a_sink():
    """A request below the boundary that reaches a key after one above it emits from the state as of the cut:
    the running count a rollback to the checkpoint would emit again is never emitted twice (with copy on
    write the count ran on with the later request first, and its value below the boundary came out one too
    high, to be emitted again by the replay)."""
    from clasp.core.routing import build_placement
    from clasp.core.sinks import aligned_operators
    from clasp.core.tracking import CHUNK_BITS
    from clasp.runtime.engine import JobEngine

    spec = count_dag(ListSink(), "aligned").to_spec()
    count = spec.by_name("count").index
    assert aligned_operators(spec) == {count}
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
    boundary = 5 << CHUNK_BITS
    eng.begin_barrier(boundary)
    eng.enqueue_rows([(count, "w", "w", boundary + 1)])  # above the boundary, first
    eng.enqueue_rows([(count, "w", "w", boundary - 1)])  # below it, later
    while eng.run_round():
        pass
    out = eng.op("out")
    assert list(zip(out.collected, out.collected_rids, strict=True)) == [(["w", 1], boundary - 1)]  # the cut's count
    list(eng.cut.snapshot_groups(eng.placement))
    assert eng.release_barrier() == 1
    while eng.run_round():
        pass
    after = list(zip(out.collected, out.collected_rids, strict=True))
    assert after == [(["w", 1], boundary - 1), (["w", 2], boundary + 1)]


def test_a_planner_sigkilled_and_restarted_leaves_the_sink_exact(tmp_path):
    """The commits owed are in the job's record: a planner restarted on its state directory re-drives them
    in the rollback, and the input replayed from its log is written once."""
    from tests.cluster.test_recovery import _connect, _free_port, _start, restart_planner

    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    planner = ["planner", "--port", str(port), "--state-dir", str(tmp_path / "state"), "--no-autoscale",
               "--checkpoint-interval", "0.2"]
    procs = [_start(planner, tmp_path / "planner.log")]
    procs += [_start(["worker", "--planner", addr, "--id", f"w{i}"], tmp_path / f"w{i}.log") for i in range(3)]
    records = lines(9000, seed=21)
    sink = FileSink(tmp_path / "out", format="jsonl")
    try:
        client = wait_for(lambda: _connect(addr), timeout=60, interval=0.5, what="the planner")
        with client:
            wait_for(lambda: len([w for w in client.workers() if w["alive"]]) == 3, timeout=60, what="3 workers")
            job = client.submit(count_dag(sink, "planner-restart"), autoscale=False)
            job.scale(3)
            job_id = job.id
            job.push(records[:3000])
            job.wait_idle(timeout=60)
            job.push(records[3000:6000])  # accepted, then the planner dies before it is all done
        client, job = restart_planner(procs, planner, tmp_path / "planner.log", addr, job_id)
        with client:
            job.push(records[6000:])
            summary = job.wait_idle(timeout=120)
            assert summary["completed"] == len(records) and summary["lost"] == 0, summary
            check_exact([v for vs in sink.read().values() for v in vs], records)
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_rescaling_while_writing_keeps_the_sink_exact(cluster4, tmp_path):
    """1 -> 4 -> 2 workers while the input flows: the sink operator's queued requests move, each partition
    keeps what it holds and commits it; nothing is written twice or lost."""
    records = lines(9000, seed=31)
    sink = FileSink(tmp_path / "out", format="jsonl")
    with clasp.connect(cluster4.planner) as client:
        job = client.submit(count_dag(sink, "rescale"), autoscale=False)
        job.scale(1)
        for i, n in enumerate((4, 2)):
            job.push(records[3000 * i:3000 * (i + 1)])
            job.scale(n)
        job.push(records[6000:])
        job.wait_idle(timeout=120)
        check_exact([v for vs in sink.read().values() for v in vs], records)
        assert len({p.split("-")[1] for p in sink.read()}) >= 2
