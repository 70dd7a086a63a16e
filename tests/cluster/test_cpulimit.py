"""Per-worker CPU quotas: applied to each worker process, removed when the cluster stops."""

from __future__ import annotations

import pytest

from clasp.local import cpulimit
from tests.conftest import start_cluster

why = cpulimit.available()


@pytest.mark.skipif(why is not None, reason=f"CPU limits unavailable here: {why}")
def test_each_worker_gets_its_own_quota_and_it_is_removed(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, 2, cpu_per_worker=0.25)
    try:
        groups = list(cluster.cpu_limits.groups)
        assert len(groups) == 2
        pids = {int(p) for g in groups for p in (g / "cgroup.procs").read_text().split()}
        assert pids == {p.pid for p in cluster.procs[1:]}  # the workers, not the planner
        for g in groups:
            if (g / "cpu.max").exists():
                assert (g / "cpu.max").read_text().split() == [str(int(0.25 * cpulimit.PERIOD_US)),
                                                               str(cpulimit.PERIOD_US)]
            else:
                assert int((g / "cpu.cfs_quota_us").read_text()) == int(0.25 * cpulimit.PERIOD_US)
        for p in cluster.procs[1:]:  # what a worker reads of itself: its stall threshold and CPU limit
            assert cpulimit.process_cpu_max(p.pid) == (0.25 * cpulimit.PERIOD_US / 1e6, cpulimit.PERIOD_US / 1e6)
        assert cpulimit.process_cpu_max(cluster.procs[0].pid) is None  # the planner runs unlimited
    finally:
        cluster.stop()
    assert not any(g.exists() for g in groups)


def test_a_bad_quota_is_refused():
    if why is not None:
        with pytest.raises(cpulimit.CpuLimitError):
            cpulimit.CpuLimits(0.5)
    else:
        with pytest.raises(cpulimit.CpuLimitError, match="must be > 0"):
            cpulimit.CpuLimits(0)
