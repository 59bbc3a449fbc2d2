"""DR-RAG evaluation in the shape of the paper's Table 5: recall of supporting paragraphs and the
actual number of documents kept, per method (BM25, SM, QDC, CIS, CFS) and top-k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import pyarrow as pa

from tasks.dr_rag.collection import ParagraphCollection, Question
from tasks.dr_rag.retrieval import Retriever, concat_query
from tasks.dr_rag.selection import (Selected, cfs_first_pairs, cfs_select, cis_pairs, cis_select, first_stage,
                                    qdc_select, split_budget)

METHODS = ("bm25", "sm", "qdc", "cis", "cfs")


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings.

    top_ks : the budgets ``k`` of Table 5.
    k1 : first-stage documents for every ``k``; ``None`` = ``ceil(k / 2)`` (then ``k2 = k - k1``).
    base : first-stage retriever of QDC, CIS and CFS (``"sm"`` as in the paper, or ``"bm25"``).
    threshold : classifier decision threshold, ``C = 1`` iff ``P >= threshold`` (CFS and CIS).
    max_candidates : CFS: not-yet-selected candidates judged per pick of one ``d*``.
    """

    top_ks: tuple[int, ...] = (3, 4, 6)
    k1: int | None = None
    base: str = "sm"
    threshold: float = 0.5
    max_candidates: int = 5

    def __post_init__(self) -> None:
        if not self.top_ks:
            raise ValueError("top_ks is empty")
        for k in self.top_ks:
            split_budget(k, self.k1)
        if self.base not in ("sm", "bm25"):
            raise ValueError(f"base must be 'sm' or 'bm25', got {self.base!r}")
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {self.max_candidates}")

    def second_depth(self) -> int:
        """Depth of each ``q ⊕ d*`` ranking: enough for QDC and CFS at every ``k``."""
        return max(k + self.max_candidates * split_budget(k, self.k1)[1] for k in self.top_ks)

    def max_k1(self) -> int:
        return max(split_budget(k, self.k1)[0] for k in self.top_ks)


@dataclass(frozen=True)
class Rankings:
    """first : ``{retriever: {question_id: ids}}`` (depth ``max(top_ks)``);
    second : ``{question_id: {d*: ids of q ⊕ d*}}`` with the ``base`` retriever."""

    first: dict[str, dict[str, list[str]]]
    second: dict[str, dict[str, list[str]]]
    base: str = "sm"


def compute_rankings(questions: Sequence[Question], collection: ParagraphCollection,
                     retrievers: Mapping[str, Retriever], cfg: EvalConfig) -> Rankings:
    """Run every retriever on the questions, then the base retriever on ``q ⊕ d*`` (QDC, Eq. 1)
    for the first ``max_k1`` documents ``d*`` of each question.

    Raises
    ------
    KeyError
        ``retrievers`` lacks ``"bm25"``, ``"sm"`` or the base.
    """
    top = max(cfg.top_ks)
    texts = [q.question for q in questions]
    first = {name: dict(zip((q.question_id for q in questions), retrievers[name].search(texts, top)))
             for name in ("bm25", "sm")}
    row = collection.row()
    jobs: list[tuple[str, str]] = []  # (question_id, d*)
    queries: list[str] = []
    for q in questions:
        for parent in first_stage(first[cfg.base][q.question_id], cfg.max_k1()):
            i = row[parent]
            jobs.append((q.question_id, parent))
            queries.append(concat_query(q.question, collection.titles[i], collection.texts[i]))
    ranked = retrievers[cfg.base].search(queries, cfg.second_depth()) if queries else []
    second: dict[str, dict[str, list[str]]] = {q.question_id: {} for q in questions}
    for (qid, parent), ids in zip(jobs, ranked):
        second[qid][parent] = ids
    return Rankings(first, second, cfg.base)


def select_all(questions: Sequence[Question], rankings: Rankings,
               probs_for: Callable[[Question], Mapping[tuple[str, str], float]] | None,
               cfg: EvalConfig) -> dict[tuple[str, int], dict[str, list[Selected]]]:
    """Kept documents per ``(method, k)`` and question.

    ``probs_for(question)`` gives the classifier probabilities of that question (a
    :class:`tasks.dr_rag.classifier.PairProbs`; it may have a ``prefetch(pairs)`` method, used to
    batch CIS's pairs). With ``probs_for=None`` only BM25, SM and QDC are computed.
    """
    if rankings.base != cfg.base:
        raise ValueError(f"rankings were made with base {rankings.base!r}, config asks for {cfg.base!r}")
    out: dict[tuple[str, int], dict[str, list[Selected]]] = {}
    for q in questions:
        qid = q.question_id
        first_base, second = rankings.first[cfg.base][qid], rankings.second[qid]
        probs = probs_for(q) if probs_for is not None else None
        for k in cfg.top_ks:
            for name in ("bm25", "sm"):
                out.setdefault((name, k), {})[qid] = [Selected(p, 1) for p in first_stage(rankings.first[name][qid], k)]
            qdc = qdc_select(first_base, second, k, cfg.k1)
            out.setdefault(("qdc", k), {})[qid] = qdc
            if probs is None:
                continue
            if hasattr(probs, "prefetch"):  # batch the pairs CIS needs and CFS's first picks
                probs.prefetch(cis_pairs(qdc) + cfs_first_pairs(first_base, second, k, cfg.k1, min(2, cfg.max_candidates)))
            out.setdefault(("cis", k), {})[qid] = cis_select(qdc, probs, cfg.threshold)
            out.setdefault(("cfs", k), {})[qid] = cfs_select(first_base, second, probs, k, cfg.threshold,
                                                             cfg.k1, cfg.max_candidates)
    return out


