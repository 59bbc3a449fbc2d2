"""Contracts of the corpus build (the nightly corpus build).

Ids, and what each is stable across:

- ``passage_id`` (string, ``{key}.p{w:03d}``) names window ``w`` of the article whose title has the
  document key ``key`` (16 hex digits of BLAKE2b-64 of the UTF-8 title,
  :func:`document_key`). **Stable across builds and nights** for as long as the
  article keeps its title and is cut with the same ``segment`` settings (``passage_words``): it does
  not depend on the cluster, the unit, the document's rank or any other article. An edited article
  keeps the ids of its windows (their texts may change: reuse keyed on a passage must also check
  its text); a window past the end of a shortened article disappears.
- ``unit_id`` (string, ``{key}.u{w:03d}``) names a unit by its first passage's article and window:
  stable while Algorithm 1 and the packing start a unit at that window (a unit keeps its id when
  its cluster's members before it are unchanged).
- ``doc_id`` (int64) names the article from its page: the dump's ``page_id`` for MediaWiki
  sources (``ingest.format: mediawiki``), :func:`title_doc_id` (BLAKE2b-64 of the normalised
  title, masked to 63 bits) for sources without page ids (``wikispeedia``, ``jsonl``). **Stable
  across builds and nights** for as long as the page exists (MediaWiki: a renamed page keeps its
  id) or keeps its title (the other sources); an added or removed article changes no other
  article's id. Distinct within a version (ingest fails naming the two titles otherwise).
  ``links.parquet``, ``cluster_members``, ``graph_metrics``, ``passages`` and
  ``window_tokens`` carry the same ids.
- ``cluster_id`` (int64) is the ``doc_id`` of the cluster's first member (its anchor, Algorithm
  1's seed; :func:`_cluster_id_is_anchor`), unique since every article is in one cluster. Stable
  for as long as the anchor's ``doc_id`` is and Algorithm 1 seeds a cluster at it: a cluster
  Algorithm 1 regroups may change its id or its members under the same id (compare members, as
  :func:`tasks.corpus.survival.id_survival` does, before reusing anything keyed on a cluster).

Dense row numbers are private to a build: the rows of ``documents.parquet`` (sorted titles) are the
nodes of the hyperlink graph and the order Algorithm 1 breaks ties by; ``clusters.parquet`` and
``cluster_members.parquet`` are in Algorithm 1's order (clusters in the order they were formed,
members by ``position``); ``graph_metrics`` and ``window_tokens`` are in the documents' row order.
Readers map ids to rows with :func:`rows_of`, never use an id as an index.

The passages cut at query time ("later chunking") carry the same ids as the passage table built
offline. Ids do not sort in file order: ``passages.parquet`` and ``document_units.parquet`` are in
(cluster, unit position, passage position) order; the row numbers of the index files
(``index/*.bm25``, embeddings) are that file order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.base import Contract

DOCUMENTS = Contract(
    name="documents",
    filename="documents.parquet",
    schema=pa.schema([
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),      # normalised Wikipedia title
        pa.field("text", pa.string(), nullable=False),       # plain text, UTF-8
        pa.field("page_id", pa.int64(), nullable=True),      # dump page id; null for formats without one
        pa.field("source", pa.string(), nullable=False),     # input file the page came from
    ]),
    unique=("doc_id",),
    free_text=("text",),
)

REDIRECTS = Contract(
    name="redirects",
    filename="redirects.parquet",
    schema=pa.schema([
        pa.field("source_title", pa.string(), nullable=False),  # normalised title of the redirect page
        pa.field("target_title", pa.string(), nullable=True),   # final kept article after chains; null unless resolved
        pa.field("status", pa.string(), nullable=False),        # resolved | cycle | dangling | excluded
        pa.field("hops", pa.int16(), nullable=False),           # redirects followed (1 = direct)
    ]),
    unique=("source_title",),
)
"""One row per main-namespace redirect page, sorted by ``source_title``. ``dangling``: the chain
ends at a title with no page (or in another namespace); ``excluded``: it ends at a page that
was skipped (e.g. a disambiguation page); ``cycle``: the chain revisits a title."""

LINKS = Contract(
    name="links",
    filename="links.parquet",
    schema=pa.schema([
        pa.field("src_doc_id", pa.int64(), nullable=False),
        pa.field("dst_doc_id", pa.int64(), nullable=False),
    ]),
    unique=("src_doc_id", "dst_doc_id"),
)

INGEST_REPORT = Contract(
    name="ingest_report",
    filename="ingest_report.parquet",
    schema=pa.schema([
        pa.field("source", pa.string(), nullable=False),     # input file name
        pa.field("position", pa.int64(), nullable=False),    # 0-based ordinal of the record in its source
        pa.field("record", pa.string(), nullable=False),     # page title, archive member or "line N"
        pa.field("page_id", pa.int64(), nullable=True),
        pa.field("title", pa.string(), nullable=True),       # normalised title (joins documents.title); null if none
        pa.field("status", pa.string(), nullable=False),     # kept | redirect | skipped
        pa.field("reason", pa.string(), nullable=True),      # why skipped (other_namespace, empty_text, ...)
        pa.field("n_bytes", pa.int64(), nullable=False),     # raw UTF-8 bytes of the record's text
        pa.field("detail", pa.string(), nullable=True),      # human-readable detail of a skip
    ]),
    unique=("source", "position"),
)
"""Every input record, in input order: ``kept`` (a document), ``redirect`` (a redirects row) or
``skipped`` with a reason: malformed_page, invalid_utf8, other_namespace, oversize,
duplicate_title, disambiguation, empty_text, malformed_link (a bad links.tsv line)."""

def _coefficient_in_unit_interval(table: pa.Table):
    """graph_metrics: the local clustering coefficient lies in [0, 1]."""
    cc = table.column("clustering_coefficient").to_numpy()
    bad = np.flatnonzero((cc < 0) | (cc > 1) | np.isnan(cc))
    return ("clustering_coefficient", bad[:5].tolist(), "outside [0, 1]") if bad.size else None


def _positions_dense_per_cluster(table: pa.Table):
    """cluster_members: positions inside each cluster are exactly 0..n_members-1."""
    cid = table.column("cluster_id").to_numpy()
    pos = table.column("position").to_numpy()
    order = np.lexsort((pos, cid))
    cid, pos = cid[order], pos[order]
    start = np.r_[True, cid[1:] != cid[:-1]] if cid.size else np.zeros(0, bool)
    first = np.maximum.accumulate(np.where(start, np.arange(cid.size), 0)) if cid.size else np.zeros(0, np.int64)
    bad = np.flatnonzero(pos != np.arange(cid.size) - first)
    return ("position", order[bad[:5]].tolist(), "positions of a cluster are not 0..n_members-1") if bad.size else None


def document_key(title: str) -> str:
    """The document part of unit and passage ids: 16 hex digits of BLAKE2b-64 of the UTF-8 title.

    The same on every machine and Python (no ``PYTHONHASHSEED``), and stable across builds for as
    long as the article keeps its title. Two titles with the same key would give two passages one
    id, which the ``passages`` contract rejects (unique ``passage_id``): at 6M titles the chance is ~1e-6.
    """
    return hashlib.blake2b(title.encode("utf-8"), digest_size=8).hexdigest()


def title_doc_id(title: str) -> int:
    """The ``doc_id`` of an article from a source without page ids: :func:`document_key` of its
    normalised title read as an integer and masked to 63 bits (a non-negative int64)."""
    return int(document_key(title), 16) & 0x7FFF_FFFF_FFFF_FFFF


def rows_of(ids: np.ndarray, wanted: np.ndarray, what: str) -> np.ndarray:
    """The row of each of ``wanted`` in ``ids``: ids → the dense row order private to a build.

    Parameters
    ----------
    ids : ``(n,)`` int
        Distinct ids in table order (``documents.doc_id`` in title order, ``clusters.cluster_id``
        in Algorithm 1's order).
    wanted : ``(m,)`` int
        Ids to look up, any order, repeats allowed.
    what : str
        Names the table in errors (``"documents"``).

    Returns
    -------
    ``(m,)`` int64 rows into ``ids``.

    Raises
    ------
    ValueError
        An id of ``wanted`` is not in ``ids`` (the message names the first such id).
    """
    ids = np.asarray(ids, np.int64)
    wanted = np.asarray(wanted, np.int64)
    ascending = ids.size < 2 or bool(np.all(ids[1:] > ids[:-1]))
    order = None if ascending else np.argsort(ids, kind="stable")
    ordered = ids if order is None else ids[order]
    pos = np.searchsorted(ordered, wanted)
    found = pos < ordered.size
    found[found] = ordered[pos[found]] == wanted[found]
    if not found.all():
        raise ValueError(f"{what}: id {int(wanted[np.flatnonzero(~found)[0]])} is not in the table")
    return pos if order is None else order[pos]


def member_order(cluster_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Row order of ``cluster_members`` rows grouped by cluster, clusters in the order they first
    appear (the file's order: Algorithm 1's), members by ``position``: ``(n,)`` int64 indices."""
    cids = np.asarray(cluster_ids, np.int64)
    if not cids.size:
        return np.zeros(0, np.int64)
    _, first, inverse = np.unique(cids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return np.lexsort((np.asarray(positions), rank[inverse.ravel()]))


def _cluster_id_is_anchor(table: pa.Table):
    """cluster_members: a cluster's id is the ``doc_id`` of its first member (position 0, its anchor)."""
    first = pc.equal(table.column("position"), 0)
    bad = pc.indices_nonzero(pc.and_(first, pc.not_equal(table.column("cluster_id"), table.column("doc_id")))).to_pylist()
    return ("cluster_id", bad[:5], ("cluster_id is not the doc_id of the cluster's first member (a version published before content-derived "
                                      "ids: build the corpus again, e.g. the next nightly)")) if bad else None


PASSAGE_ID_PATTERN = r"^[0-9a-f]{16}\.p[0-9]{3,}$"
UNIT_ID_PATTERN = r"^[0-9a-f]{16}\.u[0-9]{3,}$"
"""Content ids (:func:`tasks.corpus.segment.passage_id`, :func:`tasks.corpus.segment.unit_id`): the
document key (16 hex digits of BLAKE2b-64 of the article's title) and the window in the article."""


def _ids_match(table: pa.Table, column: str, pattern: str):
    """The rows whose ``column`` does not match ``pattern`` (Arrow's regex kernel, no Python string a row)."""
    if not table.num_rows:
        return None
    bad = pc.indices_nonzero(pc.invert(pc.match_substring_regex(table.column(column), pattern))).to_pylist()
    return (column, bad[:5], f"{column} is not a content id ({pattern})") if bad else None


def _unit_ids_are_content_ids(table: pa.Table):
    """document_units: ``unit_id`` is ``{document key}.u{window:03d}``."""
    return _ids_match(table, "unit_id", UNIT_ID_PATTERN)


def _passage_ids_are_content_ids(table: pa.Table):
    """passages: ``passage_id`` is ``{document key}.p{window:03d}``, ``unit_id`` a unit's content id."""
    return _ids_match(table, "passage_id", PASSAGE_ID_PATTERN) or _ids_match(table, "unit_id", UNIT_ID_PATTERN)


GRAPH_METRICS = Contract(
    name="graph_metrics",
    filename="graph_metrics.parquet",
    schema=pa.schema([
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("degree", pa.int32(), nullable=False),              # undirected degree
        pa.field("triangles", pa.int64(), nullable=False),
        pa.field("clustering_coefficient", pa.float64(), nullable=False),  # local, undirected (= networkx.clustering)
        pa.field("n_tokens", pa.int32(), nullable=False),            # article length in tokenizer tokens
        pa.field("order", pa.int32(), nullable=False),               # Algorithm 1 processing rank (0 = first)
    ]),
    unique=("doc_id",),
    checks=(_coefficient_in_unit_interval,),
)

CLUSTERS = Contract(
    name="clusters",
    filename="clusters.parquet",
    schema=pa.schema([
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("n_members", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("title", pa.string(), nullable=False),              # title of the first member
    ]),
    unique=("cluster_id",),
)

CLUSTER_MEMBERS = Contract(
    name="cluster_members",
    filename="cluster_members.parquet",
    schema=pa.schema([
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),            # order of the member inside the cluster text
        pa.field("doc_id", pa.int64(), nullable=False),
    ]),
    unique=("doc_id",),
    checks=(_positions_dense_per_cluster, _cluster_id_is_anchor),
)

DOCUMENT_UNITS = Contract(
    name="document_units",
    filename="document_units.parquet",
    schema=pa.schema([
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("n_passages", pa.int32(), nullable=False),
        pa.field("title", pa.string(), nullable=False),              # title of the unit's first passage
    ]),
    unique=("unit_id",),
    checks=(_unit_ids_are_content_ids,),
)

PASSAGES = Contract(
    name="passages",
    filename="passages.parquet",
    schema=pa.schema([
        pa.field("passage_id", pa.string(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("n_words", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
    ]),
    unique=("passage_id",),
    checks=(_passage_ids_are_content_ids,),
    free_text=("text",),
)

CORPUS_CONTRACTS = (DOCUMENTS, REDIRECTS, LINKS, INGEST_REPORT, GRAPH_METRICS, CLUSTERS,
                    CLUSTER_MEMBERS, DOCUMENT_UNITS, PASSAGES)

# Intermediate of the corpus build (cached, not published): tokens of every ~100-word window
# of every article, counted once and shared by Algorithm 1 (article lengths) and segmentation.
WINDOW_TOKENS = Contract(
    name="window_tokens",
    filename="window_tokens.parquet",
    schema=pa.schema([
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("n_tokens", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
        pa.field("tokenizer", pa.string(), nullable=False),
    ]),
    unique=("doc_id",),
)


@dataclass(frozen=True)
class BuildConfigContract:
    """Contract of the build config a published corpus records in ``manifest.json``
    (``manifest["config"]``, version ``manifest["config_version"]``): the sections later flows
    rely on and the keys each must have. Bump ``version`` when a key changes meaning."""

    version: int
    sections: Mapping[str, tuple[str, ...]]

    def stamp(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Manifest fields for ``config`` (a JSON-able dict): ``{"config", "config_version"}``.

        Raises
        ------
        ValueError
            A required section or key is missing.
        """
        for name in self.sections:
            self.section({"config": config, "config_version": self.version}, name, Path("<new manifest>"))
        return {"config": dict(config), "config_version": self.version}

    def section(self, manifest: Mapping[str, Any], name: str, source: Path) -> dict[str, Any]:
        """``manifest["config"][name]`` after checking version and required keys (``source``
        names the manifest in errors). Manifests written before the version was recorded are version 1."""
        version = manifest.get("config_version", 1)
        if version != self.version:
            raise ValueError(f"{source}: build config version {version}, this code reads {self.version}")
        if name not in self.sections:
            raise ValueError(f"{source}: no build-config section {name!r} in the contract ({sorted(self.sections)})")
        section = manifest.get("config", {}).get(name)
        if not isinstance(section, Mapping):
            raise ValueError(f"{source}: manifest has no config.{name}")
        missing = [k for k in self.sections[name] if k not in section]
        if missing:
            raise ValueError(f"{source}: config.{name} lacks {missing}")
        return dict(section)


BUILD_CONFIG = BuildConfigContract(version=1, sections={
    "ingest": ("format",),
    "clustering": ("max_tokens", "tokenizer"),
    "segment": ("passage_words", "unit_max_tokens", "tokenizer"),
    "bm25": ("k1", "b"),
})
"""Later chunking (:meth:`tasks.corpus.published.CorpusVersion.segment_config`) must cut units and
passages exactly as the build did, so ``segment`` is read back through this contract."""
