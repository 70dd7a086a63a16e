"""Declared sources read by the workers themselves: real planner and worker processes, real SIGKILLs.

Word Count from files (FileSource: several files, large ones in byte ranges) into a keyed running count
that emits [word, n] with collect=True: after a worker is SIGKILLed mid-run, and across rescales 1 -> 4 -> 2
while the partitions are being read, every word's emitted counts are exactly 1..n, once each, and the state
is collections.Counter of the input; the same from files into a FileSink across 1 -> 4 -> 2. A reader
pauses while its worker's window is full (bounded memory); stop() ends a job on a stream after a last
checkpoint; push() feeds the roots that are not sources; a worker that read its partitions takes some of a
busier one's, also through a SIGKILL.

CLASP_STRESS_SEEDS=N runs N seeds of the SIGKILL test (default 1).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import clasp
from clasp.connectors.files import FileSink, FileSource
from clasp.runtime.state_store import read_snapshot, snapshot_name
from clasp.testing import IterableSource
from tests.cluster.test_sinks import check_exact as check_pairs
from tests.cluster.test_sinks import count_dag
from tests.conftest import start_cluster, wait_for

SEEDS = int(os.environ.get("CLASP_STRESS_SEEDS", "1"))


def slow_split(line):
    time.sleep(0.0001)  # ~10,000 lines/s per worker at most: the input lasts through the kills
    return line.split()


def count(state, word):
    n = (state or 0) + 1
    return n, [[word, n]]


def line_time(line: str) -> float:
    return float(len(line))  # any time: a line's length puts a chunk's lines out of their files' order


def modes_and_faults(fault_ids: tuple[str, str]) -> list:
    """[kill, timestamp] cases: each reading mode (turns, aligned) and each fault once in a plain run, every
    pairing of them at CLASP_STRESS_SEEDS > 1 (a cluster run costs ~15-30 s; the suite's time is bounded)."""
    pairs = [(False, None), (True, line_time)] if SEEDS == 1 else [(k, t) for k in (False, True)
                                                                  for t in (None, line_time)]
    return [pytest.param(k, t, id=f"{fault_ids[k]}-{'aligned' if t else 'turns'}") for k, t in pairs]


def word_count(source, timestamp=None) -> clasp.Dag:
    """Word Count from a source; with `timestamp`, a source on event time, whose partitions a worker reads
    aligned (one chunk of several partitions' slices, merged by time)."""
    dag = clasp.Dag("wc-source")
    src = dag.source("lines", source, timestamp=timestamp)
    s = dag.operator("split", slow_split)
    c = dag.operator("count", count, stateful=True, key=clasp.identity, collect=True)
    src >> s >> c
    return dag


def write_input(directory, rng: random.Random, files: int, lines: int) -> list[str]:
    vocabulary = [f"w{i}" for i in range(800)]
    out = []
    for f in range(files):
        rows = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 6))) for _ in range(lines)]
        (directory / f"part-{f}.txt").write_text("".join(r + "\n" for r in rows))
        out.extend(rows)
    return out


def check_exact(job, lines: list[str]) -> None:
    expected = Counter(w for line in lines for w in line.split())
    assert job.state("count") == dict(expected)
    emitted: dict[str, list[int]] = {}
    for word, n in job.collected("count"):
        emitted.setdefault(word, []).append(n)
    wrong = {w: sorted(ns)[:10] for w, ns in emitted.items() if sorted(ns) != list(range(1, expected[w] + 1))}
    assert not wrong and set(emitted) == set(expected), f"{len(wrong)} words wrong, e.g. {list(wrong.items())[:3]}"


def _try(fn):
    try:
        return fn()
    except clasp.ClaspError:
        return None  # a migration that a worker's death failed


def _kill(client, wid: str) -> None:
    for w in client.workers():
        if w["id"] == wid and w["alive"]:
            os.kill(w["pid"], signal.SIGKILL)


def _pids(client) -> dict:
    """Live workers' pids, asked before the rescale starts, so that the kill comes with no round trip."""
    return {w["id"]: w["pid"] for w in client.workers() if w["alive"]}


@pytest.mark.parametrize("during", ["reading", "a rescale"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_file_source_word_count_exact_after_a_worker_sigkill(tmp_path_factory, seed, during):
    rng = random.Random(seed)
    data = tmp_path_factory.mktemp("input")
    # More lines than the workers' windows hold: the first checkpoints cut the files in the middle.
    lines = write_input(data, rng, files=3, lines=40000)
    source = FileSource(str(data / "part-*.txt"), range_bytes=200_000)  # 3 files, ~12 ranges
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(word_count(source), autoscale=False)
            stats = job.stats()["sources"]
            assert stats["partitions"] >= 6 and len(stats["owners"]) == 4, stats
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=30, what="a first checkpoint")
            time.sleep(rng.uniform(0.1, 0.5))
            assert job.stats()["completed"] < len(lines), "the input was done before the kill"
            pids = _pids(client)
            victim = rng.choice(sorted(pids))
            if during == "a rescale":  # partitions move while the victim dies: the rollback decides
                mover = threading.Thread(target=lambda: _try(lambda: job.scale(2)))
                mover.start()
                time.sleep(0.02)
                os.kill(pids[victim], signal.SIGKILL)
                mover.join()
            else:
                _kill(client, victim)
            wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=30, what="the recovery")
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) and summary["completed"] == len(lines) and summary["lost"] == 0
            check_exact(job, lines)
    finally:
        cluster.stop()


