"""Per-document memo: what a corpus-build step computed from one document's text, kept under the
128-bit BLAKE2b of that text and reused by the next build, whatever shard the document falls in.

Why: a nightly adds-changes build edits ~1% of the pages a day, spread over every document
shard, so a cache keyed by a whole shard's texts is never hit; a memo keyed by each document's
own text is hit by every unchanged page. The memo of a step is one directory of flat arrays
(memory-mapped by the workers, nothing parsed):

``keys.npy``
    ``(n, 2)`` uint64, the BLAKE2b-128 of each text as (high, low) words, sorted lexicographically,
    distinct.
``<field>.bounds.npy`` / ``<field>.data.npy``
    per field, ``(n, 2)`` int64 (start, end) of each key's values in ``data``: the values of key
    ``i`` are ``data[start:end]`` (the data stay in the order they were given; only the bounds are
    sorted with the keys, so a write never moves the values).

A lookup is a binary search of the high words (:meth:`DocumentMemo.lookup`), checked on the low
words. The memo is rewritten by each build with exactly that build's documents
(:meth:`DocumentMemo.write`, atomic: a reader sees the old or the new directory), so it does not
grow from night to night. Part of the corpus build of FunnelRAG (the incremental nightly).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from data_contracts.base import atomic_directory

KEYS_FILE = "keys.npy"
COMPLETE_FILE = "COMPLETE"


def settings_dir(root: Path, prefix: str, settings: object) -> Path:
    """``root/<prefix>-<16 hex of the sha256 of settings as JSON>``: the directory of a memo
    whose values depend on ``settings`` (a build with other settings never reads it)."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
    return Path(root) / f"{prefix}-{digest[:16]}"


def text_key(text: str) -> tuple[int, int]:
    """The BLAKE2b-128 digest of one text's UTF-8 bytes as (high, low) words (a row of :func:`text_keys`)."""
    d = hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big")


def keys_digest(version: str, settings: object, ids: Sequence[str], keys: np.ndarray) -> str:
    """sha256 over ``version``, ``settings``, the ids (length-prefixed) and the texts' keys
    (:func:`text_keys`): a shard's cache key, from the keys its memo lookup computed anyway."""
    h = hashlib.sha256(json.dumps([version, settings, len(ids)], sort_keys=True, default=str).encode())
    for s in ids:
        h.update(len(s).to_bytes(8, "little"))
        h.update(s.encode("utf-8"))
    h.update(np.ascontiguousarray(keys, np.uint64).tobytes())
    return h.hexdigest()


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """``(n, 2)`` uint64: the BLAKE2b-128 digest of each text's UTF-8 bytes as (high, low) words
    (big-endian, so the lexicographic order of the pairs is that of the digests)."""
    raw = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts)
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(texts), 2)


