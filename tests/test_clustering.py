"""FunnelRAG Algorithm 1 (tasks.corpus.clustering): worked examples, invariants, contract tables."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_contracts.corpus import CLUSTER_MEMBERS, CLUSTERS, GRAPH_METRICS
from tasks.corpus.clustering import (Clustering, ClusteringConfig, check_clustering, cluster_documents, cluster_members_table,
                              clusters_table, ego_closeness, graph_metrics_table, _sort_prefix)
from tasks.corpus.graph import CSRGraph, build_graph, graph_metrics


def run(edges, n, n_tokens, max_tokens) -> tuple[CSRGraph, Clustering]:
    src = np.array([a for a, _ in edges], dtype=np.int64)
    dst = np.array([b for _, b in edges], dtype=np.int64)
    graph = build_graph(src, dst, n)
    return graph, cluster_documents(graph, graph_metrics(graph), np.asarray(n_tokens), ClusteringConfig(max_tokens=max_tokens))


def clusters_of(res: Clustering) -> list[list[int]]:
    return [res.members_of(c).tolist() for c in range(res.n_clusters)]


def test_worked_example_skip_and_continue():
    # triangle 0-1-2, path 2-3-4; 100 tokens each, S = 250 (two documents per cluster)
    # order by (cc desc, degree desc, id): 0 (cc 1), 1 (cc 1), 2 (cc 1/3), 3 (deg 2), 4
    # d=0: neighbours 1, 2 tie on c=1 -> rank: merge {1}; {2} does not fit -> skipped
    # d=2: cluster {0,1} (closest) does not fit -> skipped, then {3} fits -> merged
    _, res = run([(0, 1), (1, 2), (2, 0), (2, 3), (3, 4)], 5, [100] * 5, 250)
    assert res.order.tolist() == [0, 1, 2, 3, 4]
    assert clusters_of(res) == [[0, 1], [2, 3], [4]]
    assert res.cluster_of.tolist() == [0, 0, 1, 1, 2]
    assert res.n_tokens.tolist() == [200, 200, 100]
    assert res.n_merged == 2
    assert res.n_skipped == 5  # d=0: {2}; d=1: {2}; d=2: {0,1}; d=3: {4}; d=4: {2,3}


def test_member_order_is_document_then_candidates_in_closeness_order():
    # star centre 1 with leaves 0, 2; plus 2-3 so that 2's cluster is {2,3} when 1 absorbs it
    # cc all 0 -> order by degree desc: 1, 2 (deg 2), then 0, 3
    # d=1: neighbours 0 (c=0, rank 2), 2 (c=0, rank 1) -> candidates {2}, {0}
    _, res = run([(0, 1), (1, 2), (2, 3)], 4, [1, 1, 1, 1], 100)
    assert res.order.tolist() == [1, 2, 0, 3]
    assert clusters_of(res) == [[1, 2, 0, 3]]


def test_closeness_beats_processing_rank():
    # d=0 links 1, 2, 3; 2-3 linked, so c(0,2) = c(0,3) = 1 and c(0,1) = 0.
    # 1 sits in its own triangle (1-16-17) so it ranks before 2 and 3; 2 and 3 have leaves.
    edges = ([(0, 1), (0, 2), (0, 3), (2, 3), (1, 16), (1, 17), (16, 17)]
             + [(2, v) for v in range(4, 10)] + [(3, v) for v in range(10, 16)])
    _, res = run(edges, 18, [10] * 18, 20)  # room for one neighbour per cluster
    assert res.rank[1] < res.rank[2] < res.rank[3]
    assert res.order[:3].tolist() == [16, 17, 0]  # cc 1, 1, then cc(0) = cc(1) = 1/3, id tie-break
    # 0 takes the closer neighbour 2 (c = 1) over the better-ranked 1 (c = 0); 3 ties with 2 on c
    assert res.members_of(res.cluster_of[0]).tolist() == [0, 2]
    assert res.members_of(res.cluster_of[16]).tolist() == [16, 17]


@pytest.mark.parametrize("seed", range(4))
def test_ego_closeness_equals_networkx(seed):
    g = nx.powerlaw_cluster_graph(60, 3, 0.6, seed=seed)
    graph = build_graph(np.array([a for a, _ in g.edges]), np.array([b for _, b in g.edges]), 60)
    metrics = graph_metrics(graph)
    for d in range(60):
        want = nx.closeness_centrality(nx.ego_graph(g, d))
        got = ego_closeness(graph, metrics, d)
        np.testing.assert_allclose(got, [want[u] for u in graph.neighbors(d).tolist()], rtol=0, atol=1e-12)


def test_isolated_and_oversize_documents_are_singletons():
    # 0-1-2 path; 3 isolated; 1 longer than S
    _, res = run([(0, 1), (1, 2)], 4, [10, 5000, 10, 10], 100)
    assert sorted(clusters_of(res)) == [[0], [1], [2], [3]]
    assert res.n_tokens[res.cluster_of[1]] == 5000


def test_every_document_in_a_cluster_without_any_link():
    _, res = run([], 3, [1, 2, 3], 10)
    assert clusters_of(res) == [[0], [1], [2]]


def test_bad_inputs_raise():
    graph = build_graph(np.array([0]), np.array([1]), 2)
    metrics = graph_metrics(graph)
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        cluster_documents(graph, metrics, np.array([1, 2, 3]), ClusteringConfig())
    with pytest.raises(ValueError, match="n_tokens\\[1\\] = -4 is negative"):
        cluster_documents(graph, metrics, np.array([1, -4]), ClusteringConfig())
    with pytest.raises(ValueError, match="not computed on this graph"):
        cluster_documents(build_graph(np.array([0]), np.array([1]), 3), metrics, np.array([1, 1, 1]), ClusteringConfig())
    with pytest.raises(ValueError, match="max_tokens"):
        ClusteringConfig(max_tokens=0)


def check_invariants(graph: CSRGraph, res: Clustering, n_tokens: np.ndarray, max_tokens: int) -> None:
    """``check_clustering`` plus explicit re-statements and connectivity (networkx)."""
    check_clustering(graph, res, n_tokens, ClusteringConfig(max_tokens=max_tokens))
    n = graph.n_nodes
    assert sorted(res.members.tolist()) == list(range(n))  # each document in exactly one cluster
    g = graph.to_networkx()
    for c in range(res.n_clusters):
        members = res.members_of(c)
        assert (res.cluster_of[members] == c).all()
        assert res.n_tokens[c] <= max_tokens or members.size == 1
        assert nx.is_connected(g.subgraph(members.tolist()))  # merges follow links


graphs = st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120),
    st.lists(st.integers(0, 300), min_size=n, max_size=n),
    st.integers(1, 600),
    st.randoms(use_true_random=False)))


@settings(max_examples=100, deadline=None)
@given(graphs)
def test_clustering_invariants(case):
    n, edges, tokens, max_tokens, _ = case
    graph, res = run(edges, n, tokens, max_tokens)
    check_invariants(graph, res, np.asarray(tokens), max_tokens)


@settings(max_examples=60, deadline=None)
@given(graphs)
def test_clustering_deterministic_and_independent_of_edge_order(case):
    n, edges, tokens, max_tokens, rnd = case
    _, a = run(edges, n, tokens, max_tokens)
    _, b = run(edges, n, tokens, max_tokens)
    permuted = [(y, x) if rnd.random() < 0.5 else (x, y) for x, y in edges]
    rnd.shuffle(permuted)
    _, c = run(permuted, n, tokens, max_tokens)
    for other in (b, c):
        for name in ("order", "rank", "cluster_of", "indptr", "members", "n_tokens"):
            assert np.array_equal(getattr(a, name), getattr(other, name)), name
        assert (a.n_merged, a.n_skipped) == (other.n_merged, other.n_skipped)


def test_contract_tables_round_trip(tmp_path):
    edges = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (5, 6)]
    tokens = np.array([100, 100, 100, 100, 100, 30, 9000])
    graph, res = run(edges, 7, tokens, 250)
    metrics = graph_metrics(graph)
    titles = [f"Article {i}" for i in range(7)]
    ids = np.array([7_000_000_000 - 13 * i for i in range(7)], np.int64)   # published ids: neither rows nor sorted
    gm = graph_metrics_table(metrics, tokens, res, ids)
    cl = clusters_table(res, titles, ids)
    cm = cluster_members_table(res, ids)
    assert gm.column("doc_id").to_pylist() == ids.tolist()   # rows in the documents' order
    assert cl.column("cluster_id").to_pylist() == [int(ids[res.members_of(c)[0]]) for c in range(res.n_clusters)]
    assert gm.column("order").to_pylist() == res.rank.tolist()
    assert gm.column("clustering_coefficient").to_pylist()[:4] == [1.0, 1.0, 1 / 3, 0.0]
    assert cl.column("n_members").to_pylist() == res.n_members().tolist()
    assert cl.column("title").to_pylist() == [titles[res.members_of(c)[0]] for c in range(res.n_clusters)]
    assert cm.num_rows == 7
    rows = list(zip(*(cm.column(k).to_pylist() for k in ("cluster_id", "position", "doc_id"))))
    assert rows == [(int(ids[res.members_of(c)[0]]), p, int(ids[d])) for c in range(res.n_clusters)
                    for p, d in enumerate(res.members_of(c).tolist())]   # a cluster's id: its anchor's doc_id
    for contract, table in ((GRAPH_METRICS, gm), (CLUSTERS, cl), (CLUSTER_MEMBERS, cm)):
        contract.write(table, tmp_path)
        assert contract.read(tmp_path).equals(table)


def _corrupt(res: Clustering, **changes) -> Clustering:
    fields = {k: getattr(res, k) for k in ("order", "rank", "cluster_of", "indptr", "members", "n_tokens",
                                            "n_merged", "n_skipped")}
    fields.update(changes)
    return Clustering(**fields)


def test_check_clustering_detects_violations():
    tokens = np.array([100, 100, 100, 100, 100])
    graph, res = run([(0, 1), (1, 2), (2, 0), (2, 3), (3, 4)], 5, tokens, 250)
    cfg = ClusteringConfig(max_tokens=250)
    check_clustering(graph, res, tokens, cfg)  # clusters [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="document 3 is in 2 clusters"):
        check_clustering(graph, _corrupt(res, members=np.array([0, 1, 2, 3, 3], np.int32)), tokens, cfg)
    with pytest.raises(ValueError, match="cluster 1: n_tokens"):
        check_clustering(graph, _corrupt(res, n_tokens=np.array([200, 150, 100])), tokens, cfg)
    with pytest.raises(ValueError, match="> S = 150"):
        check_clustering(graph, res, tokens, ClusteringConfig(max_tokens=150))
    with pytest.raises(ValueError, match="would still fit together"):
        check_clustering(graph, res, tokens, ClusteringConfig(max_tokens=400))
    with pytest.raises(ValueError, match="smallest processing rank"):
        swapped = _corrupt(res, members=np.array([2, 3, 0, 1, 4], np.int32),
                           cluster_of=np.array([1, 1, 0, 0, 2], np.int32))
        check_clustering(graph, swapped, tokens, cfg)


def test_contracts_reject_bad_coefficients_and_positions():
    from data_contracts.base import ContractViolation

    _, res = run([(0, 1), (1, 2), (3, 4)], 5, [1] * 5, 100)
    cm = cluster_members_table(res)
    shifted = cm.set_column(1, "position", pa.array([p + (1 if i == 0 else 0) for i, p in
                                                    enumerate(cm.column("position").to_pylist())], pa.int32()))
    with pytest.raises(ContractViolation, match="positions of a cluster"):
        CLUSTER_MEMBERS.validate(shifted)
    graph, res = run([(0, 1), (1, 2), (2, 0)], 3, [1] * 3, 100)
    gm = graph_metrics_table(graph_metrics(graph), np.ones(3), res)
    bad = gm.set_column(3, "clustering_coefficient", pa.array([1.0, 1.5, 1.0]))
    with pytest.raises(ContractViolation, match="outside \\[0, 1\\]"):
        GRAPH_METRICS.validate(bad)


@pytest.mark.parametrize("k", [0, 1, 2, 15, 16, 17, 18, 100, 1001])
def test_sort_prefix_equals_numpy_sort(k):
    """Algorithm 1's own compiled sort of a row's neighbour keys (distinct int64) equals np.sort,
    and leaves the rest of the scratch array alone."""
    rng = np.random.default_rng(k)
    keys = rng.permutation(np.arange(3 * k + 5, dtype=np.int64) * 7919 - 10**12)
    tail = keys[k:].copy()
    expected = np.sort(keys[:k])
    _sort_prefix(keys, k)
    assert np.array_equal(keys[:k], expected) and np.array_equal(keys[k:], tail)
