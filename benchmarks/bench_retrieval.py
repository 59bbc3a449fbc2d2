"""Retrieval-stage costs behind FunnelRAG's time claim: exact dense search vs corpus size, BM25
over passages vs over clusters, and the bi-encoder's encoding throughput.

    python benchmarks/bench_retrieval.py                                 # dense scaling + encoder, ~1 min
    python benchmarks/bench_retrieval.py --home eval-home                 # + BM25 on a published corpus
    python benchmarks/bench_retrieval.py --sizes 10000 100000 1000000 --threads 2
    python benchmarks/bench_retrieval.py --home eval-home --bm25-only     # ours vs bm25s numba/numpy, ~1 min

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


def _per_query(fn, queries: list[str], batched: bool, repeat: int = 3) -> float:
    """Best of ``repeat`` runs of ``fn`` over ``queries`` (one call, or one call a query), seconds a query."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        if batched:
            fn(queries)
        else:
            for q in queries:
                fn([q])
        best = min(best, time.perf_counter() - t0)
    return best / len(queries)


def bench_bm25(home: Path, corpus: str, n_questions: int) -> None:
    """Ours (:meth:`tasks.corpus.index.BM25Index.search_rows`, the compiled top-k) against bm25s's
    numba and numpy backends on the same index files and questions, batched and one at a time,
    from question strings (tokenizing included in every line); then where our time goes."""
    import bm25s  # noqa: PLC0415
    import numba  # noqa: PLC0415

    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415
    from tasks.corpus.bm25_query import top_k_rows  # noqa: PLC0415
    from tasks.corpus.published import CLUSTER_INDEX, PASSAGE_INDEX, open_corpus  # noqa: PLC0415
    from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: PLC0415

    c = open_corpus(Workspace(home), corpus)
    questions, _ = load_questions([resolve("nq-open-test", default_mirror())], QuestionsConfig(limit=n_questions))
    qs = questions["question"].to_pylist()
    print(f"BM25 {corpus}: {len(qs)} NQ-open test questions, one process, numba threads {numba.get_num_threads()} "
          f"(bm25s serial: n_threads=0)")
    for name, index, k in (("passages", c.passage_index(), 400), ("clusters", c.cluster_index(), 80)):
        shards = getattr(index, "shards", [index])
        if len(shards) > 1:
            print(f"BM25 {name}: {len(shards)} shards; bm25s has one index a shard, compared on the first only")
        ours = shards[0]
        t0 = time.perf_counter()
        ours.search_rows(qs[:1], k)
        first = time.perf_counter() - t0
        lines = {}
        for mode, batched in (("batched", True), ("one at a time", False)):
            lines[("ours", mode)] = _per_query(lambda b: ours.search_rows(b, k), qs, batched)
            lines[("ours + ids", mode)] = _per_query(lambda b: ours.search(b, k), qs, batched)
        stem = ours._stem
        for backend in ("numba", "numpy"):
            where = c.path / (PASSAGE_INDEX if name == "passages" else CLUSTER_INDEX)
            ref = bm25s.BM25.load(str(where / "shard-00000" if len(shards) > 1 else where), mmap=True, show_progress=False)
            ref.backend = backend

            def retrieve(batch, ref=ref):
                tokens = bm25s.tokenize(batch, lower=True, stopwords=ours.cfg.stopwords, stemmer=stem,
                                        return_ids=False, show_progress=False)
                tokens = [[t for t in toks if t in ref.vocab_dict] or [""] for toks in tokens]
                return ref.retrieve(tokens, k=k, show_progress=False, n_threads=0)
            t0 = time.perf_counter()
            retrieve(qs[:1])
            lines[(f"bm25s {backend}", "first query")] = time.perf_counter() - t0
            for mode, batched in (("batched", True), ("one at a time", False)):
                lines[(f"bm25s {backend}", mode)] = _per_query(retrieve, qs, batched)
        base = {m: lines[("bm25s numba", m)] for m in ("batched", "one at a time")}
        print(f"BM25 {name:<9} n={len(ours):>9,} top-{k:<3} ours first query in this process {first * 1e3:7.1f} ms "
              f"(kernels from numba's cache), bm25s numba {lines[('bm25s numba', 'first query')] * 1e3:7.1f} ms (compiles)")
        for (who, mode), sec in lines.items():
            if mode != "first query":
                print(f"BM25 {name:<9} {who:<12} {mode:<14} {sec * 1e3:8.3f} ms/query  "
                      f"{sec / base[mode]:6.2f}x bm25s numba")
        # where our batched time goes: tokenizing, id mapping, the compiled top-k
        tokens_t = _per_query(ours.tokenize, qs, True)
        tokens = ours.tokenize(qs)
        vocab = ours.retriever.vocab_dict
        map_t = _per_query(lambda b: [[vocab[t] for t in toks if t in vocab] for toks in tokens], qs, True)
        ids = [[vocab[t] for t in toks if t in vocab] for toks in tokens]
        sc = ours.retriever.scores
        arrays = (np.asarray(sc["data"]), np.asarray(sc["indices"]), np.asarray(sc["indptr"]), int(sc["num_docs"]))
        topk_t = _per_query(lambda b: top_k_rows(ids, *arrays, k), qs, True)
        print(f"BM25 {name:<9} ours batched, parts: tokenize {tokens_t * 1e3:.3f}  ids {map_t * 1e3:.3f}  "
              f"top-k {topk_t * 1e3:.3f} ms/query")
    t0 = time.perf_counter()
    ids, _ = c.cluster_index().search(qs[:10], 80)
    for row in ids:
        c.members_of([int(i) for i in row])
    print(f"members_of  {corpus} 80 clusters  {(time.perf_counter() - t0) / 10 * 1e3:8.2f} ms/query")


