"""One operator on one worker (`OpRuntime`): its queue, its keyed state as one dict per key group, its routes
and counters, and the key groups' life between executions: cold (arrived by migration, still a blob), live,
at rest (packed while unchanged). The engine (`clasp.runtime.engine`) runs it; migrations and checkpoints
move and snapshot its groups.
"""

from __future__ import annotations

import logging
import math
from operator import add

import msgpack

from clasp.core.dag import identity
from clasp.core.keyed import TimerOperator
from clasp.core.routing import NUM_KEY_GROUPS, key_group
from clasp.core.timed import TimedFold
from clasp.runtime.records import RecordQueue

log = logging.getLogger("clasp.worker.engine")
KEY_CACHE_MAX = 1 << 20
HITS_FOLD = 1 << 16  # routed requests whose key groups wait before they are counted in an operator's hits
# Two clock reads cost ~10% of a cheap request here, so one request in TIMING_SAMPLE (the first of each
# micro-batch among them) is timed; τ̄ is the sample's mean and histogram counts are scaled by it.
# (The thread's CPU clock would not count a CPU quota's throttled periods, but a read of it costs 0.6 µs
# and disturbs the timed call by another 0.2-0.5 µs, more than this runtime's cheapest operators take.)
TIMING_SAMPLE = 8
# Upper bounds (seconds) of the execution-time histogram buckets.
EXEC_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1, 1.0)


def _one_output(value):
    """A sink operator's function: the value reaching it is one value for the sink, whatever its type."""
    return (value,)


class KeyCache(dict):
    """Key -> key group, for the keys this operator has seen. A miss computes the group (`key_group`) and
    keeps it while the cache has room, so a batch's groups are one `map` of `__getitem__` in C, with no
    pass to find the misses."""

    __slots__ = ()

    def __missing__(self, key) -> int:
        g = key_group(key, NUM_KEY_GROUPS)
        if len(self) < KEY_CACHE_MAX:
            self[key] = g
        return g


class OperatorError(Exception):
    """An operator's function raised or returned something unusable."""


def unpack_group(blob: bytes) -> dict:
    """A key group's state from its migration blob; OperatorError when a peer sent something else."""
    try:
        items = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types for garbage
        raise OperatorError(f"a migrated key group's state is undecodable: {type(e).__name__}: {e}") from None
    if not isinstance(items, dict):
        raise OperatorError(f"a migrated key group's state is a {type(items).__name__}, not a map")
    return items


