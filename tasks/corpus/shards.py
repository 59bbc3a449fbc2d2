"""Per-shard execution of the corpus build's document-parallel stages.

A *shard* is a contiguous ``doc_id`` range ``[lo, hi)`` of ``documents.parquet`` (sorted by
``doc_id``, so a range is read through the row-group statistics without the rest of the file).
Token counting of the ~100-word windows (the article lengths of Algorithm 1, and the windows of
segmentation) is independent per document, so shards are counted in worker processes through
``submit(fn, *args) -> future`` and concatenated in ``doc_id`` order: ``window_tokens.parquet`` is
byte-identical to :func:`tasks.corpus.stages.run_tokens`' whatever the shard size or worker count.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts import corpus as C
from tasks.corpus.segment import SegmentConfig, count_window_tokens
from tasks.corpus.tokenize import load_token_counter


def doc_shards(n_docs: int, docs_per_shard: int) -> list[tuple[int, int]]:
    """``[(lo, hi)]`` covering ``0..n_docs`` in ranges of ``docs_per_shard`` documents."""
    return [(lo, min(lo + docs_per_shard, n_docs)) for lo in range(0, n_docs, docs_per_shard)]


def read_doc_range(ingest_dir: Path, lo: int, hi: int, columns: list[str]) -> pa.Table:
    """Documents ``lo <= doc_id < hi`` sorted by ``doc_id``; raises ``ValueError`` if ids are missing."""
    table = pq.read_table(Path(ingest_dir) / C.DOCUMENTS.filename, columns=columns,
                          filters=[("doc_id", ">=", lo), ("doc_id", "<", hi)]).sort_by("doc_id")
    ids = table.column("doc_id").to_numpy()
    if ids.size != hi - lo or (ids.size and (ids[0] != lo or ids[-1] != hi - 1)):
        raise ValueError(f"{ingest_dir}: documents {lo}..{hi - 1} are not all present (got {ids.size})")
    return table


TOKENS_SHARD_VERSION = "1"


def _shard_key(texts: list[str], cfg: SegmentConfig) -> str:
    h = hashlib.sha256(json.dumps([TOKENS_SHARD_VERSION, cfg.tokenizer, cfg.passage_words, len(texts)]).encode())
    for t in texts:
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8"))
    return h.hexdigest()


def count_shard(ingest_dir: str, lo: int, hi: int, cfg: SegmentConfig, mirror: str | None,
                cache_dir: str | None = None) -> tuple[np.ndarray, np.ndarray, str, bool]:
    """Window token counts of documents ``[lo, hi)`` (a worker-process call): ``(windows per
    doc (hi-lo,), tokens per window, tokenizer name, reused)``. With ``cache_dir``, counts are
    kept under the sha256 of the shard's texts and reused when the texts are unchanged."""
    texts = read_doc_range(Path(ingest_dir), lo, hi, ["doc_id", "text"]).column("text").to_pylist()
    cached = Path(cache_dir) / _shard_key(texts, cfg) if cache_dir else None
    if cached is not None and (cached / "COMPLETE").exists():
        return (np.load(cached / "windows.npy"), np.load(cached / "tokens.npy"),
                (cached / "COMPLETE").read_text().strip(), True)
    wt = count_window_tokens(texts, cfg, load_token_counter(cfg.tokenizer, Path(mirror) if mirror else None))
    windows = np.diff(wt.indptr).astype(np.int32)
    if cached is not None:
        tmp = cached.with_name(f".tmp-{cached.name}-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        np.save(tmp / "windows.npy", windows)
        np.save(tmp / "tokens.npy", wt.n_tokens)
        (tmp / "COMPLETE").write_text(wt.tokenizer + "\n")
        try:
            os.replace(tmp, cached)
        except OSError:   # kept by another worker meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return windows, wt.n_tokens, wt.tokenizer, False


def run_tokens_sharded(ingest_dir: Path, out_dir: Path, cfg: SegmentConfig, mirror: Path | None,
                       submit: Callable[..., Any], docs_per_shard: int, window: int = 8,
                       cache_dir: Path | None = None) -> dict[str, Any]:
    """:func:`tasks.corpus.stages.run_tokens` over document shards counted through ``submit``.

    At most ``window`` shards are in flight or waiting to be concatenated (coordinator memory).
    With ``cache_dir`` (shared by the workers) a shard whose texts are unchanged reuses its
    counts; the summary's ``shards_reused`` / ``shards_built`` say how many.
    """
    t0 = time.perf_counter()
    n_docs = pq.read_metadata(Path(ingest_dir) / C.DOCUMENTS.filename).num_rows
    shards = doc_shards(n_docs, docs_per_shard)
    per_doc: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    names: set[str] = set()
    futures: list = []
    reused = 0
    for k in range(len(shards) + window):
        if k < len(shards):
            lo, hi = shards[k]
            futures.append(submit(count_shard, str(ingest_dir), lo, hi, cfg, str(mirror) if mirror else None,
                                  str(cache_dir) if cache_dir else None))
        if k >= window or k >= len(shards):
            if not futures:
                break
            windows, n_tokens, name, hit = futures.pop(0).result()
            reused += hit
            per_doc.append(windows)
            tokens.append(n_tokens)
            names.add(name)
    counts = np.concatenate(per_doc) if per_doc else np.zeros(0, np.int32)
    n_tokens = np.concatenate(tokens) if tokens else np.zeros(0, np.int32)
    offsets = np.zeros(n_docs + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    tokenizer = names.pop() if names else cfg.tokenizer
    table = pa.table({
        "doc_id": pa.array(np.arange(n_docs, dtype=np.int32)),
        "n_tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(n_tokens.astype(np.int32), pa.int32())),
        "tokenizer": pa.array([tokenizer] * n_docs, pa.string()),
    })
    C.WINDOW_TOKENS.write(table, out_dir)
    seconds = time.perf_counter() - t0
    return {"documents": n_docs, "windows": int(n_tokens.size), "tokens": int(n_tokens.sum()), "tokenizer": tokenizer,
            "shards": len(shards), "shards_reused": reused, "shards_built": len(shards) - reused, "seconds": seconds, "tokens_per_s": float(n_tokens.sum()) / max(seconds, 1e-9)}
