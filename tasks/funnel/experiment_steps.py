"""Steps of the distillation experiment (:mod:`flows.experiment`): the configs each step is
cached under, and the outputs no funnel stage makes (the flat-BM25 reader input, answer-only
labels, the reader's learning curve, the pre-ranker's own passage scores and per-question unit
recall of a (re-ranked) held-out pool).

Each ``*_key`` function gives the config a step's cache key is computed from (with the step
name, its code version and its input digests, :meth:`funnelrag.store.StageCache.key`): changing
what one returns invalidates every cached experiment home, so ``tests/test_flow_experiment.py``
pins them. Each ``build_*`` function writes its files into ``out`` (a stage cache's temporary
directory) and returns the step summary. ``cfg`` is ``flows.experiment.ExperimentConfig``.
No Prefect import.
"""
from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, LABELS, QUESTIONS, UNIT_POOL, UNITS
from funnelrag.training import checkpoint_dirs
from models.preranker import build_preranker, load_preranker
from tasks.funnel import stages as S
from tasks.funnel.candidates import rerank_pool, unit_passages
from tasks.funnel.embeddings import passage_text
from tasks.funnel.experiment_data import bm25_passage_candidates
from tasks.funnel.experiment_eval import per_question_unit_recall
from tasks.funnel.labels import LabelConfig, make_labels
from tasks.funnel.reader import reader_from_checkpoint
from tasks.funnel.unit_scoring import maxp_pool_scores, stored_maxp_pool_scores

log = logging.getLogger(__name__)

# ``index_of(model)``: the stored passage vectors of ``model``'s document tower, or None.
IndexOf = Callable[[Any], Any]


# ---------------------------------------------------------------------------- step keys
def recall_ks(cfg) -> list[int]:
    """AR@k cut-offs of the held-out pool: ``recall_at`` and N (``candidates.n_units``)."""
    return sorted({*cfg.recall_at, cfg.candidates.n_units})


def stored_vectors(cfg, split: str) -> bool:
    """Whether ``split``'s pre-ranking reads the published passage vectors."""
    return (cfg.train_vectors if split == "train" else cfg.heldout_vectors) == "stored"


def candidates_key(cfg, split: str, segment) -> dict[str, Any]:
    """Key config of ``candidates_<split>`` (``segment``: the corpus' segmentation config); its
    ``limit``, ``candidates`` and ``preranker`` are what the step runs with."""
    train = split == "train"
    key = {"split": split, "limit": cfg.n_train if train else cfg.n_heldout,
           "candidates": (cfg.train_candidates or cfg.candidates) if train else cfg.candidates,
           "preranker": (cfg.train_preranker or cfg.preranker) if train else cfg.preranker, "segment": segment}
    return {**key, "vectors": "stored"} if stored_vectors(cfg, split) else key


def reader_data_key(cfg, split: str) -> dict[str, Any]:
    """Key config of ``reader_data`` (train) and ``reader_dev_data`` (dev)."""
    key = {"n_reader": cfg.n_reader if split == "train" else cfg.n_reader_dev, "n_passages": cfg.reader.n_passages,
           "search_k": cfg.reader_search_k}
    return key if split == "train" else {**key, "split": split}


def reader_key(cfg) -> dict[str, Any]:
    return asdict(cfg.reader)


def attention_key(cfg) -> dict[str, Any]:
    return {"score": cfg.attention, "run": cfg.attention_run}


def labels_key(cfg, l2g: bool):
    """L2G labels (𝒦 = ``l2g_top_k``) or answer-only labels (𝒦 = 0): the ``LabelConfig`` used."""
    return LabelConfig(alpha=cfg.l2g_alpha, top_k=cfg.l2g_top_k if l2g else 0)


def validation_key(cfg) -> dict[str, Any]:
    return {"validation": cfg.validation, "preranker": cfg.preranker, "distill": cfg.distill,
            "train": cfg.distill_train, "vectors": cfg.heldout_vectors, "ks": recall_ks(cfg)}


def distill_key(cfg, distill, train) -> dict[str, Any]:
    """Key config of a BPR run with these (possibly validation-chosen) settings."""
    return {"preranker": cfg.preranker, "distill": distill, "train": train}


def prerank_scores_key(cfg) -> dict[str, Any]:
    return {"preranker": cfg.preranker, "vectors": cfg.heldout_vectors}


def recall_key(cfg) -> dict[str, Any]:
    return {"ks": recall_ks(cfg)}


# ---------------------------------------------------------------------------- step outputs
def build_reader_input(corpus, questions_dir: Path, split: str, limit: int | None, n_passages: int,
                       search_k: int, out: Path) -> dict[str, Any]:
    """Flat-BM25 reader input (:func:`tasks.funnel.experiment_data.bm25_passage_candidates`) of
    the first ``limit`` questions of ``split``: ``candidates`` and the ``questions`` kept (those
    with an answer passage among their BM25 top ``search_k``)."""
    qs = S.select_questions(QUESTIONS.read(questions_dir), split, limit)
    cands = bm25_passage_candidates(corpus, qs, n_passages, search_k)
    keep = pa.array(sorted(set(cands["question_id"].to_pylist())), pa.string())
    CANDIDATES.write(cands, out)
    QUESTIONS.write(qs.filter(pc.is_in(qs["question_id"], keep)), out)
    return {"questions": qs.num_rows, "with_answer": len(keep)}


