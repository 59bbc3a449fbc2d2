"""Prefect flow ``evaluate``: flat vs progressive retrieval on a question set (FunnelRAG Table 2).

For a published corpus version, NQ-open questions (a deterministic sample) and chosen model
versions (pre-rankers by label: the MiniLM baseline and/or registry versions such as the
distilled ``models:/funnelrag-preranker@champion``; the FiD reader), it runs

* flat: BM25 and dense (exact bi-encoder index, cached on corpus digest + model) over passages
  → ``n_retrieve`` passages → top ``n_final``, without and with re-ranking by each pre-ranker;
* progressive: BM25 clusters → K → later chunking → pre-ranker → N units → top ``n_final``
  passages, without and with FiD post-ranking (Eq. 3),

and reports per setting the candidates and seconds per query of every stage, AR@1..4, the
answer recall of the candidate set, the title entropy of the top 4 (Table 9) and the reader's
EM — over all questions and over those whose answer occurs in the corpus. Results go to MLflow
(metrics, tables as Parquet/CSV/markdown, AR@k plot) and to a Prefect markdown artifact.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.utilities.annotations import quote
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.embed import corpus_digest
from flows.run_report import completed, name_run, run_name
from funnelrag import datasets
from funnelrag.config import FlowCommand, FlowConfig, resolve_flow_config
from funnelrag.device import resolve_device
from funnelrag.inputs import QUESTIONS_FILE, check_inputs
from funnelrag.progress import Progress
from funnelrag.registry import link_model_versions, missing_alias
from funnelrag.stages import DataSource
from funnelrag.store import write_json
from funnelrag.threads import torch_threads
from funnelrag.tracking import configure, flow_run, log_metrics, log_question_scores, question_scores_table, run_link
from funnelrag.workspace import Workspace
from tasks.corpus.published import open_corpus
from tasks.corpus.tokenize import load_token_counter
from tasks.evaluate.flat_dense import FlatDenseConfig, build_faiss_index, faiss_retriever
from tasks.evaluate.models import load_preranker_ref, load_reader_ref
from tasks.evaluate.report import (
    SettingSpec,
    metric_dict,
    plot_answer_recall,
    question_scores,
    summarize,
    tables,
    to_markdown,
    write_tables,
)
from tasks.evaluate.retrieval import (
    FlatSetting,
    LabeledPreRanker,
    PassageLookup,
    ProgressiveSetting,
    questions_from_table,
    run_flat,
    run_progressive,
)
from tasks.evaluate.stages import answerability, bm25_retriever, generate_answers, sample_questions, validation_part
from tasks.evaluate.stored_retrieval import StoredPreRanker, fill_lazy_rows, run_progressive_stored
from tasks.evaluate.timing import machine_info
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig
from tasks.funnel.fusion import PassageBM25
from tasks.funnel.embeddings import (
    EmbeddingConfig,
    EmbeddingIndexMismatch,
    corpus_text_keys,
    ensure_embedding_index,
    model_version,
)
from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex, lazy_root
from tasks.qa.generation import CausalLMGenerator, FiDGenerator, GenerationConfig
from tasks.qa.metrics import TokenCache
from tasks.qa.questions import QuestionsConfig, load_questions

log = logging.getLogger(__name__)

EXPERIMENT = "evaluate"
PRERANKER_MODEL = "funnelrag-preranker"   # registered by the distillation flow
READER_MODEL = "funnelrag-reader"


class EvalQuestions(DataSource):
    """Questions: a registered data set and/or files; ``limit`` sampled by hash of (seed, id).

    part : ``all`` the questions, or ``validation``: the validation part of the train split, as the
        distillation experiment cuts it (train split = ``split_of(text, 0, 0.2) == "train"``,
        :class:`tasks.qa.questions.QuestionsConfig`; validation = its questions with
        ``split_of(text, 1, 0.2) == "dev"``, :class:`tasks.funnel.experiment_validation.ValidationConfig`),
        for choosing settings on questions that are neither held out nor NQ-open test (use it
        with ``datasets: [nq-open-dev]``, the NQ-open file the experiment splits).
    """

    datasets: list[str] = Field(default_factory=lambda: ["nq-open-test"])
    expected_file: ClassVar[str] = QUESTIONS_FILE
    format: Literal["auto", "tsv", "jsonl", "dpr-csv"] = "auto"   # auto: by file suffix
    limit: int | None = 200
    seed: int = 0
    part: Literal["all", "validation"] = "all"


class FlatConfig(BaseModel):
    """Flat settings: retrievers over passages, candidates kept, re-ranking on/off."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    retrievers: list[Literal["bm25", "dense"]] = Field(default_factory=lambda: ["bm25", "dense"])
    n_retrieve: int = 400
    rerank: bool = True
    dense_preranker: str = "minilm"   # label in ``prerankers`` whose stored passage vectors flat dense searches
    rerank_vectors: Literal["on-the-fly", "stored"] = "on-the-fly"   # bi-encoder re-ranking from stored vectors
    dense: FlatDenseConfig = FlatDenseConfig()