def table5(selections: Mapping[tuple[str, int], Mapping[str, list[Selected]]],
           questions: Sequence[Question]) -> list[dict]:
    """Rows ``{method, k, recall, all_supporting, mean_docs, n_questions}`` in METHODS × k order.

    recall : mean over questions of |kept ∩ supporting| / |supporting| (questions without a
        supporting paragraph are left out and not counted in ``n_questions``).
    all_supporting : share of those questions with every supporting paragraph kept.
    mean_docs : mean number of documents kept (the "actual number of documents").
    """
    gold = {q.question_id: set(q.supporting) for q in questions if q.supporting}
    rows = []
    order = {m: i for i, m in enumerate(METHODS)}
    for (method, k) in sorted(selections, key=lambda mk: (order.get(mk[0], len(order)), mk[0], mk[1])):
        per_q = selections[(method, k)]
        qids = [qid for qid in per_q if qid in gold]
        if not qids:
            continue
        hits = [len(gold[qid] & {d.paragraph_id for d in per_q[qid]}) for qid in qids]
        rows.append({"method": method, "k": k,
                     "recall": sum(h / len(gold[qid]) for h, qid in zip(hits, qids)) / len(qids),
                     "all_supporting": sum(h == len(gold[qid]) for h, qid in zip(hits, qids)) / len(qids),
                     "mean_docs": sum(len(per_q[qid]) for qid in qids) / len(qids),
                     "n_questions": len(qids)})
    return rows


def table5_wide(rows: Sequence[dict]) -> list[dict]:
    """The paper's layout: one row per method, ``R@k`` and ``docs@k`` columns per ``k``."""
    wide: dict[str, dict] = {}
    for r in rows:
        w = wide.setdefault(r["method"], {"method": r["method"].upper()})
        w[f"R@{r['k']}"] = round(r["recall"], 4)
        w[f"docs@{r['k']}"] = round(r["mean_docs"], 2)
    return list(wide.values())


def selections_table(selections: Mapping[tuple[str, int], Mapping[str, list[Selected]]],
                     questions: Sequence[Question]) -> pa.Table:
    """Long table for :data:`data_contracts.dr_rag.SELECTIONS`, sorted by (question, method, k, rank)."""
    gold = {q.question_id: set(q.supporting) for q in questions}
    cols: dict[str, list] = {c: [] for c in ("question_id", "method", "k", "rank", "paragraph_id", "stage",
                                             "parent_id", "classifier_prob", "is_supporting")}
    for (method, k) in sorted(selections):
        for qid in sorted(selections[(method, k)]):
            for rank, d in enumerate(selections[(method, k)][qid], start=1):
                for c, v in zip(cols, (qid, method, k, rank, d.paragraph_id, d.stage, d.parent_id, d.prob,
                                       d.paragraph_id in gold.get(qid, ()))):
                    cols[c].append(v)
    table = pa.table({**cols, "k": pa.array(cols["k"], pa.int16()), "rank": pa.array(cols["rank"], pa.int16()),
                      "stage": pa.array(cols["stage"], pa.int8()),
                      "classifier_prob": pa.array(cols["classifier_prob"], pa.float32())})
    return table.sort_by([("question_id", "ascending"), ("method", "ascending"), ("k", "ascending"),
                          ("rank", "ascending")])


def rankings_table(rankings: Rankings) -> pa.Table:
    """Long table for :data:`data_contracts.dr_rag.RANKINGS` (first-stage rows have no parent)."""
    rows: list[tuple] = []
    for name in sorted(rankings.first):
        for qid in sorted(rankings.first[name]):
            rows += [(qid, name, None, r, pid) for r, pid in enumerate(rankings.first[name][qid], 1)]
    base = rankings.base
    for qid in sorted(rankings.second):
        for parent in sorted(rankings.second[qid]):
            rows += [(qid, base, parent, r, pid) for r, pid in enumerate(rankings.second[qid][parent], 1)]
    cols = list(zip(*rows)) if rows else [[]] * 5
    return pa.table({"question_id": pa.array(cols[0], pa.string()), "retriever": pa.array(cols[1], pa.string()),
                     "parent_id": pa.array(cols[2], pa.string()), "rank": pa.array(cols[3], pa.int16()),
                     "paragraph_id": pa.array(cols[4], pa.string())})


def rankings_from_table(table: pa.Table, base: str) -> Rankings:
    """Inverse of :func:`rankings_table` (``base``: the retriever of the ``q ⊕ d*`` rows)."""
    first: dict[str, dict[str, list[str]]] = {}
    second: dict[str, dict[str, list[str]]] = {}
    cols = {c: table.column(c).to_pylist() for c in ("question_id", "retriever", "parent_id", "rank", "paragraph_id")}
    order = sorted(range(table.num_rows), key=lambda i: cols["rank"][i])
    for i in order:
        qid, parent, pid = cols["question_id"][i], cols["parent_id"][i], cols["paragraph_id"][i]
        if parent is None:
            first.setdefault(cols["retriever"][i], {}).setdefault(qid, []).append(pid)
        else:
            second.setdefault(qid, {}).setdefault(parent, []).append(pid)
    for qid in first.get(base, {}):
        second.setdefault(qid, {})
    return Rankings(first, second, base)
