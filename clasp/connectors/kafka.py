"""Kafka: `KafkaSource(bootstrap_servers, topic)` and `KafkaSink(bootstrap_servers, topic)` (aiokafka:
`pip install 'clasp[kafka]'`).

The source's partitions are the topic's (`TOPIC-N`), assigned by clasp, not by a consumer group: each
reader is a consumer with no group that is assigned its one partition and seeks to its position, the offset
of the next message to read, which clasp keeps in its checkpoints (nothing is committed to Kafka). Values
are the messages' bytes.

The sink is at least once. Where the broker supports transactions it writes each partition's values in a
Kafka transaction committed when the checkpoint is prepared: a reader with `isolation_level=
"read_committed"` never sees what a recovery rolled back, though a checkpoint that fails after it was
prepared is replayed and may repeat its values. Elsewhere (a broker without transactions) values are
produced as they come and flushed at each checkpoint; a recovery replays and may repeat them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clasp.core.connector import Sink, SinkPartition, Source, SourcePartition

try:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import KafkaError
except ImportError as e:  # the optional extra
    raise ImportError("clasp.connectors.kafka needs aiokafka: pip install 'clasp[kafka]'") from e

log = logging.getLogger("clasp.connectors.kafka")
POLL_MS = 50  # how long a reader waits for messages before it answers "none now"
END_MS = 500  # a bounded reader past the end offset it saw: one more wait, to be sure nothing is left


def _in_thread(coro_fn):
    """Run a coroutine to completion from synchronous code, inside an event loop or not."""
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro_fn()).result()


def split_partition(name: str) -> tuple[str, int]:
    topic, _, n = name.rpartition("-")
    return topic, int(n)


class KafkaReader(SourcePartition):
    def __init__(self, servers: str, topic: str, partition: int, position: int | None, until_end: bool,
                 options: dict):
        self.servers, self.tp = servers, TopicPartition(topic, partition)
        self.next = position  # the offset of the next message to read; None: the partition's beginning
        self.until_end = until_end
        self.options = options
        self.consumer: AIOKafkaConsumer | None = None
        self.end: int | None = None
        self._exhausted = False

    async def _start(self) -> None:
        c = AIOKafkaConsumer(bootstrap_servers=self.servers, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", **self.options)
        await c.start()
        c.assign([self.tp])
        if self.next is None:
            self.next = (await c.beginning_offsets([self.tp]))[self.tp]
        c.seek(self.tp, self.next)
        if self.until_end:
            self.end = (await c.end_offsets([self.tp]))[self.tp]
        self.consumer = c

    async def next_batch(self, limit: int) -> list:
        if self._exhausted:
            return []
        if self.consumer is None:
            await self._start()
        got = (await self.consumer.getmany(self.tp, timeout_ms=POLL_MS, max_records=limit)).get(self.tp, [])
        if not got and self.until_end and self.next >= self.end:
            # Past the end offset seen at the start, and nothing came: look once more before calling it the end
            # (a broker may report the end of a partition's last batch lower than its last message).
            got = (await self.consumer.getmany(self.tp, timeout_ms=END_MS, max_records=limit)).get(self.tp, [])
            self._exhausted = not got
        if got:
            self.next = got[-1].offset + 1
        return [m.value for m in got]

    def position(self) -> int | None:
        return self.next

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    async def close(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None


class KafkaSource(Source):
    """The messages of `topic`, one partition per Kafka partition (`TOPIC-N`), positions their offsets.
    Unbounded by default; `until_end=True` reads each partition up to its end when its reader started.
    `consumer_options` go to every `AIOKafkaConsumer` (security settings, `isolation_level`, ...)."""

    def __init__(self, bootstrap_servers: str, topic: str, *, until_end: bool = False,
                 consumer_options: dict | None = None):
        self.servers = bootstrap_servers
        self.topic = topic
        self.until_end = until_end
        self.options = dict(consumer_options or {})
        self._partitions: list[int] | None = None

    async def _fetch_partitions(self) -> list[int]:
        c = AIOKafkaConsumer(bootstrap_servers=self.servers, group_id=None, enable_auto_commit=False, **self.options)
        await c.start()
        try:
            await c.topics()  # a metadata request covering every topic
            parts = c.partitions_for_topic(self.topic)
        finally:
            await c.stop()
        if not parts:
            raise ValueError(f"Kafka topic {self.topic!r} does not exist at {self.servers} (or has no partitions)")
        return sorted(parts)

    def partitions(self) -> list[str]:
        if self._partitions is None:
            self._partitions = _in_thread(self._fetch_partitions)
        return [f"{self.topic}-{p}" for p in self._partitions]

    def open(self, partition: str, position: Any | None) -> SourcePartition:
        topic, n = split_partition(partition)
        if topic != self.topic:
            raise KeyError(f"KafkaSource of {self.topic!r} has no partition {partition!r}")
        return KafkaReader(self.servers, topic, n, position, self.until_end, self.options)

    @property
    def bounded(self) -> bool:
        return self.until_end

    def __repr__(self) -> str:
        return f"KafkaSource({self.servers!r}, {self.topic!r})"


def to_bytes(value) -> bytes:
    """A value as a message: bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


