"""Graph metrics and Algorithm 1 on the REAL Wikispeedia hyperlink graph (links.tsv) with the
real article lengths (whitespace words of the plain-text articles)."""
from __future__ import annotations

import tarfile
from pathlib import PurePosixPath

import networkx as nx
import numpy as np
import pytest

from funnelrag.datasets import resolve
from tasks.corpus.clustering import ClusteringConfig, check_clustering, cluster_documents
from tasks.corpus.graph import build_graph, graph_metrics


def _tsv_rows(tf: tarfile.TarFile, member: str) -> list[list[str]]:
    raw = tf.extractfile(member).read().decode("utf-8")
    return [line.split("\t") for line in raw.splitlines() if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def wikispeedia(data_mirror):
    """``(titles, src, dst, n_words)``: URL-quoted titles sorted (doc_id = index), directed
    links, and each article's length in whitespace words."""
    mirror = data_mirror
    with tarfile.open(resolve("wikispeedia-graph", mirror)) as tf:
        titles = sorted(r[0] for r in _tsv_rows(tf, "wikispeedia_paths-and-graph/articles.tsv"))
        links = _tsv_rows(tf, "wikispeedia_paths-and-graph/links.tsv")
    doc_id = {t: i for i, t in enumerate(titles)}
    src = np.array([doc_id[a] for a, _ in links], dtype=np.int32)
    dst = np.array([doc_id[b] for _, b in links], dtype=np.int32)
    n_words = np.zeros(len(titles), dtype=np.int64)
    with tarfile.open(resolve("wikispeedia-articles", mirror)) as tf:
        for member in tf:
            if member.isfile() and member.name.endswith(".txt"):
                title = PurePosixPath(member.name).stem
                n_words[doc_id[title]] = len(tf.extractfile(member).read().decode("utf-8").split())
    return titles, src, dst, n_words


@pytest.mark.slow  # networkx's clustering coefficients over the whole Wikispeedia graph (reference)
def test_real_graph_shape_and_clustering_coefficient_equals_networkx(wikispeedia):
    titles, src, dst, _ = wikispeedia
    assert len(src) == 119_879
    graph = build_graph(src, dst, len(titles))
    g = nx.Graph()
    g.add_nodes_from(range(len(titles)))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    # reciprocal links collapse to one edge; links.tsv has self-links, which networkx keeps\n    assert nx.number_of_selfloops(g) > 0\n    assert graph.n_edges == g.number_of_edges() - nx.number_of_selfloops(g)
    metrics = graph_metrics(graph)
    cc = nx.clustering(g)
    np.testing.assert_allclose(metrics.clustering, [cc[i] for i in range(len(titles))], rtol=0, atol=1e-12)
    tri = nx.triangles(g)
    assert metrics.triangles.tolist() == [tri[i] for i in range(len(titles))]


@pytest.mark.slow  # graph and clustering of all of Wikispeedia (module fixture reads every link)
def test_real_graph_clustering_invariants_and_multi_document_clusters(wikispeedia):
    titles, src, dst, n_words = wikispeedia
    graph = build_graph(src, dst, len(titles))
    metrics = graph_metrics(graph)
    s = 4096
    res = cluster_documents(graph, metrics, n_words, ClusteringConfig(max_tokens=s, tokenizer="whitespace"))
    check_clustering(graph, res, n_words, ClusteringConfig(max_tokens=s))
    in_multi = res.n_members()[res.cluster_of] > 1  # (n_docs,) document shares its cluster
    # Wikispeedia articles are long (median ~2,700 words): those that leave room for a
    # neighbour (<= S/2) are mostly clustered with linked documents
    assert res.n_merged > 1000
    g = graph.to_networkx()
    assert all(nx.is_connected(g.subgraph(res.members_of(c).tolist())) for c in range(res.n_clusters))
    small = n_words <= s // 2
    assert small.sum() > 1000
    assert in_multi[small].mean() > 0.75
    # with a budget of a few median articles, most documents are in multi-document clusters
    wide = cluster_documents(graph, metrics, n_words, ClusteringConfig(max_tokens=4 * s, tokenizer="whitespace"))
    check_clustering(graph, wide, n_words, ClusteringConfig(max_tokens=4 * s))
    assert (wide.n_members()[wide.cluster_of] > 1).mean() > 0.75
    assert wide.n_clusters < len(titles) / 2


@pytest.mark.slow  # graph and clustering of all of Wikispeedia (module fixture reads every link)
def test_real_graph_clustering_independent_of_link_order(wikispeedia):
    titles, src, dst, n_words = wikispeedia
    perm = np.random.default_rng(0).permutation(src.size)
    results = []
    for a, b in ((src, dst), (dst[perm], src[perm])):
        graph = build_graph(a, b, len(titles))
        results.append(cluster_documents(graph, graph_metrics(graph), n_words, ClusteringConfig(max_tokens=4096)))
    assert np.array_equal(results[0].members, results[1].members)
    assert np.array_equal(results[0].indptr, results[1].indptr)
