"""`clasp run APP`: start a local cluster (or use one), submit an app, drive it at a rate profile.

Every argument is checked before any process starts; a bad one is a one-line error naming the problem
and the accepted forms, exit code 2. Exit codes otherwise: 0 the answer matched, 1 it did not (or the
job never went idle), 130 interrupted (Ctrl-C or SIGTERM: every process this command started is
stopped and the partial summary still printed).

Defaults, chosen so that `clasp run wc --profile gradual` takes about 75 s on a 2-core machine:
- `--max-rate` (the reference maximum that burst and gradual levels are fractions of) is 80% of what
  the workers sustain, estimated as the app's unthrottled rate on one worker of `--cpu-per-worker` CPUs
  (`one_worker_rate`: measured on this machine the first time it is needed, as `python -m clasp.bench.apps`
  does, and kept in the user's state directory, so that a seed's runs on one machine stay repeatable) times
  `capacity_factor(workers)`: linear up to one worker per two CPU cores (the planner and the driver need the
  rest), then falling, because extra workers only share the same cores and add remote chained requests.
  Measured on a 2-core machine (unthrottled WC): 2 workers 0.88x and 4 workers 0.59x of one; the factor
  gives 0.80x and 0.57x. `--max-rate` sets the reference directly.
- `--duration`: gradual is squeezed to 60 s (its natural length, 19 stages of 5-10 s, is about 140 s;
  stage lengths shrink in proportion, rates and shape do not change) and burst by the same factor, so
  that the two still have equal volumes (burst then lasts about 60 s too); a constant profile
  lasts 30 s; steps and unthrottled keep their own length. Unthrottled without `--records` pushes about
  10 s of input at the app's reference rate.
- `--records`: as many as the profile sends (its volume); a smaller number ends the run early.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

from clasp.core.profiles import ACCEPTED, Profile, ProfileError, parse_profile

REFERENCE_SHARE = 0.8
RATES_FILE = "reference_rates.json"  # in the user's state directory: one-worker rates measured on this machine
RATE_SECONDS = 3.0  # the measured part of a one-worker rate's measurement, after a warm-up
SHAPED_SECONDS = 60.0
CONSTANT_SECONDS = 30.0
UNTHROTTLED_SECONDS = 10.0
_ADDRESS = re.compile(r"^tcp://[^:/\s]+:\d+$")


def capacity_factor(workers: int, cpus: int | None = None) -> float:
    """Roughly how many one-worker capacities `workers` workers give on `cpus` cores (see the docstring)."""
    room = max(1, (cpus or os.cpu_count() or 2) // 2)
    if workers <= room:
        return float(workers)
    return room / (1 + 0.25 * (workers - room) / room)


def _measure_one_worker(app: str, cpu: float | None) -> float:
    """The app's unthrottled lines/s on a fresh one-worker local cluster (`clasp.bench.apps`), answer checked."""
    import tempfile

    import clasp
    from clasp.bench.apps import bench_app
    from clasp.local.cluster import LocalCluster

    logs = tempfile.mkdtemp(prefix="clasp-rate-")
    with LocalCluster(workers=1, port=0, cpu_per_worker=cpu, log_dir=logs) as cl, clasp.connect(cl.planner) as c:
        r = bench_app(c, app, RATE_SECONDS, seed=0)
    if not r["correct"]:
        raise RuntimeError(f"measuring {app}'s one-worker rate: the answer was wrong (logs in {logs})")
    return float(r["lines_per_s"])


def one_worker_rate(app: str, cpu: float | None, *, path: Path | None = None, measure=_measure_one_worker,
                    say=lambda message: None) -> float:
    """The app's unthrottled rate on one worker of `cpu` CPUs (None: unlimited): measured the first time on
    this machine, then read from `path` (default: RATES_FILE in the user's state directory; a file made on
    another machine, or not writable, means measuring again)."""
    import platform

    if path is None:
        from clasp.runtime.state_store import user_state_dir

        path = user_state_dir() / RATES_FILE
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "host": platform.node()}
    key = f"{app}@{'unlimited' if cpu is None else cpu}"
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict) or doc.get("machine") != machine or not isinstance(doc.get("rates"), dict):
        doc = {"machine": machine, "rates": {}}
    rate = doc["rates"].get(key)
    if isinstance(rate, int | float) and rate > 0:
        return float(rate)
    say(f"measuring {app}'s unthrottled rate on one worker{'' if cpu is None else f' of {cpu:g} CPUs'}, once on "
        f"this machine (kept in {path}; --max-rate skips it) ...")
    rate = measure(app, cpu)
    doc["rates"][key] = rate
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        say(f"could not keep it in {path}: {e}")
    return rate


