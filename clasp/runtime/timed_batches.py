"""Kernels of the keyed time operators' (`dag.window`, `dag.join`, `dag.timers`) and their feeding maps' batch
path: the executor (clasp.runtime.executor) hands them a pass of rows and they run it a key, or a whole pass, at
a time, with the progress, the outputs and the failures each request would have had on the row-at-a-time path.

- `apply_timed`: a pass of a keyed time operator's requests grouped by key (each key's in arrival order), each
  key's run by `TimedFold.run` (a window folds a key's records in one pass, its state copied once), its outputs
  sent as the children of the request that made them. Keys are independent and the watermark stands still
  within a pass, so running key by key gives every key the states and outputs that request by request does.
  A timers operator's pass runs request by request on the states in place (`TimedFold.run_rows`): its function
  is called once a record either way, and a pass holds a few records a key, too few to pay for a batch each.
- `map_keyed`: a pass of a stateless operator whose one successor is keyed by a function (a Nexmark query's
  map before its window or join): its function over the values in C, the key function over the outputs in a
  tight loop, the rows for the successor built in C when every key group is here.
- `map_local`: a pass of a stateless operator whose one successor is a stateless operator here (a query's map
  before a join's side marker): its function over the values in C, the successor's rows queued in C.
- `collect_pass`: a pass of a stateless operator whose outputs are collected and go nowhere else (a query's
  answer): its function over the values in C, the outputs and their records' ids extended in C.

The last three take their requests as columns (`RecordQueue.take_columns`: values and record ids per segment),
so a source's batch (a `Run`) is mapped as the list it was read into, its progress counted per epoch by
arithmetic over its consecutive ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import itemgetter, length_hint
from time import perf_counter

from clasp.core.tracking import epoch_counts, epoch_spans, epochs_of_runs
from clasp.runtime.batches import group_bytes, map_outputs, timed_batch
from clasp.runtime.operators import OperatorError, OpRuntime
from clasp.runtime.outbox import KEYED_HERE


def apply_timed(ex, op: OpRuntime, rows: list) -> None:
    """Rows `(op, value, key, rid)` of keyed time operator `op` on its live state (no checkpoint barrier up)."""
    n = len(rows)
    me = op.index
    for e, used in epoch_counts(map(itemgetter(3), rows)).items():
        ex._ran(e, me, used, me, 0)
    if op.fn.by_row:
        _apply_rows(ex, op, rows)
        return
    by_key: dict = {}
    for i, r in enumerate(rows):
        at = by_key.get(r[2])
        if at is None:
            by_key[r[2]] = [i]
        else:
            at.append(i)
    fold, groups, rested, group_of = op.fn, op.groups, op.rested, op.key_cache.__getitem__
    sent: list = []
    t0 = perf_counter()
    for key, at in by_key.items():
        g = group_of(key)
        d = groups[g]
        rested[g] = None
        old = d.get(key)
        new, outs, failed = fold.run(old, key, [rows[i][1] for i in at])
        if new is not None:
            d[key] = new
        elif old is not None:
            del d[key]
        for i, e in failed:
            ex.fail(op, e, rows[at[i]][1])
        for i, o in outs:
            sent.append((at[i], o))
    dt = perf_counter() - t0
    if sent:
        sent.sort(key=itemgetter(0))  # in the order of the requests that made them
        _send(ex, op, rows, sent)
    timed_batch(op, dt, n, ex.stall)


def _apply_rows(ex, op: OpRuntime, rows: list) -> None:
    """A timers operator's pass, a record at a time (`TimedFold.run_rows`), on the states in place."""
    keys = list(map(itemgetter(2), rows))
    gs = list(map(op.key_cache.__getitem__, keys))
    rested = op.rested
    for g in set(gs):
        rested[g] = None  # before the user's function runs
    dicts = list(map(op.groups.__getitem__, gs))
    t0 = perf_counter()
    sent, failed = op.fn.run_rows(dicts, keys, list(map(itemgetter(1), rows)))
    dt = perf_counter() - t0
    for i, e in failed:
        ex.fail(op, e, rows[i][1])
    if sent:
        _send(ex, op, rows, sent)
    timed_batch(op, dt, len(rows), ex.stall)


def _send(ex, op: OpRuntime, rows: list, sent: list) -> None:
    """Each `(i, outputs)` of `sent` (in request order) as the outputs of request `rows[i]`."""
    routes, collect = op.routes, op.add_collected if op.collect else None
    for i, o in sent:
        rid = rows[i][3]
        if collect is not None:
            collect(o, rid)
        if routes:
            ex.send(op, o, rid)


def map_keyed(ex, op: OpRuntime, parts: list) -> int:
    """A pass of stateless `op` whose one route goes to a stateful successor keyed by a function, on `parts`
    (`RecordQueue.take_columns`). Every successor's key group here (KEYED_HERE): its rows built in C behind its
    queue; otherwise each output to its group's owner as `send` would."""
    return sum(_map_keyed(ex, op, values, rids) for values, rids in parts)


