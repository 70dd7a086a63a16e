"""`clasp simulate APP --workers N ...`: one simulated run, summarized as JSON (docs/SIMULATOR.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from clasp.apps import get_app
from clasp.core.policies import POLICIES
from clasp.sim.simulator import COSTS_FILE, CostError, Costs, SimConfig, app_dag, simulate


class OneLineParser(argparse.ArgumentParser):
    """An argument error is one line, `PROG: message`, and exit 2, instead of argparse's usage block."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="clasp simulate", description="Simulate an app on a cluster of N workers.")
    p.add_argument("app", help="wc, sd, aa, pl, nwm, etl or syn (clasp/apps/README.md)")
    p.add_argument("--workers", type=int, required=True, help="workers in the pool (required)")
    p.add_argument("--policy", help="run the control loop with this policy, starting on one worker (default: no "
                                    "control loop, the app spread evenly over every worker)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="constant input rate, records/s")
    load.add_argument("--unthrottled", action="store_true", help="keep the planner queue full (default)")
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds (default %(default)s)")
    p.add_argument("--costs", default=str(COSTS_FILE), help="cost coefficients JSON (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation's random draws (default %(default)s)")
    p.add_argument("--json", dest="json_out",
                   help="also write the summary with its per-second series to this file (default: none)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.workers < 1:
        _parser().error(f"--workers must be at least 1, not {args.workers}")
    if args.policy is not None and args.policy not in POLICIES:
        _parser().error(f"unknown policy {args.policy!r}; accepted: {', '.join(POLICIES)}")
    if args.rate is not None and not args.rate > 0:
        _parser().error(f"--rate must be > 0, not {args.rate:g}")
    if not 0 < args.duration <= 86400:
        _parser().error(f"--duration must be in (0, 86400] s, not {args.duration:g}")
    try:
        costs = Costs.load(args.costs)
        dag = app_dag(get_app(args.app), costs)
        config = SimConfig(duration=args.duration, seed=args.seed, warmup=min(2.0, args.duration / 5))
    except (CostError, ValueError) as exc:
        _parser().error(str(exc))
    result = simulate(dag, args.workers, costs=costs, policy=args.policy, rate=args.rate, config=config)
    summary = result.summary()
    short = {"app": args.app, "policy": args.policy, "rate": args.rate, "duration": args.duration,
             "throughput": round(summary["throughput"], 1),
             "latency": {k: round(v, 6) for k, v in summary["latency"].items()},
             "workers": summary["workers"], "utilization": [round(u, 3) for u in summary["utilization"]],
             "decisions": summary["decisions"]}
    print(json.dumps(short))
    if args.json_out:
        try:
            with open(args.json_out, "w") as f:
                json.dump({**short, "series": summary["series"]}, f, indent=1)
        except OSError as exc:
            print(f"clasp simulate: cannot write {args.json_out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0
