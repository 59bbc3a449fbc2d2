"""Prefect flows of FunnelRAG's local-to-global (L2G) distillation on the current corpus version.

* ``train-reader``: questions → funnel candidates (BM25 top-K clusters → later chunking →
  pre-ranker top-N units → passages) → FiD reader trained on them.
* ``score-passages``: FiD cross-attention scores of every candidate passage (Eq. 3) →
  document scores and D+/D− labels (Eq. 4, Eq. 5).
* ``distill-preranker``: BPR training of the pre-ranker (Eq. 6) → answer recall of the
  pre-ranking stage on held-out questions before/after → model registry (challenger; champion
  only when its paired gain on the same dev questions has a 95% lower bound above 0 and the
  ``gate.margin``).
* ``distillation-run``: the three in order; prints AR@1..4 and AR@N before and after.

Stages are the pure functions of :mod:`tasks.funnel.stages`, wrapped in ``@task`` with
retries and the content-keyed :class:`funnelrag.store.StageCache` (keys: stage, code version,
config, input digests — never paths), so each flow recomputes nothing whose inputs did not
change and the sub-flows can run alone. One MLflow run per flow run (nested under the parent's).
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.events import emit_event
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from data_contracts.base import sha256_file
from data_contracts.evaluation import QUESTION_SCORES
from data_contracts.funnel import QUESTIONS, READER_PREDICTIONS
from flows.artifacts import summary_artifact
from flows.launched.preranker import launch_distill
from flows.launched.reader import launch_reader
from flows.run_report import completed, name_run, run_name
from funnelrag import datasets
from funnelrag.config import FlowCommand, FlowConfig, deep_merge, flatten_params, resolve_flow_config, to_jsonable
from funnelrag.device import resolve_device
from funnelrag.inputs import QUESTIONS_FILE, check_inputs
from funnelrag.launch import TrainingSection
from funnelrag.registry import (
    champion_version,
    download_model,
    find_model_dir,
    find_version,
    model_uri,
    question_set_digest,
    register_model,
)
from funnelrag.stages import DataSource, input_digests, run_cached, stage_task
from funnelrag.store import StageCache, StageResult
from funnelrag.tracking import (
    flow_run,
    log_metrics,
    log_question_scores,
    prefect_run_tags,
    question_scores_table,
    run_link,
)
from funnelrag.training import TrainConfig
from funnelrag.workspace import Workspace
from models.fid import FiDConfig
from models.fid_bert2bert import Bert2BertFiDConfig
from models.preranker import PreRankerConfig, build_preranker
from tasks.corpus.published import CorpusVersion, open_corpus
from tasks.corpus.tokenize import load_token_counter
from tasks.funnel import stages as S
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig
from tasks.funnel.candidates import CandidatesConfig
from tasks.funnel.distill import DistillConfig
from tasks.funnel.embeddings import find_embedding_index
from tasks.funnel.labels import LabelConfig
from tasks.funnel.reader import READER_CONFIG, ReaderTrainConfig
from tasks.qa.questions import QuestionsConfig

log = logging.getLogger(__name__)

EXPERIMENT = "distillation"


class TrainQuestions(DataSource):
    """QA files the reader and the pre-ranker are trained on (default: NQ-open dev)."""

    datasets: list[str] = Field(default_factory=lambda: ["nq-open-dev"])
    expected_file: ClassVar[str] = QUESTIONS_FILE


class GateSection(BaseModel):
    """The champion gate (:func:`funnelrag.registry.register_model`): a new model becomes champion
    only when the lower 95% bound of its paired gain over the champion on the fixed dev questions
    is above 0 and at least ``margin`` (AR and EM are fractions: 0.02 = two points); the interval
    is a percentile bootstrap of ``n_bootstrap`` resamples seeded by ``seed``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    margin: float = Field(0.0, ge=0.0)
    n_bootstrap: int = Field(2000, ge=100)
    seed: int = 0


