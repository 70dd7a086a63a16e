"""Eq. (10)–(12) and the rounding rules: ≥ 1 per placed share, ≤ P_max per worker, totals preserved."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.parallelism import (
    distribute,
    initial_parallelism,
    largest_remainder,
    operator_parallelism,
    placement_parallelism,
    total_instances,
)


def test_largest_remainder():
    assert largest_remainder([1.5, 1.5, 1.0], 4) == [2, 1, 1]
    assert largest_remainder([0.1, 0.1, 9.8], 3, [1, 1, 0]) == [1, 1, 1]
    assert largest_remainder([0.0, 0.0], 3) == [2, 1]  # no weights: even split, ties to the lower index
    with pytest.raises(ValueError):
        largest_remainder([1.0, 1.0], 1, [1, 1])


def test_eq10_scales_the_total():
    assert total_instances(2.0, 10) == 20.0


def test_eq11_proportional_to_demand():
    # N·τ̄: A 1000·400 = 400000, B 7000·300 = 2100000 → shares 0.16 / 0.84 of 10
    assert operator_parallelism(10, {"A": 400000.0, "B": 2100000.0}) == {"A": 2, "B": 8}


def test_eq12_initial_placement_uses_p_max():
    p = initial_parallelism({"A": 100.0, "B": 300.0, "C": 600.0}, 10)
    assert p == {"A": 1, "B": 3, "C": 6}
    # every operator gets an instance even with negligible demand
    p = initial_parallelism({"A": 1e-9, "B": 1.0}, 10)
    assert p == {"A": 1, "B": 9}


def test_distribute_follows_shares():
    out = distribute({"A": 6}, {"A": {0: 0.5, 1: 0.25, 2: 0.25}}, 10)
    assert out == {"A": {0: 3, 1: 2, 2: 1}} or out == {"A": {0: 3, 1: 1, 2: 2}}
    assert sum(out["A"].values()) == 6


def test_worker_cap_moves_instances_to_free_workers():
    # B's 12 instances would put 9 on worker 0; worker 0 also hosts A (5) → cap 10 moves B's to worker 1.
    out = distribute({"A": 5, "B": 12}, {"A": {0: 1.0}, "B": {0: 0.75, 1: 0.25}}, 10)
    assert sum(out["A"].values()) + out["B"][0] <= 10
    assert out["B"][1] <= 10
    assert sum(out["B"].values()) == 12


def test_more_operators_than_slots_keeps_one_each():
    fractions = {f"op{i}": {0: 1.0} for i in range(12)}
    out = distribute(dict.fromkeys(fractions, 1), fractions, 10)
    assert all(out[o][0] == 1 for o in fractions)


@st.composite
def placements(draw):
    workers = draw(st.integers(1, 6))
    ops = draw(st.integers(1, 6))
    fractions = {}
    for i in range(ops):
        ws = draw(st.lists(st.integers(0, workers - 1), min_size=1, max_size=workers, unique=True))
        weights = [draw(st.floats(0.05, 1.0)) for _ in ws]
        total = sum(weights)
        fractions[f"o{i}"] = {w: x / total for w, x in zip(ws, weights, strict=True)}
    demand = {o: draw(st.floats(0.0, 1e6)) for o in fractions}
    return fractions, demand, draw(st.floats(0.1, 5.0)), draw(st.integers(0, 60)), draw(st.integers(1, 12))


@settings(max_examples=150, deadline=None)
@given(placements())
def test_rounding_rules(case):
    fractions, demand, scale, current, p_max = case
    out = placement_parallelism(fractions, demand, scale, current, p_max)
    per_worker = {}
    for o, pw in fractions.items():
        assert set(out[o]) == set(pw)  # instances exactly where the operator is placed
        assert all(c >= 1 for c in out[o].values())
        for w, c in out[o].items():
            per_worker.setdefault(w, []).append(c)
    for counts in per_worker.values():
        # never above P_max, unless one instance per hosted operator already exceeds it
        assert sum(counts) <= max(p_max, len(counts))
    workers = len(per_worker)
    shares = sum(len(pw) for pw in fractions.values())
    target = round(scale * current) if current > 0 else p_max * workers
    expected = min(max(target, shares), max(shares, p_max * workers))
    total = sum(c for pw in out.values() for c in pw.values())
    if all(len(c) <= p_max for c in per_worker.values()):
        assert total <= expected
    assert total >= shares