class Utf8Rows:
    """The UTF-8 bytes of each value of an Arrow string column, read from its buffers (no Python
    string is made and no chunk is copied): ``rows[i]`` is a ``memoryview`` of value ``i``'s bytes
    (a null reads as ``b""``). Raises ``TypeError`` for a non-string column."""

    def __init__(self, texts: pa.Array | pa.ChunkedArray):
        chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
        starts, ends, which, self.data = [], [], [], []
        for k, chunk in enumerate(chunks):
            if not (pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type)):
                raise TypeError(f"a string array is needed, got {chunk.type}")
            _, offsets_buf, data_buf = chunk.buffers()
            self.data.append(memoryview(data_buf) if data_buf is not None else memoryview(b""))
            if not len(chunk):
                continue
            dtype = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(offsets_buf, dtype, len(chunk) + 1,
                                    chunk.offset * np.dtype(dtype).itemsize).astype(np.int64)
            end = offsets[1:].copy()
            if chunk.null_count:
                null = ~chunk.is_valid().to_numpy(zero_copy_only=False)
                end[null] = offsets[:-1][null]
            starts.append(offsets[:-1])
            ends.append(end)
            which.append(np.full(len(chunk), k, np.int64))
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
        self.starts, self.ends, self.chunk = cat(starts), cat(ends), cat(which)
        self._starts, self._ends, self._chunk = self.starts.tolist(), self.ends.tolist(), self.chunk.tolist()

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, row: int) -> memoryview:
        return self.data[self._chunk[row]][self._starts[row]:self._ends[row]]

    def __iter__(self):
        """Each value's bytes in order (a ``memoryview``), chunk by chunk."""
        data = self.data
        for k, a, b in zip(self._chunk, self._starts, self._ends):
            yield data[k][a:b]

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` int64 byte length of each value."""
        return self.ends - self.starts

    def hash_into(self, h: Any) -> None:
        """Feed the column's content to ``h`` (a :mod:`hashlib` object): every value's byte length
        (int64, little-endian), then all the values' bytes one after the other, the same however
        the column is chunked or sliced."""
        h.update(np.ascontiguousarray(self.lengths, "<i8").tobytes())
        for k, data in enumerate(self.data):
            at = np.flatnonzero(self.chunk == k)
            if not at.size:
                continue
            a, b = self.starts[at], self.ends[at]
            if np.array_equal(a[1:], b[:-1]):      # no null inside: one slice
                h.update(data[int(a[0]):int(b[-1])])
            else:
                for x, y in zip(a.tolist(), b.tolist()):
                    h.update(data[x:y])

    def count_blank(self) -> int:
        """How many values are empty or whitespace only, as Python's ``not text.strip()`` (Unicode
        whitespace): a value whose first byte is a visible ASCII character is not blank; only the
        others are decoded and checked."""
        lengths = self.lengths
        maybe = np.flatnonzero(lengths == 0)
        first = np.zeros(len(self), np.uint8)
        rows = np.flatnonzero(lengths > 0)
        for k, data in enumerate(self.data):
            at = rows[self.chunk[rows] == k]
            if at.size:
                first[at] = np.frombuffer(data, np.uint8)[self.starts[at]]
        unsure = rows[(first[rows] <= 0x20) | (first[rows] >= 0x7F)]
        return int(maybe.size) + sum(1 for r in unsure.tolist() if not str(self[r], "utf-8").strip())


def arrow_text_keys(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`text_keys` of an Arrow string (or large string) array, hashed from its UTF-8 buffer
    without making a Python string of each text (same keys; a null hashes as ``""``).

    Returns ``(len(texts), 2)`` uint64. Raises ``TypeError`` for a non-string array."""
    blake = hashlib.blake2b
    raw = b"".join(blake(value, digest_size=16).digest() for value in Utf8Rows(texts))
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(texts), 2)


def csr_take(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a CSR ``(offsets, data)``: ``(lengths (len(rows),) int64, their values
    one after the other)``, without a Python loop over rows."""
    rows = np.asarray(rows, np.int64)
    return ranges_take(np.asarray(offsets[rows], np.int64), np.asarray(offsets[rows + 1], np.int64), data)


def take_texts(texts: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> list[str]:
    """``texts[rows]`` as Python strings (``rows`` ``(m,)`` int, any order), gathered chunk by
    chunk: ``ChunkedArray.take`` first concatenates every chunk, a copy of all the texts to pick
    the few a memo lacks."""
    rows = np.asarray(rows, np.int64)
    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    if len(chunks) == 1:
        return chunks[0].take(pa.array(rows)).to_pylist() if rows.size else []
    starts = np.cumsum([0] + [len(c) for c in chunks])
    which = np.searchsorted(starts, rows, side="right") - 1
    out: list[str] = [""] * rows.size
    for k in np.unique(which).tolist():
        at = np.flatnonzero(which == k)
        for i, text in zip(at.tolist(), chunks[k].take(pa.array(rows[at] - starts[k])).to_pylist()):
            out[i] = text
    return out


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


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``, by slices where ``rows`` run consecutively (rows of a memo's table
    in the last build's order): a slice of a memory-mapped table copies nothing, and the
    caller's ``combine_chunks`` copies each run once instead of gathering row by row."""
    rows = np.asarray(rows, np.int64)
    if rows.size == 0:
        return table.slice(0, 0)
    run_starts, run_ends = contiguous_runs(rows, rows + 1)
    if run_starts.size * 16 > rows.size:
        return table.take(pa.array(rows))
    return pa.concat_tables([table.slice(a, b - a) for a, b in zip(run_starts.tolist(), run_ends.tolist())])


class DocumentMemo:
    """A memo directory opened for lookups (arrays memory-mapped).

    Use :meth:`open` (``None`` when there is no complete memo) and :meth:`write`.
    """

    def __init__(self, directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, np.ndarray]]):
        self.directory, self.keys, self.fields = Path(directory), keys, dict(fields)

    @classmethod
    def open(cls, directory: Path | str | None, fields: Sequence[str]) -> "DocumentMemo | None":
        """The memo in ``directory`` with ``fields``, or ``None`` when ``directory`` is ``None``,
        absent, incomplete (no ``COMPLETE`` marker) or lacks a field."""
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
        """``(m,)`` int64 memo row of each of ``keys`` (``(m, 2)`` uint64, :func:`text_keys`), -1
        where the memo does not hold it."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        rows = np.full(keys.shape[0], -1, np.int64)
        if not len(self) or not keys.shape[0]:
            return rows
        high, low = np.asarray(self.keys[:, 0]), np.asarray(self.keys[:, 1])
        left = np.searchsorted(high, keys[:, 0], side="left")
        right = np.searchsorted(high, keys[:, 0], side="right")
        one = np.flatnonzero(right == left + 1)
        match = low[left[one]] == keys[one, 1]
        rows[one[match]] = left[one[match]]
        for i in np.flatnonzero(right > left + 1).tolist():   # a 64-bit high word shared by two keys: ~never
            for j in range(int(left[i]), int(right[i])):
                if low[j] == keys[i, 1]:
                    rows[i] = j
                    break
        return rows

    def value_ranges(self, field: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``, each ``(len(rows),)`` int64: where the values of memo rows ``rows``
        (all >= 0) lie in ``self.fields[field][1]`` (read them without copying them together,
        unlike :meth:`take`). Raises ``KeyError`` for a field the memo was not opened with."""
        picked = np.asarray(self.fields[field][0][np.asarray(rows, np.int64)], np.int64).reshape(-1, 2)
        return picked[:, 0], picked[:, 1]

    def take(self, field: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``field``'s values of memo rows ``rows`` (all >= 0): ``(lengths, values one after the
        other)`` (:func:`csr_take`). Raises ``KeyError`` for a field the memo was not opened with."""
        starts, ends = self.value_ranges(field, rows)
        return ranges_take(starts, ends, self.fields[field][1])

    @staticmethod
    def write(directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, np.ndarray]],
              extra: Mapping[str, Callable[[Path], None]] | None = None) -> int:
        """Replace the memo in ``directory`` atomically with ``keys`` (``(n, 2)`` uint64) and, per
        field, a CSR ``(offsets (n + 1,), data)`` aligned with ``keys``. Rows are sorted by key
        and a repeated key kept once (equal texts have equal values); ``extra`` maps a file name
        to a writer ``(path) -> None`` of a file that goes into the same directory (e.g. a
        vocabulary). Returns the rows written.

        Raises ``ValueError`` when a field's offsets do not have ``n + 1`` entries."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        n = keys.shape[0]
        for name, (offsets, _) in fields.items():
            if len(offsets) != n + 1:
                raise ValueError(f"memo {directory}: field {name!r} has {len(offsets)} offsets for {n} keys")
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        ordered = keys[order]
        first = np.ones(n, bool)
        if n > 1:
            first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
        rows = order[first]
        with atomic_directory(Path(directory)) as tmp:
            np.save(tmp / KEYS_FILE, np.ascontiguousarray(keys[rows]))
            for name, (offsets, data) in fields.items():
                offsets = np.asarray(offsets, np.int64)
                np.save(tmp / f"{name}.bounds.npy", np.stack([offsets[:-1][rows], offsets[1:][rows]], axis=1))
                np.save(tmp / f"{name}.data.npy", np.asarray(data))
            for name, write in (extra or {}).items():
                write(tmp / name)
            (tmp / COMPLETE_FILE).write_text(f"{rows.size}\n")
        return int(rows.size)
