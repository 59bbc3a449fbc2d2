"""Prefect flows of DR-RAG (Hei et al. 2024) on HotpotQA.

* ``train-dr-rag-classifier``: collection → Appendix A.1 pairs → fine-tune C(q, d1, d2) with the
  shared accelerate loop → score dev pairs → register in MLflow (champion/challenger gate on
  the dev pair AUC).
* ``evaluate-dr-rag``: collection → SM embeddings → BM25 / SM / QDC rankings → CIS and CFS with
  the classifier → the paper's Table 5 (recall of supporting paragraphs and documents kept,
  per top-k).
* ``dr-rag``: both, the evaluation using the model just trained.

Stages are pure functions in :mod:`tasks.dr_rag.stages`; collection, embeddings, rankings and
pairs are cached on the content of their inputs (:class:`funnelrag.store.StageCache`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from pydantic import Field

from flows.artifacts import summary_artifact
from funnelrag.config import FlowCommand, FlowConfig, resolve_flow_config
from funnelrag.registry import download_model, model_uri, register_model
from funnelrag.stages import hash_path, resolve_dataset, run_cached, stage_task
from funnelrag.store import StageCache, StageResult, write_json
from funnelrag.tracking import configure, flow_run, log_artifact, log_metrics
from funnelrag.workspace import Workspace
from models.dr_rag import ClassifierConfig
from tasks.corpus.index import BM25Config
from tasks.dr_rag import stages as S
from tasks.dr_rag.evaluate import EvalConfig, table5_wide
from tasks.dr_rag.pairs import PairSamplingConfig
from tasks.dr_rag.retrieval import SMConfig

log = logging.getLogger(__name__)

EXPERIMENT = "dr-rag"


class DRRAGConfig(FlowConfig):
    """Configuration of the DR-RAG flows (defaults: the real HotpotQA subsample, MiniLM).

    classifier_source : where ``evaluate-dr-rag`` gets the classifier: a registry alias
        (``champion``, ``challenger``), a version number, or a local model directory.
    register_classifier : register the trained classifier in the MLflow model registry.

    Defaults are sized for a 2-core CPU (a few CPU-minutes): the classifier reads 128 tokens
    (question up to 48, the rest shared by d1 and d2) and fine-tunes its top 3 layers for one
    epoch over the balanced pairs of the train questions.
    """

    data: S.HotpotQADataConfig = S.HotpotQADataConfig()
    pairs: PairSamplingConfig = PairSamplingConfig()
    classifier: ClassifierConfig = ClassifierConfig(max_length=128, max_query_tokens=48)
    train: S.ClassifierTrainConfig = S.ClassifierTrainConfig(lr=1e-4, warmup_steps=10, trainable_layers=3)
    sm: SMConfig = SMConfig()
    bm25: BM25Config = BM25Config()
    eval: EvalConfig = EvalConfig()
    registry_name: str = "funnelrag-dr-rag-classifier"
    register_classifier: bool = True
    classifier_source: str = Field(default="champion")


def _data_file(cfg: DRRAGConfig, ws: Workspace) -> tuple[Path, str]:
    if cfg.data.path:
        return hash_path(cfg.data.path, "data.path")
    return resolve_dataset(cfg.data.dataset, cfg.workspace.data_mirror, ws.downloads_dir)


@stage_task("dr-rag-collection")
def collection_task(cache: StageCache, path: Path, sha: str, cfg: S.HotpotQADataConfig) -> StageResult:
    return run_cached(cache, S.run_collection, cfg, {"data": sha}, lambda out, _: S.run_collection(path, cfg, out))


@stage_task("dr-rag-embeddings")
def embeddings_task(cache: StageCache, coll: StageResult, cfg: SMConfig) -> StageResult:
    inputs = {"paragraphs": coll.files["paragraphs.hotpotqa.parquet"]}
    return run_cached(cache, S.run_embeddings, cfg, inputs, lambda out, _: S.run_embeddings(coll.path, cfg, out))


@stage_task("dr-rag-rankings")
def rankings_task(cache: StageCache, coll: StageResult, emb: StageResult, cfg: DRRAGConfig) -> StageResult:
    key_cfg = {"sm": cfg.sm, "bm25": cfg.bm25, "top_ks": cfg.eval.top_ks, "k1": cfg.eval.k1,
               "base": cfg.eval.base, "max_candidates": cfg.eval.max_candidates}
    return run_cached(cache, S.run_rankings, key_cfg, {"collection": coll.digest, "embeddings": emb.digest},
                      lambda out, _: S.run_rankings(coll.path, emb.path, cfg.sm, cfg.bm25, cfg.eval, out))


@stage_task("dr-rag-pairs")
def pairs_task(cache: StageCache, coll: StageResult, cfg: PairSamplingConfig) -> StageResult:
    return run_cached(cache, S.run_pairs, cfg, {"collection": coll.digest}, lambda out, _: S.run_pairs(coll.path, cfg, out))


@task(name="dr-rag-train-classifier", cache_policy=NO_CACHE)
def train_task(coll: StageResult, pairs: StageResult, cfg: DRRAGConfig, out: Path) -> dict:
    return S.run_train(coll.path, pairs.path, cfg.classifier, cfg.train, cfg.eval.threshold, out,
                       log_metrics=lambda m, step: log_metrics(m, step=step))


@task(name="dr-rag-evaluate", cache_policy=NO_CACHE)
def evaluate_task(coll: StageResult, rankings: StageResult, classifier_dir: Path, cfg: DRRAGConfig, out: Path) -> dict:
    return S.run_evaluate(coll.path, rankings.path, classifier_dir, cfg.eval, out, cfg.train.score_batch_size)


def _prepare(cfg: DRRAGConfig) -> tuple[Workspace, StageCache, StageResult]:
    ws = Workspace(cfg.workspace.home)
    cache = StageCache(ws.cache_dir / "dr_rag")
    path, sha = _data_file(cfg, ws)
    return ws, cache, collection_task(cache, path, sha, cfg.data)


@flow(name="train-dr-rag-classifier")
def train_dr_rag_classifier_flow(config: DRRAGConfig | None = None, config_file: str | None = None,
                                 overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Train, evaluate on dev pairs, and register the DR-RAG classifier; returns the summary."""
    config = resolve_flow_config(DRRAGConfig, config, config_file, overrides, home)

    logger = get_run_logger()
    ws, cache, coll = _prepare(config)
    if not coll.summary["train_questions"]:
        raise ValueError(f"data: split {config.data.split} leaves no train question of {coll.summary['questions']} "
                         "(lower data.split.dev_fraction)")
    with flow_run(ws, EXPERIMENT, "dr-rag-train", config.model_dump(exclude={"workspace"}),
                  tracking_uri=config.workspace.tracking_uri, tags={"flow": "train-dr-rag-classifier"}) as run:
        pairs = pairs_task(cache, coll, config.pairs)
        logger.info("collection %s; pairs %s", coll.summary, pairs.summary)
        out = ws.run_dir("dr-rag-train", run.info.run_id)
        stats = train_task(coll, pairs, config, out)
        log_metrics({k: v for k, v in stats.items() if isinstance(v, (int, float))})
        summary: dict[str, Any] = {"collection": coll.summary, "pairs": pairs.summary, "train": stats,
                                   "classifier_dir": str(out / "classifier"), "mlflow_run_id": run.info.run_id}
        if config.register_classifier:
            decision = register_model(out / "classifier", config.registry_name, config=config.model_dump(exclude={"workspace"}),
                                      data_version=coll.digest, gate_metric="dev_pair_auc",
                                      metrics={"dev_pair_auc": stats["dev_pair_auc"],
                                               "dev_pair_accuracy": stats["dev_pair_accuracy"]})
            summary["registry"] = {"name": decision.name, "version": decision.version,
                                   "promoted": decision.promoted, "reason": decision.reason}
        write_json(out / "summary.json", summary)
        log_artifact(out / "summary.json")
        log_artifact(pairs.path / "classifier_pairs.parquet")
        summary_artifact("train-dr-rag-classifier", "train-dr-rag-classifier: C(q, d1, d2)", run,
                         config.workspace.tracking_uri, summary, "DR-RAG classifier: training, dev pairs, registry gate")
    return summary


