"""BM25 passage index in shards with corpus-wide statistics, searched with a top-k merge.

BM25 scores (Robertson/Lucene) depend on three corpus-wide quantities: the number of documents
``N``, the document frequency ``df(t)`` of each term (through ``idf(t)``) and the average document
length ``avgdl`` (through the length normalisation). A shard indexed alone would use its own, and
its scores would not be comparable with another shard's. Here every shard is built in two
steps: :func:`shard_stats` counts a shard's ``df``, lengths and documents; the coordinator sums
them (:func:`merge_stats`); :func:`build_shard` then indexes the shard's passages with the
*global* ``N``, ``df`` and ``avgdl``, so each stored score ``idf(t) * tfc(t, d)`` is exactly the one
a single index over all passages would store. :class:`ShardedBM25` scores the shards in turn into
one running top ``k`` a query, ranked by (score desc, global row asc) — the single index's order.

In the corpus build (``index.passage_shard_tokens`` > 0, :func:`build_passage_shards`) a shard is a
range of whole clusters of ``passages.parquet`` cut by tokens with content-defined cuts
(:func:`tasks.corpus.sharded.shards.cluster_ranges`). Its passages are tokenized by the passage
token shards the one index uses too (:mod:`tasks.corpus.sharded.passage_tokens`: the ids kept in
the stage cache, each passage the token memo holds taken from it; the worker that keeps a shard's
ids counts its ``df`` too and keeps it in the same entry); the coordinator sums the shards' small
``df`` files and their ``N`` and lengths (:func:`merge_token_shard_stats`), reading no token id; each shard
is then indexed from its kept ids (:func:`passage_index_shard`). Both per-shard steps run through
``submit(fn, *args) -> future`` (the index stage's pool) and the published
``index/passages.bm25/`` holds ``shards.json``, ``global_stats.json`` and ``shard-00000/``, ….
:func:`load_passage_index` opens either layout.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.base import atomic_write_bytes, link_or_copy, replace_file, sha256_file, temp_file_beside
from data_contracts.corpus import PASSAGES
from funnelrag.content_store import keys_digest
from funnelrag.store import mark_used
from funnelrag.verify import DIGESTS_FILE, verified_entry
from tasks.corpus.index import BM25Config, BM25Index, TokenIds, _stemmer, tokenize_ids
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.cluster_index import DF_FILE
from tasks.corpus.sharded.passage_tokens import PassageTokenShards
from tasks.corpus.sharded.shards import ordered_results, put_cached, read_rows
from tasks.corpus.sharded.token_memo import write_token_memo

STATS_FILE = "global_stats.json"
SHARDS_FILE = "shards.json"


@dataclass(frozen=True)
class IndexLayout:
    """Layout of the published passage index (config section ``index``).

    passage_shard_tokens : the most tokens (``clusters.parquet`` ``n_tokens``, T5 tokens) of one
        passage BM25 shard. 0 (default): one bm25s index in ``index/passages.bm25/``, the layout
        and bytes of an unsharded build. ``> 0``: ranges of whole clusters cut by tokens with
        content-defined cuts (:func:`tasks.corpus.sharded.shards.cluster_ranges`: ``passage_shard_tokens / 2``
        to ``passage_shard_tokens`` tokens a shard, so a worker's memory is bounded whatever the
        dump's size, and an edited page moves no other shard), indexed with corpus-wide statistics
        as shards of the index stage; search results equal the single index's. An explicit setting
        rather than one derived from ``runner``: it changes the published files (and the content
        digest), which no runner setting may.
    """

    passage_shard_tokens: int = 0

    def __post_init__(self) -> None:
        if self.passage_shard_tokens < 0:
            raise ValueError(f"index.passage_shard_tokens must be >= 0 (0 = one passage index), "
                             f"got {self.passage_shard_tokens}")

    @property
    def sharded(self) -> bool:
        """Whether the passage index is built in shards."""
        return self.passage_shard_tokens > 0


@dataclass
class CorpusStats:
    """Term statistics of a set of passages: documents, summed token lengths, ``df`` per stem."""

    n_docs: int
    total_len: int
    df: dict[str, int]

    @property
    def avg_doc_len(self) -> float:
        """Mean tokens per passage, as bm25s computes it (``np.mean`` of the lengths)."""
        return self.total_len / self.n_docs if self.n_docs else 0.0


def shard_stats(texts: Sequence[str], cfg: BM25Config) -> CorpusStats:
    """``N``, total length and ``df`` of one shard's passages (tokenized as the index will be)."""
    tokens = tokenize_ids(texts, cfg, _stemmer(cfg.stemmer))
    inverse = sorted(tokens.vocab, key=tokens.vocab.__getitem__)
    df: Counter[int] = Counter()
    total = 0
    for doc in tokens.ids:
        df.update(set(doc))
        total += len(doc)
    return CorpusStats(len(tokens.ids), total, {inverse[t]: c for t, c in df.items()})


def merge_stats(parts: Sequence[CorpusStats]) -> CorpusStats:
    """Corpus-wide statistics: sums over the shards (order-independent)."""
    df: Counter[str] = Counter()
    for p in parts:
        df.update(p.df)
    return CorpusStats(sum(p.n_docs for p in parts), sum(p.total_len for p in parts), dict(df))


def _global_bm25(cfg: BM25Config, stats: CorpusStats, vocab: dict[str, int]):
    import bm25s  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)
    from bm25s.scoring import (_build_idf_array, _build_scores_and_indices_for_matrix,  # noqa: PLC0415  (heavy: bm25s, only when an index is built or searched)
                               _calculate_doc_freqs, _select_idf_scorer)

    class GlobalBM25(bm25s.BM25):
        """bm25s BM25 whose idf and length normalisation use corpus-wide statistics."""

        def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):
            if self.method in self.methods_requiring_nonoccurrence:
                raise ValueError(f"sharded BM25: method {self.method!r} is not supported (use lucene/robertson/atire)")
            local_df = _calculate_doc_freqs(corpus_tokens=corpus_token_ids, unique_tokens=unique_token_ids,
                                            show_progress=False)
            inverse = sorted(vocab, key=vocab.__getitem__)
            global_df = {i: stats.df[inverse[i]] for i in unique_token_ids}
            idf = _build_idf_array(doc_frequencies=global_df, n_docs=stats.n_docs,
                                   compute_idf_fn=_select_idf_scorer(self.idf_method), dtype=self.dtype)
            scores_flat, doc_idx, vocab_idx = _build_scores_and_indices_for_matrix(
                corpus_token_ids=corpus_token_ids, idf_array=idf, avg_doc_len=np.float64(stats.avg_doc_len),
                doc_frequencies=local_df, k1=self.k1, b=self.b, delta=self.delta, show_progress=False,
                dtype=self.dtype, int_dtype=self.int_dtype, method=self.method, nonoccurrence_array=None)
            n_docs = len(corpus_token_ids)
            data, indices, indptr = self._np_csc(data=scores_flat, rows=doc_idx, cols=vocab_idx,
                                                 shape=(n_docs, len(unique_token_ids)))
            self.nonoccurrence_array = None
            return {"data": data.astype(self.dtype), "indices": indices, "indptr": indptr, "num_docs": n_docs}

    return GlobalBM25(k1=cfg.k1, b=cfg.b, method=cfg.method, csc_backend="numpy")


