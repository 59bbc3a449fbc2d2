"""Per-cluster segmentation memo: a cluster's document units and passages kept under everything
that makes them, reused as they are by the next build whose shard holds the same cluster.

Why: the shards are content-defined ranges of clusters (:func:`tasks.corpus.sharded.shards.cluster_ranges`),
but one edited article changes its shard's key, and Algorithm 1 regroups some clusters after an
adds-changes day; most clusters of such a shard hold the same articles, in the same order, with the
same texts, titles and ids. Cutting them into ~100-word passages and ~1K-token units
(:func:`tasks.corpus.segment.segment_clusters`) is then the same work for the same rows: ids are
content ids (a passage's from its article's title and window, :func:`tasks.corpus.segment.passage_id`;
a document's from its page, a cluster's from its anchor), so a row kept is tonight's row.

- a cluster's key (:func:`cluster_keys`) is the BLAKE2b-128 of its id and, in cluster order, its
  members' document ids, titles, text keys (each the BLAKE2b-128 of a text, hashed once a shard)
  and window token counts: every input of its rows (the memo's directory name carries the
  segmentation settings, :func:`memo_dir`);
- its rows are those of the ``document_units`` and ``passages`` tables, kept as they were written;
- a cluster the memo lacks is cut by :func:`tasks.corpus.segment.segment_clusters` (the one
  segmentation) and the rows of a shard put back in cluster order (:func:`interleave`).

Layout: a :class:`funnelrag.content_store.ContentMemo` whose fields ``units`` and ``passages`` map each
key to its rows' numbers in ``units.arrow`` / ``passages.arrow`` (Arrow IPC, memory-mapped). Each
segment shard writes its rows (:func:`write_rows`) and its clusters' keys and row counts
(:func:`write_part`) in its cache entry, and the stage replaces the memo with this build's
shards (:class:`MemoWriter`, atomic), so it holds exactly the last build's clusters. Nothing here
imports Prefect.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from data_contracts import corpus as C
from data_contracts.base import names_disk_full, temp_name
from funnelrag.content_store import ContentMemo, Utf8Rows, ranges_take, settings_dir, take_rows
from tasks.corpus.segment import SegmentConfig

SEGMENT_MEMO_VERSION = "5"   # 4: doc and cluster ids from the page; 5: rows kept with their ids (no relabelling)
UNITS_FILE, PASSAGES_FILE = "units.arrow", "passages.arrow"
"""The rows (``document_units`` / ``passages`` schemas) of the memo, and of a segment shard's cache entry."""
KEYS_FILE, COUNTS_FILE = "keys.npy", "counts.npy"
FIELDS = ("units", "passages")


def memo_dir(root: Path, cfg: SegmentConfig) -> Path:
    """The segmentation memo under ``root`` (the segment shards' cache) for ``cfg``'s settings."""
    return settings_dir(root, "segment-memo", SEGMENT_MEMO_VERSION, cfg)


MEMO_BATCH_ROWS = 65_536
"""Rows per record batch of the memo's and the shards' Arrow files."""


def cluster_keys(bounds: Sequence[tuple[int, int]], rows: Sequence[int], cluster_ids: np.ndarray, doc_ids: np.ndarray,
                 titles: pa.Array | pa.ChunkedArray, text_keys: np.ndarray, offsets: np.ndarray,
                 counts: np.ndarray) -> np.ndarray:
    """``(n_clusters, 2)`` uint64 keys (BLAKE2b-128 as (high, low) words) of clusters given as
    ``bounds`` ``[(start, end)]`` into ``rows`` (member ``i``'s document row), hashing cluster
    ``k``'s id ``cluster_ids[k]`` and, for each member in cluster order, its document's id
    ``doc_ids[r]``, title ``titles[r]`` (UTF-8, length-prefixed), text key ``text_keys[r]``
    (``(n_docs, 2)`` uint64, :func:`funnelrag.content_store.arrow_text_keys`: the BLAKE2b-128 of its
    text, so no text is hashed twice) and window token counts ``counts[offsets[r]:offsets[r + 1]]``
    (int32, length-prefixed): everything the cluster's rows are made of."""
    key_bytes = np.ascontiguousarray(np.asarray(text_keys, np.uint64).astype(">u8")).view(np.uint8).reshape(-1, 16)
    ids = np.asarray(doc_ids, "<i8")
    names = Utf8Rows(titles)
    raw = bytearray()
    for cluster_id, (start, end) in zip(np.asarray(cluster_ids, "<i8").tolist(), bounds):
        h = hashlib.blake2b(int(cluster_id).to_bytes(8, "little", signed=True), digest_size=16)
        for r in rows[start:end]:
            title = names[r]
            h.update(ids[r].tobytes())
            h.update(len(title).to_bytes(8, "little"))
            h.update(title)
            h.update(key_bytes[r].tobytes())
            window = np.ascontiguousarray(counts[offsets[r]:offsets[r + 1]], "<i4")
            h.update(window.size.to_bytes(8, "little"))
            h.update(window.tobytes())
        raw += h.digest()
    return np.frombuffer(bytes(raw), dtype=">u8").astype(np.uint64).reshape(len(bounds), 2)


