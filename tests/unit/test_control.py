"""The control loop as pure code: observations in, triggers and decisions out (no cluster, no clock)."""

from __future__ import annotations

import pytest

from clasp.core.control import ControlConfig, Controller, Observation, pool_order, to_runtime_placement
from clasp.core.estimator import WorkerSample
from clasp.core.policies import ClaspPolicy, OperatorStats
from clasp.core.routing import build_placement
from tests.conftest import wordcount_dag

OPS = ["split", "count"]
EDGES = [("split", "count")]


def controller(**config) -> Controller:
    return Controller(OPS, EDGES, ClaspPolicy(), p_max=10, pool=4,
                      config=ControlConfig(warmup_requests=1000, **config))


def obs(rate: float, throughput: float | None = None, completed: int = 5000, queued: int = 0,
        active: int = 1) -> Observation:
    """A Word Count second at `rate` lines/s: 15 words per line, split 7 µs and count 0.5 µs."""
    t = rate if throughput is None else throughput
    return Observation(rate, t, completed, queued,
                       {"split": OperatorStats(t, 7.0), "count": OperatorStats(15 * t, 0.5)},
                       {("split", "count"): 15 * t},
                       {"w0": WorkerSample(0, 0.0, t * 7 + 15 * t * 0.5, 15 * t, 0, 0)}, active, 10)


def test_no_trigger_during_warmup_and_a_steady_rate():
    c = controller()
    for _ in range(5):
        assert c.observe(obs(30000, completed=10)).trigger is None  # still warming up
    for _ in range(5):
        assert c.observe(obs(10000)).trigger is None


def test_a_rate_change_must_hold_for_two_seconds_then_the_policy_scales_out():
    c = controller()
    c.observe(obs(10000))
    assert c.observe(obs(40000)).trigger is None  # one second is not consistent yet
    step = c.observe(obs(40000))
    assert "input rate changed from 10000 to 40000" in step.trigger
    assert step.decision.change and step.decision.workers >= 2
    c.placed(step.decision.placement)
    assert c.observe(obs(40000)).trigger is None and c.observe(obs(40000)).trigger is None  # cooldown


def test_a_rate_drop_during_the_cooldown_still_triggers_after_it():
    # Found by Fig. 11 (NWM from 100 % to 50 %): a backlog kept the throughput up while the input fell during
    # the cooldown after a re-placement, the cooldown took the new rate as its reference, and no trigger
    # ever fired.
    c = controller()
    c.observe(obs(10000))
    c.observe(obs(40000))
    step = c.observe(obs(40000))
    c.placed(step.decision.placement)
    assert [c.observe(obs(10000, throughput=40000, queued=q)).trigger for q in (9000, 5000)] == [None, None]
    assert c.observe(obs(10000, throughput=20000, queued=1000)).trigger is None  # one second of the drop
    step = c.observe(obs(10000))
    assert "input rate changed from 40000 to 10000" in step.trigger
    assert step.decision.change and step.decision.workers < c.current.workers


def test_throughput_trailing_for_three_seconds_triggers():
    c = controller()
    c.observe(obs(20000))
    triggers = [c.observe(obs(20000, throughput=12000, queued=q)).trigger for q in (1000, 2000, 3000)]
    assert triggers[:2] == [None, None] and "trailed the input" in triggers[2]


def test_an_idle_job_goes_back_to_one_worker():
    c = controller(idle_seconds=3)
    c.observe(obs(20000, active=3))
    steps = [c.observe(obs(0, active=3)) for _ in range(4)]
    idle = [s for s in steps if s.trigger and s.trigger.startswith("no input")]
    assert len(idle) == 1 and idle[0].decision.workers == 1


def test_runtime_placement_keeps_active_workers_first_and_moves_few_key_groups():
    spec = wordcount_dag().to_spec()
    old = build_placement(spec, ["w0", "w1", "w2"], {"split": {1: 1.0}, "count": {1: 1.0, 2: 1.0}}, 10)
    pool = pool_order(old, ["w0", "w1", "w2", "w3"])
    assert pool[:2] == ["w1", "w2"]
    result = ClaspPolicy().place_on(OPS, EDGES, controller().stats(obs(20000)), 3)
    new = to_runtime_placement(spec, result, pool, old, epoch=1)
    assert new.epoch == 1 and set(new.active_workers()) <= set(pool[:3])
    kept = sum(a == b for a, b in zip(old.operators["count"].key_groups, new.operators["count"].key_groups,
                                      strict=True))
    shares = new.operators["count"].shares
    # Every group that can stay with its owner under the new shares does.
    assert kept >= min(64, round(128 * shares.get("w1", 0))) + min(64, round(128 * shares.get("w2", 0))) - 2


