"""Crash recovery with checkpoints (docs/RECOVERY.md): real processes, SIGKILL, exact results.

The chaos test runs Word Count plus order-sensitive keyed operators on 4 workers while input flows, and
SIGKILLs workers 5 times at random moments: once while a migration runs, once while a checkpoint is
pending, once two workers at once. The supervisor restarts each killed worker (it re-registers as new).
At the end: every count exact, every key's order-sensitive hash equal to the sequential reference, every
collected output seen exactly once.

CLASP_CHAOS_SEEDS=N runs N seeds (default 1); CLASP_CHAOS_RECORDS=M records per seed (default 40000).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import clasp
from clasp.runtime.state_store import read_snapshot
from tests.cluster import test_order_stress as order_stress
from tests.cluster.test_order_stress import chain, reference
from tests.conftest import start_cluster, wait_for

SEEDS = int(os.environ.get("CLASP_CHAOS_SEEDS", "1"))
RECORDS = int(os.environ.get("CLASP_CHAOS_RECORDS", "40000"))
KILLS = 5


def inner_order(state, r):
    seq = int(r.split(" ", 2)[1])
    return chain(state or 7, seq), seq  # the output, collected: each record's sequence number once


def build_dag() -> clasp.Dag:
    return order_stress.build_dag("chaos", inner_order, collect=True)


def generate(n: int, rng: random.Random) -> list[str]:
    return order_stress.generate(n, rng, vocabulary=2000, max_words=6)


def _pid(client, wid: str) -> int | None:
    for w in client.workers():
        if w["id"] == wid and w["alive"]:
            return w["pid"]
    return None


def _kill(client, wid: str) -> None:
    pid = _pid(client, wid)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# The source on one worker and the rest on the other three: the planner's in-flight window is that of
# every worker the job spans (40,000), not of its one source worker (10,000), so more records are in flight
# on the workers that are killed.
ONE_SOURCE = {"source_order": {0: 1.0}, "inner_order": {1: 1.0}, "split": {2: 0.5, 3: 0.5},
              "count": {1: 0.3, 2: 0.35, 3: 0.35}}


@pytest.mark.parametrize("layout", ["scaled", "one source"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_chaos_five_worker_kills_exact_results(tmp_path_factory, seed, layout):
    rng = random.Random(seed)
    records = generate(RECORDS, rng)
    extra = os.environ.get("CLASP_CHAOS_PLANNER_ARGS", "").split()
    cluster = start_cluster(tmp_path_factory, 4,
                            planner_args=["--no-autoscale", "--checkpoint-interval", "0.5", *extra])
    try:
        with clasp.connect(cluster.planner) as client:
            if layout == "scaled":
                job = client.submit(build_dag(), autoscale=False)
                job.scale(4)
            else:
                job = client.submit(build_dag(), autoscale=False, placement=ONE_SOURCE)
                assert job.stats()["in_flight"]["window"] == 40_000
            stop = threading.Event()

            def feed():
                with clasp.connect(cluster.planner) as c2:
                    j2 = c2.job(job.id)
                    step = 400  # about 20 s of input: it flows through every kill
                    for i in range(0, len(records), step):
                        j2.push(records[i:i + step])
                        time.sleep(0.2)
                stop.set()

            feeder = threading.Thread(target=feed)
            feeder.start()
            kills = []
            for k in range(KILLS):
                time.sleep(rng.uniform(0.3, 1.2))
                before = job.stats()["checkpoints"]["recoveries"]
                alive = [w["id"] for w in client.workers() if w["alive"]]
                victim = rng.choice(alive)
                if k == 1:  # during a migration: it starts before the planner knows the victim is dead
                    n = rng.choice([n for n in (2, 3, 4) if n != job.stats()["workers_active"]] or [3])
                    _kill(client, victim)
                    _try(lambda n=n: client.scale(n))
                    kills.append((victim, "migration"))
                elif k == 2:  # during a checkpoint
                    wait_for(lambda: job.stats()["checkpoints"]["pending"] is not None, timeout=20, interval=0.005,
                             what="a pending checkpoint")
                    _kill(client, victim)
                    kills.append((victim, "checkpoint"))
                elif k == 3:  # two workers at once
                    other = rng.choice([w for w in alive if w != victim])
                    _kill(client, victim)
                    _kill(client, other)
                    kills.append((f"{victim}+{other}", "two at once"))
                else:
                    _kill(client, victim)
                    kills.append((victim, "random"))
                wait_for(lambda b=before: job.stats()["checkpoints"]["recoveries"] > b, timeout=30,
                         what=f"recovery from kill {k} of {victim}")
                wait_for(lambda: len(job.stats()["checkpoints"]["serving"]) == 4, timeout=30,
                         what="the killed worker back, serving the job")
            feeder.join()
            summary = job.wait_idle(timeout=120)
            src, inner, counts = reference(records)
            stats = job.stats()
            assert summary["completed"] == len(records) and summary["lost"] == 0, summary
            assert stats["checkpoints"]["recoveries"] >= KILLS, stats["checkpoints"]
            assert job.state("count") == counts, f"seed {seed}, kills {kills}: counts differ"
            got_src, got_inner = job.state("source_order"), job.state("inner_order")
            bad_src = sorted(k for k in src if got_src.get(k) != src[k])
            bad_inner = sorted(k for k in inner if got_inner.get(k) != inner[k])
            assert not bad_src and not bad_inner, f"seed {seed}, kills {kills}: order broken {bad_src} {bad_inner}"
            collected = job.collected("inner_order")
            dup = [s for s, n in Counter(collected).items() if n > 1]
            assert not dup, f"seed {seed}: {len(dup)} outputs collected twice, e.g. {dup[:5]}"
            assert sorted(collected) == list(range(len(records))), f"seed {seed}: outputs missing"
    finally:
        cluster.stop()


def _try(fn):
    try:
        fn()
    except Exception:  # the migration fails with the worker it was moving state to or from: expected
        pass


def test_state_dir_that_cannot_be_written_exits_2_and_starts_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for argv in (["planner", "--port", "0", "--state-dir", str(blocker / "sub")],
                 ["cluster", "--workers", "1", "--port", "0", "--state-dir", str(blocker / "sub")]):
        p = subprocess.run([sys.executable, "-m", "clasp", *argv], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (argv, p.stderr)
        assert "state directory" in p.stderr and "cannot be used" in p.stderr, p.stderr
        assert "clasp planner " not in p.stdout


def test_cluster_info_names_every_pid(tmp_path):
    info = tmp_path / "info.json"
    p = subprocess.Popen([sys.executable, "-m", "clasp", "cluster", "--workers", "2", "--port", "0", "--info",
                          str(info), "--log-dir", str(tmp_path / "logs")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(info.exists, timeout=60, what="the info file")
        data = json.loads(info.read_text())
        pids = data["pids"]
        assert pids["planner"] > 0 and len(pids["workers"]) == 2
        for pid in [pids["planner"], *pids["workers"]]:
            os.kill(pid, 0)  # each is a live process
        assert Path(data["state_dir"]).is_dir()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(addr: str):
    try:
        return clasp.connect(addr, timeout=30)
    except clasp.PlannerUnavailable:
        return None


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clasp", *argv], stdout=open(log, "a"), stderr=subprocess.STDOUT)


def restart_planner(procs: list, argv: list[str], log: Path, addr: str, job_id: int):
    """SIGKILL the planner (`procs[0]`), start it again with `argv` (the same state directory) and wait until it
    took job `job_id` up again; returns a client (to close) and the job's handle."""
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait(timeout=10)
    procs[0] = _start(argv, log)
    client = wait_for(lambda: _connect(addr), timeout=60, interval=0.5, what="the restarted planner")
    job = client.job(job_id)
    wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=60, what="the job resumed")
    return client, job


