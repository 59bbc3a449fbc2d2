"""Prefect flow ``embed-corpus``: the passage embedding index of a published corpus version for
one bi-encoder pre-ranker version (:mod:`tasks.funnel.embeddings`).

It resolves the pre-ranker (``minilm`` or a registry reference such as
``models:/funnelrag-preranker@champion``), fingerprints its weights, and publishes
``stores/embeddings/<corpus>/<model version>/`` unless an index of the same corpus content
digest and model version is already published (then it is a no-op). The ``embed-champion``
deployment runs it after every nightly corpus build and after every distillation run, so a
newly promoted champion (or a new corpus) is re-embedded, and an unchanged one is not. Only
texts the model version's vector store lacks are embedded; after publishing, the store drops the
vectors of texts no corpus version of the home keeps once they exceed ``embedding.max_dead_share``
(:func:`tasks.funnel.embeddings.prune_vector_store`; their count is the ``vectors_pruned`` metric).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.artifacts import create_markdown_artifact

from flows.run_report import completed, embed_markdown, embed_message, name_run, run_name
from funnelrag.config import FlowCommand, FlowConfig, resolve_flow_config
from funnelrag.device import resolve_device
from funnelrag.launch import TrainingSection
from funnelrag.registry import missing_alias
from funnelrag.threads import torch_threads
from funnelrag.tracking import configure, flow_run, log_metrics, run_link
from funnelrag.workspace import Workspace
from tasks.corpus.published import open_corpus
from tasks.evaluate.models import load_preranker_ref
from flows.launched.embed import embed_with_workers
from tasks.funnel.embeddings import EmbeddingConfig, ensure_embedding_index

log = logging.getLogger(__name__)

EXPERIMENT = "embed"


class EmbedConfig(FlowConfig):
    """Configuration of ``embed-corpus``.

    corpus, corpus_version : the published corpus (None: its current version).
    preranker : reference of a bi-encoder pre-ranker (:mod:`tasks.evaluate.models`).
    embedding : batch and shard sizes.
    torch_threads : intra-op threads (None: torch's default).
    device : ``auto`` (cuda if available) | ``cpu`` | ``cuda[:i]``: where the encoder runs (fp32;
        bf16 only after ``tasks/funnel/precision.py:bf16_topk_agreement`` says it keeps the top 10).
    training : ``training.launch`` with ``kind: accelerate``: the passages the vector store lacks
        are embedded data-parallel by the ranks of one ``accelerate launch`` (one per GPU, or
        ``num_processes`` on CPU; :mod:`flows.launched.embed`), then joined into the index here;
        ``in_process`` (default): embedded in this process.
    """

    corpus: str = "wikispeedia"
    corpus_version: str | None = None
    preranker: str = "minilm"
    embedding: EmbeddingConfig = EmbeddingConfig()
    torch_threads: int | None = None
    device: str = "auto"
    training: TrainingSection = TrainingSection()
    experiment: str = EXPERIMENT


@task(name="embed-passages", cache_policy=NO_CACHE)
def embed_task(cfg: EmbedConfig, ws, corpus, model, tok) -> dict:
    logger = get_run_logger()
    last = [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 30 or done == total:
            logger.info("embedded %d/%d passages", done, total)
            last[0] = time.perf_counter()

    launch_cfg = cfg.training.launch
    workers = None
    if launch_cfg.kind == "accelerate":
        def workers(texts, keys, store):
            return embed_with_workers(texts, model, tok, store, cfg.embedding, ws.cache_dir / "embed-launch",
                                      launch_cfg, keys=keys, logger=logger)
    _, info = ensure_embedding_index(ws.home / "stores", ws.cache_dir, cfg.corpus, corpus_digest(corpus),
                                     corpus.passages, model, tok, cfg.embedding, progress=progress,
                                     embed_missing=workers)
    logger.info("passages: %s embedded, %s reused from earlier versions", info.get("embedded", 0), info.get("reused", 0))
    return info


def corpus_digest(corpus) -> str:
    """The corpus version's content digest (the same passages give the same digest)."""
    return corpus.manifest.get("content_digest", corpus.digest)


@flow(name="embed-corpus", log_prints=True)
def embed_flow(config: EmbedConfig | None = None, config_file: str | None = None,
               overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Embed every passage of the corpus with the pre-ranker (or reuse the published index).

    ``config_file``, ``home`` and dotted ``overrides`` merge key by key
    (:func:`funnelrag.config.resolve_flow_config`): the ``embed-champion`` automation passes the
    home and the corpus version a build just made current this way.
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    config = resolve_flow_config(EmbedConfig, config, config_file, overrides, home)
    name_run(run_name("embed", config.corpus, config.preranker.rsplit("/", 1)[-1]))
    ws = Workspace(config.workspace.home)
    configure(ws, config.workspace.tracking_uri)
    absent = missing_alias(config.preranker)
    if absent is not None:   # e.g. the embed-champion automation on a home with no champion yet
        message = f"nothing to embed: {absent}"
        get_run_logger().info(message)
        return completed(message, {"corpus": config.corpus, "preranker": config.preranker, "skipped": message})
    corpus = open_corpus(ws, config.corpus, config.corpus_version)
    with torch_threads(config.torch_threads), flow_run(
            ws, config.experiment, f"embed-{config.corpus}", config.model_dump(exclude={"workspace"}),
            tracking_uri=config.workspace.tracking_uri, tags={"corpus": config.corpus, "corpus_version": corpus.version}) as run:
        model, tok, resolved = load_preranker_ref(config.preranker, ws.run_dir("embed", run.info.run_id) / "models")
        model.to(resolve_device(config.device))
        info = embed_task(config, ws, corpus, model, tok)
        mlflow.log_params({**resolved.as_params("preranker"), "model_version": info["model_version"][:16]})
        mlflow.set_tags({"corpus_digest": corpus_digest(corpus), "embedding_version": info["version"]})
        log_metrics({k: float(info[k]) for k in ("passages", "embedded", "reused", "discarded_segments", "seconds",
                                                  "passages_per_s", "vectors_pruned")
                     if k in info} | {"cache_hit": float(info["cache_hit"])})
        create_markdown_artifact(
            key=f"embed-corpus-{config.corpus}".lower().replace("_", "-"), description="embed-corpus: passages embedded and reused",
            markdown=embed_markdown(config.corpus, corpus.version, config.preranker, info,
                                    run_link(run, config.workspace.tracking_uri)))
    return completed(embed_message(info), {"corpus": config.corpus, "corpus_version": corpus.version,
                                           "preranker": config.preranker, **info})


def run_embed(cfg: EmbedConfig) -> dict[str, Any]:
    """CLI entry: run the flow (ephemeral Prefect API unless PREFECT_API_URL is set)."""
    return embed_flow(cfg)


COMMANDS = [
    FlowCommand("embed-corpus", "embed every passage of a published corpus with a bi-encoder pre-ranker version "
                "and publish the vectors (reused when corpus digest and model version match)", EmbedConfig, run_embed),
]
