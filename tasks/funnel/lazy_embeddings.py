"""A lazily filled embedding index: passages are embedded on first use and kept by content.

The full index (:mod:`tasks.funnel.embeddings`, embedded by the nightly ``embed-corpus`` flow)
costs hours of CPU for the 146K Wikispeedia passages; the demo and CPU-sized evaluations only
touch the passages of the clusters their questions retrieve. This index holds a
``(n_passages, dim)`` float32 matrix in corpus passage order and a ``filled`` mask;
:meth:`LazyEmbeddingIndex.ensure` fills the missing rows from the content-keyed vector store
(:mod:`tasks.funnel.vector_store`, verified on read) and embeds only the texts it does not
hold, with the same text and model as the full index, writing them to the store. The store is
the model version's one store (``home/cache/embed-vectors/<key>/``), shared with
``embed-corpus`` and with every corpus version: a passage embedded for an earlier corpus, or by
the full index, is never embedded again.

Crash safety: the store's segments are directories renamed into place whole (their digest
manifest inside), so a killed run keeps the chunks it finished and nothing half-written is read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from funnelrag.content_store import distinct_keys, text_keys
from funnelrag.progress import Progress
from tasks.funnel.embeddings import TEXT_FORMAT, EmbeddingIndex, embed_texts, passage_text
from tasks.funnel.vector_store import VectorStore, vector_store_root


def lazy_root(cache_dir: Path, version: str) -> Path:
    """The vector store a lazily filled index of this model version reads and fills."""
    return vector_store_root(cache_dir, version)


class LazyEmbeddingIndex(EmbeddingIndex):
    """An :class:`EmbeddingIndex` whose rows are embedded on demand (:meth:`ensure`).

    Use :meth:`open` to create or reopen one; rows not yet filled are zero and must not be
    scored: callers run :meth:`ensure` on the rows they are about to read.
    """

    root: Path
    filled: np.ndarray

    @classmethod
    def open(cls, root: Path, passages: pa.Table, corpus_digest: str, version: str, dim: int,
             max_length: int, keys: np.ndarray | None = None) -> "LazyEmbeddingIndex":
        """A lazily filled index over ``passages``, its rows filled from the vector store at
        ``root`` (:func:`lazy_root`) wherever the store holds the passage's text.

        Parameters
        ----------
        root : the model version's vector store.
        passages : the corpus ``passages`` table.
        corpus_digest, version : the corpus content digest and model version (index meta).
        dim, max_length : the encoder's width and input length.
        keys : ``(passages.num_rows, 2)`` uint64, optional
            The passages' text keys in table order when the caller holds them
            (:func:`tasks.funnel.embeddings.corpus_text_keys`: kept per corpus version, so a
            version is hashed once whatever opens it); hashed here otherwise.

        Raises
        ------
        ValueError
            ``keys`` is not one key per passage.
        """
        meta = {"corpus_digest": corpus_digest, "model_version": version, "dim": int(dim),
                "max_length": int(max_length), "text": TEXT_FORMAT, "passages": passages.num_rows}
        index = cls(passages["passage_id"].to_pylist(), passages["unit_id"].to_pylist(),
                    passages["cluster_id"].to_numpy(), np.zeros((passages.num_rows, int(dim)), np.float32), meta)
        index.store = VectorStore(root, int(dim))
        index._titles, index._texts = passages["title"], passages["text"]
        if keys is None:
            keys = text_keys([passage_text(t, x) for t, x in zip(index._titles.to_pylist(), index._texts.to_pylist())])
        if keys.shape != (passages.num_rows, 2):
            raise ValueError(f"lazy embedding index: keys {keys.shape} for {passages.num_rows} passages")
        index._keys = keys                                                        # (n, 2)
        got = index.store.lookup(index._keys)
        index.vectors[got.found] = got.vectors[got.found]
        index.filled = got.found
        return index

    @property
    def n_filled(self) -> int:
        return int(self.filled.sum())

    def ensure(self, rows: Sequence[int] | np.ndarray, model, tokenizer, batch_size: int = 64) -> int:
        """Fill the rows of ``rows`` not filled yet (from the store, else by embedding their
        texts, each distinct text once, and adding them to the store); return how many texts
        were embedded.

        Parameters
        ----------
        rows : passage rows (corpus order) about to be read.
        model, tokenizer : the bi-encoder pre-ranker of this index's model version.
        """
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        missing = rows[~self.filled[rows]]
        if not missing.size:
            return 0
        got = self.store.lookup(self._keys[missing])                         # written since open
        self.vectors[missing[got.found]] = got.vectors[got.found]
        self.filled[missing[got.found]] = True
        missing = missing[~got.found]
        if not missing.size:
            return 0
        ukeys, first, inverse = distinct_keys(self._keys[missing])
        take = pa.array(missing[first])
        texts = [passage_text(t, x) for t, x in zip(self._titles.take(take).to_pylist(),
                                                   self._texts.take(take).to_pylist())]
        with Progress("embed passages (lazily filled index)", total=len(texts), unit="passages") as bar:
            emb = embed_texts(model, tokenizer, texts, batch_size, bar)           # (n_texts, dim)
        self.store.add(ukeys, emb)
        self.vectors[missing] = emb[inverse]
        self.filled[missing] = True
        return int(len(texts))
