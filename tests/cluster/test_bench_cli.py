"""`clasp bench`: argument errors, and the two cheapest figures end to end on the simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clasp.bench.engines import load_costs
from clasp.bench.figures import FIGURES, Context
from clasp.bench.sim_engine import SimEngine


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clasp", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["fig5"], "unknown figure 'fig5'"),
    (["fig2", "--engine", "gpu"], "invalid choice"),
    (["fig4", "--engine", "sim"], "fig4 needs --engine cluster"),
    (["fig2", "--apps", "wc,nope"], "unknown app(s) nope"),
    (["fig2", "--costs", "/nonexistent.json"], "cannot load costs"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    r = bench(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and r.stdout == ""


@pytest.mark.parametrize("figure", ["fig2", "fig10"])
def test_quick_figure_writes_png_and_json_and_a_line_per_point(tmp_path, figure):
    # The paper's costs: the shapes asserted below are the paper's, and this file does not change with a
    # recalibration of this runtime's costs.
    r = bench(figure, "--quick", "--costs", "paper", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    result = json.loads((tmp_path / f"{figure}.json").read_text())
    assert (tmp_path / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(lines) == len(result["points"]) == lines[-1]["of"] > 0
    assert result["engine"] == "sim" and result["quick"] and result["command"].startswith("clasp bench " + figure)
    assert result["paper"] == FIGURES[figure].paper
    if figure == "fig2":
        rel = result["summary"]["relative_throughput"]
        for app in ("wc", "syn"):
            assert rel[app]["1"] == 1.0 and 1.0 < rel[app]["5"] < rel[app]["10"] < 10  # sub-linear, growing
    else:
        assert result["summary"]["clasp_best_everywhere"] is True


def test_paper_coefficients_reproduce_the_fig2_shape_for_syn():
    """SYN split evenly over 1/5/10 workers with the paper's α, β, γ, W and 400 µs operators: the paper
    measured 3.7x at 5 workers and 5.5x at 10; the model gives the same sub-linear shape."""
    costs, _ = load_costs("paper")
    ctx = Context(SimEngine(costs, quick=True), True, ["syn"])
    rel = {n: ctx.max_throughput("syn", n) / ctx.max_throughput("syn", 1) for n in (5, 10)}
    assert 3.2 < rel[5] < 4.3 and 5.0 < rel[10] < 7.0, rel
    assert rel[10] / rel[5] < 2.0  # each added worker buys less


def test_predicted_worker_counts_match_the_observed_optimum_in_the_simulator():
    """Figs. 11-12 in the simulator with the paper's costs, which charge exactly what CLASP's Eq. (1)
    models: CLASP's first re-plan after a rate change picks the observed optimal worker count."""
    costs, _ = load_costs("paper")
    ctx = Context(SimEngine(costs, quick=True), True, ["wc"])
    fig = FIGURES["fig11"]
    rows = [{**p, **fig.measure(ctx, p)} for p in fig.points(ctx)]
    summary = fig.summarize(ctx, rows)
    assert summary["mean_abs_error"] <= 0.25, rows


def test_fig8_summary_judges_each_key_count_against_its_targets_and_plots_one_panel_per_figure(tmp_path):
    from clasp.bench.figures import fig8_plot, fig8_summary

    def row(keys, a, b, planner, pause, hold):
        return {"app": "wc", "keys": keys, "from": a, "to": b, "planner_ms": planner, "max_worker_pause_ms": pause,
                "max_group_hold_ms": hold, "max_worker_duration_ms": hold + 1, "exact": True}

    pairs = [(1, 5), (5, 1), (5, 10), (10, 5), (1, 10), (10, 1)]
    rows = [row(40_000, a, b, p, 3, 49) for (a, b), p in zip(pairs, [10, 30, 15, 25, 5, 50], strict=True)]
    rows += [row(400_000, a, b, 60, 21, 90) for a, b in pairs] + [row(4_000, 1, 5, 5, 1, 2)]
    rows[0]["max_worker_pause_ms"] = 11
    s = fig8_summary(None, rows)
    assert s["40000"]["planner_ms_median"] == 20.0 and s["40000"]["worker_pause_ms_max"] == 11
    assert s["40000"]["met"] == {"planner_ms": True, "max_worker_pause_ms": False, "max_group_hold_ms": True}
    assert s["400000"]["met"] == {"planner_ms": False, "max_worker_pause_ms": False, "max_group_hold_ms": True}
    assert "met" not in s["4000"] and s["4000"]["exact"] is True
    assert "flowing" not in s
    # Transitions made with their input still running are summarized apart, without targets.
    rows += [{**row(400_000, a, b, 900, 15, 800), "input": "flowing"} for a, b in pairs]
    rows[-1]["exact"] = False
    s = fig8_summary(None, rows)
    assert s["400000"]["planner_ms_median"] == 60 and s["flowing"]["400000"]["planner_ms_median"] == 900
    assert "met" not in s["flowing"]["400000"] and s["flowing"]["400000"]["exact"] is False
    pytest.importorskip("matplotlib")
    fig8_plot({"points": rows, "engine": "cluster"}, tmp_path / "fig8.png")
    assert (tmp_path / "fig8.png").stat().st_size > 10_000
