"""Exact (brute-force) dense passage index for flat dense retrieval with the bi-encoder.

The index is the matrix ``E`` of L2-normalised passage embeddings ``(n_passages, dim)``; a
query ``q`` (normalised, ``(dim,)``) scores every passage by the inner product ``E @ q`` (=
cosine similarity) and the top-``k`` rows are selected with ``argpartition``. Nothing is
approximated, so it is the reference an ANN index is measured against.

Scaling
-------
* Memory: ``n · d · bytes`` — the 146K Wikispeedia passages × 384 dims: 112 MB float16 on
  disk, 225 MB float32 in memory; the 21M passages of the DPR Wikipedia split × 384 dims:
  16 GB float16 / 32 GB float32 (× 768 dims: twice that). The embeddings file is
  ``np.load(mmap_mode="r")``-able, so the operating system can page it in on demand.
* Time: ``O(n · d)`` per query — a GEMV that streams the whole matrix from memory once, so it
  is memory-bandwidth bound; a batch of queries is one GEMM and shares that stream. Measured
  (``benchmarks/bench_retrieval.py``, one core of the shared AMD EPYC, top-400): 39 ms per
  query at 100K × 384 and 88 ms at 300K, i.e. ~6 s per query at 21M; 64 queries at once:
  43 queries/s at 300K. numpy has no float16 GEMM: a float16 matrix is either upcast once at
  load (``DenseIndexConfig.upcast``, the default; float16 then halves only the file) or
  block by block on every call, ~9× slower (820 ms per query at 300K).
* Beyond ~1–5M vectors, or when latency must stay under ~10 ms per query, an approximate
  index takes over: faiss ``IndexIVFFlat`` / ``IndexIVFPQ`` (probe a few of ``√n`` lists,
  product-quantised codes cut memory 8–32×) or HNSW (``faiss.IndexHNSWFlat``, hnswlib;
  ``O(log n)`` hops, ~1.5× the vector memory for the graph). This exact index is their
  recall reference.

Files (``<dir>/``): ``embeddings.{float16|float32}.npy`` ``(n, dim)``, ``doc_ids.index.json``
(row → passage id), ``params.index.json`` (model fingerprint, dim, dtype, normalisation,
count).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from data_contracts.base import atomic_directory
from funnelrag.progress import Progress
from models.encoders import EncoderConfig

IDS_FILE = "doc_ids.index.json"
PARAMS_FILE = "params.index.json"
DTYPES = ("float16", "float32")


@dataclass(frozen=True)
class DenseIndexConfig:
    """Dense index settings.

    encoder : the bi-encoder (``models.encoders.EncoderConfig``; default offline MiniLM).
    dtype : storage dtype of the embeddings, ``"float16"`` (half the memory) or ``"float32"``.
    batch_size : texts per encoder forward pass while building.
    block_rows : rows of ``E`` multiplied per block at search time (bounds the float32 working
        memory to ``block_rows · dim · 4`` bytes plus ``block_rows · n_queries · 4``).
    upcast : hold the matrix as float32 in memory after loading (``n · dim · 4`` bytes). numpy
        has no float16 GEMM, and converting a float16 block on every query costs ~8× the
        matmul itself (``benchmarks/bench_retrieval.py``), so float16 then only halves the disk
        file; set False when float32 does not fit in memory.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    dtype: str = "float16"
    batch_size: int = 64
    block_rows: int = 65536
    upcast: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"DenseIndexConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.batch_size < 1 or self.block_rows < 1:
            raise ValueError(f"DenseIndexConfig sizes must be >= 1, got {self}")


def embeddings_file(dtype: str) -> str:
    """``embeddings.float16.npy`` / ``embeddings.float32.npy``."""
    return f"embeddings.{dtype}.npy"


