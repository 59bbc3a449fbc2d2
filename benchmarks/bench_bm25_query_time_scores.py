"""What BM25 scored at query time would cost a search, and what re-scoring a whole index from
kept term frequencies would cost a night, beside bm25s's stored scores.

A measurement for a design option of the nightly, not a feature
(`docs/corpus-build-at-scale.md`, *What a night within 10% of a full build would take*): bm25s
stores each (term, document) score ``idf(t) * tfc(tf, l_d)``; a 1% day changes ``N``, ``df`` and the
mean length, so every stored score changes and a night rewrites the whole matrix. Two ways out:
score at query time from stored term frequencies (each search pays), or keep the term frequencies
and re-score the whole matrix each night (each night pays, searches keep bm25s's layout and speed).

From a published BM25 index (``<version>/index/passages.bm25`` or ``clusters.bm25``, ``--index``)
and the texts it indexed, this script:

1. re-tokenizes the texts with the index's own settings (:func:`tasks.corpus.index.tokenize_ids`)
   for the document lengths, and derives the term frequencies from the stored scores; it checks
   that scoring them gives every stored score bit for bit (``BM25 scores from tf: identical``);
2. **search** (``--batch``): searches NQ-open *validation* questions (``nq-open-dev.tsv``) with the
   project's top-k (:func:`tasks.corpus.bm25_query.top_k_rows`) over the stored matrix, and adds
   up every query's postings three ways in the same loop (:func:`accumulate_stored`,
   :func:`accumulate_scored`, :func:`accumulate_tabled`): the stored scores; scores computed from
   ``tf`` and a per-document length normalisation with bm25s's arithmetic (:func:`score_tf`); the
   same with the term-frequency component looked up in a ``(tf, length)`` table. It checks that
   the three give the same float32 sums, and prints milliseconds a query of each and of the
   top-k search, and the search projected at query time: the top-k plus the extra of scoring;
3. **night** (``--day-share``): the term-frequency matrix of a night whose day changed that share of
   the documents (chosen at random, ``--seed``): those rows taken out and merged back in as the
   day's rows (:func:`merge_rows`; the rows keep their numbers here, the test renumbers them; the
   result must equal the kept matrix), every
   posting re-scored from the merged term frequencies with lengths summed from them
   (:func:`rescore`, every stored score bit for bit), and the three arrays written and digested
   (``np.save``, sha256) as an index stage would; CPU seconds of each. For the cluster index the
   day's rows are the regrouped clusters (``--day-share 0.41``: the share Algorithm 1 regroups a
   night at 200K pages), summed from their members' term frequencies (:func:`member_frequencies`:
   they must equal the stored rows), and that is timed too.

    python benchmarks/bench_bm25_query_time_scores.py <version dir> \\
        --questions <data>/nq-open/nq-open-dev.tsv --k 100 --batch 1 64 --day-share 0.014
    python benchmarks/bench_bm25_query_time_scores.py <version dir> --index clusters \\
        --questions <data>/nq-open/nq-open-dev.tsv --k 100 --batch 1 64 --day-share 0.41

Texts: ``passages.parquet`` (``title`` + ``"\\n"`` + ``text``, as the index stage joins them) for
passages; for clusters, each cluster's members joined as the index stage joins them
(:func:`cluster_texts_of`). Not measured: a day's new terms (the merged vocabulary is the kept one
here) and the day's texts tokenized (the tokenizer's rate is measured by ``bench_index.py``).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import pyarrow.parquet as pq

from data_contracts import corpus as C
from data_contracts.base import sha256_file
from tasks.corpus.bm25_csc import idf_array
from tasks.corpus.bm25_query import Scratch, query_id_arrays, top_k_rows
from tasks.corpus.index import BM25Index, _stemmer, tokenize_ids
from tasks.corpus.sharded.cluster_index import cluster_pieces, cluster_texts
from tasks.qa.questions import QuestionsConfig, read_questions


# Not cached (``cache=True``): run as a script and imported by its test, one cache would name two modules.

@numba.njit(nogil=True)
def score_tf(idf_t, tf, norm):  # pragma: no cover - compiled
    """bm25s's robertson / lucene score of one posting, as :func:`tasks.corpus.bm25_csc._scatter_scores`
    computes it: ``idf(t) * tf / (norm_d + tf)`` in float64 with ``tf`` and ``idf`` float32, rounded to float32."""
    x = np.float64(np.float32(tf))
    return np.float32(np.float64(idf_t) * (x / (norm + x)))


@numba.njit(nogil=True)
def _drained_sum(q_ids, lo, hi, indices, indptr, acc):  # pragma: no cover - compiled
    """The sum of the scores of the documents query ``q_ids[lo:hi]`` touched (float64); ``acc`` left zero."""
    total = 0.0
    for p in range(lo, hi):
        t = q_ids[p]
        for j in range(indptr[t], indptr[t + 1]):
            d = indices[j]
            total += acc[d]
            acc[d] = 0.0
    return total


@numba.njit(nogil=True)
def accumulate_stored(q_ids, q_offsets, data, indices, indptr, acc, sums):  # pragma: no cover - compiled
    """Each query's postings added from the stored scores ``data`` (the top-k's loop), query by query."""
    for qi in range(q_offsets.size - 1):
        for p in range(q_offsets[qi], q_offsets[qi + 1]):
            t = q_ids[p]
            for j in range(indptr[t], indptr[t + 1]):
                acc[indices[j]] += data[j]
        sums[qi] = _drained_sum(q_ids, q_offsets[qi], q_offsets[qi + 1], indices, indptr, acc)


@numba.njit(nogil=True)
def accumulate_scored(q_ids, q_offsets, tf, idf, norms, indices, indptr, acc, sums):  # pragma: no cover - compiled
    """The same, each posting scored from ``tf`` and its document's ``norms[d]`` (:func:`score_tf`)."""
    for qi in range(q_offsets.size - 1):
        for p in range(q_offsets[qi], q_offsets[qi + 1]):
            t = q_ids[p]
            f = idf[t]
            for j in range(indptr[t], indptr[t + 1]):
                d = indices[j]
                acc[d] += score_tf(f, tf[j], norms[d])
        sums[qi] = _drained_sum(q_ids, q_offsets[qi], q_offsets[qi + 1], indices, indptr, acc)


