"""Placements as the runtime carries them out, and the pure pieces of routing: key groups, weighted tables.

A placement names, per operator, the fraction `sigma_o(w)` of its requests each worker takes, the executor
instances it gets there, and for a stateful operator the owner of each of its key groups. The planner
builds one, ships it with `to_wire()`, and every worker's scheduling engine routes by it.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress

import msgpack
import numpy as np

from clasp.core.dag import DagSpec
from clasp.core.keygroups import assign_key_groups
from clasp.core.model import edge_flow
from clasp.core.parallelism import largest_remainder

NUM_KEY_GROUPS = 128  # as Flink's default max parallelism: the unit of state ownership and migration


class PlacementError(ValueError):
    """A placement that does not fit the DAG or the workers; clients see its name in the error text (the
    placement algorithm's own failure is `clasp.core.placement.NoPlacementError`)."""


def key_group(key, num_groups: int = NUM_KEY_GROUPS) -> int:
    """The key group of a key, the same in every process (Python's hash() of str is salted per process).

    Keys that Python holds equal share a group (`False`, `0` and `0.0`; `(1, "a")` and `(True, "a")`): a key
    group's state is a dict, where they are one key, and a worker's key cache answers for all of them with
    whichever it saw first, so their groups must not depend on which that was."""
    t = key.__class__
    if t is str:
        return zlib.crc32(key.encode()) % num_groups
    if t is int:
        return key % num_groups
    if t is bytes:
        return zlib.crc32(key) % num_groups
    if t is bool or (t is float and key.is_integer()):
        return int(key) % num_groups
    return zlib.crc32(msgpack.packb(_canonical_key(key), use_bin_type=True)) % num_groups


def _canonical_key(key):
    """One representative of the keys equal to `key` among the types msgpack tells apart: a bool or an
    integral float as the int it equals (a float as an int only where msgpack can carry that int), a
    tuple's items likewise."""
    if isinstance(key, bool | int):
        return int(key)
    if isinstance(key, float):
        return int(key) if key.is_integer() and -2**63 <= key < 2**64 else key
    if isinstance(key, tuple):
        return tuple(map(_canonical_key, key))
    return key


def weighted_table(shares: Mapping[str, float], size: int = 120) -> list[str]:
    """A cyclic destination table with each worker's frequency proportional to its share.

    Smooth weighted round-robin (nginx's), so consecutive requests interleave workers instead of bursting.
    """
    ids = sorted(w for w, s in shares.items() if s > 0)
    if not ids:
        raise PlacementError("an operator has no worker with a positive share")
    counts = largest_remainder([shares[w] for w in ids], size)
    ids = [w for w, c in zip(ids, counts, strict=True) if c > 0]
    counts = [c for c in counts if c > 0]
    current = [0] * len(ids)
    table = []
    total = sum(counts)
    for _ in range(total):
        for i, c in enumerate(counts):
            current[i] += c
        best = max(range(len(ids)), key=lambda i: (current[i], -i))
        current[best] -= total
        table.append(ids[best])
    return table


def key_groups_for_shares(shares: Mapping[str, float], num_groups: int = NUM_KEY_GROUPS,
                          previous: Sequence[str] | None = None, weights: Sequence[float] | None = None,
                          ) -> list[str]:
    """Key-group owners proportional to shares (by measured `weights` per group, when given), moving as
    few groups as possible from `previous`."""
    ids = sorted(w for w, s in shares.items() if s > 0)
    index = {w: i for i, w in enumerate(ids)}
    prev = None
    if previous is not None:
        # Owners that are no longer placed get an index outside `ids`, so their groups move.
        prev = [index.get(w, len(ids)) for w in previous]
    owners = assign_key_groups({i: shares[w] for i, w in enumerate(ids)}, num_groups, prev, weights)
    return [ids[i] for i in owners]


@dataclass
class OperatorPlacement:
    """Where one operator runs: sigma per worker, executor instances per worker, key-group owners."""

    shares: dict[str, float]
    instances: dict[str, int]
    key_groups: list[str] | None = None

    def workers(self) -> list[str]:
        return sorted(w for w, s in self.shares.items() if s > 0)


@dataclass
class Placement:
    """A whole job's placement at one epoch; epochs increase with every change."""

    operators: dict[str, OperatorPlacement]
    epoch: int = 0
    workers: list[str] = field(default_factory=list)

    def to_wire(self) -> dict:
        return {"epoch": self.epoch, "workers": self.workers,
                "operators": {n: {"shares": p.shares, "instances": p.instances, "key_groups": p.key_groups}
                              for n, p in self.operators.items()}}

    @classmethod
    def from_wire(cls, d: dict, spec: DagSpec) -> Placement:
        """Rebuild and validate against the DAG; raises PlacementError."""
        try:
            ops = {}
            for name, p in d["operators"].items():
                shares = {str(w): float(s) for w, s in p["shares"].items()}
                instances = {str(w): int(n) for w, n in p["instances"].items()}
                kg = p.get("key_groups")
                ops[str(name)] = OperatorPlacement(shares, instances, [str(w) for w in kg] if kg is not None else None)
            placement = cls(ops, int(d["epoch"]), [str(w) for w in d["workers"]])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlacementError(f"malformed placement: {type(e).__name__}: {e}") from None
        placement.check(spec)
        return placement

    def check(self, spec: DagSpec) -> None:
        names = {o.name for o in spec.operators}
        if set(self.operators) != names:
            raise PlacementError(f"placement covers {sorted(self.operators)}, the dag has {sorted(names)}")
        for o in spec.operators:
            p = self.operators[o.name]
            if not p.workers():
                raise PlacementError(f"operator {o.name!r} is placed on no worker")
            if any(s < 0 for s in p.shares.values()):
                raise PlacementError(f"operator {o.name!r} has a negative share")
            if o.stateful:
                if p.key_groups is None or len(p.key_groups) != NUM_KEY_GROUPS:
                    raise PlacementError(f"stateful operator {o.name!r} needs {NUM_KEY_GROUPS} key-group owners")
                if not set(p.key_groups) <= set(p.workers()):
                    raise PlacementError(f"operator {o.name!r} has key groups on a worker without a share")

    def active_workers(self) -> list[str]:
        return sorted({w for p in self.operators.values() for w in p.workers()})


def _instances(spec: DagSpec, on: dict[str, list[str]], p_max: int) -> dict[str, dict[str, int]]:
    """Split each worker's P_max slots equally among the operators placed on it (at least one each)."""
    per_worker: dict[str, list[str]] = {}
    for op, ws in on.items():
        for w in ws:
            per_worker.setdefault(w, []).append(op)
    out: dict[str, dict[str, int]] = {op: {} for op in on}
    for w, ops in per_worker.items():
        counts = largest_remainder([1.0] * len(ops), max(p_max, len(ops)))
        for op, c in zip(ops, counts, strict=True):
            out[op][w] = max(1, c)
    return out


def build_placement(spec: DagSpec, workers: Sequence[str], shares_by_index: Mapping[str, Mapping[int, float]],
                    p_max: int, epoch: int = 0, previous: Placement | None = None,
                    weights: Mapping[str, Sequence[float]] | None = None) -> Placement:
    """A placement from operator -> {worker index -> share} (the policies' and `submit(placement=)` form);
    key groups move as little as possible from `previous`, owned by their request `weights` where given."""
    names = {o.name for o in spec.operators}
    unknown = set(shares_by_index) - names
    if unknown:
        raise PlacementError(f"placement names unknown operators {sorted(unknown)}")
    missing = names - set(shares_by_index)
    if missing:
        raise PlacementError(f"placement leaves operators {sorted(missing)} unplaced")
    ops: dict[str, OperatorPlacement] = {}
    on: dict[str, list[str]] = {}
    for o in spec.operators:
        raw = shares_by_index[o.name]
        shares: dict[str, float] = {}
        for idx, s in raw.items():
            i = int(idx)
            if not 0 <= i < len(workers):
                raise PlacementError(f"operator {o.name!r}: worker index {i} but only {len(workers)} workers")
            if s < 0:
                raise PlacementError(f"operator {o.name!r}: negative share {s}")
            if s > 0:
                shares[workers[i]] = shares.get(workers[i], 0.0) + float(s)
        total = sum(shares.values())
        if total <= 0:
            raise PlacementError(f"operator {o.name!r} is placed on no worker")
        shares = {w: s / total for w, s in shares.items()}
        on[o.name] = sorted(shares)
        prev = previous.operators[o.name].key_groups if previous is not None else None
        ops[o.name] = OperatorPlacement(shares, {}, key_groups_for_shares(shares, NUM_KEY_GROUPS, prev,
                                                                          (weights or {}).get(o.name))
                                        if o.stateful else None)
    for name, inst in _instances(spec, on, p_max).items():
        ops[name].instances = inst
    return Placement(ops, epoch, list(workers))


def spread_placement(spec: DagSpec, workers: Sequence[str], p_max: int, epoch: int = 0,
                     weights: Mapping[str, Sequence[float]] | None = None) -> Placement:
    """The placement used at submission: every operator on every worker, key groups spread evenly (by their
    request `weights` where given: each owner's part of the requests, not of the groups)."""
    if not workers:
        raise PlacementError("no live workers to place the job on")
    even = {i: 1.0 for i in range(len(workers))}
    return build_placement(spec, workers, {o.name: even for o in spec.operators}, p_max, epoch, weights=weights)


# Route kinds from one operator to one successor, as seen from one process (`me`; None for the planner).
ROUTE_LOCAL = 0  # stateless successor entirely in this process
ROUTE_TABLE = 1  # stateless successor on several workers: cyclic weighted table (None = this process)
ROUTE_KEYED = 2  # stateful successor: key -> key group -> owner (None = this process)


@dataclass
class Route:
    """How requests for successor `succ` leave a process: locally, by weighted table, or by key owner."""

    kind: int
    succ: int
    table: list[str | None] | None = None
    owners: list[str | None] | None = None
    period: list[str | None] | None = None  # the table's shortest repeating prefix (`table_period`)
    sigma: dict[str | None, float] | None = None  # the table's shares per destination: the planner's balancing


def table_period(table: list) -> list:
    """The shortest prefix of `table` that repeated makes the table: the same shares in fewer slots (an
    even split of 120 slots over two workers is [a, b]), so the planner cuts a batch into fewer blocks."""
    n = len(table)
    for k in range(1, n + 1):
        if n % k == 0 and table == table[:k] * (n // k):
            return table[:k]
    return table


def route_to(spec: DagSpec, placement: Placement, succ: int, me: str | None, src: int | None = None) -> Route:
    """The route from process `me` to operator `succ` under `placement`; with `src`, the operator whose
    outputs take it: a stateless successor is then reached local first (`edge_flow`: `me` keeps what its
    own share of `succ` takes and deals the surplus out to the workers short of theirs), so an operator
    spread alike over the same workers as its predecessor never leaves the worker."""
    op = spec.operators[succ]
    p = placement.operators[op.name]
    local = lambda w: None if w == me else w  # noqa: E731
    if op.stateful:  # keyed even when every owner is local: the request must carry its key
        return Route(ROUTE_KEYED, succ, owners=[local(w) for w in p.key_groups])
    if p.workers() == [me]:
        return Route(ROUTE_LOCAL, succ)
    shares = p.shares
    if src is not None and me is not None:
        mine = placement.operators[spec.operators[src].name].shares
        if mine.get(me, 0.0) > 0:
            flows = edge_flow(mine, p.shares, local_first=True)
            shares = {d: x for (w, d), x in flows.items() if w == me and x > 0}
            if list(shares) == [me]:
                return Route(ROUTE_LOCAL, succ)
    table = [local(w) for w in weighted_table(shares)]
    sigma = {local(w): shares[w] for w in sorted(shares) if shares[w] > 0}
    return Route(ROUTE_TABLE, succ, table=table, period=table_period(table), sigma=sigma)


# Destinations up to which `partition_runs` takes each one's values by a pass of `compress` over the batch
# (~80 instructions a value a pass); beyond, by one stable sort of the batch and a gather (~550 a value).
COMPRESS_DESTINATIONS = 4


def partition_runs(values: list, rids: list, counts: list, groups: bytes, owners: list) -> dict:
    """Split a batch of requests by the owner of their key groups, keeping order: `values` with their record
    ids as runs (`rids[r]` for `counts[r]` consecutive values), the key group of each value as bytes (a
    group is below 256), and `owners` (key group -> destination) -> {destination: (values, rids, counts,
    groups)} for the destinations that get any, their runs without empty ones, their groups as bytes. The
    destination of each value by one `bytes.translate`, every run's length per destination by one
    `bincount`, and each destination's values by a pass of `itertools.compress` over the batch (a stable
    radix sort and one gather with more than COMPRESS_DESTINATIONS): a few passes in C, none
    per request in Python; the keyed fast path routes a scheduling pass's words with it."""
    dests = list(dict.fromkeys(owners))
    if type(groups) is not bytes:
        groups = bytes(groups)
    if len(dests) == 1 or not values:
        return {dests[0]: (values, rids, counts, groups)} if values else {}
    index = {d: i for i, d in enumerate(dests)}
    nd, nr = len(dests), len(counts)
    dest_of = np.frombuffer(groups.translate(bytes(map(index.__getitem__, owners)).ljust(256, b"\0")), np.uint8)
    run_of = np.repeat(np.arange(nr, dtype=np.intp), counts)
    per_run = np.bincount(run_of * nd + dest_of, minlength=nr * nd).reshape(nr, nd).T.tolist()
    by_value = np.frombuffer(groups, np.uint8)
    out = {}
    if nd <= COMPRESS_DESTINATIONS:
        for i, d in enumerate(dests):
            mine = dest_of == i
            vs = list(compress(values, mine.tobytes()))  # a bool array's bytes are 0 and 1
            if vs:
                c = per_run[i]  # run r's values that go to d
                out[d] = (vs, list(compress(rids, c)), list(compress(c, c)), by_value[mine].tobytes())
        return out
    order = np.argsort(dest_of, kind="stable")
    ordered = list(map(values.__getitem__, order.tolist()))
    ordered_groups = by_value[order].tobytes()
    bounds = [0, *np.cumsum(np.bincount(dest_of, minlength=nd)).tolist()]
    for i, d in enumerate(dests):
        a, b = bounds[i], bounds[i + 1]
        if a < b:
            c = per_run[i]
            out[d] = (ordered[a:b], list(compress(rids, c)), list(compress(c, c)), ordered_groups[a:b])
    return out
