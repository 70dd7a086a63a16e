"""clasp.bench.cluster_engine's pure helpers and clasp.bench.calibrate's pure parts (the engine on a real
cluster: tests/cluster/test_cluster_engine.py)."""

from __future__ import annotations

import pytest

from clasp.bench import cluster_engine as ce


def test_resolve_placement():
    ops = ["a", "b"]
    assert ce.resolve_placement("spread", ops, 2) == {"a": {0: 0.5, 1: 0.5}, "b": {0: 0.5, 1: 0.5}}
    p = ce.resolve_placement({"a": {1: 2, 0: 2}}, ops, 3)
    assert p["a"] == {0: 0.5, 1: 0.5} and p["b"] == {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}
    for bad in ({"a": {2: 1.0}}, {"x": {0: 1.0}}, {"a": {}}, "packed"):
        with pytest.raises(ce.EngineError):
            ce.resolve_placement(bad, ops, 2)


def test_steady_throughput_window():
    samples = [(0.0, 0, 900), (1.0, 50, 800), (2.0, 150, 500), (3.0, 250, 100), (4.0, 350, 0), (5.0, 380, 0)]
    tput, window = ce.steady_throughput(samples, 1.0, 5.0, saturated=True)
    assert (tput, window) == (100.0, 2.0)  # 1.0 → 3.0, the last sample with a queue
    tput, window = ce.steady_throughput(samples, 1.0, 5.0, saturated=False)
    assert tput == pytest.approx(330 / 4)
    assert ce.steady_throughput(samples[:1], 0.0, 5.0, saturated=False) == (None, 0.0)


# ----------------------------------------------------------------------------- clasp.bench.calibrate, pure parts
def test_capacity_and_alpha_from_numbers():
    from clasp.bench import calibrate as cal

    assert cal.cpu_rate_us(1.0, 4.0) == 250_000.0
    mult = {"split": 1.0, "count": 15.0}
    tau = {"split": 3.0, "count": 0.2}
    cost = cal.per_record_cost(mult, tau, alpha=0.5, chained=15.0)
    assert cost == pytest.approx(3.0 + 3.0 + 7.5)
    assert cal.capacity(20_000.0, cost) == pytest.approx(270_000.0)
    # SYN: W 250,000 µs/s at 50,000 records/s is 5 µs per record; 1 µs of execution; 9 chained requests.
    assert cal.alpha_from_chain(250_000.0, 50_000.0, 1.0, 9.0) == pytest.approx(4.0 / 9)


def test_two_chain_lengths_separate_alpha_from_the_per_record_cost():
    from clasp.bench import calibrate as cal

    # W 250,000 µs/s; τ̄ 0.1 µs per no-op; α 0.5 µs per chained request; F 1.2 µs per record.
    def lam(n_ops):
        return 250_000.0 / (0.1 * n_ops + 0.5 * (n_ops - 1) + 1.2)

    alpha, fixed = cal.alpha_and_record_cost(250_000.0, (lam(10), 1.0, 9.0), (lam(5), 0.5, 4.0))
    assert alpha == pytest.approx(0.5) and fixed == pytest.approx(1.2)
    # A short chain cheaper than proportional would make F negative: F 0 and the one-chain α instead.
    alpha, fixed = cal.alpha_and_record_cost(250_000.0, (50_000.0, 1.0, 9.0), (250_000.0 / 1.5, 0.5, 4.0))
    assert fixed == 0.0 and alpha == pytest.approx(cal.alpha_from_chain(250_000.0, 50_000.0, 1.0, 9.0))
    with pytest.raises(ValueError, match="not separable"):
        cal.alpha_and_record_cost(250_000.0, (lam(10), 1.0, 9.0), (lam(10), 1.0, 9.0))


