"""`clasp bench FIG [--quick] [--engine cluster|sim] [--out DIR]`: one of the paper's figures, measured here.

Writes DIR/FIG.png (the paper's layout) and DIR/FIG.json (every point, the summary next to the paper's
numbers, the command and the engine), prints a JSON line per point on stdout and a progress bar on stderr.
`all` runs every figure. A full run first says how long it will take. Bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from clasp.cli.sim import OneLineParser

FIGURE_NAMES = ["fig2", "fig3", "fig4", "fig8", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14"]


NO_MATPLOTLIB = "matplotlib is not installed: pip install 'clasp[plot]'"


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="clasp bench", description="Reproduce one of the paper's figures (docs/results.md).")
    p.add_argument("figure", help=f"one of {', '.join(FIGURE_NAMES)}, or all")
    p.add_argument("--quick", action="store_true", help="fewer apps and points: under a minute per figure")
    p.add_argument("--engine", choices=["sim", "cluster"], help="default: the figure's own (sim where it can)")
    p.add_argument("--out", default="out/bench", help="directory for FIG.png and FIG.json (default %(default)s)")
    p.add_argument("--apps", help="comma-separated apps (default: all seven; --quick: wc,syn)")
    p.add_argument("--costs", default="runtime",
                   help="simulator costs: runtime (measured here), paper, or a cost JSON file (default %(default)s)")
    p.add_argument("--cpu-per-worker", type=float, default=None,
                   help="cluster engine: CPU quota per worker (default: what fits the cores)")
    p.add_argument("--workers", type=int, default=None,
                   help="fig10: the cluster's size (default 10, the paper's testbed)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the burst and gradual input profiles (Fig. 14; default %(default)s)")
    p.add_argument("--yes", action="store_true", help="start a long full run without the 5 s pause")
    p.add_argument("--fresh", action="store_true",
                   help="measure every point, even those another figure measured the same way in --out")
    return p


def _progress_bar(console, name: str, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   TextColumn("{task.description}"), console=console, transient=True)
    task = bar.add_task("", total=total)

    def advance(done: int, of: int, row: dict) -> None:
        app = row.get("app", "")
        bar.update(task, completed=done, description=f"{app} {_short(row)}")

    return bar, advance


def _short(row: dict) -> str:
    for key in ("throughput", "p95", "planner_ms", "error", "alpha"):
        if row.get(key) is not None:
            v = row[key]
            return f"{key}={v:,.3g}" if isinstance(v, float) else f"{key}={v}"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    names = FIGURE_NAMES if args.figure == "all" else [args.figure]
    if args.figure != "all" and args.figure not in FIGURE_NAMES:
        _parser().error(f"unknown figure {args.figure!r}; accepted: {', '.join(FIGURE_NAMES)}, all")
    from clasp.bench import engines
    from clasp.bench.figures import (
        APPS,
        CLUSTER,
        FIGURES,
        QUICK_APPS,
        Context,
        estimate_seconds,
        measured_elsewhere,
        run_figure,
    )

    apps = [a.strip() for a in args.apps.split(",")] if args.apps else (QUICK_APPS if args.quick else APPS)
    unknown = [a for a in apps if a not in APPS]
    if unknown:
        _parser().error(f"unknown app(s) {', '.join(unknown)}; accepted: {', '.join(APPS)}")
    # `all` runs a figure the chosen engine cannot measure on its own default engine.
    chosen = {n: args.engine if args.engine in FIGURES[n].engines else FIGURES[n].engines[0] for n in names}
    if args.figure != "all" and args.engine and args.engine != chosen[args.figure]:
        fig = FIGURES[args.figure]
        _parser().error(f"{args.figure} needs --engine {' or '.join(fig.engines)}: "
                        f"{engines.UNSUPPORTED.get(args.figure, 'the simulator does not model it')}")
    from rich.console import Console

    console = Console(stderr=True)
    for name in names:
        fig, engine_name = FIGURES[name], chosen[name]
        try:
            engine = engines.make(engine_name, quick=args.quick, costs=args.costs, cpu_per_worker=args.cpu_per_worker)
        except engines.EngineError as e:
            print(f"clasp bench: {name}: {e}", file=sys.stderr)
            return 2
        ctx = Context(engine, args.quick, apps, seed=args.seed, workers=args.workers or CLUSTER)
        points = fig.points(ctx)
        eta = estimate_seconds(fig, ctx, {} if args.fresh else measured_elsewhere(fig, ctx, Path(args.out)))
        console.print(f"{name}: {fig.title} — {len(points)} points on the {engine_name} engine, "
                      f"about {_duration(eta)}")
        if not args.quick and eta > 600 and not args.yes:
            console.print("  a long run: starting in 5 s (Ctrl-C to stop, --yes to skip this pause)")
            time.sleep(5)
        command = shlex.join(["clasp", "bench", name, *argv[1:]])
        bar, advance = _progress_bar(console, name, len(points))
        try:
            with bar:
                result = run_figure(fig, ctx, Path(args.out), command=command, progress=advance,
                                    reuse=not args.fresh)
        except KeyboardInterrupt:
            console.print(f"{name}: interrupted")
            return 130
        png = Path(args.out) / (name + ".png")
        wrote = png if importlib.util.find_spec("matplotlib") else \
            f"{png.with_suffix('.json')} (no PNG: {NO_MATPLOTLIB})"
        console.print(f"{name}: {result['seconds']} s → {wrote}; summary {result['summary']}")
    return 0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
