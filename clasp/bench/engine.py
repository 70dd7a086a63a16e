"""The engine alone: Word Count through `JobEngine` in this process, no sockets, no planner.

`python -m clasp.bench.engine [--lines N] [--repeat R] [--json FILE]` feeds N generated lines as the planner's
runs would (2,000 a run) and runs rounds until idle: on one engine holding every key group, and on two
engines splitting them, the columns each sends the other handed over in memory. It prints the thread's CPU
time per line (the best of R), beside the app's own Python (`wc.split` over the same lines; the count's
call per word is not in it), so the difference is what the engine adds. Checked: the counts equal
`wc.expected`.
"""

from __future__ import annotations

import argparse
import sys
import time

from clasp.apps import wc
from clasp.bench import emit
from clasp.core.routing import build_placement
from clasp.runtime.engine import JobEngine

RUN = 2000


def _drain(engines: list[JobEngine], epoch: int) -> None:
    """Rounds until no engine has work, each one's remote columns delivered to their destination."""
    by_id = {e.me: e for e in engines}
    busy = True
    while busy:
        busy = False
        for e in engines:
            while e.run_round():
                busy = True
            for dest, (groups, _) in e.take_batches().items():
                by_id[dest].receive_columns(epoch, groups)
                busy = True
        for e in engines:
            e.take_progress()


def one_pass(lines: list[str], workers: int) -> tuple[float, dict]:
    """CPU seconds per line of Word Count on `workers` engines in this thread, and the merged counts."""
    spec = wc.build_dag().to_spec()
    ids = [f"w{i}" for i in range(workers)]
    shares = {i: 1 for i in range(workers)}
    placement = build_placement(spec, ids, {"split": shares, "count": shares}, 10)
    engines = [JobEngine(1, spec, w, placement) for w in ids]
    for e in engines:
        e.apply_placement(placement)
    t = time.thread_time()
    for i in range(0, len(lines), RUN):
        part = lines[i:i + RUN]
        step = -(-len(part) // workers)
        for k, e in enumerate(engines):  # the planner's dispatch: a run of lines to each source holder
            e.receive_runs(placement.epoch, [[0, i + k * step, part[k * step:(k + 1) * step]]])
        _drain(engines, placement.epoch)
    cpu = time.thread_time() - t
    counts: dict = {}
    for e in engines:
        counts.update(e.ops[1].state_dict())
    return cpu / len(lines), counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clasp.bench.engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=60_000, help="lines of generated Word Count text (default 60000)")
    ap.add_argument("--repeat", type=int, default=3, help="passes per worker count; the best is kept (default 3)")
    ap.add_argument("--json", help="also write the result to this file")
    args = ap.parse_args(argv)
    lines = wc.generate(args.lines, 0)
    expected = wc.expected(lines)
    t = time.thread_time()
    for line in lines:
        wc.split(line)
    app = (time.thread_time() - t) / len(lines)
    out = {"lines": args.lines, "split_us_per_line": round(app * 1e6, 2)}
    for workers in (1, 2):
        best = None
        for _ in range(args.repeat):
            cpu, counts = one_pass(lines, workers)
            if counts != expected:
                print(f"wrong counts on {workers} engine(s)", file=sys.stderr)
                return 1
            best = cpu if best is None else min(best, cpu)
        out[f"engine_us_per_line_{workers}"] = round(best * 1e6, 2)
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
