"""R²AG flows: ``train-r2former`` and ``evaluate-r2ag``.

``funnelrag train-r2former`` builds the ranked lists (HotpotQA context paragraphs or NQ-open BM25
lists over the published corpus), extracts the retrieval features with the MiniLM bi-encoder,
trains the R²-Former with the QDM loss (and one R²-Former per feature ablation), optionally
trains the projection into a generator jointly (Eq. 9), and prints MAP / recall@k of the QDM
ranking against the retriever's. ``funnelrag evaluate-r2ag`` scores a trained model on the held-out
questions and, when the model has a generator, generates answers through ``<R>`` prompts.

Stage cores live in :mod:`tasks.r2ag`; the features stage is cached on content (data-file
sha256, corpus manifest digest, configs) in the workspace's stage cache.

Commands::

    funnelrag train-r2former                                # HotpotQA subsample, full + 3 ablations
    funnelrag train-r2former --set data.dataset=nq --set data.max_questions=1000   # needs build-corpus
    funnelrag train-r2former --set joint.enabled=true       # + projection into a generator (Eq. 9)
    funnelrag evaluate-r2ag --set model_uri=models:/r2ag-r2former-hotpotqa@champion
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from pydantic import Field

from data_contracts import r2ag as R
from data_contracts.base import atomic_write_bytes
from flows.artifacts import summary_artifact
from funnelrag import datasets, tracking
from funnelrag.config import FlowCommand, FlowConfig, config_hash, resolve_flow_config
from funnelrag.datasets import resolve
from funnelrag.registry import download_model, register_model
from funnelrag.stages import hash_path, resolve_dataset, run_cached
from funnelrag.store import StageCache, write_json
from funnelrag.workspace import Workspace
from models.encoders import BiEncoder, EncoderConfig, resolve_model_path
from models.r2ag_generator import has_generator, load_r2ag, save_r2ag
from models.r2former import R2FormerConfig, load_r2former, save_r2former
from tasks.corpus.published import open_corpus
from tasks.r2ag.features import FeatureConfig
from tasks.r2ag.generation import (
    JointConfig,
    R2AGGeneratorConfig,
    answer_accuracy,
    generate_answers,
    prompted_lists,
    train_joint,
)
from tasks.r2ag.lists import ListConfig
from tasks.r2ag.prompting import PromptConfig
from tasks.r2ag.qdm import qdm_score_table, score_lists
from tasks.r2ag.stages import (
    QDMTrainConfig,
    R2AGDataConfig,
    build_lists_and_features,
    compare_rankings,
    mlflow_key,
    split_examples,
    test_query_ids,
    train_qdm,
    variants,
)

log = logging.getLogger(__name__)

EXPERIMENT = "r2ag"
REGISTERED_MODEL = "r2ag-r2former-{dataset}"  # one registered model per dataset (gates compare like with like)
GATE_METRIC = "qdm_full/map"  # held-out lists
LATEST_POINTER = "LATEST-{dataset}"  # model dir of the latest train-r2former run per dataset


class R2AGListsConfig(FlowConfig):
    """What both R²AG flows read: questions, ranked lists, retrieval features and their encoder
    (``evaluate-r2ag`` must use the settings the model was trained on)."""

    data: R2AGDataConfig = Field(default_factory=R2AGDataConfig)
    lists: ListConfig = Field(default_factory=ListConfig)
    features: FeatureConfig = Field(default_factory=FeatureConfig)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)


class TrainR2FormerConfig(R2AGListsConfig):
    """``train-r2former``: the lists, then R²-Former, QDM training and the joint stage."""

    model: R2FormerConfig = Field(default_factory=R2FormerConfig)
    train: QDMTrainConfig = Field(default_factory=QDMTrainConfig)
    joint: JointConfig = Field(default_factory=JointConfig)


@dataclass(frozen=True)
class R2AGGenerationConfig:
    """Answer generation in ``evaluate-r2ag`` (only for models trained with a generator).

    enabled : generate when the model directory holds a generator.
    max_lists : generate for at most this many test lists; None = all.
    batch_size, max_new_tokens : decoding settings (greedy, as in the paper).
    """

    enabled: bool = True
    max_lists: int | None = 64
    batch_size: int = 8
    max_new_tokens: int = 16


class EvaluateR2AGConfig(R2AGListsConfig):
    """``evaluate-r2ag``: which trained model, on which data (must match its training features).

    model_dir : a model directory written by ``train-r2former``.
    model_uri : a registry URI instead (``models:/r2ag-r2former-hotpotqa@champion``, ``.../3``).
    With neither, the model of the latest ``train-r2former`` run on the same dataset is used.
    """

    model_dir: Path | None = None
    model_uri: str | None = None
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    generation: R2AGGenerationConfig = Field(default_factory=R2AGGenerationConfig)


def data_file(data: R2AGDataConfig, mirror: Path | None, downloads_dir: Path) -> tuple[Path, str]:
    """``(path, sha256)`` of the questions R²AG reads: ``data.path`` when set, else the registered
    ``data.hotpotqa_file`` / ``data.nq_file`` of ``data.dataset``.

    Raises
    ------
    FileNotFoundError
        ``data.path`` does not exist (named).
    ValueError
        A registered-name setting holds a name that is not registered (a file path there is
        pointed to ``data.path``).
    """
    if data.path:
        return hash_path(data.path, "data.path")
    key = "hotpotqa_file" if data.dataset == "hotpotqa" else "nq_file"
    name = getattr(data, key)
    if name not in datasets.REGISTRY:
        hint = f"; give a file of your own as data.path={name}" if Path(name).suffix else ""
        raise ValueError(f"data.{key}: {name!r} is not a registered data set (known: "
                         f"{', '.join(sorted(datasets.REGISTRY))}){hint}")
    return resolve_dataset(name, mirror, downloads_dir)


# ---------------------------------------------------------------------------- tasks
@task(name="r2ag-features", cache_policy=NO_CACHE)
def features_task(ws: Workspace, mirror: Path | None, data: R2AGDataConfig, lists_cfg: ListConfig,
                  feat_cfg: FeatureConfig, enc_cfg: EncoderConfig):
    """Ranked lists + retrieval features, cached on content; returns (lists, features, report)."""
    path, sha = data_file(data, mirror, ws.downloads_dir)
    inputs = {"data": sha}
    corpus = None
    if data.dataset == "nq":
        corpus = open_corpus(ws, name=data.corpus, version=data.corpus_version)
        inputs["corpus"] = corpus.digest
    data_version = inputs.get("corpus", inputs["data"])  # corpus manifest sha256, else the data file's
    key_cfg = {"data": data, "lists": lists_cfg, "features": feat_cfg, "encoder": enc_cfg}

    def build(tmp: Path, _key: str) -> dict:
        encoder, tokenizer = BiEncoder.from_pretrained(enc_cfg)
        lists, features, report = build_lists_and_features(data, lists_cfg, feat_cfg, encoder, tokenizer,
                                                           data_path=path, corpus=corpus)
        R.RANKED_LISTS.write(lists, tmp)
        R.RETRIEVAL_FEATURES.write(features, tmp)
        return report

    result = run_cached(StageCache(ws.cache_dir / EXPERIMENT), build_lists_and_features, key_cfg, inputs, build)
    lists = R.RANKED_LISTS.read(result.path)
    features = R.RETRIEVAL_FEATURES.read(result.path)
    return lists, features, {**result.summary, "cache_hit": result.cache_hit, "stage_key": result.path.name[:16],
                             "data_version": data_version}


@task(name="r2ag-train-qdm", cache_policy=NO_CACHE)
def train_qdm_task(train, features, model_cfg, train_cfg, output_dir: Path, run_id: str | None, variant: str):
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    def log_metrics(metrics: dict, step: int) -> None:
        if run_id is not None:
            mlflow.log_metrics({mlflow_key(variant, k): float(v) for k, v in metrics.items()},
                               step=step, run_id=run_id)

    return train_qdm(train, features, model_cfg, train_cfg, output_dir, log_metrics)


@task(name="r2ag-joint", cache_policy=NO_CACHE)
def joint_task(retrieval, train, lists, joint: JointConfig, mirror: Path | None, ws: Workspace,
               output_dir: Path, run_id: str | None):
    """Eq. 9 training of R²-Former + projection (+ generator); returns (model, tokenizer, report)."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    def log_metrics(metrics: dict, step: int) -> None:
        if run_id is not None:
            mlflow.log_metrics({f"joint/{k}": float(v) for k, v in metrics.items()}, step=step, run_id=run_id)

    joint = replace(joint, generator=_resolve_tokenizer(joint.generator, mirror, ws))
    return train_joint(retrieval, train, _list_texts(lists), joint, output_dir, log_metrics)


