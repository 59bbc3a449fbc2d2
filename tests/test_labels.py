"""Eq. 4 (document score) and Eq. 5 (D+ / D−) on small hand-made tables."""
from __future__ import annotations

import pyarrow as pa
import pytest

from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, LABELS
from tasks.funnel.labels import LabelConfig, document_score, make_labels, split_documents


def test_eq4_alpha_max_plus_mean():
    assert document_score([0.1, 0.5, 0.3], 0.75) == pytest.approx(0.75 * 0.5 + 0.25 * 0.3)
    assert document_score([0.2], 0.75) == pytest.approx(0.2)
    assert document_score([0.1, 0.5], 1.0) == pytest.approx(0.5)
    assert document_score([0.1, 0.5], 0.0) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        document_score([], 0.5)


def test_eq5_answers_union_top_k():
    scores = [0.9, 0.1, 0.5, 0.5, 0.2]
    answers = [False, True, False, False, False]
    positive, rank = split_documents(scores, answers, top_k=2, tie_break=["a", "b", "c", "d", "e"])
    assert rank.tolist() == [0, 4, 1, 2, 3]                  # tie 0.5/0.5 broken by id c < d
    assert positive.tolist() == [True, True, True, False, False]
    positive0, _ = split_documents(scores, answers, top_k=0, tie_break=list("abcde"))
    assert positive0.tolist() == answers


def _tables():
    cand = {"question_id": [], "unit_id": [], "unit_has_answer": [], "passage_id": []}
    att = {"question_id": [], "unit_id": [], "passage_id": [], "score": []}
    spec = {  # question -> unit -> (has_answer, passage scores)
        "q1": {"c0000001.u000": (False, [0.10, 0.40]), "c0000001.u001": (True, [0.05]),
               "c0000002.u000": (False, [0.30, 0.30, 0.30]), "c0000003.u000": (False, [0.01])},
        "q2": {"c0000001.u000": (False, [0.2]), "c0000004.u000": (False, [0.6])},
    }
    for q, units in spec.items():
        for u, (ans, ps) in units.items():
            for j, s in enumerate(ps):
                pid = f"{u}.p{j:03d}"
                cand["question_id"].append(q), cand["unit_id"].append(u)
                cand["unit_has_answer"].append(ans), cand["passage_id"].append(pid)
                att["question_id"].append(q), att["unit_id"].append(u)
                att["passage_id"].append(pid), att["score"].append(s)
    return pa.table(att), pa.table(cand)


def test_make_labels_small_table():
    att, cand = _tables()
    labels = make_labels(att, cand, LabelConfig(alpha=0.75, top_k=1))
    LABELS.validate(labels)
    rows = {(r["question_id"], r["unit_id"]): r for r in labels.to_pylist()}
    # q1: u000 -> .75*.4+.25*.25 = .3625 ; u001 -> .05 ; c2 -> .3 ; c3 -> .01
    assert rows[("q1", "c0000001.u000")]["doc_score"] == pytest.approx(0.3625)
    assert rows[("q1", "c0000001.u000")]["reason"] == "top_k"
    assert rows[("q1", "c0000001.u001")]["reason"] == "answer" and rows[("q1", "c0000001.u001")]["positive"]
    assert rows[("q1", "c0000002.u000")]["positive"] is False and rows[("q1", "c0000002.u000")]["doc_rank"] == 1
    assert [r["doc_rank"] for r in labels.to_pylist() if r["question_id"] == "q1"] == [0, 1, 2, 3]
    assert sum(r["positive"] for r in labels.to_pylist() if r["question_id"] == "q2") == 1
    assert rows[("q2", "c0000004.u000")]["positive"]
    assert labels.num_rows == 6
    again = make_labels(att, cand, LabelConfig(alpha=0.75, top_k=1))
    assert again.equals(labels)


def test_missing_or_stray_scores_are_errors():
    att, cand = _tables()
    with pytest.raises(ValueError, match="no attention score"):
        make_labels(att.slice(0, att.num_rows - 1), cand)
    with pytest.raises(ValueError, match="not in the candidates"):
        make_labels(att, cand.slice(0, cand.num_rows - 1))


def test_contracts_know_the_columns_used():
    for name in ("question_id", "unit_id", "unit_has_answer", "passage_id"):
        assert name in CANDIDATES.schema.names
    for name in ("question_id", "unit_id", "passage_id", "score"):
        assert name in ATTENTION_SCORES.schema.names
