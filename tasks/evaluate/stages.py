"""Evaluation building blocks between the corpus and the settings: question sampling, the
answerability subset, the BM25 retriever callable and generation."""
from __future__ import annotations

import hashlib
import logging
import time
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from funnelrag.progress import progress
from tasks.evaluate.report import Generated
from tasks.evaluate.retrieval import QueryResult
from tasks.funnel.experiment_validation import ValidationConfig, validation_ids
from tasks.qa.corpus_answers import corpus_has_answers

log = logging.getLogger(__name__)


def sample_questions(questions: pa.Table, limit: int | None, seed: int) -> pa.Table:
    """The ``limit`` questions with the smallest ``sha256(seed, question_id)`` (a deterministic
    sample that does not depend on file order), sorted by ``question_id``; all when ``limit`` is
    None or not smaller than the table."""
    if limit is None or limit >= questions.num_rows:
        return questions
    ids = questions["question_id"].to_pylist()
    key = [hashlib.sha256(f"{seed}\0{q}".encode()).hexdigest() for q in ids]
    keep = sorted(sorted(range(len(ids)), key=lambda i: key[i])[:limit], key=lambda i: ids[i])
    return questions.take(pa.array(keep, pa.int64()))


def validation_part(questions: pa.Table, cfg: ValidationConfig = ValidationConfig()) -> pa.Table:
    """The validation part of the train split, in table order: rows with ``split == "train"``
    (:func:`tasks.qa.questions.split_of` as loaded, seed 0, 20% ``dev``: the distillation
    experiment's held-out part is never among them) whose validation hash
    (:func:`tasks.funnel.experiment_validation.validation_ids`, ``cfg``) says ``dev``.

    Raises
    ------
    KeyError
        The table has no ``split`` column (not a :func:`tasks.qa.questions.load_questions` table).
    """
    if "split" not in questions.column_names:
        raise KeyError("questions table has no 'split' column: load it with tasks.qa.questions.load_questions")
    train = questions.filter(pc.equal(questions["split"], "train"))
    keep = validation_ids(train, cfg)
    return train.filter(pa.array([q in keep for q in train["question_id"].to_pylist()], pa.bool_()))


def answerability(passage_texts: Sequence[str], questions: pa.Table) -> tuple[dict[str, bool], float]:
    """``({question_id: some corpus passage has an answer}, seconds)`` (DPR ``has_answer``, every
    question's answers in one pass over the passages: :func:`tasks.qa.corpus_answers.corpus_has_answers`,
    with a progress line)."""
    t0 = time.perf_counter()
    found = corpus_has_answers(passage_texts, questions["answers"].to_pylist())
    return dict(zip(questions["question_id"].to_pylist(), found)), time.perf_counter() - t0


def bm25_retriever(index) -> Callable[[str, int], list[str]]:
    """``retrieve(question, k)`` over a :class:`tasks.corpus.index.BM25Index` of passages."""
    def retrieve(question: str, k: int) -> list[str]:
        return index.search([question], k)[0][0]
    return retrieve


def generate_answers(generator, results: Sequence[QueryResult], questions: dict[str, str]) -> Generated:
    """Run ``generator(question, [(title, text)])`` on each result's final passages, timed."""
    answers, seconds = {}, {}
    for r in progress(results, f"reader answers ({generator.label})", unit="questions"):
        t0 = time.perf_counter()
        answers[r.question_id] = generator(questions[r.question_id], [(t, x) for _, t, x in r.passages])
        seconds[r.question_id] = time.perf_counter() - t0
    return Generated(generator.label, answers, seconds)
