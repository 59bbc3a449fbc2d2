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

Layout: no row is copied into the memo. Each segment shard writes its rows (:func:`write_rows`) and
its clusters' keys and row counts (:func:`write_part`) in its own cache entry (a *part*); the memo is
a small manifest entry (:data:`MANIFEST_FILE`, :func:`write_manifest`, atomic, with its digests)
naming the last build's parts, each with the sha256 of its ``digests.json``, so it holds exactly the
last build's clusters. :class:`SegmentMemo` looks keys up over the parts' keys and takes rows from
their Arrow files (memory-mapped). The build checks the manifest and each part it lists once
(:func:`verify_memo`); a part gone or other than the one named is skipped, and its clusters are cut
again. Retention (:func:`funnelrag.store.prune_cache`) keeps the parts as long as the manifest: the
build that writes it marks each of its shard entries used (made, or hit:
:func:`funnelrag.store.mark_used`); a part pruned later is skipped. Nothing here imports Prefect.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from data_contracts import corpus as C
from data_contracts.base import atomic_directory, names_disk_full, sha256_file
from funnelrag.content_store import Utf8Rows, join_keys, key_order, ranges_take, settings_dir, take_rows
from funnelrag.verify import DIGESTS_FILE, record_digests, verified_entry
from tasks.corpus.segment import SegmentConfig

log = logging.getLogger(__name__)

SEGMENT_MEMO_VERSION = "6"   # 5: rows kept with their ids (no relabelling); 6: a manifest of the shards' parts
UNITS_FILE, PASSAGES_FILE = "units.arrow", "passages.arrow"
"""The rows (``document_units`` / ``passages`` schemas) of a segment shard's cache entry."""
KEYS_FILE, COUNTS_FILE = "keys.npy", "counts.npy"
FIELDS = ("units", "passages")
MANIFEST_FILE = "parts.json"
"""The memo's manifest: ``{"segment_memo_version", "parts": [{"name", "digests_sha256", "clusters"}]}``, a
part's name being its directory under the shard cache root (the memo's parent)."""
INDEX_KEYS_FILE, INDEX_ROWS_FILE = "index_keys.npy", "index_rows.npy"
"""Beside the manifest: every listed part's cluster keys sorted (``(n, 2)`` uint64) and each one's memo
row (``(n,)`` int64, its place in the parts' concatenation), and :data:`COUNTS_FILE` the concatenated
counts: a shard opening the memo maps them instead of loading and sorting every part's keys."""


def memo_dir(root: Path, cfg: SegmentConfig) -> Path:
    """The segmentation memo's manifest entry under ``root`` (the segment shards' cache, where its
    parts are) for ``cfg``'s settings."""
    return settings_dir(root, "segment-memo", SEGMENT_MEMO_VERSION, cfg)