class OpRuntime:
    """One operator on this worker: its queue, state, routes and counters."""

    __slots__ = ("index", "name", "fn", "key_fn", "stateful", "is_async", "collect", "queue", "groups",
                 "instances", "routes", "successors", "processed", "exec_time", "errors", "edge_counts",
                 "dts", "hist", "collected", "key_cache", "busy", "exec_total", "group_hits",
                 "collected_rids", "cold", "rested", "batch", "key_is_value", "sink", "sink_wake", "sink_room",
                 "replaced", "unpackable", "blocks", "gathers", "routed", "timed", "maps_keyed", "maps_local",
                 "owner_table")

    def __init__(self, spec_op):
        self.index = spec_op.index
        self.name = spec_op.name
        self.fn = spec_op.fn
        self.key_fn = spec_op.key
        self.key_is_value = spec_op.key is identity  # the key is the value: no call
        self.batch = spec_op.batch  # fn takes a list of values and returns a list of outputs
        self.stateful = spec_op.stateful
        self.is_async = spec_op.is_async
        self.collect = spec_op.collect
        # A sink operator keeps each value reaching it, with its record, as a collecting one keeps its
        # outputs; the worker's sink writer (clasp.runtime.sinks) takes them out to the sink's partition.
        # It stops taking requests (`busy`) while `sink_room` values wait, so a slow sink holds its input back.
        self.sink = spec_op.kind == "sink"
        self.sink_wake = None
        self.sink_room = math.inf
        if self.sink:
            self.fn = _one_output
            self.collect = True
        self.successors = list(spec_op.successors)
        self.queue = RecordQueue()
        # The state, one dict per key group ({key: state}): a key group moves as one object, serialized
        # in one call, with no work per key in Python (paper §4.4; docs/SCALING.md).
        self.groups: list[dict] = [{} for _ in range(NUM_KEY_GROUPS)] if spec_op.stateful else []
        self.instances = 0
        self.routes: list[tuple] = []
        self.processed = 0  # cumulative, for Prometheus and exactly-once checks
        self.exec_time = 0.0  # cumulative seconds inside fn
        self.exec_total = 0.0
        self.errors = 0
        self.edge_counts = [0] * len(self.successors)
        self.dts: list[float] = []
        self.hist = [0] * (len(EXEC_BUCKETS) + 1)
        self.collected: list = []
        self.collected_rids: list[int] = []  # the record of each collected output (checkpoints release by it)
        self.key_cache = KeyCache()
        # Requests routed to each key group of this (stateful) operator by this worker, cumulative: the
        # planner sums them over the senders into the groups' weights (keygroups.assign_weighted).
        self.group_hits: list[int] = [0] * NUM_KEY_GROUPS if spec_op.stateful else []
        # The key groups of requests the keyed fast path routed here, one byte each, not yet counted in
        # `group_hits` (`hits` adds them): a batch's groups join in one copy, counted thousands at a time.
        self.routed = bytearray()
        # Key groups that arrived by migration and were not touched since: group -> (msgpack blob of
        # {key: state}, its key count). Decoded on first use (`warm`), forwarded as they are if they move on,
        # so a migration costs the receiver O(key groups), not O(keys).
        self.cold: dict[int, tuple[bytes, int]] = {}
        # Key groups at rest: group -> its blob and key count while the group is unchanged (executing any
        # request of the group drops it), so moving or checkpointing the group packs nothing. Made in idle
        # time (`JobEngine.rest_one`) and by checkpoints; a cold group's blob rests on once it is decoded.
        self.rested: list[tuple[bytes, int] | None] = [None] * NUM_KEY_GROUPS if spec_op.stateful else []
        # Key groups installed or taken away here since the event-time shell last looked: it indexes their
        # timers again (clasp.runtime.worker_time).
        self.replaced: set[int] = set()
        # Key groups whose state msgpack cannot carry (an operator error, named once): resting skips them, and a
        # checkpoint or a move of them fails with the error that names the key.
        self.unpackable: set[int] = set()
        self.busy = False
        self.blocks = False  # runs its column blocks in the tight loop: set with its routes
        self.gathers = False  # runs a pass at a time, its outputs gathered into blocks: set with its routes
        # The owners of its key groups in a route to it, with their destinations and the byte table of them
        # that the kernels' `gather` takes (`batches.gather_outputs`): made once per route, not per pass.
        self.owner_table: tuple | None = None
        # A keyed time operator runs a pass a key at a time (clasp.runtime.timed_batches.apply_timed); a map
        # whose one successor is keyed by a function (`map_keyed`), or is a stateless operator here
        # (`map_local`), a pass at a time: set with its routes.
        self.timed = isinstance(self.fn, TimedFold)
        self.maps_keyed = False
        self.maps_local = False

    def group_of(self, key) -> int:
        return self.key_cache[key]

    def warm(self, g: int) -> None:
        """Decode a cold key group into the live state."""
        blob, n = self.cold.pop(g)
        try:
            items = unpack_group(blob)
        except OperatorError as e:  # a peer's bug, not this request's: the group goes on without that state
            log.error("operator %s, key group %d: %d keys lost: %s", self.name, g, n, e)
            return
        fresh = not self.groups[g]
        self.install_items(g, items)
        if fresh:
            self.rested[g] = (blob, n)

    def install_items(self, g: int, items: dict) -> None:
        self.rested[g] = None
        self.replaced.add(g)
        if self.groups[g]:
            self.groups[g].update(items)
        else:
            self.groups[g] = items

    def warm_all(self) -> None:
        for g in list(self.cold):
            self.warm(g)

    def warm_rows(self, rows, n: int) -> None:
        """Decode the cold groups of the first `n` of `rows` (a queue about to run)."""
        cold, group_of = self.cold, self.group_of
        for i, r in enumerate(rows):
            if i >= n or not cold:
                return
            g = group_of(r[2])
            if g in cold:
                self.warm(g)

    def warm_key(self, key) -> None:
        if self.cold:
            g = self.group_of(key)
            if g in self.cold:
                self.warm(g)

    def keys(self) -> int:
        return sum(map(len, self.groups)) + sum(n for _, n in self.cold.values())

    def get(self, key):
        return self.groups[self.group_of(key)].get(key)

    def state_dict(self) -> dict:
        """Every key's state held here, in one dict (a copy; cold groups decoded first)."""
        self.warm_all()
        out: dict = {}
        for d in self.groups:
            out.update(d)
        return out

    def take_group(self, g: int, dropped: list) -> tuple[bytes, int]:
        """Remove key group `g` from this worker: its state as one blob, and its key count. The group's dict
        goes to `dropped`: freeing its keys is O(keys), work for after the migration."""
        cold = self.cold.pop(g, None)
        if cold is not None:
            return cold
        rested, self.rested[g] = self.rested[g], None
        d, self.groups[g] = self.groups[g], {}
        self.replaced.add(g)
        dropped.append(d)
        if rested is not None:
            return rested
        return msgpack.packb(d, use_bin_type=True), len(d)

    def rest(self, g: int) -> tuple[bytes, int]:
        """Pack key group `g` as it is now and keep the blob while the group stays unchanged."""
        d = self.groups[g]
        self.rested[g] = out = (msgpack.packb(d, use_bin_type=True), len(d))
        return out

    def add_collected(self, outs, rid: int) -> None:
        self.collected.extend(outs)
        self.collected_rids.extend([rid] * len(outs))
        if self.sink_wake is not None:
            self.sink_wake()
            if len(self.collected) >= self.sink_room:
                self.busy = True

    def weigh(self, groups: bytes) -> None:
        """Count a routed batch's requests in their key groups' hits (bytes: one group each)."""
        self.routed += groups
        if len(self.routed) >= HITS_FOLD:
            self.hits()

    def hits(self) -> list[int]:
        """Requests routed to each key group, cumulative (`group_hits`, the pending batches counted in)."""
        if self.routed:
            import numpy as np

            counts = np.bincount(np.frombuffer(self.routed, dtype=np.uint8), minlength=len(self.group_hits))
            self.group_hits[:] = map(add, self.group_hits, counts.tolist())
            self.routed = bytearray()  # not clear(): the array may still view the old one
        return self.group_hits

    def fold_histogram(self) -> None:
        """Fold the sampled execution times into the histogram and the total (each stands for TIMING_SAMPLE)."""
        import numpy as np

        if self.dts:
            idx = np.searchsorted(np.asarray(EXEC_BUCKETS), np.asarray(self.dts), side="left")
            counts = np.bincount(idx, minlength=len(EXEC_BUCKETS) + 1) * TIMING_SAMPLE
            for i, c in enumerate(counts.tolist()):
                self.hist[i] += c
            self.exec_total += float(np.sum(self.dts)) * TIMING_SAMPLE
            self.dts.clear()

    def put_state(self, key, new) -> None:
        """A write from outside the operator (`state_put`): for a keyed time operator the key's timers are in
        `new`, so the key is re-indexed as if its own record had changed it (clasp.runtime.worker_time)."""
        self.warm_key(key)
        self.set_state(key, new)
        if isinstance(self.fn, TimedFold):
            self.fn.touched.add(key)
            if isinstance(self.fn.op, TimerOperator):
                self.fn.op.processing = True  # the state written may hold processing-time timers

    def set_state(self, key, new) -> None:
        """Store `new` for `key` (None deletes)."""
        g = self.group_of(key)
        self.rested[g] = None
        d = self.groups[g]
        if new is None:
            d.pop(key, None)
        else:
            d[key] = new


def check_serializable(name: str, state: dict) -> None:
    """Raise OperatorError naming the first key whose state (or key) msgpack cannot carry."""
    try:
        msgpack.packb(state, use_bin_type=True)
        return
    except (TypeError, ValueError, OverflowError):
        pass
    for key, value in state.items():
        for what, obj in (("key", key), ("state", value)):
            try:
                msgpack.packb(obj, use_bin_type=True)
            except (TypeError, ValueError, OverflowError) as e:
                raise OperatorError(
                    f"operator {name!r}: the {what} of key {key!r} is a {type(obj).__name__}, which is not "
                    f"msgpack-serializable ({e}); state must be None, bool, int, float, str, bytes, list or dict"
                ) from None
