"""Per-cluster segmentation memo: a cluster's document units and passages kept under the content
of its members, reused by the next build whatever the cluster's id and its documents' ids.

Why: Algorithm 1 reruns every night and the document ids shift with every new title, so neither a
cluster id nor a shard of clusters repeats after an adds-changes day; but most clusters hold the
same articles, in the same order, with the same texts. Cutting them into ~100-word passages and
~1K-token units (:func:`tasks.corpus.segment.segment_cluster`) is then the same work for the same
result, up to the cluster and document ids in its rows. The memo is keyed on texts, not titles
(two clusters of the same texts under other titles share an entry), so it keeps each cluster's rows
without the titles and the document part of their content ids:

- a cluster's key (:func:`cluster_keys`) is the BLAKE2b-128 of its members' text keys (each
  the BLAKE2b-128 of a text, hashed once a shard) and window token counts, in cluster order (the
  windows, their counts and the packing depend on nothing else; the memo's directory name carries
  the segmentation settings, :func:`memo_dir`);
- a document index keeps, by text key, where each text's windows lie among the memo's passages
  (:meth:`SegmentMemo.document_windows`): a cluster that changed (Algorithm 1 regroups ~40% of
  the clusters after a 1% adds-changes day on the synthetic mirror, most of their articles
  unchanged) is packed from its members' windows as cut before, and only a new or edited text is
  cut again;
- its passage rows hold the member (index in the cluster), the id suffixes of the passage and of
  its unit (``.p003``, ``.u000``: the window in the member's article, the part of a content id
  after the document key, :func:`tasks.corpus.segment.passage_id`), text, words and tokens; its
  unit rows the suffix, position, tokens, passages and the member of the first passage;
- :func:`label` joins them with tonight's documents: each member's document key before the
  suffixes (ids depend on the article and window only, never on the cluster), the cluster id, the
  member's document id and title — the rows :func:`tasks.corpus.segment.segments_to_tables`
  makes for that cluster, byte for byte (tested).

Layout: a :class:`funnelrag.content_store.ContentMemo` whose fields ``units`` and ``passages`` map each
key to its rows' numbers in ``units.arrow`` / ``passages.arrow`` (Arrow IPC, memory-mapped), and the
document index: ``documents.keys.npy`` (sorted distinct text keys) and ``documents.rows.npy``
(``[start, end)`` passage rows of each). Each
segment shard writes its clusters' rows as a part (:func:`write_part`, in the shard's cache entry)
and the stage replaces the memo with the parts of this build (:class:`MemoWriter`, atomic), so it
holds exactly the last build's clusters. Nothing here imports Prefect.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from data_contracts import corpus as C
from data_contracts.base import names_disk_full, temp_name
from funnelrag.content_store import ContentMemo, distinct_keys, ranges_take, settings_dir
from funnelrag.content_store import take_rows, take_texts
from tasks.corpus.segment import (ClusterSegments, SegmentConfig, TokenCounter, cluster_windows, document_key,
                                  windows_in_member)

SEGMENT_MEMO_VERSION = "4"   # 3: id suffixes from the window in the article (content ids); 4: doc and cluster ids from the page
UNITS_FILE, PASSAGES_FILE = "units.arrow", "passages.arrow"
KEYS_FILE, COUNTS_FILE = "keys.npy", "counts.npy"
MEMBER_KEYS_FILE, MEMBER_WINDOWS_FILE = "member_keys.npy", "member_windows.npy"
DOCUMENT_KEYS_FILE, DOCUMENT_ROWS_FILE = "documents.keys.npy", "documents.rows.npy"
LABELLED_UNITS_FILE, LABELLED_PASSAGES_FILE = "units.labelled.arrow", "passages.labelled.arrow"
"""A segment shard's rows under tonight's ids (``document_units`` / ``passages`` schemas), in its
cache entry beside its part: :func:`write_rows`, read back once by the coordinator."""
FIELDS = ("units", "passages")
UNIT_SCHEMA = pa.schema([pa.field("suffix", pa.string(), nullable=False), pa.field("position", pa.int32(), nullable=False),
                         pa.field("n_tokens", pa.int32(), nullable=False),
                         pa.field("n_passages", pa.int32(), nullable=False), pa.field("member", pa.int32(), nullable=False)])
PASSAGE_SCHEMA = pa.schema([pa.field("suffix", pa.string(), nullable=False),
                            pa.field("member", pa.int32(), nullable=False), pa.field("text", pa.large_string(), nullable=False),
                            pa.field("n_words", pa.int32(), nullable=False), pa.field("n_tokens", pa.int32(), nullable=False)])

_PART_PASSAGE_SCHEMA = pa.schema([f for f in PASSAGE_SCHEMA if f.name != "text"])


def memo_dir(root: Path, cfg: SegmentConfig) -> Path:
    """The segmentation memo under ``root`` (the segment shards' cache) for ``cfg``'s settings."""
    return settings_dir(root, "segment-memo", SEGMENT_MEMO_VERSION, cfg)


MEMO_BATCH_ROWS = 65_536
"""Rows per record batch of the memo's and its parts' Arrow files."""


def cluster_keys(bounds: Sequence[tuple[int, int]], rows: Sequence[int], text_keys: np.ndarray,
                 offsets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(n_clusters, 2)`` uint64 keys (BLAKE2b-128 as (high, low) words) of clusters given as
    ``bounds`` ``[(start, end)]`` into ``rows`` (member ``i``'s document row), hashing each member's
    text key ``text_keys[r]`` (``(n_docs, 2)`` uint64, :func:`funnelrag.content_store.arrow_text_keys`:
    the BLAKE2b-128 of its text, so no text is hashed twice) and its window token counts
    ``counts[offsets[r]:offsets[r + 1]]`` (int32, length-prefixed) in cluster order."""
    key_bytes = np.ascontiguousarray(np.asarray(text_keys, np.uint64).astype(">u8")).view(np.uint8).reshape(-1, 16)
    raw = bytearray()
    for start, end in bounds:
        h = hashlib.blake2b(digest_size=16)
        for r in rows[start:end]:
            h.update(key_bytes[r].tobytes())
            window = np.ascontiguousarray(counts[offsets[r]:offsets[r + 1]], "<i4")
            h.update(window.size.to_bytes(8, "little"))
            h.update(window.tobytes())
        raw += h.digest()
    return np.frombuffer(bytes(raw), dtype=">u8").astype(np.uint64).reshape(len(bounds), 2)


def unlabel(segments: Sequence[ClusterSegments], member_doc_ids: Sequence[Sequence[int]]
            ) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """The rows of :func:`tasks.corpus.segment.segment_cluster` outputs without ids: ``(units
    (UNIT_SCHEMA), passages (PASSAGE_SCHEMA), counts (n, 2) int64: units and passages per
    cluster)``; ``member_doc_ids[c]`` are cluster ``c``'s document ids in cluster order."""
    units = {name: [] for name in UNIT_SCHEMA.names}
    passages = {name: [] for name in PASSAGE_SCHEMA.names}
    counts = np.zeros((len(segments), 2), np.int64)
    for c, (seg, doc_ids) in enumerate(zip(segments, member_doc_ids)):
        member = {int(d): i for i, d in enumerate(doc_ids)}
        n_passages = 0
        for u in seg.units:
            suffix = u.unit_id[u.unit_id.index("."):]
            for key, value in (("suffix", suffix), ("position", u.position), ("n_tokens", u.n_tokens),
                               ("n_passages", len(u.passages)), ("member", member[u.passages[0].doc_id])):
                units[key].append(value)
            for p in u.passages:
                passages["suffix"].append(p.passage_id[p.passage_id.index("."):])
                passages["member"].append(member[p.doc_id])
                passages["text"].append(p.text)
                passages["n_words"].append(p.n_words)
                passages["n_tokens"].append(p.n_tokens)
            n_passages += len(u.passages)
        counts[c] = (len(seg.units), n_passages)
    return pa.table(units, schema=UNIT_SCHEMA), pa.table(passages, schema=PASSAGE_SCHEMA), counts


def segment_unlabeled(clusters: Iterable[tuple[int, Sequence[int], Sequence[str], Sequence[np.ndarray]]],
                      cfg: SegmentConfig,
                      tokenizer: TokenCounter) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Cut clusters into id-free rows directly: ``unlabel([segment_cluster(...) for each cluster],
    member doc ids)`` without making the ``Passage`` and ``DocumentUnit`` objects and their ids
    first (same tables, tested; the rows of the clusters a night segments, which :func:`label` then
    gives tonight's ids).

    Parameters
    ----------
    clusters : per cluster (any iterable) ``(cluster_id, doc_ids, texts, window_tokens)``: its id and
        its members' document ids and texts in cluster order (the ids name a cluster in errors only),
        and each member's window token counts (``WindowTokens.of(row)``, int32, one per window of
        :func:`tasks.corpus.segment.article_windows`).
    cfg : the segmentation settings (``passage_words``, ``unit_max_tokens``, ``tokenizer``).
    tokenizer : the counter named ``cfg.tokenizer`` (checked only: the counts are given).

    Returns
    -------
    (units (UNIT_SCHEMA), passages (PASSAGE_SCHEMA), counts (n_clusters, 2) int64)
        As :func:`unlabel` returns them (the windows and units of
        :func:`tasks.corpus.segment.cluster_windows`, as :func:`tasks.corpus.segment.segment_cluster` cuts them).

    Raises
    ------
    ValueError
        The tokenizer is not the configured one, or a member's token counts do not match its
        windows (names the cluster and the document).
    """
    u_suffix: list[str] = []
    u_position: list[int] = []
    u_tokens: list[int] = []
    u_passages: list[int] = []
    u_member: list[int] = []
    p_suffix: list[str] = []
    p_member: list[int] = []
    p_text: list[str] = []
    p_words: list[int] = []
    p_tokens: list[np.ndarray] = []
    counts: list[tuple[int, int]] = []
    for cluster_id, doc_ids, texts, window_tokens in clusters:
        windows, members, tokens, bounds = cluster_windows(cluster_id, doc_ids, texts, cfg, tokenizer, window_tokens)
        in_doc = windows_in_member(members).tolist()
        p_suffix.extend(f".p{w:03d}" for w in in_doc)
        for k in range(len(bounds) - 1):
            a, b = bounds[k], bounds[k + 1]
            unit = f".u{in_doc[a]:03d}"
            u_suffix.append(unit)
            u_position.append(k)
            u_tokens.append(int(tokens[a:b].sum()))
            u_passages.append(b - a)
            u_member.append(members[a])
        p_member.extend(members)
        p_text.extend(windows)
        p_words.extend(w.count(" ") + 1 for w in windows)   # words joined by single spaces
        p_tokens.append(tokens)
        counts.append((len(bounds) - 1, len(windows)))
    units = pa.table({"suffix": u_suffix, "position": pa.array(u_position, pa.int32()),
                      "n_tokens": pa.array(u_tokens, pa.int32()), "n_passages": pa.array(u_passages, pa.int32()),
                      "member": pa.array(u_member, pa.int32())}, schema=UNIT_SCHEMA)
    passages = pa.table({"suffix": p_suffix, "member": pa.array(p_member, pa.int32()),
                         "text": pa.array(p_text, pa.large_string()), "n_words": pa.array(p_words, pa.int32()),
                         "n_tokens": pa.array(np.concatenate(p_tokens) if p_tokens else np.zeros(0, np.int32), pa.int32())},
                        schema=PASSAGE_SCHEMA)
    return units, passages, np.array(counts, np.int64).reshape(-1, 2)


def label(units: pa.Table, passages: pa.Table, counts: np.ndarray, cluster_ids: np.ndarray,
          member_starts: np.ndarray, doc_ids: np.ndarray, titles: pa.Array) -> tuple[pa.Table, pa.Table]:
    """Tonight's ``document_units`` and ``passages`` rows of clusters whose id-free rows
    (:func:`unlabel`, clusters one after the other, ``counts`` ``(n, 2)`` units and passages each)
    are ``units`` / ``passages``: cluster ``c`` is ``cluster_ids[c]`` and its member ``m`` is the
    document ``doc_ids[member_starts[c] + m]`` titled ``titles[member_starts[c] + m]``; an id is
    the member's :func:`tasks.corpus.segment.document_key` and the kept suffix (the cluster does
    not enter it).

    Returns tables of :data:`data_contracts.corpus.DOCUMENT_UNITS` / ``PASSAGES``'s schemas
    (contract-validated)."""
    n = len(cluster_ids)
    u_of = np.repeat(np.arange(n), counts[:, 0]) if n else np.zeros(0, np.int64)
    p_of = np.repeat(np.arange(n), counts[:, 1]) if n else np.zeros(0, np.int64)
    starts = np.asarray(member_starts, np.int64)
    id_type = C.PASSAGES.schema.field("cluster_id").type
    cids = np.asarray(cluster_ids, id_type.to_pandas_dtype())
    u_member = starts[u_of] + units.column("member").to_numpy()
    p_member = starts[p_of] + passages.column("member").to_numpy()
    keys = pa.array([document_key(t) for t in titles.to_pylist()], pa.string())   # (n_members,) one hash a document
    u_prefix, p_prefix = keys.take(pa.array(u_member)), keys.take(pa.array(p_member))
    unit_ids = pc.binary_join_element_wise(u_prefix, units.column("suffix"), "")
    unit_of = np.repeat(np.arange(units.num_rows), units.column("n_passages").to_numpy())   # (n_passages,) each one's unit
    out_units = pa.table({"unit_id": unit_ids, "cluster_id": pa.array(cids[u_of], id_type),
                          "position": units.column("position"), "n_tokens": units.column("n_tokens"),
                          "n_passages": units.column("n_passages"), "title": titles.take(pa.array(u_member))},
                         schema=C.DOCUMENT_UNITS.schema)
    out_passages = pa.table({"passage_id": pc.binary_join_element_wise(p_prefix, passages.column("suffix"), ""),
                             "unit_id": unit_ids.take(pa.array(unit_of)),
                             "cluster_id": pa.array(cids[p_of], id_type),
                             "doc_id": pa.array(np.asarray(doc_ids)[p_member].astype(id_type.to_pandas_dtype()), id_type),
                             "title": titles.take(pa.array(p_member)), "text": passages.column("text").cast(pa.string()),
                             "n_words": passages.column("n_words"), "n_tokens": passages.column("n_tokens")},
                            schema=C.PASSAGES.schema)
    return (C.DOCUMENT_UNITS.validate(out_units.combine_chunks()), C.PASSAGES.validate(out_passages.combine_chunks()))


class SegmentMemo:
    """A segmentation memo opened for lookups (:meth:`open`)."""

    def __init__(self, memo: ContentMemo, units: pa.Table, passages: pa.Table, documents: ContentMemo | None = None,
                 document_rows: np.ndarray | None = None):
        self.memo, self.units, self.passages = memo, units, passages
        self.documents, self.document_rows = documents, document_rows

    @classmethod
    def open(cls, directory: Path | str | None) -> "SegmentMemo | None":
        """The memo in ``directory`` (arrays and tables memory-mapped), or ``None`` when there is none."""
        memo = ContentMemo.open(directory, FIELDS)
        if memo is None:
            return None
        tables = [ipc.open_file(pa.memory_map(str(Path(directory) / name))).read_all()
                  for name in (UNITS_FILE, PASSAGES_FILE)]
        try:
            keys = np.load(Path(directory) / DOCUMENT_KEYS_FILE, mmap_mode="r")
            rows = np.load(Path(directory) / DOCUMENT_ROWS_FILE, mmap_mode="r")
        except FileNotFoundError:   # no document index: clusters only
            return cls(memo, *tables)
        return cls(memo, *tables, ContentMemo(Path(directory), keys, {}), rows)

    def document_windows(self, text_keys: np.ndarray, n_windows: np.ndarray) -> list[list[str] | None]:
        """Each text's windows as the last build cut them (:func:`tasks.corpus.segment.article_windows`),
        looked up by its text key (``(m, 2)`` uint64, :func:`funnelrag.content_store.arrow_text_keys`):
        the memo's passage texts of the first member with that text, or ``None`` where the memo
        holds no such text or holds another number of windows than ``n_windows`` (``(m,)``, the
        text's window token counts: a memo of other settings is never mixed in)."""
        out: list[list[str] | None] = [None] * len(text_keys)
        if self.documents is None or not len(text_keys):
            return out
        found = self.documents.lookup(text_keys)
        hit = np.flatnonzero(found >= 0)
        rows = np.asarray(self.document_rows[found[hit]], np.int64).reshape(-1, 2)
        same = (rows[:, 1] - rows[:, 0]) == np.asarray(n_windows, np.int64)[hit]
        hit, rows = hit[same], rows[same]
        lengths, order = ranges_take(rows[:, 0], rows[:, 1], np.arange(self.passages.num_rows, dtype=np.int64))
        texts = take_texts(self.passages.column("text"), order)   # chunk by chunk: no copy of all the memo's texts
        at = 0
        for i, n in zip(hit.tolist(), lengths.tolist()):
            out[i] = texts[at:at + n]
            at += n
        return out

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Memo row of each cluster key (``-1``: not held), :meth:`funnelrag.content_store.ContentMemo.lookup`."""
        return self.memo.lookup(keys)

    def take(self, rows: np.ndarray) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """The id-free rows of memo rows ``rows`` (all >= 0), one cluster after the other, and their
        ``(len(rows), 2)`` unit and passage counts (the arguments of :func:`label`)."""
        n_units, unit_rows = self.memo.take("units", rows)
        n_passages, passage_rows = self.memo.take("passages", rows)
        return (take_rows(self.units, unit_rows), take_rows(self.passages, passage_rows),
                np.stack([n_units, n_passages], axis=1).astype(np.int64))


def interleave(first: tuple[pa.Table, pa.Table, np.ndarray], second: tuple[pa.Table, pa.Table, np.ndarray],
               from_second: np.ndarray) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Id-free rows of clusters in one order: cluster ``c`` is the next of ``second`` where
    ``from_second[c]``, else the next of ``first`` (each ``(units, passages, counts)``)."""
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


def write_part(directory: Path, keys: np.ndarray, units: pa.Table, passages: pa.Table, counts: np.ndarray,
               member_keys: np.ndarray, member_windows: np.ndarray) -> None:
    """One shard's clusters for the next memo, in its cache entry ``directory``: their keys, counts
    and id-free rows, the passages without their text (it is read back from the entry's
    labelled passages (:data:`LABELLED_PASSAGES_FILE`), whose rows are the same in the same order,
    by :func:`write_memo`), and
    their members' text keys (``(n_members, 2)`` uint64, :func:`funnelrag.content_store.arrow_text_keys`)
    and windows (``(n_members,)``), members in cluster order, clusters in row order: a member's
    windows are the next ``member_windows[i]`` passage rows, which the memo's document index
    (:meth:`SegmentMemo.document_windows`) keeps by text.

    The rows are written in record batches of :data:`MEMO_BATCH_ROWS`, whatever the chunks of
    ``units`` / ``passages`` (rows taken from the memo come as one slice per run).

    Raises ``ValueError`` when the members' windows do not add up to the passages."""
    member_windows = np.asarray(member_windows, np.int64)
    if int(member_windows.sum()) != passages.num_rows or len(member_keys) != member_windows.size:
        raise ValueError(f"{directory}: {member_windows.size} members with {int(member_windows.sum())} windows "
                         f"({len(member_keys)} keys) for {passages.num_rows} passages")
    np.save(directory / KEYS_FILE, np.ascontiguousarray(keys, np.uint64))
    np.save(directory / COUNTS_FILE, np.ascontiguousarray(counts, np.int64))
    np.save(directory / MEMBER_KEYS_FILE, np.ascontiguousarray(member_keys, np.uint64).reshape(-1, 2))
    np.save(directory / MEMBER_WINDOWS_FILE, member_windows)
    for name, table, schema in ((UNITS_FILE, units, UNIT_SCHEMA), (PASSAGES_FILE, passages.drop_columns(["text"]),
                                                                    _PART_PASSAGE_SCHEMA)):
        with ipc.new_file(str(directory / name), schema) as writer:
            writer.write_table(table.cast(schema).combine_chunks(), max_chunksize=MEMO_BATCH_ROWS)


def write_rows(path: Path, table: pa.Table) -> None:
    """A segment shard's labelled rows as an uncompressed Arrow IPC file in record batches of
    :data:`MEMO_BATCH_ROWS` (:func:`read_rows` maps it: nothing decoded or copied).

    Why not Parquet: the coordinator reads these rows once, to write the build's
    ``passages.parquet`` (zstd) and the next memo. A shard of 224,404 passages of the 200K-page
    mirror, written and read back: 0.45 CPU s as lz4 Parquet, 0.03 as uncompressed IPC
    (``benchmarks/bench_incremental_stages.py copies``), ~1.8 CPU s of the ~1M passages an
    adds-changes night (and a full build) writes, for ~1.55x the bytes in the shard cache, which
    retention prunes (the nightly home on that mirror: 7.14 GB after night 4, against 6.65 with
    lz4 Parquet and no document index)."""
    with names_disk_full(path), ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=MEMO_BATCH_ROWS)


