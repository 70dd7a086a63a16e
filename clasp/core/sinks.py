"""Sinks committed with the checkpoints, as pure bookkeeping (no sockets, no event loop, no files).

Each worker writes the values reaching a sink operator to its own partition of that sink, named
`partition_name(sink, worker, run)`: stable for the sink's share on that worker, and unique to the job's run
(`run` is the job's id and submission time), so two runs of one DAG into the same place never take each
other's commits for their own.

A partition's checkpoint `k` is prepared when the worker snapshots `k`; a checkpoint that fails leaves what
was prepared for it uncommitted, to be committed with the next one, so a worker reports every prepared
checkpoint not committed yet (`[[k, prepared], ...]`, oldest first) and commits them in that order. The
planner (`SinkBook`) keeps each complete checkpoint's prepared partitions until their worker acknowledged the
commit; a recovery hands the commits it still owes, and the partitions of the dead workers to abort, to the
survivors (`recovery_duties`), which commit before they abort.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clasp.core.dag import DagSpec

#: Values a sink partition buffers on its worker before the sink operator stops taking requests: then its
#: requests stay queued, their records incomplete, and the planner's in-flight window stops the input.
SINK_BUFFER = 10_000
#: Values handed to one `write_batch`.
SINK_BATCH = 2_000


def aligned_operators(spec: DagSpec) -> set[int]:
    """The stateful operators whose outputs are seen: they reach a sink, a collecting operator or another
    stateful operator (a collecting one itself included).

    A checkpoint's barrier holds their requests above the boundary until the snapshot, as Flink's aligned
    checkpoints do, instead of copy on write: there a request below the boundary that reaches a key after one
    above it emits from a state that already holds the later one, while the checkpoint keeps the state
    without it, so a rollback would emit that value again (and never the one the later request emitted); a
    stateful successor would keep that value in its own state below the cut. A stateful operator whose
    outputs go nowhere seen runs on under copy on write, whatever feeds it (pushed or declared sources)."""
    ops = spec.operators
    seen: dict[int, bool] = {}  # whether what reaches operator i is seen
    for i in reversed(spec.topological()):
        o = ops[i]
        seen[i] = o.kind == "sink" or o.collect or o.stateful or any(seen[s] for s in o.successors)
    return {o.index for o in ops if o.stateful and (o.collect or any(seen[s] for s in o.successors))}


def run_token(job: int, created: float) -> str:
    """The job's run, as partition names carry it: its id and submission time (ms, hex)."""
    return f"{job}-{int(created * 1000):x}"


def partition_name(sink: str, worker: str, run: str) -> str:
    """The partition of `sink` written by `worker` in job run `run`."""
    return f"{sink}.{worker}.{run}"


def take_writable(values: list, rids: list, fence: int | None) -> tuple[list, list, list]:
    """What a sink writer may write now, in arrival order: everything without a fence; while a checkpoint's
    barrier is up, only values of records below its boundary `fence` (the rest belong to the next
    checkpoint). Returns (what to write, the values kept, their rids); O(values), no copy without a fence."""
    if fence is None:
        return values, [], []
    batch, keep, keep_r = [], [], []
    for v, r in zip(values, rids, strict=True):
        if r < fence:
            batch.append(v)
        else:
            keep.append(v)
            keep_r.append(r)
    return batch, keep, keep_r


@dataclass
class SinkBook:
    """The planner's sink commits of one job: complete checkpoints whose commits are not acknowledged yet.

    `pending[k][worker][partition] = [sink, [[k_i, prepared_i], ...]]`: what `worker` reported for its
    partitions when checkpoint `k` completed."""

    pending: dict[int, dict[str, dict[str, list]]] = field(default_factory=dict)
    seq: int = 0  # flushes of a job without checkpoints (their ids in place of a checkpoint's)
    commits: int = 0  # commits acknowledged
    errors: list[str] = field(default_factory=list)

    def completed(self, ckpt: int, replies: Mapping[str, Mapping[str, list]]) -> dict[str, dict[str, list]]:
        """Checkpoint `ckpt` is complete; `replies`: worker -> its partitions' prepared checkpoints. Returns
        what each worker is to commit now."""
        todo = {w: {p: [s, [list(e) for e in entries]] for p, (s, entries) in parts.items() if entries}
                for w, parts in replies.items()}
        todo = {w: parts for w, parts in todo.items() if parts}
        if todo:
            self.pending[ckpt] = todo
        return todo

    def acked(self, ckpt: int, worker: str) -> None:
        by_worker = self.pending.get(ckpt)
        if by_worker is not None and by_worker.pop(worker, None) is not None:
            self.commits += 1
            if not by_worker:
                del self.pending[ckpt]

    @property
    def settled(self) -> bool:
        return not self.pending

    def recovery_duties(self, alive: Sequence[str], dead: Sequence[str], sinks: Sequence[str],
                        run: str) -> dict[str, dict[str, list]]:
        """What each survivor does for the sinks in a recovery, before it restores: `commit`, the commits
        still owed ([partition, sink, [[k, prepared], ...]], oldest checkpoint first: its own partitions'
        and those of the dead workers it takes over), then `abort`, the dead workers' partitions
        ([sink, partition]: what they wrote and did not commit). The survivor aborts its own partitions
        itself. Dead workers' partitions go round-robin to the survivors (sorted, so the choice is stable)."""
        alive = sorted(alive)
        if not alive:
            return {}
        heir = {w: alive[i % len(alive)] for i, w in enumerate(sorted(dead))}
        out: dict[str, dict[str, list]] = {w: {"commit": [], "abort": []} for w in alive}
        merged: dict[tuple[str, str], list] = {}  # (worker, partition) -> [sink, entries], checkpoints in order
        for k in sorted(self.pending):
            for w, parts in self.pending[k].items():
                for p, (s, entries) in parts.items():
                    got = merged.setdefault((w, p), [s, []])
                    seen = {e[0] for e in got[1]}
                    got[1].extend(e for e in entries if e[0] not in seen)
        for (w, p), (s, entries) in merged.items():
            to = w if w in out else heir.get(w, alive[0])
            out[to]["commit"].append([p, s, sorted(entries, key=lambda e: e[0])])
        for w in sorted(dead):
            for s in sinks:
                out[heir[w]]["abort"].append([s, partition_name(s, w, run)])
        return out
