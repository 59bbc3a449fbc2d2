"""Passage vectors kept by content: every vector an encoder computed, under the digest of exactly
the text it encoded, so that any later corpus version reuses it whatever the passage's id.

Key of a store: the encoder's model version (:func:`tasks.funnel.embeddings.model_version`:
document-tower weights, ``max_length``, ``normalize``) and the encoder settings that change its
output (``precision``). Key of a row: BLAKE2b-128 of the UTF-8 bytes of the text the encoder
saw (``"{title}. {text}"``, before tokenisation). A passage whose text is unchanged from any
earlier version, or shared with another passage, is embedded once.

Layout (``home/cache/embed-vectors/<store key[:32]>/``): one *segment* per batch of vectors
written, three files named ``<segment>.keys.npy`` (uint8 ``(n, 16)``), ``<segment>.vectors.npy``
(float32 ``(n, dim)``, L2-normalised rows) and ``<segment>.json`` (rows, dim and the sha256 of
both files), the JSON written last and atomically: a segment without one was never finished
and is ignored. Segments are written as the vectors arrive, so a killed run keeps what it
embedded; worker processes write their own segments side by side (unique names) and the
index step reads them all.

Every read verifies each segment's recorded digests (git-style: nothing read is trusted
blindly); a segment whose bytes differ, is truncated or lacks a file is discarded (its path
logged, counted in :attr:`VectorStore.discarded`) and its rows are embedded again. When more
than :data:`MAX_SEGMENTS` segments exist, :meth:`VectorStore.compact` rewrites them as one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from data_contracts.base import atomic_write, sha256_file

log = logging.getLogger(__name__)

KEY_BYTES = 16
MAX_SEGMENTS = 64
STORE_FORMAT = "1"


def text_key(text: str) -> bytes:
    """BLAKE2b-128 of ``text``'s UTF-8 bytes: a row's key (16 bytes)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=KEY_BYTES).digest()


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """:func:`text_key` of every text as uint8 ``(len(texts), 16)``."""
    raw = b"".join(text_key(t) for t in texts)
    return np.frombuffer(raw, np.uint8).reshape(len(texts), KEY_BYTES).copy()


def store_key(model_version: str, precision: str = "fp32") -> str:
    """sha256 of (store format, model version, precision): the directory of one encoder's vectors."""
    return hashlib.sha256(f"format={STORE_FORMAT}\0model={model_version}\0precision={precision}".encode()).hexdigest()


def vector_store_root(cache_dir: Path, model_version: str, precision: str = "fp32") -> Path:
    """``<cache>/embed-vectors/<store key[:32]>``."""
    return Path(cache_dir) / "embed-vectors" / store_key(model_version, precision)[:32]


@dataclass
class Lookup:
    """What a store holds of some keys: ``found`` bool ``(n,)``, ``vectors`` float32 ``(n, dim)``
    (zero where not found)."""

    found: np.ndarray
    vectors: np.ndarray


