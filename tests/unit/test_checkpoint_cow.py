"""Checkpoints that do not stall: while a barrier is up, requests above the boundary run on, and the
snapshot is the state below it (a key group's image kept before the first request above it changed it)."""

from __future__ import annotations

import random

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.routing import build_placement
from clasp.core.tracking import CHUNK_BITS
from clasp.runtime.engine import JobEngine


def history(state, value):
    """Order-sensitive: the key's values in the order they ran."""
    return (state or []) + [value], None


def engine() -> JobEngine:
    dag = clasp.Dag("cow")
    dag.operator("h", history, stateful=True, key=lambda v: v[0])
    spec = dag.to_spec()
    return JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"h": {0: 1}}, 10))


def drain(eng: JobEngine) -> None:
    while eng.run_round():
        pass


def snapshot(eng: JobEngine) -> dict:
    out = {}
    for _, _g, _n, blob in eng.cut.snapshot_groups(eng.placement):
        out.update(msgpack.unpackb(blob, raw=False, strict_map_key=False))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=300), st.integers(0, 5),
       st.randoms(use_true_random=False))
def test_the_snapshot_is_the_state_below_the_boundary_whatever_runs_meanwhile(rows, rest_every, rnd):
    """Arbitrary arrivals of requests below (False) and above (True) the boundary, run in arbitrary
    pieces, some groups put to rest in between: the snapshot holds exactly the requests below the
    boundary, in their order; the live state every request, in its order."""
    eng = engine()
    boundary = 5 << CHUNK_BITS
    before = [(0, [k, -1], k, (1 << CHUNK_BITS) + i) for i, k in enumerate(range(0, 31, 3))]
    eng.enqueue_rows(before)
    drain(eng)
    eng.begin_barrier(boundary)
    below: dict = {}
    live: dict = {}
    for k in range(0, 31, 3):
        below[k] = [[k, -1]]
        live[k] = [[k, -1]]
    for i, (k, above) in enumerate(rows):
        rid = (boundary + i) if above else (2 << CHUNK_BITS) + i
        eng.enqueue_rows([(0, [k, i], k, rid)])
        live.setdefault(k, []).append([k, i])
        if not above:
            below.setdefault(k, []).append([k, i])
        if rnd.random() < 0.3:
            while eng.run_round():
                pass
        if rest_every and i % (rest_every * 7) == 0:
            eng.rest_one()
    drain(eng)
    assert snapshot(eng) == below
    assert eng.ops[0].state_dict() == live
    eng.release_barrier()
    assert not eng.cut.shadows
    assert snapshot(eng) == live


def test_requests_above_the_boundary_are_not_held():
    eng = engine()
    eng.begin_barrier(10 << CHUNK_BITS)
    eng.enqueue_rows([(0, ["a", 1], "a", 11 << CHUNK_BITS), (0, ["a", 2], "a", 3 << CHUNK_BITS)])
    drain(eng)
    assert not eng.ops[0].queue and not eng.cut.held
    assert eng.ops[0].state_dict() == {"a": [["a", 1], ["a", 2]]}  # both ran, in arrival order
    assert snapshot(eng) == {"a": [["a", 2]]}
    assert eng.release_barrier() == 0  # nothing was held


def test_a_large_state_is_copied_only_where_touched():
    eng = engine()
    rnd = random.Random(3)
    eng.enqueue_rows([(0, [k, 0], k, k) for k in range(5000)])
    drain(eng)
    eng.begin_barrier(1 << CHUNK_BITS)
    touched = {rnd.randrange(5000) for _ in range(20)}
    eng.enqueue_rows([(0, [k, 1], k, (1 << CHUNK_BITS) + k) for k in sorted(touched)])
    drain(eng)
    groups = {eng.ops[0].group_of(k) for k in touched}
    assert set(eng.cut.shadows[0]) == groups  # an image per group touched above the boundary, no other
    snap = snapshot(eng)
    assert snap == {k: [[k, 0]] for k in range(5000)}


def test_state_msgpack_cannot_carry_is_the_operators_error_when_resting_not_a_crash():
    """A worker puts key groups to rest in idle time: a state msgpack cannot pack (a set) is counted once as
    the operator's error naming the key, the group stays live and is skipped from then on."""
    dag = clasp.Dag("unpackable")
    dag.operator("s", lambda state, v: ((state or set()) | {v[1]}, None), stateful=True, key=lambda v: v[0])
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"s": {0: 1}}, 10))
    eng.enqueue_rows([(0, ["k", 1], "k", 1), (0, ["k", 2], "k", 2)])
    drain(eng)
    assert eng.changed()
    assert eng.rest_one() is True
    assert eng.rest_one() is False and not eng.changed()
    assert eng.executor.failed == 1 and eng.ops[0].errors == 1
    (sample,) = eng.executor.error_samples
    assert "'k'" in sample["error"] and "set" in sample["error"]
    assert eng.ops[0].state_dict() == {"k": {1, 2}}
