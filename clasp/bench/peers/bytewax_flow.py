"""Word Count as a Bytewax dataflow, for `python -m clasp.bench.peers` (run by `python -m bytewax.run`).

Fed and answered like a clasp job: each worker's source connects a ZeroMQ PAIR socket to the benchmark's
(PEERS_INPUT: one endpoint per worker, `;`-separated), says it is ready, and receives its slice of the
lines as msgpack batches of lines, the way clasp's client sends a `push` (an empty batch ends the input).
Split is `clasp.apps.wc.split`; `count_final` counts per word and emits each word's count at the end of
input; the sink sends its worker's counts back to the benchmark (PEERS_ANSWER, a PULL), where the clock
stops, as `job.state("count")` stops clasp's.
"""

from __future__ import annotations

import os

import bytewax.operators as op
import msgpack
import zmq
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from clasp.apps.wc import split
from clasp.bench.peers import send_answer

INPUTS = os.environ.get("PEERS_INPUT", "").split(";")
ANSWER = os.environ.get("PEERS_ANSWER", "")
CTX = zmq.Context.instance()


_opened = []


def gate() -> None:
    """Once per process (PEERS_GATE, for a flow reading its own source): ready, then wait for the go."""
    if _opened:
        return
    _opened.append(True)
    sock = CTX.socket(zmq.PAIR)
    sock.connect(os.environ["PEERS_GATE"])
    sock.send(b"ready")
    sock.recv()
    sock.close()


class _Part(StatelessSourcePartition):
    def __init__(self, index: int):
        self.sock = CTX.socket(zmq.PAIR)
        self.sock.connect(INPUTS[index])
        self.sock.send(b"ready")

    def next_batch(self):
        # Cooperative: wait at most 1 ms for the next batch, so the worker's other steps keep running.
        if not self.sock.poll(1):
            return []
        batch = msgpack.unpackb(self.sock.recv(), raw=False)
        if not batch:
            self.sock.close()
            raise StopIteration
        return batch


class Lines(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _Part(worker_index)


class _Out(StatelessSinkPartition):
    def __init__(self, index: int):
        self.index, self.counts = index, {}

    def write_batch(self, items):
        for word, n in items:
            self.counts[word] = n

    def close(self):
        send_answer(ANSWER, [self.index, self.counts])


class Counts(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Out(worker_index)


flow = Dataflow("wc")
words = op.flat_map("split", op.input("lines", flow, Lines()), split)
op.output("out", op.count_final("count", words, lambda w: w), Counts())