def _hi(keys: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each ``(n, 16)`` key as uint64 ``(n,)`` (the sort key of the join)."""
    return np.ascontiguousarray(keys[:, :8]).view("<u8").reshape(-1)


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
        self._keys = np.zeros((0, KEY_BYTES), np.uint8)
        self._vectors = np.zeros((0, self.dim), np.float32)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._seen: set[str] = set()
        self._loaded = False

    # ------------------------------------------------------------------ reading
    def segments(self) -> list[Path]:
        """The finished segments' JSON files, sorted by name."""
        return sorted(self.root.glob("*.json")) if self.root.is_dir() else []

    def _read_segment(self, meta_path: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """A segment's ``(keys, vectors)`` after checking its digests; None (and the segment
        removed, its path logged) when anything differs from what was recorded."""
        stem = meta_path.name[:-len(".json")]
        keys_path, vec_path = meta_path.with_name(f"{stem}.keys.npy"), meta_path.with_name(f"{stem}.vectors.npy")
        try:
            meta = json.loads(meta_path.read_text())
            reason = None
            if meta.get("dim") != self.dim:
                reason = f"dim {meta.get('dim')} != {self.dim}"
            elif sha256_file(keys_path) != meta["keys_sha256"] or sha256_file(vec_path) != meta["vectors_sha256"]:
                reason = "bytes differ from the recorded sha256"
            else:
                keys, vectors = np.load(keys_path), np.load(vec_path)
                if keys.shape != (meta["rows"], KEY_BYTES) or vectors.shape != (meta["rows"], self.dim):
                    reason = f"shapes {keys.shape} {vectors.shape} for {meta['rows']} rows"
                else:
                    return keys, vectors.astype(np.float32, copy=False)
        except (OSError, ValueError, KeyError) as exc:       # missing file, bad JSON, truncated npy
            reason = f"{type(exc).__name__}: {exc}"
        log.warning("vector store: discarding segment %s (%s); its passages are embedded again", meta_path, reason)
        self.discarded.append(str(meta_path))
        for p in (meta_path, keys_path, vec_path):
            p.unlink(missing_ok=True)
        return None

    def load(self) -> None:
        """Read and verify every finished segment (again: segments written since are seen)."""
        self._keys = np.zeros((0, KEY_BYTES), np.uint8)
        self._vectors = np.zeros((0, self.dim), np.float32)
        self._pending, self._seen = [], set()
        self._loaded = True
        self.refresh()

    def refresh(self) -> None:
        """Read (and verify) the segments written since the last read, by this or another
        process (a worker, a second index over the same store)."""
        for meta_path in self.segments():
            if meta_path.name not in self._seen:
                self._seen.add(meta_path.name)
                got = self._read_segment(meta_path)
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
        order = np.argsort(_hi(self._keys), kind="stable")
        self._keys, self._vectors = self._keys[order], self._vectors[order]

    def __len__(self) -> int:
        if not self._loaded:
            self.load()
        self.refresh()
        return int(self._keys.shape[0])

    def lookup(self, keys: np.ndarray) -> Lookup:
        """The stored vectors of ``keys`` (uint8 ``(n, 16)``): a join on the sorted keys."""
        if not self._loaded:
            self.load()
        self.refresh()
        n = keys.shape[0]
        found, vectors = np.zeros(n, bool), np.zeros((n, self.dim), np.float32)
        if not n or not self._keys.shape[0]:
            return Lookup(found, vectors)
        have = _hi(self._keys)
        at = np.minimum(np.searchsorted(have, _hi(keys)), have.size - 1)
        found = np.all(self._keys[at] == keys, axis=1)       # full 16 bytes (a rare 64-bit clash: a miss)
        vectors[found] = self._vectors[at[found]]
        return Lookup(found, vectors)

    # ------------------------------------------------------------------ writing
    def add(self, keys: np.ndarray, vectors: np.ndarray) -> Path | None:
        """Write ``(keys, vectors)`` as one new segment (atomic; its JSON last); returns its JSON path.

        Raises
        ------
        ValueError
            Shapes disagree, or a vector is not finite.
        """
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if keys.shape != (vectors.shape[0], KEY_BYTES) or vectors.shape[1:] != (self.dim,):
            raise ValueError(f"vector store: keys {keys.shape} and vectors {vectors.shape} (dim {self.dim})")
        if not np.isfinite(vectors).all():
            raise ValueError("vector store: refusing non-finite vectors")
        if not keys.shape[0]:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        stem = f"seg-{uuid.uuid4().hex}-{os.getpid()}"
        keys_path, vec_path = self.root / f"{stem}.keys.npy", self.root / f"{stem}.vectors.npy"
        atomic_write(keys_path, lambda p: np.save(open(p, "wb"), np.ascontiguousarray(keys, dtype=np.uint8)))
        atomic_write(vec_path, lambda p: np.save(open(p, "wb"), vectors))
        meta = {"rows": int(keys.shape[0]), "dim": self.dim, "keys_sha256": sha256_file(keys_path),
                "vectors_sha256": sha256_file(vec_path)}
        meta_path = self.root / f"{stem}.json"
        atomic_write(meta_path, lambda p: p.write_text(json.dumps(meta, sort_keys=True) + "\n"))
        if self._loaded:                                      # joined at the next lookup
            self._seen.add(meta_path.name)
            self._pending.append((np.array(keys, dtype=np.uint8), vectors))
        return meta_path

    def compact(self, max_segments: int = MAX_SEGMENTS) -> bool:
        """Rewrite every segment as one (duplicates dropped) when there are more than
        ``max_segments``; the new segment is finished before the old ones go. Returns whether it did."""
        old = self.segments()
        if len(old) <= max_segments:
            return False
        self.load()
        _, first = np.unique(self._keys, axis=0, return_index=True)
        first.sort()
        self.add(self._keys[first], self._vectors[first])
        for meta_path in old:
            stem = meta_path.name[:-len(".json")]
            meta_path.unlink(missing_ok=True)                # the JSON first: never a half segment
            for suffix in (".keys.npy", ".vectors.npy"):
                meta_path.with_name(stem + suffix).unlink(missing_ok=True)
        self.load()
        return True
