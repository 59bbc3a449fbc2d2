"""Passage vectors kept by content: every vector an encoder computed, under the digest of exactly
the text it encoded, so that any later corpus version reuses it whatever the passage's id.

Key of a store: the encoder's model version (:func:`tasks.funnel.embeddings.model_version`:
document-tower weights, ``max_length``, ``normalize``; a reduced-precision copy has weights, so a
version, of its own). Key of a row: the content store's text key
(:func:`funnelrag.content_store.text_keys`: BLAKE2b-128 of the UTF-8 bytes of the text the encoder
saw, ``"{title}. {text}"`` before tokenisation, as ``(n, 2)`` uint64 words), sorted and joined
as the memos' keys are (:func:`funnelrag.content_store.join_keys`). A passage whose text is
unchanged from any earlier version, or shared with another passage, is embedded once.

Layout (``home/cache/embed-vectors/<store key[:32]>/``): one *segment* per batch of vectors
written, a directory ``seg-<uuid>-<pid>/`` holding ``keys.npy`` (uint8 ``(n, 16)``: each key's
digest bytes, :func:`funnelrag.content_store.key_digests`),
``vectors.npy`` (float32 ``(n, dim)``, L2-normalised rows) and the digest manifest of every
cache entry (:func:`funnelrag.verify.record_digests`), built under a temp name
(:func:`data_contracts.base.temp_name`) and renamed into place whole
(:func:`data_contracts.base.atomic_directory`). Segments are written as the vectors arrive, so a
killed run keeps what it embedded; worker processes write their own segments side by side
(unique names) and the index step reads them all.

Every read checks each segment as the corpus cache checks its entries
(:func:`funnelrag.verify.verified_entry`: nothing read is trusted blindly); a segment whose bytes
differ, is truncated or lacks a file is moved aside and deleted, its path logged at WARNING and
counted in :attr:`VectorStore.discarded`, and its texts are embedded again.

Pruning (:meth:`VectorStore.compact`): vectors of texts that no retained corpus version holds
any more, and duplicates, are dropped by rewriting the store's segments as new ones (each
written atomically) before the old ones are removed, so an interrupted compaction leaves every
live vector in place (at worst twice, until the next compaction).

"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data_contracts.base import atomic_directory, temp_name
from funnelrag.content_store import digest_words, join_keys, key_digests, key_order
from funnelrag.locks import LockHeld, exclusive_lock
from funnelrag.reaper import sweep_stale_temp_dirs
from funnelrag.verify import discard_entry, record_digests, verified_entry

log = logging.getLogger(__name__)

DIGEST_BYTES = 16
"""A key's bytes in a segment's ``keys.npy``."""
MAX_SEGMENTS = 64
MAX_DEAD_SHARE = 0.2
"""Compact when more than this share of the stored rows is dead (duplicate, or a text no retained
corpus version holds): the memos' rule of rewriting once a fifth would be stale."""
SEGMENT_ROWS = 1 << 18
"""Rows a compacted segment holds at most (384-d float32: ~400 MB)."""
STORE_FORMAT = "1"
KEYS_FILE, VECTORS_FILE = "keys.npy", "vectors.npy"
COMPACT_LOCK = ".compact.lock"


def vector_store_root(cache_dir: Path, model_version: str) -> Path:
    """``<cache>/embed-vectors/<key[:32]>``, key = sha256 of (store format, model version): the
    directory of one encoder's vectors (``precision=fp32`` in the hashed text is the name it has
    had since the first format; a reduced-precision copy has a model version of its own,
    :func:`tasks.funnel.embeddings.with_precision`)."""
    key = hashlib.sha256(f"format={STORE_FORMAT}\0model={model_version}\0precision=fp32".encode()).hexdigest()
    return Path(cache_dir) / "embed-vectors" / key[:32]


@dataclass
class Lookup:
    """What a store holds of some keys: ``found`` bool ``(n,)``, ``vectors`` float32 ``(n, dim)``
    (zero where not found)."""

    found: np.ndarray
    vectors: np.ndarray


@dataclass
class Compaction:
    """What :meth:`VectorStore.compact` found and did.

    rows : rows stored before (every verified segment, duplicates included).
    dead : of them, duplicates and rows whose text is not live.
    kept : rows written to the new segments (``rows - dead`` when it rewrote).
    segments_before, segments_after : verified segments before and after.
    legacy_files : files of the flat layout of older code removed (never read: their texts are
        embedded again).
    rewritten : whether the segments were rewritten; ``reason`` says why or why not.
    seconds : wall seconds of the compaction (with :func:`tasks.funnel.embeddings.prune_vector_store`:
        the live keys' reading and hashing too).
    """

    rows: int = 0
    dead: int = 0
    kept: int = 0
    rewritten: bool = False
    reason: str = ""
    segments_before: int = 0
    segments_after: int = 0
    legacy_files: int = 0
    seconds: float = 0.0
    removed: list[str] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "removed"}


