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


def generate_answers(generator, settings: Sequence[Sequence[QueryResult]], questions: dict[str, str]) -> list[Generated]:
    """Answers of ``generator`` to each setting's questions from their final passages, timed.

    Each distinct input (question text, final ``(title, text)`` passages) is generated once,
    whichever settings share it (settings' final passages often agree), the inputs of all
    settings in batches of the generator's ``cfg.batch_size``
    (:meth:`tasks.qa.generation.FiDGenerator.answers`; one at a time for a generator without one).

    Parameters
    ----------
    generator : a :class:`tasks.qa.generation.Generator`.
    settings : each setting's results.
    questions : question id → question text.

    Returns
    -------
    list[Generated]
        Per setting, answer and seconds per question id; an input's seconds are its batch's
        seconds over the batch's inputs.
    """
    inputs = [{r.question_id: (questions[r.question_id], tuple((t, x) for _, t, x in r.passages)) for r in results}
              for results in settings]
    todo = list(dict.fromkeys(key for per_setting in inputs for key in per_setting.values()))
    size = max(1, getattr(getattr(generator, "cfg", None), "batch_size", 1))
    done: dict[tuple, tuple[str, float]] = {}
    batches = [todo[a:a + size] for a in range(0, len(todo), size)]
    n_asked = sum(map(len, inputs))
    for batch in progress(batches, f"reader answers ({generator.label}: {len(todo)} distinct of {n_asked} inputs)",
                          unit="batches"):
        t0 = time.perf_counter()
        got = generator.answers([q for q, _ in batch], [list(ps) for _, ps in batch])
        each = (time.perf_counter() - t0) / len(batch)
        done.update({key: (answer, each) for key, answer in zip(batch, got)})
    return [Generated(generator.label, {q: done[key][0] for q, key in per_setting.items()},
                      {q: done[key][1] for q, key in per_setting.items()}) for per_setting in inputs]
