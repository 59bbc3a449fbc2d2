"""Evaluation metrics against hand-computed cases: AR@k, EM, title entropy, answerability."""
from __future__ import annotations

import gzip
import json
import math

import pytest

from funnelrag.datasets import resolve
from tasks.evaluate.report import SettingSpec, StageSummary, summarize
from tasks.evaluate.retrieval import QueryResult
from tasks.evaluate.timing import StageOutcome, compact_count, funnel_label
from tasks.qa.metrics import (
    TokenCache,
    answer_recall,
    exact_match_rate,
    first_hit,
    passage_hits,
    title_entropy,
)
from tasks.qa.questions import has_answer


def test_answer_recall_hand_computed():
    hits = [[False, True, False, False],   # first hit at rank 1
            [True, False, False, False],   # rank 0
            [False, False, False, False],  # none
            [False, False, False, True]]   # rank 3
    assert answer_recall(hits, [1, 2, 3, 4]) == {1: 0.25, 2: 0.5, 3: 0.5, 4: 0.75}
    assert answer_recall([[False, True]], [4]) == {4: 1.0}   # a short list counts what it has
    assert answer_recall([], [1, 4]) == {1: 0.0, 4: 0.0}
    assert first_hit([False, False, True]) == 2 and first_hit([False]) is None
    with pytest.raises(ValueError, match=">= 1"):
        answer_recall(hits, [0])


def test_exact_match_uses_squad_normalisation():
    preds = ["The Eiffel Tower!", "paris", "1889", ""]
    golds = [["Eiffel Tower"], ["Paris, France"], ["in 1889", "1889"], ["x"]]
    assert exact_match_rate(preds, golds) == pytest.approx(2 / 4)
    assert exact_match_rate([], []) == 0.0
    with pytest.raises(ValueError):
        exact_match_rate(["a"], [])


def test_title_entropy_hand_computed():
    assert title_entropy(["A", "A", "A", "A"]) == 0.0
    assert title_entropy(["A", "B", "C", "D"]) == pytest.approx(2.0)          # log2(4)
    assert title_entropy(["A", "A", "B", "B"]) == pytest.approx(1.0)
    # {A: 2/4, B: 1/4, C: 1/4}: -(.5 log2 .5 + 2 * .25 log2 .25) = 0.5 + 1.0
    assert title_entropy(["A", "B", "A", "C"]) == pytest.approx(1.5)
    assert title_entropy(["A", "B"], base=math.e) == pytest.approx(math.log(2))
    assert title_entropy([]) == 0.0


def test_substring_matching_equals_dpr_has_answer_on_real_passages(data_mirror):
    path = resolve("nq-open-oracle", data_mirror)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(60), fh)]
    passages = [(f"p{i}", r["ctxs"][0]["text"]) for i, r in enumerate(records)]
    cache = TokenCache()
    n_hits = 0
    for r in records:
        expected = [has_answer(r["answers"], t) for _, t in passages]
        assert passage_hits(r["answers"], passages, cache) == expected
        n_hits += sum(expected)
    assert n_hits >= 50  # gold passages hold their answers: the comparison is not vacuous


def test_funnel_label_and_counts():
    assert compact_count(4598) == "4.6K" and compact_count(21_015_324) == "21M" and compact_count(80) == "80"
    prog = [StageOutcome("retrieval", "c", 3925, 80, 0.1, True), StageOutcome("chunking", "d", 80, 500, 0.2, True),
            StageOutcome("preranking", "d", 500, 8, 1.0, True), StageOutcome("postranking", "p", 60, 4, 0.5, True)]
    assert funnel_label(prog, 4) == "3.9Kc→80c→8d→4p"
    assert funnel_label(prog[:3], 4) == "3.9Kc→80c→8d→4p"                  # without post-ranking: a top-4 cut
    flat = [StageOutcome("retrieval", "p", 146402, 400, 0.01, True)]
    assert funnel_label(flat, 4) == "146Kp→400p→4p"


