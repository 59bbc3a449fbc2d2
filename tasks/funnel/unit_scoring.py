"""Whole-unit pre-ranking: a ~1K-token document unit scored from all of its passages (MaxP).

A transformer pre-ranker reads at most ``max_length`` tokens (256 for MiniLM), so scoring a
~1K-token unit from its text alone shows the pre-ranker its first quarter. As for long
documents in neural IR (Dai & Callan 2019, "MaxP"), the unit is instead cut into windows that
together cover all of it — its own ~100-word passages, each well under 256 tokens — every
window is scored by the pre-ranker, and the unit's score is the best window's:

    f(q, u) = max_{p ∈ u} f(q, p)          (FunnelRAG Eq. 1 applied per passage, then max)

This works for the bi-encoder (passage embeddings, computable offline) and the cross-encoder
(one pair per passage) alike, and yields passage scores for free: without a post-ranker, the
final passages are the best-scoring passages of the top-N units instead of their first ones.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from funnelrag.progress import Progress
from models.preranker import require_finite, score_grouped
from tasks.funnel.embeddings import EmbeddingConfig, embed_passages, embed_queries
from tasks.funnel.vector_store import VectorStore

UNIT_SCORING = ("first", "maxp")


def group_max(scores: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Maximum of ``scores`` per group, float32 ``(n_groups,)`` (``-inf`` for an empty group).

    Parameters
    ----------
    scores : float ``(n,)`` passage scores.
    groups : int ``(n,)`` group (unit) index of each score, in ``[0, n_groups)``.
    n_groups : number of groups.
    """
    out = np.full(n_groups, -np.inf, dtype=np.float32)
    np.maximum.at(out, np.asarray(groups, dtype=np.int64), np.asarray(scores, dtype=np.float32))
    return out


def maxp_pool_scores(model, tokenizer, questions: Sequence[str], pool: Sequence[tuple[int, str]],
                     passages_of: dict[str, list[tuple[str, str]]], batch_size: int = 32
                     ) -> tuple[np.ndarray, dict[tuple[int, str], float]]:
    """MaxP scores of (question, unit) pool rows, and the score of every passage behind them.

    Parameters
    ----------
    model, tokenizer : a pre-ranker (:mod:`models.preranker`, bi- or cross-encoder).
    questions : question texts.
    pool : ``[(question index, unit_id)]`` rows to score.
    passages_of : ``unit_id → [(passage_id, text)]``, the unit's passages in order; ``text``
        is what the pre-ranker reads (:func:`tasks.funnel.embeddings.passage_text`).
    batch_size : pairs (or texts) per forward pass.

    Returns
    -------
    unit_scores : float32 ``(len(pool),)``, ``max`` over each unit's passage scores.
    passage_scores : ``{(question index, passage_id): f(q, p)}`` for every passage of every
        pool unit.

    Raises
    ------
    ValueError
        A pool unit has no passages.
    """
    p_row: dict[str, int] = {}
    texts: list[str] = []
    for uid in sorted({u for _, u in pool}):
        if not passages_of.get(uid):
            raise ValueError(f"unit {uid!r} has no passages to score")
        for pid, text in passages_of[uid]:
            p_row[pid] = len(texts)
            texts.append(text)
    pairs, owner = [], []
    for r, (qi, uid) in enumerate(pool):
        for pid, _ in passages_of[uid]:
            pairs.append((qi, p_row[pid]))
            owner.append(r)
    with Progress("pre-rank candidate passages", total=len(texts), unit="passages") as bar:
        scores = score_grouped(model, tokenizer, list(questions), texts, pairs, batch_size, bar)   # (n_pairs,)
    unit_scores = group_max(scores, np.asarray(owner), len(pool))                        # (len(pool),)
    pids = list(p_row)
    passage_scores = {(qi, pids[j]): float(s) for (qi, j), s in zip(pairs, scores)}
    return unit_scores, passage_scores


