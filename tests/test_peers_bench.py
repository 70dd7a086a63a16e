"""bench.peers on a small input: both answers checked against a Counter, and the CPU each system spent."""

from __future__ import annotations

import importlib.util
import json

import pytest

from bench.peers.__main__ import main


def _run(tmp_path, systems: str) -> dict:
    out = tmp_path / "peers.json"
    assert main(["--lines", "3000", "--rounds", "1", "--workers", "1,2", "--systems", systems,
                 "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_clasp_counts_exactly_and_reports_its_cpu_per_line(tmp_path):
    s = _run(tmp_path, "clasp")
    assert [(r["workers"], r["exact"]) for r in s["runs"]] == [(1, True), (2, True)]
    assert s["words"] > 30_000  # 3,000 lines of 10-20 words
    for r in s["runs"]:
        # The planner, the workers and this process did the work: at least the words' own Python.
        assert 1.0 < r["cpu_us_per_line"] < 10_000
    assert set(s["median_cpu_us_per_line"]) == {"clasp_1", "clasp_2"}


@pytest.mark.skipif(importlib.util.find_spec("bytewax") is None,
                    reason="Bytewax is not installed: pip install '.[peers]'")
def test_bytewax_counts_exactly_and_reports_its_cpu_per_line(tmp_path):
    s = _run(tmp_path, "bytewax")
    assert [(r["workers"], r["exact"]) for r in s["runs"]] == [(1, True), (2, True)]
    assert all(1.0 < r["cpu_us_per_line"] < 10_000 for r in s["runs"])
