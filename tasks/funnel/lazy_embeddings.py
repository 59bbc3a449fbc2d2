"""A lazily filled, persisted embedding index: passages are embedded on first use and kept.

The full index (:mod:`tasks.funnel.embeddings`, embedded by the nightly ``embed-corpus`` flow)
costs hours of CPU for the 146K Wikispeedia passages; the demo and CPU-sized evaluations only
touch the passages of the clusters their questions retrieve. This cache holds a
``(n_passages, dim)`` float32 matrix (a memory-mapped ``.npy``) in corpus passage order and a
``filled`` mask; :meth:`LazyEmbeddingIndex.ensure` embeds the missing rows with the same text
and model as the full index, so a filled row equals the full index's row (same function, same
weights). Keyed like the full index by (corpus content digest, model version):
``home/cache/embed-lazy/<corpus digest[:16]>-<model version[:16]>/``.

Crash safety: vectors are flushed before the mask is replaced (written to a temporary file and
renamed), so a killed run leaves rows either filled and correct or marked missing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from data_contracts.base import atomic_write
from funnelrag.progress import Progress
from tasks.funnel.embeddings import TEXT_FORMAT, EmbeddingIndex, EmbeddingIndexMismatch, embed_texts, passage_text

VECTORS_FILE = "vectors.float32.npy"
FILLED_FILE = "filled.bool.npy"
PARAMS_FILE = "params.embedding.json"


def lazy_root(cache_dir: Path, corpus_digest: str, version: str) -> Path:
    """Directory of the lazily filled index of one (corpus, model version)."""
    return Path(cache_dir) / "embed-lazy" / f"{corpus_digest[:16]}-{version[:16]}"


class LazyEmbeddingIndex(EmbeddingIndex):
    """An :class:`EmbeddingIndex` whose rows are embedded on demand (:meth:`ensure`).

    Use :meth:`open` to create or reopen one; rows not yet filled are zero and must not be
    scored: callers run :meth:`ensure` on the rows they are about to read.
    """

    root: Path
    filled: np.ndarray

    @classmethod
    def open(cls, root: Path, passages: pa.Table, corpus_digest: str, version: str, dim: int,
             max_length: int) -> "LazyEmbeddingIndex":
        """Create (zero rows, nothing filled) or reopen the cache at ``root``.

        Raises
        ------
        EmbeddingIndexMismatch
            ``root`` holds a cache of another corpus digest, model version or passage count.
        """
        root = Path(root)
        meta = {"corpus_digest": corpus_digest, "model_version": version, "dim": int(dim),
                "max_length": int(max_length), "text": TEXT_FORMAT, "passages": passages.num_rows}
        params = root / PARAMS_FILE
        if params.exists():
            found = json.loads(params.read_text())
            if found != meta:
                diff = {k: (found.get(k), v) for k, v in meta.items() if found.get(k) != v}
                raise EmbeddingIndexMismatch(f"lazy embedding cache {root} differs in {diff}")
        else:
            root.mkdir(parents=True, exist_ok=True)
            vec = np.lib.format.open_memmap(root / VECTORS_FILE, mode="w+", dtype=np.float32,
                                            shape=(passages.num_rows, int(dim)))
            vec.flush()
            del vec
            atomic_write(root / FILLED_FILE, lambda p: np.save(open(p, "wb"), np.zeros(passages.num_rows, bool)))
            atomic_write(params, lambda p: p.write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n"))
        vectors = np.load(root / VECTORS_FILE, mmap_mode="r+")
        index = cls(passages["passage_id"].to_pylist(), passages["unit_id"].to_pylist(),
                    passages["cluster_id"].to_numpy(), vectors, meta)
        index.root = root
        index.filled = np.load(root / FILLED_FILE)
        index._titles, index._texts = passages["title"], passages["text"]
        return index

    @property
    def n_filled(self) -> int:
        return int(self.filled.sum())

    def ensure(self, rows: Sequence[int] | np.ndarray, model, tokenizer, batch_size: int = 64) -> int:
        """Embed the rows of ``rows`` not filled yet, persist them, and return how many.

        Parameters
        ----------
        rows : passage rows (corpus order) about to be read.
        model, tokenizer : the bi-encoder pre-ranker of this cache's model version.
        """
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        missing = rows[~self.filled[rows]]
        if not missing.size:
            return 0
        take = pa.array(missing)
        texts = [passage_text(t, x) for t, x in zip(self._titles.take(take).to_pylist(),
                                                   self._texts.take(take).to_pylist())]
        with Progress("embed passages (lazily filled index)", total=len(texts), unit="passages") as bar:
            self.vectors[missing] = embed_texts(model, tokenizer, texts, batch_size, bar)   # (n_missing, dim)
        self.vectors.flush()
        self.filled[missing] = True
        filled = self.filled.copy()
        atomic_write(self.root / FILLED_FILE, lambda p: np.save(open(p, "wb"), filled))
        return int(missing.size)
