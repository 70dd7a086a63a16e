"""The default policy's refinement is bounded (docs/POLICY.md, "Bounded refinement"): what it evaluates grows
like N log N in operators × workers, it places large DAGs on large clusters, and it is never worse than
next-fit (the paper's policy)."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.bench.placement_scale import profile
from clasp.core.placement import WHOLE_LIMIT, NoPlacementError, Work, highest_rate_placement, place
from clasp.core.policies import POLICIES, Stats
from clasp.core.policies.clasp import fewest_from_top


def bound(operators: int, workers: int) -> float:
    """8 N log₂ N shares and flows priced, N = operators × workers (at least WHOLE_LIMIT, below which the
    refinement examines every candidate): twice the budget of the optional candidates, the rest being
    next-fit's own searches."""
    n = max(operators * workers, WHOLE_LIMIT)
    return 8 * n * math.log2(n)


def decide(name: str, stats: Stats, max_workers: int | None):
    policy = POLICIES[name]()
    edges = [(e.src, e.dst) for e in stats.edges]
    return policy, policy.decide(list(stats.operators), edges, None, stats, max_workers=max_workers)


def fits(stats: Stats, placement, model) -> bool:
    """The placement's Eq. (8) load at its own rate, recomputed from its fractions, within every W_w."""
    load = stats.load_at(placement.rate)
    return model.fits(model.placement_load(placement.fractions, load.demand, load.edge_rates))


def test_the_100_operator_profile_on_2000_workers_within_n_log_n():
    stats = Stats.from_json_dict(profile(100))
    policy, decision = decide("clasp", stats, 2000)
    _, paper = decide("clasp-paper", stats, 2000)
    assert policy.work.priced <= bound(100, 2000)
    assert policy.work.evaluations <= 200
    assert decision.placement.rate == stats.input_rate == paper.placement.rate
    assert 300 < decision.workers <= paper.workers
    assert fits(stats, decision.placement, stats.model)


@pytest.mark.parametrize("operators", [10, 25, 50, 100, 200])
@pytest.mark.parametrize("workers", [10, 100, 2000])
def test_work_grows_like_n_log_n(operators, workers):
    stats = Stats.from_json_dict(profile(operators))
    policy, decision = decide("clasp", stats, workers)
    assert policy.work.priced <= bound(operators, workers)
    assert policy.work.evaluations > 0
    assert decision.workers <= workers and fits(stats, decision.placement, stats.model)


@pytest.mark.parametrize("share", [0.5, 0.1, 0.01])
def test_a_budget_stops_the_optional_candidates(share):
    """The worker-limit search of a 10-operator DAG on 34 workers, refined within a share of what it prices
    unbounded: it prices the budget and next-fit's own search (in three orders) at most, and finds a rate
    between next-fit's and the unbounded refinement's."""
    stats = Stats.from_json_dict(profile(10))
    ops, edges = list(stats.operators), [(e.src, e.dst) for e in stats.edges]

    def search(work: Work, refine: bool = True):
        return highest_rate_placement(ops, edges, stats.observed_load(), stats.throughput, stats.model, 34,
                                      refine=refine, work=work)

    free, plain = Work(), Work()
    unbounded, next_fit = search(free), search(plain, refine=False)
    bounded = Work(budget=share * free.priced)
    found = search(bounded)
    assert bounded.priced <= bounded.budget + 3 * plain.priced < free.priced
    assert next_fit.rate <= found.rate <= unbounded.rate


def _extended(d: dict, draw) -> dict:
    """The profile with the extended model's terms (receivers' β_r, messages, local-first routing)."""
    ops = list(d["operators"])
    return {**d, "beta_receive": draw(st.sampled_from([0.0, 60.0, 140.0])), "mu": draw(st.sampled_from([0.0, 40.0])),
            "stateless": ops[: draw(st.integers(0, len(ops)))], "local_first": draw(st.booleans())}


