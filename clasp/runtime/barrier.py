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

from itertools import chain, compress, repeat
from time import perf_counter

import msgpack

from clasp.core.checkpoint import barrier_holds
from clasp.core.dag import DagSpec
from clasp.core.routing import Placement
from clasp.runtime.batches import apply_to, distinct_groups
from clasp.runtime.operators import OpRuntime, unpack_group


class Barrier:
    """`boundary` is None while no barrier is up. `ops` is the engine's operator list (made once)."""

    def __init__(self, spec: DagSpec, ops: list[OpRuntime], me: str):
        self.ops, self.me = ops, me
        self.holds = barrier_holds(spec)
        self.boundary: int | None = None
        self.shadows: dict[int, dict[int, bytes | dict]] = {}
        self.owned: dict[int, int] = {}  # op index -> key groups this worker owns (all have images: no look)
        self.held: dict[int, list] = {}
        self.cow_s = 0.0  # s spent keeping the images while the barrier is up (copy on write)

    def begin(self, boundary: int, placement: Placement) -> None:
        """Keep the state below `boundary` until `release` (the engine then rebuilds its routes, so requests
        joining a holding operator's queue pass `appender`'s filter)."""
        self.boundary = boundary
        self.shadows = {op.index: {} for op in self.ops if op.stateful and op.index not in self.holds}
        self.owned = {i: placement.operators[self.ops[i].name].key_groups.count(self.me) for i in self.shadows}
        self.held = {i: [] for i in sorted(self.holds)}
        self.cow_s = 0.0

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

    def beside_block(self, op: OpRuntime, values: list, groups: bytes | list, rids: list, counts: list) -> None:
        """Keep the images a block of `op` (keyed by its value, its outputs going nowhere) needs before it runs
        whole on the live state in the tight loop: every key group that a request at or above the boundary
        reaches and that has none yet gets its image now (the state before the block, which only requests
        below the boundary reached: the first one above would have made the image), and each request below
        the boundary whose group has an image is applied to the image too, in the block's order. A block
        that straddles the boundary, or comes before every group has its image, needs no row-by-row run."""
        t0 = perf_counter()
        boundary, shadow = self.boundary, self.shadows[op.index]
        if max(rids) < boundary:
            below, below_groups, above = values, groups, ()
        elif min(rids) >= boundary:
            below, below_groups, above = (), (), distinct_groups(groups)
        else:
            lo = list(chain.from_iterable(map(repeat, [r < boundary for r in rids], counts)))
            below, below_groups = list(compress(values, lo)), list(compress(groups, lo))
            above = set(compress(groups, [not x for x in lo]))
        for g in above:
            if g not in shadow:
                self.keep_image(op, g)
        if below and not shadow.keys().isdisjoint(below_groups):
            self.on_block_images(op, below, below_groups)
        self.cow_s += perf_counter() - t0

    def on_block_images(self, op: OpRuntime, values: list, groups: bytes | list) -> None:
        """`values` (keys: the values; key group `groups[i]`) below the boundary: those at a key group that has its
        image are applied to the image too, in order, as `on_images` applies them, in one pass of the block's tight
        loop (`batches.apply_to`) over the images."""
        shadow = self.shadows[op.index]
        present = distinct_groups(groups)
        imaged = [g for g in present if g in shadow]
        dicts: list = [None] * 256  # by key group, the images of this block's; a table of bytes below
        for g in imaged:
            image = shadow[g]
            if type(image) is not dict:
                image = shadow[g] = unpack_group(image[0])
            dicts[g] = image
        if len(imaged) < len(present):
            at = bytearray(256)
            for g in imaged:
                at[g] = 1
            keep = (groups.translate(at) if isinstance(groups, (bytes, bytearray))
                    else bytes(map(at.__getitem__, groups)))
            values, groups = list(compress(values, keep)), bytes(compress(groups, keep))
        apply_to(op, dicts, values, groups, lambda *_: None)  # the live call reports a request's failure

    def keep_image(self, op: OpRuntime, g: int) -> None:
        """Key group `g`'s image, before the first request above the boundary changes it (a group at rest:
        its blob, no copy)."""
        self.shadows[op.index][g] = op.rested[g] or (op.rest(g) if op.groups[g] else {})

    def on_images(self, op: OpRuntime, requests) -> None:
        """Requests `(group, key, value)` below the boundary: each one at a key group that has its image is
        applied to the image too, in order (its outputs come once, from the live state)."""
        shadow, fn = self.shadows[op.index], op.fn
        for g, key, value in requests:
            image = shadow.get(g)
            if image is None:
                continue
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
