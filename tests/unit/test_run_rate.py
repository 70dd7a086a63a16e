"""`clasp run`'s reference rate: an app's one-worker rate, measured once per machine and kept; asked for
only when a profile needs it (the measurement on a real worker: tests/cluster/test_run_cli.py)."""

from __future__ import annotations

import json
import math

import pytest

from clasp import cli
from clasp.cli.run import REFERENCE_SHARE, UsageError, capacity_factor, one_worker_rate, plan


class Measure:
    def __init__(self, rate: float = 12_000.0):
        self.rate, self.calls = rate, []

    def __call__(self, app, cpu):
        self.calls.append((app, cpu))
        return self.rate


def test_measured_once_per_app_and_quota_then_read(tmp_path):
    path, m, said = tmp_path / "state" / "rates.json", Measure(), []
    assert one_worker_rate("wc", None, path=path, measure=m, say=said.append) == 12_000.0
    assert one_worker_rate("wc", None, path=path, measure=m, say=said.append) == 12_000.0
    assert m.calls == [("wc", None)] and len(said) == 1 and str(path) in said[0]
    assert one_worker_rate("wc", 0.25, path=path, measure=Measure(3_000.0)) == 3_000.0  # another quota
    assert json.loads(path.read_text())["rates"] == {"wc@unlimited": 12_000.0, "wc@0.25": 3_000.0}


def test_a_file_from_another_machine_or_unreadable_is_measured_again(tmp_path):
    path = tmp_path / "rates.json"
    one_worker_rate("sd", None, path=path, measure=Measure(5.0))
    doc = json.loads(path.read_text())
    doc["machine"]["cpus"] = (doc["machine"]["cpus"] or 1) + 64
    path.write_text(json.dumps(doc))
    m = Measure(7.0)
    assert one_worker_rate("sd", None, path=path, measure=m) == 7.0 and m.calls == [("sd", None)]
    path.write_text("{not json")
    assert one_worker_rate("sd", None, path=path, measure=Measure(9.0)) == 9.0


def test_a_rate_that_cannot_be_kept_is_still_used(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    said = []
    assert one_worker_rate("wc", None, path=blocker / "rates.json", measure=Measure(4.0), say=said.append) == 4.0
    assert "could not keep it" in said[-1]


def _plan(*argv, measure):
    return plan(cli.build_parser().parse_args(["run", *argv]), rate_of=measure)


def test_plan_asks_for_the_rate_only_when_the_profile_needs_it():
    m = Measure()
    cfg = _plan("wc", "--workers", "2", measure=m)  # gradual, no --max-rate
    assert m.calls == [("wc", None)]
    assert cfg["max_rate"] == pytest.approx(REFERENCE_SHARE * 12_000.0 * capacity_factor(2))
    u = _plan("syn", "--profile", "unthrottled", "--workers", "2", measure=m)
    assert m.calls[-1] == ("syn", None) and u["records"] == math.ceil(12_000.0 * 2 * 10.0)
    m.calls.clear()
    _plan("wc", "--max-rate", "1000", measure=m)
    _plan("sd", "--profile", "constant:100", measure=m)
    _plan("syn", "--profile", "unthrottled", "--records", "7", measure=m)
    assert m.calls == []


def test_a_bad_profile_is_refused_before_anything_is_measured():
    m = Measure()
    with pytest.raises(UsageError, match="unknown profile 'zigzag'"):
        _plan("wc", "--profile", "zigzag", measure=m)
    assert m.calls == []
