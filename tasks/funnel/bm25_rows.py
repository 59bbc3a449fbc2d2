"""BM25 scores of chosen rows of bm25s's score matrix, compiled (numba) and cached on disk.

bm25s keeps every (document, term) score in a CSC matrix (``data``, ``indices``, ``indptr``: the
column of token ``t`` holds its documents' rows ``indices[indptr[t]:indptr[t + 1]]``, ascending,
and their scores ``data[...]``); a query's score of a document is the sum, over the query's token
ids in order (repeats included), of the document's entries in those columns, in float32
(``BM25.get_scores``, ``_compute_relevance_from_scores``). :func:`score_rows` adds the same entries
in the same order and precision for a few wanted rows only (the passages of a query's BM25
clusters, :class:`tasks.funnel.fusion.PassageBM25`): the wanted rows, sorted, are merged against
each query token's posting list by galloping (exponential then binary search forward from the
last match), so a token costs ``O(m log(L / m))`` for ``m`` wanted rows and a posting list of
``L`` rows, ``O(m + L)`` at worst, and never a pass over the corpus.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _first_at_least(indices, pos, hi, w):  # pragma: no cover - compiled
    """The first position in ``[pos, hi)`` whose row is ``>= w`` (``hi`` if none), rows ascending:
    galloping from ``pos`` (steps 1, 2, 4, ...), then a binary search of the last step."""
    if indices[pos] >= w:
        return pos
    last_below, step = pos, 1                  # indices[last_below] < w
    while pos + step < hi and indices[pos + step] < w:
        last_below = pos + step
        step *= 2
    a, b = last_below + 1, min(pos + step, hi)   # the answer lies in [a, b]
    while a < b:
        mid = (a + b) >> 1
        if indices[mid] < w:
            a = mid + 1
        else:
            b = mid
    return a


@numba.njit(cache=True, nogil=True)
def score_rows(q_ids, data, indices, indptr, want, base, acc, checked):  # pragma: no cover - compiled
    """Add the query's BM25 term scores of the wanted rows into ``acc``.

    For each token id ``t = q_ids[p]`` in order, each wanted row ``want[j] - base`` found in
    ``t``'s posting list adds its entry (cast to float32) to ``acc[j]``: after the call ``acc[j]``
    holds (from zeros) bm25s's float32 score of that row, the same sums in the same order
    (a row in no posting list: 0; the non-occurrence term of ``bm25l``/``bm25+`` is not in the
    matrix and is the caller's).

    Parameters
    ----------
    q_ids : int64 ``(n_tokens,)`` the query's token ids in this matrix's vocabulary, repeats
        included, each in ``[0, n_vocab)``.
    data : float ``(n_pairs,)`` scores; ``indices`` int ``(n_pairs,)`` rows; ``indptr`` int
        ``(n_vocab + 1,)``: bm25s's ``scores`` dict (memory-mapped or not).
    want : int64 ``(m,)`` wanted rows plus ``base``, ascending (repeats allowed: each gets the score).
    base : the number subtracted from ``want`` to give a row of this matrix (a shard's first
        global row).
    acc : float32 ``(m,)``, added into.
    checked : bool ``(n_vocab,)``: posting lists already found ascending; a token not yet
        checked has its whole posting list checked once, then is marked.

    Returns
    -------
    int
        -1, or the token id whose posting list is not in strictly ascending row order (nothing
        added for it or any later token).

    Notes
    -----
    Source: bm25s's eager scoring (Lù 2024, ``_compute_relevance_from_scores``) restricted to
    the wanted rows; the search is galloping (Bentley & Yao 1976, "An almost optimal algorithm
    for unbounded searching").
    """
    m = want.size
    for p in range(q_ids.size):
        t = q_ids[p]
        lo, hi = indptr[t], indptr[t + 1]
        if hi == lo or m == 0:
            continue
        if not checked[t]:
            for j in range(lo + 1, hi):
                if indices[j] <= indices[j - 1]:
                    return t
            checked[t] = True
        pos = lo
        for j in range(m):
            w = want[j] - base
            pos = _first_at_least(indices, pos, hi, w)
            if pos == hi:
                break                          # every later wanted row lies past this posting list
            if indices[pos] == w:
                acc[j] += np.float32(data[pos])
    return -1
