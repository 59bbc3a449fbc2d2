"""The GPU check's ``embedding_scale`` phase: the passage-embedding stage at scale on one device.

Passages: the NQ-open oracle sample's real 100-word Wikipedia passages (``"{title}. {text}"``),
**repeated** to ``n_passages`` (100,000 by default) for a throughput figure. Each copy's text
starts with its copy number (``"[copy 7] Title. text"``) so the content-keyed vector store does
not embed each distinct passage once and reuse it (the lengths stay those of real passages,
plus ~5 tokens). The path is the production one: :func:`tasks.funnel.embeddings.embed_passages`
with a :class:`tasks.funnel.vector_store.VectorStore` in the check's work directory, so passages
are length-sorted, batched by tokens (``batch_tokens``), tokenised a chunk ahead in a thread while
the device runs the previous chunk (:func:`models.encoders.encode`), and each chunk's vectors are
written to the store as they arrive. bf16 (autocast) is used only when the ``embedding``
phase's top-10 agreement of bf16 with fp32 was ≥ 0.99; else fp32.

Figures: passages/s (wall, device synchronised), peak GPU memory, and the projection to the
21M passages of the DPR Wikipedia split on one device and on an 8-device node (arithmetic from
the measured rate, stated as such).
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

DPR_PASSAGES = 21_015_324
BF16_MIN_AGREEMENT = 0.99


def repeated_passages(oracle: Path, n_passages: int) -> list[str]:
    """``n_passages`` texts: the oracle file's gold passages in order, copy after copy, each
    prefixed by its copy number (see the module docstring)."""
    opener = open
    if str(oracle).endswith(".gz"):
        import gzip  # noqa: PLC0415  (heavy: only for a gzipped oracle file)

        opener = gzip.open
    with opener(oracle, "rt", encoding="utf-8") as fh:
        base = [f"{c['title']}. {c['text']}" for c in (json.loads(line)["ctxs"][0] for line in fh)]
    return [f"[copy {i // len(base)}] {base[i % len(base)]}" for i in range(n_passages)]


def embed_at_scale(oracle: Path, minilm: Path, device: str, n_passages: int, work: Path,
                   bf16_agreement: float | None, batch_tokens: int, shard_rows: int) -> dict[str, Any]:
    """Embed ``n_passages`` repeated oracle passages with MiniLM on ``device`` into a vector
    store under ``work``; returns the phase's figures (see the module docstring; the rate counts
    the distinct texts embedded: a few oracle records share their gold passage).

    Raises
    ------
    RuntimeError
        The store does not hold one vector per distinct passage text afterwards.
    """
    import torch  # noqa: PLC0415  (heavy: torch, only in this phase)

    from models.preranker import PreRankerConfig, build_preranker  # noqa: PLC0415  (heavy: torch via models.preranker)
    from tasks.funnel.embeddings import EmbeddingConfig, embed_passages, passage_vector_store  # noqa: PLC0415  (heavy: torch via tasks.funnel.embeddings)

    cuda = device.startswith("cuda")
    texts = repeated_passages(oracle, n_passages)
    model, tok = build_preranker(PreRankerConfig(kind="bi", name_or_path=str(minilm)))
    model.to(device)
    bf16 = bf16_agreement is not None and bf16_agreement >= BF16_MIN_AGREEMENT
    store = passage_vector_store(work, model)
    cfg = EmbeddingConfig(batch_size=1024 if cuda else 64, batch_tokens=batch_tokens, shard_rows=shard_rows)
    ctx = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) if bf16 else nullcontext()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with ctx:
        _, info = embed_passages(texts, model, tok, cfg, store)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    distinct = len(set(texts))                         # the oracle file repeats a few gold passages
    if len(store) != distinct or info["embedded"] != distinct:
        raise RuntimeError(f"vector store holds {len(store)} vectors after embedding {info['embedded']} "
                           f"of {distinct} distinct passages")
    rate = distinct / max(seconds, 1e-9)
    n_tokens = sum(len(x) for x in tok(texts[:2048], truncation=True, max_length=model.encoder.cfg.max_length)["input_ids"])
    return {"passages": n_passages, "distinct_texts": distinct, "embedded": info["embedded"],
            "precision": "bf16" if bf16 else "fp32", "bf16_top10_agreement": bf16_agreement,
            "batch_tokens": batch_tokens, "segments_written": len(store.segments()),
            "mean_tokens_per_passage": round(n_tokens / min(len(texts), 2048), 1),
            "embed_s": round(seconds, 2), "passages_per_s": round(rate, 1),
            "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
            "projected_hours_21m_one_device": round(DPR_PASSAGES / rate / 3600, 2),
            "projected_hours_21m_8_devices": round(DPR_PASSAGES / rate / 3600 / 8, 3)}
