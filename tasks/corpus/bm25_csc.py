"""bm25s's eager BM25 score matrix built from flat token ids in two streaming passes.

bm25s stores, for every (document, term) pair with ``tf > 0``, the score ``idf(t) * tfc(tf, l_d)``
in a CSC matrix: ``data`` (float32 scores), ``indices`` (int32 document rows) and ``indptr``
(int64, ``n_vocab + 1``), columns = terms, rows ascending within a column. bm25s makes the
``(doc, term, score)`` triples of all documents, then sorts them by a packed int64
``(term << 32) | doc`` key (``_np_csc_python``): about 36 bytes a pair at the peak, besides the token
ids. :func:`bm25_csc` computes the same three arrays with a counting sort:

1. pass 1 over the token ids: ``df(t)`` (documents holding ``t``) and the document lengths;
   ``indptr = [0, cumsum(df)]`` (a column holds one entry per document holding its term);
2. ``idf`` from ``df`` with bm25s's own idf function, called once per distinct ``df`` value;
3. pass 2: each document's term frequencies, scored and written at ``heads[t]``, the next free
   slot of column ``t``. Documents come in row order, so rows ascend within every column: the
   order of bm25s's sort (its keys are unique, so its order is fully determined).

Memory: the output (``data`` + ``indices``: 8 bytes a pair) plus ~40 bytes a vocabulary term
(``df``, ``heads``, ``indptr``, ``idf``, a tf scratch array) plus one chunk of token ids; no
per-pair intermediate. The scores are bm25s's operations in its order and precision (float32
``tf``, float64 term-frequency component, float32 idf, a float64 product rounded to float32), so the
saved files are byte-identical (``tests/test_bm25_csc.py``).
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numba
import numpy as np

TokenChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]
"""A re-iterable source of token ids: each call yields ``(ids, offsets)`` chunks covering the
documents in row order; ``ids`` int32 ``(n_tokens,)``, ``offsets`` int64 ``(n_docs_in_chunk + 1,)``
starting at 0 (document ``i`` of the chunk is ``ids[offsets[i]:offsets[i + 1]]``)."""

METHODS = ("robertson", "lucene", "atire")
"""bm25s methods :func:`bm25_csc` computes (no non-occurrence scores; ``atire`` has its own tfc)."""


@numba.njit(cache=True, nogil=True)
def _doc_freqs(ids, offsets, counts, df):  # pragma: no cover - compiled
    """``df[t] += 1`` for every distinct term of every document of the chunk; ``counts`` (zeros,
    ``(n_vocab,)``) is scratch and is left zero."""
    for i in range(offsets.size - 1):
        lo, hi = offsets[i], offsets[i + 1]
        for j in range(lo, hi):
            counts[ids[j]] += 1
        for j in range(lo, hi):
            t = ids[j]
            if counts[t]:
                df[t] += 1
                counts[t] = 0


@numba.njit(cache=True, nogil=True)
def _scatter_scores(ids, offsets, row0, counts, heads, ends, idf, avg_doc_len, k1, b, atire, data, indices):  # pragma: no cover
    """Score every (document, term) pair of the chunk and write it at ``heads[t]`` (then ``+ 1``):
    ``data`` the float32 score, ``indices`` the row ``row0 + i``. The arithmetic is bm25s's:
    robertson/lucene ``tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf)``, atire
    ``float32(tf * (k1 + 1)) / (tf + k1 * ((1 - b) + b * l_d / l_avg))``, times ``idf``, in float64
    with ``tf`` and ``idf`` float32 as bm25s holds them; rounded to float32. Returns False (and
    stops) if a column would pass its end ``ends[t]`` (token ids other than those counted)."""
    one_minus_b = 1.0 - b
    k1_plus_1 = np.float32(k1 + 1.0)
    for i in range(offsets.size - 1):
        lo, hi = offsets[i], offsets[i + 1]
        if hi == lo:
            continue
        for j in range(lo, hi):
            counts[ids[j]] += 1
        norm = k1 * (one_minus_b + b * float(hi - lo) / avg_doc_len)
        row = row0 + i
        for j in range(lo, hi):
            t = ids[j]
            c = counts[t]
            if c:
                tf = np.float32(c)
                if atire:
                    tfc = np.float64(tf * k1_plus_1) / (np.float64(tf) + norm)
                else:
                    tfc = np.float64(tf) / (norm + np.float64(tf))
                pos = heads[t]
                if pos >= ends[t]:
                    return False
                data[pos] = np.float32(np.float64(idf[t]) * tfc)
                indices[pos] = row
                heads[t] = pos + 1
                counts[t] = 0
    return True


def _check_chunk(ids: np.ndarray, offsets: np.ndarray, n_vocab: int) -> None:
    """The kernels index without bounds checks: ids in ``[0, n_vocab)``, offsets spanning ``ids``."""
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] != ids.size or np.any(offsets[1:] < offsets[:-1]):
        raise ValueError(f"BM25 build: chunk offsets do not span its {ids.size} token ids")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_vocab):
        raise ValueError(f"BM25 build: token ids outside the vocabulary of {n_vocab} terms")


def doc_freqs(chunks: TokenChunks, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1: ``(df, lengths)``: int64 ``(n_vocab,)`` documents holding each term, int64
    ``(n_docs,)`` tokens per document. Raises ``ValueError`` on a token id outside ``[0, n_vocab)``."""
    df = np.zeros(n_vocab, dtype=np.int64)
    counts = np.zeros(n_vocab, dtype=np.int32)
    lengths = []
    for ids, offsets in chunks():
        _check_chunk(ids, offsets, n_vocab)
        _doc_freqs(ids, offsets, counts, df)
        lengths.append(np.diff(offsets))
    return df, (np.concatenate(lengths) if lengths else np.zeros(0, np.int64))