@st.composite
def profiles(draw, extended: bool):
    d = profile(draw(st.integers(2, 9)), seed=draw(st.integers(0, 10_000)),
                fill=draw(st.sampled_from([0.2, 0.5, 1.0, 1.5, 2.5])))
    d["input_rate"] *= draw(st.sampled_from([0.3, 1.0, 3.0]))
    return _extended(d, draw) if extended else d


def never_worse(stats: Stats, ours, theirs) -> None:
    """Sustaining the input rate comes first, then fewer workers; short of it, a higher rate."""
    assert theirs.placement is None or ours.placement is not None
    if theirs.placement is None:
        return
    rate = stats.input_rate * (1 - 1e-9)
    if theirs.placement.rate >= rate:
        assert ours.placement.rate >= rate
        assert ours.workers <= theirs.workers
    else:
        assert ours.placement.rate >= min(rate, theirs.placement.rate * (1 - 1e-9))


@settings(max_examples=60, deadline=None)
@given(profiles(extended=False), st.one_of(st.none(), st.integers(1, 12)))
def test_never_worse_than_clasp_paper(d, max_workers):
    stats = Stats.from_json_dict(d)
    _, ours = decide("clasp", stats, max_workers)
    _, paper = decide("clasp-paper", stats, max_workers)
    never_worse(stats, ours, paper)
    if ours.placement is not None:
        assert fits(stats, ours.placement, stats.model)


@settings(max_examples=60, deadline=None)
@given(profiles(extended=True), st.integers(1, 12))
def test_never_worse_than_next_fit_in_its_own_model(d, max_workers):
    """With the extended model clasp-paper plans with another model; next-fit in the paper's order under
    clasp's own model (`place`, or its worker-limit search) is the baseline."""
    stats = Stats.from_json_dict(d)
    model = stats.model
    ops, edges = list(stats.operators), [(e.src, e.dst) for e in stats.edges]
    _, ours = decide("clasp", stats, max_workers)
    try:
        plain = place(ops, edges, stats.load_at(stats.input_rate), model, max_workers)
    except NoPlacementError:  # more than the limit: next-fit's worker-limit search is the baseline
        plain = None
    if plain is not None:
        assert ours.placement.rate >= stats.input_rate and ours.workers <= plain.workers
    else:
        try:
            found = highest_rate_placement(ops, edges, stats.observed_load(), stats.throughput, model, max_workers)
        except NoPlacementError:  # nothing fits, not even idle
            return
        assert ours.placement.rate >= min(stats.input_rate, found.rate) * (1 - 1e-9)
    assert fits(stats, ours.placement, model)


def test_clasp_simulate_runs_the_default_policy_on_1000_workers(tmp_path, capsys):
    """A small input (40,000 lines/s of Word Count, which one simulated worker serves at about 23,000) on a
    pool of 1,000 workers: the control loop's first re-plan scales out, and the input is then served."""
    from clasp.cli import main

    out = tmp_path / "sim.json"
    assert main(["simulate", "wc", "--workers", "1000", "--policy", "clasp", "--rate", "40000",
                 "--duration", "7", "--json", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["policy"] == "clasp" and len(summary["utilization"]) == 1000
    series = json.loads(out.read_text())["series"]
    one = series[1]["throughput"]  # saturated on the one worker it starts on
    assert one < 0.75 * 40000
    first = summary["decisions"][0]
    assert first["change"] and "sustain 40000 req/s" in first["reason"]
    assert math.ceil(40000 / one) <= first["workers"] == summary["workers"] < 1000
    assert all(s["throughput"] == pytest.approx(40000, rel=0.01) for s in series[-2:])


def test_fewest_from_top_bisects_below_the_first_count_that_fails():
    probes = []

    def sustains(n: int):
        probes.append(n)
        return f"on {n}" if n >= 377 else None

    assert fewest_from_top(list(range(1, 1000)), sustains) == "on 377"
    assert len(probes) <= 2 * math.ceil(math.log2(1000)) + 1
    probes.clear()
    assert fewest_from_top(list(range(1, 1000)), lambda n: probes.append(n)) is None
    assert probes == [999]  # the count just below next-fit's fails: nothing fewer is searched
