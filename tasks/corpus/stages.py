"""The corpus build's stages as pure functions over directories (no Prefect import).

Each ``run_*`` function reads its inputs from stage directories, writes its outputs into
``out_dir`` through the artifact contracts, and returns a JSON-ready summary (counts and
seconds). :mod:`flows.corpus_build` wraps each in a Prefect task and a content-keyed cache.
"""
from __future__ import annotations

import itertools
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import corpus as C
from funnelrag.stages import stage
from tasks.corpus.sharded.cluster_index import (cluster_index_from_results,  # noqa: F401 - cluster_texts re-exported
                                                cluster_texts, plan_cluster_tokens)
from tasks.corpus.clustering import (
    ClusteringConfig,
    check_clustering,
    cluster_documents,
    cluster_members_table,
    clusters_table,
    graph_metrics_table,
)
from tasks.corpus.graph import graph_from_links, graph_metrics
from tasks.corpus.index import BM25Config, BM25Index
from tasks.sources.ingest import IngestConfig, ingest
from tasks.corpus.local_clustering import PreviousClusters, cluster_documents_local
from tasks.corpus.segment import SegmentConfig, WindowTokens, count_window_tokens, segment_corpus
from tasks.corpus.sharded.sharded_index import STATS_FILE, build_passage_shards, load_passage_index
from funnelrag.memory import in_build_collector, release_memory
from tasks.corpus.sharded.passage_tokens import PassageTokenShards
from tasks.corpus.sharded.shards import ordered_results, run_here
from tasks.corpus.tokenize import load_token_counter

log = logging.getLogger(__name__)

CLUSTER_INDEX_DIR = "index/clusters.bm25"
PASSAGE_INDEX_DIR = "index/passages.bm25"


@stage("ingest", version="2")  # 2: doc_id from the page (page id or title hash), int64
def run_ingest(inputs: Sequence[Path], out_dir: Path, cfg: IngestConfig, **parallel: Any) -> dict[str, Any]:
    """Ingest stage: raw dump files → documents, redirects, links, ingest report.

    ``parallel``: ``submit``, ``streams_per_piece``, ``window`` of :func:`tasks.sources.ingest.ingest`
    (multistream dumps parsed in pieces; same artifacts). Returns the
    :class:`tasks.sources.ingest.IngestSummary` as a dict (paths dropped) plus ``mb_per_s``
    (uncompressed MB per wall-clock second).

    Raises
    ------
    ValueError
        The inputs hold 0 documents (no page, or every page skipped): there is nothing to
        cluster; the message names the inputs and what their records were.
    """
    summary = ingest(list(inputs), out_dir, cfg, **parallel).to_dict()
    if summary["documents"] == 0:
        names = ", ".join(str(p) for p in inputs)
        what = (f"{summary['records']:,} records ({summary['by_status']}, skipped: {summary['skipped']})"
                if summary["records"] else "no page/record at all")
        raise ValueError(f"ingest: 0 documents in {names}: {what}; nothing to build a corpus from")
    summary.pop("outputs", None)
    summary["mb_per_s"] = summary["uncompressed_bytes"] / 1e6 / max(summary["seconds"], 1e-9)
    return summary


