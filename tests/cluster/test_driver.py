"""The workload driver: pacing and summary as pure functions, the loop against a fake job, a real run."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest

import clasp
from clasp.apps import get_app
from clasp.core.profiles import parse_profile
from clasp.local.cluster import LocalCluster
from clasp.runtime.driver import UNTHROTTLED_BATCH, Driver, Series, due, finished, summarize, target_between


# ----------------------------------------------------------------------------- pacing
def test_due_follows_the_profile_integral():
    p = parse_profile("steps:1000@2,3000@1")
    assert due(p, 0.0, 0, 10_000) == 0
    assert due(p, 0.5, 0, 10_000) == 500
    assert due(p, 2.5, 0, 10_000) == 3500
    # Past the end: the whole volume, once, and no more.
    assert due(p, 10.0, 0, 10_000) == p.volume == 5000
    assert finished(p, 3.0, 4000, 10_000) and not finished(p, 2.9, 4000, 10_000)


def test_due_is_capped_by_the_records_and_never_goes_back():
    p = parse_profile("constant:1000")
    assert due(p, 5.0, 0, 1200) == 1200
    assert finished(p, 1.3, 1200, 1200)
    # A push that ran ahead (e.g. rounding in an earlier call) is never undone.
    assert due(p, 0.1, 400, 5000) == 400
    assert due(p, -1.0, 0, 5000) == 0


def test_unthrottled_due_is_one_batch_ahead_until_its_duration():
    p = parse_profile("unthrottled", duration=2.0)
    assert due(p, 0.0, 0, 10**6) == UNTHROTTLED_BATCH
    assert due(p, 1.0, 30_000, 10**6) == 30_000 + UNTHROTTLED_BATCH
    assert due(p, 1.0, 30_000, 35_000) == 35_000
    assert due(p, 2.5, 30_000, 10**6) == 30_000
    endless = parse_profile("unthrottled")
    assert not finished(endless, 1e6, 5, 10) and finished(endless, 0.0, 10, 10)


def test_target_between_is_the_mean_rate_over_the_interval():
    p = parse_profile("steps:1000@1,3000@1")
    assert target_between(p, 0.0, 1.0) == pytest.approx(1000)
    assert target_between(p, 0.5, 1.5) == pytest.approx(2000)
    assert target_between(p, 2.0, 3.0) == pytest.approx(0.0)
    assert target_between(parse_profile("unthrottled"), 0.0, 1.0) is None


# ----------------------------------------------------------------------------- series and summary
def _entry(t, tin, tout, p50=0.01, workers=2, **kw):
    return {"t": t, "input_rate": tin, "throughput": tout, "queue": 0, "inflight": 3, "p50": p50,
            "p95": p50 * 2, "p99": p50 * 3, "workers": workers, **kw}


def test_series_deduplicates_by_timestamp_and_adds_the_target():
    s = Series(parse_profile("steps:1000@1,3000@1"), offset=0.5)
    new = s.add([_entry(1.0, 500, 400), _entry(2.0, 2000, 1900)])
    assert [r["t"] for r in new] == [1.0, 2.0]
    # The planner returns overlapping windows of its series: only later entries are new.
    assert [r["t"] for r in s.add([_entry(2.0, 2000, 1900), _entry(3.0, 1500, 1600)])] == [3.0]
    assert len(s.rows) == 3
    # Planner second (1, 2] is profile second (0.5, 1.5]: half at 1000/s, half at 3000/s.
    assert s.rows[1]["target_rate"] == pytest.approx(2000)
    assert s.rows[0]["p50_ms"] == pytest.approx(10.0) and s.rows[0]["p99_ms"] == pytest.approx(30.0)
    assert s.rows[2]["workers"] == 2 and s.rows[2]["inflight"] == 3


def test_series_keeps_missing_latency_as_none():
    s = Series(parse_profile("constant:10"))
    s.add([{"t": 1.0, "input_rate": 0.0, "throughput": 0.0, "p50": None, "p95": None, "p99": None}])
    assert s.rows[0]["p50_ms"] is None and s.rows[0]["workers"] == 0


def test_summary_means_over_the_busy_seconds_only():
    s = Series(parse_profile("constant:100"))
    s.add([_entry(1, 100, 0, workers=1), _entry(2, 100, 90, workers=1), _entry(3, 100, 110, workers=3),
           _entry(4, 0, 0, workers=3), _entry(5, 0, 100, p50=0.2, workers=2), _entry(6, 0, 0, workers=2)])
    out = summarize(s.rows, records=400, completed=300, elapsed=6.0, correct=True,
                    latency={"count": 300, "p50": 0.012, "p95": 0.05, "p99": 0.08})
    # Seconds 2..5 (the first and the last that completed anything), the idle second 4 included.
    assert out["throughput_mean"] == pytest.approx((90 + 110 + 0 + 100) / 4)
    assert out["throughput_max"] == 110
    assert out["latency_ms"] == pytest.approx({"p50": 12.0, "p95": 50.0, "p99": 80.0})
    assert (out["workers_min"], out["workers_max"]) == (1, 3)
    assert out["records_per_s"] == pytest.approx(50.0)
    assert out["correct"] is True and out["seconds"] == 6 and out["records"] == 400


def test_summary_without_the_cumulative_histogram_takes_the_worst_second():
    s = Series(parse_profile("constant:100"))
    s.add([_entry(1, 100, 100, p50=0.01), _entry(2, 100, 100, p50=0.03)])
    out = summarize(s.rows, records=200, extra_field="x")
    assert out["latency_ms"]["p95"] == pytest.approx(60.0)
    assert out["duration_s"] == 2.0 and out["correct"] is None and out["extra_field"] == "x"
    empty = summarize([], records=0)
    assert empty["throughput_mean"] == 0.0 and empty["workers_max"] == 0
    assert empty["latency_ms"]["p50"] is None


# ----------------------------------------------------------------------------- the loop, against a fake job
class FakeJob:
    """Completes every record the moment it is pushed and stamps a series entry per elapsed second."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.pushes: list[tuple[float, int]] = []
        self.pushed: list = []

    def push(self, records):
        self.pushes.append((time.monotonic() - self.t0, len(records)))
        self.pushed.extend(records)
        return len(records)

    def stats(self, fresh=False):
        secs = int(time.monotonic() - self.t0)
        series = [_entry(float(t), 0.0, 1.0) for t in range(1, secs + 1)]
        n = len(self.pushed)
        return {"series": series, "outstanding": 0, "queued": 0, "completed": n, "lost": 0, "failed": 0,
                "errors": [], "latency": {"count": n, "p50": 0.001, "p95": 0.002, "p99": 0.003}}

    def wait_idle(self, timeout=60.0):
        return {}


