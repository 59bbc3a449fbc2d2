"""R²AG overheads on CPU: feature extraction (Eqs. 10–12), R²-Former + QDM forward, and the
retrieval-aware prompt (projection + placeholder assembly, Eqs. 3–5) relative to the generator's
own forward pass (the paper reports +0.8% latency for R²AG).

Run: ``python benchmarks/bench_r2ag.py [--lists 2000] [--k 10] [--repeats 5]``. Prints its figures;
no assertions. Embeddings are random unit vectors of MiniLM's size (384); the generator is the
from-scratch Llama of ``tasks.r2ag.generation`` with the real T5 tokenizer when the data mirror is
present (else a 32k vocabulary without tokenizer).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _time(fn, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs (after one warm-up)."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    from models.r2ag_generator import ProjectionConfig, R2AGModel, RetrievalProjection, assemble_inputs_embeds
    from models.r2former import R2FormerConfig, R2FormerQDM
    from tasks.r2ag.features import retrieval_features

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lists", type=int, default=2000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=1024, help="prompt tokens for the generator timing")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = np.random.default_rng(0)
    q = rng.normal(size=(args.lists, 384))
    d = rng.normal(size=(args.lists, args.k, 384))

    def features():
        for i in range(args.lists):
            retrieval_features(q[i], d[i])

    t = _time(features, max(1, args.repeats // 2))
    print(f"features (Eqs. 10-12): {args.lists} lists x k={args.k}: {t:.3f} s "
          f"= {t / args.lists * 1e6:.0f} us/list")

    torch.manual_seed(0)
    model = R2FormerQDM(R2FormerConfig()).eval()
    feats = torch.randn(32, args.k, 3)
    mask = torch.ones(32, args.k, dtype=torch.bool)
    with torch.no_grad():
        t = _time(lambda: model(feats, mask), args.repeats)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"R2-Former+QDM forward: batch 32 lists x k={args.k}: {t * 1e3:.2f} ms ({n_params / 1e6:.2f} M params)")

    from transformers import LlamaConfig, LlamaForCausalLM

    gen = LlamaForCausalLM(LlamaConfig(vocab_size=32101, hidden_size=128, intermediate_size=344,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                       max_position_embeddings=args.seq_len + 64)).eval()
    r_id = 32100
    proj = RetrievalProjection(ProjectionConfig(in_size=256, out_size=128))
    r2ag = R2AGModel(model, proj, gen, r_id).eval()
    ids = torch.randint(0, 32000, (1, args.seq_len))
    ids[0, torch.linspace(10, args.seq_len - 20, args.k).long()] = r_id  # (1, seq_len), k placeholders
    att = torch.ones_like(ids)
    f1, m1 = feats[:1], mask[:1]
    with torch.no_grad():
        t_plain = _time(lambda: gen(input_ids=ids, attention_mask=att), args.repeats)
        t_r2ag = _time(lambda: r2ag(f1, m1, ids, att), args.repeats)
        tok = gen.get_input_embeddings()(ids)
        e_r = proj(model(f1, m1).hidden)
        t_asm = _time(lambda: assemble_inputs_embeds(tok, ids, r_id, e_r, m1), args.repeats)
    print(f"generator forward, {args.seq_len} tokens: plain {t_plain * 1e3:.1f} ms, with R2AG "
          f"{t_r2ag * 1e3:.1f} ms (+{(t_r2ag / t_plain - 1) * 100:.1f}%), placeholder assembly alone "
          f"{t_asm * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
