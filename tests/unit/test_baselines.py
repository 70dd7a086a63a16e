"""Baselines: FaaSFlow (slots, extrapolation, critical-path grouping), Zhang24 (model, score), -SP."""

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.cli.place import main
from clasp.core.model import CapacityModel
from clasp.core.placement import topological_order
from clasp.core.policies import POLICIES, ClaspPolicy, Stats
from clasp.core.policies.baselines import (
    FaaSFlowPolicy,
    FaaSFlowSPPolicy,
    Zhang24Config,
    Zhang24Policy,
    Zhang24SPPolicy,
    critical_path,
    critical_path_grouping,
    extrapolated_workers,
    greedy_assignment,
    model_parallelism,
    model_throughput,
    neighbour_traffic,
)
from tests.unit.test_placement import FIG6_EDGES, FIG6_RATES, independent_load

BASELINE_NAMES = ["faasflow", "zhang24", "faasflow-sp", "zhang24-sp"]


def fig6_profile(**changes) -> dict:
    """The Fig. 6 DAG observed on one worker at 500 req/s: every operator once per input, ~400 µs each."""
    d = {"operators": {o: {"rate": 500.0, "tau_us": 400.0 + 10 * i} for i, o in enumerate("ABCDE")},
         "edges": [{"src": s, "dst": t, "rate": 50.0 * FIG6_RATES[(s, t)]} for s, t in FIG6_EDGES],
         "alpha": 38.5, "beta": 275.0, "gamma": 51500.0, "capacity": 850000.0,
         "throughput": 500.0, "input_rate": 2000.0, "p_max": 10, "instances": 10, "workers": 1}
    d.update(changes)
    return d


def run(policy, d, max_workers=None, current=None):
    s = Stats.from_json_dict(d)
    return policy.decide(list(s.operators), [(e.src, e.dst) for e in s.edges], current, s,
                         max_workers=max_workers)


def slots_used(parallelism):
    used = {}
    for pw in parallelism.values():
        for w, c in pw.items():
            used[w] = used.get(w, 0) + c
    return used


def check_shape(r, d, policy):
    """The CLASP result shape, fractions from instances or shares, and Eq. (8) recomputed independently."""
    s = Stats.from_json_dict(d)
    assert r.policy == policy and r.reason
    assert r.workers == len(r.load) and r.capacity == s.capacity
    assert set(r.order) == set(s.operators) == set(r.placement) == set(r.fractions) == set(r.parallelism)
    load = s.load_at(r.rate)
    for o, pw in r.fractions.items():
        assert sum(pw.values()) == pytest.approx(1.0)
        assert all(0 <= w < r.workers for w in pw)
        assert sum(r.placement[o].values()) == pytest.approx(load.demand[o])
        assert all(c >= 1 for c in r.parallelism[o].values())
    expected = independent_load(r.fractions, load.demand, load.edge_rates, s.model)
    assert r.load == pytest.approx([expected.get(w, 0.0) for w in range(r.workers)], rel=1e-9, abs=1e-6)
    json.loads(r.to_json())


def test_all_baselines_are_registered():
    assert set(BASELINE_NAMES) <= set(POLICIES)
    for name in BASELINE_NAMES:
        assert POLICIES[name]().name == name


# --- FaaSFlow -------------------------------------------------------------------------------------------

def test_extrapolation_worked_example():
    # Paper §5.6: 1 worker at 100 req/s, target 500 → 5; then 5 workers observed at 250 → 10.
    assert extrapolated_workers(1, 500, 100) == 5
    assert extrapolated_workers(5, 500, 250) == 10
    assert extrapolated_workers(10, 100, 1000) == 1
    first = run(FaaSFlowPolicy(), fig6_profile(workers=1, throughput=100.0, input_rate=500.0))
    assert first.workers == 5
    second = run(FaaSFlowPolicy(), fig6_profile(workers=5, throughput=250.0, input_rate=500.0),
                 current=first.placement)
    assert second.workers == 10 and "5 worker(s) at 250" in second.reason
    again = run(FaaSFlowPolicy(), fig6_profile(workers=10, throughput=500.0, input_rate=500.0),
                current=second.placement)
    assert not again.change and "keeps 10" in again.reason


def test_critical_path_is_the_heaviest_path():
    assert critical_path(list("ABCDE"), FIG6_EDGES, FIG6_RATES) == [("A", "B"), ("B", "C"), ("C", "E")]
    rates = {**FIG6_RATES, ("A", "D"): 30}
    assert critical_path(list("ABCDE"), FIG6_EDGES, rates) == [("A", "D"), ("D", "E")]


