"""A local cluster of real processes: one planner and N workers, started and stopped together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_FIELDS = re.compile(r"(\w+)=(\S+)")


class ClusterError(RuntimeError):
    """A process of the cluster failed to start."""


class LocalCluster:
    """Planner + workers as subprocesses of this one. Context manager; `stop()` ends every process.

    `cpu_per_worker`: a cgroup CPU quota per worker (`clasp.cpulimit`). `hosts`: the planner and each worker
    in its own network namespace on its own address (`clasp.netns`); `host` is then unused. Both need root
    and are undone by `stop()`; a cluster whose owner was killed is cleaned up by the next one that uses them.
    """

    def __init__(self, workers: int = 4, host: str = "127.0.0.1", port: int = 0, p_max: int = 10,
                 log_dir: str | os.PathLike | None = None, planner_args: list[str] | None = None,
                 worker_args: list[str] | None = None, start_timeout: float = 30.0,
                 cpu_per_worker: float | None = None, hosts: bool = False):
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, not {workers}")
        self.n_workers = workers
        self.host = host
        self.port = port
        self.p_max = p_max
        self.log_dir = Path(log_dir) if log_dir else None
        self.planner_args = planner_args or []
        self.worker_args = worker_args or []
        self.start_timeout = start_timeout
        self.cpu_per_worker = cpu_per_worker
        self.cpu_limits = None
        self.hosts = hosts
        self.netns = None
        self.procs: list[subprocess.Popen] = []
        self.planner: str | None = None
        self.metrics: dict = {"planner": None, "workers": []}
        self.worker_ids: list[str] = []

    def _spawn(self, name: str, args: list[str], netns: str | None = None) -> subprocess.Popen:
        err = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            err = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        argv = [sys.executable, "-m", "clasp", *args]
        if netns is not None:
            argv = self.netns.command(netns, argv)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if err is not None:
            err.close()
        self.procs.append(proc)
        return proc

    def _announced(self, name: str, proc: subprocess.Popen) -> dict:
        """The `key=value` fields of the line a process prints once its sockets are bound."""
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise ClusterError(f"{name} exited with code {proc.returncode} before announcing its endpoints"
                               + (f" (see {self.log_dir / (name + '.log')})" if self.log_dir else ""))
        return dict(_FIELDS.findall(line))

    def start(self) -> LocalCluster:
        try:
            self.worker_ids = [f"w{i}" for i in range(self.n_workers)]
            addresses = {name: self.host for name in ["planner", *self.worker_ids]}
            if self.hosts:
                from clasp.netns import Hosts

                # Before the CPU limits: its sweep kills a dead owner's processes, which empties their cgroups.
                self.netns = Hosts()
                addresses = {name: self.netns.add(name) for name in addresses}
            proc = self._spawn("planner", ["planner", "--host", addresses["planner"], "--port", str(self.port),
                                           "--p-max", str(self.p_max), *self.planner_args],
                               "planner" if self.hosts else None)
            info = self._announced("planner", proc)
            self.planner = info["endpoint"]
            self.metrics["planner"] = info["metrics"]
            if self.cpu_per_worker is not None:
                from clasp.cpulimit import CpuLimits

                self.cpu_limits = CpuLimits(self.cpu_per_worker)  # refuses, rather than run unlimited
            # Workers start in parallel: each spends most of its start-up importing.
            procs = [self._spawn(f"worker-{i}", ["worker", "--planner", self.planner, "--host", addresses[wid],
                                                 "--p-max", str(self.p_max), "--id", wid, *self.worker_args],
                                 wid if self.hosts else None)
                     for i, wid in enumerate(self.worker_ids)]
            for i, p in enumerate(procs):
                if self.cpu_limits is not None:
                    self.cpu_limits.limit(p.pid, f"w{i}")
                self.metrics["workers"].append(self._announced(f"worker-{i}", p)["metrics"])
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self) -> None:
        from clasp.client import connect

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
        return {"planner": self.planner, "metrics": self.metrics}

    def write_info(self, path: str | os.PathLike) -> None:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self.info(), indent=2))
        tmp.replace(path)

    def stop(self, timeout: float = 5.0) -> None:
        with _signals_deferred():
            try:
                for p in self.procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + timeout
                for p in self.procs:
                    try:
                        p.wait(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                    if p.stdout:
                        p.stdout.close()
                self.procs.clear()
            finally:
                # Namespaces after the processes: releasing kills whatever is still inside one.
                if self.netns is not None:
                    self.netns.release()
                if self.cpu_limits is not None:
                    self.cpu_limits.release()

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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
