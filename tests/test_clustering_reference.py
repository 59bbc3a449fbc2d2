"""The numba Algorithm 1 equals a plain networkx/dict reference implementation.

The reference follows the algorithm text literally: ``networkx.clustering`` for line 1, the
real ``networkx.closeness_centrality`` inside ``networkx.ego_graph(G, d)`` for line 6 (so the
closed form ``k / (2k - 1 - c)`` used by the fast code is checked too), dict/list clusters.
"""
from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.corpus.clustering import ClusteringConfig, cluster_documents
from tasks.corpus.graph import build_graph, graph_metrics


def reference_algorithm1(g: nx.Graph, n_tokens: list[int], max_tokens: int) -> tuple[list[int], list[list[int]]]:
    """FunnelRAG Algorithm 1 with networkx and dicts: ``(processing order, clusters)``.

    Clusters are member lists in cluster order, listed by cluster id.
    """
    cc = nx.clustering(g)
    order = sorted(g.nodes, key=lambda d: (-cc[d], -g.degree(d), d))
    rank = {d: i for i, d in enumerate(order)}
    cluster = {d: d for d in g.nodes}          # doc -> cluster key
    members = {d: [d] for d in g.nodes}        # cluster key -> members in order
    size = {d: n_tokens[d] for d in g.nodes}   # cluster key -> tokens
    for d in order:
        neighbours = list(g[d])
        if not neighbours:
            continue
        closeness = nx.closeness_centrality(nx.ego_graph(g, d))
        neighbours.sort(key=lambda u: (-closeness[u], rank[u]))
        candidates, seen = [], {cluster[d]}
        for u in neighbours:
            if cluster[u] not in seen:
                seen.add(cluster[u])
                candidates.append(cluster[u])
        for c in candidates:
            mine = cluster[d]
            if size[mine] + size[c] > max_tokens:
                continue  # skip and try the next candidate
            members[mine].extend(members[c])
            for x in members.pop(c):
                cluster[x] = mine
            size[mine] += size.pop(c)
    ids: dict[int, int] = {}
    clusters: list[list[int]] = []
    for d in order:
        if cluster[d] not in ids:
            ids[cluster[d]] = len(ids)
            clusters.append(members[cluster[d]])
    return order, clusters


def fast(edges: list[tuple[int, int]], n: int, n_tokens: list[int], max_tokens: int):
    src = np.array([e[0] for e in edges], dtype=np.int64)
    dst = np.array([e[1] for e in edges], dtype=np.int64)
    graph = build_graph(src, dst, n)
    res = cluster_documents(graph, graph_metrics(graph), np.array(n_tokens), ClusteringConfig(max_tokens=max_tokens))
    clusters = [res.members_of(c).tolist() for c in range(res.n_clusters)]
    return res.order.tolist(), clusters


def reference(edges, n, n_tokens, max_tokens):
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((a, b) for a, b in edges if a != b)
    return reference_algorithm1(g, n_tokens, max_tokens)


@pytest.mark.parametrize("seed", range(12))
def test_equals_reference_on_random_graphs(seed):
    rng = random.Random(seed)
    n = rng.randint(20, 120)
    kind = seed % 3
    if kind == 0:
        g = nx.gnp_random_graph(n, rng.uniform(0.02, 0.2), seed=seed)
    elif kind == 1:
        g = nx.powerlaw_cluster_graph(n, rng.randint(1, 4), rng.uniform(0.1, 0.9), seed=seed)
    else:
        g = nx.relaxed_caveman_graph(max(2, n // 8), 8, 0.2, seed=seed)
        n = g.number_of_nodes()
    edges = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in g.edges]
    n_tokens = [rng.choice([0, 50, 200, 700, 1500, 5000]) for _ in range(n)]
    max_tokens = rng.choice([500, 1024, 4096])
    got, want = fast(edges, n, n_tokens, max_tokens), reference(edges, n, n_tokens, max_tokens)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert sum(len(c) > 1 for c in want[1]) > 0  # the case exercises merges


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 25).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=80),
    st.lists(st.integers(0, 60), min_size=n, max_size=n),
    st.integers(1, 150))))
def test_equals_reference_hypothesis(case):
    n, edges, n_tokens, max_tokens = case
    assert fast(edges, n, n_tokens, max_tokens) == reference(edges, n, n_tokens, max_tokens)
