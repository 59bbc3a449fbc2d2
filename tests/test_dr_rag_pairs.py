"""DR-RAG classifier training pairs (Appendix A.1) and the paragraph collection, on real HotpotQA."""
from __future__ import annotations

from collections import Counter

import pytest

from funnelrag.datasets import resolve
from tasks.dr_rag.collection import Question, build_collection, paragraph_id
from tasks.dr_rag.pairs import PairSamplingConfig, build_pairs, pairs_from_table, pairs_table
from tasks.dr_rag.hotpotqa import Paragraph, QARecord, load_hotpotqa


@pytest.fixture(scope="module")
def records(data_mirror):
    return load_hotpotqa(resolve("hotpotqa-dev-subsampled", data_mirror))


@pytest.fixture(scope="module")
def collection(records):
    return build_collection(records)


def test_collection_deduplicates_by_title_and_text(records, collection):
    coll, questions = collection
    distinct = {(p.title, p.text) for r in records for p in r.paragraphs}
    assert len(coll) == len(distinct) < sum(len(r.paragraphs) for r in records)
    assert list(coll.ids) == sorted(coll.ids)
    row = coll.row()
    for rec, q in zip(records, questions):
        assert q.question_id == rec.question_id
        assert set(q.supporting) == {paragraph_id(p.title, p.text) for p in rec.supporting}
        for pid in q.candidates:
            assert paragraph_id(coll.titles[row[pid]], coll.texts[row[pid]]) == pid


def test_collection_merges_a_paragraph_repeated_across_questions():
    shared = Paragraph("Muse (band)", "Muse are an English rock band.", False)
    r1 = QARecord("q1", "Which band?", ("Muse",), (shared, Paragraph("Teignmouth", "A town.", True),
                                                   Paragraph("Muse (band)", "Muse are an English rock band.", True)))
    r2 = QARecord("q2", "Where?", ("Devon",), (shared, Paragraph("Devon", "A county.", True)))
    coll, (q1, q2) = build_collection([r1, r2])
    assert len(coll) == 3
    assert q1.candidates[0] == q2.candidates[0]
    assert len(q1.candidates) == 2 and set(q1.supporting) == set(q1.candidates)  # the supporting copy wins


def test_pairs_are_balanced_and_labelled_as_appendix_a1(collection):
    _, questions = collection
    pairs, report = build_pairs(questions[:60], PairSamplingConfig(seed=7))
    assert report["positives"] == report["negatives"] == sum(p.label for p in pairs)
    by_q = {q.question_id: q for q in questions}
    per_q = Counter()
    for p in pairs:
        q = by_q[p.question_id]
        s1, s2 = p.d1_id in q.supporting, p.d2_id in q.supporting
        assert p.d1_id != p.d2_id and p.d1_id in q.candidates and p.d2_id in q.candidates
        assert p.label == int(s1 and s2)
        assert p.kind == {(True, True): "sup_sup", (True, False): "sup_non", (False, False): "non_non"}[(s1, s2)]
        per_q[(p.question_id, p.label)] += 1
    for q in questions[:60]:
        n_non = len(q.candidates) - len(q.supporting)
        available = len(q.supporting) * n_non + n_non * (n_non - 1)
        assert per_q[(q.question_id, 1)] == 2  # both orders of the two supporting paragraphs
        assert per_q[(q.question_id, 0)] == min(2, available)
    assert report["sup_non"] > 0 and report["non_non"] > 0
    assert len({(p.question_id, p.d1_id, p.d2_id) for p in pairs}) == len(pairs)


def test_pair_sample_is_deterministic_and_order_free(collection):
    _, questions = collection
    qs = questions[:40]
    a, _ = build_pairs(qs, PairSamplingConfig(seed=1))
    b, _ = build_pairs(list(reversed(qs)), PairSamplingConfig(seed=1))
    assert sorted(a, key=str) == sorted(b, key=str)
    c, _ = build_pairs(qs, PairSamplingConfig(seed=2))
    assert {p for p in a if p.label == 0} != {p for p in c if p.label == 0}
    assert {p for p in a if p.label == 1} == {p for p in c if p.label == 1}
    assert pairs_from_table(pairs_table(a, "train"), "train") == a
    assert pairs_from_table(pairs_table(a, "train"), "dev") == []


