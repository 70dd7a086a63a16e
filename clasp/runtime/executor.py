"""The executor pool of one job's engine: scheduling rounds over the operators with work, each running its
share of the round as a tight loop (synchronous, batch, shadowed under a checkpoint's barrier, async as tasks,
or against the remote-state server), every output handed to its successor's route, and the progress counts.

Termination detection is epoch progress (`clasp.core.tracking`): the executor counts, per progress epoch
(`rid >> EPOCH_BITS`) and operator, the requests it finished (-1) and the chained requests they produced
(+1 at the successor), a run of one epoch at a time, and the worker reports the counts it gathered in
one message per flush. No per-request message, no per-record bookkeeping.
"""

from __future__ import annotations

import asyncio
import math
import traceback
from collections import deque
from itertools import chain
from operator import itemgetter
from time import perf_counter

from clasp.core.outputs import ITEMS_EXACT, ONE_EXACT, as_outputs
from clasp.core.routing import ROUTE_LOCAL, ROUTE_TABLE
from clasp.core.tracking import EPOCH_BITS, epochs_of_runs
from clasp.runtime.barrier import Barrier
from clasp.runtime.batches import apply_block, estimate, gather_outputs, group_bytes, map_outputs, timed_batch
from clasp.runtime.operators import TIMING_SAMPLE, OperatorError, OpRuntime
from clasp.runtime.outbox import KEYED_HERE, ROUTE_ONE_REMOTE, Outbox
from clasp.runtime.timed_batches import apply_timed, collect_pass, map_keyed, map_local
from clasp.runtime.worker_migration import Handover

# A scheduling round is about ROUND_TIME_US of work, shared by the worker's operators in proportion to
# their executor instances and sized from each one's mean execution time plus the runtime's own per-request
# cost: cheap operators then run long enough between event-loop turns, and a round stays within the 1 ms
# flush delay. The round's length does not follow the instance count: one single-threaded process runs
# every instance, so instances set an operator's share of the round, not how long the round is, and a
# share its operator has no work for goes to the others (docs/RUNTIME.md, "Scheduling rounds").
ROUND_TIME_US = 1000.0
# ... and at most this long by the clock, whatever the estimates say: an estimate far below an operator's
# real cost (before its first timings, or under a quota that stalls every one) must not keep the event loop,
# and with it the worker's heartbeats, from turning until the whole queue has run.
ROUND_WALL_S = 0.01
REQUEST_OVERHEAD_US = 1.5
# An operator that runs blocks or gathered passes (`_apply_block`, `_run_gathered`) times the whole loop,
# its own per-request cost included, so only the batch's fixed cost is left to add.
BLOCK_OVERHEAD_US = 0.05
MIN_BATCH = 16
TIMING_MASK = TIMING_SAMPLE - 1


