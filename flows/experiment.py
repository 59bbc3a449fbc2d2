"""Prefect flow ``experiment``: does L2G distillation help, and is the post-ranker any good?

``funnelrag experiment --config configs/distillation_experiment_cpu.yaml [--set k=v]``; every
step is cached by content in :class:`funnelrag.store.StageCache` under ``cache/experiment/`` (a
killed run resumes from the last complete step, the reader from its last checkpoint):

1. NQ-open dev questions, hashed split (``split``): the ``train`` part trains, the ``dev`` part is
   held out (never NQ-open test).
2. Funnel candidates of both parts (BM25 top-K clusters → ~1K-token units → pre-ranker top-N units
   → passages), one candidate pool and one pre-ranker input length for every row below.
3. The FiD reader (``reader.fid.kind``) trained on the flat-BM25 passages of the train questions
   (:func:`tasks.funnel.experiment_data.bm25_passage_candidates`), and its learning curve.
4. Eq. 3 scores of the distillation questions' candidates; labels with answer documents only
   (𝒦 = 0) and with L2G labels (Eqs. 4–5, 𝒦 = ``l2g_top_k``); one BPR run (Eq. 6) per label set,
   optionally with the learning rate and epochs chosen on a validation part of the train split.
5. Held-out evaluation (:mod:`tasks.funnel.experiment_eval`): pre-ranker AR@k before / after each
   distillation with bootstrap 95% intervals (and paired intervals of the differences), FiD Eq. 3
   post-ranking vs pre-ranker passage order over the same N units, and reader EM.

The tables are printed, the figures written to ``<home>/experiment_results.json`` and logged to
MLflow (experiment ``distillation-experiment``). Step cores: :mod:`tasks.funnel.stages` and
:mod:`tasks.funnel.experiment_steps`; step names and cache keys are those of the earlier
``python -m tasks.funnel.experiment`` runner, so its cached homes are reused.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from prefect import flow, get_run_logger
from pydantic import BeforeValidator, Field, model_validator

from flows.artifacts import summary_artifact
from funnelrag.config import FlowCommand, FlowConfig, resolve_flow_config
from tasks.corpus.published import CorpusVersion, open_corpus
from funnelrag.stages import DataSource, stage_task
from funnelrag.store import StageCache, StageResult, write_json
from funnelrag.threads import torch_threads
from funnelrag.tracking import flow_run
from funnelrag.training import TrainConfig
from funnelrag.workspace import Workspace
from models.fid_bert2bert import Bert2BertFiDConfig
from models.preranker import PreRankerConfig, build_preranker
from models.readers import reader_config_from_dict
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.tokenize import load_token_counter
from tasks.funnel import experiment_steps as X
from tasks.funnel import stages as S
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig
from tasks.funnel.candidates import CandidatesConfig
from tasks.funnel.distill import DistillConfig
from tasks.funnel.embeddings import find_embedding_index, model_version
from tasks.funnel.experiment_data import answerable, first_questions, subset
from tasks.funnel.experiment_report import experiment_report
from tasks.funnel.experiment_validation import ValidationConfig, validation_curve
from tasks.qa.questions import QuestionsConfig
from tasks.funnel.reader import ReaderTrainConfig

EXPERIMENT = "distillation-experiment"   # MLflow experiment
CACHE = "experiment"                     # the stage cache: <home>/cache/experiment/<step>/<key>/
VERSION = "1"                            # of every step: bump when a step's output bytes change for the same inputs
RESULTS = "experiment_results.json"      # in the home

Part = Literal["candidates", "validation", "reader", "answer_only", "l2g", "postrank", "report"]
PARTS: tuple[str, ...] = ("candidates", "validation", "reader", "answer_only", "l2g", "postrank", "report")

DEFAULT_READER = ReaderTrainConfig(
    fid=Bert2BertFiDConfig(freeze_encoder=True, max_answer_tokens=16),
    train=TrainConfig(output_dir="", epochs=6, batch_size=8, lr=3e-4, warmup_steps=30, log_every=10,
                      checkpoint_every=50),
    n_passages=4, max_passage_tokens=128, max_answer_tokens=16)


def _reader_over_default(value: Any) -> Any:
    """A partial ``reader`` mapping filled in from :data:`DEFAULT_READER` (its ``fid.kind`` picks
    the reader config class, :func:`models.readers.reader_config_from_dict`)."""
    if not isinstance(value, Mapping):
        return value

    r = dict(value)
    fid = reader_config_from_dict({**asdict(DEFAULT_READER.fid), **r.pop("fid", {})})
    train = replace(DEFAULT_READER.train, **r.pop("train", {}))
    return replace(DEFAULT_READER, fid=fid, train=train, **r)


class ExperimentConfig(FlowConfig):
    """Sizes of the experiment (defaults: a small CPU run; the reported run:
    ``configs/distillation_experiment_cpu.yaml``).

    corpus : the published corpus (its current version).
    questions : the NQ-open dev questions (one file; default the registered ``nq-open-dev``).
    parts : the parts to run (each reuses every cached step); ``report`` runs all and prints the tables.
    torch_threads : intra-op threads of torch during the run (None: torch's default).
    n_train : train-split questions run through the funnel (the distillation questions).
    n_reader : train-split questions whose flat BM25 passages train the reader (None = all);
        those with an answer passage among their BM25 top ``reader_search_k`` are kept.
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
        published embedding index, as ``train_vectors`` does for the train split
        (``candidates.unit_scoring`` must be ``"maxp"``). A distilled pre-ranker whose document
        tower differs from the index's (``distill.towers="both"``) is scored on the fly.
    n_reader_dev : held-out questions (first in id order) whose flat BM25 reader input (built like
        the reader's training input) measures reader EM per checkpoint.
    """

    corpus: str = "wikispeedia"
    questions: DataSource = Field(default_factory=lambda: DataSource(datasets=["nq-open-dev"]))
    parts: tuple[Part, ...] = PARTS
    torch_threads: int | None = 2
    split: QuestionsConfig = QuestionsConfig(dev_fraction=0.2, seed=0)
    n_train: int | None = 300
    n_reader: int | None = None
    reader_search_k: int = 20
    n_heldout: int | None = 400
    n_distill: int = 300
    n_postrank: int = 100
    candidates: CandidatesConfig = CandidatesConfig(n_clusters=3, n_units=8, batch_size=64)
    preranker: PreRankerConfig = PreRankerConfig(kind="bi", max_length=128)
    reader: Annotated[ReaderTrainConfig, BeforeValidator(_reader_over_default)] = DEFAULT_READER
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
    train_vectors: Literal["computed", "stored"] = "computed"
    train_candidates: CandidatesConfig | None = None
    train_preranker: PreRankerConfig | None = None
    n_reader_dev: int | None = 400
    distill_answerable: bool = False
    heldout_vectors: Literal["computed", "stored"] = "computed"
    validation: ValidationConfig | None = None
    distill_select: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> "ExperimentConfig":
        if self.distill_select and self.validation is None:
            raise ValueError("distill_select needs a validation search (validation: {...})")
        if self.heldout_vectors == "stored" and self.candidates.unit_scoring != "maxp":
            raise ValueError("heldout_vectors='stored' reads passage vectors: candidates.unit_scoring must be 'maxp'")
        if self.train_vectors == "stored" and (self.train_candidates or self.candidates).unit_scoring != "maxp":
            raise ValueError("train_vectors='stored' reads passage vectors: "
                             "train_candidates.unit_scoring must be 'maxp'")
        return self


# ---------------------------------------------------------------------------- context
@dataclass
class Context:
    """What every step needs: config, workspace, corpus, the step cache and the questions file."""

    cfg: ExperimentConfig
    ws: Workspace
    corpus: CorpusVersion
    cache: StageCache
    questions_file: Path
    questions_digest: str
    keys: dict[str, str] = field(default_factory=dict)      # step name -> its cache key
    results: dict[str, StageResult] = field(default_factory=dict)   # step name -> its output
    indexes: dict[str, Any] = field(default_factory=dict)   # document-tower version -> embedding index

    @classmethod
    def open(cls, cfg: ExperimentConfig) -> "Context":
        """Open the workspace, the corpus' current version and the questions file.

        Raises
        ------
        ValueError
            ``questions`` names other than exactly one file.
        """
        ws = Workspace(cfg.workspace.home)
        files = cfg.questions.resolve(cfg.workspace.data_mirror, ws.downloads_dir, "questions.paths")
        if len(files) != 1:
            raise ValueError(f"questions must name exactly one file, got {len(files)}")
        (path, digest), = files
        return cls(cfg, ws, open_corpus(ws, cfg.corpus), StageCache(ws.cache_dir / CACHE), path, digest)

    def step(self, name: str, config: Any, inputs: dict[str, str], build) -> StageResult:
        """The cached output of step ``name``; ``build(out, key) -> summary`` makes it."""
        key = StageCache.key(name, VERSION, config, inputs)
        self.keys[name] = key
        result = self.results[name] = self.cache.run(name, key, lambda out: build(out, key))
        get_run_logger().info("step %-16s %s %s", name, "cache hit" if result.cache_hit else "built", key[:12])
        return result

    def subset(self, name: str, stage: StageResult, ids: set[str]) -> StageResult:
        inputs = {"stage": stage.digest, "ids": json.dumps(sorted(ids))}
        return self.step(name, {}, inputs, lambda out, _: subset(stage.path, ids, out))

    def embedding_index(self, model):
        """The published embedding index of ``model``'s document tower over this corpus (loaded
        once per document tower), or None when none is published.

        Raises
        ------
        tasks.funnel.embeddings.EmbeddingIndexMismatch
            The store's current index was built from another corpus version.
        """
        version = model_version(model)
        if version not in self.indexes:
            self.indexes[version] = find_embedding_index(
                self.ws.home / "stores", self.cfg.corpus,
                self.corpus.manifest.get("content_digest", self.corpus.digest), model)
        return self.indexes[version]

    def heldout_index_of(self):
        """``index_of(model)`` for the held-out pool's scoring: stored vectors, or None (computed)."""
        return self.embedding_index if self.cfg.heldout_vectors == "stored" else None

    def distill_index(self):
        """The stored vectors query-side MaxP distillation reads (None for other settings or
        when no index is published: then they are computed)."""
        c = self.cfg
        if c.distill.unit_scoring == "maxp" and c.distill.towers == "query" and c.preranker.kind == "bi":
            return self.embedding_index(build_preranker(c.preranker)[0])
        return None

    def reader_run_dir(self, key: str) -> Path:
        return self.ws.run_dir("experiment-reader", key[:16])


# ---------------------------------------------------------------------------- steps
@stage_task("experiment-questions")
def questions_task(ctx: Context) -> StageResult:
    return ctx.step("questions", ctx.cfg.split, {"file": ctx.questions_digest},
                    lambda out, _: S.run_questions([ctx.questions_file], ctx.cfg.split, out))


@stage_task("experiment-candidates")
def candidates_task(ctx: Context, questions: StageResult, split: str) -> StageResult:
    """Funnel candidates of one split (``train``: ``train_vectors``, ``train_candidates``, ...)."""
    seg_cfg = SegmentConfig(**ctx.corpus.manifest["config"]["segment"])
    key = X.candidates_key(ctx.cfg, split, seg_cfg)
    inputs = {"questions": questions.files["questions.parquet"], "corpus": ctx.corpus.digest}
    stored = X.stored_vectors(ctx.cfg, split)
    extra = {"stores_dir": ctx.ws.home / "stores", "corpus_name": ctx.cfg.corpus} if stored else {}
    return ctx.step(f"candidates_{split}", key, inputs, lambda out, _: S.run_candidates(
        questions.path, split, key["limit"], ctx.corpus, seg_cfg,
        load_token_counter(seg_cfg.tokenizer, ctx.cfg.workspace.data_mirror), key["preranker"], key["candidates"],
        out, **extra))


@stage_task("experiment-subset")
def subset_task(ctx: Context, name: str, stage: StageResult, ids: set[str]) -> StageResult:
    return ctx.subset(name, stage, ids)


@stage_task("experiment-distill-data")
def distill_data_task(ctx: Context, train: StageResult) -> StageResult:
    """The first ``n_distill`` train questions (id order), or with ``distill_answerable`` the
    first ``n_distill`` of those whose top-N units hold an answer."""
    if ctx.cfg.distill_answerable:
        ids = set(sorted(answerable(train.path, None))[: ctx.cfg.n_distill])
        return ctx.subset("distill_data_answerable", train, ids)
    return ctx.subset("distill_data", train, first_questions(train.path, ctx.cfg.n_distill))


@stage_task("experiment-reader-data")
def reader_data_task(ctx: Context, questions: StageResult, split: str = "train") -> StageResult:
    """Flat-BM25 reader input of the train-split questions (``n_reader``), or of the first
    ``n_reader_dev`` held-out ones (``split="dev"``)."""
    key = X.reader_data_key(ctx.cfg, split)
    inputs = {"questions": questions.files["questions.parquet"], "corpus": ctx.corpus.digest}
    return ctx.step("reader_data" if split == "train" else "reader_dev_data", key, inputs,
                    lambda out, _: X.build_reader_input(ctx.corpus, questions.path, split, key["n_reader"],
                                                        key["n_passages"], key["search_k"], out))


@stage_task("experiment-reader")
def reader_task(ctx: Context, data: StageResult) -> StageResult:
    """The FiD reader trained on ``data`` (checkpoints in its run directory)."""
    r = ctx.cfg.reader
    return ctx.step("reader", X.reader_key(ctx.cfg), {"data": data.digest},
                    lambda out, key: S.run_reader(data.path, r, ctx.reader_run_dir(key), out))


@stage_task("experiment-reader-curve")
def reader_curve_task(ctx: Context, data: StageResult, dev: StageResult, reader: StageResult) -> StageResult:
    """Held-out EM of every kept checkpoint of the reader run: the learning curve."""
    run_dir = ctx.reader_run_dir(ctx.keys["reader"])
    return ctx.step("reader_curve", {}, {"reader": reader.digest, "dev": dev.digest},
                    lambda out, _: X.build_reader_curve(data.path, dev.path, run_dir, ctx.cfg.reader, out))


@stage_task("experiment-reader-eval")
def reader_eval_task(ctx: Context, heldout: StageResult, reader: StageResult) -> StageResult:
    """Reader EM on the held-out questions whose reader input holds an answer."""
    data = ctx.subset("reader_eval_data", heldout, answerable(heldout.path, ctx.cfg.reader.n_passages))
    return ctx.step("reader_eval", {}, {"data": data.digest, "reader": reader.digest},
                    lambda out, _: S.run_reader_eval(data.path, reader.path, out))


@stage_task("experiment-attention")
def attention_task(ctx: Context, name: str, data: StageResult, reader: StageResult) -> StageResult:
    c = ctx.cfg
    return ctx.step(name, X.attention_key(c), {"data": data.digest, "reader": reader.digest},
                    lambda out, _: S.run_attention(data.path, reader.path, c.attention, c.attention_run, out))


@stage_task("experiment-labels")
def labels_task(ctx: Context, name: str, data: StageResult, attention: StageResult | None) -> StageResult:
    """L2G labels from Eq. 3 scores, or (``attention=None``) answer-only labels (𝒦 = 0)."""
    cfg = X.labels_key(ctx.cfg, l2g=attention is not None)
    if attention is not None:
        return ctx.step(name, cfg, {"data": data.digest, "attention": attention.digest},
                        lambda out, _: S.run_labels(data.path, attention.path, cfg, out))
    return ctx.step(name, cfg, {"data": data.digest}, lambda out, _: X.build_answer_only_labels(data.path, cfg, out))


@stage_task("experiment-validation")
def validation_task(ctx: Context, train: StageResult, data: StageResult, labels: StageResult) -> StageResult:
    """The BPR validation search (:func:`tasks.funnel.experiment_validation.validation_curve`)
    → ``validation.json``."""
    c = ctx.cfg
    key_cfg = X.validation_key(c)

    def build(out: Path, key: str) -> dict[str, Any]:
        curve = validation_curve(train.path, data.path, labels.path, ctx.corpus.passages, c.preranker, c.distill,
                                 c.distill_train, c.validation, ctx.ws.run_dir("experiment-validation", key[:16]),
                                 key_cfg["ks"], ctx.distill_index())
        (out / "validation.json").write_text(json.dumps(curve, indent=1))
        return {"best": curve["best"], "validation_questions": curve["validation_questions"]}

    return ctx.step("validation", key_cfg, {"train": train.digest, "data": data.digest, "labels": labels.digest}, build)


@stage_task("experiment-distill")
def distill_task(ctx: Context, name: str, data: StageResult, labels: StageResult,
                 selected: StageResult | None = None) -> StageResult:
    """BPR (Eq. 6) of ``preranker`` on ``labels`` (with the validation search's choice when
    ``selected``); query-side MaxP distillation reads the frozen document tower's stored
    passage vectors when they are published."""
    c = ctx.cfg
    d_cfg, t_cfg = X.distill_settings(c.distill, c.distill_train, selected.path if selected else None)
    return ctx.step(name, X.distill_key(c, d_cfg, t_cfg), {"data": data.digest, "labels": labels.digest},
                    lambda out, key: S.run_distill(data.path, labels.path, c.preranker, d_cfg, t_cfg,
                                                   ctx.ws.run_dir(f"experiment-{name}", key[:16]), out,
                                                   index=ctx.distill_index()))


@stage_task("experiment-prerank-scores")
def prerank_scores_task(ctx: Context, name: str, data: StageResult) -> StageResult:
    """The pre-ranker's own score of every candidate passage of ``data``."""
    c = ctx.cfg
    return ctx.step(name, X.prerank_scores_key(c), {"data": data.digest}, lambda out, _: X.build_prerank_passage_scores(
        data.path, c.preranker, c.candidates.batch_size, ctx.heldout_index_of(), out))


@stage_task("experiment-recall")
def recall_task(ctx: Context, name: str, heldout: StageResult, distilled: StageResult | None) -> StageResult:
    """Per-question AR@k of the held-out unit pool, re-ranked by a distilled pre-ranker
    (``distilled=None``: the pool's own pre-ranker order, i.e. before distillation)."""
    c = ctx.cfg
    passages = ctx.corpus.passages if c.candidates.unit_scoring == "maxp" else None
    inputs = {"heldout": heldout.digest, "distilled": distilled.digest if distilled else "base"}
    return ctx.step(name, X.recall_key(c), inputs, lambda out, _: X.build_preranker_recall(
        heldout.path, distilled.path if distilled else None, X.recall_ks(c), c.candidates.batch_size, passages,
        ctx.heldout_index_of(), out))


# ---------------------------------------------------------------------------- flow
def run_parts(ctx: Context, parts: tuple[str, ...]) -> dict[str, Any]:
    """Run the requested parts (each reuses every cached step); with ``"report"`` return the
    tables (``text``) and figures (JSON-ready), else the summaries of the steps run."""
    c, want = ctx.cfg, set(parts)
    q = questions_task(ctx)
    done: dict[str, StageResult] = {}
    if {"candidates", "answer_only", "postrank", "report"} & want:
        heldout = candidates_task(ctx, q, "dev")
    if {"candidates", "answer_only", "l2g", "validation", "report"} & want:
        train = candidates_task(ctx, q, "train")
        data = distill_data_task(ctx, train)
    selected = None
    if c.validation is not None and ({"validation", "report"} & want
                                     or (c.distill_select and {"answer_only", "l2g"} & want)):
        done["labels_answer_only"] = labels_task(ctx, "labels_answer_only", data, None)
        done["validation"] = validation_task(ctx, train, data, done["labels_answer_only"])
        selected = done["validation"] if c.distill_select else None
    if {"answer_only", "report"} & want:
        if "labels_answer_only" not in done:
            done["labels_answer_only"] = labels_task(ctx, "labels_answer_only", data, None)
        done["answer_only"] = distill_task(ctx, "distill_answer_only", data, done["labels_answer_only"], selected)
    if {"reader", "l2g", "postrank", "report"} & want:
        reader_data = reader_data_task(ctx, q)
        done["reader"] = reader_task(ctx, reader_data)
    if {"reader", "report"} & want:
        done["reader_curve"] = reader_curve_task(ctx, reader_data, reader_data_task(ctx, q, "dev"), done["reader"])
    if {"l2g", "report"} & want:
        att = attention_task(ctx, "attention_distill", data, done["reader"])
        done["l2g"] = distill_task(ctx, "distill_l2g", data, labels_task(ctx, "labels_l2g", data, att), selected)
    if {"postrank", "report"} & want:
        done["reader_eval"] = reader_eval_task(ctx, heldout, done["reader"])
        ids = sorted(answerable(heldout.path, None))[: c.n_postrank]
        done["postrank_data"] = subset_task(ctx, "postrank_data", heldout, set(ids))
        done["postrank"] = attention_task(ctx, "attention_postrank", done["postrank_data"], done["reader"])
        if c.candidates.unit_scoring == "maxp":
            done["postrank_prerank"] = prerank_scores_task(ctx, "prerank_passage_scores", done["postrank_data"])

    recalls = {}
    if "answer_only" in done:   # the held-out pool before / after each distillation
        recalls = {name: recall_task(ctx, f"recall_{name}", heldout, d) for name, d in
                   (("before", None), ("answer_only", done["answer_only"]), ("l2g", done.get("l2g")))
                   if d or name == "before"}
    text, figures = experiment_report(c, done, recalls)
    if not text:
        return {k: v.summary for k, v in ctx.results.items()}
    return {"text": text, "figures": figures}


@flow(name="experiment", log_prints=True)
def experiment_flow(config: ExperimentConfig | None = None, config_file: str | None = None,
                    overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """The distillation experiment's requested ``parts`` on the corpus' current version.

    Returns
    -------
    dict
        ``steps`` (step name → cache key), ``built`` (the steps not found in the cache),
        ``mlflow_run_id`` and either ``text`` (the tables) and ``results`` (the figures' JSON
        file, ``<home>/experiment_results.json``), or, without ``report``, ``summaries`` (each
        step's summary).
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    cfg = resolve_flow_config(ExperimentConfig, config, config_file, overrides, home)
    ctx = Context.open(cfg)
    params = cfg.model_dump(exclude={"workspace"})
    with torch_threads(cfg.torch_threads), flow_run(ctx.ws, EXPERIMENT, "experiment", params,
                                                     tracking_uri=cfg.workspace.tracking_uri,
                                                     tags={"corpus_version": ctx.corpus.version}) as run:
        result = run_parts(ctx, tuple(cfg.parts))
        out: dict[str, Any] = {"mlflow_run_id": run.info.run_id, "steps": dict(ctx.keys),
                               "built": [n for n, r in ctx.results.items() if not r.cache_hit]}
        if "text" not in result:
            return {**out, "summaries": result}
        path = ctx.ws.home / RESULTS
        write_json(path, {"config": cfg.model_dump(mode="json", exclude={"workspace"}), **result["figures"]})
        mlflow.log_artifact(str(path))
        summary_artifact("experiment", f"distillation experiment on `{cfg.corpus}` version `{ctx.corpus.version}`",
                         run, cfg.workspace.tracking_uri, {**out, **result["figures"]},
                         "distillation experiment: labels, reader, post-ranking figures")
        return {**out, "text": result["text"], "results": str(path)}


def run_experiment(cfg: ExperimentConfig) -> dict[str, Any]:
    """CLI entry: run the flow, print its tables; the summary keeps the results file and step keys."""
    out = experiment_flow(cfg)
    if "text" in out:
        print(out["text"])
    return {k: v for k, v in out.items() if k != "text"}


COMMANDS = [
    FlowCommand("experiment", "the distillation experiment: answer-only vs L2G BPR of the pre-ranker on held-out "
                "NQ-open dev questions, the reader's learning curve, Eq. 3 post-ranking (tables with 95% intervals)",
                ExperimentConfig, run_experiment),
]
