"""BM25 token ids of texts from the per-document memo: only texts the last build did not see are
tokenized (bm25s's split, stop words and stemmer, :func:`tasks.corpus.index.tokenize_ids`).

The BM25 indexes of the corpus build (clusters, passages) tokenize every text of the corpus; a
nightly that edited 1% of the pages needs only 1% of that. A text's terms are kept in the memo
(a :class:`funnelrag.content_store.ContentMemo`, field ``terms``) as ids into the memo's own vocabulary
(``terms.arrow`` beside it); :func:`memo_token_ids` returns exactly what
``TokenIds.from_tokenized(tokenize_ids(texts, cfg, stem))`` returns (same ids, same vocabulary
order: sorted stems with a stemmer, first occurrence without), tested on the enwiki sample.

Texts can be tokenized in *pieces* and joined: bm25s's tokens (``\\b\\w\\w+\\b`` on the lower-cased
text) never span a non-word character, so the tokens of ``"\\n\\n".join(pieces)`` are those of the
pieces one after the other. A cluster's text is its members' ``title\\ntext`` joined by blank
lines, so its memo is per member, and an edited member costs one member's tokenization.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from funnelrag.content_store import ContentMemo, DataParts, settings_dir, text_keys
from tasks.corpus.index import TOKEN_PATTERN, BM25Config, TokenIds, _stemmer, tokenize_ids
from funnelrag.content_store import JoinedTexts, arrow_text_keys, copy_ranges, take_texts

TERMS_FIELD = "terms"
VOCAB_FILE = "terms.arrow"   # an uncompressed Arrow IPC file: every token shard memory-maps it, nothing decoded
PART_KEYS = "memo_keys.npy"
PART_OFFSETS = "memo_piece_offsets.npy"


TOKEN_MEMO_VERSION = "4"   # 2: written whole each build (one data file); an extended memo of 1 is never read;
# 3: keyed on piece keys derived from the documents' text keys (tasks/corpus/sharded/piece_keys.py);
# 4: the vocabulary an Arrow IPC file (was Parquet: decoded by every shard, ~50 bytes of RSS a memo term)

PIECES_JOIN = "\n\n"
"""What joins a text's pieces (a cluster's members). Tokenizing pieces one by one equals tokenizing
the joined text only because no token of :data:`tasks.corpus.index.TOKEN_PATTERN` can match a
non-word character; :func:`check_pieces_join` proves it for the pattern in use."""


def check_pieces_join(pattern: str = TOKEN_PATTERN, join: str = PIECES_JOIN) -> None:
    """Raise unless tokens of ``pattern`` can never span ``join`` (so pieces tokenize alone).

    The test: the pattern must match no string containing a character of ``join`` (every one a
    non-word character), tried on the join itself between word characters. A tokenizer whose
    tokens could cross it (e.g. one that keeps ``"a\n\nb"`` as one token) would make the memo's
    per-piece terms differ from the joined text's.

    Raises
    ------
    ValueError
        The pattern can match across ``join``: name both; the token memo cannot be used with it.
    """
    import re  # noqa: PLC0415  (stdlib; only where checked)

    compiled = re.compile(pattern)
    probe = f"ab{join}cd"
    if any(set(m.group()) & set(join) for m in compiled.finditer(probe)) or any(c.isalnum() or c == "_" for c in join):
        raise ValueError(f"token pattern {pattern!r} can match across the pieces' join {join!r}: "
                         "tokenizing a cluster's members one by one would differ from its joined text")


def token_memo_dir(root: Path, kind: str, cfg: BM25Config) -> Path:
    """The BM25 token memo of ``kind`` (``"clusters"``: member pieces; ``"passages"``) for
    ``cfg``'s tokenizer settings under ``root`` (the stage cache)."""
    return settings_dir(root, f"bm25-memo-{kind}", TOKEN_MEMO_VERSION, cfg)


def open_token_memo(directory: Path | str | None) -> tuple[ContentMemo | None, pa.Array | list[str]]:
    """The BM25 token memo in ``directory`` and its vocabulary (memo id → term; sorted, as
    :func:`write_token_memo` writes it) as an Arrow string array read from the memory-mapped file,
    or ``(None, [])`` when there is none. Every token shard opens the memo; its vocabulary (5-10M
    terms for the English dump) never becomes Python strings here (:func:`memo_token_ids` turns
    only the terms the shard uses into strings)."""
    memo = ContentMemo.open(directory, [TERMS_FIELD])
    if memo is None or not (Path(directory) / VOCAB_FILE).exists():
        return None, []
    terms = pa.ipc.open_file(pa.memory_map(str(Path(directory) / VOCAB_FILE))).read_all().column("term")
    return memo, terms.chunk(0) if terms.num_chunks == 1 else terms.combine_chunks()   # one chunk: no copy


