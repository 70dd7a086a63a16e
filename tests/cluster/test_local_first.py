"""Local-first routing: a worker keeps the requests its own share of a stateless successor takes and sends
only its surplus, to the workers short of theirs (clasp.core.model.edge_flow). The flows as a pure
function (by hand and as properties), the model's terms, next-fit and the worker-limit search under it,
the runtime's tables, the simulator, and real clusters counting what crossed workers."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import clasp
from clasp.apps import get_app
from clasp.core.model import CapacityModel, edge_flow, pair_rates
from clasp.core.placement import derive_load, highest_rate_placement, place, single_worker_rate
from clasp.core.policies import uniform_placement
from clasp.core.routing import ROUTE_LOCAL, ROUTE_TABLE, build_placement, route_to, spread_placement
from clasp.sim.simulator import COSTS_FILE, Costs, SimConfig, Simulator, app_dag

SRC = {0: 0.5, 1: 0.5}
DST = {0: 0.2, 1: 0.3, 2: 0.5}


def test_edge_flow_by_hand():
    assert edge_flow(SRC, DST, local_first=True) == {
        (0, 0): 0.2, (0, 2): pytest.approx(0.3), (1, 1): 0.3, (1, 2): pytest.approx(0.2)}
    assert edge_flow(SRC, DST) == {(w, d): pytest.approx(SRC[w] * DST[d]) for w in SRC for d in DST}
    # The same shares on both sides: nothing leaves any worker.
    assert edge_flow(DST, DST, local_first=True) == {(w, w): f for w, f in DST.items()}
    # A successor placed nowhere yet: no flow to anyone (the model charges it all as remote).
    assert edge_flow(SRC, {}, local_first=True) == {}


def shares(n: int):
    return st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n).filter(lambda v: sum(v) > 1e-3).map(
        lambda v: {i: x / sum(v) for i, x in enumerate(v) if x > 0})


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7).flatmap(lambda n: st.tuples(shares(n), shares(n))))
def test_local_first_gives_every_holder_its_share_with_the_least_remote_traffic(pair):
    src, dst = pair
    flows = edge_flow(src, dst, local_first=True)
    for w, f in src.items():  # every sender sends all it has
        assert sum(x for (a, _), x in flows.items() if a == w) == pytest.approx(f, abs=1e-9)
    for d, f in dst.items():  # every holder receives its share, as under σ routing
        assert sum(x for (_, b), x in flows.items() if b == d) == pytest.approx(f, abs=1e-9)
    remote = sum(x for (a, b), x in flows.items() if a != b)
    floor = sum(max(f - dst.get(w, 0.0), 0.0) for w, f in src.items())  # no routing can keep more
    assert remote == pytest.approx(floor, abs=1e-9)
    proportional = sum(x for (a, b), x in edge_flow(src, dst).items() if a != b)
    assert remote <= proportional + 1e-9


def test_load_terms_under_local_first_by_hand():
    m = CapacityModel(alpha=1.0, beta=2.0, gamma=10.0, capacity=1e6, beta_receive=3.0, alpha_split=5.0,
                      beta_split=4.0, table_routed=frozenset({"A", "B"}), local_first=True)
    terms = m.load_terms({"A": SRC, "B": DST}, {"A": 100.0, "B": 100.0}, {("A", "B"): 1000.0})
    # Worker 0 keeps 0.2 (on its table, with worker 2: α_split) and sends 0.3 (β_s + β_split).
    assert terms[0]["local"] == pytest.approx(1000 * 0.2 * 5.0)
    assert terms[0]["remote_out"] == pytest.approx(1000 * 0.3 * (2.0 + 4.0))
    assert terms[1]["local"] == pytest.approx(1000 * 0.3 * 5.0)
    assert terms[1]["remote_out"] == pytest.approx(1000 * 0.2 * (2.0 + 4.0))
    assert terms[2]["remote_in"] == pytest.approx(1000 * 0.5 * 3.0) and terms[2]["remote_out"] == 0.0
    assert terms[0]["destinations"] == terms[1]["destinations"] == 10.0 and terms[2]["destinations"] == 0.0
    # The paper's model of the same placement: by σ, more remote, both ways.
    paper = dataclasses.replace(m, local_first=False).load_terms({"A": SRC, "B": DST}, {"A": 100.0, "B": 100.0},
                                                                 {("A", "B"): 1000.0})
    assert paper[0]["remote_out"] == pytest.approx(1000 * 0.5 * 0.8 * 6.0)
    assert paper[2]["remote_in"] == pytest.approx(1000 * 0.5 * 3.0)
    assert paper[0]["remote_in"] == pytest.approx(1000 * 0.2 * 0.5 * 3.0)
    assert terms[0]["remote_in"] == 0.0


def _chain(n_ops: int, rate: float = 1000.0, tau: float = 50.0):
    ops = [f"o{i}" for i in range(n_ops)]
    edges = [(ops[i], ops[i + 1]) for i in range(n_ops - 1)]
    return ops, edges, derive_load(dict.fromkeys(ops, rate), dict.fromkeys(ops, tau), dict.fromkeys(edges, rate),
                                   rate, rate)


def test_a_stateless_chain_spread_local_first_scales_linearly_and_the_paper_model_does_not_see_it():
    ops, edges, observed = _chain(6, tau=5.0)  # SYN-like: chained requests cost about what execution does
    m = CapacityModel(0.5, 1.8, 0.0, 250000.0, beta_receive=1.8, mu=59.0, table_routed=frozenset(ops),
                      local_first=True)
    one = single_worker_rate(observed, 1000.0, m)
    search = highest_rate_placement(ops, edges, observed, 1000.0, m, 5, refine=True)
    assert search.rate == pytest.approx(5 * one, rel=0.01)
    assert all(f == {w: pytest.approx(0.2) for w in range(5)} for f in search.placement.fractions.values())
    assert pair_rates(search.placement.fractions, search.placement.edge_rates, m.local_routed) == {}
    paper = highest_rate_placement(ops, edges, observed, 1000.0, m.paper(), 5, refine=True)
    assert paper.rate < 0.9 * search.rate


def test_the_spread_follows_unequal_capacities():
    ops, edges, observed = _chain(4)
    m = CapacityModel(0.5, 1.8, 0.0, 250000.0, capacities=(100000.0, 300000.0), table_routed=frozenset(ops),
                      local_first=True)
    search = highest_rate_placement(ops, edges, observed, 1000.0, m, 2, refine=True)
    one = [single_worker_rate(observed, 1000.0, m, w) for w in (0, 1)]
    assert search.rate == pytest.approx(sum(one), rel=0.01)
    assert search.placement.fractions["o0"] == {0: pytest.approx(0.25), 1: pytest.approx(0.75)}


def test_next_fit_charges_what_local_first_keeps_and_sends():
    """B (placed first) takes 0.4 of worker 0 and the rest of worker 1; A's share on worker 0 keeps up to
    0.4 of its requests there, and only the surplus beyond it is charged remote."""
    ops, edges = ["A", "B"], [("A", "B")]
    load = derive_load({"A": 1000.0, "B": 1000.0}, {"A": 300.0, "B": 500.0}, {("A", "B"): 1000.0}, 1000.0,
                       1000.0)
    m = CapacityModel(alpha=10.0, beta=100.0, gamma=0.0, capacity=700000.0, beta_receive=50.0,
                      table_routed=frozenset(ops), local_first=True)
    p = place(ops, edges, load, m)
    for w, v in enumerate(p.load(m)):
        assert v <= m.capacity_of(w) * (1 + 1e-9)
    # Eq. (8) under local-first routing of what next-fit made equals what next-fit reserved.
    assert [m.capacity_of(w) - v for w, v in enumerate(p.load(m))] == pytest.approx(p.remaining, abs=1e-6)


def test_route_tables_from_each_worker():
    dag = clasp.Dag("ab")
    a = dag.operator("a", lambda v: v)
    b = dag.operator("b", lambda v: v, collect=True)
    a >> b
    spec = dag.to_spec()
    workers = ["w0", "w1", "w2"]
    uneven = build_placement(spec, workers, {"a": SRC, "b": DST}, 10)
    r0 = route_to(spec, uneven, 1, "w0", 0)
    assert r0.kind == ROUTE_TABLE
    assert collections.Counter(r0.table) == {None: 48, "w2": 72}  # keeps 0.2 of its 0.5, sends 0.3 to w2
    assert route_to(spec, uneven, 1, "w2", 0).kind == ROUTE_TABLE  # not a holder of a: by σ
    assert collections.Counter(route_to(spec, uneven, 1, None).table) == {"w0": 24, "w1": 36, "w2": 60}
    even = spread_placement(spec, workers, 10)
    assert {route_to(spec, even, 1, w, 0).kind for w in workers} == {ROUTE_LOCAL}


def test_the_simulator_routes_as_the_model_does():
    costs = Costs.load(COSTS_FILE)
    assert costs.local_first
    dag = app_dag(get_app("syn"), costs)
    cfg = SimConfig(duration=4.0, warmup=1.0)
    spread = uniform_placement(dag.operators, dag.edges, 3, 10, 1.0, "spread", "spread")
    sim = Simulator(dag, costs, 3, placement=spread, config=cfg)
    assert sim.remote_per_req.max() == 0.0 and sim.delta.max() == 0.0
    one = Simulator(dag, costs, 1, config=cfg).run().throughput
    assert sim.run().throughput == pytest.approx(3 * one, rel=0.03)
    # An uneven placement: the rows between workers are the model's pair rates.
    fractions = {o: ({0: 0.5, 1: 0.5} if i % 2 else {0: 0.2, 1: 0.3, 2: 0.5}) for i, o in enumerate(dag.operators)}
    uneven = dataclasses.replace(spread, fractions=fractions)
    sim = Simulator(dag, costs, 3, placement=uneven, config=cfg)
    served = np.array([[fractions[o].get(w, 0.0) * 1000.0 for o in dag.operators] for w in range(3)])
    rows = np.einsum("wo,wod->wd", served, sim.to_worker)
    expect = pair_rates(fractions, {e: 1000.0 * f for e, f in dag.fanout.items()},
                        frozenset(dag.operators))
    for w in range(3):
        for d in range(3):
            assert rows[w, d] == pytest.approx(expect.get((w, d), 0.0) if w != d else rows[w, d], abs=1e-6)


def _remote(job) -> int:
    return sum(w["counters"]["remote"] for w in job.stats(fresh=True)["workers"].values())


def test_a_spread_stateless_chain_never_leaves_its_worker(client3):
    dag = clasp.Dag("chain-local")
    ops = [dag.operator(f"op{i}", lambda v, i=i: v * 2 + i) for i in range(4)]
    ops.append(dag.operator("out", lambda v: v, collect=True))
    for x, y in zip(ops, ops[1:], strict=False):
        x >> y
    job = client3.submit(dag, autoscale=False)  # every operator on every worker, evenly
    job.push(range(9000))
    job.wait_idle(60)

    def chain(v):
        for i in range(4):
            v = v * 2 + i
        return v
    assert sorted(job.collected("out")) == sorted(chain(v) for v in range(9000))
    assert len(job.info["placement"]["operators"]["op0"]["shares"]) == 3
    assert _remote(job) == 0
    job.cancel()


def test_uneven_shares_send_only_the_surplus_and_stay_exact(client3):
    dag = clasp.Dag("surplus")
    a = dag.operator("a", lambda v: v + 1)
    b = dag.operator("b", lambda v: v * 3, collect=True)
    c = dag.operator("sum", lambda s, v: ((s or 0) + v, None), stateful=True, key=lambda v: v % 5)
    a >> b >> c
    n = 12000
    job = client3.submit(dag, placement={"a": SRC, "b": DST, "sum": {2: 1.0}})
    job.push(range(n))
    job.wait_idle(60)
    assert sorted(job.collected("b")) == [(v + 1) * 3 for v in range(n)]
    expect = collections.Counter()
    for v in range(n):
        expect[((v + 1) * 3) % 5] += (v + 1) * 3
    assert job.state("sum") == dict(expect)
    # a → b: 0.3 + 0.2 of the requests cross (by σ it would be 0.5·0.8 + 0.5·0.7 = 0.75); b → sum: what b
    # holds off worker 2, 0.5.
    assert _remote(job) == pytest.approx(n * 0.5 + n * 0.5, rel=0.01)
    job.cancel()
