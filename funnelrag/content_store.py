"""The content store: what a step computed from one piece of content (a page's wikitext, a
document's text, a cluster's members), kept under the 128-bit BLAKE2b of that content and reused
by the next build, whatever shard, piece or id the content has tonight.

One kind of entry serves every per-page, per-document and per-cluster memo of the corpus build
(the page memo, the window-token memo, the BM25 token memos, the segmentation memo):

- **Key.** The entry's directory is named by the step (a prefix), its code version and the digest
  of the **whole** config section the step reads (:func:`settings_dir`: no hand-picked field list,
  so a field added to the section changes the key instead of leaving the entry silently stale);
  inside it, each value is keyed by its content (:func:`text_keys`).
- **Value.** Per field, each key's values are a range of one flat array (``<field>.data.npy``):
  numbers (token ids, window token counts) or row numbers of Arrow files written beside the
  arrays (the segmentation memo's units and passages, the page memo's pages).
- **Lookup.** A join of the asked keys, sorted, with the entry's sorted keys
  (:meth:`ContentMemo.lookup`; :meth:`ContentMemo.find` for one key).
- **Write.** A build writes the entry whole with exactly the keys it used (:meth:`ContentMemo.write`,
  atomic: a reader sees the last entry or the new one), the digest manifest last
  (:func:`funnelrag.verify.record_digests`); before a build reads an entry it checks it once
  (:func:`funnelrag.verify.verified_entry`): an entry of other bytes, truncated or missing a
  file is discarded, its path logged, and rebuilt. An entry no build used for a while is swept
  by retention (:func:`funnelrag.store.prune_cache`).

Layout of an entry:

``keys.npy``
    ``(n, 2)`` uint64, the BLAKE2b-128 of each content as (high, low) words, sorted
    lexicographically, distinct.
``<field>.bounds.npy`` / ``<field>.data.npy``
    per field, ``(n, 2)`` int64 (start, end) of each key's values in ``data``: the values of key
    ``i`` are ``data[start:end]`` (the data stay in the order they were given; only the bounds
    are sorted with the keys).
``COMPLETE``
    the number of keys, written before the manifest.

(git's object store and Bazel's action cache: content-addressed, verified on read.)
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from data_contracts.base import atomic_directory
from funnelrag.config import config_hash
from funnelrag.verify import record_digests

KEYS_FILE = "keys.npy"
COMPLETE_FILE = "COMPLETE"


def settings_dir(root: Path, prefix: str, version: str, section: Any, *extra: object) -> Path:
    """``root/<prefix>-<16 hex>``: the entry of a step (``prefix``: its name) whose values depend
    on a config section.

    The key is :func:`funnelrag.config.config_hash` over ``version``, the **whole** ``section``
    (a dataclass or pydantic model: every field, not a hand-picked list, so a field added to the
    section later changes the key instead of leaving the entry silently stale) and ``extra`` (e.g.
    the dump's namespaces). A build with other settings never reads another's entry.
    """
    return Path(root) / f"{prefix}-{config_hash({'version': version, 'section': section, 'extra': list(extra)})[:16]}"


def text_key(text: str) -> tuple[int, int]:
    """The BLAKE2b-128 digest of one text's UTF-8 bytes as (high, low) words (a row of :func:`text_keys`)."""
    d = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big")


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """``(n, 2)`` uint64: the BLAKE2b-128 digest of each text's UTF-8 bytes as (high, low) words
    (big-endian, so the lexicographic order of the pairs is that of the digests)."""
    raw = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts)
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(texts), 2)


def first_of_each_key(keys: np.ndarray) -> np.ndarray:
    """``(m,)`` int64: the row of the first occurrence of each distinct key of ``keys`` (``(n, 2)``
    uint64 (high, low) words, :func:`text_keys`), in key order: what an entry keeps of a repeated
    key (equal contents have equal values)."""
    keys = np.asarray(keys, np.uint64).reshape(-1, 2)
    order = np.lexsort((keys[:, 1], keys[:, 0]))   # stable: of equal keys, the first row comes first
    ordered = keys[order]
    first = np.ones(order.size, bool)
    if order.size > 1:
        first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    return order[first].astype(np.int64)