@dataclass
class MemoTokens:
    """:func:`memo_token_ids`' result.

    tokens : the texts' (or groups') token ids and vocabulary, as ``tokenize_ids`` gives them.
    keys : ``(n_pieces, 2)`` uint64 text keys of the pieces.
    piece_offsets : ``(n_pieces + 1,)`` int64 bounds of each piece's ids in ``tokens.ids``.
    reused : pieces whose terms came from the memo.
    """

    tokens: TokenIds
    keys: np.ndarray
    piece_offsets: np.ndarray
    reused: int

    def save(self, directory: Path) -> None:
        """The token ids (:meth:`TokenIds.save`) plus the pieces' keys and bounds, the part of
        the next memo this shard contributes (:func:`write_token_memo`)."""
        self.tokens.save(directory)
        np.save(Path(directory) / PART_KEYS, self.keys)
        np.save(Path(directory) / PART_OFFSETS, self.piece_offsets)


def _runs(dst: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranges ``[starts[k], ends[k])`` of a source copied to ``dst[k]`` onwards, merged where both
    the source and the destination continue: ``(dst, start, end)`` int64 arrays (few copies of long runs)."""
    if not starts.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    sizes = ends - starts
    cont = (starts[1:] == ends[:-1]) & (dst[1:] == dst[:-1] + sizes[:-1])
    cut = np.flatnonzero(~cont) + 1
    first, last = np.r_[0, cut], np.r_[cut - 1, starts.size - 1]
    return dst[first], starts[first], ends[last]


IDS_CHUNK = 1 << 24
"""Ids renumbered per step (:func:`memo_token_ids`): a 64 MiB temporary, whatever the texts' total."""


@numba.njit(cache=True, nogil=True)
def _utf8_search(offsets, data, q_offsets, q_data, out):  # pragma: no cover - compiled
    """For each query ``k`` (bytes ``q_data[q_offsets[k]:q_offsets[k + 1]]``), its index among the
    sorted, distinct byte strings ``data[offsets[i]:offsets[i + 1]]`` (unsigned byte order, then
    length), or -1: a binary search a query."""
    n = offsets.size - 1
    for k in range(q_offsets.size - 1):
        qa, qb = q_offsets[k], q_offsets[k + 1]
        lo, hi = 0, n
        out[k] = -1
        while lo < hi:
            mid = (lo + hi) >> 1
            a, b = offsets[mid], offsets[mid + 1]
            c = 0
            for i in range(min(b - a, qb - qa)):
                x, y = data[a + i], q_data[qa + i]
                if x != y:
                    c = -1 if x < y else 1
                    break
            if c == 0:
                c = -1 if b - a < qb - qa else (1 if b - a > qb - qa else 0)
            if c == 0:
                out[k] = mid
                break
            if c < 0:
                lo = mid + 1
            else:
                hi = mid


def _utf8_buffers(terms: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow ``string`` array's offsets (int32 ``(n + 1,)``, from its first value) and bytes,
    read-only views (an empty array's too: one compiled signature of :func:`_utf8_search`)."""
    if len(terms):
        offsets = np.frombuffer(terms.buffers()[1], np.int32)[terms.offset:terms.offset + len(terms) + 1]
        data = np.frombuffer(terms.buffers()[2], np.uint8) if terms.buffers()[2] is not None else np.zeros(0, np.uint8)
    else:
        offsets, data = np.zeros(1, np.int32), np.zeros(0, np.uint8)
    offsets.flags.writeable = data.flags.writeable = False
    return offsets, data


def sorted_positions(sorted_terms: pa.Array, terms: Sequence[str] | pa.Array) -> np.ndarray:
    """``(len(terms),)`` int64: the index of each of ``terms`` in ``sorted_terms`` (an Arrow string
    array, distinct and ascending in code-point order, as :func:`write_token_memo` writes a memo's
    vocabulary), -1 where it is absent.

    A compiled binary search a term over the arrays' UTF-8 bytes (unsigned byte order is code-point
    order), so a token shard's lookup holds no more than the memo's vocabulary as read, instead of a
    Python string and a dict entry (~170 bytes) or Arrow's hash table (~40 bytes) a memo term, and
    costs ~1 µs a term of the shard's new texts, not time a memo term.

    Raises
    ------
    ValueError
        Either array is not a plain ``string`` array (``large_string`` offsets are not read here).
    """
    queries = terms if isinstance(terms, pa.Array) else pa.array(list(terms), pa.string())
    for name, array in (("memo vocabulary", sorted_terms), ("terms", queries)):
        if array.type != pa.string():
            raise ValueError(f"sorted_positions: {name} of type {array.type}, not string")
    out = np.empty(len(queries), np.int64)
    _utf8_search(*_utf8_buffers(sorted_terms), *_utf8_buffers(queries), out)
    return out


def memo_token_ids(pieces: Sequence[str] | pa.Array | pa.ChunkedArray | JoinedTexts, cfg: BM25Config, memo: ContentMemo | None,
                   memo_terms: pa.Array | Sequence[str],
                   group_offsets: np.ndarray | None = None, keys: np.ndarray | None = None) -> MemoTokens:
    """Token ids of texts made of ``pieces``, taking each piece's terms from ``memo`` when it
    holds the piece's text.

    Parameters
    ----------
    pieces : ``n_pieces`` texts: a sequence of ``str``, an Arrow string array (hashed from its
        buffer, :func:`funnelrag.content_store.arrow_text_keys`), or two columns' texts joined
        (:class:`funnelrag.content_store.JoinedTexts`, hashed from both buffers); with either of the
        last two only the texts the memo lacks become Python strings.
    cfg : BM25 settings (lower-casing, stop words, stemmer).
    memo, memo_terms : :func:`open_token_memo` (``None, []``: tokenize every piece); ``memo_terms``
        an Arrow string array or a sequence of ``str``. Memory and time: the terms the pieces use
        and the memo's vocabulary as read, searched for the new texts' terms (:func:`sorted_positions`),
        not a Python string and dict entry a memo term (~170 bytes and ~1.3 µs each before).
    group_offsets : ``(n_texts + 1,)`` int64: text ``g`` is pieces ``group_offsets[g]:group_offsets[g + 1]``
        joined by :data:`PIECES_JOIN` (default: each piece is a text).
    keys : the pieces' :func:`funnelrag.content_store.text_keys`, when the caller has them already.

    Returns
    -------
    MemoTokens
        ``tokens`` equals ``TokenIds.from_tokenized(tokenize_ids(texts, cfg, stem))`` of the
        joined texts.

    Raises
    ------
    ValueError
        ``group_offsets`` does not cover the pieces, or the token pattern could span the pieces'
        join (:func:`check_pieces_join`).
    """
    if group_offsets is not None:
        check_pieces_join()
    n = len(pieces)
    bounds = np.arange(n + 1, dtype=np.int64) if group_offsets is None else np.asarray(group_offsets, np.int64)
    if bounds.size == 0 or bounds[0] != 0 or bounds[-1] != n or np.any(np.diff(bounds) < 0):
        raise ValueError(f"memo_token_ids: group offsets {bounds[:3]}…{bounds[-3:]} do not cover {n} pieces")
    joined = isinstance(pieces, JoinedTexts)
    arrow = isinstance(pieces, (pa.Array, pa.ChunkedArray))
    if keys is None:
        keys = pieces.keys() if joined else arrow_text_keys(pieces) if arrow else text_keys(pieces)
    rows = memo.lookup(keys) if memo is not None else np.full(n, -1, np.int64)
    hit, miss = np.flatnonzero(rows >= 0), np.flatnonzero(rows < 0)
    if isinstance(memo_terms, pa.ChunkedArray):
        memo_terms = memo_terms.combine_chunks()
    elif not isinstance(memo_terms, pa.Array):
        memo_terms = pa.array(memo_terms, pa.string())
    n_memo = len(memo_terms)
    lengths = np.zeros(n, np.int64)
    miss_ids = np.zeros(0, np.int32)
    memo_data = np.zeros(0, np.int32)
    hit_starts = hit_ends = np.zeros(0, np.int64)
    new_terms: list[str] = []
    if hit.size:   # where the hit pieces' ids lie in the memo (read in place below, not copied together)
        hit_starts, hit_ends = memo.value_ranges(TERMS_FIELD, rows[hit])
        memo_data = memo.fields[TERMS_FIELD][1]
        lengths[hit] = hit_ends - hit_starts
    if miss.size:
        texts = (pieces.take(miss) if joined else take_texts(pieces, miss) if arrow
                 else [pieces[i] for i in miss.tolist()])
        fresh = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
        to_combined = sorted_positions(memo_terms, fresh.terms).astype(np.int32)
        absent = np.flatnonzero(to_combined < 0)   # terms the memo lacks: numbered after it, in the shard's order
        to_combined[absent] = n_memo + np.arange(absent.size, dtype=np.int32)
        new_terms = [fresh.terms[j] for j in absent.tolist()]
        lengths[miss] = np.diff(fresh.offsets)
        miss_ids = to_combined[fresh.ids]
    piece_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=piece_offsets[1:])
    miss_src = np.zeros(miss.size + 1, np.int64)
    np.cumsum(lengths[miss], out=miss_src[1:])
    # the texts' ids in memo-wide numbering, in text order: runs of the memo's data and of miss_ids,
    # copied into the output array (a plain copy a run), then renumbered in place below
    total = int(piece_offsets[-1])
    ids = np.empty(total, np.int32)
    for source, (dst, a, b) in ((memo_data, _runs(piece_offsets[hit], hit_starts, hit_ends)),
                                (miss_ids, _runs(piece_offsets[miss], miss_src[:-1], miss_src[1:]))):
        copy_ranges(source, a, b, ids, dst)
    n_combined = n_memo + len(new_terms)
    present = np.zeros(n_combined, bool)
    present[ids] = True    # raises IndexError for an id outside the vocabulary
    used = np.flatnonzero(present)   # the ids the texts use, ascending (a counting pass, no sort)
    split = int(np.searchsorted(used, n_memo))   # used ids of the memo, then of tonight's new terms
    used_terms = memo_terms.take(pa.array(used[:split])).to_pylist() + [new_terms[c - n_memo] for c in used[split:].tolist()]
    if cfg.stemmer is not None:   # tokenize_ids numbers stems in sorted order
        vocab = sorted(used_terms)
        rank = {t: i for i, t in enumerate(vocab)}
        local = np.array([rank[t] for t in used_terms], np.int64)
    else:                         # ... and raw tokens in first-occurrence order
        _, first = np.unique(ids, return_index=True)
        order = np.argsort(first, kind="stable")
        local = np.empty(used.size, np.int64)
        local[order] = np.arange(used.size)
        vocab = [used_terms[i] for i in order.tolist()]
    lookup = np.full(n_combined, -1, np.int32)
    lookup[used] = local
    for a in range(0, total, IDS_CHUNK):   # every id is checked above
        ids[a:a + IDS_CHUNK] = lookup[ids[a:a + IDS_CHUNK]]
    return MemoTokens(TokenIds(ids, piece_offsets[bounds], vocab), keys, piece_offsets, int(hit.size))


class TermUnion:
    """The distinct terms of Arrow string arrays added one by one (e.g. the token shards'
    vocabularies), in order of first occurrence (Arrow's ``unique`` keeps it).

    The arrays waiting are merged (one ``pc.unique`` over the merged terms and them) whenever they
    hold as many terms as the merged ones, so each term is hashed a bounded number of times:
    O(sum of the arrays' lengths) in C++, not a Python set update and dict entry a term of every
    shard (~140-230 shards of ~1M terms each for the English dump). Memory: the union and at most
    about as many terms waiting."""

    def __init__(self) -> None:
        self._merged = pa.array([], pa.string())
        self._waiting: list[pa.Array] = []
        self._n_waiting = 0

    def add(self, terms: pa.Array) -> None:
        """Add one array of terms (a plain ``string`` array)."""
        self._waiting.append(terms)
        self._n_waiting += len(terms)
        if self._n_waiting >= len(self._merged):
            self._merge()

    def terms(self) -> pa.Array:
        """The union so far, in order of first occurrence."""
        if self._waiting:
            self._merge()
        return self._merged

    def _merge(self) -> None:
        self._merged = pc.unique(pa.concat_arrays([self._merged, *self._waiting]))
        self._waiting, self._n_waiting = [], 0


def union_terms(term_arrays: Iterable[pa.Array]) -> pa.Array:
    """The distinct terms of ``term_arrays``, in order of first occurrence (:class:`TermUnion`)."""
    union = TermUnion()
    for terms in term_arrays:
        union.add(terms)
    return union.terms()


def positions_in(vocabulary: pa.Array, term_arrays: Iterable[pa.Array]) -> Iterator[np.ndarray]:
    """For each of ``term_arrays`` (in order), int32 ``(len(array),)``: the index in ``vocabulary``
    (distinct terms) of each of its terms.

    Arrays are looked up in batches of about ``len(vocabulary)`` terms (one ``pc.index_in``, whose
    hash of the vocabulary costs O(its length), per batch): O(vocabulary + sum of the arrays).

    Raises
    ------
    KeyError
        A term is not in ``vocabulary`` (names the first such term).
    """
    batch: list[pa.Array] = []
    n_batch = 0

    def flush() -> Iterator[np.ndarray]:
        at = pc.index_in(pa.concat_arrays(batch), value_set=vocabulary)
        if at.null_count:
            first = pa.concat_arrays(batch).filter(pc.is_null(at))[0].as_py()
            raise KeyError(f"term {first!r} is not in the vocabulary of {len(vocabulary)} terms")
        at = at.to_numpy().astype(np.int32, copy=False)
        bounds = np.cumsum([0, *(len(b) for b in batch)])
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield at[a:b]

    for terms in term_arrays:
        batch.append(terms)
        n_batch += len(terms)
        if n_batch >= len(vocabulary):
            yield from flush()
            batch, n_batch = [], 0
    if batch:
        yield from flush()


def write_token_memo(directory: Path, part_dirs: Sequence[Path | MemoTokens]) -> int:
    """Replace the token memo in ``directory`` with the pieces of ``part_dirs`` (directories
    :meth:`MemoTokens.save` wrote: this build's shards; or the :class:`MemoTokens` themselves),
    atomically, so that it holds exactly this build's pieces (a repeated text once), its
    vocabulary the sorted union of the parts' terms (:meth:`funnelrag.content_store.ContentMemo.write`).
    :func:`memo_token_ids` gives the same ids from any memo (its result does not depend on the
    memo's numbering). Returns the pieces the memo holds.

    Memory: the pieces' keys and bounds (24 bytes a piece), the vocabulary (Arrow), and one part's
    token ids at a time (each part's vocabulary is read twice: once for the union, once to renumber
    its ids as they are written, :class:`funnelrag.content_store.DataParts`), not every part's ids
    at once and their copies (~16 bytes a token before: ~30 GB for the English dump's ~2 billion
    tokens). Time: the vocabularies are merged and looked up in Arrow (:func:`union_terms`,
    :func:`positions_in`), O(sum of the parts' vocabularies), no Python string a term.
    """
    parts = [d if isinstance(d, MemoTokens) else Path(d) for d in part_dirs]

    def terms_of(part: Path | MemoTokens) -> pa.Array:
        if isinstance(part, MemoTokens):
            return pa.array(part.tokens.terms, pa.string())
        return pq.read_table(part / TokenIds.TERMS_FILE).column("term").combine_chunks()

    keys = [part.keys if isinstance(part, MemoTokens) else np.load(part / PART_KEYS) for part in parts]
    lengths = [np.diff(part.piece_offsets if isinstance(part, MemoTokens) else np.load(part / PART_OFFSETS))
               for part in parts]
    vocab = union_terms(terms_of(part) for part in parts)
    vocab = vocab.take(pc.array_sort_indices(vocab))   # UTF-8 byte order: Python's code-point order

    def renumbered():
        for part, remap in zip(parts, positions_in(vocab, (terms_of(part) for part in parts))):
            ids = part.tokens.ids if isinstance(part, MemoTokens) else np.load(part / TokenIds.IDS_FILE, mmap_mode="r")
            yield remap[ids] if ids.size else np.zeros(0, np.int32)

    flat_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(flat_lengths.size + 1, np.int64)
    np.cumsum(flat_lengths, out=offsets[1:])
    return ContentMemo.write(Path(directory), np.concatenate(keys) if keys else np.zeros((0, 2), np.uint64),
                             {TERMS_FIELD: (offsets, DataParts(np.int32, renumbered()))},
                             extra={VOCAB_FILE: lambda path: _write_vocabulary(path, vocab)})


def _write_vocabulary(path: Path, vocab: pa.Array) -> None:
    """The memo's vocabulary as one uncompressed Arrow IPC record batch (``term``), so that
    :func:`open_token_memo` maps it instead of decoding it."""
    table = pa.table({"term": vocab})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(len(vocab), 1))
