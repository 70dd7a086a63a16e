"""The keyed fast path (a keyed successor whose key is the value, spread over workers): words routed in
passes over a line, the remote ones batched as columns. Per-key order from one sender must hold while
the engine switches between it and the general path (routes rebuilt, a key group held by a migration),
and the counts must be exact; no sockets."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core import protocol
from clasp.core.routing import build_placement
from clasp.core.tracking import Tracker
from clasp.runtime.engine import JobEngine


def identity_dag() -> clasp.Dag:
    """split → an order-sensitive history per word, keyed by the word itself (the fast path)."""
    d = clasp.Dag("fast-id")
    s = d.operator("split", lambda line: line.split()[1:])
    d.operator("hist", lambda st, w: ((st or 0) + 1, w), stateful=True, key=clasp.identity, collect=True)
    s >> d.operators[1]
    return d


def deliver(src: JobEngine, engines: dict) -> int:
    n = 0
    for dest, (groups, k) in src.take_batches().items():
        body = protocol.decode(protocol.encode_columns(src.job, src.epoch, groups))[1]
        protocol.open_columns(body[2], protocol.string_table())
        protocol.check_columns(body[2], len(src.ops))
        engines[dest].receive_columns(body[1], body[2])
        n += k
    return n


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["run", "settle", "hold", "release", "flush"]), min_size=1, max_size=40),
       st.integers(0, 2**32 - 1))
def test_per_key_order_from_one_sender_survives_switching_paths(actions, seed):
    rnd = random.Random(seed)
    spec = identity_dag().to_spec()
    placement = build_placement(spec, ["w0", "w1"], {"split": {0: 1}, "hist": {0: 1, 1: 1}}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ("w0", "w1")}
    w0 = engines["w0"]
    vocab = [f"k{i}" for i in range(40)]
    sent = []  # (word, rid) in the order w0's split ran them
    rid = 0
    held_group = None
    for a in actions:
        if a == "run":
            for _ in range(rnd.randint(1, 30)):
                words = rnd.choices(vocab, k=rnd.randint(1, 8))
                w0.enqueue_rows([(0, f"{rid} " + " ".join(words), None, rid)])
                sent.extend((w, rid) for w in words)
                rid += 1
            while w0.run_round():
                pass
        elif a == "settle":
            w0.apply_placement(w0.placement)
        elif a == "hold" and held_group is None:
            owners = placement.operators["hist"].key_groups
            held_group = rnd.choice([g for g, o in enumerate(owners) if o == "w0"])
            w0.begin_migration(placement, {1: {held_group}})
            while w0.run_round():
                pass
        elif a == "release" and held_group is not None:
            w0.release_groups({1: [held_group]})
            held_group = None
        elif a == "flush":
            deliver(w0, engines)
            while engines["w1"].run_round():
                pass
    if held_group is not None:
        w0.release_groups({1: [held_group]})
    while w0.run_round():
        pass
    deliver(w0, engines)
    for e in engines.values():
        while e.run_round():
            pass
    # Every word ran once, on its group's owner, in the order w0 sent it.
    got = []
    for e in engines.values():
        op = e.ops[1]
        got.extend(zip(op.collected, op.collected_rids, strict=True))
    by_word: dict = {}
    for w, r in got:
        by_word.setdefault(w, []).append(r)
    expected: dict = {}
    for w, r in sent:
        expected.setdefault(w, []).append(r)
    assert {w: sorted(rs) for w, rs in by_word.items()} == expected
    for w, rs in by_word.items():
        assert rs == sorted(rs), f"word {w} ran out of order: {rs}"


def test_the_fast_path_counts_progress_exactly():
    spec = identity_dag().to_spec()
    placement = build_placement(spec, ["w0", "w1"], {"split": {0: 1}, "hist": {0: 1, 1: 1}}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ("w0", "w1")}
    t = Tracker()
    lines = [f"{i} " + " ".join(f"k{(i * 7 + j) % 50}" for j in range(i % 6)) for i in range(3000)]
    base = t.admit(len(lines), 0.0)
    engines["w0"].enqueue_rows([(0, line, None, base + i) for i, line in enumerate(lines)])
    t.dispatched(base, len(lines), {e: {0: n} for e, n in _per_epoch(base, len(lines)).items()}, 0.0)
    run_until_complete(engines, t)
    assert t.outstanding == 0 and t.completed == len(lines)
    assert engines["w0"].outbox.remote_requests > 0 and engines["w0"].outbox.local_requests > 0


def run_until_complete(engines: dict, t: Tracker, rounds: int = 100) -> None:
    """Rounds on every engine, their columns delivered and their progress reported, until the tracker has
    nothing outstanding (or `rounds` passed)."""
    for _ in range(rounds):
        for e in engines.values():
            while e.run_round():
                pass
            deliver(e, engines)
            t.progress(e.take_progress(), 1.0)
        if t.outstanding == 0:
            return


def _per_epoch(first: int, n: int) -> dict:
    from clasp.core.tracking import add_range

    counts: dict = {}
    add_range(counts, 0, first, n)
    return {e: c[0] for e, c in counts.items()}


def _split_or_fail(line):
    """Words as a list, a tuple, a generator or None, and a failure: every return form the gathered pass
    takes."""
    if "boom" in line:
        raise ValueError("no words in a boom")
    words = line.split()
    if len(words) % 4 == 1:
        return tuple(words)
    if len(words) % 4 == 2:
        return (w for w in words)
    return words or None


def _count_or_fail(state, word):
    if word.startswith("bad"):
        raise ValueError(f"no count for {word}")
    return (state or 0) + 1, None


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(0, 2**32 - 1))
def test_blocks_of_a_count_without_outputs_count_exactly_and_report_failures(workers, seed):
    """A stateful operator keyed by the value with no successor and no collection (Word Count's count) runs
    its blocks in the tight loop: exact state, exact progress per epoch, every failing request counted and
    named, on one engine and on two exchanging columns."""
    from collections import Counter

    rnd = random.Random(seed)
    d = clasp.Dag("blocks")
    d.operator("split", _split_or_fail) >> d.operator("count", _count_or_fail, stateful=True, key=clasp.identity)
    spec = d.to_spec()
    ids = [f"w{i}" for i in range(workers)]
    shares = {i: 1 for i in range(workers)}
    placement = build_placement(spec, ids, {"split": shares, "count": shares}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ids}
    vocab = [f"k{i}" for i in range(300)] + ["bad1", "bad2"]
    lines = [" ".join(rnd.choices(vocab, k=rnd.randint(0, 12))) for _ in range(rnd.randint(1, 3000))]
    lines = [line if rnd.random() > 0.02 else line + " boom" for line in lines]
    t = Tracker()
    base = t.admit(len(lines), 0.0)
    step = -(-len(lines) // workers)
    for k, w in enumerate(ids):
        part = lines[k * step:(k + 1) * step]
        engines[w].enqueue_rows([(0, line, None, base + k * step + i) for i, line in enumerate(part)])
    t.dispatched(base, len(lines), {e: {0: n} for e, n in _per_epoch(base, len(lines)).items()}, 0.0)
    run_until_complete(engines, t)
    assert t.outstanding == 0 and t.completed == len(lines)
    words = Counter(w for line in lines if "boom" not in line for w in line.split())
    bad = words.pop("bad1", 0) + words.pop("bad2", 0)
    booms = sum("boom" in line for line in lines)
    state: dict = {}
    for e in engines.values():
        state.update(e.ops[1].state_dict())
    assert state == dict(words)
    assert sum(e.executor.failed for e in engines.values()) == bad + booms
    assert sum(e.ops[0].errors for e in engines.values()) == booms
    samples = [s for e in engines.values() for s in e.executor.error_samples]
    assert all("no count for bad" in s["error"] or "no words in a boom" in s["error"] for s in samples)
    assert samples or not bad + booms
    count = [e.ops[1] for e in engines.values()]
    assert sum(op.processed for op in count) == sum(words.values()) + bad
    assert all(op.exec_time >= 0 for op in count)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_the_routed_words_weigh_their_key_groups_exactly(workers, seed):
    """Every word the fast path routes counts once in its key group's weight (the planner sums them into the
    groups' weights), on one engine holding every group and on several exchanging columns, whose key groups
    travel as bytes, one per value."""
    from collections import Counter

    from clasp.core.routing import key_group

    rnd = random.Random(seed)
    d = clasp.Dag("weights")
    d.operator("split", str.split) >> d.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True,
                                                 key=clasp.identity)
    spec = d.to_spec()
    ids = [f"w{i}" for i in range(workers)]
    shares = {i: 1 for i in range(workers)}
    placement = build_placement(spec, ids, {"split": shares, "count": shares}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ids}
    vocab = [f"k{i}" for i in range(500)]
    lines = [" ".join(rnd.choices(vocab, k=rnd.randint(1, 9))) for _ in range(rnd.randint(1, 2000))]
    for k, line in enumerate(lines):
        engines[ids[k % workers]].enqueue_rows([(0, line, None, k)])
    for _ in range(20):
        for e in engines.values():
            while e.run_round():
                pass
            for dest, (groups, _) in e.take_batches().items():
                body = protocol.decode(protocol.encode_columns(e.job, e.epoch, groups))[1]
                protocol.open_columns(body[2], protocol.string_table())
                assert all(type(g[5]) is bytes and len(g[5]) == len(g[1]) for g in body[2] if len(g) > 5)
                protocol.check_columns(body[2], len(e.ops))
                engines[dest].receive_columns(body[1], body[2])
    words = Counter(w for line in lines for w in line.split())
    expected = Counter()
    for w, n in words.items():
        expected[key_group(w)] += n
    hits = [sum(e.ops[1].hits()[g] for e in engines.values()) for g in range(len(engines["w0"].ops[1].group_hits))]
    assert {g: n for g, n in enumerate(hits) if n} == dict(expected)
    state: dict = {}
    for e in engines.values():
        state.update(e.ops[1].state_dict())
    assert state == dict(words)


def _words_and_lists(line):
    """Words, and a list (which cannot be a key) for each word that starts with x."""
    return [[w] if w.startswith("x") else w for w in line.split()]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["function", "identity", "two routes"]), st.integers(1, 2), st.integers(0, 2**32 - 1))
def test_a_value_that_cannot_be_a_key_fails_alone_on_every_keyed_path(shape, workers, seed):
    """A map's outputs reach a stateful operator keyed by a function (a pass at a time), by the value itself
    (gathered blocks) or, with a second route, one request at a time: an output whose key is unhashable is
    reported as the key's failure and goes nowhere; every other word is counted exactly, and progress
    completes (before, the successor's loop raised and the worker process died)."""
    from collections import Counter

    rnd = random.Random(seed)
    d = clasp.Dag("bad-keys")
    split = d.operator("split", _words_and_lists)
    count = d.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True,
                       key=clasp.identity if shape == "identity" else (lambda w: w))
    split >> count
    if shape == "two routes":
        split >> d.operator("echo", lambda w: None)
    spec = d.to_spec()
    ids = [f"w{i}" for i in range(workers)]
    shares = {i: 1 for i in range(workers)}
    placement = build_placement(spec, ids, {op.name: shares for op in spec.operators}, 10)
    engines = {w: JobEngine(1, spec, w, placement) for w in ids}
    vocab = [f"k{i}" for i in range(50)] + ["x1", "x2"]
    lines = [" ".join(rnd.choices(vocab, k=rnd.randint(0, 10))) for _ in range(rnd.randint(1, 500))]
    t = Tracker()
    base = t.admit(len(lines), 0.0)
    engines["w0"].enqueue_rows([(0, line, None, base + i) for i, line in enumerate(lines)])
    t.dispatched(base, len(lines), {e: {0: n} for e, n in _per_epoch(base, len(lines)).items()}, 0.0)
    run_until_complete(engines, t)
    assert t.outstanding == 0 and t.completed == len(lines)
    words = Counter(w for line in lines for w in line.split())
    lists = words.pop("x1", 0) + words.pop("x2", 0)
    state: dict = {}
    for e in engines.values():
        state.update(e.ops[1].state_dict())
    assert state == dict(words)
    assert sum(e.executor.failed for e in engines.values()) == lists
    assert all("unhashable" in s["error"] for e in engines.values() for s in e.executor.error_samples)
