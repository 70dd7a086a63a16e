"""Processing-time timers on a real cluster (`timers.at_processing`, docs/TIME.md): a key's first record asks to be
called back DELAY seconds of the worker's clock later; the callback emits the key's count and clears it. No event
time anywhere: only the clock fires them. The timers live in the keys' state, so the counts the callbacks emit add
up to exactly the records pushed per key on one worker, after a worker's SIGKILL (restored from a checkpoint) and
across a rescale 1 -> 2 with timers pending (migrated with their key groups)."""

from __future__ import annotations

import random
import time
from collections import Counter

import zmq

import clasp
from clasp.core import protocol
from clasp.runtime.security import Security
from tests.conftest import WorkerSigkill, start_cluster, wait_for

DELAY = 0.4  # seconds of processing time from a key's first record to its callback


def flushing(name: str, delay: float = DELAY) -> clasp.Dag:
    def count(state, value, timers):
        if state is None:
            timers.at_processing(timers.now + delay, [timers.now, delay])
        return (state or 0) + 1, []

    def flush(state, t, payload, timers):
        return None, [[timers.key, state, payload, t, timers.now]]

    dag = clasp.Dag(name)
    src = dag.operator("records", lambda v: [v])
    src >> dag.timers("flush", count, flush, key=lambda v: v[0], collect=True)
    return dag


def records(n: int, seed: int, keys: int = 50) -> list[list]:
    rng = random.Random(seed)
    return [[f"k{rng.randrange(keys)}", i] for i in range(n)]


def flushed(job) -> Counter:
    got = Counter()
    for key, n, (set_at, delay), t, now in job.collected("flush"):
        assert t == set_at + delay and now >= t, "a timer fired before its time"
        got[key] += n
    return got


def settled(job, recs: list) -> Counter:
    want = Counter(k for k, _ in recs)
    wait_for(lambda: sum(flushed(job).values()) >= len(recs), timeout=60, what="every timer")
    time.sleep(1.0)  # nothing more comes
    return want


def test_processing_time_timers_fire_on_the_clock_without_any_watermark(cluster1):
    recs = records(3000, 1)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(flushing("ptime"), autoscale=False)
        t0 = time.time()
        job.push(recs)
        job.wait_idle(timeout=30)
        want = settled(job, recs)
        assert flushed(job) == want
        first = min(p[0] for _, _, p, _, _ in job.collected("flush"))
        assert first >= t0 - 1.0  # the clock is the workers' time.time()
        assert job.stats()["event_time"]["watermark"] is None
        job.cancel()


def test_a_failing_callback_is_the_operators_error_and_the_other_keys_still_fire(cluster1):
    def count(state, value, timers):
        if state is None:
            timers.at_processing(timers.now + 0.2, None)
        return (state or 0) + 1, []

    def flush(state, t, payload, timers):
        if timers.key == "bad":
            raise ValueError("this key's callback fails")
        return None, [[timers.key, state]]

    dag = clasp.Dag("ptime-failing")
    dag.operator("records", lambda v: [v]) >> dag.timers("flush", count, flush, key=lambda v: v[0], collect=True)
    recs = [["bad", i] for i in range(10)] + [[f"k{i % 5}", i] for i in range(100)]
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        job.push(recs)
        wait_for(lambda: len(job.collected("flush")) == 5, timeout=30, what="the other keys' callbacks")
        assert sorted(job.collected("flush")) == [[f"k{i}", 20] for i in range(5)]
        errors = wait_for(lambda: job.stats(fresh=True)["errors"], timeout=30, what="the error")
        assert any("on_timer of key 'bad'" in e["error"] and "fails" in e["error"] for e in errors)
        assert job.state("flush.windows") == {"bad": [10, []]}  # its count kept, its timer spent
        job.cancel()


def test_processing_time_timers_exact_after_a_worker_sigkill(tmp_path_factory):
    recs = records(12000, 2)
    with WorkerSigkill(tmp_path_factory) as run:
        job = run.client.submit(flushing("ptime-kill"), autoscale=False)
        for i in range(0, 6000, 500):
            job.push(recs[i:i + 500])
            time.sleep(0.1)
        run.started(job, lambda: job.collected("flush"))
        run.kill()
        for i in range(6000, len(recs), 500):
            job.push(recs[i:i + 500])
            time.sleep(0.05)
        run.recovered(job)
        assert job.wait_idle(timeout=120)["lost"] == 0
        want = settled(job, recs)
        assert flushed(job) == want


