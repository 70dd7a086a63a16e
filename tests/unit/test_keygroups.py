"""Key-group ownership from shares, and minimal moves on reassignment."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.keygroups import assign_key_groups, diff_key_groups, group_counts
from clasp.core.routing import NUM_KEY_GROUPS, key_group
from clasp.runtime.operators import KeyCache


def counts(owners):
    out = {}
    for w in owners:
        out[w] = out.get(w, 0) + 1
    return out


def test_default_is_128_groups():
    assert NUM_KEY_GROUPS == 128


def test_proportional_fresh_assignment_is_contiguous():
    owners = assign_key_groups({0: 3.0, 1: 1.0}, 128)
    assert owners == [0] * 96 + [1] * 32


def test_largest_remainder_and_minimum_one():
    assert group_counts({0: 1.0, 1: 1.0, 2: 1.0}, 128) == {0: 43, 1: 43, 2: 42}
    # a tiny share still owns one group
    assert group_counts({0: 1.0, 1: 1e-6}, 128) == {0: 127, 1: 1}
    # zero share owns nothing
    assert group_counts({0: 1.0, 5: 0.0}, 8) == {0: 8}


def test_scale_out_moves_only_what_the_new_worker_needs():
    old = assign_key_groups({0: 1.0, 1: 1.0}, 128)
    new = assign_key_groups({0: 1.0, 1: 1.0, 2: 1.0}, 128, previous=old)
    moves = diff_key_groups(old, new)
    moved = sum(len(g) for g in moves.values())
    assert moved == 42  # the new worker's share, and nothing shuffled between 0 and 1
    assert set(moves) == {(0, 2), (1, 2)}
    assert counts(new) == {0: 43, 1: 43, 2: 42}


def test_removed_worker_hands_its_groups_over():
    old = assign_key_groups({0: 1.0, 1: 1.0, 2: 1.0}, 128)
    new = assign_key_groups({0: 1.0, 1: 1.0}, 128, previous=old)
    assert 2 not in new
    assert all(src == 2 for src, _ in diff_key_groups(old, new))


def test_errors():
    with pytest.raises(ValueError):
        assign_key_groups({0: 0.0}, 128)
    with pytest.raises(ValueError):
        assign_key_groups({0: -1.0, 1: 2.0}, 128)
    with pytest.raises(ValueError):
        assign_key_groups({0: 1.0}, 0)
    with pytest.raises(ValueError):
        diff_key_groups([0, 1], [0])


shares_st = st.dictionaries(st.integers(0, 12), st.floats(0.01, 10.0), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(shares_st, shares_st, st.sampled_from([8, 32, 128]))
def test_reassignment_moves_the_minimum(before, after, num_groups):
    old = assign_key_groups(before, num_groups)
    new = assign_key_groups(after, num_groups, previous=old)
    assert len(new) == num_groups
    target = group_counts(after, num_groups)
    assert counts(new) == target
    prev = counts(old)
    # Every group whose owner keeps a slot stays; only the deficit moves — the lower bound for any
    # ownership with these counts.
    lower_bound = sum(max(0, target[w] - prev.get(w, 0)) for w in target)
    moved = sum(len(g) for g in diff_key_groups(old, new).values())
    assert moved == lower_bound
    # proportionality: within one group of the exact quota, when no one-group minimum distorts it
    total = sum(after[w] for w in target)
    quotas = {w: num_groups * after[w] / total for w in target}
    if all(q >= 1 for q in quotas.values()):
        for w, c in target.items():
            assert abs(c - quotas[w]) < 1 + 1e-9


def test_weighted_ownership_gives_each_worker_its_share_of_the_requests_not_of_the_groups():
    """One hot group carrying 30 % of the requests, the rest spread: by count the hot group's owner would
    carry its σ of the groups plus the hot one; by weight each worker's requests follow its share."""
    from clasp.core.keygroups import assign_weighted

    weights = [30.0] + [70.0 / 127] * 127
    shares = {0: 0.34, 1: 0.33, 2: 0.33}
    owners = assign_weighted(shares, weights)
    load = {w: sum(v for g, v in enumerate(weights) if owners[g] == w) for w in shares}
    for w, s in shares.items():
        assert abs(load[w] - 100.0 * s) <= 1.0, load
    by_count = assign_key_groups(shares, 128)
    hot_owner = by_count[0]
    assert sum(v for g, v in enumerate(weights) if by_count[g] == hot_owner) > 50.0
    # Kept where it may stay: the same shares and weights again move nothing.
    assert assign_key_groups(shares, 128, owners, weights) == owners


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.floats(0.01, 1.0), min_size=1, max_size=8),
       st.lists(st.floats(0.0, 100.0), min_size=128, max_size=128), st.booleans())
def test_weighted_ownership_covers_every_group_and_every_worker_within_one_group(shares, weights, keep):
    from clasp.core.keygroups import assign_weighted

    previous = assign_key_groups(shares, 128) if keep else None
    owners = assign_weighted(shares, weights, previous)
    assert len(owners) == 128 and set(owners) == set(shares)
    floor = 0.01 * sum(weights) / 128
    w = [v + floor for v in weights]
    total, share_total = sum(w), sum(shares.values())
    for worker, s in shares.items():
        carried = sum(v for g, v in enumerate(w) if owners[g] == worker)
        # LPT: no worker is further above its target than the heaviest group (plus what a kept group may add).
        assert carried <= s / share_total * total + 1.5 * max(w) + 1e-6


_numbers = st.one_of(st.booleans(), st.integers(-2**63, 2**64 - 1),
                     st.integers(-2**53, 2**53).map(float), st.floats(allow_nan=False))
_keys = st.recursive(st.one_of(_numbers, st.text(max_size=4)), lambda inner: st.tuples(inner, inner), max_leaves=6)


def _equal_variant(key, inside=False):
    """A key Python holds equal to `key` but of other types where there is one (bool, int, float); inside a
    tuple, only ints msgpack can carry."""
    if isinstance(key, tuple):
        return tuple(_equal_variant(k, True) for k in key)
    if isinstance(key, bool):
        return int(key)
    if isinstance(key, int) and abs(key) <= 2**53:
        return float(key) if key not in (0, 1) else bool(key)
    if isinstance(key, float) and key.is_integer() and (-2**63 <= key < 2**64 or not inside):
        return int(key)
    return key


@settings(max_examples=300, deadline=None)
@given(_keys)
def test_keys_python_holds_equal_share_a_key_group(key):
    other = _equal_variant(key)
    assert other == key
    assert key_group(other) == key_group(key)


def test_a_key_cache_answers_equal_keys_with_their_one_group():
    """A worker that saw `False` first and one that saw `0` first put `0` in the same group."""
    first_false, first_zero = KeyCache(), KeyCache()
    assert first_false[False] == first_zero[0] == first_false[0] == first_zero[False] == key_group(0.0)
    assert first_false[(1.0, "a")] == first_zero[(True, "a")] == key_group((1, "a"))
