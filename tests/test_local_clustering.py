"""Algorithm 1 re-run only where the graph changed (tasks.corpus.local_clustering): kept clusters,
freed clusters, the invariant among freed clusters, and equality with the full algorithm."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.corpus.clustering import (Clustering, ClusteringConfig, KeptClusters, check_clustering,
                                     cluster_documents)
from tasks.corpus.graph import CSRGraph, build_graph, graph_metrics
from tasks.corpus.local_clustering import PreviousClusters, cluster_documents_local


def version(pages: dict[str, int], links: list[tuple[str, str]]) -> tuple[pa.Array, CSRGraph, np.ndarray]:
    """Titles (sorted: doc_id = rank of the title), graph and lengths of one corpus version."""
    titles = sorted(pages)
    rank = {t: i for i, t in enumerate(titles)}
    src = np.array([rank[a] for a, _ in links], dtype=np.int64)
    dst = np.array([rank[b] for _, b in links], dtype=np.int64)
    return pa.array(titles), build_graph(src, dst, len(titles)), np.array([pages[t] for t in titles], dtype=np.int64)


def full(pages, links, max_tokens) -> tuple[pa.Array, CSRGraph, np.ndarray, Clustering]:
    titles, graph, tokens = version(pages, links)
    return titles, graph, tokens, cluster_documents(graph, graph_metrics(graph), tokens, ClusteringConfig(max_tokens=max_tokens))


def previous_of(pages, links, max_tokens) -> tuple[PreviousClusters, Clustering]:
    titles, graph, tokens, res = full(pages, links, max_tokens)
    return PreviousClusters(titles=titles, n_tokens=tokens, graph=graph, indptr=res.indptr, members=res.members,
                            max_tokens=max_tokens, tokenizer="t5"), res


def local(pages, links, previous: PreviousClusters, max_tokens):
    titles, graph, tokens = version(pages, links)
    res, change = cluster_documents_local(graph, graph_metrics(graph), tokens, titles,
                                          ClusteringConfig(max_tokens=max_tokens, mode="local"), previous)
    check_clustering(graph, res, tokens, ClusteringConfig(max_tokens=max_tokens))
    return titles, graph, tokens, res, change


def named_clusters(titles: pa.Array, res: Clustering) -> list[tuple[str, ...]]:
    """Each cluster's member titles in member order, by cluster id."""
    t = titles.to_pylist()
    return [tuple(t[d] for d in res.members_of(c).tolist()) for c in range(res.n_clusters)]


ARRAYS = ("order", "rank", "cluster_of", "indptr", "members", "n_tokens")


def same(a: Clustering, b: Clustering, counts: bool = True) -> bool:
    """Equal clusterings; ``counts``: also the same merges and skips (a run that keeps every
    cluster merges nothing)."""
    arrays = all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ARRAYS)
    return arrays and (not counts or (a.n_merged, a.n_skipped) == (b.n_merged, b.n_skipped))


# two triangles joined by a path; S leaves room for two documents per cluster
PAGES = {f"p{i}": 100 for i in range(8)}
LINKS = [("p0", "p1"), ("p1", "p2"), ("p2", "p0"), ("p2", "p3"), ("p3", "p4"), ("p4", "p5"),
         ("p5", "p6"), ("p6", "p7"), ("p7", "p5")]


def test_unchanged_graph_keeps_every_cluster():
    prev, res_prev = previous_of(PAGES, LINKS, 250)
    titles, _, _, res, change = local(PAGES, LINKS, prev, 250)
    assert change.kept.n_clusters == res_prev.n_clusters and not change.touched.any()
    assert res.kept.all() and same(res, res_prev, counts=False)


def test_one_edge_change_frees_only_the_touched_clusters():
    prev, res_prev = previous_of(PAGES, LINKS, 250)
    before = named_clusters(prev.titles, res_prev)
    titles, _, _, res, change = local(PAGES, LINKS + [("p0", "p7")], prev, 250)
    touched = {titles[i].as_py() for i in np.flatnonzero(change.touched)}
    assert touched == {"p0", "p7"}
    freed_before = [c for c in before if set(c) & touched]
    after = named_clusters(titles, res)
    kept_after = [c for c, k in zip(after, res.kept.tolist()) if k]
    assert sorted(kept_after) == sorted(c for c in before if c not in freed_before)   # same members, same order
    assert len(freed_before) == 2 and change.kept.n_clusters == len(before) - 2
    assert change.n_edges_changed == 1 and change.n_new == change.n_removed == change.n_length_changed == 0


