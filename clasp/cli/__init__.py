"""The `clasp` command: planner, worker, cluster, run, keys, place (and, in submodules, simulate and bench).

The top layer, the only one that may import every other (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time

from clasp.core.credit import DEFAULT_MAX_QUEUE_DELAY, DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES, parse_size


def _security(args, what: str):
    """The process's Security from --keys / CLASP_KEYS / --insecure, or an exit code (2) after saying why."""
    from clasp.runtime.security import ENV, Keys, KeysError, Security, check_exposure

    if args.keys and args.insecure:
        print(f"clasp {what}: --keys and --insecure exclude each other", file=sys.stderr)
        return 2
    directory = None if args.insecure else (args.keys or os.environ.get(ENV))
    try:
        keys = Keys(directory) if directory else None
        if keys is not None:
            keys.server_pair  # noqa: B018 - a missing or readable secret key stops the process here
    except KeysError as e:
        print(f"clasp {what}: {e}", file=sys.stderr)
        return 2
    why = check_exposure(args.host, keys, args.insecure, what)  # the metrics endpoint carries no code
    if why:
        print(why, file=sys.stderr)
        return 2
    return Security(keys)


def add_security_options(p: argparse.ArgumentParser, cluster: bool = False) -> None:
    """--keys, --insecure and --metrics-host (planner, worker, cluster, run)."""
    p.add_argument("--keys", help="CURVE key directory from `clasp keys init` (default: CLASP_KEYS; "
                   + ("none: ephemeral keys made for this cluster)" if cluster else "none: plaintext, loopback only)"))
    p.add_argument("--insecure", action="store_true",
                   help="no CURVE: plaintext, unauthenticated (needed to bind a non-loopback address without keys)")
    p.add_argument("--metrics-host", help="address the plaintext Prometheus endpoint binds (default: --host)")


def _planner(args) -> int:
    from clasp.runtime.config import PlannerConfig
    from clasp.runtime.net import run, setup_logging
    from clasp.runtime.planner import Planner
    from clasp.runtime.state_store import StateStoreError, check_state_dir, lock_state_dir, user_state_dir

    security = _security(args, "planner")
    if isinstance(security, int):
        return security
    setup_logging("planner", args.log_level)
    state_dir = None
    if args.checkpoint_interval > 0:
        state_dir = args.state_dir or str(user_state_dir())
        try:
            check_state_dir(state_dir)
            lock_state_dir(state_dir)  # held until this process ends
        except (StateStoreError, OSError) as e:
            print(f"clasp planner: {e}", file=sys.stderr)
            return 2
    from clasp.core.pool import PoolConfig
    from clasp.runtime.providers import make_provider

    config = PlannerConfig.from_args(args, state_dir=state_dir)
    provider = make_provider(config.provider, PoolConfig(config.min_workers, config.max_workers,
                                                         config.pool_cooldown), config.statefulset)
    return run(Planner(config, security=security, provider=provider).serve)


def _worker(args) -> int:
    from clasp.runtime.config import WorkerConfig
    from clasp.runtime.net import run, setup_logging
    from clasp.runtime.state_store import StateStoreError, check_state_dir
    from clasp.runtime.worker import Worker

    security = _security(args, "worker")
    if isinstance(security, int):
        return security
    setup_logging(f"worker {args.id or ''}".strip(), args.log_level)
    if args.state_dir:
        try:
            check_state_dir(args.state_dir)
        except StateStoreError as e:
            print(f"clasp worker: {e}", file=sys.stderr)
            return 2
    w = Worker(WorkerConfig.from_args(args), security=security)
    return run(w.serve, on_term=w.leave)


def _drain(args) -> int:
    from clasp.runtime.client import ClaspError, connect

    try:
        with connect(args.planner, keys=args.keys, insecure=args.insecure) as c:
            result = c.drain(args.worker, timeout=args.timeout)
    except ClaspError as e:
        print(f"clasp drain: {e}", file=sys.stderr)
        return 1
    print(result["detail"])
    return 0


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number")
    return v


def _on_term(signum, frame):
    raise KeyboardInterrupt


def _say(message: str) -> None:
    print(f"clasp cluster: {message}", file=sys.stderr, flush=True)


