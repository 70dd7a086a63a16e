"""Word Count read by Bytewax's own sources, for `python -m clasp.bench.peers --feed files|kafka`.

PEERS_FEED=files: the lines are in files under PEERS_DIR (`*.txt`), read by `DirSource` (each file a
partition, hashed to a worker). PEERS_FEED=kafka: the lines are the messages of the topic PEERS_TOPIC on
the broker PEERS_BROKER, read by `bytewax.connectors.kafka.KafkaSource` (confluent-kafka) from the start
to the end (`tail=False`). Either reads PEERS_BATCH lines per batch. Before it lists its partitions each
process says it is ready on its ZeroMQ PAIR socket (PEERS_GATE) and waits for the word to go: the
benchmark's clock starts there, as it starts at clasp's `submit`. Split, `count_final` and the sink that
sends each worker's counts back (PEERS_ANSWER) are those of `clasp.bench.peers.bytewax_flow`.
"""

from __future__ import annotations

import os
from pathlib import Path

import bytewax.operators as op
from bytewax.dataflow import Dataflow

from clasp.apps.wc import split
from clasp.bench.peers.bytewax_flow import Counts, gate

BATCH = int(os.environ.get("PEERS_BATCH", "1000"))


def _message_words(msg) -> list[str]:
    return split(msg.value.decode())


def _files_flow() -> Dataflow:
    from bytewax.connectors.files import DirSource

    class GatedDirSource(DirSource):
        def list_parts(self):
            gate()
            return super().list_parts()

    flow = Dataflow("wc-files")
    lines = op.input("lines", flow, GatedDirSource(Path(os.environ["PEERS_DIR"]), "*.txt", batch_size=BATCH,
                                                   get_fs_id=lambda _dir: "SHARED"))
    op.output("out", op.count_final("count", op.flat_map("split", lines, split), lambda w: w), Counts())
    return flow


def _kafka_flow() -> Dataflow:
    from bytewax.connectors.kafka import KafkaSource

    class GatedKafkaSource(KafkaSource):
        def list_parts(self):
            gate()
            return super().list_parts()

    flow = Dataflow("wc-kafka")
    msgs = op.input("lines", flow, GatedKafkaSource([os.environ["PEERS_BROKER"]], [os.environ["PEERS_TOPIC"]],
                                                    tail=False, batch_size=BATCH))
    words = op.flat_map("split", msgs, _message_words)
    op.output("out", op.count_final("count", words, lambda w: w), Counts())
    return flow


flow = _kafka_flow() if os.environ.get("PEERS_FEED") == "kafka" else _files_flow()