def test_record_cost_goes_half_to_the_sources_and_half_to_the_sinks_per_record():
    from clasp.bench import calibrate as cal

    # WC-like: one split per record, 15 counts per record: the sink's half is spread over the 15.
    tau = cal.with_record_cost({"split": 3.0, "count": 0.2}, {"split": 1.0, "count": 15.0}, ["split"], ["count"],
                               2.0)
    assert tau == {"split": pytest.approx(4.0), "count": pytest.approx(0.2 + 1.0 / 15)}
    assert cal.ends("syn") == (["op0"], ["op9"])
    assert cal.ends(f"syn{cal.SHORT_CHAIN}") == (["op0"], [f"op{cal.SHORT_CHAIN - 1}"])
    mult, chained = cal.structure(f"syn{cal.SHORT_CHAIN}")
    assert sum(mult.values()) == cal.SHORT_CHAIN and chained == cal.SHORT_CHAIN - 1


def test_fit_tau_adds_a_per_request_residual_or_scales_down():
    from clasp.bench import calibrate as cal

    mult = {"a": 1.0, "b": 3.0}
    tau = {"a": 2.0, "b": 1.0}
    fitted, eps = cal.fit_tau(tau, mult, alpha=1.0, chained=3.0, target_us=12.0)  # base 2 + 3 + 3 = 8
    assert eps == pytest.approx(1.0)
    assert cal.per_record_cost(mult, fitted, 1.0, 3.0) == pytest.approx(12.0)
    fitted, eps = cal.fit_tau(tau, mult, alpha=1.0, chained=3.0, target_us=5.5)  # exec must shrink to 2.5
    assert eps < 0
    assert fitted == {"a": pytest.approx(1.0), "b": pytest.approx(0.5)}
    assert cal.per_record_cost(mult, fitted, 1.0, 3.0) == pytest.approx(5.5)


def test_front_costs_are_median_cpu_per_record():
    from clasp.bench import calibrate as cal

    runs = [{"cpu_s": {0: 2.0, "planner": 0.5}, "client_cpu_s": 0.2, "cpu_window_s": 10.0, "throughput": 20_000.0},
            {"cpu_s": {0: 2.0, "planner": 0.9}, "client_cpu_s": 0.3, "cpu_window_s": 10.0, "throughput": 30_000.0},
            {"cpu_s": {0: 2.0, "planner": 0.4}, "client_cpu_s": None, "cpu_window_s": 10.0, "throughput": 10_000.0}]
    # planner 2.5, 3.0, 4.0 µs per record; client 1.0, 1.0 (the third run did not measure it).
    assert cal.front_costs(runs) == {"planner_us": 3.0, "client_us": 1.0}
    assert cal.front_costs([{"cpu_s": {0: 1.0}, "cpu_window_s": 0.0, "throughput": 0.0}]) \
        == {"planner_us": None, "client_us": None}


def test_solve_bisects_a_decreasing_function():
    from clasp.bench import calibrate as cal

    assert cal.solve(lambda x: 100.0 / (1 + x), 0.0, 10.0, 50.0) == pytest.approx(1.0, abs=1e-6)
    assert cal.solve(lambda x: 100.0 / (1 + x), 0.0, 10.0, 200.0) == 0.0


def test_solve_finds_what_bisection_would_in_fewer_runs_and_never_two_more():
    """Each evaluation is a simulated run: within bisection's resolution after `iters` halvings, in fewer
    evaluations on a nearly linear f, and at most one more (beyond the two bounds) on any monotone one."""
    import random

    from clasp.bench import calibrate as cal

    rng = random.Random(7)
    for _ in range(500):
        root, power, iters = rng.uniform(0.01, 9.99), rng.choice([0.3, 1.0, 3.0]), rng.randint(5, 30)
        calls = []

        def f(x, root=root, power=power, calls=calls):
            calls.append(x)
            return -abs(x - root) ** power * (1 if x > root else -1)

        assert abs(cal.solve(f, 0.0, 10.0, 0.0, iters) - root) <= 10.0 / 2 ** (iters + 1)
        assert len(calls) <= iters + 3
    calls = []
    assert cal.solve(lambda x: calls.append(x) or 100.0 - 9.0 * x - 0.1 * x * x, 0.0, 10.0, 50.0, 20) \
        == pytest.approx((-9.0 + 101 ** 0.5) / 0.2, abs=10.0 / 2 ** 21)
    assert len(calls) <= 20 / 2