def _cluster(args) -> int:
    from clasp.local.cluster import ClusterError, LocalCluster
    from clasp.local.cpulimit import CpuLimitError
    from clasp.local.netns import NetnsError

    # SIGTERM takes the Ctrl-C path, so a killed `clasp cluster` still removes its cgroups and namespaces.
    from clasp.runtime.security import KeysError

    signal.signal(signal.SIGTERM, _on_term)
    if args.keys and args.insecure:
        print("clasp cluster: --keys and --insecure exclude each other", file=sys.stderr)
        return 2
    code = check_state_option(args, "clasp cluster")
    if code:
        return code
    cluster = LocalCluster(workers=args.workers, host=args.host, port=args.port, p_max=args.p_max,
                           log_dir=args.log_dir, planner_config=cluster_planner_config(args),
                           cpu_per_worker=args.cpu_per_worker, hosts=args.hosts,
                           restart_workers=args.restart_workers, on_event=_say, keys=args.keys,
                           insecure=args.insecure, metrics_host=args.metrics_host, provider=args.provider,
                           min_workers=min(args.min_workers, args.workers), max_workers=args.max_workers,
                           pool_cooldown=args.pool_cooldown, prometheus_sd=args.prometheus_sd,
                           state_dir=args.state_dir)
    try:
        cluster.start()
    except KeysError as e:
        print(f"clasp cluster: {e}", file=sys.stderr)
        return 2
    except (ClusterError, CpuLimitError, NetnsError, OSError) as e:
        print(f"clasp cluster: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # start() has stopped what it started
        return 130
    if args.info:
        cluster.write_info(args.info)
    print(f"clasp cluster up: planner {cluster.planner}, {args.workers} workers"
          + (f" ({args.provider} provider: {min(args.min_workers, args.workers)} to {cluster.max_workers})"
             if args.provider == "local" else " (static)")
          + f"; metrics {cluster.metrics['planner']}; dashboard {cluster.dashboard}"
          + (f"; keys {cluster.keys_dir} (clients: CLASP_KEYS={cluster.keys_dir})" if cluster.keys_dir else
             "; plaintext (--insecure)")
          + f"; state {cluster.state_dir}" + ("" if cluster.state_dir_kept else " (temporary: removed when it stops)")
          + " — Ctrl-C stops every process", flush=True)
    try:
        # A worker that exits is the supervisor's (it logs it and restarts it); the planner's exit ends the
        # cluster: the supervisor has logged it and stopped every process.
        while cluster.planner_running():
            time.sleep(0.5)
        if cluster._supervisor is not None:  # it logs the planner's exit and stops the rest: let it say so
            cluster._supervisor.join(timeout=5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        try:
            cluster.stop()
        except KeyboardInterrupt:  # pressed again while stopping: stop() held it until everything was removed
            pass


def check_state_option(args, who: str) -> int:
    """`--state-dir` of `clasp cluster` / `clasp run` must be usable before anything starts: 0, or exit 2."""
    from clasp.runtime.state_store import StateStoreError, check_state_dir

    if args.checkpoint_interval > 0 and args.state_dir:
        try:
            check_state_dir(args.state_dir)
        except StateStoreError as e:
            print(f"{who}: {e}", file=sys.stderr)
            return 2
    return 0


def cluster_planner_config(args):
    """The planner's settings that `clasp cluster` passes through; where it runs, its pool and its state
    directory are the cluster's own (`LocalCluster`)."""
    from clasp.runtime.config import PlannerConfig

    return PlannerConfig.from_args(args, state_dir=None)


def add_pool_options(p: argparse.ArgumentParser, cluster: bool = False) -> None:
    """The elastic pool's bounds (planner, cluster)."""
    p.add_argument("--min-workers", type=_positive(int), default=1,
                   help="the fewest workers the provider keeps when idle ones are given back (default %(default)s)")
    p.add_argument("--max-workers", type=_positive(int), default=None,
                   help="the most workers the provider may start" + (" (default: --workers)" if cluster else
                                                                     " (default: none are started)"))
    p.add_argument("--pool-cooldown", type=_positive(float), default=10.0,
                   help="seconds a worker holds nothing before it is given back (default %(default)s)")


def add_control_options(p: argparse.ArgumentParser, cluster: bool = False) -> None:
    """Scaling options shared by `clasp planner` and `clasp cluster` (`clasp run` has its own)."""
    from clasp.core.policies import POLICIES

    p.add_argument("--policy", default="clasp", choices=sorted(POLICIES),
                   help="scaling policy: %(choices)s (docs/POLICY.md; default %(default)s)")
    p.add_argument("--autoscale", action=argparse.BooleanOptionalAction, default=True,
                   help="let the control loop re-place jobs as their load changes, or keep them where they are "
                        "until job.scale() (default: --autoscale)")
    p.add_argument("--rebalance", action=argparse.BooleanOptionalAction, default=True,
                   help="move a keyed operator's key groups between its workers when their measured load "
                        "leaves one well over its share, autoscaling on or off (default: --rebalance)")
    p.add_argument("--warmup", type=int, default=10_000,
                   help="requests a job completes before its first re-plan (default %(default)s)")
    p.add_argument("--state", default="local", choices=["local", "remote"],
                   help="jobs' default state: local on the workers, or remote on the planner's state server "
                        "(the Fig. 4 baseline; default %(default)s)")
    p.add_argument("--checkpoint-interval", type=_non_negative, default=1.0,
                   help="seconds between checkpoints of keyed state (0: off; a dead worker's state is then lost; "
                        "default %(default)s)")
    if cluster:
        where = ("default: a temporary directory, removed when the cluster stops; a directory given here is kept "
                 "after it stops, and a planner started on it takes up its jobs (docs/RECOVERY.md)")
    else:
        where = ("default: $XDG_STATE_HOME/clasp, else ~/.local/state/clasp; one planner at a time uses a "
                 "directory, and one restarted on it resumes its jobs")
    p.add_argument("--state-dir", help=f"checkpoints and the input log (a volume every host shares); {where}")
    p.add_argument("--collected-memory", type=byte_size, default="64M",
                   help="per job: bytes of collected outputs released by checkpoints kept in memory, the newest; "
                        "older ones are read back from their checkpoint files when asked for, N or NK/NM/NG "
                        "(default %(default)s)")
    add_queue_options(p)


def add_queue_options(p: argparse.ArgumentParser) -> None:
    """The bound on each job's planner queue (planner, cluster): pushes wait while it is reached."""
    p.add_argument("--max-queued-bytes", type=byte_size, default=f"{DEFAULT_MAX_QUEUED_BYTES >> 20}M",
                   help="per job: bytes of input accepted and not yet dispatched (push frames' bytes plus 64 per "
                        "record), N or NK/NM/NG; push() blocks while it is reached (default %(default)s)")
    p.add_argument("--max-queued", type=_positive(int), default=DEFAULT_MAX_QUEUED,
                   help="per job: records accepted and not yet dispatched (default %(default)s)")
    p.add_argument("--max-queue-delay", type=_non_negative, default=DEFAULT_MAX_QUEUE_DELAY,
                   help="per job: seconds of input, at the rate the job's queue drains, accepted and not yet "
                        "dispatched (within --max-queued-bytes and at least 8 pushes; 0: no time bound; "
                        "default %(default)s)")


def _keys(args) -> int:
    from clasp.runtime.security import KeysError, add_client, init_keys

    try:
        if args.action == "init":
            d = init_keys(args.dir)
            print(f"keys for a cluster in {d}: give --keys {d} to `clasp planner|worker|cluster` (the whole "
                  f"directory), and clients keys={d!s} or CLASP_KEYS={d}; `clasp keys add-client {d} NAME` adds "
                  "a client with its own key")
        else:
            if not args.name:
                print("clasp keys add-client: a NAME is needed", file=sys.stderr)
                return 2
            b = add_client(args.dir, args.name)
            print(f"client {args.name!r} allowed ({args.dir}/public/{args.name}.key; delete that file to revoke it). "
                  f"Give the client {b} (it holds its secret key): clasp.connect(addr, keys=\"{b}\") or "
                  f"CLASP_KEYS={b}")
    except KeysError as e:
        print(f"clasp keys: {e}", file=sys.stderr)
        return 2
    return 0


def _place(args, rest) -> int:
    from clasp.cli.place import main as place_main

    return place_main(rest)


def byte_size(text: str) -> int:
    """A size in bytes, > 0: `N`, or with a suffix K, M or G (powers of 1024), e.g. 128M."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _quotas(text: str) -> float | list[float]:
    """`F` (every worker) or `F1,F2,...` (one per worker, an unequal pool), each > 0."""
    parts = [_positive(float)(t) for t in text.split(",")]
    return parts[0] if len(parts) == 1 else parts


def _positive(kind):
    def parse(text):
        v = kind(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
        return v
    return parse


def build_parser() -> argparse.ArgumentParser:
    from clasp.cli.run import add_parser as add_run_parser

    ap = argparse.ArgumentParser(prog="clasp", description="Elastic stream processing with CLASP placement")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                            help="what to run; `clasp COMMAND --help` describes each")
    log_levels = ["DEBUG", "INFO", "WARNING", "ERROR"]

    p = sub.add_parser("planner", help="run the planner")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind, 0.0.0.0 for all (default %(default)s)")
    p.add_argument("--port", type=int, default=5555, help="ZeroMQ port, 0 for a free one (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus and dashboard HTTP port, 0 for a free one (default %(default)s)")
    p.add_argument("--state-port", type=int, default=0,
                   help="remote-state server's ZeroMQ port, 0 for a free one (default %(default)s)")
    p.add_argument("--advertise", help="address others dial, when --host is a wildcard (default: --host)")
    p.add_argument("--heartbeat", type=_positive(float), default=1.0,
                   help="seconds between workers' metrics heartbeats and the planner's control ticks "
                        "(default %(default)s)")
    p.add_argument("--dead-after", type=_positive(float), default=5.0,
                   help="seconds of heartbeat silence that mark a worker dead (one whose connection dropped: 1 s; "
                        "default %(default)s)")
    p.add_argument("--max-inflight", type=_positive(int), default=None,
                   help="records in flight per job (default: 10,000 per worker the job spans)")
    p.add_argument("--dispatch-batch", type=_positive(int), default=None,
                   help="the most records one dispatch step sends, one message per source worker (default: 2,500 "
                        "per worker holding a source, at least 5,000: a client's whole push)")
    p.add_argument("--p-max", type=_positive(int), default=10,
                   help="executor slots per worker, P_max, that placements assume (default %(default)s)")
    p.add_argument("--migration-timeout", type=_positive(float), default=5.0,
                   help="seconds a migration waits for its workers before it is reported failed (default %(default)s)")
    add_control_options(p)
    add_pool_options(p)
    p.add_argument("--provider", default="static", choices=["static", "local", "kubernetes"],
                   help="what starts and stops workers (docs/DEPLOY.md): static (whatever registers), local (the "
                        "local cluster polls the planner's wish), kubernetes (scales --statefulset); "
                        "default %(default)s")
    p.add_argument("--statefulset", default="clasp-worker",
                   help="kubernetes provider: the worker StatefulSet it scales (default %(default)s)")
    add_security_options(p)
    p.add_argument("--log-level", default="INFO", choices=log_levels, help="log verbosity (default %(default)s)")
    p.set_defaults(fn=_planner)

    w = sub.add_parser("worker", help="run a worker")
    w.add_argument("--planner", required=True, help="the planner's endpoint, tcp://HOST:PORT (required)")
    w.add_argument("--host", default="127.0.0.1", help="address to bind, 0.0.0.0 for all (default %(default)s)")
    w.add_argument("--data-port", type=int, default=0,
                   help="ZeroMQ port the planner and peer workers send requests to, 0 for a free one "
                        "(default %(default)s)")
    w.add_argument("--state-port", type=int, default=0,
                   help="ZeroMQ port of its state server (job.state() reads, state moved between workers), 0 for "
                        "a free one (default %(default)s)")
    w.add_argument("--metrics-port", type=int, default=0,
                   help="Prometheus HTTP port, 0 for a free one (default %(default)s)")
    w.add_argument("--advertise", help="address others dial, when --host is a wildcard (default: --host)")
    w.add_argument("--id", help="worker id (default: random)")
    w.add_argument("--p-max", type=_positive(int), default=10,
                   help="executor slots, P_max (default %(default)s)")
    w.add_argument("--flush-delay-ms", type=_positive(float), default=1.0,
                   help="milliseconds a remote chained request waits at most for its batch (default %(default)s)")
    w.add_argument("--max-batch", type=_positive(int), default=2000,
                   help="rows of remote chained requests that flush a batch at once, whatever its age "
                        "(default %(default)s)")
    w.add_argument("--source-window", type=_positive(int), default=16384,
                   help="records this worker's source readers keep in flight per job, at most: read and not yet "
                        "complete; a reader waits while they are. Fewer (down to 4096) while the worker completes "
                        "fewer in 50 ms (default %(default)s)")
    w.add_argument("--leave-timeout", type=_positive(float), default=300.0,
                   help="after SIGTERM, the longest wait in seconds for the planner to drain this worker before "
                        "exiting 1 (default %(default)s)")
    w.add_argument("--cpus", type=_positive(float),
                   help="the CPUs this worker may use (default: its cgroup quota, if any): the placement's "
                        "starting estimate of its capacity W_w, refined online")
    w.add_argument("--state-dir", help="where checkpoints are (default: the directory the planner names)")
    add_security_options(w)
    w.add_argument("--log-level", default="INFO", choices=log_levels, help="log verbosity (default %(default)s)")
    w.set_defaults(fn=_worker)

    c = sub.add_parser("cluster", help="run a planner and N workers here, in the foreground")
    c.add_argument("--workers", type=_positive(int), default=4,
                   help="worker processes to start with (default %(default)s)")
    c.add_argument("--host", default="127.0.0.1",
                   help="address every process binds (default %(default)s); unused with --hosts")
    c.add_argument("--port", type=int, default=5555,
                   help="the planner's ZeroMQ port, 0 for a free one (default %(default)s)")
    c.add_argument("--p-max", type=_positive(int), default=10,
                   help="executor slots per worker, P_max (default %(default)s)")
    c.add_argument("--info", help="write the cluster's endpoints, pids and state directory as JSON to this file "
                   "once it is up (default: none)")
    c.add_argument("--log-dir", help="write each process's log here instead of the terminal (default: the terminal)")
    c.add_argument("--cpu-per-worker", type=_quotas,
                   help="limit each worker to F CPUs with a cgroup quota, like a separate host (root); "
                        "F1,F2,... gives each worker its own (one per worker: an unequal pool; default: no limit)")
    c.add_argument("--hosts", action="store_true",
                   help="the planner and each worker in its own network namespace and address, joined by a "
                        "bridge, like separate hosts (root, iproute2); --host is then unused")
    c.add_argument("--restart-workers", action=argparse.BooleanOptionalAction, default=True,
                   help="start a worker that exits again, same id and ports, at most 5 times a minute (with "
                        "backoff); without, it stays down. Either way the rest of the cluster keeps running "
                        "(default: --restart-workers)")
    add_control_options(c, cluster=True)
    add_pool_options(c, cluster=True)
    c.add_argument("--provider", default="local", choices=["local", "static"],
                   help="local: start workers on demand up to --max-workers and stop idle ones down to "
                        "--min-workers; static: exactly --workers (default %(default)s)")
    c.add_argument("--prometheus-sd", help="write Prometheus file-based service discovery JSON for every process's "
                   "metrics endpoint to this file, rewritten as workers come and go (default: none)")
    add_security_options(c, cluster=True)
    c.set_defaults(fn=_cluster)
    add_security_options(add_run_parser(sub), cluster=True)

    d = sub.add_parser("drain", help="live-migrate a worker's shares and key groups to the others, then stop it")
    d.add_argument("worker", help="the worker's id (`clasp.connect(ADDR).workers()`)")
    d.add_argument("--planner", default="tcp://127.0.0.1:5555", help="the planner's endpoint (default %(default)s)")
    d.add_argument("--timeout", type=_positive(float), default=300.0,
                   help="seconds to wait for the drain (default %(default)s)")
    d.add_argument("--keys", help="CURVE key directory (default: CLASP_KEYS; none: plaintext)")
    d.add_argument("--insecure", action="store_true", help="plaintext, no CURVE")
    d.set_defaults(fn=_drain)

    k = sub.add_parser("keys", help="make CURVE keys: `init DIR` (a cluster's and one client's), `add-client DIR NAME`")
    k.add_argument("action", choices=["init", "add-client"],
                   help="init: make a cluster's keys and one client's in DIR; add-client: allow one more client")
    k.add_argument("dir", help="the key directory")
    k.add_argument("name", nargs="?", help="add-client: the new client's name")
    k.set_defaults(fn=_keys)

    pl = sub.add_parser("place", help="print CLASP's placement for a profile of observed statistics",
                        add_help=False)
    pl.set_defaults(fn=None)
    sim = sub.add_parser("simulate", help="simulate an app on a cluster of any size, with the real policies",
                         add_help=False)
    sim.set_defaults(fn=None)
    bench = sub.add_parser("bench", help="reproduce one of the paper's figures: PNG + JSON (docs/results.md)",
                           add_help=False)
    bench.set_defaults(fn=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGINT stops every clasp command (LocalCluster stops its planner and workers with it), also when it was
    # started from a shell's background job, which ignores SIGINT and hands that on (Python keeps it ignored).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # `kill -USR1 PID` prints every thread's stack of a clasp process to its stderr: what a hung one waits on.
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):  # called in-process with a stderr that has no file (tests)
        pass
    if argv[:1] == ["place"]:
        return _place(None, argv[1:])
    if argv[:1] == ["simulate"]:
        from clasp.cli.sim import main as simulate_main

        return simulate_main(argv[1:])
    if argv[:1] == ["bench"]:
        from clasp.cli.bench import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    return args.fn(args) or 0