def test_a_length_change_or_a_removed_page_frees_its_cluster_only():
    prev, res_prev = previous_of(PAGES, LINKS, 250)   # clusters (p0 p1) (p6 p7) (p2 p3) (p5 p4)
    pages = {**PAGES, "p3": 130}
    titles, _, _, res, change = local(pages, LINKS, prev, 250)
    assert [titles[i].as_py() for i in np.flatnonzero(change.touched)] == ["p3"] and change.n_length_changed == 1
    assert sorted(c for c, k in zip(named_clusters(titles, res), res.kept.tolist()) if k) == [("p0", "p1"), ("p5", "p4"), ("p6", "p7")]
    pages = {t: v for t, v in PAGES.items() if t != "p4"}
    links = [(a, b) for a, b in LINKS if "p4" not in (a, b)]
    titles, _, _, res, change = local(pages, links, prev, 250)
    assert not change.touched.any() and change.n_removed == 1 and change.n_edges_changed == 2
    assert sorted(c for c, k in zip(named_clusters(titles, res), res.kept.tolist()) if k) == [("p0", "p1"), ("p2", "p3"), ("p6", "p7")]
    assert sorted(res.members.tolist()) == list(range(7))


def test_a_removed_edge_frees_its_cluster_when_inside_it_and_nothing_when_across():
    prev, _ = previous_of(PAGES, LINKS, 250)
    inside = [e for e in LINKS if e != ("p0", "p1")]                # p0 p1 no longer linked directly
    titles, _, _, res, change = local(PAGES, inside, prev, 250)
    assert not change.touched.any() and change.kept.n_clusters == 3
    assert ("p0", "p1") not in [c for c, k in zip(named_clusters(titles, res), res.kept.tolist()) if k]
    across = [e for e in LINKS if e != ("p3", "p4")]                # between (p2 p3) and (p5 p4)
    titles, _, _, res, change = local(PAGES, across, prev, 250)
    assert not change.touched.any() and change.kept.n_clusters == 4 and res.kept.all()


def test_new_pages_shift_doc_ids_but_kept_clusters_keep_their_titles():
    prev, res_prev = previous_of(PAGES, LINKS, 250)
    pages = {"a-new": 50, **PAGES}                   # sorts first: every doc_id moves by one
    titles, _, _, res, change = local(pages, LINKS + [("a-new", "p6")], prev, 250)
    assert change.n_new == 1 and change.previous_of[0] == -1
    before = set(named_clusters(prev.titles, res_prev))
    kept_after = {c for c, k in zip(named_clusters(titles, res), res.kept.tolist()) if k}
    assert kept_after and kept_after <= before
    assert not any("p6" in c for c in kept_after)


def test_everything_freed_equals_the_full_algorithm():
    prev, _ = previous_of(PAGES, LINKS, 250)
    pages = {t: v + 1 for t, v in PAGES.items()}     # every length changed: nothing kept
    titles, graph, tokens, res, change = local(pages, LINKS, prev, 250)
    assert change.kept.n_clusters == 0
    assert same(res, cluster_documents(graph, graph_metrics(graph), tokens, ClusteringConfig(max_tokens=250)))


def test_other_s_is_refused():
    prev, _ = previous_of(PAGES, LINKS, 250)
    titles, graph, tokens = version(PAGES, LINKS)
    with pytest.raises(ValueError, match="S = 250"):
        cluster_documents_local(graph, graph_metrics(graph), tokens, titles, ClusteringConfig(max_tokens=300), prev)


def test_bad_kept_clusters_are_refused():
    graph = build_graph(np.array([0, 1]), np.array([1, 2]), 3)
    metrics, tokens, cfg = graph_metrics(graph), np.ones(3, np.int64), ClusteringConfig(max_tokens=10)
    with pytest.raises(ValueError, match="document 1 is in 2 kept clusters"):
        cluster_documents(graph, metrics, tokens, cfg, KeptClusters(np.array([0, 2, 3]), np.array([0, 1, 1], np.int32)))
    with pytest.raises(ValueError, match="outside"):
        cluster_documents(graph, metrics, tokens, cfg, KeptClusters(np.array([0, 1]), np.array([5], np.int32)))
    with pytest.raises(ValueError, match="non-empty"):
        cluster_documents(graph, metrics, tokens, cfg, KeptClusters(np.array([0, 0, 1]), np.array([0], np.int32)))


