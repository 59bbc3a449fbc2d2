"""The one answer recall (tasks.qa.metrics) and the pipelines that read it: the evaluation's
ranked hit lists, the funnel's unit pool and the experiment's per-question arrays agree, in the
edge cases where the former copies differed too."""
from __future__ import annotations

import pyarrow as pa
import pytest

from data_contracts.funnel import UNIT_POOL
from tasks.funnel.candidates import answer_recall as pool_answer_recall
from tasks.funnel.experiment_eval import per_question_unit_recall
from tasks.qa.metrics import answer_recall, first_hit_ranks, recall_at_ranks, recall_per_question


def _pool(rows):
    n = len(rows)
    return UNIT_POOL.validate(pa.table({
        "question_id": [q for q, _, _ in rows], "cluster_id": [1] * n, "cluster_rank": [0] * n,
        "bm25_score": [1.0] * n, "unit_id": [f"c0000001.u{r:03d}" for _, r, _ in rows],
        "prerank_score": [-float(r) for _, r, _ in rows], "prerank_rank": [r for _, r, _ in rows],
        "has_answer": [h for _, _, h in rows]}).cast(UNIT_POOL.schema))


# q1: answer at rank 1; q2: at rank 0 (rows out of order, two hits); q3: none; q4: no rows.
ROWS = [("q1", 0, False), ("q2", 2, True), ("q1", 1, True), ("q2", 0, True), ("q3", 0, False), ("q3", 1, False)]
HITS = [[False, True], [True, False, True], [False, False], []]
QS = ["q1", "q2", "q3", "q4"]


def test_three_readings_give_the_same_numbers():
    ks = [1, 2, 3]
    expected = {1: 0.25, 2: 0.5, 3: 0.5}
    assert answer_recall(HITS, ks) == expected
    assert pool_answer_recall(_pool(ROWS), ks, QS) == expected
    per_q = per_question_unit_recall(_pool(ROWS), ks, QS)
    assert {k: float(v.mean()) for k, v in per_q.items()} == expected
    assert per_q[1].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_first_hit_ranks_keeps_every_question_with_rows():
    assert first_hit_ranks(*zip(*[(q, r, h) for q, r, h in ROWS])) == {"q1": 1, "q2": 0, "q3": None}
    # the pool's default question set is the questions with rows (q4 is unknown to it)
    assert pool_answer_recall(_pool(ROWS), [2]) == {2: pytest.approx(2 / 3)}


def test_no_question_is_zero_and_a_cutoff_below_one_is_refused():
    assert answer_recall([], [1, 4]) == {1: 0.0, 4: 0.0}
    assert recall_at_ranks([], [5]) == {5: 0.0}
    assert pool_answer_recall(_pool(ROWS), [1], questions=[]) == {1: 0.0}
    # the funnel's and the experiment's former copies returned 0.0 for k = 0; all refuse it now
    for call in (lambda: answer_recall(HITS, [0]), lambda: pool_answer_recall(_pool(ROWS), [0]),
                 lambda: per_question_unit_recall(_pool(ROWS), [0], QS), lambda: recall_per_question([0], [-1])):
        with pytest.raises(ValueError, match="cut-offs must be >= 1"):
            call()
