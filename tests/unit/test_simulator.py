"""The simulator: linear scaling without chaining costs, the paper's Fig. 2 shape, rate tracking, the
control loop adding workers through the real policy, and the CLI's argument checks."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clasp.apps import get_app
from clasp.cli.sim import main
from clasp.sim.simulator import COSTS_FILE, PAPER_COSTS_FILE, Costs, SimConfig, app_dag, share_host, simulate


@pytest.fixture(scope="module")
def runtime_costs() -> Costs:
    return Costs.load(COSTS_FILE)


@pytest.fixture(scope="module")
def by_sigma(runtime_costs) -> Costs:
    """This runtime's costs with every request routed by σ of its successor (the paper's routing), so that
    an even spread sends remote requests: what the table-route and message tests below price."""
    return dataclasses.replace(runtime_costs, local_first=False)


@pytest.fixture(scope="module")
def paper_costs() -> Costs:
    return Costs.load(PAPER_COSTS_FILE)


def _throughputs(app: str, costs: Costs, workers=(1, 5, 10), duration: float = 8.0) -> list[float]:
    dag = app_dag(get_app(app), costs)
    return [simulate(dag, n, costs=costs, config=SimConfig(duration=duration, warmup=2.0)).throughput
            for n in workers]


@pytest.mark.parametrize("app", ["syn", "wc"])
def test_no_chaining_cost_scales_linearly(runtime_costs, app):
    free = runtime_costs.with_coefficients(0.0, 0.0, 0.0)
    one, five, ten = _throughputs(app, free)
    assert five / one == pytest.approx(5.0, rel=0.03)
    assert ten / one == pytest.approx(10.0, rel=0.03)


def test_paper_coefficients_give_fig2_shape(paper_costs):
    one, five, ten = _throughputs("syn", paper_costs)
    # One worker: 10 × 400 µs + 9 local chained requests × 38.5 µs per record, at 850,000 µs/s.
    assert one == pytest.approx(850000 / (10 * 400 + 9 * 38.5), rel=0.02)
    assert one < five < ten
    assert five / one < 0.75 * 5
    assert ten / one < 0.6 * 10


def test_rate_below_capacity_is_sustained(runtime_costs):
    dag = app_dag(get_app("wc"), runtime_costs)
    r = simulate(dag, 2, costs=runtime_costs, rate=15000.0, config=SimConfig(duration=6.0, warmup=1.0))
    assert r.throughput == pytest.approx(15000.0, rel=0.01)
    assert max(r.utilization) < 0.9
    assert r.latency["p50"] < 0.05


def test_rate_above_capacity_saturates(runtime_costs):
    dag = app_dag(get_app("wc"), runtime_costs)
    r = simulate(dag, 1, costs=runtime_costs, rate=60000.0, config=SimConfig(duration=6.0, warmup=2.0))
    assert r.throughput < 30000.0
    assert r.utilization[0] == pytest.approx(1.0, rel=0.01)
    assert r.seconds[-1].observation.queued > r.seconds[2].observation.queued > 0


def test_deterministic_for_a_seed(runtime_costs):
    dag = app_dag(get_app("nwm"), runtime_costs)
    a = simulate(dag, 3, costs=runtime_costs, rate=8000.0, config=SimConfig(duration=4.0, warmup=1.0, seed=3))
    b = simulate(dag, 3, costs=runtime_costs, rate=8000.0, config=SimConfig(duration=4.0, warmup=1.0, seed=3))
    assert a.summary() == b.summary()


def test_control_loop_adds_workers_under_rising_rate(runtime_costs):
    dag = app_dag(get_app("wc"), runtime_costs)

    def rising(t: float) -> float:
        return 5000.0 + 2000.0 * t  # 5,000 → 65,000 records/s over 30 s; one worker sustains ~23,000

    r = simulate(dag, 10, costs=runtime_costs, policy="clasp", rate=rising,
                 config=SimConfig(duration=30.0, warmup=1.0))
    assert r.seconds[0].workers == 1
    changes = [d for d in r.decisions if d["change"]]
    assert changes, r.decisions
    assert r.seconds[-1].workers >= 3
    assert r.seconds[-1].throughput > 40000.0


@pytest.mark.parametrize("argv", [
    [],
    ["wc"],
    ["nosuchapp", "--workers", "2"],
    ["wc", "--workers", "0"],
    ["wc", "--workers", "two"],
    ["wc", "--workers", "2", "--policy", "nosuch"],
    ["wc", "--workers", "2", "--rate", "-5"],
    ["wc", "--workers", "2", "--rate", "100", "--unthrottled"],
    ["wc", "--workers", "2", "--duration", "0"],
    ["wc", "--workers", "2", "--costs", "/nonexistent/costs.json"],
])
def test_cli_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clasp simulate: ") and "\n" not in err


def test_cli_prints_summary(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["syn", "--workers", "2", "--rate", "20000", "--duration", "3", "--json", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["throughput"] == pytest.approx(20000.0, rel=0.02)
    assert summary["workers"] == 2 and len(summary["utilization"]) == 2
    assert set(summary["latency"]) == {"p50", "p95", "p99"}
    assert len(json.loads(out.read_text())["series"]) == 3


def test_the_clasp_command_runs_simulate(capsys):
    from clasp.cli import main as clasp_main

    with pytest.raises(SystemExit) as exit_:
        clasp_main(["simulate", "nope", "--workers", "1"])
    assert exit_.value.code == 2
    assert "unknown app 'nope'" in capsys.readouterr().err
    assert clasp_main(["simulate", "syn", "--workers", "2", "--duration", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"] > 0


def test_alpha_split_prices_only_local_requests_to_split_successors(by_sigma):
    import dataclasses

    from clasp.core.policies import uniform_placement
    from clasp.sim.simulator import Simulator

    dag = app_dag(get_app("syn"), by_sigma)
    cfg = SimConfig(duration=4.0, warmup=1.0)
    # Default (no alpha_split, or a file without the key): the same as before.
    assert Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}}).alpha_split \
        is None
    base = [simulate(dag, n, costs=by_sigma, config=cfg).throughput for n in (1, 2)]
    same = dataclasses.replace(by_sigma, alpha_split=by_sigma.alpha)
    assert [simulate(dag, n, costs=same, config=cfg).throughput for n in (1, 2)] == pytest.approx(base)
    dear = dataclasses.replace(by_sigma, alpha_split=by_sigma.alpha + 5.0)
    # One worker holds every operator alone (the fast path): unchanged; a 2-worker spread pays it.
    assert simulate(dag, 1, costs=dear, config=cfg).throughput == pytest.approx(base[0])
    assert simulate(dag, 2, costs=dear, config=cfg).throughput < 0.8 * base[1]
    # Alternating over 2 workers: every chained request remote, none split-local: unchanged.
    alt = uniform_placement(dag.operators, dag.edges, 2, 10, 1.0, "alt", "alt")
    alt = dataclasses.replace(alt, fractions={o: {i % 2: 1.0} for i, o in enumerate(dag.operators)})
    a = Simulator(dag, by_sigma, 2, placement=alt, config=cfg).run().throughput
    b = Simulator(dag, dear, 2, placement=alt, config=cfg).run().throughput
    assert b == pytest.approx(a)
    with pytest.raises(ValueError):
        Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}, "alpha_split": -1})


def test_alpha_keyed_prices_requests_into_a_keyed_operator_off_its_sender(runtime_costs):
    import dataclasses

    from clasp.core.policies import uniform_placement
    from clasp.sim.simulator import Simulator

    assert Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}}).alpha_keyed \
        is None
    dag = app_dag(get_app("wc"), runtime_costs)
    keyed = runtime_costs.beta + 3.0
    dear = dataclasses.replace(runtime_costs, alpha_keyed=keyed)
    cfg = SimConfig(duration=4.0, warmup=1.0, key_skew=True)

    def run(costs, fractions):
        pl = uniform_placement(dag.operators, dag.edges, 2, 10, 1.0, "t", "t")
        return Simulator(dag, costs, 2, placement=dataclasses.replace(pl, fractions=fractions), config=cfg)

    # count wholly beside split (w0): the owner's path, no α_keyed; split's worker pays it per word in
    # place of its share of β as soon as count is on the other worker, and nothing else changes.
    def held_cost(costs, fractions):  # per-request costs where the operator runs
        s = run(costs, fractions)
        return s.cost * (s.sigma > 0)

    together = {"split": {0: 1.0}, "count": {0: 1.0}}
    assert held_cost(dear, together) == pytest.approx(held_cost(runtime_costs, together))
    apart = {"split": {0: 1.0}, "count": {1: 1.0}}
    extra = held_cost(dear, apart) - held_cost(runtime_costs, apart)
    words = dag.fanout[("split", "count")]
    share = runtime_costs.receive_share
    assert extra[0, dag.operators.index("split")] == pytest.approx((keyed - (1 - share) * runtime_costs.beta) * words)
    extra[0, dag.operators.index("split")] = 0.0
    assert extra == pytest.approx(0.0)
    assert run(dear, apart).run().throughput < run(runtime_costs, apart).run().throughput
    with pytest.raises(ValueError):
        Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}, "alpha_keyed": -1})


def test_message_cost_is_opt_in_and_grows_with_destinations(by_sigma):
    import dataclasses

    import numpy as np

    from clasp.core.policies import uniform_placement
    from clasp.sim.simulator import Simulator

    plain = Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}})
    assert (plain.message_us, plain.flush_delay_s, plain.max_batch) == (0.0, 0.001, 2000)
    for bad in ({"message_us": -1}, {"message_us": True}, {"flush_delay_s": 0}, {"max_batch": 0.5}):
        with pytest.raises(ValueError):
            Costs.from_json_dict({"alpha": 1, "beta": 2, "gamma": 0, "capacity": 1e6, "tau_us": {}, **bad})
    dag = app_dag(get_app("syn"), by_sigma)
    cfg = SimConfig(duration=4.0, warmup=1.0)
    base = [simulate(dag, n, costs=by_sigma, config=cfg).throughput for n in (1, 2, 5)]
    zero = dataclasses.replace(by_sigma, message_us=0.0)
    assert [simulate(dag, n, costs=zero, config=cfg).throughput for n in (1, 2, 5)] == pytest.approx(base)
    dear = dataclasses.replace(by_sigma, message_us=30.0)
    got = [simulate(dag, n, costs=dear, config=cfg).throughput for n in (1, 2, 5)]
    assert got[0] == pytest.approx(base[0])  # one worker sends no message
    # More destinations, more messages per record: the loss grows with the worker count.
    assert got[1] < base[1] and got[2] / base[2] < got[1] / base[1]
    # The message rate: a stream below the flush floor's rows is one row a message; above it, the timer's
    # capacity / 10⁶ / flush_delay_s flushes per second, until batches fill.
    sim = Simulator(dag, dear, 2, placement=uniform_placement(dag.operators, dag.edges, 2, 10, 1.0, "u", "u"),
                    config=cfg)
    served = np.zeros((2, len(dag.operators)))
    floor = dear.capacity / 1e6 / dear.flush_delay_s
    for rate in (10.0, 1e5, 1e9):
        served[:] = rate / 10  # every one of the 10 operators; 9 edges, half of each successor on the other
        rows = 0.45 * rate
        m = sim.messages_per_second(served)
        assert m[0, 0] == 0
        assert m[0, 1] == pytest.approx(min(rows, max(rows / dear.max_batch, floor)))
    assert m[0, 1] == pytest.approx(0.45e9 / 2000)  # full batches
    # A sender busy half the time flushes on its timer half as often.
    served[:] = 1e4
    half = sim.messages_per_second(served, [0.5, 0.5])
    assert half[0, 1] == pytest.approx(0.5 * floor)


def test_one_worker_of_a_pool_completes_at_its_maximum_from_the_first_seconds(paper_costs):
    """The in-flight window follows the workers in use: a job overloading one worker of ten completes at
    that worker's maximum within two seconds, as FaaSFlow's extrapolation (and the paper's example) assume;
    a window sized for the pool would queue seconds of work and lag for as long."""
    from clasp.core.policies import uniform_placement
    from clasp.sim.simulator import Simulator

    dag = app_dag(get_app("aa"), paper_costs)
    alone = simulate(dag, 1, costs=paper_costs, config=SimConfig(duration=8.0, warmup=2.0)).throughput
    one = uniform_placement(list(dag.operators), list(dag.edges), 1, 10, paper_costs.capacity, "one", "uniform")
    r = Simulator(dag, paper_costs, 10, rate=2.0 * alone, placement=one,
                  config=SimConfig(duration=4.0, warmup=0.0)).run()
    assert [s.workers for s in r.seconds] == [1, 1, 1, 1]
    assert r.seconds[1].throughput == pytest.approx(alone, rel=0.03)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=12), st.floats(0, 5e6))
def test_share_host_is_max_min_fair(demand, available):
    got = share_host(np.array(demand), available)
    assert (got <= np.array(demand) + 1e-6).all()
    assert got.sum() == pytest.approx(min(sum(demand), available), rel=1e-9, abs=1e-6)
    # Max-min: whoever gets less than it asked gets at least as much as anyone else.
    short = [g for g, d in zip(got, demand, strict=True) if g < d - 1e-6]
    if short:
        assert min(short) >= got.max() - 1e-6


def test_share_host_by_hand():
    assert share_host(np.array([1.0, 5.0, 5.0]), 7.0).tolist() == [1.0, 3.0, 3.0]
    assert share_host(np.array([1.0, 2.0]), 10.0).tolist() == [1.0, 2.0]


def test_the_planner_caps_admissions(runtime_costs):
    """planner_us: one planner process of 10⁶ µs/s admits 10⁶ / planner_us records/s at most, however many
    workers there are."""
    free = dataclasses.replace(runtime_costs.with_coefficients(0.0, 0.0, 0.0), planner_us=4.0)
    dag = app_dag(get_app("syn"), free)
    cfg = SimConfig(duration=6.0, warmup=2.0)
    ten = simulate(dag, 10, costs=free, config=cfg).throughput
    assert ten == pytest.approx(250_000, rel=0.01)
    assert simulate(dag, 10, costs=dataclasses.replace(free, planner_us=0.0), config=cfg).throughput > 1.5 * ten


def test_a_shared_host_divides_its_cpu(runtime_costs):
    """host_capacity: ten workers of W on a host of 2·10⁶ µs/s, with planner and client paying p per record,
    complete Λ with Λ·(per-record work) + Λ·p = 2·10⁶ (every worker saturated at its fair share)."""
    free = dataclasses.replace(runtime_costs.with_coefficients(0.0, 0.0, 0.0), capacity=400_000.0,
                               planner_us=2.0, client_us=1.0)
    dag = app_dag(get_app("syn"), free)
    per_record = sum(dag.tau_us.values())  # every operator once per record, every request local and free
    got = simulate(dag, 10, costs=free, config=SimConfig(duration=8.0, warmup=3.0, host_capacity=2e6)).throughput
    assert got == pytest.approx(2e6 / (per_record + 3.0), rel=0.03)
    alone = simulate(dag, 10, costs=free, config=SimConfig(duration=8.0, warmup=3.0)).throughput
    assert alone == pytest.approx(min(10 * 400_000 / per_record, 1e6 / 2.0), rel=0.03)
