"""BM25 indexing throughput: funnelrag's BM25Index.build vs bm25s called directly on the same
tokens, on the real Wikispeedia passages of a published corpus (or the enwiki sample).

Usage: python benchmarks/bench_index.py [--home funnelrag-home] [--corpus wikispeedia]
Prints documents/s for: tokenization (bm25s.tokenize + PyStemmer), indexing from token ids with
bm25s directly, and the whole BM25Index.build (tokenize + index), plus query latency.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from funnelrag.workspace import Workspace
from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.published import open_corpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", default="funnelrag-home")
    ap.add_argument("--corpus", default="wikispeedia")
    ap.add_argument("--limit", type=int, default=0, help="first N passages only (0 = all)")
    args = ap.parse_args()
    corpus = open_corpus(Workspace(Path(args.home)), args.corpus)
    p = corpus.passages
    texts = [f"{t}\n{x}" for t, x in zip(p.column("title").to_pylist(), p.column("text").to_pylist())]
    if args.limit:
        texts = texts[: args.limit]
    ids = [str(i) for i in range(len(texts))]
    cfg = BM25Config()
    n_mb = sum(len(t) for t in texts) / 1e6
    print(f"corpus {args.corpus} {corpus.version}: {len(texts):,} passages, {n_mb:.1f} MB of text")

    stem = Stemmer.Stemmer("english").stemWords
    t0 = time.perf_counter()
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stem, return_ids=True, show_progress=False)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    direct = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    direct.index(tokens, show_progress=False)
    t_direct = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = BM25Index.build(texts, ids, cfg)
    t_ours = time.perf_counter() - t0
    print(f"bm25s.tokenize (stemmed, stop words)   : {len(texts) / t_tok:10,.0f} docs/s  ({t_tok:.1f} s)")
    print(f"bm25s.BM25.index on the same token ids  : {len(texts) / t_direct:10,.0f} docs/s  ({t_direct:.1f} s)")
    print(f"bm25s tokenize + index (direct total)   : {len(texts) / (t_tok + t_direct):10,.0f} docs/s  ({t_tok + t_direct:.1f} s)")
    print(f"funnelrag BM25Index.build (same work)   : {len(texts) / t_ours:10,.0f} docs/s  ({t_ours:.1f} s)")

    queries = ["who wrote the origin of species", "capital city of australia", "largest planet in the solar system",
               "when did the second world war end", "what is photosynthesis"] * 20
    t0 = time.perf_counter()
    _, scores = ours.search(queries, k=100)
    t_q = time.perf_counter() - t0
    print(f"query latency (k=100, {len(queries)} queries)   : {1000 * t_q / len(queries):8.2f} ms/query; top score mean {np.mean(scores[:, 0]):.2f}")


if __name__ == "__main__":
    main()
