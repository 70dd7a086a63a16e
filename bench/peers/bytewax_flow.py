"""Word Count as a Bytewax dataflow, for `python -m bench.peers` (run by `python -m bytewax.run`).

The lines come from the file in PEERS_LINES (written by the benchmark from `clasp.apps.wc.generate`), read at
import, before the clock starts; each worker reads its own slice (`lines[i::n]`, a DynamicSource). Split
is `clasp.apps.wc.split`; `count_final` counts per word and emits each word's count at the end of input.
Each worker writes PEERS_OUT/worker-I.json: its words' counts, when its source began, when its sink closed.
"""

from __future__ import annotations

import json
import os
import time

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from clasp.apps.wc import split

BATCH = 1000
with open(os.environ["PEERS_LINES"]) as _f:
    LINES = _f.read().split("\n")
OUT = os.environ["PEERS_OUT"]
STARTED: dict[int, float] = {}


class _Part(StatelessSourcePartition):
    def __init__(self, index: int, count: int):
        self.index, self.lines, self.pos = index, LINES[index::count], 0

    def next_batch(self):
        if self.pos == 0:
            STARTED.setdefault(self.index, time.time())
        if self.pos >= len(self.lines):
            raise StopIteration
        batch = self.lines[self.pos:self.pos + BATCH]
        self.pos += BATCH
        return batch


class Lines(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _Part(worker_index, worker_count)


class _Out(StatelessSinkPartition):
    def __init__(self, index: int):
        self.index, self.counts = index, {}

    def write_batch(self, items):
        for word, n in items:
            self.counts[word] = n

    def close(self):
        with open(os.path.join(OUT, f"worker-{self.index}.json"), "w") as f:
            json.dump({"counts": self.counts, "end": time.time(), "start": STARTED.get(self.index)}, f)


class Counts(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Out(worker_index)


flow = Dataflow("wc")
words = op.flat_map("split", op.input("lines", flow, Lines()), split)
op.output("out", op.count_final("count", words, lambda w: w), Counts())