def stored_maxp_pool_scores(model, tokenizer, questions: Sequence[str], pool: Sequence[tuple[int, str]],
                            passages_of: dict[str, list[tuple[str, str]]], index, batch_size: int = 32
                            ) -> tuple[np.ndarray, dict[tuple[int, str], float]]:
    """:func:`maxp_pool_scores` of a bi-encoder with the passage vectors read from an embedding
    index: ``f(q, p) = E(q) · E(p)`` (FunnelRAG Eq. 1), ``E(q)`` computed once per question,
    ``E(p)`` the stored row of passage ``p``; a unit scores the max over its passages (MaxP).

    Costs one question encoding (~10 ms on CPU) plus dot products per question, instead of a
    transformer pass over every passage of every pool unit (seconds per question on CPU).

    Parameters
    ----------
    model, tokenizer : the bi-encoder pre-ranker whose weights built ``index`` (the caller checks
        the model version with :meth:`tasks.funnel.embeddings.EmbeddingIndex.check`).
    questions, pool, passages_of, batch_size : as :func:`maxp_pool_scores` (texts are unused).
    index : :class:`tasks.funnel.embeddings.EmbeddingIndex` of the corpus the units come from.

    Returns
    -------
    unit_scores : float32 ``(len(pool),)``.
    passage_scores : ``{(question index, passage_id): f(q, p)}``.

    Raises
    ------
    ValueError
        A pool unit has no passages.
    KeyError
        A passage of a pool unit is not in the embedding index (names it).
    """
    row_of = index.row_of()
    rows_of: dict[str, np.ndarray] = {}
    for uid in sorted({u for _, u in pool}):
        if not passages_of.get(uid):
            raise ValueError(f"unit {uid!r} has no passages to score")
        try:
            rows_of[uid] = np.asarray([row_of[pid] for pid, _ in passages_of[uid]], np.int64)
        except KeyError as exc:
            raise KeyError(f"passage {exc.args[0]!r} of unit {uid!r} is not in the embedding index") from exc
    qvec = embed_queries(model, tokenizer, list(questions), batch_size)          # (n_questions, dim)
    unit_scores = np.zeros(len(pool), np.float32)
    passage_scores: dict[tuple[int, str], float] = {}
    for r, (qi, uid) in enumerate(pool):
        s = index.vectors[rows_of[uid]] @ qvec[qi]                              # (n_passages_of_unit,)
        unit_scores[r] = s.max()
        for (pid, _), v in zip(passages_of[uid], s.tolist()):
            passage_scores[(qi, pid)] = v
    return unit_scores, passage_scores


def stored_text_scores(model, tokenizer, questions: Sequence[str], texts: Sequence[str],
                       pairs: Sequence[tuple[int, int]], store: VectorStore, batch_size: int = 32
                       ) -> tuple[np.ndarray, dict]:
    """Bi-encoder scores ``f(q, d) = E_q(q) · E_d(d)`` (FunnelRAG Eq. 1) of ``(questions[i], texts[j])``
    for each ``(i, j)`` in ``pairs``, the document vectors kept by content in ``store``.

    Same values as :func:`models.preranker.score_grouped` up to float rounding (both L2-normalise
    both towers' outputs); each distinct text is embedded once per model version, whatever step
    asks for it (a pool's units, the same pool re-ranked by a pre-ranker fine-tuned on the query
    side only, the champion gate), and a text the store already holds is not embedded again
    (:func:`tasks.funnel.embeddings.embed_passages`).

    Parameters
    ----------
    model, tokenizer : a bi-encoder pre-ranker (:class:`models.preranker.BiEncoderPreRanker`).
    questions, texts : query texts and document texts (e.g. unit texts, truncated by the model to
        its ``max_length`` as in :func:`models.preranker.score_grouped`).
    pairs : ``[(question index, text index)]``.
    store : the vector store of ``model``'s document tower
        (:func:`tasks.funnel.vector_store.vector_store_root` of
        :func:`tasks.funnel.embeddings.model_version`); the caller picks it by model version.
    batch_size : texts per forward pass, at most.

    Returns
    -------
    (scores, info)
        float32 ``(len(pairs),)`` and ``{"embedded": texts encoded now, "reused": texts read
        from the store, "discarded_segments": damaged store segments dropped}``.

    Raises
    ------
    models.preranker.NonFiniteScoresError
        A score is NaN or infinite.
    """
    if not pairs:
        return np.zeros(0, dtype=np.float32), {"embedded": 0, "reused": 0, "discarded_segments": 0}
    d_idx = sorted({j for _, j in pairs})
    q_idx = sorted({i for i, _ in pairs})
    was_training = model.training
    model.eval()
    try:
        d_vec, info = embed_passages([texts[j] for j in d_idx], model, tokenizer,
                                     EmbeddingConfig(batch_size=batch_size), store)         # (n_d, dim)
        q_vec = embed_queries(model, tokenizer, [questions[i] for i in q_idx], batch_size)  # (n_q, dim)
    finally:
        model.train(was_training)
    q_row = {i: r for r, i in enumerate(q_idx)}
    d_row = {j: r for r, j in enumerate(d_idx)}
    qi = np.fromiter((q_row[i] for i, _ in pairs), np.int64, len(pairs))
    dj = np.fromiter((d_row[j] for _, j in pairs), np.int64, len(pairs))
    scores = np.einsum("nd,nd->n", q_vec[qi], d_vec[dj]).astype(np.float32)                # (n_pairs,)
    return require_finite(scores, "pre-ranker scores"), info