def _map_keyed(ex, op: OpRuntime, values_in: list, rids) -> int:
    n = len(values_in)
    results, dt, counts = _map_pass(ex, op, values_in)
    kind, succ, append, owners, _, target = op.routes[0]
    key_fn = target.key_fn
    values, out_rids = _outputs(results, rids, counts)
    out_rids = list(out_rids)
    try:
        keys = list(map(key_fn, values))
        gs = group_bytes(target, keys)
    except Exception:  # a key that cannot be had or cannot be one: each output alone, the failure reported
        keys = None
    made = counts
    if keys is None:
        keys, made, kept_groups = [], list(counts), bytearray()
        key_cache = target.key_cache
        pos = 0
        for j, c in enumerate(counts):
            for v in values[pos:pos + c]:
                try:
                    key = key_fn(v)
                    kept_groups.append(key_cache[key])
                except Exception as e:
                    ex.fail(target, OperatorError(f"key function of {target.name!r} failed: {e!r}"), v)
                    keys.append(_NO_KEY)
                    made[j] -= 1
                    continue
                keys.append(key)
            pos += c
        gs = bytes(kept_groups)
    _progress(ex, op.index, rids, succ, made)
    timed_batch(op, dt, n, ex.stall)
    if made is not counts:  # the outputs whose key failed go nowhere
        kept = [k is not _NO_KEY for k in keys]
        values, keys, out_rids = (list(compress(x, kept)) for x in (values, keys, out_rids))
    if not values:
        return n
    target.weigh(gs)
    if kind == KEYED_HERE:
        target.queue.extend(zip(repeat(succ), values, keys, out_rids))
        ex.outbox.local_requests += len(values)
        op.edge_counts[0] += len(values)
        return n
    pending = ex.outbox.pending
    local = 0
    for row, d in zip(zip(repeat(succ), values, keys, out_rids), map(owners.__getitem__, gs), strict=True):
        if d is None:
            append(row)
            local += 1
        elif d in pending:
            pending[d].append(row)
        else:
            pending[d] = [row]
    remote = len(values) - local
    if remote and ex.outbox.pending_since is None:
        ex.outbox.pending_since = perf_counter()
    ex.outbox.local_requests += local
    ex.outbox.remote_requests += remote
    op.edge_counts[0] += len(values)
    return n


def map_local(ex, op: OpRuntime, parts: list) -> int:
    """A pass of stateless `op` whose one route is a stateless operator here (a join's side marker after a
    Nexmark query's map), on `parts` (`RecordQueue.take_columns`): its function over the values in C, the
    successor's rows made and queued in C unless a checkpoint barrier filters them."""
    _, succ, append, _, _, _ = op.routes[0]
    queue = ex.ops[succ].queue
    n = 0
    for values_in, rids in parts:
        results, dt, counts = _map_pass(ex, op, values_in)
        _progress(ex, op.index, rids, succ, counts)
        timed_batch(op, dt, len(values_in), ex.stall)
        n += len(values_in)
        values, out_rids = _outputs(results, rids, counts)
        if values:
            made = zip(repeat(succ), values, repeat(None), out_rids)
            if append == queue.append:
                queue.extend(made)
            else:  # the barrier's filter: rows above it are held
                for row in made:
                    append(row)
            ex.outbox.local_requests += len(values)
            op.edge_counts[0] += len(values)
    return n


def collect_pass(ex, op: OpRuntime, parts: list) -> int:
    """A pass of stateless `op` with no route whose outputs are collected (not a sink's writer), on `parts`
    (`RecordQueue.take_columns`)."""
    n = 0
    for values, rids in parts:
        results, dt = map_outputs(op, values, ex.fail, none=True)
        _progress(ex, op.index, rids, op.index, None)
        timed_batch(op, dt, len(values), ex.stall)
        n += len(values)
        # The requests with outputs only (None and empty lists are false), picked in C: a filter's pass has few.
        made = list(compress(results, results))
        if made:
            op.collected.extend(chain.from_iterable(made))
            op.collected_rids.extend(chain.from_iterable(map(repeat, compress(rids, results), map(len, made))))
    return n


def _map_pass(ex, op: OpRuntime, values: list) -> tuple[list, float, list]:
    """`op`'s function over a pass's values in C: (each one's outputs, None for none, the seconds, how many
    outputs each made)."""
    results, dt = map_outputs(op, values, ex.fail, none=True)
    return results, dt, list(map(length_hint, results))  # None's is 0


def _outputs(results: list, rids, counts: list) -> tuple[list, Iterator]:
    """A pass's outputs in order and the record id of each, the requests that made none skipped in C: a
    filter's pass (a Nexmark query's selection) keeps few, and a row's id made per request is then waste."""
    if 0 in counts:
        results, rids, counts = compress(results, counts), compress(rids, counts), list(compress(counts, counts))
    if max(counts, default=1) == 1:  # one output a request (a keying map): the requests' ids, no repeat made each
        return list(chain.from_iterable(results)), iter(rids)
    return list(chain.from_iterable(results)), chain.from_iterable(map(repeat, rids, counts))


def _progress(ex, me: int, rids, succ: int, made: list | None) -> None:
    """A pass's progress: its requests (ids `rids`) finished at `me`, having made `made[i]` children each at
    `succ` (None: none), counted per epoch: by arithmetic over a source batch's `range` of ids, else per
    run of one epoch."""
    if type(rids) is range:
        for e, a, b in epoch_spans(rids):
            ex._ran(e, me, b - a, succ, sum(made[a:b]) if made is not None else 0)
    elif made is None:
        for e, used in epoch_counts(rids).items():
            ex._ran(e, me, used, me, 0)
    else:
        for e, used, k in epochs_of_runs(rids, repeat(1), made):
            ex._ran(e, me, used, succ, k)


_NO_KEY = object()  # an output whose key function raised: it goes nowhere
