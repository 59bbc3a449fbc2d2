"""What BM25 scored at query time would cost a search, beside bm25s's stored scores.

A measurement for a design option of the nightly, not a feature
(`docs/corpus-build-at-scale.md`, *What a night within 10% of a full build would take*): bm25s
stores each (term, document) score ``idf(t) * tfc(tf, l_d)``; a 1% day changes ``N``, ``df`` and the
mean length, so every stored score changes and a night rewrites the whole matrix. Stored term
frequencies and per-document length normalisations, scored when a query reads them, would not.

From a published BM25 index (``<version>/index/clusters.bm25`` or ``passages.bm25``) and the texts
it indexed, this script:

1. re-tokenizes the texts with the index's own settings (:func:`tasks.corpus.index.tokenize_ids`)
   for the document lengths, and derives the term frequencies from the stored scores; it checks
   that scoring them gives every stored score bit for bit (``BM25 scores from tf: identical``);
2. searches NQ-open *validation* questions (``nq-open-dev.tsv``) both ways and checks the same rows
   and scores: the stored matrix with :func:`tasks.corpus.bm25_query.top_k_rows`; at query time,
   the columns of the batch's distinct query terms scored into a scratch matrix
   (:func:`score_columns`, the same float operations as :func:`tasks.corpus.bm25_csc.bm25_csc`),
   then the same top-k over it. The scratch matrix copies the columns' rows too, so the second
   figure is an upper bound of a kernel that would add the scores as it computes them;
3. prints seconds a query (best of ``--repeat``) for batches of ``--batch`` questions, and the
   postings read a query.

    python benchmarks/bench_bm25_query_time_scores.py <version dir> --index passages \\
        --questions <data>/nq-open/nq-open-dev.tsv --k 100 --batch 1 64

Texts: ``passages.parquet`` (``title`` + ``"\\n"`` + ``text``, as the index stage joins them) for
``passages``; clusters are not supported (their text is assembled from members).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numba
import numpy as np
import pyarrow.parquet as pq

from tasks.corpus.bm25_csc import idf_array
from tasks.corpus.bm25_query import top_k_rows
from tasks.corpus.index import BM25Index, _stemmer, tokenize_ids
from tasks.qa.questions import QuestionsConfig, read_questions


@numba.njit(nogil=True)   # not cached: run as a script and imported by its test, one cache would name two modules
def score_columns(terms, tf, indices, indptr, idf, norms, out_data, out_indices, out_indptr):  # pragma: no cover
    """Columns ``terms`` of the score matrix scored from term frequencies (robertson / lucene:
    ``idf(t) * tf / (norm_d + tf)`` in float64, ``tf`` and ``idf`` float32, rounded to float32: the
    operations of :func:`tasks.corpus.bm25_csc._scatter_scores`) into ``out_*`` (a CSC matrix of
    ``len(terms)`` columns, column ``i`` = term ``terms[i]``). Returns the postings written."""
    pos = 0
    for i in range(terms.size):
        t = terms[i]
        out_indptr[i] = pos
        f = np.float64(idf[t])
        for j in range(indptr[t], indptr[t + 1]):
            d = indices[j]
            x = np.float64(np.float32(tf[j]))
            out_data[pos] = np.float32(f * (x / (norms[d] + x)))
            out_indices[pos] = d
            pos += 1
    out_indptr[terms.size] = pos
    return pos


def passage_texts(version: Path) -> list[str]:
    """``title + "\\n" + text`` of every passage, in row order (the passage index's rows)."""
    table = pq.read_table(version / "passages.parquet", columns=["title", "text"])
    return [f"{a}\n{b}" for a, b in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]


def lazy_arrays(index: BM25Index, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tf, norms, idf)``: uint16 ``(n_pairs,)`` term frequencies in the stored matrix's order,
    float64 ``(n_docs,)`` length normalisations ``k1 * (1 - b + b * l_d / mean l)`` and float32
    ``(n_vocab,)`` idf, checked to give every stored score bit for bit.

    Raises ``ValueError`` when the texts do not give the index's documents, or a score differs."""
    cfg = index.cfg
    if cfg.method not in ("lucene", "robertson"):
        raise ValueError(f"only lucene / robertson are measured here, not {cfg.method!r}")
    data, indices, indptr, n_docs = index._csc
    if len(texts) != n_docs:
        raise ValueError(f"{len(texts)} texts for an index of {n_docs} documents")
    tokens = tokenize_ids(texts, cfg, _stemmer(cfg.stemmer))
    lengths = np.diff(tokens.ids.offsets)
    avg = float(lengths.mean())
    norms = cfg.k1 * ((1.0 - cfg.b) + cfg.b * lengths.astype(np.float64) / avg)
    from bm25s.scoring import _select_idf_scorer  # noqa: PLC0415  (bm25s, as the index stage calls it)

    idf = idf_array(np.diff(indptr), n_docs, _select_idf_scorer(cfg.method))
    col = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    x = data.astype(np.float64) / idf[col].astype(np.float64)
    norm_d = norms[indices]
    tf = np.rint(norm_d * x / (1.0 - x)).astype(np.uint16)
    again = (idf[col].astype(np.float64) * (tf.astype(np.float64) / (norm_d + tf))).astype(np.float32)
    bad = int(np.count_nonzero(again != data))
    if bad:
        raise ValueError(f"{bad} of {data.size} stored scores differ when scored from tf")
    return tf, norms, idf


def questions(path: Path, limit: int) -> list[str]:
    """The first ``limit`` valid questions of a QA file (:func:`tasks.qa.questions.read_questions`)."""
    return [r["question"] for r in read_questions(path, QuestionsConfig(limit=limit))]


def measure(index: BM25Index, tf, norms, idf, qs: list[str], k: int, batch: int, repeat: int) -> dict:
    """Seconds a query both ways, best of ``repeat``, over batches of ``batch`` questions; checks
    the same rows and scores."""
    data, indices, indptr, n_docs = index._csc
    vocab = index.retriever.vocab_dict
    ids = [np.array([vocab[t] for t in toks if t in vocab], np.int64) for toks in index.tokenize(qs)]
    batches = [ids[i:i + batch] for i in range(0, len(ids), batch)]
    top_k_rows(batches[0], data, indices, indptr, n_docs, k)          # compile / load the kernels
    best = {"stored": np.inf, "query_time": np.inf, "scoring": np.inf}
    for _ in range(repeat):
        t0 = time.perf_counter()
        stored = [top_k_rows(b, data, indices, indptr, n_docs, k) for b in batches]
        t1 = time.perf_counter()
        lazy, scoring = [], 0.0
        for b in batches:
            s0 = time.perf_counter()
            terms, inverse = np.unique(np.concatenate(b) if b else np.zeros(0, np.int64), return_inverse=True)
            n = int(sum(indptr[t + 1] - indptr[t] for t in terms.tolist()))
            out_data, out_indices = np.empty(n, np.float32), np.empty(n, np.int32)
            out_indptr = np.empty(terms.size + 1, np.int64)
            score_columns(terms, tf, indices, indptr, idf, norms, out_data, out_indices, out_indptr)
            local, at = [], 0
            for q in b:
                local.append(inverse[at:at + q.size])
                at += q.size
            scoring += time.perf_counter() - s0
            lazy.append(top_k_rows(local, out_data, out_indices, out_indptr, n_docs, k))
        t2 = time.perf_counter()
        best = {"stored": min(best["stored"], t1 - t0), "query_time": min(best["query_time"], t2 - t1),
                "scoring": min(best["scoring"], scoring)}
    for (r1, s1), (r2, s2) in zip(stored, lazy):
        if not (np.array_equal(r1, r2) and np.array_equal(s1, s2)):
            raise ValueError("the query-time scores rank other rows or give other scores")
    postings = sum(int(indptr[t + 1] - indptr[t]) for q in ids for t in q.tolist())
    n = len(qs)
    return {"batch": batch, "queries": n, "k": k, "postings_a_query": postings / n,
            "stored_ms_a_query": 1e3 * best["stored"] / n, "query_time_ms_a_query": 1e3 * best["query_time"] / n,
            "of_which_scoring_ms": 1e3 * best["scoring"] / n,
            "ratio": best["query_time"] / best["stored"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", type=Path, help="a published corpus version directory")
    ap.add_argument("--index", choices=["passages"], default="passages")
    ap.add_argument("--questions", type=Path, required=True, help="nq-open-dev.tsv (validation; never the test set)")
    ap.add_argument("--n-questions", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if "test" in args.questions.name:
        raise SystemExit(f"{args.questions}: measure on validation questions, not the test set")
    index = BM25Index.load(args.version / "index" / f"{args.index}.bm25")
    t0 = time.process_time()
    tf, norms, idf = lazy_arrays(index, passage_texts(args.version))
    print(json.dumps({"documents": int(index._csc[3]), "postings": int(tf.size), "terms": int(idf.size),
                      "BM25 scores from tf": "identical", "derive_cpu_s": round(time.process_time() - t0, 1)}))
    qs = questions(args.questions, args.n_questions)
    for batch in args.batch:
        print(json.dumps(measure(index, tf, norms, idf, qs, args.k, batch, args.repeat)))


if __name__ == "__main__":
    main()
