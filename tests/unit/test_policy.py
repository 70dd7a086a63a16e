"""Stats (PROFILE.json) validation, PlacementResult, and the CLASP policy's decisions."""

import copy
import json

import pytest

from clasp.core.model import placement_load
from clasp.core.policies import (
    POLICIES,
    ClaspPolicy,
    Decision,
    PlacementResult,
    Policy,
    Stats,
    StatsError,
    uniform_placement,
)

PROFILE = {"operators": {"A": {"rate": 1000, "tau_us": 400}, "B": {"rate": 7000, "tau_us": 300}},
           "edges": [{"src": "A", "dst": "B", "rate": 7000}],
           "alpha": 38.5, "beta": 275, "gamma": 51500, "capacity": 850000,
           "throughput": 1000, "input_rate": 2000, "p_max": 10, "instances": 10, "workers": 1}


def profile(**changes):
    d = copy.deepcopy(PROFILE)
    d.update(changes)
    return d


def test_from_json_dict_reads_every_field():
    s = Stats.from_json_dict(PROFILE)
    assert s.operators["B"].rate == 7000 and s.operators["A"].tau_us == 400
    assert s.edges[0].src == "A" and s.edges[0].rate == 7000
    assert (s.alpha, s.beta, s.gamma, s.capacity) == (38.5, 275, 51500, 850000)
    assert (s.throughput, s.input_rate, s.p_max, s.instances, s.workers) == (1000, 2000, 10, 10, 1)
    assert Stats.from_json_dict(s.to_json_dict()) == s
    d = profile()
    del d["workers"]
    assert Stats.from_json_dict(d).workers == 1


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("alpha"), "alpha"),
    (lambda d: d.pop("edges"), "edges"),
    (lambda d: d["edges"][0].update(dst="Z"), "edges[0].dst"),
    (lambda d: d["edges"][0].pop("src"), "edges[0].src"),
    (lambda d: d["operators"]["A"].update(rate=-1), "operators.A.rate"),
    (lambda d: d["operators"]["B"].pop("tau_us"), "operators.B.tau_us"),
    (lambda d: d["edges"].append({"src": "B", "dst": "A", "rate": 1}), "edges"),
    (lambda d: d.update(capacity=0), "capacity"),
    (lambda d: d.update(p_max=2.5), "p_max"),
    (lambda d: d.update(throughput="fast"), "throughput"),
    (lambda d: d.update(gamma=True), "gamma"),
    (lambda d: d.update(operators={}), "operators"),
])
def test_malformed_profile_names_the_field(mutate, field):
    d = profile()
    mutate(d)
    with pytest.raises(StatsError) as e:
        Stats.from_json_dict(d)
    assert e.value.field == field
    assert repr(field) in str(e.value)


def test_cycle_message():
    d = profile()
    d["edges"].append({"src": "B", "dst": "A", "rate": 1})
    with pytest.raises(StatsError, match="cycle"):
        Stats.from_json_dict(d)


def test_registry():
    assert POLICIES["clasp"] is ClaspPolicy
    assert issubclass(ClaspPolicy, Policy)


def decide(d, current=None, max_workers=None, policy=None):
    s = Stats.from_json_dict(d)
    policy = policy or ClaspPolicy()
    return policy.decide(list(s.operators), [(e.src, e.dst) for e in s.edges], current, s,
                         max_workers=max_workers)


def check_fits(result: PlacementResult, d):
    s = Stats.from_json_dict(d)
    load = s.load_at(result.rate)
    per = placement_load(result.fractions, load.demand, load.edge_rates, s.alpha, s.beta, s.gamma)
    assert all(v <= s.capacity * (1 + 1e-9) for v in per.values())
    assert result.load == pytest.approx([per.get(w, 0.0) for w in range(result.workers)])


def test_decide_new_placement():
    dec = decide(PROFILE)
    assert dec.change and isinstance(dec, Decision)
    r = dec.placement
    assert r.order == ["B", "A"] and r.rate == 2000 and r.capacity == 850000
    assert r.workers == dec.workers == len(r.load)
    # demand at 2000 req/s: A 800000, B 4200000 µs/s; shares add up to it
    assert sum(r.placement["A"].values()) == pytest.approx(800000)
    assert sum(r.placement["B"].values()) == pytest.approx(4200000)
    assert r.workers >= 6  # ceil(5.0e6 / 850000)
    check_fits(r, PROFILE)
    for o in r.placement:
        assert set(r.parallelism[o]) == set(r.fractions[o])
    assert "sustain" in dec.reason


def test_decide_zero_throughput_is_no_change():
    dec = decide(profile(throughput=0))
    assert not dec.change and dec.placement is None
    assert "nothing to scale from" in dec.reason


def test_decide_keeps_a_placement_that_still_fits():
    first = decide(PROFILE).placement
    again = decide(profile(input_rate=1990), current=first)
    assert not again.change and "still sustains" in again.reason
    grown = decide(profile(input_rate=4000), current=first)
    assert grown.change and grown.workers > first.workers