# ---------------------------------------------------------------------------- helpers
def _resolve_tokenizer(gcfg: R2AGGeneratorConfig, mirror: Path | None, ws: Workspace) -> R2AGGeneratorConfig:
    """Resolve the tokenizer aliases ``"t5"`` (data mirror) and ``"minilm"`` to directories."""
    if gcfg.tokenizer == "t5":
        resolve("t5-tokenizer-config", mirror, cache_dir=ws.downloads_dir)
        return replace(gcfg, tokenizer=str(resolve("t5-tokenizer", mirror, cache_dir=ws.downloads_dir).parent))
    if gcfg.tokenizer == "minilm":
        return replace(gcfg, tokenizer=resolve_model_path("minilm"))
    return gcfg


def _list_texts(lists) -> dict:
    """``query_id -> (question, answers, [(title, text)] in rank order)``."""
    table = lists.sort_by([("query_id", "ascending"), ("rank", "ascending")])
    out: dict = {}
    for qid, q, ans, title, text in zip(*(table[c].to_pylist() for c in ("query_id", "question", "answers", "title", "text"))):
        out.setdefault(qid, (q, ans, []))[2].append((title, text))
    return out


def _mlflow_run(ws: Workspace, cfg, name: str):
    return tracking.flow_run(ws, EXPERIMENT, name, cfg, tracking_uri=cfg.workspace.tracking_uri,
                             tags={"flow": name, "dataset": cfg.data.dataset})