class GeneratorConfig(BaseModel):
    """EM generator: the FiD reader (``fid``), a causal LM (``causal-lm``, ``model`` = local
    directory or hub name) or none."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["fid", "causal-lm", "none"] = "fid"
    model: str | None = None
    settings: GenerationConfig = GenerationConfig()

    @model_validator(mode="after")
    def _model_for_llm(self) -> "GeneratorConfig":
        if self.kind == "causal-lm" and not self.model:
            raise ValueError("generator.kind=causal-lm needs generator.model (a local directory or hub name)")
        return self


class EvaluateConfig(FlowConfig):
    """Configuration of ``evaluate`` (defaults: Wikispeedia, 200 NQ-open test questions,
    FunnelRAG's funnel sizes K = 80, N = 8, H = 4 and flat 400p → 4p).

    prerankers : label → reference (:mod:`tasks.evaluate.models`): ``minilm`` (the untrained
        baseline, "before distillation"), ``models:/funnelrag-preranker@champion`` (the distilled
        one, "after"), or a saved pre-ranker directory.
    embeddings : where stored passage vectors come from when no matching embedding index is
        published: ``build`` — embed the whole corpus now (then published and reused);
        ``require`` — fail (publish one with ``funnelrag embed-corpus``); ``lazy`` — a lazily
        filled, persisted cache (:mod:`tasks.funnel.lazy_embeddings`): the passages each block
        of questions needs are embedded before the block runs (outside the timed stages, as
        an offline index would be), and flat dense, which needs every vector, is skipped.
    reader : FiD post-ranker and EM generator (``models:/...``, a saved reader directory,
        ``scratch`` for an untrained one, or None).
    on_missing_model : ``skip`` (report it in ``skipped``) or ``error`` when a reference cannot
        be loaded.
    torch_threads : intra-op threads for the run (restored afterwards); per-query latency on a
        shared CPU is far more stable with 1.
    block_questions : settings run interleaved over blocks of this many questions.
    device : ``auto`` (cuda if available) | ``cpu`` | ``cuda[:i]``: where the pre-rankers and the
        reader run (fp32; query-time figures are per device, so the run records it).
    """

    corpus: str = "wikispeedia"
    corpus_version: str | None = None
    questions: EvalQuestions = Field(default_factory=EvalQuestions)
    n_final: int = Field(default=4, ge=1)
    flat: FlatConfig = Field(default_factory=FlatConfig)
    progressive: list[ProgressiveSetting] = Field(default_factory=lambda: [ProgressiveSetting()])
    prerankers: dict[str, str] = Field(default_factory=lambda: {"minilm": "minilm"})
    preranker_batch_size: int = 32
    embeddings: Literal["build", "require", "lazy"] = "build"
    embedding: EmbeddingConfig = EmbeddingConfig()
    reader: str | None = f"models:/{READER_MODEL}@champion"
    post_rank: bool = True
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)
    attention: AttentionScoreConfig = AttentionScoreConfig()
    attention_run: AttentionRunConfig = AttentionRunConfig()
    on_missing_model: Literal["skip", "error"] = "skip"
    torch_threads: int | None = None
    device: str = "auto"
    block_questions: int = Field(default=20, ge=1)
    experiment: str = EXPERIMENT


# ---------------------------------------------------------------------------- tasks
@task(name="evaluate-questions", cache_policy=NO_CACHE)
def questions_task(cfg: EvaluateConfig, ws, passages) -> tuple[Any, dict[str, bool], dict]:
    files = cfg.questions.resolve(cfg.workspace.data_mirror, ws.downloads_dir, "questions.paths")
    table, report = load_questions([p for p, _ in files], QuestionsConfig(format=cfg.questions.format))
    if cfg.questions.part == "validation":
        table = validation_part(table)
    table = sample_questions(table, cfg.questions.limit, cfg.questions.seed)
    in_corpus, seconds = answerability(passages["text"].to_pylist(), table)
    return table, in_corpus, {"load": report.as_dict(), "answerability_seconds": seconds}


@task(name="evaluate-models", cache_policy=NO_CACHE)
def models_task(cfg: EvaluateConfig, download_dir: Path) -> tuple[list, Any, dict[str, dict], dict[str, str]]:
    """Pre-rankers, the reader and their provenance; a missing model is skipped (and reported)
    or raises, per ``on_missing_model``."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    missing = (OSError, ValueError, KeyError, MlflowException)  # no such file / version / alias
    device = resolve_device(cfg.device)
    prerankers, provenance, skipped = [], {}, {}
    for label, ref in sorted(cfg.prerankers.items()):
        try:
            model, tok, resolved = load_preranker_ref(ref, download_dir)
        except missing as exc:
            if cfg.on_missing_model == "error":
                raise
            skipped[f"preranker {label}"] = f"{ref}: {type(exc).__name__}: {exc}"
            continue
        prerankers.append(LabeledPreRanker(label, model.to(device), tok, cfg.preranker_batch_size))
        provenance[f"preranker.{label}"] = {**resolved.as_params(f"preranker.{label}"),
                                            f"preranker.{label}.max_length": str(model.cfg.max_length)}
    reader = None
    if cfg.reader is not None and (cfg.post_rank or cfg.generator.kind == "fid"):
        try:
            tok_dir = datasets.resolve("t5-tokenizer", cfg.workspace.data_mirror).parent if cfg.reader == "scratch" else None
            model, tok, resolved = load_reader_ref(cfg.reader, download_dir, tok_dir)
            reader = (model.to(device), tok)
            provenance["reader"] = resolved.as_params("reader")
        except missing as exc:
            if cfg.on_missing_model == "error":
                raise
            skipped["reader"] = f"{cfg.reader}: {type(exc).__name__}: {exc}"
    return prerankers, reader, provenance, skipped


@task(name="evaluate-embeddings", cache_policy=NO_CACHE)
def embeddings_task(cfg: EvaluateConfig, ws, corpus, preranker) -> tuple[Any, dict]:
    """The published embedding index of (corpus, pre-ranker weights), embedded first when
    ``cfg.embeddings == "build"`` and none is published."""
    digest = corpus_digest(corpus)
    try:
        return ensure_embedding_index(ws.home / "stores", ws.cache_dir, cfg.corpus, digest, corpus.passages,
                                      preranker.model, preranker.tokenizer, cfg.embedding,
                                      build=cfg.embeddings == "build")
    except (FileNotFoundError, EmbeddingIndexMismatch):
        if cfg.embeddings != "lazy":
            raise
    version = model_version(preranker.model)
    enc = preranker.model.encoder
    index = LazyEmbeddingIndex.open(lazy_root(ws.cache_dir, version), corpus.passages, digest, version,
                                    enc.backbone.config.hidden_size, enc.cfg.max_length,
                                    keys=corpus_text_keys(ws.cache_dir, digest, corpus.passages))
    return index, {"lazy": True, "model_version": version, "filled_before": index.n_filled, "fill_seconds": 0.0}


@task(name="evaluate-progressive-stored", cache_policy=NO_CACHE)
def progressive_stored_task(questions, cluster_index, index, lookup, setting: ProgressiveSetting, preranker,
                            tokens, reader, cfg: EvaluateConfig, passage_bm25=None) -> dict:
    return run_progressive_stored(questions, cluster_index, index, lookup, setting, preranker, tokens, reader,
                                  cfg.attention, cfg.attention_run, passage_bm25)


@task(name="evaluate-flat", cache_policy=NO_CACHE)
def flat_task(questions, retrieve, lookup, setting: FlatSetting, prerankers, tokens) -> dict:
    return run_flat(questions, retrieve, lookup, setting, prerankers, tokens)


@task(name="evaluate-progressive", cache_policy=NO_CACHE)
def progressive_task(questions, cluster_index, members_of, seg_cfg, counter, setting: ProgressiveSetting, preranker,
                     reader, cfg: EvaluateConfig) -> dict:
    return run_progressive(questions, cluster_index, members_of, seg_cfg, counter, setting,
                           preranker, reader, cfg.attention, cfg.attention_run)


@task(name="evaluate-generate", cache_policy=NO_CACHE)
def generate_task(generator, settings, question_text: dict[str, str]):
    return generate_answers(generator, settings, question_text)


# ---------------------------------------------------------------------------- publishing
def publish_results(cfg: EvaluateConfig, corpus, run, run_dir: Path, rows, info: dict, seconds: float,
                    question_text: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the tables (Parquet, CSV, markdown; AR@k and EM with 95% intervals), the AR@k plot and
    ``summary.json`` into the run directory, log them and the metrics to MLflow with the
    per-question results (``per_question`` artifact, ``question_text`` by question id) and each
    figure's 95% interval, and create the Prefect markdown artifact."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    results, stages, per_q = tables(*rows)
    n_questions = results["n_questions"][0].as_py() if results.num_rows else 0
    title = f"evaluate `{cfg.corpus}` version `{corpus.version}`: {n_questions} questions"
    md = to_markdown(results, stages, title, per_q)
    files = write_tables(run_dir, results, stages, per_q, md)
    files.append(plot_answer_recall(results, run_dir / "answer_recall_at_k.png"))
    all_rows = [r for r in results.to_pylist() if r["subset"] == "all"]
    in_corpus = {r["setting"]: r for r in results.to_pylist() if r["subset"] == "answer_in_corpus"}
    summary = {
        "corpus": cfg.corpus, "corpus_version": corpus.version,
        "questions": all_rows[0]["n_questions"] if all_rows else 0,
        "answer_in_corpus": next(iter(in_corpus.values()))["n_questions"] if in_corpus else 0,
        "table": [{"setting": r["setting"], "funnel": r["funnel"], "s/query": r["seconds_per_query"],
                   "AR@1": r["ar_1"], "AR@4": r["ar_4"], "AR cand": r["ar_candidates"], "entropy": r["entropy_top4"],
                   "EM": "–" if r["em"] is None else r["em"], "AR@4 in-corpus": in_corpus[r["setting"]]["ar_4"]}
                  for r in all_rows],
        **info, "artifacts": str(run_dir), "mlflow_run_id": run.info.run_id, "total_seconds": seconds,
    }
    write_json(run_dir / "summary.json", summary)
    log_metrics({**metric_dict(results, stages), "questions": summary["questions"],
                 "answer_in_corpus": summary["answer_in_corpus"], "seconds_total": seconds})
    for f in [*files, run_dir / "summary.json"]:
        mlflow.log_artifact(str(f), artifact_path="evaluation")
    # per-question results (for paired comparisons: funnelrag compare) and each figure's 95% interval
    log_question_scores(question_scores_table(question_scores(per_q), question_text),
                        run_dir / "per_question")
    used = []
    for params in info.get("models", {}).values():
        mlflow.log_params(params)
        used += [(v, params[k.replace(".registry_name", ".registry_version")]) for k, v in params.items()
                 if k.endswith(".registry_name") and k.replace(".registry_name", ".registry_version") in params]
    # the registered versions this evaluation used: tags, and its figures on their logged models
    link_model_versions(sorted(set(used)), metric_dict(results, stages))
    mlflow.set_tags({"corpus_digest": corpus.digest, "skipped": json.dumps(sorted(info.get("skipped", {}))),
                     **{f"machine.{k}": str(v) for k, v in info.get("machine", {}).items()}})
    create_markdown_artifact(key=_slug(f"evaluate-{cfg.corpus}"),
                             markdown=f"{md}\n\nMLflow run: {run_link(run, cfg.workspace.tracking_uri)} (the AR@k plot "
                                      "`evaluation/answer_recall_at_k.png` is among its artifacts)\n",
                             description="flat vs progressive retrieval")
    return summary


# ---------------------------------------------------------------------------- flow
def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text).strip("-").lower()


@flow(name="evaluate", log_prints=True)
def evaluate_flow(config: EvaluateConfig | None = None, config_file: str | None = None,
                  overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Evaluate flat and progressive retrieval; returns the summary printed by the CLI.

    ``config_file``, ``home`` and dotted ``overrides`` merge key by key
    (:func:`funnelrag.config.resolve_flow_config`); the ``evaluate-champion`` automation
    passes the home and the corpus version a build just made current this way.
    """
    config = resolve_flow_config(EvaluateConfig, config, config_file, overrides, home)
    check_inputs(config)   # before MLflow and the corpus: a wrong questions path fails in a second
    name_run(run_name("evaluate", config.corpus, config.corpus_version))
    absent = _absent_required_models(config)
    if absent:   # e.g. the evaluate-champion automation on a home with no champion yet
        message = "nothing to evaluate: " + "; ".join(absent)
        get_run_logger().info(message)
        return completed(message, {"corpus": config.corpus, "skipped": message})
    with torch_threads(config.torch_threads):
        summary = _evaluate(config)
    return completed(evaluate_message(summary), summary)


def evaluate_message(summary: dict[str, Any]) -> str:
    """State message of an ``evaluate`` run: the number of settings and questions and the
    setting with the best AR@4 (``evaluated 6 settings on 300 questions; best AR@4 0.187:
    flat-bm25-50p-minilm-4p``)."""
    table = summary.get("table") or []
    head = f"evaluated {len(table)} setting{'s' if len(table) != 1 else ''} on {summary.get('questions', 0):,} questions"
    if not table:
        return head
    best = max(table, key=lambda r: r["AR@4"])
    return f"{head}; best AR@4 {best['AR@4']:.3f}: {best['setting']}"


def _absent_required_models(config: EvaluateConfig) -> list[str]:
    """Why required registry aliases (``on_missing_model: error``) name no version yet, if so."""
    if config.on_missing_model != "error":
        return []
    refs = [*config.prerankers.values(), *([config.reader] if config.reader else [])]
    if not any(r.startswith("models:/") and "@" in r for r in refs):
        return []
    configure(Workspace(config.workspace.home), config.workspace.tracking_uri)
    return [why for why in map(missing_alias, refs) if why is not None]


def _evaluate(config: EvaluateConfig) -> dict[str, Any]:
    logger = get_run_logger()
    t_flow = time.perf_counter()
    ws = Workspace(config.workspace.home)
    corpus = open_corpus(ws, config.corpus, config.corpus_version)
    seg_cfg = corpus.segment_config()   # later chunking = the corpus build's
    counter = load_token_counter(seg_cfg.tokenizer, config.workspace.data_mirror)
    with flow_run(ws, config.experiment, f"evaluate-{config.corpus}", config.model_dump(exclude={"workspace"}),
                  tracking_uri=config.workspace.tracking_uri,
                  tags={"corpus": config.corpus, "corpus_version": corpus.version}) as run:
        run_dir = ws.run_dir("evaluate", run.info.run_id)
        passages = corpus.passages
        qtable, in_corpus, qinfo = questions_task(config, ws, quote(passages))
        logger.info("%d questions, %d with an answer in the corpus (%.1f s)", qtable.num_rows,
                    sum(in_corpus.values()), qinfo["answerability_seconds"])
        prerankers, reader, provenance, skipped = models_task(config, run_dir / "models")
        gen = None
        if config.generator.kind == "fid" and reader is not None:
            gen = FiDGenerator(f"fid:{config.reader}", reader[0], reader[1], config.generator.settings)
        elif config.generator.kind == "causal-lm":
            gen = CausalLMGenerator(f"llm:{config.generator.model}", config.generator.model, config.generator.settings)
        questions, tokens = questions_from_table(qtable), TokenCache()
        answers = {q.question_id: q.answers for q in questions}
        qtext = {q.question_id: q.question for q in questions}
        reader_label = "fid" if reader is not None and config.post_rank else ""
        info: dict[str, Any] = {"question_load": qinfo, "models": provenance, "skipped": skipped,
                                "machine": {**machine_info(), "device": resolve_device(config.device)}}
        lookup = PassageLookup(passages)
        flat = FlatSetting(n_retrieve=config.flat.n_retrieve, n_final=config.n_final)
        by_label = {pr.label: pr for pr in prerankers}
        vectors: dict[str, Any] = {}
        info["embeddings"] = {}

        def stored_vectors(pr) -> Any:
            """The embedding index of a bi-encoder pre-ranker (built or loaded once per run)."""
            if pr.label not in vectors:
                vectors[pr.label], info["embeddings"][pr.label] = embeddings_task(config, ws, quote(corpus), quote(pr))
            return vectors[pr.label]

        retrievers, bm25_passages = {}, None
        for name in config.flat.retrievers:
            if name == "bm25":
                bm25_passages = corpus.passage_index()
                retrievers[name] = bm25_retriever(bm25_passages)
            elif config.flat.dense_preranker not in by_label:
                skipped[f"flat {name}"] = f"pre-ranker {config.flat.dense_preranker!r} not loaded"
            else:
                pr = by_label[config.flat.dense_preranker]
                t0 = time.perf_counter()
                emb = stored_vectors(pr)
                if hasattr(emb, "ensure"):
                    skipped[f"flat {name}"] = "needs every passage vector: publish the index with `funnelrag embed-corpus`"
                    continue
                faiss_index = build_faiss_index(emb.vectors, config.flat.dense)
                info["flat_dense"] = {"preranker": pr.label, "kind": config.flat.dense.kind, "vectors": len(emb),
                                      "seconds": time.perf_counter() - t0}
                retrievers[name] = faiss_retriever(emb, faiss_index, pr)
        rerankers = prerankers
        if config.flat.rerank and config.flat.rerank_vectors == "stored":
            rerankers = [StoredPreRanker(pr, stored_vectors(pr)) if pr.model.kind == "bi" else pr for pr in prerankers]
        cluster_index = corpus.cluster_index() if config.progressive else None
        fused_bm25: dict[str, PassageBM25] = {}

        def passage_bm25(pr) -> PassageBM25 | None:
            """BM25 scores of the embedding index's passages (fused pre-ranking), built once per pre-ranker."""
            if not any(s.uses_bm25 for s in config.progressive):
                return None
            if pr.label not in fused_bm25:
                fused_bm25[pr.label] = PassageBM25(bm25_passages or corpus.passage_index(), stored_vectors(pr).passage_ids)
            return fused_bm25[pr.label]
        for setting in config.progressive:
            if setting.vectors == "stored":
                for pr in prerankers:
                    if pr.model.kind == "bi":
                        stored_vectors(pr)
        specs: dict[str, SettingSpec] = {}
        by_setting: dict[str, list] = {}

        def fill_stored_vectors(block) -> None:
            """Lazily filled indexes: embed what this block's stored-vector settings read, untimed."""
            stored = [s for s in config.progressive if s.vectors == "stored"]
            ks = [s.n_clusters for s in stored if not s.passage_shortlist]
            shortlists = [(s.n_clusters, s.passage_shortlist) for s in stored if s.passage_shortlist]
            for pr in prerankers:
                if pr.label in vectors:
                    n, sec = fill_lazy_rows(vectors[pr.label], [q.question for q in block], pr, cluster_index, ks,
                                            bm25_passages if rerankers is not prerankers else None, flat.n_retrieve,
                                            shortlists, passage_bm25(pr) if shortlists else None)
                    emb_info = info["embeddings"][pr.label]
                    emb_info["filled"], emb_info["fill_seconds"] = emb_info.get("filled", 0) + n, emb_info.get(
                        "fill_seconds", 0.0) + sec

        def add(spec: SettingSpec, results: list) -> None:
            specs.setdefault(spec.name, spec)
            by_setting.setdefault(spec.name, []).extend(results)

        # Settings are interleaved block by block, so a change of machine load during the run
        # affects every setting alike instead of biasing the one that happened to run then.
        # Indexes, lookups, models, token caches and results go to the tasks quoted: Prefect walks every
        # element of a task's arguments for futures, twice a call (an index's 146K passage ids, a
        # lookup's rows), which was a third of the evaluation's time; none of them holds a future.
        bar = Progress("evaluate", total=len(questions), unit="questions")
        for start in range(0, len(questions), config.block_questions):
            block, block_table = questions[start:start + config.block_questions], qtable.slice(start, config.block_questions)
            fill_stored_vectors(block)
            for name, retrieve in retrievers.items():
                out = flat_task(block, quote(retrieve), quote(lookup), FlatSetting(name, flat.n_retrieve, flat.n_final),
                                quote(rerankers if config.flat.rerank else []), quote(tokens))
                for label, results in out.items():
                    add(SettingSpec(_slug(f"flat-{name}-{flat.n_retrieve}p-{label + '-' if label else ''}{flat.n_final}p"),
                                    "flat", name, label, "", flat.n_final), results)
                bar.update(0, block_setting=f"flat-{name}")   # a line within a long block too
            for setting in config.progressive:
                for pr in prerankers:
                    post_reader = reader if config.post_rank else None
                    if setting.vectors == "stored" and pr.model.kind != "bi":
                        skipped[f"stored vectors {pr.label}"] = "a cross-encoder has no passage vectors"
                        continue
                    if setting.vectors == "stored":
                        out = progressive_stored_task(block, quote(cluster_index), quote(stored_vectors(pr)), quote(lookup),
                                                      setting, quote(pr), quote(tokens), quote(post_reader), config,
                                                      quote(passage_bm25(pr)))
                    else:
                        out = progressive_task(block_table, quote(cluster_index), quote(corpus.members_of), seg_cfg,
                                               quote(counter), setting, quote(pr), quote(post_reader), config)
                    for post, results in sorted(out.items()):
                        base = (f"prog-{setting.n_clusters}c-{setting.n_units}d-{pr.label}"
                                f"{'-first' if setting.unit_scoring == 'first' else ''}"
                                f"{'-stored' if setting.vectors == 'stored' else ''}"
                                f"{'-' + setting.label() if setting.label() else ''}")
                        add(SettingSpec(_slug(f"{base}{'-fid' if post else ''}-{setting.n_final}p"), "progressive",
                                        "bm25-clusters", pr.label, reader_label if post else "", setting.n_final), results)
                    bar.update(0, block_setting=f"prog-{setting.n_clusters}c-{pr.label}")
            bar.update(len(block), settings=len(specs))
        bar.close()
        runs = [(specs[n], by_setting[n]) for n in specs]
        rows: tuple[list, list, list] = ([], [], [])
        generated_all = (generate_task(quote(gen), quote([results for _, results in runs]), qtext) if gen is not None
                         else [None] * len(runs))
        for (spec, results), generated in zip(runs, generated_all):
            for acc, part in zip(rows, summarize(spec, results, in_corpus, answers, generated)):
                acc.extend(part)
        info["machine"]["load_avg_1m_end"] = machine_info()["load_avg_1m"]
        summary = publish_results(config, corpus, run, run_dir, rows, info, time.perf_counter() - t_flow,
                                  dict(zip(qtable["question_id"].to_pylist(), qtable["question"].to_pylist())))
    return summary


def run_evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """CLI entry: run the flow (ephemeral Prefect API unless PREFECT_API_URL is set)."""
    return evaluate_flow(cfg)


COMMANDS = [
    FlowCommand("evaluate", "flat vs progressive retrieval on NQ-open: candidates, seconds per stage, AR@1..4, "
                "title entropy and reader EM (FunnelRAG Tables 2, 3, 9, 11-13)", EvaluateConfig, run_evaluate),
]
