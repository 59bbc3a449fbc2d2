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
* a query that scans every row keeps its candidates in row order in a buffer of ``4 k``: every
  row until the buffer is full, then only the rows scoring above the worst of the best ``k`` so
  far; a full buffer keeps its best ``k`` (``np.partition``, linear) and raises that bar. Only the
  last best ``k`` enter the heap, instead of one heap insertion for every row that beat the heap's
  worst so far (~11 ``k`` at ``k`` = 400 over 146K passages: most of the time of the search);
* a query's heap is carried from one score matrix to the next (:class:`RunningTopK`), so a
  sharded index searches its shards in turn into one top ``k``, the worst of it the bar every
  later shard's rows must beat, with no per-shard top ``k`` and no merge;
* ties are broken by row (score descending, then row ascending) inside the selection, so the
  ``k``-th place is deterministic. bm25s's ``argpartition`` keeps an arbitrary subset of the
  documents tied at the ``k``-th score; there, and only there, the rows may differ from bm25s's
  (same scores);
* the kernels are compiled with ``cache=True`` (numba's on-disk cache beside this file or in
  ``NUMBA_CACHE_DIR``): the first query of a process loads them (~0.1 s) instead of compiling
  (~1-2 s, bm25s's numba backend compiles in every process).

Scratch arrays (a float32 score per document, the touched list and the candidates' scores) are
kept per index and thread (:class:`Scratch`) and reused for every query; the kernels release the GIL.
"""
from __future__ import annotations

import itertools

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


BUFFER_K = 4   # a query scanning every row keeps its candidates in a buffer of BUFFER_K * k before selecting


@numba.njit(cache=True, nogil=True)
def _compact(buf_scores, buf_rows, m, k):  # pragma: no cover - compiled
    """Keep the best ``k`` of the ``m > k`` candidates ``buf_scores[:m]``, ``buf_rows[:m]`` (rows
    ascending) in place, in row order: those scoring above the ``k``-th largest score ``t``
    (``np.partition``, linear), then the lowest rows scoring ``t``. Returns ``(k, t)``: a later
    row enters only with a score above ``t``."""
    t = np.partition(buf_scores[:m], m - k)[m - k]
    ties = k
    for i in range(m):
        ties -= buf_scores[i] > t
    j = 0
    for i in range(m):
        s = buf_scores[i]
        if s > t or (s == t and ties > 0):
            ties -= s == t
            buf_scores[j], buf_rows[j] = s, buf_rows[i]
            j += 1
    return j, t


@numba.njit(cache=True, nogil=True)
def _top_k_batch(q_ids, q_offsets, data, indices, indptr, n_docs, base, k, heap_scores, heap_rows, sizes, acc, touched,
                 values):  # pragma: no cover - compiled
    """Offer the rows of one score matrix, numbered from ``base``, to every query's running top
    ``k`` (see :class:`RunningTopK`). Scores must be >= 0 (bm25s's lucene, robertson and atire
    scores are). ``heap_scores`` float32 / ``heap_rows`` int64 ``(n_queries, k)`` and ``sizes``
    int64 ``(n_queries,)``: each query's heap (worst at the root), carried from matrix to matrix.
    ``acc`` float32 zeros, ``touched`` int64 (one spare slot: written before the count says so)
    and ``values`` float32 scratch, each of ``n_docs`` rows or more (``n_docs + 1`` for
    ``touched``); ``acc`` is left zero.

    A full heap's worst score is the bar: a row scoring below it cannot enter, nor one scoring
    equal to it (its row is higher than every row already in the heap: rows of a later matrix).
    A query touching fewer than ``n_docs / 16`` rows offers the touched rows to the heap, then
    the first untouched ones (score 0) while they still enter. One touching more scans every row
    in order into a buffer of ``BUFFER_K * k`` candidates (``values``, ``touched``) that beat the
    bar; a full buffer keeps its best ``k`` (:func:`_compact`) and raises the bar to their worst;
    the buffer's last best ``k`` are offered to the heap.

    Returns False, having offered nothing, when a token id lies outside the matrix's columns."""
    n_vocab = indptr.size - 1
    for p in range(q_ids.size):
        if q_ids[p] < 0 or q_ids[p] >= n_vocab:
            return False                       # nothing offered: a token id outside the matrix's columns
    zero = np.float32(0.0)
    cap = BUFFER_K * k
    for qi in range(q_offsets.size - 1):
        h_scores, h_rows = heap_scores[qi], heap_rows[qi]
        size = sizes[qi]
        n_postings = 0
        for p in range(q_offsets[qi], q_offsets[qi + 1]):
            n_postings += indptr[q_ids[p] + 1] - indptr[q_ids[p]]
        if 16 * n_postings < n_docs:
            # few postings: keep the rows they touch, rank those, then the first untouched rows
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
                size = _offer(h_scores, h_rows, size, k, s, base + d)
            r = np.int64(0)
            while r < n_docs and (size < k or _worse(h_scores[0], h_rows[0], zero, base + r)):
                if acc[r] == zero:
                    size = _offer(h_scores, h_rows, size, k, zero, base + r)
                r += 1
            for i in range(n_touched):
                acc[touched[i]] = zero
        else:
            # many: bm25s's dense scores, one pass over every row in order (untouched rows score 0)
            for p in range(q_offsets[qi], q_offsets[qi + 1]):
                t = q_ids[p]
                for j in range(indptr[t], indptr[t + 1]):
                    acc[indices[j]] += data[j]
            # the candidates, in row order: every row while the heap is not full, then only those
            # above its worst; a full buffer keeps its best k and raises the bar to their worst
            bar = h_scores[0] if size == k else np.float32(-1.0)
            m = 0
            for d in range(n_docs):
                s = acc[d]
                if s > bar:
                    values[m], touched[m] = s, d
                    m += 1
                    if m == cap:
                        m, bar = _compact(values, touched, m, k)
            acc[:n_docs] = zero
            if m > k:
                m, bar = _compact(values, touched, m, k)
            for i in range(m):
                size = _offer(h_scores, h_rows, size, k, values[i], base + touched[i])
        sizes[qi] = size
    return True


@numba.njit(cache=True, nogil=True)
def _drain(heap_scores, heap_rows, sizes, out_rows, out_scores):  # pragma: no cover - compiled
    """Pop every query's heap worst first into the tail of its output row: best first, heaps left empty."""
    for qi in range(sizes.size):
        h_scores, h_rows = heap_scores[qi], heap_rows[qi]
        size = sizes[qi]
        for pos in range(size - 1, -1, -1):
            out_scores[qi, pos], out_rows[qi, pos] = h_scores[0], h_rows[0]
            size -= 1
            if size > 0:
                h_scores[0], h_rows[0] = h_scores[size], h_rows[size]
                _sift_down(h_scores, h_rows, size, 0)
        sizes[qi] = 0


class Scratch:
    """Reusable scratch of :func:`top_k_rows` for one index, one thread at a time: a float32 score
    per document (all zero between calls), the touched list (or the candidates' rows) and the
    candidates' scores. Saves a call the allocation and the page faults of ~16 bytes a
    document (2.3 MB at 146K passages)."""

    def __init__(self, n_docs: int):
        self.acc = np.zeros(n_docs, dtype=np.float32)
        self.touched = np.empty(n_docs + 1, dtype=np.int64)
        self.values = np.empty(n_docs, dtype=np.float32)


def query_id_arrays(query_ids: list[np.ndarray] | list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """``n_queries`` sequences of token ids as one flat int64 array and int64 ``(n_queries + 1,)``
    offsets (query ``i`` is ``flat[offsets[i]:offsets[i + 1]]``), in two numpy calls (a query
    searched alone pays ~5 us a numpy call, for every shard)."""
    offsets = np.fromiter(itertools.accumulate(map(len, query_ids), initial=0), dtype=np.int64,
                          count=len(query_ids) + 1)
    return np.fromiter(itertools.chain.from_iterable(query_ids), dtype=np.int64, count=int(offsets[-1])), offsets


class RunningTopK:
    """The top ``k`` rows of ``n_queries`` queries over one score matrix or several stacked ones
    (the shards of a passage index, rows numbered on from the matrices before), without a merge:
    each query's heap of its best ``k`` so far is carried from matrix to matrix, its worst score
    the floor that the next matrix's rows must beat (a row of a later matrix tied with it has a
    higher row number, so ranks below it). The same rows and scores as :func:`top_k_rows` over
    the matrices stacked row-wise (``tests/test_sharded_index.py``).

    Parameters
    ----------
    n_queries : queries of the batch.
    k : results a query, ``>= 1``; the matrices added must hold ``k`` rows or more in all.

    Raises
    ------
    ValueError
        ``k < 1``.
    """

    def __init__(self, n_queries: int, k: int):
        if k < 1:
            raise ValueError(f"BM25 top-k: k must be >= 1, got {k}")
        self.k = int(k)
        self.heap_scores = np.empty((n_queries, self.k), dtype=np.float32)
        self.heap_rows = np.empty((n_queries, self.k), dtype=np.int64)
        self.sizes = np.zeros(n_queries, dtype=np.int64)
        self.n_rows = 0

    def add(self, query_ids: list[np.ndarray] | list[list[int]], data: np.ndarray, indices: np.ndarray,
            indptr: np.ndarray, n_docs: int, scratch: "Scratch | None" = None) -> "RunningTopK":
        """Offer every row of one more matrix (rows ``n_rows .. n_rows + n_docs - 1`` of the stack).

        Parameters
        ----------
        query_ids : ``n_queries`` sequences of this matrix's columns (see :func:`top_k_rows`).
        data, indices, indptr, n_docs : the matrix (see :func:`top_k_rows`).
        scratch : a :class:`Scratch` of ``n_docs`` rows or more used by no other thread meanwhile
            (one for all the shards of an index: the same memory, warm in the cache), or None.

        Raises
        ------
        ValueError
            Not ``n_queries`` queries, a token id outside the matrix's columns, or a scratch of
            fewer rows.
        """
        if len(query_ids) != self.sizes.size:
            raise ValueError(f"BM25 top-k: {len(query_ids)} queries for a batch of {self.sizes.size}")
        flat, offsets = query_id_arrays(query_ids)
        if scratch is None:
            scratch = Scratch(n_docs)
        elif scratch.acc.size < n_docs:
            raise ValueError(f"BM25 top-k: scratch of {scratch.acc.size} rows for an index of {n_docs}")
        if not _top_k_batch(flat, offsets, data, indices, indptr, int(n_docs), int(self.n_rows), self.k, self.heap_scores,
                            self.heap_rows, self.sizes, scratch.acc, scratch.touched, scratch.values):
            raise ValueError(f"BM25 top-k: token ids outside the index's {indptr.size - 1} terms")
        self.n_rows += int(n_docs)
        return self

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, scores)``: int64 and float32 ``(n_queries, k)``, by score descending then row
        ascending; the heaps are left empty.

        Raises
        ------
        ValueError
            The matrices added hold fewer than ``k`` rows.
        """
        if self.n_rows < self.k:
            raise ValueError(f"BM25 top-k: k must lie in [1, {self.n_rows}], got {self.k}")
        rows = np.empty((self.sizes.size, self.k), dtype=np.int64)
        scores = np.empty((self.sizes.size, self.k), dtype=np.float32)
        _drain(self.heap_scores, self.heap_rows, self.sizes, rows, scores)
        return rows, scores


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
    scratch : a :class:`Scratch` of ``n_docs`` rows or more used by no other thread meanwhile, or None (made for the call).

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
    return RunningTopK(len(query_ids), k).add(query_ids, data, indices, indptr, n_docs, scratch).result()