class DenseIndex:
    """Normalised passage embeddings ``(n, dim)`` and their ids; exact inner-product search.

    Parameters
    ----------
    embeddings : np.ndarray
        ``(n, dim)`` float16 or float32, rows L2-normalised (checked on construction).
    ids : sequence of str
        ``ids[i]`` names row ``i``; unique.
    params : dict
        Provenance stored beside the matrix (model fingerprint, encoder config, ...).
    block_rows : int
        See :class:`DenseIndexConfig`.

    Raises
    ------
    ValueError
        Shape, dtype, id count or uniqueness is wrong, or rows are not unit-norm.
    """

    def __init__(self, embeddings: np.ndarray, ids: Sequence[str], params: dict | None = None,
                 block_rows: int = 65536):
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be (n, dim), got shape {embeddings.shape}")
        if embeddings.dtype.name not in DTYPES:
            raise ValueError(f"embeddings dtype must be one of {DTYPES}, got {embeddings.dtype}")
        if len(ids) != embeddings.shape[0]:
            raise ValueError(f"{len(ids)} ids for {embeddings.shape[0]} embedding rows")
        if len(set(ids)) != len(ids):
            raise ValueError("dense index ids are not unique")
        if embeddings.shape[0]:
            sample = np.asarray(embeddings[: min(1024, embeddings.shape[0])], dtype=np.float32)
            norms = np.linalg.norm(sample, axis=1)  # (sample,)
            if not np.allclose(norms, 1.0, atol=1e-2):
                bad = int(np.argmax(np.abs(norms - 1.0)))
                raise ValueError(f"embedding row {bad} has norm {norms[bad]:.4f}; rows must be L2-normalised")
        self.embeddings = embeddings
        self.ids = list(ids)
        self.params = dict(params or {})
        self.block_rows = block_rows

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the embedding matrix (``n · dim · itemsize``)."""
        return int(self.embeddings.shape[0] * self.embeddings.shape[1] * self.embeddings.dtype.itemsize)

    def search(self, queries: np.ndarray, k: int) -> tuple[list[list[str]], np.ndarray]:
        """Exact top-``k`` by inner product.

        Parameters
        ----------
        queries : np.ndarray
            ``(n_queries, dim)`` L2-normalised query embeddings (any float dtype).
        k : int
            Passages per query; ``k' = min(k, n)`` are returned.

        Returns
        -------
        ids : list of lists of str, ``(n_queries, k')``
        scores : float32 ``(n_queries, k')``, descending per row; equal scores ordered by row id.

        Raises
        ------
        ValueError
            ``queries`` is not ``(n_queries, dim)``.
        """
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be (n_queries, {self.dim}), got {q.shape}")
        k = min(int(k), len(self))
        if k <= 0 or q.shape[0] == 0:
            return [[] for _ in range(q.shape[0])], np.zeros((q.shape[0], 0), np.float32)
        best_rows = np.zeros((q.shape[0], 0), np.int64)
        best_scores = np.zeros((q.shape[0], 0), np.float32)
        for start in range(0, len(self), self.block_rows):
            block = np.asarray(self.embeddings[start:start + self.block_rows], dtype=np.float32)  # (rows, dim)
            scores = q @ block.T                                             # (n_queries, rows)
            rows = np.broadcast_to(np.arange(start, start + block.shape[0]), scores.shape)
            cand_s = np.concatenate([best_scores, scores], axis=1)           # (n_queries, k + rows)
            cand_r = np.concatenate([best_rows, rows], axis=1)
            if cand_s.shape[1] > k:
                part = np.argpartition(-cand_s, k - 1, axis=1)[:, :k]        # (n_queries, k) unordered
                cand_s = np.take_along_axis(cand_s, part, 1)
                cand_r = np.take_along_axis(cand_r, part, 1)
            best_scores, best_rows = cand_s, cand_r
        order = np.lexsort((best_rows, -best_scores), axis=-1)               # score desc, row asc
        best_rows = np.take_along_axis(best_rows, order, -1)
        best_scores = np.take_along_axis(best_scores, order, -1)
        return [[self.ids[r] for r in row] for row in best_rows], best_scores.astype(np.float32)

    # ------------------------------------------------------------------ save / load
    def save(self, directory: Path) -> Path:
        """Write the index atomically (temporary sibling directory, then rename)."""
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            np.save(tmp / embeddings_file(self.embeddings.dtype.name), np.ascontiguousarray(self.embeddings))
            (tmp / IDS_FILE).write_text(json.dumps(self.ids))
            params = {**self.params, "dim": self.dim, "n": len(self), "dtype": self.embeddings.dtype.name}
            (tmp / PARAMS_FILE).write_text(json.dumps(params, sort_keys=True, indent=1) + "\n")
        return directory

    @classmethod
    def load(cls, directory: Path, mmap: bool = True, block_rows: int = 65536, upcast: bool = False) -> "DenseIndex":
        """Load an index written by :meth:`save` (embeddings memory-mapped by default; with
        ``upcast``, read into memory as float32 for fast search).

        Raises
        ------
        FileNotFoundError
            A file of the index is missing (names it).
        """
        directory = Path(directory)
        for name in (PARAMS_FILE, IDS_FILE):
            if not (directory / name).exists():
                raise FileNotFoundError(f"dense index {directory}: missing {name}")
        params = json.loads((directory / PARAMS_FILE).read_text())
        emb_path = directory / embeddings_file(params["dtype"])
        if not emb_path.exists():
            raise FileNotFoundError(f"dense index {directory}: missing {emb_path.name}")
        emb = np.load(emb_path, mmap_mode="r" if mmap and not upcast else None)
        if upcast:
            emb = emb.astype(np.float32)                                     # (n, dim) in memory
        return cls(emb, json.loads((directory / IDS_FILE).read_text()), params, block_rows)


# ---------------------------------------------------------------------------- building
def encode_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None) -> np.ndarray:
    """L2-normalised bi-encoder embeddings, float32 ``(len(texts), dim)`` (input order); ``bar``
    (:class:`funnelrag.progress.Progress`, optional) counts the texts embedded.

    ``model`` is a :class:`models.encoders.BiEncoder`; rows are re-normalised here in case its
    config does not normalise.
    """
    import torch.nn.functional as F  # noqa: PLC0415

    from models.encoders import encode  # noqa: PLC0415

    emb = encode(model, tokenizer, list(texts), batch_size=batch_size, bar=bar)  # (n, dim) float32
    return F.normalize(emb, p=2, dim=-1).numpy().astype(np.float32) if len(texts) else emb.numpy()


def build_dense_index(texts: Sequence[str], ids: Sequence[str], model, tokenizer,
                      cfg: DenseIndexConfig = DenseIndexConfig(), params: dict | None = None) -> DenseIndex:
    """Embed every passage with the bi-encoder and stack the normalised rows.

    Parameters
    ----------
    texts, ids : passages (``title + " " + text`` is the caller's choice) and their ids.
    model, tokenizer : :class:`models.encoders.BiEncoder` and its tokenizer.
    cfg : DenseIndexConfig
    params : provenance stored with the index (model fingerprint, corpus digest).

    Returns
    -------
    DenseIndex
        Embeddings in ``cfg.dtype``, ``(len(texts), dim)``.

    Raises
    ------
    ValueError
        ``texts`` and ``ids`` differ in length or ids repeat.
    """
    if len(texts) != len(ids):
        raise ValueError(f"dense index build: {len(texts)} texts but {len(ids)} ids")
    with Progress("embed passages", total=len(texts), unit="passages") as bar:
        emb = encode_texts(model, tokenizer, texts, cfg.batch_size, bar).astype(cfg.dtype)  # (n, dim)
    meta = {"encoder": asdict(cfg.encoder), **dict(params or {})}
    return DenseIndex(emb, [str(i) for i in ids], meta, cfg.block_rows)


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over the weight and config files of a model directory (content, not path).

    Keys the dense-index cache: the same weights anywhere on disk give the same fingerprint.

    Raises
    ------
    FileNotFoundError
        ``model_dir`` holds no weight file (``*.safetensors`` / ``*.bin``).
    """
    from data_contracts.base import sha256_file  # noqa: PLC0415

    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin") or p.name in ("config.json", "tokenizer.json", "vocab.txt")))
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise FileNotFoundError(f"{model_dir}: no model weights (*.safetensors, *.bin) to fingerprint")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()
