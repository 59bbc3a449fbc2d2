"""The funnel (BM25 clusters → later chunking → pre-ranking → passages) on real NQ gold passages."""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from oracle_corpus import oracle_clusters

from data_contracts.funnel import CANDIDATES, UNIT_POOL, UNITS
from models.preranker import PreRankerConfig, build_preranker
from tasks.corpus.segment import SegmentConfig, segment_cluster
from tasks.corpus.tokenize import WhitespaceCounter
from tasks.funnel.candidates import CandidatesConfig, answer_recall, build_candidates, chunk_clusters, rerank_pool
from tasks.qa.questions import QuestionsConfig, has_answer, load_questions

N_RECORDS = 36
SEG = SegmentConfig(passage_words=30, unit_max_tokens=70, tokenizer="whitespace")
pytestmark = pytest.mark.slow  # the real MiniLM pre-ranker over 36 real questions (module fixture)


@pytest.fixture(scope="module")
def mini(data_mirror):
    """A real mini corpus: the oracle file's gold Wikipedia passages, 3 per cluster."""
    path, clusters, index = oracle_clusters(data_mirror, N_RECORDS)
    questions, _ = load_questions([path], QuestionsConfig(limit=N_RECORDS))
    model, tok = build_preranker(PreRankerConfig(kind="bi", max_length=128))
    members_of = lambda ids: {c: clusters[c] for c in ids}  # noqa: E731
    cfg = CandidatesConfig(n_clusters=3, n_units=2, batch_size=16)
    cs = build_candidates(questions, index, members_of, SEG, WhitespaceCounter(), model, tok, cfg)
    return {"questions": questions, "clusters": clusters, "index": index, "members_of": members_of,
            "model": model, "tok": tok, "cfg": cfg, "cs": cs}


def test_tables_satisfy_contracts_and_timings(mini):
    cs = mini["cs"]
    UNIT_POOL.validate(cs.unit_pool), CANDIDATES.validate(cs.candidates), UNITS.validate(cs.units)
    assert set(cs.timings) == {"retrieval", "chunking", "answer_matching", "preranking"}
    assert all(v >= 0 for v in cs.timings.values())


def test_pool_holds_every_unit_of_the_top_k_clusters(mini):
    cs, q = mini["cs"], mini["questions"]
    ids, _ = mini["index"].search(q["question"].to_pylist()[:5], 3)
    pool = cs.unit_pool.to_pylist()
    for qid, row in zip(q["question_id"].to_pylist()[:5], ids):
        mine = [r for r in pool if r["question_id"] == qid]
        segs = [segment_cluster(int(c), mini["clusters"][int(c)], SEG, WhitespaceCounter()) for c in row]
        expected = {u.unit_id for seg in segs for u in seg.units}
        assert {r["unit_id"] for r in mine} == expected
        assert sorted(r["prerank_rank"] for r in mine) == list(range(len(mine)))
        by_rank = sorted(mine, key=lambda r: r["prerank_rank"])
        assert all(a["prerank_score"] >= b["prerank_score"] for a, b in zip(by_rank, by_rank[1:]))
        assert {r["cluster_id"]: r["cluster_rank"] for r in mine} == {int(c): k for k, c in enumerate(row)}


def test_candidates_are_passages_of_the_top_n_units(mini):
    cs, q = mini["cs"], mini["questions"]
    answers = dict(zip(q["question_id"].to_pylist(), q["answers"].to_pylist()))
    units = {r["unit_id"]: r for r in cs.units.to_pylist()}
    cands = cs.candidates.to_pylist()
    top = {(r["question_id"], r["unit_id"]) for r in cs.unit_pool.to_pylist() if r["prerank_rank"] < 2}
    assert {(r["question_id"], r["unit_id"]) for r in cands} == top
    for r in cands:
        # a passage's id names its article and window, not its unit: it belongs to the unit by its text
        assert re.fullmatch(r"[0-9a-f]{16}\.p\d{3}", r["passage_id"]) and r["text"] in units[r["unit_id"]]["text"]
        assert r["has_answer"] == has_answer(answers[r["question_id"]], r["text"])
    by_unit = {}
    for r in cands:
        by_unit.setdefault((r["question_id"], r["unit_id"]), []).append(r["passage_position"])
    assert all(v == list(range(len(v))) for v in by_unit.values())


def test_unit_has_answer_and_answer_recall(mini):
    cs, q = mini["cs"], mini["questions"]
    answers = dict(zip(q["question_id"].to_pylist(), q["answers"].to_pylist()))
    text = dict(zip(cs.units["unit_id"].to_pylist(), cs.units["text"].to_pylist()))
    pool = cs.unit_pool.to_pylist()
    assert all(r["has_answer"] == has_answer(answers[r["question_id"]], text[r["unit_id"]]) for r in pool)
    ar = answer_recall(cs.unit_pool, [1, 2, 4, 100])
    hits1 = {r["question_id"] for r in pool if r["prerank_rank"] == 0 and r["has_answer"]}
    assert ar[1] == pytest.approx(len(hits1) / q.num_rows)
    assert ar[1] <= ar[2] <= ar[4] <= ar[100]
    assert ar[100] > 0.5  # gold passages are in the mini corpus: BM25 finds most of them
    assert answer_recall(cs.unit_pool, [1], questions=["missing-question"]) == {1: 0.0}


def test_rerank_with_same_model_reproduces_ranks(mini):
    cs = mini["cs"]
    first = sorted(set(cs.unit_pool["question_id"].to_pylist()))[:6]
    pool = cs.unit_pool.filter(pc.is_in(cs.unit_pool["question_id"], pa.array(first)))
    again = rerank_pool(pool, cs.units, mini["questions"], mini["model"], mini["tok"], batch_size=7)
    a = {(r["question_id"], r["unit_id"]): r for r in pool.to_pylist()}
    for r in again.to_pylist():
        ref = a[(r["question_id"], r["unit_id"])]
        assert r["prerank_score"] == pytest.approx(ref["prerank_score"], abs=1e-5)
    np.testing.assert_array_equal(np.array(again["prerank_rank"]), np.array(pool["prerank_rank"]))
    assert again.column_names == pool.column_names and again.num_rows == pool.num_rows


def test_chunking_dedups_clusters(mini):
    calls = []

    def members_of(ids):
        calls.append(list(ids))
        return mini["members_of"](ids)

    segs = chunk_clusters([3, 1, 3, 1, 0], members_of, SEG, WhitespaceCounter())
    assert calls == [[0, 1, 3]] and sorted(segs) == [0, 1, 3]
