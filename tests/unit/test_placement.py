"""Load derivation, placement order, next-fit, and the worker-limit search."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clasp.core.model import CapacityModel
from clasp.core.placement import (
    InfeasiblePlacement,
    Load,
    LoadError,
    NoPlacementError,
    WorkerLimitCache,
    WorkerLimitExceeded,
    derive_load,
    highest_rate_placement,
    place,
    placement_order,
    scale_factor,
    topological_order,
)

FIG6_EDGES = [("A", "B"), ("B", "C"), ("C", "E"), ("A", "D"), ("D", "E")]
FIG6_RATES = {("A", "B"): 7, ("B", "C"): 8, ("C", "E"): 10, ("A", "D"): 10, ("D", "E"): 6}


def test_fig6_order():
    assert placement_order(list("ABCDE"), FIG6_EDGES, FIG6_RATES) == ["E", "C", "B", "D", "A"]


def test_fig6_order_does_not_depend_on_declaration_order():
    assert placement_order(list("EDCBA"), FIG6_EDGES[::-1], FIG6_RATES) == ["E", "C", "B", "D", "A"]


def test_heaviest_edge_first_at_fan_in():
    # S has two producers; the heavier one is placed right after it.
    edges = [("P", "S"), ("Q", "S")]
    assert placement_order(["P", "Q", "S"], edges, {("P", "S"): 1, ("Q", "S"): 5}) == ["S", "Q", "P"]
    assert placement_order(["P", "Q", "S"], edges, {("P", "S"): 5, ("Q", "S"): 1}) == ["S", "P", "Q"]


def test_cycle_is_rejected():
    with pytest.raises(NoPlacementError, match="cycle"):
        topological_order(["A", "B"], [("A", "B"), ("B", "A")])
    with pytest.raises(NoPlacementError, match="unknown"):
        placement_order(["A"], [("A", "Z")])


def test_eq5_to_eq7():
    load = derive_load({"A": 1000, "B": 7000}, {"A": 400, "B": 300}, {("A", "B"): 7000}, 1000, 2000)
    assert load.scale == 2.0
    assert load.rates == {"A": 2000.0, "B": 14000.0}
    assert load.tau_us == {"A": 400.0, "B": 300.0}  # τ̄ unscaled
    assert load.edge_rates == {("A", "B"): 14000.0}
    assert load.demand == {"A": 800000.0, "B": 4200000.0}
    assert scale_factor(500, 1000) == 0.5


def test_zero_throughput_says_so():
    with pytest.raises(LoadError, match="nothing to scale from"):
        derive_load({"A": 0}, {"A": 400}, {}, 0, 1000)


def test_next_fit_splits_demand():
    load = Load(1.0, {"A": 2.5}, {"A": 850000.0}, {})
    p = place(["A"], [], load, CapacityModel())
    assert p.workers == 3
    assert p.shares["A"] == {0: pytest.approx(850000), 1: pytest.approx(850000), 2: pytest.approx(425000)}


def test_next_fit_two_operators_hand_computed():
    # B (sink) 600000 on w0 leaves 250000. A: 300000 demand, 1000 chained req/s to B.
    # On w0, B is local: m = 1 + 1000*38.5/300000; φ_max = 250000/m.
    model = CapacityModel()
    load = Load(1.0, {"A": 1.0, "B": 1.0}, {"A": 300000.0, "B": 600000.0}, {("A", "B"): 1000.0})
    p = place(["A", "B"], [("A", "B")], load, model)
    m = 1 + 1000 * 38.5 / 300000
    assert p.order == ["B", "A"]
    assert p.shares["A"][0] == pytest.approx(250000 / m)
    rest = 300000 - 250000 / m
    # the rest lands on w1, remote to B on w0: fan-out γ·1 and β per request
    assert p.shares["A"][1] == pytest.approx(rest)
    assert p.load(model)[1] == pytest.approx(rest + 51500 + 1000 * rest / 300000 * 275)


def test_infeasible_fan_out():
    # γ above W̄: A cannot sit anywhere B is not.
    load = Load(1.0, {"A": 1.0, "B": 1.0}, {"A": 10.0, "B": 2e6}, {("A", "B"): 1.0})
    with pytest.raises(InfeasiblePlacement):
        place(["A", "B"], [("A", "B")], load, CapacityModel(gamma=1e6, capacity=1e6))


def test_worker_limit_exceeded():
    load = Load(1.0, {"A": 10.0}, {"A": 850000.0}, {})
    with pytest.raises(WorkerLimitExceeded):
        place(["A"], [], load, CapacityModel(), max_workers=5)
    assert place(["A"], [], load, CapacityModel(), max_workers=10).workers == 10


def test_zero_demand_operator_is_still_placed():
    load = Load(1.0, {"A": 0.0, "B": 100.0}, {"A": 400.0, "B": 400.0}, {("A", "B"): 0.0})
    p = place(["A", "B"], [("A", "B")], load, CapacityModel())
    assert p.fractions["A"] and sum(p.fractions["A"].values()) == pytest.approx(1.0)


# --- property tests -----------------------------------------------------------------------------------

@st.composite
def dags(draw, max_ops=8):
    n = draw(st.integers(1, max_ops))
    ops = [f"o{i}" for i in range(n)]
    edges = [(ops[i], ops[j]) for i in range(n) for j in range(i + 1, n) if draw(st.booleans())
             and j - i <= 3]
    # shuffle declaration order so sources are not always first
    perm = draw(st.permutations(ops))
    return list(perm), edges


@st.composite
def cases(draw, zero_costs=False):
    ops, edges = draw(dags())
    rates = {o: draw(st.floats(0.0, 5000.0)) for o in ops}
    tau = {o: draw(st.floats(1.0, 1000.0)) for o in ops}
    edge_rates = {e: draw(st.floats(0.0, 5000.0)) for e in edges}
    if zero_costs:
        model = CapacityModel(0.0, 0.0, 0.0, draw(st.floats(2e5, 2e6)))
    else:
        model = CapacityModel(draw(st.floats(0.0, 100.0)), draw(st.floats(0.0, 500.0)),
                              draw(st.floats(0.0, 60000.0)), draw(st.floats(5e5, 2e6)))
    throughput = draw(st.floats(100.0, 1000.0))
    target = draw(st.floats(0.0, 2000.0))
    return ops, edges, derive_load(rates, tau, edge_rates, throughput, target), model


def independent_load(fractions, demand, edge_rates, m):
    """Eq. (8) written out again, without clasp.core.model, to check the placement against."""
    load = {}
    reach = {}
    for o, pw in fractions.items():
        for w, f in pw.items():
            load[w] = load.get(w, 0.0) + f * demand[o]
    for (s, d), rate in edge_rates.items():
        for w, f in fractions[s].items():
            local = fractions[d].get(w, 0.0)
            load[w] += rate * f * (m.alpha * local + m.beta * (1 - local))
            if rate > 0 and f > 0:
                reach.setdefault(w, set()).update(v for v, g in fractions[d].items() if g > 0 and v != w)
    for w, r in reach.items():
        load[w] += m.gamma * len(r)
    return load


def check_order(order, ops, edges):
    assert sorted(order) == sorted(ops)
    pos = {o: i for i, o in enumerate(order)}
    for s, d in edges:
        assert pos[d] < pos[s], f"{s} placed before its successor {d}"


@settings(max_examples=120, deadline=None)
@given(cases())
def test_placement_properties(case):
    ops, edges, load, model = case
    try:
        p = place(ops, edges, load, model)
    except InfeasiblePlacement:
        # only when fan-out alone is a sizeable part of W̄
        assert model.gamma > 0
        return
    check_order(p.order, ops, edges)
    demand = load.demand
    for o in ops:
        assert sum(p.shares[o].values()) == pytest.approx(demand[o], rel=1e-9, abs=1e-6)
        assert sum(p.fractions[o].values()) == pytest.approx(1.0, rel=1e-9)
        assert all(f > 0 for f in p.fractions[o].values())
    recomputed = independent_load(p.fractions, demand, load.edge_rates, model)
    assert set(recomputed) <= set(range(p.workers))
    loads = p.load(model)  # once: a fan-out γ·g just under W̄ leaves slivers on tens of thousands of workers
    for w in range(p.workers):
        assert recomputed.get(w, 0.0) <= model.capacity * (1 + 1e-9)
        assert recomputed.get(w, 0.0) == pytest.approx(loads[w], rel=1e-9, abs=1e-6)
    bound = math.ceil(sum(demand.values()) / model.capacity - 1e-9)
    assert p.workers >= max(1, bound)


@settings(max_examples=120, deadline=None)
@given(cases(zero_costs=True))
def test_without_chained_costs_the_count_is_the_bound(case):
    ops, edges, load, model = case
    ratio = sum(load.demand.values()) / model.capacity
    assume(abs(ratio - round(ratio)) > 1e-6)
    p = place(ops, edges, load, model)
    assert p.workers == max(1, math.ceil(ratio))


@settings(max_examples=100, deadline=None)
@given(dags(max_ops=10), st.dictionaries(st.integers(0, 60), st.floats(0.0, 100.0)))
def test_order_is_reverse_topological_for_any_shape(dag, weights):
    ops, edges = dag
    rates = {e: weights.get(i, 1.0) for i, e in enumerate(edges)}
    check_order(placement_order(ops, edges, rates), ops, edges)


# --- worker-limit search --------------------------------------------------------------------------------

def chain_case():
    ops = ["src", "map", "agg", "sink"]
    edges = [("src", "map"), ("map", "agg"), ("agg", "sink")]
    observed = derive_load({o: 1000.0 for o in ops}, {"src": 200, "map": 400, "agg": 600, "sink": 100},
                           {e: 1000.0 for e in edges}, 1000.0, 1000.0)
    return ops, edges, observed


def fits(ops, edges, observed, rate, model, n):
    try:
        place(ops, edges, observed.scaled(rate / 1000.0), model, max_workers=n)
        return True
    except NoPlacementError:
        return False


@pytest.mark.parametrize("n", [1, 3, 5])
def test_worker_limit_search_finds_the_highest_rate(n):
    ops, edges, observed = chain_case()
    model = CapacityModel()
    found = highest_rate_placement(ops, edges, observed, 1000.0, model, n, tolerance=50.0)
    p = found.placement
    assert p.workers <= n
    loads = independent_load(p.fractions, p.demand, p.edge_rates, model)
    assert max(loads.values()) <= model.capacity * (1 + 1e-9)
    assert found.upper - found.rate <= 50.0
    assert fits(ops, edges, observed, found.rate, model, n)
    if found.upper > found.rate:  # else the initial bound (one worker's max × n) fitted outright
        assert not fits(ops, edges, observed, found.upper, model, n)
    # a fine scan: nothing beyond the tolerance above the found rate fits
    step = 5.0
    highest = max(r * step for r in range(int(found.upper * 3 / step))
                  if fits(ops, edges, observed, r * step, model, n))
    assert highest - found.rate <= 50.0


def test_worker_limit_cache_reuses_and_refreshes():
    ops, edges, observed = chain_case()
    cache = WorkerLimitCache(tolerance=0.05)
    first = cache.get_or_search(ops, edges, observed, 1000.0, CapacityModel(), 3)
    again = cache.get_or_search(ops, edges, observed.scaled(1.01), 1010.0, CapacityModel(), 3)
    assert again is first and cache.hits == 1
    cache.get_or_search(ops, edges, observed, 1000.0, CapacityModel(beta=400.0), 3)
    assert cache.misses == 2
    other = cache.get_or_search(ops, edges, observed, 1000.0, CapacityModel(), 4)
    assert other.rate > first.rate
