"""Ingest that grows with the workers: Word Count read from files by the workers themselves.

`python -m clasp.bench.ingest_scaling [--workers 1,2,4,8] [--cpu-per-worker 0.2] [--lines-per-worker N]
[--rounds R] [--push] [--json FILE] [--plot FILE]` runs, for each N, a local cluster of N workers, each under a
cgroup CPU quota, and Word Count (`FileSource` -> split -> keyed count) on files of N x `lines-per-worker` lines
(weak scaling: each run lasts about as long), spread over every worker; throughput is lines read and counted per
second of wall clock, from submit to `wait_idle`. With `--rounds R` every worker count runs R times, the counts
in turn (ascending, then descending, ...) so that a noisy minute on a shared host falls on several counts; each
count's figure is the median of its rounds. `--push` also measures the same Word Count fed by one client's
`push()` into the planner, the path every record took before declared sources. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import clasp
from clasp.bench import emit
from clasp.bench.runtime import cpu_seconds
from clasp.connectors.files import FileSource
from clasp.local.cluster import LocalCluster

VOCABULARY = 20_000
WORDS_PER_LINE = 8


def split(line):
    return line.split()


def count(state, word):
    return (state or 0) + 1, None


def word_count(source=None) -> clasp.Dag:
    dag = clasp.Dag("wc-ingest")
    s = dag.operator("split", split)
    c = dag.operator("count", count, stateful=True, key=clasp.identity)
    if source is not None:
        dag.source("lines", source) >> s
    s >> c
    return dag


def write_files(directory: Path, lines: int, files: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(VOCABULARY)]
    per = -(-lines // files)
    out = []
    for f in range(files):
        rows = [" ".join(rng.choices(vocab, k=WORDS_PER_LINE)) for _ in range(min(per, lines - f * per))]
        (directory / f"part-{f:02d}.txt").write_text("".join(r + "\n" for r in rows))
        out.extend(rows)
    return out


def run_one(n: int, cpu_quota: float | None, lines: list[str], directory: Path, push: bool,
            checkpoint_interval: float = 1.0) -> dict:
    logs = tempfile.mkdtemp(prefix="clasp-ingest-")
    planner = ["--no-autoscale", "--checkpoint-interval", str(checkpoint_interval)]
    with LocalCluster(workers=n, cpu_per_worker=cpu_quota, planner_args=planner, log_dir=logs) as cl, \
            clasp.connect(cl.planner, timeout=60) as client:
        pids = {"planner": cl.procs[0].pid, **{w["id"]: w["pid"] for w in client.workers()}}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        if push:
            job = client.submit(word_count(), autoscale=False)
            t0 = time.perf_counter()
            job.push(lines)
        else:
            # Two byte ranges per worker, of about equal size: every worker reads an equal share (a range
            # size that rounded down would cut each file into one range more, and some workers would read
            # one partition more than others: the run would wait for them).
            files = sorted(directory.glob("part-*.txt"))
            per_file = -(-2 * n // len(files))
            largest = max(p.stat().st_size for p in files)
            src = FileSource(str(directory / "part-*.txt"), range_bytes=max(1, -(-largest // per_file)))
            t0 = time.perf_counter()
            job = client.submit(word_count(src), autoscale=False)
        summary = job.wait_idle(timeout=900)
        wall = time.perf_counter() - t0
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        stats = job.stats(fresh=True)
        words = stats["operators"]["count"]["processed"]
    done = summary.get("read", 0) + summary["pushed"]
    assert done == len(lines) == summary["completed"], summary
    assert words == len(lines) * WORDS_PER_LINE, (words, len(lines))
    return {"workers": n, "lines": len(lines), "wall_s": round(wall, 3), "lines_per_s": round(len(lines) / wall, 1),
            "words_per_s": round(words / wall, 1), "partitions": (stats["sources"] or {}).get("partitions"),
            # CPU seconds the run took: the workers' share of their quotas says whether they, or the host,
            # were the limit
            "cpu_planner_s": round(cpu.pop("planner"), 2), "cpu_workers_s": round(sum(cpu.values()), 2),
            "worker_quota_used": round(sum(cpu.values()) / (n * cpu_quota * wall), 2) if cpu_quota else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clasp.bench.ingest_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated (default %(default)s)")
    p.add_argument("--cpu-per-worker", type=float, default=0.2,
                   help="cgroup CPU quota of each worker; 0: none (default %(default)s)")
    p.add_argument("--lines-per-worker", type=int, default=20_000,
                   help="input lines per worker of the run (default %(default)s)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each worker count, the counts in turn; figures are medians (default %(default)s)")
    p.add_argument("--checkpoint-interval", type=float, default=1.0,
                   help="the planner's checkpoint interval in seconds, 0: off (default %(default)s, the planner's)")
    p.add_argument("--push", action="store_true", help="also measure Word Count fed by push() into the planner")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--plot", help="draw throughput against workers into this image (needs matplotlib)")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",")]
    cpu = args.cpu_per_worker or None
    result: dict = {"cpu_per_worker": cpu, "lines_per_worker": args.lines_per_worker,
                    "checkpoint_interval": args.checkpoint_interval,
                    "words_per_line": WORDS_PER_LINE, "command": " ".join(["python -m clasp.bench.ingest_scaling",
                                                                           *(argv or sys.argv[1:])]),
                    "sources": [], "push": []}
    runs: dict[str, dict[int, list[dict]]] = {"sources": {n: [] for n in counts}, "push": {n: [] for n in counts}}
    for r in range(args.rounds):
        for n in (counts if r % 2 == 0 else counts[::-1]):
            with tempfile.TemporaryDirectory(prefix="clasp-ingest-input-") as d:
                lines = write_files(Path(d), n * args.lines_per_worker, files=max(2, n))
                for key in ("sources", "push") if args.push else ("sources",):
                    one = run_one(n, cpu, lines, Path(d), key == "push", args.checkpoint_interval)
                    runs[key][n].append(one)
                    print(f"{key}, {n} workers, round {r + 1}/{args.rounds}: {one['lines_per_s']:.0f} lines/s",
                          file=sys.stderr)
    for key, by_count in runs.items():
        result[key] = [median_run(by_count[n]) for n in counts if by_count[n]]
    base = result["sources"][0]["lines_per_s"]
    result["speedup"] = {r["workers"]: round(r["lines_per_s"] / base, 2) for r in result["sources"]}
    if args.plot:
        plot(result, args.plot)
    return emit(result, args.json)


def median_run(rounds: list[dict]) -> dict:
    """One worker count's figure: the run of median throughput, with every round's throughput beside it."""
    ranked = sorted(rounds, key=lambda r: r["lines_per_s"])
    mid = dict(ranked[(len(ranked) - 1) // 2])
    mid["lines_per_s"] = round(statistics.median(r["lines_per_s"] for r in rounds), 1)
    mid["rounds_lines_per_s"] = [r["lines_per_s"] for r in rounds]
    return mid


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for key, label, style in (("sources", "FileSource (read by the workers)", "o-"),
                              ("push", "push() into the planner", "s--")):
        rows = result[key]
        if rows:
            ax.plot([r["workers"] for r in rows], [r["lines_per_s"] / 1000 for r in rows], style, label=label)
    rows = result["sources"]
    ax.plot([r["workers"] for r in rows], [rows[0]["lines_per_s"] / 1000 * r["workers"] for r in rows], ":",
            color="grey", label="linear")
    ax.set_xlabel(f"workers ({result['cpu_per_worker']} CPU each)")
    ax.set_ylabel("Word Count, 1000 lines/s")
    ax.set_xticks([r["workers"] for r in rows])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
