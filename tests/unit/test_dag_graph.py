"""The DAG's graph algorithms, on successor lists, give what networkx gives: the topological orders that decide
how successors are sorted (and so travel to the workers), reachability, and cycles."""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from clasp.core import dag as d


@st.composite
def graphs(draw, acyclic: bool):
    n = draw(st.integers(1, 12))
    names = draw(st.permutations([f"o{i}" for i in range(n)]))  # insertion order is not the topological one
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b and (a < b or not acyclic)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=30)) if pairs else []
    return names, [(f"o{a}", f"o{b}") for a, b in edges]


def _nx(nodes, edges):
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    return g


@settings(max_examples=300, deadline=None)
@given(graphs(acyclic=True))
def test_orders_and_reachability_are_networkx_s(graph):
    nodes, edges = graph
    succ = d._successor_lists(nodes, edges)
    g = _nx(nodes, edges)
    assert d._generations(succ) == list(nx.topological_sort(g))
    assert d._a_cycle(succ) is None
    for n in nodes:
        assert d._reachable(succ, n) == {n} | nx.descendants(g, n)
    # The spec's order: by index, the smallest ready first.
    index = {n: i for i, n in enumerate(sorted(nodes))}
    succ_i = d._successor_lists(range(len(nodes)), ((index[a], index[b]) for a, b in edges))
    ops = [d.OperatorSpec(i, f"o{i}", False, False, succ_i[i], None, None) for i in range(len(nodes))]
    assert d.DagSpec("g", ops, []).topological() == list(nx.lexicographical_topological_sort(
        _nx(range(len(nodes)), [(index[a], index[b]) for a, b in edges])))


@settings(max_examples=300, deadline=None)
@given(graphs(acyclic=False))
def test_a_cycle_is_found_exactly_when_networkx_finds_one(graph):
    nodes, edges = graph
    cycle = d._a_cycle(d._successor_lists(nodes, edges))
    assert (cycle is not None) == (not nx.is_directed_acyclic_graph(_nx(nodes, edges)))
    if cycle:
        assert cycle[0] == cycle[-1] and len(set(cycle)) == len(cycle) - 1
        assert all((a, b) in edges for a, b in zip(cycle, cycle[1:], strict=False))


def test_a_dag_refuses_an_edge_that_closes_a_cycle_and_sorts_successors_topologically():
    import pytest

    import clasp

    g = clasp.Dag("g")
    a, b, c, e = (g.operator(n, lambda x: x) for n in "abce")
    a >> c
    a >> b
    b >> c
    c >> e
    with pytest.raises(d.DagError, match="would close a cycle"):
        e >> a
    g.validate()
    spec = d.DagSpec.from_dag(g)
    assert [spec.operators[i].name for i in spec.operators[0].successors] == ["b", "c"]
