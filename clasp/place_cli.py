"""`clasp place PROFILE.json [--rate R] [--max-workers N] [--policy P]`: print a placement as JSON.

P is any name in clasp.policy.POLICIES: clasp, faasflow, zhang24, faasflow-sp, zhang24-sp.
"""

from __future__ import annotations

import argparse
import json
import sys

from clasp.placement import PlacementError
from clasp.policy import POLICIES, ProfileError, Stats


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clasp place", description="Place a profiled DAG onto workers and print the placement as JSON.")
    p.add_argument("profile", help="PROFILE.json with the observed statistics")
    p.add_argument("--rate", type=float, default=None, help="target input rate (req/s); overrides input_rate")
    p.add_argument("--max-workers", type=int, default=None, help="worker limit (default: unlimited)")
    p.add_argument("--policy", default="clasp", choices=sorted(POLICIES),
                   help="scaling policy (default: clasp; baselines: docs/BASELINES.md)")
    return p


def main(argv: list[str]) -> int:
    """Run `clasp place`: 0 on success, 1 when nothing can be placed, 2 on bad usage, bad profile."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its message
        return int(exc.code or 0)
    try:
        with open(args.profile, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        print(f"clasp place: cannot read {args.profile}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:
        print(f"clasp place: {args.profile} is not JSON: {exc}", file=sys.stderr)
        return 2
    try:
        stats = Stats.from_json_dict(raw)
    except ProfileError as exc:
        print(f"clasp place: {args.profile}: {exc}", file=sys.stderr)
        return 2
    if args.rate is not None:
        if not args.rate >= 0:
            print(f"clasp place: --rate must be ≥ 0, not {args.rate}", file=sys.stderr)
            return 2
        stats.input_rate = args.rate
    if args.max_workers is not None and args.max_workers < 1:
        print(f"clasp place: --max-workers must be at least 1, not {args.max_workers}", file=sys.stderr)
        return 2
    if not stats.throughput > 0:
        print("clasp place: throughput is 0: nothing to scale from", file=sys.stderr)
        return 1
    policy = POLICIES[args.policy]()
    operators = list(stats.operators)
    edges = [(e.src, e.dst) for e in stats.edges]
    decision = policy.decide(operators, edges, None, stats, max_workers=args.max_workers)
    if decision.placement is None:
        print(f"clasp place: {decision.reason}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(decision.placement.to_json_dict(), indent=2))
    except (PlacementError, ValueError) as exc:
        print(f"clasp place: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
