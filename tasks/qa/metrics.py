"""QA metrics, written once for every pipeline: answer recall AR@k, exact match, contextual-integrity
entropy (answerability over a whole corpus: tasks/qa/corpus_answers.py).

* **AR@k** (FunnelRAG Tables 2, 11–13; DPR top-k accuracy): share of questions whose top-``k``
  retrieved passages contain an answer string by DPR ``has_answer``
  (:class:`tasks.qa.questions.AnswerMatcher`).
* **EM** (Table 3): SQuAD exact match of the generated answer (:func:`tasks.qa.questions.exact_match`).
* **Entropy** (Table 9, contextual integrity): Shannon entropy of the distribution of the
  titles of the top-4 passages, ``H = −Σ_t p_t log₂ p_t`` with ``p_t`` = share of the passages
  from article ``t``: 0 bits when all four come from one article, 2 bits when they come from four.
* **Answer in corpus**: whether any passage of the corpus contains an answer (DPR
  ``has_answer``); NQ-open was written against full Wikipedia, so on a small corpus many
  questions cannot be answered at all and are reported as a separate subset.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from tasks.qa.questions import AnswerMatcher, dpr_tokens, exact_match


def answer_recall(hits: Sequence[Sequence[bool]], ks: Iterable[int]) -> dict[int, float]:
    """AR@k over questions.

    Parameters
    ----------
    hits : per question, DPR ``has_answer`` of its ranked passages, best first
        (``(n_questions, n_ranked)``, ragged); a list shorter than ``k`` counts what it has.
    ks : cut-offs (each >= 1).

    Returns
    -------
    dict
        ``{k: AR@k}`` in [0, 1]; 0.0 for every ``k`` when there is no question.

    Raises
    ------
    ValueError
        A cut-off is < 1.
    """
    return recall_at_ranks([first_hit(h) for h in hits], ks)


def first_hit(hits: Sequence[bool]) -> int | None:
    """0-based rank of the first answer-bearing passage, or None."""
    return next((i for i, h in enumerate(hits) if h), None)


def first_hit_ranks(question_ids: Iterable[str], ranks: Iterable[int], hits: Iterable[bool]) -> dict[str, int | None]:
    """Per question, the best (smallest) rank of a row that holds an answer, from long-format rows
    ``(question_id, rank, has_answer)`` in any order (a unit pool, a candidates table); None for a
    question whose rows hold none. Every question that has a row is a key."""
    best: dict[str, int | None] = {}
    for q, rank, hit in zip(question_ids, ranks, hits):
        cur = best.setdefault(q, None)
        if hit and (cur is None or rank < cur):
            best[q] = rank
    return best


def recall_per_question(first: Sequence[int | None], ks: Iterable[int]) -> dict[int, np.ndarray]:
    """``{k: (n_questions,) float 0/1}``: whether each question's first answer rank ``first[i]``
    (0-based, None: no answer) is below ``k``.

    Raises
    ------
    ValueError
        A cut-off is < 1.
    """
    ks = [int(k) for k in ks]
    if any(k < 1 for k in ks):
        raise ValueError(f"answer recall cut-offs must be >= 1, got {ks}")
    ranks = np.array([math.inf if f is None else f for f in first], dtype=np.float64)  # (n_questions,)
    return {k: (ranks < k).astype(np.float64) for k in ks}


def recall_at_ranks(first: Sequence[int | None], ks: Iterable[int]) -> dict[int, float]:
    """AR@k = share of questions whose first answer rank (0-based, None: no answer) is below
    ``k``; 0.0 for every ``k`` when there is no question (see :func:`recall_per_question`)."""
    return {k: float(v.sum()) / len(v) if len(v) else 0.0 for k, v in recall_per_question(first, ks).items()}


def title_entropy(titles: Sequence[str], base: float = 2.0) -> float:
    """Shannon entropy of the title distribution of ``titles`` (FunnelRAG Table 9).

    Parameters
    ----------
    titles : article titles of the top passages (the evaluation uses the top 4).
    base : logarithm base; 2 gives bits.

    Returns
    -------
    float
        ``−Σ_t p_t log p_t``, 0.0 for an empty list or a single article.
    """
    if not titles:
        return 0.0
    n = len(titles)
    h = -sum((c / n) * math.log(c / n, base) for c in Counter(titles).values())
    return h + 0.0  # -0.0 → 0.0


def exact_match_rate(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> float:
    """Mean SQuAD exact match (FunnelRAG Table 3's EM), in [0, 1].

    Raises
    ------
    ValueError
        Lengths differ.
    """
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answer lists")
    if not predictions:
        return 0.0
    return sum(exact_match(p, a) for p, a in zip(predictions, answers)) / len(predictions)


class TokenCache:
    """DPR tokens of texts keyed by an id (passages recur across settings and questions)."""

    def __init__(self) -> None:
        self._joined: dict[str, str] = {}

    def joined(self, key: str, text: str) -> str:
        """``" t1 t2 … tn "``: DPR tokens joined by single spaces with a space on each side."""
        out = self._joined.get(key)
        if out is None:
            out = self._joined[key] = " " + " ".join(dpr_tokens(text)) + " "
        return out


def _needles(answers: Sequence[str]) -> list[str]:
    """Answer token sequences as ``" a1 a2 "`` strings (answers without tokens are dropped,
    as :class:`AnswerMatcher` does)."""
    return [" " + " ".join(t) + " " for t in AnswerMatcher(answers).answers]


def passage_hits(answers: Sequence[str], items: Sequence[tuple[str, str]], cache: TokenCache) -> list[bool]:
    """DPR ``has_answer`` of each ``(passage_id, text)``: the same decisions as
    :func:`tasks.qa.questions.has_answer`, by substring search over space-joined tokens (DPR
    tokens never contain whitespace, so a token-sequence match is exactly a match of
    ``" a1 … am "`` in ``" t1 … tn "``)."""
    needles = _needles(answers)
    return [any(n in cache.joined(pid, text) for n in needles) for pid, text in items]