def test_fig6_grouping_hand_computed():
    # Two instances each. Critical path A→B→C→E (25): merge its heaviest edge C→E. Then A→D→E (16) is
    # critical: merge A→D. Then A→B→C→E (15): B→C. Then A→B (7) joins the rest: all 10 slots on one worker.
    two = dict.fromkeys("ABCDE", 2)
    g = critical_path_grouping(list("ABCDE"), FIG6_EDGES, FIG6_RATES, two, 10)
    assert g.merges == [("C", "E"), ("A", "D"), ("B", "C"), ("A", "B")]
    assert g.groups == [["A", "B", "C", "D", "E"]]
    # With 5 slots, B fits neither {C, E} nor {A, D}, and {A, D} + {C, E} is 8: three groups.
    g = critical_path_grouping(list("ABCDE"), FIG6_EDGES, FIG6_RATES, two, 5)
    assert g.merges == [("C", "E"), ("A", "D")]
    assert sorted(map(sorted, g.groups)) == [["A", "D"], ["B"], ["C", "E"]]


def check_faasflow(r, p_max):
    """FaaSFlow's own rules: every slot of its workers used, none above P_max, parallelism by invocation."""
    used = slots_used(r.parallelism)
    assert all(c <= p_max for c in used.values())
    assert sum(used.values()) == max(r.workers * p_max, len(r.parallelism))
    for o, pw in r.parallelism.items():
        total = sum(pw.values())
        assert r.fractions[o] == pytest.approx({w: c / total for w, c in pw.items()})


def test_faasflow_places_fig6_by_slots():
    d = fig6_profile()
    dec = run(FaaSFlowPolicy(), d)
    r = dec.placement
    assert r.workers == 4  # ceil(1 · 2000 / 500)
    check_shape(r, d, "faasflow")
    check_faasflow(r, 10)
    # Equal invocation rates: 40 slots split 8 each, whatever the execution times.
    assert {o: sum(pw.values()) for o, pw in r.parallelism.items()} == dict.fromkeys("ABCDE", 8)
    # Blind to chained-request cost: at 4× the one-worker load, some worker is well past W̄.
    assert max(r.load) > r.capacity and "peak load" in dec.reason


def test_faasflow_worker_limit_and_place_on():
    d = fig6_profile(input_rate=20000.0)
    r = run(FaaSFlowPolicy(), d, max_workers=6).placement
    assert r.workers == 6
    check_faasflow(r, 10)
    s = Stats.from_json_dict(d)
    r = FaaSFlowPolicy().place_on(list("ABCDE"), FIG6_EDGES, s, 3)
    assert r.workers == 3 and r.rate == pytest.approx(1500.0)  # Λ · 3 / 1
    check_shape(r, d, "faasflow")
    check_faasflow(r, 10)


def test_faasflow_ignores_chained_request_cost():
    cheap = run(FaaSFlowPolicy(), fig6_profile(alpha=0.0, beta=0.0, gamma=0.0)).placement
    dear = run(FaaSFlowPolicy(), fig6_profile(beta=5000.0, gamma=200000.0)).placement
    assert cheap.workers == dear.workers and cheap.parallelism == dear.parallelism
    assert max(dear.load) > max(cheap.load)


@st.composite
def profiles(draw, max_ops=7):
    n = draw(st.integers(1, max_ops))
    ops = [f"o{i}" for i in range(n)]
    perm = draw(st.permutations(ops))
    edges = [(ops[i], ops[j]) for i in range(n) for j in range(i + 1, n)
             if j - i <= 3 and draw(st.booleans())]
    throughput = draw(st.floats(50.0, 2000.0))
    d = {"operators": {o: {"rate": draw(st.floats(0.0, 20000.0)), "tau_us": draw(st.floats(0.1, 800.0))}
                       for o in perm},
         "edges": [{"src": s, "dst": t, "rate": draw(st.floats(0.0, 20000.0))} for s, t in edges],
         "alpha": draw(st.floats(0.0, 50.0)), "beta": draw(st.floats(0.0, 400.0)),
         "gamma": draw(st.floats(0.0, 60000.0)), "capacity": draw(st.floats(2e5, 2e6)),
         "throughput": throughput, "input_rate": draw(st.floats(0.0, 8.0)) * throughput,
         "p_max": draw(st.integers(1, 12)), "instances": 10, "workers": draw(st.integers(1, 4))}
    return d


def placed_on(policy, d, workers):
    """The profile's Stats, its edges, and `policy` placed on `workers` (at least one slot per operator)."""
    s = Stats.from_json_dict(d)
    edges = [(e.src, e.dst) for e in s.edges]
    n = max(workers, math.ceil(len(s.operators) / s.p_max))
    return s, edges, n, policy.place_on(list(s.operators), edges, s, n)


random_cases = settings(max_examples=60, deadline=None)(given(profiles(), st.integers(1, 6)))