def test_negative_kinds_follow_the_configured_share(collection):
    _, questions = collection
    full = [q for q in questions[:50] if len(q.candidates) == 10]
    _, half = build_pairs(full, PairSamplingConfig(sup_non_share=0.5))
    assert half["sup_non"] == half["non_non"] == len(full)  # 2 negatives per question: one of each kind
    _, only = build_pairs(full, PairSamplingConfig(sup_non_share=1.0, neg_per_pos=2.0))
    assert only["sup_non"] == 4 * len(full) and only["non_non"] == 0
    # uniform over the union: 16 sup_non vs 56 non_non candidates per question
    _, uniform = build_pairs(full, PairSamplingConfig(sup_non_share=None, neg_per_pos=10.0))
    assert uniform["negatives"] == 20 * len(full) and uniform["non_non"] > 2 * uniform["sup_non"] > 0
    # a kind that runs short is filled from the other
    q = Question("q", "?", ("s1", "s2"), ("s1", "s2", "n1"))
    pairs, rep = build_pairs([q], PairSamplingConfig(sup_non_share=0.0))
    assert rep["sup_non"] == 2 and rep["non_non"] == 0
    with pytest.raises(ValueError):
        build_pairs([q], PairSamplingConfig(sup_non_share=1.5))


def test_pairs_report_questions_without_enough_data():
    q_single = Question("q1", "?", ("p1",), ("p1", "p2", "p3"))
    q_short = Question("q2", "?", ("p1", "p2"), ("p1", "p2"))
    pairs, report = build_pairs([q_single, q_short], PairSamplingConfig(neg_per_pos=1.0))
    assert report["questions_without_positive"] == 1 and report["questions_short_of_negatives"] == 1
    assert [(p.d1_id, p.d2_id, p.label) for p in pairs] == [("p1", "p2", 1), ("p2", "p1", 1)]
    three, rep3 = build_pairs([Question("q3", "?", ("s1", "s2"), ("s1", "s2", "n1", "n2", "n3"))],
                              PairSamplingConfig(neg_per_pos=3.0))
    assert rep3["negatives"] == 6 and rep3["positives"] == 2
    with pytest.raises(ValueError):
        build_pairs([q_single], PairSamplingConfig(neg_per_pos=-1))


def test_collection_and_pair_stages_are_byte_identical(data_mirror, tmp_path):
    from data_contracts.base import sha256_file
    from tasks.dr_rag.stages import HotpotQADataConfig, read_collection, run_collection, run_pairs
    from tasks.dr_rag.hotpotqa import SplitConfig

    path = resolve("hotpotqa-dev-subsampled", data_mirror)
    cfg = HotpotQADataConfig(max_questions=40, split=SplitConfig(seed=0, dev_fraction=0.25))
    for run in ("a", "b"):
        summary = run_collection(path, cfg, tmp_path / run / "c")
        run_pairs(tmp_path / run / "c", PairSamplingConfig(), tmp_path / run / "p")
    assert summary["train_questions"] + summary["dev_questions"] == 40
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.parquet"))
    assert len(files) == 4
    for f in files:
        assert sha256_file(tmp_path / "a" / f) == sha256_file(tmp_path / "b" / f), f
    coll = read_collection(tmp_path / "a" / "c")
    assert [len(coll.questions["train"]), len(coll.questions["dev"])] == [summary["train_questions"], summary["dev_questions"]]
    assert all(len(q.supporting) == 2 for qs in coll.questions.values() for q in qs)
    with pytest.raises(ValueError, match="leaves no dev question"):
        run_collection(path, HotpotQADataConfig(max_questions=5, split=SplitConfig(dev_fraction=0.0)), tmp_path / "x")