def read_rows(path: Path) -> pa.Table:
    """The rows :func:`write_rows` wrote, memory-mapped."""
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def has_part(directory: Path) -> bool:
    """Whether ``directory`` holds a part written by :func:`write_part` beside its passages."""
    return all((Path(directory) / name).is_file()
               for name in (KEYS_FILE, COUNTS_FILE, MEMBER_KEYS_FILE, MEMBER_WINDOWS_FILE, UNITS_FILE, PASSAGES_FILE,
                            LABELLED_PASSAGES_FILE))


def document_index(member_keys: Sequence[np.ndarray], member_ends: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The memo's document index from its parts' members: ``(keys (m, 2) uint64, rows (m, 2)
    int64)``, one row a distinct text key in key order, ``rows`` the ``[start, end)`` of that
    text's windows in the memo's passages (the first member with that text: equal texts have equal
    windows). ``member_ends``: each member's end row (its start is the previous member's end, 0
    for the first of all)."""
    keys = np.concatenate(member_keys).reshape(-1, 2).astype(np.uint64) if member_keys else np.zeros((0, 2), np.uint64)
    ends = np.concatenate(member_ends).astype(np.int64) if member_ends else np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    kept = distinct_keys(keys)[1]
    return np.ascontiguousarray(keys[kept]), np.stack([starts[kept], ends[kept]], axis=1)


class MemoWriter:
    """The next segmentation memo, written part by part as the segment stage reads its shards
    (:meth:`add`), then put in place atomically (:meth:`commit`): the memo's rows of a part are
    its units and id-free passages (:func:`write_part`) with the text of its labelled passages,
    which the stage has just read for ``passages.parquet`` of the build and hands over, so the
    texts are not read a second time. A repeated key is kept once. The rows go to two Arrow files
    in a ``.tmp-<pid>-<memo>.parts`` directory beside ``directory`` (same file system), moved into the
    memo's directory on commit and removed on :meth:`abort` (or, after a killed stage, by the
    cache's sweep of stale temp directories); ``directory`` keeps the last memo until
    :meth:`commit` replaces it.

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
        self._units = ipc.new_file(str(self._tmp[UNITS_FILE]), UNIT_SCHEMA)
        self._passages = ipc.new_file(str(self._tmp[PASSAGES_FILE]), PASSAGE_SCHEMA)
        self._keys: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []
        self._member_keys: list[np.ndarray] = []
        self._member_ends: list[np.ndarray] = []   # each member's last passage row + 1 in the memo's passages
        self._n_passages = 0

    def add(self, part: Path, text: pa.ChunkedArray | pa.Array | None = None) -> None:
        """Append the clusters of ``part`` (a segment shard's cache entry holding a :func:`write_part`
        part); ``text`` is its labelled passages' ``text`` column when the caller has it (else
        read here). Raises ``ValueError`` when the part's rows and texts differ in number."""
        part = Path(part)
        self._keys.append(np.load(part / KEYS_FILE))
        self._counts.append(np.load(part / COUNTS_FILE))
        self._units.write_table(ipc.open_file(pa.memory_map(str(part / UNITS_FILE))).read_all().combine_chunks(),
                                max_chunksize=MEMO_BATCH_ROWS)
        rows = ipc.open_file(pa.memory_map(str(part / PASSAGES_FILE))).read_all()
        if text is None:
            text = read_rows(part / LABELLED_PASSAGES_FILE).column("text")
        if len(text) != rows.num_rows:
            raise ValueError(f"{part}: {rows.num_rows} memo rows but {len(text)} passages")
        windows = np.load(part / MEMBER_WINDOWS_FILE)
        if int(windows.sum()) != rows.num_rows:
            raise ValueError(f"{part}: its members have {int(windows.sum())} windows but {rows.num_rows} passages")
        self._member_keys.append(np.load(part / MEMBER_KEYS_FILE))
        self._member_ends.append(self._n_passages + np.cumsum(windows, dtype=np.int64))
        self._n_passages += rows.num_rows
        table = rows.add_column(PASSAGE_SCHEMA.get_field_index("text"), "text", text.cast(pa.large_string()))
        self._passages.write_table(table.cast(PASSAGE_SCHEMA).combine_chunks(), max_chunksize=MEMO_BATCH_ROWS)

    def commit(self) -> int:
        """Replace the memo in ``directory`` with the parts added, atomically; returns the clusters written."""
        self._units.close()
        self._passages.close()
        keys_all = np.concatenate(self._keys) if self._keys else np.zeros((0, 2), np.uint64)
        counts_all = np.concatenate(self._counts) if self._counts else np.zeros((0, 2), np.int64)
        fields = {}
        for k, name in enumerate(FIELDS):
            offsets = np.concatenate([[0], np.cumsum(counts_all[:, k])]).astype(np.int64)
            fields[name] = (offsets, np.arange(int(offsets[-1]), dtype=np.int64))
        move = lambda name: lambda path: os.replace(self._tmp[name], path)  # noqa: E731
        doc_keys, doc_rows = document_index(self._member_keys, self._member_ends)
        try:
            return ContentMemo.write(self.directory, keys_all, fields,
                                      extra={UNITS_FILE: move(UNITS_FILE), PASSAGES_FILE: move(PASSAGES_FILE),
                                             DOCUMENT_KEYS_FILE: lambda path: np.save(path, doc_keys),
                                             DOCUMENT_ROWS_FILE: lambda path: np.save(path, doc_rows)})
        finally:
            self._remove_tmp()

    def abort(self) -> None:
        """Drop what was added; the last memo stays."""
        for writer in (self._units, self._passages):
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the files are being discarded anyway
                pass
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        shutil.rmtree(self._work, ignore_errors=True)


def write_memo(directory: Path, parts: Sequence[Path]) -> int:
    """Replace the memo in ``directory`` with the clusters of ``parts`` (segment shard cache
    entries holding a :func:`write_part` part), atomically, reading each part's texts from its
    labelled passages (:class:`MemoWriter` without the texts handed over). Returns the clusters written."""
    writer = MemoWriter(directory)
    try:
        for part in parts:
            writer.add(Path(part))
    except BaseException:
        writer.abort()
        raise
    return writer.commit()
