"""Per-document memo: what a corpus-build step computed from one document's text, kept under the
128-bit BLAKE2b of that text and reused by the next build, whatever shard the document falls in.

Why: a nightly adds-changes build edits ~1% of the pages a day, spread over every document
shard, so a cache keyed by a whole shard's texts is never hit; a memo keyed by each document's
own text is hit by every unchanged page. The memo of a step is one directory of flat arrays
(memory-mapped by the workers, nothing parsed):

``keys.npy``
    ``(n, 2)`` uint64, the BLAKE2b-128 of each text as (high, low) words, sorted lexicographically,
    distinct.
``<field>.bounds.npy`` / ``<field>.data.npy`` (and ``<field>.data.<k>.npy``, k = 1, 2, ...)
    per field, ``(n, 2)`` int64 (start, end) of each key's values in ``data``: the values of key
    ``i`` are ``data[start:end]`` (the data stay in the order they were given; only the bounds are
    sorted with the keys, so a write never moves the values). ``data`` is the data files one
    after the other (:class:`PartedArray`; a key's values lie in one file).

A lookup is a binary search of the high words (:meth:`DocumentMemo.lookup`), checked on the low
words. A build either rewrites the memo with exactly its documents (:meth:`DocumentMemo.write`)
or extends it with the documents it lacked (:meth:`DocumentMemo.extend`: the data files are
hard-linked, one file of new values is added, only keys and bounds are written again), both
atomic (a reader sees the old or the new directory). A nightly extends the BM25 token memos
while the keys no build asks for stay few (:func:`keep_extending`), so a night writes its ~1% of
new values, not the whole memo again. Part of the corpus build of FunnelRAG (the incremental nightly).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from data_contracts.base import atomic_directory, link_or_copy
from funnelrag.config import config_hash
from funnelrag.verify import record_digests, recorded_digests

KEYS_FILE = "keys.npy"
COMPLETE_FILE = "COMPLETE"


def settings_dir(root: Path, prefix: str, version: str, section: Any, *extra: object) -> Path:
    """``root/<prefix>-<16 hex>``: the directory of a memo whose values depend on a config section.

    The key is :func:`funnelrag.config.config_hash` over ``version``, the **whole** ``section``
    (a dataclass or pydantic model: every field, not a hand-picked list, so a field added to the
    section later changes the key instead of leaving the memo silently stale) and ``extra`` (e.g.
    the dump's namespaces). A build with other settings never reads another's memo.
    """
    return Path(root) / f"{prefix}-{config_hash({'version': version, 'section': section, 'extra': list(extra)})[:16]}"


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


def first_of_each_key(keys: np.ndarray) -> np.ndarray:
    """``(m,)`` int64: the row of the first occurrence of each distinct key of ``keys`` (``(n, 2)``
    uint64 (high, low) words, :func:`text_keys`), in key order: what a memo keeps of a repeated
    key (equal texts have equal values)."""
    keys = np.asarray(keys, np.uint64).reshape(-1, 2)
    order = np.lexsort((keys[:, 1], keys[:, 0]))   # stable: of equal keys, the first row comes first
    ordered = keys[order]
    first = np.ones(order.size, bool)
    if order.size > 1:
        first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    return order[first].astype(np.int64)


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


class JoinedTexts:
    """The texts ``first[r] + sep + second[r]``, for ``r`` in ``rows`` (default: every row), of two
    Arrow string columns of one length (a document's or passage's ``title`` and ``text``), never
    joined as a whole: :meth:`keys` hashes them from the columns' buffers and :meth:`take` makes
    Python strings only of the rows asked for.

    Why: the BM25 token memos look up every ``title\\ntext`` of the corpus by its key, and a night
    tokenizes ~1% of them. Joining the columns with Arrow (``binary_join_element_wise``) and
    putting the documents in cluster order (``take``) copied every text twice to hash it once:
    ~2.3 CPU s a night at 200K pages (55K members 2.6 → 0.8, ~1M passages 2.2 → 1.7, one call in
    a fresh process), mostly the system time of the copies' fresh memory.

    Raises ``ValueError`` when the columns differ in length or hold a null (the corpus contracts
    allow none), ``IndexError`` for a row outside them, ``TypeError`` for a non-string column.
    """

    def __init__(self, first: pa.Array | pa.ChunkedArray, second: pa.Array | pa.ChunkedArray, sep: str = "\n",
                 rows: np.ndarray | None = None):
        if len(first) != len(second):
            raise ValueError(f"joined texts: columns of {len(first)} and {len(second)} rows")
        if first.null_count or second.null_count:
            raise ValueError(f"joined texts: {first.null_count + second.null_count} null values")
        self.first, self.second, self.sep = first, second, sep
        n = len(first)
        self.rows = None if rows is None else np.asarray(rows, np.int64)
        if self.rows is not None and self.rows.size and (self.rows.min() < 0 or self.rows.max() >= n):
            raise IndexError(f"joined texts: rows outside 0..{n - 1}")

    def __len__(self) -> int:
        return len(self.first) if self.rows is None else int(self.rows.size)

    def keys(self) -> np.ndarray:
        """``(len(self), 2)`` uint64: :func:`text_keys` of the joined texts (BLAKE2b-128 of
        ``first + sep + second`` in UTF-8, fed in three parts: the same digest)."""
        first, second, sep = Utf8Rows(self.first), Utf8Rows(self.second), self.sep.encode("utf-8")
        blake = hashlib.blake2b
        out: list[bytes] = []
        add = out.append
        if self.rows is None:
            pairs = zip(first, second)
        else:
            get_a, get_b = first.__getitem__, second.__getitem__
            pairs = ((get_a(r), get_b(r)) for r in self.rows.tolist())
        for a, b in pairs:
            h = blake(a, digest_size=16)
            h.update(sep)
            h.update(b)
            add(h.digest())
        return np.frombuffer(b"".join(out), dtype=">u8").astype(np.uint64).reshape(len(out), 2)

    def take(self, rows: np.ndarray) -> list[str]:
        """The joined texts of positions ``rows`` (``(m,)`` int, any order) as Python strings."""
        rows = np.asarray(rows, np.int64)
        src = rows if self.rows is None else self.rows[rows]
        return [a + self.sep + b for a, b in zip(take_texts(self.first, src), take_texts(self.second, src))]

    def to_pylist(self) -> list[str]:
        """Every joined text, in order."""
        return self.take(np.arange(len(self), dtype=np.int64))


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


class PartedArray:
    """Files of a 1-D array one after the other, read as one array without joining them: ``a[i:j]``
    (a view when the range lies in one part, else a copy of the pieces) and ``a[indices]``.

    ``parts``: the 1-D arrays (memory-mapped), one dtype."""

    def __init__(self, parts: Sequence[np.ndarray]):
        if not parts:
            raise ValueError("PartedArray needs at least one part")
        self.parts = list(parts)
        self.dtype = self.parts[0].dtype
        if any(p.dtype != self.dtype or p.ndim != 1 for p in self.parts):
            raise ValueError(f"PartedArray parts must be 1-D of one dtype, got {[(p.dtype, p.ndim) for p in self.parts]}")
        self.bases = np.zeros(len(self.parts) + 1, np.int64)
        np.cumsum([p.shape[0] for p in self.parts], out=self.bases[1:])
        self.shape = (int(self.bases[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("PartedArray slices take step 1")
            if start >= stop:
                return self.parts[0][0:0]
            k = int(np.searchsorted(self.bases, start, side="right")) - 1
            if stop <= self.bases[k + 1]:
                return self.parts[k][start - self.bases[k]:stop - self.bases[k]]
            pieces, at = [], start
            while at < stop:
                k = int(np.searchsorted(self.bases, at, side="right")) - 1
                end = min(stop, int(self.bases[k + 1]))
                pieces.append(self.parts[k][at - self.bases[k]:end - self.bases[k]])
                at = end
            return np.concatenate(pieces)
        idx = np.asarray(key, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"PartedArray index out of range 0..{len(self) - 1}")
        which = np.searchsorted(self.bases, idx, side="right") - 1
        out = np.empty(idx.shape, self.dtype)
        for k in np.unique(which).tolist():
            at = which == k
            out[at] = self.parts[k][idx[at] - self.bases[k]]
        return out


def copy_ranges(source: np.ndarray | PartedArray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray,
                dst: np.ndarray) -> None:
    """``out[dst[k]:dst[k] + ends[k] - starts[k]] = source[starts[k]:ends[k]]`` for every ``k``
    (``starts``, ``ends``, ``dst``: ``(m,)`` int). ``source`` is a 1-D array or a
    :class:`PartedArray`; a range lying in one part (the usual case: a memo key's values lie in one
    file) is copied from a plain view of that part, without the per-slice overhead of a memmap or
    of :meth:`PartedArray.__getitem__` (~10 µs a range: 1M passages come in ~70K ranges a night)."""
    starts, ends, dst = (np.asarray(x, np.int64) for x in (starts, ends, dst))
    if not starts.size:
        return
    if starts.min() < 0:
        raise IndexError(f"copy_ranges: negative start {int(starts.min())}")
    parts, bases = ((source.parts, source.bases) if isinstance(source, PartedArray)
                    else ([source], np.array([0, len(source)], np.int64)))
    views = [p.view(np.ndarray) for p in parts]
    part = np.searchsorted(bases, starts, side="right") - 1
    inside = (part >= 0) & (part < len(parts)) & (ends <= bases[np.minimum(part + 1, len(parts))])
    rel = starts - bases[np.clip(part, 0, len(parts) - 1)]
    for k, a, s, e, d, one in zip(part.tolist(), rel.tolist(), starts.tolist(), ends.tolist(), dst.tolist(),
                                  inside.tolist()):
        out[d:d + e - s] = views[k][a:a + e - s] if one else source[s:e]   # else: across parts (joined), or raises


def _data_files(directory: Path, field: str) -> list[Path]:
    """A field's data files in order: ``<field>.data.npy``, then ``<field>.data.1.npy``, ... ."""
    first = directory / f"{field}.data.npy"
    more = sorted(directory.glob(f"{field}.data.*.npy"), key=lambda p: int(p.name.split(".")[-2]))
    return ([first] if first.exists() else []) + more


MAX_DATA_FILES = 32
"""The most data files an extended memo has: the next build rewrites it whole."""
MAX_DEAD = 0.2
"""The largest share of an extended memo's rows that may be keys no build asks for any more."""


def keep_extending(memo_rows: int, new_rows: int, live_rows: int, max_dead: float = MAX_DEAD, data_files: int = 1) -> bool:
    """Whether a build extends the memo (:meth:`DocumentMemo.extend`) rather than rewriting it:
    while at most ``max_dead`` of the extended memo's rows are keys this build did not ask for
    (``live_rows``: its distinct keys; the rest are texts edited or deleted since, which only cost
    space) and the memo has fewer than :data:`MAX_DATA_FILES` data files (``data_files``). At ~1%
    of the texts edited a night that is ~15 nights between rewrites (measured: ~1.4% go stale a night), so a night writes its new
    values and, one night in ~15, the whole memo again."""
    total = memo_rows + new_rows
    return total > 0 and (total - live_rows) <= max_dead * total and data_files < MAX_DATA_FILES


class DocumentMemo:
    """A memo directory opened for lookups (arrays memory-mapped).

    Use :meth:`open` (``None`` when there is no complete memo), :meth:`write` and :meth:`extend`.
    ``fields[name]`` is ``(bounds (n, 2) int64, data)``; ``data`` is an array, or a
    :class:`PartedArray` when an extended memo has several data files.
    """

    def __init__(self, directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, Any]]):
        self.directory, self.keys, self.fields = Path(directory), keys, dict(fields)

    @classmethod
    def open(cls, directory: Path | str | None, fields: Sequence[str]) -> "DocumentMemo | None":
        """The memo in ``directory`` with ``fields``, or ``None`` when ``directory`` is ``None``,
        absent, incomplete (no ``COMPLETE`` marker) or lacks a field. Its files are not checked
        here (a memo is opened by every shard): the build checks them once before its shards
        open it (:func:`funnelrag.verify.verified_entry`)."""
        if directory is None:
            return None
        directory = Path(directory)
        if not (directory / COMPLETE_FILE).exists():
            return None
        try:
            keys = np.load(directory / KEYS_FILE, mmap_mode="r")
            found = {}
            for f in fields:
                parts = [np.load(p, mmap_mode="r") for p in _data_files(directory, f)]
                if not parts:
                    return None
                found[f] = (np.load(directory / f"{f}.bounds.npy", mmap_mode="r"),
                            parts[0] if len(parts) == 1 else PartedArray(parts))
        except FileNotFoundError:
            return None
        return cls(directory, keys, found)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @property
    def data_files(self) -> int:
        """How many data files a field's values are in (1 until the memo is extended)."""
        data = next(iter(self.fields.values()))[1] if self.fields else None
        return len(data.parts) if isinstance(data, PartedArray) else 1

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """``(m,)`` int64 memo row of each of ``keys`` (``(m, 2)`` uint64, :func:`text_keys`), -1
        where the memo does not hold it."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        rows = np.full(keys.shape[0], -1, np.int64)
        if not len(self) or not keys.shape[0]:
            return rows
        high, low = np.ascontiguousarray(self.keys[:, 0]), np.asarray(self.keys[:, 1])
        # Binary searches in key order walk the memo front to back (numpy narrows each search from
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

    def extend(self, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, np.ndarray]],
               extra: Mapping[str, Callable[[Path], None]] | None = None) -> int:
        """Replace this memo's directory atomically with this memo plus ``keys`` (``(m, 2)``
        uint64) and, per field, their CSR ``(offsets (m + 1,), data)``: every field of the memo
        must be given. The memo's data files are hard-linked into the new directory (no value is
        copied) and each field gains one data file of the new values; only the keys and bounds
        (16 bytes a key each) are written again. A key the memo holds, or a repeated key, is kept
        once (equal texts have equal values); only the new keys' values are written.
        ``extra`` as in :meth:`write` (written anew).
        Returns the rows of the new memo.

        Raises ``ValueError`` when a field is missing or its offsets do not have ``m + 1`` entries."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        m = keys.shape[0]
        if set(fields) != set(self.fields):
            raise ValueError(f"memo {self.directory}: extend needs the fields {sorted(self.fields)}, got {sorted(fields)}")
        for name, (offsets, _) in fields.items():
            if len(offsets) != m + 1:
                raise ValueError(f"memo {self.directory}: field {name!r} has {len(offsets)} offsets for {m} keys")
        new = np.flatnonzero(self.lookup(keys) < 0)
        if new.size:   # each new key once (the first of a repeated one), in key order
            _, first = np.unique(keys[new], axis=0, return_index=True)
            new = new[first]
        at = self._insertion_points(keys[new])
        files = {name: _data_files(self.directory, name) for name in self.fields}
        known = recorded_digests(self.directory)   # of the data files linked below: not hashed again
        with atomic_directory(self.directory) as tmp:
            np.save(tmp / KEYS_FILE, np.insert(np.asarray(self.keys), at, keys[new], axis=0))
            for name, (offsets, data) in fields.items():
                old_bounds, old_data = self.fields[name]
                offsets = np.asarray(offsets, np.int64)
                lengths, values = ranges_take(offsets[:-1][new], offsets[1:][new], np.asarray(data))
                ends = np.cumsum(lengths) + len(old_data)
                added = np.stack([ends - lengths, ends], axis=1)
                np.save(tmp / f"{name}.bounds.npy", np.insert(np.asarray(old_bounds, np.int64), at, added, axis=0))
                for k, path in enumerate(files[name]):
                    link_or_copy(path, tmp / (f"{name}.data.npy" if k == 0 else f"{name}.data.{k}.npy"))
                np.save(tmp / f"{name}.data.{len(files[name])}.npy", np.asarray(values, old_data.dtype))
            for name, write in (extra or {}).items():
                write(tmp / name)
            (tmp / COMPLETE_FILE).write_text(f"{len(self) + new.size}\n")
            record_digests(tmp, {n: d for n, d in known.items() if ".data." in n})
        return len(self) + int(new.size)

    def _insertion_points(self, keys: np.ndarray) -> np.ndarray:
        """Where sorted, distinct ``keys`` (none held by the memo) go among the memo's sorted keys
        (``np.insert`` positions: a merge, not a sort of all keys)."""
        high, low = np.asarray(self.keys[:, 0]), np.asarray(self.keys[:, 1])
        at = np.searchsorted(high, keys[:, 0], side="left")
        for i in np.flatnonzero((at < high.size) & (high[np.minimum(at, high.size - 1)] == keys[:, 0])).tolist():
            while at[i] < high.size and high[at[i]] == keys[i, 0] and low[at[i]] < keys[i, 1]:   # a shared high word: ~never
                at[i] += 1
        return at
