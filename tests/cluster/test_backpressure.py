"""Bounded planner memory: a small --max-queued-bytes holds, push() blocks and resumes, nothing is lost.

Real processes: a planner with a 256 KiB bound per job and one worker slowed to a few thousand records
a second; 2 KiB records from an endless generator (stopped from outside) and from a list, each many
times the bound. The queue the planner reports never exceeds the bound plus one push, its resident
memory hardly moves, and the job's state counts every record the generator yielded, exactly.
"""

from __future__ import annotations

import collections
import threading
import time

import pytest

import clasp
from clasp.core.credit import CHUNK_BYTES, CHUNK_RECORDS
from tests.conftest import start_cluster

BOUND = 256 << 10
RECORD = 2048
GROUPS = 64


def slow(rec):
    time.sleep(0.0002)  # ~5,000 records/s: the cluster is the bottleneck, the planner's queue fills
    return rec


def tally(state, rec):
    return (state or 0) + 1, None


def group(rec):
    return int(rec.split(":", 1)[0]) % GROUPS


def dag() -> clasp.Dag:
    d = clasp.Dag("backpressure")
    s = d.operator("slow", slow)
    c = d.operator("tally", tally, stateful=True, key=group)
    s >> c
    return d


def record(i: int) -> str:
    head = f"{i}:"
    return head + "x" * (RECORD - len(head))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 1, planner_args=["--no-autoscale", "--max-queued-bytes", str(BOUND),
                                                         "--max-inflight", "200"])
    yield c
    c.stop()


def watch(job_id: int, address: str, stop: threading.Event, seen: dict) -> None:
    with clasp.connect(address) as c:
        job = c.job(job_id)
        while not stop.is_set():
            s = job.stats()
            seen["max_bytes"] = max(seen.get("max_bytes", 0), s["queued_bytes"])
            seen["max_records"] = max(seen.get("max_records", 0), s["queued"])
            seen["samples"] = seen.get("samples", 0) + 1
            seen["bound"] = s["queue_bound"]
            time.sleep(0.02)


def endless(start: int, yielded: collections.Counter, *, limit: int | None = None,
            halt: threading.Event | None = None):
    """Records until `limit` have been yielded or `halt` is set: a generator with no length, so push() cannot
    know where it ends."""
    i = start
    while (limit is None or i - start < limit) and not (halt is not None and halt.is_set()):
        yielded[i % GROUPS] += 1
        yield record(i)
        i += 1


def watched(job_id: int, address: str) -> tuple[threading.Event, dict, threading.Thread]:
    """A thread sampling the job's queue into `seen` until the event is set."""
    stop, seen = threading.Event(), {}
    t = threading.Thread(target=watch, args=(job_id, address, stop, seen), daemon=True)
    t.start()
    return stop, seen, t


def run_push(cl, records, limit: int | None = None):
    planner_pid = cl.procs[0].pid
    rss0 = rss_kb(planner_pid)
    with clasp.connect(cl.planner) as client:
        job = client.submit(dag(), autoscale=False)
        stop, seen, t = watched(job.id, cl.planner)
        yielded = collections.Counter()
        if limit is not None:
            source = endless(0, yielded, limit=limit)
        else:
            source = records
            for i in range(len(records)):
                yielded[i % GROUPS] += 1
        t0 = time.monotonic()
        n = job.push(source)
        took = time.monotonic() - t0
        at_return = job.stats()
        job.wait_idle(timeout=120)
        stop.set()
        t.join()
        rss1 = rss_kb(planner_pid)
        state = job.state("tally")
        job.cancel()
    return {"n": n, "yielded": yielded, "state": state, "seen": seen, "took": took, "at_return": at_return,
            "rss_growth_kb": rss1 - rss0}


