"""The interfaces a connector implements (exported as `clasp.connectors.Source`, `Sink`, ...): a partitioned
source read by the workers and a sink committed with the checkpoints (docs/CONNECTORS.md, "Writing a connector").

A source lists its partitions once, when a job is submitted; the planner places them on the workers with the
source operator's shares, as it places key groups, and moves them with their positions on rescale, drain and
recovery. A worker opens a reader per partition it owns, at the position it was given (None: the beginning), and
asks it for batches while its queues have room. The position a reader reports is where reading resumes: the
runtime keeps it in each checkpoint and on recovery reopens the partition there, so keyed state is exactly-once.

A sink partition receives batches between checkpoints, `prepare`s when a checkpoint is taken (what it returns is
kept in the checkpoint) and `commit`s when the checkpoint is complete (a checkpoint that failed after the prepare
is committed with the next one, in order); after a failure the runtime first re-drives `commit` for every complete
checkpoint whose commit it cannot be sure of, then `abort`s what is written or prepared and not committed, and
replays from the checkpoint (docs/CONNECTORS.md, "How a sink runs"). A sink whose commits are idempotent is
exactly-once; others are at-least-once (`Sink.exactly_once`). Every method may be called from the worker's event
loop: a blocking call belongs in `asyncio.to_thread`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class SourcePartition(ABC):
    """A reader of one partition, opened at a position."""

    @abstractmethod
    async def next_batch(self, limit: int) -> list:
        """Up to `limit` values in the partition's order; `[]` when none is available now (the runtime waits a
        little and asks again). Once `exhausted` is true it returns `[]` for good."""

    @abstractmethod
    def position(self) -> Any:
        """Where reading resumes after every value returned so far: msgpack-able (int, str, bytes, lists)."""

    @property
    def exhausted(self) -> bool:
        """True once a bounded partition has returned its last value; unbounded partitions never are."""
        return False

    async def close(self) -> None:
        """Release the reader's resources; the runtime calls it when the partition moves away or the job ends."""
        return None

    def take_errors(self) -> list[str]:
        """Values the reader skipped since the last call (a line that is not valid JSON), each described
        with where it was: the runtime reports them as errors of the source operator, the job goes on."""
        return []


class Source(ABC):
    """A partitioned input of a DAG (`dag.source(name, source)`)."""

    @abstractmethod
    def partitions(self) -> list[str]:
        """The partitions' names: stable across calls and processes, since positions are kept by name."""

    @abstractmethod
    def open(self, partition: str, position: Any | None) -> SourcePartition:
        """A reader of `partition` resuming at `position` (None: from the beginning)."""

    @property
    def bounded(self) -> bool:
        """True when every partition ends (files, lists); a job on bounded sources is idle once all are read."""
        return True

    @property
    def splits(self) -> bool:
        """True when a partition is cheap to reopen elsewhere part-way (a file's byte range, a list): then a
        reader that has read all of its own takes some of a busier one's (`clasp.core.partitions.steal`), as
        Flink's split enumerator hands out file splits. False by default: a partition whose reader holds a
        connection (a Kafka consumer, a Redis stream) stays where it is, as Flink leaves Kafka's."""
        return False


class SinkPartition(ABC):
    """A writer of one sink partition, between checkpoints."""

    @abstractmethod
    async def write_batch(self, values: list) -> None:
        """Take a batch of the sink's input values, in order; nothing needs to be visible before `commit`."""

    @abstractmethod
    async def prepare(self, checkpoint: int) -> Any:
        """Make what was written since the last prepare durable but not yet visible, and return a msgpack-able
        description of it: kept in checkpoint `checkpoint`, handed back to `commit`."""

    @abstractmethod
    async def commit(self, checkpoint: int, prepared: Any) -> None:
        """Make a prepared checkpoint's writes visible. May be called again for the same checkpoint after a
        failure (possibly on another worker, with the same `prepared`): it must then do nothing twice."""

    async def abort(self) -> None:
        """Drop what was written or prepared and not committed (the runtime replays it from the checkpoint);
        called after the commits still owed were made, on the writer or on a fresh `open` of the partition."""
        return None

    async def close(self) -> None:
        """Release the writer's resources."""
        return None


class Sink(ABC):
    """An output of a DAG (`dag.sink(name, sink)`): one partition per worker that holds a share of it."""

    #: True when commits are idempotent, so a replay never makes a value visible twice.
    exactly_once: bool = True

    @abstractmethod
    def open(self, partition: str) -> SinkPartition:
        """A writer of `partition` (a name the runtime chooses, stable for the sink's share on one worker)."""
