"""BM25 passage index in shards with corpus-wide statistics, searched with a top-k merge.

BM25 scores (Robertson/Lucene) depend on three corpus-wide quantities: the number of documents
``N``, the document frequency ``df(t)`` of each term (through ``idf(t)``) and the average document
length ``avgdl`` (through the length normalisation). A shard indexed alone would use its own, and
its scores would not be comparable with another shard's. Here every shard is built in two
steps: :func:`shard_stats` counts a shard's ``df``, lengths and documents; the coordinator sums
them (:func:`merge_stats`); :func:`build_shard` then indexes the shard's passages with the
*global* ``N``, ``df`` and ``avgdl``, so each stored score ``idf(t) * tfc(t, d)`` is exactly the one
a single index over all passages would store. A query scores each shard, keeps its top ``k``, and
:class:`ShardedBM25` merges them by (score desc, global row asc) — the single index's order.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from data_contracts.base import atomic_write_bytes
from tasks.corpus.index import BM25Config, BM25Index, _stemmer, tokenize_ids

STATS_FILE = "global_stats.json"
SHARDS_FILE = "shards.json"


@dataclass
class CorpusStats:
    """Term statistics of a set of passages: documents, summed token lengths, ``df`` per stem."""

    n_docs: int
    total_len: int
    df: dict[str, int]

    @property
    def avg_doc_len(self) -> float:
        """Mean tokens per passage, as bm25s computes it (``np.mean`` of the lengths)."""
        return self.total_len / self.n_docs if self.n_docs else 0.0


def shard_stats(texts: Sequence[str], cfg: BM25Config) -> CorpusStats:
    """``N``, total length and ``df`` of one shard's passages (tokenized as the index will be)."""
    tokens = tokenize_ids(texts, cfg, _stemmer(cfg.stemmer))
    inverse = sorted(tokens.vocab, key=tokens.vocab.__getitem__)
    df: Counter[int] = Counter()
    total = 0
    for doc in tokens.ids:
        df.update(set(doc))
        total += len(doc)
    return CorpusStats(len(tokens.ids), total, {inverse[t]: c for t, c in df.items()})


def merge_stats(parts: Sequence[CorpusStats]) -> CorpusStats:
    """Corpus-wide statistics: sums over the shards (order-independent)."""
    df: Counter[str] = Counter()
    for p in parts:
        df.update(p.df)
    return CorpusStats(sum(p.n_docs for p in parts), sum(p.total_len for p in parts), dict(df))


def _global_bm25(cfg: BM25Config, stats: CorpusStats, vocab: dict[str, int]):
    import bm25s  # noqa: PLC0415
    from bm25s.scoring import (_build_idf_array, _build_scores_and_indices_for_matrix,  # noqa: PLC0415
                               _calculate_doc_freqs, _select_idf_scorer)

    class GlobalBM25(bm25s.BM25):
        """bm25s BM25 whose idf and length normalisation use corpus-wide statistics."""

        def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
            if self.method in self.methods_requiring_nonoccurrence:
                raise ValueError(f"sharded BM25: method {self.method!r} is not supported (use lucene/robertson/atire)")
            local_df = _calculate_doc_freqs(corpus_tokens=corpus_token_ids, unique_tokens=unique_token_ids,
                                            show_progress=False)
            inverse = sorted(vocab, key=vocab.__getitem__)
            global_df = {i: stats.df[inverse[i]] for i in unique_token_ids}
            idf = _build_idf_array(doc_frequencies=global_df, n_docs=stats.n_docs,
                                   compute_idf_fn=_select_idf_scorer(self.idf_method), dtype=self.dtype)
            scores_flat, doc_idx, vocab_idx = _build_scores_and_indices_for_matrix(
                corpus_token_ids=corpus_token_ids, idf_array=idf, avg_doc_len=np.float64(stats.avg_doc_len),
                doc_frequencies=local_df, k1=self.k1, b=self.b, delta=self.delta, show_progress=False,
                dtype=self.dtype, int_dtype=self.int_dtype, method=self.method, nonoccurrence_array=None)
            n_docs = len(corpus_token_ids)
            data, indices, indptr = self._np_csc(data=scores_flat, rows=doc_idx, cols=vocab_idx,
                                                 shape=(n_docs, len(unique_token_ids)))
            self.nonoccurrence_array = None
            return {"data": data.astype(self.dtype), "indices": indices, "indptr": indptr, "num_docs": n_docs}

    return GlobalBM25(k1=cfg.k1, b=cfg.b, method=cfg.method, csc_backend="numpy")


def build_shard(texts: Sequence[str], doc_ids: Sequence[str], cfg: BM25Config, stats: CorpusStats) -> BM25Index:
    """Index one shard's passages with the corpus-wide ``stats`` (from :func:`merge_stats`).

    Raises ``ValueError`` if a shard term is missing from ``stats`` (stats of other passages).
    """
    texts, ids = list(texts), [str(i) for i in doc_ids]
    if len(texts) != len(ids):
        raise ValueError(f"BM25 shard: {len(texts)} texts but {len(ids)} ids")
    index = BM25Index(None, ids, cfg)
    tokens = tokenize_ids(texts, cfg, index._stem)
    missing = [t for t in tokens.vocab if t not in stats.df]
    if missing:
        raise ValueError(f"BM25 shard: terms {missing[:5]} are not in the corpus statistics (stats of other passages?)")
    retriever = _global_bm25(cfg, stats, tokens.vocab)
    retriever.index(tokens, show_progress=False)
    index.retriever = retriever
    return index


def save_stats(stats: CorpusStats, directory: Path) -> None:
    """``global_stats.json``: ``N`` and total length (the ``df`` table lives in the shards' scores)."""
    atomic_write_bytes(Path(directory) / STATS_FILE, (json.dumps({"n_docs": stats.n_docs, "total_len": stats.total_len}) + "\n").encode())


class ShardedBM25:
    """Top-``k`` search over passage shards (``shard-00000``, … under one directory)."""

    def __init__(self, shards: list[BM25Index]):
        self.shards = shards
        self.offsets = np.cumsum([0] + [len(s) for s in shards])

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> "ShardedBM25":
        """Load the shards listed in ``shards.json``. Raises ``FileNotFoundError`` if it is missing."""
        names = json.loads((Path(directory) / SHARDS_FILE).read_text())
        return cls([BM25Index.load(Path(directory) / n, mmap=mmap) for n in names])

    @property
    def doc_ids(self) -> list[str]:
        return [i for s in self.shards for i in s.doc_ids]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def search(self, queries: Sequence[str], k: int) -> tuple[list[list[str]], np.ndarray]:
        """Top-``k`` ids and scores per query over all shards: ``(n_queries, min(k, N))``,
        ordered by score descending then global row (shard order, row within shard)."""
        k = min(k, len(self))
        if not queries or k == 0:
            return [[] for _ in queries], np.zeros((len(queries), 0), dtype=np.float32)
        parts = [s.search_rows(queries, k) for s in self.shards]
        rows = np.concatenate([r + base for (r, _), base in zip(parts, self.offsets)], axis=1)
        scores = np.concatenate([sc for _, sc in parts], axis=1)
        order = np.lexsort((rows, -scores), axis=-1)[:, :k]
        top_rows = np.take_along_axis(rows, order, -1)
        shard_of = np.searchsorted(self.offsets, top_rows, side="right") - 1
        ids = [[self.shards[s].doc_ids[r - self.offsets[s]] for s, r in zip(srow, row)]
               for srow, row in zip(shard_of, top_rows)]
        return ids, np.take_along_axis(scores, order, -1)