class ContentMemo:
    """A content-store entry opened for lookups (arrays memory-mapped).

    Use :meth:`open` (``None`` when there is no complete entry) and :meth:`write`.
    ``fields[name]`` is ``(bounds (n, 2) int64, data (total,))``.
    """

    def __init__(self, directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, np.ndarray]]):
        self.directory, self.keys, self.fields = Path(directory), keys, dict(fields)
        self._high: np.ndarray | None = None

    @classmethod
    def open(cls, directory: Path | str | None, fields: Sequence[str]) -> "ContentMemo | None":
        """The entry in ``directory`` with ``fields``, or ``None`` when ``directory`` is ``None``,
        absent, incomplete (no ``COMPLETE`` marker) or lacks a field. Its files are not checked
        here (an entry is opened by every shard): the build checks them once before its shards
        open it (:func:`funnelrag.verify.verified_entry`)."""
        if directory is None:
            return None
        directory = Path(directory)
        if not (directory / COMPLETE_FILE).exists():
            return None
        try:
            keys = np.load(directory / KEYS_FILE, mmap_mode="r")
            found = {f: (np.load(directory / f"{f}.bounds.npy", mmap_mode="r"),
                         np.load(directory / f"{f}.data.npy", mmap_mode="r")) for f in fields}
        except FileNotFoundError:
            return None
        return cls(directory, keys, found)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """``(m,)`` int64 row of each of ``keys`` (``(m, 2)`` uint64, :func:`text_keys`), -1 where
        the entry does not hold it: a join of the asked keys, in key order, with the entry's."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        rows = np.full(keys.shape[0], -1, np.int64)
        if not len(self) or not keys.shape[0]:
            return rows
        high, low = self._high_words(), np.asarray(self.keys[:, 1])
        # Binary searches in key order walk the entry front to back (numpy narrows each search from
        # the last one): a lookup of 1M keys 0.63 -> 0.16 CPU s, the argsort included.
        order = np.argsort(keys[:, 0], kind="stable")
        needles = keys[order, 0]
        left, right = np.empty(order.size, np.int64), np.empty(order.size, np.int64)
        left[order] = np.searchsorted(high, needles, side="left")
        right[order] = np.searchsorted(high, needles, side="right")
        one = np.flatnonzero(right == left + 1)
        match = low[left[one]] == keys[one, 1]
        rows[one[match]] = left[one[match]]
        for i in np.flatnonzero(right > left + 1).tolist():   # a 64-bit high word shared by two keys: ~never
            rows[i] = self._among(int(left[i]), int(right[i]), keys[i, 1])
        return rows

    def find(self, key: tuple[int, int]) -> int:
        """The row of one key (``(high, low)``), -1 when the entry does not hold it: :meth:`lookup`
        without its per-call set-up (a caller asking key by key, e.g. pass 1 page by page)."""
        high = self._high_words()
        a = int(np.searchsorted(high, np.uint64(key[0]), side="left"))
        b = int(np.searchsorted(high, np.uint64(key[0]), side="right"))
        return self._among(a, b, np.uint64(key[1])) if b > a else -1

    def _among(self, a: int, b: int, low: np.uint64) -> int:
        """The row in ``[a, b)`` (keys of one high word) whose low word is ``low``, else -1."""
        for j in range(a, b):
            if self.keys[j, 1] == low:
                return j
        return -1

    def _high_words(self) -> np.ndarray:
        """The keys' high words as one contiguous array (made once: a search of a strided view
        would copy it every time)."""
        if self._high is None:
            self._high = np.ascontiguousarray(self.keys[:, 0])
        return self._high

    def value_ranges(self, field: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``, each ``(len(rows),)`` int64: where the values of rows ``rows`` (all
        >= 0) lie in ``self.fields[field][1]`` (read them without copying them together, unlike
        :meth:`take`). Raises ``KeyError`` for a field the entry was not opened with."""
        picked = np.asarray(self.fields[field][0][np.asarray(rows, np.int64)], np.int64).reshape(-1, 2)
        return picked[:, 0], picked[:, 1]

    def take(self, field: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``field``'s values of rows ``rows`` (all >= 0): ``(lengths (len(rows),) int64, values one
        after the other)``. Raises ``KeyError`` for a field the entry was not opened with."""
        starts, ends = self.value_ranges(field, rows)
        return ranges_take(starts, ends, self.fields[field][1])

    @staticmethod
    def write(directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, np.ndarray]],
              extra: Mapping[str, Callable[[Path], None]] | None = None) -> int:
        """Replace the entry in ``directory`` atomically with ``keys`` (``(n, 2)`` uint64) and, per
        field, a CSR ``(offsets (n + 1,), data)`` aligned with ``keys``. Rows are sorted by key
        and a repeated key kept once (equal contents have equal values); ``extra`` maps a file
        name to a writer ``(path) -> None`` of a file that goes into the same directory (a
        vocabulary, the Arrow files whose row numbers a field holds). The digest manifest is
        written last. Returns the rows written.

        Raises ``ValueError`` when a field's offsets do not have ``n + 1`` entries."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        n = keys.shape[0]
        for name, (offsets, _) in fields.items():
            if len(offsets) != n + 1:
                raise ValueError(f"memo {directory}: field {name!r} has {len(offsets)} offsets for {n} keys")
        rows = first_of_each_key(keys)
        with atomic_directory(Path(directory)) as tmp:
            np.save(tmp / KEYS_FILE, np.ascontiguousarray(keys[rows]))
            for name, (offsets, data) in fields.items():
                offsets = np.asarray(offsets, np.int64)
                np.save(tmp / f"{name}.bounds.npy", np.stack([offsets[:-1][rows], offsets[1:][rows]], axis=1))
                np.save(tmp / f"{name}.data.npy", np.asarray(data))
            for name, write in (extra or {}).items():
                write(tmp / name)
            (tmp / COMPLETE_FILE).write_text(f"{rows.size}\n")
            record_digests(tmp)
        return int(rows.size)


def ranges_take(starts: np.ndarray, ends: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``data[starts[k]:ends[k]]`` for every ``k``, one after the other: ``(lengths, values)``.

    Ranges that follow one another in ``data`` (``starts[k + 1] == ends[k]``: the unchanged texts
    of a memo, which keeps its values in the last build's order) are copied as one slice each;
    only when the ranges are scattered (fewer than 64 values a run) does it gather value by
    value. Same result either way."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return lengths, np.zeros(0, dtype=data.dtype)
    run_starts, run_ends = contiguous_runs(starts[lengths > 0], ends[lengths > 0])
    if run_starts.size * 64 <= total:
        return lengths, np.concatenate([data[a:b] for a, b in zip(run_starts.tolist(), run_ends.tolist())])
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return lengths, np.asarray(data[first + np.arange(total, dtype=np.int64)])


def contiguous_runs(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive ranges ``[starts[k], ends[k])`` merged where one ends where the next starts:
    ``(run starts, run ends)``, each ``(n_runs,)`` int64, covering the same values in the same order."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not starts.size:
        return starts, ends
    cut = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    return starts[np.r_[0, cut]], ends[np.r_[cut - 1, starts.size - 1]]