def _lines_before(name: str, position) -> list[str]:
    """The lines of partition `name` (a file, or `path@start-end`) below byte `position`: what a reader
    that stopped there had read."""
    path, sep, span = name.rpartition("@")
    if not sep or "-" not in span:
        path, start = name, 0
    else:
        start = int(span.split("-")[0])
    if position is None:
        return []
    data = Path(path).read_bytes()
    if start:
        nl = data.find(b"\n", start - 1)
        start = len(data) if nl < 0 else nl + 1  # the first line that begins at or after the range
    return data[start:int(position)].decode().splitlines()


def _capture_checkpoints(state_dir: Path, into: Path, stop: threading.Event) -> None:
    """Copy every complete checkpoint of job 1 as it appears (the planner keeps only the newest two)."""
    seen: set[str] = set()
    while not stop.is_set():
        for marker in state_dir.glob("job-1/ckpt-*/COMPLETE.json"):
            d = marker.parent
            if d.name in seen:
                continue
            try:
                shutil.copytree(d, into / d.name)
                seen.add(d.name)
            except (OSError, shutil.Error):
                shutil.rmtree(into / d.name, ignore_errors=True)  # deleted while copied: missed
        time.sleep(0.005)


@pytest.mark.parametrize(("kill", "timestamp"), modes_and_faults(("rescale", "SIGKILL during a rescale")))
@pytest.mark.parametrize("seed", range(SEEDS))
def test_every_checkpoint_is_a_consistent_cut(tmp_path_factory, seed, kill, timestamp):
    """A checkpoint's state is the count of exactly the lines below its positions: no record of the cut's
    far side in the snapshot (a replay would add it twice), none of its near side missing (a replay would
    skip it). Checked on every checkpoint of a run with frequent checkpoints and a rescale (and a worker
    SIGKILLed while it runs), not only on the one a recovery happens to restore."""
    rng = random.Random(seed)
    data = tmp_path_factory.mktemp("input")
    # Enough input for several checkpoints: each lasts as long as the records read before its cut take to
    # complete, up to a source window of them (16,384 a worker), and 90,000 lines once gave only 4.
    lines = write_input(data, rng, files=3, lines=60000)
    state_dir = tmp_path_factory.mktemp("state")
    captured = tmp_path_factory.mktemp("captured")
    cluster = start_cluster(tmp_path_factory, 4, state_dir=state_dir,
                            planner_args=["--no-autoscale", "--checkpoint-interval", "0.05"])
    stop = threading.Event()
    watcher = threading.Thread(target=_capture_checkpoints, args=(state_dir, captured, stop), daemon=True)
    watcher.start()
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(word_count(FileSource(str(data / "part-*.txt"), range_bytes=150_000), timestamp),
                                autoscale=False)
            time.sleep(rng.uniform(0.5, 1.0))
            pids = _pids(client)
            mover = threading.Thread(target=lambda: _try(lambda: job.scale(2)))
            mover.start()
            if kill:
                time.sleep(rng.uniform(0.0, 0.1))
                os.kill(pids[rng.choice(sorted(pids))], signal.SIGKILL)
            mover.join()
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) and summary["completed"] == len(lines) and summary["lost"] == 0
            assert job.stats()["checkpoints"]["recoveries"] == int(kill)
            final = job.state("count")
    finally:
        stop.set()
        watcher.join()
        cluster.stop()
    checked = 0
    for d in sorted(captured.iterdir()):
        meta = json.loads((d / "COMPLETE.json").read_text())
        counts: Counter = Counter()
        for w in meta["workers"]:
            for op, _, state in read_snapshot(d / snapshot_name(w)) if (d / snapshot_name(w)).exists() else ():
                if op == "count":
                    counts.update(state)
        expected = Counter(w for _, name, pos in meta["positions"] for line in _lines_before(name, pos)
                           for w in line.split())
        extra = {w: counts[w] - expected[w] for w in counts if counts[w] > expected[w]}
        missing = {w: expected[w] - counts[w] for w in expected if counts[w] < expected[w]}
        assert not extra and not missing, (f"{d.name} at chunk {meta['boundary']}: {len(extra)} words counted "
                                           f"beyond the cut, e.g. {list(extra.items())[:3]}; {len(missing)} "
                                           f"short of it, e.g. {list(missing.items())[:3]}")
        checked += 1
    assert checked >= 5, f"only {checked} checkpoints captured"
    assert final == dict(Counter(w for line in lines for w in line.split()))