def test_summarize_hand_computed():
    def res(qid, titles, hits, seconds, stage_hit):
        stages = [StageOutcome("retrieval", "p", 100, 10, seconds, stage_hit),
                  StageOutcome("reranking", "p", 10, len(hits), 2 * seconds, any(hits))]
        return QueryResult(qid, [(f"{qid}.{i}", t, "text") for i, t in enumerate(titles)], hits, stages)

    results = [res("q1", ["A", "A", "B", "C"], [False, True, False, False], 1.0, True),
               res("q2", ["A", "A", "A", "A"], [False, False, False, False], 3.0, True),
               res("q3", ["A", "B", "C", "D"], [True, False, False, False], 2.0, False)]
    in_corpus = {"q1": True, "q2": False, "q3": True}
    spec = SettingSpec("flat-x", "flat", "bm25", "minilm", "", 4)
    from tasks.evaluate.report import Generated

    gen = Generated("fid", {"q1": "Paris", "q2": "no", "q3": "x"}, {"q1": 0.5, "q2": 0.5, "q3": 1.0})
    rows, stages, per_q = summarize(spec, results, in_corpus, {"q1": ["paris"], "q2": ["yes"], "q3": ["y"]}, gen)
    all_row, sub_row = rows
    assert all_row["subset"] == "all" and all_row["n_questions"] == 3
    assert (all_row["ar_1"], all_row["ar_2"], all_row["ar_4"]) == pytest.approx((1 / 3, 2 / 3, 2 / 3))
    assert all_row["ar_candidates"] == pytest.approx(2 / 3)       # retrieval stage (the re-ranker's input)
    assert all_row["entropy_top4"] == pytest.approx((1.5 + 0.0 + 2.0) / 3)
    assert all_row["em"] == pytest.approx(1 / 3)
    assert all_row["seconds_per_query"] == pytest.approx((3 + 9 + 6) / 3)
    assert all_row["funnel"] == "100p→10p→4p"
    assert sub_row["subset"] == "answer_in_corpus" and sub_row["n_questions"] == 2
    assert (sub_row["ar_1"], sub_row["ar_2"]) == pytest.approx((0.5, 1.0))
    assert stages[0]["answer_recall"] == pytest.approx(2 / 3) and stages[1]["seconds_per_query"] == pytest.approx(4.0)
    assert [r["em"] for r in per_q] == [True, False, False]
    assert isinstance(StageSummary("r", "p", 1, 1, 0.0, 0.5).answer_recall, float)


def test_per_question_scores_average_to_the_table_and_the_markdown_carries_intervals():
    """The per-question values logged for paired comparisons are the table's figures question by
    question; the markdown table shows each AR@k and EM with its 95% bootstrap interval."""
    from funnelrag.paired import mean_interval
    from tasks.evaluate.report import Generated, question_scores, tables, to_markdown

    def res(qid, hits):
        stages = [StageOutcome("retrieval", "p", 100, len(hits), 0.5, any(hits))]
        return QueryResult(qid, [(f"{qid}.{i}", f"T{i}", "text") for i in range(len(hits))], hits, stages)

    results = [res(f"q{i:02d}", [i % 3 == 0, i % 4 == 0, False, i % 5 == 0]) for i in range(40)]
    in_corpus = {r.question_id: i % 2 == 0 for i, r in enumerate(results)}
    gen = Generated("fid", {r.question_id: "a" if i % 4 else "b" for i, r in enumerate(results)},
                    {r.question_id: 0.1 for r in results})
    rows, stage_rows, q_rows = summarize(SettingSpec("flat-x", "flat", "bm25"), results, in_corpus,
                                         {r.question_id: ["b"] for r in results}, gen)
    results_t, stages_t, per_q = tables(rows, stage_rows, q_rows)
    scores = question_scores(per_q)
    for row in rows:
        key = "flat-x." + ("all" if row["subset"] == "all" else "in_corpus")
        assert len(scores[f"{key}.ar_4"]) == row["n_questions"]
        for m in ("ar_1", "ar_2", "ar_4", "em", "entropy_top4"):
            values = list(scores[f"{key}.{m}"].values())
            assert sum(values) / len(values) == pytest.approx(row[m]), (key, m)
    md = to_markdown(results_t, stages_t, "t", per_q)
    m, lo, hi = mean_interval(list(scores["flat-x.all.ar_4"].values()))
    assert f"{100 * m:.2f} [{100 * lo:.2f}, {100 * hi:.2f}]" in md and lo < m < hi
    m, lo, hi = mean_interval(list(scores["flat-x.in_corpus.em"].values()))
    assert f"{100 * m:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] |" in md
    assert "95% percentile-bootstrap interval" in md and "[" not in to_markdown(results_t, stages_t, "t")
