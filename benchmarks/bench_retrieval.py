"""Retrieval-stage costs behind FunnelRAG's time claim: exact dense search vs corpus size, BM25
over passages vs over clusters, and the bi-encoder's encoding throughput.

    python benchmarks/bench_retrieval.py                                 # dense scaling + encoder, ~1 min
    python benchmarks/bench_retrieval.py --home eval-home                 # + BM25 on a published corpus
    python benchmarks/bench_retrieval.py --sizes 10000 100000 1000000 --threads 2

Prints, per line: what was measured, its size and the figure (ms per query, queries/s,
tokens/s, bytes). Exact dense search is faiss ``IndexFlatIP`` (``tasks/evaluate/flat_dense.py``, kind
``flat``) over float32 unit vectors drawn from a fixed seed (an exact search's cost
does not depend on the values); the 21M line extrapolates linearly (exact search is O(n · d)).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

DPR_PASSAGES = 21_015_324  # passages of the DPR Wikipedia split (FunnelRAG's flat corpus)


def _timeit(fn, repeat: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def bench_dense(sizes: list[int], dim: int, batch: int) -> None:
    from tasks.evaluate.flat_dense import FlatDenseConfig, build_faiss_index  # noqa: PLC0415

    rng = np.random.default_rng(0)
    q1 = rng.standard_normal((1, dim), dtype=np.float32)
    q1 /= np.linalg.norm(q1, axis=1, keepdims=True)
    qb = rng.standard_normal((batch, dim), dtype=np.float32)
    qb /= np.linalg.norm(qb, axis=1, keepdims=True)
    per_row = {}
    for n in sizes:
        emb = rng.standard_normal((n, dim), dtype=np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        index = build_faiss_index(emb, FlatDenseConfig(kind="flat"))
        one = _timeit(lambda: index.search(q1, 400), repeat=5)
        many = _timeit(lambda: index.search(qb, 400), repeat=2)
        per_row[n] = one / n
        print(f"dense exact  n={n:>9,} d={dim} float32  memory {emb.nbytes / 2**20:8.1f} MiB  "
              f"1 query {one * 1e3:8.2f} ms  batch {batch}: {batch / many:8.1f} queries/s")
        del emb
    n = max(sizes)
    est = per_row[n] * DPR_PASSAGES
    mem = DPR_PASSAGES * dim * 4
    print(f"dense exact  n={DPR_PASSAGES:>9,} d={dim} float32  memory {mem / 2**30:8.1f} GiB  "
          f"1 query ~{est * 1e3:7.0f} ms (linear extrapolation from n={n:,})")


def bench_encoder(threads: int, n_texts: int) -> None:
    import torch  # noqa: PLC0415

    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from models.encoders import BiEncoder, EncoderConfig, encode  # noqa: PLC0415

    torch.set_num_threads(threads)
    mirror = default_mirror()
    import gzip  # noqa: PLC0415
    import json  # noqa: PLC0415

    with gzip.open(resolve("nq-open-oracle", mirror), "rt", encoding="utf-8") as fh:
        texts = [json.loads(line)["ctxs"][0]["text"] for _, line in zip(range(n_texts), fh)]
    for max_length in (128, 256):
        model, tok = BiEncoder.from_pretrained(EncoderConfig(max_length=max_length))
        n_tokens = sum(min(len(x), max_length) for x in tok(texts, truncation=True, max_length=max_length)["input_ids"])
        sec = _timeit(lambda: encode(model, tok, texts, batch_size=32), repeat=1)
        print(f"MiniLM encode  {n_texts} real passages  max_length={max_length}  threads={threads}  "
              f"{n_tokens / sec:8.0f} tokens/s  {n_texts / sec:6.1f} passages/s")


def bench_bm25(home: Path, corpus: str, n_questions: int) -> None:
    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415
    from tasks.corpus.published import open_corpus  # noqa: PLC0415
    from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: PLC0415

    c = open_corpus(Workspace(home), corpus)
    questions, _ = load_questions([resolve("nq-open-test", default_mirror())], QuestionsConfig(limit=n_questions))
    qs = questions["question"].to_pylist()
    for name, index, k in (("passages", c.passage_index(), 400), ("clusters", c.cluster_index(), 80)):
        t0 = time.perf_counter()
        for q in qs:
            index.search([q], k)
        per_q = (time.perf_counter() - t0) / len(qs)
        print(f"BM25 {name:<9} {corpus} n={len(index):>9,}  top-{k:<3}  {per_q * 1e3:8.2f} ms/query (one at a time)")
    t0 = time.perf_counter()
    ids, _ = c.cluster_index().search(qs[:10], 80)
    for row in ids:
        c.members_of([int(i) for i in row])
    print(f"members_of  {corpus} 80 clusters  {(time.perf_counter() - t0) / 10 * 1e3:8.2f} ms/query")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads for the encoder")
    p.add_argument("--n-texts", type=int, default=64)
    p.add_argument("--home", type=Path, default=None, help="funnelrag home with a published corpus")
    p.add_argument("--corpus", default="wikispeedia")
    p.add_argument("--questions", type=int, default=50)
    args = p.parse_args()
    bench_dense(args.sizes, args.dim, args.batch)
    bench_encoder(args.threads, args.n_texts)
    if args.home is not None:
        bench_bm25(args.home, args.corpus, args.questions)


if __name__ == "__main__":
    main()