def test_calibrated_file_loads():
    from clasp.apps import get_app
    from clasp.sim.simulator import MEASURED_COSTS_FILE, Costs, app_dag

    costs = Costs.load(MEASURED_COSTS_FILE)
    assert costs.capacity > 0 and costs.beta >= costs.alpha >= 0
    for app in ("wc", "syn"):
        assert set(app_dag(get_app(app), costs).operators) == set(costs.tau_us[app])


def test_cgroup_and_run_delay_readers_on_this_process():
    import os

    st = ce.cgroup_cpu_stat(os.getpid())
    assert st is None or set(st) == {"nr_periods", "nr_throttled", "throttled_s"}
    assert ce.cgroup_cpu_stat(2 ** 22 + 12345) is None  # no such process
    assert ce.run_delay_seconds(os.getpid()) >= 0


def test_mix_calibration_placement_is_not_a_spread():
    from clasp.bench import calibrate as cal

    assert cal.MIX["op0"] == {0: 1.0} and cal.MIX["op1"] == {0: 0.5, 1: 0.5}
    assert all(cal.MIX[o] != {0: 0.5, 1: 0.5} for o in cal.SYN_OPS[::2])
    # SPLIT: every operator on both workers, almost all on worker 0, and each successor's share there a little
    # smaller than its predecessor's: under local-first routing worker 0 then keeps each edge up to its share
    # and still sends a surplus, so every chained request it keeps takes the table route.
    shares = [cal.SPLIT[o][0] for o in cal.SYN_OPS]
    assert all(set(cal.SPLIT[o]) == {0, 1} and sum(cal.SPLIT[o].values()) == pytest.approx(1.0) for o in cal.SYN_OPS)
    assert all(0.97 <= a and a > b for a, b in zip(shares, shares[1:], strict=False))


def test_fit_message_us_recovers_a_common_slope():
    from clasp.bench import calibrate as cal

    def run(msgs_sent_per_s, cpu_per_record, tput=10_000.0, win=4.0, flush=None):
        # Two workers splitting the CPU and the messages.
        cpu = cpu_per_record * tput * win / 1e6
        sent = msgs_sent_per_s * win / 2
        return {"throughput": tput, "cpu_window_s": win, "flush_delay_ms": flush,
                "cpu_s": {0: cpu / 2, 1: cpu / 2, "planner": 9.0},
                "per_worker": {i: {"window": {"messages": {"sent": sent}}} for i in (0, 1)}}

    # Message ends per record = 2 × sent / s / throughput; CPU = intercept + 25 µs per message end.
    alt = [run(m, 17.0 + 25.0 * 2 * m / 10_000) for m in (200.0, 500.0, 900.0)]
    fan = [run(m, 20.0 + 25.0 * 2 * m / 10_000) for m in (100.0, 400.0)]
    us, points = cal.fit_message_us({"alt": alt, "fan": fan})
    assert us == pytest.approx(25.0)
    assert len(points) == 5 and points[0]["message_ends_per_record"] == pytest.approx(0.04)
    assert cal.peer_messages_per_record({"throughput": 1.0, "cpu_window_s": 1.0, "per_worker": {0: {}}}) is None
    # Fewer messages costing more: clamped at 0.
    assert cal.fit_message_us({"alt": [run(200.0, 20.0), run(800.0, 18.0)]})[0] == 0.0


