"""Held-out measures of the distillation experiment: per-question recall, Eq. 3 passage order, bootstrap."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from data_contracts.funnel import CANDIDATES, UNIT_POOL
from funnelrag.paired import bootstrap_indices, interval
from tasks.funnel.experiment_eval import per_question_passage_recall, per_question_unit_recall, recall_table


def _pool(rows):
    cols = {"question_id": [], "cluster_id": [], "cluster_rank": [], "bm25_score": [], "unit_id": [],
            "prerank_score": [], "prerank_rank": [], "has_answer": []}
    for q, rank, hit in rows:
        for k, v in (("question_id", q), ("cluster_id", 1), ("cluster_rank", 0), ("bm25_score", 1.0),
                     ("unit_id", f"c0000001.u{rank:03d}"), ("prerank_score", -float(rank)), ("prerank_rank", rank),
                     ("has_answer", hit)):
            cols[k].append(v)
    return UNIT_POOL.validate(pa.table(cols).cast(UNIT_POOL.schema))


def test_unit_recall_per_question_matches_answer_recall():
    from tasks.funnel.candidates import answer_recall

    pool = _pool([("q1", 0, False), ("q1", 1, True), ("q2", 0, True), ("q3", 0, False), ("q3", 1, False)])
    per_q = per_question_unit_recall(pool, [1, 2], ["q1", "q2", "q3", "q4"])
    assert per_q[1].tolist() == [0, 1, 0, 0] and per_q[2].tolist() == [1, 1, 0, 0]
    ref = answer_recall(pool, [1, 2], ["q1", "q2", "q3", "q4"])
    assert {k: v.mean() for k, v in per_q.items()} == pytest.approx(ref)


def _cands(spec):
    rows = []
    for q, passages in spec.items():
        for rank, pos, hit in passages:
            pid = f"c0000001.u{rank:03d}.p{pos:03d}"
            rows.append({"question_id": q, "cluster_id": 1, "bm25_score": 1.0, "unit_id": f"c0000001.u{rank:03d}",
                         "unit_rank": rank, "prerank_score": 0.0, "unit_has_answer": hit, "passage_id": pid,
                         "passage_position": pos, "title": "t", "text": "x", "has_answer": hit})
    return CANDIDATES.validate(pa.Table.from_pylist(rows, schema=CANDIDATES.schema))


def test_passage_recall_in_preranker_order_and_in_eq3_order():
    cands = _cands({"q1": [(0, 0, False), (0, 1, False), (1, 0, True)], "q2": [(0, 0, True), (0, 1, False)]})
    pre = per_question_passage_recall(cands, [1, 2, 3], ["q1", "q2"])
    assert pre[1].tolist() == [0, 1] and pre[2].tolist() == [0, 1] and pre[3].tolist() == [1, 1]
    scores = {("q1", "c0000001.u001.p000"): 0.9, ("q1", "c0000001.u000.p000"): 0.2, ("q1", "c0000001.u000.p001"): 0.2,
              ("q2", "c0000001.u000.p000"): 0.1, ("q2", "c0000001.u000.p001"): 0.5}
    post = per_question_passage_recall(cands, [1, 2], ["q1", "q2"], scores)
    assert post[1].tolist() == [1, 0] and post[2].tolist() == [1, 1]
    with pytest.raises(KeyError, match="q2"):
        per_question_passage_recall(cands, [1], ["q1", "q2"], {k: v for k, v in scores.items() if k[0] == "q1"})


def test_bootstrap_interval_contains_the_mean_and_paired_difference_of_equal_rows_is_zero():
    values = np.array([1.0] * 30 + [0.0] * 70)
    idx = bootstrap_indices(len(values), 500, seed=0)
    assert idx.shape == (500, 100) and np.array_equal(idx, bootstrap_indices(100, 500, seed=0))
    mean, lo, hi = interval(values, idx)
    assert mean == pytest.approx(0.3) and lo < 0.3 < hi and hi - lo == pytest.approx(0.18, abs=0.05)
    text, figures = recall_table("t", {"a": {1: values}, "b": {1: values}}, idx, baseline="a")
    assert figures["b"]["diff@1"] == (0.0, 0.0, 0.0) and "minus a" in text


def test_answerable_counts_answer_passages_within_the_reader_input(tmp_path):
    from tasks.funnel.experiment_data import answerable

    rows = []
    for q, hits in (("q1", [False, False, True]), ("q2", [True, False, False]), ("q3", [False, False, False])):
        for pos, hit in enumerate(hits):
            rows.append({"question_id": q, "cluster_id": 1, "bm25_score": 1.0, "unit_id": "c0000001.u000",
                         "unit_rank": 0, "prerank_score": 0.0, "unit_has_answer": any(hits),
                         "passage_id": f"c0000001.u000.p{pos:03d}", "passage_position": pos, "title": "t",
                         "text": "x", "has_answer": hit})
    CANDIDATES.write(pa.Table.from_pylist(rows, schema=CANDIDATES.schema), tmp_path)
    assert answerable(tmp_path, None) == {"q1", "q2"}
    assert answerable(tmp_path, 2) == {"q2"}
