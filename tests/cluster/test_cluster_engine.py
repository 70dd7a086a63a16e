"""clasp.bench.cluster_engine on a real 2-worker cluster (its pure helpers: tests/unit/test_calibrate.py)."""

from __future__ import annotations

import pytest

from clasp.bench import cluster_engine as ce


@pytest.fixture(scope="module")
def engine():
    yield ce
    ce.shutdown()


def test_unthrottled_wc_two_workers_is_correct(engine):
    r = engine.unthrottled("wc", 2, records=3000)
    assert r["correct"] is True
    assert r["throughput"] > 0
    assert r["records"] == 3000 and r["completed"] == 3000
    assert set(r) >= {"app", "workers", "throughput", "latency", "records", "correct", "seconds"}
    assert r["latency"] is None or set(r["latency"]) == {"p50", "p95", "p99"}
    # Spread: both workers ran both operators.
    for w in (0, 1):
        assert all(n > 0 for n in r["per_worker"][w]["processed"].values())
        # and sent each other data messages, counted (rows in them too).
        m = r["per_worker"][w]["messages"]
        assert m["sent"] > 0 and m["sent_rows"] >= m["sent"] and m["received"] > 0


def test_the_steady_window_measures_the_planner_and_the_client(engine):
    # Their CPU per record is what clasp.bench.calibrate's front costs come from.
    r = engine.unthrottled("wc", 2, seconds=3.0)
    assert r["correct"] is True and r["cpu_window_s"] > 0
    assert r["cpu_s"]["planner"] > 0 and 0 < r["client_cpu_s"] <= 1.5 * r["cpu_window_s"]


def test_explicit_placement_is_honored(engine):
    r = engine.unthrottled("wc", 2, placement={"split": {0: 1.0}, "count": {0: 1.0}}, records=2000)
    assert r["correct"] is True
    assert r["per_worker"][0]["processed"]["split"] == 2000
    assert sum(r["per_worker"][1]["processed"].values()) == 0
    assert r["per_worker"][0]["remote"] == 0