def resolve_classifier(cfg: DRRAGConfig, ws: Workspace, dst: Path) -> Path:
    """The classifier directory named by ``cfg.classifier_source`` (local directory, registry
    alias or version number; registry models are downloaded into ``dst``)."""
    local = Path(cfg.classifier_source)
    if local.is_dir():
        return local
    configure(ws, cfg.workspace.tracking_uri)
    return download_model(model_uri(cfg.registry_name, cfg.classifier_source), dst)


@flow(name="evaluate-dr-rag")
def evaluate_dr_rag_flow(config: DRRAGConfig | None = None, config_file: str | None = None,
                         overrides: list[str] | None = None, home: str | None = None, classifier_dir: str | None = None) -> dict[str, Any]:
    """BM25 / SM / QDC / CIS / CFS on the dev questions: the paper's Table 5 for ``eval.top_ks``.

    A file of one's own (``data.path``) evaluated with a registered or local classifier (no
    ``classifier_dir`` from a training in the same run) is evaluated whole: every question is a
    dev question (``data.split.dev_fraction`` = 1), since that classifier was not trained on it.
    """
    config = resolve_flow_config(DRRAGConfig, config, config_file, overrides, home)
    if config.data.path and classifier_dir is None and config.data.split.dev_fraction != 1.0:
        whole = dataclasses.replace(config.data, split=dataclasses.replace(config.data.split, dev_fraction=1.0))
        config = config.model_copy(update={"data": whole})

    logger = get_run_logger()
    ws, cache, coll = _prepare(config)
    t0 = time.perf_counter()
    emb = embeddings_task(cache, coll, config.sm)
    rankings = rankings_task(cache, coll, emb, config)
    logger.info("embeddings %s; rankings %s", emb.summary, rankings.summary)
    with flow_run(ws, EXPERIMENT, "dr-rag-evaluate", config.model_dump(exclude={"workspace"}),
                  tracking_uri=config.workspace.tracking_uri, tags={"flow": "evaluate-dr-rag"}) as run:
        out = ws.run_dir("dr-rag-evaluate", run.info.run_id)
        clf_dir = Path(classifier_dir) if classifier_dir else resolve_classifier(config, ws, out / "classifier")
        result = evaluate_task(coll, rankings, clf_dir, config, out)
        rows = result["rows"]
        for r in rows:
            log_metrics({f"recall_{r['method']}_k{r['k']}": r["recall"], f"docs_{r['method']}_k{r['k']}": r["mean_docs"],
                         f"all_supporting_{r['method']}_k{r['k']}": r["all_supporting"]})
        wide = table5_wide(rows)
        summary = {"dev_questions": coll.summary["dev_questions"], "paragraphs": coll.summary["paragraphs"],
                   "classifier": str(clf_dir), "threshold": config.eval.threshold, "table5": wide,
                   "classifier_calls": result["classifier_calls"],
                   "cache_hits": {"collection": coll.cache_hit, "embeddings": emb.cache_hit, "rankings": rankings.cache_hit},
                   "seconds": time.perf_counter() - t0, "mlflow_run_id": run.info.run_id}
        write_json(out / "table5.json", {"rows": rows, "wide": wide})
        for f in ("table5.json", "table5.dev.parquet", "selections.dev.parquet"):
            log_artifact(out / f)
        create_markdown_artifact(key="dr-rag-table5", markdown=table5_markdown(rows), description="DR-RAG Table 5")
    return summary