def idf_array(df: np.ndarray, n_docs: int, idf_fn: Callable[..., float], dtype: str = "float32") -> np.ndarray:
    """bm25s's ``_build_idf_array`` (``idf_fn(df, N=n_docs)`` per term, 0 where ``df == 0``, cast to
    ``dtype``), with one Python call per distinct ``df`` value instead of per term."""
    from bm25s.scoring import _build_idf_array  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

    values, inverse = np.unique(df, return_inverse=True)
    per_value = _build_idf_array(doc_frequencies=dict(enumerate(values.tolist())), n_docs=n_docs,
                                 compute_idf_fn=idf_fn, dtype=dtype)
    return per_value[inverse]


def bm25_csc(chunks: TokenChunks, n_vocab: int, method: str, k1: float, b: float,
             idf_fn: Callable[..., float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """bm25s's score matrix of the documents of ``chunks`` (read twice) in CSC form.

    Parameters
    ----------
    chunks : :data:`TokenChunks` over ``n_docs`` documents, token ids in ``[0, n_vocab)``.
    n_vocab : number of columns (terms).
    method : one of :data:`METHODS` (bm25s's name; selects the tfc formula).
    k1, b : BM25 parameters.
    idf_fn : bm25s's idf function for the method (``_select_idf_scorer(idf_method)``).

    Returns
    -------
    data : float32 ``(n_pairs,)`` scores, column by column, rows ascending within a column.
    indices : int32 ``(n_pairs,)`` document rows.
    indptr : int64 ``(n_vocab + 1,)``; column ``t`` is ``data[indptr[t]:indptr[t + 1]]``.
    n_docs : number of documents (rows).

    Raises
    ------
    ValueError
        ``method`` is not in :data:`METHODS`, a token id is outside the vocabulary, or the two
        passes read different token ids.
    """
    if method not in METHODS:
        raise ValueError(f"bm25_csc: method {method!r} is not one of {METHODS}")
    df, lengths = doc_freqs(chunks, n_vocab)
    n_docs = int(lengths.size)
    avg_doc_len = float(lengths.mean()) if n_docs else 0.0      # as bm25s: mean of the int lengths
    del lengths
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    idf = idf_array(df, n_docs, idf_fn)
    del df
    heads = indptr[:-1].copy()
    data = np.empty(int(indptr[-1]), dtype=np.float32)
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    counts = np.zeros(n_vocab, dtype=np.int32)
    row0 = 0
    for ids, offsets in chunks():
        _check_chunk(ids, offsets, n_vocab)
        if row0 + offsets.size - 1 > n_docs or not _scatter_scores(
                ids, offsets, row0, counts, heads, indptr[1:], idf, avg_doc_len, float(k1), float(b),
                method == "atire", data, indices):
            raise ValueError("bm25_csc: the second pass over the token ids differs from the first")
        row0 += offsets.size - 1
    if row0 != n_docs or not np.array_equal(heads, indptr[1:]):
        raise ValueError("bm25_csc: the second pass over the token ids differs from the first")
    return data, indices, indptr, n_docs


def array_chunks(ids: np.ndarray, offsets: np.ndarray, chunk_tokens: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """:data:`TokenChunks` chunks of in-memory flat ids (views): whole documents, about
    ``chunk_tokens`` tokens a chunk (at least one document)."""
    n_docs, lo = offsets.size - 1, 0
    while lo < n_docs:
        hi = max(lo + 1, int(np.searchsorted(offsets, offsets[lo] + chunk_tokens, side="right")) - 1)
        hi = min(hi, n_docs)
        yield ids[offsets[lo]:offsets[hi]], offsets[lo:hi + 1] - offsets[lo]
        lo = hi