@stage("tokens", version="2")  # 2: rows in the documents' order, their page-derived doc ids
def run_tokens(ingest_dir: Path, out_dir: Path, cfg: SegmentConfig, mirror: Path | None) -> dict[str, Any]:
    """Count tokens of every ~100-word window of every article with ``cfg.tokenizer``.

    Writes ``window_tokens.parquet``: one row per document, in ``documents.parquet``'s row order,
    with its windows' token counts.
    """
    t0 = time.perf_counter()
    docs = C.DOCUMENTS.read(ingest_dir, columns=["doc_id", "text"])
    counter = load_token_counter(cfg.tokenizer, mirror)
    wt = count_window_tokens(docs.column("text").to_pylist(), cfg, counter)
    offsets = pa.array(wt.indptr.astype(np.int32))
    table = pa.table({
        "doc_id": docs.column("doc_id"),
        "n_tokens": pa.ListArray.from_arrays(offsets, pa.array(wt.n_tokens, pa.int32())),
        "tokenizer": pa.array([wt.tokenizer] * docs.num_rows, pa.string()),
    })
    C.WINDOW_TOKENS.write(table, out_dir)
    seconds = time.perf_counter() - t0
    return {"documents": docs.num_rows, "windows": int(wt.n_tokens.size), "tokens": int(wt.n_tokens.sum()),
            "tokenizer": wt.tokenizer, "seconds": seconds, "tokens_per_s": float(wt.n_tokens.sum()) / max(seconds, 1e-9)}


def read_window_tokens(tokens_dir: Path) -> WindowTokens:
    """Load ``window_tokens.parquet`` back into :class:`tasks.corpus.segment.WindowTokens` (rows in
    the file's order: ``documents.parquet``'s)."""
    table = C.WINDOW_TOKENS.read(tokens_dir)
    col = table.column("n_tokens").combine_chunks()
    names = set(table.column("tokenizer").unique().to_pylist())
    if len(names) > 1:
        raise ValueError(f"{tokens_dir}: window tokens counted with several tokenizers {sorted(names)}")
    return WindowTokens(indptr=col.offsets.to_numpy().astype(np.int64),
                        n_tokens=col.values.to_numpy(zero_copy_only=False).astype(np.int32),
                        tokenizer=names.pop() if names else "none")


