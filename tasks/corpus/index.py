"""BM25 indexes (bm25s) over cluster texts (progressive path) and passages (flat baseline).

The index directory holds bm25s' mmap-loadable files (``data.csc.index.npy``,
``indices.csc.index.npy``, ``indptr.csc.index.npy``, ``vocab.index.json``,
``params.index.json``) plus ``doc_ids.index.json`` (row → external id) and
``tokenizer.index.json`` (lower-casing, stop words, stemmer). Queries are tokenized from that
file, so the query path always uses the very tokenizer the index was built with (a stemmed
index queried without the stemmer silently returns garbage).
"""
from __future__ import annotations

import itertools
import json
import re
import threading
from array import array
from collections import defaultdict
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from collections import abc
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import Stemmer

from data_contracts.base import atomic_directory

TOKENIZER_FILE = "tokenizer.index.json"
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
"""The token split of every BM25 index and query (bm25s's default, passed explicitly so that a
new bm25s default cannot change our tokens). A token never spans a non-word character, which the
token memo relies on (:data:`tasks.corpus.sharded.token_memo.PIECES_JOIN`)."""
IDS_FILE = "doc_ids.index.json"
_SPLIT = re.compile(TOKEN_PATTERN).findall


@dataclass(frozen=True)
class BM25Config:
    """BM25 settings (bm25s ``method`` lucene = Lucene's BM25 idf).

    k1, b : BM25 term-frequency saturation and length normalisation.
    stemmer : Snowball language for PyStemmer, or ``None`` for no stemming.
    stopwords : bm25s stop-word list name (``"en"``) or ``None``.
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    stemmer: str | None = "english"
    stopwords: str | None = "en"
    lower: bool = True


def _stemmer(name: str | None):
    if name is None:
        return None

    return Stemmer.Stemmer(name).stemWords


def tokenize_ids(texts: Sequence[str], cfg: BM25Config, stem=None):
    """bm25s ``Tokenized`` (token ids per text + vocabulary) with a vocabulary order that does not
    depend on the process.

    ``bm25s.tokenize(..., stemmer=...)`` numbers stems by iterating a ``set``, so the ids, and with
    them the saved ``vocab``/``data``/``indices`` arrays, change with ``PYTHONHASHSEED`` from one
    run to the next. Here the raw tokens are split and numbered as bm25s numbers them (its regex
    on the lower-cased text, stop words dropped, first-occurrence order, which is deterministic),
    the unique tokens are stemmed once, and stems are numbered in sorted order.

    The split and numbering are bm25s's own steps without its per-token Python loop: each text's
    ``findall`` numbers its tokens through a ``defaultdict`` whose missing keys take the next id
    (stop words preset to -1), all in C, into one flat int32 array; stop words are dropped and
    stems mapped with numpy. Same tokens and ids as :func:`tokenize_ids_bm25s` (the plain path,
    compared in ``tests/test_bm25_tokenize.py``), about a third fewer CPU seconds (the regex split,
    in C either way, is most of what is left; ``benchmarks/bench_demo_parts.py``).

    Parameters
    ----------
    texts : ``n`` strings.
    cfg : lower-casing and stop words (``cfg.stemmer`` is given as the callable ``stem``).
    stem : ``list[str] -> list[str]`` (PyStemmer ``stemWords``) or None.

    Returns
    -------
    bm25s.tokenization.Tokenized
        ``ids``: ``n`` sequences of token ids (a list-like view of flat arrays, each text's ids a
        list when read; :meth:`TokenIds.from_tokenized` takes the arrays as they are);
        ``vocab``: token (stem) → id, ids ``0..V-1`` in sorted token order when stemming,
        first-occurrence order otherwise.
    """
    from bm25s.tokenization import Tokenized, _infer_stopwords  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

    split = re.compile(TOKEN_PATTERN).findall
    raw: defaultdict[str, int] = defaultdict(itertools.count().__next__)   # token -> raw id, the next id when missing
    for word in _infer_stopwords(cfg.stopwords):
        dict.__setitem__(raw, word, -1)
    numbered = raw.__getitem__
    flat = array("i")
    counts = array("q")
    for text in texts:
        tokens = split(text.lower() if cfg.lower else text)
        counts.append(len(tokens))
        flat.extend(map(numbered, tokens))
    raw_ids = np.frombuffer(flat, dtype=np.int32) if flat else np.zeros(0, np.int32)
    kept = raw_ids >= 0                                        # stop words are -1
    ends = np.cumsum(np.frombuffer(counts, dtype=np.int64)) if counts else np.zeros(0, np.int64)
    kept_before = np.concatenate([[0], np.cumsum(kept, dtype=np.int64)])
    offsets = np.concatenate([[0], kept_before[ends]]).astype(np.int64)
    ids = raw_ids[kept]
    unique = [t for t, i in raw.items() if i >= 0]             # raw id order 0..U-1 (insertion order)
    if stem is None:
        return Tokenized(ids=_IdLists(ids, offsets), vocab={t: i for i, t in enumerate(unique)})
    stems = stem(unique)
    vocab = {t: i for i, t in enumerate(sorted(set(stems)))}
    lookup = np.fromiter((vocab[t] for t in stems), dtype=np.int32, count=len(stems))   # raw id -> stem id
    return Tokenized(ids=_IdLists(lookup[ids] if ids.size else ids, offsets), vocab=vocab)


def tokenize_ids_bm25s(texts: Sequence[str], cfg: BM25Config, stem=None):
    """:func:`tokenize_ids` by ``bm25s.tokenize`` itself (its per-token loop), stems numbered in
    sorted order: the plain path the fast one is tested against. Same parameters and result
    (``ids`` as lists)."""
    import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)
    from bm25s.tokenization import Tokenized  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

    raw = bm25s.tokenize(list(texts), lower=cfg.lower, token_pattern=TOKEN_PATTERN, stopwords=cfg.stopwords, stemmer=None,
                         return_ids=True, show_progress=False)
    if stem is None:
        return raw
    unique = sorted(raw.vocab, key=raw.vocab.__getitem__)   # raw id order 0..U-1
    stems = stem(unique)
    vocab = {t: i for i, t in enumerate(sorted(set(stems)))}
    lookup = [vocab[t] for t in stems]                        # raw id -> stem id
    return Tokenized(ids=[[lookup[t] for t in doc] for doc in raw.ids], vocab=vocab)


@dataclass
class TokenIds:
    """Token ids of ``n`` texts in flat arrays (4 bytes a token instead of a Python list's 8 plus
    the list headers), with their vocabulary.

    ids : int32 ``(n_tokens,)``, the texts' token ids one after the other.
    offsets : int64 ``(n + 1,)``; text ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
    terms : ``V`` tokens (stems), ``terms[j]`` is id ``j``.
    """

    ids: np.ndarray
    offsets: np.ndarray
    terms: list[str]

    IDS_FILE = "token_ids.npy"
    OFFSETS_FILE = "token_offsets.npy"
    TERMS_FILE = "vocab.parquet"

    @classmethod
    def from_tokenized(cls, tokens) -> "TokenIds":
        """From a bm25s ``Tokenized`` (:func:`tokenize_ids`: its flat arrays taken as they are)."""
        if isinstance(tokens.ids, _IdLists):
            return cls(tokens.ids.ids, tokens.ids.offsets, sorted(tokens.vocab, key=tokens.vocab.__getitem__))
        lengths = np.fromiter((len(d) for d in tokens.ids), dtype=np.int64, count=len(tokens.ids))
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.fromiter((t for d in tokens.ids for t in d), dtype=np.int32, count=int(offsets[-1]))
        return cls(ids, offsets, sorted(tokens.vocab, key=tokens.vocab.__getitem__))

    def __len__(self) -> int:
        return self.offsets.size - 1

    def tokenized(self):
        """A bm25s ``Tokenized`` over these arrays (ids per text made as lists when read) for
        ``bm25s.BM25.index``: the index of :func:`tokenize_ids`' output, same bytes."""
        from bm25s.tokenization import Tokenized  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

        return Tokenized(ids=_IdLists(self.ids, self.offsets), vocab={t: i for i, t in enumerate(self.terms)})

    def save(self, directory: Path) -> None:
        """``token_ids.npy``, ``token_offsets.npy``, ``vocab.parquet`` (one ``term`` per id) in ``directory``."""
        np.save(Path(directory) / self.IDS_FILE, self.ids)
        np.save(Path(directory) / self.OFFSETS_FILE, self.offsets)
        pq.write_table(pa.table({"term": pa.array(self.terms, pa.string())}), Path(directory) / self.TERMS_FILE)

    @classmethod
    def load(cls, directory: Path) -> "TokenIds":
        """Read what :meth:`save` wrote. Raises ``FileNotFoundError`` if a file is missing."""
        return cls(np.load(Path(directory) / cls.IDS_FILE), np.load(Path(directory) / cls.OFFSETS_FILE),
                   pq.read_table(Path(directory) / cls.TERMS_FILE).column("term").to_pylist())