class KafkaWriter(SinkPartition):
    def __init__(self, sink: KafkaSink, partition: str):
        self.sink = sink
        self.partition = partition
        self.producer: AIOKafkaProducer | None = None
        self.transactional = False
        self.in_txn = False
        self.sent: list[tuple[Any, bytes, bytes | None]] = []  # (delivery future, value, key) since the last flush

    async def _start(self) -> None:
        s = self.sink
        if s.transactional is not False:
            p = AIOKafkaProducer(bootstrap_servers=s.servers, transactional_id=f"clasp-{self.partition}",
                                 **s.options)
            try:
                await p.start()
                self.producer, self.transactional = p, True
                return
            except KafkaError as e:
                await p.stop()
                if s.transactional:
                    raise
                log.info("Kafka at %s has no transactions (%s): sink %s is at least once without them",
                         s.servers, e, self.partition)
        p = AIOKafkaProducer(bootstrap_servers=s.servers, enable_idempotence=False, **s.options)
        await p.start()
        self.producer = p

    async def write_batch(self, values: list) -> None:
        if self.producer is None:
            await self._start()
        if self.transactional and not self.in_txn:
            await self.producer.begin_transaction()
            self.in_txn = True
        key = self.sink.key
        for v in values:
            data, k = to_bytes(v), (to_bytes(key(v)) if key is not None else None)
            self.sent.append((await self.producer.send(self.sink.topic, data, key=k), data, k))

    async def prepare(self, checkpoint: int) -> Any:
        if self.producer is None:
            return None
        await self.producer.flush()
        failed = []
        for fut, data, k in self.sent:
            try:
                await fut
            except KafkaError:
                failed.append((data, k))
        self.sent = []
        for data, k in failed:  # once more, waited for: a value fails the checkpoint rather than vanish
            await self.producer.send_and_wait(self.sink.topic, data, key=k)
        if self.in_txn:
            await self.producer.commit_transaction()
            self.in_txn = False
        return None

    async def commit(self, checkpoint: int, prepared: Any) -> None:
        return None  # visible since the checkpoint's prepare: at least once

    async def abort(self) -> None:
        self.sent = []
        if self.in_txn:
            await self.producer.abort_transaction()
            self.in_txn = False

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None


class KafkaSink(Sink):
    """Values produced to `topic` (`to_bytes`), at least once; in Kafka transactions where the broker has them
    (`transactional=None` finds out; True requires them, False never uses them). `key(value)` picks a
    message's key (and so its partition); `producer_options` go to every `AIOKafkaProducer`."""

    exactly_once = False

    def __init__(self, bootstrap_servers: str, topic: str, *, key: Callable | None = None,
                 transactional: bool | None = None, producer_options: dict | None = None):
        self.servers = bootstrap_servers
        self.topic = topic
        self.key = key
        self.transactional = transactional
        self.options = dict(producer_options or {})

    def open(self, partition: str) -> SinkPartition:
        return KafkaWriter(self, partition)

    def __repr__(self) -> str:
        return f"KafkaSink({self.servers!r}, {self.topic!r})"
