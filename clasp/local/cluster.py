"""A local cluster of real processes: one planner and N workers, started and stopped together.

While it runs, a supervisor thread watches the processes. A worker that exits is logged (its id, pid,
exit code or signal) and, by default, started again with the same id and arguments on the endpoints
it had, so the planner's and its peers' sockets reconnect to it; `restart_delay` (pure) rations the
restarts. The planner exiting is the end of the cluster: that is logged, and every process stopped.

Secure by default: without `keys` (and without CLASP_KEYS) the cluster makes ephemeral CURVE keys in its
log directory (or a private temporary one, removed by `stop()`), gives them to every process, publishes
them in `info()["keys"]`, and tells `clasp.connect` in this process to use them for its planner address.
`insecure=True` runs every process in plaintext.

Checkpoints and the input log go to `state_dir`, kept when the cluster stops; without one, to a fresh
temporary directory that `stop()` removes (or, if its owner is killed first, the next local cluster's
`start()`: `sweep_state_dirs`). Nothing is written to the working directory.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clasp.runtime.config import PlannerConfig, WorkerConfig

_FIELDS = re.compile(r"(\w+)=(\S+)")
STATE_PREFIX = "clasp-state-"  # a local cluster's temporary state directory, in tempfile.gettempdir()
STATE_LOCK = "cluster.lock"  # held (flock) by the process that owns the cluster, for as long as it lives
KEYS_PREFIX = "clasp-keys-"  # its ephemeral CURVE keys (no --keys, no CLASP_KEYS), locked and swept the same way
_PORT = re.compile(r":(\d+)(?:/|$)")
log = logging.getLogger("clasp.cluster")


class ClusterError(RuntimeError):
    """A process of the cluster failed to start."""


@dataclass(frozen=True)
class RestartPolicy:
    """At most `max_restarts` restarts of one worker within `window` seconds, then it stays down. The
    first restart in a window is immediate; each further one waits `backoff` seconds, doubled per restart
    already in the window, at most `max_backoff`."""

    max_restarts: int = 5
    window: float = 60.0
    backoff: float = 1.0
    max_backoff: float = 16.0


def restart_delay(restarts: Sequence[float], now: float, policy: RestartPolicy = RestartPolicy()) -> float | None:
    """Seconds to wait before restarting a worker that exited at `now`, given the (monotonic) times of
    its earlier restarts; None: leave it down, it was restarted `max_restarts` times within the window."""
    recent = sum(1 for t in restarts if now - policy.window < t <= now)
    if recent >= policy.max_restarts:
        return None
    if recent == 0:
        return 0.0
    return min(policy.max_backoff, policy.backoff * 2 ** (recent - 1))


def describe_exit(returncode: int) -> str:
    """'exited with code 3', 'was killed by SIGKILL' (a negative Popen return code is the signal)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def temporary_state_dir(prefix: str = STATE_PREFIX) -> tuple[Path, int]:
    """A fresh temporary state (or keys) directory and the descriptor of its held lock: while the owner lives
    (and until it closes the descriptor), `sweep_state_dirs` leaves the directory alone."""
    # Made under a name the sweep does not match and renamed once locked: a sweep never sees it unlocked.
    made = Path(tempfile.mkdtemp(prefix="." + prefix))
    fd = os.open(made / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    d = made.with_name(made.name[1:])
    os.rename(made, d)
    return d, fd


def sweep_state_dirs(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the temporary state and keys directories of local clusters whose owner died without stopping
    them (a SIGKILLed `clasp run` or test): nobody holds their lock. The kernel drops an flock with its
    process, so no pid can be reused into a false owner."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for d in [*base.glob(STATE_PREFIX + "*"), *base.glob(KEYS_PREFIX + "*")]:
        try:
            fd = os.open(d / STATE_LOCK, os.O_RDWR)
        except OSError:  # not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its cluster is running
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(d)
    return removed


def _ports(fields: dict) -> list[str]:
    """The worker flags that pin the data, state and metrics ports a worker announced."""
    out = []
    for key, flag in (("data", "--data-port"), ("state", "--state-port"), ("metrics", "--metrics-port")):
        m = _PORT.search(fields.get(key, ""))
        if m:
            out += [flag, m.group(1)]
    return out


class LocalCluster:
    """Planner + workers as subprocesses of this one. Context manager; `stop()` ends every process.

    `cpu_per_worker`: a cgroup CPU quota per worker (`clasp.local.cpulimit`), or a list of one quota each (an
    unequal pool). `hosts`: the planner and each worker
    in its own network namespace on its own address (`clasp.local.netns`); `host` is then unused. Both need root
    and are undone by `stop()`; a cluster whose owner was killed is cleaned up by the next one that uses them.

    `restart_workers`: a worker that exits is started again (same id, arguments and ports) as
    `restart_policy` allows; otherwise it stays down. Either way the planner and the other workers keep
    running, and the exit is reported (to `on_event(message)` when given, else the `clasp.local.cluster` logger)
    and kept in `events`. The planner exiting stops every process; `planner_running()` is then false.
    """

    def __init__(self, workers: int = 4, host: str = "127.0.0.1", port: int = 0, p_max: int = 10,
                 log_dir: str | os.PathLike | None = None, planner_args: list[str] | None = None,
                 worker_args: list[str] | None = None, start_timeout: float = 30.0,
                 cpu_per_worker: float | Sequence[float] | None = None, hosts: bool = False,
                 restart_workers: bool = True,
                 restart_policy: RestartPolicy | None = None, on_event: Callable[[str], None] | None = None,
                 keys: str | os.PathLike | None = None, insecure: bool = False, metrics_host: str | None = None,
                 provider: str = "static", min_workers: int = 1, max_workers: int | None = None,
                 pool_cooldown: float = 10.0, prometheus_sd: str | os.PathLike | None = None,
                 state_dir: str | os.PathLike | None = None, planner_config: PlannerConfig | None = None,
                 worker_config: WorkerConfig | None = None):
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, not {workers}")
        if provider not in ("static", "local"):
            raise ValueError(f"a local cluster's provider is static or local, not {provider!r}")
        # The local provider (docs/DEPLOY.md): the planner wishes, the supervisor starts and stops workers.
        self.provider = provider
        self.min_workers = min_workers
        self.max_workers = max(workers, max_workers or workers)
        self.pool_cooldown = pool_cooldown
        self.prometheus_sd = Path(prometheus_sd) if prometheus_sd else None
        self._released: set[int] = set()  # worker indices the provider stopped (SIGTERM: drained, exit 0)
        self._pool_client = None
        self.n_workers = workers
        self.host = host
        self.port = port
        self.p_max = p_max
        self.log_dir = Path(log_dir) if log_dir else None
        # The processes' settings: the configs, then any further flags (`planner_args`, `worker_args`). Where
        # the processes run, the pool, the keys and the state directory are the cluster's own and override them.
        self.planner_config = planner_config or PlannerConfig()
        self.worker_config = worker_config or WorkerConfig()
        self.planner_args = list(planner_args or [])
        self.worker_args = list(worker_args or [])
        if ("--state-dir" in self.planner_args + self.worker_args or self.planner_config.state_dir
                or self.worker_config.state_dir):
            raise ValueError("give the cluster's state directory as state_dir=, not to the planner or the workers: "
                             "they read and write the same one")
        # Checkpoints and the input log: one directory for the planner and every worker. Given, it is kept (a
        # planner restarted on it resumes its jobs); otherwise each start() makes a temporary one and stop()
        # removes it, so that nothing is written where the cluster happens to be started.
        self.state_dir: Path | None = Path(state_dir) if state_dir else None
        self.state_dir_kept = bool(state_dir)
        self._state_lock: int | None = None  # the held lock of a temporary state directory
        self.start_timeout = start_timeout
        self.cpu_per_worker = cpu_per_worker
        # One quota for every worker, or one each (an unequal pool: the workers stand for unequal hosts).
        if cpu_per_worker is None:
            self.cpu_quotas = None
        elif isinstance(cpu_per_worker, int | float):
            self.cpu_quotas = [float(cpu_per_worker)] * workers
        else:
            self.cpu_quotas = [float(c) for c in cpu_per_worker]
            if len(self.cpu_quotas) != workers:
                raise ValueError(f"{len(self.cpu_quotas)} CPU quotas for {workers} workers")
        self.cpu_limits = None
        self.hosts = hosts
        self.netns = None
        self.procs: list[subprocess.Popen] = []
        self.planner: str | None = None
        self.metrics: dict = {"planner": None, "workers": []}
        self.dashboard: str | None = None
        self.worker_ids: list[str] = []
        self.restart_workers = restart_workers
        self.restart_policy = restart_policy or RestartPolicy()
        self.on_event = on_event
        self.events: list[dict] = []  # what the supervisor saw and did: exits, restarts, give-ups
        self._addresses: dict[str, str] = {}
        self._pinned: dict[str, list[str]] = {}  # worker id -> the port flags of its announced endpoints
        self._restarts: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._info_path: str | os.PathLike | None = None
        if keys is not None and insecure:
            raise ValueError("keys and insecure exclude each other")
        self.insecure = insecure
        self.metrics_host = metrics_host
        self._keys_arg = keys
        self.keys_dir: Path | None = None  # the CURVE key directory every process uses (None: plaintext)
        self._ephemeral: Path | None = None  # keys this cluster made, and removes when it stops
        self._keys_lock: int | None = None  # the flock on them that keeps `sweep_state_dirs` away

    def _spawn(self, name: str, args: list[str], netns: str | None = None, index: int | None = None
               ) -> subprocess.Popen:
        err = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            err = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        argv = [sys.executable, "-m", "clasp", *args]
        if netns is not None:
            argv = self.netns.command(netns, argv)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent)
        if err is not None:
            err.close()
        if index is None:
            self.procs.append(proc)
        else:
            self.procs[index] = proc
        return proc

    def _announced(self, name: str, proc: subprocess.Popen) -> dict:
        """The `key=value` fields of the line a process prints once its sockets are bound."""
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise ClusterError(f"{name} exited with code {proc.returncode} before announcing its endpoints"
                               + (f" (see {self.log_dir / (name + '.log')})" if self.log_dir else ""))
        return dict(_FIELDS.findall(line))

    def _security_args(self) -> list[str]:
        out = ["--insecure"] if self.keys_dir is None else ["--keys", str(self.keys_dir)]
        return out + (["--metrics-host", self.metrics_host] if self.metrics_host else [])

    def _make_keys(self) -> None:
        """The keys every process gets: the given directory, CLASP_KEYS, or ephemeral ones made here."""
        from clasp.runtime.security import ENV, Keys, init_keys

        if self.insecure:
            self.keys_dir = None
            return
        given = self._keys_arg or os.environ.get(ENV)
        if given:
            self.keys_dir = Keys(given).dir
            return
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            d = Path(tempfile.mkdtemp(prefix="keys-", dir=self.log_dir))
        else:
            self._ephemeral, self._keys_lock = temporary_state_dir(KEYS_PREFIX)
            d = self._ephemeral / "keys"
        self.keys_dir = Keys(init_keys(d)).dir

    def _worker_args(self, wid: str) -> list[str]:
        # A quota'd worker declares its CPUs too: the quota is read from its cgroup only once it is in it.
        cpus = None if self.cpu_quotas is None else self.cpu_quotas[self.worker_ids.index(wid)]
        config = dataclasses.replace(self.worker_config, planner=self.planner, host=self._addresses[wid],
                                     p_max=self.p_max, worker_id=wid, cpus=cpus, state_dir=str(self.state_dir),
                                     metrics_host=None)
        return ["worker", *config.flags(), *self._pinned.get(wid, []), *self._security_args(), *self.worker_args]

    def _planner_args(self, port: int | None = None) -> list[str]:
        pool = (dict(provider="local", min_workers=self.min_workers, max_workers=self.max_workers,
                     pool_cooldown=self.pool_cooldown) if self.provider == "local" else {})
        config = dataclasses.replace(self.planner_config, host=self._addresses["planner"],
                                     port=self.port if port is None else port,
                                     p_max=self.p_max, state_dir=str(self.state_dir), metrics_host=None, **pool)
        return ["planner", *config.flags(), *self._security_args(), *self.planner_args]

    def _start_processes(self) -> None:
        """The planner, and the workers beside it: each process spends most of its start-up importing, so a
        free port picked here for the planner (port 0) lets the workers start with it rather than after its
        announcement; a worker's registration waits in its socket until the planner binds. If the port was
        taken meanwhile (the planner exits before announcing), it starts again on another one."""
        from clasp.runtime.net import advertised

        host = self._addresses["planner"]
        early = self.port == 0 and not self.hosts
        for attempt in range(3 if early else 1):
            port = _free_port(host) if early else self.port
            self.planner = None
            proc = self._spawn("planner", self._planner_args(port), "planner" if self.hosts else None)
            if early:
                self.planner = f"tcp://{advertised(host, self.planner_config.advertise)}:{port}"
                self._spawn_workers()
            try:
                info = self._announced("planner", proc)
            except ClusterError:
                if attempt == 2 or not early or _free_port(host, port) == port:
                    raise  # not a port taken meanwhile
                self._end_processes()
                continue
            if info["endpoint"] != self.planner:  # not where the workers were sent: send them again
                self._end_processes(keep=1)
                self.planner = info["endpoint"]
                self._spawn_workers()
            break
        self.metrics["planner"] = info["metrics"]
        self.dashboard = info.get("dashboard")  # the planner's web dashboard (its metrics server, at /)
        if self.keys_dir is not None:
            from clasp.runtime.security import remember

            remember(self.planner, self.keys_dir)

    def _spawn_workers(self) -> None:
        for i, wid in enumerate(self.worker_ids):
            p = self._spawn(f"worker-{i}", self._worker_args(wid), wid if self.hosts else None)
            if self.cpu_limits is not None:
                self.cpu_limits.limit(p.pid, wid, self.cpu_quotas[i])

    def _end_processes(self, keep: int = 0) -> None:
        """SIGKILL the processes of a start that failed, past the first `keep`."""
        for p in self.procs[keep:]:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()
        del self.procs[keep:]

    def start(self) -> LocalCluster:
        self._stopping.clear()
        try:
            self._make_keys()
            self.worker_ids = [f"w{i}" for i in range(self.n_workers)]
            addresses = self._addresses = {name: self.host for name in ["planner", *self.worker_ids]}
            if self.hosts:
                from clasp.local.netns import Hosts

                # Before the CPU limits: its sweep kills a dead owner's processes, which empties their cgroups.
                self.netns = Hosts()
                addresses = self._addresses = {name: self.netns.add(name) for name in addresses}
            if not self.state_dir_kept:
                for d in sweep_state_dirs():
                    log.info("removed %s, the state directory of a local cluster whose owner was killed", d)
                self.state_dir, self._state_lock = temporary_state_dir()
            if self.cpu_quotas is not None:
                from clasp.local.cpulimit import CpuLimits

                self.cpu_limits = CpuLimits(min(self.cpu_quotas))  # refuses, rather than run unlimited
            self._start_processes()
            for i, p in enumerate(self.procs[1:]):
                fields = self._announced(f"worker-{i}", p)
                self.metrics["workers"].append(fields["metrics"])
                self._pinned[self.worker_ids[i]] = _ports(fields)
            self._wait_registered()
            self._write_sd()
        except BaseException:
            self.stop()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="clasp-cluster-supervisor", daemon=True)
        self._supervisor.start()
        return self

    # ----------------------------------------------------------------- supervision
    def _event(self, level: int, message: str, **fields) -> None:
        self.events.append({"t": time.time(), "message": message, **fields})
        if self.on_event is None:
            log.log(level, "%s", message)
            return
        try:
            self.on_event(message)
        except Exception:  # a failing printer must not stop the supervision
            log.exception("on_event failed")

    def planner_running(self) -> bool:
        """The planner process is running (and the cluster has not been stopped)."""
        procs = self.procs  # stop() replaces the list, so this one stays whole
        return bool(procs) and procs[0].poll() is None and not self._stopping.is_set()

    def _supervise(self, interval: float = 0.2) -> None:
        """Watch every process until stop(): log exits, restart workers, note the planner's end."""
        due: dict[int, float] = {}  # worker index -> when to restart it
        down: set[int] = set()  # exited and not to be restarted
        while not self._stopping.wait(interval):
            procs = self.procs
            if len(procs) != 1 + len(self.worker_ids):
                return  # stopped
            planner = procs[0]
            if planner.poll() is not None:
                self._event(logging.ERROR, f"the planner (pid {planner.pid}) {describe_exit(planner.returncode)}: "
                            "the cluster cannot run without it; stopping every process", process="planner",
                            pid=planner.pid, code=planner.returncode, action="stop")
                self.stop()
                return
            now = time.monotonic()
            if self.provider == "local":
                self._reconcile(due, down)
                procs = self.procs
                if len(procs) != 1 + len(self.worker_ids):
                    return  # stopped meanwhile
            for i in range(len(self.worker_ids)):
                p = procs[1 + i]
                if i in due or i in down or p.poll() is None:
                    if i in due and now >= due[i] and not self._stopping.is_set():
                        del due[i]
                        self._restart(i, due, down)
                        procs = self.procs
                        if len(procs) != 1 + len(self.worker_ids):
                            return  # stopped meanwhile
                    continue
                self._on_worker_exit(i, p, due, down, now)

    def _on_worker_exit(self, i: int, p: subprocess.Popen, due: dict, down: set, now: float,
                        announced: bool = True) -> None:
        wid = self.worker_ids[i]
        if p.stdout:
            p.stdout.close()
        if i in self._released:
            down.add(i)
            self.metrics["workers"][i] = None
            self._write_sd()
            self._event(logging.INFO if p.returncode == 0 else logging.WARNING,
                        f"provider: worker {wid} (pid {p.pid}) {describe_exit(p.returncode)} after its drain; "
                        "released", process=wid, pid=p.pid, code=p.returncode, action="released")
            return
        what = f"worker {wid} (pid {p.pid}) {describe_exit(p.returncode)}"
        if not announced:
            what += " before announcing its endpoints"
        fields = {"process": wid, "pid": p.pid, "code": p.returncode}
        if p.returncode == 0 and announced:
            # A clean exit is a worker stopped on purpose (SIGINT, SIGTERM): like systemd's on-failure.
            down.add(i)
            self._event(logging.WARNING, f"{what} (stopped on purpose): left down; the planner and the other "
                        "workers keep running", **fields, action="down")
            return
        if not self.restart_workers:
            down.add(i)
            self._event(logging.WARNING, f"{what}; the planner and the other workers keep running (no restart: "
                        "--no-restart-workers)", **fields, action="down")
            return
        delay = restart_delay(self._restarts.get(wid, []), now, self.restart_policy)
        if delay is None:
            down.add(i)
            pol = self.restart_policy
            self._event(logging.ERROR, f"{what}; it was restarted {pol.max_restarts} times within {pol.window:g} s: "
                        "leaving it down (the planner and the other workers keep running)", **fields,
                        action="give up")
            return
        due[i] = now + delay
        self._event(logging.WARNING, f"{what}; the planner and the other workers keep running; restarting it"
                    + (f" in {delay:g} s" if delay else ""), **fields, action="restart", delay=delay)

    def _restart(self, i: int, due: dict, down: set) -> None:
        """Start worker i again: same id and arguments, on the ports it had (if those fail once, free ones)."""
        wid = self.worker_ids[i]
        self._restarts.setdefault(wid, []).append(time.monotonic())
        with self._lock:
            if self._stopping.is_set():
                return
            p = self._spawn(f"worker-{i}", self._worker_args(wid), wid if self.hosts else None, index=1 + i)
        if self.cpu_limits is not None:
            try:
                self.cpu_limits.limit(p.pid, wid, self.cpu_quotas[i])
            except OSError as e:
                self._event(logging.WARNING, f"worker {wid}: could not put it under its CPU quota: {e}", process=wid)
        fields = self._announced_within(p, self.start_timeout)
        if fields is None:
            if self._stopping.is_set():
                return
            if p.poll() is None:  # hung before binding: treat as a failed start
                p.kill()
                p.wait()
            self._pinned[wid] = []  # its old ports may be taken: the next try binds free ones
            self._on_worker_exit(i, p, due, down, time.monotonic(), announced=False)
            return
        self._pinned[wid] = _ports(fields)
        if fields.get("metrics") and fields["metrics"] != self.metrics["workers"][i]:
            self.metrics["workers"][i] = fields["metrics"]
            if self._info_path is not None:
                self.write_info(self._info_path)
        self._write_sd()
        self._event(logging.INFO, f"worker {wid} restarted (pid {p.pid}); it registers with the planner again",
                    process=wid, pid=p.pid, action="restarted")

    # ----------------------------------------------------------------- the local provider
    def _reconcile(self, due: dict, down: set) -> None:
        """Read the planner's pool wish and make it so: start workers up to it (at most `max_workers`),
        SIGTERM those it releases (the planner drains them; they exit 0). Like dask's SpecCluster, a
        declarative wish reconciled with what runs."""
        now = time.monotonic()
        if now < getattr(self, "_next_poll", 0.0):
            return
        self._next_poll = now + 0.5
        try:
            if self._pool_client is None:
                from clasp.runtime.client import connect

                self._pool_client = connect(self.planner, timeout=5.0)
            pool = self._pool_client.pool()
        except Exception as e:  # the planner is busy or going away: try again at the next poll
            log.debug("pool poll failed: %s", e)
            return
        wish = pool["wish"]
        release = set(wish["release"])
        running = [i for i in range(len(self.worker_ids))
                   if i not in down and i not in self._released and (i in due or self.procs[1 + i].poll() is None)]
        for i in running:
            wid = self.worker_ids[i]
            if wid in release:
                self._released.add(i)
                self._event(logging.INFO, f"provider: stopping worker {wid} (pid {self.procs[1 + i].pid}): "
                            f"{wish['reason']}", process=wid, action="release")
                try:
                    self.procs[1 + i].send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        keep = [i for i in running if self.worker_ids[i] not in release]
        for _ in range(min(wish["workers"], self.max_workers) - len(keep)):
            if self._stopping.is_set() or not self._add_worker(wish["reason"]):
                return

    def _add_worker(self, reason: str) -> bool:
        """Start one more worker (the provider): a new id, free ports; it registers and joins the jobs."""
        with self._lock:
            if self._stopping.is_set():
                return False
            n = len(self.worker_ids)
            used = {int(w[1:]) for w in self.worker_ids if w[1:].isdigit()}
            wid = f"w{max(used, default=-1) + 1}"
            self.worker_ids.append(wid)
            self._addresses[wid] = self.netns.add(wid) if self.netns is not None else self.host
            if self.cpu_quotas is not None:
                self.cpu_quotas.append(self.cpu_quotas[-1])
            self.metrics["workers"].append(None)
            self.procs.append(None)
            p = self._spawn(f"worker-{n}", self._worker_args(wid), wid if self.hosts else None, index=1 + n)
        if self.cpu_limits is not None:
            try:
                self.cpu_limits.limit(p.pid, wid, self.cpu_quotas[n])
            except OSError as e:
                self._event(logging.WARNING, f"worker {wid}: could not put it under its CPU quota: {e}", process=wid)
        fields = self._announced_within(p, self.start_timeout) or {}
        self._pinned[wid] = _ports(fields)
        self.metrics["workers"][n] = fields.get("metrics")
        self._event(logging.INFO, f"provider: started worker {wid} (pid {p.pid}): {reason}", process=wid,
                    pid=p.pid, action="start")
        if self._info_path is not None:
            self.write_info(self._info_path)
        self._write_sd()
        return True

    def running_workers(self) -> list[str]:
        """The ids of the worker processes running now."""
        procs = self.procs
        return [w for i, w in enumerate(self.worker_ids) if 1 + i < len(procs) and procs[1 + i] is not None
                and procs[1 + i].poll() is None]

    def _write_sd(self) -> None:
        """Prometheus file-based service discovery: one target group per process's metrics endpoint,
        rewritten atomically (Prometheus watches the file) as workers come and go."""
        if self.prometheus_sd is None:
            return
        groups = []
        procs = self.procs
        entries = [("planner", "planner", self.metrics.get("planner"), procs[0] if procs else None)]
        entries += [(wid, "worker", self.metrics["workers"][i] if i < len(self.metrics["workers"]) else None,
                     procs[1 + i] if 1 + i < len(procs) else None) for i, wid in enumerate(self.worker_ids)]
        for name, role, url, proc in entries:
            if not url or proc is None or proc.poll() is not None:
                continue
            m = re.match(r"https?://([^/]+)(/.*)?$", url)
            if not m:
                continue
            groups.append({"targets": [m.group(1)], "labels": {"clasp_process": name, "clasp_role": role,
                                                               "__metrics_path__": m.group(2) or "/metrics"}})
        tmp = self.prometheus_sd.with_name(self.prometheus_sd.name + ".tmp")
        tmp.write_text(json.dumps(groups, indent=2))
        os.replace(tmp, self.prometheus_sd)

    def _announced_within(self, proc: subprocess.Popen, timeout: float) -> dict | None:
        """The fields of a restarted worker's first line, or None if it exits, hangs or the cluster stops."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping.is_set():
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                return dict(_FIELDS.findall(line)) if line else None
        return None

    def _wait_registered(self) -> None:
        from clasp.runtime.client import connect

        deadline = time.monotonic() + self.start_timeout
        with connect(self.planner, timeout=self.start_timeout) as c:
            while True:
                alive = {w["id"] for w in c.workers() if w["alive"]}
                if set(self.worker_ids) <= alive:
                    return
                if time.monotonic() > deadline:
                    raise ClusterError(f"only {sorted(alive)} of {self.worker_ids} registered in time")
                for p in self.procs:
                    if p.poll() is not None:
                        raise ClusterError(f"a cluster process exited with code {p.returncode}")
                time.sleep(0.05)

    def info(self) -> dict:
        """{"planner": endpoint, "metrics": URLs, "dashboard": URL, "keys": the key directory clients use
        (None: plaintext), "state_dir": checkpoints and the input log, "state_dir_kept": false when it is
        temporary (removed by `stop()`), "pids": {"planner": pid, "workers": [pid, ...]}}."""
        procs = list(self.procs)
        return {"planner": self.planner, "metrics": self.metrics, "dashboard": self.dashboard,
                "keys": str(self.keys_dir) if self.keys_dir else None,
                "state_dir": str(self.state_dir) if self.state_dir else None, "state_dir_kept": self.state_dir_kept,
                "pids": {"planner": procs[0].pid if procs else None, "workers": [p.pid for p in procs[1:]]}}

    def write_info(self, path: str | os.PathLike) -> None:
        """Write info() as JSON to `path`; written again when a restarted worker's metrics URL changes."""
        self._info_path = path
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.info(), indent=2))
        tmp.replace(path)

    def stop(self, timeout: float = 5.0) -> None:
        with _signals_deferred():
            self._stopping.set()  # the supervisor restarts nothing from now on
            sup = self._supervisor
            if sup is not None and sup is not threading.current_thread():
                sup.join(timeout=timeout)
            with self._lock:
                try:
                    # Workers get SIGINT: SIGTERM would ask the planner to drain them, one by one.
                    for k, p in enumerate(self.procs):
                        if p is not None and p.poll() is None:
                            p.send_signal(signal.SIGTERM if k == 0 else signal.SIGINT)
                    deadline = time.monotonic() + timeout
                    for p in self.procs:
                        if p is None:
                            continue
                        try:
                            p.wait(timeout=max(0.1, deadline - time.monotonic()))
                        except subprocess.TimeoutExpired:
                            p.kill()
                            p.wait()
                        if p.stdout:
                            p.stdout.close()
                    self.procs = []
                    if self._pool_client is not None:
                        try:
                            self._pool_client.close()
                        except Exception:
                            pass
                        self._pool_client = None
                finally:
                    # Namespaces after the processes: releasing kills whatever is still inside one.
                    if self.netns is not None:
                        self.netns.release()
                    if self.cpu_limits is not None:
                        self.cpu_limits.release()
                    if self.planner is not None:
                        from clasp.runtime.security import forget

                        forget(self.planner)
                    if self._ephemeral is not None:
                        shutil.rmtree(self._ephemeral, ignore_errors=True)
                        os.close(self._keys_lock)
                        self._ephemeral = self._keys_lock = None
                    if self._state_lock is not None:
                        shutil.rmtree(self.state_dir, ignore_errors=True)
                        os.close(self._state_lock)
                        self._state_lock = None

    def alive(self) -> bool:
        """Every process of the cluster is running now (a restarted worker counts once it is started)."""
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port(host: str, port: int = 0) -> int | None:
    """A TCP port free on `host` now (`port`, or the kernel's pick; another process may take it before it is
    bound); None if `port` is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return None
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGINT when the process that started it dies (Linux), so a cluster whose
    owner was SIGKILLed (a `clasp run` killed, a test's timeout) does not leave its planner and workers
    running (SIGINT, not SIGTERM: a worker's SIGTERM asks the planner to drain it, docs/DEPLOY.md).
    Elsewhere nothing: they stop with `LocalCluster.stop()` only."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _signals_deferred:
    """Holds Ctrl-C and SIGTERM while a cluster stops, then delivers them: a second Ctrl-C during the stop
    must not leave processes, cgroups or namespaces behind. Signal handlers belong to the main thread;
    elsewhere this does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.pending: list[int] = []
        self.old = None
        if threading.current_thread() is threading.main_thread():
            # A handler set outside Python (getsignal() is None) could not be put back: leave it alone.
            self.old = {s: signal.signal(s, lambda signum, frame: self.pending.append(signum))
                        for s in self.SIGNALS if signal.getsignal(s) is not None}

    def __exit__(self, *exc):
        if self.old is None:
            return
        for s, handler in self.old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(self.pending):
            signal.raise_signal(s)