def test_check_clustering_holds_freed_clusters_only_to_the_invariant():
    # path 0-1-2, S = 300: kept {0}, freed 1 and 2 merge; {0} would fit beside {1, 2} (kept: allowed)
    graph = build_graph(np.array([0, 1]), np.array([1, 2]), 3)
    tokens, cfg = np.array([100, 100, 100]), ClusteringConfig(max_tokens=300)
    res = cluster_documents(graph, graph_metrics(graph), tokens, cfg, KeptClusters(np.array([0, 1]), np.array([0], np.int32)))
    assert [res.members_of(c).tolist() for c in range(res.n_clusters)] == [[1, 2], [0]]
    assert res.kept.tolist() == [False, True]
    check_clustering(graph, res, tokens, cfg)
    with pytest.raises(ValueError, match="would still fit together"):   # as a full clustering it breaks the invariant
        check_clustering(graph, Clustering(**{k: getattr(res, k) for k in (*ARRAYS, "n_merged", "n_skipped")}), tokens, cfg)
    # two linked freed singletons that would fit are caught
    split = Clustering(order=res.order, rank=res.rank, cluster_of=np.array([1, 0, 2], np.int32),
                       indptr=np.array([0, 1, 2, 3]), members=np.array([1, 0, 2], np.int32),
                       n_tokens=np.array([100, 100, 100]), n_merged=0, n_skipped=0, kept=np.array([False, True, False]))
    with pytest.raises(ValueError, match="freed clusters 0 and 2"):
        check_clustering(graph, split, tokens, cfg)


edits = st.integers(2, 30).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=80),    # links of night 1
    st.lists(st.integers(0, 300), min_size=n, max_size=n),                              # lengths of night 1
    st.integers(1, 600),                                                                # S
    st.lists(st.tuples(st.integers(0, n + 2), st.integers(0, n + 2)), max_size=6),      # links added (n.. = new pages)
    st.lists(st.integers(0, 79), max_size=6),                                           # links removed (indexes)
    st.lists(st.integers(0, n - 1), max_size=3),                                        # lengths changed
    st.lists(st.integers(0, n - 1), max_size=2)))                                       # pages removed


def night_two(case):
    n, links, tokens, s, added, removed, lengths, gone = case
    pages1 = {f"t{i:03d}": tokens[i] for i in range(n)}
    links1 = [(f"t{a:03d}", f"t{b:03d}") for a, b in links]
    pages2 = {**pages1, **{f"t{i:03d}": pages1[f"t{i:03d}"] + 7 for i in lengths},
              **{f"t{i:03d}x": 40 for i in range(n, n + 3)}}   # new titles sort between the old ones
    name = {i: f"t{i:03d}" if i < n else f"t{i:03d}x" for i in range(n + 3)}
    drop = {links1[i] for i in removed if i < len(links1)}
    links2 = [e for e in links1 if e not in drop] + [(name[a], name[b]) for a, b in added]
    for i in gone:
        pages2.pop(f"t{i:03d}", None)
    links2 = [(a, b) for a, b in links2 if a in pages2 and b in pages2]
    return (pages1, links1), (pages2, links2), s


@settings(max_examples=120, deadline=None)
@given(edits)
def test_local_clustering_is_a_partition_within_s_that_keeps_untouched_clusters(case):
    (pages1, links1), (pages2, links2), s = night_two(case)
    prev, res_prev = previous_of(pages1, links1, s)
    titles, graph, tokens, res, change = local(pages2, links2, prev, s)     # check_clustering: partition, <= S, invariant
    assert sorted(res.members.tolist()) == list(range(len(pages2)))
    before = named_clusters(prev.titles, res_prev)
    after = named_clusters(titles, res)
    touched = {titles[i].as_py() for i in np.flatnonzero(change.touched)}
    edges1, edges2 = ({frozenset(e) for e in links if e[0] != e[1]} for links in (links1, links2))
    home = {t: i for i, c in enumerate(before) for t in c}
    joined = {t for e in edges2 - edges1 for t in e if any(x not in home for x in e) or len({home[x] for x in e}) > 1}
    assert touched == {t for t in pages2 if t not in pages1 or pages2[t] != pages1[t]} | joined
    cut = [c for c in before for a, b in links1 if a != b and a in c and b in c and frozenset((a, b)) not in edges2]
    untouched = [c for c in before if not set(c) & touched and all(t in pages2 for t in c) and c not in cut]
    assert sorted(c for c, k in zip(after, res.kept.tolist()) if k) == sorted(untouched)
    again = local(pages2, links2, prev, s)[3]                                # deterministic
    assert same(res, again) and np.array_equal(res.kept, again.kept)
    if pages1 == pages2 and sorted(map(sorted, links1)) == sorted(map(sorted, links2)):
        assert same(res, res_prev, counts=False)


@settings(max_examples=60, deadline=None)
@given(edits)
def test_nothing_kept_is_the_full_algorithm(case):
    _, (pages2, links2), s = night_two(case)
    titles, graph, tokens = version(pages2, links2)
    metrics, cfg = graph_metrics(graph), ClusteringConfig(max_tokens=s)
    none_kept = cluster_documents(graph, metrics, tokens, cfg, KeptClusters(np.zeros(1, np.int64), np.zeros(0, np.int32)))
    assert same(none_kept, cluster_documents(graph, metrics, tokens, cfg)) and not none_kept.kept.any()


