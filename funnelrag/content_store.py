"""The content store: what a step computed from one piece of content (a page's wikitext, a
document's text, a cluster's members), kept under the 128-bit BLAKE2b of that content and reused
by the next build, whatever shard, piece or id the content has tonight.

One kind of entry serves every per-page, per-document and per-cluster memo of the corpus build
(the page memo, the window-token memo, the BM25 token memos, the segmentation memo), and one kind
of key every store keyed by text (these memos, and the passage vectors of
:mod:`tasks.funnel.vector_store`): :func:`text_keys`, ``(n, 2)`` uint64, sorted, deduplicated
and joined by :func:`key_order`, :func:`distinct_keys` and :func:`join_keys`.

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

Texts as keys without Python strings: a nightly adds-changes build edits ~1% of the pages a day,
spread over every shard, so hashing ~1M texts a night is the memos' main cost. The texts are hashed
from their Arrow buffers (:class:`Utf8Rows`, :func:`arrow_text_keys`, :class:`JoinedTexts`), and
only the texts a step must cut or tokenize become Python strings (:func:`take_texts`).

(git's object store and Bazel's action cache: content-addressed, verified on read.)
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

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
    return digest_words(b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts))


def digest_words(digests: bytes | np.ndarray) -> np.ndarray:
    """``(n, 2)`` uint64 text keys from ``n`` BLAKE2b-128 digests, 16 bytes each one after the
    other (``bytes``, or uint8 ``(n, 16)``): each digest as its two big-endian 64-bit words."""
    raw = np.ascontiguousarray(digests, np.uint8) if isinstance(digests, np.ndarray) else digests
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(-1, 2)


def key_digests(keys: np.ndarray) -> np.ndarray:
    """uint8 ``(n, 16)``: the digest bytes of text keys (``(n, 2)`` uint64), :func:`digest_words` undone."""
    return np.ascontiguousarray(keys, ">u8").view(np.uint8).reshape(-1, 16)


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
    return digest_words(b"".join(blake(value, digest_size=16).digest() for value in Utf8Rows(texts)))


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
        return digest_words(b"".join(out))

    def take(self, rows: np.ndarray) -> list[str]:
        """The joined texts of positions ``rows`` (``(m,)`` int, any order) as Python strings."""
        rows = np.asarray(rows, np.int64)
        src = rows if self.rows is None else self.rows[rows]
        return [a + self.sep + b for a, b in zip(take_texts(self.first, src), take_texts(self.second, src))]

    def to_pylist(self) -> list[str]:
        """Every joined text, in order."""
        return self.take(np.arange(len(self), dtype=np.int64))


def keys_digest(version: str, settings: object, ids: Sequence[str], keys: np.ndarray) -> str:
    """sha256 over ``version``, ``settings``, the ids (length-prefixed) and the texts' keys
    (:func:`funnelrag.content_store.text_keys`): a shard's cache key, from the keys its memo lookup computed anyway."""
    h = hashlib.sha256(json.dumps([version, settings, len(ids)], sort_keys=True, default=str).encode())
    for s in ids:
        h.update(len(s).to_bytes(8, "little"))
        h.update(s.encode("utf-8"))
    h.update(np.ascontiguousarray(keys, np.uint64).tobytes())
    return h.hexdigest()


def key_order(keys: np.ndarray) -> np.ndarray:
    """``(n,)`` int64: the rows of ``keys`` (``(n, 2)`` uint64, :func:`text_keys`) in key order, the
    digests' lexicographic order (a stable sort of the two words: of equal keys, the first row
    comes first)."""
    keys = np.asarray(keys, np.uint64).reshape(-1, 2)
    return np.lexsort((keys[:, 1], keys[:, 0])).astype(np.int64, copy=False)