def test_stats_plan_from_steady_per_record_rates_while_queues_fill():
    """Word Count filling its in-flight window on one saturated worker (figures from the simulator): the
    splitter runs ahead of the counter and of the completions. Per record, the policy must still see one
    split and 15.14 counts, the fan-out the splitter emits, or it plans ×1.5 the demand."""
    c = controller()
    fill = Observation(37943, 16395, 50000, 900, {"split": OperatorStats(24448, 10.0),
                                                  "count": OperatorStats(248169, 0.3)},
                       {("split", "count"): 370055}, {}, 1, 10)
    s = c.stats(fill)
    fanout = 370055 / 24448
    assert s.throughput == 16395
    assert s.operators["split"].rate == 16395 and s.operators["split"].tau_us == 10.0
    assert abs(s.operators["count"].rate - 16395 * fanout) < 1e-6
    assert abs(s.edges[0].rate - 16395 * fanout) < 1e-6
    steady = c.stats(obs(10000))  # a steady second is left as observed
    assert steady.operators["count"].rate == 150000 and steady.edges[0].rate == 150000
    no_split = Observation(0, 0, 0, 0, {"split": OperatorStats(0, 0), "count": OperatorStats(0, 0)}, {}, {}, 1, 0)
    assert c.stats(no_split).operators["count"].rate == 0  # nothing observed: nothing invented


def test_an_idle_job_under_a_baseline_goes_back_to_one_worker_too():
    """FaaSFlow cannot place without a throughput; the idle consolidation must not raise for it."""
    from clasp.core.policies import POLICIES

    c = Controller(OPS, EDGES, POLICIES["faasflow"](), p_max=10, pool=4,
                   config=ControlConfig(warmup_requests=1000, idle_seconds=2))
    idle = Observation(0, 0, 5000, 0, {"split": OperatorStats(0, 7.0), "count": OperatorStats(0, 0.5)}, {}, {}, 3, 10)
    steps = [c.observe(idle) for _ in range(2)]
    assert steps[-1].decision.change and steps[-1].decision.workers == 1


def test_observation_marks_saturation_and_passes_cpu_time_and_receipts():
    """A worker that worked without waiting, or that used all its CPU, is saturated; one blocked the whole
    interval (no idle wait either, but no work) is not. CPU time goes to the estimator only for a worker
    that runs this job alone."""
    from clasp.core.control import observation

    spec = wordcount_dag().to_spec()
    placement = build_placement(spec, ["a", "b", "c", "d"], {"split": {0: 1, 1: 1, 2: 1, 3: 1},
                                                             "count": {0: 1, 1: 1, 2: 1, 3: 1}}, 10)

    def sample(exec_us, idle_waits, cpu_bound, jobs=1):
        js = {"queue": 0, "queue_delay": 0.0, "exec_us": exec_us, "r_local": 10.0, "r_remote": 20.0, "r_in": 30.0,
              "operators": {}, "edges": []}
        return {"delta": 3, "idle_waits": idle_waits, "cpu_us": 150000.0, "cpu_bound": cpu_bound,
                "jobs": {j: js for j in range(7, 7 + jobs)}}

    samples = {"a": sample(1000.0, 0, False), "b": sample(0.0, 0, False), "c": sample(1000.0, 4, True),
               "d": sample(1000.0, 0, False, jobs=2)}
    o = observation(spec, samples, 7, 100.0, 100.0, 0, 0, placement)
    assert {w: s.busy for w, s in o.workers.items()} == {"a": True, "b": False, "c": True, "d": True}
    assert o.workers["a"].cpu == 150000.0 and o.workers["d"].cpu is None
    assert o.workers["a"].r_received == 30.0