class _IdLists(abc.Sequence):
    """``list[list[int]]`` view of flat token ids: text ``i`` becomes a list when it is read."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        bounds = self.offsets.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield self.ids[a:b].tolist()


def bm25_from_token_ids(tokens: TokenIds, cfg: BM25Config, chunk_tokens: int = 1 << 22):
    """``bm25s.BM25(k1, b, method).index(tokens)`` built from the flat arrays: the same retriever
    (same ``data``/``indices``/``indptr``/vocabulary, so the same saved bytes) as indexing
    :func:`tokenize_ids`' lists, without bm25s's per-document Python loops and without its
    per-pair sort (:func:`tasks.corpus.bm25_csc.bm25_csc`: two passes over the ids, ``chunk_tokens``
    tokens of whole texts at a time, a counting-sort CSC).

    Methods ``lucene``, ``robertson`` and ``atire``; any other method is indexed by bm25s itself
    (its lists and loops). Memory besides the token ids: the index (8 bytes a (text, term) pair)
    and ~40 bytes a vocabulary term.
    """
    from tasks.corpus.bm25_csc import array_chunks  # noqa: PLC0415  (heavy: numba kernels, only when an index is built)

    return bm25_from_token_chunks(lambda: array_chunks(tokens.ids, tokens.offsets, chunk_tokens), len(tokens),
                                  {t: i for i, t in enumerate(tokens.terms)}, cfg)


def bm25_from_token_chunks(chunks, n_texts: int, vocab: dict[str, int], cfg: BM25Config):
    """:func:`bm25_from_token_ids` over token ids read chunk by chunk (twice) from ``chunks``
    (:data:`tasks.corpus.bm25_csc.TokenChunks`), e.g. from files, so that they are never all
    in memory at once.

    Parameters
    ----------
    chunks : ``() -> iterable of (ids int32, offsets int64)`` covering ``n_texts`` texts in row order.
    n_texts : number of texts (rows of the index).
    vocab : the vocabulary, term → token id (ids ``0..V-1``); becomes the retriever's
        ``vocab_dict`` (bm25s adds its empty token ``""`` to it).
    cfg : BM25 settings (tokenizer fields unused here).

    Returns
    -------
    bm25s.BM25
        The retriever, as ``bm25s.BM25(k1, b, method).index(Tokenized(ids, vocab))`` would give.

    Raises
    ------
    ValueError
        The chunks do not hold ``n_texts`` texts, a token id is outside the vocabulary, or the
        two passes differ.
    """
    import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)
    from bm25s.scoring import _select_idf_scorer  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)
    from bm25s.tokenization import Tokenized  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

    from tasks.corpus.bm25_csc import METHODS, bm25_csc  # noqa: PLC0415  (heavy: numba kernels, only when an index is built)

    class ChunksBM25(bm25s.BM25):
        def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
            if self.method not in METHODS or self.csc_backend != "numpy" or (self.dtype, self.int_dtype) != ("float32", "int32"):
                return super().build_index_from_ids(unique_token_ids, corpus_token_ids, show_progress, leave_progress)
            data, indices, indptr, n_docs = bm25_csc(chunks, len(unique_token_ids), self.method, self.k1, self.b,
                                                     _select_idf_scorer(self.idf_method))
            if n_docs != n_texts:
                raise ValueError(f"BM25 build: {n_texts} texts but the token id chunks hold {n_docs}")
            self.nonoccurrence_array = None
            return {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}

    retriever = ChunksBM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    retriever.index(Tokenized(ids=_ChunkLists(chunks, n_texts), vocab=vocab), show_progress=False)
    return retriever


class _ChunkLists:
    """``list[list[int]]`` iteration over token id chunks, for bm25s's own build (other methods)."""

    def __init__(self, chunks, n_texts: int):
        self.chunks, self.n_texts = chunks, n_texts

    def __len__(self) -> int:
        return self.n_texts

    def __iter__(self) -> Iterator[list[int]]:
        for ids, offsets in self.chunks():
            bounds = offsets.tolist()
            for a, b in zip(bounds[:-1], bounds[1:]):
                yield ids[a:b].tolist()