def distinct_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct keys of ``keys`` (``(n, 2)`` uint64, :func:`text_keys`), in key order: what
    ``np.unique(keys, axis=0, return_index=True, return_inverse=True)`` gives, by a stable sort of
    the two uint64 words instead of numpy's row-wise sort of records (5-60 times faster: ~1 s
    instead of tens of seconds for 2M keys).

    Returns
    -------
    (distinct, first, inverse)
        ``(m, 2)`` uint64; ``(m,)`` int64, the row where each distinct key first occurs (what an
        entry keeps of a repeated key: equal contents have equal values); ``(n,)`` int64, the
        index in ``distinct`` of each row (``distinct[inverse] == keys``).
    """
    keys = np.asarray(keys, np.uint64).reshape(-1, 2)
    order = key_order(keys)
    ordered = keys[order]
    new = np.ones(order.size, bool)
    new[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    inverse = np.empty(order.size, np.int64)
    inverse[order] = np.cumsum(new) - 1
    first = order[new]
    return keys[first], first, inverse


def join_keys(sorted_keys: np.ndarray, keys: np.ndarray, high: np.ndarray | None = None) -> np.ndarray:
    """A join on sorted keys: ``(m,)`` int64, the row of ``sorted_keys`` that holds each of ``keys``
    (``(m, 2)`` uint64, :func:`text_keys`), -1 where none does.

    ``sorted_keys``: ``(n, 2)`` uint64 in key order (:func:`key_order`); a key held twice gives its
    first row. ``high``: ``sorted_keys[:, 0]`` as one contiguous array, when the caller keeps it
    (a search of a strided view copies it every time)."""
    keys = np.asarray(keys, np.uint64).reshape(-1, 2)
    rows = np.full(keys.shape[0], -1, np.int64)
    if not sorted_keys.shape[0] or not keys.shape[0]:
        return rows
    high = np.ascontiguousarray(sorted_keys[:, 0]) if high is None else high
    low = np.asarray(sorted_keys[:, 1])
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
    for i in np.flatnonzero(right > left + 1).tolist():   # a high word held twice: a repeated key, or ~never
        rows[i] = _row_among(sorted_keys, int(left[i]), int(right[i]), keys[i, 1])
    return rows


def _row_among(sorted_keys: np.ndarray, a: int, b: int, low: np.uint64) -> int:
    """The first row in ``[a, b)`` (keys of one high word) whose low word is ``low``, else -1."""
    for j in range(a, b):
        if sorted_keys[j, 1] == low:
            return j
    return -1


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
        the entry does not hold it (:func:`join_keys`)."""
        return join_keys(self.keys, keys, self._high_words())

    def find(self, key: tuple[int, int]) -> int:
        """The row of one key (``(high, low)``), -1 when the entry does not hold it: :meth:`lookup`
        without its per-call set-up (a caller asking key by key, e.g. pass 1 page by page)."""
        high = self._high_words()
        a = int(np.searchsorted(high, np.uint64(key[0]), side="left"))
        b = int(np.searchsorted(high, np.uint64(key[0]), side="right"))
        return _row_among(self.keys, a, b, np.uint64(key[1])) if b > a else -1

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
    def write(directory: Path, keys: np.ndarray, fields: Mapping[str, tuple[np.ndarray, "np.ndarray | DataParts"]],
              extra: Mapping[str, Callable[[Path], None]] | None = None) -> int:
        """Replace the entry in ``directory`` atomically with ``keys`` (``(n, 2)`` uint64) and, per
        field, a CSR ``(offsets (n + 1,), data)`` aligned with ``keys``; ``data`` an array, or
        :class:`DataParts` written part by part (never held together). Rows are sorted by key
        and a repeated key kept once (equal contents have equal values); ``extra`` maps a file
        name to a writer ``(path) -> None`` of a file that goes into the same directory (a
        vocabulary, the Arrow files whose row numbers a field holds). The digest manifest is
        written last. Returns the rows written.

        Raises ``ValueError`` when a field's offsets do not have ``n + 1`` entries, or its
        :class:`DataParts` hold another number of values than ``offsets[-1]``."""
        keys = np.asarray(keys, np.uint64).reshape(-1, 2)
        n = keys.shape[0]
        for name, (offsets, _) in fields.items():
            if len(offsets) != n + 1:
                raise ValueError(f"memo {directory}: field {name!r} has {len(offsets)} offsets for {n} keys")
        _, rows, _ = distinct_keys(keys)
        with atomic_directory(Path(directory)) as tmp:
            np.save(tmp / KEYS_FILE, np.ascontiguousarray(keys[rows]))
            for name, (offsets, data) in fields.items():
                offsets = np.asarray(offsets, np.int64)
                np.save(tmp / f"{name}.bounds.npy", np.stack([offsets[:-1][rows], offsets[1:][rows]], axis=1))
                if isinstance(data, DataParts):
                    data.save(tmp / f"{name}.data.npy", int(offsets[-1]) if offsets.size else 0)
                else:
                    np.save(tmp / f"{name}.data.npy", np.asarray(data))
            for name, write in (extra or {}).items():
                write(tmp / name)
            (tmp / COMPLETE_FILE).write_text(f"{rows.size}\n")
            record_digests(tmp)
        return int(rows.size)


@dataclass(frozen=True)
class DataParts:
    """A field's ``data`` for :meth:`ContentMemo.write` as consecutive 1-D parts of one ``dtype``
    (an iterable, read once), written one after another into the one ``<field>.data.npy``: the
    same bytes as ``np.save`` of their concatenation, while only one part is in memory. A memo of
    all of a corpus's token ids (the BM25 token memos: ~2 billion tokens for the English dump)
    is then written in the memory of one shard's ids, not ~16 bytes a token."""

    dtype: np.dtype | type
    parts: Iterable[np.ndarray]

    def save(self, path: Path, total: int) -> None:
        """Write the ``.npy`` of ``total`` values to ``path``.

        Raises ``ValueError`` (naming ``path``) when the parts hold another number of values."""
        dtype = np.dtype(self.dtype)
        header = {**np.lib.format.header_data_from_array_1_0(np.empty(0, dtype)), "shape": (total,)}
        written = 0
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            for part in self.parts:
                part = np.ascontiguousarray(part, dtype).reshape(-1)
                written += part.size
                if written > total:
                    break
                part.tofile(f)
        if written != total:
            raise ValueError(f"memo {path}: the parts hold {f'more than {total}' if written > total else written} values, "
                             f"the offsets {total}")


# ---------------------------------------------------------------------------- taking values
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