MEMO_BATCH_ROWS = 65_536
"""Rows per record batch of the shards' Arrow files (the memo's rows)."""


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
    """A segmentation memo opened for lookups (:meth:`open`): the clusters of its parts, one part
    after the other (a cluster's *memo row* is its place in that concatenation).

    ``parts``: the parts' entry directories; ``keys`` / ``counts``: each part's ``(n, 2)`` uint64
    cluster keys and ``(n, 2)`` int64 units and passages a cluster (:func:`write_part`). A part's
    Arrow files are memory-mapped the first time rows are taken from it."""

    def __init__(self, parts: Sequence[Path], sizes: np.ndarray, usable: np.ndarray, sorted_keys: np.ndarray,
                 order: np.ndarray, counts: np.ndarray):
        self.parts = [Path(p) for p in parts]
        sizes = np.asarray(sizes, np.int64)
        self.part_of = np.repeat(np.arange(len(self.parts), dtype=np.int64), sizes)   # (n_rows,)
        self.usable = np.asarray(usable, bool)
        self.counts = np.asarray(counts, np.int64).reshape(-1, 2)
        if self.counts.shape[0] != int(sizes.sum()) or len(order) != self.counts.shape[0]:
            raise ValueError(f"segmentation memo: {int(sizes.sum())} clusters in its parts, {self.counts.shape[0]} counts, "
                             f"{len(order)} keys")
        # (n_rows, 2): each cluster's first unit and passage row in its own part's files
        self.rows_in = np.zeros((len(self.parts), 2), np.int64)   # (n_parts, 2): units and passages of each part
        np.add.at(self.rows_in, self.part_of, self.counts)
        running = np.cumsum(self.counts, axis=0) - self.counts     # first rows in the parts' concatenation
        self.firsts = running - (np.cumsum(self.rows_in, axis=0) - self.rows_in)[self.part_of]
        self.order = np.asarray(order, np.int64)
        self.sorted_keys = sorted_keys
        self._high = np.ascontiguousarray(sorted_keys[:, 0])
        self._tables: dict[int, tuple[pa.Table, pa.Table]] = {}

    @classmethod
    def open(cls, directory: Path | str | None, warn: bool = True) -> "SegmentMemo | None":
        """The memo whose manifest is ``directory`` (:func:`write_manifest`: its sorted key index
        memory-mapped, nothing sorted here), over the parts it lists that are there as it named them
        (:func:`part_problem`: the others are skipped, each logged at WARNING with its path and
        reason unless ``warn`` is False, and their clusters are cut again); ``None`` when there is
        no manifest. Its files are not hashed here (every shard opens it): the build checks them
        once before its shards open it (:func:`verify_memo`).

        Raises ``ValueError`` naming the file when the manifest is malformed."""
        if directory is None or not (Path(directory) / MANIFEST_FILE).is_file():
            return None
        directory = Path(directory)
        listed = listed_parts(directory)
        usable = np.array([_usable(directory, part, digest, warn) for part, digest, _ in listed], bool)
        load = lambda name: np.load(directory / name, mmap_mode="r")   # noqa: E731
        return cls([part for part, _, _ in listed], np.array([n for _, _, n in listed], np.int64), usable,
                   load(INDEX_KEYS_FILE), load(INDEX_ROWS_FILE), load(COUNTS_FILE))

    def __len__(self) -> int:
        return int(self.part_of.size)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """``(m,)`` int64 memo row of each of ``keys`` (``(m, 2)`` uint64 cluster keys), ``-1``
        where no part holds it; a key two parts hold gives either (their rows are equal)."""
        found = join_keys(self.sorted_keys, keys, self._high)
        if not len(self):
            return found
        rows = np.where(found >= 0, self.order[np.maximum(found, 0)], -1)
        return np.where((rows >= 0) & self.usable[self.part_of[np.maximum(rows, 0)]], rows, -1)

    def take(self, rows: np.ndarray) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """The rows of memo rows ``rows`` (``(m,)`` int, all >= 0), one cluster after the other,
        and their ``(m, 2)`` int64 unit and passage counts. Rows that follow one another in a part's
        file are sliced, not gathered (:func:`funnelrag.content_store.take_rows`).

        Raises ``ValueError`` naming the part when its counts and its rows differ in number."""
        rows = np.asarray(rows, np.int64)
        counts = self.counts[rows]
        if not rows.size:
            return C.DOCUMENT_UNITS.schema.empty_table(), C.PASSAGES.schema.empty_table(), counts
        needed = np.unique(self.part_of[rows])
        tables = [self._part_tables(int(p)) for p in needed.tolist()]
        out = []
        for field in (0, 1):
            base = np.zeros(len(self.parts), np.int64)   # where each needed part starts in their concatenation
            base[needed] = np.concatenate([[0], np.cumsum(self.rows_in[needed, field])[:-1]])
            starts = base[self.part_of[rows]] + self.firsts[rows, field]
            _, at = ranges_take(starts, starts + counts[:, field], np.arange(int(self.rows_in[needed, field].sum())))
            out.append(take_rows(pa.concat_tables([t[field] for t in tables]), at))
        return out[0], out[1], counts

    def _part_tables(self, part: int) -> tuple[pa.Table, pa.Table]:
        """Part ``part``'s units and passages, memory-mapped once (:func:`read_rows`), checked
        against its counts."""
        if part not in self._tables:
            directory = self.parts[part]
            tables = (read_rows(directory / UNITS_FILE), read_rows(directory / PASSAGES_FILE))
            for k, (name, table) in enumerate(zip((UNITS_FILE, PASSAGES_FILE), tables)):
                if table.num_rows != int(self.rows_in[part, k]):
                    raise ValueError(f"{directory}: its clusters have {int(self.rows_in[part, k])} {FIELDS[k]} "
                                     f"but {name} holds {table.num_rows} rows")
            self._tables[part] = tables
        return self._tables[part]


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
    ``passages.parquet`` (zstd), and the next build's memo takes rows from the same file. A shard of 224,404 passages of the 200K-page
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


