"""`clasp place PROFILE.json`: output object, overrides, and exit codes."""

import json
import subprocess
import sys

import pytest

from clasp.cli.place import main
from tests.unit.test_policy import PROFILE, profile


@pytest.fixture
def write(tmp_path):
    def _write(d, name="PROFILE.json"):
        p = tmp_path / name
        p.write_text(json.dumps(d) if not isinstance(d, str) else d)
        return str(p)
    return _write


def run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_prints_the_placement(capsys, write):
    rc, out, err = run(capsys, [write(PROFILE)])
    assert rc == 0, err
    d = json.loads(out)
    assert d["order"] == ["B", "A"]
    assert d["workers"] == len(d["load"]) >= 6
    assert d["capacity"] == 850000
    assert sum(d["placement"]["A"].values()) == pytest.approx(800000)  # 2000 req/s × 400 µs
    assert set(d["parallelism"]) == {"A", "B"}
    assert max(d["load"]) <= 850000 * (1 + 1e-9)


def test_rate_and_max_workers(capsys, write):
    path = write(PROFILE)
    rc, out, _ = run(capsys, [path, "--rate", "1000"])
    assert rc == 0 and json.loads(out)["rate"] == 1000
    assert sum(json.loads(out)["placement"]["B"].values()) == pytest.approx(2100000)
    rc, out, _ = run(capsys, [path, "--max-workers", "3", "--policy", "clasp"])
    d = json.loads(out)
    assert rc == 0 and d["workers"] <= 3 and d["rate"] < 2000


@pytest.mark.parametrize("d, field", [
    (profile(alpha=None), "alpha"),
    ({k: v for k, v in PROFILE.items() if k != "throughput"}, "throughput"),
    (profile(edges=[{"src": "A", "dst": "X", "rate": 1}]), "edges[0].dst"),
    (profile(operators={"A": {"rate": -3, "tau_us": 1}}, edges=[]), "operators.A.rate"),
    (profile(edges=[{"src": "A", "dst": "B", "rate": 1}, {"src": "B", "dst": "A", "rate": 1}]), "edges"),
])
def test_malformed_profile_exits_2_naming_the_field(capsys, write, d, field):
    rc, out, err = run(capsys, [write(d)])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert repr(field) in err


def test_unreadable_inputs_exit_2(capsys, write, tmp_path):
    assert run(capsys, [str(tmp_path / "missing.json")])[0] == 2
    assert run(capsys, [write("{not json")])[0] == 2
    assert run(capsys, [write(PROFILE), "--policy", "nope"])[0] == 2
    assert run(capsys, [write(PROFILE), "--max-workers", "0"])[0] == 2


def test_zero_throughput_exits_1_and_says_so(capsys, write):
    rc, out, err = run(capsys, [write(profile(throughput=0))])
    assert rc == 1 and out == "" and "nothing to scale from" in err


def test_module_entry_point(write):
    proc = subprocess.run([sys.executable, "-m", "clasp.cli.place", write(PROFILE), "--rate", "500"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rate"] == 500


def test_explain_prints_every_term_against_each_workers_capacity(capsys, write):
    ext = {**PROFILE, "beta_receive": 20.0, "mu": 50.0, "capacities": [900000, 850000, 800000, 700000, 850000,
                                                                          850000, 850000, 850000]}
    rc, out, err = run(capsys, [write(ext), "--explain"])
    assert rc == 0, err
    lines = out.strip().splitlines()
    header = lines[1].split()
    assert header == ["worker", "execution", "local", "remote_out", "remote_in", "messages", "destinations",
                      "total", "capacity", "used"]
    rows = [line.split() for line in lines[2:]]
    assert rows and [int(r[0]) for r in rows] == list(range(len(rows)))
    for r in rows:
        terms = [float(x) for x in r[1:7]]
        assert float(r[7]) == pytest.approx(sum(terms), abs=len(terms))  # printed rounded
        assert float(r[7]) <= float(r[8]) * (1 + 1e-6)
    assert float(rows[0][8]) == 900000
    assert sum(float(r[1]) for r in rows) == pytest.approx(800000 + 4200000, rel=1e-3)  # A and B at 2000 req/s
    assert any(float(r[4]) > 0 for r in rows)  # someone receives remote requests
