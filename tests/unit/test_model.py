"""Eq. (1) and Eq. (8) of the capacity model, with hand-computed numbers."""

import pytest

from clasp.core.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_CAPACITY,
    DEFAULT_GAMMA,
    CapacityModel,
    execution_cost,
    placement_load,
    remote_destinations,
    worker_capacity,
)


def test_defaults_are_the_papers_converged_values():
    m = CapacityModel()
    assert (m.alpha, m.beta, m.gamma, m.capacity) == (38.5, 275.0, 51500.0, 850000.0)
    assert (DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_GAMMA, DEFAULT_CAPACITY) == (38.5, 275.0, 51500.0, 850000.0)


def test_eq1_worker_capacity():
    # 400000 + 38.5*1000 + 275*500 + 51500*2
    assert worker_capacity(400000, 1000, 500, 2, 38.5, 275, 51500) == pytest.approx(679000)
    assert CapacityModel().worker_load(400000, 1000, 500, 2) == pytest.approx(679000)


def test_execution_cost_sums_rate_times_tau():
    assert execution_cost({"A": 1000, "B": 500}, {"A": 400, "B": 100}) == pytest.approx(450000)


def test_eq8_split_successor():
    # A wholly on worker 0; B half on 0, half on 1; 1000 chained req/s A->B.
    fractions = {"A": {0: 1.0}, "B": {0: 0.5, 1: 0.5}}
    demand = {"A": 100000.0, "B": 200000.0}
    load = placement_load(fractions, demand, {("A", "B"): 1000.0}, 38.5, 275, 51500)
    # w0: 100000 + 100000 + 1000*(38.5*0.5 + 275*0.5) + 51500*1 remote destination
    assert load[0] == pytest.approx(200000 + 156750 + 51500)
    assert load[1] == pytest.approx(100000)
    assert remote_destinations(fractions, {("A", "B"): 1000.0}) == {0: {1}}


def test_eq8_all_local_has_no_fan_out():
    fractions = {"A": {0: 1.0}, "B": {0: 1.0}}
    load = placement_load(fractions, {"A": 1.0, "B": 2.0}, {("A", "B"): 100.0}, 10, 1000, 51500)
    assert load == {0: pytest.approx(3.0 + 100 * 10)}


def test_eq8_edge_without_traffic_opens_no_connection():
    fractions = {"A": {0: 1.0}, "B": {1: 1.0}}
    assert remote_destinations(fractions, {("A", "B"): 0.0}) == {}
    load = placement_load(fractions, {"A": 5.0, "B": 7.0}, {("A", "B"): 0.0}, 38.5, 275, 51500)
    assert load == {0: 5.0, 1: 7.0}


def test_fits_with_slack():
    m = CapacityModel(capacity=100.0)
    assert m.fits({0: 100.0, 1: 50.0})
    assert not m.fits({0: 100.1})
