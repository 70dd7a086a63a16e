"""Every app on run_local gives exactly its expected answer; generators are deterministic for a seed."""

import random

import msgpack
import pytest

import clasp
from clasp.apps import APPS, get_app
from clasp.testing import run_local

SIZES = {"wc": 400, "sd": 3000, "aa": 3000, "pl": 3000, "nwm": 1500, "etl": 600, "syn": 500}
# Operator count and stateful operators of each app as we read the paper's Fig. 1 (clasp/apps/README.md).
TOPOLOGY = {
    "wc": (2, {"count"}),
    "sd": (2, {"moving_average"}),
    "aa": (5, {"campaign_join", "window_aggregate"}),
    "pl": (6, {"aggregate"}),
    "nwm": (10, {"join", "aggregate"}),
    "etl": (10, {"bloom_filter", "interpolate", "join"}),
    "syn": (10, set()),
}


@pytest.fixture(params=sorted(APPS))
def app(request):
    return get_app(request.param)


def test_registry_and_unknown_name():
    assert list(APPS) == ["wc", "sd", "aa", "pl", "nwm", "etl", "syn"]
    with pytest.raises(ValueError, match="unknown app 'nope'; accepted: wc, sd"):
        get_app("nope")


def test_syn_chains_of_other_lengths():
    five = get_app("syn5")
    assert five.NAME == "syn5" and "syn5" not in APPS
    dag = five.build_dag()
    assert [o.name for o in dag.operators] == [f"op{i}" for i in range(5)] and len(dag.edges) == 4
    records = five.generate(300, seed=2)
    assert five.result(run_local(dag, records)) == five.expected(records) == sorted(records)
    with pytest.raises(ValueError, match="unknown app 'synx'"):
        get_app("synx")
    with pytest.raises(ValueError, match="at least one operator"):
        get_app("syn0")


def test_topology(app):
    dag = app.build_dag()
    assert isinstance(dag, clasp.Dag) and dag.name == app.NAME
    dag.validate()
    n_ops, stateful = TOPOLOGY[app.NAME]
    assert len(dag.operators) == n_ops
    assert {o.name for o in dag.operators if o.stateful} == stateful


def test_local_run_matches_expected(app):
    records = app.generate(SIZES[app.NAME], seed=11)
    job = run_local(app.build_dag(), records)
    want = app.expected(records)
    assert want, "a test input with an empty answer proves nothing"
    assert app.result(job) == want
    # Every operator does something on this input.
    assert all(n > 0 for n in job.processed.values()), job.processed


def test_generator_deterministic_and_serializable(app):
    a = app.generate(200, seed=5)
    assert a == app.generate(200, seed=5)
    assert a != app.generate(200, seed=6)
    assert len(a) == 200
    assert msgpack.unpackb(msgpack.packb(a), strict_map_key=False) == a


def test_expected_is_seed_sensitive(app):
    assert app.expected(app.generate(300, seed=1)) != app.expected(app.generate(300, seed=2))


@pytest.mark.parametrize("name", ["wc", "aa", "pl", "nwm", "etl", "syn"])
def test_answer_does_not_depend_on_arrival_order(name):
    # On a cluster, parallel stateless executors and two-path joins reorder requests; only SD promises
    # (and needs) per-key order. A shuffled input is the harshest reordering.
    app = get_app(name)
    records = app.generate(SIZES[name], seed=3)
    shuffled = list(records)
    random.Random(9).shuffle(shuffled)
    assert app.result(run_local(app.build_dag(), shuffled)) == app.expected(records)


def test_wc_lines_and_vocabulary():
    wc = get_app("wc")
    lines = wc.generate(2000, seed=1)
    assert all(10 <= len(line.split()) <= 20 for line in lines)
    counts = wc.expected(lines)
    assert sum(counts.values()) == sum(len(line.split()) for line in lines)
    # Zipf: the most frequent word is far more common than the median one.
    freq = sorted(counts.values(), reverse=True)
    assert freq[0] > 20 * freq[len(freq) // 2]


def test_sd_answer_is_order_sensitive():
    sd = get_app("sd")
    records = sd.generate(3000, seed=4)
    want = sd.expected(records)
    assert want["spikes"]
    swapped = list(records)
    # Swap a sensor's last two readings: its final window (and so the answer) must change.
    last = [i for i, r in enumerate(records) if r["sensor"] == records[0]["sensor"]][-2:]
    swapped[last[0]], swapped[last[1]] = swapped[last[1]], swapped[last[0]]
    assert sd.expected(swapped) != want


def test_stateful_operators_leave_no_stray_state():
    etl = get_app("etl")
    job = run_local(etl.build_dag(), etl.generate(600, seed=2))
    # Every message completed, so the join deleted every message's state.
    assert job.state("join") == {}
    counts = job.state("bloom_filter")
    assert set(counts) == set(etl.FIELDS) and all(c["pass"] and c["reject"] for c in counts.values())