def build_answer_only_labels(data_dir: Path, cfg, out: Path) -> dict[str, Any]:
    """Labels with 𝒦 = 0 (``cfg.top_k``): D+ = the answer units, attention scores unused."""
    cands = CANDIDATES.read(data_dir)
    zero = pa.table({"question_id": cands["question_id"], "unit_id": cands["unit_id"],
                     "passage_id": cands["passage_id"], "score": pa.array([0.0] * cands.num_rows, pa.float32()),
                     "attention": pa.array(["none"] * cands.num_rows)})
    labels = make_labels(zero.cast(ATTENTION_SCORES.schema), cands, cfg)
    LABELS.write(labels, out)
    return {"documents": labels.num_rows, "positives": sum(labels["positive"].to_pylist())}


def build_reader_curve(reader_data_dir: Path, dev_dir: Path, run_dir: Path, reader_cfg, out: Path) -> dict[str, Any]:
    """Held-out EM of every kept checkpoint of the reader run in ``run_dir`` on the reader input
    ``dev_dir``: ``curve.json`` = ``[{step, epoch, em, per_question}]`` (epochs counted in
    batches of the questions kept in ``reader_data_dir``)."""
    kept = QUESTIONS.read(reader_data_dir).num_rows
    steps_per_epoch = -(-kept // reader_cfg.train.batch_size)
    curve = []
    for ckpt in checkpoint_dirs(run_dir):
        step = int(ckpt.name.split("_")[1])
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            reader_dir = reader_from_checkpoint(ckpt, reader_cfg, Path(tmp) / "reader")
            preds, summary = S.evaluate_reader(dev_dir, reader_dir)
        curve.append({"step": step, "epoch": round(step / steps_per_epoch, 2), "em": summary["em"],
                      "per_question": [int(x) for x in preds["exact_match"].to_pylist()]})
        log.info("reader checkpoint step %d: held-out EM %.3f", step, summary["em"])
    (out / "curve.json").write_text(json.dumps(curve))
    return {"checkpoints": len(curve), "questions": QUESTIONS.read(dev_dir).num_rows,
            "em": {c["step"]: c["em"] for c in curve}}


def distill_settings(distill_cfg, train_cfg, selected_dir: Path | None):
    """``(distill_cfg, train_cfg)``, with the learning rate and (rounded) epochs chosen by the
    validation search (``validation.json`` in ``selected_dir``) when it is given."""
    if selected_dir is None:
        return distill_cfg, train_cfg
    best = json.loads((selected_dir / "validation.json").read_text())["best"]
    return replace(distill_cfg, epochs=max(1, round(best["epochs"]))), replace(train_cfg, lr=best["lr"])


def build_prerank_passage_scores(data_dir: Path, preranker_cfg, batch_size: int, index_of: IndexOf | None,
                                 out: Path) -> dict[str, Any]:
    """The pre-ranker's own score ``f(q, p)`` of every candidate passage of ``data_dir`` (MaxP
    funnels order a unit's passages by it): ``passage_scores.json`` = ``[[question_id,
    passage_id, score], ...]``; read from stored vectors when ``index_of`` gives an index."""
    model, tok = build_preranker(preranker_cfg)
    cands, questions = CANDIDATES.read(data_dir), QUESTIONS.read(data_dir)
    qids = questions["question_id"].to_pylist()
    q_row = {q: i for i, q in enumerate(qids)}
    passages_of: dict[str, list[tuple[str, str]]] = {}
    pool, seen = set(), set()
    for q, u, _, pid, title, text in sorted(zip(
            cands["question_id"].to_pylist(), cands["unit_id"].to_pylist(), cands["passage_position"].to_pylist(),
            cands["passage_id"].to_pylist(), cands["title"].to_pylist(), cands["text"].to_pylist())):
        pool.add((q_row[q], u))
        if pid not in seen:
            seen.add(pid)
            passages_of.setdefault(u, []).append((pid, passage_text(title, text)))
    rows = sorted(pool)
    index = index_of(model) if index_of is not None else None
    texts = questions["question"].to_pylist()
    if index is not None:
        _, scores = stored_maxp_pool_scores(model, tok, texts, rows, passages_of, index, batch_size)
    else:
        _, scores = maxp_pool_scores(model, tok, texts, rows, passages_of, batch_size)
    triples = sorted([qids[qi], pid, float(v)] for (qi, pid), v in scores.items())
    (out / "passage_scores.json").write_text(json.dumps(triples))
    return {"passages": len(triples), "stored_vectors": index is not None}


def build_preranker_recall(heldout_dir: Path, distilled_dir: Path | None, ks: Sequence[int], batch_size: int,
                           passages: pa.Table | None, index_of: IndexOf | None, out: Path) -> dict[str, Any]:
    """Per-question AR@k of the held-out unit pool, re-ranked by the pre-ranker saved in
    ``distilled_dir`` (None: the pool's own order, i.e. before distillation): ``recall.json``.

    passages : the corpus passages when the pool ranks units by MaxP (re-ranked the same way).
    index_of : stored passage vectors of a bi-encoder's document tower (None: computed).
    """
    pool, questions = UNIT_POOL.read(heldout_dir), QUESTIONS.read(heldout_dir)
    if distilled_dir is not None:
        model, tok = load_preranker(distilled_dir / S.PRERANKER_DIR)
        passages_of = index = None
        if passages is not None:
            passages_of = unit_passages(passages, pool["unit_id"].to_pylist())
            if index_of is not None and model.kind == "bi":
                index = index_of(model)
        pool = rerank_pool(pool, UNITS.read(heldout_dir), questions, model, tok, batch_size, passages_of, index)
    qids = sorted(questions["question_id"].to_pylist())
    per_q = per_question_unit_recall(pool, ks, qids)
    per_k = {str(k): v.tolist() for k, v in per_q.items()}
    (out / "recall.json").write_text(json.dumps({"question_ids": qids, **per_k}))
    return {str(k): float(v.mean()) for k, v in per_q.items()}
