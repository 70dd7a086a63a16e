"""The paper's figures (SPEC.md "Experiments"), each written once against an engine: the simulator
(`clasp/bench/sim_engine.py`) or the emulated cluster (`clasp/bench/engines.py` → `clasp/bench/cluster_engine.py`).

A figure is a list of points (`points(ctx)`), a measurement per point (`measure(ctx, point)`), a summary
of the measured rows with the paper's numbers next to ours (`summarize(ctx, rows)`) and a plot in the
paper's layout (`plot(result, path)`). `run_figure` drives it: one JSON line per point on stdout, a progress
bar on stderr, `FIG.json` and `FIG.png` in the output directory. `clasp bench` (clasp/cli/bench.py) is
the command.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clasp.core.profiles import Profile, parse_profile

APPS = ["wc", "sd", "aa", "pl", "nwm", "etl", "syn"]
QUICK_APPS = ["wc", "syn"]
PLACERS = ["clasp", "faasflow", "zhang24"]  # the base policies
# Fig. 10 compares every placement: CLASP (extended model), the paper's CLASP, the baselines and their -SP
# variants (on a fixed worker count an -SP variant is CLASP's placement for it).
FIG10_PLACERS = ["clasp", "clasp-paper", "faasflow", "faasflow-sp", "zhang24", "zhang24-sp"]
POLICY_NAMES = ["clasp", "faasflow", "faasflow-sp", "zhang24", "zhang24-sp"]
CLUSTER = 10  # the paper's testbed: ten homogeneous workers
LEVELS = [round(0.1 * i, 1) for i in range(1, 11)]
QUICK_LEVELS = [0.2, 0.5, 0.8]
# Fig. 3's fixed rate: the paper says "equal to one worker's max"; at exactly its maximum one worker's
# queue grows for as long as the run lasts, so its p95 would measure the run's length, not the placement.
FIG3_LOAD = 0.9


@dataclass
class Context:
    """What a figure's functions see: the engine, the mode, the apps, shared caches and resources."""

    engine: Any
    quick: bool
    apps: list[str]
    seed: int = 0
    workers: int = CLUSTER  # Fig. 10's cluster size
    cache: dict = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def memo(self, key, compute: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def placement(self, app: str, policy: str, workers: int):
        return self.memo(("placement", app, policy, workers),
                         lambda: self.engine.policy_placement(app, policy, workers))

    def max_throughput(self, app: str, workers: int) -> float:
        """Unthrottled throughput on `workers` workers under CLASP's placement for that many."""
        return self.memo(("max", app, workers), lambda: self.engine.unthrottled(
            app, workers, self.placement(app, "clasp", workers))["throughput"])

    def reference(self, app: str) -> float:
        """The paper's 100% input level: the 10-worker maximum."""
        return self.max_throughput(app, CLUSTER)

    def oowc(self, app: str, rate: float) -> int:
        """The observed optimal worker count: the fewest workers whose maximum sustains `rate` (2% slack,
        the measurement's noise)."""
        for n in range(1, CLUSTER + 1):
            if self.max_throughput(app, n) >= 0.98 * rate:
                return n
        return CLUSTER


@dataclass
class Figure:
    name: str
    title: str
    engines: tuple[str, ...]  # the first is the default
    points: Callable[[Context], list[dict]]
    measure: Callable[[Context, dict], dict]
    summarize: Callable[[Context, list[dict]], dict]
    plot: Callable[[dict, Path], None]
    paper: dict


# ---------------------------------------------------------------- Fig. 2 and 3: scaling a fixed placement

SIZES = [1, 5, 10]  # Figs. 2 and 3


def fig2_points(ctx: Context) -> list[dict]:
    # Size-major: the cluster engine keeps one cluster running, so each size starts one.
    return [{"app": a, "workers": n} for n in SIZES for a in ctx.apps]


def fig2_measure(ctx: Context, p: dict) -> dict:
    return {"throughput": ctx.max_throughput(p["app"], p["workers"])}


def _relative(rows: list[dict], key: str) -> dict:
    """Per app: value at n workers over its value at 1 worker."""
    base = {r["app"]: r[key] for r in rows if r["workers"] == 1}
    out: dict = {}
    for r in rows:
        b = base.get(r["app"])
        out.setdefault(r["app"], {})[str(r["workers"])] = round(r[key] / b, 3) if b and r[key] is not None else None
    return out


def fig2_summary(ctx: Context, rows: list[dict]) -> dict:
    return {"relative_throughput": _relative(rows, "throughput")}


def fig3_measure(ctx: Context, p: dict) -> dict:
    rate = FIG3_LOAD * ctx.max_throughput(p["app"], 1)
    r = ctx.engine.fixed_rate(p["app"], p["workers"], rate, ctx.placement(p["app"], "clasp", p["workers"]))
    lat = r["latency"] or {}  # None when nothing completed
    return {"rate": rate, "throughput": r["throughput"], "p50": lat.get("p50"), "p95": lat.get("p95")}


def fig3_summary(ctx: Context, rows: list[dict]) -> dict:
    return {"relative_p95": _relative(rows, "p95"), "load_of_one_worker": FIG3_LOAD}


# ---------------------------------------------------------------- Fig. 4: local vs remote state (cluster)

def fig4_points(ctx: Context) -> list[dict]:
    apps = [a for a in ctx.apps if a in ("wc", "pl")] or ["wc"]
    n = 3 if ctx.quick else CLUSTER
    return [{"app": a, "state": s, "workers": n} for a in apps for s in ("local", "remote")]


def fig4_measure(ctx: Context, p: dict) -> dict:
    r = ctx.engine.unthrottled(p["app"], p["workers"], None, state=p["state"])
    return {"throughput": r["throughput"], "correct": r.get("correct")}


def fig4_summary(ctx: Context, rows: list[dict]) -> dict:
    by = {(r["app"], r["state"]): r["throughput"] for r in rows}
    return {"local_over_remote": {a: round(by[(a, "local")] / by[(a, "remote")], 2)
                                  for a in sorted({r["app"] for r in rows}) if by.get((a, "remote"))}}


# ---------------------------------------------------------------- Fig. 8: migration durations (cluster)

def fig8_points(ctx: Context) -> list[dict]:
    from clasp.bench.engines import MIGRATION_KEYS
    from clasp.bench.migration import TRANSITIONS

    pairs = TRANSITIONS[:2] if ctx.quick else TRANSITIONS
    return [{"app": "wc", "keys": k, "input": i, "from": a, "to": b}
            for k in MIGRATION_KEYS["quick" if ctx.quick else "full"] for i in ("settled", "flowing") for a, b in pairs]


def fig8_measure(ctx: Context, p: dict) -> dict:
    return ctx.engine.migration(ctx, p["from"], p["to"], p["keys"], p.get("input") == "flowing")


def _fig8_figures(rs: list[dict]) -> dict:
    """One key count's figures over its transitions."""
    return {"planner_ms_median": round(statistics.median(r["planner_ms"] for r in rs), 1),
            "planner_ms_max": round(max(r["planner_ms"] for r in rs), 1),
            "worker_pause_ms_max": round(max(r["max_worker_pause_ms"] for r in rs), 1),
            "group_hold_ms_max": round(max(r["max_group_hold_ms"] for r in rs), 1),
            "worker_duration_ms_max": round(max(r["max_worker_duration_ms"] for r in rs), 1),
            "worker_pause_cpu_ms_max": round(max(r.get("max_worker_pause_cpu_ms", 0.0) for r in rs), 1),
            "exact": all(r["exact"] for r in rs)}


def fig8_summary(ctx: Context, rows: list[dict]) -> dict:
    """Per key count: the planner's median and largest duration, the largest worker pause and key-group
    hold, and whether the targets for that count (`FIG8_TARGETS`) are met (settled transitions, the paper's case);
    under "flowing" the same figures for the transitions made with their input still running (no targets)."""
    from clasp.bench.migration import FIG8_TARGETS

    out: dict = {}
    settled = [r for r in rows if r.get("input", "settled") == "settled"]
    for k in sorted({r["keys"] for r in settled}):
        s = _fig8_figures([r for r in settled if r["keys"] == k])
        t = FIG8_TARGETS.get(k)
        if t is not None:
            s["targets"] = t
            s["met"] = {"planner_ms": s["planner_ms_median"] <= t["planner_ms"],
                        "max_worker_pause_ms": s["worker_pause_ms_max"] <= t["max_worker_pause_ms"],
                        "max_group_hold_ms": s["group_hold_ms_max"] <= t["max_group_hold_ms"]}
        out[str(k)] = s
    flowing = [r for r in rows if r.get("input") == "flowing"]
    if flowing:
        out["flowing"] = {str(k): _fig8_figures([r for r in flowing if r["keys"] == k])
                          for k in sorted({r["keys"] for r in flowing})}
    return out


# ---------------------------------------------------------------- Fig. 9: converged α, β, γ

AGREE = 2.0  # Fig. 9 reproduced: each coefficient's per-app medians lie within this factor of each other

def fig9_points(ctx: Context) -> list[dict]:
    from clasp.bench.engines import FIG9_SIZES

    return [{"app": a, "workers": n} for a in ctx.apps for n in FIG9_SIZES["quick" if ctx.quick else "full"]]


def fig9_measure(ctx: Context, p: dict) -> dict:
    """CLASP's placement for the count, as the paper runs each app on 1..10 workers under its own system."""
    return ctx.engine.coefficients(p["app"], p["workers"], ctx.placement(p["app"], "clasp", p["workers"]))


def fig9_summary(ctx: Context, rows: list[dict]) -> dict:
    """Per coefficient: its range over every point, each app's median over the worker counts at which the
    estimator had identified it (moved off the initial values), and how far the apps' medians lie apart
    (max / min): the paper's apps agree (38.5, 275, 51,500 "across applications and cluster sizes"), and
    ours count as reproducing that when every coefficient's medians agree within AGREE and β > α."""
    from clasp.core.control import runtime_estimator_config

    initial = runtime_estimator_config()
    moved = [r for r in rows if r.get("alpha") is not None
             and (r["alpha"], r["beta"], r["gamma"]) != (initial.alpha, initial.beta, initial.gamma)]
    apps = sorted({r["app"] for r in rows}, key=APPS.index)
    out: dict = {"identified_points": len(moved), "points": len(rows)}
    for key in ("alpha", "beta", "gamma"):
        vals = [r[key] for r in rows if r.get(key) is not None]
        medians = {a: statistics.median(v) for a in apps if (v := [r[key] for r in moved if r["app"] == a])}
        positive = [m for m in medians.values() if m > 0]
        out[key] = {"mean": round(statistics.fmean(vals), 2) if vals else None,
                    "min": round(min(vals), 2) if vals else None, "max": round(max(vals), 2) if vals else None,
                    "median_per_app": {a: round(m, 3) for a, m in medians.items()},
                    "apps_apart": round(max(positive) / min(positive), 2)
                    if len(positive) == len(medians) and positive else None}
    out["reproduced"] = bool(len(apps) >= 2 and all(
        out[k]["apps_apart"] is not None and out[k]["apps_apart"] <= AGREE for k in ("alpha", "beta", "gamma"))
        and all(out["beta"]["median_per_app"][a] > out["alpha"]["median_per_app"][a]
                for a in out["alpha"]["median_per_app"]))
    return out


# ---------------------------------------------------------------- Fig. 10: placement per policy, 10 workers

def fig10_points(ctx: Context) -> list[dict]:
    return [{"app": a, "policy": p, "workers": ctx.workers} for a in ctx.apps for p in FIG10_PLACERS]


def fig10_measure(ctx: Context, p: dict) -> dict:
    placement = ctx.placement(p["app"], p["policy"], p["workers"])
    r = ctx.engine.unthrottled(p["app"], p["workers"], placement)
    return {"throughput": r["throughput"], "used_workers": placement.workers}


def fig10_summary(ctx: Context, rows: list[dict]) -> dict:
    by = {(r["app"], r["policy"]): r["throughput"] for r in rows}
    apps = sorted({r["app"] for r in rows}, key=APPS.index)
    return {"clasp_over": {p: {a: round(by[(a, "clasp")] / by[(a, p)], 2) if by[(a, p)] else None for a in apps}
                           for p in FIG10_PLACERS[1:]},
            "clasp_best_everywhere": all(by[(a, "clasp")] >= max(by[(a, p)] for p in FIG10_PLACERS) * 0.99
                                         for a in apps),
            # Per placer, on every app (1 % slack): the -SP variants run CLASP's own placement, so on the
            # emulated cluster they differ from it by the run-to-run noise only.
            "clasp_at_or_above": {p: all(by[(a, "clasp")] >= by[(a, p)] * 0.99 for a in apps)
                                  for p in FIG10_PLACERS[1:]}}


# ---------------------------------------------------------------- Figs. 11-13: worker-count prediction

def _levels(ctx: Context) -> list[float]:
    return QUICK_LEVELS if ctx.quick else LEVELS


def _prediction_points(ctx: Context, policies: list[str]) -> list[dict]:
    pts: list[dict] = [{"kind": "max", "app": a, "workers": n} for a in ctx.apps for n in range(1, CLUSTER + 1)]
    levels = _levels(ctx)
    pts += [{"kind": "transition", "app": a, "policy": p, "source": s, "target": t}
            for a in ctx.apps for p in policies for s in levels for t in levels if s != t]
    return pts


TRANSITION_SECONDS = {"quick": (20.0, 15.0), "full": (30.0, 20.0)}


def prediction_measure(ctx: Context, p: dict) -> dict:
    if p["kind"] == "max":
        return {"throughput": ctx.max_throughput(p["app"], p["workers"])}
    ref = ctx.reference(p["app"])
    before, after = TRANSITION_SECONDS["quick" if ctx.quick else "full"]
    src, dst = p["source"] * ref, p["target"] * ref
    r = ctx.engine.autoscaled(p["app"], p["policy"], Profile("steps", ((src, before), (dst, after))), CLUSTER,
                              min(src, dst), drain=False, backlog_seconds=None)
    series = [s for s in r["series"] if s["t"] < before + after]
    at_switch = next((s["workers"] for s in series if s["t"] >= before - 1), series[-1]["workers"])
    # The prediction: what the first re-plan after the rate change chose (no change keeps the count).
    first = next((d for d in r["decisions"] if d["t"] > before), None)
    predicted = (first["workers"] if first and first["change"] else at_switch) if first else series[-1]["workers"]
    optimal = ctx.oowc(p["app"], dst)
    return {"source_workers": at_switch, "predicted": predicted, "final": series[-1]["workers"],
            "oowc": optimal, "error": predicted - optimal, "source_oowc": ctx.oowc(p["app"], src)}


def _transitions(rows: list[dict], policy: str) -> list[dict]:
    return [r for r in rows if r.get("kind") == "transition" and r["policy"] == policy]


def _mean_abs(rows: list[dict], key: str = "error") -> float | None:
    return round(statistics.fmean(abs(r[key]) for r in rows), 3) if rows else None


def fig11_summary(ctx: Context, rows: list[dict]) -> dict:
    t = _transitions(rows, "clasp")
    gaps = sorted({round(abs(r["target"] - r["source"]), 1) for r in t})
    return {"mean_abs_error": _mean_abs(t),
            "by_target": {str(lv): _mean_abs([r for r in t if r["target"] == lv]) for lv in _levels(ctx)},
            "by_app": {a: _mean_abs([r for r in t if r["app"] == a]) for a in ctx.apps},
            "by_gap": {str(g): _mean_abs([r for r in t if round(abs(r["target"] - r["source"]), 1) == g])
                       for g in gaps},
            "scaling_up": _mean_abs([r for r in t if r["target"] > r["source"]]),
            "scaling_down": _mean_abs([r for r in t if r["target"] < r["source"]])}


def fig12_summary(ctx: Context, rows: list[dict]) -> dict:
    t = _transitions(rows, "clasp")
    return {"by_target": {str(lv): {"clasp": round(statistics.fmean(r["predicted"] for r in sel), 2),
                                    "oowc": round(statistics.fmean(r["oowc"] for r in sel), 2)}
                          for lv in _levels(ctx) if (sel := [r for r in t if r["target"] == lv])},
            "mean_abs_error": _mean_abs(t)}


# FaaSFlow-SP too: FaaSFlow's extrapolation with CLASP's placement, the one the observed optimum is measured
# with. FaaSFlow's own placement does not scale some apps at all (WC: 139 records/s on 2 workers, 131 on 5),
# so from its own steady counts it extrapolates to the pool, and its scale-up bias is its placement's.
FIG13_POLICIES = ["clasp", "faasflow", "faasflow-sp", "zhang24"]


def fig13_summary(ctx: Context, rows: list[dict]) -> dict:
    out: dict = {"by_target": {}, "bias": {}}
    for lv in _levels(ctx):
        cell = {}
        for pol in FIG13_POLICIES:
            sel = [r for r in _transitions(rows, pol) if r["target"] == lv]
            if sel:
                cell[pol] = round(statistics.fmean(r["predicted"] for r in sel), 2)
                cell["oowc"] = round(statistics.fmean(r["oowc"] for r in sel), 2)
        out["by_target"][str(lv)] = cell
    for pol in FIG13_POLICIES:
        t = _transitions(rows, pol)
        up = [r["error"] for r in t if r["target"] > r["source"]]
        down = [r["error"] for r in t if r["target"] < r["source"]]
        out["bias"][pol] = {"scaling_up_mean_error": round(statistics.fmean(up), 2) if up else None,
                            "scaling_down_mean_error": round(statistics.fmean(down), 2) if down else None,
                            "mean_abs_error": _mean_abs(t)}
    return out


# ---------------------------------------------------------------- Fig. 14: burst and gradual, per policy

def fig14_points(ctx: Context) -> list[dict]:
    policies = PLACERS if ctx.quick else POLICY_NAMES  # quick: the three base policies
    return [{"app": a, "profile": k, "policy": p} for a in ctx.apps for k in ("burst", "gradual") for p in policies]


def fig14_measure(ctx: Context, p: dict) -> dict:
    ref = ctx.reference(p["app"])
    profile = parse_profile(p["profile"], ref, seed=ctx.seed)
    r = ctx.engine.autoscaled(p["app"], p["policy"], profile, CLUSTER, 0.1 * ref)
    span = r["drained_at"] or len(r["series"])
    return {"records": round(r["pushed"]), "throughput": r["completed"] / span, "seconds": span,
            "drained": r["drained_at"] is not None, "p50": r["latency"]["p50"], "p95": r["latency"]["p95"],
            "workers_mean": round(statistics.fmean(s["workers"] for s in r["series"][:int(profile.duration)]), 2),
            "rescales": sum(1 for d in r["decisions"] if d["change"])}


def fig14_summary(ctx: Context, rows: list[dict]) -> dict:
    out: dict = {}
    for kind in ("burst", "gradual"):
        sel = [r for r in rows if r["profile"] == kind]
        by = {(r["app"], r["policy"]): r for r in sel}
        ratios: dict = {}
        for pol in {r["policy"] for r in sel} - {"clasp"}:
            tp = [by[(a, "clasp")]["throughput"] / by[(a, pol)]["throughput"] for a in ctx.apps
                  if (a, pol) in by and by[(a, pol)]["throughput"]]
            med = [1 - by[(a, "clasp")]["p50"] / by[(a, pol)]["p50"] for a in ctx.apps
                   if (a, pol) in by and by[(a, pol)]["p50"]]
            ratios[pol] = {"max_throughput_ratio": round(max(tp), 2) if tp else None,
                           "max_median_latency_reduction": round(max(med), 2) if med else None}
        out[kind] = ratios
    return out


# ---------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(path: Path, title: str, ylabel: str, groups: list[str], series: dict[str, list[float | None]],
          log: bool = False) -> None:
    """Grouped bars in the paper's layout: one group per app on x, one bar per series."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(groups) + 2), 3.6))
    width = 0.8 / max(len(series), 1)
    for i, (name, vals) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width, label=name)
    ax.set_xticks(range(len(groups)), [g.upper() for g in groups])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.18)
    ax.legend(fontsize=8, ncol=min(len(series), 5), loc="upper left")
    _save(plt, fig, path)


def _by_app(result: dict, key: str, series_key: str, value: str) -> tuple[list[str], dict]:
    rows = [r for r in result["points"] if key in r]
    apps = [a for a in APPS if any(r["app"] == a for r in rows)]
    names = list(dict.fromkeys(str(r[series_key]) for r in rows))
    series = {n: [next((r[value] for r in rows if r["app"] == a and str(r[series_key]) == n), None) for a in apps]
              for n in names}
    return apps, series


def fig2_plot(result: dict, path: Path) -> None:
    rel = result["summary"]["relative_throughput"]
    apps = [a for a in APPS if a in rel]
    series = {f"{n} worker{'s' if n != '1' else ''}": [rel[a].get(n) for a in apps] for n in ("1", "5", "10")}
    _bars(path, f"Fig. 2: throughput relative to 1 worker ({result['engine']}; paper SYN 3.7x / 5.5x)",
          "throughput / 1 worker", apps, series)


def fig3_plot(result: dict, path: Path) -> None:
    apps, series = _by_app(result, "p95", "workers", "p95")
    _bars(path, f"Fig. 3: p95 latency at {FIG3_LOAD:.0%} of one worker's max ({result['engine']})",
          "p95 latency (s)", apps, {f"{k} workers": v for k, v in series.items()})


def fig4_plot(result: dict, path: Path) -> None:
    apps, series = _by_app(result, "state", "state", "throughput")
    _bars(path, f"Fig. 4: local vs remote state ({result['engine']}; paper WC 3.5x, PL 1.5x)",
          "throughput (records/s)", apps, series)


def fig8_plot(result: dict, path: Path) -> None:
    """One panel per figure of Fig. 8 against the key count: the median and the largest over the
    transitions, and the targets (`FIG8_TARGETS`)."""
    from clasp.bench.migration import FIG8_TARGETS

    every = result["points"]
    rows = [r for r in every if r.get("input", "settled") == "settled"]
    flowing = [r for r in every if r.get("input") == "flowing"]
    keys = sorted({r["keys"] for r in rows})
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (("planner_ms", "planner duration", "planner_ms"),
              ("max_worker_pause_ms", "worker pause (longest step)", "max_worker_pause_ms"),
              ("max_group_hold_ms", "key-group hold", "max_group_hold_ms"))
    for ax, (field_, title, target) in zip(axes, panels, strict=True):
        per = [[r[field_] for r in rows if r["keys"] == k] for k in keys]
        ax.plot(keys, [statistics.median(v) for v in per], marker="o", label="median over transitions")
        ax.plot(keys, [max(v) for v in per], marker="^", ls="--", label="max over transitions")
        if flowing:
            fk = sorted({r["keys"] for r in flowing})
            fper = [[r[field_] for r in flowing if r["keys"] == k] for k in fk]
            ax.plot(fk, [statistics.median(v) for v in fper], marker="o", color="tab:red",
                    label="median, input flowing")
            ax.plot(fk, [max(v) for v in fper], marker="^", ls="--", color="tab:red", label="max, input flowing")
        if field_ == "max_worker_pause_ms" and all("max_worker_pause_cpu_ms" in r for r in rows):
            # the same stretch by the worker's CPU clock: the rest of the wall time is preemption/throttling
            ax.plot(keys, [max(r["max_worker_pause_cpu_ms"] for r in rows if r["keys"] == k) for k in keys],
                    marker="v", ls=":", label="max, CPU time")
        tk = [k for k in keys if k in FIG8_TARGETS]
        if tk:
            ax.plot(tk, [FIG8_TARGETS[k][target] for k in tk], "k_", ms=18, mew=2, ls="none", label="target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("keys in the state")
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    pairs = ", ".join(dict.fromkeys(f"{r['from']}→{r['to']}" for r in rows))
    fig.suptitle(f"Fig. 8: WC migration against state size over {pairs} ({result['engine']})", fontsize=10)
    _save(plt, fig, path)


def fig9_plot(result: dict, path: Path) -> None:
    rows = result["points"]
    apps = [a for a in APPS if any(r["app"] == a for r in rows)]
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, key in zip(axes, ("alpha", "beta", "gamma"), strict=True):
        ax.boxplot([[r[key] for r in rows if r["app"] == a and r.get(key) is not None] or [0] for a in apps],
                   tick_labels=[a.upper() for a in apps])
        ax.set_title(f"{key} (µs{'/s' if key == 'gamma' else ''})", fontsize=10)
    fig.suptitle(f"Fig. 9: converged coefficients over worker counts ({result['engine']})", fontsize=10)
    _save(plt, fig, path)


def fig10_plot(result: dict, path: Path) -> None:
    apps, series = _by_app(result, "policy", "policy", "throughput")
    workers = result["points"][0]["workers"] if result.get("points") else CLUSTER
    _bars(path, f"Fig. 10: unthrottled throughput on {workers} workers per placement ({result['engine']})",
          "throughput (records/s)", apps, series, log=True)


def _lines(path: Path, title: str, xlabel: str, ylabel: str, xs: list, series: dict[str, list]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name, ls="--" if name == "oowc" else "-")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def fig11_plot(result: dict, path: Path) -> None:
    s = result["summary"]
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (key, label) in zip(axes, (("by_target", "target rate"), ("by_app", "app"), ("by_gap", "rate gap")),
                                strict=True):
        keys = list(s[key])
        ax.bar(range(len(keys)), [s[key][k] or 0 for k in keys])
        ax.set_xticks(range(len(keys)), [k.upper() if key == "by_app" else k for k in keys], fontsize=8)
        ax.axhline(0.25, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("mean |workers − OOWC|")
    fig.suptitle(f"Fig. 11: worker-count error of CLASP ({result['engine']}; paper < 0.25 per app)", fontsize=10)
    _save(plt, fig, path)


def fig12_plot(result: dict, path: Path) -> None:
    bt = result["summary"]["by_target"]
    xs = [float(k) for k in bt]
    _lines(path, f"Fig. 12: workers per target rate ({result['engine']})", "target rate (fraction of max)",
           "workers", xs, {"clasp": [bt[k]["clasp"] for k in bt], "oowc": [bt[k]["oowc"] for k in bt]})


def fig13_plot(result: dict, path: Path) -> None:
    bt = result["summary"]["by_target"]
    xs = [float(k) for k in bt]
    names = [p for p in [*FIG13_POLICIES, "oowc"] if all(p in bt[k] for k in bt)]
    _lines(path, f"Fig. 13: predicted workers per target rate ({result['engine']})", "target rate (fraction of max)",
           "workers", xs, {n: [bt[k][n] for k in bt] for n in names})


def fig14_plot(result: dict, path: Path) -> None:
    rows = result["points"]
    apps = [a for a in APPS if any(r["app"] == a for r in rows)]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(13, 6))
    for i, kind in enumerate(("burst", "gradual")):
        for j, (key, label) in enumerate((("throughput", "throughput (records/s)"), ("p50", "median latency (s)"),
                                          ("p95", "p95 latency (s)"))):
            ax = axes[i][j]
            width = 0.8 / len(policies)
            for k, pol in enumerate(policies):
                vals = [next((r[key] for r in rows if r["app"] == a and r["policy"] == pol and r["profile"] == kind),
                             0) for a in apps]
                ax.bar([x + (k - (len(policies) - 1) / 2) * width for x in range(len(apps))], vals, width, label=pol)
            ax.set_xticks(range(len(apps)), [a.upper() for a in apps])
            ax.set_yscale("log")
            ax.set_title(f"{kind}: {label}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Fig. 14: burst and gradual input per policy ({result['engine']})", fontsize=10)
    _save(plt, fig, path)


# ---------------------------------------------------------------- the registry

FIGURES: dict[str, Figure] = {f.name: f for f in [
    Figure("fig2", "throughput at 1/5/10 workers, unthrottled", ("sim", "cluster"), fig2_points, fig2_measure,
           fig2_summary, fig2_plot, {"syn_relative": {"5": 3.7, "10": 5.5}}),
    Figure("fig3", "p95 latency at one worker's max rate, 1/5/10 workers", ("cluster", "sim"), fig2_points,
           fig3_measure, fig3_summary, fig3_plot, {"syn_relative_p95": {"5": 1.5, "10": 2.3}}),
    Figure("fig4", "local vs remote state access", ("cluster",), fig4_points, fig4_measure, fig4_summary,
           fig4_plot, {"local_over_remote": {"wc": 3.5, "pl": 1.5}}),
    Figure("fig8", "migration durations", ("cluster",), fig8_points, fig8_measure, fig8_summary, fig8_plot,
           {"planner_ms": "10-20 typical, up to ~70 (WC, ~40k keys)", "worker_pause_ms": "within ~10"}),
    Figure("fig9", "converged alpha, beta, gamma per app over worker counts", ("cluster",), fig9_points,
           fig9_measure, fig9_summary, fig9_plot, {"alpha": 38.5, "beta": 275, "gamma": 51500, "tau_us": 400}),
    Figure("fig10", "unthrottled throughput on 10 workers per placement", ("sim", "cluster"), fig10_points,
           fig10_measure, fig10_summary, fig10_plot, {"claim": "CLASP above FaaSFlow and Zhang24 on every app"}),
    Figure("fig11", "worker-count error vs the observed optimal", ("sim", "cluster"),
           lambda ctx: _prediction_points(ctx, ["clasp"]), prediction_measure, fig11_summary, fig11_plot,
           {"mean_abs_error_per_app": "< 0.25", "per_gap": "< 0.3"}),
    Figure("fig12", "workers per target rate, CLASP vs OOWC", ("sim", "cluster"),
           lambda ctx: _prediction_points(ctx, ["clasp"]), prediction_measure, fig12_summary, fig12_plot,
           {"claim": "tracks the OOWC closely"}),
    Figure("fig13", "predicted workers per policy", ("sim", "cluster"),
           lambda ctx: _prediction_points(ctx, FIG13_POLICIES), prediction_measure, fig13_summary, fig13_plot,
           {"claim": "Zhang24 over-provisions; FaaSFlow under-provisions scaling up, over-provisions scaling down"}),
    Figure("fig14", "burst and gradual input: throughput and latency per policy", ("sim", "cluster"),
           fig14_points, fig14_measure, fig14_summary, fig14_plot,
           {"max_throughput_ratio": {"faasflow": 2.5, "zhang24": 3.3},
            "max_median_latency_reduction": {"faasflow": 0.75, "zhang24": 0.76}}),
]}


def _round(v):
    if isinstance(v, float):
        return round(float(v), 6)
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def _key(point: dict) -> str:
    return json.dumps(point, sort_keys=True)


def measured_elsewhere(fig: Figure, ctx: Context, out: Path) -> dict[str, dict]:
    """Rows already measured in `out` by figures with the same measurement (Figs. 11-13 share theirs) on
    the same engine, costs, mode and seed: point → row."""
    found: dict[str, dict] = {}
    for other in FIGURES.values():
        path = out / f"{other.name}.json"
        if other is fig or other.measure is not fig.measure or not path.exists():
            continue
        try:
            prev = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (prev.get("engine"), prev.get("quick"), prev.get("seed", 0), prev.get("costs")) != (
                ctx.engine.name, ctx.quick, ctx.seed, _round(ctx.engine.describe())):
            continue
        for row in prev.get("points", []):
            found[_key({k: row[k] for k in row if k in _POINT_KEYS})] = row
    return found


# The keys a point is made of (the rest of a row is its measurement).
_POINT_KEYS = ("kind", "app", "workers", "policy", "source", "target", "profile", "state", "keys", "input", "from",
               "to")


def run_figure(fig: Figure, ctx: Context, out: Path, *, command: str, progress=None, reuse: bool = True,
               stdout=sys.stdout) -> dict:
    """Measure every point (a JSON line each on `stdout`), then write FIG.json and FIG.png into `out`. With
    `reuse`, points another figure already measured the same way in `out` are taken from its JSON."""
    points = fig.points(ctx)
    rows: list[dict] = []
    known = measured_elsewhere(fig, ctx, out) if reuse else {}
    t0 = time.perf_counter()
    with ctx.stack:
        for i, p in enumerate(points):
            row = known.get(_key(p)) or {**p, **fig.measure(ctx, p)}
            rows.append(row)
            print(json.dumps({"figure": fig.name, "point": i + 1, "of": len(points), **_round(row)}), file=stdout,
                  flush=True)
            if progress is not None:
                progress(i + 1, len(points), row)
    result = {"figure": fig.name, "title": fig.title, "engine": ctx.engine.name, "quick": ctx.quick, "seed": ctx.seed,
              "apps": ctx.apps, "command": command, "seconds": round(time.perf_counter() - t0, 1),
              "costs": _round(ctx.engine.describe()), "reused_points": sum(1 for p in points if _key(p) in known),
              "paper": fig.paper, "summary": _round(fig.summarize(ctx, rows)), "points": _round(rows)}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{fig.name}.json").write_text(json.dumps(result, indent=1))
    # matplotlib is the optional `plot` extra: without it (a plain `pip install clasp`) the JSON is the result.
    if importlib.util.find_spec("matplotlib") is not None:
        fig.plot(result, out / f"{fig.name}.png")
    return result


def _point_size(ctx: Context, p: dict) -> tuple[float, int]:
    """(seconds of input, workers) of one point: what its wall time scales with."""
    if p.get("kind") == "transition":
        return sum(TRANSITION_SECONDS["quick" if ctx.quick else "full"]), CLUSTER
    if "profile" in p:
        return 200.0, CLUSTER  # 19 stages of 5-10 s, plus the drain
    return ctx.engine.seconds, p.get("workers", CLUSTER)


def estimate_seconds(fig: Figure, ctx: Context, known: dict[str, dict] | None = None) -> float:
    """A rough wall time of the figure's points not in `known`, from the engine's per-point estimate."""
    return sum(ctx.engine.estimate_seconds(*_point_size(ctx, p)) for p in fig.points(ctx)
               if _key(p) not in (known or {}))
