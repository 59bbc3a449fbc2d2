"""Pre-ranking from stored vectors: BM25 clusters → the stored passage vectors of their units →
dot products → MaxP unit scores → top-N units → their best passages.

The bi-encoder pre-ranker's ``f(q, p) = E(q) · E(p)`` (FunnelRAG Eq. 1, normalised embeddings)
needs only ``E(q)`` at query time when ``E(p)`` is read from the embedding index
(:mod:`tasks.funnel.embeddings`); units score by MaxP (:mod:`tasks.funnel.unit_scoring`). The
ranking equals the on-the-fly path (:func:`tasks.funnel.candidates.build_candidates` with
``unit_scoring="maxp"``) up to float rounding: units by (score desc, unit_id asc). With the
passages' BM25 scores, units rank by the fusion of their MaxP and BM25 scores instead
(:mod:`tasks.funnel.fusion`); the final passages are still the best dense ones of the top-N units.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.funnel.embeddings import EmbeddingIndex
from tasks.funnel.fusion import FusionConfig, fuse, pool_bm25
from tasks.funnel.unit_scoring import group_max


@dataclass
class StoredRanking:
    """Pre-ranking of one question from stored vectors.

    unit_ids, unit_scores : every unit of the K clusters, best first (``(n_units,)`` scores: MaxP
        dense, or the fused score when BM25 scores were given, :mod:`tasks.funnel.fusion`).
    passage_rows, passage_scores : embedding-index rows of every passage of the K clusters and
        their dense scores ``(n_passages,)``, in index row order of the clusters as given (the
        final passages of the top-N units are chosen by these).
    """

    unit_ids: list[str]
    unit_scores: np.ndarray
    passage_rows: np.ndarray
    passage_scores: np.ndarray

    def top_passages(self, index: EmbeddingIndex, n_units: int, n_final: int) -> list[tuple[int, float]]:
        """``[(row, score)]`` of the ``n_final`` best passages of the top ``n_units`` units
        (score desc, then row asc)."""
        keep = set(self.unit_ids[:n_units])
        cand = [(float(s), int(r)) for r, s in zip(self.passage_rows, self.passage_scores) if index.unit_ids[r] in keep]
        cand.sort(key=lambda x: (-x[0], x[1]))
        return [(r, s) for s, r in cand[:n_final]]


def rank_units_stored(query: np.ndarray, index: EmbeddingIndex, cluster_ids: list[int],
                      bm25_scores=None, fusion: FusionConfig = FusionConfig()) -> StoredRanking:
    """Score every passage of ``cluster_ids`` by ``query · E(p)`` and rank their units by MaxP,
    or by MaxP fused with the units' BM25 scores (:func:`tasks.funnel.fusion.fuse`).

    Parameters
    ----------
    query : float32 ``(dim,)``, the L2-normalised question embedding of the same pre-ranker
        version as the index (checked by the caller with :meth:`EmbeddingIndex.check`).
    index : EmbeddingIndex
    cluster_ids : the BM25 top-K clusters.
    bm25_scores : None, or ``rows -> float (n,)``: the passages' BM25 scores for the question
        (:meth:`tasks.funnel.fusion.PassageBM25.scores` bound to it); needed when
        ``fusion.method != "none"``.
    fusion : FusionConfig (default: MaxP alone).

    Returns
    -------
    StoredRanking

    Raises
    ------
    ValueError
        ``query`` does not have the index's dimension, or a fusion has no ``bm25_scores``.
    """
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if q.shape[0] != index.dim:
        raise ValueError(f"query has {q.shape[0]} dims, the embedding index {index.dim}")
    if fusion.method != "none" and bm25_scores is None:
        raise ValueError(f"fusion {fusion.method!r} needs the passages' BM25 scores")
    rows = index.rows_of_clusters(cluster_ids)                      # (n_passages,)
    scores = index.vectors[rows] @ q                                 # (n_passages,)
    units = [index.unit_ids[r] for r in rows]
    names = sorted(set(units))
    pos = {u: i for i, u in enumerate(names)}
    groups = np.asarray([pos[u] for u in units], np.int64)
    best = group_max(scores, groups, len(names))                     # (n_units,)
    if fusion.method != "none":
        unit_bm25 = pool_bm25(bm25_scores(rows), groups, len(names), fusion.bm25_pool)   # (n_units,)
        best = fuse(best, unit_bm25, names, fusion)                  # (n_units,) float64
    order = sorted(range(len(names)), key=lambda i: (-float(best[i]), names[i]))
    return StoredRanking([names[i] for i in order], best[order], rows, scores.astype(np.float32))