def test_an_unequal_pool_is_ordered_by_cpu_allowance_and_equal_workers_keep_active_ones_first():
    spec = wordcount_dag().to_spec()
    old = build_placement(spec, ["w0", "w1", "w2", "w3"], {"split": {1: 1.0}, "count": {1: 1.0}}, 10)
    alive = ["w0", "w1", "w2", "w3"]
    assert pool_order(old, alive, {"w0": 0.2, "w1": 0.2, "w2": 0.6, "w3": 0.4}) == ["w2", "w3", "w1", "w0"]
    assert pool_order(old, alive, dict.fromkeys(alive, 0.25)) == ["w1", "w0", "w2", "w3"]
    assert pool_order(old, alive, {}) == pool_order(old, alive) == ["w1", "w0", "w2", "w3"]


def test_stats_carry_each_pool_index_its_own_capacity_from_the_cpu_allowances():
    """The 0.6- and 0.2-CPU workers' W_w reach the policy at the indices the pool gives them; equal
    workers leave the policy on the one W̄ (no per-worker list)."""
    c = controller()
    o = obs(20000)
    o.workers = {"big": WorkerSample(0, cpus=0.6), "small": WorkerSample(0, cpus=0.2)}
    o.pool = ["big", "small"]
    c.observe(o, decide=False)
    per_cpu = c.estimator.config.capacity
    assert c.stats(o).capacities == [0.6 * per_cpu, 0.2 * per_cpu]
    o.workers = {"a": WorkerSample(0), "b": WorkerSample(0)}
    o.pool = ["a", "b"]
    c.observe(o, decide=False)
    assert c.stats(o).capacities is None


def test_observation_passes_messages_and_cpu_allowance():
    from clasp.core.control import observation

    spec = wordcount_dag().to_spec()
    placement = build_placement(spec, ["a"], {"split": {0: 1}, "count": {0: 1}}, 10)
    js = {"queue": 0, "queue_delay": 0.0, "exec_us": 10.0, "r_local": 1.0, "r_remote": 2.0, "r_in": 3.0,
          "operators": {}, "edges": [], "messages": {"sent": 40.0, "sent_rows": 2.0, "received": 50.0,
                                                      "received_rows": 3.0}}
    o = observation(spec, {"a": {"delta": 1, "cpus": 0.4, "jobs": {7: js}}}, 7, 1.0, 1.0, 0, 0, placement, ["a"])
    s = o.workers["a"]
    assert (s.messages_out, s.messages_in, s.cpus, o.pool) == (40.0, 50.0, 0.4, ["a"])


def test_key_weights_sum_the_senders_and_smooth_and_skip_malformed_entries():
    from clasp.core.control import KEY_WEIGHT_SMOOTHING, key_weights

    spec = wordcount_dag().to_spec()
    samples = {"a": {"jobs": {7: {"key_groups": {"count": {0: 100.0, 5: 10.0}}}}},
               "b": {"jobs": {7: {"key_groups": {"count": {0: 50.0, 300: 1.0, "x": 2.0, 6: -1.0},
                                                 "split": {0: 9.0}}}}},
               "c": {"jobs": {7: {"key_groups": "garbage"}}}, "d": None}
    w = key_weights(spec, samples, 7)
    assert set(w) == {"count"} and w["count"][0] == 150.0 and w["count"][5] == 10.0 and sum(w["count"]) == 160.0
    again = key_weights(spec, {"a": {"jobs": {7: {"key_groups": {"count": {1: 100.0}}}}}}, 7, w)
    assert again["count"][0] == pytest.approx((1 - KEY_WEIGHT_SMOOTHING) * 150.0)
    assert again["count"][1] == pytest.approx(KEY_WEIGHT_SMOOTHING * 100.0)
    assert key_weights(spec, {}, 7, w) == w  # nobody routed to it this tick: kept


def test_runtime_placement_owns_key_groups_by_weight():
    spec = wordcount_dag().to_spec()
    result = ClaspPolicy().place_on(OPS, EDGES, controller().stats(obs(20000)), 2)
    weights = {"count": [64.0] + [1.0] * 127}
    new = to_runtime_placement(spec, result, ["w0", "w1"], None, 1, weights)
    kg, shares = new.operators["count"].key_groups, new.operators["count"].shares
    for w, s in shares.items():
        carried = sum(v for g, v in enumerate(weights["count"]) if kg[g] == w) / sum(weights["count"])
        assert abs(carried - s) < 0.3