def _is_legacy_file(path: Path) -> bool:
    """A file of the flat segment layout of older code (``<segment>.json``, ``.keys.npy``,
    ``.vectors.npy`` at the store's root): never read, removed by a compaction."""
    return path.is_file() and path.name.startswith("seg-") and path.name.endswith((".json", ".npy"))


class VectorStore:
    """The content-keyed vectors of one encoder (see the module docstring).

    Parameters
    ----------
    root : the store's directory (:func:`vector_store_root`); created on first write.
    dim : the vectors' width (segments of another width are discarded as damaged).
    """

    def __init__(self, root: Path, dim: int):
        self.root, self.dim = Path(root), int(dim)
        self.discarded: list[str] = []
        self._keys = np.zeros((0, 2), np.uint64)
        self._vectors = np.zeros((0, self.dim), np.float32)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._seen: set[str] = set()
        self._loaded = False

    # ------------------------------------------------------------------ reading
    def segments(self) -> list[Path]:
        """The segments' directories, sorted by name (work in progress, named ``.tmp-…``, is not one)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _read_segment(self, segment: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """A segment's ``(keys, vectors)`` once its digest manifest checks
        (:func:`funnelrag.verify.verified_entry`); None when it does not (the segment moved aside
        and deleted, its path logged at WARNING, counted in :attr:`discarded`) or another process
        removed it meanwhile (a compaction)."""
        if not segment.is_dir():
            return None
        if verified_entry(segment):
            try:
                keys, vectors = np.load(segment / KEYS_FILE), np.load(segment / VECTORS_FILE)
            except FileNotFoundError:                         # compacted away by another process meanwhile
                return None
            except (OSError, ValueError) as exc:              # recorded so, but not arrays: a writer's bug
                discard_entry(segment, f"unreadable arrays ({exc!r})")
            else:
                if keys.ndim == 2 and keys.shape[1] == DIGEST_BYTES and vectors.shape == (keys.shape[0], self.dim):
                    return digest_words(keys), vectors.astype(np.float32, copy=False)
                discard_entry(segment, f"keys {keys.shape} and vectors {vectors.shape}, "
                                       f"not (n, {DIGEST_BYTES}) and (n, {self.dim})")
        self.discarded.append(str(segment))
        return None

    def load(self) -> None:
        """Read and verify every segment (again: segments written since are seen)."""
        self._keys = np.zeros((0, 2), np.uint64)
        self._vectors = np.zeros((0, self.dim), np.float32)
        self._pending, self._seen = [], set()
        self._loaded = True
        self.refresh()

    def refresh(self) -> None:
        """Read (and verify) the segments written since the last read, by this or another
        process (a worker, a second index over the same store)."""
        for segment in self.segments():
            if segment.name not in self._seen:
                self._seen.add(segment.name)
                got = self._read_segment(segment)
                if got is not None:
                    self._pending.append(got)
        self._join_pending()

    def _join_pending(self) -> None:
        """Merge the segments read or written since the last lookup into the sorted join arrays."""
        if not self._pending:
            return
        self._keys = np.concatenate([self._keys, *(k for k, _ in self._pending)])
        self._vectors = np.concatenate([self._vectors, *(v for _, v in self._pending)])
        self._pending = []
        order = key_order(self._keys)
        self._keys, self._vectors = self._keys[order], self._vectors[order]

    def __len__(self) -> int:
        if not self._loaded:
            self.load()
        self.refresh()
        return int(self._keys.shape[0])

    def lookup(self, keys: np.ndarray) -> Lookup:
        """The stored vectors of ``keys`` (``(n, 2)`` uint64, :func:`funnelrag.content_store.text_keys`):
        a join on the sorted keys."""
        if not self._loaded:
            self.load()
        self.refresh()
        at = join_keys(self._keys, keys)
        found = at >= 0
        vectors = np.zeros((found.size, self.dim), np.float32)
        vectors[found] = self._vectors[at[found]]
        return Lookup(found, vectors)

    # ------------------------------------------------------------------ writing
    def add(self, keys: np.ndarray, vectors: np.ndarray) -> Path | None:
        """Write ``(keys, vectors)`` as one new segment (a directory renamed into place whole,
        its digest manifest recorded); returns its directory (None for no rows).

        Raises
        ------
        ValueError
            Shapes disagree, or a vector is not finite.
        """
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if keys.shape != (vectors.shape[0], 2) or vectors.shape[1:] != (self.dim,):
            raise ValueError(f"vector store: keys {keys.shape} and vectors {vectors.shape} (dim {self.dim})")
        if not np.isfinite(vectors).all():
            raise ValueError("vector store: refusing non-finite vectors")
        if not keys.shape[0]:
            return None
        keys = np.asarray(keys, np.uint64)
        segment = self.root / f"seg-{uuid.uuid4().hex}-{os.getpid()}"
        with atomic_directory(segment) as tmp:
            np.save(tmp / KEYS_FILE, key_digests(keys))
            np.save(tmp / VECTORS_FILE, vectors)
            record_digests(tmp)
        if self._loaded:                                      # joined at the next lookup
            self._seen.add(segment.name)
            self._pending.append((keys.copy(), vectors))
        return segment

    def compact(self, live: np.ndarray | None = None, max_segments: int = MAX_SEGMENTS,
                max_dead_share: float = MAX_DEAD_SHARE, segment_rows: int = SEGMENT_ROWS) -> Compaction:
        """Prune and merge: rewrite the store's segments without their dead rows (duplicates, and
        with ``live`` the rows whose key it lacks) when more than ``max_dead_share`` of the rows
        are dead, when there are more than ``max_segments`` segments, or when files of the older
        flat layout are left.

        The kept rows (sorted by key: the same rows give the same bytes) are written as new
        segments of at most ``segment_rows`` rows, each renamed into place whole, before any old
        segment is removed (each moved aside under a temp name, then deleted), so a compaction
        killed at any point loses no live vector; the next one removes what it left twice, and
        :func:`funnelrag.reaper.sweep_stale_temp_dirs` what it left half-written. Segments other
        processes write meanwhile are not touched. One compaction at a time: while another holds
        the store's lock this one does nothing.

        Parameters
        ----------
        live : ``(m, 2)`` uint64, optional
            The text keys still in use (:func:`funnelrag.content_store.text_keys` of every passage of every retained
            corpus version); None: only duplicates are dead.
        max_segments, max_dead_share, segment_rows : the rewrite rule and the new segments' size.

        Returns
        -------
        Compaction
        """
        t0 = time.perf_counter()
        report = Compaction()
        if not self.root.is_dir():
            report.reason = "empty store"
            return report
        try:
            with exclusive_lock(self.root / COMPACT_LOCK, f"compaction of the vector store {self.root}"):
                self._compact(report, live, max_segments, max_dead_share, segment_rows)
        except LockHeld as exc:
            report.reason = str(exc)
        report.seconds = time.perf_counter() - t0
        return report

    def _compact(self, report: Compaction, live: np.ndarray | None, max_segments: int, max_dead_share: float,
                 segment_rows: int) -> None:
        """:meth:`compact`'s work, under the store's lock."""
        sweep_stale_temp_dirs(self.root)
        old = self.segments()
        self.load()                                           # verifies every segment, drops damaged ones
        old = [s for s in old if s.name in self._seen and str(s) not in self.discarded]
        legacy = [p for p in self.root.iterdir() if _is_legacy_file(p)]
        keys, vectors = self._keys, self._vectors
        keep = np.ones(keys.shape[0], bool)
        keep[1:] = np.any(keys[1:] != keys[:-1], axis=1)      # sorted: the first of equal keys (duplicates hold equal vectors)
        if live is not None:
            live = np.asarray(live, np.uint64).reshape(-1, 2)
            keep &= join_keys(live[key_order(live)], keys) >= 0
        report.rows, report.kept = int(keys.shape[0]), int(keep.sum())
        report.dead, report.segments_before, report.legacy_files = report.rows - report.kept, len(old), len(legacy)
        report.segments_after = len(old)
        dead_share = report.dead / max(report.rows, 1)
        if dead_share <= max_dead_share and len(old) <= max_segments and not legacy:
            report.reason = (f"{report.dead:,} of {report.rows:,} rows dead ({dead_share:.1%} <= {max_dead_share:.0%}), "
                             f"{len(old)} segments (<= {max_segments})")
            return
        report.reason = (f"{report.dead:,} of {report.rows:,} rows dead ({dead_share:.1%}), {len(old)} segments, "
                         f"{len(legacy)} files of the older layout")
        rows = np.flatnonzero(keep)
        for start in range(0, rows.size, segment_rows):      # the new segments first: nothing live is ever missing
            part = rows[start:start + segment_rows]
            self.add(keys[part], vectors[part])
        for segment in old:
            trash = self.root / temp_name(f"compacted.{segment.name}")
            try:
                os.replace(segment, trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
            report.removed.append(segment.name)
        for path in legacy:
            path.unlink(missing_ok=True)
        report.rewritten = True
        self.load()
        report.segments_after = len(self._seen)
        log.info("vector store %s compacted: %s; %d rows in %d segments now", self.root, report.reason,
                 report.kept, report.segments_after)