def table5_markdown(rows: list[dict]) -> str:
    """Table 5 as markdown: one row per method, recall / documents kept per top-k."""
    ks = sorted({r["k"] for r in rows})
    by = {(r["method"], r["k"]): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = ["| method | " + " | ".join(f"recall@{k} | docs@{k}" for k in ks) + " |",
             "|---|" + "---:|---:|" * len(ks)]
    for m in methods:
        cells = [f"{by[(m, k)]['recall']:.4f} | {by[(m, k)]['mean_docs']:.2f}" if (m, k) in by else " | " for k in ks]
        lines.append(f"| {m.upper()} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@flow(name="dr-rag")
def dr_rag_flow(config: DRRAGConfig | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Train the classifier, then evaluate Table 5 with it (two MLflow runs)."""
    config = resolve_flow_config(DRRAGConfig, config, config_file, overrides, home)
    trained = train_dr_rag_classifier_flow(config)
    evaluated = evaluate_dr_rag_flow(config, classifier_dir=trained["classifier_dir"])
    return {"train": trained["train"], "registry": trained.get("registry", {}), **evaluated}


COMMANDS = [
    FlowCommand("dr-rag", "train the DR-RAG classifier and print Table 5 (BM25, SM, QDC, CIS, CFS) on HotpotQA",
                DRRAGConfig, dr_rag_flow),
    FlowCommand("dr-rag-train", "train and register the DR-RAG classifier C(q, d1, d2) on HotpotQA",
                DRRAGConfig, train_dr_rag_classifier_flow),
    FlowCommand("dr-rag-evaluate", "evaluate DR-RAG (Table 5) with a registered or local classifier",
                DRRAGConfig, evaluate_dr_rag_flow),
]
