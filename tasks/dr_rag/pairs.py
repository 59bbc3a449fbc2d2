"""Training pairs of the DR-RAG classifier C(q, d1, d2) (paper Appendix A.1), balanced 1:1.

Per question with supporting paragraphs ``d*`` and non-supporting ``dΔ``:

* positives ``C(q, d*_a, d*_b) = 1``: every ordered pair of two different supporting paragraphs;
* negatives ``C(q, d*, dΔ) = 0`` (kind ``sup_non``) and ``C(q, dΔ_a, dΔ_b) = 0`` (``non_non``,
  two different paragraphs): ``n = round(neg_per_pos * n_positives)`` are kept, so the classes
  are 1:1 per question. Each kind's candidates are ranked by ``sha256(seed, question_id, d1, d2)``;
  ``round(sup_non_share * n)`` come from ``sup_non`` and the rest from ``non_non`` (a kind
  that runs short is filled from the other). ``sup_non_share=None`` draws from the union,
  which, with 8 distractors and 2 supporting paragraphs, gives mostly ``non_non``
  (56 of 72). Fewer than ``n`` negatives only when a question has too few (counted).

The sample depends only on ``(seed, question_id, d1, d2)``: deterministic and independent of
the order of questions.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import permutations
from typing import Sequence

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from tasks.dr_rag.collection import Question

KINDS = ("sup_sup", "sup_non", "non_non")


@dataclass(frozen=True)
class PairSamplingConfig:
    """seed : hash seed of the negative sample; neg_per_pos : negatives per positive (1.0 = 1:1);
    sup_non_share : share of the negatives of kind ``sup_non`` (None = uniform over all negatives)."""

    seed: int = 0
    neg_per_pos: float = 1.0
    sup_non_share: float | None = 0.5


@dataclass(frozen=True)
class ClassifierPair:
    """One training example ``(q, d1, d2) -> label`` by id (``kind`` in :data:`KINDS`)."""

    question_id: str
    d1_id: str
    d2_id: str
    kind: str
    label: int


def pair_hash(seed: int, question_id: str, d1: str, d2: str) -> str:
    """sha256 hex of ``"seed|question_id|d1|d2"``: the sampling key of one negative."""
    return hashlib.sha256(f"{seed}|{question_id}|{d1}|{d2}".encode()).hexdigest()


def build_pairs(questions: Sequence[Question], cfg: PairSamplingConfig = PairSamplingConfig()
                ) -> tuple[list[ClassifierPair], dict[str, int]]:
    """Balanced classifier pairs for ``questions`` (Appendix A.1; see module doc).

    Returns
    -------
    pairs : per question (input order) its positives (permutation order) then its sampled
        negatives (hash order).
    report : counts ``questions``, ``questions_without_positive`` (fewer than two supporting
        paragraphs: no pair emitted), ``questions_short_of_negatives``, ``positives``,
        ``negatives``, ``sup_non``, ``non_non``.

    Raises
    ------
    ValueError
        ``neg_per_pos`` is negative or ``sup_non_share`` outside [0, 1].
    """
    if cfg.neg_per_pos < 0:
        raise ValueError(f"neg_per_pos must be >= 0, got {cfg.neg_per_pos}")
    if cfg.sup_non_share is not None and not 0.0 <= cfg.sup_non_share <= 1.0:
        raise ValueError(f"sup_non_share must be in [0, 1] or None, got {cfg.sup_non_share}")
    pairs: list[ClassifierPair] = []
    report = dict.fromkeys(("questions", "questions_without_positive", "questions_short_of_negatives",
                            "positives", "negatives", "sup_non", "non_non"), 0)
    for q in questions:
        report["questions"] += 1
        sup = list(dict.fromkeys(q.supporting))
        non = [p for p in dict.fromkeys(q.candidates) if p not in set(sup)]
        positives = [ClassifierPair(q.question_id, a, b, "sup_sup", 1) for a, b in permutations(sup, 2)]
        if not positives:
            report["questions_without_positive"] += 1
            continue
        want = round(cfg.neg_per_pos * len(positives))
        chosen = _sample_negatives(q.question_id, sup, non, want, cfg)
        if len(chosen) < want:
            report["questions_short_of_negatives"] += 1
        pairs.extend(positives)
        pairs.extend(ClassifierPair(q.question_id, a, b, kind, 0) for a, b, kind in chosen)
        report["positives"] += len(positives)
        report["negatives"] += len(chosen)
        for _, _, kind in chosen:
            report[kind] += 1
    return pairs, report


def _sample_negatives(qid: str, sup: list[str], non: list[str], want: int,
                      cfg: PairSamplingConfig) -> list[tuple[str, str, str]]:
    """``want`` negatives ``(d1, d2, kind)`` of one question, hash-ranked per kind (module doc)."""
    def ranked(items):
        return sorted(items, key=lambda t: pair_hash(cfg.seed, qid, t[0], t[1]))

    sup_non = [(a, b, "sup_non") for a in sup for b in non]
    non_non = [(a, b, "non_non") for a, b in permutations(non, 2)]
    if cfg.sup_non_share is None:
        return ranked(sup_non + non_non)[:want]
    sup_non, non_non = ranked(sup_non), ranked(non_non)
    n_sup = min(len(sup_non), max(round(cfg.sup_non_share * want), want - len(non_non)))
    chosen = sup_non[:n_sup] + non_non[:want - n_sup]
    return ranked(chosen)


def pairs_table(pairs: Sequence[ClassifierPair], split: str) -> pa.Table:
    """Columns of :data:`data_contracts.dr_rag.CLASSIFIER_PAIRS` (``split`` on every row)."""
    return pa.table({"question_id": [p.question_id for p in pairs], "split": [split] * len(pairs),
                     "d1_id": [p.d1_id for p in pairs],
                     "d2_id": [p.d2_id for p in pairs], "kind": [p.kind for p in pairs],
                     "label": pa.array([p.label for p in pairs], pa.int8())})


def pairs_from_table(table: pa.Table, split: str | None = None) -> list[ClassifierPair]:
    """Pairs of a :data:`CLASSIFIER_PAIRS` table (only rows of ``split`` when given), in row order."""
    if split is not None:
        table = table.filter(pa.compute.equal(table.column("split"), split))
    cols = {c: table.column(c).to_pylist() for c in ("question_id", "d1_id", "d2_id", "kind", "label")}
    return [ClassifierPair(*row) for row in zip(cols["question_id"], cols["d1_id"], cols["d2_id"], cols["kind"], cols["label"])]
