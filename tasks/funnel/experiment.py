"""The distillation experiment in one command: does L2G distillation help, and is the post-ranker any good?

Pure stage functions of :mod:`tasks.funnel.stages` chained under the content-keyed
:class:`funnelrag.store.StageCache` (no Prefect: a killed run resumes from the last complete stage,
the reader from its last checkpoint):

1. NQ-open dev questions, hashed split (``split``): the ``train`` part trains, the ``dev`` part is
   held out (never NQ-open test).
2. Funnel candidates of both parts (BM25 top-K clusters → ~1K-token units → pre-ranker top-N units
   → passages), one candidate pool and one pre-ranker input length for every row below.
3. The FiD reader (``reader.fid.kind``) trained on the train questions whose reader input (the top
   ``n_passages`` passages in pre-ranker order) contains an answer.
4. Eq. 3 scores of the distillation questions' candidates; labels with answer documents only
   (𝒦 = 0) and with L2G labels (Eqs. 4–5, 𝒦 = ``l2g_top_k``); one BPR run (Eq. 6) per label set.
5. Held-out evaluation (:mod:`tasks.funnel.experiment_eval`): pre-ranker AR@k before / after each
   distillation with bootstrap 95% intervals (and paired intervals of the differences), FiD Eq. 3
   post-ranking vs pre-ranker passage order over the same N units, and reader EM.

Run: ``python -m tasks.funnel.experiment --config configs/distillation_experiment_cpu.yaml``.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch
import yaml

from data_contracts.base import sha256_file
from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, LABELS, QUESTIONS, UNIT_POOL, UNITS
from funnelrag import datasets
from funnelrag.config import deep_merge, parse_overrides
from funnelrag.store import StageCache, StageResult
from funnelrag.training import TrainConfig, checkpoint_dirs
from funnelrag.workspace import Workspace
from models.fid_bert2bert import Bert2BertFiDConfig
from models.preranker import PreRankerConfig, build_preranker, load_preranker
from models.readers import reader_config_from_dict
from tasks.corpus.published import open_corpus
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.tokenize import load_token_counter
from tasks.funnel import stages as S
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig
from tasks.funnel.candidates import CandidatesConfig, rerank_pool, unit_passages
from tasks.funnel.distill import DistillConfig
from tasks.funnel.embeddings import find_embedding_index, model_version, passage_text
from tasks.funnel.experiment_data import answerable, bm25_passage_candidates, first_questions, subset
from tasks.funnel.experiment_eval import per_question_unit_recall
from tasks.funnel.experiment_report import distillation_report, postranker_report, reader_curve_report
from tasks.funnel.experiment_validation import ValidationConfig, validation_curve, validation_table
from tasks.funnel.labels import LabelConfig, make_labels
from tasks.funnel.reader import ReaderTrainConfig, reader_from_checkpoint
from tasks.funnel.unit_scoring import maxp_pool_scores, stored_maxp_pool_scores
from tasks.qa.questions import QuestionsConfig

log = logging.getLogger(__name__)

VERSION = "1"  # bump when a step's output bytes change for the same inputs


@dataclass(frozen=True)
class ExperimentConfig:
    """Sizes of the experiment (defaults: the 2-core CPU run reported in the README).

    n_train : train-split questions run through the funnel (the distillation questions).
    n_reader : train-split questions whose flat BM25 passages train the reader (None = all);
        those with an answer passage among their BM25 top ``reader_search_k`` are kept
        (:func:`bm25_passage_candidates`).
    n_heldout : held-out (dev-split) questions, the first ones in question-id order.
    n_distill : train questions (first in id order) scored by Eq. 3 and used for BPR.
    n_postrank : held-out questions (first in id order among those whose N units hold an answer)
        on which Eq. 3 post-ranking is compared with pre-ranker passage order.
    l2g_top_k : 𝒦 of the L2G labels (Eq. 5); the answer-only row uses 𝒦 = 0.
    n_bootstrap, bootstrap_seed : bootstrap resamples of the held-out questions.
    train_vectors : ``"computed"`` — the train split runs the same funnel as the held-out one;
        ``"stored"`` — its pre-ranking reads the passage vectors of the published embedding index
        (``funnelrag embed-corpus``) of ``train_preranker`` with ``train_candidates`` (MaxP unit
        scoring): ~15 ms per question instead of ~1.75 s, so every train-split question can give
        distillation pairs. The held-out pool, and every row of the table, are unaffected.
    train_candidates, train_preranker : funnel sizes and pre-ranker of the train split (None: the
        held-out ones).
    distill_answerable : distil on train questions whose top-N units hold an answer only (the
        questions that give answer-only pairs; L2G's attention-only questions are then left out).
    validation : the search for BPR's learning rate and epochs on a validation part of the
        train split (:mod:`tasks.funnel.experiment_validation`); None: no search.
    distill_select : both distillations train with the learning rate and epochs chosen by that
        search (answer-only labels, validation AR@1) instead of ``distill_train.lr`` and
        ``distill.epochs``.
    heldout_vectors : ``"computed"`` or ``"stored"``: the held-out pool's pre-ranking (and the
        re-ranking of that pool by each distilled pre-ranker) reads the passage vectors of the
        published embedding index, as :attr:`train_vectors` does for the train split
        (``candidates.unit_scoring`` must be ``"maxp"``). A distilled pre-ranker whose document
        tower differs from the index's (``distill.towers="both"``) is scored on the fly.
    n_reader_dev : held-out questions (first in id order) whose flat BM25 reader input (built like
        the reader's training input) measures reader EM per checkpoint.
    """

    split: QuestionsConfig = QuestionsConfig(dev_fraction=0.2, seed=0)
    n_train: int | None = 300
    n_reader: int | None = None
    reader_search_k: int = 20
    n_heldout: int | None = 400
    n_distill: int = 300
    n_postrank: int = 100
    candidates: CandidatesConfig = CandidatesConfig(n_clusters=3, n_units=8, batch_size=64)
    preranker: PreRankerConfig = PreRankerConfig(kind="bi", max_length=128)
    reader: ReaderTrainConfig = ReaderTrainConfig(
        fid=Bert2BertFiDConfig(freeze_encoder=True, max_answer_tokens=16),
        train=TrainConfig(output_dir="", epochs=6, batch_size=8, lr=3e-4, warmup_steps=30, log_every=10,
                          checkpoint_every=50),
        n_passages=4, max_passage_tokens=128, max_answer_tokens=16)
    attention: AttentionScoreConfig = AttentionScoreConfig()
    attention_run: AttentionRunConfig = AttentionRunConfig(max_passage_tokens=128, batch_size=1)
    l2g_alpha: float = 0.75
    l2g_top_k: int = 1
    distill: DistillConfig = DistillConfig(epochs=1, max_pairs_per_question=4, score_scale=20.0)
    distill_train: TrainConfig = TrainConfig(output_dir="", batch_size=8, lr=2e-5, warmup_steps=10, log_every=10,
                                             checkpoint_every=50)
    recall_at: tuple[int, ...] = (1, 2, 3, 4)
    n_bootstrap: int = 1000
    bootstrap_seed: int = 0
    train_vectors: str = "computed"
    train_candidates: CandidatesConfig | None = None
    train_preranker: PreRankerConfig | None = None
    n_reader_dev: int | None = 400
    distill_answerable: bool = False
    heldout_vectors: str = "computed"
    validation: ValidationConfig | None = None
    distill_select: bool = False

    def __post_init__(self) -> None:
        if self.distill_select and self.validation is None:
            raise ValueError("distill_select needs a validation search (validation: {...})")
        for name in ("train_vectors", "heldout_vectors"):
            if getattr(self, name) not in ("computed", "stored"):
                raise ValueError(f"{name} must be 'computed' or 'stored', got {getattr(self, name)!r}")
        if self.heldout_vectors == "stored" and self.candidates.unit_scoring != "maxp":
            raise ValueError("heldout_vectors='stored' reads passage vectors: candidates.unit_scoring must be 'maxp'")
        if self.train_vectors == "stored" and (self.train_candidates or self.candidates).unit_scoring != "maxp":
            raise ValueError("train_vectors='stored' reads passage vectors: train_candidates.unit_scoring must be 'maxp'")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExperimentConfig":
        """Nested dict (e.g. YAML) → config; unknown keys raise ``TypeError``."""
        d = dict(d)
        sub = {"split": QuestionsConfig, "candidates": CandidatesConfig, "preranker": PreRankerConfig,
               "train_candidates": CandidatesConfig, "train_preranker": PreRankerConfig, "attention": AttentionScoreConfig, "attention_run": AttentionRunConfig, "distill": DistillConfig}
        out: dict[str, Any] = {k: sub[k](**v) for k, v in d.items() if k in sub}
        if "distill_train" in d:
            out["distill_train"] = TrainConfig(**{"output_dir": "", **d["distill_train"]})
        if "reader" in d:
            r = dict(d["reader"])
            base = cls.reader
            fid = reader_config_from_dict({**asdict(base.fid), **r.pop("fid", {})})
            train = replace(base.train, **r.pop("train", {}))
            out["reader"] = replace(base, fid=fid, train=train, **r)
        if "recall_at" in d:
            out["recall_at"] = tuple(d["recall_at"])
        if d.get("validation") is not None:
            v = dict(d["validation"])
            out["validation"] = ValidationConfig(**{**v, **({"lrs": tuple(v["lrs"])} if "lrs" in v else {})})
        rest = {k: v for k, v in d.items() if k not in out and k not in ("distill_train", "reader", "recall_at")}
        return cls(**out, **rest)


def config_json(cfg: ExperimentConfig) -> str:
    return json.dumps(asdict(cfg), indent=1, sort_keys=True, default=str)


class Experiment:
    """The experiment's steps over one workspace; each step is cached by content key.

    Parameters
    ----------
    cfg : ExperimentConfig
    home : funnelrag workspace with a published ``corpus`` version.
    questions_file : NQ-open dev TSV (e.g. ``datasets.resolve("nq-open-dev", mirror)``).
    mirror : data mirror (the T5 tokenizer of the corpus' token counter).
    """

    def __init__(self, cfg: ExperimentConfig, home: Path, questions_file: Path, mirror: Path | None,
                 corpus: str = "wikispeedia"):
        self.cfg, self.mirror, self.questions_file = cfg, mirror, Path(questions_file)
        self.corpus_name = corpus
        self.keys: dict[str, str] = {}   # step name -> its cache key (run directories are named by it)
        self.ws = Workspace(home)
        self.corpus = open_corpus(self.ws, corpus)
        self.cache = StageCache(self.ws.cache_dir / "experiment")
        self._indexes: dict[str, Any] = {}

    def embedding_index(self, model):
        """The published embedding index of ``model``'s document tower over this corpus (loaded
        once per document tower), or None when none is published.

        Raises
        ------
        tasks.funnel.embeddings.EmbeddingIndexMismatch
            The store's current index was built from another corpus version.
        """
        version = model_version(model)
        if version not in self._indexes:
            self._indexes[version] = find_embedding_index(
                self.ws.home / "stores", self.corpus_name,
                self.corpus.manifest.get("content_digest", self.corpus.digest), model)
        return self._indexes[version]

    def step(self, name: str, config: Any, inputs: dict[str, str], build) -> StageResult:
        key = StageCache.key(name, VERSION, config, inputs)
        self.keys[name] = key
        result = self.cache.run(name, key, lambda out: build(out, key))
        log.info("step %-16s %s %s", name, "cache hit" if result.cache_hit else "built", key[:12])
        return result

    def questions(self) -> StageResult:
        return self.step("questions", self.cfg.split, {"file": sha256_file(self.questions_file)},
                         lambda out, _: S.run_questions([self.questions_file], self.cfg.split, out))

    def candidates(self, questions: StageResult, split: str) -> StageResult:
        """Funnel candidates of one split (``train``: :attr:`ExperimentConfig.train_vectors`)."""
        c = self.cfg
        limit = c.n_train if split == "train" else c.n_heldout
        stored = (c.train_vectors if split == "train" else c.heldout_vectors) == "stored"
        cand_cfg = (c.train_candidates or c.candidates) if split == "train" else c.candidates
        pre_cfg = (c.train_preranker or c.preranker) if split == "train" else c.preranker
        seg_cfg = SegmentConfig(**self.corpus.manifest["config"]["segment"])
        key_cfg = {"split": split, "limit": limit, "candidates": cand_cfg, "preranker": pre_cfg, "segment": seg_cfg,
                   **({"vectors": "stored"} if stored else {})}
        inputs = {"questions": questions.files["questions.parquet"], "corpus": self.corpus.digest}
        extra = {"stores_dir": self.ws.home / "stores", "corpus_name": self.corpus_name} if stored else {}
        return self.step(f"candidates_{split}", key_cfg, inputs, lambda out, _: S.run_candidates(
            questions.path, split, limit, self.corpus, seg_cfg, load_token_counter(seg_cfg.tokenizer, self.mirror),
            pre_cfg, cand_cfg, out, **extra))

    def subset(self, name: str, stage: StageResult, ids: set[str]) -> StageResult:
        inputs = {"stage": stage.digest, "ids": json.dumps(sorted(ids))}
        return self.step(name, {}, inputs, lambda out, _: subset(stage.path, ids, out))

    def reader_data(self, questions: StageResult, split: str = "train") -> StageResult:
        """Flat-BM25 reader input (:func:`bm25_passage_candidates`) of the train-split questions
        (``n_reader``), or of the first ``n_reader_dev`` held-out ones (``split="dev"``)."""
        r, c = self.cfg.reader, self.cfg
        limit = c.n_reader if split == "train" else c.n_reader_dev

        def build(out: Path, _key: str) -> dict[str, Any]:
            qs = S.select_questions(QUESTIONS.read(questions.path), split, limit)
            cands = bm25_passage_candidates(self.corpus, qs, r.n_passages, c.reader_search_k)
            keep = pa.array(sorted(set(cands["question_id"].to_pylist())), pa.string())
            CANDIDATES.write(cands, out)
            QUESTIONS.write(qs.filter(pc.is_in(qs["question_id"], keep)), out)
            return {"questions": qs.num_rows, "with_answer": len(keep)}

        inputs = {"questions": questions.files["questions.parquet"], "corpus": self.corpus.digest}
        key_cfg = {"n_reader": limit, "n_passages": r.n_passages, "search_k": c.reader_search_k,
                   **({"split": split} if split != "train" else {})}
        return self.step("reader_data" if split == "train" else "reader_dev_data", key_cfg, inputs, build)

    def reader(self, questions: StageResult) -> tuple[StageResult, StageResult]:
        """Reader data (:meth:`reader_data`) and the trained reader (checkpoints in its run directory)."""
        r = self.cfg.reader
        data = self.reader_data(questions)
        key_cfg = asdict(r)
        return data, self.step("reader", key_cfg, {"data": data.digest}, lambda out, key: S.run_reader(
            data.path, r, self.reader_run_dir(key), out))

    def reader_run_dir(self, key: str) -> Path:
        return self.ws.run_dir("experiment-reader", key[:16])

    def reader_curve(self, questions: StageResult, reader: StageResult) -> StageResult:
        """Held-out EM of every kept checkpoint of the reader run (:meth:`reader_data`, ``dev``):
        the learning curve, ``curve.json`` = ``[{step, epoch, em, per_question}]``."""
        dev = self.reader_data(questions, "dev")
        run_dir = self.reader_run_dir(self.keys["reader"])
        r = self.cfg.reader

        def build(out: Path, _key: str) -> dict[str, Any]:
            kept = QUESTIONS.read(self.reader_data(questions).path).num_rows
            steps_per_epoch = -(-kept // r.train.batch_size)
            curve = []
            for ckpt in checkpoint_dirs(run_dir):
                step = int(ckpt.name.split("_")[1])
                with tempfile.TemporaryDirectory(dir=out) as tmp:
                    reader_dir = reader_from_checkpoint(ckpt, r, Path(tmp) / "reader")
                    preds, summary = S.evaluate_reader(dev.path, reader_dir)
                curve.append({"step": step, "epoch": round(step / steps_per_epoch, 2), "em": summary["em"],
                              "per_question": [int(x) for x in preds["exact_match"].to_pylist()]})
                log.info("reader checkpoint step %d: held-out EM %.3f", step, summary["em"])
            (out / "curve.json").write_text(json.dumps(curve))
            return {"checkpoints": len(curve), "questions": QUESTIONS.read(dev.path).num_rows,
                    "em": {c["step"]: c["em"] for c in curve}}

        return self.step("reader_curve", {}, {"reader": reader.digest, "dev": dev.digest}, build)

    def reader_eval(self, heldout: StageResult, reader: StageResult) -> StageResult:
        """Reader EM on the held-out questions whose reader input holds an answer."""
        data = self.subset("reader_eval_data", heldout, answerable(heldout.path, self.cfg.reader.n_passages))
        return self.step("reader_eval", {}, {"data": data.digest, "reader": reader.digest},
                         lambda out, _: S.run_reader_eval(data.path, reader.path, out))

    def attention(self, name: str, data: StageResult, reader: StageResult) -> StageResult:
        key_cfg = {"score": self.cfg.attention, "run": self.cfg.attention_run}
        return self.step(name, key_cfg, {"data": data.digest, "reader": reader.digest}, lambda out, _: S.run_attention(
            data.path, reader.path, self.cfg.attention, self.cfg.attention_run, out))

    def distill_data(self, train: StageResult) -> StageResult:
        """The first ``n_distill`` train questions (id order), or with ``distill_answerable`` the
        first ``n_distill`` of those whose top-N units hold an answer."""
        if self.cfg.distill_answerable:
            ids = set(sorted(answerable(train.path, None))[: self.cfg.n_distill])
            return self.subset("distill_data_answerable", train, ids)
        return self.subset("distill_data", train, first_questions(train.path, self.cfg.n_distill))

    def labels(self, name: str, data: StageResult, attention: StageResult | None) -> StageResult:
        """L2G labels from Eq. 3 scores, or (``attention=None``) answer-only labels (𝒦 = 0)."""
        if attention is not None:
            cfg = LabelConfig(alpha=self.cfg.l2g_alpha, top_k=self.cfg.l2g_top_k)
            return self.step(name, cfg, {"data": data.digest, "attention": attention.digest},
                             lambda out, _: S.run_labels(data.path, attention.path, cfg, out))
        cfg = LabelConfig(alpha=self.cfg.l2g_alpha, top_k=0)

        def build(out: Path, _key: str) -> dict[str, Any]:
            cands = CANDIDATES.read(data.path)   # 𝒦 = 0: D+ = answer units, attention scores unused
            zero = pa.table({"question_id": cands["question_id"], "unit_id": cands["unit_id"],
                             "passage_id": cands["passage_id"], "score": pa.array([0.0] * cands.num_rows, pa.float32()),
                             "attention": pa.array(["none"] * cands.num_rows)})
            labels = make_labels(zero.cast(ATTENTION_SCORES.schema), cands, cfg)
            LABELS.write(labels, out)
            return {"documents": labels.num_rows, "positives": sum(labels["positive"].to_pylist())}

        return self.step(name, cfg, {"data": data.digest}, build)

    def distill_index(self):
        """The stored vectors query-side MaxP distillation reads (None for other settings or
        when no index is published: then they are computed)."""
        c = self.cfg
        if c.distill.unit_scoring == "maxp" and c.distill.towers == "query" and c.preranker.kind == "bi":
            return self.embedding_index(build_preranker(c.preranker)[0])
        return None

    def distill_settings(self, selected: StageResult | None) -> tuple[DistillConfig, TrainConfig]:
        """``distill`` and ``distill_train``, with the validation search's learning rate and
        epochs when ``selected`` (the ``validation`` step) is given."""
        c = self.cfg
        if selected is None:
            return c.distill, c.distill_train
        best = json.loads((selected.path / "validation.json").read_text())["best"]
        return replace(c.distill, epochs=max(1, round(best["epochs"]))), replace(c.distill_train, lr=best["lr"])

    def validation(self, train: StageResult, data: StageResult, labels: StageResult) -> StageResult:
        """The BPR validation search (:func:`tasks.funnel.experiment_validation.validation_curve`)
        → ``validation.json``."""
        c = self.cfg
        key_cfg = {"validation": c.validation, "preranker": c.preranker, "distill": c.distill,
                   "train": c.distill_train, "vectors": c.heldout_vectors, "ks": sorted({*c.recall_at, c.candidates.n_units})}

        def build(out: Path, key: str) -> dict[str, Any]:
            curve = validation_curve(train.path, data.path, labels.path, self.corpus.passages, c.preranker, c.distill,
                                     c.distill_train, c.validation, self.ws.run_dir("experiment-validation", key[:16]),
                                     key_cfg["ks"], self.distill_index())
            (out / "validation.json").write_text(json.dumps(curve, indent=1))
            return {"best": curve["best"], "validation_questions": curve["validation_questions"]}

        inputs = {"train": train.digest, "data": data.digest, "labels": labels.digest}
        return self.step("validation", key_cfg, inputs, build)

    def distill(self, name: str, data: StageResult, labels: StageResult,
                selected: StageResult | None = None) -> StageResult:
        """BPR (Eq. 6) of ``preranker`` on ``labels`` (with the validation search's choice when
        ``selected``); query-side MaxP distillation reads the frozen document tower's stored
        passage vectors when they are published."""
        c = self.cfg
        d_cfg, t_cfg = self.distill_settings(selected)
        key_cfg = {"preranker": c.preranker, "distill": d_cfg, "train": t_cfg}

        def build(out: Path, key: str) -> dict[str, Any]:
            return S.run_distill(data.path, labels.path, c.preranker, d_cfg, t_cfg,
                                 self.ws.run_dir(f"experiment-{name}", key[:16]), out, index=self.distill_index())

        return self.step(name, key_cfg, {"data": data.digest, "labels": labels.digest}, build)

    def prerank_passage_scores(self, name: str, data: StageResult) -> StageResult:
        """The pre-ranker's own score ``f(q, p)`` of every candidate passage of ``data`` (MaxP
        funnels order a unit's passages by it): ``passage_scores.json`` = ``[[question_id,
        passage_id, score], ...]``; stored vectors when published, else computed."""
        c = self.cfg

        def build(out: Path, _key: str) -> dict[str, Any]:
            model, tok = build_preranker(c.preranker)
            cands, questions = CANDIDATES.read(data.path), QUESTIONS.read(data.path)
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
            index = self.embedding_index(model) if c.heldout_vectors == "stored" else None
            texts = questions["question"].to_pylist()
            if index is not None:
                _, scores = stored_maxp_pool_scores(model, tok, texts, rows, passages_of, index, c.candidates.batch_size)
            else:
                _, scores = maxp_pool_scores(model, tok, texts, rows, passages_of, c.candidates.batch_size)
            triples = sorted([qids[qi], pid, float(v)] for (qi, pid), v in scores.items())
            (out / "passage_scores.json").write_text(json.dumps(triples))
            return {"passages": len(triples), "stored_vectors": index is not None}

        return self.step(name, {"preranker": c.preranker, "vectors": c.heldout_vectors}, {"data": data.digest}, build)

    def preranker_recall(self, name: str, heldout: StageResult, distilled: StageResult | None) -> StageResult:
        """Per-question AR@k of the held-out unit pool, re-ranked by a distilled pre-ranker
        (``distilled=None``: the pool's own pre-ranker order, i.e. before distillation)."""
        ks = sorted({*self.cfg.recall_at, self.cfg.candidates.n_units})

        def build(out: Path, _key: str) -> dict[str, Any]:
            pool, questions = UNIT_POOL.read(heldout.path), QUESTIONS.read(heldout.path)
            if distilled is not None:
                model, tok = load_preranker(distilled.path / S.PRERANKER_DIR)
                passages_of = index = None
                if self.cfg.candidates.unit_scoring == "maxp":     # rank units as the pool was ranked
                    passages_of = unit_passages(self.corpus.passages, pool["unit_id"].to_pylist())
                    if self.cfg.heldout_vectors == "stored" and model.kind == "bi":
                        index = self.embedding_index(model)
                pool = rerank_pool(pool, UNITS.read(heldout.path), questions, model, tok,
                                   self.cfg.candidates.batch_size, passages_of, index)
            qids = sorted(questions["question_id"].to_pylist())
            per_q = per_question_unit_recall(pool, ks, qids)
            (out / "recall.json").write_text(json.dumps({"question_ids": qids, **{str(k): v.tolist() for k, v in per_q.items()}}))
            return {str(k): float(v.mean()) for k, v in per_q.items()}

        inputs = {"heldout": heldout.digest, "distilled": distilled.digest if distilled else "base"}
        return self.step(name, {"ks": ks}, inputs, build)


PARTS = ("candidates", "validation", "reader", "answer_only", "l2g", "postrank", "report")


def run(exp: Experiment, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Run the requested parts (each reuses every cached step) and, with ``"report"``, return
    the tables (text) and figures (JSON-ready) of the experiment."""
    c = exp.cfg
    q = exp.questions()
    done: dict[str, StageResult] = {}
    if {"candidates", "answer_only", "postrank", "report"} & set(parts):
        heldout = exp.candidates(q, "dev")
    if {"candidates", "answer_only", "l2g", "validation", "report"} & set(parts):
        train = exp.candidates(q, "train")
        data = exp.distill_data(train)
    selected = None
    if c.validation is not None and ({"validation", "report"} & set(parts) or
                                     (c.distill_select and {"answer_only", "l2g"} & set(parts))):
        done["labels_answer_only"] = exp.labels("labels_answer_only", data, None)
        done["validation"] = exp.validation(train, data, done["labels_answer_only"])
        selected = done["validation"] if c.distill_select else None
    if {"answer_only", "report"} & set(parts):
        if "labels_answer_only" not in done:
            done["labels_answer_only"] = exp.labels("labels_answer_only", data, None)
        done["answer_only"] = exp.distill("distill_answer_only", data, done["labels_answer_only"], selected)
    if {"reader", "l2g", "postrank", "report"} & set(parts):
        reader_data, done["reader"] = exp.reader(q)
    if {"reader", "report"} & set(parts):
        done["reader_curve"] = exp.reader_curve(q, done["reader"])
    if {"l2g", "report"} & set(parts):
        att = exp.attention("attention_distill", data, done["reader"])
        done["l2g"] = exp.distill("distill_l2g", data, exp.labels("labels_l2g", data, att), selected)
    if {"postrank", "report"} & set(parts):
        done["reader_eval"] = exp.reader_eval(heldout, done["reader"])
        ids = sorted(answerable(heldout.path, None))[: c.n_postrank]
        done["postrank_data"] = exp.subset("postrank_data", heldout, set(ids))
        done["postrank"] = exp.attention("attention_postrank", done["postrank_data"], done["reader"])
        if c.candidates.unit_scoring == "maxp":
            done["postrank_prerank"] = exp.prerank_passage_scores("prerank_passage_scores", done["postrank_data"])

    texts, figures = [], {}
    if "validation" in done:
        curve = json.loads((done["validation"].path / "validation.json").read_text())
        texts.append(validation_table(curve))
        figures["validation"] = curve
    if "answer_only" in done:
        t, f = distillation_report(exp, heldout, done)
        texts.append(t)
        figures.update(f)
    if "reader_curve" in done:
        t, f = reader_curve_report(exp, done)
        texts.append(t)
        figures.update(f)
    if {"postrank", "reader_eval"} <= set(done):
        t, f = postranker_report(exp, done)
        texts.append(t)
        figures.update(f)
    if not texts:
        return {k: v.summary for k, v in done.items()}
    return {"text": "\n\n".join(texts), "figures": figures}


def main(argv: list[str] | None = None) -> int:
    """``python -m tasks.funnel.experiment --config C [--home H] [--parts reader,answer_only] [--set k=v]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, help="YAML of ExperimentConfig fields")
    ap.add_argument("--home", type=Path, default=Path("funnelrag-home"))
    ap.add_argument("--mirror", type=Path, default=Path("../shared/data"))
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, dotted keys, YAML values (e.g. --set distill.epochs=1)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)

    raw = (yaml.safe_load(args.config.read_text()) or {}) if args.config else {}
    cfg = ExperimentConfig.from_dict(deep_merge(raw, parse_overrides(args.overrides)))
    mirror = args.mirror.resolve()
    exp = Experiment(cfg, args.home, datasets.resolve("nq-open-dev", mirror), mirror)
    result = run(exp, tuple(p for p in args.parts.split(",") if p))
    if "text" in result:
        print(result["text"])
        out = exp.ws.home / "experiment_results.json"
        out.write_text(json.dumps({"config": json.loads(config_json(cfg)), **result["figures"]}, indent=1))
        print(f"\nfigures: {out}")
    else:
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