def build_shard(texts: Sequence[str], doc_ids: Sequence[str], cfg: BM25Config, stats: CorpusStats) -> BM25Index:
    """Index one shard's passages with the corpus-wide ``stats`` (from :func:`merge_stats`).

    Raises ``ValueError`` if a shard term is missing from ``stats`` (stats of other passages).
    """
    texts = list(texts)
    return build_shard_from_ids(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)), doc_ids, cfg, stats)


def build_shard_from_ids(tokens, doc_ids: Sequence[str], cfg: BM25Config, stats: CorpusStats) -> BM25Index:
    """:func:`build_shard` of passages already tokenized by :func:`tasks.corpus.index.tokenize_ids`
    (a bm25s ``Tokenized``: ids per passage and the shard's vocabulary); same index."""
    ids = [str(i) for i in doc_ids]
    if len(tokens.ids) != len(ids):
        raise ValueError(f"BM25 shard: {len(tokens.ids)} texts but {len(ids)} ids")
    index = BM25Index(None, ids, cfg)
    missing = [t for t in tokens.vocab if t not in stats.df]
    if missing:
        raise ValueError(f"BM25 shard: terms {missing[:5]} are not in the corpus statistics (stats of other passages?)")
    retriever = _global_bm25(cfg, stats, tokens.vocab)
    retriever.index(tokens, show_progress=False)
    index.retriever = retriever
    return index


