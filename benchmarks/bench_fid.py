"""FiD reader throughput: training examples/s through the shared loop, and first-token
cross-attention (FunnelRAG Eq. 3 input) passages/s, on real NQ-open oracle passages.

    python benchmarks/bench_fid.py                       # tiny + small on CPU, ~1-2 minutes
    python benchmarks/bench_fid.py --configs small --steps 20 --n-passages 10 --seq-len 200
    python benchmarks/bench_fid.py --device cuda --bf16  # the GPU path (when CUDA is available)

Prints one line per configuration: parameters, n_passages, seq_len, batch, threads, device,
training examples/s (steady state: the first step is excluded) and attention passages/s.
"""
from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time

import torch

from funnelrag.datasets import default_mirror, resolve
from funnelrag.training import TrainConfig, train
from models.fid import FiDConfig, FiDReader, encode_fid_inputs
from tasks.funnel.reader import ReaderExample, ReaderHooks, ReaderTrainConfig

SIZES = {"tiny": dict(d_model=64, n_layers=2, n_heads=4, d_ff=128),
         "small": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024),
         "t5-small-shape": dict(d_model=512, n_layers=6, n_heads=8, d_ff=2048)}


def oracle_examples(mirror, n_questions: int, n_passages: int) -> list[ReaderExample]:
    """Real questions; passages = gold + the gold passages of the following questions."""
    rows = []
    with gzip.open(resolve("nq-open-oracle", mirror), "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == n_questions + n_passages:
                break
    gold = [(f"oracle-{i}", r["ctxs"][0]["title"], r["ctxs"][0]["text"]) for i, r in enumerate(rows)]
    return [ReaderExample(r["question"], tuple(r["answers"]), tuple(gold[i:i + n_passages]))
            for i, r in enumerate(rows[:n_questions])]


def bench(name: str, args, mirror, tok_dir: str) -> None:
    fid = FiDConfig(tokenizer=tok_dir, **SIZES[name])
    examples = oracle_examples(mirror, args.batch_size * (args.steps + 1), args.n_passages)
    with tempfile.TemporaryDirectory() as out:
        cfg = ReaderTrainConfig(fid=fid, train=TrainConfig(
            output_dir=out, max_steps=args.steps, batch_size=args.batch_size, lr=1e-4, log_every=1,
            mixed_precision="bf16" if args.bf16 else "no", cpu=args.device == "cpu",
            gradient_checkpointing=args.gradient_checkpointing),
            n_passages=args.n_passages, max_passage_tokens=args.seq_len)
        model, tok = FiDReader.from_config(fid)
        n_params = sum(p.numel() for p in model.parameters())
        stamps: dict[int, float] = {}
        train(model, examples, ReaderHooks(tok, cfg), cfg.train,
              log_metrics=lambda m, step: stamps.__setitem__(step, time.perf_counter()))
    train_eps = (args.steps - 1) * args.batch_size / (stamps[args.steps] - stamps[1])

    model.eval()
    enc = encode_fid_inputs(tok, [e.question for e in examples[:args.batch_size]],
                            [[(t, x) for _, t, x in e.passages] for e in examples[:args.batch_size]], args.seq_len)
    device = next(model.parameters()).device
    ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    with torch.autocast(device.type, dtype=dtype, enabled=args.bf16):
        model.first_token_cross_attention(ids, mask)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.attn_reps):
            model.first_token_cross_attention(ids, mask)
        if device.type == "cuda":
            torch.cuda.synchronize()
        attn_pps = args.attn_reps * ids.shape[0] * ids.shape[1] / (time.perf_counter() - t0)
    print(f"{name:>15}  params={n_params / 1e6:6.1f}M  n_passages={args.n_passages}  seq_len={ids.shape[2]}"
          f" (max {args.seq_len})  batch={args.batch_size}  threads={torch.get_num_threads()}  device={device}"
          f"  bf16={args.bf16}  train={train_eps:7.2f} examples/s  first-token attention={attn_pps:8.1f} passages/s",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
    p.add_argument("--n-passages", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128, help="max tokens per (question, passage) pair")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--attn-reps", type=int, default=3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    mirror = default_mirror()
    if mirror is None:
        raise SystemExit("no data mirror found (set FUNNELRAG_DATA_MIRROR)")
    tok_dir = str(resolve("t5-tokenizer", mirror).parent)
    for name in args.configs:
        bench(name, args, mirror, tok_dir)


if __name__ == "__main__":
    main()