@random_cases
def test_faasflow_random_dags_within_slots(d, workers):
    s, edges, n, r = placed_on(FaaSFlowPolicy(), d, workers)
    check_shape(r, d, "faasflow")
    check_faasflow(r, s.p_max)
    # A group that fits one worker sits on one worker: that is what grouping co-locates.
    scale = r.rate / s.throughput
    per_op = {o: sum(pw.values()) for o, pw in r.parallelism.items()}
    g = critical_path_grouping(list(s.operators), edges, {e: scale * v for e, v in s.edge_rates().items()},
                               per_op, s.p_max)
    for group in g.groups:
        assert len(group) == 1 or sum(per_op[o] for o in group) <= s.p_max  # merges respect the slots
    # The largest group is packed first: if it fits one worker, it sits on one worker.
    largest = max(g.groups, key=lambda grp: sum(per_op[o] for o in grp))
    if sum(per_op[o] for o in largest) <= s.p_max:
        assert len({w for o in largest for w in r.parallelism[o]}) == 1
    for src, dst in g.merges:
        assert any(src in grp and dst in grp for grp in g.groups)
    dec = run(FaaSFlowPolicy(), d)
    if dec.change:
        assert dec.workers == max(math.ceil(s.workers * s.input_rate / s.throughput - 1e-9), 1,
                                  math.ceil(len(s.operators) / s.p_max))
        check_faasflow(dec.placement, s.p_max)


# --- Zhang24 --------------------------------------------------------------------------------------------

def test_performance_model():
    # X(k) = 10⁶ k / ((τ̄ + s)(1 + κ(k − 1))): one instance of a 400 µs operator with 100 µs overhead: 2000/s.
    assert model_throughput(1, 400, 100, 0.1) == pytest.approx(2000)
    assert model_throughput(4, 400, 100, 0.1) == pytest.approx(8000 / 1.3)
    assert model_throughput(0, 400, 100, 0.1) == 0
    # Non-linear: doubling the instances less than doubles the throughput.
    assert model_throughput(8, 400, 100, 0.1) < 2 * model_throughput(4, 400, 100, 0.1)
    assert model_parallelism(1000, 400, 100, 0.1, 1.0, 100) == 1
    assert model_parallelism(6000, 400, 100, 0.1, 1.0, 100) == 4  # X(3) = 5000, X(4) ≈ 6154
    # Past the contention ceiling 10⁶/((τ̄ + s)κ) = 20000/s no k suffices: the cap.
    assert model_parallelism(25000, 400, 100, 0.1, 1.0, 37) == 37


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 50000.0), st.floats(0.1, 1000.0), st.floats(0.0, 300.0), st.floats(0.0, 0.2),
       st.floats(0.3, 1.0), st.integers(1, 200))
def test_model_parallelism_is_the_fewest_sufficient_instances(rate, tau, overhead, kappa, util, cap):
    k = model_parallelism(rate, tau, overhead, kappa, util, cap)
    enough = [j for j in range(1, cap + 1) if util * model_throughput(j, tau, overhead, kappa) >= rate]
    assert k == (enough[0] if enough else cap)


def independent_greedy(order, per_op, edge_rates, workers, p_max, weight):
    """Zhang24's greedy assignment written out again; returns placements and the argmax check per step."""
    traffic = {o: [] for o in order}
    for (s, t), r in edge_rates.items():
        traffic[s].append((t, r))
        traffic[t].append((s, r))
    placed = {o: {} for o in order}
    used = [0] * workers
    for o in order:
        total = sum(r for _, r in traffic[o])
        for _ in range(per_op[o]):
            scores = {}
            for w in range(workers):
                if used[w] < p_max:
                    aff = 0.0 if total <= 0 else sum(
                        r * placed[n].get(w, 0) / per_op[n] for n, r in traffic[o]) / total
                    spread = max(used) - min(used)
                    balance = 1.0 if spread == 0 else (max(used) - used[w]) / spread
                    scores[w] = weight * aff + (1 - weight) * balance
            best = max(scores.values())
            w = min((v for v, sc in scores.items() if sc == best), key=lambda v: (used[v], v))
            placed[o][w] = placed[o].get(w, 0) + 1
            used[w] += 1
    return placed


def check_zhang(r, d, pool):
    s = Stats.from_json_dict(d)
    edges = [(e.src, e.dst) for e in s.edges]
    used = slots_used(r.parallelism)
    assert all(c <= s.p_max for c in used.values())
    assert sorted(used) == list(range(len(used)))  # the used workers are 0..k-1
    per_op = {o: sum(pw.values()) for o, pw in r.parallelism.items()}
    scale = r.rate / s.throughput
    edge_rates = {e: scale * v for e, v in s.edge_rates().items()}
    order = topological_order(list(s.operators), edges)
    assert r.parallelism == independent_greedy(order, per_op, edge_rates, pool, s.p_max, 0.5)
    # Every step of the library's assignment is the argmax of the score at that step.
    a = greedy_assignment(order, per_op, neighbour_traffic(list(s.operators), edges, edge_rates), pool,
                          s.p_max, 0.5)
    assert a.parallelism == r.parallelism and len(a.steps) == sum(per_op.values())
    return per_op


