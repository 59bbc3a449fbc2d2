"""Algorithm 1 re-run only where the hyperlink graph changed (``clustering.mode: local``).

Not in FunnelRAG: an option of the nightly build, which otherwise regroups most clusters after a
1% day (``clusters_unchanged`` of :func:`tasks.corpus.survival.id_survival`). The paper's full
algorithm stays the default and is what a build without a current version runs.

Where the graph changed. Documents are matched between the previous version and this build by
title (Algorithm 1 runs on the rows in title order, which shift). Algorithm 1 reads nothing but the
undirected edge set and each document's length ``n_tokens``. A document of this build is
*touched* when

1. it is new (its title is not in the previous version), or
2. its ``n_tokens`` changed (a text edit that keeps the token count moves nothing Algorithm 1
   reads), or
3. it is an end of an *added* edge whose ends were in different previous clusters (or one end is
   new): the two sides may now merge.

A previous cluster is *freed* when one of its members is touched or was removed, or when an edge
between two of its members was removed (it may no longer be connected). Every other previous
cluster is *kept*: same members in the same order (so its units and passages keep their content
ids, and its ``cluster_id``, its first member's ``doc_id``). A kept cluster is
still one Algorithm 1 could make: connected by its old edges, its size unchanged and ≤ S. An edge
removed between two different clusters frees neither (it only takes away a merge), nor does an
edge added inside one cluster.

The *freed documents* are the members of freed clusters that are still here plus the new
documents. Algorithm 1 (:func:`tasks.corpus.clustering.cluster_documents`, the one
implementation) then runs with the kept clusters frozen: the freed documents in the processing
order of this build's graph, the same closeness rule, merging only among freed clusters, ≤ S
tokens. Invariant: no two linked freed clusters would fit together in S
(:func:`tasks.corpus.clustering.check_clustering`). Everything freed (no cluster kept): exactly
the full algorithm. Deterministic: same inputs and same previous version → same clusters.

Nothing here imports Prefect.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import corpus as C
from tasks.corpus.clustering import Clustering, ClusteringConfig, KeptClusters, cluster_documents
from tasks.corpus.graph import CSRGraph, GraphMetrics, graph_from_links

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class PreviousClusters:
    """What Algorithm 1 saw and made in the previous version (doc ids of that version).

    Attributes
    ----------
    titles : pa.Array
        ``(n_prev,)`` string, the title of each previous doc id.
    n_tokens : np.ndarray
        ``(n_prev,)`` int64 article lengths Algorithm 1 read.
    graph : CSRGraph
        The previous undirected hyperlink graph.
    indptr : np.ndarray
        ``(n_prev_clusters + 1,)`` int64 cluster boundaries in ``members``.
    members : np.ndarray
        ``(n_prev,)`` int32 previous doc ids grouped by cluster, in member order.
    max_tokens : int
        The ``S`` it was built with.
    tokenizer : str
        The tokenizer its ``n_tokens`` were counted with.
    """

    titles: pa.Array
    n_tokens: np.ndarray
    graph: CSRGraph
    indptr: np.ndarray
    members: np.ndarray
    max_tokens: int
    tokenizer: str

    @classmethod
    def read(cls, version_dir: Path) -> "PreviousClusters":
        """Read a published version's documents (titles), graph metrics (lengths), links,
        cluster members and its manifest's ``clustering`` section.

        Raises
        ------
        FileNotFoundError
            A table or the manifest is missing.
        ValueError
            A table breaks its contract, or the manifest lacks the clustering section (names the file).
        """
        manifest_path = Path(version_dir) / "manifest.json"
        section = C.BUILD_CONFIG.section(json.loads(manifest_path.read_text()), "clustering", manifest_path)
        docs = C.DOCUMENTS.read(version_dir, columns=["doc_id", "title"])   # title order: the rows Algorithm 1 ran on
        n = docs.num_rows
        doc_ids = docs["doc_id"].to_numpy()
        metrics = C.GRAPH_METRICS.read(version_dir, columns=["doc_id", "n_tokens"])
        members = C.CLUSTER_MEMBERS.read(version_dir)
        members = members.take(C.member_order(members["cluster_id"].to_numpy(), members["position"].to_numpy()))
        if metrics.num_rows != n or members.num_rows != n:
            raise ValueError(f"{version_dir}: {n} documents but {metrics.num_rows} graph_metrics rows and "
                             f"{members.num_rows} cluster_members rows")
        cids = members["cluster_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1]]) if n else np.zeros(0, np.int64)
        n_tokens = np.zeros(n, np.int64)
        n_tokens[C.rows_of(doc_ids, metrics["doc_id"].to_numpy(), f"{version_dir}: graph_metrics")] = metrics["n_tokens"].to_numpy()
        return cls(titles=docs["title"].combine_chunks(), n_tokens=n_tokens,
                   graph=graph_from_links(C.LINKS.read(version_dir), n, doc_ids),
                   indptr=np.r_[starts, n].astype(np.int64),
                   members=C.rows_of(doc_ids, members["doc_id"].to_numpy(), f"{version_dir}: cluster_members").astype(np.int32),
                   max_tokens=int(section["max_tokens"]), tokenizer=str(section["tokenizer"]))


@dataclass(frozen=True, eq=False)
class GraphChange:
    """Where this build's graph differs from the previous version's (module docstring).

    Attributes
    ----------
    previous_of : np.ndarray
        ``(n,)`` int64 previous doc id of each doc id of this build, ``-1`` for a new document.
    touched : np.ndarray
        ``(n,)`` bool: new, changed length, or an end of an edge added between two clusters.
    kept : KeptClusters
        The previous clusters with no touched or removed member and no removed inner edge, in
        doc ids of this build.
    n_new, n_removed, n_length_changed, n_edges_changed : int
        New and removed documents, documents whose ``n_tokens`` changed, undirected edges
        added or removed (between documents present in both versions, or to a new or removed one).
    """

    previous_of: np.ndarray
    touched: np.ndarray
    kept: KeptClusters
    n_new: int
    n_removed: int
    n_length_changed: int
    n_edges_changed: int

    def summary(self) -> dict[str, int]:
        """Counts for a build summary."""
        n_kept_docs = int(self.kept.members.size)
        return {"local_kept_clusters": self.kept.n_clusters, "local_freed_documents": int(self.touched.size) - n_kept_docs,
                "local_touched_documents": int(self.touched.sum()), "local_new_documents": self.n_new,
                "local_removed_documents": self.n_removed, "local_length_changed": self.n_length_changed,
                "local_edges_changed": self.n_edges_changed}


def _edge_keys(u: np.ndarray, v: np.ndarray, n: int) -> np.ndarray:
    """``(m,)`` int64 key of each undirected pair (order-free), ids in ``[0, n)``."""
    lo, hi = np.minimum(u, v).astype(np.int64), np.maximum(u, v).astype(np.int64)
    return lo * max(n, 1) + hi


def graph_change(titles: pa.Array | pa.ChunkedArray, graph: CSRGraph, n_tokens: np.ndarray,
                 previous: PreviousClusters) -> GraphChange:
    """Touched documents and kept clusters of this build against ``previous`` (module docstring).

    Parameters
    ----------
    titles : pa.Array
        ``(n,)`` titles of this build's doc ids (unique).
    graph : CSRGraph
        This build's undirected graph over ``n`` documents.
    n_tokens : np.ndarray
        ``(n,)`` this build's article lengths.
    previous : PreviousClusters

    Returns
    -------
    GraphChange
        ``O((n + m) log (n + m))``: one title lookup, one sort of each edge list.

    Raises
    ------
    ValueError
        ``titles`` or ``n_tokens`` do not have one entry per node of ``graph``.
    """
    n, n_prev = graph.n_nodes, len(previous.titles)
    if len(titles) != n or np.asarray(n_tokens).shape != (n,):
        raise ValueError(f"graph_change: {len(titles)} titles and {np.asarray(n_tokens).shape} lengths for {n} documents")
    found = pc.index_in(titles, value_set=previous.titles)
    previous_of = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)      # (n,)
    now_of = np.full(n_prev, -1, dtype=np.int64)                                             # (n_prev,)
    here = previous_of >= 0
    now_of[previous_of[here]] = np.flatnonzero(here)
    touched = ~here
    lengths = np.zeros(n, dtype=bool)
    lengths[here] = np.asarray(n_tokens, dtype=np.int64)[here] != previous.n_tokens[previous_of[here]]
    touched |= lengths
    # edges in previous ids; an edge with a new (or removed) endpoint cannot be in the other list
    u, v = graph.edge_list()
    pu, pv = previous_of[u], previous_of[v]
    both = (pu >= 0) & (pv >= 0)
    now_keys = _edge_keys(pu[both], pv[both], n_prev)
    qu, qv = previous.graph.edge_list()
    kept_ends = (now_of[qu] >= 0) & (now_of[qv] >= 0)
    prev_keys = _edge_keys(qu[kept_ends], qv[kept_ends], n_prev)
    added = ~np.isin(now_keys, prev_keys)
    gone = ~np.isin(prev_keys, now_keys)
    counts = np.diff(previous.indptr)
    cluster_of_prev = np.empty(n_prev, dtype=np.int64)                                      # (n_prev,)
    cluster_of_prev[previous.members] = np.repeat(np.arange(counts.size), counts)
    au, av = u[both][added], v[both][added]
    across = cluster_of_prev[previous_of[au]] != cluster_of_prev[previous_of[av]]
    touched[u[~both]] = True                       # an edge to a new document: both ends
    touched[v[~both]] = True
    touched[au[across]] = True                     # an edge added between two clusters: both ends
    touched[av[across]] = True
    ru, rv = qu[kept_ends][gone], qv[kept_ends][gone]
    inside = cluster_of_prev[ru] == cluster_of_prev[rv]
    # kept clusters: no member touched or removed, no edge between two members removed
    member_now = now_of[previous.members]                                                   # (n_prev,)
    bad = (member_now < 0) | touched[np.maximum(member_now, 0)]
    freed = np.add.reduceat(bad.astype(np.int64), previous.indptr[:-1]) > 0 if counts.size else np.zeros(0, bool)
    freed[cluster_of_prev[ru[inside]]] = True
    keep_rows = np.repeat(~freed, counts)
    kept = KeptClusters(indptr=np.r_[0, np.cumsum(counts[~freed])].astype(np.int64),
                        members=member_now[keep_rows].astype(np.int32))
    return GraphChange(previous_of=previous_of, touched=touched, kept=kept, n_new=int((~here).sum()),
                       n_removed=int((now_of < 0).sum()), n_length_changed=int(lengths.sum()),
                       n_edges_changed=int((~both).sum() + added.sum() + (~kept_ends).sum() + gone.sum()))


def cluster_documents_local(graph: CSRGraph, metrics: GraphMetrics, n_tokens: np.ndarray,
                            titles: pa.Array | pa.ChunkedArray, cfg: ClusteringConfig,
                            previous: PreviousClusters) -> tuple[Clustering, GraphChange]:
    """Algorithm 1 only where the graph changed since ``previous`` (module docstring).

    Parameters
    ----------
    graph, metrics, n_tokens, cfg
        As :func:`tasks.corpus.clustering.cluster_documents`.
    titles : pa.Array
        ``(n,)`` titles of this build's doc ids.
    previous : PreviousClusters
        The previous version, built with the same ``S`` and tokenizer.

    Returns
    -------
    (Clustering, GraphChange)
        The clustering (its ``kept`` marks the kept clusters) and what changed.

    Raises
    ------
    ValueError
        ``previous`` was built with another ``S`` or tokenizer (its lengths and bound do not
        apply: run the full algorithm), or as :func:`graph_change` and
        :func:`tasks.corpus.clustering.cluster_documents`.
    """
    if (previous.max_tokens, previous.tokenizer) != (cfg.max_tokens, cfg.tokenizer):
        raise ValueError(f"the previous version was clustered with S = {previous.max_tokens} ({previous.tokenizer}), "
                         f"this build asks S = {cfg.max_tokens} ({cfg.tokenizer}): local re-clustering needs the same")
    change = graph_change(titles, graph, n_tokens, previous)
    clustering = cluster_documents(graph, metrics, n_tokens, cfg, kept=change.kept)
    log.info("local Algorithm 1: %d of %d previous clusters kept; %d documents touched (%d new, %d removed, "
             "%d lengths, %d edges changed)", change.kept.n_clusters, previous.indptr.size - 1, int(change.touched.sum()),
             change.n_new, change.n_removed, change.n_length_changed, change.n_edges_changed)
    return clustering, change
