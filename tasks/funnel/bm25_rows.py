"""BM25 scores of chosen rows of bm25s's score matrix, compiled (numba) and cached on disk.

bm25s keeps every (document, term) score in a CSC matrix (``data``, ``indices``, ``indptr``: the
column of token ``t`` holds its documents' rows ``indices[indptr[t]:indptr[t + 1]]``, ascending,
and their scores ``data[...]``); a query's score of a document is the sum, over the query's token
ids in order (repeats included), of the document's entries in those columns, in float32
(``BM25.get_scores``, ``_compute_relevance_from_scores``). :func:`score_rows` adds the same entries
in the same order and precision for a few wanted rows only (the passages of a query's BM25
clusters, :class:`tasks.funnel.fusion.PassageBM25`), without sorting them: each wanted row gets a
slot in a scratch array of the matrix's rows, then each query token either walks its posting
list once, adding every entry whose row has a slot (a posting list of ``L`` rows costs ``L``), or,
when the list is much longer than the wanted rows (``L > m log2 L``), binary-searches each of the
``m`` rows in it (``m log2 L``). Either way a token never costs a pass over the corpus.
:func:`group_by_shard` splits the rows of a sharded index by shard in one counting pass.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def group_by_shard(positions, shard_of, local, n_shards):  # pragma: no cover - compiled
    """Group wanted positions by shard, keeping their order within a shard (a counting sort).

    Parameters
    ----------
    positions : int64 ``(m,)`` positions wanted, any order, repeats allowed.
    shard_of : int ``(n,)`` the shard of each position; ``local`` int ``(n,)`` its row in the shard.
    n_shards : number of shards (every ``shard_of`` value lies in ``[0, n_shards)``).

    Returns
    -------
    order : int64 ``(m,)``: ``positions[order]`` grouped by shard.
    rows : int64 ``(m,)``: ``local[positions[order]]``, the rows in their shard.
    bounds : int64 ``(n_shards + 1,)``: shard ``s``'s part is ``[bounds[s], bounds[s + 1])``.
    """
    m = positions.size
    bounds = np.zeros(n_shards + 1, np.int64)
    for j in range(m):
        bounds[shard_of[positions[j]] + 1] += 1
    for s in range(n_shards):
        bounds[s + 1] += bounds[s]
    fill = bounds[:n_shards].copy()
    order = np.empty(m, np.int64)
    rows = np.empty(m, np.int64)
    for j in range(m):
        p = positions[j]
        s = shard_of[p]
        order[fill[s]] = j
        rows[fill[s]] = local[p]
        fill[s] += 1
    return order, rows, bounds


@numba.njit(cache=True, nogil=True)
def _bits(n):  # pragma: no cover - compiled
    """Bits of ``n >= 0`` (``ceil(log2(n + 1))``)."""
    b = 0
    while n > 0:
        b += 1
        n >>= 1
    return b


@numba.njit(cache=True, nogil=True)
def _walk_checked(indices, data, lo, hi, slot, acc):  # pragma: no cover - compiled
    """The walk of :func:`score_rows` over ``[lo, hi)`` that also checks the rows ascend: -1, or
    the position where they do not (entries before it added)."""
    for k in range(lo, hi):
        if k > lo and indices[k] <= indices[k - 1]:
            return k
        s = slot[indices[k]]
        if s > 0:
            acc[s - 1] += np.float32(data[k])
    return -1


@numba.njit(cache=True, nogil=True)
def score_rows(q_ids, data, indices, indptr, rows, acc, checked, slot):  # pragma: no cover - compiled
    """Add the query's BM25 term scores of the wanted rows into ``acc``.

    For each token id ``t = q_ids[p]`` in order, each wanted row ``rows[j]`` found in ``t``'s
    posting list adds its entry (cast to float32) to ``acc[j]``: after the call ``acc[j]`` holds
    (from zeros) bm25s's float32 score of that row, the same sums in the same order (a row in
    no posting list: 0; the non-occurrence term of ``bm25l``/``bm25+`` is not in the matrix and
    is the caller's). A repeated row gets the score of its first occurrence.

    Parameters
    ----------
    q_ids : int64 ``(n_tokens,)`` the query's token ids in this matrix's vocabulary, repeats
        included, each in ``[0, n_vocab)``.
    data : float ``(n_pairs,)`` scores; ``indices`` int ``(n_pairs,)`` rows; ``indptr`` int
        ``(n_vocab + 1,)``: bm25s's ``scores`` dict (memory-mapped or not).
    rows : int64 ``(m,)`` wanted rows of this matrix, any order, repeats allowed.
    acc : float32 ``(m,)``, added into.
    checked : bool ``(n_vocab,)``: posting lists already found ascending; a token not yet
        checked has its whole posting list checked once (as it is walked, or before its rows
        are searched), then is marked.
    slot : int32 zeros, ``(n_docs,)`` or more: scratch, left zero.

    Returns
    -------
    int
        -1, or the token id whose posting list is not in strictly ascending row order (``acc``
        then holds partial sums).

    Notes
    -----
    Source: bm25s's eager scoring (Lù 2024, ``_compute_relevance_from_scores``) restricted to
    the wanted rows.
    """
    m = rows.size
    n_first = 0
    for j in range(m):                       # the first occurrence of each row takes a slot (j + 1)
        if slot[rows[j]] == 0:
            slot[rows[j]] = j + 1
            n_first += 1
    bad = -1
    for p in range(q_ids.size):
        t = q_ids[p]
        lo, hi = indptr[t], indptr[t + 1]
        if hi == lo or m == 0:
            continue
        length = hi - lo
        walk = length <= n_first * _bits(length)
        if not checked[t]:
            if walk:                         # checked as it is walked
                bad = _walk_checked(indices, data, lo, hi, slot, acc)
            else:
                for k in range(lo + 1, hi):
                    if indices[k] <= indices[k - 1]:
                        bad = t
                        break
            if bad >= 0:
                bad = t
                break
            checked[t] = True
            if walk:
                continue
        if walk:
            for k in range(lo, hi):          # walk the posting list
                s = slot[indices[k]]
                if s > 0:
                    acc[s - 1] += np.float32(data[k])
        else:
            for j in range(m):               # binary search of each wanted row
                r = rows[j]
                if slot[r] != j + 1:
                    continue
                a, b = lo, hi
                while a < b:
                    mid = (a + b) >> 1
                    if indices[mid] < r:
                        a = mid + 1
                    else:
                        b = mid
                if a < hi and indices[a] == r:
                    acc[j] += np.float32(data[a])
    for j in range(m):                       # repeats copy their first occurrence's score
        first = slot[rows[j]] - 1
        if first != j:
            acc[j] = acc[first]
    for j in range(m):
        slot[rows[j]] = 0
    return bad
