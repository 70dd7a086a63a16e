"""`clasp place PROFILE.json [--rate R] [--max-workers N] [--policy P] [--explain]`: print a placement as
JSON, or with `--explain` each worker's Eq. (8) load term by term against its own capacity.

P is any name in clasp.core.policies.POLICIES: clasp, clasp-paper, faasflow, zhang24, faasflow-sp, zhang24-sp.
"""

from __future__ import annotations

import argparse
import json
import sys

from clasp.core.model import TERMS, CapacityModel
from clasp.core.placement import LoadError, NoPlacementError
from clasp.core.policies import POLICIES, ClaspPolicy, PlacementResult, Stats, StatsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clasp place", description="Place a profiled DAG onto workers and print the placement as JSON.")
    p.add_argument("profile", help="PROFILE.json with the observed statistics")
    p.add_argument("--rate", type=float, default=None, help="target input rate (req/s); overrides input_rate")
    p.add_argument("--max-workers", type=int, default=None, help="worker limit (default: unlimited)")
    p.add_argument("--policy", default="clasp", choices=sorted(POLICIES),
                   help="scaling policy (default: clasp; baselines: docs/BASELINES.md)")
    p.add_argument("--explain", action="store_true",
                   help="print each worker's load term by term against its capacity instead of JSON")
    return p


def explain(result: PlacementResult, stats: Stats, model: CapacityModel) -> str:
    """A table of every worker's Eq. (8) terms (µs/s) at the placement's rate, its total and W_w."""
    try:
        load = stats.load_at(result.rate)
    except LoadError:
        return "no throughput to project the load from"
    terms = model.load_terms(result.fractions, load.demand, load.edge_rates)
    head = ["worker", *TERMS, "total", "capacity", "used"]
    lines = [f"{result.policy}: {result.reason}", "  ".join(f"{h:>12}" for h in head)]
    for w in range(result.workers):
        t = terms.get(w, dict.fromkeys(TERMS, 0.0))
        total, cap = sum(t.values()), model.capacity_of(w)
        cells = [f"{w:>12}", *(f"{t[k]:>12.0f}" for k in TERMS), f"{total:>12.0f}", f"{cap:>12.0f}",
                 f"{total / cap:>11.1%} "]
        lines.append("  ".join(cells))
    return "\n".join(lines)


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
    except StatsError as exc:
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
    if args.explain:
        model = policy.model_of(stats) if isinstance(policy, ClaspPolicy) else stats.model
        print(explain(decision.placement, stats, model))
        return 0
    try:
        print(json.dumps(decision.placement.to_json_dict(), indent=2))
    except (NoPlacementError, ValueError) as exc:
        print(f"clasp place: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