def test_fit_flush_delay_is_cpu_seconds_per_batch_to_one_peer_growing_with_the_peers():
    """FAN's worker 0 sends to 2 peers: 0.25 CPU and 200 messages/s of 10 rows, 100 per peer, is one batch
    per 2.5 ms of its CPU; ALT's senders (1 peer) 125 per peer, one per 2 ms: d₁ = 2 ms, c = 0.25. A worker
    whose messages hold one row each (not timer-bound), or below 90 % of its quota, is left out."""
    from clasp.bench import calibrate as cal

    def run(w0_sent, w0_rows, w1_sent=50.0, w1_cpu=0.25, win=4.0):
        return {"cpu_window_s": win, "cpu_s": {0: 0.25 * win, 1: w1_cpu * win, 2: 0.25 * win},
                "per_worker": {0: {"window": {"messages": {"sent": w0_sent * win, "sent_rows": w0_rows * win}}},
                               1: {"window": {"messages": {"sent": w1_sent * win,
                                                           "sent_rows": 10 * w1_sent * win}}}}}

    flush, c, points = cal.fit_flush_delay({"fan": (cal.FAN, [run(200.0, 2000.0, w1_cpu=0.1)]),
                                            "alt": (cal.ALT, [run(125.0, 1250.0, 125.0)])}, quota=0.25)
    assert (flush, c) == (pytest.approx(0.002), pytest.approx(0.25))
    assert sorted((p["placement"], p["worker"], p["peers"]) for p in points) == [
        ("alt", 0, 1), ("alt", 1, 1), ("fan", 0, 2)]
    one_count = cal.fit_flush_delay({"fan": (cal.FAN, [run(200.0, 2000.0, w1_cpu=0.1)])}, quota=0.25)
    assert one_count[0] == pytest.approx(0.0025 / (1 + cal.FLUSH_PEER_FACTOR))
    assert cal.fit_flush_delay({"fan": (cal.FAN, [run(200.0, 200.0, w1_cpu=0.1)])}, quota=0.25)[0] is None


def test_monitor_counts_data_messages_per_interval():
    from clasp.runtime.monitor import Monitor

    m = Monitor("w0")
    c = m.job_messages(7)
    c[0] += 2
    c[1] += 300
    c[2] += 1
    c[3] += 40
    assert m.message_counts(7) == {"sent": 2, "sent_rows": 300, "received": 1, "received_rows": 40}
    assert m.message_counts(8) == {"sent": 0, "sent_rows": 0, "received": 0, "received_rows": 0}
    assert m.sample(1.0)["messages"] == {"sent": 0.0, "sent_rows": 0.0, "received": 0.0, "received_rows": 0.0}


