"""Fused unit pre-ranking: a unit's BM25 score and its MaxP dense score combined.

The MaxP pre-ranker (:mod:`tasks.funnel.unit_scoring`) ranks the units of the K BM25 clusters by
their best passage's bi-encoder score alone, and drops answer units that BM25 ranks well. Here a
unit also scores by what BM25 knows about it: the flat passage index's BM25 score of each of its
passages for the question (the scores flat BM25 ranks the whole corpus by), pooled per unit by
``max`` (BM25-MaxP) or ``sum``. The two unit scores of one question are fused over the units of
its K clusters:

* ``convex`` — ``s(u) = w · mm(b)(u) + (1 − w) · mm(d)(u)``, ``mm(x) = (x − min x) / (max x − min x)``
  over the question's units (0 for all when ``max x = min x``), ``b`` the pooled BM25 and ``d``
  the MaxP dense scores: the convex combination of min-max normalised scores (Bruch, Gai &
  Ingber 2023, "An Analysis of Fusion Functions for Hybrid Retrieval", §4).
* ``rrf`` — ``s(u) = w / (k + r_b(u)) + (1 − w) / (k + r_d(u))``, ``r`` the 1-based rank by
  (score desc, unit_id asc); ``w = 0.5`` is reciprocal-rank fusion (Cormack, Clarke & Büttcher
  2009, ``Σ 1 / (k + r)``, here halved, which does not change the order).

Units then rank by ``(s desc, unit_id asc)``. The weight ``w`` and ``k`` are chosen on the
validation part of the NQ-open train split (``docs/results/funnel.md``), never on test questions.

Passage BM25 scores are read for the candidate rows only (:class:`PassageBM25`): per query
token, the sorted rows merged against the token's posting list of the bm25s index by galloping, in
one compiled call a shard (:mod:`tasks.funnel.bm25_rows`), so the cost grows with the candidates
and the query tokens' posting lists' log length, not with the corpus.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

FUSIONS = ("none", "convex", "rrf")
BM25_POOLS = ("max", "sum")


@dataclass(frozen=True)
class FusionConfig:
    """How unit scores are fused.

    method : ``"none"`` (MaxP dense only), ``"convex"`` or ``"rrf"``.
    bm25_weight : ``w`` in [0, 1], the BM25 side's weight.
    rrf_k : ``k`` of RRF (> 0; Cormack et al. use 60).
    bm25_pool : ``"max"`` or ``"sum"`` of the unit's passage BM25 scores.
    """

    method: str = "none"
    bm25_weight: float = 0.5
    rrf_k: float = 60.0
    bm25_pool: str = "max"

    def __post_init__(self) -> None:
        if self.method not in FUSIONS or self.bm25_pool not in BM25_POOLS:
            raise ValueError(f"fusion method must be one of {FUSIONS} and bm25_pool one of {BM25_POOLS}, "
                             f"got {self.method!r}, {self.bm25_pool!r}")
        if not 0.0 <= self.bm25_weight <= 1.0 or self.rrf_k <= 0:
            raise ValueError(f"fusion needs 0 <= bm25_weight <= 1 and rrf_k > 0, got {self.bm25_weight}, {self.rrf_k}")


def min_max(x: np.ndarray) -> np.ndarray:
    """``(x − min x) / (max x − min x)``, float64 ``(n,)``; all zeros when ``max x = min x``
    (or ``n = 0``)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return np.zeros_like(x) if hi == lo else (x - lo) / (hi - lo)


