"""Putting key groups to rest (clasp.core.rest): the budget of CPU time the idle-time packing may spend."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core.rest import REST_BURST_S, REST_IDLE_S, REST_SHARE, RestBudget, idle_work_at


def test_a_full_budget_allows_then_waits_for_its_share_of_the_clock():
    budget = RestBudget(10.0)
    assert budget.allows(10.0) and budget.ready_at(10.0) == 10.0
    budget.spend(REST_BURST_S + 0.01)  # one burst and a bit: overdrawn
    assert not budget.allows(10.0)
    at = budget.ready_at(10.0)
    assert at == 10.0 + (1e-6 + 0.01) / REST_SHARE
    assert not budget.allows(at - 0.01) and budget.allows(at)


def test_the_level_never_rises_above_one_burst():
    budget = RestBudget(0.0, share=0.5, burst=1.0)
    budget.spend(0.5)
    assert budget.allows(1000.0)
    budget.spend(1.0)  # a thousand seconds of filling kept one burst, not 500
    assert not budget.allows(1000.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2.0), st.floats(0, 0.3)), max_size=60))
def test_rest_budget_spends_at_most_its_share_of_the_clock_plus_one_burst(steps):
    budget = RestBudget(0.0, share=0.05, burst=0.25)
    now = spent = 0.0
    biggest = 0.0
    for dt, cost in steps:
        now += dt
        if budget.allows(now):
            budget.spend(cost)
            spent += cost
            biggest = max(biggest, cost)
        else:
            assert budget.ready_at(now) > now
    assert spent <= 0.25 + 0.05 * now + biggest + 1e-9


def test_idle_work_waits_for_the_input_to_pause_and_for_the_budget():
    budget = RestBudget(0.0)
    assert idle_work_at(5.0, 5.0, moved=False, changed=False, budget=budget) is None
    assert idle_work_at(5.0, 5.0, moved=True, changed=True, budget=budget) == 5.0 + REST_IDLE_S
    assert idle_work_at(5.0, 5.0, moved=False, changed=True, budget=budget) == 5.0 + REST_IDLE_S
    budget.spend(REST_BURST_S + 0.01)  # overdrawn: packing waits for the budget, freeing does not
    at = idle_work_at(5.0, 5.0, moved=False, changed=True, budget=budget)
    assert at == budget.ready_at(5.0) > 5.0 + REST_IDLE_S
    assert idle_work_at(5.0, 5.0, moved=True, changed=True, budget=budget) == 5.0 + REST_IDLE_S
