"""Kernels of the batch-at-a-time path, on one operator and its values, with no routing and no progress of
their own (the executor, clasp.runtime.executor, does both): a stateless operator's function mapped over a
pass, the key groups of a batch of keys, a count's tight loop over a block, and the timing of a batch.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from itertools import chain, compress
from time import perf_counter

from clasp.core import kernels
from clasp.core.outputs import as_outputs
from clasp.core.routing import NUM_KEY_GROUPS, partition_runs
from clasp.runtime.operators import EXEC_BUCKETS, TIMING_SAMPLE, OpRuntime

LISTS = {list, tuple}  # return values that are their outputs as they are
LISTS_OR_NONE = {list, tuple, type(None)}  # and None, no outputs: a filter's "not this one"

Fail = Callable[[OpRuntime, BaseException, object], None]  # how a request's failure is reported


def estimate(op: OpRuntime, t_exec: float, timed: int, n: int, stall: float = 0.0) -> float:
    """Execution time of `n` requests from the `timed` of them that took `t_exec`; when every timed one
    was stalled, the operator's mean so far, or before it has one, `stall` a request: the most a request can
    have run with no throttled stretch inside. Counted as free instead, an operator slow enough that each of
    its timings looks stalled would never get a cost, and a scheduling round would run its whole queue."""
    if timed:
        return t_exec * n / timed
    if op.exec_time:
        return op.exec_time / op.processed * n
    return stall * n


def timed_batch(op: OpRuntime, dt: float, n: int, stall: float) -> None:
    """`n` requests of `op` ran in `dt` seconds as one batch: each counts as the mean in τ̄ and in the
    histogram (whose samples stand for TIMING_SAMPLE requests each), unless a throttled period inside makes
    the batch say nothing of τ̄, when the operator's mean stands. A throttled period lands in a batch once,
    whatever its length: the batch stalled when it took `stall` or more beyond what its requests take at the
    mean so far; with no mean yet, only when it took `stall` a request (the rule before: first batches set it)."""
    if op.exec_time:
        stalled = dt - n * op.exec_time / op.processed >= stall
    else:
        stalled = dt >= stall * n
    if not stalled:
        op.exec_time += dt
        # Straight into the histogram, as `fold_histogram` would count n // TIMING_SAMPLE samples of the mean.
        samples = max(1, n // TIMING_SAMPLE) * TIMING_SAMPLE
        op.hist[bisect_left(EXEC_BUCKETS, dt / n)] += samples
        op.exec_total += dt / n * samples
    else:
        op.exec_time += estimate(op, 0.0, 0, n, stall)
    op.processed += n


def map_outputs(op: OpRuntime, values: list, fail: Fail, none: bool = False) -> tuple[list, float]:
    """`op`'s function over `values` in C, each result as its outputs (clasp.core.outputs), and the seconds
    the map took. A failure is reported to `fail`, gives no outputs, and the map goes on after it. With
    `none`, a result that is None (no outputs) stays None, for a caller that skips the empty ones anyway."""
    results: list = []
    it = map(op.fn, values)
    t0 = perf_counter()
    while True:
        try:
            results.extend(it)  # what the map made before a failure stays in the list
            break
        except Exception as e:
            fail(op, e, values[len(results)])
            results.append(None)
    dt = perf_counter() - t0
    kinds = set(map(type, results))
    if kinds <= LISTS:
        return results, dt
    if kinds <= LISTS_OR_NONE:  # a map that filters: no call per value to find the Nones
        if not none:
            results = [() if out is None else out for out in results]
    else:
        results = [_outputs(op, out, v, fail) for out, v in zip(results, values, strict=True)]
    return results, dt


def _outputs(op: OpRuntime, out, value, fail: Fail) -> list | tuple:
    try:
        return as_outputs(out)
    except Exception as e:  # a generator's body raised: the request fails
        fail(op, e, value)
        return ()


def group_bytes(op: OpRuntime, keys: list) -> bytes:
    """The key group of each key as bytes, from `op`'s key cache (a miss takes the hashing call): one `map`
    in C; with the kernels (`clasp.core.kernels`), an ASCII string's group is hashed in C and only other keys
    ask the cache (a string's CRC costs less than finding it in a cache of many thousands). Raises what the
    key cache raises for a key that cannot be one (unhashable, not serializable)."""
    if kernels.C is not None and type(keys) is list:
        return kernels.C.key_groups(keys, op.key_cache.__getitem__, NUM_KEY_GROUPS)
    return bytes(map(op.key_cache.__getitem__, keys))


def gather_outputs(target: OpRuntime, results: list, rids: list, counts: list, owners: list,
                   ) -> tuple[dict, bytes]:
    """The outputs of a pass, `results[i]` those of the request with record id `rids[i]` (`counts[i]` of them),
    for `target`, a keyed successor whose key is the value: split by the owner of their key groups (`owners`,
    key group -> destination) as `partition_runs` splits them, {destination: (values, record ids as runs,
    their counts, key groups as bytes)} for the destinations that get any, and the key groups of all of them
    in order (bytes). With the kernels, in two passes in C over the outputs (`gather`); else flattened, then
    their groups (`group_bytes`) and `partition_runs`. Raises what the key cache raises for a value that
    cannot be a key."""
    if kernels.C is not None and type(results) is list and type(rids) is list:
        made = target.owner_table
        if made is None or made[0] is not owners:  # a route's owners never change: a new route, a new list
            dests = list(dict.fromkeys(owners))
            index = {d: i for i, d in enumerate(dests)}
            made = target.owner_table = (owners, dests, bytes(map(index.__getitem__, owners)).ljust(256, b"\0"))
        _, dests, table = made
        parts, gs = kernels.C.gather(results, rids, target.key_cache.__getitem__, NUM_KEY_GROUPS, table,
                                     len(dests))
        return {d: tuple(p) for d, p in zip(dests, parts, strict=True) if p[0]}, gs
    values = list(chain.from_iterable(results))
    gs = group_bytes(target, values)
    return partition_runs(values, list(compress(rids, counts)), list(compress(counts, counts)), gs, owners), gs


def distinct_groups(groups: bytes | list):
    """The key groups in a block's (bytes: in C with the kernels, no int object per value)."""
    return kernels.C.groups_in(groups) if kernels.C is not None and type(groups) is bytes else set(groups)


def apply_block(op: OpRuntime, values: list, groups: bytes | list, fail: Fail) -> float:
    """A stateful operator keyed by the value on its live state, once per value (of key group `groups[i]`)
    in a tight loop (its outputs go nowhere); returns the seconds the loop took. The loop is in C where the
    kernels are built (`clasp.core.kernels`), and hands back the values it cannot finish alone (fn raised, or
    returned something other than a pair), which Python finishes as its own loop would."""
    rested = op.rested
    for g in distinct_groups(groups):
        rested[g] = None  # before fn runs: it may change `old` in place, even when it then raises
    t0 = perf_counter()
    apply_to(op, op.groups, values, groups, fail)
    return perf_counter() - t0


def apply_to(op: OpRuntime, dicts: list, values: list, groups: bytes | list, fail: Fail) -> None:
    """`op`'s function once per value on `dicts[groups[i]]` (a dict for every group of `groups`), as `apply_block`
    runs it on the live state: in C where the kernels are built. A checkpoint's barrier runs it on its images."""
    if kernels.C is not None and type(values) is list:
        _apply_kernel(op, dicts, values, groups, fail)
    else:
        _apply_loop(op, op.fn, values, map(dicts.__getitem__, groups), fail)


def _apply_loop(op: OpRuntime, fn, values, states, fail: Fail) -> None:
    for key, state in zip(values, states, strict=True):
        old = state.get(key)
        try:
            new, _ = fn(old, key)
        except Exception as e:
            fail(op, e, key)
            continue
        if new is not None:
            state[key] = new
        elif old is not None:
            del state[key]


def _apply_kernel(op: OpRuntime, dicts: list, values: list, groups: bytes | list, fail: Fail) -> None:
    fn, run, i = op.fn, kernels.C.apply_block, 0
    while True:
        i, kind, payload = run(fn, values, groups, dicts, i)
        if i >= len(values):
            return
        if kind == kernels.RAISED:
            fail(op, payload, values[i])
        elif kind == kernels.RETURNED:  # unpacked by the loop, to fail as its unpacking does
            _apply_loop(op, lambda _old, _key, out=payload: out, values[i:i + 1], [dicts[groups[i]]], fail)
        else:  # a key group the kernel leaves to the loop
            _apply_loop(op, fn, values[i:i + 1], [dicts[groups[i]]], fail)
        i += 1