def test_zhang24_fig6_spreads_over_all_workers():
    d = fig6_profile(input_rate=1000.0)
    r = run(Zhang24Policy(), d, max_workers=10).placement
    check_shape(r, d, "zhang24")
    per_op = check_zhang(r, d, 10)
    # 1000 req/s × (≈420 µs + α) / 0.8 ≈ 0.57 busy instances: one each by the model.
    assert per_op == dict.fromkeys("ABCDE", 1)
    # The load-balance term sends every first instance to an empty worker: 5 instances, 5 workers.
    assert r.workers == 5
    more = run(Zhang24Policy(), fig6_profile(input_rate=8000.0), max_workers=10).placement
    assert more.workers == 10 and sum(slots_used(more.parallelism).values()) > 10


def test_zhang24_affinity_weight_one_packs_neighbours():
    d = fig6_profile(input_rate=8000.0)
    policy = Zhang24Policy(Zhang24Config(affinity_weight=1.0))
    r = run(policy, d, max_workers=10).placement
    spread = run(Zhang24Policy(), d, max_workers=10).placement
    assert r.workers < spread.workers


@random_cases
def test_zhang24_random_dags_follow_the_score(d, workers):
    s, _, pool, r = placed_on(Zhang24Policy(), d, workers)
    assert r.workers == pool
    check_shape(r, d, "zhang24")
    per_op = check_zhang(r, d, pool)
    assert sum(per_op.values()) <= pool * s.p_max


# --- -SP variants ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sp, base, max_workers", [
    (FaaSFlowSPPolicy, FaaSFlowPolicy, None), (FaaSFlowSPPolicy, FaaSFlowPolicy, 3),
    (Zhang24SPPolicy, Zhang24Policy, 10), (Zhang24SPPolicy, Zhang24Policy, 4)])
def test_sp_uses_the_baseline_count_and_clasp_placement(sp, base, max_workers):
    d = fig6_profile(input_rate=3000.0)
    s = Stats.from_json_dict(d)
    dec = run(sp(), d, max_workers=max_workers)
    n = run(base(), d, max_workers=max_workers).workers
    assert dec.workers == n
    clasp = ClaspPolicy().place_on(list("ABCDE"), FIG6_EDGES, s, n)
    r = dec.placement
    assert r.fractions == clasp.fractions and r.order == clasp.order
    assert r.rate == 3000.0 and f"sustains {clasp.rate:.0f}" in r.reason
    check_shape(r, d, sp().name)
    assert all(c <= s.p_max for c in slots_used(r.parallelism).values())


def test_sp_at_the_clasp_count_matches_clasp():
    # When the baseline happens to pick CLASP's count, the -SP placement is CLASP's own.
    d = fig6_profile(input_rate=1200.0)
    s = Stats.from_json_dict(d)
    n = run(FaaSFlowPolicy(), d).workers
    r = FaaSFlowSPPolicy().place_on(list("ABCDE"), FIG6_EDGES, s, n)
    assert r.workers == n and r.fractions == ClaspPolicy().place_on(list("ABCDE"), FIG6_EDGES, s, n).fractions


# --- every baseline -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BASELINE_NAMES)
def test_zero_throughput_is_no_change(name):
    dec = run(POLICIES[name](), fig6_profile(throughput=0.0))
    assert not dec.change and "nothing to scale from" in dec.reason


@pytest.mark.parametrize("name", BASELINE_NAMES)
def test_clasp_place_policy_prints_json(name, tmp_path, capsys):
    path = tmp_path / "PROFILE.json"
    path.write_text(json.dumps(fig6_profile()))
    assert main([str(path), "--policy", name, "--max-workers", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == name and out["workers"] == len(out["load"]) <= 10
    assert set(out["parallelism"]) == set("ABCDE") and out["rate"] == 2000.0
    assert all(sum(pw.values()) == pytest.approx(1.0) for pw in out["fractions"].values())


def test_profile_is_not_mutated():
    d = fig6_profile()
    before = copy.deepcopy(d)
    s = Stats.from_json_dict(d)
    snapshot = copy.deepcopy(s)
    for name in BASELINE_NAMES:
        run(POLICIES[name](), d, max_workers=10)
        POLICIES[name]().place_on(list("ABCDE"), FIG6_EDGES, s, 3)
    assert d == before and s == snapshot
    assert CapacityModel() == CapacityModel()
