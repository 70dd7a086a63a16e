"""Reading the CPU quota a process runs under (cgroup v2 `cpu.max` or v1 `cpu.cfs_quota_us`), read-only.

The worker reports it as its capacity; `clasp.local.cpulimit`, which sets quotas (and needs root), sits a
layer above and uses the same paths.
"""

from __future__ import annotations

from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/cpu")


def _cpu_max_of(d: Path, version: int) -> tuple[float, float] | None:
    """(quota, period) in seconds of group `d`, None when it has no quota."""
    try:
        if version == 2:
            quota, period = (d / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else (int(quota) / 1e6, int(period) / 1e6)
        quota = int((d / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else (quota / 1e6, int((d / "cpu.cfs_period_us").read_text()) / 1e6)
    except (OSError, ValueError):
        return None


def process_cpu_max(pid: int | str = "self") -> tuple[float, float] | None:
    """The CFS quota that limits process `pid`, (quota, period) in seconds, of the tightest group (fewest
    CPUs) among its cgroup and that group's ancestors, v2 or v1; None when it runs unlimited or its cgroups
    cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, version = V2, 2
        elif "cpu" in controllers.split(","):
            base, version = V1, 1
        else:
            continue
        d = base / path.lstrip("/")
        for group in (d, *d.parents):
            q = _cpu_max_of(group, version)
            if q is not None and q[1] > 0 and (tightest is None or q[0] / q[1] < tightest[0] / tightest[1]):
                tightest = q
            if group == base:
                break
    return tightest