@stage("cluster", version="2")  # 2: published doc ids; cluster_id = its anchor's doc_id
def run_cluster(ingest_dir: Path, tokens_dir: Path, out_dir: Path, cfg: ClusteringConfig,
                previous_dir: Path | None = None) -> dict[str, Any]:
    """Graph + local clustering coefficients + Algorithm 1 → graph_metrics, clusters, cluster_members.

    ``cfg.mode == "local"`` with ``previous_dir`` (the published version this build follows):
    Algorithm 1 re-runs only where the graph changed since that version and keeps its other
    clusters (:func:`tasks.corpus.local_clustering.cluster_documents_local`); the summary adds
    ``clustering_local`` = 1 and the ``local_*`` counts of
    :meth:`tasks.corpus.local_clustering.GraphChange.summary`. Without ``previous_dir``, or a
    previous version clustered with another ``S`` or tokenizer, the full algorithm runs
    (``clustering_local`` = 0, logged). ``mode: full`` ignores ``previous_dir``.
    """
    t0 = time.perf_counter()
    docs = C.DOCUMENTS.read(ingest_dir, columns=["doc_id", "title"])   # title order: the graph's rows
    doc_ids = docs.column("doc_id").to_numpy()
    links = C.LINKS.read(ingest_dir)
    wt = read_window_tokens(tokens_dir)
    if wt.tokenizer != cfg.tokenizer:
        raise ValueError(f"window tokens were counted with {wt.tokenizer!r} but clustering.tokenizer is {cfg.tokenizer!r}")
    n_tokens = wt.article_tokens()
    graph = graph_from_links(links, docs.num_rows, doc_ids)
    t1 = time.perf_counter()
    metrics = graph_metrics(graph)
    t2 = time.perf_counter()
    local: dict[str, int] = {}
    previous = None
    if cfg.mode == "local" and previous_dir is not None:
        try:
            previous = PreviousClusters.read(previous_dir)
        except ValueError as exc:   # e.g. a version published before cluster ids were their anchors' doc ids
            log.warning("clustering.mode local: %s cannot be read as a previous clustering (%s); running the full "
                        "algorithm", previous_dir, exc)
    if previous is not None and (previous.max_tokens, previous.tokenizer) != (cfg.max_tokens, cfg.tokenizer):
        log.warning("clustering.mode local: %s was clustered with S = %d (%s), this build S = %d (%s); running the full "
                    "algorithm", previous_dir, previous.max_tokens, previous.tokenizer, cfg.max_tokens, cfg.tokenizer)
        previous = None
    if previous is not None:
        clustering, change = cluster_documents_local(graph, metrics, n_tokens, docs.column("title").combine_chunks(),
                                                     cfg, previous)
        local = {"clustering_local": 1, **change.summary()}
    else:
        clustering = cluster_documents(graph, metrics, n_tokens, cfg)
        if cfg.mode == "local":
            log.info("clustering.mode local without a previous version: the full algorithm runs")
            local = {"clustering_local": 0}
    t3 = time.perf_counter()
    check_clustering(graph, clustering, n_tokens, cfg)  # Algorithm 1 post-conditions, O(n + m)
    C.GRAPH_METRICS.write(graph_metrics_table(metrics, n_tokens, clustering, doc_ids), out_dir)
    C.CLUSTERS.write(clusters_table(clustering, docs.column("title").combine_chunks(), doc_ids), out_dir)
    C.CLUSTER_MEMBERS.write(cluster_members_table(clustering, doc_ids), out_dir)
    sizes = clustering.n_tokens
    members = np.diff(clustering.indptr)
    return {
        "documents": int(docs.num_rows), "links": int(links.num_rows),
        "undirected_edges": int(graph.indices.size // 2), "clusters": int(clustering.n_clusters),
        "singleton_clusters": int((members == 1).sum()), "mean_cluster_tokens": float(sizes.mean()) if sizes.size else 0.0,
        "max_cluster_tokens": int(sizes.max()) if sizes.size else 0, "mean_cluster_members": float(members.mean()) if members.size else 0.0,
        "merges": clustering.n_merged, "skipped_for_size": clustering.n_skipped,
        "mean_clustering_coefficient": float(metrics.clustering.mean()) if metrics.clustering.size else 0.0,
        "graph_seconds": t1 - t0, "coefficient_seconds": t2 - t1, "algorithm1_seconds": t3 - t2, **local,
        "seconds": time.perf_counter() - t0,
    }


@stage("segment", version="3")  # 2: unit and passage ids from the article and window (content ids); 3: doc/cluster ids from the page
def run_segment(ingest_dir: Path, tokens_dir: Path, cluster_dir: Path, out_dir: Path, cfg: SegmentConfig,
                mirror: Path | None) -> dict[str, Any]:
    """Clusters → ~1K-token document units → ~100-word passages (offline "later chunking")."""
    t0 = time.perf_counter()
    docs = C.DOCUMENTS.read(ingest_dir, columns=["doc_id", "title", "text"])
    members = C.CLUSTER_MEMBERS.read(cluster_dir)
    wt = read_window_tokens(tokens_dir)
    seg = segment_corpus(docs, members, cfg, load_token_counter(cfg.tokenizer, mirror), window_tokens=wt)
    C.DOCUMENT_UNITS.write(seg.units, out_dir)
    C.PASSAGES.write(seg.passages, out_dir)
    unit_tokens = seg.units.column("n_tokens").to_numpy()
    return {"document_units": seg.units.num_rows, "passages": seg.passages.num_rows,
            "mean_unit_tokens": float(unit_tokens.mean()) if unit_tokens.size else 0.0,
            "articles_without_passages": seg.n_articles_without_passages, "seconds": time.perf_counter() - t0}


@stage("index", version="3")  # 2: stems numbered in sorted order (bytes independent of PYTHONHASHSEED); 3: cluster ids from anchors
def run_index(ingest_dir: Path, cluster_dir: Path, segment_dir: Path, out_dir: Path, cfg: BM25Config,
              passage_shard_tokens: int = 0, submit: Callable[..., Any] | None = None, window: int = 8,
              work_dir: Path | None = None, tokens_per_shard: int = 32_000_000,
              docs_per_range: int = 20_000, split_dir: Path | None = None, tokens_dir: Path | None = None,
              passage_words: int = SegmentConfig.passage_words) -> dict[str, Any]:
    """bm25s indexes over cluster texts (progressive) and passages (flat baseline).

    The cluster index is one index; its texts are tokenized in ranges of whole clusters of at most
    ``tokens_per_shard`` tokens through ``submit`` (default: in this process; their documents
    partitioned first in tasks of ``docs_per_range`` documents, or taken from the build's shared
    split ``split_dir``, :class:`tasks.corpus.sharded.shards.DocumentSplit`) and merged
    into the one-process vocabulary and ids (:func:`tasks.corpus.sharded.cluster_index.build_cluster_index`:
    same bytes as ``BM25Index.build`` over all cluster texts, without holding them all).
    ``passage_shard_tokens`` > 0: the passage index is built in shards of whole clusters of at
    most that many tokens with corpus-wide statistics
    (:func:`tasks.corpus.sharded.sharded_index.build_passage_shards`), the per-shard steps through
    ``submit``; 0: one index, its passages tokenized in the cluster index's ranges through ``submit``
    too, queued behind the cluster shards so that the pool tokenizes them while this process
    merges the cluster index (:class:`tasks.corpus.sharded.passage_tokens.PassageTokenShards`: same
    bytes as ``BM25Index.build`` over all passages). Shard token ids, statistics and
    indexes are kept in ``work_dir`` (default: ``out_dir/.work``, removed after), with the BM25
    token memos of member texts and passages (:mod:`tasks.corpus.sharded.token_memo`): a text the last
    build saw is not tokenized again, whatever shard it falls in (same bytes; the summary's
    ``cluster_members_reused`` and ``passages_reused`` count them). The memos key a member by its
    document's title and text key, a passage by that and its window number and ``passage_words``
    (``segment.passage_words``: the passages' windows are checked against it), the text keys those
    the tokens stage kept in ``tokens_dir`` (without them the shards hash the documents' texts;
    :mod:`tasks.corpus.sharded.piece_keys`).
    """
    t0 = time.perf_counter()
    submit = submit or run_here
    scratch = work_dir is None
    work = Path(out_dir) / ".work" if scratch else Path(work_dir)
    plan = plan_cluster_tokens(ingest_dir, cluster_dir, cfg, submit, tokens_per_shard, work, window=window,
                               docs_per_range=docs_per_range, split_dir=split_dir, tokens_dir=tokens_dir)
    passages = None if passage_shard_tokens > 0 else PassageTokenShards.plan(
        segment_dir, cluster_dir, ingest_dir, cfg, work, tokens_per_shard, tokens_dir=tokens_dir, passage_words=passage_words)
    # the passages' token shards queued behind the clusters': the pool tokenizes passages while
    # this process merges and saves the cluster index
    results = ordered_results(submit, [*plan.calls, *(passages.calls if passages else [])], window, "index token shards")
    cluster_index, clusters = cluster_index_from_results(plan, itertools.islice(results, len(plan.calls)), cfg)
    cluster_index.save(out_dir / CLUSTER_INDEX_DIR)
    n_clusters = len(cluster_index)
    del cluster_index
    release_memory(freeze=in_build_collector())   # the index and its merge buffers (GBs at full scale) go back before the passage shards run
    t1 = time.perf_counter()
    if passages is None:
        results.close()
        sharded = build_passage_shards(segment_dir, cluster_dir, out_dir / PASSAGE_INDEX_DIR, cfg,
                                       passage_shard_tokens, submit, work, window=window, ingest_dir=ingest_dir,
                                       tokens_dir=tokens_dir, passage_words=passage_words)
        n_passages = sharded["passage_index_docs"]
    else:
        passage_index, sharded = passages.index(results, cfg)
        n_passages = len(passage_index)
        passage_index.save(out_dir / PASSAGE_INDEX_DIR)
        del passage_index
    if scratch:
        shutil.rmtree(work, ignore_errors=True)
    t2 = time.perf_counter()
    return {"cluster_index_docs": n_clusters, "passage_index_docs": n_passages, "bm25": asdict(cfg),
            "cluster_index_seconds": t1 - t0, "passage_index_seconds": t2 - t1,
            "cluster_docs_per_s": n_clusters / max(t1 - t0, 1e-9), "passage_docs_per_s": n_passages / max(t2 - t1, 1e-9),
            **clusters, **sharded, "seconds": t2 - t0}


def same_ids(ids: Sequence[str], column: pa.ChunkedArray | pa.Array) -> bool:
    """Whether ``ids`` (an index's document ids, strings) and ``column`` (a table's ids, any
    type, compared as their strings) hold the same values the same number of times, in any
    order. Compared as Arrow arrays: equal in order (the common case) without a sort."""
    got = pa.array(ids, pa.string())
    want = column.cast(pa.string())
    want = want.combine_chunks() if isinstance(want, pa.ChunkedArray) else want
    if len(got) != len(want):
        return False
    if got.equals(want):
        return True
    return got.take(pc.array_sort_indices(got)).equals(want.take(pc.array_sort_indices(want)))


def validate_corpus(version_dir: Path, max_cluster_tokens: int) -> dict[str, int]:
    """Cross-artifact checks of a staged corpus version; raises ``ValueError`` naming the
    artifact and the first offending ids. Also checks every table against its contract
    (:meth:`data_contracts.base.Contract.verify`: every column but the article and passage
    texts read and validated, the texts' types and nulls from the files' footers).

    Checks: every document in exactly one cluster; no cluster over S tokens unless it is a
    single document; cluster and passage indexes (either passage layout) cover exactly the
    clusters and passages, a sharded one's global ``N`` is the passage count; every passage's
    document exists.
    """
    tables = {c.name: c.verify(version_dir) for c in C.CORPUS_CONTRACTS}
    n_docs = tables["documents"].num_rows
    members = tables["cluster_members"]
    if members.num_rows != n_docs:
        raise ValueError(f"cluster_members: {members.num_rows} rows for {n_docs} documents (each document must be in exactly one cluster)")
    doc_ids = tables["documents"].column("doc_id").to_numpy()
    missing = np.setdiff1d(doc_ids, members.column("doc_id").to_numpy())
    if missing.size:
        raise ValueError(f"cluster_members: documents {missing[:5].tolist()} are in no cluster")
    clusters = tables["clusters"]
    over = pc.and_(pc.greater(clusters["n_tokens"], max_cluster_tokens), pc.greater(clusters["n_members"], 1))
    if pc.any(over).as_py():
        bad = clusters.filter(over).column("cluster_id").to_pylist()[:5]
        raise ValueError(f"clusters: {bad} exceed {max_cluster_tokens} tokens with more than one member")
    for sub, table, key in ((CLUSTER_INDEX_DIR, clusters, "cluster_id"), (PASSAGE_INDEX_DIR, tables["passages"], "passage_id")):
        index = BM25Index.load(version_dir / sub) if sub == CLUSTER_INDEX_DIR else load_passage_index(version_dir / sub)
        if not same_ids(index.doc_ids, table.column(key)):
            raise ValueError(f"{sub}: index ids do not match the {key}s of the published tables")
    stats_file = version_dir / PASSAGE_INDEX_DIR / STATS_FILE
    if stats_file.exists() and json.loads(stats_file.read_text())["n_docs"] != tables["passages"].num_rows:
        raise ValueError(f"{stats_file}: N differs from the {tables['passages'].num_rows} passages (shards built with other statistics)")
    pdocs = tables["passages"].column("doc_id").to_numpy()
    if np.setdiff1d(pdocs, doc_ids).size:
        raise ValueError("passages: a passage refers to a document that does not exist")
    return {name: t.num_rows for name, t in tables.items()}