def test_driver_paces_pushes_to_the_profile_and_checks_the_answer():
    app = SimpleNamespace(result=lambda job: sorted(job.pushed), expected=sorted)
    job = FakeJob()
    samples = []
    d = Driver(job, app, list(range(10_000)), parse_profile("steps:2000@0.5,6000@0.25"), tick=0.02,
               on_sample=lambda row, drv: samples.append(row["t"]))
    summary = d.run()
    assert summary["correct"] is True and d.sent == 2500 and summary["sent"] == 2500
    # Many small pushes, each at most what the profile allowed by its time (one tick of slack).
    assert len(job.pushes) >= 20
    total = 0
    for t, n in job.pushes:
        total += n
        assert total <= math.floor(d.profile.sent_by(t + 0.005)) + 1
    assert samples and samples == sorted(samples)
    assert summary["latency_ms"]["p99"] == pytest.approx(3.0)


def test_driver_reports_a_wrong_answer():
    app = SimpleNamespace(result=lambda job: [], expected=sorted)
    d = Driver(FakeJob(), app, list(range(100)), parse_profile("unthrottled"))
    assert d.run()["correct"] is False and d.sent == 100


# ----------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    with LocalCluster(workers=2, port=0, log_dir=tmp_path_factory.mktemp("driver-cluster2")) as c:
        yield c


def test_driver_runs_word_count_on_a_two_worker_cluster(cluster2):
    wc = get_app("wc")
    records = wc.generate(3000, seed=3)
    with clasp.connect(cluster2.planner) as c:
        submitted = time.monotonic()
        job = c.submit(wc.build_dag())
        d = Driver(job, wc, records, parse_profile("steps:1000@1,2000@1"), submitted_at=submitted)
        summary = d.run()
    assert summary["correct"] is True
    assert summary["sent"] == summary["completed"] == 3000
    assert len(d.series.rows) >= 2
    assert sum(r["input_rate"] for r in d.series.rows) == pytest.approx(3000, rel=0.1)
    assert summary["workers_max"] >= 1 and summary["latency_ms"]["p50"] > 0
    assert any(r["target_rate"] and r["target_rate"] > 0 for r in d.series.rows)
