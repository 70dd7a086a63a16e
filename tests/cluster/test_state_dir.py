"""Where checkpoints and the input log go: never the working directory. A local cluster without a state
directory uses a temporary one, removed when it stops; one given is kept; a planner started by hand uses
--state-dir or the per-user $XDG_STATE_HOME/clasp. Real processes, real checkpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import clasp
from clasp.apps import wc
from clasp.local.cluster import LocalCluster
from tests.conftest import wait_for

BANNER = re.compile(r"; state (\S+)( \(temporary: removed when it stops\))? — Ctrl-C")


def checkpointed_job(planner: str, keys: str | None = None, lines: int = 300) -> int:
    """Submit Word Count, push `lines` lines, wait for its answer and a checkpoint; the job's id."""
    with clasp.connect(planner, keys=keys, timeout=30) as client:
        wait_for(lambda: any(w["alive"] for w in client.workers()), timeout=30, what="a live worker")
        job = client.submit(wc.build_dag(), autoscale=False)
        records = wc.generate(lines, 1)
        job.push(records)
        job.wait_idle(timeout=60)
        assert job.state("count") == wc.expected(records)
        wait_for(lambda: job.stats()["checkpoints"]["completed"] >= 1, timeout=30, what="a checkpoint")
        return job.id


def start_cluster(cwd: Path, *extra: str) -> tuple[subprocess.Popen, re.Match]:
    cwd.mkdir(exist_ok=True)
    p = subprocess.Popen([sys.executable, "-m", "clasp", "cluster", "--workers", "1", "--port", "0", *extra],
                         cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    m = BANNER.search(line)
    if m is None:
        p.kill()
        pytest.fail(f"no state directory in the banner: {line!r}; stderr: {p.communicate(timeout=10)[1]}")
    return p, m


def stop(p: subprocess.Popen, sig: int) -> None:
    p.send_signal(sig)
    assert p.wait(timeout=60) in (0, -sig), p.stderr.read()


def planner_and_keys(tmp_path: Path, info: Path) -> tuple[str, str]:
    data = wait_for(lambda: info.exists() and json.loads(info.read_text()), timeout=30, what="the info file")
    return data["planner"], data["keys"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cluster_without_state_dir_uses_a_temporary_one_and_removes_it(tmp_path, sig):
    cwd, info = tmp_path / "project", tmp_path / "info.json"
    p, m = start_cluster(cwd, "--info", str(info))
    try:
        state = Path(m.group(1))
        assert m.group(2), "the banner says the directory is temporary"
        assert cwd not in state.parents and state.is_dir()
        data = json.loads(info.read_text())
        assert data["state_dir"] == str(state) and data["state_dir_kept"] is False
        job = checkpointed_job(data["planner"], data["keys"])
        assert any((state / f"job-{job}").glob("ckpt-*/COMPLETE.json")), "checkpoints are written there"
    finally:
        stop(p, sig)
    assert not state.exists(), "removed when the cluster stopped"
    assert list(cwd.iterdir()) == [], "nothing written into the working directory"


def test_cluster_with_state_dir_keeps_it(tmp_path):
    cwd, info, kept = tmp_path / "project", tmp_path / "info.json", tmp_path / "kept"
    p, m = start_cluster(cwd, "--info", str(info), "--state-dir", str(kept))
    try:
        assert Path(m.group(1)) == kept and not m.group(2)
        assert json.loads(info.read_text())["state_dir_kept"] is True
        job = checkpointed_job(*planner_and_keys(tmp_path, info))
    finally:
        stop(p, signal.SIGINT)
    assert (kept / f"job-{job}" / "job.kg").is_file(), "kept after the cluster stopped"
    assert list(cwd.iterdir()) == []


def test_planner_by_hand_uses_the_per_user_state_directory(tmp_path):
    cwd, xdg = tmp_path / "project", tmp_path / "xdg"
    cwd.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(xdg)}
    env.pop("CLASP_KEYS", None)

    def start(*argv: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "clasp", *argv], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    planner = start("planner", "--port", "0")
    procs = [planner]
    try:
        fields = dict(re.findall(r"(\w+)=(\S+)", planner.stdout.readline()))
        assert fields["state_dir"] == str(xdg / "clasp")
        procs.append(start("worker", "--planner", fields["endpoint"], "--id", "w0"))
        job = checkpointed_job(fields["endpoint"])
        assert (xdg / "clasp" / f"job-{job}" / "job.kg").is_file()
        # A second planner on the same directory would take up and rewrite the same jobs: it is refused.
        second = start("planner", "--port", "0")
        out, err = second.communicate(timeout=60)
        assert second.returncode == 2 and "in use by another planner" in err and str(xdg / "clasp") in err, err
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
            p.wait(timeout=30)
    assert list(cwd.iterdir()) == []


def test_user_state_dir_follows_the_xdg_spec():
    from clasp.runtime.state_store import user_state_dir

    assert user_state_dir({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == Path("/x/state/clasp")
    assert user_state_dir({"XDG_STATE_HOME": "relative", "HOME": "/h"}) == Path("/h/.local/state/clasp")
    assert user_state_dir({"XDG_STATE_HOME": "", "HOME": "/h"}) == Path("/h/.local/state/clasp")
    assert user_state_dir({"HOME": "/h"}) == Path("/h/.local/state/clasp")


def test_local_cluster_from_python_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    cwd = tmp_path / "project"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with LocalCluster(workers=1, port=0) as cl:
        state = cl.state_dir
        assert state is not None and state.is_dir() and cwd not in state.parents
        assert cl.info()["state_dir"] == str(state) and cl.state_dir_kept is False
        job = checkpointed_job(cl.planner)
        assert (state / f"job-{job}" / "job.kg").is_file()
    assert not state.exists()
    assert list(cwd.iterdir()) == []
    with pytest.raises(ValueError, match="state_dir="):
        LocalCluster(workers=1, planner_args=["--state-dir", str(tmp_path / "s")])