class SegmentMemo:
    """A segmentation memo opened for lookups (:meth:`open`)."""

    def __init__(self, memo: ContentMemo, units: pa.Table, passages: pa.Table):
        self.memo, self.units, self.passages = memo, units, passages

    @classmethod
    def open(cls, directory: Path | str | None) -> "SegmentMemo | None":
        """The memo in ``directory`` (arrays and tables memory-mapped), or ``None`` when there is none."""
        memo = ContentMemo.open(directory, FIELDS)
        if memo is None:
            return None
        return cls(memo, *(read_rows(Path(directory) / name) for name in (UNITS_FILE, PASSAGES_FILE)))

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Memo row of each cluster key (``-1``: not held), :meth:`funnelrag.content_store.ContentMemo.lookup`."""
        return self.memo.lookup(keys)

    def take(self, rows: np.ndarray) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """The rows of memo rows ``rows`` (all >= 0), one cluster after the other, and their
        ``(len(rows), 2)`` unit and passage counts."""
        n_units, unit_rows = self.memo.take("units", rows)
        n_passages, passage_rows = self.memo.take("passages", rows)
        return (take_rows(self.units, unit_rows), take_rows(self.passages, passage_rows),
                np.stack([n_units, n_passages], axis=1).astype(np.int64))


def interleave(first: tuple[pa.Table, pa.Table, np.ndarray], second: tuple[pa.Table, pa.Table, np.ndarray],
               from_second: np.ndarray) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Rows of clusters in one order: cluster ``c`` is the next of ``second`` where
    ``from_second[c]``, else the next of ``first`` (each ``(units, passages, counts)``, the
    counts ``(n, 2)`` units and passages a cluster)."""
    from_second = np.asarray(from_second, bool)
    counts = np.zeros((from_second.size, 2), np.int64)
    counts[~from_second], counts[from_second] = first[2], second[2]
    tables = []
    for field in (0, 1):
        sizes = counts[:, field]
        own = np.zeros(from_second.size, np.int64)   # start of each cluster's rows in its own table
        for mask, part in ((~from_second, first), (from_second, second)):
            own[mask] = np.concatenate([[0], np.cumsum(part[2][:, field])[:-1]]) if mask.any() else []
        own[from_second] += first[field].num_rows
        _, order = ranges_take(own, own + sizes, np.arange(first[field].num_rows + second[field].num_rows))
        tables.append(take_rows(pa.concat_tables([first[field], second[field]]), order))
    return tables[0], tables[1], counts


def write_part(directory: Path, keys: np.ndarray, counts: np.ndarray) -> None:
    """One shard's clusters for the next memo, in its cache entry ``directory`` beside its rows
    (:data:`UNITS_FILE`, :data:`PASSAGES_FILE`): their keys (``(n, 2)`` uint64, :func:`cluster_keys`)
    and ``(n, 2)`` int64 units and passages each, clusters in row order."""
    np.save(directory / KEYS_FILE, np.ascontiguousarray(keys, np.uint64))
    np.save(directory / COUNTS_FILE, np.ascontiguousarray(counts, np.int64))


def write_rows(path: Path, table: pa.Table) -> None:
    """A segment shard's rows as an uncompressed Arrow IPC file in record batches of
    :data:`MEMO_BATCH_ROWS`, whatever the chunks of ``table`` (:func:`read_rows` maps it: nothing
    decoded or copied).

    Why not Parquet: the coordinator reads these rows once, to write the build's
    ``passages.parquet`` (zstd) and the next memo. A shard of 224,404 passages of the 200K-page
    mirror, written and read back: 0.45 CPU s as lz4 Parquet, 0.03 as uncompressed IPC
    (``benchmarks/bench_incremental_stages.py copies``), ~1.8 CPU s of the ~1M passages an
    adds-changes night (and a full build) writes, for ~1.55x the bytes in the shard cache, which
    retention prunes (the nightly home on that mirror: 7.14 GB after night 4, against 6.65 with
    lz4 Parquet and no document index)."""
    with names_disk_full(path), ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table.combine_chunks(), max_chunksize=MEMO_BATCH_ROWS)


