"""L2G labels: document scores from passage scores (FunnelRAG Eq. 4) and D+/D− (Eq. 5).

Eq. 4 aggregates the FiD attention scores of a document unit's passages (local signal) into a
document score (global signal)::

    S(q, d) = α · max_{p ∈ d} s(q, p) + (1 − α) · mean_{p ∈ d} s(q, p)

Eq. 5 splits the pre-ranked documents ``D_m`` of a question::

    D+ = {d ∈ D_m : d contains an answer} ∪ top-𝒦(D_m by S(q, d))
    D− = D_m \\ D+

Here ``D_m`` is the set of document units whose passages the reader scored (the candidates
table: the pre-ranker's top-N units per question).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from data_contracts.funnel import LABELS


@dataclass(frozen=True)
class LabelConfig:
    """Eq. 4/5 settings.

    alpha : weight of the max in Eq. 4 (FunnelRAG default 0.75).
    top_k : 𝒦, documents with the highest aggregated score put into D+ besides the answer
        documents.
    """

    alpha: float = 0.75
    top_k: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"LabelConfig.alpha must lie in [0, 1], got {self.alpha}")
        if self.top_k < 0:
            raise ValueError(f"LabelConfig.top_k must be >= 0, got {self.top_k}")


def document_score(passage_scores: Sequence[float] | np.ndarray, alpha: float) -> float:
    """Eq. 4: ``α · max + (1 − α) · mean`` of one document's passage scores.

    Raises
    ------
    ValueError
        No passage score was given.
    """
    s = np.asarray(passage_scores, dtype=np.float64)
    if s.size == 0:
        raise ValueError("document_score: a document needs at least one passage score")
    return float(alpha * s.max() + (1.0 - alpha) * s.mean())


def split_documents(doc_scores: Sequence[float], has_answer: Sequence[bool], top_k: int,
                    tie_break: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 5 for one question.

    Parameters
    ----------
    doc_scores : ``(n_docs,)`` aggregated scores S(q, d).
    has_answer : ``(n_docs,)`` whether each document contains an answer (DPR has_answer).
    top_k : 𝒦.
    tie_break : ``(n_docs,)`` ids; equal scores rank by id (ascending) for determinism.

    Returns
    -------
    positive : ``(n_docs,)`` bool, membership of D+.
    rank : ``(n_docs,)`` int, 0 = highest score.
    """
    scores = np.asarray(doc_scores, dtype=np.float64)
    order = sorted(range(scores.size), key=lambda i: (-scores[i], tie_break[i]))
    rank = np.empty(scores.size, dtype=np.int64)
    rank[order] = np.arange(scores.size)
    positive = np.asarray(has_answer, dtype=bool) | (rank < top_k)
    return positive, rank


def make_labels(attention: pa.Table, candidates: pa.Table, cfg: LabelConfig = LabelConfig()) -> pa.Table:
    """The contract-checked labels table (Eq. 4 + Eq. 5) of every (question, document unit).

    Parameters
    ----------
    attention : pa.Table
        ``attention_scores`` rows (question_id, unit_id, passage_id, score).
    candidates : pa.Table
        ``candidates`` rows; supplies each unit's ``unit_has_answer`` and the set D_m.
    cfg : LabelConfig

    Returns
    -------
    pa.Table
        :data:`data_contracts.funnel.LABELS`, sorted by (question_id, doc_rank).

    Raises
    ------
    ValueError
        A (question, unit) of the candidates has no attention score, or an attention row
        names a unit that is not a candidate (names the question and unit).
    """
    passage_scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    for q, u, s in zip(attention["question_id"].to_pylist(), attention["unit_id"].to_pylist(),
                       attention["score"].to_pylist()):
        passage_scores[(q, u)].append(s)
    units: dict[str, dict[str, bool]] = defaultdict(dict)
    for q, u, a in zip(candidates["question_id"].to_pylist(), candidates["unit_id"].to_pylist(),
                       candidates["unit_has_answer"].to_pylist()):
        units[q][u] = bool(a)
    stray = sorted(set(passage_scores) - {(q, u) for q, us in units.items() for u in us})
    if stray:
        raise ValueError(f"attention scores for {len(stray)} (question, unit) not in the candidates, e.g. {stray[0]}")
    rows: dict[str, list] = {name: [] for name in LABELS.schema.names}
    for q in sorted(units):
        unit_ids = sorted(units[q])
        missing = [u for u in unit_ids if (q, u) not in passage_scores]
        if missing:
            raise ValueError(f"question {q}: unit {missing[0]} has no attention score")
        scores = [document_score(passage_scores[(q, u)], cfg.alpha) for u in unit_ids]
        answers = [units[q][u] for u in unit_ids]
        positive, rank = split_documents(scores, answers, cfg.top_k, unit_ids)
        for i in np.argsort(rank, kind="stable"):
            in_top = rank[i] < cfg.top_k
            reason = ("answer+top_k" if answers[i] and in_top else "answer" if answers[i]
                      else "top_k" if in_top else "negative")
            for key, value in (("question_id", q), ("unit_id", unit_ids[i]), ("doc_score", scores[i]),
                               ("doc_rank", int(rank[i])), ("has_answer", answers[i]),
                               ("positive", bool(positive[i])), ("reason", reason)):
                rows[key].append(value)
    return LABELS.validate(pa.table(rows, schema=LABELS.schema))