def test_decide_at_the_worker_limit_uses_the_cached_search():
    policy = ClaspPolicy()
    dec = decide(profile(input_rate=50000), max_workers=4, policy=policy)
    assert dec.change and dec.workers <= 4
    assert "worker limit 4" in dec.reason and dec.placement.rate < 50000
    check_fits(dec.placement, PROFILE)
    decide(profile(input_rate=60000), max_workers=4, policy=policy)
    assert policy.cache.hits == 1 and policy.cache.misses == 1


def test_place_on_exactly_n_workers():
    s = Stats.from_json_dict(PROFILE)
    r = ClaspPolicy().place_on(["A", "B"], [("A", "B")], s, 5)
    assert r.workers == 5 and len(r.load) == 5
    check_fits(r, PROFILE)
    assert r.rate > 0


def test_place_on_without_observations_spreads_evenly():
    s = Stats.from_json_dict(profile(throughput=0))
    r = ClaspPolicy().place_on(["A", "B"], [("A", "B")], s, 3)
    assert r.workers == 3
    assert r.fractions == {o: {0: pytest.approx(1 / 3), 1: pytest.approx(1 / 3), 2: pytest.approx(1 / 3)}
                           for o in "AB"}
    assert all(c >= 1 for pw in r.parallelism.values() for c in pw.values())
    assert "no throughput" in r.reason


def test_unobserved_operators_count_as_idle():
    d = profile()
    s = Stats.from_json_dict(d)
    dec = ClaspPolicy().decide(["A", "B", "C"], [("A", "B"), ("B", "C")], None, s)
    assert dec.change
    assert sum(dec.placement.fractions["C"].values()) == pytest.approx(1.0)
    with pytest.raises(StatsError):
        ClaspPolicy().decide(["A"], [], None, s)


def test_placement_result_json_round_trip():
    r = decide(PROFILE).placement
    d = json.loads(r.to_json())
    assert set(d) >= {"order", "workers", "placement", "parallelism", "load", "capacity"}
    assert all(isinstance(k, str) for k in d["placement"]["A"])
    back = PlacementResult.from_json_dict(d)
    assert back == r


# Word Count on five of ten simulated workers at the runtime's costs, its input up from 24,658 to 33,710
# lines/s (Fig. 11): next-fit's messages overflow the receivers at that rate on any count.
WC_AT_FIVE = {"operators": {"split": {"rate": 24658, "tau_us": 3.7966}, "count": {"rate": 373233, "tau_us": 0.7252}},
              "edges": [{"src": "split", "dst": "count", "rate": 373233}], "alpha": 0.239, "beta": 0.8662,
              "gamma": 0.0, "capacity": 249806, "throughput": 24658, "input_rate": 33710, "p_max": 10,
              "instances": 18, "workers": 5, "beta_receive": 0.8655, "mu": 120.341, "flush_delay": 0.001844,
              "flush_peer_factor": 0.2223, "alpha_split": 1.0652, "stateless": ["split"]}
WC_OPS, WC_EDGES = ["split", "count"], [("split", "count")]


def test_next_fit_failing_at_the_limit_still_takes_the_fewest_workers_whose_limit_placement_sustains_the_rate():
    policy = ClaspPolicy()
    s = Stats.from_json_dict(WC_AT_FIVE)
    limits = {n: policy.place_on(WC_OPS, WC_EDGES, s, n).rate for n in range(1, 11)}
    fewest = min(n for n, r in limits.items() if r >= s.input_rate)
    dec = policy.decide(WC_OPS, WC_EDGES, None, s, max_workers=10)
    assert fewest < 10 and dec.change and dec.workers == fewest
    assert dec.placement.rate == s.input_rate
    m, load = s.model, s.load_at(s.input_rate)
    assert m.fits(m.placement_load(dec.placement.fractions, load.demand, load.edge_rates))


@pytest.mark.parametrize("rate", [14000, 21000, 30000, 36500, 42000, 47000])
def test_a_plan_never_needs_more_workers_than_the_fewest_limit_placement_that_sustains_it(rate):
    policy = ClaspPolicy()
    s = Stats.from_json_dict(dict(WC_AT_FIVE, input_rate=rate))
    fewest = min(n for n in range(1, 11) if policy.place_on(WC_OPS, WC_EDGES, s, n).rate >= rate)
    assert policy.decide(WC_OPS, WC_EDGES, None, s, max_workers=10).workers <= fewest


def test_at_the_worker_limit_a_re_plan_that_moves_next_to_nothing_is_no_change():
    policy = ClaspPolicy()
    first = decide(profile(input_rate=50000), max_workers=4, policy=policy).placement
    again = decide(profile(input_rate=50000, throughput=990), current=first, max_workers=4, policy=policy)
    assert not again.change and "differs from it by at most" in again.reason
    spread = uniform_placement(["A", "B"], [("A", "B")], 4, 10, 850000, "spread", "clasp")
    assert decide(profile(input_rate=50000), current=spread, max_workers=4, policy=policy).change
