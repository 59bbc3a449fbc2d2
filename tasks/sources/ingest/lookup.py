"""Exact title -> integer lookup over Arrow string buffers, compiled (numba).

Pass 2 of the ingest resolves every link target of the dump (15M at 1M pages, ~170M in the
English dump) to a ``doc_id``. Through Python dicts each distinct target of a batch became a
Python string first and was then hashed and probed: 9.6 of the coordinator's 37.6 CPU s at 1M
pages, all of it on pass 2's serial path. :class:`TitleIndex` holds the keys as one Arrow string
array (their UTF-8 bytes) and an open-addressing hash table over them. A lookup reads the
queries' offsets and bytes in place: no Python object per target.

The table uses linear probing and a capacity of a power of two at least twice the number of
keys. A slot is one 24-byte record: the key's 64-bit hash (FNV-1a over the UTF-8 bytes, finished
with the murmur3 ``fmix64`` so that the low bits used for the slot depend on every byte), the
offset of its bytes, and its row and length. A probe reads one slot (one cache line) and, on an
equal hash, the key's bytes: two memory accesses a hit, where separate arrays for rows, hashes
and key offsets took four; queries are probed in groups whose memory accesses overlap
(:func:`_lookup`). On pass 2's first 40 batches at 1M pages (735K keys, 9.3M link targets) a
lookup took 285 ns with four arrays, 214 with one record a slot, ~150 with groups (hashing
alone: ~19). A hit needs equal hashes, equal
lengths and equal bytes, so a hash collision can never map a title to another title's value: the
lookup is exact.
"""
from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

_EMPTY = -1