def test_fit_fixes_gamma_to_zero_when_message_us_is_fitted(monkeypatch):
    from clasp.bench import calibrate as cal

    def fake_sim(costs, placement, workers):  # decreasing in β and γ; ALT has δ = 1, FAN δ = 2
        delta = 1 if placement is cal.ALT else 2
        per_record = 10.0 + 5.0 * costs.beta + 2.0 * costs.message_us * 0.05 * delta
        return (costs.capacity - costs.gamma * delta) / per_record

    monkeypatch.setattr(cal, "_sim_tput", fake_sim)

    def run(tput, cpu_per_record=20.0, msgs_sent_per_s=0.0, win=4.0, flush=None, workers=2):
        cpu = cpu_per_record * tput * win / 1e6
        return {"throughput": tput, "cpu_window_s": win, "flush_delay_ms": flush,
                "cpu_s": {**{i: cpu / workers for i in range(workers)}, "planner": 0.1},
                "operators": {o: {"tau_us": 0.1} for o in cal.SYN_OPS},
                "per_worker": {i: {"window": {"messages": {"sent": msgs_sent_per_s * win / workers}}}
                               for i in range(workers)}}

    one = run(60_000.0, workers=1)
    one["cpu_s"] = {0: 250_000.0 * 4.0 / 1e6, "planner": 0.1}  # W = 250,000 µs/s
    # ALT: 20 → 22 µs/record when message ends per record go 0.02 → 0.06 (50 µs per message end).
    alt = [run(12_000.0, 20.0, 120.0)]
    alt_fast = [run(12_000.0, 22.0, 360.0, flush=0.1)]
    fan = [run(9_000.0, 20.0, 90.0, workers=3)]
    fan_fast = [run(9_000.0, 22.0, 270.0, flush=0.1, workers=3)]
    runs = {"one": {"syn": [one]}, "alt": alt, "fan": fan, "alt_fast": alt_fast, "fan_fast": fan_fast}
    tau = {"syn": {o: 0.1 for o in cal.SYN_OPS}}

    # The synthetic workers are below their quota by construction: throughputs as given.
    doc = cal.fit(runs, 0.25, 6.0, 1, unlimited_tau=tau, scale_to_quota=False)
    assert doc["message_us"] == pytest.approx(50.0, rel=1e-3)
    assert doc["gamma"] == 0.0 and doc["measured"]["gamma_rule"].startswith("fixed 0")
    # β from ALT alone: 250,000 / (10 + 5β + 2·50·0.05) = 12,000 → β = (250,000/12,000 − 15) / 5.
    assert doc["beta"] == pytest.approx((250_000 / 12_000 - 15.0) / 5.0, abs=1e-3)

    old = cal.fit(runs, 0.25, 6.0, 1, unlimited_tau=tau, gamma_with_messages=True, scale_to_quota=False)
    assert old["gamma"] > 0 and old["measured"]["gamma_rule"] == "fitted on FAN after message_us"
    assert fake_sim(_costs(old), cal.FAN, 3) == pytest.approx(9_000.0, rel=1e-3)

    no_msg = cal.fit({k: v for k, v in runs.items() if not k.endswith("_fast")}, 0.25, 6.0, 1, unlimited_tau=tau,
                     scale_to_quota=False)
    assert "message_us" not in no_msg and no_msg["gamma"] > 0
    assert no_msg["measured"]["gamma_rule"] == "fitted on FAN"


def _costs(doc):
    from clasp.sim.simulator import Costs

    return Costs.from_json_dict(doc)


def test_pipe_fit_recovers_beta_and_the_receive_share():
    """β and the receive share a PIPE run implies are those the simulator was given (its own throughput and
    receiver/sender utilization fed back as the measurement)."""
    import dataclasses

    from clasp.bench import calibrate as cal
    from clasp.sim.simulator import MEASURED_COSTS_FILE, Costs

    assert [cal.PIPE[o] for o in cal.SYN_OPS] == [{1: 1.0}] * 5 + [{0: 1.0}] * 5
    base = Costs.load(MEASURED_COSTS_FILE)
    base = dataclasses.replace(base, gamma=0.0, message_us=0.0, alpha_split=None)
    truth = dataclasses.replace(base, beta=2.4, receive_share=0.3)
    lam = cal._sim_tput(truth, cal.PIPE, 2)
    ratio = cal._sim_pipe_ratio(truth)
    assert 0 < ratio < 1  # the sender, with the source half, is the bottleneck
    beta, share = cal.fit_pipe(dataclasses.replace(base, beta=base.alpha, receive_share=0.5), lam, ratio)
    assert beta == pytest.approx(2.4, rel=0.05) and share == pytest.approx(0.3, abs=0.03)
    # The measured ratio is the receiver's CPU over the sender's, within each run, averaged over runs.
    runs = [{"cpu_s": {0: 0.9, 1: 1.0, "planner": 0.1}}, {"cpu_s": {"0": 1.6, "1": 2.0}}]
    assert cal.receiver_cpu_ratio(runs) == pytest.approx(0.85)


