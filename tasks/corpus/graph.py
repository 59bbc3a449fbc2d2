"""The article hyperlink graph as compact CSR arrays, and its triangle metrics.

FunnelRAG (Zhao et al., 2024), Algorithm 1 orders documents by their *local clustering
coefficient* in the hyperlink graph. Full English Wikipedia has ~7M articles and 80–170M links:
networkx needs ~300 bytes per edge and ``nx.clustering`` runs for hours there, so the graph is
held as two int arrays (CSR: ``indptr`` ``(n_nodes + 1,)`` int64, ``indices`` ``(2 * n_edges,)``
int32, ~12 bytes per undirected edge) and all metrics come from one pass of numba kernels.
networkx stays the API for small graphs and tests (:meth:`CSRGraph.to_networkx`).

The graph is simple and undirected: links are deduplicated, self-loops dropped, and every link
``a -> b`` also gives ``b -> a`` (the clustering coefficient of the paper is the undirected
one, ``networkx.clustering``).

Triangles are counted once each by the oriented (degree-ordered) algorithm: every edge is
directed from the endpoint of lower ``(degree, node id)`` rank to the higher one, so each node
has at most ``sqrt(2 m)`` out-neighbours, and a triangle ``u < v < w`` (in rank order) is found
exactly once, from ``u``, by intersecting the out-lists of ``u`` and ``v`` with a marker array.
Work is ``O(m^1.5)`` worst case, near-linear on power-law graphs; memory is ``O(n + m)``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numba
import numpy as np
import pyarrow as pa

from data_contracts.corpus import rows_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class CSRGraph:
    """A simple undirected graph in compressed sparse row form.

    Attributes
    ----------
    indptr : np.ndarray
        ``(n_nodes + 1,)`` int64; the neighbours of node ``u`` are
        ``indices[indptr[u]:indptr[u + 1]]``.
    indices : np.ndarray
        ``(2 * n_edges,)`` int32 neighbour ids; every undirected edge appears in both rows;
        each row is sorted ascending, has no duplicates and no self-loop.
    """

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def n_nodes(self) -> int:
        return int(self.indptr.size - 1)

    @property
    def n_edges(self) -> int:
        """Number of undirected edges."""
        return int(self.indices.size // 2)

    def degree(self) -> np.ndarray:
        """``(n_nodes,)`` int32 undirected degrees."""
        return np.diff(self.indptr).astype(np.int32)

    def neighbors(self, u: int) -> np.ndarray:
        """Sorted neighbour ids of node ``u`` (a view, int32)."""
        return self.indices[self.indptr[u]:self.indptr[u + 1]]

    def edge_list(self) -> tuple[np.ndarray, np.ndarray]:
        """Each undirected edge once, as ``(u, v)`` arrays with ``u < v``, shape ``(n_edges,)``."""
        rows = np.repeat(np.arange(self.n_nodes, dtype=np.int32), np.diff(self.indptr))
        keep = rows < self.indices
        return rows[keep], self.indices[keep]

    def to_networkx(self):
        """The same graph as a ``networkx.Graph`` over nodes ``0..n_nodes-1`` (small graphs only)."""
        import networkx as nx  # noqa: PLC0415  (heavy: networkx, ~0.2 s, only for the small-graph API)

        g = nx.Graph()
        g.add_nodes_from(range(self.n_nodes))
        u, v = self.edge_list()
        g.add_edges_from(zip(u.tolist(), v.tolist()))
        return g


def build_graph(src: np.ndarray, dst: np.ndarray, n_nodes: int) -> CSRGraph:
    """Build the simple undirected hyperlink graph from directed links.

    Parameters
    ----------
    src, dst : array-like of int
        ``(n_links,)`` link endpoints (``src_doc_id -> dst_doc_id`` of ``links.parquet``), any
        integer dtype, any order, duplicates and self-loops allowed.
    n_nodes : int
        Number of documents; ids must lie in ``[0, n_nodes)``. Nodes without links are kept
        (degree 0).

    Returns
    -------
    CSRGraph
        Deduplicated, self-loop-free, symmetrised graph; rows sorted. The result depends only
        on the *set* of undirected pairs, not on link order or direction.

    Raises
    ------
    ValueError
        ``src``/``dst`` differ in shape or are not 1-D integer arrays, ``n_nodes`` is negative
        or too large for int32 ids, or a link endpoint is out of range (names the link index
        and value).
    """
    src = np.asarray(src)
    dst = np.asarray(dst)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(f"src and dst must be 1-D arrays of equal length, got shapes {src.shape} and {dst.shape}")
    if src.size and not (np.issubdtype(src.dtype, np.integer) and np.issubdtype(dst.dtype, np.integer)):
        raise ValueError(f"link endpoints must be integers, got dtypes {src.dtype} and {dst.dtype}")
    if not 0 <= n_nodes < 2**31 - 1:
        raise ValueError(f"n_nodes must be in [0, 2**31 - 1), got {n_nodes}")
    for name, arr in (("src", src), ("dst", dst)):
        if arr.size:
            bad = np.flatnonzero((arr < 0) | (arr >= n_nodes))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"link {i}: {name} id {int(arr[i])} is outside [0, {n_nodes}) "
                                 f"({bad.size} out-of-range {name} id(s) in total)")
    n_links = src.size
    not_loop = src != dst
    s = src[not_loop].astype(np.int64)
    d = dst[not_loop].astype(np.int64)
    k = s.size
    key = np.empty(2 * k, dtype=np.int64)  # (2 * k,) row * n + col, both directions
    np.multiply(s, n_nodes, out=key[:k])
    key[:k] += d
    np.multiply(d, n_nodes, out=key[k:])
    key[k:] += s
    del s, d
    key.sort()
    if key.size:
        first = np.empty(key.size, dtype=bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
        del first
    indptr = np.searchsorted(key, np.arange(n_nodes + 1, dtype=np.int64) * n_nodes).astype(np.int64)
    indices = (key % max(n_nodes, 1)).astype(np.int32)  # (2 * n_edges,)
    log.debug("built graph: %d nodes, %d links -> %d undirected edges (%d self-loops dropped)",
              n_nodes, n_links, indices.size // 2, n_links - k)
    return CSRGraph(indptr=indptr, indices=indices)


def graph_from_links(links: pa.Table, n_docs: int, doc_ids: np.ndarray | None = None) -> CSRGraph:
    """:func:`build_graph` from a ``links.parquet`` table (columns ``src_doc_id``, ``dst_doc_id``).

    ``doc_ids`` ``(n_docs,)``: the documents' ids in row order (``documents.parquet``'s title
    order); the graph's nodes are the rows (the private dense order Algorithm 1 runs on). ``None``:
    the links' ids are the rows already.

    Raises
    ------
    KeyError
        A column is missing.
    ValueError
        As :func:`build_graph`; a link names a document that is not in ``doc_ids``.
    """
    src = links.column("src_doc_id").to_numpy()
    dst = links.column("dst_doc_id").to_numpy()
    if doc_ids is not None:
        src, dst = rows_of(doc_ids, src, "links.src_doc_id"), rows_of(doc_ids, dst, "links.dst_doc_id")
    return build_graph(src, dst, n_docs)


@dataclass(frozen=True, eq=False)
class GraphMetrics:
    """Per-node and per-edge triangle metrics of a :class:`CSRGraph`.

    Attributes
    ----------
    degree : np.ndarray
        ``(n_nodes,)`` int32 undirected degree ``k``.
    triangles : np.ndarray
        ``(n_nodes,)`` int64 number of triangles through the node (``networkx.triangles``).
    clustering : np.ndarray
        ``(n_nodes,)`` float64 local clustering coefficient ``2 T / (k (k - 1))``, 0 for
        ``k < 2`` (equals ``networkx.clustering`` bit for bit: both are the correctly rounded
        quotient of the same two integers).
    support : np.ndarray
        ``(2 * n_edges,)`` int32 aligned with ``graph.indices``: ``support[p]`` for
        ``p`` in row ``u`` with ``v = indices[p]`` is the number of triangles on edge
        ``(u, v)`` = the number of common neighbours ``c(u, v)``; symmetric.
    """

    degree: np.ndarray
    triangles: np.ndarray
    clustering: np.ndarray
    support: np.ndarray


def degree_order(degree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, rank)``, both ``(n_nodes,)`` int32: nodes sorted by ``(degree asc, node id
    asc)`` and each node's position in that order (the orientation of the triangle pass)."""
    order = np.argsort(degree, kind="stable").astype(np.int32)
    rank = np.empty(degree.size, dtype=np.int32)
    rank[order] = np.arange(degree.size, dtype=np.int32)
    return order, rank