def test_processing_time_timers_move_with_their_key_groups_in_a_rescale(tmp_path_factory):
    recs = records(12000, 3)
    cluster = start_cluster(tmp_path_factory, 2, planner_args=["--no-autoscale", "--heartbeat", "0.2"])
    one = {"records": {0: 1.0}, "flush.windows": {0: 1.0}, "flush": {0: 1.0}, "flush.late": {0: 1.0}}
    try:
        with clasp.connect(cluster.planner) as client:
            job = client.submit(flushing("ptime-rescale", delay=4.0), placement=one)
            job.push(recs[:6000])
            job.wait_idle(timeout=30)
            assert not job.scale(2)["failed"]
            assert job.collected("flush") == [], "a timer fired before the rescale"  # every one of them moves
            moved = len(job.state("flush.windows"))
            job.push(recs[6000:])
            job.wait_idle(timeout=60)
            want = settled(job, recs)
            assert flushed(job) == want
            assert moved == 50 and job.state("flush.windows") == {}, "a key kept its count: its timer never fired"
    finally:
        cluster.stop()


def _put_state(cluster, job_id: int, op: str, key, value) -> None:
    """`state_put` to every worker's state server (the one holding the key stores it; a cluster of one here)."""
    ctx = zmq.Context()
    try:
        with clasp.connect(cluster.planner) as client:
            for w in client.workers():
                sock = Security(cluster.keys_dir).client(ctx.socket(zmq.DEALER))
                sock.connect(w["state"])
                sock.send(protocol.encode("state_put", {"req": 1, "job": job_id, "op": op, "key": key,
                                                        "value": value}))
                assert sock.poll(5000), "no answer to state_put"
                assert protocol.decode(sock.recv())[1]["ok"]
                sock.close(0)
    finally:
        ctx.term()


def test_timers_in_state_written_by_state_put_are_indexed(cluster1):
    """A keyed time operator's state written from outside (`state_put`) carries the key's timers: they fire as
    if a record had set them. A new key's event-time timer fires at the watermark, and a key whose processing-time
    timer was moved a minute earlier fires at its new time, not at the old one."""
    def count(state, value, timers):
        if state is None:
            timers.at_processing(timers.now + 60.0, [timers.now, 60.0])
        return (state or 0) + 1, []

    def flush(state, t, payload, timers):
        return None, [[timers.key, state, payload, t]]

    dag = clasp.Dag("ptime-put")
    src = dag.push_source("events", timestamp=lambda e: e[1])
    src >> dag.timers("flush", count, flush, key=lambda v: v[0], collect=True)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        job.push([["old", 0.0], ["old", 1.0]])
        wait_for(lambda: job.state("flush.windows").get("old", [0])[0] == 2, timeout=30, what="the pushed key")
        now = time.time()
        _put_state(cluster1, job.id, "flush.windows", "old", [2, [[now + 0.3, "processing", [now, 0.3]]]])
        _put_state(cluster1, job.id, "flush.windows", "new", [5, [[5.0, "event", "at 5"]]])
        job.push([["later", 20.0]])  # the watermark passes 5
        got = wait_for(lambda: len(job.collected("flush")) >= 2 and job.collected("flush"), timeout=15,
                       what="both written timers")
        assert sorted(got) == [["new", 5, "at 5", 5.0], ["old", 2, [now, 0.3], now + 0.3]]
        assert time.time() < now + 30, "the moved timer fired at its old time"
        assert set(job.state("flush.windows")) == {"later"}
        job.cancel()


def test_wait_idle_waits_for_the_timers_due_when_it_was_called_and_no_later_ones(cluster1):
    """Each record asks for a timer at the time it carries. `wait_idle` called just after a batch's timers came
    due returns with their callbacks' outputs collected, every time; timers due a minute later do not hold it,
    and neither does a timer its callback re-arms forever."""
    def arm(state, value, timers):
        timers.at_processing(value[1], value[2])
        return (state or 0) + 1, []

    def call(state, t, payload, timers):
        if payload == "again":
            timers.at_processing(timers.now + 0.1, "again")
            return state, []
        return None, [[timers.key, state, t]]

    dag = clasp.Dag("ptime-wait")
    dag.operator("records", lambda v: [v]) >> dag.timers("call", arm, call, key=lambda v: v[0], collect=True)
    with clasp.connect(cluster1.planner) as client:
        job = client.submit(dag, autoscale=False)
        job.push([["forever", time.time() + 0.1, "again"], *[[f"late{i}", time.time() + 60, None] for i in range(5)]])
        want = []
        for rnd in range(4):
            due = time.time() + 0.5
            batch = [[f"r{rnd}k{i}", due, None] for i in range(40)]
            job.push(batch)
            time.sleep(max(0.0, due - time.time()) + 0.001)
            t0 = time.monotonic()
            job.wait_idle(timeout=30)
            assert time.monotonic() - t0 < 10, "a timer due later held wait_idle"
            want += [[k, 1, due] for k, _, _ in batch]
            assert sorted(job.collected("call")) == sorted(want), f"round {rnd}: wait_idle returned before its timers"
        assert set(job.state("call.windows")) == {"forever", *(f"late{i}" for i in range(5))}
        job.cancel()
