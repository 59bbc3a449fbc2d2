"""Scoring throughput of the FunnelRAG distillation: Eq. 3 attention scoring (passages/s) with
the FiD reader, and pre-ranker scoring (question, document unit) pairs/s, on real NQ-open
oracle questions and Wikipedia passages.

    python benchmarks/bench_scoring.py                          # CPU defaults, ~1-3 minutes
    python benchmarks/bench_scoring.py --fid small --n-passages 40 --questions 8
    python benchmarks/bench_scoring.py --device cuda            # where CUDA is available

Prints one line per measurement: wall seconds, process CPU seconds (the machine may be
shared: CPU seconds are the compute, wall includes waiting) and throughput per wall second.
Attention scoring runs :func:`tasks.funnel.attention.score_candidates` (FiD single decoder step +
Eq. 3 aggregation); the pre-ranker runs :func:`models.preranker.score_pairs` (every pair
through the model, as the cross-encoder and the training loop do) and, for the bi-encoder,
:func:`models.preranker.score_grouped` (each distinct text embedded once, as the funnel does).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_contracts.funnel import CANDIDATES  # noqa: E402
from funnelrag.datasets import default_mirror, resolve  # noqa: E402
from models.fid import FiDConfig, FiDReader  # noqa: E402
from models.preranker import PreRankerConfig, build_preranker, score_grouped, score_pairs  # noqa: E402
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, score_candidates  # noqa: E402

FID_SIZES = {"tiny": dict(d_model=64, n_layers=2, n_heads=4, d_ff=256),
             "small": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024),
             "t5-small-shape": dict(d_model=512, n_layers=6, n_heads=8, d_ff=2048)}


def oracle(mirror, n: int) -> list[dict]:
    rows = []
    with gzip.open(resolve("nq-open-oracle", mirror), "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def bench_attention(rows, args, device) -> None:
    n_q, n_p = args.questions, args.n_passages
    questions = pa.table({"question_id": [f"q{i:04d}" for i in range(n_q)], "question": [r["question"] for r in rows[:n_q]]})
    cand = []
    for i in range(n_q):
        for j in range(n_p):
            ctx = rows[(i + j) % len(rows)]["ctxs"][0]
            cand.append({"question_id": f"q{i:04d}", "cluster_id": 0, "bm25_score": 0.0, "unit_id": f"c{j:07d}.u000",
                         "unit_rank": j, "prerank_score": 0.0, "unit_has_answer": False,
                         "passage_id": f"c{j:07d}.u000.p000", "passage_position": 0, "title": ctx["title"],
                         "text": ctx["text"], "has_answer": False})
    table = CANDIDATES.validate(pa.Table.from_pylist(cand, schema=CANDIDATES.schema))
    tok_dir = resolve("t5-tokenizer", args.mirror).parent
    for size in args.fid:
        model, tok = FiDReader.from_config(FiDConfig(tokenizer=str(tok_dir), **FID_SIZES[size]))
        model.to(device).eval()
        run = AttentionRunConfig(max_passage_tokens=args.seq_len, batch_size=args.batch)
        score_candidates(table.slice(0, n_p), questions, model, tok, AttentionScoreConfig(), run)  # warm-up
        _, wall, cpu = timed(lambda: score_candidates(table, questions, model, tok, AttentionScoreConfig(), run))
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"attention  fid={size:<14} params={params:6.1f}M n_passages={n_p} seq_len<={args.seq_len} "
              f"batch={args.batch} device={device}  wall={wall:7.2f}s cpu={cpu:7.2f}s  "
              f"{table.num_rows / wall:8.1f} passages/s ({table.num_rows / cpu:.1f} per CPU-s)")


def bench_preranker(rows, args, device) -> None:
    queries = [r["question"] for r in rows]
    # a document unit ≈ 1K tokens: concatenate consecutive gold passages (~100 words each)
    units = [" ".join(rows[(i + j) % len(rows)]["ctxs"][0]["text"] for j in range(args.unit_passages))
             for i in range(len(rows))]
    n = args.pairs
    pairs_q = [queries[i % len(queries)] for i in range(n)]
    pairs_d = [units[(i * 7) % len(units)] for i in range(n)]
    for kind in args.kinds:
        model, tok = build_preranker(PreRankerConfig(kind=kind, max_length=args.max_length))
        model.to(device)
        score_pairs(model, tok, pairs_q[:8], pairs_d[:8], args.batch_size)  # warm-up
        _, wall, cpu = timed(lambda: score_pairs(model, tok, pairs_q, pairs_d, args.batch_size))
        print(f"preranker  kind={kind:<5} max_length={args.max_length} pairs={n} device={device}  "
              f"wall={wall:7.2f}s cpu={cpu:7.2f}s  {n / wall:8.1f} pairs/s ({n / cpu:.1f} per CPU-s; "
              "every pair through the model)")
        if kind == "bi":
            idx = [(i % len(queries), (i * 7) % len(units)) for i in range(n)]
            _, wall, cpu = timed(lambda: score_grouped(model, tok, queries, units, idx, args.batch_size))
            n_q, n_u = len({i for i, _ in idx}), len({j for _, j in idx})
            print(f"preranker  kind=bi    max_length={args.max_length} pairs={n} device={device}  "
                  f"wall={wall:7.2f}s cpu={cpu:7.2f}s  {n / wall:8.1f} pairs/s ({n / cpu:.1f} per CPU-s; "
                  f"grouped: {n_q} questions + {n_u} units embedded once)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fid", nargs="+", default=["tiny", "small"], choices=list(FID_SIZES))
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--n-passages", type=int, default=24)
    ap.add_argument("--seq-len", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1, help="questions per FiD forward")
    ap.add_argument("--kinds", nargs="+", default=["bi", "cross"], choices=["bi", "cross"])
    ap.add_argument("--pairs", type=int, default=96)
    ap.add_argument("--unit-passages", type=int, default=4, help="gold passages per synthetic ~unit")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-preranker", action="store_true")
    args = ap.parse_args()
    args.mirror = default_mirror()
    device = torch.device(args.device)
    print(f"torch threads={torch.get_num_threads()} load average={' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rows = oracle(args.mirror, max(args.questions + args.n_passages, 64))
    with torch.inference_mode():
        if not args.skip_attention:
            bench_attention(rows, args, device)
        if not args.skip_preranker:
            bench_preranker(rows, args, device)


if __name__ == "__main__":
    main()
