"""Retrievers over the paragraph collection: BM25 (bm25s) and similarity matching (SM, bi-encoder).

Both return ranked paragraph ids; ties are broken by collection row (ascending), so rankings
are deterministic. DR-RAG's query-document concatenation (QDC, Eq. 1) queries a retriever with
``q ⊕ d`` = :func:`concat_query`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from models.encoders import encode
from tasks.corpus.index import BM25Config, BM25Index
from tasks.dr_rag.collection import ParagraphCollection, paragraph_text


class Retriever(Protocol):
    """Anything that ranks collection ids for a batch of queries."""

    def search(self, queries: Sequence[str], k: int) -> list[list[str]]:
        """Top-``k`` paragraph ids per query, best first: ``(n_queries, min(k, n_docs))``."""


def concat_query(question: str, title: str, text: str) -> str:
    """``q ⊕ d`` of DR-RAG Eq. 1: the question followed by the document (title and text).

    The question comes first, so an encoder that truncates to ``max_length`` tokens keeps it.
    """
    return f"{question} {paragraph_text(title, text)}"


class BM25Retriever:
    """BM25 over ``"title: text"`` of every paragraph (:class:`tasks.corpus.index.BM25Index`)."""

    def __init__(self, index: BM25Index):
        self.index = index

    @classmethod
    def build(cls, collection: ParagraphCollection, cfg: BM25Config = BM25Config()) -> "BM25Retriever":
        return cls(BM25Index.build(collection.retrieval_texts(), collection.ids, cfg))

    def search(self, queries: Sequence[str], k: int) -> list[list[str]]:
        ids, _ = self.index.search(list(queries), k)
        return ids


@dataclass(frozen=True)
class SMConfig:
    """Similarity-matching retriever: bi-encoder name and query batch size."""

    encoder: str = "minilm"
    max_length: int = 256
    batch_size: int = 64


class SMRetriever:
    """Dense retrieval by cosine similarity (dot product of L2-normalised embeddings).

    Parameters
    ----------
    embeddings : float32 tensor ``(n_docs, dim)``, L2-normalised, row ``i`` = ``ids[i]``.
    ids : paragraph ids.
    encode_queries : ``texts -> (n_queries, dim)`` normalised tensor (the same encoder).
    """

    def __init__(self, embeddings: torch.Tensor, ids: Sequence[str], encode_queries):
        if embeddings.shape[0] != len(ids):
            raise ValueError(f"SM retriever: {embeddings.shape[0]} embeddings but {len(ids)} ids")
        self.embeddings = embeddings.float()
        self.ids = list(ids)
        self.encode_queries = encode_queries

    def search(self, queries: Sequence[str], k: int) -> list[list[str]]:
        k = min(k, len(self.ids))
        if not queries or k == 0:
            return [[] for _ in queries]
        q = self.encode_queries(list(queries)).float()  # (n_queries, dim)
        scores = (q @ self.embeddings.T).numpy()  # (n_queries, n_docs)
        rows = np.arange(scores.shape[1])
        out = []
        for row_scores in scores:
            # score descending, then row ascending (deterministic ties)
            order = np.lexsort((rows, -row_scores))[:k]
            out.append([self.ids[i] for i in order])
        return out


def encoder_fn(model, tokenizer, batch_size: int = 64):
    """Wrap :func:`models.encoders.encode` as ``texts -> (n, dim)`` for :class:`SMRetriever`."""
    return lambda texts: encode(model, tokenizer, texts, batch_size=batch_size)
