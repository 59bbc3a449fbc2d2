"""Pre-ranking from stored vectors: BM25 clusters → the stored passage vectors of their units →
dot products → MaxP unit scores → top-N units → their best passages.

The bi-encoder pre-ranker's ``f(q, p) = E(q) · E(p)`` (FunnelRAG Eq. 1, normalised embeddings)
needs only ``E(q)`` at query time when ``E(p)`` is read from the embedding index
(:mod:`tasks.funnel.embeddings`); units score by MaxP (:mod:`tasks.funnel.unit_scoring`). The
ranking equals the on-the-fly path (:func:`tasks.funnel.candidates.build_candidates` with
``unit_scoring="maxp"``) up to float rounding: units by (score desc, unit_id asc). With the
passages' BM25 scores, units rank by the fusion of their MaxP and BM25 scores instead
(:mod:`tasks.funnel.fusion`). The final passages are the best dense ones of the top-N units, or,
with a passage BM25 weight, the best by the convex fusion of their dense and BM25 scores. With a
BM25 shortlist of M passages, only the M passages of the K clusters that score highest by passage
BM25 are scored by the bi-encoder, and units rank by their best shortlisted passage.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.funnel.embeddings import EmbeddingIndex
from tasks.funnel.fusion import FusionConfig, fuse, fuse_passages, pool_bm25
from tasks.funnel.unit_scoring import group_max


@dataclass
class StoredRanking:
    """Pre-ranking of one question from stored vectors.

    unit_ids, unit_scores : every unit of the K clusters, best first (``(n_units,)`` scores: MaxP
        dense, or the fused score when BM25 scores were given, :mod:`tasks.funnel.fusion`).
    passage_rows, passage_scores : embedding-index rows of every passage of the K clusters and
        their dense scores ``(n_passages,)``, in index row order of the clusters as given (the
        final passages of the top-N units are chosen by these).
    unit_codes : the index's unit code of each unit of ``unit_ids`` (same order), int64.
    passage_codes : the unit code of each passage row, int64 ``(n_passages,)``.
    passage_bm25 : the BM25 score of each passage row ``(n_passages,)`` when a unit fusion or a
        shortlist read them (then :meth:`top_passages` reuses them), else None.
    cluster_rows : with a BM25 shortlist, every passage row of the K clusters (``passage_rows``
        then holds the shortlisted rows only); None when every row was scored.
    """

    unit_ids: list[str]
    unit_scores: np.ndarray
    passage_rows: np.ndarray
    passage_scores: np.ndarray
    unit_codes: np.ndarray | None = None
    passage_codes: np.ndarray | None = None
    passage_bm25: np.ndarray | None = None
    cluster_rows: np.ndarray | None = None

    @property
    def all_rows(self) -> np.ndarray:
        """Every passage row of the K clusters, int64 ``(n,)`` (answer recall of the clusters,
        and the top units' passages the FiD post-ranker reads)."""
        return self.passage_rows if self.cluster_rows is None else self.cluster_rows

    def top_passages(self, index, n_units: int, n_final: int, bm25_scores=None,
                     bm25_weight: float = 0.0) -> list[tuple[int, float]]:
        """``[(row, score)]`` of the ``n_final`` best passages of the top ``n_units`` units
        (score desc, then row asc).

        The score is the passage's dense score, or, with ``bm25_weight`` w > 0, the convex fusion
        ``w · mm(b) + (1 − w) · mm(d)`` over the passages of the top ``n_units`` units
        (:func:`tasks.funnel.fusion.fuse_passages`; ``b`` their BM25 scores from
        ``bm25_scores(rows) -> (n,)``, ``d`` their dense scores).

        Raises
        ------
        ValueError
            ``bm25_weight`` > 0 without ``bm25_scores``, or outside [0, 1].
        """
        if self.unit_codes is None or self.passage_codes is None:      # built by hand: by unit id
            keep = set(self.unit_ids[:n_units])
            mask = np.asarray([index.unit_ids[int(r)] in keep for r in self.passage_rows], dtype=bool)
        else:
            mask = np.isin(self.passage_codes, self.unit_codes[:n_units])
        rows = np.asarray(self.passage_rows)[mask]
        scores = np.asarray(self.passage_scores, dtype=np.float32)[mask]
        if bm25_weight:
            if self.passage_bm25 is not None:
                bm25 = np.asarray(self.passage_bm25)[mask]
            elif bm25_scores is not None:
                bm25 = bm25_scores(rows)
            else:
                raise ValueError("top_passages: bm25_weight > 0 needs the passages' BM25 scores")
            scores = fuse_passages(scores, bm25, bm25_weight)
        order = np.lexsort((rows, -scores))[:n_final]
        return [(int(rows[j]), float(scores[j])) for j in order]


def bm25_shortlist(bm25: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
    """Positions of the ``size`` best passages by BM25, int64 ``(min(size, n),)``, best first
    (score desc, then index row asc).

    Parameters
    ----------
    bm25 : float ``(n,)``, the passages' BM25 scores for the question.
    rows : int ``(n,)``, their embedding-index rows (the tie order).
    size : M >= 1.

    Raises
    ------
    ValueError
        ``size`` < 1 or the lengths differ.
    """
    bm25, rows = np.asarray(bm25, np.float64), np.asarray(rows, np.int64)
    if size < 1 or bm25.shape != rows.shape:
        raise ValueError(f"bm25_shortlist: size {size} of {bm25.shape} scores for {rows.shape} rows")
    return np.lexsort((rows, -bm25))[:size].astype(np.int64)


def shortlist_rows(index: EmbeddingIndex, cluster_ids: list[int], bm25_scores, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The BM25 shortlist of the K clusters' passages: the rows the bi-encoder scores.

    Parameters
    ----------
    index : EmbeddingIndex or MappedEmbeddingIndex (only its cluster → rows map is read).
    cluster_ids : the BM25 top-K clusters.
    bm25_scores : ``rows -> float (n,)``, the passages' BM25 scores for the question.
    size : M >= 1.

    Returns
    -------
    (cluster_rows, rows, bm25)
        every passage row of the clusters, int64 ``(n,)``; the shortlisted rows in the clusters'
        row order, int64 ``(min(M, n),)``; their BM25 scores ``(min(M, n),)``.

    Raises
    ------
    ValueError
        ``size`` < 1.
    """
    cluster_rows = index.rows_of_clusters(cluster_ids)              # (n,)
    bm25 = np.asarray(bm25_scores(cluster_rows))                    # (n,)
    keep = np.sort(bm25_shortlist(bm25, cluster_rows, size))        # (M,), in the clusters' row order
    return cluster_rows, cluster_rows[keep], bm25[keep]


def rank_units_stored(query: np.ndarray, index: EmbeddingIndex, cluster_ids: list[int],
                      bm25_scores=None, fusion: FusionConfig = FusionConfig(), shortlist: int = 0) -> StoredRanking:
    """Score every passage of ``cluster_ids`` by ``query · E(p)`` and rank their units by MaxP,
    or by MaxP fused with the units' BM25 scores (:func:`tasks.funnel.fusion.fuse`).

    With ``shortlist`` M > 0 only the M passages of the clusters with the highest passage BM25
    scores (:func:`bm25_shortlist`) are scored and pooled: a unit scores as its best
    shortlisted passage and units without one drop out. This is flat BM25 + bi-encoder re-ranking
    (the flat setting's candidates are its top passages by the same scores) confined to the K
    clusters; its cost grows with the clusters' passages, not with the corpus.

    Vectorised over the passages of the K clusters: one gather of their stored vectors (from
    memory or a memory map, :class:`tasks.funnel.embeddings.MappedEmbeddingIndex`), one
    matrix-vector product, the per-unit maximum by the index's integer unit codes (which sort as
    the unit ids do), one lexicographic sort; unit ids are materialised only for the units of
    these clusters.

    Parameters
    ----------
    query : float32 ``(dim,)``, the L2-normalised question embedding of the same pre-ranker
        version as the index (checked by the caller with :meth:`EmbeddingIndex.check`).
    index : EmbeddingIndex or MappedEmbeddingIndex
    cluster_ids : the BM25 top-K clusters.
    bm25_scores : None, or ``rows -> float (n,)``: the passages' BM25 scores for the question
        (:meth:`tasks.funnel.fusion.PassageBM25.scores` bound to it); needed when
        ``fusion.method != "none"`` or ``shortlist`` > 0.
    fusion : FusionConfig (default: MaxP alone).
    shortlist : M, the BM25 shortlist's size (0: every passage of the clusters).

    Returns
    -------
    StoredRanking
        Units by (MaxP score desc, unit id asc).

    Raises
    ------
    ValueError
        ``query`` does not have the index's dimension, a fusion or a shortlist has no
        ``bm25_scores``, or ``shortlist`` < 0.
    """
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if q.shape[0] != index.dim:
        raise ValueError(f"query has {q.shape[0]} dims, the embedding index {index.dim}")
    if (fusion.method != "none" or shortlist) and bm25_scores is None:
        raise ValueError(f"fusion {fusion.method!r} / shortlist {shortlist} needs the passages' BM25 scores")
    if shortlist < 0:
        raise ValueError(f"shortlist must be >= 0, got {shortlist}")
    cluster_rows, passage_bm25 = None, None
    if shortlist:
        cluster_rows, rows, passage_bm25 = shortlist_rows(index, cluster_ids, bm25_scores, shortlist)
    else:
        rows = index.rows_of_clusters(cluster_ids)                  # (n_passages,)
    scores = index.gather(rows) @ q                                  # (n_passages,) float32
    codes = np.asarray(index.unit_codes[rows], dtype=np.int64)       # (n_passages,)
    uniq, first, inv = np.unique(codes, return_index=True, return_inverse=True)   # units in id order
    groups = inv.reshape(-1)
    best = group_max(scores, groups, len(uniq))                      # (n_units,)
    if fusion.method != "none":
        if passage_bm25 is None:
            passage_bm25 = np.asarray(bm25_scores(rows))                                # (n_passages,)
        unit_bm25 = pool_bm25(passage_bm25, groups, len(uniq), fusion.bm25_pool)        # (n_units,)
        best = fuse(best, unit_bm25, index.unit_names_at(rows[first]), fusion)         # (n_units,) float64
    order = np.lexsort((uniq, -best))                                # score desc, unit id asc
    names = index.unit_names_at(rows[first[order]])
    return StoredRanking(names, best[order], rows, scores.astype(np.float32), uniq[order], codes, passage_bm25,
                         cluster_rows)
