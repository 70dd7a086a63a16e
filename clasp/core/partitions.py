"""Which worker reads each partition of a source, from the source operator's shares σ_o(w).

A source lists its partitions once, at submit; they are owned like key groups: each by one worker holding
a share of the source operator, as many per worker as its share says (largest remainder), and a new
assignment keeps every partition whose owner may stay, so a rescale, drain or recovery moves the fewest.
With fewer partitions than workers some workers read nothing (their share of the source operator then
only passes on what others read). The planner carries the assignment out: a partition that changes
owner moves with its position (`clasp/runtime/sources.py`).

A bounded source's partitions are also balanced as they end (`steal`): a worker that has read all of its own
while another still has several to read takes half of the difference, as Flink's split enumerator hands
unread file splits to the readers that ask. Workers read at different speeds (one of them owns the hot key
groups, or has less CPU), and without it the fastest would idle while the slowest reads on alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import replace

from clasp.core.dag import DagSpec
from clasp.core.parallelism import largest_remainder
from clasp.core.routing import Placement


def partition_counts(shares: Mapping[str, float], n: int) -> dict[str, int]:
    """Partitions per worker: proportional to its share; each worker with a positive share gets one
    before any gets two."""
    workers = sorted(w for w, s in shares.items() if s > 0)
    if not workers:
        raise ValueError("at least one worker needs a positive share")
    if n <= 0:
        return dict.fromkeys(workers, 0)
    minimum = [1] * len(workers) if n >= len(workers) else None
    counts = largest_remainder([shares[w] for w in workers], n, minimum)
    return dict(zip(workers, counts, strict=True))


def assign_partitions(partitions: Sequence[str], shares: Mapping[str, float],
                      previous: Mapping[str, str] | None = None) -> dict[str, str]:
    """Owner of each partition, proportional to `shares` (worker -> σ), moving the fewest from `previous`
    (partition -> owner): a previous owner with a positive share keeps its partitions up to its count,
    in the partitions' order; the rest go, in order, to the workers below their count, in worker order."""
    target = partition_counts(shares, len(partitions))
    owners: dict[str, str] = {}
    kept = dict.fromkeys(target, 0)
    prev = previous or {}
    for p in partitions:
        w = prev.get(p)
        if w in target and kept[w] < target[w]:
            owners[p] = w
            kept[w] += 1
    free = (w for w in sorted(target) for _ in range(target[w] - kept[w]))
    for p in partitions:
        if p not in owners:
            owners[p] = next(free)
    return {p: owners[p] for p in partitions}


def reassign(partitions: Sequence[str], shares: Mapping[str, float], previous: Mapping[str, str],
             ended: Set[str]) -> dict[str, str]:
    """Owner of each partition after a placement change: one read to its end (`ended`) stays with its owner
    while that owner keeps a share (moving it would only open a reader with nothing to read); the rest by
    `assign_partitions`, proportional to `shares` over the partitions still being read. So a rebalance
    that leaves the shares as they are does not undo what `steal` evened out at the end of a source."""
    owners = {p: previous[p] for p in partitions if p in ended and shares.get(previous.get(p), 0) > 0}
    # An ended partition whose owner left goes anywhere (spread among themselves): it is not read, so it
    # counts for no worker's share of the reading.
    owners.update(assign_partitions([p for p in partitions if p in ended and p not in owners], shares))
    owners.update(assign_partitions([p for p in partitions if p not in ended], shares, previous))
    return {p: owners[p] for p in partitions}


def moved_partitions(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """Partition -> (old owner or None, new owner), for those whose owner changes."""
    return {p: (old.get(p), w) for p, w in new.items() if old.get(p) != w}


def steal(owners: Mapping[tuple[str, str], str], ended: Set[tuple[str, str]],
          readers: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], tuple[str, str]]:
    """Moves (op, partition) -> (owner, new owner) that even out the partitions still being read, per source
    operator, once one of its readers (`readers[op]`: the workers holding a share of it) has none left: from
    the worker with the most to the one with the fewest while they differ by two or more, the
    last-listed partitions first (the order of `owners`). Nothing while every reader still has one."""
    moves: dict[tuple[str, str], tuple[str, str]] = {}
    for op, workers in readers.items():
        left: dict[str, list] = {w: [] for w in workers}
        for key, w in owners.items():
            if key[0] == op and key not in ended and w in left:
                left[w].append(key)
        if len(left) < 2 or min(map(len, left.values())) > 0:
            continue
        while True:
            most = max(sorted(left), key=lambda w: len(left[w]))
            fewest = min(sorted(left), key=lambda w: len(left[w]))
            if len(left[most]) - len(left[fewest]) < 2:
                break
            key = left[most].pop()
            left[fewest].append(key)
            first = moves.pop(key, (most, fewest))[0]
            if first != fewest:
                moves[key] = (first, fewest)
    return moves


def readers_follow(spec: DagSpec, placement: Placement) -> Placement:
    """`placement` with every source operator on the workers of its first successor, with the same shares:
    a policy sees no load on a source operator (it runs no function), and its partitions should be read
    where what it reads is processed, local first. Returns a new Placement; others' placements unchanged."""
    ops = dict(placement.operators)
    for i in spec.readers:
        o = spec.operators[i]
        if not o.successors:
            continue
        follow = placement.operators[spec.operators[o.successors[0]].name]
        ops[o.name] = replace(ops[o.name], shares=dict(follow.shares),
                              instances={w: max(1, n) for w, n in follow.instances.items()})
    return replace(placement, operators=ops)
