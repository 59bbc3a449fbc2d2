"""DR-RAG pipeline stages: each reads its inputs from directories, writes contract-checked
artifacts into ``out`` and returns a JSON-able summary (the flow caches and wires them).

collection → embeddings (SM) → rankings (BM25, SM, QDC) ─┐
collection → pairs (Appendix A.1) → train classifier ────┴→ evaluate (QDC, CIS, CFS; Table 5)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from data_contracts import dr_rag as C
from funnelrag.progress import Progress
from funnelrag.stages import stage
from funnelrag.training import TrainConfig, train
from models.dr_rag import ClassifierConfig, DRRAGClassifier, load_classifier, save_classifier
from models.encoders import BiEncoder, EncoderConfig, encode
from tasks.corpus.index import BM25Config
from tasks.dr_rag.classifier import ClassifierHooks, PairProbs, question_scorer, score_triples
from tasks.dr_rag.collection import ParagraphCollection, Question, build_collection, paragraph_text, qrels_table
from tasks.dr_rag.evaluate import (
    EvalConfig,
    compute_rankings,
    rankings_from_table,
    rankings_table,
    select_all,
    selections_table,
    table5,
)
from tasks.dr_rag.hotpotqa import SplitConfig, read_hotpotqa, split_train_dev
from tasks.dr_rag.pairs import PairSamplingConfig, build_pairs, pairs_from_table, pairs_table
from tasks.dr_rag.retrieval import BM25Retriever, SMConfig, SMRetriever, encoder_fn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HotpotQADataConfig:
    """Questions and collection.

    dataset : registered data set name (:mod:`funnelrag.datasets`), used when ``path`` is None.
    path : an explicit HotpotQA file (IRCoT JSON Lines or original JSON).
    max_questions : keep only the first N records (smoke runs and tests); None = all.
    split : deterministic train/dev split by hash of ``(seed, question_id)``.

    The retrieval collection is every paragraph of every kept question (train and dev),
    de-duplicated by ``(title, text)``: one knowledge base, as in the paper.
    """

    dataset: str = "hotpotqa-dev-subsampled"
    path: str | None = None
    max_questions: int | None = None
    split: SplitConfig = SplitConfig()


@dataclass(frozen=True)
class ClassifierTrainConfig(TrainConfig):
    """Classifier training: the shared loop's :class:`funnelrag.training.TrainConfig` (defaults
    for fine-tuning MiniLM) plus

    trainable_layers : fine-tune only the top N transformer layers (None = all); cheaper on CPU.
    score_batch_size : pairs per batch when scoring the dev pairs.
    """

    batch_size: int = 16
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int = 5
    trainable_layers: int | None = None
    score_batch_size: int = 32


@dataclass(frozen=True)
class Collection:
    """A loaded collection stage: paragraphs, questions per split, question texts."""

    paragraphs: ParagraphCollection
    questions: dict[str, list[Question]] = field(default_factory=dict)  # split -> questions

    def texts(self) -> dict[str, str]:
        """``{paragraph_id: "title: text"}``."""
        return {pid: paragraph_text(t, x) for pid, t, x in
                zip(self.paragraphs.ids, self.paragraphs.titles, self.paragraphs.texts)}


# ---------------------------------------------------------------------- collection
@stage("collection", version="1")
def run_collection(path: Path, cfg: HotpotQADataConfig, out: Path) -> dict:
    """Load the questions, split them, build the de-duplicated collection; write
    ``questions.hotpotqa.parquet``, ``qrels.hotpotqa.parquet``, ``paragraphs.hotpotqa.parquet``.

    Raises
    ------
    tasks.dr_rag.hotpotqa.HotpotQAFormatError
        A malformed record (file, line, reason).
    ValueError
        No question left in the dev split (an empty train split is allowed here: evaluating a
        registered classifier on a file of one's own trains nothing; training checks it).
    """
    data = read_hotpotqa(path)
    records = list(data.records)[:cfg.max_questions] if cfg.max_questions else list(data.records)
    train, dev = split_train_dev(records, cfg.split)
    if not dev:
        raise ValueError(f"{path}: split {cfg.split} of {len(records)} questions leaves no dev question "
                         f"(train={len(train)})")
    split_of = {r.question_id: "train" for r in train} | {r.question_id: "dev" for r in dev}
    coll, questions = build_collection(records)
    C.HOTPOTQA_QUESTIONS.write(pa.table({
        "question_id": [r.question_id for r in records], "split": [split_of[r.question_id] for r in records],
        "question": [r.question for r in records],
        "answers": pa.array([list(r.answers) for r in records], pa.list_(pa.string()))}), out)
    C.QRELS.write(qrels_table(questions, split_of), out)
    C.PARAGRAPHS.write(coll.to_table(), out)
    return {"questions": len(records), "train_questions": len(train), "dev_questions": len(dev),
            "paragraphs": len(coll), "paragraph_mentions": sum(len(r.paragraphs) for r in records)}


def read_collection(directory: Path) -> Collection:
    """Load a collection stage written by :func:`run_collection` (questions in file order)."""
    paragraphs = ParagraphCollection.from_table(C.PARAGRAPHS.read(directory))
    qt = C.HOTPOTQA_QUESTIONS.read(directory)
    qrels = C.QRELS.read(directory)
    cands: dict[str, list[str]] = {}
    sup: dict[str, list[str]] = {}
    for qid, pid, is_sup in zip(*(qrels.column(c).to_pylist() for c in ("question_id", "paragraph_id", "is_supporting"))):
        cands.setdefault(qid, []).append(pid)
        if is_sup:
            sup.setdefault(qid, []).append(pid)
    by_split: dict[str, list[Question]] = {"train": [], "dev": []}
    for qid, split, text in zip(*(qt.column(c).to_pylist() for c in ("question_id", "split", "question"))):
        by_split.setdefault(split, []).append(Question(qid, text, tuple(sup.get(qid, ())), tuple(cands.get(qid, ()))))
    return Collection(paragraphs, by_split)


# ---------------------------------------------------------------------- SM embeddings
@stage("embeddings", version="1")
def run_embeddings(collection_dir: Path, cfg: SMConfig, out: Path) -> dict:
    """Encode every paragraph with the bi-encoder (``paragraph_embeddings.sm.parquet``)."""
    coll = ParagraphCollection.from_table(C.PARAGRAPHS.read(collection_dir))
    model, tok = BiEncoder.from_pretrained(EncoderConfig(name_or_path=cfg.encoder, max_length=cfg.max_length))
    t0 = time.perf_counter()
    with Progress("embed paragraphs", total=len(coll), unit="paragraphs") as bar:
        emb = encode(model, tok, coll.retrieval_texts(), batch_size=cfg.batch_size, bar=bar)  # (n_docs, dim)
    seconds = time.perf_counter() - t0
    C.EMBEDDINGS.write(pa.table({"paragraph_id": list(coll.ids),
                                 "embedding": pa.array(list(emb.numpy()), pa.list_(pa.float32()))}), out)
    return {"paragraphs": len(coll), "dim": int(emb.shape[1]), "seconds": seconds,
            "paragraphs_per_s": len(coll) / max(seconds, 1e-9)}


def load_sm_retriever(collection_dir: Path, embeddings_dir: Path, cfg: SMConfig) -> SMRetriever:
    """An :class:`SMRetriever` over the stored embeddings with the same encoder for queries.

    Raises
    ------
    ValueError
        The embeddings do not cover exactly the collection's paragraphs (in order).
    """
    ids = C.PARAGRAPHS.read(collection_dir, columns=["paragraph_id"]).column("paragraph_id").to_pylist()
    table = C.EMBEDDINGS.read(embeddings_dir)
    if table.column("paragraph_id").to_pylist() != ids:
        raise ValueError(f"{embeddings_dir}: embeddings do not match the paragraphs of {collection_dir}")
    emb = torch.from_numpy(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32))
    model, tok = BiEncoder.from_pretrained(EncoderConfig(name_or_path=cfg.encoder, max_length=cfg.max_length))
    return SMRetriever(emb, ids, encoder_fn(model, tok, cfg.batch_size))


# ---------------------------------------------------------------------- rankings
@stage("rankings", version="1")
def run_rankings(collection_dir: Path, embeddings_dir: Path, sm: SMConfig, bm25: BM25Config,
                 cfg: EvalConfig, out: Path) -> dict:
    """First-stage BM25 and SM rankings of the dev questions and the base retriever's
    rankings of ``q ⊕ d*`` (QDC, Eq. 1); ``rankings.dev.parquet``."""
    coll = read_collection(collection_dir)
    retrievers = {"bm25": BM25Retriever.build(coll.paragraphs, bm25),
                  "sm": load_sm_retriever(collection_dir, embeddings_dir, sm)}
    t0 = time.perf_counter()
    rankings = compute_rankings(coll.questions["dev"], coll.paragraphs, retrievers, cfg)
    seconds = time.perf_counter() - t0
    table = C.RANKINGS.write(rankings_table(rankings), out)
    n_second = sum(len(v) for v in rankings.second.values())
    return {"questions": len(coll.questions["dev"]), "qdc_queries": n_second, "seconds": seconds,
            "rows": pq.read_metadata(table).num_rows}


# ---------------------------------------------------------------------- classifier pairs and training
@stage("pairs", version="2")
def run_pairs(collection_dir: Path, cfg: PairSamplingConfig, out: Path) -> dict:
    """Balanced pairs (Appendix A.1) of the train questions (training) and of the dev questions
    (the gate metric); ``classifier_pairs.parquet``."""
    coll = read_collection(collection_dir)
    train, rep_train = build_pairs(coll.questions["train"], cfg)
    dev, rep_dev = build_pairs(coll.questions["dev"], cfg)
    C.CLASSIFIER_PAIRS.write(pa.concat_tables([pairs_table(train, "train"), pairs_table(dev, "dev")]), out)
    return {"train": rep_train, "dev": rep_dev}


def pair_metrics(probs: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    """Accuracy at ``threshold`` and ROC AUC (Mann–Whitney, ties counted half) of pair scores."""
    from scipy.stats import rankdata  # noqa: PLC0415  (heavy: scipy.stats, only for the rankings)

    acc = float(((probs >= threshold).astype(int) == labels).mean()) if len(labels) else float("nan")
    n_pos, n_neg = int(labels.sum()), int((1 - labels).sum())
    if n_pos == 0 or n_neg == 0:
        return {"accuracy": acc, "auc": float("nan")}
    ranks = rankdata(probs)
    auc = (ranks[labels == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {"accuracy": acc, "auc": float(auc)}


def run_train(collection_dir: Path, pairs_dir: Path, clf: ClassifierConfig, settings: ClassifierTrainConfig,
              threshold: float, out: Path, log_metrics: Callable[[dict, int], None] | None = None) -> dict:
    """Fine-tune C(q, d1, d2) on the train pairs with the shared accelerate loop, score the dev
    pairs, and save the model to ``out / "classifier"``."""
    coll = read_collection(collection_dir)
    table = C.CLASSIFIER_PAIRS.read(pairs_dir)
    train_pairs, dev_pairs = pairs_from_table(table, "train"), pairs_from_table(table, "dev")
    questions = {q.question_id: q.question for qs in coll.questions.values() for q in qs}
    texts = coll.texts()
    with torch.random.fork_rng():  # seed the new classification head without touching global RNG state
        torch.manual_seed(settings.seed)
        model, tok = DRRAGClassifier.from_pretrained(clf)
    n_trainable = (model.freeze_lower_layers(settings.trainable_layers) if settings.trainable_layers is not None
                   else sum(p.numel() for p in model.parameters()))
    t0 = time.perf_counter()
    result = train(model, train_pairs, ClassifierHooks(tok, clf, questions, texts),
                   replace(settings, output_dir=str(out / "run")), log_metrics=log_metrics, resume=False)
    train_seconds = time.perf_counter() - t0
    model = model.cpu()
    save_classifier(model, tok, out / "classifier")
    t0 = time.perf_counter()
    triples = [(questions[p.question_id], texts[p.d1_id], texts[p.d2_id]) for p in dev_pairs]
    probs = score_triples(model, tok, triples, settings.score_batch_size) if triples else np.zeros(0, np.float32)
    metrics = pair_metrics(probs, np.array([p.label for p in dev_pairs]), threshold)
    return {"train_pairs": len(train_pairs), "dev_pairs": len(dev_pairs), "steps": result.global_step,
            "final_loss": result.losses[-1], "trainable_parameters": n_trainable,
            "train_seconds": train_seconds, "dev_score_seconds": time.perf_counter() - t0,
            "dev_pair_accuracy": metrics["accuracy"], "dev_pair_auc": metrics["auc"]}


# ---------------------------------------------------------------------- evaluation (Table 5)
def run_evaluate(collection_dir: Path, rankings_dir: Path, classifier_dir: Path | None, cfg: EvalConfig,
                 out: Path, score_batch_size: int = 32) -> dict:
    """BM25, SM, QDC, CIS and CFS on the dev questions; ``selections.dev.parquet`` and
    ``table5.dev.parquet``. Without ``classifier_dir`` only BM25, SM and QDC are evaluated."""
    coll = read_collection(collection_dir)
    dev = coll.questions["dev"]
    rankings = rankings_from_table(C.RANKINGS.read(rankings_dir), cfg.base)
    probs_for = None
    scored: list[PairProbs] = []
    if classifier_dir is not None:
        model, tok = load_classifier(classifier_dir)
        texts = coll.texts()

        def probs_for(q: Question) -> PairProbs:
            probs = PairProbs(question_scorer(model, tok, q.question, texts, score_batch_size))
            scored.append(probs)
            return probs
    t0 = time.perf_counter()
    selections = select_all(dev, rankings, probs_for, cfg)
    seconds = time.perf_counter() - t0
    rows = table5(selections, dev)
    C.SELECTIONS.write(selections_table(selections, dev), out)
    C.TABLE5.write(pa.table({c: [r[c] for r in rows] for c in ("method", "k", "recall", "all_supporting",
                                                                 "mean_docs", "n_questions")}), out)
    return {"rows": rows, "seconds": seconds, "classifier_calls": sum(len(p) for p in scored)}