class Executor:
    """Runs one engine's operators (`ops`, in topological `order`; both made once) into its `outbox`, past its
    barrier (`cut`) and around the key groups its migration holds (`handover`)."""

    def __init__(self, job: int, ops: list[OpRuntime], order: list[OpRuntime], outbox: Outbox, cut: Barrier,
                 handover: Handover, max_errors_kept: int = 20):
        self.job, self.ops, self.order = job, ops, order
        self.outbox, self.cut, self.handover = outbox, cut, handover
        # Progress epoch -> {op index: requests produced minus finished here}, not reported yet.
        self.progress: dict[int, dict[int, int]] = {}
        # A timed request longer than this (s) was stalled, not executing: under a CPU quota a throttled
        # period lands inside whichever request was running. The worker sets it from its quota.
        self.stall = math.inf
        self.round_wall = ROUND_WALL_S  # s a round runs at most by the clock (`run_round`)
        self.failed = 0
        self.error_samples: deque = deque(maxlen=max_errors_kept)
        self.async_tasks: set[asyncio.Task] = set()
        self.on_work = lambda: None  # the worker's wake-up, called when async executions produce work
        # The remote-state baseline (paper Fig. 4): an object with `async get_many(job, op, keys) -> dict`
        # and `async put_many(job, op, {key: state or None})`; None keeps state in this worker.
        self.remote_state = None

    def run_round(self) -> int:
        """One scheduling round, about ROUND_TIME_US of work: passes over the operators with work, each
        running its instances' share of the round per pass, until the round's work is done or none is left
        (work-conserving: an operator whose share is idle leaves it to the others)."""
        done = 0
        spent = 0.0
        ends = perf_counter() + self.round_wall
        # The worker's slots, not only those with work now: an operator handed work during this pass by
        # its predecessor runs in it too, with the same share.
        slots = sum(op.instances for op in self.order if op.instances > 0) or 1
        while True:
            ran = 0
            for op in self.order:
                if op.queue and not op.busy:
                    passes = (op.blocks or op.gathers or op.timed or op.maps_keyed or op.maps_local
                              or (op.collect and not op.routes and not op.sink))  # `collect_pass`
                    cost = ((op.exec_time / op.processed * 1e6 if op.processed else 10.0)
                            + (BLOCK_OVERHEAD_US if passes else REQUEST_OVERHEAD_US))
                    # A gathered pass takes the whole round's worth: its fixed routing cost wants many
                    # requests to spread over, and its successor's blocks run in the next pass.
                    share = 1.0 if op.gathers else max(1, op.instances) / slots
                    budget = max(MIN_BATCH, int(share * ROUND_TIME_US / cost))
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
                    if self.outbox.batch_full():
                        return done + ran
            done += ran
            if not ran or spent >= ROUND_TIME_US or perf_counter() >= ends:
                return done

    def count(self, e: int, op_index: int, k: int) -> None:
        """Add `k` to this worker's progress count of operator `op_index` in progress epoch `e`."""
        d = self.progress.get(e)
        if d is None:
            d = self.progress[e] = {}
        d[op_index] = d.get(op_index, 0) + k

    def _ran(self, e: int, op_index: int, used: int, succ: int, made: int) -> None:
        """A run of `used` requests of one epoch finished at `op_index`, having handed `made` to `succ`."""
        self.count(e, op_index, -used)
        if made:
            self.count(e, succ, made)

    def fail(self, op: OpRuntime, exc: BaseException, value) -> None:
        op.errors += 1
        self.failed += 1
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.error_samples.append({"operator": op.name, "error": text[:300], "value": repr(value)[:200]})

    def _run_stateless(self, op: OpRuntime, budget: int) -> int:
        q = op.queue
        n = min(budget, len(q))
        routes = op.routes
        # One keyed successor whose key is the value (Word Count's split): the whole pass at once. Not while
        # a checkpoint barrier holds what would join the successor's queue, nor while a migration holds key
        # groups.
        if (op.gathers and routes[0][5].index not in self.cut.held
                and (routes[0][0] == KEYED_HERE or not self.handover.held)):
            return self._run_gathered(op, q.take_columns(n))
        if op.maps_keyed and routes[0][5].index not in self.cut.held:
            return map_keyed(self, op, q.take_columns(n))
        if op.maps_local:
            return map_local(self, op, q.take_columns(n))
        if not routes and op.collect and not op.sink:
            return collect_pass(self, op, q.take_columns(n))
        fn = op.fn
        pc = perf_counter
        dts = op.dts
        dts_append = dts.append
        one, items = ONE_EXACT, ITEMS_EXACT
        fast = routes[0][2] if len(routes) == 1 and routes[0][0] == ROUTE_LOCAL else None
        # One remote holder of the only successor: its batch takes the requests as a local queue would (the
        # general path's divmod, table and dict lookups per request cost more than the append).
        remote_to = routes[0][5] if len(routes) == 1 and routes[0][0] == ROUTE_ONE_REMOTE else None
        if remote_to is not None:
            batch = self.outbox.pending.get(remote_to)
            if batch is None:
                batch = self.outbox.pending[remote_to] = []
            fast = batch.append
        succ0 = routes[0][1] if routes else -1
        me = op.index
        collect = op.add_collected if op.collect else None
        t_exec = 0.0
        timed = 0
        stall = self.stall
        stalled = 0.0  # `stall` once a timed request was stalled: what a request counts for with no mean yet
        emitted = 0  # children handed over by the fast paths; the general path counts in send
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
                    self.fail(op, e, value)
                    continue
            else:  # one request in TIMING_SAMPLE is timed: τ̄ and the histogram come from the sample
                t0 = pc()
                try:
                    out = fn(value)
                except Exception as e:
                    self.fail(op, e, value)
                    continue
                dt = pc() - t0
                if dt < stall:
                    t_exec += dt
                    timed += 1
                    dts_append(dt)
                else:
                    stalled = stall
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
                    self.fail(op, e, value)
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
            if routes:
                self.send(op, outs, rid)
        if used:
            self._ran(cur, me, used, succ0, made)
        op.exec_time += estimate(op, t_exec, timed, n, stalled)
        op.processed += n
        if remote_to is not None:
            if emitted:
                if self.outbox.pending_since is None:
                    self.outbox.pending_since = perf_counter()
            elif not batch:
                del self.outbox.pending[remote_to]  # never an empty batch: a flush sends every one
            self.outbox.remote_requests += emitted
            op.edge_counts[0] += emitted
        elif emitted:
            self.outbox.local_requests += emitted
            op.edge_counts[0] += emitted
        if len(dts) > 20_000:
            op.fold_histogram()
        return n

    def _run_gathered(self, op: OpRuntime, parts: list) -> int:
        """A pass of a stateless operator whose one successor is keyed by the value, on `parts`
        (`RecordQueue.take_columns`, as one: a source's runs give their values and ids with no row made): its
        function mapped over the values (`batches.map_outputs`), timed as a whole; the outputs gathered as one
        block (values, their ids as runs) and routed by key group (`_route_block`); progress counted per run of
        one epoch."""
        values = list(chain.from_iterable(map(itemgetter(0), parts)))
        rids = list(chain.from_iterable(map(itemgetter(1), parts)))
        n = len(values)
        results, dt = map_outputs(op, values, self.fail)
        counts = list(map(len, results))
        me, succ = op.index, op.routes[0][1]
        for e, used, made in epochs_of_runs(rids, None, counts):
            self._ran(e, me, used, succ, made)
        timed_batch(op, dt, n, self.stall)
        if any(counts):
            self._route_block(op, op.routes[0], results, rids, counts)
        return n

    def _route_block(self, op: OpRuntime, route: tuple, results: list, rids: list, counts: list) -> None:
        """The outputs of a pass of `op` (`results[i]` those of the request with id `rids[i]`, `counts[i]` of
        them) to its one keyed successor whose key is the value, by `route` (KEYED_HERE or ROUTE_KEYED),
        gathered by key group (`batches.gather_outputs`): the local part joins the successor's queue as a
        block, each remote part its destination's columns, their key groups with them (bytes), which also
        weigh the groups."""
        _, succ, _, owners, _, target = route
        try:
            parts, gs = gather_outputs(target, results, rids, counts, owners)
        except Exception:  # a value that cannot be a key: line by line on the general path, which reports it
            for rid, outs in zip(rids, results, strict=True):
                if outs:
                    self.count(rid >> EPOCH_BITS, succ, -len(outs))  # counted as made by the pass; `send` again
                    self.send(op, outs, rid)
            return
        target.weigh(gs)
        cols, remote = self.outbox.pending_cols, 0
        # The groups travel with the values: the successor's loop, here or at the destination, looks none up.
        for d, (vs, rs, cs, ks) in parts.items():
            if d is None:
                target.queue.append_block(succ, vs, rs, cs, ks)
                continue
            by_succ = cols.get(d)
            if by_succ is None:
                by_succ = cols[d] = {}
            c = by_succ.get(succ)
            if c is None:
                by_succ[succ] = [vs, rs, cs, bytearray(ks)]
            else:
                c[0].extend(vs)
                c[1].extend(rs)
                c[2].extend(cs)
                c[3].extend(ks)
            remote += len(vs)
        if remote and self.outbox.pending_since is None:
            self.outbox.pending_since = perf_counter()
        self.outbox.remote_requests += remote
        self.outbox.local_requests += len(gs) - remote
        op.edge_counts[0] += len(gs)

    def _run_stateful(self, op: OpRuntime, budget: int) -> int:
        q = op.queue
        n = min(budget, len(q))
        if op.cold:
            op.warm_rows(q, n)
        shadowed = self.cut.shadows and op.index in self.cut.shadows
        for part in q.take(n):
            if shadowed and op.blocks and type(part) is not list:
                self._apply_block(op, part, True)
            elif shadowed and not self._beside_images(op, part):
                t = perf_counter()
                self._run_shadowed(op, part if type(part) is list else list(part.rows()))
                self.cut.cow_s += perf_counter() - t
            elif type(part) is list:
                apply_timed(self, op, part) if op.timed else self._apply(op, part, len(part))
            elif op.blocks:
                self._apply_block(op, part)
            else:  # its outputs need each request's id
                self._apply(op, part.rows(), len(part))
        return n

    def _beside_images(self, op: OpRuntime, part) -> bool:
        """Whether a part of a stateful operator's queue, while a checkpoint barrier is up, runs on the live
        state alone: the two common cases, which need no look per request. Nothing above the boundary came
        yet, or only requests above it come and every group here has its image."""
        rids = [r[3] for r in part] if type(part) is list else part.runs()[0]
        shadow = self.cut.shadows[op.index]
        return bool(rids) and (max(rids) < self.cut.boundary if not shadow
                               else min(rids) >= self.cut.boundary and len(shadow) >= self.cut.owned[op.index])

    def _apply_block(self, op: OpRuntime, block, barrier: bool = False) -> None:
        """A block of requests to a stateful operator whose key is the value and whose outputs go nowhere
        (Word Count's count), on its live state in one tight loop (`batches.apply_block`), timed as a
        whole; progress counted per run of ids. Under a checkpoint's `barrier`, after the images it needs."""
        values = block.values_left()
        rids, counts = block.runs()
        for e, used, _ in epochs_of_runs(rids, counts, None):
            self._ran(e, op.index, used, op.index, 0)
        gs = block.groups_left()
        if gs is None:
            gs = group_bytes(op, values)
        if barrier:
            self.cut.beside_block(op, values, gs, rids, counts)
        dt = apply_block(op, values, gs, self.fail)
        timed_batch(op, dt, len(values), self.stall)

    def _run_shadowed(self, op: OpRuntime, rows: list) -> None:
        """`rows` of a stateful operator while a checkpoint barrier is up (copy on write): before the first
        request at or above the boundary changes a key group, the group's image is kept for the snapshot (a
        group at rest: its blob, no copy); a request below the boundary that comes after it is applied to
        the image as well (its outputs come once, from the live state). The rows run as they came, in runs
        between two such points."""
        cut, group_of = self.cut, op.group_of
        boundary, shadow = cut.boundary, cut.shadows[op.index]
        start = 0
        for i, (_, value, key, rid) in enumerate(rows):
            g = group_of(key)
            if rid >= boundary:
                if g not in shadow:
                    if i > start:
                        self._apply(op, rows[start:i], i - start)
                        start = i
                    cut.keep_image(op, g)
            elif g in shadow:
                cut.on_images(op, ((g, key, value),))
        if start < len(rows):
            self._apply(op, rows[start:], len(rows) - start)

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
        stalled = 0.0  # `stall` once a timed request was stalled: what a request counts for with no mean yet
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
                    self.fail(op, e, value)
                    continue
            else:
                t0 = pc()
                try:
                    new, out = fn(old, value)
                except Exception as e:
                    self.fail(op, e, value)
                    continue
                dt = pc() - t0
                if dt < stall:
                    t_exec += dt
                    timed += 1
                    dts_append(dt)
                else:
                    stalled = stall
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
                    self.fail(op, e, value)
                    continue
            if collect is not None:
                collect(outs, rid)
            if routes and outs:
                self.send(op, outs, rid)
        if used:
            self._ran(cur, me, used, me, 0)
        op.exec_time += estimate(op, t_exec, timed, n, stalled)
        op.processed += n
        if len(op.dts) > 20_000:
            op.fold_histogram()
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
                self.fail(op, exc, values[:3])
                outs = ()
            self._ran(e, me, end - start, me, 0)
            if outs:
                if op.collect:
                    op.add_collected(outs, rid)
                if op.routes:
                    self.send(op, outs, rid)
            start = end
        timed_batch(op, perf_counter() - t0, n, self.stall)
        return n

    def send(self, op: OpRuntime, outs, rid: int) -> int:
        """Hand every output to every successor by its route, and count them in the progress of `rid`'s
        epoch; returns how many requests were made."""
        local = remote = 0
        pending = self.outbox.pending
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
            else:  # keyed (all here or spread): the group from the key cache, which also weighs it
                key_fn, ident = target.key_fn, target.key_is_value
                routed = bytearray()
                for o in outs:
                    try:
                        key = o if ident else key_fn(o)
                        g = aux[key]  # a key that cannot be one (unhashable) fails here, reported
                    except Exception as e:
                        self.fail(target, OperatorError(f"key function of {target.name!r} failed: {e!r}"), o)
                        k -= 1
                        continue
                    routed.append(g)
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
                target.weigh(bytes(routed))
            op.edge_counts[j] += len(outs)
            made.append((succ, k))
        e = rid >> EPOCH_BITS
        for succ, k in made:
            if k:
                self.count(e, succ, k)
        if remote and self.outbox.pending_since is None:
            self.outbox.pending_since = perf_counter()
        self.outbox.local_requests += local
        self.outbox.remote_requests += remote
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
                self.fail(op, e, value)
                self.count(rid >> EPOCH_BITS, op.index, -1)
                return
            dt = perf_counter() - t0
            op.exec_time += dt
            op.dts.append(dt)
            if op.collect:
                op.add_collected(outs, rid)
            # Its children and its own end in the same report (no await in between).
            if op.routes and outs:
                self.send(op, outs, rid)
            self.count(rid >> EPOCH_BITS, op.index, -1)

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
                    self.fail(op, e, value)
                    self.count(rid >> EPOCH_BITS, op.index, -1)
                return
            t0 = perf_counter()
            emits = []
            for _, value, key, rid in batch:
                try:
                    new, out = op.fn(states.get(key), value)
                    outs = as_outputs(out)
                except Exception as e:
                    self.fail(op, e, value)
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
                    self.send(op, outs, rid)
                self.count(rid >> EPOCH_BITS, op.index, -1)
        finally:
            op.processed += len(batch)
            op.busy = False
            self.on_work()

    # ----------------------------------------------------------------- progress
    def take_progress(self) -> dict[int, dict[int, int]]:
        """The progress counts gathered since the last call (the worker reports them in one message)."""
        p, self.progress = self.progress, {}
        return p
