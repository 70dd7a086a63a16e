"""bench.cluster_engine on a real 2-worker cluster, its pure helpers, and bench.calibrate's pure parts."""

from __future__ import annotations

import pytest

from bench import cluster_engine as ce


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


def test_explicit_placement_is_honored(engine):
    r = engine.unthrottled("wc", 2, placement={"split": {0: 1.0}, "count": {0: 1.0}}, records=2000)
    assert r["correct"] is True
    assert r["per_worker"][0]["processed"]["split"] == 2000
    assert sum(r["per_worker"][1]["processed"].values()) == 0
    assert r["per_worker"][0]["remote"] == 0


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
