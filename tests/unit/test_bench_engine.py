"""The engine benchmark runs Word Count through one and two in-process engines and checks the counts."""

from __future__ import annotations

import json

from clasp.bench import engine


def test_engine_benchmark_counts_exactly_and_reports_cpu_per_line(tmp_path, capsys):
    out = tmp_path / "engine.json"
    assert engine.main(["--lines", "3000", "--repeat", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    # Both passes did the app's work and more: the engine's CPU per line is above the split's alone.
    assert result["engine_us_per_line_1"] > result["split_us_per_line"] > 0
    assert result["engine_us_per_line_2"] > result["split_us_per_line"]
