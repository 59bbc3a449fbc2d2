"""Evaluation building blocks between the corpus and the settings: question sampling, the
answerability subset, retriever callables (BM25 / cached dense index) and generation."""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa

from funnelrag.progress import progress
from funnelrag.stages import run_cached, stage
from tasks.evaluate.dense import DenseIndex, DenseIndexConfig, build_dense_index, encode_texts
from tasks.evaluate.metrics import CorpusAnswers
from tasks.evaluate.report import Generated
from tasks.evaluate.retrieval import QueryResult

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


def answerability(passage_texts: Sequence[str], questions: pa.Table) -> tuple[dict[str, bool], float]:
    """``({question_id: some corpus passage has an answer}, seconds)`` (DPR ``has_answer``)."""
    t0 = time.perf_counter()
    corpus = CorpusAnswers(progress(passage_texts, "answerability: tokenize passages", unit="passages"))
    out = {q: corpus.contains(a) for q, a in zip(questions["question_id"].to_pylist(), questions["answers"].to_pylist())}
    return out, time.perf_counter() - t0


def passage_texts_for_index(passages: pa.Table) -> list[str]:
    """What the dense index embeds per passage: ``"{title}. {text}"`` (DPR encodes title and text)."""
    return [f"{t}. {x}" for t, x in zip(passages["title"].to_pylist(), passages["text"].to_pylist())]


@stage("dense-index", version="1")
def dense_index(cache, corpus_digest: str, passages: pa.Table, encoder, tokenizer, model_id: str,
                cfg: DenseIndexConfig) -> tuple[DenseIndex, dict]:
    """Load the dense passage index from the stage cache or build it (embedding every passage).

    Parameters
    ----------
    cache : funnelrag.store.StageCache
        Content-keyed cache; the key is the corpus digest, the encoder's weight fingerprint
        (``model_id``) and the index config, never a path.
    corpus_digest : digest of the published corpus version.
    passages : the corpus ``passages`` table.
    encoder, tokenizer : the bi-encoder (:class:`models.encoders.BiEncoder`).
    cfg : DenseIndexConfig

    Returns
    -------
    (DenseIndex, info)
        ``info`` = ``{"cache_hit", "build_seconds", "n", "bytes"}``.
    """
    key_cfg = {**asdict(cfg), "text": "title. text"}
    key_cfg.pop("block_rows"), key_cfg.pop("upcast")

    def build(out: Path, _key: str) -> dict:
        t0 = time.perf_counter()
        index = build_dense_index(passage_texts_for_index(passages), passages["passage_id"].to_pylist(),
                                  encoder, tokenizer, cfg, {"corpus_digest": corpus_digest, "model": model_id})
        seconds = time.perf_counter() - t0
        index.save(out)
        return {"build_seconds": seconds, "n": len(index), "bytes": index.nbytes,
                "passages_per_s": len(index) / max(seconds, 1e-9)}

    res = run_cached(cache, dense_index, key_cfg, {"corpus": corpus_digest, "model": model_id}, build)
    index = DenseIndex.load(res.path, block_rows=cfg.block_rows, upcast=cfg.upcast)
    return index, {"cache_hit": res.cache_hit, **res.summary}


def bm25_retriever(index) -> Callable[[str, int], list[str]]:
    """``retrieve(question, k)`` over a :class:`tasks.corpus.index.BM25Index` of passages."""
    def retrieve(question: str, k: int) -> list[str]:
        return index.search([question], k)[0][0]
    return retrieve


def dense_retriever(index: DenseIndex, encoder, tokenizer) -> Callable[[str, int], list[str]]:
    """``retrieve(question, k)``: encode the question with the bi-encoder, exact top-k search."""
    def retrieve(question: str, k: int) -> list[str]:
        q = encode_texts(encoder, tokenizer, [question])   # (1, dim)
        return index.search(q, k)[0][0]
    return retrieve


def generate_answers(generator, results: Sequence[QueryResult], questions: dict[str, str]) -> Generated:
    """Run ``generator(question, [(title, text)])`` on each result's final passages, timed."""
    answers, seconds = {}, {}
    for r in progress(results, f"reader answers ({generator.label})", unit="questions"):
        t0 = time.perf_counter()
        answers[r.question_id] = generator(questions[r.question_id], [(t, x) for _, t, x in r.passages])
        seconds[r.question_id] = time.perf_counter() - t0
    return Generated(generator.label, answers, seconds)