class BM25Index:
    """A bm25s retriever plus the tokenizer settings and external ids it was built with."""

    def __init__(self, retriever, doc_ids: list[str], cfg: BM25Config):
        self.retriever = retriever
        self.doc_ids = doc_ids
        self.cfg = cfg
        self._stem = _stemmer(cfg.stemmer)
        self._scratch = threading.local()     # the compiled top-k's scratch arrays, made at the first search

    # ------------------------------------------------------------------ build / save / load
    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Tokens (strings) of ``texts`` with this index's lower-casing, stop words and stemmer.

        ``bm25s.tokenize(texts, ..., return_ids=False)``'s tokens (:meth:`tokenize_bm25s`, compared
        in ``tests/test_bm25_query.py``) without its per-call costs: three progress bars and a
        stop-word set built again for every text (~0.1 ms of a query searched alone). Each text
        split by :data:`TOKEN_PATTERN`, stop words dropped, the distinct tokens stemmed once.
        """
        lower, stop = self.cfg.lower, self._stopwords
        tokens = [[t for t in _SPLIT(x.lower() if lower else x) if t not in stop] for x in texts]
        if self._stem is None:
            return tokens
        distinct = list(dict.fromkeys(t for toks in tokens for t in toks))
        stems = dict(zip(distinct, self._stem(distinct)))
        return [[stems[t] for t in toks] for toks in tokens]

    def tokenize_bm25s(self, texts: Sequence[str]) -> list[list[str]]:
        """:meth:`tokenize` by ``bm25s.tokenize`` itself: the reference it is tested against."""
        import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

        return bm25s.tokenize(list(texts), lower=self.cfg.lower, token_pattern=TOKEN_PATTERN, stopwords=self.cfg.stopwords,
                              stemmer=self._stem, return_ids=False, show_progress=False)

    @cached_property
    def _stopwords(self) -> frozenset[str]:
        from bm25s.tokenization import _infer_stopwords  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

        return frozenset(_infer_stopwords(self.cfg.stopwords))

    @classmethod
    def build(cls, texts: Iterable[str], doc_ids: Sequence[str | int], cfg: BM25Config = BM25Config()) -> "BM25Index":
        """Index ``texts`` (one per retrieval unit); ``doc_ids[i]`` names row ``i``.

        Raises
        ------
        ValueError
            ``texts`` and ``doc_ids`` differ in length, or ids repeat.
        """
        import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

        texts = list(texts)
        ids = [str(i) for i in doc_ids]
        if len(texts) != len(ids):
            raise ValueError(f"BM25 build: {len(texts)} texts but {len(ids)} ids")
        if len(set(ids)) != len(ids):
            raise ValueError("BM25 build: document ids are not unique")
        index = cls(None, ids, cfg)
        # Token ids + vocabulary (bm25s ``Tokenized``): indexing from ids is ~2x faster than
        # from strings; the vocabulary is saved with the index and maps query strings.
        tokens = tokenize_ids(texts, cfg, index._stem)
        retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        retriever.index(tokens, show_progress=False)
        index.retriever = retriever
        return index

    @classmethod
    def from_token_ids(cls, tokens: TokenIds, doc_ids: Sequence[str | int], cfg: BM25Config) -> "BM25Index":
        """:meth:`build` of texts already tokenized (``tokens``: :func:`tokenize_ids`' ids and
        vocabulary as flat arrays, e.g. :func:`tasks.corpus.sharded.token_memo.memo_token_ids`): the same
        index bytes, built by :func:`bm25_from_token_ids`.

        Raises
        ------
        ValueError
            ``tokens`` and ``doc_ids`` differ in length, or ids repeat.
        """
        ids = [str(i) for i in doc_ids]
        if len(tokens) != len(ids):
            raise ValueError(f"BM25 build: {len(tokens)} texts but {len(ids)} ids")
        if len(set(ids)) != len(ids):
            raise ValueError("BM25 build: document ids are not unique")
        return cls(bm25_from_token_ids(tokens, cfg), ids, cfg)

    def save(self, directory: Path) -> Path:
        """Write the index atomically: into a temporary sibling directory, then rename."""
        with atomic_directory(Path(directory)) as tmp:
            self.retriever.save(str(tmp), show_progress=False)
            (tmp / IDS_FILE).write_text(json.dumps(self.doc_ids))
            (tmp / TOKENIZER_FILE).write_text(json.dumps(asdict(self.cfg), sort_keys=True, indent=1))
            _canonicalise_json(tmp / "vocab.index.json")
            _canonicalise_json(tmp / "params.index.json")
        return directory

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> "BM25Index":
        """Load an index saved by :meth:`save` (memory-mapped by default).

        Raises
        ------
        FileNotFoundError
            The directory or its tokenizer/id files are missing.
        """
        import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)

        directory = Path(directory)
        for name in (TOKENIZER_FILE, IDS_FILE, "params.index.json"):
            if not (directory / name).exists():
                raise FileNotFoundError(f"BM25 index {directory}: missing {name}")
        cfg = BM25Config(**json.loads((directory / TOKENIZER_FILE).read_text()))
        retriever = bm25s.BM25.load(str(directory), mmap=mmap, show_progress=False)
        ids = json.loads((directory / IDS_FILE).read_text())
        return cls(retriever, ids, cfg)

    # ------------------------------------------------------------------ search
    def search(self, queries: Sequence[str], k: int) -> tuple[list[list[str]], np.ndarray]:
        """Top-``k`` ids and BM25 scores per query.

        Returns
        -------
        ids : list of lists of str, ``(n_queries, k')`` with ``k' = min(k, n_docs)``
        scores : float32 array ``(n_queries, k')``, descending per row; ties broken by row id.
        """
        rows, scores = self.search_rows(queries, k)
        return self._id_array[rows].tolist(), scores

    @cached_property
    def _id_array(self) -> np.ndarray:
        """``doc_ids`` as an object array (8 bytes a row): rows become ids in one indexing, not a
        Python lookup each."""
        return np.array(self.doc_ids, dtype=object)

    def search_rows(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`search` but with row numbers: int ``(n_queries, k')`` and float32 scores."""
        return self.search_token_rows(self.tokenize(queries) if queries else [], k)

    def search_token_rows(self, tokens: Sequence[Sequence[str]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search_rows` of queries already tokenized by :meth:`tokenize` (a sharded index
        tokenizes once for all its shards).

        Scored by the compiled top-``k`` of :func:`tasks.corpus.bm25_query.top_k_rows` (bm25s's
        scores, ties at the ``k``-th place by row) for the methods whose scores are never negative
        (``lucene``, ``robertson``, ``atire``); one whose method adds non-occurrence scores
        (``bm25l``, ``bm25+``) or whose arrays are not float32/int32 by bm25s's own
        ``retrieve`` (:meth:`search_token_rows_bm25s`).

        Returns
        -------
        rows : int64 ``(n_queries, k')``, ``k' = min(k, n_docs)``, by score descending then row ascending.
        scores : float32 ``(n_queries, k')``.

        Raises
        ------
        ValueError
            The index's vocabulary holds a token id outside its score matrix (a corrupt index).
        """
        k = min(k, len(self.doc_ids))
        if not tokens or k == 0:
            return np.zeros((len(tokens), 0), dtype=np.int64), np.zeros((len(tokens), 0), dtype=np.float32)
        if not self.compiled_search:
            return self.search_token_rows_bm25s(tokens, k)
        from tasks.corpus.bm25_query import RunningTopK  # noqa: PLC0415  (heavy: numba kernels, only when an index is searched)

        return self.rank_into(RunningTopK(len(tokens), k), tokens).result()

    @property
    def compiled_search(self) -> bool:
        """Whether :meth:`rank_into` can search this index: a method whose scores are never
        negative (``lucene``, ``robertson``, ``atire``: not ``bm25l``/``bm25+``, which add
        non-occurrence scores) over float32 scores and int32 rows."""
        return self._csc is not None

    @cached_property
    def _csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
        """``(data, indices, indptr, n_docs)`` of the score matrix for the compiled top-k, or None
        (:attr:`compiled_search`); looked up once, not at every query of every shard."""
        scores = self.retriever.scores
        if self.retriever.method not in ("lucene", "robertson", "atire") or \
                getattr(self.retriever, "nonoccurrence_array", None) is not None or \
                (scores["data"].dtype, scores["indices"].dtype) != (np.float32, np.int32):
            return None
        return (np.asarray(scores["data"]), np.asarray(scores["indices"]), np.asarray(scores["indptr"]),
                int(scores["num_docs"]))

    def rank_into(self, top, tokens: Sequence[Sequence[str]], scratch=None):
        """Offer this index's rows, numbered on from ``top.n_rows``, to the running top-k ``top``
        (:class:`tasks.corpus.bm25_query.RunningTopK`: one index, or each shard of a sharded one
        in turn) for queries already tokenized by :meth:`tokenize`; returns ``top``. ``scratch``:
        a :class:`tasks.corpus.bm25_query.Scratch` of this index's rows or more that no other
        thread uses meanwhile (a sharded index passes one for all its shards), or None: this
        index's own, one per thread.

        Raises
        ------
        ValueError
            The index's vocabulary holds a token id outside its score matrix (a corrupt index), or
            the index has no compiled search (:attr:`compiled_search`).
        """
        csc = self._csc
        if csc is None:
            raise ValueError(f"BM25 search: method {self.retriever.method!r} has no compiled top-k")
        vocab = self.retriever.vocab_dict
        # Out-of-vocabulary tokens cannot match; a query left with no token scores every
        # document 0 and returns the first k rows (deterministic).
        ids = [[vocab[t] for t in toks if t in vocab] for toks in tokens]
        if scratch is None:
            scratch = getattr(self._scratch, "value", None)      # one per thread: searches may run in threads
        if scratch is None:
            from tasks.corpus.bm25_query import Scratch  # noqa: PLC0415  (heavy: numba kernels, only when an index is searched)

            scratch = self._scratch.value = Scratch(csc[3])
        return top.add(ids, *csc, scratch)

    def search_token_rows_bm25s(self, tokens: Sequence[Sequence[str]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search_token_rows` by bm25s's ``retrieve`` (its numpy backend: dense scores, then
        ``argpartition``), rows then sorted by (score desc, row asc). The reference the compiled
        path is tested against; where several documents tie at the ``k``-th score, which of them
        are kept is bm25s's (arbitrary) choice."""
        k = min(k, len(self.doc_ids))
        vocab = self.retriever.vocab_dict
        tokens = [[t for t in toks if t in vocab] for toks in tokens]
        rows = np.tile(np.arange(k), (len(tokens), 1))
        scores = np.zeros((len(tokens), k), dtype=np.float32)
        live = [i for i, t in enumerate(tokens) if t]
        if live and k:
            # n_threads=0: bm25s's serial map; n_threads=1 starts a thread pool per call (~1-6 ms a query,
            # the larger part of BM25 over the clusters), with the same top-k function and results
            r, sc = self.retriever.retrieve([tokens[i] for i in live], k=k, show_progress=False, n_threads=0)
            rows[live], scores[live] = np.asarray(r), np.asarray(sc, dtype=np.float32)
        return _stable_order(rows, scores)

    def __len__(self) -> int:
        return len(self.doc_ids)


def _stable_order(rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each row by (score desc, row id asc) so equal scores come back deterministically."""
    order = np.lexsort((rows, -scores), axis=-1)
    return np.take_along_axis(rows, order, -1), np.take_along_axis(scores, order, -1)


def _canonicalise_json(path: Path) -> None:
    if path.exists():
        path.write_text(json.dumps(json.loads(path.read_text()), sort_keys=True))
