"""Answerability in one pass (tasks/qa/corpus_answers.py) makes DPR has_answer's decisions: on
every shipped question set over real passages, and on the cases its filter must not lose."""
import gzip
import json
import logging
import tarfile

import pytest

from funnelrag.datasets import resolve
from tasks.evaluate.stages import answerability
from tasks.qa.corpus_answers import corpus_has_answers
from tasks.qa.questions import AnswerMatcher, QuestionsConfig, dpr_tokens, has_answer, load_questions


@pytest.fixture(scope="module")
def passages(data_mirror) -> list[str]:
    """Real passages: 100-word pieces of 30 Wikispeedia articles (non-ASCII text included), the
    gold passages of the first 600 NQ-open oracle questions (so NQ answers are found) and the
    paragraphs of the first 150 HotpotQA questions."""
    out = []
    with tarfile.open(resolve("wikispeedia-articles", data_mirror)) as tf:
        files = [m for m in tf if m.isfile()]
        for m in files[::len(files) // 30][:30]:
            words = tf.extractfile(m).read().decode("utf-8").split()
            out += [" ".join(words[i:i + 100]) for i in range(0, len(words), 100)]
    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        out += [f"{c['title']}\n{c['text']}" for _, c in zip(range(600), (json.loads(line)["ctxs"][0] for line in fh))]
    with open(resolve("hotpotqa-dev-subsampled", data_mirror), encoding="utf-8") as fh:
        out += [f"{c['title']}\n{c['paragraph_text']}" for _, line in zip(range(150), fh) for c in json.loads(line)["contexts"]]
    assert any(not p.isascii() for p in out)
    return out


def question_sets(data_mirror) -> dict[str, list[list[str]]]:
    """Answer lists of every shipped question set: NQ-open dev and test (samples), the NQ-open
    oracle file, HotpotQA."""
    sets = {}
    for name, limit in (("nq-open-dev", 600), ("nq-open-test", 300), ("nq-open-oracle", 900)):
        table, _ = load_questions([resolve(name, data_mirror)], QuestionsConfig(limit=limit))
        sets[name] = table["answers"].to_pylist()
    with open(resolve("hotpotqa-dev-subsampled", data_mirror), encoding="utf-8") as fh:
        sets["hotpotqa"] = [[s for o in json.loads(line)["answers_objects"] for s in o["spans"]] for line in fh]
    return sets


def dpr_decisions(passages: list[str], answer_lists: list[list[str]]) -> list[bool]:
    """``any(has_answer(answers, p) for p in passages)`` per question: the passages' DPR tokens
    once, each question tested (:meth:`AnswerMatcher.tokens_match`, has_answer's test) on the
    passages holding an answer's first token (no other passage can match)."""
    tokens = [dpr_tokens(p) for p in passages]
    holding: dict[str, list[int]] = {}
    for i, toks in enumerate(tokens):
        for t in set(toks):
            holding.setdefault(t, []).append(i)
    out = []
    for answers in answer_lists:
        m = AnswerMatcher(answers)
        rows = sorted({i for a in m.answers for i in holding.get(a[0], [])})
        out.append(any(m.tokens_match(tokens[i]) for i in rows))
    return out


def test_same_decisions_as_dpr_has_answer_on_every_shipped_question_set(passages, data_mirror):
    for name, answer_lists in question_sets(data_mirror).items():
        want = dpr_decisions(passages, answer_lists)
        got = corpus_has_answers(passages, answer_lists, chunk=1000)
        assert got == want, name
        assert 0 < sum(want) < len(want), name          # some found, some not: the comparison is not vacuous


def test_cases_the_filter_must_keep():
    texts = ["we concatenate strings", "the U. S. Army", "ΟΔΥΣΣΕΥΣ. Ithaca", "co\u00adoperate now",
             "Beyonce\u0301 sings", "ctrl\x01char here", "tab\tseparated\u2003words", "5%of all", "end of one"]
    cases = {("cat",): False, ("concatenate",): True, ("U.S.",): True, ("u.s. army",): True,
             ("οδυσσευς",): True, ("Odysseus",): False, ("co operate",): True, ("cooperate",): False,
             ("Beyoncé",): True, ("char",): True, ("ctrl char",): True, ("separated words",): True,
             ("%",): True, ("5 %",): True, ("of",): True, ("one we",): False, ("", "  "): False,
             ("army", "navy"): True, ("strings the",): False}
    answer_lists = [list(a) for a in cases]
    want = [any(has_answer(a, t) for t in texts) for a in answer_lists]
    assert want == list(cases.values())
    for chunk in (1, 3, 100):
        assert corpus_has_answers(texts, answer_lists, chunk=chunk) == want
    assert corpus_has_answers(iter(texts), answer_lists) == want            # any iterable, read once
    assert corpus_has_answers([], answer_lists) == [False] * len(cases)


def test_answerability_reports_progress(caplog):
    import pyarrow as pa

    questions = pa.table({"question_id": ["a", "b"], "answers": [["Army"], ["navy"]]})
    with caplog.at_level(logging.INFO, logger="funnelrag.progress"):
        found, seconds = answerability(["the U. S. Army", "ships"], questions)
    assert found == {"a": True, "b": False} and seconds >= 0
    assert any("answerability" in r.getMessage() for r in caplog.records)


def test_the_squeeze_removes_exactly_what_dpr_skips():
    """The filter's squeezed text relies on two Unicode facts: every str.isspace character is a Z
    or C one, and no Z or C character but the space is printable."""
    import sys
    import unicodedata

    skipped = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c))[0] in "ZC"]
    assert all(not ch.isprintable() for ch in skipped if ch != " ")
    assert all(unicodedata.category(chr(c))[0] in "ZC" for c in range(sys.maxunicode + 1) if chr(c).isspace())
