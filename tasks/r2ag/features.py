"""R²AG retrieval features: relevance, precedent similarity and neighbor similarity.

Ye et al. 2024, "R²AG: Incorporating Retrieval Information into Retrieval Augmented Generation",
Section 3.2 and Appendix A, Eqs. 10–12. For a query representation ``x^q`` and the
representations ``x^d_1 .. x^d_k`` of a ranked list of ``k`` documents (retriever order), each
document gets ``input_i = [r_i, gamma_i, zeta_i]``:

* Eq. 10  ``r_i = sim(x^q, x^d_i)``
* Eq. 11  ``gamma_i = sim(x^d_i, sum_{j=1}^{i-1} w_j x^d_j)``, ``w_j = exp(r_j) / sum_{l=1}^{k} exp(r_l)``
* Eq. 12  ``zeta_1 = sim(x^d_1, x^d_2)``; ``zeta_i = [sim(x^d_{i-1}, x^d_i) + sim(x^d_i, x^d_{i+1})] / 2``
  for ``i in [2, k)``; ``zeta_k = sim(x^d_{k-1}, x^d_k)``.

Two cases the paper leaves open are fixed here and documented: ``gamma_1`` compares ``x^d_1`` with
the empty sum (the zero vector) and is 0 (``sim(x, 0) = 0`` for both dot product and cosine,
the limit torch's ``cosine_similarity`` also returns); a list of one document has no neighbour
and gets ``zeta_1 = 0``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from data_contracts import r2ag as R

log = logging.getLogger(__name__)

FEATURE_NAMES = ("relevance", "precedent_similarity", "neighbor_similarity")
SIMILARITIES = ("cosine", "dot")


@dataclass(frozen=True)
class FeatureConfig:
    """Retrieval-feature settings.

    similarity : ``"cosine"`` (the paper's choice, Appendix D) or ``"dot"``.
    include_title : embed documents as ``"title. text"`` rather than the text alone.
    """

    similarity: str = "cosine"
    include_title: bool = True

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"FeatureConfig.similarity must be one of {SIMILARITIES}, got {self.similarity!r}")


def _sim_rows(a: np.ndarray, b: np.ndarray, similarity: str) -> np.ndarray:
    """Row-wise similarity of ``a`` and ``b`` (both ``(n, dim)``) → ``(n,)`` float64.

    Cosine of a zero vector is defined as 0.
    """
    dot = np.einsum("nd,nd->n", a, b)  # (n,)
    if similarity == "dot":
        return dot
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)  # (n,)
    out = np.zeros_like(dot)
    nz = norms > 0
    out[nz] = dot[nz] / norms[nz]
    return out


def retrieval_features(query_emb: np.ndarray, doc_embs: np.ndarray, similarity: str = "cosine") -> np.ndarray:
    """Eqs. 10–12 for one ranked list.

    Parameters
    ----------
    query_emb : array ``(dim,)``
        Retriever representation ``x^q`` of the query.
    doc_embs : array ``(k, dim)``
        Representations ``x^d_1 .. x^d_k`` in the retriever's ranking order (row 0 = top).
    similarity : ``"cosine"`` or ``"dot"``

    Returns
    -------
    np.ndarray ``(k, 3)`` float64
        Columns ``[r_i, gamma_i, zeta_i]`` (Eq. 10, Eq. 11, Eq. 12); first/last documents as in
        Eq. 12, ``gamma_1 = 0`` and ``zeta_1 = 0`` when ``k = 1`` (see module docstring).

    Raises
    ------
    ValueError
        Shapes disagree, the list is empty, or ``similarity`` is unknown.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}; expected one of {SIMILARITIES}")
    q = np.asarray(query_emb, dtype=np.float64)
    d = np.asarray(doc_embs, dtype=np.float64)
    if q.ndim != 1 or d.ndim != 2 or d.shape[1] != q.shape[0]:
        raise ValueError(f"expected query (dim,) and documents (k, dim); got {q.shape} and {d.shape}")
    k = d.shape[0]
    if k == 0:
        raise ValueError("a ranked list needs at least one document")
    # Eq. 10: relevance
    r = _sim_rows(np.broadcast_to(q, d.shape), d, similarity)  # (k,)
    # Eq. 11: precedent similarity; weights are a softmax over the relevances of all k documents
    w = np.exp(r - r.max())
    w = w / w.sum()  # (k,)  (shift-invariant: equals exp(r_j) / sum_l exp(r_l))
    weighted = w[:, None] * d  # (k, dim)
    precedents = np.zeros_like(d)  # (k, dim): row i = sum_{j<i} w_j x_j, row 0 = empty sum
    precedents[1:] = np.cumsum(weighted, axis=0)[:-1]
    gamma = _sim_rows(d, precedents, similarity)  # (k,), row 0 compares with the zero vector → 0
    # Eq. 12: neighbor similarity
    zeta = np.zeros(k)
    if k >= 2:
        adjacent = _sim_rows(d[:-1], d[1:], similarity)  # (k-1,): sim(x_i, x_{i+1})
        zeta[0] = adjacent[0]
        zeta[-1] = adjacent[-1]
        if k > 2:
            zeta[1:-1] = (adjacent[:-1] + adjacent[1:]) / 2.0
    return np.stack([r, gamma, zeta], axis=1)  # (k, 3)