def save_stats(stats: CorpusStats, directory: Path) -> None:
    """``global_stats.json``: ``N`` and total length (the ``df`` table lives in the shards' scores)."""
    atomic_write_bytes(Path(directory) / STATS_FILE, (json.dumps({"n_docs": stats.n_docs, "total_len": stats.total_len}) + "\n").encode())


class ShardedBM25:
    """Top-``k`` search over passage shards (``shard-00000``, … under one directory)."""

    def __init__(self, shards: list[BM25Index]):
        self.shards = shards
        self.offsets = np.cumsum([0] + [len(s) for s in shards])
        self._scratch = threading.local()     # one scratch of the largest shard's rows for all shards, per thread

    @classmethod
    def load(cls, directory: Path, mmap: bool = True) -> "ShardedBM25":
        """Load the shards listed in ``shards.json``. Raises ``FileNotFoundError`` if it is missing."""
        names = json.loads((Path(directory) / SHARDS_FILE).read_text())
        return cls([BM25Index.load(Path(directory) / n, mmap=mmap) for n in names])

    @cached_property
    def doc_ids(self) -> list[str]:
        """Row → external id over all shards (shard order, then row within the shard)."""
        return [i for s in self.shards for i in s.doc_ids]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def search(self, queries: Sequence[str], k: int) -> tuple[list[list[str]], np.ndarray]:
        """Top-``k`` ids and scores per query over all shards: ``(n_queries, min(k, N))``,
        ordered by score descending then global row (shard order, row within shard)."""
        rows, scores = self.search_rows(queries, k)
        return self._id_array[rows].tolist(), scores

    @cached_property
    def _id_array(self) -> np.ndarray:
        """:attr:`doc_ids` as an object array: rows become ids in one indexing."""
        return np.array(self.doc_ids, dtype=object)

    def search_rows(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`search` with global row numbers: int ``(n_queries, k')`` and float32 scores.

        The queries are tokenized once (every shard has the corpus's tokenizer); each shard in
        turn offers its rows to one running top-``k`` a query
        (:class:`tasks.corpus.bm25_query.RunningTopK`), whose worst score so far is the bar the
        next shard's rows must beat: no per-shard top-``k`` and no merge sort. Every shard scores
        into the same scratch arrays (the largest shard's rows, one set per thread), so a query
        searched alone finds them in the cache from one shard to the next. The same rows and
        scores as one index over all passages, ties included (``tests/test_sharded_index.py``).

        Raises
        ------
        ValueError
            A shard without the compiled search (a method adding non-occurrence scores, which
            :func:`build_shard` refuses).
        """
        from tasks.corpus.bm25_query import RunningTopK, Scratch  # noqa: PLC0415  (heavy: numba kernels, only when an index is searched)

        k = min(k, len(self))
        if not queries or k == 0:
            return np.zeros((len(queries), 0), dtype=np.int64), np.zeros((len(queries), 0), dtype=np.float32)
        tokens = self.shards[0].tokenize(queries)
        scratch = getattr(self._scratch, "value", None)
        if scratch is None:
            scratch = self._scratch.value = Scratch(max(len(s) for s in self.shards))
        top = RunningTopK(len(queries), k)
        for shard in self.shards:
            shard.rank_into(top, tokens, scratch)
        return top.result()


def load_passage_index(directory: Path, mmap: bool = True) -> "BM25Index | ShardedBM25":
    """The passage index in ``directory``: a :class:`ShardedBM25` when it holds ``shards.json``,
    else a :class:`tasks.corpus.index.BM25Index` (same ``search`` / ``search_rows`` / ``doc_ids``)."""
    if (Path(directory) / SHARDS_FILE).exists():
        return ShardedBM25.load(directory, mmap=mmap)
    return BM25Index.load(directory, mmap=mmap)


# --------------------------------------------------------------------- the corpus build's shards
PASSAGE_SHARD_VERSION = "5"   # 5: indexes the ids kept by the passage token shards (keyed on their key and the passage ids)
SHARDS_DIR = "passage-shards"


def merge_token_shard_stats(shard_dirs: Sequence[Path], work_dir: Path) -> tuple[list[int], int, Path, str]:
    """Corpus-wide statistics of the passage token shards (coordinator): each shard's ``df``, which
    the worker that kept its ids counted (:data:`tasks.corpus.sharded.cluster_index.DF_FILE`, int64
    per term of the shard's vocabulary), summed by term into
    ``work_dir/passage-shards/global-<sha256>.parquet`` (``term``, ``df``; term-sorted, so equal
    statistics give equal bytes); ``N`` and the total length from the shards' offsets.

    Returns ``(passages per shard, total tokens, the df file, the key of the global statistics)``
    (sha256 over the file, ``N`` and the total length). No token id is read.

    Cost: the shards' ``(term, df)`` rows are summed (Arrow's hash ``group_by``) whenever the rows
    waiting reach the merged vocabulary's size, so every row is summed a bounded number of times:
    O(sum of the shards' vocabularies), not O(shards x vocabulary) as merging shard by shard
    (~140 passage shards of the full English dump). Memory: at most about twice the global
    vocabulary's rows plus one shard's.

    Raises
    ------
    ValueError
        A shard's ``df`` file does not hold one count a term of its vocabulary.
    """
    merged = pa.table({"term": pa.array([], pa.string()), "df": pa.array([], pa.int64())})
    waiting: list[pa.Table] = []
    n_waiting = 0
    n_docs: list[int] = []
    total_len = 0

    def summed(tables: list[pa.Table]) -> pa.Table:
        s = pa.concat_tables(tables).group_by("term").aggregate([("df", "sum")])
        return pa.table({"term": s.column("term"), "df": s.column("df_sum")})

    for d in shard_dirs:
        offsets, df = np.load(Path(d) / TokenIds.OFFSETS_FILE, mmap_mode="r"), np.load(Path(d) / DF_FILE)
        terms = pq.read_table(Path(d) / TokenIds.TERMS_FILE).column("term")
        if df.shape != (len(terms),):
            raise ValueError(f"passage token shard {d}: {DF_FILE} holds {df.shape} counts for {len(terms)} terms")
        n_docs.append(offsets.size - 1)
        total_len += int(offsets[-1])
        waiting.append(pa.table({"term": terms, "df": pa.array(df, pa.int64())}))
        n_waiting += len(terms)
        if n_waiting >= merged.num_rows:
            merged, waiting, n_waiting = summed([merged, *waiting]), [], 0
    if waiting:
        merged = summed([merged, *waiting])
    merged = merged.sort_by("term")
    (Path(work_dir) / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    with temp_file_beside(Path(work_dir) / SHARDS_DIR / "global.parquet") as tmp:   # named by its digest
        pq.write_table(merged.select(["term", "df"]), tmp)
        digest = sha256_file(tmp)
        final = tmp.with_name(f"global-{digest}.parquet")
        replace_file(tmp, final)
    global_key = hashlib.sha256(json.dumps([digest, sum(n_docs), total_len]).encode()).hexdigest()
    return n_docs, total_len, final, global_key


def passage_index_shard(segment_dir: str, lo: int, hi: int, cfg: BM25Config, work_dir: str, tokens_dir: str,
                        global_df: str, n_docs: int, total_len: int, global_key: str) -> tuple[str, bool]:
    """One passage shard's index (a worker-process call): :func:`build_shard_from_ids` of the
    passages in rows ``[lo, hi)`` of ``passages.parquet`` (the token ids their passage token shard
    kept in ``tokens_dir``, :func:`tasks.corpus.sharded.passage_tokens.passage_token_shard`) with
    the corpus-wide statistics, saved in ``work_dir/passage-shards/<sha256 of (token shard, passage
    ids, global statistics)>/``.

    Returns ``(index directory, reused)``. A shard index is reused only when its passages *and*
    the global ``N``, ``df`` and ``avgdl`` are unchanged: any changed page changes the global
    statistics, so then every shard is re-indexed (only the token shards of unchanged passages
    are reused).

    Raises
    ------
    ValueError
        The kept ids are not one list a passage, or a shard term is missing from ``global_df``.
    """
    ids = [str(i) for i in read_rows(Path(segment_dir) / PASSAGES.filename, lo, hi, ["passage_id"])
           .column("passage_id").to_pylist()]
    key = keys_digest(PASSAGE_SHARD_VERSION, [Path(tokens_dir).name, global_key], ids, np.zeros((0, 2), np.uint64))
    cached = Path(work_dir) / SHARDS_DIR / key
    if verified_entry(cached):
        mark_used(cached)
        return str(cached), True
    tokens = TokenIds.load(Path(tokens_dir))
    if len(tokens) != len(ids):
        raise ValueError(f"BM25 shard {lo}..{hi - 1}: {len(ids)} passages but {len(tokens)} kept token id lists in {tokens_dir}")
    table = pq.read_table(global_df)
    at = pc.index_in(pa.array(tokens.terms, pa.string()), value_set=table.column("term"))
    if at.null_count:
        raise ValueError(f"BM25 shard {lo}..{hi - 1}: terms missing from the global statistics {global_df}")
    df = dict(zip(tokens.terms, table.column("df").take(at).to_pylist()))
    shard = build_shard_from_ids(tokens.tokenized(), ids, cfg, CorpusStats(n_docs, total_len, df))
    put_cached(cached, shard.save)
    return str(cached), False


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy across devices) every file of the cache entry ``src`` into ``dst``, but
    its digest manifest (:data:`funnelrag.verify.DIGESTS_FILE`)."""
    for path in sorted(src.rglob("*")):
        if path.relative_to(src).as_posix() == DIGESTS_FILE:
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            link_or_copy(path, target)


def build_passage_shards(segment_dir: Path, cluster_dir: Path, out_dir: Path, cfg: BM25Config, shard_tokens: int,
                         submit: Callable[..., Any], work_dir: Path, window: int = 8, *, ingest_dir: Path,
                         tokens_dir: Path | None = None, passage_words: int = SegmentConfig.passage_words) -> dict[str, Any]:
    """The sharded passage index of a corpus build in ``out_dir`` (``shards.json``,
    ``global_stats.json``, ``shard-00000/``, …): the passage token shards through ``submit``
    (:class:`tasks.corpus.sharded.passage_tokens.PassageTokenShards`, as for the one index) →
    :func:`merge_token_shard_stats` → :func:`passage_index_shard` per shard through ``submit``.

    Shards are the passages of the cluster ranges of :func:`tasks.corpus.sharded.shards.read_cluster_ranges` over
    ``cluster_dir`` with at most ``shard_tokens`` tokens each (a cluster's passages hold its
    tokens: the correlation of passages and ``n_tokens`` per cluster is 0.9998 at 1M pages), so
    a worker's peak memory is bounded by ``shard_tokens``, not by the dump.

    ``work_dir`` (shared by the workers: the stage cache) keeps the shards' token ids and shard
    indexes keyed by content. What a rebuild reuses: the token ids of every shard whose passages
    are unchanged (in a changed shard, of each passage the token memo holds); shard indexes only
    when the global statistics are equal too (a changed page changes ``df``/``N``/``avgdl`` and
    with them every stored score). Shards without passages (clusters whose articles have no words)
    are left out. Each shard's passages are read and tokenized once. Summary: shard counts, reuse,
    seconds. ``ingest_dir``, ``tokens_dir``, ``passage_words``: where the passages' derived keys
    come from (:meth:`tasks.corpus.sharded.passage_tokens.PassageTokenShards.plan`). Raises
    ``ValueError`` as :func:`tasks.corpus.sharded.shards.passage_row_ranges` does.
    """
    t0 = time.perf_counter()
    tokens = PassageTokenShards.plan(segment_dir, cluster_dir, ingest_dir, cfg, work_dir, shard_tokens, keep_df=True,
                                     tokens_dir=tokens_dir, passage_words=passage_words)
    shard_dirs, summary = tokens.collect(ordered_results(submit, tokens.calls, window, "passage token shards"))
    counts, total_len, global_df, global_key = merge_token_shard_stats(shard_dirs, work_dir)
    kept = [(r, d) for r, d, n in zip(tokens.ranges, shard_dirs, counts) if n > 0]
    n_docs = sum(counts)
    t1 = time.perf_counter()
    calls = [(passage_index_shard, str(segment_dir), lo, hi, cfg, str(work_dir), str(d), str(global_df), n_docs,
              total_len, global_key) for (lo, hi), d in kept]
    names = [f"shard-{k:05d}" for k in range(len(kept))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reused = 0
    for name, (path, hit) in zip(names, ordered_results(submit, calls, window, "passage index shards")):
        _link_tree(Path(path), out_dir / name)
        reused += hit
    (out_dir / SHARDS_FILE).write_text(json.dumps(names) + "\n")
    save_stats(CorpusStats(n_docs, total_len, {}), out_dir)
    t2 = time.perf_counter()
    write_token_memo(tokens.memo_dir, shard_dirs)
    return {**summary, "passage_token_memo_seconds": time.perf_counter() - t2,
            "passage_shards": len(kept), "passage_index_docs": n_docs,
            "passage_index_shards_built": len(kept) - reused, "passage_index_shards_reused": reused,
            "passage_stats_seconds": t1 - t0, "passage_shard_index_seconds": t2 - t1}