def test_keyed_and_table_route_fits_recover_what_the_simulator_was_given():
    """β_split from FAN, and WC's residual shift and α_keyed from KEYED's two workers, are the values the
    simulator was given (its own throughput and per-worker CPU per line fed back as the measurement); the
    shift leaves one worker's cost per line as it was."""
    import dataclasses

    from clasp.bench import calibrate as cal
    from clasp.sim.simulator import MEASURED_COSTS_FILE, Costs

    base = dataclasses.replace(Costs.load(MEASURED_COSTS_FILE), gamma=0.0, beta_split=0.0, alpha_keyed=None)
    assert cal.fit_beta_split(base, cal._sim_tput(dataclasses.replace(base, beta_split=1.5), cal.FAN, 3)) \
        == pytest.approx(1.5, rel=0.05)
    mult = cal.structure("wc")[0]
    shifted = cal.with_keyed_shift(base, 0.2, mult)
    assert cal.per_record_cost(mult, shifted.tau_us["wc"], 0.3, 15.0) \
        == pytest.approx(cal.per_record_cost(mult, base.tau_us["wc"], 0.3, 15.0))
    truth = dataclasses.replace(shifted, alpha_keyed=0.5)
    rc, sc = (cal._sim_keyed_cost(truth, w) for w in (cal.KEYED_RECEIVER, cal.KEYED_SENDER))
    shift, keyed = cal.fit_keyed(base, rc, sc, 0.5, mult)
    assert shift == pytest.approx(0.2, abs=0.01) and keyed == pytest.approx(0.5, rel=0.05)
    # Measured: each worker's CPU over the window and the run's throughput, µs per line, averaged over runs.
    runs = [{"cpu_s": {0: 2.0, 1: 1.6}, "cpu_window_s": 8.0, "throughput": 25_000.0},
            {"cpu_s": {"0": 1.8, "1": 1.8}, "cpu_window_s": 8.0, "throughput": 22_500.0}]
    assert cal.keyed_worker_cost(runs, 0) == pytest.approx(10.0)
    assert cal.keyed_worker_cost(runs, 1) == pytest.approx(9.0)


def test_runs_scaled_to_the_quota_read_cpu_per_record_whatever_the_host_gave():
    """A worker that got 0.15 CPU of its 0.25 quota on a busy host ran 0.6 of its quiet throughput at the same
    CPU per record: scaled by the quota over its busiest worker's CPU rate, both runs read the same, and the
    one-chain α from either load is the same."""
    from clasp.bench import calibrate as cal

    def run(cpu_rates, tput, win=8.0):
        return {"throughput": tput, "cpu_window_s": win,
                "cpu_s": {**{i: c * win for i, c in enumerate(cpu_rates)}, "planner": 0.3}}

    quiet, busy = run([0.25], 50_000.0), run([0.15], 30_000.0)
    assert cal.at_quota(quiet, 0.25)["throughput"] == pytest.approx(50_000.0)
    assert cal.at_quota(busy, 0.25)["throughput"] == pytest.approx(50_000.0)
    assert cal.at_quota(busy, 0.25)["quota_factor"] == pytest.approx(0.25 / 0.15)
    # Two workers: the busiest one is the bottleneck's measure; the unchanged input is not modified.
    two = run([0.2, 0.1], 20_000.0)
    assert cal.at_quota(two, 0.25)["throughput"] == pytest.approx(25_000.0) and two["throughput"] == 20_000.0
    assert cal.at_quota({"throughput": 5.0, "cpu_window_s": 0.0, "cpu_s": {}}, 0.25)["throughput"] == 5.0

    tau = {"syn": {o: 0.1 for o in cal.SYN_OPS}}
    alphas = []
    for r in (quiet, busy):
        r = {**r, "operators": {o: {"tau_us": 0.1} for o in cal.SYN_OPS}}
        doc = cal.fit({"one": {"syn": [r]}, "alt": [r], "fan": [r]}, 0.25, 8.0, 1, unlimited_tau=tau)
        assert doc["capacity"] == 250_000.0
        alphas.append(doc["alpha"])
    assert alphas[0] == pytest.approx(alphas[1], rel=1e-6)
