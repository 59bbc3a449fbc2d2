"""FunnelRAG Algorithm 1: cluster linked documents into coarse retrieval units of ≤ S tokens.

Algorithm 1 (Zhao et al., 2024, "FunnelRAG"), as implemented here, line by line:

1. compute the local clustering coefficient ``cc(d)`` of every document in the undirected
   hyperlink graph (:func:`tasks.corpus.graph.graph_metrics`);
2. sort documents by ``cc`` high → low; ties by degree high → low, then ``doc_id`` low → high
   (the *processing rank*, :attr:`Clustering.rank`);
3. start from singleton clusters ``{d}``;
4. for each document ``d`` in that order (every document is processed, also one that was
   already merged into another cluster):
5.   the candidate clusters are the clusters of ``d``'s linked documents, excluding ``d``'s own
     cluster;
6.   sort them by closeness centrality to ``d`` (below), highest first;
7.   merge each candidate, in that order, into ``d``'s cluster if the merged size stays
     ``≤ S`` tokens (``S = ClusteringConfig.max_tokens``); a candidate that does not fit is
     **skipped and the next one tried** (skip-and-continue, counted in
     :attr:`Clustering.n_skipped`). A cluster's size is the sum of its members' ``n_tokens``.
     Since sizes only grow, at the end no two linked clusters would fit together
     (:func:`check_clustering` verifies this).

Closeness centrality to ``d`` (local measure). Full closeness is ``O(n m)`` and infeasible for
Wikipedia, so closeness is taken inside the 1-hop ego graph ``H`` of ``d`` (``d``, its
``k`` neighbours and all edges among them). In ``H`` a neighbour ``u`` is at distance 1 from
``d`` and from its ``c(d, u)`` common neighbours with ``d`` (the triangle support of edge
``(d, u)``) and at distance 2 from the other ``k - 1 - c(d, u)`` neighbours, so::

    closeness_H(u) = (|H| - 1) / sum_dist = k / (2 k - 1 - c(d, u))

which increases strictly with ``c(d, u)``: neighbours are ranked by ``c(d, u)`` descending,
ties by processing rank ascending. A candidate cluster's closeness is the maximum over its
members adjacent to ``d``; clusters are ordered by their best adjacent member in that
neighbour order (so equal closeness is broken by that member's processing rank).

Documents without links stay singleton clusters (LongRAG drops them; here every document
ends in exactly one cluster). A document longer than ``S`` can never merge: it is its own
cluster. Clusters and their member lists are kept with a document → cluster label array,
O(1) linked-list concatenation and relabelling of the smaller side (small-into-large), so
the run is ``O(m log m + n log n)``; no step scans all clusters.

Local re-clustering (``ClusteringConfig.mode = "local"``, not in the paper): over a published
version, only the clusters where the graph changed are re-run; the others are passed in as
:class:`KeptClusters`, whose members lines 4–5 skip (frozen). The freed documents go through
lines 2–7 unchanged, so the invariant above holds among the freed clusters only
(:func:`check_clustering`). Which clusters are freed: :mod:`tasks.corpus.local_clustering`.

Output order. Member order inside a cluster: when ``d``'s cluster absorbs a candidate, the
candidate's members are appended after the current members (in their own order); so a
cluster reads as its founding document's chain of merges in closeness order. Cluster ids are
dense ``0..n_clusters-1`` in ascending order of the smallest processing rank among their
members.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Sequence

import numba
import numpy as np
import pyarrow as pa

from data_contracts.corpus import CLUSTER_MEMBERS, CLUSTERS, GRAPH_METRICS
from tasks.corpus.graph import CSRGraph, GraphMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusteringConfig:
    """Settings of Algorithm 1.

    max_tokens : cluster size limit ``S`` in tokens of ``tokenizer`` (FunnelRAG: 4K).
    tokenizer : name of the tokenizer the article lengths ``n_tokens`` are counted with
        (:mod:`tasks.corpus.tokenize`); the flow must count with this one.
    mode : ``"full"`` (default, the paper's): Algorithm 1 over every document. ``"local"``: over a
        current version, Algorithm 1 re-runs only where the graph changed and every other cluster
        of that version is kept as is (:mod:`tasks.corpus.local_clustering`); a build without a
        current version, or with ``--no-cache``, runs ``"full"``.
    """

    max_tokens: int = 4096
    tokenizer: str = "t5"
    mode: Literal["full", "local"] = "full"

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"ClusteringConfig.max_tokens must be >= 1, got {self.max_tokens}")
        if self.mode not in ("full", "local"):
            raise ValueError(f"ClusteringConfig.mode must be 'full' or 'local', got {self.mode!r}")


@dataclass(frozen=True, eq=False)
class Clustering:
    """Result of Algorithm 1 over ``n`` documents and ``n_clusters`` clusters.

    Attributes
    ----------
    order : np.ndarray
        ``(n,)`` int32 doc ids in processing order.
    rank : np.ndarray
        ``(n,)`` int32 processing rank of each doc id (inverse of ``order``).
    cluster_of : np.ndarray
        ``(n,)`` int32 cluster id of each doc id.
    indptr : np.ndarray
        ``(n_clusters + 1,)`` int64; members of cluster ``c`` are
        ``members[indptr[c]:indptr[c + 1]]`` in cluster order.
    members : np.ndarray
        ``(n,)`` int32 doc ids grouped by cluster.
    n_tokens : np.ndarray
        ``(n_clusters,)`` int64 cluster sizes in tokens.
    n_merged, n_skipped : int
        Merges done, and candidate clusters skipped because they did not fit in ``S``.
    kept : np.ndarray or None
        ``(n_clusters,)`` bool: the cluster was given as a :class:`KeptClusters` cluster (frozen,
        not re-clustered); None when every cluster came out of Algorithm 1.
    """

    order: np.ndarray
    rank: np.ndarray
    cluster_of: np.ndarray
    indptr: np.ndarray
    members: np.ndarray
    n_tokens: np.ndarray
    n_merged: int
    n_skipped: int
    kept: np.ndarray | None = None

    @property
    def n_clusters(self) -> int:
        return int(self.indptr.size - 1)

    def members_of(self, cluster_id: int) -> np.ndarray:
        """Doc ids of one cluster in cluster order (int32 view)."""
        return self.members[self.indptr[cluster_id]:self.indptr[cluster_id + 1]]

    def n_members(self) -> np.ndarray:
        """``(n_clusters,)`` int32 member counts."""
        return np.diff(self.indptr).astype(np.int32)


@dataclass(frozen=True, eq=False)
class KeptClusters:
    """Clusters that Algorithm 1 takes as given and never touches (``mode: local``).

    Attributes
    ----------
    indptr : np.ndarray
        ``(n_kept + 1,)`` int64; kept cluster ``j`` is ``members[indptr[j]:indptr[j + 1]]``.
    members : np.ndarray
        ``(n_kept_members,)`` int32 doc ids in each cluster's member order; each doc id at most once.
    """

    indptr: np.ndarray
    members: np.ndarray

    @property
    def n_clusters(self) -> int:
        return int(self.indptr.size - 1)


def processing_order(metrics: GraphMetrics) -> np.ndarray:
    """Algorithm 1 line 2: ``(n,)`` int32 doc ids sorted by clustering coefficient desc, then
    degree desc, then doc id asc."""
    n = metrics.degree.size
    ids = np.arange(n, dtype=np.int64)
    return np.lexsort((ids, -metrics.degree.astype(np.int64), -metrics.clustering)).astype(np.int32)


def ego_closeness(graph: CSRGraph, metrics: GraphMetrics, d: int) -> np.ndarray:
    """Closeness centrality of each neighbour of ``d`` inside ``d``'s 1-hop ego graph ``H``.

    ``closeness_H(u) = k / (2k - 1 - c(d, u))`` with ``k = deg(d)`` and ``c(d, u)`` the common
    neighbours of ``d`` and ``u`` (module docstring). Algorithm 1 line 6 ranks by the integer
    ``c(d, u)``, which orders exactly like this value; this function is for inspection/tests.

    Returns
    -------
    np.ndarray
        ``(deg(d),)`` float64, aligned with ``graph.neighbors(d)``.
    """
    k = float(graph.indptr[d + 1] - graph.indptr[d])
    c = metrics.support[graph.indptr[d]:graph.indptr[d + 1]].astype(np.float64)
    return k / (2.0 * k - 1.0 - c)


def cluster_documents(graph: CSRGraph, metrics: GraphMetrics, n_tokens: np.ndarray,
                      cfg: ClusteringConfig, kept: KeptClusters | None = None) -> Clustering:
    """Run FunnelRAG Algorithm 1 (module docstring) on the hyperlink graph.

    With ``kept`` (``mode: local``, :func:`tasks.corpus.local_clustering.cluster_documents_local`),
    the kept clusters are frozen: their members are not processed (line 4) and are never a
    candidate (line 5), so the other, *freed* documents run through lines 3–7 in the same order
    with the same closeness rule and merge only among themselves. The kept clusters come out
    with the same members in the same order; cluster ids are dense over all clusters by the
    smallest processing rank, as in a full run. Nothing is kept (``None`` or no kept cluster):
    exactly the full algorithm.

    Parameters
    ----------
    graph : CSRGraph
        Undirected hyperlink graph over ``n`` documents.
    metrics : GraphMetrics
        ``graph_metrics(graph)``.
    n_tokens : np.ndarray
        ``(n,)`` non-negative article lengths in tokens of ``cfg.tokenizer``.
    cfg : ClusteringConfig
    kept : KeptClusters, optional
        Clusters to keep as they are (doc ids of this graph).

    Returns
    -------
    Clustering
        Every document in exactly one cluster; no cluster over ``cfg.max_tokens`` tokens unless
        it is a single over-long document (a kept cluster is checked too). Deterministic:
        depends only on the edge set, ``n_tokens``, ``cfg`` and ``kept``. ``kept`` marks the kept
        clusters when ``kept`` was given.

    Raises
    ------
    ValueError
        ``n_tokens`` or ``metrics`` do not match the graph's node count or edge count, or
        ``n_tokens`` has a negative entry (names the doc id); a kept member is out of range or
        in two kept clusters, or a kept cluster is empty (names it).
    """
    n = graph.n_nodes
    n_tokens = np.asarray(n_tokens)
    if n_tokens.shape != (n,):
        raise ValueError(f"n_tokens has shape {n_tokens.shape}, expected ({n},) = one length per document")
    if metrics.degree.shape != (n,) or metrics.support.shape != graph.indices.shape:
        raise ValueError("metrics were not computed on this graph (node or edge count differs)")
    if n and n_tokens.min() < 0:
        bad = int(np.flatnonzero(n_tokens < 0)[0])
        raise ValueError(f"n_tokens[{bad}] = {int(n_tokens[bad])} is negative")
    frozen = np.zeros(n, dtype=np.bool_)   # (n,) member of a kept cluster
    if kept is not None:
        _check_kept(kept, n)
        frozen[kept.members] = True
    order = processing_order(metrics)
    rank = np.empty(n, dtype=np.int32)
    rank[order] = np.arange(n, dtype=np.int32)
    tokens64 = n_tokens.astype(np.int64)
    label, head, nxt, size, n_merged, n_skipped = _algorithm1(
        graph.indptr, graph.indices, metrics.support, order, rank, tokens64, np.int64(cfg.max_tokens), frozen)
    if kept is not None:
        _splice_kept(kept, tokens64, label, head, nxt, size)
    cluster_of, indptr, members, sizes = _finalise(order, label, head, nxt, size)
    kept_mask = None
    if kept is not None:
        kept_mask = np.zeros(indptr.size - 1, dtype=np.bool_)
        kept_mask[cluster_of[kept.members[kept.indptr[:-1]]]] = True
    log.info("Algorithm 1: %d documents -> %d clusters (S=%d tokens, %d merges, %d skipped for size%s)",
             n, indptr.size - 1, cfg.max_tokens, n_merged, n_skipped,
             "" if kept is None else f"; {kept.n_clusters} clusters kept, {int(n - frozen.sum())} documents re-clustered")
    return Clustering(order=order, rank=rank, cluster_of=cluster_of, indptr=indptr, members=members,
                      n_tokens=sizes, n_merged=int(n_merged), n_skipped=int(n_skipped), kept=kept_mask)


def _check_kept(kept: KeptClusters, n: int) -> None:
    """Raise ``ValueError`` unless ``kept`` is a set of disjoint, non-empty clusters of doc ids in ``[0, n)``."""
    counts = np.diff(kept.indptr)
    if kept.indptr.size < 1 or kept.indptr[0] != 0 or kept.indptr[-1] != kept.members.size or (counts < 1).any():
        bad = int(np.flatnonzero(counts < 1)[0]) if (counts < 1).any() else -1
        raise ValueError(f"kept clusters: indptr does not cut the members into non-empty clusters (cluster {bad})")
    if kept.members.size and (kept.members.min() < 0 or kept.members.max() >= n):
        raise ValueError(f"kept clusters: a member id is outside [0, {n})")
    times = np.bincount(kept.members, minlength=n)
    if (times > 1).any():
        raise ValueError(f"kept clusters: document {int(np.flatnonzero(times > 1)[0])} is in {int(times.max())} kept clusters")


def _splice_kept(kept: KeptClusters, n_tokens: np.ndarray, label: np.ndarray, head: np.ndarray,
                 nxt: np.ndarray, size: np.ndarray) -> None:
    """Write the kept clusters into Algorithm 1's label / member-list state (in place): their
    members were frozen, so each is still its own singleton there. Label of a kept cluster = its
    first member; its list in the given member order."""
    counts = np.diff(kept.indptr)
    first = kept.members[kept.indptr[:-1]]                  # (n_kept,)
    label[kept.members] = np.repeat(first, counts)
    nxt[kept.members[:-1]] = kept.members[1:]
    nxt[kept.members[kept.indptr[1:] - 1]] = -1              # each cluster's last member ends its list
    head[first] = first
    if first.size:
        size[first] = np.add.reduceat(n_tokens[kept.members], kept.indptr[:-1])


@numba.njit(cache=True, nogil=True)
def _sort_prefix(keys, k):  # pragma: no cover - compiled
    """Sort ``keys[:k]`` (int64) ascending in place: insertion sort up to 16 keys, heapsort beyond.

    Numba's ``ndarray.sort`` (its generic quicksort) took ~2 of the ~4.6 CPU s that compiling
    :func:`_algorithm1` costs on a fresh checkout (``benchmarks/numba_compile.py``); these loops
    compile in a fraction of that. Algorithm 1's keys are distinct (a neighbour's rank is in the
    low bits), so every correct sort gives the same order (``tests/test_clustering.py``).
    """
    if k <= 16:
        for i in range(1, k):
            x = keys[i]
            j = i - 1
            while j >= 0 and keys[j] > x:
                keys[j + 1] = keys[j]
                j -= 1
            keys[j + 1] = x
        return
    n_heapify = k // 2
    for step in range(n_heapify + k - 1):
        if step < n_heapify:                  # build the max-heap bottom up
            pos, size = n_heapify - 1 - step, k
        else:                                 # move the largest left to the end, heap shrinks
            size = k - 1 - (step - n_heapify)
            keys[0], keys[size] = keys[size], keys[0]
            pos = 0
        x = keys[pos]
        while True:                           # sift x down from pos
            child = 2 * pos + 1
            if child >= size:
                break
            if child + 1 < size and keys[child + 1] > keys[child]:
                child += 1
            if keys[child] <= x:
                break
            keys[pos] = keys[child]
            pos = child
        keys[pos] = x


@numba.njit(cache=True, nogil=True)
def _algorithm1(indptr, indices, support, order, rank, n_tokens, max_tokens, frozen):  # pragma: no cover
    n = indptr.size - 1
    label = np.arange(n).astype(np.int32)     # cluster label of each document
    head = np.arange(n).astype(np.int32)      # per label: first member
    tail = np.arange(n).astype(np.int32)      # per label: last member
    nxt = np.full(n, -1, dtype=np.int32)      # member linked list
    count = np.ones(n, dtype=np.int64)        # per label: member count
    size = n_tokens.copy()                    # per label: tokens
    seen = np.full(n, -1, dtype=np.int64)     # per label: step at which it was last a candidate
    max_deg = 0
    for u in range(n):
        max_deg = max(max_deg, indptr[u + 1] - indptr[u])
    keys = np.empty(max_deg, dtype=np.int64)
    n_merged = 0
    n_skipped = 0
    low32 = np.int64(0xFFFFFFFF)
    for step in range(n):
        d = order[step]
        lo = indptr[d]
        k = indptr[d + 1] - lo
        if k == 0 or frozen[d]:          # a kept cluster's member is not processed
            continue
        # line 6: neighbours by closeness k / (2k - 1 - c) desc == c desc, then rank asc
        for i in range(k):
            keys[i] = (np.int64(k - support[lo + i]) << 32) | np.int64(rank[indices[lo + i]])
        _sort_prefix(keys, k)
        ranked = keys[:k]
        seen[label[d]] = step
        for i in range(k):
            u = order[ranked[i] & low32]
            if frozen[u]:                # nor is a kept cluster a candidate
                continue
            c = label[u]
            if seen[c] == step:          # own cluster, or a cluster already considered
                continue
            seen[c] = step
            a = label[d]
            if size[a] + size[c] > max_tokens:
                n_skipped += 1           # line 7: skip and try the next candidate
                continue
            # merge c into d's cluster: list a ++ list c; relabel the smaller side
            head_a, tail_a, head_c, tail_c = head[a], tail[a], head[c], tail[c]
            nxt[tail_a] = head_c
            if count[a] >= count[c]:
                keep, x, stop = a, head_c, tail_c
            else:
                keep, x, stop = c, head_a, tail_a
            while True:
                label[x] = keep
                if x == stop:
                    break
                x = nxt[x]
            head[keep] = head_a
            tail[keep] = tail_c
            count[keep] = count[a] + count[c]
            size[keep] = size[a] + size[c]
            seen[keep] = step
            n_merged += 1
    return label, head, nxt, size, n_merged, n_skipped


@numba.njit(cache=True, nogil=True)
def _finalise(order, label, head, nxt, size):  # pragma: no cover - compiled
    n = order.size
    cid = np.full(n, -1, dtype=np.int32)      # per label: final cluster id
    n_clusters = 0
    for step in range(n):
        lab = label[order[step]]
        if cid[lab] < 0:
            cid[lab] = n_clusters
            n_clusters += 1
    roots = np.empty(n_clusters, dtype=np.int32)
    for lab in range(n):
        if cid[lab] >= 0:
            roots[cid[lab]] = lab
    indptr = np.zeros(n_clusters + 1, dtype=np.int64)
    members = np.empty(n, dtype=np.int32)
    sizes = np.empty(n_clusters, dtype=np.int64)
    cluster_of = np.empty(n, dtype=np.int32)
    pos = 0
    for c in range(n_clusters):
        lab = roots[c]
        sizes[c] = size[lab]
        x = head[lab]
        while x >= 0:
            members[pos] = x
            cluster_of[x] = c
            pos += 1
            x = nxt[x]
        indptr[c + 1] = pos
    return cluster_of, indptr, members, sizes


def check_clustering(graph: CSRGraph, clustering: Clustering, n_tokens: np.ndarray, cfg: ClusteringConfig) -> None:
    """Verify the post-conditions of Algorithm 1 (cheap, ``O(n + m)``; run after every build).

    Checks that every document is in exactly one cluster, cluster sizes are the sums of their
    members' tokens, no cluster exceeds ``cfg.max_tokens`` unless it is one over-long document,
    cluster ids follow the smallest processing rank of their members, and no linked pair of
    clusters would still fit together (what skip-and-continue over every document guarantees,
    since cluster sizes only grow). With kept clusters (``clustering.kept``, ``mode: local``) the
    last check is the invariant that still holds: no two linked *freed* clusters (neither of
    them kept) would fit together; a kept cluster was never a candidate, so it may still fit
    beside a linked neighbour.

    Raises
    ------
    ValueError
        Naming the first violated condition and the offending cluster or document.
    """
    n = graph.n_nodes
    n_tokens = np.asarray(n_tokens, dtype=np.int64)
    c = clustering
    times = np.bincount(c.members, minlength=n) if c.members.size else np.zeros(n, np.int64)
    if c.members.size != n or (times != 1).any():
        bad = int(np.flatnonzero(times != 1)[0])
        raise ValueError(f"document {bad} is in {int(times[bad])} clusters; expected exactly one")
    counts = np.diff(c.indptr)
    owner = np.repeat(np.arange(c.n_clusters, dtype=np.int32), counts)  # (n,) cluster of each member slot
    if not np.array_equal(c.cluster_of[c.members], owner):
        raise ValueError("cluster_of disagrees with the member lists")
    sums = np.bincount(owner, weights=n_tokens[c.members], minlength=c.n_clusters).astype(np.int64)
    if not np.array_equal(sums, c.n_tokens):
        bad = int(np.flatnonzero(sums != c.n_tokens)[0])
        raise ValueError(f"cluster {bad}: n_tokens {int(c.n_tokens[bad])} != sum of its members {int(sums[bad])}")
    over = np.flatnonzero((c.n_tokens > cfg.max_tokens) & (counts > 1))
    if over.size:
        raise ValueError(f"cluster {int(over[0])} has {int(c.n_tokens[over[0]])} tokens > S = {cfg.max_tokens} "
                         f"with {int(counts[over[0]])} members")
    first_rank = np.full(c.n_clusters, n, dtype=np.int64)
    np.minimum.at(first_rank, owner, c.rank[c.members])
    if (np.diff(first_rank) <= 0).any():
        raise ValueError("cluster ids are not ordered by the smallest processing rank of their members")
    u, v = graph.edge_list()
    cu, cv = c.cluster_of[u], c.cluster_of[v]
    fits = (cu != cv) & (c.n_tokens[cu] + c.n_tokens[cv] <= cfg.max_tokens)
    if c.kept is not None:
        fits &= ~(c.kept[cu] | c.kept[cv])
    if fits.any():
        i = int(np.flatnonzero(fits)[0])
        freed = "" if c.kept is None else "freed "
        raise ValueError(f"linked documents {int(u[i])} and {int(v[i])} are in {freed}clusters {int(cu[i])} and {int(cv[i])} "
                         f"that would still fit together in S = {cfg.max_tokens} tokens")


# ---------------------------------------------------------------------- contract tables
def _published_ids(doc_ids: np.ndarray | None, n: int) -> np.ndarray:
    """The published ``doc_id`` of each of the ``n`` document rows (``doc_ids``; ``None``: the rows)."""
    if doc_ids is None:
        return np.arange(n, dtype=np.int64)
    doc_ids = np.asarray(doc_ids)
    if doc_ids.shape != (n,):
        raise ValueError(f"{doc_ids.shape[0]} doc ids for {n} documents")
    return doc_ids


def graph_metrics_table(metrics: GraphMetrics, n_tokens: np.ndarray, clustering: Clustering,
                        doc_ids: np.ndarray | None = None) -> pa.Table:
    """The ``graph_metrics.parquet`` table (:data:`data_contracts.corpus.GRAPH_METRICS`), one row
    per document in row order (``documents.parquet``'s), with the Algorithm 1 processing rank in
    ``order``; ``doc_ids`` ``(n,)``: the documents' published ids (default: the rows)."""
    n = metrics.degree.size
    table = pa.table({
        "doc_id": pa.array(_published_ids(doc_ids, n)),
        "degree": pa.array(metrics.degree.astype(np.int32)),
        "triangles": pa.array(metrics.triangles.astype(np.int64)),
        "clustering_coefficient": pa.array(metrics.clustering.astype(np.float64)),
        "n_tokens": pa.array(np.asarray(n_tokens).astype(np.int32)),
        "order": pa.array(clustering.rank.astype(np.int32)),
    })
    return GRAPH_METRICS.validate(table)


def clusters_table(clustering: Clustering, titles: Sequence[str] | pa.Array | pa.ChunkedArray,
                   doc_ids: np.ndarray | None = None) -> pa.Table:
    """The ``clusters.parquet`` table (:data:`data_contracts.corpus.CLUSTERS`): one row per
    cluster in Algorithm 1's order; ``cluster_id`` is the ``doc_id`` of the cluster's first member
    (its anchor: Algorithm 1's seed), ``title`` that member's title.

    Parameters
    ----------
    titles : sequence of str
        ``(n,)`` document titles by document row.
    doc_ids : ``(n,)`` int, optional
        The documents' published ids by row (default: the rows).
    """
    titles = titles if isinstance(titles, (pa.Array, pa.ChunkedArray)) else pa.array(list(titles), pa.string())
    first = clustering.members[clustering.indptr[:-1]]  # (n_clusters,) first member of each cluster
    table = pa.table({
        "cluster_id": pa.array(_published_ids(doc_ids, len(titles))[first]),
        "n_members": pa.array(clustering.n_members()),
        "n_tokens": pa.array(clustering.n_tokens.astype(np.int32)),
        "title": titles.take(pa.array(first)),
    })
    return CLUSTERS.validate(table)


def cluster_members_table(clustering: Clustering, doc_ids: np.ndarray | None = None) -> pa.Table:
    """The ``cluster_members.parquet`` table (:data:`data_contracts.corpus.CLUSTER_MEMBERS`):
    rows in (cluster in Algorithm 1's order, position) order, ``position`` = index inside the
    cluster, ``cluster_id`` its first member's ``doc_id``; ``doc_ids`` ``(n,)``: the documents'
    published ids by row (default: the rows)."""
    counts = np.diff(clustering.indptr)
    ids = _published_ids(doc_ids, clustering.members.size)
    cluster_id = np.repeat(ids[clustering.members[clustering.indptr[:-1]]], counts)
    position = np.arange(clustering.members.size, dtype=np.int64) - np.repeat(clustering.indptr[:-1], counts)
    table = pa.table({
        "cluster_id": pa.array(cluster_id),
        "position": pa.array(position.astype(np.int32)),
        "doc_id": pa.array(ids[clustering.members]),
    })
    return CLUSTER_MEMBERS.validate(table)
