"""Questions: DPR has_answer, SQuAD EM, file formats, deterministic split (real NQ-open files)."""
from __future__ import annotations

import gzip
import json
import unicodedata

import pytest

from data_contracts.funnel import QUESTIONS
from funnelrag.datasets import resolve
from tasks.qa.questions import (
    AnswerMatcher,
    QuestionsConfig,
    dpr_tokens,
    exact_match,
    has_answer,
    load_questions,
    normalize_answer,
    read_questions,
    split_of,
)


# ---------------------------------------------------------------------------- DPR has_answer
def test_dpr_tokens_split_words_and_single_symbols():
    assert dpr_tokens("581 (second edition)") == ["581", "(", "second", "edition", ")"]
    assert dpr_tokens("Röntgen's X-rays") == [unicodedata.normalize("NFD", "röntgen"), "'", "s", "x", "-", "rays"]


@pytest.mark.parametrize("answers,text,expected", [
    (["Linda Davis"], "The duet was sung by LINDA DAVIS and Reba.", True),      # case-insensitive
    (["cat"], "concatenate strings", False),                                    # token boundary
    (["the Saint Lawrence River"], "via the Saint Lawrence River.", True),
    (["the Saint Lawrence River"], "via the Saint-Lawrence River.", False),     # '-' is a token
    (["581 (second edition)"], "It has 581 (second edition) pages", True),
    (["581 (second edition)"], "It has 581 pages (second edition)", False),     # order matters
    (["Röntgen"], "Wilhelm Conrad Ro\u0308ntgen won", True),                     # NFC answer, NFD text
    (["Ro\u0308ntgen"], "Wilhelm Conrad Röntgen won", True),                     # NFD answer, NFC text
    (["Rontgen"], "Wilhelm Conrad Röntgen won", False),                         # marks are kept
    (["", "   "], "anything at all", False),                                    # empty answers never match
    (["x", "New York"], "in new york city", True),                              # any answer
])
def test_has_answer_cases(answers, text, expected):
    assert has_answer(answers, text) is expected


def test_has_answer_agrees_with_lost_in_the_middle_labels(data_mirror):
    """The oracle file's ``hasanswer`` flags were computed with DPR's matcher: we reproduce them,
    and the answers of one question do not all match the gold passage of another."""
    path = resolve("nq-open-oracle", data_mirror)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(300), fh)]
    flags = [(has_answer(r["answers"], c["text"]), c["hasanswer"]) for r in records for c in r["ctxs"]]
    assert all(ours == theirs for ours, theirs in flags)
    shifted = [has_answer(a["answers"], b["ctxs"][0]["text"]) for a, b in zip(records, records[1:])]
    assert sum(shifted) < len(shifted) // 4


def test_answer_matcher_reuses_tokenized_answers():
    m = AnswerMatcher(["New York", "NYC"])
    assert m("I love nyc") and m("new york!") and not m("york new")


# ---------------------------------------------------------------------------- SQuAD EM
@pytest.mark.parametrize("pred,answers,expected", [
    ("The Beatles", ["Beatles"], True),
    ("beatles.", ["The Beatles"], True),
    ("  a   Beatle ", ["beatle"], True),
    ("Beatles band", ["The Beatles"], False),
    ("Theatre", ["atre"], False),              # 'the' is removed only as a word
    ("U.S.", ["US"], True),
])
def test_exact_match(pred, answers, expected):
    assert exact_match(pred, answers) is expected


def test_normalize_answer_squad():
    assert normalize_answer("The  Quick, brown   fox!") == "quick brown fox"


# ---------------------------------------------------------------------------- loading
def test_load_real_nq_tsv_and_oracle_jsonl(data_mirror):
    tsv, oracle = resolve("nq-open-dev", data_mirror), resolve("nq-open-oracle", data_mirror)
    cfg = QuestionsConfig(limit=200, dev_fraction=0.25, seed=3)
    table, report = load_questions([tsv, oracle], cfg)
    assert table.num_rows == 400 and report.kept == 400 and not report.skipped
    QUESTIONS.validate(table)
    rows = {r["question_id"]: r for r in table.to_pylist()}
    first = rows["nq-open-dev:000001"]
    assert first["question"] == "who sings does he love me with reba"
    assert first["answers"] == ["Linda Davis"] and first["record"] == 1
    oracle_first = rows["nq-open-oracle:000001"]
    assert oracle_first["answers"] == ["Wilhelm Conrad Röntgen"]
    dev_share = table["split"].to_pylist().count("dev") / table.num_rows
    assert 0.15 < dev_share < 0.35
    again, _ = load_questions([tsv, oracle], cfg)
    assert again.equals(table)


def test_split_is_hash_of_text_and_seed():
    qs = [f"question number {i}" for i in range(2000)]
    a = [split_of(q, 0, 0.2) for q in qs]
    assert a == [split_of(q, 0, 0.2) for q in qs]
    assert a != [split_of(q, 1, 0.2) for q in qs]
    assert 0.15 < a.count("dev") / len(a) < 0.25
    assert all(split_of(q, 0, 0.0) == "train" for q in qs[:50])
    with pytest.raises(ValueError):
        split_of("q", 0, 1.5)


def test_bad_tsv_line_names_file_and_line(tmp_path):
    path = tmp_path / "qs.tsv"
    path.write_text("good question\t['yes']\nbad question\t['unterminated\n")
    with pytest.raises(ValueError, match=r"qs\.tsv:2"):
        read_questions(path)


def test_skips_are_counted_not_lost(tmp_path):
    path = tmp_path / "qs.jsonl"
    lines = [{"question": "q1", "answers": ["a"]}, {"question": "q2", "answers": []},
             {"question": " ", "answers": ["b"]}, {"question": "q4", "answers": "single"}]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    table, report = load_questions([path])
    assert table["question"].to_pylist() == ["q1", "q4"]
    assert table["answers"].to_pylist() == [["a"], ["single"]]
    assert report.skipped == {"no_answer": 1, "empty_question": 1, "blank_line": 1}
    assert report.read == 4 and report.kept == 2


def test_jsonl_missing_key_names_line(tmp_path):
    path = tmp_path / "qs.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"question": "q", "answers": ["a"]}) + "\n")
        fh.write(json.dumps({"query": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"qs\.jsonl\.gz:2"):
        read_questions(path)
