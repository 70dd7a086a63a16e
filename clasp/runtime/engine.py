"""A worker's local scheduling engine for one job: the wiring of its collaborators, its input, and what the
worker asks of it.

Requests are 4-tuples `(op, value, key, rid)`, or column blocks of them where the key is the value
(`clasp.runtime.records`); each operator (`clasp.runtime.operators.OpRuntime`) has a FIFO queue. `JobEngine`
takes rows, runs and columns from the network and the readers into the queues (or, during a migration or
a checkpoint's barrier, to whoever holds them), switches placements, and answers for the job's state and
counters. Its collaborators, built here with what each uses passed in:

- `Executor` (clasp.runtime.executor): scheduling rounds, the operators' runs, the progress counts;
- `Outbox` (clasp.runtime.outbox): the routes to each successor, the remote batches until a flush;
- `Barrier` (clasp.runtime.barrier): a checkpoint's holds and copy-on-write images, the snapshot;
- `Handover` (clasp.runtime.worker_migration): a live migration's held, forwarded, extracted and
  installed requests and key groups.
"""

from __future__ import annotations

import msgpack

from clasp.core.dag import DagSpec
from clasp.core.protocol import column_rows, expand_columns, expand_run, expand_runs
from clasp.core.routing import ROUTE_LOCAL, Placement
from clasp.core.tracking import EPOCH_BITS
from clasp.runtime.barrier import Barrier
from clasp.runtime.executor import Executor
from clasp.runtime.operators import OperatorError, OpRuntime, check_serializable
from clasp.runtime.outbox import Outbox
from clasp.runtime.worker_migration import Handover


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
        self.received_requests = 0  # chained requests that came from other workers, cumulative
        # A checkpoint's barrier: what it holds back, what it keeps for the snapshot.
        self.cut = Barrier(spec, self.ops, me)
        # The routes to each successor and the batches of remote requests until the worker flushes them.
        self.outbox = Outbox(spec, self.ops, me, self.cut)
        # A live migration: what is held, forwarded, taken out and installed (clasp.runtime.worker_migration).
        self.handover = Handover(self.ops, me, self.outbox, self.cut)
        # The executor pool: scheduling rounds, the operators' runs, the progress counts.
        self.executor = Executor(job, self.ops, self.order, self.outbox, self.cut, self.handover, max_errors_kept)
        # Rows of an epoch below `floor` belong to an era a recovery rolled back, and are dropped.
        self.floor = 0
        self.placement = placement
        self.epoch = placement.epoch
        self.apply_placement(placement)

    # ----------------------------------------------------------------- placement and routing
    def apply_placement(self, placement: Placement) -> None:
        """Rebuild every route and instance count for a new placement; key groups still on their way
        here (`self.handover.held`) route to the HOLD destination, which `take_batches` keeps back."""
        self.placement = placement
        self.epoch = placement.epoch
        self.outbox.route(placement, self.handover.held)

    # ----------------------------------------------------------------- checkpoints
    def begin_barrier(self, boundary: int) -> None:
        """Keep the state below `boundary` for the snapshot until `release_barrier` (nothing of the records
        at or above it is here yet: the planner dispatches them after this); `Barrier` holds and keeps."""
        self.cut.begin(boundary, self.placement)
        self.apply_placement(self.placement)

    def release_barrier(self) -> int:
        """The snapshot is taken: held requests join their queues in arrival order; returns how many."""
        if self.cut.boundary is None:
            return 0
        n = self.cut.release()
        self.apply_placement(self.placement)
        return n

    def changed(self) -> bool:
        """Whether some key group here changed since it was last packed (`rest_one` has work)."""
        return self.executor.remote_state is None and any(
            d and op.rested[g] is None and g not in op.unpackable for op in self.ops for g, d in enumerate(op.groups))

    def rest_one(self) -> bool:
        """Put one changed key group to rest; False when none is left. The worker calls it once its input has
        paused (REST_IDLE_S without work), within a RestBudget: a migration or checkpoint that follows then
        sends or writes the blobs as they are, O(key groups) instead of O(keys)."""
        if self.executor.remote_state is not None:
            return False
        for op in self.ops:
            for g, d in enumerate(op.groups):
                if d and op.rested[g] is None and g not in op.unpackable:
                    try:
                        op.rest(g)
                    except (TypeError, ValueError, OverflowError):
                        op.unpackable.add(g)
                        try:
                            check_serializable(op.name, d)
                        except OperatorError as named:
                            self.executor.fail(op, named, None)
                    return True
        return False

    def install_group(self, name: str, g: int, items: dict) -> None:
        self.op(name).install_items(g, items)

    def warm_one(self) -> bool:
        """Decode one key group that came by migration and has not been used yet; False when none is left.
        The worker calls it when it has nothing else to do, so the decoding is done in idle time and stateful
        rounds stop checking for cold groups soon after a migration."""
        for op in self.ops:
            if op.cold:
                op.warm(next(iter(op.cold)))
                return True
        return False

    def behind(self) -> int:
        """The work queued here past the push roots' own queues, in requests of a push root: each operator's
        queue by its mean execution time, over the roots' mean. The planner adds it to the root requests it
        counts outstanding here (`scheduler.Loads`): a worker whose keyed stage is behind gets fewer pushed
        records although its root keeps up. O(operators)."""
        ops, roots = self.ops, self.spec.sources
        unit = n = 0.0
        for i in roots:
            op = ops[i]
            if op.processed:
                unit += op.exec_time / op.processed
                n += 1
        if not unit:
            return 0
        work = 0.0
        for i, op in enumerate(ops):
            if op.queue and op.processed and i not in roots:
                work += len(op.queue) * op.exec_time / op.processed
        return int(work * n / unit)

    def queue_length(self) -> int:
        return (sum(len(op.queue) for op in self.ops) + sum(map(len, self.handover.held_rows()))
                + self.cut.held_rows())

    def holds_below(self, fence: int) -> bool:
        """Whether anything here still belongs to a record below `fence`: a queued, held, early or batched
        request, progress not yet reported, or an execution in progress. O(requests held), asked
        only while the planner looks for records lost with a dead worker."""
        ex = self.executor
        if ex.async_tasks or any(e << EPOCH_BITS < fence for e in ex.progress):
            return True
        rows = [op.queue for op in self.ops]
        rows += self.handover.held_rows()
        rows += [r for _, r in self.handover.future]
        if self.outbox.holds_below(fence):
            return True
        return any(r[3] < fence for part in rows for r in part)

    def idle(self) -> bool:
        return (not self.executor.async_tasks and not self.handover.held and not self.handover.future
                and not self.outbox.waiting() and all(not op.queue for op in self.ops)
                and not any(self.cut.held.values()))

    # ----------------------------------------------------------------- input
    def enqueue_rows(self, rows: list) -> None:
        """Append validated rows [op, value, key, rid] to their operators' queues."""
        ops = self.ops
        if self.cut.held:
            boundary, held = self.cut.boundary, self.cut.held
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
        if self.cut.held or self.handover.held or epoch != self.epoch:
            rows = expand_runs(runs)
            self.receive(epoch, rows)
            return len(rows)
        ops, n = self.ops, 0
        for op, first, values in runs:
            ops[op].queue.extend(expand_run(op, first, values))
            n += len(values)
        return n

    def drop_runs(self, bad: list) -> None:
        """Pushed runs this worker could not decode ([op, first rid, records, error], `protocol.open_runs`):
        their records fail here, counted among the operator's errors, and are done, so nothing waits on them."""
        ex = self.executor
        for op, first, n, text in bad:
            ex.fail(self.ops[op], ValueError(text), f"{n} pushed records from rid {first}")
            rid = first
            while rid < first + n:
                stop = min(first + n, ((rid >> EPOCH_BITS) + 1) << EPOCH_BITS)
                ex.count(rid >> EPOCH_BITS, op, rid - stop)
                rid = stop

    def admit_source(self, op_index: int, values: list, first: int) -> dict[int, dict[int, int]]:
        """A batch a source reader here read, records `first ..`: handed to the source operator's successors
        as its outputs (the source operator is a pass-through: no call per record), by their routes. Returns
        the requests made per epoch and successor, which the reader's seal carries to the planner (they
        are not counted in `progress`, so the epoch cannot complete before the seal arrives)."""
        op = self.ops[op_index]
        ex = self.executor
        saved, ex.progress = ex.progress, {}
        n = len(values)
        try:
            if all(r[0] == ROUTE_LOCAL and r[2] == self.ops[r[1]].queue.append for r in op.routes):
                # Every successor's share here, no barrier filter: the batch joins each queue as one run (its
                # values, shared, and its first record id; `clasp.runtime.records`), no row per record.
                for j, (_, succ, _, _, _, _) in enumerate(op.routes):
                    self.ops[succ].queue.append_run(succ, values, first)
                    op.edge_counts[j] += n
                    rid = first
                    while rid < first + n:
                        e = rid >> EPOCH_BITS
                        stop = min(first + n, (e + 1) << EPOCH_BITS)
                        ex.count(e, succ, stop - rid)
                        rid = stop
                self.outbox.local_requests += n * len(op.routes)
            else:
                send = ex.send
                for i, v in enumerate(values):
                    send(op, (v,), first + i)
        finally:
            made, ex.progress = ex.progress, saved
        op.processed += n
        return made

    def receive(self, epoch: int, rows: list) -> None:
        """Rows from the network, sent under `epoch`: queued, held for a key group on its way here, kept
        until our plan for `epoch` arrives, or forwarded to the owner of a newer epoch."""
        if epoch > self.epoch:
            self.handover.future.append((epoch, rows))  # the sender switched before our plan arrived
        elif self.handover.held or epoch < self.epoch:
            self.handover.place(rows, self.placement if epoch < self.epoch else None)
        else:
            self.enqueue_rows(rows)

    def receive_columns(self, epoch: int, groups: list) -> None:
        """A `cols` message's validated groups (clasp.core.protocol.columns): straight onto their operators'
        queues in steady state (one extend per group, the rows built without a loop in Python), row by
        row through `receive` during a migration or a barrier."""
        if epoch == self.epoch and not self.handover.held and not self.cut.held:
            ops = self.ops
            for g in groups:
                op = ops[g[0]]
                if g[2] is True and op.stateful:  # keys are the values: the columns join as a block
                    op.queue.append_block(g[0], g[1], g[3], g[4] if g[4] is not None else [1] * len(g[3]),
                                          g[5] if len(g) > 5 else None)
                else:
                    op.queue.extend(column_rows(g))
        else:
            self.receive(epoch, expand_columns(groups))

    # ----------------------------------------------------------------- migration
    def begin_migration(self, placement: Placement, incoming: dict[int, set[int]]) -> None:
        """Switch to the new epoch's routing. Requests for the key groups in `incoming` (op index -> groups
        whose state is on its way here) are held, in arrival order, until `release_groups`; the rest run on."""
        future = self.handover.begin(self.placement, incoming)
        self.apply_placement(placement)
        for epoch, rows in future:
            self.receive(epoch, rows)

    def release_groups(self, groups: dict[int, list[int]]) -> None:
        """The state of these key groups is installed: their held requests join the queues after what
        came with the state. When nothing is held any more, routing stops holding."""
        if self.handover.release(groups):
            self.apply_placement(self.placement)

    def install(self, units: list, rows: list) -> int:
        """Take over key groups (state, then their queued requests) and handed-over requests from a peer;
        returns the number of state objects installed. The state stays serialized until first used."""
        n = self.handover.install(units)
        self.enqueue_rows(rows)
        return n

    # ----------------------------------------------------------------- execution
    def run_round(self) -> int:
        """One scheduling round (`Executor.run_round`)."""
        return self.executor.run_round()

    def take_batches(self) -> dict[str, tuple[list, int]]:
        """The remote batches to send now: destination -> (the groups of its `cols` message, requests);
        resets the flush timer."""
        self.handover.hold_local()
        return self.outbox.take()

    def roots_finished(self) -> int | None:
        """The push roots' requests finished here since the last report (`take_progress`); None where this
        worker runs no instance of a push root. O(epochs pending x roots)."""
        roots = [i for i in self.spec.sources if self.ops[i].instances > 0]
        if not roots:
            return None
        n = 0
        for d in self.executor.progress.values():
            for i in roots:
                n -= d.get(i, 0)
        return n

    def take_progress(self) -> dict[int, dict[int, int]]:
        """The progress counts gathered since the last call (the worker reports them in one message)."""
        return self.executor.take_progress()

    def fold_histograms(self) -> None:
        for op in self.ops:
            op.fold_histogram()

    def counters(self) -> dict:
        """Cumulative counts, exact at the moment of asking (heartbeat samples are up to 1 s old)."""
        return {"operators": {op.name: {"processed": op.processed, "exec_s": op.exec_time, "errors": op.errors,
                                        "queue": len(op.queue), "keys": op.keys(),
                                        "edges": dict(zip((self.ops[s].name for s in op.successors),
                                                          op.edge_counts, strict=True))}
                              for op in self.ops},
                "local": self.outbox.local_requests, "remote": self.outbox.remote_requests,
                "failed": self.executor.failed, "queue": self.queue_length(), "idle": self.idle()}

    # ----------------------------------------------------------------- state server
    def state_dump(self, name: str) -> dict:
        """The keyed state of operator `name` held here, checked to be msgpack-serializable."""
        state = self._stateful(name).state_dict()
        check_serializable(name, state)
        return state

    def state_packed(self, name: str) -> bytes:
        """`state_dump`, as its msgpack map (packed once: the check is the packing)."""
        state = self._stateful(name).state_dict()
        try:
            return msgpack.packb(state, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            check_serializable(name, state)  # names the key it cannot carry
            raise

    def _stateful(self, name: str) -> OpRuntime:
        op = self.op(name)
        if not op.stateful:
            raise OperatorError(f"operator {name!r} is stateless: it has no state")
        return op

    def op(self, name: str) -> OpRuntime:
        for op in self.ops:
            if op.name == name:
                return op
        raise OperatorError(f"job {self.job} has no operator {name!r}")