def count_quietly(state, word):
    return (state or 0) + 1, None


def running_sum(state, pair):
    return (state or 0) + pair[1], None


def state_dag(source, chained: bool) -> clasp.Dag:
    """Split -> a running count whose outputs nobody sees (copy on write at the barrier), or one emitting
    [word, n] to a keyed running sum of the n (aligned: a stateful successor sees them)."""
    dag = clasp.Dag("wc-state")
    s = dag.source("lines", source) >> dag.operator("split", slow_split)
    if chained:
        s >> dag.operator("count", count, stateful=True, key=clasp.identity) >> dag.operator(
            "sum", running_sum, stateful=True, key=lambda pair: pair[0])
    else:
        s >> dag.operator("count", count_quietly, stateful=True, key=clasp.identity)
    return dag


@pytest.mark.parametrize("chained", [False, True], ids=["count", "count-then-sum"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_state_without_seen_outputs_exact_after_a_worker_sigkill(tmp_path_factory, seed, chained):
    """The stateful operators of a job on declared sources whose outputs nobody sees run on under copy on
    write at a barrier: the state is still exact after a SIGKILL (the running count, and the running sum of
    its emitted n, n(n+1)/2 per word: a value emitted below the boundary from a state that held a request
    above it would repeat in the sum after the rollback)."""
    rng = random.Random(100 + seed)
    data = tmp_path_factory.mktemp("input")
    lines = write_input(data, rng, files=3, lines=40000)
    source = FileSource(str(data / "part-*.txt"), range_bytes=200_000)
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(state_dag(source, chained), autoscale=False)
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 2, timeout=30, what="two checkpoints")
            assert job.stats()["completed"] < len(lines), "the input was done before the kill"
            _kill(client, rng.choice([w["id"] for w in client.workers() if w["alive"]]))
            wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=30, what="the recovery")
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) and summary["completed"] == len(lines) and summary["lost"] == 0
            expected = Counter(w for line in lines for w in line.split())
            assert job.state("count") == dict(expected)
            if chained:
                sums = job.state("sum")
                want = {w: n * (n + 1) // 2 for w, n in expected.items()}
                wrong = {w: (sums.get(w), v) for w, v in want.items() if sums.get(w) != v}
                assert not wrong, f"{len(wrong)} sums wrong, e.g. {list(wrong.items())[:3]}"
    finally:
        cluster.stop()


def test_rescale_1_4_2_moves_partitions_with_their_positions(tmp_path_factory):
    data = tmp_path_factory.mktemp("input")
    lines = write_input(data, random.Random(7), files=4, lines=16000)
    # A small window per worker: reading goes on through both rescales.
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale"],
                            worker_args=["--source-window", "2048"])
    one = {"lines": {0: 1.0}, "split": {0: 1.0}, "count": {0: 1.0}}
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(word_count(FileSource(str(data / "*.txt"), range_bytes=100_000)), placement=one)
            total = job.stats()["sources"]["partitions"]
            assert list(job.stats()["sources"]["owners"].values()) == [total] and total >= 8
            time.sleep(0.3)
            assert not job.scale(4)["failed"]
            four = job.stats()["sources"]
            assert len(four["owners"]) == 4 and four["ended"] < total, four
            time.sleep(0.3)
            assert not job.scale(2)["failed"]
            two = job.stats()["sources"]
            assert len(two["owners"]) == 2 and two["ended"] < total, two
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) == summary["completed"]
            check_exact(job, lines)
    finally:
        cluster.stop()


def write_uneven(directory, rng: random.Random, big: int, small: int) -> list[str]:
    """Four big files listed first, then four small ones: the first worker's four, the second's four."""
    vocabulary = [f"w{i}" for i in range(300)]
    out = []
    for f in range(8):
        rows = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 5)))
                for _ in range(big if f < 4 else small)]
        (directory / f"part-{f}.txt").write_text("".join(r + "\n" for r in rows))
        out.extend(rows)
    return out


