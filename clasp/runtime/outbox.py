"""Where one engine's outputs go: the route each operator has to each successor under the current placement,
and the batches of remote chained requests per destination until the worker flushes them.

A route is a tuple `(kind, successor, append, table, aux, target)`: local (appended to the successor's queue,
past a checkpoint's barrier filter while one is up), one remote holder, a weighted table, or keyed by key
group (`KEYED_HERE` when this worker owns every group). A remote request joins its destination's rows in
`pending`; the keyed fast path (a keyed successor whose key is the value) batches columns in `pending_cols`
instead. Key groups on their way here route to `HOLD`, which the engine's migration half takes back before a
flush (`Handover.hold_local`).
"""

from __future__ import annotations

import sys
from time import perf_counter

from clasp.core.dag import DagSpec
from clasp.core.protocol import column_rows, columns
from clasp.core.routing import ROUTE_KEYED, ROUTE_LOCAL, ROUTE_TABLE, Placement, route_to
from clasp.runtime.barrier import Barrier
from clasp.runtime.operators import OpRuntime

HOLD = "\x00hold"  # the route of a key group whose state is on its way here: its requests wait
KEYED_HERE = 3  # a keyed route whose key groups are all owned by this worker
ROUTE_ONE_REMOTE = 4  # a stateless successor that one other worker alone holds: every request goes there


class Outbox:
    """`ops` is the engine's operator list (made once); `cut` its barrier, whose filter local routes pass."""

    def __init__(self, spec: DagSpec, ops: list[OpRuntime], me: str, cut: Barrier):
        self.spec, self.ops, self.me, self.cut = spec, ops, me, cut
        self.pending: dict[str, list] = {}  # destination worker -> rows of remote chained requests
        # What the keyed fast path batched (the executor's gathered passes: a keyed successor whose key is the
        # value), as columns: destination -> {successor: [values, record ids, run lengths, key groups]}. For one
        # operator, rows in `pending` always came before these (`settle_columns` turns them into rows wherever
        # routes change), so a flush sends rows first.
        self.pending_cols: dict[str, dict[int, list]] = {}
        # A batch this long ends the scheduling round after the operator that filled it, so the worker
        # flushes it then (the worker sets it from --max-batch): the cap holds per micro-batch, not per round.
        self.max_batch = 2000
        self.pending_since: float | None = None
        self.local_requests = 0  # chained requests handed over in memory (R^l), cumulative
        self.remote_requests = 0  # chained requests batched for another worker (R^r), cumulative

    def route(self, placement: Placement, held: dict[int, dict]) -> None:
        """Rebuild every route and instance count for `placement`; the key groups in `held` (op index ->
        groups whose state is on its way here) route to the HOLD destination."""
        self.settle_columns()
        me, cut = self.me, self.cut
        for op in self.ops:
            op.instances = placement.operators[op.name].instances.get(me, 0)
            routes = []
            for s in op.successors:
                r = route_to(self.spec, placement, s, me, op.index)
                target = self.ops[s]
                if r.kind == ROUTE_LOCAL:
                    routes.append((ROUTE_LOCAL, s, cut.appender(target), None, None, None))
                elif r.kind == ROUTE_TABLE and len(set(r.table)) == 1 and r.table[0] is not None:
                    routes.append((ROUTE_ONE_REMOTE, s, None, r.table, [0], r.table[0]))
                elif r.kind == ROUTE_TABLE:
                    routes.append((ROUTE_TABLE, s, cut.appender(target), r.table, [0], None))
                else:
                    # interned: the keyed fast path tells destinations apart by identity
                    owners = [w if w is None else sys.intern(w) for w in r.owners]
                    for g in held.get(s, ()):
                        owners[g] = HOLD
                    # Every key group here: the key is all a request needs (no group lookup per request).
                    kind = KEYED_HERE if all(w is None for w in owners) else ROUTE_KEYED
                    routes.append((kind, s, cut.appender(target), owners, target.key_cache, target))
            op.routes = routes
            # A stateful operator keyed by the value whose outputs go nowhere (Word Count's count) runs its
            # blocks in the executor's tight loop, which does not keep each request's id.
            op.blocks = op.stateful and op.key_is_value and not routes and not op.collect and not op.is_async
            # A stateless operator whose one successor is keyed by the value (Word Count's split) runs a
            # pass at a time and gathers its outputs into such blocks.
            op.gathers = (not op.stateful and not op.is_async and not op.batch and not op.collect
                          and len(routes) == 1 and routes[0][0] in (KEYED_HERE, ROUTE_KEYED)
                          and routes[0][5].key_is_value)
            op.maps_keyed = (not op.stateful and not op.is_async and not op.batch and not op.collect
                             and len(routes) == 1 and routes[0][0] in (KEYED_HERE, ROUTE_KEYED)
                             and not routes[0][5].key_is_value)
            op.maps_local = (not op.stateful and not op.is_async and not op.batch and not op.collect
                             and not op.sink and len(routes) == 1 and routes[0][0] == ROUTE_LOCAL)

    def settle_columns(self) -> None:
        """Turn the keyed fast path's columns into rows of `pending`, behind the rows there: routes are
        about to change, and what an operator sends from now on must queue after what it sent so far."""
        for d, by_succ in self.pending_cols.items():
            rows = self.pending.setdefault(d, [])
            for succ, (values, rids, counts, _) in by_succ.items():
                rows.extend(column_rows([succ, values, True, rids, counts]))
        self.pending_cols = {}

    def add(self, d: str, row) -> None:
        """One request for worker `d` (a forwarded row)."""
        self.pending.setdefault(d, []).append(row)
        if self.pending_since is None:
            self.pending_since = perf_counter()

    def waiting(self) -> bool:
        """Whether any remote request waits for a flush."""
        return bool(self.pending or self.pending_cols)

    def batch_full(self) -> bool:
        """Whether some destination's batch reached `max_batch` requests (the worker flushes it then)."""
        m = self.max_batch
        return (any(len(r) >= m for r in self.pending.values())
                or any(len(c[0]) >= m for by_succ in self.pending_cols.values() for c in by_succ.values()))

    def take(self) -> dict[str, tuple[list, int]]:
        """The remote batches to send now: destination -> (the groups of its `cols` message, requests);
        resets the flush timer."""
        out: dict[str, tuple[list, int]] = {}
        for d, rows in self.pending.items():
            if rows:
                out[d] = (columns(rows), len(rows))
        for d, by_succ in self.pending_cols.items():
            groups, n = out.get(d, ([], 0))
            for succ, (values, rids, counts, key_groups) in by_succ.items():
                groups.append([succ, values, True, rids, counts, key_groups])
                n += len(values)
            out[d] = (groups, n)
        self.pending, self.pending_cols, self.pending_since = {}, {}, None
        return out

    def holds_below(self, fence: int) -> bool:
        """Whether a batched request belongs to a record below `fence`."""
        if any(rid < fence for by_succ in self.pending_cols.values() for c in by_succ.values() for rid in c[1]):
            return True
        return any(r[3] < fence for rows in self.pending.values() for r in rows)