def read_rows(path: Path) -> pa.Table:
    """The rows :func:`write_rows` wrote, memory-mapped."""
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def has_part(directory: Path) -> bool:
    """Whether ``directory`` holds a part written by :func:`write_part` beside its rows."""
    return all((Path(directory) / name).is_file() for name in (KEYS_FILE, COUNTS_FILE, UNITS_FILE, PASSAGES_FILE))


class MemoWriter:
    """The next segmentation memo, written part by part as the segment stage reads its shards
    (:meth:`add`), then put in place atomically (:meth:`commit`): a part's rows are the shard's
    ``document_units`` and ``passages`` rows, which the stage has just read for the build's
    tables and hands over, so they are not read a second time. A repeated key is kept once. The
    rows go to two Arrow files in a ``.tmp-<pid>-<memo>.parts`` directory beside ``directory``
    (same file system), moved into the memo's directory on commit and removed on :meth:`abort`
    (or, after a killed stage, by the cache's sweep of stale temp directories); ``directory``
    keeps the last memo until :meth:`commit` replaces it.

    Each part's rows are written in record batches of :data:`MEMO_BATCH_ROWS`. A table of many
    small batches is slow to slice and take from (each slice walks the chunk list): rows taken
    from a memo come back as one slice per run, and written as they came, the batches got smaller
    every night (80,240 batches of ~62 passages after three nights at 1M pages, where a shard's
    rows took ~7 CPU s to gather instead of a few hundredths)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        # ".tmp-<pid>-<name>.parts" (not atomic_directory's ".tmp-<pid>-<name>"): a killed stage's
        # files are swept with the cache's other temp directories (funnelrag.reaper.sweep_stale_temp_dirs)
        self._work = self.directory.parent / temp_name(f"{self.directory.name}.parts")
        shutil.rmtree(self._work, ignore_errors=True)
        self._work.mkdir(parents=True)
        self._tmp = {name: self._work / name for name in (UNITS_FILE, PASSAGES_FILE)}
        self._writers = {UNITS_FILE: ipc.new_file(str(self._tmp[UNITS_FILE]), C.DOCUMENT_UNITS.schema),
                         PASSAGES_FILE: ipc.new_file(str(self._tmp[PASSAGES_FILE]), C.PASSAGES.schema)}
        self._keys: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []

    def add(self, part: Path, units: pa.Table | None = None, passages: pa.Table | None = None) -> None:
        """Append the clusters of ``part`` (a segment shard's cache entry holding a :func:`write_part`
        part); ``units`` / ``passages`` are its rows when the caller has them (else read here).
        Raises ``ValueError`` when the part's counts and rows differ in number."""
        part = Path(part)
        counts = np.load(part / COUNTS_FILE)
        for k, (name, table) in enumerate(((UNITS_FILE, units), (PASSAGES_FILE, passages))):
            table = read_rows(part / name) if table is None else table
            if int(counts[:, k].sum()) != table.num_rows:
                raise ValueError(f"{part}: its clusters have {int(counts[:, k].sum())} {FIELDS[k]} "
                                 f"but {name} holds {table.num_rows} rows")
            self._writers[name].write_table(table.combine_chunks(), max_chunksize=MEMO_BATCH_ROWS)
        self._keys.append(np.load(part / KEYS_FILE))
        self._counts.append(counts)

    def commit(self) -> int:
        """Replace the memo in ``directory`` with the parts added, atomically; returns the clusters written."""
        for writer in self._writers.values():
            writer.close()
        keys_all = np.concatenate(self._keys) if self._keys else np.zeros((0, 2), np.uint64)
        counts_all = np.concatenate(self._counts) if self._counts else np.zeros((0, 2), np.int64)
        fields = {}
        for k, name in enumerate(FIELDS):
            offsets = np.concatenate([[0], np.cumsum(counts_all[:, k])]).astype(np.int64)
            fields[name] = (offsets, np.arange(int(offsets[-1]), dtype=np.int64))
        move = lambda name: lambda path: os.replace(self._tmp[name], path)  # noqa: E731
        try:
            return ContentMemo.write(self.directory, keys_all, fields,
                                     extra={name: move(name) for name in (UNITS_FILE, PASSAGES_FILE)})
        finally:
            self._remove_tmp()

    def abort(self) -> None:
        """Drop what was added; the last memo stays."""
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the files are being discarded anyway
                pass
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        shutil.rmtree(self._work, ignore_errors=True)
