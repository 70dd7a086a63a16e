"""A worker's local scheduling engine and executor pool for one job: the hot path.

Requests are 4-tuples `(op, value, key, rid)`, or column blocks of them where the key is the value
(`clasp.runtime.records`). Each operator has a FIFO queue; executors run
micro-batches of it in a tight loop and hand every output to the successor's route: a local chained
request is appended to the successor's queue in memory (no serialization, no socket); a remote one is
appended to the per-destination batch that the worker flushes within the flush delay.

Termination detection is epoch progress (`clasp.core.tracking`): the engine counts, per progress epoch
(`rid >> EPOCH_BITS`) and operator, the requests it finished (-1) and the chained requests they produced
(+1 at the successor), a run of one epoch at a time, and the worker reports the counts it gathered in
one message per flush. No per-request message, no per-record bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import traceback
from collections import deque
from itertools import chain, compress, repeat
from operator import is_
from time import perf_counter

import msgpack

from clasp.core.dag import DagSpec, identity
from clasp.core.outputs import ITEMS_EXACT, ONE_EXACT, as_outputs
from clasp.core.protocol import column_rows, columns, expand_columns, expand_run, expand_runs
from clasp.core.routing import NUM_KEY_GROUPS, ROUTE_KEYED, ROUTE_LOCAL, ROUTE_TABLE, Placement, key_group, route_to
from clasp.core.sinks import aligned_operators
from clasp.core.tracking import EPOCH_BITS
from clasp.runtime.records import RecordQueue

log = logging.getLogger("clasp.worker.engine")
HOLD = "\x00hold"  # the route of a key group whose state is on its way here: its requests wait
KEYED_HERE = 3  # a keyed route whose key groups are all owned by this worker
ROUTE_ONE_REMOTE = 4  # a stateless successor that one other worker alone holds: every request goes there
# A scheduling round is about ROUND_TIME_US of work, shared by the worker's operators in proportion to
# their executor instances and sized from each one's mean execution time plus the runtime's own per-request
# cost: cheap operators then run long enough between event-loop turns, and a round stays within the 1 ms
# flush delay. The round's length does not follow the instance count: one single-threaded process runs
# every instance, so instances set an operator's share of the round, not how long the round is, and a
# share its operator has no work for goes to the others (docs/RUNTIME.md, "Scheduling rounds").
ROUND_TIME_US = 1000.0
REQUEST_OVERHEAD_US = 1.5
MIN_BATCH = 16
# Two clock reads cost ~10% of a cheap request here, so one request in TIMING_SAMPLE (the first of each
# micro-batch among them) is timed; τ̄ is the sample's mean and histogram counts are scaled by it.
# (The thread's CPU clock would not count a CPU quota's throttled periods, but a read of it costs 0.6 µs
# and disturbs the timed call by another 0.2-0.5 µs, more than this runtime's cheapest operators take.)
TIMING_SAMPLE = 8
TIMING_MASK = TIMING_SAMPLE - 1
KEY_CACHE_MAX = 1 << 20
SCAN_ROWS = 512  # queued requests a migration scans between two pause points
REST_IDLE_S = 0.05  # the worker without work this long: its input paused, not a gap between two requests
REST_SHARE = 0.05  # of the wall clock, the most that putting state to rest costs on average
REST_BURST_S = 0.25  # of CPU time: how much packing one pause may do at once (a few 100k keys)
HIT_SAMPLE = 8  # one output in this many weighs the key groups on a keyed route that is all local
# Upper bounds (seconds) of the execution-time histogram buckets.
EXEC_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1, 1.0)


def _estimate(op: OpRuntime, t_exec: float, timed: int, n: int) -> float:
    """Execution time of `n` requests from the `timed` of them that took `t_exec`; when every timed one
    was stalled, the operator's mean so far."""
    if timed:
        return t_exec * n / timed
    return op.exec_time / op.processed * n if op.processed else 0.0


def _one_output(value):
    """A sink operator's function: the value reaching it is one value for the sink, whatever its type."""
    return (value,)


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


class RestBudget:
    """How much CPU time putting key groups to rest may take: a token bucket filled at REST_SHARE of the
    wall clock up to REST_BURST_S, so a job whose input stops and starts again and again (each pause
    repacking what the last burst changed) spends at most REST_SHARE of a core on it. Pure: the caller
    passes the clock."""

    def __init__(self, now: float, share: float = REST_SHARE, burst: float = REST_BURST_S):
        self.share, self.burst = share, burst
        self.level, self.at = burst, now

    def _fill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.share)
        self.at = now

    def allows(self, now: float) -> bool:
        self._fill(now)
        return self.level > 0

    def spend(self, cpu_s: float) -> None:
        self.level -= cpu_s

    def ready_at(self, now: float) -> float:
        """When `allows` becomes true again."""
        self._fill(now)
        return now if self.level > 0 else now + (1e-6 - self.level) / self.share


class OpRuntime:
    """One operator on this worker: its queue, state, routes and counters."""

    __slots__ = ("index", "name", "fn", "key_fn", "stateful", "is_async", "collect", "queue", "groups",
                 "instances", "routes", "successors", "processed", "exec_time", "errors", "edge_counts",
                 "dts", "hist", "collected", "key_cache", "busy", "exec_total", "group_hits",
                 "collected_rids", "cold", "rested", "batch", "key_is_value", "sink", "sink_wake", "sink_room")

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
        self.key_cache: dict = {}
        # Requests routed to each key group of this (stateful) operator by this worker, cumulative: the
        # planner sums them over the senders into the groups' weights (keygroups.assign_weighted).
        self.group_hits: list[int] = [0] * NUM_KEY_GROUPS if spec_op.stateful else []
        # Key groups that arrived by migration and were not touched since: group -> (msgpack blob of
        # {key: state}, its key count). Decoded on first use (`warm`), forwarded as they are if they move on,
        # so a migration costs the receiver O(key groups), not O(keys).
        self.cold: dict[int, tuple[bytes, int]] = {}
        # Key groups at rest: group -> its blob and key count while the group is unchanged (executing any
        # request of the group drops it), so moving or checkpointing the group packs nothing. Made in idle
        # time (`JobEngine.rest_one`) and by checkpoints; a cold group's blob rests on once it is decoded.
        self.rested: list[tuple[bytes, int] | None] = [None] * NUM_KEY_GROUPS if spec_op.stateful else []
        self.busy = False

    def group_of(self, key) -> int:
        g = self.key_cache.get(key)
        if g is None:
            g = key_group(key, NUM_KEY_GROUPS)
            if len(self.key_cache) < KEY_CACHE_MAX:
                self.key_cache[key] = g
        return g

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

    def set_state(self, key, new) -> None:
        """Store `new` for `key` (None deletes)."""
        g = self.group_of(key)
        self.rested[g] = None
        d = self.groups[g]
        if new is None:
            d.pop(key, None)
        else:
            d[key] = new