def bench_answerability(home: Path, corpus: str, n_questions: int) -> None:
    """:func:`tasks.evaluate.stages.answerability` (the evaluate flow's call) of the first
    ``n_questions`` NQ-open dev questions with two or more answers over every passage text."""
    import pyarrow.compute as pc  # noqa: PLC0415

    from data_contracts.corpus import PASSAGES  # noqa: PLC0415
    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415
    from tasks.corpus.published import open_corpus  # noqa: PLC0415
    from tasks.evaluate.stages import answerability  # noqa: PLC0415
    from tasks.qa.questions import load_questions  # noqa: PLC0415

    c = open_corpus(Workspace(home), corpus)
    texts = c.table(PASSAGES)["text"].to_pylist()
    questions, _ = load_questions([resolve("nq-open-dev", default_mirror())])
    questions = questions.filter(pc.greater_equal(pc.list_value_length(questions["answers"]), 2)).slice(0, n_questions)
    aliases = sum(len(a) for a in questions["answers"].to_pylist())
    found, seconds = answerability(texts, questions)
    print(f"answerability {corpus} {len(texts):,} passages ({sum(map(len, texts)) / 1e6:.0f} M characters)  "
          f"{questions.num_rows} NQ-open dev questions with >= 2 answers ({aliases} aliases)  "
          f"{sum(found.values())} answerable  {seconds:6.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch threads for the encoder")
    p.add_argument("--n-texts", type=int, default=64)
    p.add_argument("--home", type=Path, default=None, help="funnelrag home with a published corpus")
    p.add_argument("--corpus", default="wikispeedia")
    p.add_argument("--questions", type=int, default=300)
    p.add_argument("--bm25-only", action="store_true", help="only the BM25 and answerability lines (needs --home)")
    args = p.parse_args()
    if not args.bm25_only:
        bench_dense(args.sizes, args.dim, args.batch)
        bench_encoder(args.threads, args.n_texts)
    if args.home is not None:
        bench_bm25(args.home, args.corpus, args.questions)
        bench_answerability(args.home, args.corpus, args.questions)


if __name__ == "__main__":
    main()
