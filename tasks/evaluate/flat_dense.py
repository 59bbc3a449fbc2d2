"""Flat dense retrieval over every corpus passage, searched with faiss on the stored vectors.

The vectors are the embedding index of the pre-ranker (:mod:`tasks.funnel.embeddings`): the
same ``E(p)`` that progressive retrieval reads for the units of its K clusters, so "flat dense"
and "progressive" differ only in which passages are scored (FunnelRAG Table 2).

Kinds (:class:`FlatDenseConfig`):

* ``flat`` — ``faiss.IndexFlatIP``: exact inner product (= cosine on normalised rows); the
  reference the approximate kinds are measured against. ``O(n · d)`` per query.
* ``hnsw`` — ``faiss.IndexHNSWFlat`` (inner product, ``M`` links per node, ``ef_search``
  candidates at query time): ``O(log n)`` hops, ~``M · 8`` extra bytes per vector; for
  10⁶–10⁸ vectors.
* ``ivf`` — ``faiss.IndexIVFFlat`` over ``n_lists`` k-means cells (default ``4·√n``),
  ``n_probe`` cells searched per query.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tasks.funnel.embeddings import EmbeddingIndex, embed_queries

KINDS = ("flat", "hnsw", "ivf")


@dataclass(frozen=True)
class FlatDenseConfig:
    """faiss index settings (see the module docstring).

    kind : ``flat`` | ``hnsw`` | ``ivf``.
    hnsw_m, ef_construction, ef_search : HNSW graph degree and beam widths.
    n_lists : IVF cells (None: ``4·√n``); n_probe : cells searched per query.
    seed : k-means seed of IVF training.
    """

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 128
    n_lists: int | None = None
    n_probe: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"flat dense kind must be one of {KINDS}, got {self.kind!r}")


def build_faiss_index(vectors: np.ndarray, cfg: FlatDenseConfig = FlatDenseConfig()):
    """A faiss inner-product index over ``vectors`` (float32 ``(n, dim)``, L2-normalised).

    Raises
    ------
    ValueError
        ``vectors`` is not a non-empty 2-D array.
    """
    import faiss  # noqa: PLC0415  (heavy: faiss, only for a flat dense setting)

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or not x.shape[0]:
        raise ValueError(f"faiss index needs a non-empty (n, dim) matrix, got {x.shape}")
    n, dim = x.shape
    if cfg.kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif cfg.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        index.hnsw.efSearch = cfg.ef_search
    else:
        n_lists = cfg.n_lists or max(1, min(n // 39, int(4 * math.sqrt(n))))   # faiss wants >= 39 points per cell
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, n_lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = cfg.seed
        index.train(x)
        index.nprobe = min(cfg.n_probe, n_lists)
    index.add(x)
    return index


def faiss_retriever(index: EmbeddingIndex, faiss_index, preranker) -> Callable[[str, int], list[str]]:
    """``retrieve(question, k) -> passage ids``: embed the question with the pre-ranker whose
    vectors ``index`` holds, search ``faiss_index`` (built over ``index.vectors``)."""
    def retrieve(question: str, k: int) -> list[str]:
        q = embed_queries(preranker.model, preranker.tokenizer, [question])             # (1, dim)
        _, rows = faiss_index.search(np.ascontiguousarray(q, dtype=np.float32), k)    # (1, k)
        return [index.passage_ids[r] for r in rows[0] if r >= 0]
    return retrieve
