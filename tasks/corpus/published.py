"""Read access to a published corpus version (the output of the ``corpus-build`` flow).

Layout of a version directory (``home/stores/corpus/<name>/versions/<version>/``)::

    documents.parquet  redirects.parquet  links.parquet  ingest_report.parquet
    graph_metrics.parquet  clusters.parquet  cluster_members.parquet
    document_units.parquet  passages.parquet
    index/clusters.bm25/   BM25 over cluster texts (progressive path; ids = cluster_id as str)
    index/passages.bm25/   BM25 over passages (flat baseline; ids = passage_id); with
                           ``index.passage_shard_tokens`` > 0: shards.json, global_stats.json and
                           shard-00000/, … (one bm25s index per range of clusters, global idf)
    manifest.json          written last: every file's sha256/rows/contract, ``content_digest``,
                           ``counts``, the build ``config`` and the code and schema versions

Later flows read the build's ``segment`` settings (later chunking must cut units and passages
exactly as the build did) with :meth:`CorpusVersion.segment_config`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import corpus as C
from data_contracts.base import sha256_file
from funnelrag.content_store import take_texts
from funnelrag.store import ArtifactStore
from funnelrag.workspace import Workspace
from tasks.corpus.index import BM25Index
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.sharded_index import load_passage_index

CORPUS_STORE = "corpus"
DEFAULT_CORPUS = "wikispeedia"
CLUSTER_INDEX = "index/clusters.bm25"
PASSAGE_INDEX = "index/passages.bm25"


def _lazy_table(contract) -> cached_property:
    return cached_property(lambda self: self.table(contract))


@dataclass
class CorpusVersion:
    """One published corpus version; tables are read (and contract-checked) lazily."""

    path: Path
    version: str
    manifest: dict[str, Any] = field(repr=False)

    @property
    def digest(self) -> str:
        """sha256 of the manifest: the data version logged with every model trained on it."""
        return sha256_file(self.path / "manifest.json")

    def table(self, contract) -> pa.Table:
        """The version's artifact ``contract`` (read and checked against its schema)."""
        return contract.read(self.path)

    # Tables read once per CorpusVersion object, on first access.
    documents = _lazy_table(C.DOCUMENTS)
    cluster_members = _lazy_table(C.CLUSTER_MEMBERS)
    clusters = _lazy_table(C.CLUSTERS)
    passages = _lazy_table(C.PASSAGES)

    def build_config(self, section: str) -> dict[str, Any]:
        """Section ``section`` (``ingest``, ``clustering``, ``segment``, ``bm25``) of the build config
        recorded in the manifest, checked against :data:`data_contracts.corpus.BUILD_CONFIG`.

        Raises
        ------
        ValueError
            The manifest's config version is not the one this code reads, or the section is
            missing or lacks a required key (the message names the manifest).
        """
        return C.BUILD_CONFIG.section(self.manifest, section, self.path / "manifest.json")

    def segment_config(self):
        """The :class:`tasks.corpus.segment.SegmentConfig` the version was built with: later
        chunking at query time must cut clusters exactly as the build did."""
        return SegmentConfig(**self.build_config("segment"))

    def cluster_index(self):
        return BM25Index.load(self.path / CLUSTER_INDEX)

    def passage_index(self):
        """The flat passage BM25 index: a :class:`tasks.corpus.index.BM25Index`, or a
        :class:`tasks.corpus.sharded.sharded_index.ShardedBM25` for a version built with
        ``index.passage_shard_tokens`` > 0 (same ``search``, ``search_rows``, ``doc_ids``, equal results)."""
        return load_passage_index(self.path / PASSAGE_INDEX)

    def members_of(self, cluster_ids: list[int]) -> dict[int, list[tuple[int, str, str]]]:
        """``{cluster_id: [(doc_id, title, text), ...]}`` in cluster order, for later chunking.

        Titles and texts are gathered chunk by chunk (:func:`funnelrag.content_store.take_texts`):
        ``ChunkedArray.take`` concatenates the column first, which fails with an offset overflow
        once a corpus's texts pass 2 GiB (1M pages) and copies every text to pick a few."""
        id_type = C.CLUSTER_MEMBERS.schema.field("cluster_id").type
        members = self.cluster_members.filter(pc.is_in(self.cluster_members["cluster_id"], pa.array(cluster_ids, id_type)))
        members = members.take(C.member_order(members["cluster_id"].to_numpy(), members["position"].to_numpy()))
        docs = self.documents
        doc_ids = members["doc_id"].to_numpy()
        rows = C.rows_of(docs["doc_id"].to_numpy(), doc_ids, f"{self.path}: documents")
        titles, texts = take_texts(docs["title"], rows), take_texts(docs["text"], rows)
        out: dict[int, list[tuple[int, str, str]]] = {int(c): [] for c in cluster_ids}
        for cid, did, title, text in zip(members["cluster_id"].to_pylist(), doc_ids.tolist(), titles, texts):
            out[cid].append((did, title, text))
        return out


def corpus_store(ws: Workspace, name: str = DEFAULT_CORPUS) -> ArtifactStore:
    """The versioned store of corpus ``name`` (``home/stores/corpus/<name>``)."""
    return ArtifactStore(ws.store_dir(f"{CORPUS_STORE}/{name}"))


def open_corpus(ws: Workspace, name: str = DEFAULT_CORPUS, version: str | None = None) -> CorpusVersion:
    """The current (or a named) published version of corpus ``name`` (default: wikispeedia).

    Raises
    ------
    FileNotFoundError
        Nothing published yet, or no such version.
    """
    store = corpus_store(ws, name)
    path = store.current_dir() if version is None else store.versions_dir / version
    if not (path / "manifest.json").exists():
        raise FileNotFoundError(f"corpus version {version} not found in {store.versions_dir}")
    return CorpusVersion(path=path, version=path.name, manifest=store.read_manifest(path.name))


def list_corpora(ws: Workspace) -> dict[str, str]:
    """``{corpus name: current version}`` of every corpus published under ``ws`` (sorted)."""
    root = ws.store_dir(CORPUS_STORE)
    if not root.is_dir():
        return {}
    found = {p.name: ArtifactStore(p).current_version() for p in sorted(root.iterdir()) if p.is_dir()}
    return {name: version for name, version in found.items() if version}