class TitleIndex:
    """Map distinct titles to their row numbers; look many titles up at once.

    Parameters
    ----------
    keys : pa.Array or pa.ChunkedArray of string
        Distinct, non-null titles (UTF-8). Row ``i`` of ``keys`` is the answer for the title
        ``keys[i]``.

    Raises
    ------
    ValueError
        A key is null, or a key occurs twice (the message names the title and both rows).

    Notes
    -----
    Memory: the keys' bytes, plus 24 bytes per slot of a table of ``2 ** ceil(log2(2 * n_keys))``
    slots. For 18M titles (English Wikipedia's articles and redirects) that is ~1.6 GB for the
    table (2 ** 26 slots) and ~0.4 GB for the keys. At most 2 ** 31 - 1 keys of at most 2 ** 32 - 1
    bytes each.
    """

    def __init__(self, keys: pa.Array | pa.ChunkedArray):
        offsets, data, n = _buffers(keys, "key")
        self.n_keys = n
        capacity = 1 << max(4, int(2 * n - 1).bit_length())
        self._data = data
        # (capacity, 3) int64 slots: [hash (uint64 bits), start of the key's bytes, row << 32 | length]
        self._slots = np.zeros((capacity, 3), dtype=np.int64)
        self._slots[:, 2] = _EMPTY
        first = _build(offsets, data, self._slots, np.uint64(capacity - 1))
        if first >= 0:   # the keys before it are in the table: its first occurrence is found
            dup = int(first)
            title = bytes(data[offsets[dup]:offsets[dup + 1]]).decode("utf-8", "replace")
            earlier = int(self.rows(pa.array([title], pa.string()))[0])
            raise ValueError(f"TitleIndex: key {title!r} occurs more than once (rows {earlier} and {dup})")

    def rows(self, queries: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Row of each query among the keys, ``-1`` where the query is not a key.

        Parameters
        ----------
        queries : pa.Array or pa.ChunkedArray of string, shape (n_queries,)
            Non-null titles.

        Returns
        -------
        np.ndarray of int64, shape (n_queries,)

        Raises
        ------
        ValueError
            A query is null.
        """
        out = []
        for chunk in _chunks(queries):
            offsets, data, n = _buffers(chunk, "query")
            rows = np.empty(n, dtype=np.int64)
            _lookup(self._data, self._slots, np.uint64(len(self._slots) - 1), offsets, data, rows)
            out.append(rows)
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def _chunks(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(array.chunks) if isinstance(array, pa.ChunkedArray) else [array]


def _buffers(array: pa.Array | pa.ChunkedArray, what: str) -> tuple[np.ndarray, np.ndarray, int]:
    """``(offsets (n + 1,) int64, data (bytes,) uint8, n)`` of a string array, read in place
    (a ``string`` array's int32 offsets are widened; a slice keeps its absolute offsets)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise TypeError(f"TitleIndex: {what}s must be strings, got {array.type}")
    if array.null_count:
        raise ValueError(f"TitleIndex: {array.null_count} null {what}(s)")
    n = len(array)
    _, offset_buf, data_buf = array.buffers()
    width = np.int64 if pa.types.is_large_string(array.type) else np.int32
    if offset_buf is None:
        offsets = np.zeros(n + 1, dtype=np.int64)
    else:
        offsets = np.frombuffer(offset_buf, dtype=width)[array.offset:array.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data, n


@numba.njit(cache=True, nogil=True, inline="always")
def _hash(data, start, end):  # pragma: no cover - compiled
    h = np.uint64(14695981039346656037)          # FNV-1a 64
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    h ^= h >> np.uint64(33)                       # murmur3 fmix64: every byte reaches the low bits
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _same(data_a, start_a, end_a, data_b, start_b, end_b):  # pragma: no cover - compiled
    if end_a - start_a != end_b - start_b:
        return False
    for i in range(end_a - start_a):
        if data_a[start_a + i] != data_b[start_b + i]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _build(offsets, data, slots, mask):  # pragma: no cover - compiled
    """Insert keys 0..n-1; returns the first key already present, or -1."""
    for k in range(offsets.size - 1):
        s, e = offsets[k], offsets[k + 1]
        h = _hash(data, s, e)
        j = h & mask
        while slots[j, 2] != -1:
            other = slots[j, 2]
            if (np.uint64(slots[j, 0]) == h and (other & 0xFFFFFFFF) == e - s
                    and _same(data, slots[j, 1], slots[j, 1] + (e - s), data, s, e)):
                return k
            j = (j + np.uint64(1)) & mask
        slots[j, 0] = np.int64(h)
        slots[j, 1] = s
        slots[j, 2] = (np.int64(k) << 32) | (e - s)
    return -1


_GROUP = 32   # queries probed together (their memory accesses overlap)


@numba.njit(cache=True, nogil=True)
def _lookup(key_data, slots, mask, offsets, data, out):  # pragma: no cover - compiled
    """``out[q]``: row of query ``q`` or -1. Queries go in groups of :data:`_GROUP`: first every
    query's hash and first slot are read, then the key bytes of every first-slot hash match,
    then each query is compared and probed on. Reads of different queries do not depend on each
    other, so their cache misses overlap instead of following one another. Returns the XOR of the
    bytes step 2 read (meaningless; returned so that the compiler keeps those reads)."""
    n = offsets.size - 1
    hashes = np.empty(_GROUP, dtype=np.uint64)
    firsts = np.empty(_GROUP, dtype=np.uint64)
    metas = np.empty(_GROUP, dtype=np.int64)
    checksum = np.uint8(0)
    for base in range(0, n, _GROUP):
        m = min(_GROUP, n - base)
        for g in range(m):                              # 1: hashes and first slots
            q = base + g
            h = _hash(data, offsets[q], offsets[q + 1])
            j = h & mask
            hashes[g], firsts[g], metas[g] = h, j, slots[j, 2]
        touched = np.uint8(0)
        for g in range(m):                              # 2: first byte of each candidate key
            if metas[g] != -1 and np.uint64(slots[firsts[g], 0]) == hashes[g] and (metas[g] & 0xFFFFFFFF) > 0:
                touched ^= key_data[slots[firsts[g], 1]]
        for g in range(m):                              # 3: compare, probe on
            q = base + g
            s, e, h, j = offsets[q], offsets[q + 1], hashes[g], firsts[g]
            found = -1
            while slots[j, 2] != -1:
                meta = slots[j, 2]
                if (np.uint64(slots[j, 0]) == h and (meta & 0xFFFFFFFF) == e - s
                        and _same(key_data, slots[j, 1], slots[j, 1] + (e - s), data, s, e)):
                    found = meta >> 32
                    break
                j = (j + np.uint64(1)) & mask
            out[q] = found
        checksum ^= touched
    return checksum
