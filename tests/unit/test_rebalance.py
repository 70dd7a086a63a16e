"""Key groups rebalanced by their measured load (`control.rebalance`, `control.Rebalancer`): a keyed operator
whose busiest owner carries much more than its share σ gets its groups re-owned by weight, with the fewest
moves, only after the skew persisted, never while migrating, and not right after a placement change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.core.control import RebalanceConfig, Rebalancer, keyed_excess, rebalance, skewed
from clasp.core.routing import NUM_KEY_GROUPS, build_placement, key_groups_for_shares, spread_placement

CONFIG = RebalanceConfig()


def word_count_spec():
    dag = clasp.Dag("wc")
    split = dag.operator("split", lambda line: line.split())
    count = dag.operator("count", lambda s, w: ((s or 0) + 1, None), stateful=True, key=lambda w: w)
    split >> count
    return dag.to_spec()


def zipf(hot: dict[int, float], rest: float = 1.0) -> list[float]:
    """Requests/s per key group: `hot` groups as given, every other one `rest`."""
    return [hot.get(g, rest) for g in range(NUM_KEY_GROUPS)]


def test_word_counts_zipf_skew_on_contiguous_ranges_moves_to_even_loads():
    spec = word_count_spec()
    placement = spread_placement(spec, ["w0", "w1"], 4)  # w0 owns groups 0-63, with the two hottest
    weights = {"count": zipf({20: 3550.0, 13: 1310.0, 90: 200.0}, 40.0)}
    p = placement.operators["count"]
    worst, before = keyed_excess(p.shares, p.key_groups, weights["count"])
    assert worst == "w0" and before > 0.4
    new, reason = rebalance(spec, placement, weights)
    q = new.operators["count"]
    after = keyed_excess(q.shares, q.key_groups, weights["count"])[1]
    assert after < 0.05 and new.epoch == placement.epoch + 1 and "count" in reason
    assert q.shares == p.shares and new.operators["split"] == placement.operators["split"]
    moved = [g for g in range(NUM_KEY_GROUPS) if p.key_groups[g] != q.key_groups[g]]
    assert all(p.key_groups[g] == "w0" for g in moved) and 0 < len(moved) < 64  # off the busy one only


def test_a_spread_placement_with_request_weights_gives_each_owner_its_part_of_the_requests():
    spec = word_count_spec()
    weights = {"count": zipf({20: 3550.0, 13: 1310.0, 90: 200.0}, 40.0)}
    even = spread_placement(spec, ["w0", "w1"], 4).operators["count"]
    weighed = spread_placement(spec, ["w0", "w1"], 4, weights=weights).operators["count"]
    assert keyed_excess(even.shares, even.key_groups, weights["count"])[1] > 0.4
    assert keyed_excess(weighed.shares, weighed.key_groups, weights["count"])[1] < 0.05
    assert weighed.shares == even.shares


def test_even_load_a_light_job_and_an_unsplittable_hot_group_are_left_alone():
    spec = word_count_spec()
    placement = spread_placement(spec, ["w0", "w1"], 4)
    assert rebalance(spec, placement, {"count": zipf({}, 10.0)}) is None  # even
    assert rebalance(spec, placement, {"count": zipf({3: 50.0}, 0.1)}) is None  # below min_rate
    # one group with 80 % of the requests: whichever worker owns it is 60 % over; moving it gains nothing
    assert rebalance(spec, placement, {"count": zipf({3: 8000.0}, 2000.0 / 127)}) is None
    assert rebalance(spec, placement, {}) is None  # nothing measured yet


@given(n=st.integers(1, 4), shares=st.lists(st.floats(0.1, 1.0), min_size=4, max_size=4),
       weights=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 5000.0)), min_size=NUM_KEY_GROUPS,
                        max_size=NUM_KEY_GROUPS))
@settings(max_examples=150, deadline=None)
def test_a_rebalance_keeps_shares_and_owners_valid_and_removes_at_least_its_gain_of_the_excess(n, shares, weights):
    spec = word_count_spec()
    workers = [f"w{i}" for i in range(n)]
    placement = build_placement(spec, workers, {o.name: {i: shares[i] for i in range(n)} for o in spec.operators}, 4)
    out = rebalance(spec, placement, {"count": weights})
    p = placement.operators["count"]
    before = keyed_excess(p.shares, p.key_groups, weights)[1]
    if out is None:  # not skewed, or the best re-ownership by weight would not gain enough
        if skewed(spec, placement, {"count": weights}, CONFIG):
            owners = key_groups_for_shares(p.shares, NUM_KEY_GROUPS, p.key_groups, weights)
            assert keyed_excess(p.shares, owners, weights)[1] > before * (1 - CONFIG.gain)
        return
    new, _ = out
    new.check(spec)
    q = new.operators["count"]
    assert q.shares == p.shares and q.instances == p.instances and len(q.key_groups) == NUM_KEY_GROUPS
    assert set(q.key_groups) <= set(p.workers())
    assert before > CONFIG.margin and sum(weights) >= CONFIG.min_rate
    assert keyed_excess(q.shares, q.key_groups, weights)[1] <= before * (1 - CONFIG.gain)
    assert rebalance(spec, new, {"count": weights}) is None  # settled: no second move on the same load


def test_the_rebalancer_waits_for_a_persistent_skew_and_never_acts_while_migrating_or_right_after_a_change():
    spec = word_count_spec()
    placement = spread_placement(spec, ["w0", "w1"], 4)
    skew = {"count": zipf({20: 3550.0, 13: 1310.0}, 40.0)}
    even = {"count": zipf({}, 40.0)}
    r = Rebalancer(RebalanceConfig(persist=3, cooldown=2))
    assert r.tick(spec, placement, skew, False) is None
    assert r.tick(spec, placement, skew, False) is None
    assert r.tick(spec, placement, even, False) is None  # the skew did not persist: counted again
    assert [r.tick(spec, placement, skew, False) for _ in range(2)] == [None, None]
    assert [r.tick(spec, placement, skew, True) for _ in range(3)] == [None] * 3  # held: skipped, not counted
    new, reason = r.tick(spec, placement, skew, False)
    assert new.epoch == placement.epoch + 1 and reason.startswith("key groups rebalanced")
    # The placement changed (by this rebalance or anything else): `cooldown` ticks pass before counting.
    moved = build_placement(spec, ["w0", "w1"], {"split": {0: 1.0, 1: 1.0}, "count": {0: 1.0, 1: 1.0}}, 4,
                            epoch=placement.epoch + 1)
    assert [r.tick(spec, moved, skew, False) for _ in range(2 + 2)] == [None] * 4
    assert r.tick(spec, moved, skew, False) is not None