def _planner_and_workers(tmp_path: Path, workers: int, *planner_args: str) -> tuple[list, list[str], str]:
    """A planner (`procs[0]`, started with `argv`, to restart) on a state directory in `tmp_path`, and `workers`
    workers: (procs, argv, address)."""
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    argv = ["planner", "--port", str(port), "--state-dir", str(tmp_path / "state"), "--no-autoscale", *planner_args]
    procs = [_start(argv, tmp_path / "planner.log")]
    procs += [_start(["worker", "--planner", addr, "--id", f"w{i}"], tmp_path / f"w{i}.log") for i in range(workers)]
    return procs, argv, addr


def _connect_to_workers(addr: str, workers: int):
    client = wait_for(lambda: _connect(addr), timeout=60, interval=0.5, what="the planner")
    wait_for(lambda: len([w for w in client.workers() if w["alive"]]) == workers, timeout=60,
             what=f"{workers} workers")
    return client


def test_planner_sigkilled_and_restarted_resumes_the_job_exactly(tmp_path):
    procs, planner, addr = _planner_and_workers(tmp_path, 3, "--checkpoint-interval", "0.5")
    rng = random.Random(7)
    records = generate(30_000, rng)
    try:
        with _connect_to_workers(addr, 3) as client:
            job = client.submit(build_dag(), autoscale=False)
            job.scale(3)
            job_id = job.id
            half = len(records) // 2
            job.push(records[:half])
            job.wait_idle(timeout=60)
            wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=60, what="a checkpoint")
            job.push(records[half:half + 5000])  # accepted, then the planner dies before it is all done
        client, job = restart_planner(procs, planner, tmp_path / "planner.log", addr, job_id)
        with client:
            job.push(records[half + 5000:])
            summary = job.wait_idle(timeout=120)
            assert summary["completed"] == len(records) and summary["lost"] == 0, summary
            src, inner, counts = reference(records)
            assert job.state("count") == counts
            assert job.state("source_order") == src and job.state("inner_order") == inner
            collected = job.collected("inner_order")
            assert sorted(collected) == list(range(len(records))), "every collected output exactly once"
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_collected_outputs_past_the_memory_bound_are_answered_from_their_files(tmp_path):
    """With `--collected-memory 1` the planner keeps only the newest checkpoint's released outputs in memory:
    `collected()` reads the older ones from their files, exactly once each, through a worker's SIGKILL (its
    rollback drops the files it rolls back over) and the planner's own SIGKILL and restart."""
    procs, planner, addr = _planner_and_workers(tmp_path, 2, "--checkpoint-interval", "0.3", "--collected-memory", "1")
    records = generate(16_000, random.Random(5))
    parts = [records[i:i + 4000] for i in range(0, len(records), 4000)]
    try:
        with _connect_to_workers(addr, 2) as client:
            job = client.submit(build_dag(), autoscale=False)
            job.scale(2)
            job_id = job.id
            for i, part in enumerate(parts[:3]):
                job.push(part)
                job.wait_idle(timeout=60)
                wait_for(lambda i=i: job.stats()["checkpoints"]["completed"] >= i + 1, timeout=30,
                         what="a checkpoint after the part")
            ck = job.stats()["checkpoints"]
            assert ck["collected_checkpoints_on_disk_only"] >= 1 and ck["collected_in_memory_bytes"] > 0, ck
            done = sum(len(p) for p in parts[:3])
            assert sorted(job.collected("inner_order")) == list(range(done))
            os.kill(_pid(client, "w1"), signal.SIGKILL)
            wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=60, what="the rollback")
            job.push(parts[3])
            summary = job.wait_idle(timeout=90)
            assert summary["completed"] == len(records) and summary["lost"] == 0, summary
            assert sorted(job.collected("inner_order")) == list(range(len(records)))
            wait_for(lambda: job.stats()["checkpoints"]["last_id"] > ck["last_id"], timeout=30,
                     what="a checkpoint after the recovery")
        client, job = restart_planner(procs, planner, tmp_path / "planner.log", addr, job_id)
        with client:
            job.wait_idle(timeout=90)
            assert job.stats()["checkpoints"]["collected_checkpoints_on_disk_only"] >= 1
            assert sorted(job.collected("inner_order")) == list(range(len(records)))
            src, inner, counts = reference(records)
            assert job.state("count") == counts and job.state("inner_order") == inner
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_a_corrupt_checkpoint_file_falls_back_to_the_one_before(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"],
                            restart_workers=False)
    records = generate(12_000, random.Random(3))
    parts = [records[:4000], records[4000:8000], records[8000:]]
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(build_dag(), autoscale=False)
            job.scale(3)
            for i, part in enumerate(parts[:2]):
                job.push(part)
                job.wait_idle(timeout=60)
                wait_for(lambda i=i: job.stats()["checkpoints"]["completed"] >= i + 1, timeout=30, what="checkpoint")
            newest = job.stats()["checkpoints"]["last_id"]
            stages = job.stats()["checkpoints"]["stages_ms"]  # each stage's mean time per checkpoint
            assert set(stages) == {"boundary", "barrier", "align", "snapshot", "commit", "pack_s", "write_s",
                                   "prepare_s", "cow_s"} and min(stages.values()) >= 0, stages
            ckdir = cluster.state_dir / f"job-{job.id}" / f"ckpt-{newest}"
            victim_file = ckdir / "w0.snapshot"  # a survivor's: read by whoever restores its groups
            victim_file.write_bytes(victim_file.read_bytes()[:10])  # truncated
            job.push(parts[2])
            w = next(w for w in client.workers() if w["id"] == "w1")
            os.kill(w["pid"], signal.SIGKILL)
            summary = job.wait_idle(timeout=90)
            stats = job.stats()
            assert summary["completed"] == len(records) and summary["lost"] == 0
            assert stats["checkpoints"]["last_recovery"]["checkpoint"] < newest, stats["checkpoints"]
            assert any(str(victim_file) in e["error"] for e in stats["errors"]), stats["errors"]
            src, inner, counts = reference(records)
            assert job.state("count") == counts
            assert job.state("inner_order") == inner
            assert sorted(job.collected("inner_order")) == list(range(len(records)))
    finally:
        cluster.stop()


