"""bench.speed_probe: the host-speed probe run beside benchmarks, and its pure helpers."""

from __future__ import annotations

import time

import pytest

from bench import speed_probe as sp


def test_speed_between_and_normalized():
    samples = [(1.0, 100.0), (2.0, 80.0), (3.0, 120.0), (9.0, 1.0)]
    assert sp.speed_between(samples, 1.5, 3.0) == pytest.approx(100.0)
    assert sp.speed_between(samples, 4.0, 8.0) is None
    # A run at 80 % of the reference speed did 80 % of the work it would have.
    assert sp.normalized(800.0, 80.0, 100.0) == pytest.approx(1000.0)
    assert sp.normalized(800.0, None, 100.0) == 800.0


def test_probe_reports_speed_while_running_and_stops():
    probe = sp.SpeedProbe(burst_s=0.002, duty=0.2)
    try:
        start = time.monotonic()
        deadline = start + 10.0
        while len(probe.samples()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = probe.samples()
        assert len(samples) >= 5
        assert all(start - 1.0 <= t <= time.monotonic() and v > 0 for t, v in samples)
        assert probe.speed_between(start - 1.0, time.monotonic()) > 0
    finally:
        probe.stop()
    assert probe._proc.poll() is not None