# ---------------------------------------------------------------- the cluster stage over directories
def _stage_dirs(root, name: str, pages: dict[str, int], links: list[tuple[str, str]]):
    """An ingest directory (documents, links) and a tokens directory (one window per article of
    ``pages[title]`` tokens) for :func:`tasks.corpus.stages.run_cluster`."""
    from data_contracts import corpus as C  # noqa: PLC0415  (these stage tests only)

    titles = sorted(pages)
    rank = {t: i for i, t in enumerate(titles)}
    ingest, tokens = root / name / "ingest", root / name / "tokens"
    C.DOCUMENTS.write(pa.table({"doc_id": pa.array(range(len(titles)), pa.int32()), "title": titles,
                                "text": [f"text of {t}" for t in titles], "page_id": pa.array([None] * len(titles), pa.int64()),
                                "source": ["x"] * len(titles)}), ingest)
    pairs = sorted({(rank[a], rank[b]) for a, b in links})
    C.LINKS.write(pa.table({"src_doc_id": pa.array([a for a, _ in pairs], pa.int32()),
                            "dst_doc_id": pa.array([b for _, b in pairs], pa.int32())}), ingest)
    C.WINDOW_TOKENS.write(pa.table({"doc_id": pa.array(range(len(titles)), pa.int32()),
                                    "n_tokens": pa.array([[pages[t]] for t in titles], pa.list_(pa.field("item", pa.int32(), nullable=False))),
                                    "tokenizer": ["t5"] * len(titles)}), tokens)
    return ingest, tokens


def _publish_like(ingest, cluster_dir, max_tokens: int) -> None:
    """What :func:`tasks.corpus.local_clustering.PreviousClusters.read` reads of a published version."""
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from data_contracts import corpus as C  # noqa: PLC0415  (these stage tests only)

    for f in ("documents.parquet", "links.parquet"):
        shutil.copy(ingest / f, cluster_dir / f)
    config = {"ingest": {"format": "x"}, "clustering": {"max_tokens": max_tokens, "tokenizer": "t5"},
              "segment": {"passage_words": 100, "unit_max_tokens": 1000, "tokenizer": "t5"}, "bm25": {"k1": 1.5, "b": 0.75}}
    (cluster_dir / "manifest.json").write_text(json.dumps(C.BUILD_CONFIG.stamp(config)))


def test_cluster_stage_runs_local_over_a_previous_version_and_full_without_one(tmp_path):
    from data_contracts import corpus as C  # noqa: PLC0415  (these stage tests only)
    from tasks.corpus.stages import run_cluster  # noqa: PLC0415

    local_cfg = ClusteringConfig(max_tokens=250, mode="local")
    ingest1, tokens1 = _stage_dirs(tmp_path, "night1", PAGES, LINKS)
    first = run_cluster(ingest1, tokens1, tmp_path / "v1", local_cfg)              # no previous version: full
    assert first["clustering_local"] == 0
    _publish_like(ingest1, tmp_path / "v1", 250)
    ingest2, tokens2 = _stage_dirs(tmp_path, "night2", PAGES, LINKS + [("p0", "p7")])
    second = run_cluster(ingest2, tokens2, tmp_path / "v2", local_cfg, previous_dir=tmp_path / "v1")
    assert second["clustering_local"] == 1 and second["local_kept_clusters"] == first["clusters"] - 2
    assert second["local_touched_documents"] == 2 and second["local_edges_changed"] == 1
    run_cluster(ingest2, tokens2, tmp_path / "v2b", local_cfg, previous_dir=tmp_path / "v1")
    for contract in (C.CLUSTERS, C.CLUSTER_MEMBERS, C.GRAPH_METRICS):                # deterministic: same bytes
        assert (tmp_path / "v2" / contract.filename).read_bytes() == (tmp_path / "v2b" / contract.filename).read_bytes()
    full = run_cluster(ingest2, tokens2, tmp_path / "v2f", ClusteringConfig(max_tokens=250), previous_dir=tmp_path / "v1")
    assert "clustering_local" not in full                                          # mode full ignores the previous version
    other_s = run_cluster(ingest2, tokens2, tmp_path / "v2s", ClusteringConfig(max_tokens=300, mode="local"),
                          previous_dir=tmp_path / "v1")
    assert other_s["clustering_local"] == 0                                        # built with another S: full


def test_mode_is_checked():
    with pytest.raises(ValueError, match="'full' or 'local'"):
        ClusteringConfig(mode="partial")
