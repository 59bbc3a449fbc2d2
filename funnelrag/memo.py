"""Texts as content keys: what the content store (:mod:`funnelrag.content_store`) needs of the
corpus build's Arrow tables to key its memos by text, without making a Python string of every text.

Why: a nightly adds-changes build edits ~1% of the pages a day, spread over every document
shard, so a cache keyed by a whole shard's texts is never hit; a memo keyed by each document's
own text is hit by every unchanged page. Hashing ~1M texts a night is then the memos' main cost,
so the texts are hashed from their Arrow buffers (:class:`Utf8Rows`, :func:`arrow_text_keys`,
:class:`JoinedTexts`) and only the texts a step must cut or tokenize become Python strings
(:func:`take_texts`). Part of the corpus build of FunnelRAG (the incremental nightly).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from funnelrag.content_store import contiguous_runs


def keys_digest(version: str, settings: object, ids: Sequence[str], keys: np.ndarray) -> str:
    """sha256 over ``version``, ``settings``, the ids (length-prefixed) and the texts' keys
    (:func:`funnelrag.content_store.text_keys`): a shard's cache key, from the keys its memo lookup computed anyway."""
    h = hashlib.sha256(json.dumps([version, settings, len(ids)], sort_keys=True, default=str).encode())
    for s in ids:
        h.update(len(s).to_bytes(8, "little"))
        h.update(s.encode("utf-8"))
    h.update(np.ascontiguousarray(keys, np.uint64).tobytes())
    return h.hexdigest()


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
    """:func:`funnelrag.content_store.text_keys` of an Arrow string (or large string) array,
    hashed from its UTF-8 buffer without making a Python string of each text (same keys; a null
    hashes as ``""``).

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
        """``(len(self), 2)`` uint64: :func:`funnelrag.content_store.text_keys` of the joined texts (BLAKE2b-128 of
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


def copy_ranges(source: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray, dst: np.ndarray) -> None:
    """``out[dst[k]:dst[k] + ends[k] - starts[k]] = source[starts[k]:ends[k]]`` for every ``k``
    (``starts``, ``ends``, ``dst``: ``(m,)`` int; ``source`` 1-D, e.g. a memory-mapped memo
    field), each range copied from a plain view of ``source``, without the per-slice overhead of
    a memmap (~10 µs a range: 1M passages come in ~70K ranges a night).

    Raises ``IndexError`` for a range outside ``source``."""
    starts, ends, dst = (np.asarray(x, np.int64) for x in (starts, ends, dst))
    if not starts.size:
        return
    if starts.min() < 0 or ends.max() > len(source):
        raise IndexError(f"copy_ranges: a range outside 0..{len(source)}")
    view = source.view(np.ndarray)
    for s_, e, d in zip(starts.tolist(), ends.tolist(), dst.tolist()):
        out[d:d + e - s_] = view[s_:e]