@pytest.mark.parametrize(("kill", "timestamp"), modes_and_faults(("steal", "SIGKILL after a steal")))
@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_worker_that_read_its_partitions_takes_some_of_a_busier_ones(tmp_path_factory, seed, kill, timestamp):
    """Partitions of very different lengths on 2 workers: the one whose files were short takes some of the
    other's (with their positions) when it has read its own, so both read to the end; with a SIGKILL after
    that, the rollback reopens every partition at the checkpoint's position. Exact either way."""
    rng = random.Random(seed)
    data = tmp_path_factory.mktemp("input")
    lines = write_uneven(data, rng, big=12000, small=300)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"])
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(word_count(FileSource(str(data / "part-*.txt")), timestamp), autoscale=False)
            assert job.stats()["sources"]["partitions"] == 8
            wait_for(lambda: job.stats()["sources"]["stolen"] >= 1, timeout=30, what="a partition moved")
            assert job.stats()["sources"]["ended"] < 8  # moved while the big files were still being read
            if kill:
                pids = _pids(client)
                os.kill(pids[rng.choice(sorted(pids))], signal.SIGKILL)
                wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=30, what="the recovery")
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) == summary["completed"] and summary["lost"] == 0
            check_exact(job, lines)
    finally:
        cluster.stop()


def slow(value):
    time.sleep(0.001)
    return value


def test_a_reader_pauses_while_its_window_is_full(cluster1):
    from clasp.runtime.sources import WINDOW

    values = list(range(200_000))
    dag = clasp.Dag("bp")
    src = dag.source("numbers", IterableSource(values, partitions=4))
    src >> dag.operator("slow", slow)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        try:
            wait_for(lambda: job.stats()["sources"]["read"] >= WINDOW, timeout=20, what="the window filled")
            for _ in range(10):
                s = job.stats(fresh=True)
                src_stats = s["sources"]
                assert src_stats["read"] - src_stats["read_complete"] <= WINDOW, src_stats
                assert s["operators"]["slow"]["queue"] <= WINDOW
                time.sleep(0.1)
            assert job.stats()["sources"]["read"] < len(values) // 2  # it waited instead of reading on
        finally:
            job.cancel()


def test_stop_ends_a_job_on_a_stream_after_a_last_checkpoint(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--checkpoint-interval", "0.5"])
    lines = [f"a b c{i % 7}" for i in range(3000)]
    try:
        with clasp.connect(cluster.planner) as client:
            dag = word_count(IterableSource(lines, partitions=3, bounded=False))
            job = client.submit(dag, autoscale=False)
            with pytest.raises(clasp.ClaspTimeout, match="reading 3 source partition"):
                job.wait_idle(timeout=1.5)
            out = job.stop(timeout=60)
            assert out["read"] == len(lines) == out["completed"] and out["checkpoint"] is not None
            assert sorted(p[2] for p in out["positions"]) == [1000, 1000, 1000]
            check_exact(job, lines)
            assert job.wait_idle(timeout=10)["read"] == len(lines)
    finally:
        cluster.stop()


def test_push_feeds_the_roots_that_are_not_sources_and_is_refused_without_one(client3):
    dag = clasp.Dag("mixed")
    src = dag.source("lines", IterableSource(["a b", "b"], partitions=2))
    pushed = dag.operator("pushed", str.split)
    s = dag.operator("split", str.split)
    c = dag.operator("count", count, stateful=True, key=clasp.identity)
    src >> s >> c
    pushed >> c
    job = client3.submit(dag, autoscale=False)
    job.push(["a c", "c"])
    summary = job.wait_idle(timeout=30)
    assert summary["read"] == 2 and summary["pushed"] == 2
    assert job.state("count") == {"a": 2, "b": 2, "c": 2}
    only = client3.submit(word_count(IterableSource(["x"])), autoscale=False)
    with pytest.raises(clasp.ClaspError, match="reads only its declared sources"):
        only.push(["y"])
    assert only.wait_idle(timeout=30)["read"] == 1


def test_file_source_to_file_sink_exact_through_a_rescale_1_4_2(tmp_path_factory):
    """Files in, part files out, 1 -> 4 -> 2 workers while the partitions are read: the sink holds each
    word's counts exactly 1..n once each."""
    data = tmp_path_factory.mktemp("input")
    lines = write_input(data, random.Random(11), files=4, lines=10000)
    sink = FileSink(tmp_path_factory.mktemp("output"), format="jsonl")
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale"],
                            worker_args=["--source-window", "2048"])
    one = {"lines": {0: 1.0}, "split": {0: 1.0}, "count": {0: 1.0}, "out": {0: 1.0}}
    try:
        with clasp.connect(cluster.planner) as client:
            dag = count_dag(sink, "files-in-out", FileSource(str(data / "*.txt"), range_bytes=60_000))
            job = client.submit(dag, placement=one)
            total = job.stats()["sources"]["partitions"]
            for n in (4, 2):
                time.sleep(0.5)
                assert not job.scale(n)["failed"]
                moved = job.stats()["sources"]
                assert len(moved["owners"]) == n and moved["ended"] < total, moved
            summary = job.wait_idle(timeout=120)
            assert summary["read"] == len(lines) == summary["completed"]
            check_pairs([v for vs in sink.read().values() for v in vs], lines)
    finally:
        cluster.stop()
