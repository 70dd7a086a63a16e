"""The emulated cluster's hosts: each process in its own network namespace, and nothing left after it."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clasp
from clasp.local import cpulimit, netns
from clasp.local.cluster import LocalCluster
from tests.conftest import make_lines, wordcount_dag

why = netns.available()
pytestmark_live = pytest.mark.skipif(why is not None, reason=f"network namespaces unavailable here: {why}")
no_cpu = cpulimit.available()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def namespaces_work():
    """Root and iproute2 are not enough in some containers: try one namespace for real."""
    try:
        h = netns.Hosts()
    except netns.NetnsError as e:
        pytest.skip(f"network namespaces unavailable here: {e}")
    try:
        h.add("probe")
    except netns.NetnsError as e:
        pytest.skip(f"network namespaces unavailable here: {e}")
    finally:
        h.release()


def _ip_json(*args) -> list[dict]:
    text = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout.strip()
    return json.loads(text) if text else []


def leftovers(owner: int) -> list[str]:
    """Namespaces, veths and bridges of `owner` that exist now."""
    link = re.compile(rf"^cl(?:br|v){owner}-\d+$")
    return ([n["name"] for n in _ip_json("netns", "list") if n["name"].startswith(f"clasp-{owner}-")]
            + [k["ifname"] for k in _ip_json("link", "show") if link.match(k["ifname"])])


def net_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytestmark_live
@pytest.mark.parametrize("cpu", [None, pytest.param(0.5, marks=pytest.mark.skipif(
    no_cpu is not None, reason=f"CPU limits unavailable here: {no_cpu}"))], ids=["hosts", "hosts+cpu"])
def test_word_count_is_exact_across_namespaces_and_nothing_remains(cpu, namespaces_work, tmp_path):
    cluster = LocalCluster(workers=2, port=0, log_dir=tmp_path, hosts=True, cpu_per_worker=cpu).start()
    try:
        mine = set(leftovers(os.getpid()))
        assert len(mine) == 3 + 3 + 1  # a namespace and a veth per process, one bridge
        with clasp.connect(cluster.planner) as c:
            workers = sorted(c.workers(), key=lambda w: w["id"])
            # nsenter execed the worker in place: the PID we hold is the Python process that registered.
            assert [w["pid"] for w in workers] == [p.pid for p in cluster.procs[1:]]
            inodes = {net_ns(p.pid) for p in cluster.procs}
            assert len(inodes) == 3 and net_ns(os.getpid()) not in inodes
            addresses = {cluster.planner.split("//")[1].split(":")[0], *(w["host"] for w in workers)}
            assert len(addresses) == 3 and "127.0.0.1" not in addresses
            assert [w["data"].split("//")[1].split(":")[0] for w in workers] == [w["host"] for w in workers]
            if cpu is not None:
                pids = {int(p) for g in cluster.cpu_limits.groups for p in (g / "cgroup.procs").read_text().split()}
                assert pids == {p.pid for p in cluster.procs[1:]}
            lines = make_lines(20_000, seed=3)
            job = c.submit(wordcount_dag(), autoscale=False)
            job.push(lines)
            assert job.wait_idle(timeout=60)["completed"] == len(lines)
            assert job.state("count") == dict(collections.Counter(w for line in lines for w in line.split()))
            # Both workers took part, so chained requests crossed the bridge.
            stats = job.stats(fresh=True)
            assert all(w["counters"]["operators"]["count"]["keys"] > 0 for w in stats["workers"].values())
    finally:
        cluster.stop()
    assert not set(leftovers(os.getpid())) & mine
    if cpu is not None:
        assert not any(g.exists() for g in cluster.cpu_limits.groups)


_OWNER = """
import sys, time
from clasp.local.cluster import LocalCluster
cpu = float(sys.argv[2]) if sys.argv[2] != "-" else None
cl = LocalCluster(workers=1, port=0, log_dir=sys.argv[1], hosts=True, cpu_per_worker=cpu).start()
print(" ".join(str(p.pid) for p in cl.procs), flush=True)
time.sleep(120)
"""


@pytestmark_live
def test_a_sigkilled_owner_is_cleaned_up_by_the_next_cluster(namespaces_work, tmp_path):
    cpu = 0.5 if no_cpu is None else None
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path), str(cpu or "-")],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = owner.stdout.readline()
        assert line, "the owner process did not start its cluster"
        orphans = [int(p) for p in line.split()]
        left = leftovers(owner.pid)
        assert len(left) == 2 + 2 + 1
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()
    # The kill leaves the namespaces, links and cgroups behind; the planner and worker die with their owner
    # (PR_SET_PDEATHSIG), the sweep below kills any that did not.
    assert set(leftovers(owner.pid)) == set(left)
    deadline = time.monotonic() + 15
    while any(_running(p) for p in orphans) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in orphans), "the cluster's processes outlived their SIGKILLed owner"
    groups = list(Path(cpulimit._root()[0]).glob(f"clasp-{owner.pid}-*")) if cpu else []
    assert len(groups) == (1 if cpu else 0)
    # A new cluster sweeps first: the orphans are killed, namespaces, links and cgroups removed.
    with LocalCluster(workers=1, port=0, log_dir=tmp_path / "next", hosts=True, cpu_per_worker=cpu):
        assert leftovers(owner.pid) == []
        assert not any(_running(p) for p in orphans)
        assert not any(g.exists() for g in groups)


@pytestmark_live
def test_clasp_cluster_hosts_cleans_up_on_sigterm(namespaces_work, tmp_path):
    info = tmp_path / "info.json"
    p = subprocess.Popen([sys.executable, "-m", "clasp", "cluster", "--workers", "1", "--port", "0", "--hosts",
                          "--info", str(info), "--log-dir", str(tmp_path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not info.exists():
            assert p.poll() is None and time.monotonic() < deadline, "clasp cluster --hosts did not come up"
            time.sleep(0.05)
        published = json.loads(info.read_text())
        planner = published["planner"]
        assert not planner.startswith("tcp://127.")
        with clasp.connect(planner, timeout=10, keys=published["keys"]) as c:
            assert [w["alive"] for w in c.workers()] == [True]
        assert len(leftovers(p.pid)) == 2 + 2 + 1
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert leftovers(p.pid) == []


def test_refuses_without_root_or_iproute2(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match="need root"):
        netns.Hosts()
    with pytest.raises(netns.NetnsError, match="need root"):
        LocalCluster(workers=1, hosts=True).start()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "ip" else f"/usr/bin/{tool}")
    with pytest.raises(netns.NetnsError, match="iproute2"):
        netns.sweep()


def test_clasp_run_hosts_is_checked_before_anything_starts():
    from clasp import cli
    from clasp.cli.run import UsageError, plan

    parse = cli.build_parser().parse_args
    rate = lambda app, cpu: 10_000.0  # noqa: E731 - what one_worker_rate would measure
    with pytest.raises(UsageError, match="--planner"):
        plan(parse(["run", "wc", "--hosts", "--planner", "tcp://127.0.0.1:5555"]), rate)
    if why is None:
        assert plan(parse(["run", "wc", "--hosts", "--records", "10"]), rate)["hosts"] is True
    else:
        with pytest.raises(UsageError):
            plan(parse(["run", "wc", "--hosts"]), rate)
