"""Top-``k`` BM25 search over bm25s's eager score matrix, compiled (numba) and cached on disk.

bm25s stores every (document, term) score ``idf(t) * tfc(t, d)`` in a CSC matrix
(:mod:`tasks.corpus.bm25_csc`), so a query's score of document ``d`` is the sum, over the query's
token ids in order (repeats included), of the column entries of row ``d``. bm25s's numpy backend
(``BM25.retrieve``, what :class:`tasks.corpus.index.BM25Index` called before) adds each column into
a dense ``(n_docs,)`` float32 array with ``np.add.at`` and takes the top ``k`` with
``np.argpartition``; its numba backend does the same in a compiled loop and scans every document
with a heap. :func:`top_k_rows` does the same additions in the same order and precision (float32,
token by token), so the scores are bit-identical, but

* a query with few postings (fewer than ``n_docs / 16``) keeps the list of documents it touched
  and ranks only those (plus the first untouched rows, score 0, where fewer than ``k`` touched
  documents outrank them), so it costs its postings, not ``n_docs``; a query with more scans
  every row in order as bm25s's numba backend does (sequential reads beat a random walk there);
* a query that scans every row with ``k`` to 16 ``k`` postings selects the ``k``-th best positive
  score first (``np.partition``, linear), and only the documents scoring at least that enter the
  heap: ~``k`` heap insertions instead of one for every document that beat the worst of the best
  so far (~8 ``k`` at ``k`` = 400 in a 14K-row shard: most of the time of a sharded search); with
  more postings the heap alone is cheaper than the selection;
* ties are broken by row (score descending, then row ascending) inside the selection, so the
  ``k``-th place is deterministic. bm25s's ``argpartition`` keeps an arbitrary subset of the
  documents tied at the ``k``-th score; there, and only there, the rows may differ from bm25s's
  (same scores);
* the kernels are compiled with ``cache=True`` (numba's on-disk cache beside this file or in
  ``NUMBA_CACHE_DIR``): the first query of a process loads them (~0.1 s) instead of compiling
  (~1-2 s, bm25s's numba backend compiles in every process).

Scratch arrays (a float32 score per document and the touched list) are made once per call and
reused for every query of the batch; the kernel releases the GIL.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _worse(score_a, row_a, score_b, row_b):  # pragma: no cover - compiled
    """Whether ``(score_a, row_a)`` ranks below ``(score_b, row_b)`` (score desc, then row asc)."""
    return score_a < score_b or (score_a == score_b and row_a > row_b)


@numba.njit(cache=True, nogil=True)
def _sift_down(h_scores, h_rows, size, pos):  # pragma: no cover - compiled
    """Restore the heap below ``pos``: the worst entry at the root (a min-heap on rank)."""
    s, r = h_scores[pos], h_rows[pos]
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _worse(h_scores[right], h_rows[right], h_scores[child], h_rows[child]):
            child = right
        if not _worse(h_scores[child], h_rows[child], s, r):
            break
        h_scores[pos], h_rows[pos] = h_scores[child], h_rows[child]
        pos = child
    h_scores[pos], h_rows[pos] = s, r


@numba.njit(cache=True, nogil=True)
def _sift_up(h_scores, h_rows, pos):  # pragma: no cover - compiled
    s, r = h_scores[pos], h_rows[pos]
    while pos > 0:
        parent = (pos - 1) >> 1
        if not _worse(s, r, h_scores[parent], h_rows[parent]):
            break
        h_scores[pos], h_rows[pos] = h_scores[parent], h_rows[parent]
        pos = parent
    h_scores[pos], h_rows[pos] = s, r


@numba.njit(cache=True, nogil=True)
def _offer(h_scores, h_rows, size, k, s, r):  # pragma: no cover - compiled
    """Offer ``(s, r)`` to the heap of the best ``k``; returns the new size."""
    if size < k:
        h_scores[size], h_rows[size] = s, r
        _sift_up(h_scores, h_rows, size)
        return size + 1
    if _worse(h_scores[0], h_rows[0], s, r):
        h_scores[0], h_rows[0] = s, r
        _sift_down(h_scores, h_rows, size, 0)
    return size


SELECT_POSTINGS = 16   # a query scanning every row selects its entry score when its postings number k to 16 k


@numba.njit(cache=True, nogil=True)
def _entry_score(values, n_values, k):  # pragma: no cover - compiled
    """The least score that can enter the top ``k``: the ``k``-th largest of the ``n_values``
    positive scores in ``values[:n_values]``, or 0 when there are ``k`` or fewer."""
    if n_values <= k:
        return np.float32(0.0)
    return np.partition(values[:n_values], n_values - k)[n_values - k]


@numba.njit(cache=True, nogil=True)
def _top_k_batch(q_ids, q_offsets, data, indices, indptr, n_docs, k, out_rows, out_scores, acc, touched,
                 values):  # pragma: no cover - compiled
    """Top ``k`` of every query into ``out_rows[i]``, ``out_scores[i]`` (see :func:`top_k_rows`).
    Scores must be >= 0 (bm25s's lucene, robertson and atire scores are). ``acc`` float32
    ``(n_docs,)`` zeros, ``touched`` int64 ``(n_docs + 1,)`` (one spare slot: written before the
    count says so) and ``values`` float32 ``(n_docs,)`` scratch; ``acc`` is left zero.

    A query that scans every row with ``k`` to ``SELECT_POSTINGS * k`` postings offers the heap
    only the documents scoring at least the ``k``-th best positive score (:func:`_entry_score`, a
    selection over at most that many scores): ~``k`` offers instead of one per document that beats
    the heap's worst so far (~8 ``k`` at ``k`` = 400 in a 14K-row shard). With more postings, or
    on the touched documents alone, the heap is no slower than the selection: the heap alone."""
    h_scores = np.empty(k, dtype=np.float32)
    h_rows = np.empty(k, dtype=np.int64)
    zero = np.float32(0.0)
    for qi in range(q_offsets.size - 1):
        n_postings = 0
        for p in range(q_offsets[qi], q_offsets[qi + 1]):
            n_postings += indptr[q_ids[p] + 1] - indptr[q_ids[p]]
        size = 0
        if 16 * n_postings < n_docs:
            # few postings: keep the documents they touch, rank those, then the first untouched rows
            # (score 0) while they still enter the top k
            n_touched = 0
            for p in range(q_offsets[qi], q_offsets[qi + 1]):
                t = q_ids[p]
                for j in range(indptr[t], indptr[t + 1]):
                    d = indices[j]
                    a, v = acc[d], data[j]
                    touched[n_touched] = d            # kept only at a first positive contribution (scores >= 0)
                    n_touched += (a == zero) & (v != zero)
                    acc[d] = a + v
            for i in range(n_touched):
                d = touched[i]
                s = acc[d]
                if size == k and s < h_scores[0]:
                    continue
                size = _offer(h_scores, h_rows, size, k, s, d)
            r = np.int64(0)
            while r < n_docs and (size < k or _worse(h_scores[0], h_rows[0], zero, r)):
                if acc[r] == zero:
                    size = _offer(h_scores, h_rows, size, k, zero, r)
                r += 1
            for i in range(n_touched):
                acc[touched[i]] = zero
        else:
            # many: bm25s's dense scores, one pass over every row in order (untouched rows score 0)
            for p in range(q_offsets[qi], q_offsets[qi + 1]):
                t = q_ids[p]
                for j in range(indptr[t], indptr[t + 1]):
                    acc[indices[j]] += data[j]
            entry = zero
            if k < n_postings <= SELECT_POSTINGS * k:
                n_positive = 0
                for d in range(n_docs):
                    values[n_positive] = acc[d]
                    n_positive += acc[d] > zero
                entry = _entry_score(values, n_positive, k)
            for d in range(n_docs):
                s = acc[d]
                if s < entry or (size == k and s < h_scores[0]):
                    continue
                size = _offer(h_scores, h_rows, size, k, s, np.int64(d))
            acc[:] = zero
        # pop worst first into the tail: best first in the output
        for pos in range(size - 1, -1, -1):
            out_scores[qi, pos], out_rows[qi, pos] = h_scores[0], h_rows[0]
            size -= 1
            if size > 0:
                h_scores[0], h_rows[0] = h_scores[size], h_rows[size]
                _sift_down(h_scores, h_rows, size, 0)


class Scratch:
    """Reusable scratch of :func:`top_k_rows` for one index, one thread at a time: a float32 score
    per document (all zero between calls), the touched list and the positive scores the entry
    score is selected from. Saves a call the allocation and the page faults of ~16 bytes a
    document (2.3 MB at 146K passages)."""

    def __init__(self, n_docs: int):
        self.acc = np.zeros(n_docs, dtype=np.float32)
        self.touched = np.empty(n_docs + 1, dtype=np.int64)
        self.values = np.empty(n_docs, dtype=np.float32)


def top_k_rows(query_ids: list[np.ndarray] | list[list[int]], data: np.ndarray, indices: np.ndarray,
               indptr: np.ndarray, n_docs: int, k: int, scratch: Scratch | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BM25 top-``k`` rows of each query over a bm25s CSC score matrix.

    Parameters
    ----------
    query_ids : ``n_queries`` sequences of token ids (columns of the matrix; repeats count twice,
        as in bm25s), each id in ``[0, n_vocab)``.
    data : float32 ``(n_pairs,)`` scores, all ``>= 0`` (bm25s's ``lucene``, ``robertson`` and
        ``atire`` scores: their idf is clipped at 0), ``indices`` int32 ``(n_pairs,)`` rows, ``indptr`` int64
        ``(n_vocab + 1,)``: bm25s's ``scores`` dict (``retriever.scores``), memory-mapped or not.
    n_docs : rows of the matrix.
    k : results a query, ``1 <= k <= n_docs``.
    scratch : a :class:`Scratch` of ``n_docs`` rows used by no other thread meanwhile, or None (made for the call).

    Returns
    -------
    rows : int64 ``(n_queries, k)``, each row ordered by score descending, then row ascending.
    scores : float32 ``(n_queries, k)``, bm25s's scores (the same float32 sums in the same order).

    Raises
    ------
    ValueError
        ``k`` outside ``[1, n_docs]``, or a token id outside the matrix's columns.

    Notes
    -----
    Source: the BM25 eager-scoring retrieval of bm25s (Lù 2024, ``_compute_relevance_from_scores``
    then ``topk``), restricted to the documents a query touches; ties ranked by row.
    """
    if not 1 <= k <= n_docs:
        raise ValueError(f"BM25 top-k: k must lie in [1, {n_docs}], got {k}")
    lengths = np.fromiter((len(q) for q in query_ids), dtype=np.int64, count=len(query_ids))
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = (np.concatenate([np.asarray(q, dtype=np.int64) for q in query_ids]) if offsets[-1]
            else np.zeros(0, dtype=np.int64))
    n_vocab = indptr.size - 1
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n_vocab):
        raise ValueError(f"BM25 top-k: token ids outside the index's {n_vocab} terms")
    if scratch is None:
        scratch = Scratch(n_docs)
    elif scratch.acc.size != n_docs:
        raise ValueError(f"BM25 top-k: scratch of {scratch.acc.size} rows for an index of {n_docs}")
    rows = np.empty((lengths.size, k), dtype=np.int64)
    scores = np.empty((lengths.size, k), dtype=np.float32)
    _top_k_batch(flat, offsets, data, indices, indptr, int(n_docs), int(k), rows, scores, scratch.acc, scratch.touched,
                 scratch.values)
    return rows, scores