class ReaderSection(BaseModel):
    """FiD reader: ``kind`` ``t5`` (``fid``: a tiny scratch T5 by default, no pretrained T5 weights
    offline) or ``minilm-bert2bert`` (``bert2bert``: warm-started from the MiniLM checkpoint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["t5", "minilm-bert2bert"] = "t5"
    bert2bert: Bert2BertFiDConfig = Bert2BertFiDConfig(freeze_encoder=True)
    fid: FiDConfig = FiDConfig(d_model=64, n_layers=2, n_heads=4, d_ff=256, dropout=0.1, max_answer_tokens=16)
    train: TrainConfig = TrainConfig(epochs=2, batch_size=4, lr=1e-3, warmup_steps=5, log_every=5)
    n_passages: int = 8
    max_passage_tokens: int = 160
    max_answer_tokens: int = 16


DEFAULT_READER = ReaderSection()


def _over(default: Any):
    """A partial section (``reader: {train: {max_steps: 3}}``) fills in from ``default``."""
    base = to_jsonable(default)
    return lambda value: deep_merge(base, value) if isinstance(value, dict) else value


class DistillationConfig(FlowConfig):
    """Configuration of the distillation flows (defaults: a CPU run of a few minutes on
    Wikispeedia + NQ-open; FunnelRAG's sizes are ``candidates.n_clusters=80``,
    ``candidates.n_units=8`` and thousands of training questions)."""

    corpus: str = "wikispeedia"
    corpus_version: str | None = None
    questions: TrainQuestions = Field(default_factory=TrainQuestions)
    split: QuestionsConfig = QuestionsConfig(dev_fraction=0.2, seed=0)
    n_train: int | None = 150
    n_eval: int | None = 100
    candidates: CandidatesConfig = CandidatesConfig(n_clusters=3, n_units=8, batch_size=32)
    preranker: PreRankerConfig = PreRankerConfig(kind="bi")   # the model's own input length (one source)
    reader: Annotated[ReaderSection, BeforeValidator(_over(DEFAULT_READER))] = DEFAULT_READER
    attention: AttentionScoreConfig = AttentionScoreConfig()
    attention_run: AttentionRunConfig = AttentionRunConfig(max_passage_tokens=160, batch_size=1)
    labels: LabelConfig = LabelConfig(alpha=0.75, top_k=1)
    distill: DistillConfig = DistillConfig(epochs=1, max_pairs_per_question=8, score_scale=20.0)
    distill_train: TrainConfig = TrainConfig(batch_size=4, grad_accum=2, lr=2e-5, warmup_steps=2, log_every=5)
    recall_at: list[int] = Field(default_factory=lambda: [1, 2, 3, 4])
    registry_name: str = "funnelrag-preranker"
    reader_registry_name: str = "funnelrag-reader"
    gate: GateSection = GateSection()
    # how the reader and the pre-ranker are trained (in this process or under accelerate launch);
    # not part of any cache key: a launch trains the same global batches (funnelrag/launch.py)
    training: TrainingSection = TrainingSection()
    # where the inference stages run (pre-ranking, Eq. 3 scoring, evaluation loads): auto = cuda if available;
    # fp32 on every device, so not part of any cache key
    device: str = "auto"

    @property
    def recall_ks(self) -> list[int]:
        return sorted({*self.recall_at, self.candidates.n_units})


# ---------------------------------------------------------------------------- stage plumbing
@dataclass
class Context:
    """What every stage task needs: config, workspace, cache, corpus version, token counter."""

    cfg: DistillationConfig
    ws: Workspace
    cache: StageCache
    corpus: CorpusVersion
    data_version: str
    tokenizer_dir: Path
    device: str = "cpu"

    @classmethod
    def open(cls, cfg: DistillationConfig) -> "Context":
        check_inputs(cfg)   # before the corpus, MLflow and any stage: a wrong questions path fails at once
        ws = Workspace(cfg.workspace.home)
        corpus = open_corpus(ws, cfg.corpus, cfg.corpus_version)
        tok = datasets.resolve("t5-tokenizer", cfg.workspace.data_mirror, cache_dir=ws.downloads_dir)
        datasets.resolve("t5-tokenizer-config", cfg.workspace.data_mirror, cache_dir=ws.downloads_dir)
        return cls(cfg, ws, StageCache(ws.cache_dir / EXPERIMENT), corpus, corpus.digest, tok.parent,
                   resolve_device(cfg.device))

    def segment(self):
        seg_cfg = self.corpus.segment_config()
        return seg_cfg, load_token_counter(seg_cfg.tokenizer, self.cfg.workspace.data_mirror)

    def reader_config(self):
        """``cfg.reader`` with a scratch reader's tokenizer set to the real T5 tokenizer."""
        r = self.cfg.reader
        fid = r.fid if r.fid.tokenizer or r.fid.base != "scratch" else replace(r.fid, tokenizer=str(self.tokenizer_dir))
        fid = fid if r.kind == "t5" else r.bert2bert
        return ReaderTrainConfig(fid=fid, train=r.train, n_passages=r.n_passages,
                                 max_passage_tokens=r.max_passage_tokens, max_answer_tokens=r.max_answer_tokens)

    def maxp_passages(self):
        """The corpus passages when the dev pool ranks units by MaxP (re-rank them the same way), else None."""
        return self.corpus.passages if self.cfg.candidates.unit_scoring == "maxp" else None

    def maxp_key(self) -> dict[str, str]:
        return {"unit_scoring": "maxp"} if self.cfg.candidates.unit_scoring == "maxp" else {}

    def run(self, core, config: Any, inputs: dict[str, str], build) -> StageResult:
        """:func:`funnelrag.stages.run_cached` of ``core`` in this flow's cache, logged."""
        result = run_cached(self.cache, core, config, inputs, build)
        get_run_logger().info("stage %-10s %s (%s)", core.stage.name, "cache hit" if result.cache_hit else "built",
                              result.path.name[:12])
        return result


