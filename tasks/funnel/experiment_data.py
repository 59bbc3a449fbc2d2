"""Stage-directory helpers of the distillation experiment (:mod:`flows.experiment`):
question subsets of a candidates stage, answerable questions, and the flat-BM25 reader input."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.funnel import CANDIDATES, QUESTIONS, UNIT_POOL, UNITS
from tasks.qa.questions import AnswerMatcher


def subset(stage_dir: Path, question_ids: set[str], out_dir: Path) -> dict[str, Any]:
    """Copy a candidates stage directory restricted to ``question_ids`` (all four tables)."""
    n = 0
    for contract in (UNIT_POOL, CANDIDATES, QUESTIONS):
        t = contract.read(stage_dir)
        t = t.filter(pc.is_in(t["question_id"], pa.array(sorted(question_ids), pa.string())))
        contract.write(t, out_dir)
        n = t.num_rows if contract is QUESTIONS else n
    UNITS.write(UNITS.read(stage_dir), out_dir)
    return {"questions": n}


def answerable(stage_dir: Path, n_passages: int | None) -> set[str]:
    """Question ids with an answer-bearing passage among their first ``n_passages`` candidate
    passages in pre-ranker order (``None`` = any candidate passage, i.e. the top-N units)."""
    c = CANDIDATES.read(stage_dir)
    rows = sorted(zip(c["question_id"].to_pylist(), c["unit_rank"].to_pylist(),
                      c["passage_position"].to_pylist(), c["has_answer"].to_pylist()))
    seen: dict[str, int] = {}
    hit: set[str] = set()
    for q, _, _, has in rows:
        i = seen[q] = seen.get(q, -1) + 1
        if has and (n_passages is None or i < n_passages):
            hit.add(q)
    return hit


def bm25_passage_candidates(corpus, questions: pa.Table, n_passages: int, search_k: int) -> pa.Table:
    """Reader training input from flat BM25: per question with an answer passage among its BM25
    top-``search_k`` corpus passages, the best-ranked answer passage and the ``n_passages - 1``
    best-ranked other passages, in BM25 order, as a ``candidates`` table (each passage its own
    slot: ``unit_rank`` = rank among the kept, ``passage_position`` = 0, ``bm25_score`` =
    ``prerank_score`` = its BM25 score). Questions without an answer passage are left out.

    Flat BM25 costs ~0.03 s per question; the funnel's pre-ranking of ~1K-token units costs
    seconds per question, which 2 shared CPU cores cannot spend on thousands of questions.
    """
    passages = corpus.passages
    row_of = {p: i for i, p in enumerate(passages["passage_id"].to_pylist())}
    ids, scores = corpus.passage_index().search(questions["question"].to_pylist(), search_k)
    rows = []
    for qid, answers, pids, ss in zip(questions["question_id"].to_pylist(), questions["answers"].to_pylist(), ids, scores):
        match = AnswerMatcher(answers)
        hits = [match(passages["text"][row_of[str(p)]].as_py()) for p in pids]
        if not any(hits):
            continue
        first = hits.index(True)
        keep = sorted([first] + [i for i in range(len(pids)) if i != first][: n_passages - 1])
        for rank, i in enumerate(keep):
            r = row_of[str(pids[i])]
            rows.append({"question_id": qid, "cluster_id": passages["cluster_id"][r].as_py(),
                         "bm25_score": float(ss[i]), "unit_id": passages["unit_id"][r].as_py(), "unit_rank": rank,
                         "prerank_score": float(ss[i]), "unit_has_answer": hits[i], "passage_id": str(pids[i]),
                         "passage_position": 0, "title": passages["title"][r].as_py(),
                         "text": passages["text"][r].as_py(), "has_answer": hits[i]})
    return CANDIDATES.validate(pa.Table.from_pylist(rows, schema=CANDIDATES.schema))


def first_questions(stage_dir: Path, n: int) -> set[str]:
    """The first ``n`` question ids (id order) of a candidates stage directory."""
    return set(sorted(QUESTIONS.read(stage_dir)["question_id"].to_pylist())[:n])
