"""Throughput of the passage embedding stage (:mod:`tasks.funnel.embeddings`) on this CPU:
passages/s of the bi-encoder pre-ranker in fp32 and the speed routes (int8 dynamic
quantization, bf16), their agreement with fp32, and projections to the whole corpus and to
the 21M passages of the DPR Wikipedia split.

    python benchmarks/bench_embedding.py --home funnelrag-home --n 1024 --threads 1
    python benchmarks/bench_embedding.py --home funnelrag-home --precisions fp32 int8 --threads 2

Passages are a fixed, evenly spaced sample of the published corpus (``"{title}. {text}"``,
the pre-ranker's own max_length). Prints wall seconds, process CPU seconds (the machine may
be shared: CPU seconds are the compute, wall includes waiting), passages per wall and per CPU
second, and for each route the min cosine / max abs difference against fp32 and the share of
sample queries whose top-10 passages (by dot product) are unchanged.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from funnelrag.workspace import Workspace  # noqa: E402
from models.preranker import PreRankerConfig, build_preranker  # noqa: E402
from tasks.corpus.published import open_corpus  # noqa: E402
from tasks.funnel.embeddings import embed_queries, embed_texts, passage_texts, with_precision  # noqa: E402

DPR_PASSAGES = 21_015_324


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=Path("funnelrag-home"))
    ap.add_argument("--corpus", default="wikispeedia")
    ap.add_argument("--n", type=int, default=1024, help="passages in the sample")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "int8", "bf16"])
    ap.add_argument("--gpu-tflops", type=float, default=100.0,
                    help="sustained GPU TFLOP/s assumed for the 21M projection (H100 bf16 dense peak ≈ 990)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    corpus = open_corpus(Workspace(args.home), args.corpus)
    passages = corpus.passages
    rows = np.linspace(0, passages.num_rows - 1, min(args.n, passages.num_rows)).astype(np.int64)
    texts = passage_texts(passages.take(rows))
    queries = [f"{t}" for t in passages.take(rows[::max(1, len(rows) // 32)])["title"].to_pylist()][:32]
    model, tok = build_preranker(PreRankerConfig())
    print(f"# {len(texts)} passages of {passages.num_rows:,} ({args.corpus} {corpus.version}), torch threads "
          f"{args.threads}, batch {args.batch_size}, load average {os.getloadavg()[0]:.1f}")
    ref = None
    for precision in args.precisions:
        fast = with_precision(model, precision)
        embed_texts(fast, tok, texts[:args.batch_size], args.batch_size)               # warm-up
        w0, c0 = time.perf_counter(), time.process_time()
        emb = embed_texts(fast, tok, texts, args.batch_size)                            # (n, dim)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        line = (f"{precision:5s} wall {wall:7.2f} s  cpu {cpu:7.2f} s  {len(texts) / wall:7.1f} passages/s wall  "
                f"{len(texts) / cpu * args.threads:7.1f} passages/s per {args.threads} thread(s) of CPU  "
                f"corpus {passages.num_rows / (len(texts) / wall) / 60:6.1f} min wall")
        if ref is None:
            ref, q_ref, ref_wall, ref_rate = emb, embed_queries(fast, tok, queries), wall, len(texts) / wall
        else:
            q = embed_queries(fast, tok, queries)
            cos = np.sum(emb * ref, axis=1)
            top = lambda e, qq: np.argsort(-(qq @ e.T), axis=1)[:, :10]  # noqa: E731
            same = np.mean([set(a) == set(b) for a, b in zip(top(emb, q), top(ref, q_ref))])
            line += f"  min cos vs fp32 {cos.min():.4f}  max |Δ| {np.abs(emb - ref).max():.4f}  top-10 same {same:.2f}"
        print(line, flush=True)
    n_tokens = sum(len(x) for x in tok(texts, truncation=True, max_length=model.cfg.max_length)["input_ids"])
    params = sum(p.numel() for n, p in model.encoder.named_parameters() if "embeddings" not in n)
    flops = 2 * params * n_tokens / len(texts)                       # matmul FLOPs per passage (attention excluded)
    gpu_rate = args.gpu_tflops * 1e12 / flops
    print(f"# {n_tokens / len(texts):.0f} tokens and {flops / 1e9:.2f} GFLOP per passage ({params / 1e6:.1f}M "
          f"non-embedding parameters); fp32 CPU reached {flops * len(texts) / ref_wall / 1e9:.1f} GFLOP/s wall")
    print(f"# projection (not measured): at {args.gpu_tflops:.0f} sustained TFLOP/s a GPU embeds {gpu_rate:,.0f} "
          f"passages/s: {passages.num_rows / gpu_rate:.0f} s for this corpus, {DPR_PASSAGES / gpu_rate / 60:.1f} min "
          f"for the 21M DPR passages; fp32 on this CPU: {DPR_PASSAGES / ref_rate / 3600:.0f} h")


if __name__ == "__main__":
    main()