@numba.njit(nogil=True)
def accumulate_tabled(q_ids, q_offsets, tf, lengths, table, width, idf, indices, indptr, acc, sums):  # pragma: no cover
    """The same, the term-frequency component looked up: ``table[tf * width + l_d]`` (float64
    ``tf / (norm(l) + tf)`` for every ``tf`` and length), ``lengths`` a posting's document length."""
    for qi in range(q_offsets.size - 1):
        for p in range(q_offsets[qi], q_offsets[qi + 1]):
            t = q_ids[p]
            f = np.float64(idf[t])
            for j in range(indptr[t], indptr[t + 1]):
                acc[indices[j]] += np.float32(f * table[np.int64(tf[j]) * width + lengths[j]])
        sums[qi] = _drained_sum(q_ids, q_offsets[qi], q_offsets[qi + 1], indices, indptr, acc)


@numba.njit(nogil=True)
def _merge_columns(b_tf, b_indices, b_indptr, keep, new_row, d_tf, d_indices, d_indptr, tf, indices, indptr):  # pragma: no cover
    pos = 0
    for t in range(b_indptr.size - 1):
        indptr[t] = pos
        i, i_end, j, j_end = b_indptr[t], b_indptr[t + 1], d_indptr[t], d_indptr[t + 1]
        while True:
            while i < i_end and not keep[b_indices[i]]:
                i += 1
            if i == i_end and j == j_end:
                break
            if j == j_end or (i < i_end and new_row[b_indices[i]] < d_indices[j]):
                tf[pos], indices[pos] = b_tf[i], new_row[b_indices[i]]
                i += 1
            else:
                tf[pos], indices[pos] = d_tf[j], d_indices[j]
                j += 1
            pos += 1
    indptr[b_indptr.size - 1] = pos