def graph_metrics(graph: CSRGraph) -> GraphMetrics:
    """Degree, triangle count, local clustering coefficient and edge triangle support.

    One oriented-triangle pass (module docstring). Source: the local clustering coefficient
    that FunnelRAG Algorithm 1 sorts documents by (Watts–Strogatz, as ``networkx.clustering``
    for an undirected unweighted graph); the edge support ``c(d, u)`` feeds the ego-graph
    closeness of :mod:`tasks.corpus.clustering`.

    Parameters
    ----------
    graph : CSRGraph

    Returns
    -------
    GraphMetrics
        Arrays of shape ``(n_nodes,)`` and ``(2 * n_edges,)``.
    """
    degree = graph.degree()
    order, rank = degree_order(degree)
    triangles, support = _triangle_pass(graph.indptr, graph.indices, rank, order)
    k = degree.astype(np.float64)
    denom = k * (k - 1.0)
    clustering = np.zeros(graph.n_nodes, dtype=np.float64)
    has = triangles > 0
    clustering[has] = (2.0 * triangles[has].astype(np.float64)) / denom[has]
    return GraphMetrics(degree=degree, triangles=triangles, clustering=clustering, support=support)


@numba.njit(cache=True, nogil=True)
def _triangle_pass(indptr, indices, rank, order):  # pragma: no cover - compiled
    n = indptr.size - 1
    # oriented out-edges r -> s (r < s) in rank space: hubs (high rank) sit together at the
    # end, so the marker array and out-lists touched by the inner loop stay cache-local
    out_ptr = np.zeros(n + 1, dtype=np.int64)  # (n + 1,) indexed by rank
    for r in range(n):
        u = order[r]
        c = 0
        for p in range(indptr[u], indptr[u + 1]):
            if rank[indices[p]] > r:
                c += 1
        out_ptr[r + 1] = out_ptr[r] + c
    m = out_ptr[n]
    out_pos = np.empty(m, dtype=np.int64)  # (n_edges,) position of the out-edge in `indices`
    out_nbr = np.empty(m, dtype=np.int32)  # (n_edges,) rank of its head
    for r in range(n):
        u = order[r]
        e = out_ptr[r]
        for p in range(indptr[u], indptr[u + 1]):
            if rank[indices[p]] > r:
                out_pos[e] = p
                out_nbr[e] = rank[indices[p]]
                e += 1
    tri_by_rank = np.zeros(n, dtype=np.int64)
    sup = np.zeros(m, dtype=np.int32)      # (n_edges,) triangles per out-edge
    mark = np.full(n, -1, dtype=np.int64)  # mark[s] = out-edge r -> s while r is processed
    for r in range(n):
        for e in range(out_ptr[r], out_ptr[r + 1]):
            mark[out_nbr[e]] = e
        for e in range(out_ptr[r], out_ptr[r + 1]):
            s = out_nbr[e]
            for f in range(out_ptr[s], out_ptr[s + 1]):
                g = mark[out_nbr[f]]
                if g >= 0:  # triangle r < s < t, found once
                    tri_by_rank[r] += 1
                    tri_by_rank[s] += 1
                    tri_by_rank[out_nbr[f]] += 1
                    sup[e] += 1
                    sup[g] += 1
                    sup[f] += 1
        for e in range(out_ptr[r], out_ptr[r + 1]):
            mark[out_nbr[e]] = -1
    triangles = np.empty(n, dtype=np.int64)
    for r in range(n):
        triangles[order[r]] = tri_by_rank[r]
    # scatter out-edge support onto both positions u -> v and v -> u (rows are sorted)
    support = np.zeros(indices.size, dtype=np.int32)
    for r in range(n):
        u = order[r]
        for e in range(out_ptr[r], out_ptr[r + 1]):
            p = out_pos[e]
            support[p] = sup[e]
            v = indices[p]
            lo = indptr[v]
            hi = indptr[v + 1]
            while lo < hi:                     # binary search for u in v's sorted row (np.searchsorted's
                mid = (lo + hi) >> 1           # compilation alone costs ~0.7 CPU s on a fresh checkout)
                if indices[mid] < u:
                    lo = mid + 1
                else:
                    hi = mid
            support[lo] = sup[e]
    return triangles, support
