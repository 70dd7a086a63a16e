"""Partition ownership from the source operator's shares, and minimal moves (clasp.core.partitions)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.partitions import assign_partitions, moved_partitions, partition_counts


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