def _register(model_dir: Path, cfg, data_version: str, rows: list[dict]):
    """Register the model directory (``funnelrag.registry``), gated on the QDM MAP of the held-out
    lists; needs the active MLflow run. Returns the registry's GateDecision."""
    metrics = {mlflow_key(r["ranking"], k): float(v) for r in rows for k, v in r.items()
               if k != "ranking" and v == v}
    return register_model(model_dir, REGISTERED_MODEL.format(dataset=cfg.data.dataset), config=cfg,
                          data_version=data_version, metrics=metrics, gate_metric=GATE_METRIC,
                          tags={"dataset": cfg.data.dataset})


# ---------------------------------------------------------------------------- flows
@flow(name="train-r2former")
def train_r2former_flow(cfg: TrainR2FormerConfig | None = None, config_file: str | None = None,
                        overrides: list[str] | None = None, home: str | None = None) -> dict:
    """Train the R²-Former (QDM, Eqs. 7–8) and its feature ablations; compare rankings."""
    cfg = resolve_flow_config(TrainR2FormerConfig, cfg, config_file, overrides, home)
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    ws = Workspace(cfg.workspace.home)
    mirror = cfg.workspace.data_mirror
    run_dir = ws.run_dir("train-r2former", config_hash(cfg.model_dump(exclude={"workspace"}))[:16])
    t0 = time.perf_counter()
    lists, features, feat_report = features_task(ws, mirror, cfg.data, cfg.lists, cfg.features, cfg.encoder)
    seconds = {"features": time.perf_counter() - t0}
    train, test = split_examples(features, test_query_ids(lists, cfg.data))
    if not train or not test:
        raise ValueError(f"train/test split of {len(train) + len(test)} lists is empty on one side "
                         f"(train {len(train)}, test {len(test)}); use more questions or another test_fraction")
    with _mlflow_run(ws, cfg, "train-r2former") as run:
        run_id = run.info.run_id
        scores, models, losses = {}, {}, {}
        for name, feats in variants(cfg.train).items():
            t0 = time.perf_counter()
            model, step_losses = train_qdm_task(train, feats, cfg.model, cfg.train, run_dir / "train" / name, run_id, name)
            models[name], losses[name] = model, step_losses
            scores[name] = score_lists(model, test, feats)
            save_r2former(model, feats, run_dir / "variants" / name)
            seconds[f"train {name}"] = time.perf_counter() - t0
        model_dir = run_dir / "model"
        full_features = variants(cfg.train)["full"]
        joint_report = None
        if cfg.joint.enabled:
            t0 = time.perf_counter()
            r2ag, tokenizer, joint_report = joint_task(models["full"], train, lists, cfg.joint, mirror, ws,
                                                       run_dir / "train" / "joint", run_id)
            scores["full after joint"] = score_lists(r2ag.retrieval, test, full_features)
            save_r2ag(r2ag, full_features, tokenizer, model_dir)
            seconds["joint"] = time.perf_counter() - t0
        else:
            save_r2former(models["full"], full_features, model_dir)
        metrics_table, rows = compare_rankings(test, scores)
        R.RANKING_METRICS.write(metrics_table, run_dir)
        R.QDM_SCORES.write(_concat([qdm_score_table(n, test, s) for n, s in scores.items()]), run_dir)
        for row in rows:
            mlflow.log_metrics({mlflow_key("test", row["ranking"], k): float(v) for k, v in row.items()
                                if k != "ranking" and v == v}, run_id=run_id)
        summary = {"dataset": cfg.data.dataset, "lists": feat_report, "train_lists": len(train),
                   "test_lists": len(test), "final_train_loss": {n: curve[-1] for n, curve in losses.items()},
                   "ranking (test lists, MAP / recall@k)": rows, "joint": joint_report,
                   "seconds": {k: round(v, 1) for k, v in seconds.items()},
                   "run_dir": str(run_dir), "model_dir": str(model_dir), "mlflow_run_id": run_id}
        write_json(run_dir / "summary.json", summary)
        mlflow.log_artifact(str(run_dir / "summary.json"), run_id=run_id)
        decision = _register(model_dir, cfg, feat_report["data_version"], rows)
        summary["registered"] = {"name": decision.name, "version": decision.version,
                                 "promoted": decision.promoted, "gate": decision.reason}
        summary_artifact(f"train-r2former-{cfg.data.dataset}", f"train-r2former on `{cfg.data.dataset}`", run,
                         cfg.workspace.tracking_uri, summary, "R²-Former (QDM): ranking of the test lists, registry gate")
    atomic_write_bytes(run_dir.parent / LATEST_POINTER.format(dataset=cfg.data.dataset),
                       (str(model_dir) + "\n").encode())
    return summary