def feature_table(lists: pa.Table, query_embs: np.ndarray, doc_embs: np.ndarray,
                  cfg: FeatureConfig = FeatureConfig()) -> pa.Table:
    """Retrieval features of every ranked list, as a contract-checked table.

    Parameters
    ----------
    lists : ``RANKED_LISTS`` table
        Rows grouped by ``query_id`` in any order; each list is sorted by ``rank`` here.
    query_embs : array ``(n_queries, dim)``
        Query representations, row ``i`` for the ``i``-th distinct ``query_id`` in order of first
        appearance in ``lists`` (what :func:`tasks.r2ag.lists.list_texts` returns).
    doc_embs : array ``(lists.num_rows, dim)``
        Document representations, row-aligned with ``lists``.
    cfg : FeatureConfig

    Returns
    -------
    pa.Table
        ``RETRIEVAL_FEATURES`` rows ordered by (first appearance of query, rank).

    Raises
    ------
    ValueError
        Embedding rows do not match the table.
    ContractViolation
        The input or output breaks its contract (non-contiguous ranks, non-finite values).
    """
    lists = R.RANKED_LISTS.validate(lists)
    qids = lists["query_id"].to_pylist()
    order_q = list(dict.fromkeys(qids))
    if query_embs.shape[0] != len(order_q):
        raise ValueError(f"{query_embs.shape[0]} query embeddings for {len(order_q)} ranked lists")
    if doc_embs.shape[0] != lists.num_rows:
        raise ValueError(f"{doc_embs.shape[0]} document embeddings for {lists.num_rows} list rows")
    ranks = lists["rank"].to_numpy()
    rows_of: dict[str, list[int]] = {}
    for row, qid in enumerate(qids):
        rows_of.setdefault(qid, []).append(row)
    out_rows: list[int] = []
    feats: list[np.ndarray] = []
    for qi, qid in enumerate(order_q):
        rows = np.asarray(rows_of[qid])
        rows = rows[np.argsort(ranks[rows], kind="stable")]  # (k,) in rank order
        feats.append(retrieval_features(query_embs[qi], doc_embs[rows], cfg.similarity))
        out_rows.extend(rows.tolist())
    x = np.concatenate(feats, axis=0).astype(np.float32) if feats else np.zeros((0, 3), np.float32)  # (n_rows, 3)
    take = pa.array(out_rows, pa.int64())
    table = pa.table({
        "query_id": lists["query_id"].take(take),
        "rank": lists["rank"].take(take),
        "doc_id": lists["doc_id"].take(take),
        "relevance": pa.array(x[:, 0]),
        "precedent_similarity": pa.array(x[:, 1]),
        "neighbor_similarity": pa.array(x[:, 2]),
        "label": lists["label"].take(take),
    })
    return R.RETRIEVAL_FEATURES.validate(table)


def feature_columns(names: Sequence[str]) -> list[int]:
    """Column indices into ``[r, gamma, zeta]`` for the named features (ablation support).

    Raises
    ------
    ValueError
        An unknown or repeated name, or no feature at all.
    """
    if not names:
        raise ValueError("at least one retrieval feature is needed")
    if len(set(names)) != len(names):
        raise ValueError(f"repeated feature names in {list(names)}")
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown:
        raise ValueError(f"unknown retrieval feature(s) {unknown}; expected a subset of {FEATURE_NAMES}")
    return [FEATURE_NAMES.index(n) for n in names]
