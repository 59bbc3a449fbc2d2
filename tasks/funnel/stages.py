"""The FunnelRAG L2G distillation stages as functions over directories (no Prefect import).

Each ``run_*`` reads its inputs from stage directories, writes its artifacts into ``out_dir``
through the contracts of :mod:`data_contracts.funnel` and returns a JSON-ready summary
(counts, seconds). :mod:`flows.funnel` wraps each in a Prefect task and the
content-keyed :class:`funnelrag.store.StageCache`.

questions → candidates (train / dev) → reader (FiD) → attention (Eq. 3) → labels (Eq. 4/5)
→ distill (Eq. 6) → answer recall of the pre-ranking stage (before / after).
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.funnel import (
    ANSWER_RECALL,
    ATTENTION_SCORES,
    CANDIDATES,
    LABELS,
    QUESTIONS,
    READER_PREDICTIONS,
    UNIT_POOL,
    UNITS,
)
from data_contracts.evaluation import QUESTION_SCORES
from funnelrag.progress import Progress, progress
from funnelrag.stages import stage
from funnelrag.tracking import question_scores_table
from funnelrag.training import TrainConfig, train
from models.preranker import PreRankerConfig, build_preranker, load_preranker, save_preranker
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, score_candidates
from tasks.funnel.candidates import (
    CandidatesConfig,
    answer_recall,
    build_candidates,
    published_segments,
    rerank_pool,
    unit_passages,
)
from tasks.funnel.distill import (
    BPRHooks,
    DistillConfig,
    MaxPBPRHooks,
    PairDataset,
    build_examples,
    prepare_for_distillation,
)
from tasks.funnel.experiment_eval import per_question_unit_recall
from tasks.funnel.embeddings import (
    EmbeddingConfig,
    embed_passages,
    embed_texts,
    model_version,
    open_embedding_index,
    passage_text,
    store_root,
)
from tasks.funnel.labels import LabelConfig, make_labels
from tasks.funnel.reader import ReaderExample, load_reader, train_reader
from tasks.funnel.vector_store import VectorStore, vector_store_root
from tasks.qa.generation import FiDGenerator, GenerationConfig
from tasks.qa.questions import QuestionsConfig, exact_match, load_questions

log = logging.getLogger(__name__)

PRERANKER_DIR = "preranker"
READER_DIR = "reader"
MetricsFn = Callable[[dict[str, float], int], None] | None


@stage("questions", version="1")
def run_questions(paths: Sequence[Path], cfg: QuestionsConfig, out_dir: Path) -> dict[str, Any]:
    """QA files → ``questions.parquet`` (+ ``questions_report.json``: read / kept / skipped)."""
    table, report = load_questions(paths, cfg)
    QUESTIONS.write(table, out_dir)
    (Path(out_dir) / "questions_report.json").write_text(json.dumps(report.as_dict(), indent=1, sort_keys=True))
    splits = table["split"].to_pylist()
    return {"questions": table.num_rows, "train": splits.count("train"), "dev": splits.count("dev"), **report.as_dict()}


def select_questions(questions: pa.Table, split: str, limit: int | None) -> pa.Table:
    """The first ``limit`` questions of ``split`` in question-id (= file) order."""
    sub = questions.filter(pc.equal(questions["split"], split)).sort_by("question_id")
    return sub if limit is None else sub.slice(0, limit)


def unit_vector_store(model, vector_cache: Path | None) -> VectorStore | None:
    """The content-keyed vector store of a bi-encoder's document tower under the home's cache
    directory ``vector_cache`` (:func:`tasks.funnel.vector_store.vector_store_root` of
    :func:`tasks.funnel.embeddings.model_version`), shared with the passage vectors of the
    evaluation and ``embed-corpus``; None for a cross-encoder or without ``vector_cache``."""
    if vector_cache is None or getattr(model, "kind", None) != "bi":
        return None
    return VectorStore(vector_store_root(vector_cache, model_version(model)), model.encoder.backbone.config.hidden_size)


@stage("candidates", version="2")
def run_candidates(questions_dir: Path, split: str, limit: int | None, corpus, seg_cfg, token_counter,
                   preranker: PreRankerConfig, cfg: CandidatesConfig, out_dir: Path,
                   stores_dir: Path | None = None, corpus_name: str | None = None, device: str = "cpu",
                   vector_cache: Path | None = None) -> dict[str, Any]:
    """Funnel of one split's questions: writes ``unit_pool``, ``candidates``, ``units`` and
    ``questions`` (the subset) tables; summary has per-stage seconds and counts.

    With ``vector_cache`` (the home's cache directory) a bi-encoder pre-ranking units from their
    text reads and keeps the unit vectors in its document tower's vector store
    (:func:`unit_vector_store`), so the units shared by both splits, the re-ranking after a
    query-side distillation and the champion gate embed nothing again. The retrieved clusters'
    units and passages are the published version's own (:func:`tasks.funnel.candidates.published_segments`:
    the build's later chunking, read back instead of cut again).

    With ``stores_dir`` (and ``corpus_name``), the passage vectors of the published embedding
    index of this corpus and of the pre-ranker's weights are read instead of computed
    (``cfg.unit_scoring`` must be ``"maxp"``; ~15 ms per question instead of seconds on CPU).

    Raises
    ------
    ValueError
        No question of ``split``; stored vectors asked with ``unit_scoring="first"``.
    FileNotFoundError, tasks.funnel.embeddings.EmbeddingIndexMismatch
        No embedding index is published for this corpus and pre-ranker version.
    """
    questions = select_questions(QUESTIONS.read(questions_dir), split, limit)
    if questions.num_rows == 0:
        raise ValueError(f"no {split!r} question in {questions_dir}")
    model, tok = build_preranker(preranker)
    model.to(device)   # the pre-ranker scores on ``device`` (funnelrag.device.resolve_device at the flow)
    index = None
    if stores_dir is not None:
        version = model_version(model)
        index = open_embedding_index(store_root(stores_dir, corpus_name or "", version),
                                     corpus.manifest.get("content_digest", corpus.digest), version)
    unit_store = unit_vector_store(model, vector_cache) if cfg.unit_scoring == "first" else None
    cs = build_candidates(questions, corpus.cluster_index(), corpus.members_of, seg_cfg, token_counter,
                          model, tok, cfg, index=index, unit_store=unit_store,
                          segments_of=lambda ids: published_segments(corpus.passages, ids))
    for contract, table in ((UNIT_POOL, cs.unit_pool), (CANDIDATES, cs.candidates), (UNITS, cs.units),
                            (QUESTIONS, questions)):
        contract.write(table, out_dir)
    pairs = cs.unit_pool.num_rows
    return {"split": split, "questions": questions.num_rows, "pool_units": pairs, "distinct_units": cs.units.num_rows,
            "candidate_passages": cs.candidates.num_rows,
            "seconds": {k: round(v, 4) for k, v in cs.timings.items()},
            "prerank_pairs_per_s": pairs / max(cs.timings["preranking"], 1e-9),
            "answer_recall": {str(k): v for k, v in answer_recall(cs.unit_pool, [1, 2, 3, 4, cfg.n_units],
                                                                  questions["question_id"].to_pylist()).items()}}


def reader_examples(candidates: pa.Table, questions: pa.Table) -> list:
    """:class:`tasks.funnel.reader.ReaderExample` per question: passages in pre-ranker order."""
    answers = dict(zip(questions["question_id"].to_pylist(), questions["answers"].to_pylist()))
    text = dict(zip(questions["question_id"].to_pylist(), questions["question"].to_pylist()))
    rows = sorted(zip(candidates["question_id"].to_pylist(), candidates["unit_rank"].to_pylist(),
                      candidates["passage_position"].to_pylist(), candidates["passage_id"].to_pylist(),
                      candidates["title"].to_pylist(), candidates["text"].to_pylist()))
    per_q: dict[str, list] = {}
    for q, _, _, pid, title, body in rows:
        per_q.setdefault(q, []).append((pid, title, body))
    return [ReaderExample(text[q], tuple(answers[q]), tuple(per_q[q])) for q in sorted(per_q)]


@stage("reader", version="1")
def run_reader(candidates_dir: Path, reader_cfg, work_dir: Path, out_dir: Path, log_metrics: MetricsFn = None) -> dict[str, Any]:
    """Train the FiD reader (helper: :func:`tasks.funnel.reader.train_reader`) on the train
    candidates; checkpoints go to ``work_dir``, the final reader to ``out_dir/reader``."""
    t0 = time.perf_counter()
    examples = reader_examples(CANDIDATES.read(candidates_dir), QUESTIONS.read(candidates_dir))
    cfg = replace(reader_cfg, train=replace(reader_cfg.train, output_dir=str(work_dir)))
    result = train_reader(examples, cfg, log_metrics=log_metrics)
    shutil.copytree(result.model_dir, Path(out_dir) / READER_DIR)
    losses = result.train.losses
    (Path(out_dir) / "losses.json").write_text(json.dumps([round(x, 6) for x in losses]))
    return {"examples": len(examples), "kept": result.report.kept, "steps": result.train.global_step,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "skipped_too_few_passages": result.report.skipped_too_few_passages,
            "seconds": time.perf_counter() - t0}


def evaluate_reader(candidates_dir: Path, reader_dir: Path, device: str = "cpu") -> tuple[pa.Table, dict[str, Any]]:
    """Dev exact match of a saved FiD reader (FunnelRAG Table 3's EM, SQuAD normalisation).

    Each question of ``candidates_dir`` gets a greedy answer from its first ``n_passages``
    candidate passages in pre-ranker order (questions batched, :meth:`tasks.qa.generation.FiDGenerator.answers`) (``n_passages``, ``max_passage_tokens`` and
    ``max_answer_tokens`` from the reader's own training config), as at training time.

    Parameters
    ----------
    candidates_dir : a ``candidates`` stage directory (``candidates`` + ``questions`` tables).
    reader_dir : a directory saved by :func:`tasks.funnel.reader.save_reader`.
    device : where the reader generates (``cpu``, ``cuda[:i]``; fp32 either way).

    Returns
    -------
    (pa.Table, dict)
        ``reader_predictions`` rows (one per question, sorted by question id) and a summary:
        ``questions``, ``em`` in [0, 1], ``seconds``, ``questions_per_s``.

    Raises
    ------
    FileNotFoundError
        ``reader_dir`` is not a saved reader.
    ValueError
        ``candidates_dir`` has no candidate passage.
    """
    model, tok, cfg = load_reader(reader_dir)
    model.to(device)
    cands = CANDIDATES.read(candidates_dir)
    examples = reader_examples(cands, QUESTIONS.read(candidates_dir))
    if not examples:
        raise ValueError(f"{candidates_dir}: no candidate passage to answer from")
    qids = sorted(set(cands["question_id"].to_pylist()))
    if len(qids) != len(examples):
        raise ValueError(f"{candidates_dir}: {len(examples)} reader examples for {len(qids)} questions")
    generate = FiDGenerator("reader", model, tok, GenerationConfig(
        n_passages=cfg.n_passages, max_passage_tokens=cfg.max_passage_tokens, max_answer_tokens=cfg.max_answer_tokens))
    t0 = time.perf_counter()
    rows = []
    size = generate.cfg.batch_size
    for a in progress(range(0, len(examples), size), "reader exact match", unit="batches"):   # both sorted by id
        batch = examples[a:a + size]
        passages = [[(title, text) for _, title, text in ex.passages[: cfg.n_passages]] for ex in batch]
        preds = generate.answers([ex.question for ex in batch], passages)
        rows += [(qid, pred, exact_match(pred, ex.answers), len(ps))
                 for qid, ex, pred, ps in zip(qids[a:a + size], batch, preds, passages)]
    seconds = time.perf_counter() - t0
    table = pa.table({"question_id": [r[0] for r in rows], "prediction": [r[1] for r in rows],
                      "exact_match": [r[2] for r in rows], "n_passages": [r[3] for r in rows]})
    em = sum(r[2] for r in rows) / len(rows)
    return table, {"questions": len(rows), "em": em, "seconds": seconds,
                   "questions_per_s": len(rows) / max(seconds, 1e-9)}


@stage("reader_eval", version="1")
def run_reader_eval(candidates_dir: Path, reader_stage_dir: Path, out_dir: Path, device: str = "cpu") -> dict[str, Any]:
    """:func:`evaluate_reader` of the trained reader on the dev candidates → ``reader_predictions``."""
    table, summary = evaluate_reader(candidates_dir, Path(reader_stage_dir) / READER_DIR, device)
    READER_PREDICTIONS.write(table, out_dir)
    return summary


@stage("attention", version="1")
def run_attention(candidates_dir: Path, reader_dir: Path, cfg: AttentionScoreConfig, run: AttentionRunConfig,
                  out_dir: Path, device: str = "cpu") -> dict[str, Any]:
    """Eq. 3 scores of every candidate passage with the trained reader on ``device`` (fp32) → ``attention_scores``."""
    model, tok, _ = load_reader(Path(reader_dir) / READER_DIR)
    model.to(device)
    cands = CANDIDATES.read(candidates_dir)
    t0 = time.perf_counter()
    scores = score_candidates(cands, QUESTIONS.read(candidates_dir), model, tok, cfg, run)
    seconds = time.perf_counter() - t0
    ATTENTION_SCORES.write(scores, out_dir)
    return {"passages": scores.num_rows, "attention": "post_softmax", "seconds": seconds,
            "passages_per_s": scores.num_rows / max(seconds, 1e-9)}


@stage("labels", version="1")
def run_labels(candidates_dir: Path, attention_dir: Path, cfg: LabelConfig, out_dir: Path) -> dict[str, Any]:
    """Eq. 4 + Eq. 5 → ``labels``; summary counts D+ (by reason) and D−."""
    labels = make_labels(ATTENTION_SCORES.read(attention_dir), CANDIDATES.read(candidates_dir), cfg)
    LABELS.write(labels, out_dir)
    reasons = labels["reason"].to_pylist()
    return {"documents": labels.num_rows, "positives": sum(labels["positive"].to_pylist()),
            **{f"reason_{r}": reasons.count(r) for r in sorted(set(reasons))}}


@stage("distill", version="3")
def run_distill(candidates_dir: Path, labels_dir: Path, preranker: PreRankerConfig, cfg: DistillConfig,
                train_cfg: TrainConfig, work_dir: Path, out_dir: Path, log_metrics: MetricsFn = None,
                index=None, vector_cache: Path | None = None) -> dict[str, Any]:
    """Eq. 6 BPR training of the pre-ranker through the shared loop → ``out_dir/preranker``.

    With ``cfg.unit_scoring="maxp"`` a unit scores as its best passage (the candidates table
    gives each unit's passages). With ``cfg.towers="query"`` only a query tower is trained; the
    frozen document tower's passage vectors are read from ``index`` (a
    :class:`tasks.funnel.embeddings.EmbeddingIndex` of the same document tower, checked here) or,
    without one, computed once before training; with ``unit_scoring="first"`` the frozen tower's
    unit vectors are computed once (read from the vector store under ``vector_cache`` where it
    holds them, :func:`unit_vector_store`).

    Raises
    ------
    tasks.funnel.embeddings.EmbeddingIndexMismatch
        ``index`` was built by another document tower.
    KeyError
        A candidate passage is not in ``index``.
    """
    t0 = time.perf_counter()
    model, tok, trainable, data, hooks, report = distill_setup(candidates_dir, labels_dir, preranker, cfg, index,
                                                               vector_cache)
    result = train(model, data, hooks, replace(train_cfg, output_dir=str(work_dir)), log_metrics=log_metrics)
    save_preranker(model, tok, Path(out_dir) / PRERANKER_DIR)
    return distill_summary(report, trainable, result, cfg, time.perf_counter() - t0)


def distill_summary(report: dict[str, Any], trainable: int, result, cfg: DistillConfig, seconds: float) -> dict[str, Any]:
    """The ``distill`` stage summary of a finished :func:`funnelrag.training.train` ``result``."""
    losses = result.losses
    return {**report, "trainable_parameters": trainable, "steps": result.global_step,
            "unit_scoring": cfg.unit_scoring, "towers": cfg.towers,
            "first_loss": losses[0], "last_loss": losses[-1], "seconds": seconds}


def distill_setup(candidates_dir: Path, labels_dir: Path, preranker: PreRankerConfig, cfg: DistillConfig, index=None,
                  vector_cache: Path | None = None):
    """What :func:`run_distill` trains: ``(model, tokenizer, trainable parameters, PairDataset,
    hooks, example report)`` (also the launched entry point's, :mod:`flows.launched.preranker`).

    Query-side fine-tuning from unit texts (``towers="query"``, ``unit_scoring="first"``): the
    frozen document tower's vector of each labelled unit is computed once (or read from the
    vector store under ``vector_cache``), not at every step; each unit is then a one-vector MaxP
    unit (:class:`tasks.funnel.distill.MaxPBPRHooks`), the same ``S(q, d)``."""
    model, tok = build_preranker(preranker)
    store = unit_vector_store(model, vector_cache)      # the document tower's: before the query tower is split off
    trainable = prepare_for_distillation(model, cfg)
    labels, questions, units = LABELS.read(labels_dir), QUESTIONS.read(candidates_dir), UNITS.read(candidates_dir)
    if cfg.unit_scoring == "first" and cfg.towers == "query":
        labelled = set(labels["unit_id"].to_pylist())
        uids = [u for u in units["unit_id"].to_pylist() if u in labelled]
        text_of = dict(zip(units["unit_id"].to_pylist(), units["text"].to_pylist()))
        model.eval()                                     # the frozen tower's vectors, as at scoring time
        vectors, _ = embed_passages([text_of[u] for u in uids], model, tok, EmbeddingConfig(), store)  # (n_units, dim)
        examples, report = build_examples(labels, questions, units, {u: (i,) for i, u in enumerate(uids)})
        hooks = MaxPBPRHooks(tok, model.cfg.max_length, cfg.score_scale, vectors)
    elif cfg.unit_scoring == "first":
        examples, report = build_examples(labels, questions, units)
        hooks = BPRHooks(model.tokenize, tok, cfg.score_scale)
    else:
        cands = CANDIDATES.read(candidates_dir)
        rows = sorted(zip(cands["unit_id"].to_pylist(), cands["passage_position"].to_pylist(),
                          cands["passage_id"].to_pylist(), cands["title"].to_pylist(), cands["text"].to_pylist()))
        passages: dict[str, dict[str, str]] = {}
        for uid, _, pid, title, text in rows:
            passages.setdefault(uid, {})[pid] = passage_text(title, text)
        vectors = None
        if cfg.towers == "query":
            pids = sorted({pid for ps in passages.values() for pid in ps})
            if index is not None:
                index.check(index.meta.get("corpus_digest"), model_version(model))
                row_of = index.row_of()
                missing = [pid for pid in pids if pid not in row_of]
                if missing:
                    raise KeyError(f"passage {missing[0]!r} is not in the embedding index ({len(missing)} missing)")
                vectors = index.vectors
            else:   # the frozen document tower, once
                text_of = {pid: t for ps in passages.values() for pid, t in ps.items()}
                with Progress("embed candidate passages", total=len(pids), unit="passages") as bar:
                    vectors = embed_texts(model, tok, [text_of[pid] for pid in pids], bar=bar)   # (n_passages, dim)
                row_of = {pid: i for i, pid in enumerate(pids)}
            passages_of = {u: tuple(row_of[pid] for pid in ps) for u, ps in passages.items()}
        else:
            passages_of = {u: tuple(ps.values()) for u, ps in passages.items()}
        examples, report = build_examples(labels, questions, units, passages_of)
        hooks = MaxPBPRHooks(tok, model.cfg.max_length, cfg.score_scale, vectors)
    return model, tok, trainable, PairDataset(examples, cfg), hooks, report


def preranker_recall_per_question(dev_dir: Path, preranker_dir: Path | None, ks: Sequence[int], batch_size: int = 32,
                                  passages: pa.Table | None = None, device: str = "cpu",
                                  vector_cache: Path | None = None) -> dict[int, dict[str, float]]:
    """Per dev question, whether the pre-ranking stage puts an answer unit among its top k:
    ``{k: {question_id: 0.0 | 1.0}}`` for a saved pre-ranker (or, with ``preranker_dir=None``,
    the base one the pool was ranked with); a question without pool rows is a miss.

    With ``passages`` (the corpus ``passages`` table) units are re-scored by MaxP over their
    passages, as a pool built with ``unit_scoring="maxp"`` was ranked; else from their text, a
    bi-encoder's unit vectors read from (and kept in) the vector store under ``vector_cache``
    (:func:`unit_vector_store`): after query-side fine-tuning only the questions are encoded.

    Raises
    ------
    ValueError
        A cut-off is < 1.
    """
    pool = UNIT_POOL.read(dev_dir)
    questions = QUESTIONS.read(dev_dir)
    if preranker_dir is not None:
        model, tok = load_preranker(preranker_dir)
        model.to(device)
        passages_of = None if passages is None else unit_passages(passages, pool["unit_id"].to_pylist())
        store = unit_vector_store(model, vector_cache) if passages_of is None else None
        pool = rerank_pool(pool, UNITS.read(dev_dir), questions, model, tok, batch_size, passages_of, unit_store=store)
    qids = questions["question_id"].to_pylist()
    per_k = per_question_unit_recall(pool, ks, qids)                       # {k: (n_questions,) 0/1}
    return {k: dict(zip(qids, v.tolist())) for k, v in per_k.items()}


def evaluate_preranker(dev_dir: Path, preranker_dir: Path | None, ks: Sequence[int],
                       batch_size: int = 32, passages: pa.Table | None = None, device: str = "cpu",
                       vector_cache: Path | None = None) -> dict[int, float]:
    """AR@k of the pre-ranking stage on the dev unit pool: the means of
    :func:`preranker_recall_per_question` (same arguments)."""
    per_q = preranker_recall_per_question(dev_dir, preranker_dir, ks, batch_size, passages, device, vector_cache)
    return {k: sum(v.values()) / len(v) if v else 0.0 for k, v in per_q.items()}


@stage("eval", version="2")
def run_eval(dev_dir: Path, distill_dir: Path, ks: Sequence[int], out_dir: Path,
             passages: pa.Table | None = None, device: str = "cpu", vector_cache: Path | None = None) -> dict[str, Any]:
    """Answer recall of the pre-ranking stage before (base) and after distillation → ``answer_recall``,
    and per question → ``question_scores`` (metrics ``before_ar_at_<k>``, ``after_ar_at_<k>``)
    (``passages``: MaxP re-ranking; ``vector_cache``: stored unit vectors; :func:`preranker_recall_per_question`)."""
    t0 = time.perf_counter()
    questions = QUESTIONS.read(dev_dir)
    n = questions.num_rows
    rows, scores = [], {}
    for name, directory in (("before", None), ("after", Path(distill_dir) / PRERANKER_DIR)):
        per_q = preranker_recall_per_question(dev_dir, directory, ks, passages=passages, device=device,
                                              vector_cache=vector_cache)
        for k, hits in per_q.items():
            scores[f"{name}_ar_at_{k}"] = hits
            rows.append({"model": name, "k": k, "answer_recall": sum(hits.values()) / n if n else 0.0, "n_questions": n})
    QUESTION_SCORES.write(question_scores_table(scores, dict(zip(questions["question_id"].to_pylist(),
                                                                 questions["question"].to_pylist()))), out_dir)
    ANSWER_RECALL.write(pa.Table.from_pylist(rows, schema=ANSWER_RECALL.schema), out_dir)
    out: dict[str, Any] = {"questions": n, "seconds": time.perf_counter() - t0}
    for r in rows:
        out[f"{r['model']}_ar_at_{r['k']}"] = r["answer_recall"]
    return out