def test_the_snapshot_holds_once_every_group_has_its_image():
    """Requests above the boundary at every key group, then only above it (run without a look per request,
    every group having its image), then below it again: the snapshot is still the state below the boundary."""
    eng = engine()
    boundary = 5 << CHUNK_BITS
    keys = range(3000)  # every one of the 128 key groups
    eng.enqueue_rows([(0, [k, "a"], k, (1 << CHUNK_BITS) + k) for k in keys])
    drain(eng)
    eng.begin_barrier(boundary)
    assert not eng.cut.shadows[0]
    eng.enqueue_rows([(0, [k, "b"], k, (2 << CHUNK_BITS) + k) for k in keys])  # below, nothing above yet
    drain(eng)
    assert not eng.cut.shadows[0]
    eng.enqueue_rows([(0, [k, "c"], k, boundary + k) for k in keys])  # above: every group gets its image
    drain(eng)
    assert len(eng.cut.shadows[0]) == 128
    eng.enqueue_rows([(0, [k, "d"], k, boundary + 3000 + k) for k in keys])  # above only
    drain(eng)
    eng.enqueue_rows([(0, [k, "e"], k, (3 << CHUNK_BITS) + k) for k in keys[::7]])  # below, after those above
    drain(eng)
    below = {k: [[k, "a"], [k, "b"]] + ([[k, "e"]] if k % 7 == 0 else []) for k in keys}
    assert snapshot(eng) == below
    live = {k: [[k, "a"], [k, "b"], [k, "c"], [k, "d"]] + ([[k, "e"]] if k % 7 == 0 else []) for k in keys}
    assert eng.ops[0].state_dict() == live


def test_only_operators_whose_outputs_are_seen_align_also_on_declared_sources():
    """A stateful operator aligns at a barrier when its outputs reach a sink, a collection or another stateful
    operator; else it runs on under copy on write, whether its job is pushed or reads declared sources."""
    from clasp.core.sinks import aligned_operators
    from clasp.testing import IterableSource

    def wc(chained: bool, collect: bool = False):
        dag = clasp.Dag("wc")
        s = dag.source("lines", IterableSource(["a b"])) >> dag.operator("split", str.split)
        c = s >> dag.operator("count", history, stateful=True, key=clasp.identity, collect=collect)
        if chained:
            c >> dag.operator("tag", lambda v: v) >> dag.operator("last", history, stateful=True, key=str)
        return dag.to_spec()

    for spec, aligned in ((wc(False), set()), (wc(False, collect=True), {"count"}), (wc(True), {"count"})):
        assert {spec.operators[i].name for i in aligned_operators(spec)} == aligned
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {o.name: {0: 1} for o in spec.operators}, 10))
        eng.begin_barrier(5 << CHUNK_BITS)
        assert {spec.operators[i].name for i in eng.cut.held} == aligned
        stateful = {o.name for o in spec.operators if o.stateful}
        assert {spec.operators[i].name for i in eng.cut.shadows} == stateful - aligned


def _count(state, word):
    return (state or 0) + 1, None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=12), min_size=1,
                max_size=60), st.integers(0, 5), st.randoms(use_true_random=False))