def _metrics(prefix: str):
    return lambda metrics, step: log_metrics({f"{prefix}/{k.split('/', 1)[-1]}": v for k, v in metrics.items()}, step)


def _tracking(prefix: str) -> dict[str, str]:
    """Where a launched training's main rank logs its step metrics: this flow's MLflow run."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    run = mlflow.active_run()
    if run is None:
        return {"kind": "none"}
    return {"kind": "mlflow", "uri": mlflow.get_tracking_uri(), "run_id": run.info.run_id, "prefix": prefix}


@stage_task("questions")
def questions_task(ctx: Context) -> StageResult:
    files = ctx.cfg.questions.resolve(ctx.cfg.workspace.data_mirror, ctx.ws.downloads_dir, "questions.paths")
    return ctx.run(S.run_questions, ctx.cfg.split, input_digests(files),
                   lambda out, _: S.run_questions([p for p, _ in files], ctx.cfg.split, out))


@stage_task("candidates")
def candidates_task(ctx: Context, questions: StageResult, split: str) -> StageResult:
    limit = ctx.cfg.n_train if split == "train" else ctx.cfg.n_eval
    seg_cfg, counter = ctx.segment()
    key_cfg = {"split": split, "limit": limit, "candidates": ctx.cfg.candidates, "preranker": ctx.cfg.preranker,
               "segment": seg_cfg}
    inputs = {"questions": questions.files["questions.parquet"], "corpus": ctx.data_version}
    return ctx.run(S.run_candidates, key_cfg, inputs, lambda out, _: S.run_candidates(
        questions.path, split, limit, ctx.corpus, seg_cfg, counter, ctx.cfg.preranker, ctx.cfg.candidates, out,
        device=ctx.device, vector_cache=ctx.ws.cache_dir))


@stage_task("train-reader")
def reader_task(ctx: Context, train: StageResult) -> StageResult:
    reader_cfg = ctx.reader_config()
    fid = replace(reader_cfg.fid, tokenizer=None) if hasattr(reader_cfg.fid, "tokenizer") else reader_cfg.fid
    key_cfg = asdict(replace(reader_cfg, fid=fid))
    inputs = {"candidates": train.digest, "tokenizer": sha256_file(ctx.tokenizer_dir / "tokenizer.json")}
    launch = ctx.cfg.training.launch

    def build(out: Path, key: str) -> dict[str, Any]:
        work = ctx.ws.run_dir("train-reader", key[:16])
        if launch.kind == "accelerate":
            return launch_reader(train.path, reader_cfg, work, out, launch, tracking=_tracking("reader"),
                                 logger=get_run_logger())
        return S.run_reader(train.path, reader_cfg, work, out, _metrics("reader"))

    return ctx.run(S.run_reader, key_cfg, inputs, build)


@stage_task("attention")
def attention_task(ctx: Context, train: StageResult, reader: StageResult) -> StageResult:
    key_cfg = {"score": ctx.cfg.attention, "run": ctx.cfg.attention_run}
    inputs = {"candidates": train.digest, "reader": reader.digest}
    return ctx.run(S.run_attention, key_cfg, inputs, lambda out, _: S.run_attention(
        train.path, reader.path, ctx.cfg.attention, ctx.cfg.attention_run, out, ctx.device))


@stage_task("labels")
def labels_task(ctx: Context, train: StageResult, attention: StageResult) -> StageResult:
    inputs = {"candidates": train.digest, "attention": attention.digest}
    return ctx.run(S.run_labels, ctx.cfg.labels, inputs,
                   lambda out, _: S.run_labels(train.path, attention.path, ctx.cfg.labels, out))


@stage_task("distill")
def distill_task(ctx: Context, train: StageResult, labels: StageResult) -> StageResult:
    key_cfg = {"preranker": ctx.cfg.preranker, "distill": ctx.cfg.distill, "train": ctx.cfg.distill_train}
    inputs = {"candidates": train.digest, "labels": labels.digest}

    def build(out: Path, key: str) -> dict[str, Any]:
        index = None
        d = ctx.cfg.distill
        if d.unit_scoring == "maxp" and d.towers == "query" and ctx.cfg.preranker.kind == "bi":
            index = find_embedding_index(ctx.ws.home / "stores", ctx.cfg.corpus, ctx.corpus.manifest.get(
                "content_digest", ctx.corpus.digest), build_preranker(ctx.cfg.preranker)[0])
        work = ctx.ws.run_dir("distill-preranker", key[:16])
        if ctx.cfg.training.launch.kind == "accelerate":
            where = None if index is None else {"stores_dir": str(ctx.ws.home / "stores"), "corpus": ctx.cfg.corpus,
                                                "corpus_digest": ctx.corpus.manifest.get("content_digest", ctx.corpus.digest)}
            return launch_distill(train.path, labels.path, ctx.cfg.preranker, d, ctx.cfg.distill_train, work, out,
                                  ctx.cfg.training.launch, index=where, tracking=_tracking("distill"),
                                  logger=get_run_logger())
        return S.run_distill(train.path, labels.path, ctx.cfg.preranker, d, ctx.cfg.distill_train,
                             work, out, _metrics("distill"), index=index, vector_cache=ctx.ws.cache_dir)

    return ctx.run(S.run_distill, key_cfg, inputs, build)


@stage_task("evaluate")
def eval_task(ctx: Context, dev: StageResult, distilled: StageResult) -> StageResult:
    inputs = {"dev": dev.digest, "distilled": distilled.digest}
    return ctx.run(S.run_eval, {"ks": ctx.cfg.recall_ks, **ctx.maxp_key()}, inputs,
                   lambda out, _: S.run_eval(dev.path, distilled.path, ctx.cfg.recall_ks, out, ctx.maxp_passages(),
                                             ctx.device, ctx.ws.cache_dir))


@stage_task("reader-eval")
def reader_eval_task(ctx: Context, dev: StageResult, reader: StageResult) -> StageResult:
    inputs = {"dev": dev.digest, "reader": reader.digest}
    return ctx.run(S.run_reader_eval, {}, inputs,
                   lambda out, _: S.run_reader_eval(dev.path, reader.path, out, ctx.device))


def _register_gated(ctx: Context, name: str, model_dir: Path, model_digest: str, metrics: dict[str, float],
                    gate_metric: str, scores: dict[str, float], measure_champion, dev: StageResult) -> dict[str, Any]:
    """Register ``model_dir`` under ``name`` once per distinct model (tag ``model_digest``) and
    run the champion gate on the same fixed dev question set (``dev``, whose digest is recorded
    with the decision): ``scores`` are the new model's ``{question id: value}`` of ``gate_metric``,
    ``measure_champion(dir)`` measures the current champion's on the same questions now."""
    existing = find_version(name, "model_digest", model_digest)
    if existing is not None:
        return {"registered": False, "version": str(existing.version), "reason": "already_registered",
                "aliases": sorted(existing.aliases)}
    champion_scores = None
    if champion_version(name) is not None:
        champ_dir = download_model(model_uri(name), ctx.ws.run_dir("registry", model_digest[:16]) / f"champion-{name}")
        champion_scores = measure_champion(champ_dir)
    gate = ctx.cfg.gate
    decision = register_model(model_dir, name, config=ctx.cfg.model_dump(exclude={"workspace"}),
                              data_version=ctx.data_version, metrics=metrics, gate_metric=gate_metric,
                              tags={"model_digest": model_digest, "corpus_version": ctx.corpus.version},
                              eval_set=question_set_digest(QUESTIONS.read(dev.path)["question_id"].to_pylist()),
                              challenger_scores=scores if champion_scores is not None else None,
                              champion_scores=champion_scores, margin=gate.margin, n_bootstrap=gate.n_bootstrap,
                              seed=gate.seed)
    return {"registered": True, **asdict(decision), "description": decision.description()}