def write_manifest(directory: Path, parts: Sequence[Path]) -> int:
    """Replace the memo ``directory`` (:func:`memo_dir`) with a manifest of ``parts`` (this build's
    segment shard entries holding a :func:`write_part` part, in shard order; a repeated one listed
    once), each named by its directory under ``directory``'s parent with the sha256 of its
    ``digests.json`` and its number of clusters, and the parts' cluster keys sorted once
    (:data:`INDEX_KEYS_FILE`); atomic, with the entry's own digests
    (:func:`funnelrag.verify.record_digests`). No row is copied. Returns the parts listed.

    Raises ``ValueError`` naming the part when one is not an entry directly under the memo's parent
    or has no ``digests.json``, or its keys and counts differ in number."""
    directory = Path(directory)
    listed: dict[str, tuple[str, np.ndarray, np.ndarray]] = {}
    for part in map(Path, parts):
        if part.parent.resolve() != directory.parent.resolve() or not (part / DIGESTS_FILE).is_file():
            raise ValueError(f"{part}: not a cache entry (with its {DIGESTS_FILE}) beside the segmentation memo "
                             f"{directory}")
        if part.name not in listed:
            keys, counts = np.load(part / KEYS_FILE), np.load(part / COUNTS_FILE)
            if keys.shape[0] != counts.shape[0]:
                raise ValueError(f"{part}: {keys.shape[0]} cluster keys but {counts.shape[0]} counts")
            listed[part.name] = (sha256_file(part / DIGESTS_FILE), keys, counts)
    body = {"segment_memo_version": SEGMENT_MEMO_VERSION,
            "parts": [{"name": name, "digests_sha256": digest, "clusters": int(keys.shape[0])}
                      for name, (digest, keys, _) in listed.items()]}
    all_keys = np.concatenate([k for _, k, _ in listed.values()]).astype(np.uint64).reshape(-1, 2) if listed \
        else np.zeros((0, 2), np.uint64)
    counts = np.concatenate([c for _, _, c in listed.values()]).astype(np.int64).reshape(-1, 2) if listed \
        else np.zeros((0, 2), np.int64)
    order = key_order(all_keys)
    with atomic_directory(directory) as tmp:
        (tmp / MANIFEST_FILE).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        np.save(tmp / INDEX_KEYS_FILE, np.ascontiguousarray(all_keys[order]))
        np.save(tmp / INDEX_ROWS_FILE, np.asarray(order, np.int64))
        np.save(tmp / COUNTS_FILE, counts)
        record_digests(tmp)
    return len(listed)


def listed_parts(directory: Path) -> list[tuple[Path, str, int]]:
    """``[(part directory, sha256 of its digests.json, its clusters)]`` the memo ``directory``'s
    manifest names, in its order. Raises ``ValueError`` naming the file when the manifest is malformed."""
    path = Path(directory) / MANIFEST_FILE
    try:
        body = json.loads(path.read_text())
        return [(Path(directory).parent / str(p["name"]), str(p["digests_sha256"]), int(p["clusters"]))
                for p in body["parts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a segmentation memo manifest ({exc!r})") from exc


def part_problem(part: Path, digest: str) -> str | None:
    """Why the part ``part`` is not the one a manifest named with ``digest`` (the sha256 of its
    ``digests.json``), or ``None`` when it is: gone (retention, a discarded entry), without a part, or
    with another ``digests.json`` (the entry replaced or altered since)."""
    if not Path(part).is_dir():
        return "missing (pruned or discarded since the memo named it)"
    if not has_part(part) or not (Path(part) / DIGESTS_FILE).is_file():
        return f"no longer holds a part and its {DIGESTS_FILE}"
    if sha256_file(Path(part) / DIGESTS_FILE) != digest:
        return f"its {DIGESTS_FILE} differs from the one the memo named (the entry was replaced or altered)"
    return None


def _usable(directory: Path, part: Path, digest: str, warn: bool) -> bool:
    """Whether the memo ``directory``'s part ``part`` is there as named (:func:`part_problem`);
    if not and ``warn``, logged at WARNING with its path and reason."""
    problem = part_problem(part, digest)
    if problem is not None and warn:
        log.warning("segmentation memo %s: part %s skipped: %s; its clusters are cut again", directory, part, problem)
    return problem is None


def usable_parts(directory: Path, warn: bool = True) -> list[Path]:
    """The parts the memo ``directory`` lists that are there as it named them (:func:`part_problem`),
    in its order; each other one is skipped and, with ``warn``, logged at WARNING with its path and
    reason (its clusters are then cut again)."""
    return [part for part, digest, _ in listed_parts(directory) if _usable(Path(directory), part, digest, warn)]


def verify_memo(directory: Path | None) -> list[Path]:
    """Check the memo ``directory`` once a build, before its shards open it: its manifest entry and
    each part it lists (:func:`funnelrag.verify.verified_entry`, which discards an entry of other
    bytes, logging why: its clusters are cut again, and the shard that makes them writes a fresh
    entry). A part gone or other than the one named is skipped and logged once here
    (:func:`usable_parts`), so the shards open the memo quietly (``SegmentMemo.open(..., warn=False)``).
    Returns the parts that may be read (none without a memo)."""
    if not verified_entry(directory):
        return []
    return [part for part in usable_parts(Path(directory)) if verified_entry(part)]
