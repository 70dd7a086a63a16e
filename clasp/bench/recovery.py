"""Checkpoints and recovery (docs/RECOVERY.md), measured on this machine.

`python -m clasp.bench.recovery [--what throughput,kill,size,barrier,write] [--workers 1,2,4] [--json FILE]
[--plot PNG]` prints JSON:

- throughput: Word Count lines/s with checkpoints every 1 s and with checkpoints off, alternating runs
  on fresh clusters of each of `--workers` workers (side by side in one run);
- kill: 4 workers, Word Count with 40,000 distinct words of state, input pushed as fast as it is taken;
  one worker SIGKILLed (no restart): seconds from the kill until the completion rate is back at >= 90 %
  of its level before, and the detection and rollback times;
- size: checkpoint duration, bytes and max worker pause at 4,000, 40,000 and 400,000 keys (2 workers);
- barrier: one engine's CPU for Word Count's count with no barrier, with one up, and with requests below it
  mixed into the blocks (no process, no I/O): median ms over `--rounds` (at least 5);
- write: one worker's write of its part of a checkpoint (64 key groups of `--keys` keys in all, compressed
  and written as its snapshot file) in a fresh directory under $TMPDIR, `--rounds` times: median ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

import clasp
from clasp.apps import wc
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig


def count(state, word):
    return (state or 0) + 1, None


def dag() -> clasp.Dag:
    d = clasp.Dag("wc-ckpt")
    s = d.operator("split", str.split)
    c = d.operator("count", count, stateful=True, key=lambda w: w)
    s >> c
    return d


def lines_over(keys: int, n: int, words: int = 10, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"k{rng.randrange(keys)}" for _ in range(words)) for _ in range(n)]


def cluster(workers: int, interval: float, logs: str, restart: bool = True) -> LocalCluster:
    return LocalCluster(workers=workers, port=0, log_dir=logs, restart_workers=restart,
                        planner_config=PlannerConfig(autoscale=False, checkpoint_interval=interval)).start()


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def throughput(records: int, rounds: int, logs: str, workers: int = 2) -> dict:
    """Alternating A B, B A per round, each on a fresh cluster of `workers` workers: lines/s and CPU µs
    per line."""
    lines = wc.generate(records, seed=5)
    out: dict[str, list[float]] = {"checkpoints_1s": [], "checkpoints_off": [], "cpu_us_per_line_1s": [],
                                   "cpu_us_per_line_off": [], "checkpoints_taken": []}
    stages: list[dict] = []  # per run with checkpoints: each stage's mean ms per checkpoint
    for r in range(rounds):
        order = (("off", 0), ("1s", 1.0)) if r % 2 == 0 else (("1s", 1.0), ("off", 0))
        for name, interval in order:
            cl = cluster(workers, interval, os.path.join(logs, f"tp-{workers}-{name}-{r}"))
            try:
                with clasp.connect(cl.planner) as c:
                    job = c.submit(wc.build_dag(), autoscale=False)
                    job.scale(workers)
                    pids = [p.pid for p in cl.procs]
                    cpu0, t0 = _cpu_s(pids), time.monotonic()
                    job.push(lines)
                    job.wait_idle(timeout=600)
                    wall, cpu = time.monotonic() - t0, _cpu_s(pids) - cpu0
                    out[f"checkpoints_{name}"].append(len(lines) / wall)
                    out[f"cpu_us_per_line_{name}"].append(cpu / len(lines) * 1e6)
                    if interval:
                        ck = job.stats()["checkpoints"]
                        out["checkpoints_taken"].append(ck["completed"])
                        stages.append(ck["stages_ms"])
            finally:
                cl.stop()

    def med(v):
        return sorted(v)[len(v) // 2]

    res = {k: [round(v, 1) for v in vs] for k, vs in out.items()}
    res["stages_ms"] = stages
    on, off = med(out["checkpoints_1s"]), med(out["checkpoints_off"])
    con, coff = med(out["cpu_us_per_line_1s"]), med(out["cpu_us_per_line_off"])
    res.update({"median_on": round(on), "median_off": round(off), "ratio": round(on / off, 3),
                "cpu_median_on": round(con, 2), "cpu_median_off": round(coff, 2),
                "cpu_ratio": round(con / coff, 3), "records": records, "rounds": rounds, "workers": workers})
    return res


def kill(keys: int, logs: str, seconds_before: float = 6.0) -> dict:
    lines = lines_over(keys, 400_000, seed=1)
    cl = cluster(4, 1.0, os.path.join(logs, "kill"), restart=False)
    try:
        with clasp.connect(cl.planner) as c:
            job = c.submit(dag(), autoscale=False)
            job.scale(4)
            job.push(lines_over(keys, 20_000, seed=2))  # fill the state first
            job.wait_idle(timeout=120)
            stop = threading.Event()

            def feed():  # the lines over and over until told to stop: input never runs out before the measure
                with clasp.connect(cl.planner) as c2:
                    j = c2.job(job.id)
                    i = 0
                    while not stop.is_set():
                        j.push(lines[i:i + 5000])
                        i = (i + 5000) % len(lines)

            t = threading.Thread(target=feed, daemon=True)
            t.start()
            samples = []  # (t, completed)

            def sample():
                s = job.stats()
                samples.append((time.monotonic(), s["completed"], s["checkpoints"]["recoveries"]))

            t_end = time.monotonic() + seconds_before
            while time.monotonic() < t_end:
                sample()
                time.sleep(0.1)
            victim = next(w for w in c.workers() if w["id"] == "w3")
            t_kill = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            t_end = time.monotonic() + 15
            while time.monotonic() < t_end:
                sample()
                time.sleep(0.1)
            stop.set()
            st = job.stats()
    finally:
        cl.stop()

    def rate(i0, i1):
        (ta, ca, _), (tb, cb, _) = samples[i0], samples[i1]
        return (cb - ca) / (tb - ta)

    before = [s for s in samples if s[0] < t_kill]
    i_kill = len(before)
    level = rate(max(0, i_kill - 30), i_kill - 1)  # the last ~3 s before the kill
    t_detect = next((s[0] for s in samples[i_kill:] if s[2] > samples[0][2]), None)
    back = None
    for i in range(i_kill + 5, len(samples)):
        if t_detect is not None and samples[i][0] >= t_detect and rate(i - 5, i) >= 0.9 * level:
            back = samples[i][0] - t_kill
            break
    rec = st["checkpoints"]["last_recovery"] or {}
    return {"keys": keys, "rate_before": round(level), "kill_to_90pct_s": None if back is None else round(back, 2),
            "kill_to_recovery_seen_s": None if t_detect is None else round(t_detect - t_kill, 2),
            "rollback_s": round(rec.get("duration_s", 0.0), 3), "replayed": rec.get("replayed"),
            "lost": st["lost"]}


def size(sizes: list[int], logs: str) -> list[dict]:
    out = []
    for keys in sizes:
        cl = cluster(2, 1.0, os.path.join(logs, f"size-{keys}"))
        try:
            with clasp.connect(cl.planner) as c:
                job = c.submit(dag(), autoscale=False)
                job.scale(2)
                words = [f"k{i}" for i in range(keys)]
                for i in range(0, keys, 50_000):
                    job.push([" ".join(words[j:j + 10]) for j in range(i, min(keys, i + 50_000), 10)])
                job.wait_idle(timeout=300)
                runs = []
                for r in range(3):
                    n0 = job.stats()["checkpoints"]["completed"]
                    job.push([f"k{r}"])
                    deadline = time.monotonic() + 60
                    while job.stats()["checkpoints"]["completed"] == n0 and time.monotonic() < deadline:
                        time.sleep(0.05)
                    ck = job.stats()["checkpoints"]
                    runs.append((ck["last_duration_s"], ck["last_bytes"], ck["last_pause_s"], ck["last_pause_cpu_s"]))
                assert len(job.state("count")) == keys
        finally:
            cl.stop()
        runs.sort()
        d, b, p, _ = runs[len(runs) // 2]
        out.append({"keys": keys, "duration_ms": round(d * 1e3, 1), "bytes": b,
                    "max_pause_ms": round(max(r[2] for r in runs) * 1e3, 2),
                    "max_pause_cpu_ms": round(max(r[3] for r in runs) * 1e3, 2), "runs_ms": [round(r[0] * 1e3, 1)
                                                                                          for r in runs]})
    return out


def write(keys: int, rounds: int, logs: str) -> dict:
    """The store's write of one worker's snapshot, as `clasp.runtime.worker_recovery` does it off the loop."""
    import msgpack

    from clasp.runtime.state_store import FileStore, wrap_blob

    groups = [msgpack.packb({f"word{g}-{i}": i for i in range(keys // 64)}, use_bin_type=True) for g in range(64)]
    store = FileStore(os.path.join(logs, "write"))
    runs = []
    for k in range(1, rounds + 1):
        t = time.perf_counter()
        n = store.write_snapshot(1, k, "w0", (("count", g, wrap_blob(b)) for g, b in enumerate(groups)))
        runs.append(time.perf_counter() - t)
        store.delete(1, k)
    runs.sort()
    return {"keys": keys, "groups": 64, "bytes": n, "median_ms": round(runs[len(runs) // 2] * 1e3, 2),
            "runs_ms": [round(r * 1e3, 2) for r in runs]}


def barrier(rounds: int) -> dict:
    """One engine's CPU for Word Count's count over 40,000 lines of blocks (its 20,000 lines before them in its
    state): with no barrier, with a barrier up and every request above it, and with a third of each block's
    lines below it (a peer's, still coming during the alignment): median ms of thread CPU over `rounds`."""
    from clasp.core.routing import build_placement
    from clasp.core.tracking import CHUNK_BITS
    from clasp.runtime.engine import JobEngine

    d = clasp.Dag("barrier")
    d.operator("count", count, stateful=True, key=clasp.identity)
    spec = d.to_spec()
    words = [wc.split(line) for line in wc.generate(60_000, seed=5)]
    boundary = 10 << CHUNK_BITS

    def run(up: bool, mixed: bool) -> float:
        eng = JobEngine(1, spec, "w0", build_placement(spec, ["w0"], {"count": {0: 1}}, 10))
        t = 0.0
        for start in range(0, 60_000, 500):
            if start == 20_000:
                if up:
                    eng.begin_barrier(boundary)
                t = time.thread_time()
            lines = range(start, start + 500)
            rids = [(1 << CHUNK_BITS) + j if start < 20_000 or (mixed and j % 3 == 0) else boundary + j
                    for j in lines]
            eng.ops[0].queue.append_block(0, [w for j in lines for w in words[j]], rids, [len(words[j]) for j in lines])
            while eng.run_round():
                pass
        return time.thread_time() - t

    out = {}
    for name, up, mixed in (("none", False, False), ("above", True, False), ("mixed", True, True)):
        runs = sorted(run(up, mixed) for _ in range(rounds))
        out[f"{name}_ms"] = round(runs[len(runs) // 2] * 1e3, 1)
    return out


def draw(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    keys = [r["keys"] for r in rows]
    ax[0].plot(keys, [r["duration_ms"] for r in rows], "o-", label="checkpoint duration")
    ax[0].plot(keys, [r["max_pause_ms"] for r in rows], "s--", label="max worker pause (wall)")
    ax[0].plot(keys, [r["max_pause_cpu_ms"] for r in rows], "^:", label="max worker pause (CPU)")
    ax[0].set(xscale="log", yscale="log", xlabel="keys of state", ylabel="ms", title="checkpoint time")
    ax[0].legend()
    ax[1].plot(keys, [r["bytes"] / 1e6 for r in rows], "o-")
    ax[1].set(xscale="log", yscale="log", xlabel="keys of state", ylabel="MB written", title="checkpoint size")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", default="throughput,kill,size")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="2", help="worker counts of the throughput runs, comma-separated")
    ap.add_argument("--keys", type=int, default=40_000)
    ap.add_argument("--sizes", default="4000,40000,400000")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args(argv)
    logs = tempfile.mkdtemp(prefix="clasp-bench-recovery-")
    what = args.what.split(",")
    res: dict = {"logs": logs}
    if "throughput" in what:
        res["throughput"] = [throughput(args.records, args.rounds, logs, int(n)) for n in args.workers.split(",")]
        print(json.dumps({"throughput": res["throughput"]}), file=sys.stderr, flush=True)
    if "kill" in what:
        res["kill"] = kill(args.keys, logs)
        print(json.dumps({"kill": res["kill"]}), file=sys.stderr, flush=True)
    if "write" in what:
        res["write"] = write(args.keys, max(args.rounds, 5), logs)
    if "barrier" in what:
        res["barrier"] = barrier(max(args.rounds, 5))
    if "size" in what:
        res["size"] = size([int(x) for x in args.sizes.split(",")], logs)
        if args.plot:
            draw(res["size"], args.plot)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