@task(name="register", cache_policy=NO_CACHE)
def register_task(ctx: Context, dev: StageResult, distilled: StageResult, evaluation: StageResult) -> dict[str, Any]:
    """Register the distilled pre-ranker (``registry_name``); gate: dev answer recall of the
    pre-ranking stage at N, its paired gain over the champion's on the same dev pool
    (:class:`GateSection`)."""
    n = ctx.cfg.candidates.n_units
    metrics = {f"dev_prerank_ar_at_{k}": evaluation.summary[f"after_ar_at_{k}"] for k in ctx.cfg.recall_ks}
    outcome = _register_gated(ctx, ctx.cfg.registry_name, distilled.path / S.PRERANKER_DIR, distilled.digest, metrics,
                              f"dev_prerank_ar_at_{n}", _stage_scores(evaluation)[f"after_ar_at_{n}"],
                              lambda d: S.preranker_recall_per_question(dev.path, d, [n], passages=ctx.maxp_passages(),
                                                                        device=ctx.device,
                                                                        vector_cache=ctx.ws.cache_dir)[n], dev)
    if outcome.get("promoted"):
        emit_champion_event(ctx.cfg.registry_name, outcome["version"], ctx.cfg.corpus, ctx.ws.home)
    return outcome


# Emitted when a distillation promoted a new champion pre-ranker; prefect.yaml's embed-champion
# trigger takes the corpus and home from its payload (not the deployment's defaults).
CHAMPION_EVENT = "funnelrag.preranker.champion"