def check(r):
    one_push = 2 * max(1, BOUND // 8) + CHUNK_RECORDS  # a push may reach twice its byte target before it halves
    assert r["seen"]["samples"] > 5
    assert r["seen"]["bound"]["bytes"] == BOUND
    assert r["seen"]["max_bytes"] <= BOUND + one_push, r["seen"]
    assert r["seen"]["max_bytes"] > BOUND // 2, r["seen"]  # it really filled: push() was held back
    assert r["at_return"]["queued_bytes"] <= BOUND + one_push
    assert {int(k): v for k, v in r["state"].items()} == dict(r["yielded"])  # every record, exactly once
    assert sum(r["yielded"].values()) == r["n"]
    assert r["rss_growth_kb"] < 64 << 10, r["rss_growth_kb"]  # far below the 8+ MB pushed


def test_endless_generator_is_held_at_the_bound(bounded):
    # A count, not a time: on a loaded host 2 s of a slowed worker once let less than 8 bounds through.
    r = run_push(bounded, None, limit=16 * BOUND // RECORD)
    assert r["n"] == 16 * BOUND // RECORD  # many times the bound went through
    check(r)


def test_a_list_many_times_the_bound_blocks_until_it_drains(bounded):
    n = 6000  # 12 MB of records, ~48 x the bound
    r = run_push(bounded, [record(i) for i in range(n)])
    assert r["n"] == n
    assert r["took"] > 0.5  # held back: the worker runs ~5,000 records/s
    check(r)


def test_clients_pushing_to_one_job_share_its_credit(bounded):
    """Two clients pushing to one job together stay within the bound plus one push each (each has credit
    for half of what is free), and both generators' records are counted exactly once."""
    with clasp.connect(bounded.planner) as first:
        job = first.submit(dag(), autoscale=False)
        stop, seen, watcher = watched(job.id, bounded.planner)
        yielded = [collections.Counter(), collections.Counter()]
        pushed = [0, 0]
        each = 8 * BOUND // RECORD  # a count, not a time, so that a loaded host cannot push less

        def second():
            with clasp.connect(bounded.planner) as c:
                pushed[1] = c.job(job.id).push(endless(1 << 30, yielded[1], limit=each))

        t = threading.Thread(target=second)
        t.start()
        pushed[0] = job.push(endless(0, yielded[0], limit=each))
        t.join()
        job.wait_idle(timeout=120)
        stop.set()
        watcher.join()
        state = job.state("tally")
        job.cancel()
    one_push = 2 * (BOUND // 8)  # records of 2 KiB: a push is at most twice its byte target
    assert pushed == [each, each]  # both really pushed, many times the bound
    assert seen["max_bytes"] <= BOUND + 2 * one_push, seen  # without sharing, each could fill what is free
    assert {int(k): v for k, v in state.items()} == dict(yielded[0] + yielded[1])
    assert sum(pushed) == sum((yielded[0] + yielded[1]).values())


DELAY = 3.0  # s: the time bound of the planner below
BIG = 256 << 20  # its bound in bytes: far above what the time bound lets in


def quick(rec):
    time.sleep(0.00005)  # ~10-20k records/s of 2 KiB: a drain rate of tens of MB/s
    return rec


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    c = start_cluster(tmp_path_factory, 1, planner_args=["--no-autoscale", "--max-queued-bytes", str(BIG),
                                                         "--max-queue-delay", str(DELAY)])
    yield c
    c.stop()


def test_the_queue_holds_what_drains_in_max_queue_delay(timed):
    """With a bound in bytes far above what the cluster drains in a second, the time bound holds the queue
    to about DELAY seconds of draining (at least 8 pushes), so admitted records wait about that long."""
    d = clasp.Dag("timed")
    d.operator("quick", quick) >> d.operator("tally", tally, stateful=True, key=group)
    with clasp.connect(timed.planner) as c:
        job = c.submit(d, autoscale=False)
        stop, seen = threading.Event(), {}
        limits = []

        def watch_limit():
            with clasp.connect(timed.planner) as w:
                j = w.job(job.id)
                while not stop.is_set():
                    s = j.stats()
                    seen["max_bytes"] = max(seen.get("max_bytes", 0), s["queued_bytes"])
                    limits.append((s["queue_bound"]["limit"], s["queue_bound"]["drain_bytes_per_s"]))
                    time.sleep(0.02)

        watcher = threading.Thread(target=watch_limit, daemon=True)
        watcher.start()
        halt, yielded = threading.Event(), collections.Counter()
        threading.Timer(6.0, halt.set).start()
        n = job.push(endless(0, yielded, halt=halt))
        job.wait_idle(timeout=120)
        stop.set()
        watcher.join()
        stats = job.stats(fresh=True)
        state = job.state("tally")
        job.cancel()
    rates = [r for _, r in limits if r]
    assert rates, "the drain rate was never measured"
    floor = 8 * CHUNK_BYTES  # 8 whole pushes
    for lim, rate in limits:  # the limit each stats() reported is the one its drain rate gives
        assert lim == (min(BIG, max(floor, int(rate * DELAY))) if rate else floor), (lim, rate)
    top_limit = max(lim for lim, _ in limits)
    assert top_limit < BIG // 4  # the time bound, not the byte bound, held the queue
    assert seen["max_bytes"] <= top_limit + 2 * CHUNK_BYTES + CHUNK_RECORDS, (seen, top_limit)
    assert n * RECORD > 2 * top_limit  # far more than the limit went through
    assert stats["latency"]["p99"] < 4 * DELAY + 2.0, stats["latency"]
    assert {int(k): v for k, v in state.items()} == dict(yielded)