def test_blocks_run_past_the_barrier_and_the_snapshot_is_the_count_below_it(lines, rest_every, rnd):
    """A count keyed by the value (it runs column blocks in the tight loop) while a barrier is up: lines of
    words below (False) and above (True) the boundary arrive as blocks, run in arbitrary pieces, groups put
    to rest in between; the snapshot counts exactly the words below the boundary, the live state all."""
    from collections import Counter

    dag = clasp.Dag("cow-blocks")
    dag.operator("count", _count, stateful=True, key=clasp.identity)
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"count": {0: 1}}, 10))
    assert eng.ops[0].blocks
    boundary = 5 << CHUNK_BITS
    eng.ops[0].queue.append_block(0, [1, 2, 3], [1 << CHUNK_BITS], [3])
    drain(eng)
    eng.begin_barrier(boundary)
    below, live = Counter([1, 2, 3]), Counter([1, 2, 3])
    pending: tuple[list, list, list] = ([], [], [])
    for i, words in enumerate(lines):
        above = words[0][1]  # one line, one record: all its words on one side
        rid = (boundary + i) if above else (2 << CHUNK_BITS) + i
        values = [w for w, _ in words]
        pending[0].extend(values)
        pending[1].append(rid)
        pending[2].append(len(values))
        live.update(values)
        if not above:
            below.update(values)
        if rnd.random() < 0.3:
            eng.ops[0].queue.append_block(0, *pending)
            pending = ([], [], [])
        if rnd.random() < 0.3:
            eng.run_round()
        if rest_every and i % rest_every == 0:
            eng.rest_one()
    eng.ops[0].queue.append_block(0, *pending)
    drain(eng)
    assert snapshot(eng) == dict(below)
    assert eng.ops[0].state_dict() == dict(live)
    eng.release_barrier()
    assert snapshot(eng) == dict(live)


def test_a_block_that_straddles_the_boundary_runs_whole_and_keeps_the_cut():
    """One block with requests below the boundary before and after the first one above it at the same key,
    and a key only below it: each image is the state before the block's first request above the boundary
    plus every request below it, whatever their place in the block; a group no request above reached gets no
    image and the live state has every request."""
    dag = clasp.Dag("cow-straddle")
    dag.operator("count", _count, stateful=True, key=clasp.identity)
    spec = dag.to_spec()
    eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"count": {0: 1}}, 10))
    op = eng.ops[0]
    lone = next(w for w in (f"w{i}" for i in range(1000)) if op.group_of(w) not in {op.group_of("a"), op.group_of("b")})
    op.queue.append_block(0, ["a"], [1 << CHUNK_BITS], [1])
    drain(eng)
    boundary = 5 << CHUNK_BITS
    eng.begin_barrier(boundary)
    below, above = 2 << CHUNK_BITS, boundary + 1
    op.queue.append_block(0, ["a", "a", "b", "a", lone, "a"], [below, above, above, below, below],
                          [1, 1, 1, 2, 1])
    drain(eng)
    assert set(eng.cut.shadows[0]) == {op.group_of("a"), op.group_of("b")}
    assert snapshot(eng) == {"a": 4, lone: 1}
    assert op.state_dict() == {"a": 5, "b": 1, lone: 1}


def _quirky(state, word):
    """A count that fails on some words, deletes its key on others and returns no pair on others."""
    if word % 7 == 3:
        raise ValueError(word)
    if word % 11 == 5:
        return None, None
    if word % 13 == 6:
        return (state or 0) + 1
    return (state or 0) + 1, None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 60), max_size=40),
       st.sets(st.integers(0, 60), max_size=40), st.booleans(), st.booleans())
def test_a_block_below_the_boundary_reaches_the_images_as_its_requests_one_by_one(before, block, touched, rest,
                                                                                    python):
    """A block below the boundary at a count with images of some of its key groups (a rested group's blob or a
    decoded dict): applied to the images in one pass, every image is what the requests applied one by one in
    the block's order make, whatever the function does (fail, delete, return no pair), and a group with no
    image gets none."""
    from clasp.core import kernels
    from clasp.runtime.batches import group_bytes

    def images(one_by_one: bool) -> dict:
        dag = clasp.Dag("cow-images")
        dag.operator("count", _quirky, stateful=True, key=clasp.identity)
        spec = dag.to_spec()
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"count": {0: 1}}, 10))
        op = eng.ops[0]
        if before:
            op.queue.append_block(0, list(before), [1 << CHUNK_BITS], [len(before)])
            drain(eng)
        eng.begin_barrier(5 << CHUNK_BITS)
        for w in sorted(touched):
            g = op.group_of(w)
            if g not in eng.cut.shadows[0]:
                eng.cut.keep_image(op, g)
                if not rest:
                    eng.cut.shadows[0][g] = dict(op.groups[g])
        gs = group_bytes(op, block)
        if one_by_one:
            eng.cut.on_images(op, zip(gs, block, block, strict=True))
        else:
            eng.cut.on_block_images(op, list(block), gs)
        return {g: (msgpack.unpackb(i[0], raw=False, strict_map_key=False) if type(i) is tuple else i)
                for g, i in eng.cut.shadows[0].items()}

    saved = kernels.C
    kernels.C = None if python else saved
    try:
        assert images(False) == images(True)
    finally:
        kernels.C = saved