@flow(name="evaluate-r2ag")
def evaluate_r2ag_flow(cfg: EvaluateR2AGConfig | None = None, config_file: str | None = None,
                       overrides: list[str] | None = None, home: str | None = None) -> dict:
    """QDM ranking vs the retriever on held-out lists, and answers generated through <R> prompts."""
    cfg = resolve_flow_config(EvaluateR2AGConfig, cfg, config_file, overrides, home)
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    ws = Workspace(cfg.workspace.home)
    run_dir = ws.run_dir("evaluate-r2ag", config_hash(cfg.model_dump(exclude={"workspace"}))[:16])
    model_dir = _model_dir(cfg, ws, run_dir)
    retrieval, feats = load_r2former(model_dir)
    lists, features, feat_report = features_task(ws, cfg.workspace.data_mirror, cfg.data, cfg.lists,
                                                 cfg.features, cfg.encoder)
    _, test = split_examples(features, test_query_ids(lists, cfg.data))
    if not test:
        raise ValueError("no held-out list to evaluate on")
    scores = {"full": score_lists(retrieval, test, feats)}
    metrics_table, rows = compare_rankings(test, scores)
    R.RANKING_METRICS.write(metrics_table, run_dir)
    R.QDM_SCORES.write(qdm_score_table("full", test, scores["full"]), run_dir)
    summary = {"dataset": cfg.data.dataset, "model_dir": str(model_dir), "lists": feat_report,
               "test_lists": len(test), "ranking (test lists, MAP / recall@k)": rows}
    if cfg.generation.enabled and has_generator(model_dir):
        model, tokenizer, _ = load_r2ag(model_dir)
        r_id = model.r_token_id
        items, report = prompted_lists(test[:cfg.generation.max_lists], _list_texts(lists), tokenizer, r_id,
                                       cfg.prompt, with_answer=False)
        preds = generate_answers(model, items, tokenizer, feats, cfg.generation.batch_size,
                                 cfg.generation.max_new_tokens)
        summary["generation"] = {**report, **answer_accuracy(preds, [it.answers for it in items]),
                                 "examples": [{"answers": list(it.answers)[:2], "prediction": p}
                                              for it, p in list(zip(items, preds))[:3]]}
    with _mlflow_run(ws, cfg, "evaluate-r2ag") as run:
        for row in rows:
            mlflow.log_metrics({mlflow_key("test", row["ranking"], k): float(v) for k, v in row.items()
                                if k != "ranking" and v == v})
        if "generation" in summary:
            mlflow.log_metrics({f"generation/{k}": float(v) for k, v in summary["generation"].items()
                                if isinstance(v, (int, float)) and v == v})
        summary["mlflow_run_id"] = run.info.run_id
        summary_artifact(f"evaluate-r2ag-{cfg.data.dataset}", f"evaluate-r2ag on `{cfg.data.dataset}`", run,
                         cfg.workspace.tracking_uri, summary, "R²AG: QDM ranking vs the retriever, <R>-prompted answers")
    write_json(run_dir / "summary.json", summary)
    summary["run_dir"] = str(run_dir)
    return summary