def ranks(scores: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """1-based rank of each entry by (score desc, name asc), int64 ``(n,)``."""
    order = sorted(range(len(names)), key=lambda i: (-float(scores[i]), names[i]))
    out = np.empty(len(names), np.int64)
    out[order] = np.arange(1, len(names) + 1)
    return out


def pool_bm25(passage_scores: np.ndarray, groups: np.ndarray, n_groups: int, how: str) -> np.ndarray:
    """Per-unit pooling of passage BM25 scores, ``max`` or ``sum``, float64 ``(n_groups,)``
    (``-inf`` / 0 for a group without passages).

    Parameters
    ----------
    passage_scores : float ``(n,)``.
    groups : int ``(n,)``, the unit index of each passage in ``[0, n_groups)``.
    n_groups : number of units.
    how : ``"max"`` or ``"sum"``.

    Raises
    ------
    ValueError
        ``how`` is neither.
    """
    g = np.asarray(groups, dtype=np.int64)
    s = np.asarray(passage_scores, dtype=np.float64)
    if how == "sum":
        return np.bincount(g, weights=s, minlength=n_groups).astype(np.float64)
    if how == "max":
        out = np.full(n_groups, -np.inf)
        np.maximum.at(out, g, s)
        return out
    raise ValueError(f"bm25 pool must be one of {BM25_POOLS}, got {how!r}")


def fuse(dense: np.ndarray, bm25: np.ndarray, names: Sequence[str], cfg: FusionConfig) -> np.ndarray:
    """Fused unit scores, float64 ``(n_units,)`` (the module docstring's ``s(u)``).

    Parameters
    ----------
    dense : MaxP dense unit scores ``(n_units,)``.
    bm25 : pooled BM25 unit scores ``(n_units,)``.
    names : the ``n_units`` unit ids (rank ties).
    cfg : FusionConfig; ``method="none"`` returns ``dense`` (as float64).

    Raises
    ------
    ValueError
        The three inputs differ in length.
    """
    dense, bm25 = np.asarray(dense, np.float64), np.asarray(bm25, np.float64)
    if not dense.shape == bm25.shape == (len(names),):
        raise ValueError(f"fuse: {dense.shape} dense, {bm25.shape} BM25 scores for {len(names)} units")
    w = cfg.bm25_weight
    if cfg.method == "none":
        return dense
    if cfg.method == "convex":
        return fuse_passages(dense, bm25, w)
    return w / (cfg.rrf_k + ranks(bm25, names)) + (1.0 - w) / (cfg.rrf_k + ranks(dense, names))


def fuse_passages(dense: np.ndarray, bm25: np.ndarray, bm25_weight: float) -> np.ndarray:
    """Convex fusion of scores: ``w · mm(bm25) + (1 − w) · mm(dense)`` over the given passages
    (the final passages of the top-N units) or units (:func:`fuse`'s ``convex``), float64
    ``(n,)``; ``mm`` is :func:`min_max`.

    The convex combination of min-max normalised scores (Bruch, Gai & Ingber 2023, §4). Applied
    to the passages the funnel's last step chooses from: flat BM25 + re-rank
    wins on answer recall because its candidates were found by passage BM25, which the units'
    dense passage order ignores.

    Parameters
    ----------
    dense, bm25 : ``(n,)`` scores of the same passages.
    bm25_weight : ``w`` in [0, 1].

    Raises
    ------
    ValueError
        Lengths differ, or ``w`` is outside [0, 1].
    """
    dense, bm25 = np.asarray(dense, np.float64), np.asarray(bm25, np.float64)
    if dense.shape != bm25.shape or dense.ndim != 1:
        raise ValueError(f"fuse_passages: {dense.shape} dense and {bm25.shape} BM25 scores")
    if not 0.0 <= bm25_weight <= 1.0:
        raise ValueError(f"fuse_passages needs 0 <= bm25_weight <= 1, got {bm25_weight}")
    return bm25_weight * min_max(bm25) + (1.0 - bm25_weight) * min_max(dense)


def _same_ids(doc_ids: Sequence[str], passage_ids) -> bool:
    """Whether two id sequences are equal, element by element. An Arrow-backed sequence (a
    memory-mapped embedding index's ``passage_ids``, with ``.array``) is compared in blocks of
    65,536, so 5M ids cost ~1 s and no more memory than a block."""
    if len(doc_ids) != len(passage_ids):
        return False
    array = getattr(passage_ids, "array", None)
    if array is None:
        return all(a == b for a, b in zip(doc_ids, passage_ids))
    step = 65_536
    return all(array.slice(i, step).to_pylist() == list(doc_ids[i:i + step]) for i in range(0, len(doc_ids), step))


class PassageBM25:
    """BM25 scores of chosen passages for a question, from the corpus's flat passage index.

    Equal to the scores the flat index gives those passages over the whole corpus (bm25s
    ``get_scores``: the sum, over the query's token ids in the vocabulary, repeats included, of
    the token's precomputed BM25 term score in the passage, in float32; plus, for ``bm25l`` and
    ``bm25+``, the query tokens' non-occurrence scores), read by one compiled call a shard
    (:func:`tasks.funnel.bm25_rows.score_rows`): the wanted rows, sorted once, merged against
    each query token's posting list by galloping. bm25s's CSC postings hold ascending rows; each
    posting list is checked once, at its first use.

    Parameters
    ----------
    index : :class:`tasks.corpus.index.BM25Index` or :class:`tasks.corpus.sharded.sharded_index.ShardedBM25`
        (each shard holds the global corpus statistics, so its scores are the corpus's).
    passage_ids : ``(n,)`` ids of the rows callers ask for (an embedding index's
        ``passage_ids``): position ``i`` of a call is the passage ``passage_ids[i]``.

    Raises
    ------
    KeyError
        A passage id is not in the BM25 index (names it).
    """

    def __init__(self, index, passage_ids: Sequence[str]):
        shards = list(getattr(index, "shards", [index]))
        self._tokenizer = shards[0]
        self._shards = []
        for s in shards:
            m = s.retriever.scores
            nonocc = getattr(s.retriever, "nonoccurrence_array", None)
            self._shards.append((np.asarray(m["data"]), np.asarray(m["indices"]), np.asarray(m["indptr"]),
                                 s.retriever.vocab_dict, None if nonocc is None else np.asarray(nonocc),
                                 np.zeros(len(m["indptr"]) - 1, dtype=np.bool_)))    # posting lists checked
        self._offsets = np.cumsum([0] + [len(s) for s in shards]).astype(np.int64)  # (n_shards + 1,)
        doc_ids = index.doc_ids
        # self._bm25_row (n,): the BM25 index's global row of each position (shard order, then row in its shard)
        if _same_ids(doc_ids, passage_ids):
            self._bm25_row = np.arange(len(doc_ids), dtype=np.int64)
        else:
            row = {p: i for i, p in enumerate(doc_ids)}
            try:
                self._bm25_row = np.fromiter((row[p] for p in passage_ids), np.int64, count=len(passage_ids))
            except KeyError as exc:
                raise KeyError(f"passage {exc.args[0]!r} is not in the BM25 passage index") from exc

    def scores(self, question: str, rows: np.ndarray) -> np.ndarray:
        """BM25 score of each of ``rows`` (positions in ``passage_ids``, any order, repeats
        allowed) for ``question``, float32 ``(len(rows),)``; 0 for a passage sharing no query
        token (the non-occurrence scores for ``bm25l``/``bm25+``).

        Raises
        ------
        ValueError
            A posting list is not in ascending row order (an index this code cannot read).
        """
        from tasks.funnel.bm25_rows import score_rows  # noqa: PLC0415  (heavy: numba kernels, only when scores are read)

        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.zeros(0, np.float32)
        global_rows = self._bm25_row[rows]
        order = np.argsort(global_rows, kind="stable")
        want = global_rows[order]                                        # (n,) ascending
        bounds = np.searchsorted(want, self._offsets).tolist()          # shard si: want[bounds[si]:bounds[si + 1]]
        acc = np.zeros(rows.size, np.float32)                            # (n,) in the order of want
        tokens = self._tokenizer.tokenize([question])[0]
        for si, (data, indices, indptr, vocab, nonocc, checked) in enumerate(self._shards):
            a, b = bounds[si], bounds[si + 1]
            if a == b:
                continue
            ids = np.array([vocab[t] for t in tokens if t in vocab], dtype=np.int64)
            if ids.size == 0:
                continue
            bad = score_rows(ids, data, indices, indptr, want[a:b], int(self._offsets[si]), acc[a:b], checked)
            if bad >= 0:
                raise ValueError(f"BM25 posting list of token {bad} (shard {si}) is not in ascending row order")
            if nonocc is not None:
                acc[a:b] += np.float32(nonocc[ids].sum())
        out = np.empty(rows.size, np.float32)
        out[order] = acc
        return out
