"""A Nexmark query as Bytewax processes, for `python -m clasp.bench.nexmark_cluster --bytewax-processes 1,2` (run
by `python -m bytewax.run`, one worker a process, `-i/-a` between processes as the Word Count bench runs them).

The events are JSON lines in files under NEXMARK_DIR (`events-*.jsonl`), read by Bytewax's `DirSource` (each file a
partition, hashed to a worker; NEXMARK_BATCH lines a batch) and decoded by orjson, as clasp's workers read and
decode theirs (only the lines of the kinds the query reads where the benchmark selects them, `kind_marks`); the
query is `clasp.bench.peers.nexmark_bytewax`'s (NEXMARK_QUERY), its clock waiting NEXMARK_BOUND_MS. Before it
lists its partitions each process says it is ready on its ZeroMQ PAIR socket (PEERS_GATE) and waits for the word
to go, where the benchmark's clock starts, as it starts at clasp's `submit`; each worker's sink sends the rows it
got back (PEERS_ANSWER, msgpack `[worker, rows]`) when the input ends.
"""

from __future__ import annotations

import os
from pathlib import Path

from bytewax.connectors.files import DirSource
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from clasp.bench.nexmark_cluster import kind_marks
from clasp.bench.peers import nexmark_bytewax as bw
from clasp.bench.peers import send_answer
from clasp.bench.peers.bytewax_flow import gate


class _GatedDirSource(DirSource):
    def list_parts(self):
        gate()
        return super().list_parts()


class _Rows(StatelessSinkPartition):
    def __init__(self, index: int):
        self.index, self.rows = index, []

    def write_batch(self, items):
        self.rows.extend(items)

    def close(self):
        send_answer(os.environ["PEERS_ANSWER"], [self.index, self.rows])


class Rows(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Rows(worker_index)


def _flow():
    source = _GatedDirSource(Path(os.environ["NEXMARK_DIR"]), "events-*.jsonl",
                             batch_size=int(os.environ.get("NEXMARK_BATCH", "1000")), get_fs_id=lambda _: "SHARED")
    query = os.environ["NEXMARK_QUERY"]
    return bw.build(query, source, Rows(), int(os.environ["NEXMARK_BOUND_MS"]), decode=True, select=kind_marks(query))


flow = _flow()
