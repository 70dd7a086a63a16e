"""Redis Streams in and out (clasp.connectors.redis) against Debian's redis-server, started here on a free port.

The source is read directly (a partition opened at a position, batches, resumed at the position: exact);
the sink end to end: Word Count's running counts into a stream on 4 workers with a worker SIGKILLed
mid-run, each word's counts exactly 1..n once each in the stream; and Redis Streams in and out, the lines
read by the workers from several streams (CLASP_STRESS_SEEDS=N runs N seeds).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

pytest.importorskip("redis", reason="needs redis-py: pip install 'clasp[redis]'")
if shutil.which("redis-server") is None:
    pytest.skip("needs Debian's redis-server (apt-get install redis-server)", allow_module_level=True)

import msgpack  # noqa: E402
import redis  # noqa: E402

from clasp.connectors.redis import RedisStreamSink, RedisStreamSource, as_fields  # noqa: E402
from tests.cluster.test_sinks import check_exact, lines, run_with_kill, unequal_parts  # noqa: E402
from tests.conftest import start_cluster, wait_for  # noqa: E402

SEEDS = int(os.environ.get("CLASP_STRESS_SEEDS", "1"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    port = _free_port()
    d = tmp_path_factory.mktemp("redis")
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        r = redis.Redis.from_url(url)

        def up():
            try:
                return r.ping()
            except redis.ConnectionError:
                return False

        wait_for(up, timeout=20, what="redis-server")
        yield url
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_source_reads_batches_and_resumes_at_its_position_exactly(redis_url):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for i in range(100):
        r.xadd("in-a", {"i": str(i), "s": "a"})
        if i % 2 == 0:
            r.xadd("in-b", {"i": str(i), "s": "b"})
    src = RedisStreamSource(redis_url, ["in-a", "in-b"], until_end=True)
    assert src.partitions() == ["in-a", "in-b"] and src.bounded

    async def read(partition, position, batches=None):
        reader = src.open(partition, position)
        got = []
        try:
            n = 0
            while not reader.exhausted and (batches is None or n < batches):
                got.extend(await reader.next_batch(30))
                n += 1
            return got, reader.position(), reader.exhausted
        finally:
            await reader.close()

    first, pos, done = asyncio.run(read("in-a", None, batches=2))
    assert [v["i"] for v in first] == [str(i) for i in range(60)] and not done
    rest, end, done = asyncio.run(read("in-a", pos))
    assert [v["i"] for v in rest] == [str(i) for i in range(60, 100)] and done
    assert all(v == {"i": v["i"], "s": "a"} for v in first + rest)
    assert asyncio.run(read("in-a", end))[0] == []  # resumed at the end: nothing twice
    b, _, _ = asyncio.run(read("in-b", None))
    assert [v["i"] for v in b] == [str(i) for i in range(0, 100, 2)]
    # unbounded: a reader at the end returns [] now and the new entries later
    unb = RedisStreamSource(redis_url, "in-b")

    async def tail():
        reader = unb.open("in-b", end_b)
        try:
            assert await reader.next_batch(10) == [] and not reader.exhausted
            r.xadd("in-b", {"i": "new"})
            return await reader.next_batch(10)
        finally:
            await reader.close()

    end_b = r.xrevrange("in-b", count=1)[0][0]
    assert asyncio.run(tail()) == [{"i": "new"}]


def test_sink_commit_is_idempotent_and_abort_drops_what_was_not_committed(redis_url):
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    sink = RedisStreamSink(redis_url, "out-unit")

    async def go():
        p = sink.open("out.w0.run1")
        await p.write_batch([{"a": 1}, "x"])
        prep = await p.prepare(1)
        await p.write_batch([[1, 2]])
        prep2 = await p.prepare(2)
        await p.write_batch([{"never": "seen"}])  # not prepared: aborted
        await p.commit(1, prep)
        await p.commit(1, prep)  # again (a recovery re-drives it): nothing twice
        # a second writer of the same partition (another worker) commits checkpoint 2, then the first aborts
        q = sink.open("out.w0.run1")
        await q.commit(2, prep2)
        await q.commit(2, prep2)
        await p.abort()
        await p.close()
        await q.close()

    asyncio.run(go())
    entries = [f for _, f in r.xrange("out-unit")]
    assert entries == [{"a": "1"}, {"value": "x"}, {"value": json.dumps([1, 2])}]
    assert not list(r.scan_iter(match="clasp:{out-unit}:stage:*"))


def test_a_commit_costs_the_worker_one_round_trip_whatever_the_checkpoint_holds(redis_url):
    """A recovery waits for the commits its worker owes: a commit that read the staged entries back and sent
    one XADD each took 1.1 s for 40,000 entries here (5 s on a loaded host, a restore owing two of them
    outlasting the planner's wait). The server adds them now: the entries never come back to the worker."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    sink = RedisStreamSink(redis_url, "out-big")
    values = [{"word": f"w{i % 300}", "n": i, "raw": b"\x00\xff"} if i % 3 else [f"w{i}", i] for i in range(40_000)]
    legacy = "clasp:{out-big}:stage:out.w1.run1:ckpt-1"  # a row as staged before: a msgpack map, bin values
    r.rpush(legacy, msgpack.packb({"old": "x", "b": b"\x01"}, use_bin_type=True))

    async def go():
        p = sink.open("out.w0.run1")
        for i in range(0, len(values), 2000):
            await p.write_batch(values[i:i + 2000])
        prep = await p.prepare(1)
        sent = r.info("stats")["total_net_output_bytes"]
        await p.commit(1, prep)
        sent = r.info("stats")["total_net_output_bytes"] - sent  # the server's replies, the first INFO's too
        await p.commit(1, prep)  # again: nothing twice
        q = sink.open("out.w1.run1")
        await q.commit(1, {"key": legacy})
        await p.close()
        await q.close()
        return sent

    sent = asyncio.run(go())
    got = [f for _, f in redis.Redis.from_url(redis_url).xrange("out-big")]
    want = [{k.encode(): f if isinstance(f, bytes) else f.encode() for k, f in as_fields(v).items()} for v in values]
    assert got[:-1] == want
    assert list(got[0]) == [b"value"] and list(got[1]) == [b"word", b"n", b"raw"]  # the fields in order
    assert got[-1] == {b"old": b"x", b"b": b"\x01"}
    assert r.get("clasp:{out-big}:committed:out.w0.run1") == "1" and not list(r.scan_iter("clasp:{out-big}:stage:*"))
    assert sent < 20_000, f"the commit of {len(values)} entries read {sent} bytes from Redis"


def test_redis_sink_exactly_once_through_a_worker_kill(redis_url, tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"])
    try:
        records = lines(12_000, seed=11)
        sink = RedisStreamSink(redis_url, "counts")
        t0 = time.monotonic()
        _job, stats = run_with_kill(cluster, sink, records, seed=2, name="redis-counts")
        assert stats["checkpoints"]["recoveries"] >= 1
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        pairs = [json.loads(f["value"]) for _, f in r.xrange("counts")]
        check_exact(pairs, records)
        assert not list(r.scan_iter(match="clasp:{counts}:stage:*")), "staged writes left behind"
        assert time.monotonic() - t0 < 120
    finally:
        cluster.stop()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_redis_streams_in_and_out_exactly_once_through_a_worker_kill(redis_url, tmp_path_factory, seed):
    """Several streams (the source's partitions) read by 4 workers -> split -> running count -> a stream,
    a worker SIGKILLed mid-run: each word's counts exactly 1..n once each in the sink's stream. Two streams
    are short: read to their end before the checkpoint the recovery goes back to, reopened there."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    records = lines(30_000, seed=17 + seed)
    streams = [f"lines-{seed}-{i}" for i in range(6)]
    pipe = r.pipeline(transaction=False)
    for stream, part in zip(streams, unequal_parts(records, len(streams)), strict=True):
        for line in part:
            pipe.xadd(stream, {"line": line})
    pipe.execute()
    # A small window per worker: checkpoints complete while most of the input is still to be read.
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"],
                            worker_args=["--source-window", "2048"])
    try:
        source = RedisStreamSource(redis_url, streams, until_end=True)
        sink = RedisStreamSink(redis_url, f"counts-in-out-{seed}")
        job, stats = run_with_kill(cluster, sink, records, seed=5 + seed, name=f"redis-in-out-{seed}", source=source)
        assert stats["checkpoints"]["recoveries"] >= 1
        check_exact([json.loads(f["value"]) for _, f in r.xrange(f"counts-in-out-{seed}")], records)
        assert not list(r.scan_iter(match=f"clasp:{{counts-in-out-{seed}}}:stage:*")), "staged writes left behind"
    finally:
        cluster.stop()
