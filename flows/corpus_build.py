"""Prefect flow ``corpus-build``: Wikipedia dump → published, versioned BM25 cluster index.

Stages (pure cores in :mod:`tasks.corpus.stages`, each cached on the content of its inputs):
ingest → tokens → cluster (graph, local clustering coefficients, Algorithm 1) → segment
(document units, passages) → index (bm25s; passages in shards of ``index.passage_shard_tokens`` tokens) →
validate + publish (manifest last, then the ``current`` pointer). One MLflow run per flow run; a
markdown summary artifact in Prefect.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar, Iterator

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE
from prefect.events import emit_event
from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from data_contracts.base import sha256_file
from data_contracts.corpus import CLUSTERS
from flows.run_report import build_message, completed, name_run, run_name
from flows.runners import RunnerConfig, ShardRunner, ShardWorkerDied
from funnelrag import datasets
from funnelrag.config import ConfigError, FlowCommand, FlowConfig, redact_url, resolve_flow_config, to_jsonable
from funnelrag.inputs import check_inputs
from funnelrag.locks import exclusive_lock
from funnelrag.reaper import scratch_dir
from funnelrag.stages import DataSource, input_digests, retry_transient, run_cached, stage_task
from funnelrag.store import (StageCache, StageResult, code_version, dir_digest, prune_cache, sweep_cache_temps,
                             write_json)
from funnelrag.tracking import flow_run, log_artifact, log_metrics, run_link
from funnelrag.verify import first_difference
from funnelrag.workspace import Workspace
from tasks.corpus import stages as S
from tasks.corpus.clustering import ClusteringConfig
from tasks.corpus.gate import GateConfig, GateDecision, GateRefused, decide, question_pairs, version_figures
from tasks.corpus.index import BM25Config
from tasks.sources.ingest import IngestConfig
from tasks.sources.ingest.changes import ChangesFile
from tasks.corpus.published import corpus_store
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.sharded_index import IndexLayout
from funnelrag.memory import build_collector
from tasks.corpus.sharded.shards import run_segment_sharded, run_tokens_sharded
from tasks.corpus.survival import id_survival
from tasks.qa.questions import QuestionsConfig, load_questions

log = logging.getLogger(__name__)



class CorpusSource(DataSource):
    """Dumps to build from (default: the Wikispeedia articles and link graph).

    ``mirror`` (an ``https://`` base URL in Wikimedia's layout, e.g. ``https://dumps.wikimedia.org``,
    or a local directory laid out the same way) is followed by ``corpus-build-nightly``
    (:mod:`flows.corpus_nightly`): the newest finished full dump of ``wiki`` plus its adds-changes
    days, downloaded into the home, of which the newest ``keep_dumps`` full dumps are kept. ``dump``
    is set by that flow (what tonight's input holds: base dump and applied days) and goes into the
    manifest; ``changes`` too (a Parquet file of the adds-changes revisions the ingest applies to
    the one dump of ``paths`` as it reads it, :class:`tasks.sources.ingest.changes.ChangesFile`);
    leave both unset.

    A mirror that needs a login takes it from the environment (``FUNNELRAG_MIRROR_USER``,
    ``FUNNELRAG_MIRROR_PASSWORD``) or a netrc file (``$NETRC``, else ``~/.netrc``), see
    ``docs/deploying.md``; a URL with inline credentials (``https://user:password@host``) works
    too, but every serialized form of this config (Prefect parameters, ``--print-config``) shows
    it redacted (:func:`funnelrag.config.redact_url`), as do manifests, summaries and MLflow.
    """

    datasets: list[str] = Field(default_factory=lambda: ["wikispeedia-articles", "wikispeedia-graph"])
    mirror: str | None = None
    wiki: str = "enwiki"
    keep_dumps: int = Field(default=2, ge=1)
    dump: dict[str, Any] | None = None
    changes: str | None = None
    @field_serializer("mirror", when_used="json")
    def _mirror_redacted(self, mirror: str | None) -> str | None:
        return None if mirror is None else redact_url(mirror)

    expected_file: ClassVar[str] = ("a dump file (a MediaWiki .xml or .xml.bz2 export, e.g. "
                                    "enwiki-…-pages-articles-multistream.xml.bz2, or a file of ingest.format)")


class CacheConfig(BaseModel):
    """What a build reads from the home's cache (no output byte depends on it).

    read : take stage outputs, shard outputs and memos from ``<home>/cache/corpus`` (each entry
        checked against its digest manifest first, :func:`funnelrag.verify.verified_entry`);
        False (``--no-cache``) = build everything from the input in an empty scratch cache,
        removed afterwards: the home's cache is neither read nor changed (the nightly also parses
        every adds-changes day again).
    verify : (``--verify``) build as with ``read: false``, publish nothing, and compare the
        build's content digest with the current version's; the summary's ``verify`` names the
        first file, table row or array element that differs (:func:`funnelrag.verify.first_difference`),
        and the CLI exits with status 1 when they differ.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    read: bool = True
    verify: bool = False


class RetentionConfig(BaseModel):
    """What a build removes from its home once it has published (no artifact byte depends on it).

    cache_max_age_days : remove the corpus stage and shard cache entries and memos that no build
        used for this many days (:func:`funnelrag.store.prune_cache`; a nightly uses its base
        dump's pieces and the memos every night, so they stay); None = keep every entry.
    keep_versions : keep the newest this many published versions of the corpus, and ``current``
        whichever it is (:meth:`funnelrag.store.ArtifactStore.prune`); None = keep every version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    cache_max_age_days: float | None = Field(default=None, gt=0)
    keep_versions: int | None = Field(default=None, ge=1)


# Wikispeedia articles are whole articles (median 4,012 T5 tokens; 2,247 of 4,598 exceed 4,096),
# so the paper's S = 4K leaves 77% of them alone in a cluster. S = 16K keeps the paper's ratio
# of a few articles per cluster (92.5% of articles share one). Dumps use ClusteringConfig's 4,096.
WIKISPEEDIA_MAX_CLUSTER_TOKENS = 16_384


class CorpusBuildConfig(FlowConfig):
    """Configuration of ``corpus-build`` (defaults: the real Wikispeedia data)."""

    name: str = "wikispeedia"
    source: CorpusSource = Field(default_factory=CorpusSource)
    ingest: IngestConfig = IngestConfig(format="wikispeedia")
    clustering: ClusteringConfig = ClusteringConfig(max_tokens=WIKISPEEDIA_MAX_CLUSTER_TOKENS)
    segment: SegmentConfig = SegmentConfig()
    bm25: BM25Config = BM25Config()
    index: IndexLayout = IndexLayout()   # passage_shard_tokens: 0 = one passage index; n > 0 = shards of <= n tokens
    gate: GateConfig = GateConfig()
    runner: RunnerConfig = Field(default_factory=RunnerConfig)   # where the stages run their shards; no output byte depends on it
    retention: RetentionConfig = RetentionConfig()   # what a build removes from the home afterwards; no output byte depends on it
    cache: CacheConfig = CacheConfig()   # read the home's cache or build from scratch (--no-cache, --verify); no output byte depends on it
    embed_preranker: str | None = None   # a bi-encoder pre-ranker ref: embed the published passages (flows/embed.py)

    @model_validator(mode="after")
    def _same_tokenizer(self) -> "CorpusBuildConfig":
        if self.clustering.tokenizer != self.segment.tokenizer:
            raise ValueError(f"clustering.tokenizer ({self.clustering.tokenizer}) and segment.tokenizer "
                             f"({self.segment.tokenizer}) must name the same tokenizer")
        if not self.source.datasets and not self.source.paths and not self.source.mirror:
            raise ValueError("source: give at least one dataset name or path, or a mirror")
        return self


def enwiki_sample_config(**overrides: Any) -> CorpusBuildConfig:
    """The real enwiki XML dump sample (MediaWiki path: wikitext, redirects, namespaces)."""
    base = {"name": "enwiki-sample", "source": {"datasets": ["enwiki-sample"]},
            "ingest": IngestConfig(format="mediawiki"), "clustering": ClusteringConfig(max_tokens=4096)}
    return CorpusBuildConfig.model_validate({**base, **overrides})


def resolve_inputs(cfg: CorpusBuildConfig, ws: Workspace) -> list[tuple[Path, str]]:
    """``[(path, sha256)]`` of the inputs: registered sets verified against their checksum,
    explicit paths hashed.

    Raises ``ValueError`` for a mirror without paths: the nightly flow resolves the mirror."""
    if cfg.source.mirror and not cfg.source.paths:
        raise ValueError(f"source.mirror ({redact_url(cfg.source.mirror)}) is followed by the corpus-build-nightly flow "
                         "(flows/corpus_nightly.py); build-corpus builds source.paths / source.datasets")
    return cfg.source.resolve(cfg.workspace.data_mirror, ws.downloads_dir, "source.paths")


def retry_shard_stage(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of a stage whose shards run on the build's runner: as
    :func:`funnelrag.stages.retry_transient`, and never after a shard's worker died on each of its
    attempts (:class:`flows.runners.ShardWorkerDied`: each was on a fresh pool already)."""
    try:
        state.result()
    except ShardWorkerDied:
        return False
    except Exception:  # noqa: BLE001 - the platform's rule decides
        pass
    return retry_transient(task, task_run, state)


def shard_stage(name: str) -> Any:
    """The Prefect ``@task`` of a stage that drives its own shard pool (one task run per stage):
    one retry after 2 s of a failure that may be transient (:func:`retry_shard_stage`; shards
    already built are cache hits then), Prefect caching off."""
    return task(name=name, retries=1, retry_delay_seconds=2, retry_condition_fn=retry_shard_stage,
                cache_policy=NO_CACHE)


@contextlib.contextmanager
def stage_pool(runner: ShardRunner, name: str) -> Iterator[Any]:
    """``runner``'s pool of stage ``name`` around the stage's core; its shard count and seconds
    go to the task run's log when the stage ends."""
    with runner.pool(name) as pool:
        yield pool
    get_run_logger().info(pool.report())


PIECE_CACHE = "ingest-pieces"
"""The ingest's piece cache in the build cache: kept pieces, page memo parts, multistream index summaries."""


@shard_stage("ingest")
def ingest_sharded(cache: StageCache, inputs: list[tuple[Path, str]], cfg: IngestConfig, runner: ShardRunner,
                   changes: str | None = None) -> StageResult:
    """Ingest with multistream pieces as shards on this stage's pool; with ``changes``
    (``source.changes``), the adds-changes revisions applied as the dump is read (the changes
    file's sha256 joins the cache key: its writer is deterministic, and hashing its bytes costs
    ~1% of decoding every revision since the base dump each night)."""
    page_changes = ChangesFile.open(Path(changes)) if changes else None
    digests = input_digests(inputs)
    if page_changes is not None:
        digests["changes"] = sha256_file(page_changes.path)
    with stage_pool(runner, "ingest") as pool:
        return run_cached(cache, S.run_ingest, cfg, digests, lambda out, _: S.run_ingest(
            [p for p, _ in inputs], out, cfg, submit=pool.submit, streams_per_piece=runner.cfg.streams_per_piece,
            window=2 * runner.cfg.n_workers() + 2, piece_cache=cache.root / PIECE_CACHE, changes=page_changes))


@shard_stage("tokens")
def tokens_sharded(cache: StageCache, ingest: StageResult, cfg: SegmentConfig, mirror: Path | None,
                   runner: ShardRunner) -> StageResult:
    """Window token counts by document shards on this stage's pool; same key and bytes as :func:`tasks.corpus.stages.run_tokens`."""
    inputs = {"documents": ingest.files["documents.parquet"]}
    key_cfg = {"tokenizer": cfg.tokenizer, "passage_words": cfg.passage_words}
    with stage_pool(runner, "tokens") as pool:
        return run_cached(cache, S.run_tokens, key_cfg, inputs, lambda out, _: run_tokens_sharded(
            ingest.path, out, cfg, mirror, pool.submit, runner.cfg.docs_per_shard,
            window=2 * runner.cfg.n_workers() + 2, cache_dir=cache.root))


@stage_task("cluster")
def cluster_task(cache: StageCache, ingest: StageResult, tokens: StageResult, cfg: ClusteringConfig,
                 base: Path | None = None) -> StageResult:
    """Algorithm 1; with ``base`` (``clustering.mode: local``, :func:`clustering_base`) re-run only
    where the graph changed since that published version, whose manifest digest joins the key."""
    inputs = {"documents": ingest.files["documents.parquet"], "links": ingest.files["links.parquet"], "tokens": tokens.digest}
    if base is not None:
        inputs["base"] = sha256_file(base / "manifest.json")
    return run_cached(cache, S.run_cluster, cfg, inputs,
                      lambda out, _: S.run_cluster(ingest.path, tokens.path, out, cfg, previous_dir=base))


def clustering_base(cfg: CorpusBuildConfig, ws: Workspace) -> Path | None:
    """The published version a ``clustering.mode: local`` build re-clusters from, or None (full).

    A build follows ``current``; ``--no-cache``, a build of a corpus without a version and the
    nightly's build of a new full dump (``source.dump.base`` other than current's) run the full
    algorithm, so a chain of local nights starts again from the paper's clusters at each full dump.
    ``--verify`` rebuilds from the ``clustering_base`` that ``current``'s manifest names (a
    published version, not the cache), so a locally clustered ``current`` is reproduced; when that
    version is gone (retention) the full algorithm runs and the clusters may differ (logged).
    """
    if cfg.clustering.mode != "local":
        return None
    store = corpus_store(ws, cfg.name)
    current = store.current_version()
    if current is None or not (cfg.cache.read or cfg.cache.verify):
        return None
    if not cfg.cache.verify:
        dump = cfg.source.dump
        if dump is not None and (store.read_manifest(current).get("dump") or {}).get("base") != dump.get("base"):
            log.info("clustering.mode local: a new full dump (%s) is clustered by the full algorithm", dump.get("base"))
            return None
        return store.versions_dir / current
    base = store.read_manifest(current).get("clustering_base")
    if base is not None and (store.versions_dir / base / "manifest.json").exists():
        return store.versions_dir / base
    if base is not None:
        log.warning("verify: %s was clustered locally from version %s, which is gone; the full algorithm runs", current, base)
    return None


@shard_stage("segment")
def segment_sharded(cache: StageCache, ingest: StageResult, tokens: StageResult, cluster: StageResult,
                    cfg: SegmentConfig, mirror: Path | None, runner: ShardRunner,
                    split_dir: Path | None = None) -> StageResult:
    """Units and passages by cluster ranges on this stage's pool; same key and bytes as
    :func:`tasks.corpus.stages.run_segment`. ``split_dir``: the build's shared document split
    (:class:`tasks.corpus.sharded.shards.DocumentSplit`), which the index stage reuses."""
    inputs = {"documents": ingest.files["documents.parquet"], "tokens": tokens.digest,
              "members": cluster.files["cluster_members.parquet"]}
    with stage_pool(runner, "segment") as pool:
        return run_cached(cache, S.run_segment, cfg, inputs, lambda out, _: run_segment_sharded(
            ingest.path, tokens.path, cluster.path, out, cfg, mirror, pool.submit, runner.cfg.tokens_per_shard,
            window=2 * runner.cfg.n_workers() + 2, cache_dir=cache.root / "segment-shards",
            docs_per_range=runner.cfg.docs_per_shard, split_dir=split_dir))


@shard_stage("index")
def index_sharded(cache: StageCache, ingest: StageResult, tokens: StageResult, cluster: StageResult, segment: StageResult,
                  cfg: BM25Config, layout: IndexLayout, runner: ShardRunner, passage_words: int,
                  split_dir: Path | None = None) -> StageResult:
    """The index stage with its per-shard steps on this stage's pool: the cluster index's
    tokenization by cluster ranges of at most ``runner.tokens_per_shard`` tokens, then the one
    passage index's by the same ranges (queued behind them), or with
    ``layout.passage_shard_tokens`` > 0 the passage shards (cut from ``clusters.parquet``,
    which then joins the key). Shard token ids, statistics and indexes kept under the stage cache
    for reuse. The cache key of a one-index build is the one it always had (the cluster index's
    bytes do not depend on the shards). ``split_dir``: the build's shared document split, made by
    the segment stage (:class:`tasks.corpus.sharded.shards.DocumentSplit`). ``tokens``, ``passage_words``
    (``segment.passage_words``): what the BM25 token memos' keys derive from (the documents' text
    keys the tokens stage kept; not part of the stage's key: the index bytes do not depend on them)."""
    inputs = {"documents": ingest.files["documents.parquet"], "members": cluster.files["cluster_members.parquet"],
              "passages": segment.files["passages.parquet"]}
    key_cfg: Any = cfg
    if layout.sharded:
        key_cfg = {"bm25": cfg, "passage_shard_tokens": layout.passage_shard_tokens}
        inputs["clusters"] = cluster.files["clusters.parquet"]
    with stage_pool(runner, "index") as pool:
        return run_cached(cache, S.run_index, key_cfg, inputs, lambda out, _: S.run_index(
            ingest.path, cluster.path, segment.path, out, cfg, passage_shard_tokens=layout.passage_shard_tokens,
            submit=pool.submit, window=2 * runner.cfg.n_workers() + 2, work_dir=cache.root,
            tokens_per_shard=runner.cfg.tokens_per_shard, docs_per_range=runner.cfg.docs_per_shard,
            split_dir=split_dir, tokens_dir=tokens.path, passage_words=passage_words))


# The files a version publishes, by the stage that makes them (and every file of the index stage).
PUBLISHED = {
    "ingest": ["documents.parquet", "redirects.parquet", "links.parquet", "ingest_report.parquet"],
    "cluster": ["graph_metrics.parquet", "clusters.parquet", "cluster_members.parquet"],
    "segment": ["document_units.parquet", "passages.parquet"],
}


def published_files(stages: dict[str, StageResult]) -> tuple[dict[str, Path], dict[str, str]]:
    """``({name: path}, {name: sha256})`` of the files a version of these stages' outputs holds,
    in publication order (:data:`PUBLISHED`, then the index stage's files); the content digest is
    :func:`funnelrag.store.dir_digest` of the second."""
    digests = {name: stages[stage].files[name] for stage, names in PUBLISHED.items() for name in names}
    digests.update(stages["index"].files)
    paths = {name: (stages["index"].path if name in stages["index"].files else
                    next(stages[s].path for s, ns in PUBLISHED.items() if name in ns)) / name for name in digests}
    return paths, digests


def verify_task(cfg: CorpusBuildConfig, ws: Workspace, stages: dict[str, StageResult]) -> dict[str, Any]:
    """``--verify``: this build (made without reading the cache) against the current version.

    Returns ``{"current", "current_digest", "fresh_digest", "same", "first_difference"}``:
    ``same`` when the content digests are equal *and* every file of the current version has the
    bytes this build made (its files are hashed again, so a file changed after publishing is found
    too); otherwise ``first_difference`` names the first file, in publication order, and the first
    row (Parquet tables), element (``.npy`` arrays) or byte where they differ
    (:func:`funnelrag.verify.first_difference`).

    Raises ``FileNotFoundError`` when the corpus has no current version."""
    store = corpus_store(ws, cfg.name)
    current_dir = store.current_dir()
    manifest = store.read_manifest()
    paths, digests = published_files(stages)
    fresh = dir_digest(digests)
    current_files = {name: current_dir / name for name in manifest["files"]}
    first = first_difference(paths, current_files)
    same = first is None and manifest.get("content_digest") == fresh
    result = {"current": current_dir.name, "current_digest": manifest.get("content_digest"), "fresh_digest": fresh,
              "same": same, "first_difference": first}
    if same:
        log.info("verify %s: a build without the cache equals current version %s (content digest %s)",
                 cfg.name, current_dir.name, fresh[:12])
    else:
        log.error("verify %s: current version %s differs from a build without the cache: %s", cfg.name,
                  current_dir.name, first or "content digests differ, files equal (the manifest was changed)")
    return result


@task(name="publish", cache_policy=NO_CACHE)
def publish_task(cfg: CorpusBuildConfig, ws: Workspace, stages: dict[str, StageResult],
                 base: Path | None = None) -> tuple[Path, dict, bool]:
    """Publish the built files as a new version, or nothing when they equal ``current``'s.
    ``base``: the version Algorithm 1 re-clustered from (``clustering.mode: local``), named in
    the manifest as ``clustering_base`` when the cluster stage did.

    Returns ``(version_dir, validation_checks, unchanged)``: with ``unchanged`` the content digest
    equals the current version's, so no version is written and ``version_dir`` is the current
    one (a rebuild of unchanged input is a no-op: no new version, no pointer move, no event).
    """
    files, file_digests = published_files(stages)
    digest = dir_digest(file_digests)
    counts = {k: v for k, v in stages["cluster"].summary.items() if not k.endswith("seconds")}
    manifest_extra = {
        "corpus": cfg.name, "content_digest": digest, "code_version": code_version(),
        **S.C.BUILD_CONFIG.stamp(to_jsonable(cfg.model_dump(exclude={"workspace", "runner", "retention", "cache"}))),
        "schema_versions": {c.name: c.version for c in S.C.CORPUS_CONTRACTS},
        "counts": {"documents": stages["ingest"].summary["documents"], "links": stages["ingest"].summary["links"],
                   "redirects": stages["ingest"].summary["redirects"], **counts,
                   "document_units": stages["segment"].summary["document_units"],
                   "passages": stages["segment"].summary["passages"]},
    }
    if cfg.source.dump:   # the nightly's input: the base full dump and the adds-changes days applied
        manifest_extra["dump"] = cfg.source.dump
    if base is not None and stages["cluster"].summary.get("clustering_local"):
        manifest_extra["clustering_base"] = base.name
    store = corpus_store(ws, cfg.name)
    current = store.current_version()
    if current is not None and store.read_manifest(current).get("content_digest") == digest:
        get_run_logger().info("corpus %s unchanged: content digest %s equals current version %s; nothing published",
                              cfg.name, digest[:12], current)
        return store.versions_dir / current, {}, True
    version_id = store.new_version_id(digest)
    checks: dict[str, int] = {}

    def _validate(staging: Path) -> None:
        checks.update(S.validate_corpus(staging, cfg.clustering.max_tokens))

    path = store.publish(version_id, files, manifest_extra, _validate, make_current=not cfg.gate.enabled,
                         digests=file_digests)
    return path, checks, False


@task(name="gate", cache_policy=NO_CACHE)
def gate_task(cfg: CorpusBuildConfig, ws: Workspace, version_dir: Path) -> GateDecision:
    """The quality gate (:mod:`tasks.corpus.gate`): the new version against the current one."""
    paths = [datasets.resolve(n, cfg.workspace.data_mirror, cache_dir=ws.downloads_dir) for n in cfg.gate.questions]
    table, _ = load_questions([*paths, *cfg.gate.paths], QuestionsConfig(limit=cfg.gate.limit))
    questions = question_pairs(table)
    store = corpus_store(ws, cfg.name)
    current = store.current_version()
    candidate = version_figures(version_dir, questions, cfg.gate.k)
    baseline = None if current is None else version_figures(store.versions_dir / current, questions, cfg.gate.k)
    return decide(candidate, baseline, cfg.gate)


def promote(cfg: CorpusBuildConfig, ws: Workspace, version_dir: Path, decision: GateDecision | None) -> None:
    """Move ``current`` to a version that passed the gate (raise :class:`GateRefused` otherwise)
    and emit ``funnelrag.corpus.current`` (the ``evaluate-champion`` automation's trigger)."""
    if decision is not None and not decision.passed:
        raise GateRefused(decision)
    if decision is not None:
        corpus_store(ws, cfg.name).set_current(version_dir.name)
    emit_event(event=CORPUS_CURRENT_EVENT, resource={"prefect.resource.id": f"funnelrag.corpus.{cfg.name}"},
               payload={"corpus": cfg.name, "version": version_dir.name, "home": str(ws.home)})


# Emitted when a build made its version current; prefect.yaml's evaluate-champion trigger expects it.
CORPUS_CURRENT_EVENT = "funnelrag.corpus.current"


def _clusters_over_s(version_dir: Path, max_tokens: int) -> int:
    table = CLUSTERS.read(version_dir, columns=["n_tokens", "n_members"])
    return oversize_clusters(table.column("n_tokens").to_numpy(), table.column("n_members").to_numpy(), max_tokens)


def oversize_clusters(n_tokens, n_members, max_tokens: int) -> int:
    """Clusters over S tokens: each is one article longer than S, which Algorithm 1 never merges
    (clusters of several members stay ≤ S).

    Parameters
    ----------
    n_tokens, n_members : int arrays of shape (n_clusters,), from the clusters table.
    max_tokens : S.

    Raises
    ------
    ValueError
        A cluster of several members over S (Algorithm 1's bound broken), naming how many.
    """
    over = n_tokens > max_tokens
    merged = int((over & (n_members > 1)).sum())
    if merged:
        raise ValueError(f"{merged} clusters of several members exceed S = {max_tokens} tokens")
    return int(over.sum())


def _cluster_histogram(version_dir: Path, out_png: Path, max_tokens: int, over: int) -> None:
    import matplotlib  # noqa: PLC0415  (heavy: matplotlib, only when a plot is drawn)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (heavy: matplotlib, only when a plot is drawn)

    sizes = CLUSTERS.read(version_dir, columns=["n_tokens"]).column("n_tokens").to_numpy()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(sizes, bins=50, color="#3b6ea5")
    ax.axvline(max_tokens, color="crimson", linestyle="--", label=f"S = {max_tokens} tokens")
    ax.set_xlabel("cluster size (tokens)")
    ax.set_ylabel("clusters")
    ax.set_title(f"{sizes.size} clusters, mean {sizes.mean():.0f} tokens"
                 + (f"; {over:,} over S: single articles longer than S" if over else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100, metadata={"Software": None})
    plt.close(fig)


def shard_report(stages: dict[str, StageResult]) -> dict[str, dict[str, int]]:
    """Per-shard stages: ``{"ingest_pieces": {"built", "reused"[, "patched"]}, "token_shards": {...},
    "segment_shards": {...}, "cluster_token_shards": {...}, "passage_token_shards": {...}}`` of this
    build (:mod:`tasks.corpus.sharded.passage_tokens`), plus ``passage_index_shards`` with a
    sharded passage index (a stage-cache hit reuses all of a
    stage's shards). ``patched``: base-dump pieces with the night's adds-changes revisions applied
    (:func:`tasks.sources.ingest.parallel.patch_piece`), present when there were any."""
    pieces = stages["ingest"].summary.get("pieces", {})
    patched = pieces.get("patched", 0)
    hit = stages["ingest"].cache_hit
    found = {"ingest_pieces": (stages["ingest"], pieces.get("built", 0), pieces.get("reused", 0) + (patched if hit else 0))}
    for name, stage, prefix in (("token_shards", "tokens", "shards"), ("segment_shards", "segment", "shards"),
                                ("cluster_token_shards", "index", "cluster_token_shards"),
                                ("passage_token_shards", "index", "passage_token_shards"),
                                ("passage_index_shards", "index", "passage_index_shards")):
        summary = stages[stage].summary
        if f"{prefix}_built" in summary or name in ("token_shards", "segment_shards"):
            found[name] = (stages[stage], summary.get(f"{prefix}_built", 0), summary.get(f"{prefix}_reused", 0))
    report = {name: {"built": 0, "reused": built + reused} if res.cache_hit else {"built": built, "reused": reused}
              for name, (res, built, reused) in found.items()}
    if patched and not hit:
        report["ingest_pieces"]["patched"] = patched
    return report


def memo_report(stages: dict[str, StageResult]) -> dict[str, dict[str, int]]:
    """Texts this build took from the per-text memos instead of computing them again
    (:mod:`funnelrag.content_store`, :mod:`tasks.sources.ingest.page_memo`): ``{"ingest_cleaned_pages"
    (only when pass 1 ran with a piece cache) | "window_token_documents" | "segment_clusters" (the sharded
    segment stage) | "cluster_index_members" |
    "passage_index_passages": {"built", "reused"}}`` (a stage-cache hit reuses every text; a stage
    summary from before the memos counts every text as built)."""
    found = {}
    cleaned = stages["ingest"].summary.get("cleaned_pages") or {}
    if cleaned and not stages["ingest"].cache_hit:   # pass 1: pages cleaned / taken from the page memo
        found["ingest_cleaned_pages"] = {"built": int(cleaned.get("built", 0)), "reused": int(cleaned.get("reused", 0))}
    for name, stage, total, reused in (("window_token_documents", "tokens", "documents", "documents_reused"),
                                       ("segment_clusters", "segment", "clusters", "clusters_reused"),
                                       ("cluster_index_members", "index", "cluster_members", "cluster_members_reused"),
                                       ("passage_index_passages", "index", "passage_index_docs", "passages_reused")):
        summary = stages[stage].summary
        if total not in summary:   # a stage without that memo (the one-process segment stage)
            continue
        n = int(summary.get(total, 0))
        hit = n if stages[stage].cache_hit else int(summary.get(reused, 0))
        found[name] = {"built": n - hit, "reused": hit}
    return found


def summary_markdown(summary: dict[str, Any]) -> str:
    """The Prefect artifact: counts and seconds per stage as markdown tables."""
    lines = [f"# corpus-build `{summary['corpus']}` → version `{summary['version']}`", "",
             f"- MLflow run: {summary.get('mlflow_run_link') or '`' + summary['mlflow_run_id'] + '`'}",
             f"- store: `{summary['store']}` (version directory `{summary['path']}`)",
             f"- S (max cluster tokens): {summary['max_cluster_tokens_S']:,}"
             + (f"; {summary['clusters_over_S']:,} clusters are single articles longer than S "
                f"(the largest {summary['counts']['max_cluster_tokens']:,} tokens), which Algorithm 1 never merges"
                if summary.get("clusters_over_S") else "")]
    if summary.get("dump"):
        dump = summary["dump"]
        lines.append(f"- input: full dump `{dump['base']}` of `{dump['wiki']}`"
                     + (f" + adds-changes days {', '.join(dump['days'])}" if dump.get("days") else ""))
        if dump.get("days"):
            lines.append("- page deletions and moves are not in adds-changes dumps: they take effect when the next "
                         "full dump becomes the base")
    if summary.get("stale_revisions"):
        lines.append(f"- {summary['stale_revisions']:,} adds-changes revisions skipped: not newer than the revision "
                     "the base dump or an earlier day holds for their page")
    if summary.get("unchanged"):
        lines.append(f"- **unchanged**: the build's content digest equals the current version `{summary['version']}`; "
                     "nothing was published, `current` did not move and no `corpus.current` event was emitted")
    if "gate" in summary:
        gate = summary["gate"]
        verdict = "passed: now current" if gate["passed"] else "REFUSED: " + "; ".join(gate["reasons"])
        lines.append(f"- quality gate: {verdict} (AR@{gate['k']} {gate['candidate']['answer_recall']:.4f}, "
                     f"skipped {gate['candidate']['skipped_fraction']:.1%} of pages)")
    if summary.get("clustering", {}).get("clustering_local"):
        cl = summary["clustering"]
        lines.append(f"- Algorithm 1 re-ran only where the graph changed since version `{cl['base']}`: "
                     f"{cl['local_kept_clusters']:,} clusters kept, {cl['local_freed_documents']:,} documents re-clustered "
                     f"({cl['local_touched_documents']:,} touched: {cl['local_new_documents']:,} new, "
                     f"{cl['local_length_changed']:,} lengths, {cl['local_edges_changed']:,} edges changed)")
    lines += ["", "| count | value |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" if isinstance(v, int) else f"| {k} | {v:.1f} |" for k, v in summary["counts"].items()]
    if "survival" in summary:
        sv = summary["survival"]
        lines += ["", "| of the previous version | kept |", "|---|---:|",
                  f"| doc ids ({sv['documents_before']:,}) | {sv['documents_kept_ids']:.2%} |",
                  f"| cluster ids ({sv['clusters_before']:,}) | {sv['clusters_kept_ids']:.2%} |",
                  f"| passage ids ({sv['passages_before']:,}) | {sv['passages_kept_ids']:.2%} |",
                  f"| unit ids ({sv['units_before']:,}) | {sv['units_kept_ids']:.2%} |",
                  f"| units unchanged (id, passages, tokens) | {sv['units_unchanged']:.2%} |",
                  f"| clusters unchanged (member titles, in order; {sv['clusters_before']:,}) | {sv['clusters_unchanged']:.2%} |"]
    lines += ["", "| stage | seconds spent | cache |", "|---|---:|---|"]
    lines += [f"| {k} | {'cached' if v['cache_hit'] else format(v['seconds'], '.2f')} | {'hit' if v['cache_hit'] else 'built'} |"
              for k, v in summary["stages"].items()]
    return "\n".join(lines) + "\n"


@flow(name="corpus-build", log_prints=True)
def corpus_build_flow(config: CorpusBuildConfig | None = None, config_file: str | None = None,
                      overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Build, validate and publish a corpus version; returns the summary printed by the CLI.

    Deployments pass ``config_file`` (a file under ``configs/``), ``home`` and dotted
    ``overrides``; they merge key by key (:func:`funnelrag.config.resolve_flow_config`), so
    overriding one field never replaces the rest of the config.
    """
    config = resolve_flow_config(CorpusBuildConfig, config, config_file, overrides, home)
    check_inputs(config)   # before the lock, MLflow and any stage: a wrong path fails in a second
    name_run(run_name("build-corpus", config.name))
    logger = get_run_logger()
    ws = Workspace(config.workspace.home)
    if config.cache.verify and corpus_store(ws, config.name).current_version() is None:
        raise FileNotFoundError(f"verify: corpus {config.name!r} has no current version in {ws.home} to compare with")
    with exclusive_lock(corpus_store(ws, config.name).root / BUILD_LOCK,
                        f"corpus build of {config.name!r} in {ws.home}"), build_collector():
        with build_cache(config.cache, ws) as cache:
            summary = _build_and_publish(config, ws, cache, logger)
        if removed := apply_retention(config.retention, ws, config.name):
            summary["retention"] = removed
    if config.embed_preranker and not config.cache.verify:   # the embedding index step of the nightly build (after `current` moved)
        from flows.embed import EmbedConfig, embed_flow  # noqa: PLC0415  (heavy: torch via the embedding flow, only when the build embeds the corpus)

        summary["embeddings"] = embed_flow(EmbedConfig(corpus=config.name, corpus_version=summary["version"],
                                                       preranker=config.embed_preranker, workspace=config.workspace))
    return completed(build_message(summary), summary)


def apply_retention(cfg: RetentionConfig, ws: Workspace, corpus: str) -> dict[str, Any]:
    """``cfg``'s retention after a build of ``corpus`` published (under its build lock): old
    versions first (they hold hard links to stage outputs), then the corpus cache
    (``<home>/cache/corpus``, shared by every corpus of the home: an entry another corpus used
    within the age is kept). Returns ``{"versions_removed": [ids], "cache": {"entries",
    "bytes_freed"}}`` for what was configured (``{}``: no retention set)."""
    done: dict[str, Any] = {}
    if cfg.keep_versions is not None:
        done["versions_removed"] = corpus_store(ws, corpus).prune(cfg.keep_versions)
    if cfg.cache_max_age_days is not None:
        done["cache"] = prune_cache(ws.cache_dir / "corpus", cfg.cache_max_age_days * 86400).as_dict()
    return done


# One build per corpus and home at a time: this file in the corpus store holds the flock.
BUILD_LOCK = ".build.lock"


@contextlib.contextmanager
def build_cache(cfg: CacheConfig, ws: Workspace) -> Iterator[StageCache]:
    """The stage cache a build reads and fills: the home's ``cache/corpus``, or with
    ``cache.read: false`` or ``cache.verify`` an empty scratch cache in it (``.tmp-<pid>-no-cache``,
    never an entry of the home's cache; swept by :func:`funnelrag.reaper.sweep_stale_temp_dirs`
    should the build be killed), removed when the build ends. A published version keeps its files
    (hard links)."""
    root = ws.cache_dir / "corpus"
    if cfg.read and not cfg.verify:
        yield StageCache(root)
        return
    scratch = scratch_dir(root, "no-cache")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log.info("building without the cache (in %s, removed afterwards)", scratch)
    try:
        yield StageCache(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_and_publish(config: CorpusBuildConfig, ws: Workspace, cache: StageCache, logger) -> dict[str, Any]:
    """The stages, publish, gate and promotion of one build (under the build lock); with
    ``cache.verify``, the stages and :func:`verify_task` only (nothing published)."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    mirror = config.workspace.data_mirror
    t_flow = time.perf_counter()
    with flow_run(ws, "corpus-build", f"corpus-build-{config.name}", config.model_dump(exclude={"workspace"}),
                  tracking_uri=config.workspace.tracking_uri, tags={"corpus": config.name}) as run:
        inputs = resolve_inputs(config, ws)
        logger.info("inputs: %s", ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p, _ in inputs))
        stages: dict[str, StageResult] = {}
        walls: dict[str, float] = {}
        sweep_cache_temps(cache.root)   # what a killed run left (its pool workers' temps, its scratch)
        # the documents split by cluster shard: made once, by segment, and read again by index
        split_dir = scratch_dir(cache.root, "split")   # .tmp-<pid>-split-<uuid>: swept if this run is killed
        base = clustering_base(config, ws)
        try:
            with ShardRunner(config.runner) as runner:   # each stage task opens its own pool of it
                for name, call in (
                    ("ingest", lambda: ingest_sharded(cache, inputs, config.ingest, runner, config.source.changes)),
                    ("tokens", lambda: tokens_sharded(cache, stages["ingest"], config.segment, mirror, runner)),
                    ("cluster", lambda: cluster_task(cache, stages["ingest"], stages["tokens"], config.clustering, base)),
                    ("segment", lambda: segment_sharded(cache, stages["ingest"], stages["tokens"], stages["cluster"],
                                                        config.segment, mirror, runner, split_dir)),
                    ("index", lambda: index_sharded(cache, stages["ingest"], stages["tokens"], stages["cluster"],
                                                    stages["segment"], config.bm25, config.index, runner,
                                                    config.segment.passage_words, split_dir)),
                ):
                    t0 = time.perf_counter()
                    stages[name] = call()
                    walls[name] = time.perf_counter() - t0
                    logger.info("stage %-8s %s in %.2f s", name, "cache hit" if stages[name].cache_hit else "built",
                                walls[name])
        finally:
            shutil.rmtree(split_dir, ignore_errors=True)
        if config.cache.verify:
            result = verify_task(config, ws, stages)
            log_metrics({"verify_same": int(result["same"])})
            mlflow.set_tag("corpus_verify", "same" if result["same"] else "differs")
            return {"corpus": config.name, "verify": result, "total_seconds": time.perf_counter() - t_flow,
                    "mlflow_run_id": run.info.run_id}
        t0 = time.perf_counter()
        previous = corpus_store(ws, config.name).current_version()
        version_dir, rows, unchanged = publish_task(config, ws, stages, base)
        walls["publish"] = time.perf_counter() - t0
        decision = gate_task(config, ws, version_dir) if config.gate.enabled and not unchanged else None
        manifest = (version_dir / "manifest.json").read_text()

        man = json.loads(manifest)
        summary: dict[str, Any] = {
            "corpus": config.name, "version": version_dir.name, "path": str(version_dir), "unchanged": unchanged,
            "counts": {"documents": man["counts"]["documents"], "links": man["counts"]["links"],
                       "redirects": man["counts"]["redirects"], "clusters": man["counts"]["clusters"],
                       "mean_cluster_tokens": man["counts"]["mean_cluster_tokens"],
                       "max_cluster_tokens": man["counts"]["max_cluster_tokens"],
                       "document_units": man["counts"]["document_units"], "passages": man["counts"]["passages"]},
            "ingest": {"records": stages["ingest"].summary["records"], "skipped": stages["ingest"].summary["skipped"],
                       "mb_per_s": stages["ingest"].summary["mb_per_s"]},
            # adds-changes revisions not newer than what the base dump or an earlier day holds: skipped
            "stale_revisions": (int(stages["ingest"].summary.get("stale_revisions", 0))
                                + int((config.source.dump or {}).get("stale_revisions_before_ingest", 0))),
            "shards": shard_report(stages),
            "reused_texts": memo_report(stages),
            **({"dump": config.source.dump} if config.source.dump else {}),
            # seconds spent in this run; a cache hit's original build time is not spent now
            "stages": {k: {"seconds": (walls[k] if k not in stages or stages[k].cache_hit
                                       else stages[k].summary.get("seconds", walls[k])),
                           "wall_seconds": walls[k], "cache_hit": bool(stages[k].cache_hit) if k in stages else False}
                       for k in walls},
            "total_seconds": time.perf_counter() - t_flow,
            "max_cluster_tokens_S": config.clustering.max_tokens,
            "clusters_over_S": _clusters_over_s(version_dir, config.clustering.max_tokens),
            "store": str(corpus_store(ws, config.name).root),
            "mlflow_run_id": run.info.run_id,
            "mlflow_run_link": run_link(run, config.workspace.tracking_uri),
            "prefect_flow_run_id": run.data.tags.get("prefect.flow_run_id"),
        }
        if config.clustering.mode == "local":   # where Algorithm 1 ran: kept clusters, freed documents
            summary["clustering"] = {k: v for k, v in stages["cluster"].summary.items()
                                     if k.startswith("local_") or k == "clustering_local"}
            summary["clustering"]["base"] = base.name if base is not None else None
            log_metrics({k: v for k, v in summary["clustering"].items() if k != "base"})
        if previous is not None and not unchanged:   # what of the current version survives into this one
            try:
                summary["survival"] = id_survival(corpus_store(ws, config.name).versions_dir / previous, version_dir)
            except ValueError as exc:   # a version of an earlier layout (positional cluster ids): nothing to compare
                logger.warning("no id survival against version %s: %s", previous, exc)
            else:
                log_metrics({k: v for k, v in summary["survival"].items() if not k.endswith("_before")})
        if decision is not None:
            summary["gate"] = decision.as_dict()
            log_metrics({"gate_answer_recall": decision.candidate.answer_recall,
                         "gate_skipped_fraction": decision.candidate.skipped_fraction, "gate_passed": int(decision.passed)})
        # ---- tracking: counts, per-stage seconds and throughput; manifest, report, histogram
        log_metrics({f"count_{k}": v for k, v in summary["counts"].items()})
        log_metrics({f"seconds_{k}": v["seconds"] for k, v in summary["stages"].items()})
        log_metrics({"ingest_mb_per_s": summary["ingest"]["mb_per_s"],
                     "tokens_per_s": stages["tokens"].summary["tokens_per_s"],
                     "bm25_cluster_docs_per_s": stages["index"].summary["cluster_docs_per_s"],
                     "bm25_passage_docs_per_s": stages["index"].summary["passage_docs_per_s"],
                     "seconds_total": summary["total_seconds"], "stale_revisions": summary["stale_revisions"]})
        run_dir = ws.run_dir("corpus-build", run.info.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        hist = run_dir / "cluster_sizes.png"
        _cluster_histogram(version_dir, hist, config.clustering.max_tokens, summary["clusters_over_S"])
        write_json(run_dir / "summary.json", summary)
        for f in (version_dir / "manifest.json", version_dir / "ingest_report.parquet", hist, run_dir / "summary.json"):
            log_artifact(f)
        mlflow.set_tag("corpus_version", version_dir.name)
        md = redact_url(summary_markdown(summary))
        create_markdown_artifact(key=f"corpus-build-{config.name}".lower().replace("_", "-"), markdown=md,
                                 description="corpus-build summary")
        mlflow.set_tag("corpus_unchanged", str(unchanged).lower())
        if not unchanged:
            promote(config, ws, version_dir, decision)
    return summary


def run_corpus_build(cfg: CorpusBuildConfig) -> dict[str, Any]:
    """CLI entry: run the flow (ephemeral Prefect API unless PREFECT_API_URL is set)."""
    return corpus_build_flow(cfg)


def refuse_mirror(cfg: CorpusBuildConfig) -> None:
    """``funnelrag build-corpus``'s check before any flow run: a dumps mirror is followed by
    ``funnelrag nightly`` (the ``corpus-build-nightly`` flow, which hands this flow tonight's dump
    as ``source.paths``).

    Raises
    ------
    funnelrag.config.ConfigError
        ``source.mirror`` is set (its value is not repeated: a URL may hold credentials).
    """
    if cfg.source.mirror:
        raise ConfigError("source.mirror is set: a dumps mirror is followed by the nightly flow, use `funnelrag "
                          "nightly` with the same --config/--set (build-corpus builds source.paths or source.datasets)")


COMMANDS = [
    FlowCommand("build-corpus", "build, validate and publish a versioned corpus + BM25 indexes (default: Wikispeedia)",
                CorpusBuildConfig, run_corpus_build, check=refuse_mirror,
                flags=(("--no-cache", "cache.read=false", "build without reading any cache entry"),
                       ("--verify", "cache.verify=true", "build without the cache and compare with the current version "
                        "(first differing table and row; exit status 1 when they differ); nothing is published")),
                exit_status=lambda summary: 1 if not summary.get("verify", {}).get("same", True) else 0),
]
