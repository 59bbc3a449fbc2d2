"""CSR hyperlink graph and its triangle metrics against networkx."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.corpus.graph import CSRGraph, build_graph, graph_metrics

TOL = 1e-12


def nx_graph(edges, n: int) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    return g


def from_edges(edges, n: int) -> CSRGraph:
    src = np.array([a for a, _ in edges], dtype=np.int64)
    dst = np.array([b for _, b in edges], dtype=np.int64)
    return build_graph(src, dst, n)


def assert_metrics_equal_networkx(graph: CSRGraph, g: nx.Graph) -> None:
    """Degree, triangles, clustering and per-edge common neighbours equal networkx's."""
    m = graph_metrics(graph)
    n = graph.n_nodes
    cc = nx.clustering(g)
    tri = nx.triangles(g)
    deg = dict(g.degree())
    # networkx counts a self-loop twice in degree; the simple graph has none
    assert [deg[i] for i in range(n)] == m.degree.tolist()
    assert [tri[i] for i in range(n)] == m.triangles.tolist()
    np.testing.assert_allclose(m.clustering, [cc[i] for i in range(n)], rtol=0, atol=TOL)
    for u in range(n):
        row = graph.neighbors(u)
        assert row.tolist() == sorted(g[u])
        for p, v in zip(range(graph.indptr[u], graph.indptr[u + 1]), row.tolist()):
            assert m.support[p] == len(set(g[u]) & set(g[v]))


def test_build_graph_dedupes_drops_self_loops_and_symmetrises():
    src = np.array([0, 1, 0, 2, 2, 3, 3], dtype=np.int32)
    dst = np.array([1, 0, 1, 2, 0, 1, 1], dtype=np.int32)
    graph = build_graph(src, dst, 5)
    assert graph.n_nodes == 5
    assert graph.n_edges == 3  # {0,1}, {0,2}, {1,3}
    assert graph.neighbors(0).tolist() == [1, 2]
    assert graph.neighbors(1).tolist() == [0, 3]
    assert graph.neighbors(2).tolist() == [0]
    assert graph.neighbors(3).tolist() == [1]
    assert graph.neighbors(4).tolist() == []  # isolated node kept
    assert graph.indices.dtype == np.int32 and graph.indptr.dtype == np.int64
    u, v = graph.edge_list()
    assert list(zip(u.tolist(), v.tolist())) == [(0, 1), (0, 2), (1, 3)]


def test_build_graph_empty_and_no_links():
    graph = build_graph(np.zeros(0, np.int32), np.zeros(0, np.int32), 3)
    assert graph.n_edges == 0 and graph.degree().tolist() == [0, 0, 0]
    m = graph_metrics(graph)
    assert m.clustering.tolist() == [0.0, 0.0, 0.0]
    assert build_graph([], [], 0).n_nodes == 0


@pytest.mark.parametrize("src,dst,n,match", [
    ([0, 5], [1, 2], 5, "link 1: src id 5 is outside"),
    ([0, 1], [-1, 2], 5, "link 0: dst id -1 is outside"),
    ([0, 1], [1], 5, "equal length"),
    ([0.0], [1.0], 5, "integers"),
])
def test_build_graph_rejects_bad_links(src, dst, n, match):
    with pytest.raises(ValueError, match=match):
        build_graph(np.array(src), np.array(dst), n)


def test_metrics_on_known_graphs():
    # triangle 0-1-2 plus pendant 3 attached to 2
    graph = from_edges([(0, 1), (1, 2), (2, 0), (2, 3)], 4)
    m = graph_metrics(graph)
    assert m.triangles.tolist() == [1, 1, 1, 0]
    assert m.clustering.tolist() == [1.0, 1.0, 1 / 3, 0.0]
    # complete graph K6: every coefficient 1, every edge in 4 triangles
    k6 = nx.complete_graph(6)
    m6 = graph_metrics(from_edges(list(k6.edges), 6))
    assert m6.clustering.tolist() == [1.0] * 6 and set(m6.support.tolist()) == {4}


@pytest.mark.parametrize("seed", range(6))
def test_metrics_equal_networkx_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 200))
    graphs = [nx.gnp_random_graph(n, float(rng.uniform(0.01, 0.3)), seed=seed),
              nx.powerlaw_cluster_graph(n, 3, 0.5, seed=seed),
              nx.barabasi_albert_graph(n, 4, seed=seed)]
    for g in graphs:
        edges = list(g.edges)
        rng.shuffle(edges)
        # add reversed duplicates and self-loops: build_graph must ignore them
        edges = edges + [(b, a) for a, b in edges[: len(edges) // 3]] + [(0, 0), (n - 1, n - 1)]
        assert_metrics_equal_networkx(from_edges(edges, n), g)


def test_metrics_equal_networkx_on_graph_with_hubs():
    # degree ordering matters most with hubs: a few nodes linked to everything
    g = nx.gnp_random_graph(300, 0.02, seed=7)
    for hub in (0, 1, 2):
        g.add_edges_from((hub, v) for v in range(300) if v != hub)
    assert_metrics_equal_networkx(from_edges(list(g.edges), 300), g)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=150))))
def test_metrics_equal_networkx_hypothesis(case):
    n, edges = case
    g = nx_graph([(a, b) for a, b in edges if a != b], n)
    assert_metrics_equal_networkx(from_edges(edges, n), g)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 20).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60),
    st.randoms(use_true_random=False))))
def test_graph_independent_of_link_order_and_direction(case):
    n, edges, rnd = case
    shuffled = [(b, a) if rnd.random() < 0.5 else (a, b) for a, b in edges]
    rnd.shuffle(shuffled)
    g1, g2 = from_edges(edges, n), from_edges(shuffled, n)
    assert np.array_equal(g1.indptr, g2.indptr) and np.array_equal(g1.indices, g2.indices)
    m1, m2 = graph_metrics(g1), graph_metrics(g2)
    assert np.array_equal(m1.clustering, m2.clustering) and np.array_equal(m1.support, m2.support)


def test_to_networkx_round_trip():
    g = nx.powerlaw_cluster_graph(50, 2, 0.3, seed=1)
    graph = from_edges(list(g.edges), 50)
    back = graph.to_networkx()
    assert sorted(back.nodes) == list(range(50))
    assert {frozenset(e) for e in back.edges} == {frozenset(e) for e in g.edges}