def merge_rows(base: tuple[np.ndarray, np.ndarray, np.ndarray], keep: np.ndarray, new_row: np.ndarray,
               day: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A kept term-frequency matrix with a day's rows merged in.

    Parameters
    ----------
    base : ``(tf, indices, indptr)`` of the kept matrix (CSC: uint16 ``(n_pairs,)``, int32 rows,
        int64 ``(n_terms + 1,)``; rows ascending within a column).
    keep : bool ``(n_base_rows,)``: the base rows that stay (the others were changed or removed).
    new_row : int64 ``(n_base_rows,)``: a kept row's number in the result (increasing).
    day : ``(tf, indices, indptr)`` of the day's rows over the same terms, rows numbered in the result.

    Returns
    -------
    ``(tf, indices, indptr)`` of the result, rows ascending within each column.
    """
    b_tf, b_indices, b_indptr = base
    d_tf, d_indices, d_indptr = day
    n = int(np.count_nonzero(keep[b_indices])) + d_tf.size
    tf, indices, indptr = np.empty(n, b_tf.dtype), np.empty(n, b_indices.dtype), np.empty_like(b_indptr)
    _merge_columns(b_tf, b_indices, b_indptr, keep, new_row, d_tf, d_indices, d_indptr, tf, indices, indptr)
    return tf, indices, indptr


@numba.njit(nogil=True)
def _rescore(tf, indices, indptr, idf, norms, data):  # pragma: no cover - compiled
    for t in range(indptr.size - 1):
        f = idf[t]
        for j in range(indptr[t], indptr[t + 1]):
            data[j] = score_tf(f, tf[j], norms[indices[j]])


def length_norms(lengths: np.ndarray, cfg, mean: float | None = None) -> np.ndarray:
    """float64 ``k1 * ((1 - b) + b * l / mean l)`` of each length (bm25s's robertson / lucene
    normalisation, in :func:`tasks.corpus.bm25_csc._scatter_scores`'s order of operations);
    ``mean``: the corpus's mean length when ``lengths`` are not the corpus's (a table's columns)."""
    mean = float(lengths.mean()) if mean is None else mean
    return cfg.k1 * ((1.0 - cfg.b) + cfg.b * np.asarray(lengths).astype(np.float64) / mean)


def term_idf(indptr: np.ndarray, n_docs: int, cfg) -> np.ndarray:
    """float32 ``(n_terms,)`` bm25s idf of every column of a CSC matrix of ``n_docs`` rows."""
    from bm25s.scoring import _select_idf_scorer  # noqa: PLC0415  (bm25s, as the index stage calls it)

    return idf_array(np.diff(indptr), n_docs, _select_idf_scorer(cfg.method))


def row_lengths(tf: np.ndarray, indices: np.ndarray, n_docs: int) -> np.ndarray:
    """int64 ``(n_docs,)`` tokens of each row: the sum of its term frequencies."""
    return np.bincount(indices, weights=tf, minlength=n_docs).astype(np.int64)


def rescore(tf: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_docs: int, cfg) -> np.ndarray:
    """bm25s's stored scores (float32 ``(n_pairs,)``) of a term-frequency matrix of ``n_docs`` rows: ``N`` its rows,
    ``df`` its column sizes, each document's length the sum of its term frequencies (the token
    count :func:`tasks.corpus.bm25_csc.bm25_csc` takes), robertson / lucene only."""
    norms = length_norms(row_lengths(tf, indices, n_docs), cfg)
    idf = term_idf(indptr, n_docs, cfg)
    data = np.empty(tf.size, np.float32)
    _rescore(tf, indices, indptr, idf, norms, data)
    return data


def passage_texts(version: Path) -> list[str]:
    """``title + "\\n" + text`` of every passage, in row order (the passage index's rows)."""
    table = pq.read_table(version / "passages.parquet", columns=["title", "text"])
    return [f"{a}\n{b}" for a, b in zip(table.column("title").to_pylist(), table.column("text").to_pylist())]


def cluster_texts_of(version: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """``(member texts, group offsets, cluster texts)`` of a version, in the cluster index's row
    order: each member's ``title + "\\n" + text`` in cluster order (cluster ``g``'s members are
    ``offsets[g]:offsets[g + 1]``), and each cluster's members joined as the index stage joins them
    (:func:`tasks.corpus.sharded.cluster_index.cluster_texts`)."""
    documents = C.DOCUMENTS.read(version, columns=["doc_id", "title", "text"])
    members = C.CLUSTER_MEMBERS.read(version)
    _, pieces, offsets = cluster_pieces(documents, members)
    return pieces.to_pylist(), offsets, cluster_texts(documents, members)[1]


def member_frequencies(index: BM25Index, member_texts: list[str], offsets: np.ndarray):
    """``(member_tf, cluster_of_member)``: scipy CSR ``(n_members, n_terms)`` term frequencies of
    each member text over the cluster index's terms, and int64 ``(n_members,)`` the cluster row of
    each member (cluster ``g``'s members are ``offsets[g]:offsets[g + 1]``)."""
    import scipy.sparse as sp  # noqa: PLC0415  (scipy, for the sparse sums only)

    tokens = tokenize_ids(member_texts, index.cfg, _stemmer(index.cfg.stemmer))
    vocab = index.retriever.vocab_dict
    column = np.array([vocab[t] for t, _ in sorted(tokens.vocab.items(), key=lambda kv: kv[1])], np.int64)
    ids = tokens.ids.ids
    rows = np.repeat(np.arange(len(member_texts)), np.diff(tokens.ids.offsets))
    member_tf = sp.csr_matrix((np.ones(ids.size, np.int64), (rows, column[ids])),
                              shape=(len(member_texts), index._csc[2].size - 1))
    return member_tf, np.repeat(np.arange(offsets.size - 1), np.diff(offsets))


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
    norms = length_norms(lengths, cfg)
    idf = term_idf(indptr, n_docs, cfg)
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


def _posting_table(tf: np.ndarray, indices: np.ndarray, lengths: np.ndarray, cfg, most: int = 1 << 24):
    """``(table, width, posting_lengths)`` for :func:`accumulate_tabled`, or None when the table would
    hold more than ``most`` entries (long documents or high term frequencies: clusters)."""
    width = int(lengths.max()) + 1
    if (int(tf.max()) + 1) * width > most:
        return None
    x = np.arange(int(tf.max()) + 1, dtype=np.float32).astype(np.float64)[:, None]
    norm = length_norms(np.arange(width), cfg, float(lengths.mean()))[None, :]
    dtype = np.uint16 if width <= 1 << 16 else np.uint32
    return (x / (norm + x)).ravel(), width, lengths[indices].astype(dtype)


def measure(index: BM25Index, tf, norms, idf, qs: list[str], k: int, batch: int, repeat: int) -> dict:
    """Milliseconds a query, best of ``repeat``: the top-k search over the stored scores in batches
    of ``batch`` questions, and each query's postings added up three ways (stored, scored,
    tabled); checks that the three ways give the same sums.

    Raises ``ValueError`` when a way gives other sums than the stored scores."""
    data, indices, indptr, n_docs = index._csc
    vocab = index.retriever.vocab_dict
    ids = [np.array([vocab[t] for t in toks if t in vocab], np.int64) for toks in index.tokenize(qs)]
    flat, offsets = query_id_arrays(ids)
    lengths = row_lengths(tf, indices, n_docs)
    tabled = _posting_table(tf, indices, lengths, index.cfg)
    batches = [ids[i:i + batch] for i in range(0, len(ids), batch)]
    scratch, acc = Scratch(n_docs), np.zeros(n_docs, np.float32)
    ways = {"stored": lambda out: accumulate_stored(flat, offsets, data, indices, indptr, acc, out),
            "scored": lambda out: accumulate_scored(flat, offsets, tf, idf, norms, indices, indptr, acc, out)}
    if tabled is not None:
        table, width, posting_lengths = tabled
        ways["tabled"] = lambda out: accumulate_tabled(flat, offsets, tf, posting_lengths, table, width, idf, indices,
                                                       indptr, acc, out)
    sums = {name: np.empty(len(ids)) for name in ways}
    top_k_rows(batches[0], data, indices, indptr, n_docs, k, scratch)       # compile / load the kernels
    for name, way in ways.items():
        way(sums[name])
    best = dict.fromkeys(["top_k", *ways], np.inf)
    for _ in range(repeat):
        t0 = time.perf_counter()
        for b in batches:
            top_k_rows(b, data, indices, indptr, n_docs, k, scratch)
        best["top_k"] = min(best["top_k"], time.perf_counter() - t0)
        for name, way in ways.items():
            t0 = time.perf_counter()
            way(sums[name])
            best[name] = min(best[name], time.perf_counter() - t0)
    for name in ways:
        if not np.array_equal(sums[name], sums["stored"]):
            raise ValueError(f"scores added {name} differ from the stored scores'")
    n = len(qs)
    ms = {name: 1e3 * v / n for name, v in best.items()}
    row = {"batch": batch, "queries": n, "k": k, "postings_a_query": int(np.diff(indptr)[flat].sum()) / n,
           "top_k_ms_a_query": ms["top_k"], **{f"add_{name}_ms_a_query": ms[name] for name in ways}}
    for name in ("scored", "tabled"):
        if name in ms:
            at_query_time = ms["top_k"] + ms[name] - ms["stored"]
            row[f"{name}_search_ms_a_query"] = at_query_time
            row[f"{name}_ratio"] = at_query_time / ms["top_k"]
    return row


def measure_night(index: BM25Index, tf: np.ndarray, share: float, seed: int, members=None) -> dict:
    """CPU seconds of a night that keeps the term-frequency matrix: ``share`` of the rows (at
    random) taken out and merged back in as the day's rows (:func:`merge_rows`), every posting
    re-scored (:func:`rescore`), the three arrays written and digested. ``members``: the cluster
    index's :func:`member_frequencies`; the day's rows (the regrouped clusters) are then summed
    from their members' term frequencies, as a night would make them, and timed too.

    Raises ``ValueError`` when the summed rows are not the stored ones, the merge does not give the
    kept matrix back or a re-scored score differs from the stored one."""
    data, indices, indptr, n_docs = index._csc
    rng = np.random.default_rng(seed)
    keep = np.ones(n_docs, bool)
    keep[rng.choice(n_docs, size=max(1, round(share * n_docs)), replace=False)] = False
    in_day = ~keep[indices]
    column = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    day = (tf[in_day], indices[in_day],
           np.concatenate([[0], np.cumsum(np.bincount(column[in_day], minlength=indptr.size - 1))]).astype(np.int64))
    summed_s = None
    if members is not None:
        import scipy.sparse as sp  # noqa: PLC0415  (scipy, for the sparse sums only)

        member_tf, cluster_of = members
        t0 = time.process_time()
        regrouped = np.flatnonzero(~keep)
        taken = np.flatnonzero(np.isin(cluster_of, regrouped))
        sums = sp.csr_matrix((np.ones(taken.size, np.int64), (np.searchsorted(regrouped, cluster_of[taken]), taken)),
                             shape=(regrouped.size, member_tf.shape[0])) @ member_tf
        sums = sums.tocsc()
        sums.sort_indices()
        summed = (sums.data.astype(tf.dtype), regrouped[sums.indices].astype(indices.dtype), sums.indptr.astype(np.int64))
        summed_s = time.process_time() - t0
        if not all(np.array_equal(a, b) for a, b in zip(summed, day)):
            raise ValueError("the regrouped clusters' frequencies summed from their members differ from the stored ones")
        day = summed
    t0 = time.process_time()
    merged = merge_rows((tf, indices, indptr), keep, np.arange(n_docs, dtype=np.int64), day)
    t1 = time.process_time()
    if not all(np.array_equal(a, b) for a, b in zip(merged, (tf, indices, indptr))):
        raise ValueError("the merged matrix is not the kept one")
    scores = rescore(*merged, n_docs, index.cfg)
    t2 = time.process_time()
    bad = int(np.count_nonzero(scores != data))
    if bad:
        raise ValueError(f"{bad} of {data.size} re-scored scores differ from the stored ones")
    with tempfile.TemporaryDirectory() as tmp:
        t3 = time.process_time()
        for name, array in (("data", scores), ("indices", merged[1]), ("indptr", merged[2])):
            np.save(Path(tmp) / f"{name}.npy", array)
            sha256_file(Path(tmp) / f"{name}.npy")
        t4 = time.process_time()
    return {"day_share": share, "day_rows": int(n_docs - keep.sum()), "day_postings": int(day[0].size),
            "postings": int(tf.size), **({"sum_from_members_cpu_s": summed_s} if summed_s is not None else {}),
            "merge_cpu_s": t1 - t0, "rescore_cpu_s": t2 - t1, "write_and_digest_cpu_s": t4 - t3,
            "rescored": "identical"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", type=Path, help="a published corpus version directory")
    ap.add_argument("--index", choices=["passages", "clusters"], default="passages")
    ap.add_argument("--questions", type=Path, required=True, help="nq-open-dev.tsv (validation; never the test set)")
    ap.add_argument("--n-questions", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--day-share", type=float, help="also measure a night that keeps the term frequencies: this "
                    "share of the documents changed (0.014: the 200K mirror's passages a night)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if "test" in args.questions.name:
        raise SystemExit(f"{args.questions}: measure on validation questions, not the test set")
    index = BM25Index.load(args.version / "index" / f"{args.index}.bm25")
    t0 = time.process_time()
    if args.index == "clusters":
        member_texts, offsets, texts = cluster_texts_of(args.version)
    else:
        texts = passage_texts(args.version)
    tf, norms, idf = lazy_arrays(index, texts)
    del texts
    print(json.dumps({"documents": int(index._csc[3]), "postings": int(tf.size), "terms": int(idf.size),
                      "BM25 scores from tf": "identical", "derive_cpu_s": round(time.process_time() - t0, 1)}))
    qs = questions(args.questions, args.n_questions)
    for batch in args.batch:
        print(json.dumps(measure(index, tf, norms, idf, qs, args.k, batch, args.repeat)))
    if args.day_share:
        members = member_frequencies(index, member_texts, offsets) if args.index == "clusters" else None
        print(json.dumps(measure_night(index, tf, args.day_share, args.seed, members)))


if __name__ == "__main__":
    main()