def _model_dir(cfg: EvaluateR2AGConfig, ws: Workspace, run_dir: Path) -> Path:
    """``model_dir``, else the registry ``model_uri`` downloaded into the run, else the latest run's."""
    if cfg.model_dir is not None:
        return Path(cfg.model_dir)
    if cfg.model_uri is not None:
        tracking.configure(ws, cfg.workspace.tracking_uri)
        return download_model(cfg.model_uri, run_dir / "downloaded")
    pointer = ws.run_dir("train-r2former", LATEST_POINTER.format(dataset=cfg.data.dataset))
    if not pointer.exists():
        raise FileNotFoundError(f"no model_dir or model_uri given and no trained R²-Former in {pointer.parent} "
                                "(run train-r2former first)")
    return Path(pointer.read_text().strip())


def _concat(tables):
    return pa.concat_tables(tables)


COMMANDS: list[FlowCommand] = [
    FlowCommand("train-r2former", "R²AG: extract retrieval features, train the R²-Former (QDM) and its feature "
                "ablations, print MAP/recall@k against the retriever", TrainR2FormerConfig,
                lambda cfg: train_r2former_flow(cfg)),
    FlowCommand("evaluate-r2ag", "R²AG: score held-out ranked lists with a trained R²-Former and generate "
                "answers through <R> prompts", EvaluateR2AGConfig, lambda cfg: evaluate_r2ag_flow(cfg)),
]
