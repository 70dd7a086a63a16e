"""Partition ownership from the source operator's shares, and minimal moves (clasp.core.partitions)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.partitions import assign_partitions, moved_partitions, partition_counts, reassign, steal


def owned(owners):
    out = {}
    for w in owners.values():
        out[w] = out.get(w, 0) + 1
    return out


def test_proportional_and_every_worker_one_before_any_two():
    parts = [f"p{i}" for i in range(8)]
    owners = assign_partitions(parts, {"a": 3.0, "b": 1.0})
    assert owned(owners) == {"a": 6, "b": 2}
    assert partition_counts({"a": 1.0, "b": 1e-6, "c": 0.0}, 4) == {"a": 3, "b": 1}
    assert owned(assign_partitions(["x", "y"], {"a": 1.0, "b": 1.0, "c": 1.0})) in ({"a": 1, "b": 1},
                                                                                   {"a": 1, "c": 1},
                                                                                   {"b": 1, "c": 1})


def test_scale_out_then_in_moves_only_what_must_move():
    parts = [f"f{i}" for i in range(12)]
    one = assign_partitions(parts, {"w1": 1.0})
    four = assign_partitions(parts, dict.fromkeys(["w1", "w2", "w3", "w4"], 1.0), one)
    assert owned(four) == dict.fromkeys(["w1", "w2", "w3", "w4"], 3)
    assert len(moved_partitions(one, four)) == 9 and all(a == "w1" for a, _ in moved_partitions(one, four).values())
    two = assign_partitions(parts, {"w2": 1.0, "w3": 1.0}, four)
    moves = moved_partitions(four, two)
    assert len(moves) == 6 and all(a in ("w1", "w4") for a, _ in moves.values())


def test_no_partitions_and_no_share():
    assert assign_partitions([], {"a": 1.0}) == {}
    with pytest.raises(ValueError):
        assign_partitions(["p"], {"a": 0.0})


shares = st.dictionaries(st.sampled_from(list("abcdefg")), st.floats(0.0, 10.0), min_size=1).filter(
    lambda d: any(v > 0 for v in d.values()))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), shares, shares)
def test_every_partition_one_owner_proportional_and_fewest_moves(n, before, after):
    parts = [f"p{i}" for i in range(n)]
    old = assign_partitions(parts, before)
    new = assign_partitions(parts, after, old)
    assert set(new) == set(parts)
    assert all(after.get(w, 0) > 0 for w in new.values())
    target = partition_counts(after, n)
    assert owned(new) == {w: c for w, c in target.items() if c}
    # fewest moves: a partition moves only away from a worker over its new count (or without a share)
    must = sum(max(0, c - target.get(w, 0)) for w, c in owned(old).items())
    assert len(moved_partitions(old, new)) == must
    assert assign_partitions(parts, after, new) == new  # stable


def test_a_reader_with_nothing_left_takes_half_of_the_difference_last_listed_first():
    owners = {("s", str(i)): ("a" if i < 8 else "b") for i in range(16)}
    ended = {("s", str(i)) for i in range(8, 16)}
    assert steal(owners, ended, {"s": ["a", "b"]}) == {("s", str(i)): ("a", "b") for i in (7, 6, 5, 4)}
    three = steal(owners, ended, {"s": ["a", "b", "c"]})
    assert sorted(b for _, b in three.values()) == ["b", "b", "b", "c", "c"]
    assert steal(owners, set(), {"s": ["a", "b"]}) == {}  # every reader still has partitions to read
    assert steal(owners, ended, {"s": ["a"]}) == {}  # a worker without a share of the source reads nothing


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xy"), st.integers(0, 3), st.booleans()), max_size=30),
       st.lists(st.sampled_from("abcd"), min_size=1, max_size=4, unique=True))
def test_steals_even_out_only_what_is_left_and_only_once_a_reader_ran_dry(parts, readers):
    owners = {(op, f"p{i}"): "abcd"[w] for i, (op, w, _) in enumerate(parts)}
    ended = {(op, f"p{i}") for i, (op, _, done) in enumerate(parts) if done}
    ops = {"x": readers, "y": readers[:1] + ["d"]}
    moves = steal(owners, ended, ops)
    after = {**owners, **{k: b for k, (_, b) in moves.items()}}
    for k, (a, b) in moves.items():
        assert k not in ended and owners[k] == a != b and b in ops[k[0]]
    for op, workers in ops.items():
        left = {w: sum(1 for k, w2 in owners.items() if k[0] == op and k not in ended and w2 == w) for w in workers}
        now = {w: sum(1 for k, w2 in after.items() if k[0] == op and k not in ended and w2 == w) for w in workers}
        if len(workers) < 2 or min(left.values()) > 0:
            assert all(after[k] == owners[k] for k in owners if k[0] == op)
        else:
            assert max(now.values()) - min(now.values()) <= 1
            assert sum(now.values()) == sum(left.values())


def test_a_placement_change_with_the_same_shares_leaves_stolen_and_ended_partitions_where_they_are():
    # 16 partitions, 8 each; b read its 8 and took 4 of a's. A key-group rebalance (same shares) used to
    # send b's stolen partitions back to a, then a steal took them again.
    owners = {str(i): ("a" if i < 4 else "b") for i in range(16)}
    ended = {str(i) for i in range(8, 16)}
    after = reassign(list(owners), {"a": 1.0, "b": 1.0}, owners, ended)
    assert moved_partitions(owners, after) == {}
    # A worker that leaves hands on what it still reads, and its ended partitions too.
    gone = reassign(list(owners), {"a": 1.0}, owners, ended)
    assert set(gone.values()) == {"a"}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 30), shares, shares, st.sets(st.integers(0, 29)))
def test_reassign_keeps_ended_partitions_and_spreads_the_rest_by_share(n, before, after, done):
    parts = [f"p{i}" for i in range(n)]
    ended = {f"p{i}" for i in done if i < n}
    old = assign_partitions(parts, before)
    new = reassign(parts, after, old, ended)
    assert set(new) == set(parts) and all(after.get(w, 0) > 0 for w in new.values())
    for p in ended:
        if after.get(old[p], 0) > 0:
            assert new[p] == old[p]
    live = [p for p in parts if p not in ended]
    target = partition_counts(after, len(live))
    assert owned({p: new[p] for p in live}) == {w: c for w, c in target.items() if c}
    assert reassign(parts, after, new, ended) == new  # stable


def test_only_sources_whose_partitions_reopen_cheaply_are_stolen_from():
    from clasp.connectors.file_source import FileSource
    from clasp.connectors.kafka import KafkaSource
    from clasp.core.connector import Source
    from clasp.testing import IterableSource

    assert FileSource("x").splits and IterableSource([1]).splits
    assert not Source.splits.fget(None) and not KafkaSource("localhost:9", "t", until_end=True).splits