class JobEngine:
    """The state of one job on one worker; `run_round()` executes, the worker process does the I/O."""

    def __init__(self, job: int, spec: DagSpec, me: str, placement: Placement, p_max: int = 10,
                 max_errors_kept: int = 20):
        self.job = job
        self.spec = spec
        self.me = me
        self.p_max = p_max
        self.ops = [OpRuntime(o) for o in spec.operators]
        self.order = [self.ops[i] for i in spec.topological()]
        self.pending: dict[str, list] = {}  # destination worker -> rows of remote chained requests
        # What the keyed fast path batched (`_run_stateless`: a keyed successor whose key is the value), as
        # columns: destination -> {successor: [values, record ids, run lengths]}. For one operator, rows in
        # `pending` always came before these (`_settle_columns` turns them into rows wherever routes change),
        # so a flush sends rows first.
        self.pending_cols: dict[str, dict[int, list]] = {}
        # A batch this long ends the scheduling round after the operator that filled it, so the worker
        # flushes it then (the worker sets it from --max-batch): the cap holds per micro-batch, not per round.
        self.max_batch = 2000
        self.pending_since: float | None = None
        # Progress epoch -> {op index: requests produced minus finished here}, not reported yet.
        self.progress: dict[int, dict[int, int]] = {}
        self.local_requests = 0  # chained requests handed over in memory (R^l), cumulative
        self.remote_requests = 0  # chained requests batched for another worker (R^r), cumulative
        self.received_requests = 0  # chained requests that came from other workers, cumulative
        # A timed request longer than this (s) was stalled, not executing: under a CPU quota a throttled
        # period lands inside whichever request was running. The worker sets it from its quota.
        self.stall = math.inf
        self.failed = 0
        self.error_samples: deque = deque(maxlen=max_errors_kept)
        self.async_tasks: set[asyncio.Task] = set()
        self.on_work = lambda: None  # the worker's wake-up, called when async executions produce work
        # During a migration: op index -> key group -> requests held until the group's state arrives.
        self.held: dict[int, dict[int, list]] = {}
        self.held_since = 0.0  # when the groups in `held` began to wait (perf_counter)
        self.group_hold = 0.0  # the longest any key group waited in this migration (s)
        self.future: list[tuple[int, list]] = []  # rows of an epoch whose plan has not arrived yet
        # The migration in progress (clasp.core.migration.WorkerMigration) and what the worker keeps for it.
        self.migration = None
        self.migration_req = 0
        self.migration_t0 = 0.0
        self.migration_stats: dict = {}
        self.packed_on_move = 0  # key groups a migration had to pack (not at rest), cumulative
        self.dropped: list[dict] = []  # the state of key groups that moved away, freed in idle time
        self.early: list = []  # markers and migrate messages that overtook their plan
        self.queued_plans: list = []  # plans that arrived while one was still running
        # The remote-state baseline (paper Fig. 4): an object with `async get_many(job, op, keys) -> dict`
        # and `async put_many(job, op, {key: state or None})`; None keeps state in this worker.
        self.remote_state = None
        # Checkpoints (clasp.core.checkpoint, docs/RECOVERY.md): while a barrier is up, a synchronous
        # stateful operator runs on and keeps, per key group that a request at or above the boundary touched,
        # the group's image before that request (`shadows`: op index -> group -> msgpack blob, or the dict it
        # was decoded into to apply a later request below the boundary); an async stateful operator's
        # requests at or above the boundary wait in `barrier_held` instead. `floor`: rows of an epoch below it
        # belong to an era a recovery rolled back, and are dropped.
        self.shadows: dict[int, dict[int, bytes | dict]] = {}
        self.barrier: int | None = None
        self.barrier_held: dict[int, list] = {}
        # Stateful operators whose outputs are seen (they reach a sink, a collecting operator or another
        # stateful operator): their outputs must agree with the cut, so a barrier holds their requests above the
        # boundary (aligned, as Flink aligns) instead of copy on write, where a request below the boundary that
        # comes after one above it would emit from a state holding the later one, and a rollback would then
        # emit that value again.
        self.aligned = aligned_operators(spec)
        self.floor = 0
        self.placement = placement
        self.before: Placement | None = None  # the placement the migration in progress started from
        self.epoch = placement.epoch
        self.apply_placement(placement)

    # ----------------------------------------------------------------- placement and routing
    def apply_placement(self, placement: Placement) -> None:
        """Rebuild every route and instance count for a new placement; key groups still on their way
        here (`self.held`) route to the HOLD destination, which `take_batches` keeps back."""
        self._settle_columns()
        self.placement = placement
        self.epoch = placement.epoch
        for op in self.ops:
            op.instances = placement.operators[op.name].instances.get(self.me, 0)
            routes = []
            for s in op.successors:
                r = route_to(self.spec, placement, s, self.me, op.index)
                target = self.ops[s]
                if r.kind == ROUTE_LOCAL:
                    routes.append((ROUTE_LOCAL, s, self._appender(target), None, None, None))
                elif r.kind == ROUTE_TABLE and len(set(r.table)) == 1 and r.table[0] is not None:
                    routes.append((ROUTE_ONE_REMOTE, s, None, r.table, [0], r.table[0]))
                elif r.kind == ROUTE_TABLE:
                    routes.append((ROUTE_TABLE, s, self._appender(target), r.table, [0], None))
                else:
                    # interned: the keyed fast path tells destinations apart by identity
                    owners = [w if w is None else sys.intern(w) for w in r.owners]
                    for g in self.held.get(s, ()):
                        owners[g] = HOLD
                    # Every key group here: the key is all a request needs (no group lookup per request).
                    kind = KEYED_HERE if all(w is None for w in owners) else ROUTE_KEYED
                    routes.append((kind, s, self._appender(target), owners, target.key_cache, target))
            op.routes = routes

    def _settle_columns(self) -> None:
        """Turn the keyed fast path's columns into rows of `pending`, behind the rows there: routes are
        about to change, and what an operator sends from now on must queue after what it sent so far."""
        for d, by_succ in self.pending_cols.items():
            rows = self.pending.setdefault(d, [])
            for succ, (values, rids, counts) in by_succ.items():
                rows.extend(column_rows([succ, values, True, rids, counts]))
        self.pending_cols = {}

    def _appender(self, target: OpRuntime):
        """How requests join `target`'s queue: directly, or past the barrier's filter while one is up."""
        if self.barrier is None or target.index not in self.barrier_held:
            return target.queue.append
        boundary, append, held = self.barrier, target.queue.append, self.barrier_held[target.index]
        hold = held.append

        def admit(row):
            if row[3] >= boundary:
                hold(row)
            else:
                append(row)
        return admit

    # ----------------------------------------------------------------- checkpoints
    def begin_barrier(self, boundary: int) -> None:
        """Keep the state below `boundary` for the snapshot until `release_barrier` (nothing of the records
        at or above it is here yet: the planner dispatches them after this). A synchronous stateful operator
        runs on and keeps a key group's image before the first request at or above the boundary changes
        it (`_run_shadowed`); an async one's requests at or above the boundary are held out of its queue, and
        so are those of one whose outputs reach a sink, a collecting or another stateful operator (`aligned`)."""
        self.barrier = boundary
        # Operators whose outputs are seen (a sink, a collection, another stateful operator: `self.aligned`)
        # align: records below the boundary keep coming after the barrier (dispatched or read before it), and a
        # request above it that overtook one below at a key would emit from a state the checkpoint does not
        # hold (a running count's n). The others run on with copy on write.
        hold = {op.index for op in self.ops if op.stateful and (op.is_async or op.index in self.aligned)}
        self.shadows = {op.index: {} for op in self.ops if op.stateful and op.index not in hold}
        self.barrier_held = {i: [] for i in sorted(hold)}
        self.apply_placement(self.placement)

    def release_barrier(self) -> int:
        """The snapshot is taken: held requests join their queues in arrival order; returns how many."""
        if self.barrier is None:
            return 0
        held, self.barrier_held, self.barrier = self.barrier_held, {}, None
        self.shadows = {}
        n = 0
        for op_index, rows in held.items():
            self.ops[op_index].queue.extend(rows)
            n += len(rows)
        self.apply_placement(self.placement)
        return n

    def snapshot_groups(self):
        """(operator, group, key count, msgpack blob) for every non-empty key group this worker owns, one at
        a time, as it was below the barrier's boundary: the image kept of a group that a request above it
        changed, a cold or rested group's blob as it is, any other group packed (and so put to rest)."""
        me = self.me
        for op in self.ops:
            if not op.stateful:
                continue
            owners = self.placement.operators[op.name].key_groups
            shadow = self.shadows.get(op.index, {})
            for g, d in enumerate(op.groups):
                if owners[g] != me:
                    continue
                image = shadow.get(g)
                if image is not None:
                    if type(image) is dict:
                        image = (msgpack.packb(image, use_bin_type=True), len(image)) if image else None
                    if image is not None:
                        yield op.name, g, image[1], image[0]
                    continue
                blob = op.cold.get(g) or op.rested[g] or (op.rest(g) if d else None)
                if blob is not None:
                    yield op.name, g, blob[1], blob[0]

    def changed(self) -> bool:
        """Whether some key group here changed since it was last packed (`rest_one` has work)."""
        return self.remote_state is None and any(
            d and op.rested[g] is None for op in self.ops for g, d in enumerate(op.groups))

    def rest_one(self) -> bool:
        """Put one changed key group to rest; False when none is left. The worker calls it once its input has
        paused (REST_IDLE_S without work), within a RestBudget: a migration or checkpoint that follows then
        sends or writes the blobs as they are, O(key groups) instead of O(keys)."""
        if self.remote_state is not None:
            return False
        for op in self.ops:
            for g, d in enumerate(op.groups):
                if d and op.rested[g] is None:
                    op.rest(g)
                    return True
        return False

    def install_group(self, name: str, g: int, items: dict) -> None:
        self.op(name).install_items(g, items)

    def free_one(self) -> bool:
        """Free the state of one key group that moved away; False when none is left."""
        if not self.dropped:
            return False
        self.dropped.pop()
        return True

    def warm_one(self) -> bool:
        """Decode one key group that came by migration and has not been used yet; False when none is left.
        The worker calls it when it has nothing else to do, so the decoding is done in idle time and stateful
        rounds stop checking for cold groups soon after a migration."""
        for op in self.ops:
            if op.cold:
                op.warm(next(iter(op.cold)))
                return True
        return False

    def take_collected_below(self, boundary: int) -> dict[str, list]:
        """The collected outputs of records below `boundary`, taken out (the planner releases them)."""
        out = {}
        for op in self.ops:
            if not op.collect or not op.collected or op.sink:
                continue
            lo, keep, keep_r = [], [], []
            for o, r in zip(op.collected, op.collected_rids, strict=True):
                if r < boundary:
                    lo.append(o)
                else:
                    keep.append(o)
                    keep_r.append(r)
            if lo:
                out[op.name] = lo
                op.collected, op.collected_rids = keep, keep_r
        return out

    def queue_length(self) -> int:
        return (sum(len(op.queue) for op in self.ops) + sum(len(r) for h in self.held.values() for r in h.values())
                + sum(len(r) for r in self.barrier_held.values()))

    def holds_below(self, fence: int) -> bool:
        """Whether anything here still belongs to a record below `fence`: a queued, held, early or batched
        request, progress not yet reported, or an execution in progress. O(requests held), asked
        only while the planner looks for records lost with a dead worker."""
        if self.async_tasks or any(e << EPOCH_BITS < fence for e in self.progress):
            return True
        rows = [op.queue for op in self.ops]
        rows += [r for h in self.held.values() for r in h.values()]
        rows += [r for _, r in self.future]
        rows += list(self.pending.values())
        if any(rid < fence for by_succ in self.pending_cols.values() for c in by_succ.values() for rid in c[1]):
            return True
        return any(r[3] < fence for part in rows for r in part)

    def idle(self) -> bool:
        return (not self.async_tasks and not self.held and not self.future and not self.pending
                and not self.pending_cols and all(not op.queue for op in self.ops)
                and not any(self.barrier_held.values()))

    # ----------------------------------------------------------------- input
    def enqueue_rows(self, rows: list) -> None:
        """Append validated rows [op, value, key, rid] to their operators' queues."""
        ops = self.ops
        if self.barrier_held:
            boundary, held = self.barrier, self.barrier_held
            for r in rows:
                if r[3] >= boundary and r[0] in held:
                    held[r[0]].append(r)
                else:
                    ops[r[0]].queue.append(r)
            return
        for r in rows:
            ops[r[0]].queue.append(r)

    def receive_runs(self, epoch: int, runs: list) -> int:
        """Validated runs [op, first rid, values] from the planner; returns the requests. In the
        steady state (no barrier, no migration, the current epoch) each run joins its operator's queue in
        one `extend` of rows built in C; otherwise row by row, as `receive`."""
        if self.barrier_held or self.held or epoch != self.epoch:
            rows = expand_runs(runs)
            self.receive(epoch, rows)
            return len(rows)
        ops, n = self.ops, 0
        for op, first, values in runs:
            ops[op].queue.extend(expand_run(op, first, values))
            n += len(values)
        return n

    def admit_source(self, op_index: int, values: list, first: int) -> dict[int, dict[int, int]]:
        """A batch a source reader here read, records `first ..`: handed to the source operator's successors
        as its outputs (the source operator is a pass-through: no call per record), by their routes. Returns
        the requests made per epoch and successor, which the reader's seal carries to the planner (they
        are not counted in `progress`, so the epoch cannot complete before the seal arrives)."""
        op = self.ops[op_index]
        saved, self.progress = self.progress, {}
        n = len(values)
        try:
            if all(r[0] == ROUTE_LOCAL and r[2] == self.ops[r[1]].queue.append for r in op.routes):
                # Every successor's share here, no barrier filter: each queue extended once, rows built in C.
                for j, (_, succ, _, _, _, _) in enumerate(op.routes):
                    self.ops[succ].queue.extend(zip(repeat(succ), values, repeat(None), range(first, first + n)))
                    op.edge_counts[j] += n
                    rid = first
                    while rid < first + n:
                        e = rid >> EPOCH_BITS
                        stop = min(first + n, (e + 1) << EPOCH_BITS)
                        self._count(e, succ, stop - rid)
                        rid = stop
                self.local_requests += n * len(op.routes)
            else:
                send = self._send
                for i, v in enumerate(values):
                    send(op, (v,), first + i)
        finally:
            made, self.progress = self.progress, saved
        op.processed += n
        return made

    def receive(self, epoch: int, rows: list) -> None:
        """Rows from the network, sent under `epoch`: queued, held for a key group on its way here, kept
        until our plan for `epoch` arrives, or forwarded to the owner of a newer epoch."""
        if epoch > self.epoch:
            self.future.append((epoch, rows))  # the sender switched before our plan arrived
        elif self.held or epoch < self.epoch:
            self._place(rows, forward=epoch < self.epoch)
        else:
            self.enqueue_rows(rows)

    def receive_columns(self, epoch: int, groups: list) -> None:
        """A `cols` message's validated groups (clasp.core.protocol.columns): straight onto their operators'
        queues in steady state (one extend per group, the rows built without a loop in Python), row by
        row through `receive` during a migration or a barrier."""
        if epoch == self.epoch and not self.held and not self.barrier_held:
            ops = self.ops
            for g in groups:
                op = ops[g[0]]
                if g[2] is True and op.stateful:  # keys are the values: the columns join as a block
                    rids = g[3] if g[4] is None else list(chain.from_iterable(map(repeat, g[3], g[4])))
                    op.queue.append_block(g[0], g[1], rids)
                else:
                    op.queue.extend(column_rows(g))
        else:
            self.receive(epoch, expand_columns(groups))

    def _place(self, rows, forward: bool) -> None:
        """Row by row (only during or just after a migration): hold, forward or queue."""
        held, ops = self.held, self.ops
        for r in rows:
            op = ops[r[0]]
            h = held.get(op.index)
            if h is not None:
                waiting = h.get(op.group_of(r[2]))
                if waiting is not None:
                    waiting.append(r)
                    continue
            d = self._owner(op, r, self.placement) if forward else None
            if d is not None and self._extracting_later(op, r):
                d = None
            if d is None:
                if op.index in self.barrier_held and r[3] >= self.barrier:
                    self.barrier_held[op.index].append(r)
                else:
                    op.queue.append(r)
            else:
                self.pending.setdefault(d, []).append(r)
                if self.pending_since is None:
                    self.pending_since = perf_counter()

    def _extracting_later(self, op: OpRuntime, row) -> bool:
        """An old-epoch row for something this worker is giving away but has not taken out yet: it queues
        here and leaves with the group, behind the rows queued before it. Forwarded at once, it could
        reach the new owner after rows of the new epoch that the new owner holds for the same key."""
        mig = self.migration
        return (self.before is not None and mig is not None and not mig.sent
                and self._owner(op, row, self.before) is None)

    def _owner(self, op: OpRuntime, row, placement: Placement) -> str | None:
        """The worker that should run `row` under `placement`; None when it is this one (a stateless
        operator's requests all have one owner: `row` may be None)."""
        p = placement.operators[op.name]
        if op.stateful:
            w = p.key_groups[op.group_of(row[2])]
        elif p.shares.get(self.me, 0.0) > 0:
            return None
        else:
            w = min(p.workers(), key=lambda x: (-p.shares[x], x))
        return None if w == self.me else w

    # ----------------------------------------------------------------- migration
    def begin_migration(self, placement: Placement, incoming: dict[int, set[int]]) -> None:
        """Switch to the new epoch's routing. Requests for the key groups in `incoming` (op index -> groups
        whose state is on its way here) are held, in arrival order, until `release_groups`; the rest run on."""
        self.held = {op: {g: [] for g in groups} for op, groups in incoming.items() if groups}
        self.held_since, self.group_hold = perf_counter(), 0.0
        self.before = self.placement
        self.apply_placement(placement)
        future, self.future = self.future, []
        for epoch, rows in future:
            self.receive(epoch, rows)

    def release_groups(self, groups: dict[int, list[int]]) -> None:
        """The state of these key groups is installed: their held requests join the queues after what
        came with the state. When nothing is held any more, routing stops holding."""
        self._hold_local()
        for op_index, gs in groups.items():
            h = self.held.get(op_index)
            if h is None:
                continue
            queue = self.ops[op_index].queue
            for g in gs:
                rows = h.pop(g, None)
                if rows is not None:
                    queue.extend(rows)
                    self.group_hold = max(self.group_hold, perf_counter() - self.held_since)
            if not h:
                del self.held[op_index]
        if not self.held:
            self.apply_placement(self.placement)

    def _hold_local(self) -> None:
        """Requests this worker routed to a held group itself join that group's held rows."""
        rows = self.pending.pop(HOLD, None)
        if rows:
            self._place(rows, forward=False)

    def extract(self):
        """Take out every state object and queued request this worker no longer owns, group by group.

        Yields (destination, unit, None) with unit = [op index, key group, msgpack blob of {key: state},
        its key count, rows of that group] (a group at rest as its blob, any other serialized as it is taken),
        then (destination, None, rows) for the requests of stateless operators handed over; and, while the
        queues are scanned (first), pause points (None, None, None). The caller may yield to the event loop
        at any of them: during the scan nothing of this job runs, and after it no request of a group being
        taken out can run here any more (they are out of the queues, and markers guarantee no more come)."""
        placement, me = self.placement, self.me
        loose: dict[str, list] = {}
        pending_units = []
        # A backlog of many thousand requests is scanned in pieces, a pause point (None, None, None) after
        # each SCAN_ROWS, where the caller may turn the event loop: nothing of this job runs meanwhile (every
        # operator is busy), requests arriving join the queues after what the scan keeps.
        for op in self.ops:
            op.busy = True
        try:
            for op in self.ops:
                p = placement.operators[op.name]
                rows_of: dict[int, list] = {}
                if op.queue:
                    rows = list(op.queue)
                    op.queue.clear()
                    if op.stateful:
                        keep = []
                        owners, group_of = p.key_groups, op.group_of
                        for i, r in enumerate(rows, 1):
                            g = group_of(r[2])
                            if owners[g] == me:
                                keep.append(r)
                            else:
                                rows_of.setdefault(g, []).append(r)
                            if not i % SCAN_ROWS:
                                yield None, None, None
                    else:
                        d = self._owner(op, None, placement)
                        keep = rows if d is None else []
                        if d is not None:
                            loose.setdefault(d, []).extend(rows)
                    op.queue.extendleft(reversed(keep))
                    # The moved requests are then held by their units alone, so each is freed once its slice is
                    # sent rather than all of them at the end of the scan's frame (O(requests) in one step).
                    rows = keep = None
                if op.stateful:
                    for g, d in enumerate(p.key_groups):
                        if d != me and (op.groups[g] or g in op.cold or g in rows_of):
                            pending_units.append((d, op, g, rows_of.get(g, [])))
        finally:
            for op in self.ops:
                op.busy = False
        rows_of = None
        pending_units.reverse()
        while pending_units:  # popped, so a unit's requests are the caller's alone once it is yielded
            d, op, g, rows = pending_units.pop()
            if op.rested[g] is None and g not in op.cold:
                self.packed_on_move += 1
            blob, n = op.take_group(g, self.dropped)
            unit, rows = [op.index, g, blob, n, rows], None
            yield d, unit, None
        for d, rows in loose.items():
            yield d, None, rows

    def install(self, units: list, rows: list) -> int:
        """Take over key groups (state, then their queued requests) and handed-over requests from a peer;
        returns the number of state objects installed. The state stays serialized until first used."""
        n = 0
        for op_index, g, blob, keys, group_rows in units:
            op = self.ops[op_index]
            if keys:
                if g in op.cold or op.groups[g]:  # state of this group here already: merge now
                    if g in op.cold:
                        op.warm(g)
                    op.install_items(g, unpack_group(blob))
                else:
                    op.cold[g] = (blob, keys)
            op.queue.extend(group_rows)
            n += keys
        self.enqueue_rows(rows)
        return n

    # ----------------------------------------------------------------- execution
    def run_round(self) -> int:
        """One scheduling round, about ROUND_TIME_US of work: passes over the operators with work, each
        running its instances' share of the round per pass, until the round's work is done or none is left
        (work-conserving: an operator whose share is idle leaves it to the others)."""
        done = 0
        spent = 0.0
        # The worker's slots, not only those with work now: an operator handed work during this pass by
        # its predecessor runs in it too, with the same share.
        slots = sum(op.instances for op in self.order if op.instances > 0) or 1
        while True:
            ran = 0
            for op in self.order:
                if op.queue and not op.busy:
                    cost = (op.exec_time / op.processed * 1e6 if op.processed else 10.0) + REQUEST_OVERHEAD_US
                    budget = max(MIN_BATCH, int(max(1, op.instances) / slots * ROUND_TIME_US / cost))
                    if op.is_async:
                        n = self._start_async(op, budget)
                    elif op.stateful and self.remote_state is not None:
                        n = self._start_remote(op, budget)
                    elif op.stateful:
                        n = self._run_stateful(op, budget)
                    elif op.batch:
                        n = self._run_batch(op, budget)
                    else:
                        n = self._run_stateless(op, budget)
                    ran += n
                    spent += n * cost
                    if self.batch_full():
                        return done + ran
            done += ran
            if not ran or spent >= ROUND_TIME_US:
                return done

    def _count(self, e: int, op_index: int, k: int) -> None:
        """Add `k` to this worker's progress count of operator `op_index` in progress epoch `e`."""
        d = self.progress.get(e)
        if d is None:
            d = self.progress[e] = {}
        d[op_index] = d.get(op_index, 0) + k

    def _ran(self, e: int, op_index: int, used: int, succ: int, made: int) -> None:
        """A run of `used` requests of one epoch finished at `op_index`, having handed `made` to `succ`."""
        self._count(e, op_index, -used)
        if made:
            self._count(e, succ, made)

    def _fail(self, op: OpRuntime, exc: BaseException, value) -> None:
        op.errors += 1
        self.failed += 1
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.error_samples.append({"operator": op.name, "error": text[:300], "value": repr(value)[:200]})

    def _run_stateless(self, op: OpRuntime, budget: int) -> int:
        q = op.queue
        n = min(budget, len(q))
        fn = op.fn
        pc = perf_counter
        dts = op.dts
        dts_append = dts.append
        routes = op.routes
        one, items = ONE_EXACT, ITEMS_EXACT
        fast = routes[0][2] if len(routes) == 1 and routes[0][0] == ROUTE_LOCAL else None
        # One remote holder of the only successor: its batch takes the requests as a local queue would (the
        # general path's divmod, table and dict lookups per request cost more than the append).
        remote_to = routes[0][5] if len(routes) == 1 and routes[0][0] == ROUTE_ONE_REMOTE else None
        if remote_to is not None:
            batch = self.pending.get(remote_to)
            if batch is None:
                batch = self.pending[remote_to] = []
            fast = batch.append
        succ0 = routes[0][1] if routes else -1
        # One keyed successor whose every key group is here and whose key is the value (Word Count on one
        # worker): a line's words extend the round's block of its queue (values and record ids, in C); the
        # group weights from the sampled requests' outputs. Not while a checkpoint barrier holds what would
        # join its queue.
        here = keyed = None
        if (fast is None and len(routes) == 1 and routes[0][0] == KEYED_HERE and routes[0][5].key_is_value
                and routes[0][5].index not in self.barrier_held):
            target = routes[0][5]
            block_values, block_rids = [], []
            here, here_rids = block_values.extend, block_rids.extend
            hits, group_of = target.group_hits, target.group_of
        # One keyed successor spread over workers, its key the value (Word Count on several): a line's
        # words are routed by key group in passes over the line in C (map, compress), the local ones
        # extend the round's block of the successor's queue, the remote ones the destination's columns.
        elif (fast is None and len(routes) == 1 and routes[0][0] == ROUTE_KEYED and routes[0][5].key_is_value
              and not self.held and routes[0][5].index not in self.barrier_held):
            target = routes[0][5]
            block_values, block_rids = [], []
            keyed, keyed_rids = block_values.extend, block_rids.extend
            owners, hits, group_of = routes[0][3], target.group_hits, target.group_of
            cache_get, owner_of, cols = target.key_cache.get, owners.__getitem__, self.pending_cols
            remote_made = 0
        me = op.index
        collect = op.add_collected if op.collect else None
        t_exec = 0.0
        timed = 0
        stall = self.stall
        emitted = 0  # children handed over by the fast paths; the general path counts in _send
        cur, used, made = -1, 0, 0  # the progress epoch of the run being counted, its requests, their children
        i = -1
        for _, value, _k, rid in q.take_rows(n):
            i += 1
            ep = rid >> EPOCH_BITS
            if ep != cur:
                if used:
                    self._ran(cur, me, used, succ0, made)
                cur, used, made = ep, 0, 0
            used += 1
            if i & TIMING_MASK:
                try:
                    out = fn(value)
                except Exception as e:
                    self._fail(op, e, value)
                    continue
            else:  # one request in TIMING_SAMPLE is timed: τ̄ and the histogram come from the sample
                t0 = pc()
                try:
                    out = fn(value)
                except Exception as e:
                    self._fail(op, e, value)
                    continue
                dt = pc() - t0
                if dt < stall:
                    t_exec += dt
                    timed += 1
                    dts_append(dt)
            if out is None:
                continue
            # clasp.core.outputs' rule: its exact-type fast path inline (no call for the common returns),
            # the rest by the shared function.
            cls = type(out)  # not __class__, which a proxy can fake: the same test as as_outputs
            if cls is list or cls is tuple:
                outs = out
            elif cls in one:
                outs = (out,)
            else:
                try:
                    outs = list(out) if cls in items else as_outputs(out)
                except Exception as e:  # a generator's body raised: the request fails
                    self._fail(op, e, value)
                    continue
            if collect is not None:
                collect(outs, rid)
            if fast is not None:
                k = len(outs)
                if k == 1:
                    fast((succ0, outs[0], None, rid))
                else:
                    for o in outs:
                        fast((succ0, o, None, rid))
                made += k
                emitted += k
                continue
            if keyed is not None:
                try:
                    gs = list(map(cache_get, outs))
                    if None in gs:
                        gs = list(map(group_of, outs))
                except Exception:  # a value that cannot be a key: the general path reports it
                    self._send(op, outs, rid)
                    continue
                k = len(outs)
                ds = list(map(owner_of, gs))
                if not i & TIMING_MASK:  # the timed request's outputs weigh the groups for all of them
                    for g in gs:
                        hits[g] += TIMING_SAMPLE
                for d in set(ds):
                    words = outs if len(ds) == ds.count(d) else list(compress(outs, map(is_, ds, repeat(d))))
                    m = len(words)
                    if d is None:
                        keyed(words)
                        keyed_rids(repeat(rid, m))
                        continue
                    by_succ = cols.get(d)
                    if by_succ is None:
                        by_succ = cols[d] = {}
                    c = by_succ.get(succ0)
                    if c is None:
                        c = by_succ[succ0] = [[], [], []]
                    c[0].extend(words)
                    c[1].append(rid)
                    c[2].append(m)
                    remote_made += m
                made += k
                emitted += k
                continue
            if here is not None:
                k = len(outs)
                here(outs)
                here_rids(repeat(rid, k))
                if not i & TIMING_MASK:  # the timed request's outputs weigh the groups for all of them
                    for o in outs:
                        hits[group_of(o)] += TIMING_SAMPLE
                made += k
                emitted += k
                continue
            if routes:
                self._send(op, outs, rid)
        if used:
            self._ran(cur, me, used, succ0, made)
        op.exec_time += _estimate(op, t_exec, timed, n)
        op.processed += n
        if here is not None or keyed is not None:
            target.queue.append_block(succ0, block_values, block_rids)
        if keyed is not None:
            if remote_made and self.pending_since is None:
                self.pending_since = perf_counter()
            self.remote_requests += remote_made
            self.local_requests += emitted - remote_made
            op.edge_counts[0] += emitted
        elif remote_to is not None:
            if emitted:
                if self.pending_since is None:
                    self.pending_since = perf_counter()
            elif not batch:
                del self.pending[remote_to]  # never an empty batch: a flush sends every one
            self.remote_requests += emitted
            op.edge_counts[0] += emitted
        elif emitted:
            self.local_requests += emitted
            op.edge_counts[0] += emitted
        if len(dts) > 20_000:
            self._fold_histogram(op)
        return n

    def _run_stateful(self, op: OpRuntime, budget: int) -> int:
        q = op.queue
        n = min(budget, len(q))
        if op.cold:
            op.warm_rows(q, n)
        if self.shadows and op.index in self.shadows:
            return self._run_shadowed(op, q.take_rows(n))
        for part in q.take(n):
            self._apply(op, part if type(part) is list else part.rows(), len(part))
        return n

    def _run_shadowed(self, op: OpRuntime, rows: list) -> int:
        """`rows` of a stateful operator while a checkpoint barrier is up (copy on write): before the first
        request at or above the boundary changes a key group, the group's image is kept for the snapshot (a
        group at rest: its blob, no copy); a request below the boundary that comes after it is applied to
        the image as well (its outputs come once, from the live state). The rows run as they came, in runs
        between two such points."""
        boundary, shadow, group_of, fn = self.barrier, self.shadows[op.index], op.group_of, op.fn
        # The two common cases need no look per request: nothing above the boundary came yet, or only
        # requests above it come and every group here has its image.
        rids = [r[3] for r in rows]
        if rids and (max(rids) < boundary if not shadow else min(rids) >= boundary and all(
                g in shadow for g, w in enumerate(self.placement.operators[op.name].key_groups) if w == self.me)):
            self._apply(op, rows, len(rows))
            return len(rows)
        start = 0
        for i, (_, value, key, rid) in enumerate(rows):
            g = group_of(key)
            image = shadow.get(g)
            if rid >= boundary:
                if image is None:
                    if i > start:
                        self._apply(op, rows[start:i], i - start)
                        start = i
                    shadow[g] = op.rested[g] or (op.rest(g) if op.groups[g] else {})
            elif image is not None:
                if type(image) is not dict:
                    image = shadow[g] = unpack_group(image[0])
                try:
                    new, _ = fn(image.get(key), value)
                except Exception:  # the live call reports the request's failure
                    continue
                if new is None:
                    image.pop(key, None)
                else:
                    image[key] = new
        if start < len(rows):
            self._apply(op, rows[start:], len(rows) - start)
        return len(rows)

    def _apply(self, op: OpRuntime, rows, n: int) -> int:
        """Run the `n` requests `rows` (an iterable of rows) of a stateful operator on its live state."""
        fn = op.fn
        pc = perf_counter
        dts_append = op.dts.append
        groups = op.groups
        cached = op.key_cache.get
        group_of = op.group_of
        routes = op.routes
        me = op.index
        collect = op.add_collected if op.collect else None
        one, items = ONE_EXACT, ITEMS_EXACT
        t_exec = 0.0
        timed = 0
        stall = self.stall
        cur, used = -1, 0  # the progress epoch of the run being counted, and its requests
        rested = op.rested
        i = -1
        for _, value, key, rid in rows:
            i += 1
            ep = rid >> EPOCH_BITS
            if ep != cur:
                if used:
                    self._ran(cur, me, used, me, 0)
                cur, used = ep, 0
            used += 1
            g = cached(key)
            if g is None:
                g = group_of(key)
            state = groups[g]
            rested[g] = None  # before fn runs: it may change `old` in place, even when it then raises
            old = state.get(key)
            if i & TIMING_MASK:
                try:
                    new, out = fn(old, value)
                except Exception as e:
                    self._fail(op, e, value)
                    continue
            else:
                t0 = pc()
                try:
                    new, out = fn(old, value)
                except Exception as e:
                    self._fail(op, e, value)
                    continue
                dt = pc() - t0
                if dt < stall:
                    t_exec += dt
                    timed += 1
                    dts_append(dt)
            if new is not None:
                state[key] = new
            elif old is not None:
                del state[key]
            if out is None or not routes and collect is None:
                continue
            cls = type(out)  # as in _run_stateless: clasp.core.outputs' fast path inline
            if cls is list or cls is tuple:
                outs = out
            elif cls in one:
                outs = (out,)
            else:
                try:
                    outs = list(out) if cls in items else as_outputs(out)
                except Exception as e:  # a generator's body raised: the request fails, the loop goes on
                    self._fail(op, e, value)
                    continue
            if collect is not None:
                collect(outs, rid)
            if routes and outs:
                self._send(op, outs, rid)
        if used:
            self._ran(cur, me, used, me, 0)
        op.exec_time += _estimate(op, t_exec, timed, n)
        op.processed += n
        if len(op.dts) > 20_000:
            self._fold_histogram(op)
        return n

    def _run_batch(self, op: OpRuntime, budget: int) -> int:
        """A `batch=True` operator: `fn` once per run of requests of one progress epoch, on their values;
        the outputs go out as the children of the run's last record (one epoch, so one chunk: checkpoints
        and progress see them where the run's records are)."""
        q = op.queue
        n = min(budget, len(q))
        rows = q.take_rows(n)
        me = op.index
        start = 0
        t0 = perf_counter()
        while start < n:
            e = rows[start][3] >> EPOCH_BITS
            end = start + 1
            while end < n and rows[end][3] >> EPOCH_BITS == e:
                end += 1
            values = [r[1] for r in rows[start:end]]
            rid = rows[end - 1][3]
            try:
                outs = as_outputs(op.fn(values))
            except Exception as exc:
                self._fail(op, exc, values[:3])
                outs = ()
            self._ran(e, me, end - start, me, 0)
            if outs:
                if op.collect:
                    op.add_collected(outs, rid)
                if op.routes:
                    self._send(op, outs, rid)
            start = end
        dt = perf_counter() - t0
        op.exec_time += dt
        if n:  # the histogram's samples stand for TIMING_SAMPLE requests each: one per TIMING_SAMPLE run here
            op.dts.extend([dt / n] * max(1, n // TIMING_SAMPLE))
        op.processed += n
        return n

    def _send(self, op: OpRuntime, outs, rid: int) -> int:
        """Hand every output to every successor by its route, and count them in the progress of `rid`'s
        epoch; returns how many requests were made."""
        local = remote = 0
        pending = self.pending
        made = []
        for j, (kind, succ, append, table, aux, target) in enumerate(op.routes):
            k = len(outs)
            if kind == ROUTE_LOCAL:
                for o in outs:
                    append((succ, o, None, rid))
                local += k
            elif kind == ROUTE_ONE_REMOTE:
                batch = pending.get(target)
                if batch is None:
                    batch = pending[target] = []
                for o in outs:
                    batch.append((succ, o, None, rid))
                remote += k
            elif kind == ROUTE_TABLE:
                n = len(table)
                for o in outs:
                    i = aux[0]
                    aux[0] = i + 1
                    d = table[i % n]
                    if d is None:
                        append((succ, o, None, rid))
                        local += 1
                    else:
                        batch = pending.get(d)
                        if batch is None:
                            batch = pending[d] = []
                        batch.append((succ, o, None, rid))
                        remote += 1
            elif kind == KEYED_HERE:
                key_fn = target.key_fn
                if target.key_is_value:
                    for o in outs:
                        append((succ, o, o, rid))
                    local += k
                else:
                    for o in outs:
                        try:
                            key = key_fn(o)
                        except Exception as e:
                            self._fail(target, OperatorError(f"key function of {target.name!r} failed: {e!r}"), o)
                            k -= 1
                            continue
                        append((succ, o, key, rid))
                        local += 1
                # Every group is here, so none is computed to route: weigh the groups from a sample.
                hits = target.group_hits
                for o in outs[::HIT_SAMPLE]:
                    try:
                        hits[target.group_of(key_fn(o))] += HIT_SAMPLE
                    except Exception:  # the key function's failure was reported above, once
                        continue
            else:
                key_fn = target.key_fn
                ident = target.key_is_value
                hits = target.group_hits
                for o in outs:
                    try:
                        key = o if ident else key_fn(o)
                        g = aux.get(key)
                        if g is None:
                            g = key_group(key, NUM_KEY_GROUPS)
                            if len(aux) < KEY_CACHE_MAX:
                                aux[key] = g
                    except Exception as e:
                        self._fail(target, OperatorError(f"key function of {target.name!r} failed: {e!r}"), o)
                        k -= 1
                        continue
                    hits[g] += 1
                    d = table[g]
                    if d is None:
                        append((succ, o, key, rid))
                        local += 1
                    else:
                        batch = pending.get(d)
                        if batch is None:  # not setdefault: it would build a list per request
                            batch = pending[d] = []
                        batch.append((succ, o, key, rid))
                        remote += 1
            op.edge_counts[j] += len(outs)
            made.append((succ, k))
        e = rid >> EPOCH_BITS
        for succ, k in made:
            if k:
                self._count(e, succ, k)
        if remote and self.pending_since is None:
            self.pending_since = perf_counter()
        self.local_requests += local
        self.remote_requests += remote
        return local + remote

    # ----------------------------------------------------------------- async operators
    def _start_async(self, op: OpRuntime, budget: int) -> int:
        """Run up to `instances` requests of an async operator concurrently, one per distinct key."""
        batch = []
        keys = set()
        q = op.queue
        limit = min(budget, max(1, op.instances))
        if op.cold:
            op.warm_rows(q, limit)
        while q and len(batch) < limit:
            key = q[0][2]
            if op.stateful and key in keys:
                break  # a second request for a key waits, so per-key order holds
            keys.add(key)
            batch.append(q.popleft())
        return self._launch(op, self._run_async(op, batch), len(batch))

    def _launch(self, op: OpRuntime, coro, n: int) -> int:
        """Run one batch of `op` as a task; the operator is busy (no second batch) until it ends."""
        op.busy = True
        task = asyncio.ensure_future(coro)
        self.async_tasks.add(task)
        task.add_done_callback(self.async_tasks.discard)
        return n

    async def _run_async(self, op: OpRuntime, batch: list) -> None:
        async def one(row):
            _, value, key, rid = row
            t0 = perf_counter()
            try:
                if op.stateful:
                    op.rested[op.group_of(key)] = None  # as in _run_stateful: `old` may change in place
                    new, out = await op.fn(op.get(key), value)
                    op.set_state(key, new)
                else:
                    out = await op.fn(value)
                outs = as_outputs(out)
            except Exception as e:
                op.exec_time += perf_counter() - t0
                self._fail(op, e, value)
                self._count(rid >> EPOCH_BITS, op.index, -1)
                return
            dt = perf_counter() - t0
            op.exec_time += dt
            op.dts.append(dt)
            if op.collect:
                op.add_collected(outs, rid)
            # Its children and its own end in the same report (no await in between).
            if op.routes and outs:
                self._send(op, outs, rid)
            self._count(rid >> EPOCH_BITS, op.index, -1)

        try:
            await asyncio.gather(*(one(r) for r in batch))
        finally:
            op.processed += len(batch)
            op.busy = False
            self.on_work()

    # ----------------------------------------------------------------- remote state (baseline)
    def _start_remote(self, op: OpRuntime, budget: int) -> int:
        """Run a micro-batch of a stateful operator against the remote state server: one read of its
        keys, the requests in order, one write back. One batch per operator at a time, so per-key order
        holds (a key group still has one owner worker, which alone touches its keys)."""
        q = op.queue
        batch = [q.popleft() for _ in range(min(budget, len(q)))]
        return self._launch(op, self._run_remote(op, batch), len(batch))

    async def _run_remote(self, op: OpRuntime, batch: list) -> None:
        try:
            keys = list(dict.fromkeys(r[2] for r in batch))
            try:
                states = await self.remote_state.get_many(self.job, op.name, keys)
            except Exception as e:  # nothing ran yet: every request of the batch fails, the worker goes on
                for _, value, _key, rid in batch:
                    self._fail(op, e, value)
                    self._count(rid >> EPOCH_BITS, op.index, -1)
                return
            t0 = perf_counter()
            emits = []
            for _, value, key, rid in batch:
                try:
                    new, out = op.fn(states.get(key), value)
                    outs = as_outputs(out)
                except Exception as e:
                    self._fail(op, e, value)
                    outs = ()
                else:
                    states[key] = new
                    if op.collect:
                        op.add_collected(outs, rid)
                emits.append((outs, rid))
            op.exec_time += perf_counter() - t0
            try:
                await self.remote_state.put_many(self.job, op.name, {k: states.get(k) for k in keys})
            except Exception as e:  # the outputs still go out; the lost write is an error to report
                op.errors += 1
                self.error_samples.append({"operator": op.name, "error": f"remote state write failed: {e!r}"[:300],
                                           "value": f"{len(keys)} keys"})
            # Outputs and progress only after the write: a record is never complete before the state server
            # holds what its requests wrote.
            for outs, rid in emits:
                if op.routes and outs:
                    self._send(op, outs, rid)
                self._count(rid >> EPOCH_BITS, op.index, -1)
        finally:
            op.processed += len(batch)
            op.busy = False
            self.on_work()

    # ----------------------------------------------------------------- flushing and metrics
    def batch_full(self) -> bool:
        """Whether some destination's batch reached `max_batch` requests (the worker flushes it then)."""
        m = self.max_batch
        return (any(len(r) >= m for r in self.pending.values())
                or any(len(c[0]) >= m for by_succ in self.pending_cols.values() for c in by_succ.values()))

    def take_batches(self) -> dict[str, tuple[list, int]]:
        """The remote batches to send now: destination -> (the groups of its `cols` message, requests);
        resets the flush timer."""
        self._hold_local()
        out: dict[str, tuple[list, int]] = {}
        for d, rows in self.pending.items():
            if rows:
                out[d] = (columns(rows), len(rows))
        for d, by_succ in self.pending_cols.items():
            groups, n = out.get(d, ([], 0))
            for succ, (values, rids, counts) in by_succ.items():
                groups.append([succ, values, True, rids, counts])
                n += len(values)
            out[d] = (groups, n)
        self.pending, self.pending_cols, self.pending_since = {}, {}, None
        return out

    def take_progress(self) -> dict[int, dict[int, int]]:
        """The progress counts gathered since the last call (the worker reports them in one message)."""
        p, self.progress = self.progress, {}
        return p

    def _fold_histogram(self, op: OpRuntime) -> None:
        import numpy as np

        if op.dts:
            idx = np.searchsorted(np.asarray(EXEC_BUCKETS), np.asarray(op.dts), side="left")
            counts = np.bincount(idx, minlength=len(EXEC_BUCKETS) + 1) * TIMING_SAMPLE
            for i, c in enumerate(counts.tolist()):
                op.hist[i] += c
            op.exec_total += float(np.sum(op.dts)) * TIMING_SAMPLE
            op.dts.clear()

    def fold_histograms(self) -> None:
        for op in self.ops:
            self._fold_histogram(op)

    def counters(self) -> dict:
        """Cumulative counts, exact at the moment of asking (heartbeat samples are up to 1 s old)."""
        return {"operators": {op.name: {"processed": op.processed, "exec_s": op.exec_time, "errors": op.errors,
                                        "queue": len(op.queue), "keys": op.keys(),
                                        "edges": dict(zip((self.ops[s].name for s in op.successors),
                                                          op.edge_counts, strict=True))}
                              for op in self.ops},
                "local": self.local_requests, "remote": self.remote_requests, "failed": self.failed,
                "queue": self.queue_length(), "idle": self.idle()}

    # ----------------------------------------------------------------- state server
    def state_dump(self, name: str) -> dict:
        """The keyed state of operator `name` held here, checked to be msgpack-serializable."""
        op = self.op(name)
        if not op.stateful:
            raise OperatorError(f"operator {name!r} is stateless: it has no state")
        state = op.state_dict()
        check_serializable(op.name, state)
        return state

    def op(self, name: str) -> OpRuntime:
        for op in self.ops:
            if op.name == name:
                return op
        raise OperatorError(f"job {self.job} has no operator {name!r}")


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
