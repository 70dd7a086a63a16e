"""`clasp run`: bad arguments are one-line errors with exit code 2; a short real run; Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clasp import cli
from clasp.local import cluster

BAD = [
    (["nosuchapp"], "unknown app 'nosuchapp'; accepted: wc, sd, aa, pl, nwm, etl, syn"),
    (["wc", "--profile", "zigzag"], "unknown profile 'zigzag'; accepted profiles: unthrottled, constant:"),
    (["wc", "--profile", "constant:fast"], "malformed profile 'constant:fast'"),
    (["wc", "--profile", "steps:100@2,300"], "step '300' is not RATE@SECONDS"),
    (["wc", "--profile", "constant:0"], "rate must be > 0"),
    (["wc", "--profile", "constant:-5"], "rate must be > 0"),
    (["wc", "--max-rate", "0"], "--max-rate must be a rate in records/s > 0, got '0'"),
    (["wc", "--workers", "0"], "--workers must be a whole number >= 1, got '0'"),
    (["wc", "--workers", "two"], "--workers must be a whole number >= 1, got 'two'"),
    (["wc", "--records", "-3"], "--records must be a whole number >= 1"),
    (["wc", "--duration", "0"], "--duration must be a number of seconds > 0"),
    (["wc", "--planner", "localhost"], "--planner must be tcp://HOST:PORT"),
    (["wc", "--plot", "out.svg"], "--plot writes a PNG"),
]


def _clasp(*args, timeout=60, **kw):
    return subprocess.run([sys.executable, "-m", "clasp", "run", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_bad_arguments_exit_2_with_one_line_naming_the_problem():
    # One interpreter per case is the real CLI path but costs ~0.5 s each; three cover the kinds.
    for argv, message in (BAD[0], BAD[1], BAD[7]):
        r = _clasp(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("clasp run: ") and message in lines[0]
        assert r.stdout == ""


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_start_no_process(monkeypatch, capsys, argv, message):
    started = []
    monkeypatch.setattr(cluster.LocalCluster, "start", lambda self: started.append(self))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    args = cli.build_parser().parse_args(["run", *argv])
    assert args.fn(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert started == []


def test_short_word_count_run_writes_a_correct_json(tmp_path):
    out, cwd = tmp_path / "run.json", tmp_path / "project"
    cwd.mkdir()
    r = _clasp("wc", "--records", "2000", "--profile", "constant:2000", "--workers", "1", "--json", str(out), cwd=cwd)
    assert r.returncode == 0, r.stderr
    # checkpoints went to a temporary directory, named, and removed at the end; nothing into the cwd
    state = re.search(r"state in (\S+) \(temporary: removed at the end of the run\)", r.stderr)
    assert state and not Path(state.group(1)).exists(), r.stderr
    assert list(cwd.iterdir()) == []
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["correct"] is True and s["sent"] == s["completed"] == 2000
    assert doc["app"] == "wc" and doc["profile"] == "constant:2000" and doc["workers"] == 1
    assert doc["series"] and all({"t", "input_rate", "throughput", "p95_ms", "workers"} <= set(x)
                                 for x in doc["series"])
    assert "correct" in r.stdout  # the summary table


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_the_cluster_and_prints_the_partial_summary(tmp_path):
    out = tmp_path / "partial.json"
    # SIGINT back to its default in the child: a suite started in the background (`make test &`) ignores
    # it, the child would inherit that, and Python keeps an ignored SIGINT ignored.
    p = subprocess.Popen([sys.executable, "-m", "clasp", "run", "wc", "--profile", "constant:500",
                          "--duration", "60", "--workers", "1", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # The first progress line means the cluster is up and records are flowing.
        deadline = time.monotonic() + 40
        while "t=" not in (line := p.stderr.readline()):
            assert line and time.monotonic() < deadline, "clasp run printed no progress line"
        kids = _children(p.pid)
        assert len(kids) == 2  # the planner and the worker
        p.send_signal(signal.SIGINT)
        try:
            stdout, _ = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGUSR1)  # the CLI's faulthandler: where it hangs, into the failure
            time.sleep(1.0)
            p.kill()
            out_, err = p.communicate()
            pytest.fail(f"clasp run did not stop within 30 s of Ctrl-C; its stacks:\n{err[-6000:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert not [k for k in kids if _alive(k)]
    assert "interrupted" in stdout
    s = json.loads(out.read_text())["summary"]
    assert s["interrupted"] is True and s["correct"] is None and 0 < s["sent"] < 30_000


ONE_WORKER = 17_300.0  # lines/s: what `one_worker_rate` would measure (tests/unit/test_run_rate.py)


def _plan(*argv):
    from clasp.cli.run import plan

    return plan(cli.build_parser().parse_args(["run", *argv]), rate_of=lambda app, cpu: ONE_WORKER)


def test_defaults_squeeze_gradual_to_a_minute_at_what_the_workers_sustain():
    from clasp.cli.run import REFERENCE_SHARE, capacity_factor

    cfg = _plan("wc", "--workers", "2")
    p = cfg["profile"]
    assert p.kind == "gradual" and p.duration == pytest.approx(60.0)
    assert cfg["max_rate"] == pytest.approx(REFERENCE_SHARE * ONE_WORKER * capacity_factor(2))
    assert max(r for r, _ in p.stages) == pytest.approx(cfg["max_rate"])
    assert cfg["records"] == p.volume
    # Same seed, same run; burst has gradual's volume.
    assert _plan("wc", "--workers", "2")["profile"] == p
    assert _plan("wc", "--workers", "2", "--profile", "burst")["records"] == pytest.approx(p.volume, abs=1)
    peak = _plan("wc", "--max-rate", "1000", "--duration", "20")["profile"].stages[9]
    assert peak[0] == pytest.approx(1000)


def test_defaults_for_constant_steps_and_unthrottled():
    c = _plan("sd", "--profile", "constant:100")
    assert c["records"] == 3000 and c["profile"].duration == 30.0 and c["max_rate"] is None
    assert _plan("sd", "--profile", "constant:100", "--records", "50")["records"] == 50
    assert _plan("sd", "--profile", "steps:10@1,20@2")["records"] == 50
    u = _plan("syn", "--profile", "unthrottled", "--records", "7")
    assert u["records"] == 7 and u["profile"].unthrottled


def test_the_one_worker_rate_is_measured_once_on_a_real_worker_and_kept(tmp_path):
    from clasp.cli.run import one_worker_rate

    said = []
    rate = one_worker_rate("syn", None, path=tmp_path / "rates.json", say=said.append)
    assert rate > 1000 and len(said) == 1 and "measuring syn's unthrottled rate on one worker" in said[0]
    assert json.loads((tmp_path / "rates.json").read_text())["rates"] == {"syn@unlimited": rate}
    assert one_worker_rate("syn", None, path=tmp_path / "rates.json", say=said.append) == rate and len(said) == 1


def test_capacity_factor_is_linear_up_to_one_worker_per_two_cores_then_falls():
    from clasp.cli.run import capacity_factor

    assert [capacity_factor(w, cpus=8) for w in (1, 2, 4)] == [1.0, 2.0, 4.0]
    assert capacity_factor(8, cpus=8) < 4.0
    two = [capacity_factor(w, cpus=2) for w in (1, 2, 4, 10)]
    assert two[0] == 1.0 and two == sorted(two, reverse=True)