def emit_champion_event(name: str, version: str, corpus: str, home: Path) -> None:
    """Emit :data:`CHAMPION_EVENT` for registered model ``name`` v``version`` trained on ``corpus``
    in ``home`` (resource ``funnelrag.model.<name>``)."""
    emit_event(event=CHAMPION_EVENT, resource={"prefect.resource.id": f"funnelrag.model.{name}"},
               payload={"name": name, "version": str(version), "corpus": corpus, "home": str(home)})


@task(name="register-reader", cache_policy=NO_CACHE)
def register_reader_task(ctx: Context, dev: StageResult, reader: StageResult, reader_eval: StageResult) -> dict[str, Any]:
    """Register the FiD reader (``reader_registry_name``); gate: dev exact match, its paired gain
    over the champion reader's on the same dev candidates (:class:`GateSection`)."""
    def champion_em(model_dir: Path) -> dict[str, float]:
        return em_scores(S.evaluate_reader(dev.path, find_model_dir(model_dir, READER_CONFIG), ctx.device)[0])

    metrics = {"dev_reader_em": reader_eval.summary["em"]}
    if reader.summary.get("last_loss") is not None:
        metrics["train_last_loss"] = reader.summary["last_loss"]
    return _register_gated(ctx, ctx.cfg.reader_registry_name, reader.path / S.READER_DIR, reader.digest, metrics,
                           "dev_reader_em", em_scores(READER_PREDICTIONS.read(reader_eval.path)), champion_em, dev)


def em_scores(predictions) -> dict[str, float]:
    """``{question id: 0.0 | 1.0}`` exact match of a ``reader_predictions`` table."""
    return dict(zip(predictions["question_id"].to_pylist(), map(float, predictions["exact_match"].to_pylist())))


