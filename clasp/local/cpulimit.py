"""Per-process CPU quotas with Linux cgroups, so each local worker is a fixed slice like a separate host.

Ten workers on a 2-core machine otherwise share the CPU, and adding workers adds no capacity. A quota
of F CPUs per worker (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us`) makes each one an equal,
independent slice. Needs root; `CpuLimitError` says why it cannot be applied rather than running
unlimited.
"""

from __future__ import annotations

import os
from pathlib import Path

from clasp.runtime.cpuquota import V1 as _V1
from clasp.runtime.cpuquota import V2 as _V2
from clasp.runtime.cpuquota import process_cpu_max

PERIOD_US = 10_000  # a short period: a throttled worker stalls its peers for at most a few ms
_PREFIX = "clasp-"

__all__ = ["PERIOD_US", "CpuLimitError", "CpuLimits", "available", "process_cpu_max"]


class CpuLimitError(RuntimeError):
    """CPU limits were asked for but this machine cannot apply them."""


def _root() -> tuple[Path, int]:
    """The cgroup directory under which to create groups, and its version."""
    if os.geteuid() != 0:
        raise CpuLimitError("per-worker CPU limits need root (cgroups); run as root or drop --cpu-per-worker")
    if (_V2 / "cgroup.controllers").exists() and "cpu" in (_V2 / "cgroup.controllers").read_text().split():
        return _V2, 2
    if (_V1 / "cpu.cfs_quota_us").exists():
        return _V1, 1
    raise CpuLimitError("no cgroup cpu controller is mounted (neither v2 cpu.max nor v1 cpu.cfs_quota_us)")


def available() -> str | None:
    """None when CPU limits can be applied here, else the reason they cannot."""
    try:
        _root()
        return None
    except CpuLimitError as e:
        return str(e)


class CpuLimits:
    """Creates one cgroup per limited process, removes them all on `release()`."""

    def __init__(self, cpus: float):
        if not 0 < cpus:
            raise CpuLimitError(f"--cpu-per-worker must be > 0, not {cpus}")
        self.cpus = cpus
        self.root, self.version = _root()
        self.groups: list[Path] = []
        self.sweep()

    def sweep(self) -> None:
        """Remove groups left behind by a run that crashed (empty ones only: their processes are gone)."""
        for d in self.root.glob(f"{_PREFIX}*"):
            pid = d.name[len(_PREFIX):].split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                try:
                    d.rmdir()
                except OSError:
                    pass

    def limit(self, pid: int, name: str, cpus: float | None = None) -> Path:
        """Put `pid` in its own group with a quota of `cpus` (default: this object's)."""
        d = self.root / f"{_PREFIX}{os.getpid()}-{name}"
        d.mkdir(exist_ok=True)
        quota = max(1000, int((self.cpus if cpus is None else cpus) * PERIOD_US))
        if self.version == 2:
            (d / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        else:
            (d / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (d / "cgroup.procs").write_text(f"{pid}\n")
        if d not in self.groups:  # a restarted worker goes back into its group
            self.groups.append(d)
        return d

    def release(self) -> None:
        """Remove every group created (their processes must have exited)."""
        for d in self.groups:
            try:
                d.rmdir()
            except OSError:
                pass
        self.groups.clear()
