"""Is bf16 safe for the passage-embedding stage? Top-k agreement of bf16 with fp32 embeddings.

The embedding index is searched by inner product; bf16 keeps 8 bits of mantissa, so near-ties
in a question's top-k can swap. :func:`bf16_topk_agreement` embeds a sample of passages and
questions twice (fp32, and under bf16 autocast on ``device``) and reports the mean fraction of
each question's fp32 top-k that the bf16 top-k keeps, with the throughput of both; the GPU
check (``infra/gpu/check.py``) runs it before an index is built in bf16.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Sequence

import numpy as np


def topk_agreement(queries_a: np.ndarray, docs_a: np.ndarray, queries_b: np.ndarray, docs_b: np.ndarray,
                   k: int = 10) -> float:
    """Mean over queries of ``|top-k_a ∩ top-k_b| / k`` (inner-product rankings, ``(n_q, dim)`` x ``(n_d, dim)``)."""
    k = min(k, docs_a.shape[0])
    top_a = np.argsort(-(queries_a @ docs_a.T), axis=1)[:, :k]   # (n_q, k)
    top_b = np.argsort(-(queries_b @ docs_b.T), axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top_a, top_b)]))


def bf16_topk_agreement(model, tokenizer, passages: Sequence[str], questions: Sequence[str], k: int = 10,
                        device: str = "cpu", batch_size: int = 64) -> dict[str, float]:
    """Top-``k`` agreement of bf16 (autocast) with fp32 embeddings of a bi-encoder pre-ranker.

    ``model`` must already be on ``device`` (the caller moves it: models do no device lookups).

    Returns
    -------
    dict
        ``top{k}_agreement`` in [0, 1], ``passages``, ``passages_per_s_fp32``, ``passages_per_s_bf16``.
    """
    import torch  # noqa: PLC0415  (heavy: torch, only when the agreement is measured)

    from tasks.funnel.embeddings import embed_queries, embed_texts  # noqa: PLC0415  (heavy: torch via tasks.funnel.embeddings, only when the agreement is measured)

    def run(bf16: bool):
        ctx = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) if bf16 else nullcontext()
        with torch.no_grad(), ctx:
            if torch.cuda.is_available() and device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            docs = embed_texts(model, tokenizer, passages, batch_size=batch_size)
            if torch.cuda.is_available() and device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            return embed_queries(model, tokenizer, questions, batch_size=batch_size), docs, seconds

    q32, d32, s32 = run(False)
    q16, d16, s16 = run(True)
    return {f"top{k}_agreement": topk_agreement(q32, d32, q16, d16, k), "passages": len(passages),
            "passages_per_s_fp32": round(len(passages) / max(s32, 1e-9), 1),
            "passages_per_s_bf16": round(len(passages) / max(s16, 1e-9), 1)}