# ---------------------------------------------------------------------------- tracking
@contextlib.contextmanager
def tracked(ctx: Context, flow_name: str) -> Iterator[Any]:
    """One MLflow run per flow run; nested under the parent flow's run when there is one. Either
    is tagged with its Prefect flow run (:func:`funnelrag.tracking.prefect_run_tags`)."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    cfg = ctx.cfg
    tags = {"flow": flow_name, "corpus_version": ctx.corpus.version, "data_version": ctx.data_version,
            **prefect_run_tags()}
    parent = mlflow.active_run()
    if parent is None:
        with flow_run(ctx.ws, EXPERIMENT, flow_name, cfg.model_dump(exclude={"workspace"}),
                      tracking_uri=cfg.workspace.tracking_uri, tags=tags) as run:
            yield run
        return
    with mlflow.start_run(experiment_id=parent.info.experiment_id, run_name=flow_name, nested=True, tags=tags) as run:
        items = sorted(flatten_params(cfg.model_dump(exclude={"workspace"})).items())
        for i in range(0, len(items), 100):
            mlflow.log_params({k: v[:6000] for k, v in items[i:i + 100]})
        yield run


def _log_question_scores(ctx: Context, run: Any, name: str, scores: dict[str, dict[str, float]],
                         dev: StageResult) -> None:
    """Log per-question dev results (``{metric: {question id: value}}``, metric names prefixed
    ``<name>.`` like the stage's metrics) as the run's ``per_question`` artifact, with each
    metric's 95% interval as metrics (:func:`funnelrag.tracking.log_question_scores`)."""
    questions = QUESTIONS.read(dev.path)
    texts = dict(zip(questions["question_id"].to_pylist(), questions["question"].to_pylist()))
    log_question_scores(question_scores_table(scores, texts, prefix=f"{name}."),
                        ctx.ws.run_dir("question-scores", run.info.run_id))


def _stage_scores(result: StageResult) -> dict[str, dict[str, float]]:
    """``{metric: {question id: value}}`` of a stage's ``question_scores`` table."""
    out: dict[str, dict[str, float]] = {}
    t = QUESTION_SCORES.read(result.path)
    for m, q, v in zip(t["metric"].to_pylist(), t["question_id"].to_pylist(), t["value"].to_pylist()):
        out.setdefault(m, {})[q] = v
    return out


def _log_stage(name: str, result: StageResult) -> dict[str, Any]:
    flat: dict[str, float] = {}
    for k, v in result.summary.items():
        if isinstance(v, dict):
            flat.update({f"{name}.{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[f"{name}.{k}"] = v
    log_metrics({re.sub(r"[^\w\-./ :]", "_", k): v for k, v in flat.items()})  # MLflow's allowed name characters
    return {"cache_hit": result.cache_hit, **result.summary}


# ---------------------------------------------------------------------------- flows
@flow(name="train-reader", log_prints=True)
def train_reader_flow(config: DistillationConfig | None = None, config_file: str | None = None,
                      overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Questions → funnel candidates (train, dev) → FiD reader → dev exact match → registry
    (``reader_registry_name``, champion gate on dev EM)."""
    ctx = Context.open(resolve_flow_config(DistillationConfig, config, config_file, overrides, home))
    name_run(run_name("train-reader", ctx.cfg.corpus, ctx.corpus.version))
    with tracked(ctx, "train-reader") as run:
        questions = questions_task(ctx)
        train = candidates_task(ctx, questions, "train")
        dev = candidates_task(ctx, questions, "dev")
        reader = reader_task(ctx, train)
        reader_eval = reader_eval_task(ctx, dev, reader)
        _log_question_scores(ctx, run, "reader_eval", {"em": em_scores(READER_PREDICTIONS.read(reader_eval.path))}, dev)
        gate = register_reader_task(ctx, dev, reader, reader_eval)
        summary = {"mlflow_run_id": run.info.run_id, "questions": _log_stage("questions", questions),
                   "candidates_train": _log_stage("candidates_train", train),
                   "candidates_dev": _log_stage("candidates_dev", dev), "reader": _log_stage("reader", reader),
                   "reader_eval": _log_stage("reader_eval", reader_eval), "reader_gate": gate}
        summary_artifact(f"train-reader-{ctx.cfg.corpus}", f"train-reader on `{ctx.cfg.corpus}` version "
                         f"`{ctx.corpus.version}`", run, ctx.cfg.workspace.tracking_uri, summary,
                         "FiD reader: training, dev exact match, registry gate")
    return completed(f"FiD reader: dev EM {summary['reader_eval'].get('em', 0.0):.3f} on "
                     f"{summary['reader_eval'].get('questions', 0):,} questions; registry: {_gate_text(gate)}", summary)


@flow(name="score-passages", log_prints=True)
def score_passages_flow(config: DistillationConfig | None = None, config_file: str | None = None,
                        overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """FiD attention scores of the train candidates (Eq. 3) and L2G labels (Eq. 4, 5)."""
    ctx = Context.open(resolve_flow_config(DistillationConfig, config, config_file, overrides, home))
    name_run(run_name("score-passages", ctx.cfg.corpus, ctx.corpus.version))
    with tracked(ctx, "score-passages") as run:
        train = candidates_task(ctx, questions_task(ctx), "train")
        reader = reader_task(ctx, train)
        attention = attention_task(ctx, train, reader)
        labels = labels_task(ctx, train, attention)
        summary = {"mlflow_run_id": run.info.run_id, "attention": _log_stage("attention", attention),
                   "labels": _log_stage("labels", labels)}
        summary_artifact(f"score-passages-{ctx.cfg.corpus}", f"score-passages on `{ctx.cfg.corpus}` version "
                         f"`{ctx.corpus.version}`", run, ctx.cfg.workspace.tracking_uri, summary,
                         "Eq. 3 attention scores and L2G labels (Eqs. 4-5) of the train candidates")
    return completed(f"Eq. 3 scores of {summary['attention'].get('passages', 0):,} passages; L2G labels of "
                     f"{summary['labels'].get('documents', 0):,} documents ({summary['labels'].get('positives', 0):,} D+)",
                     summary)


@flow(name="distill-preranker", log_prints=True)
def distill_preranker_flow(config: DistillationConfig | None = None, config_file: str | None = None,
                           overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """BPR distillation (Eq. 6), dev answer recall before/after, registry gate."""
    ctx = Context.open(resolve_flow_config(DistillationConfig, config, config_file, overrides, home))
    name_run(run_name("distill-preranker", ctx.cfg.corpus, ctx.corpus.version))
    with tracked(ctx, "distill-preranker") as run:
        questions = questions_task(ctx)
        train = candidates_task(ctx, questions, "train")
        dev = candidates_task(ctx, questions, "dev")
        labels = labels_task(ctx, train, attention_task(ctx, train, reader_task(ctx, train)))
        distilled = distill_task(ctx, train, labels)
        evaluation = eval_task(ctx, dev, distilled)
        _log_question_scores(ctx, run, "evaluate", _stage_scores(evaluation), dev)
        gate = register_task(ctx, dev, distilled, evaluation)
        recall = [{"k": k, "before": evaluation.summary[f"before_ar_at_{k}"],
                   "after": evaluation.summary[f"after_ar_at_{k}"]} for k in ctx.cfg.recall_ks]
        summary = {"mlflow_run_id": run.info.run_id, "distill": _log_stage("distill", distilled),
                   "evaluate": _log_stage("evaluate", evaluation), "answer_recall": recall, "gate": gate}
        _distillation_artifact(ctx, run, summary)
    return completed(distill_message(recall, {"name": ctx.cfg.registry_name, **gate}), summary)


def distillation_markdown(corpus: str, corpus_version: str, questions: int, recall: list[dict[str, float]],
                          gate: dict[str, Any], mlflow_run: str) -> str:
    """The Prefect artifact of a distillation: dev answer recall of the pre-ranking stage before
    and after BPR (Eq. 6) and the registry gate's decision."""
    lines = [f"# distill-preranker on `{corpus}` version `{corpus_version}`", "",
             f"- MLflow run: {mlflow_run}", f"- registry: {_gate_text(gate)}", ""]
    return "\n".join(lines + _recall_lines(questions, recall)) + "\n"


def distillation_run_markdown(corpus: str, corpus_version: str, mlflow_run: str, steps: list[tuple[str, str]],
                              reader_eval: dict[str, Any], reader_gate: dict[str, Any], questions: int,
                              recall: list[dict[str, float]], gate: dict[str, Any]) -> str:
    """The Prefect artifact of a whole distillation run: its MLflow run and each step's
    (train-reader, score-passages, distill-preranker), the FiD reader's dev exact match and registry
    gate, the pre-ranker's registry gate, and the pre-ranking stage's answer recall before and
    after BPR (Eq. 6) on the held-out dev questions.

    Parameters
    ----------
    steps : ``(step name, markdown naming its MLflow run)`` in run order.
    reader_eval : ``em`` (a fraction) and ``questions`` of the reader's dev evaluation.
    reader_gate, gate : the registry decisions (``name``, ``version``, ``reason``, ``promoted``).
    questions, recall : as :func:`distillation_markdown`.
    """
    lines = [f"# distillation-run on `{corpus}` version `{corpus_version}`", "",
             f"- MLflow run: {mlflow_run}",
             f"- FiD reader: dev exact match {reader_eval.get('em', 0.0):.3f} on {reader_eval.get('questions', 0)} "
             f"held-out questions; registry: {_gate_text(reader_gate)}",
             f"- pre-ranker: registry: {_gate_text(gate)}", "",
             "| step | MLflow run |", "|---|---|", *[f"| {name} | {link} |" for name, link in steps], ""]
    return "\n".join(lines + _recall_lines(questions, recall)) + "\n"


def distill_message(recall: list[dict[str, float]], gate: dict[str, Any]) -> str:
    """State message of a distillation: the pre-ranker's answer recall at the largest k before
    and after BPR (Eq. 6) and the registry decision (``AR@8 0.433 → 0.467; funnelrag-preranker v3
    — reason``)."""
    top = max(recall, key=lambda r: r["k"]) if recall else None
    head = f"AR@{top['k']} {top['before']:.3f} → {top['after']:.3f}; " if top else ""
    return head + _gate_text(gate)


def _gate_text(gate: dict[str, Any]) -> str:
    """``name vN — reason (now champion)``, then the decision's evidence (paired gain, 95%
    interval, n) when the gate compared against a champion."""
    head = (f"{gate.get('name', '')} v{gate.get('version')} — {gate.get('reason')}"
            + (" (now champion)" if gate.get("promoted") else ""))
    return head + (f". {gate['description']}" if gate.get("description") else "")


def _recall_lines(questions: int, recall: list[dict[str, float]]) -> list[str]:
    lines = [f"Answer recall of the pre-ranking stage on {questions} held-out dev questions:", "",
             "| k | before | after | change |", "|---:|---:|---:|---:|"]
    return lines + [f"| {r['k']} | {r['before']:.3f} | {r['after']:.3f} | {r['after'] - r['before']:+.3f} |"
                    for r in recall]


def _distillation_artifact(ctx: Context, run: Any, summary: dict[str, Any]) -> None:
    md = distillation_markdown(ctx.cfg.corpus, ctx.corpus.version, int(summary["evaluate"].get("questions", 0)),
                               summary["answer_recall"], {"name": ctx.cfg.registry_name, **summary["gate"]},
                               run_link(run, ctx.cfg.workspace.tracking_uri))
    create_markdown_artifact(key=f"distill-preranker-{ctx.cfg.corpus}".lower().replace("_", "-"), markdown=md,
                             description="pre-ranker answer recall before/after distillation, registry gate")


@flow(name="distillation-run", log_prints=True)
def distillation_run_flow(config: DistillationConfig | None = None, config_file: str | None = None,
                          overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """train-reader → score-passages → distill-preranker on the current corpus version; prints
    the pre-ranker's answer recall on held-out questions before and after distillation."""
    ctx = Context.open(resolve_flow_config(DistillationConfig, config, config_file, overrides, home))
    name_run(run_name("distillation-run", ctx.cfg.corpus, ctx.corpus.version))
    with tracked(ctx, "distillation-run") as run:
        reader = train_reader_flow(ctx.cfg)
        scored = score_passages_flow(ctx.cfg)
        distilled = distill_preranker_flow(ctx.cfg)
        n_dev = distilled["evaluate"]["questions"]
        r_eval, r_gate = reader["reader_eval"], reader["reader_gate"]
        print(f"FiD reader: dev exact match {r_eval['em']:.3f} on {r_eval['questions']} held-out questions; "
              f"{ctx.cfg.reader_registry_name} v{r_gate['version']} "
              f"({r_gate.get('reason')}{', champion' if r_gate.get('promoted') else ''})")
        print(f"pre-ranker answer recall on {n_dev} held-out questions (corpus {ctx.corpus.version}):")
        print("   k   before   after")
        for row in distilled["answer_recall"]:
            print(f"{row['k']:>4}   {row['before']:.3f}   {row['after']:.3f}")
        log_metrics(run_summary_metrics(reader, distilled))
        _distillation_run_artifact(ctx, run, reader, scored, distilled)
        summary = {"corpus_version": ctx.corpus.version, "data_version": ctx.data_version,
                "mlflow_run_id": run.info.run_id, "answer_recall": distilled["answer_recall"],
                "gate": distilled["gate"], "reader_gate": reader["reader_gate"], "train_reader": reader, "score_passages": scored,
                "distill_preranker": {k: v for k, v in distilled.items() if k not in ("answer_recall", "gate")}}
    return completed(f"reader dev EM {r_eval['em']:.3f}; " + distill_message(
        distilled["answer_recall"], {"name": ctx.cfg.registry_name, **distilled["gate"]}), summary)


def run_summary_metrics(reader: dict[str, Any], distilled: dict[str, Any]) -> dict[str, float]:
    """The parent ``distillation-run``'s own metrics, from its sub-flows' summaries: the reader's
    dev EM and last training loss, the pre-ranker's dev AR@k before and after BPR and its last
    loss, and each registry gate's decision with its paired gain and interval (``gate.*`` for
    the pre-ranker, ``reader_gate.*`` for the reader)."""
    out: dict[str, float] = {"reader_eval.em": reader["reader_eval"]["em"],
                             "reader_eval.questions": reader["reader_eval"]["questions"],
                             "evaluate.questions": distilled["evaluate"]["questions"]}
    for row in distilled["answer_recall"]:
        out[f"evaluate.before_ar_at_{row['k']}"] = row["before"]
        out[f"evaluate.after_ar_at_{row['k']}"] = row["after"]
    for name, summary in (("reader", reader["reader"]), ("distill", distilled["distill"])):
        for key in ("last_loss", "steps"):
            if summary.get(key) is not None:
                out[f"{name}.{key}"] = summary[key]
    for prefix, gate in (("gate", distilled["gate"]), ("reader_gate", reader["reader_gate"])):
        if "promoted" in gate:
            out[f"{prefix}.promoted"] = float(gate["promoted"])
        out.update({f"{prefix}.{k}": gate[k] for k in ("gain", "gain_low", "gain_high", "n") if gate.get(k) is not None})
    return out


def _distillation_run_artifact(ctx: Context, run: Any, reader: dict[str, Any], scored: dict[str, Any],
                               distilled: dict[str, Any]) -> None:
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    uri = ctx.cfg.workspace.tracking_uri
    steps = [(name, run_link(mlflow.get_run(summary["mlflow_run_id"]), uri))
             for name, summary in (("train-reader", reader), ("score-passages", scored),
                                   ("distill-preranker", distilled))]
    md = distillation_run_markdown(
        ctx.cfg.corpus, ctx.corpus.version, run_link(run, uri), steps, reader["reader_eval"],
        {"name": ctx.cfg.reader_registry_name, **reader["reader_gate"]}, int(distilled["evaluate"].get("questions", 0)),
        distilled["answer_recall"], {"name": ctx.cfg.registry_name, **distilled["gate"]})
    create_markdown_artifact(key=f"distillation-run-{ctx.cfg.corpus}".lower().replace("_", "-"), markdown=md,
                             description="the distillation's steps and MLflow runs, reader EM, pre-ranker answer recall")


COMMANDS = [
    FlowCommand("distill", "FunnelRAG L2G distillation: reader → attention labels → BPR pre-ranker (+ registry gate)",
                DistillationConfig, distillation_run_flow),
    FlowCommand("train-reader", "funnel candidates of NQ questions and the FiD reader trained on them",
                DistillationConfig, train_reader_flow),
    FlowCommand("score-passages", "FiD cross-attention scores (Eq. 3) and L2G labels (Eq. 4/5)",
                DistillationConfig, score_passages_flow),
    FlowCommand("distill-preranker", "BPR distillation of the pre-ranker (Eq. 6), dev answer recall, registry gate",
                DistillationConfig, distill_preranker_flow),
]
