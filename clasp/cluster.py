"""A local cluster of real processes: one planner and N workers, started and stopped together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

_FIELDS = re.compile(r"(\w+)=(\S+)")


class ClusterError(RuntimeError):
    """A process of the cluster failed to start."""


class LocalCluster:
    """Planner + workers as subprocesses of this one. Context manager; `stop()` ends every process."""

    def __init__(self, workers: int = 4, host: str = "127.0.0.1", port: int = 0, p_max: int = 10,
                 log_dir: str | os.PathLike | None = None, planner_args: list[str] | None = None,
                 worker_args: list[str] | None = None, start_timeout: float = 30.0,
                 cpu_per_worker: float | None = None):
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
        self.procs: list[subprocess.Popen] = []
        self.planner: str | None = None
        self.metrics: dict = {"planner": None, "workers": []}
        self.worker_ids: list[str] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        err = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            err = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen([sys.executable, "-m", "clasp", *args], stdout=subprocess.PIPE, stderr=err,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
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
            proc = self._spawn("planner", ["planner", "--host", self.host, "--port", str(self.port),
                                           "--p-max", str(self.p_max), *self.planner_args])
            info = self._announced("planner", proc)
            self.planner = info["endpoint"]
            self.metrics["planner"] = info["metrics"]
            self.worker_ids = [f"w{i}" for i in range(self.n_workers)]
            if self.cpu_per_worker is not None:
                from clasp.cpulimit import CpuLimits

                self.cpu_limits = CpuLimits(self.cpu_per_worker)  # refuses, rather than run unlimited
            # Workers start in parallel: each spends most of its start-up importing.
            procs = [self._spawn(f"worker-{i}", ["worker", "--planner", self.planner, "--host", self.host,
                                                 "--p-max", str(self.p_max), "--id", wid, *self.worker_args])
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
        if self.cpu_limits is not None:
            self.cpu_limits.release()

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