def _planner_config(args):
    """The settings of the planner that `clasp run` starts: the run's flags where given, else the defaults."""
    from clasp.runtime.config import PlannerConfig

    try:
        interval = float(args.checkpoint_interval)
        if not 0 <= interval < float("inf"):
            raise ValueError
    except ValueError:
        raise UsageError(f"--checkpoint-interval must be a non-negative number, not {args.checkpoint_interval!r}"
                         ) from None
    given = {"policy": args.policy, "state": args.state, "max_queued_bytes": _queued_bytes(args.max_queued_bytes)}
    return PlannerConfig(checkpoint_interval=interval, **{k: v for k, v in given.items() if v is not None})


class UsageError(ValueError):
    """A bad argument: one line, printed after `clasp run: `."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    r = subparsers.add_parser("run", description=__doc__.split("\n\n")[0],
                              help="run an app on a local cluster at a rate profile and check its answer")
    # Numbers are taken as text and checked here, so every bad value gets the same one-line error.
    r.add_argument("app", help="wc, sd, aa, pl, nwm, etl or syn (clasp/apps/README.md)")
    r.add_argument("--workers", default="1", help="workers the local cluster starts with (default %(default)s)")
    r.add_argument("--max-workers", help="the most workers the local provider starts on demand (default: --workers)")
    r.add_argument("--min-workers", default="1",
                   help="the fewest it keeps when it stops idle ones (default %(default)s)")
    r.add_argument("--pool-cooldown", default="3", help="seconds a worker holds nothing before the provider "
                                                         "stops it (default %(default)s)")
    r.add_argument("--provider", default="local", help="local: workers started and stopped on demand; "
                                                       "static: exactly --workers (default %(default)s)")
    r.add_argument("--profile", default="gradual", help=f"input rate profile: {ACCEPTED} (default %(default)s)")
    r.add_argument("--duration", help="seconds the profile lasts (default: burst and gradual 60, constant 30, "
                                      "steps their own, unthrottled 10 s of input)")
    r.add_argument("--records", help="input records to generate (default: the profile's volume)")
    r.add_argument("--seed", default="0", help="seed of the input and of burst/gradual (default %(default)s)")
    r.add_argument("--max-rate", help="reference max rate, records/s, that burst and gradual levels are fractions "
                                      "of (default: 80%% of what the workers sustain, from the app's one-worker "
                                      "rate, measured the first time on this machine and kept)")
    r.add_argument("--json", help="write the summary and the per-second series to this file (default: none)")
    r.add_argument("--plot", help="draw input rate, throughput, workers and latency to this PNG (default: none)")
    r.add_argument("--planner", help="use the cluster at tcp://HOST:PORT (default: start a local cluster)")
    r.add_argument("--log-dir", help="the local cluster's process logs (default: a temporary directory, kept)")
    r.add_argument("--policy", help="scaling policy: clasp, faasflow, faasflow-sp, zhang24 or zhang24-sp "
                                    "(default: the planner's, clasp)")
    r.add_argument("--state", help="where stateful operators keep state: local or remote (the planner's state "
                                   "server, the Fig. 4 baseline; default: the planner's, local)")
    r.add_argument("--max-queued-bytes", help="per job: bytes of input the planner holds accepted and not yet "
                                              "dispatched, N or NK/NM/NG; push() waits while it is reached "
                                              "(default: the planner's, 128M)")
    r.add_argument("--cpu-per-worker", help="limit each worker to F CPUs with a cgroup quota, like a separate "
                                            "host (needs root; default: no limit)")
    r.add_argument("--hosts", action="store_true", help="the planner and each worker in its own network "
                   "namespace and address, like separate hosts (needs root and iproute2)")
    r.add_argument("--restart-workers", action=argparse.BooleanOptionalAction, default=True,
                   help="start a worker of the local cluster that exits again, or leave it down "
                        "(default: --restart-workers)")
    r.add_argument("--checkpoint-interval", default="1",
                   help="seconds between checkpoints of keyed state (0: off; default %(default)s)")
    r.add_argument("--state-dir", help="checkpoints and the input log, kept after the run (default: a temporary "
                                       "directory, removed at the end of the run)")
    r.set_defaults(fn=main)
    return r


# ----------------------------------------------------------------------------- argument checking
def _queued_bytes(text: str | None) -> int | None:
    if text is None:
        return None
    from clasp.core.credit import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise UsageError(f"--max-queued-bytes: {e}") from None


def _number(text: str | None, flag: str, kind=float, minimum: float = 0.0, strict: bool = True,
            what: str = "a number"):
    if text is None:
        return None
    try:
        v = kind(text)
    except ValueError:
        v = None
    bad = v is None or (isinstance(v, float) and not math.isfinite(v))
    if bad or v < minimum or (strict and v == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise UsageError(f"{flag} must be {what} {bound}, got {text!r}")
    return v


def plan(args, rate_of=one_worker_rate) -> dict:
    """Everything the run needs, from the arguments, or UsageError. Starts nothing once the arguments are
    checked but `rate_of(app, cpu)`, the app's one-worker rate, when the profile needs it and no --max-rate
    gives it (`one_worker_rate`: measured once per machine)."""
    from clasp.apps import get_app

    try:
        app = get_app(args.app)
    except ValueError as e:
        raise UsageError(str(e)) from None
    workers = _number(args.workers, "--workers", int, 1, strict=False, what="a whole number")
    max_workers = _number(args.max_workers, "--max-workers", int, 1, strict=False, what="a whole number")
    min_workers = _number(args.min_workers, "--min-workers", int, 1, strict=False, what="a whole number")
    cooldown = _number(args.pool_cooldown, "--pool-cooldown", what="a number of seconds")
    if args.provider not in ("local", "static"):
        raise UsageError(f"--provider must be local or static, got {args.provider!r}")
    max_workers = max(workers, max_workers or workers)
    seed = _number(args.seed, "--seed", int, 0, strict=False, what="a whole number")
    duration = _number(args.duration, "--duration", what="a number of seconds")
    records = _number(args.records, "--records", int, 1, strict=False, what="a whole number")
    max_rate = _number(args.max_rate, "--max-rate", what="a rate in records/s")
    cpu = _number(args.cpu_per_worker, "--cpu-per-worker", what="a number of CPUs")
    if cpu is not None:
        from clasp.local.cpulimit import available

        why = available()
        if why is not None:
            raise UsageError(why)
    if args.hosts:
        if args.planner is not None:
            raise UsageError("--hosts starts a local cluster; it cannot apply to the one at --planner")
        from clasp.local.netns import available as netns_available

        why = netns_available()
        if why is not None:
            raise UsageError(why)
    from clasp.core.policies import POLICIES

    if args.policy is not None and args.policy not in POLICIES:
        raise UsageError(f"--policy must be one of {', '.join(sorted(POLICIES))}, got {args.policy!r}")
    if args.state is not None and args.state not in ("local", "remote"):
        raise UsageError(f"--state must be local or remote, got {args.state!r}")
    if args.planner is not None and not _ADDRESS.match(args.planner):
        raise UsageError(f"--planner must be tcp://HOST:PORT, got {args.planner!r}")
    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot writes a PNG: give a FILE.png, got {args.plot!r}")
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError(NO_MATPLOTLIB)
    text = args.profile
    try:
        kind = parse_profile(text, max_rate=1.0, seed=seed, duration=None).kind  # checked before measuring
    except ProfileError as e:
        raise UsageError(str(e)) from None
    rate = None
    if (max_rate is None and kind in ("burst", "gradual")) or (records is None and kind == "unthrottled"):
        rate = rate_of(app.NAME, cpu)
    reference = max_rate
    if reference is None:
        reference = REFERENCE_SHARE * (rate or 1.0) * capacity_factor(workers)
    try:
        profile = parse_profile(text, max_rate=reference, seed=seed, duration=None)
        kind = profile.kind
        if duration is None and kind in ("burst", "gradual"):
            # Burst is squeezed by gradual's factor, not to 60 s of its own, so the two keep equal volumes.
            gradual = parse_profile("gradual", max_rate=reference, seed=seed)
            duration = profile.duration * SHAPED_SECONDS / gradual.duration
        elif duration is None and kind == "constant" and records is None:
            duration = CONSTANT_SECONDS
        if duration is not None:
            profile = profile.scaled(duration)
    except ProfileError as e:
        raise UsageError(str(e)) from None
    if records is None:
        if profile.volume is not None:
            records = max(1, profile.volume)
        elif kind == "unthrottled":
            secs = duration if duration is not None else UNTHROTTLED_SECONDS
            # With a --duration the pushing stops at the deadline; 1.5x leaves room to keep it busy.
            slack = 1.5 if duration else 1.0
            records = math.ceil(rate * min(workers, 4) * secs * slack)
        else:
            raise UsageError(f"profile {text!r} has no end: give --duration or --records")
    return {"app": app, "workers": workers, "seed": seed, "profile": profile, "profile_text": text,
            "cpu_per_worker": cpu, "hosts": args.hosts, "submit": {"policy": args.policy, "state": args.state},
            "planner": _planner_config(args),
            "restart_workers": args.restart_workers, "provider": args.provider, "max_workers": max_workers,
            "min_workers": min(min_workers, workers), "pool_cooldown": cooldown,
            "records": records, "max_rate": reference if kind in ("burst", "gradual") else None}


# ----------------------------------------------------------------------------- output
def _fmt(v, unit: str = "", digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{unit}"


def progress_text(row: dict, elapsed: float, sent: int, total: int, recoveries: int = 0) -> str:
    procs = f" of {row['processes']} running" if row.get("processes") is not None else ""
    return (f"t={elapsed:5.1f}s  in {_fmt(row['input_rate'])}/s  out {_fmt(row['throughput'])}/s  "
            f"workers {row['workers']}{procs}  p50 {_fmt(row['p50_ms'], ' ms', 1)}  "
            f"p95 {_fmt(row['p95_ms'], ' ms', 1)}  sent {sent:,}/{total:,}"
            + (f"  recovered from {recoveries} worker death(s)" if recoveries else ""))


_CORRECT = {True: "[green]true[/]", False: "[red]false[/]", None: "not checked"}
NO_MATPLOTLIB = "--plot needs matplotlib, which is not installed: pip install 'clasp[plot]'"


def summary_table(summary: dict, title: str):
    from rich.table import Table

    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    lat = summary["latency_ms"]
    rows = [("duration", _fmt(summary["duration_s"], " s", 1)),
            ("records sent / generated", f"{summary['sent']:,} / {summary['records']:,}"),
            ("records completed", _fmt(summary["completed"])),
            ("records/s (sent ÷ duration)", _fmt(summary["records_per_s"])),
            ("throughput mean / max (/s)",
             f"{_fmt(summary['throughput_mean'])} / {_fmt(summary['throughput_max'])}"),
            ("latency p50 / p95 / p99", " / ".join(_fmt(lat[k], " ms", 1) for k in ("p50", "p95", "p99"))),
            ("workers min / max", f"{summary['workers_min']} / {summary['workers_max']}"),
            *([("worker processes start / max / end", f"{summary['processes_first']} / {summary['processes_max']} / "
                                                      f"{summary['processes_last']}"),
               ("provider started / stopped", f"{summary['provider_started']} / {summary['provider_stopped']}")]
              if "processes_max" in summary else []),
            ("correct", _CORRECT[summary["correct"]])]
    if summary.get("interrupted"):
        rows.append(("interrupted", "[yellow]yes (partial)[/]"))
    if summary.get("error"):
        rows.append(("error", str(summary["error"])))
    for k, v in rows:
        t.add_row(k, v)
    return t


def plot(path: str, rows: list[dict], title: str) -> None:
    """Input rate (and the profile's target), throughput, workers and latency against time."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(NO_MATPLOTLIB) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    t = [r["t"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(9, 7.5))
    if any(r["target_rate"] is not None for r in rows):
        ax1.step(t, [r["target_rate"] for r in rows], where="pre", color="0.6", ls="--", label="profile")
    ax1.plot(t, [r["input_rate"] for r in rows], label="input rate")
    ax1.plot(t, [r["throughput"] for r in rows], label="throughput")
    ax1.set_ylabel("records/s")
    ax1.legend(loc="upper right")
    ax1.set_title(title)
    ax2.step(t, [r["workers"] for r in rows], where="pre", color="C2", label="in use by the job")
    procs = [r.get("processes") for r in rows]
    if any(p is not None for p in procs):
        ax2.step(t, [p if p is not None else float("nan") for p in procs], where="pre", color="C4", ls="--",
                 label="worker processes (provider)")
        ax2.legend(loc="upper right")
    ax2.set_ylabel("workers")
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylim(bottom=0, top=max([r["workers"] for r in rows] + [p or 0 for p in procs] + [1]) + 1)
    for k, c in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C3")):
        ax3.plot(t, [r[k] if r[k] is not None else float("nan") for r in rows], color=c, label=k[:3])
    ax3.set_yscale("log")
    ax3.set_ylabel("latency (ms)")
    ax3.set_xlabel("seconds since submit")
    ax3.legend(loc="upper right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- the run
def _on_term(signum, frame):
    raise KeyboardInterrupt


def main(args) -> int:
    def say(message: str) -> None:
        print(f"clasp run: {message}", file=sys.stderr, flush=True)

    try:
        cfg = plan(args, rate_of=lambda app, cpu: one_worker_rate(app, cpu, say=say))
    except UsageError as e:
        print(f"clasp run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # measuring the one-worker rate failed (a cluster that did not start, a wrong answer)
        say(f"{type(e).__name__}: {e}; give --max-rate to skip the measurement")
        return 1
    if args.state_dir and cfg["planner"].checkpoint_interval > 0:
        from clasp.runtime.state_store import StateStoreError, check_state_dir

        try:
            check_state_dir(args.state_dir)
        except StateStoreError as e:
            print(f"clasp run: {e}", file=sys.stderr)
            return 2
    # SIGTERM takes the Ctrl-C path, so a killed `clasp run` still stops its cluster.
    signal.signal(signal.SIGTERM, _on_term)
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    app, profile = cfg["app"], cfg["profile"]
    title = (f"clasp run {app.NAME} · {cfg['profile_text']}"
             + (f" (max {cfg['max_rate']:,.0f}/s)" if cfg["max_rate"] else "")
             + f" · {cfg['workers'] if not args.planner else 'existing'} worker(s)")
    # _drive puts its Driver here first thing, so an interrupt at any point still finds the series.
    box: dict = {}
    summary: dict | None = None
    code = 1
    try:
        console.print(f"{title}: generating {cfg['records']:,} records (seed {cfg['seed']}) ...")
        records = app.generate(cfg["records"], cfg["seed"])
        with _cluster(args, cfg, console) as (planner, cl):
            pool = (lambda: len(cl.running_workers())) if cl is not None else None
            summary, code = _drive(planner, app, records, profile, console, box, cfg["submit"], pool)
            if cl is not None:
                _provider_summary(summary, box["driver"].series.rows, cl)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping the processes this run started[/]")
        code = 130
        if "driver" in box:
            summary = box["driver"].summary(interrupted=True)
    except Exception as e:  # the cluster failed to start or died: one line, not a traceback
        from clasp.local.cluster import ClusterError
        from clasp.local.netns import NetnsError
        from clasp.runtime.client import ClaspError
        from clasp.runtime.security import KeysError

        if not isinstance(e, (ClaspError, ClusterError, NetnsError, OSError, KeysError)):
            raise
        console.print(f"[red]clasp run: {e}[/]")
        code = 1
        if "driver" in box:
            summary = box["driver"].summary()
            summary["error"] = str(e)
    if summary is None:
        return code
    _report(args, cfg, summary, box.get("driver"), title, console)
    return code


class _cluster:
    """A LocalCluster started for this run, or the --planner address as is."""

    def __init__(self, args, cfg, console):
        self.args, self.cfg, self.console, self.cl = args, cfg, console, None

    def __enter__(self) -> tuple[str, object]:
        if self.args.planner:
            if self.args.keys:
                from clasp.runtime.security import Keys, remember

                remember(self.args.planner, Keys(self.args.keys).dir)  # what clasp.connect(planner) uses
            return self.args.planner, None
        import tempfile

        from clasp.local.cluster import LocalCluster

        logs = self.args.log_dir or tempfile.mkdtemp(prefix="clasp-run-")
        n = self.cfg["workers"]
        c = self.cfg
        grow = (f", {c['provider']} provider: {c['min_workers']} to {c['max_workers']} workers on demand"
                if c["provider"] == "local" else "")
        self.console.print(f"starting a local cluster: 1 planner, {n} worker(s){grow}; logs in {logs}")
        self.cl = LocalCluster(workers=self.cfg["workers"], port=0, log_dir=logs,
                               cpu_per_worker=self.cfg["cpu_per_worker"], hosts=self.cfg["hosts"],
                               planner_config=self.cfg["planner"],
                               state_dir=self.args.state_dir,
                               restart_workers=self.cfg["restart_workers"],
                               on_event=self._say, keys=self.args.keys, insecure=self.args.insecure,
                               metrics_host=self.args.metrics_host, provider=c["provider"],
                               min_workers=c["min_workers"], max_workers=c["max_workers"],
                               pool_cooldown=c["pool_cooldown"])
        self.cl.start()
        self.console.print(f"dashboard: {self.cl.dashboard}; state in {self.cl.state_dir}"
                           + ("" if self.cl.state_dir_kept else " (temporary: removed at the end of the run)"),
                           highlight=False)
        return self.cl.planner, self.cl

    def _say(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"[yellow]cluster: {escape(message)}[/]", highlight=False)

    def __exit__(self, *exc) -> None:
        if self.cl is not None:
            self.cl.stop()


def _provider_summary(summary: dict, rows: list[dict], cl) -> None:
    """Worker processes over the run, and what the provider did (the cluster's events)."""
    procs = [r["processes"] for r in rows if r.get("processes") is not None]
    if procs:
        summary.update(processes_first=procs[0], processes_max=max(procs), processes_last=procs[-1])
    actions = [e.get("action") for e in cl.events]
    summary["provider_started"] = actions.count("start")
    summary["provider_stopped"] = actions.count("released")


def _drive(planner: str, app, records: list, profile: Profile, console, box: dict,
           options: dict | None = None, pool=None) -> tuple[dict, int]:
    from rich.live import Live
    from rich.text import Text

    import clasp
    from clasp.runtime.driver import DriveError, Driver

    live_line = Text("waiting for the first second ...")
    last_print = [0.0]

    with clasp.connect(planner) as client:
        submitted = time.monotonic()
        job = client.submit(app.build_dag(), **{k: v for k, v in (options or {}).items() if v is not None})

        def on_sample(row, d):
            if pool is not None:
                row["processes"] = pool()
            line = progress_text(row, d.elapsed(), d.sent, len(records), d.recoveries)
            if console.is_terminal:
                live_line.plain = line
            elif time.monotonic() - last_print[0] >= 5.0:  # a log, not a progress bar, when piped
                last_print[0] = time.monotonic()
                console.print(line, highlight=False)

        driver = box["driver"] = Driver(job, app, records, profile, submitted_at=submitted,
                                        on_sample=on_sample)
        try:
            with Live(live_line, console=console, refresh_per_second=4, transient=False,
                      auto_refresh=console.is_terminal) if console.is_terminal else _Null():
                summary = driver.run()
        except DriveError:
            return driver.summary(), 1
        return summary, 0 if summary["correct"] else 1


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _report(args, cfg, summary: dict, driver, title: str, console) -> None:
    from rich.console import Console

    Console().print(summary_table(summary, title))
    rows = driver.series.rows if driver is not None else []
    if args.json:
        doc = {"app": cfg["app"].NAME, "profile": cfg["profile_text"],
               "workers": None if args.planner else cfg["workers"],
               "planner": args.planner, "seed": cfg["seed"], "max_rate": cfg["max_rate"],
               "stages": [[r, d if math.isfinite(d) else None] for r, d in cfg["profile"].stages],
               "summary": summary, "series": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2))
        console.print(f"wrote {args.json}")
    if args.plot and rows:
        plot(args.plot, rows, title)
        console.print(f"wrote {args.plot}")
