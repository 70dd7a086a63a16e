"""A checkpoint's barrier on one worker's engine (clasp.core.checkpoint, docs/RECOVERY.md): what it holds back
and what it keeps for the snapshot.

While a barrier is up, a synchronous stateful operator runs on and keeps, per key group that a request at or
above the boundary touched, the group's image before that request (`shadows`: op index -> group -> msgpack
blob, or the dict it was decoded into to apply a later request below the boundary; the executor's
`run_shadowed`); the requests at or above the boundary of an aligned operator (`clasp.core.checkpoint.
barrier_holds`: async ones and those whose outputs are seen, by a sink, a collection or another stateful
operator) wait in `held` instead. The snapshot reads the groups as of the boundary
(`snapshot_groups`) and takes out the collected outputs below it (`take_collected_below`).
"""

from __future__ import annotations

import msgpack

from clasp.core.checkpoint import barrier_holds
from clasp.core.dag import DagSpec
from clasp.core.routing import Placement
from clasp.runtime.operators import OpRuntime


class Barrier:
    """`boundary` is None while no barrier is up. `ops` is the engine's operator list (made once)."""

    def __init__(self, spec: DagSpec, ops: list[OpRuntime], me: str):
        self.ops, self.me = ops, me
        self.holds = barrier_holds(spec)
        self.boundary: int | None = None
        self.shadows: dict[int, dict[int, bytes | dict]] = {}
        self.owned: dict[int, int] = {}  # op index -> key groups this worker owns (all have images: no look)
        self.held: dict[int, list] = {}

    def begin(self, boundary: int, placement: Placement) -> None:
        """Keep the state below `boundary` until `release` (the engine then rebuilds its routes, so requests
        joining a holding operator's queue pass `appender`'s filter)."""
        self.boundary = boundary
        self.shadows = {op.index: {} for op in self.ops if op.stateful and op.index not in self.holds}
        self.owned = {i: placement.operators[self.ops[i].name].key_groups.count(self.me) for i in self.shadows}
        self.held = {i: [] for i in sorted(self.holds)}

    def release(self) -> int:
        """The snapshot is taken: held requests join their queues in arrival order; returns how many."""
        held, self.held, self.boundary = self.held, {}, None
        self.shadows = {}
        n = 0
        for op_index, rows in held.items():
            self.ops[op_index].queue.extend(rows)
            n += len(rows)
        return n

    def appender(self, target: OpRuntime):
        """How requests join `target`'s queue: directly, or past the barrier's filter while one is up."""
        if self.boundary is None or target.index not in self.held:
            return target.queue.append
        boundary, append, held = self.boundary, target.queue.append, self.held[target.index]
        hold = held.append

        def admit(row):
            if row[3] >= boundary:
                hold(row)
            else:
                append(row)
        return admit

    def held_rows(self) -> int:
        return sum(len(r) for r in self.held.values())

    def snapshot_groups(self, placement: Placement):
        """(operator, group, key count, msgpack blob) for every non-empty key group this worker owns, one at
        a time, as it was below the barrier's boundary: the image kept of a group that a request above it
        changed, a cold or rested group's blob as it is, any other group packed (and so put to rest)."""
        me = self.me
        for op in self.ops:
            if not op.stateful:
                continue
            owners = placement.operators[op.name].key_groups
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