def test_groups_a_killed_worker_wrote_are_restored_by_the_others_exactly(tmp_path_factory):
    """Each worker writes its part of a checkpoint as one file; after a SIGKILL the survivors load the dead
    worker's key groups from its file (by the file's index) and nothing is replayed: every count of the
    records below the checkpoint that the dead worker held can only have come from that file."""
    cluster = start_cluster(tmp_path_factory, 3, planner_args=["--no-autoscale", "--checkpoint-interval", "0.3"],
                            restart_workers=False)
    records = generate(12_000, random.Random(11))
    before, after = records[:8000], records[8000:]
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(build_dag(), autoscale=False)
            job.scale(3)
            job.push(before)
            job.wait_idle(timeout=60)
            jobdir = cluster.state_dir / f"job-{job.id}"

            def newest() -> dict:
                metas = [json.loads(m.read_text()) for m in jobdir.glob("ckpt-*/COMPLETE.json")]
                return max(metas, key=lambda m: m["ckpt"], default={"records_below": -1})

            wait_for(lambda: newest()["records_below"] == len(before), timeout=30, what="a checkpoint of it all")
            meta = newest()
            ckdir = jobdir / f"ckpt-{meta['ckpt']}"
            files = sorted(p.name for p in ckdir.iterdir())
            assert files == ["COMPLETE.json", "w0.snapshot", "w1.snapshot", "w2.snapshot"], files
            written = {w: [(op, g, s) for op, g, s in read_snapshot(ckdir / f"{w}.snapshot") if op == "count"]
                       for w in ("w0", "w1", "w2")}
            _, _, counts_before = reference(before)
            on_disk: Counter = Counter()
            for parts in written.values():
                for _, _, state in parts:
                    on_disk.update(state)
            assert on_disk == Counter(counts_before), "the files hold exactly the counts of the cut"
            assert written["w1"], "the victim wrote key groups of the count"
            os.kill(_pid(client, "w1"), signal.SIGKILL)
            wait_for(lambda: job.stats()["checkpoints"]["recoveries"] >= 1, timeout=60, what="the rollback")
            job.push(after)
            summary = job.wait_idle(timeout=90)
            assert summary["completed"] == len(records) and summary["lost"] == 0, summary
            rec = job.stats()["checkpoints"]["last_recovery"]
            assert rec["checkpoint"] == meta["ckpt"] and rec["replayed"] == 0, rec
            src, inner, counts = reference(records)
            assert job.state("count") == counts
            assert job.state("source_order") == src and job.state("inner_order") == inner
            assert sorted(job.collected("inner_order")) == list(range(len(records)))
    finally:
        cluster.stop()
