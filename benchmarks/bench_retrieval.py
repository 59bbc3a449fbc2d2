"""Retrieval-stage costs behind FunnelRAG's time claim: exact dense search vs corpus size, BM25
over passages vs over clusters, and the bi-encoder's encoding throughput.

    python benchmarks/bench_retrieval.py                                 # dense scaling + encoder, ~1 min
    python benchmarks/bench_retrieval.py --home eval-home                 # + BM25 on a published corpus
    python benchmarks/bench_retrieval.py --sizes 10000 100000 1000000 --threads 2
    python benchmarks/bench_retrieval.py --home eval-home --bm25-only     # ours vs bm25s numba/numpy, ~1 min
    python benchmarks/bench_retrieval.py --home H --corpus syn1m --bm25-only --backends numba --no-answerability

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


def _interleaved(contenders: dict, queries: list[str], repeat: int) -> dict[tuple[str, str], float]:
    """Seconds a query of each of ``contenders`` (name → ``fn(batch)``), batched (one call) and one
    at a time (one call a query): ``repeat`` passes, each pass running every contender in turn, the
    best pass of each kept. Interleaved, so that a change of load beside the benchmark (other jobs
    on a shared box) reaches every contender alike instead of whichever ran during it."""
    out = {}
    for mode, batched in (("batched", True), ("one at a time", False)):
        best = dict.fromkeys(contenders, float("inf"))
        for _ in range(repeat):
            for who, fn in contenders.items():
                best[who] = min(best[who], _per_query(fn, queries, batched, repeat=1))
        out.update({(who, mode): sec for who, sec in best.items()})
    return out


def merge_shard_matrices(shards: list, out_dir: Path) -> Path:
    """One bm25s index over every passage of a sharded passage index: the shards' score
    matrices stacked row-wise (shard order, then row within the shard), their vocabularies joined.

    The shards are scored with the corpus-wide ``N``, ``df`` and ``avgdl``
    (:mod:`tasks.corpus.sharded.sharded_index`), so every stored ``idf(t) * tfc(t, d)`` is the one a
    single bm25s index over all passages holds, and a query's float32 sums are the same: this is
    the matrix bm25s's own backends search when the corpus is one index (what a user of bm25s would
    build), written in bm25s's layout (``data.csc.index.npy``, ``indices.csc.index.npy``,
    ``indptr.csc.index.npy``, ``vocab.index.json``, ``params.index.json``) so that
    ``bm25s.BM25.load`` opens it. Written atomically; an existing ``out_dir`` is reused.

    Parameters
    ----------
    shards : the :class:`tasks.corpus.index.BM25Index` shards, in row order (``ShardedBM25.shards``).
    out_dir : the index directory to write.

    Returns
    -------
    ``out_dir``: ``(n_docs, n_terms)`` float32 scores in CSC, ``n_docs`` = the shards' rows summed,
    ``n_terms`` = the union of the shards' terms, sorted (column ``j`` is the ``j``-th term; a
    token bm25s names past a shard's columns, its empty token, comes after them, as in bm25s).

    Raises
    ------
    ValueError
        A shard's vocabulary does not name every column of its matrix once, or the shards were
        built with different BM25 parameters.
    """
    import json  # noqa: PLC0415

    from data_contracts.base import atomic_directory  # noqa: PLC0415

    out_dir = Path(out_dir)
    if (out_dir / "params.index.json").exists():
        return out_dir
    params = [(s.retriever.k1, s.retriever.b, s.retriever.method, s.retriever.delta) for s in shards]
    if len(set(params)) != 1:
        raise ValueError(f"BM25 merge: shards built with different parameters {sorted(set(params))}")
    # bm25s names one token past the columns (its empty token "", for queries left with none):
    # kept past the merged columns too
    n_cols = [len(s.retriever.scores["indptr"]) - 1 for s in shards]
    terms = sorted({t for s, n in zip(shards, n_cols) for t, j in s.retriever.vocab_dict.items() if j < n})
    extra = sorted({t for s, n in zip(shards, n_cols) for t, j in s.retriever.vocab_dict.items() if j >= n} - set(terms))
    column = {t: j for j, t in enumerate(terms + extra)}
    to_global, lengths = [], np.zeros(len(terms), dtype=np.int64)
    for i, (s, n) in enumerate(zip(shards, n_cols)):
        indptr = np.asarray(s.retriever.scores["indptr"], dtype=np.int64)
        cols = np.full(n, -1, dtype=np.int64)
        named = 0
        for t, local in s.retriever.vocab_dict.items():
            if 0 <= local < n:
                cols[local] = column[t]
                named += 1
        if (cols < 0).any() or named != n:
            raise ValueError(f"BM25 merge: shard {i}'s vocabulary does not name each of its {n} columns once")
        lengths[cols] += np.diff(indptr)           # cols is one-to-one within a shard
        to_global.append(cols)
    indptr = np.zeros(len(terms) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    n_pairs = int(indptr[-1])
    data = np.empty(n_pairs, dtype=np.float32)
    indices = np.empty(n_pairs, dtype=np.int32)
    cursor = indptr[:-1].copy()
    base = 0
    for s, cols in zip(shards, to_global):
        sc = s.retriever.scores
        local_ptr = np.asarray(sc["indptr"], dtype=np.int64)
        per_col = np.diff(local_ptr)
        # each local column's pairs go to its global column after the earlier shards' (rows stay ascending)
        pos = np.repeat(cursor[cols] - local_ptr[:-1], per_col) + np.arange(local_ptr[-1], dtype=np.int64)
        data[pos] = np.asarray(sc["data"])
        indices[pos] = np.asarray(sc["indices"], dtype=np.int64) + base
        cursor[cols] += per_col
        base += int(sc["num_docs"])
    if base >= 2**31:
        raise ValueError(f"BM25 merge: {base} rows do not fit bm25s's int32 indices")
    r = shards[0].retriever
    meta = {"k1": r.k1, "b": r.b, "delta": r.delta, "method": r.method, "idf_method": r.idf_method,
            "dtype": r.dtype, "int_dtype": r.int_dtype, "num_docs": base}
    with atomic_directory(out_dir) as tmp:
        np.save(tmp / "data.csc.index.npy", data)
        np.save(tmp / "indices.csc.index.npy", indices)
        np.save(tmp / "indptr.csc.index.npy", indptr)
        (tmp / "vocab.index.json").write_text(json.dumps(column, ensure_ascii=False))
        (tmp / "params.index.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    return out_dir


def _bm25s_retrieve(ref, ours, k: int):
    """bm25s's own query path over ``ref`` (a loaded ``bm25s.BM25``): ``bm25s.tokenize`` with our
    index's tokenizer settings, unknown tokens dropped (a query left empty searches bm25s's empty
    token), ``retrieve`` serial (``n_threads=0``)."""
    import bm25s  # noqa: PLC0415

    from tasks.corpus.index import TOKEN_PATTERN  # noqa: PLC0415

    def retrieve(batch):
        tokens = bm25s.tokenize(batch, lower=ours.cfg.lower, token_pattern=TOKEN_PATTERN, stopwords=ours.cfg.stopwords,
                                stemmer=ours._stem, return_ids=False, show_progress=False)
        tokens = [[t for t in toks if t in ref.vocab_dict] or [""] for toks in tokens]
        return ref.retrieve(tokens, k=k, show_progress=False, n_threads=0)
    return retrieve


def _rss() -> str:
    from funnelrag.memory import status_mb  # noqa: PLC0415

    return f"RSS {status_mb('VmRSS') or 0:,.0f} MB (anonymous {status_mb('RssAnon') or 0:,.0f}), peak {status_mb('VmHWM') or 0:,.0f} MB"


def bench_bm25(home: Path, corpus: str, n_questions: int, backends: tuple[str, ...] = ("numba", "numpy"),
               repeat: int = 3) -> None:
    """Ours (``search_rows``: the compiled top-k of :mod:`tasks.corpus.bm25_query`) against bm25s's
    backends on the same matrix and questions, batched and one at a time, from question strings
    (tokenizing included in every line); then where our time goes.

    A sharded passage index (``index.passage_shard_tokens`` > 0) is searched as the corpus
    searches it (every shard in turn into one running top-k:
    :class:`tasks.corpus.sharded.sharded_index.ShardedBM25`);
    bm25s searches one index over all the passages, the shards' matrices stacked
    (:func:`merge_shard_matrices`, the same scores; kept under ``<home>/cache/bench-retrieval/``),
    which our compiled top-k also searches ("ours, one matrix"). Every question's top-``k`` scores
    of ours and of each bm25s backend are compared (equal within 1e-6 relative, or the run stops).
    The contenders run in turn in every pass (:func:`_interleaved`), best pass kept."""
    import bm25s  # noqa: PLC0415
    import numba  # noqa: PLC0415

    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415
    from tasks.corpus.bm25_query import top_k_rows  # noqa: PLC0415
    from tasks.corpus.index import BM25Index  # noqa: PLC0415
    from tasks.corpus.published import CLUSTER_INDEX, PASSAGE_INDEX, open_corpus  # noqa: PLC0415
    from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: PLC0415

    c = open_corpus(Workspace(home), corpus)
    questions, _ = load_questions([resolve("nq-open-test", default_mirror())], QuestionsConfig(limit=n_questions))
    qs = questions["question"].to_pylist()
    print(f"BM25 {corpus}: {len(qs)} NQ-open test questions, one process, numba threads {numba.get_num_threads()} "
          f"(bm25s serial: n_threads=0), best of {repeat} passes; {_rss()}", flush=True)
    for name, index, k in (("passages", c.passage_index(), 400), ("clusters", c.cluster_index(), 80)):
        shards = getattr(index, "shards", None)
        where = c.path / (PASSAGE_INDEX if name == "passages" else CLUSTER_INDEX)
        ours = {"ours": index}
        if shards is not None:
            merged = Path(home) / "cache" / "bench-retrieval" / corpus / c.manifest["content_digest"][:16] / f"{name}.bm25"
            t0 = time.perf_counter()
            where = merge_shard_matrices(shards, merged)
            print(f"BM25 {name}: {len(shards)} shards of {min(map(len, shards)):,}-{max(map(len, shards)):,} rows; "
                  f"bm25s searches them as one index {merged.name} (the matrices stacked: "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)
            one = bm25s.BM25.load(str(where), mmap=True, show_progress=False)
            ours["ours, one matrix"] = BM25Index(one, range(len(index)), shards[0].cfg)
        t0 = time.perf_counter()
        index.search_rows(qs[:1], k)
        first = time.perf_counter() - t0
        contenders = {who: (lambda b, ix=ix: ix.search_rows(b, k)) for who, ix in ours.items()}
        contenders["ours + ids"] = lambda b: index.search(b, k)
        tokenizer = shards[0] if shards is not None else index
        firsts = {}
        for backend in backends:
            ref = bm25s.BM25.load(str(where), mmap=True, show_progress=False)
            ref.backend = backend
            retrieve = _bm25s_retrieve(ref, tokenizer, k)
            t0 = time.perf_counter()
            retrieve(qs[:1])
            firsts[backend] = time.perf_counter() - t0
            _, ref_scores = retrieve(qs)
            _, our_scores = index.search_rows(qs, k)
            if not np.allclose(np.asarray(ref_scores, dtype=np.float32), our_scores, rtol=1e-6, atol=0):
                raise SystemExit(f"BM25 {name}: ours and bm25s {backend} disagree on the top-{k} scores")
            contenders[f"bm25s {backend}"] = retrieve
            print(f"BM25 {name} after loading bm25s {backend}: {_rss()}", flush=True)
        lines = _interleaved(contenders, qs, repeat)
        print(f"BM25 {name} after the runs: {_rss()}", flush=True)
        checked = ", ".join(backends)
        lines.update({(f"bm25s {b}", "first query"): sec for b, sec in firsts.items()})
        base = {m: lines[(f"bm25s {backends[0]}", m)] for m in ("batched", "one at a time")}
        print(f"BM25 {name:<9} n={len(index):>9,} top-{k:<3} ours first query in this process {first * 1e3:7.1f} ms "
              f"(kernels from numba's cache), bm25s {backends[0]} "
              f"{lines[(f'bm25s {backends[0]}', 'first query')] * 1e3:7.1f} ms; top-{k} scores equal to bm25s "
              f"{checked}'s for all {len(qs)} questions")
        for (who, mode), sec in lines.items():
            if mode != "first query":
                print(f"BM25 {name:<9} {who:<16} {mode:<14} {sec * 1e3:8.3f} ms/query  "
                      f"{sec / base[mode]:6.2f}x bm25s {backends[0]}")
        # where our batched time goes on one matrix: tokenizing, id mapping, the compiled top-k
        flat = ours.get("ours, one matrix", index)
        tokens_t = _per_query(tokenizer.tokenize, qs, True, repeat)
        tokens = tokenizer.tokenize(qs)
        vocab = flat.retriever.vocab_dict
        map_t = _per_query(lambda b: [[vocab[t] for t in toks if t in vocab] for toks in tokens], qs, True, repeat)
        ids = [[vocab[t] for t in toks if t in vocab] for toks in tokens]
        sc = flat.retriever.scores
        arrays = (np.asarray(sc["data"]), np.asarray(sc["indices"]), np.asarray(sc["indptr"]), int(sc["num_docs"]))
        topk_t = _per_query(lambda b: top_k_rows(ids, *arrays, k), qs, True, repeat)
        print(f"BM25 {name:<9} ours batched, one matrix, parts: tokenize {tokens_t * 1e3:.3f}  ids {map_t * 1e3:.3f}  "
              f"top-k {topk_t * 1e3:.3f} ms/query", flush=True)
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
    p.add_argument("--backends", nargs="+", choices=("numba", "numpy"), default=["numba", "numpy"],
                   help="bm25s backends to compare with, the first the ratios' base")
    p.add_argument("--repeat", type=int, default=3, help="passes over the questions; the best is kept")
    p.add_argument("--no-answerability", action="store_true", help="skip the answerability line")
    args = p.parse_args()
    if not args.bm25_only:
        bench_dense(args.sizes, args.dim, args.batch)
        bench_encoder(args.threads, args.n_texts)
    if args.home is not None:
        bench_bm25(args.home, args.corpus, args.questions, tuple(args.backends), args.repeat)
        if not args.no_answerability:
            bench_answerability(args.home, args.corpus, args.questions)


if __name__ == "__main__":
    main()
