"""The BM25 cluster index, its tokenization in cluster-range shards on worker processes.

The cluster index is one bm25s index over every cluster's text (its members' ``title\\ntext``
joined in cluster order, :func:`cluster_texts`): ~all article text of the dump. Tokenizing it is
most of its cost and holding it is most of the coordinator's memory, so it is split by ranges of
whole clusters (the segment shards' :func:`tasks.corpus.sharded.shards.cluster_ranges`):
:func:`cluster_token_shard` (a worker-process call through ``submit``) reads its clusters' member
documents, tokenizes their texts with :func:`tasks.corpus.index.tokenize_ids` and keeps the token
ids with the shard's own vocabulary (:class:`tasks.corpus.index.TokenIds`) in the work directory,
keyed by the sha256 of the texts, so an unchanged shard is reused by the next build. A changed
shard tokenizes only the members the last build did not see: each member's ``title\ntext`` takes
its terms from the token memo (:mod:`tasks.corpus.sharded.token_memo`, rewritten after each build).

:func:`merge_vocabularies` gives the vocabulary the one-process tokenization of all texts gives:
:func:`tasks.corpus.index.tokenize_ids` numbers stems in sorted order (the sorted union of the
shards' stems), or without a stemmer raw tokens by first occurrence (shards in cluster order, each
shard's tokens in its own first-occurrence order). Token ids are per-token maps (split, lower-case,
stop words, stem), so remapping each shard's ids to the global vocabulary gives exactly the ids of
the one-process path, and bm25s builds the same index from them: the saved files are
byte-identical to ``BM25Index.build(cluster_texts(...))`` (``tests/test_cluster_index.py``).

What the coordinator holds: the members table (3 integers a document), the union of the shards'
vocabularies as they come in (:class:`VocabularyMerge`), then the global vocabulary, each shard's
local → global id map (4 bytes a shard term) and the index arrays as they are built
(:func:`tasks.corpus.index.bm25_from_token_chunks`: 8 bytes a (cluster, term) pair, ~40 bytes a
term); the token ids are read back from the work directory one shard at a time, twice (document
frequencies, then scores). No article text (one shard's at a time when ``submit`` runs in this
process).
"""
from __future__ import annotations

import time
from pathlib import Path
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts import corpus as C
from funnelrag.store import mark_used
from funnelrag.verify import verified_entry
from tasks.corpus.bm25_csc import doc_freqs
from tasks.corpus.index import BM25Config, BM25Index, TokenIds, bm25_from_token_chunks
from funnelrag.content_store import JoinedTexts, keys_digest
from tasks.corpus.sharded.token_memo import (PIECES_JOIN, TermUnion, memo_token_ids, open_token_memo, positions_in,
                                             token_memo_dir, write_token_memo)
from tasks.corpus.segment import check_members
from tasks.corpus.sharded.piece_keys import member_keys
from tasks.corpus.sharded.shards import document_text_keys
from tasks.corpus.sharded.shards import (ROW, DocumentSplit, member_cluster_ranks, ordered_results, put_cached,
                                         read_cluster_members, read_cluster_ranges, read_shard_documents)

DF_FILE = "doc_freqs.npy"
"""A token shard's document frequencies (:func:`kept_token_ids` with ``keep_df``): int64, one a vocabulary term."""
CLUSTER_TOKENS_VERSION = "4"   # 2: keyed on member pieces, the shard keeps its part of the token memo; 3: keyed on their text keys;
# 4: on member keys derived from the documents' text keys (tasks/corpus/sharded/piece_keys.py)


def cluster_pieces(documents: pa.Table, cluster_members: pa.Table) -> tuple[list[str], JoinedTexts, np.ndarray]:
    """``(cluster ids as str, pieces, group offsets)``: each member's ``title\ntext`` in cluster
    order, as :class:`funnelrag.content_store.JoinedTexts` over ``documents``' columns (never joined or
    reordered as a whole: a memo lookup hashes them from the columns' buffers and only the texts
    the memo lacks become Python strings); cluster ``g``'s text is pieces
    ``offsets[g]:offsets[g + 1]`` joined by blank lines (:func:`cluster_texts`).

    ``documents`` holds at least the members' documents (``doc_id``, ``title``, ``text``; all of
    them or a subset); raises ``ValueError`` if a member's document is missing."""
    members = cluster_members.take(C.member_order(cluster_members.column("cluster_id").to_numpy(),
                                                  cluster_members.column("position").to_numpy()))
    try:
        rows = C.rows_of(documents.column("doc_id").to_numpy(), members.column("doc_id").to_numpy(), "documents")
    except ValueError:
        raise ValueError("cluster texts: cluster members refer to documents that are not in the documents table") from None
    pieces = JoinedTexts(documents.column("title"), documents.column("text"), "\n", rows)
    cids = members.column("cluster_id").to_numpy()
    starts = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1]]) if cids.size else np.zeros(0, np.int64)
    offsets = np.append(starts, cids.size).astype(np.int64)
    return [str(int(cids[a])) for a in starts.tolist()], pieces, offsets


def cluster_texts(documents: pa.Table, cluster_members: pa.Table) -> tuple[list[str], list[str]]:
    """``(cluster ids as str, texts)``: each cluster's members' ``title\ntext`` joined in
    cluster order — the coarse retrieval units of the progressive path.

    ``documents`` holds at least the members' documents (``doc_id``, ``title``, ``text``; all of
    them or a subset); raises ``ValueError`` if a member's document is missing."""
    ids, pieces, offsets = cluster_pieces(documents, cluster_members)
    pieces = pieces.to_pylist()
    return ids, [PIECES_JOIN.join(pieces[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def cluster_token_shard(ingest_dir: str, cluster_dir: str, lo: int, hi: int, cfg: BM25Config,
                        work_dir: str, docs_dir: str, memo_dir: str | None = None,
                        tokens_dir: str | None = None) -> tuple[list[str], pa.Array, str, bool, int]:
    """Token ids of the cluster texts of the clusters of ranks ``lo <= rank < hi`` (a worker-process
    call), kept in ``work_dir/cluster-tokens/<sha256 of the shard's cluster ids and pieces>/``
    (:meth:`tasks.corpus.sharded.token_memo.MemoTokens.save`).

    Reads only the shard's members and their documents (``docs_dir``, the shard's partition by
    :func:`tasks.corpus.sharded.shards.partition_documents`). Each member's
    ``title\ntext`` takes its terms from the token memo ``memo_dir`` when the last build saw it
    (:func:`tasks.corpus.sharded.token_memo.memo_token_ids`); only the others are tokenized. A
    member's key is derived from its document's title and text key
    (:func:`tasks.corpus.sharded.piece_keys.member_keys`; the text keys the tokens stage kept in
    ``tokens_dir``, else hashed here), not hashed from the piece's bytes. Returns
    ``(cluster ids as str, the shard's vocabulary in id order (Arrow strings), key, reused, members taken from
    the memo)``; ``reused`` when the shard's texts are unchanged since a build that kept them."""
    members = read_cluster_members(Path(cluster_dir), lo, hi)
    docs = read_shard_documents(docs_dir)
    ids, pieces, offsets = cluster_pieces(docs, members)
    text_keys = document_text_keys(tokens_dir, docs.column(ROW).to_numpy(), lambda: docs.column("text"))
    piece_keys = member_keys(docs.column("title"), text_keys)[pieces.rows]   # the shard's cache key and the memo lookup
    key = keys_digest(CLUSTER_TOKENS_VERSION, asdict(cfg), [*ids, *map(str, offsets.tolist())], piece_keys)
    terms, reused, from_memo = kept_token_ids(Path(work_dir) / "cluster-tokens" / key, pieces, piece_keys, cfg,
                                              memo_dir, offsets)
    return ids, terms, key, reused, from_memo


def kept_token_ids(cached: Path, pieces: JoinedTexts, keys: np.ndarray, cfg: BM25Config, memo_dir: str | None,
                   group_offsets: np.ndarray | None = None, keep_df: bool = False) -> tuple[list[str], bool, int]:
    """A token shard's ids kept in the cache entry ``cached`` (a worker-process step): the entry
    when it is there and verified, else the texts made of ``pieces`` (``group_offsets``: as
    :func:`tasks.corpus.sharded.token_memo.memo_token_ids`) tokenized, each piece the token memo
    ``memo_dir`` holds taken from it, and saved there
    (:meth:`tasks.corpus.sharded.token_memo.MemoTokens.save`, its part of the next memo beside).
    ``keep_df``: the entry also holds :data:`DF_FILE`, int64 ``(V,)`` documents holding each term
    of the shard's vocabulary in its id order (:func:`tasks.corpus.bm25_csc.doc_freqs` over the kept
    ids), covered by the entry's digests like its other files (the caller's key must say so).

    Returns ``(the shard's vocabulary in id order, reused, pieces taken from the memo)``; the
    vocabulary an Arrow string array, so that it reaches the coordinator (:class:`VocabularyMerge`)
    without a Python string a term."""
    if verified_entry(cached):
        mark_used(cached)
        return pq.read_table(cached / TokenIds.TERMS_FILE).column("term").combine_chunks(), True, len(pieces)
    memo, memo_terms = open_token_memo(memo_dir)
    found = memo_token_ids(pieces, cfg, memo, memo_terms, group_offsets, keys)

    def write(tmp: Path) -> None:
        found.save(tmp)
        if keep_df:
            tokens = found.tokens
            np.save(tmp / DF_FILE, doc_freqs(lambda: [(tokens.ids, tokens.offsets)], len(tokens.terms))[0])
        (tmp / "COMPLETE").write_text(f"{len(found.tokens)}\n")
    cached.parent.mkdir(parents=True, exist_ok=True)
    put_cached(cached, write)
    return pa.array(found.tokens.terms, pa.string()), False, found.reused


class VocabularyMerge:
    """The vocabulary :func:`tasks.corpus.index.tokenize_ids` gives all parts' texts in one call,
    from the parts' own vocabularies added in text order; holds only the union (Arrow strings),
    not the parts.

    ``sorted_terms`` (stemming): ids in sorted term order, known once every part is added
    (:meth:`finish`); else first-occurrence order (parts in text order, each part's terms in its
    own id order, which is its first-occurrence order).

    The parts are merged in Arrow (:class:`tasks.corpus.sharded.token_memo.TermUnion`) and
    looked up in batches (:meth:`lookups`): O(sum of the parts' vocabularies) in C++, not a Python
    dict operation a term of every part (~230 cluster token shards of ~1M terms each for the
    English dump). Only the global vocabulary becomes Python strings (:meth:`finish`: bm25s keeps
    its vocabulary as a dict).
    """

    def __init__(self, sorted_terms: bool):
        self.sorted_terms = sorted_terms
        self._union: TermUnion | None = TermUnion()
        self.terms: pa.Array | None = None
        self.vocab: dict[str, int] = {}

    def add(self, part: Sequence[str] | pa.Array) -> None:
        """Add one part's vocabulary (its terms in its id order). Raises ``RuntimeError`` after :meth:`finish`."""
        if self._union is None:
            raise RuntimeError("VocabularyMerge.add after finish")
        self._union.add(part if isinstance(part, pa.Array) else pa.array(list(part), pa.string()))

    def finish(self) -> dict[str, int]:
        """The global vocabulary, term → id (ids ``0..V-1`` in insertion order)."""
        if self._union is not None:
            terms = self._union.terms()
            self.terms = terms.take(pc.array_sort_indices(terms)) if self.sorted_terms else terms
            self._union = None
            self.vocab = {t: i for i, t in enumerate(self.terms.to_pylist())}
        return self.vocab

    def lookups(self, parts: Iterable[Sequence[str] | pa.Array]) -> list[np.ndarray]:
        """Per part (in order), int32 ``(len(part),)``: its local id → global id (after :meth:`finish`),
        the parts looked up in batches (:func:`tasks.corpus.sharded.token_memo.positions_in`).
        Raises ``KeyError`` for a term that no added part holds."""
        self.finish()
        return list(positions_in(self.terms, (p if isinstance(p, pa.Array) else pa.array(list(p), pa.string()) for p in parts)))

    def lookup(self, part: Sequence[str] | pa.Array) -> np.ndarray:
        """:meth:`lookups` of one part."""
        return self.lookups([part])[0]


def merge_vocabularies(parts: Sequence[list[str]], sorted_terms: bool) -> tuple[list[str], list[np.ndarray]]:
    """The vocabulary of all parts' texts as :func:`tasks.corpus.index.tokenize_ids` numbers it
    when tokenizing them in one call, and each part's map from its own ids to it
    (:class:`VocabularyMerge` over ``parts``).

    Parameters
    ----------
    parts : each part's vocabulary in its id order (``TokenIds.terms``), parts in text order.
    sorted_terms : True when stemming (ids in sorted stem order), False for first-occurrence order.

    Returns
    -------
    terms : the global vocabulary in id order.
    lookups : per part, int32 ``(len(part),)``: local id → global id.
    """
    merge = VocabularyMerge(sorted_terms)
    for part in parts:
        merge.add(part)
    return list(merge.finish()), merge.lookups(parts)


def index_from_token_shards(shard_dirs: Sequence[Path], doc_ids: list[str], merge: VocabularyMerge,
                            cfg: BM25Config, name: str = "cluster index") -> BM25Index:
    """The index (clusters, or passages: :mod:`tasks.corpus.sharded.passage_tokens`) from the
    shards' kept token ids (:meth:`tasks.corpus.index.TokenIds.save`, shards in row order) and
    their merged vocabularies, reading one shard's ids at a time.

    Parameters
    ----------
    shard_dirs : the shards' directories, in row order.
    doc_ids : the index rows' ids (as str), in order.
    merge : every shard's vocabulary added, in shard order.
    cfg : BM25 settings.
    name : what the errors call the index.

    Raises
    ------
    ValueError
        The shards hold another number of texts than ``doc_ids``, or ids repeat.
    KeyError
        A shard's vocabulary was not added to ``merge``.
    """
    if len(set(doc_ids)) != len(doc_ids):
        raise ValueError(f"{name}: ids are not unique")
    vocab = merge.finish()
    lookups = merge.lookups(pq.read_table(Path(d) / TokenIds.TERMS_FILE).column("term").combine_chunks() for d in shard_dirs)

    def chunks():
        for d, lookup in zip(shard_dirs, lookups):
            yield lookup[np.load(Path(d) / TokenIds.IDS_FILE)], np.load(Path(d) / TokenIds.OFFSETS_FILE)
    try:
        retriever = bm25_from_token_chunks(chunks, len(doc_ids), vocab, cfg)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    return BM25Index(retriever, doc_ids, cfg)


@dataclass
class ClusterTokenShards:
    """The cluster index's token shards planned (:func:`plan_cluster_tokens`): the shard calls to
    run through the stage's ``submit`` and what :func:`cluster_index_from_results` needs after."""

    calls: list[tuple]
    split: DocumentSplit
    memo_dir: Path
    work_dir: Path
    n_members: int
    t0: float
    partition_seconds: float


def plan_cluster_tokens(ingest_dir: Path, cluster_dir: Path, cfg: BM25Config, submit: Callable[..., Any],
                        tokens_per_shard: int, work_dir: Path, window: int = 8, docs_per_range: int = 20_000,
                        split_dir: Path | None = None, tokens_dir: Path | None = None) -> ClusterTokenShards:
    """The first half of :func:`build_cluster_index`: the cluster ranges, the documents split by
    range (through ``submit``, or the build's shared split in ``split_dir``), and one
    :func:`cluster_token_shard` call a range. The split stays open until
    :func:`cluster_index_from_results` has the shards' results (closed here if planning fails).
    ``tokens_dir``: the tokens stage's output, whose kept text keys the shards' member keys derive
    from (:func:`cluster_token_shard`)."""
    t0 = time.perf_counter()
    members = pq.read_table(Path(cluster_dir) / C.CLUSTER_MEMBERS.filename, columns=["cluster_id", "doc_id"])
    cids = members.column("cluster_id").to_numpy()
    doc_ids = pq.read_table(Path(ingest_dir) / C.DOCUMENTS.filename, columns=["doc_id"]).column("doc_id").to_numpy()
    doc_rows = check_members(doc_ids, members.column("doc_id").to_numpy())
    n_members = int(cids.size)
    ranges = read_cluster_ranges(cluster_dir, tokens_per_shard, cids)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    split = DocumentSplit(split_dir, work_dir)
    try:
        docs_dirs = split.partition(ingest_dir, ranges, member_cluster_ranks(cids), doc_rows, submit,
                                    docs_per_range, window)
        memo_dir = token_memo_dir(work_dir, "clusters", cfg)
        verified_entry(memo_dir)   # checked once here, not by each shard that opens it: a bad memo is discarded
    except BaseException:
        split.close()
        raise
    calls = [(cluster_token_shard, str(ingest_dir), str(cluster_dir), lo, hi, cfg, str(work_dir), str(d),
              str(memo_dir), str(tokens_dir) if tokens_dir is not None else None)
             for (lo, hi), d in zip(ranges, docs_dirs)]
    return ClusterTokenShards(calls, split, memo_dir, Path(work_dir), n_members, t0, time.perf_counter() - t0)


def cluster_index_from_results(plan: ClusterTokenShards, results: Iterable[Any],
                               cfg: BM25Config) -> tuple[BM25Index, dict[str, Any]]:
    """The second half of :func:`build_cluster_index`: the shards' results (of ``plan.calls``, in
    order) merged into the one vocabulary, the index built from the kept token ids, the token memo
    rewritten; the split closed. Returns the index and the summary."""
    index_ids: list[str] = []
    keys: list[str] = []
    merge = VocabularyMerge(sorted_terms=cfg.stemmer is not None)
    reused = members_reused = 0
    try:
        for ids, terms, key, hit, from_memo in results:
            index_ids.extend(ids)
            keys.append(key)
            merge.add(terms)
            reused += hit
            members_reused += from_memo
    finally:
        plan.split.close()
    if len(keys) != len(plan.calls):
        raise ValueError(f"cluster index: {len(keys)} token shard results for {len(plan.calls)} shards")
    t1 = time.perf_counter()
    shard_dirs = [plan.work_dir / "cluster-tokens" / key for key in keys]
    n_tokens = sum(int(np.load(d / TokenIds.OFFSETS_FILE, mmap_mode="r")[-1]) for d in shard_dirs)
    n_terms = len(merge.finish())
    index = index_from_token_shards(shard_dirs, index_ids, merge, cfg)
    t2 = time.perf_counter()
    write_token_memo(plan.memo_dir, shard_dirs)
    n_shards = len(plan.calls)
    return index, {"cluster_members": plan.n_members, "cluster_members_reused": members_reused,
                   "cluster_token_memo_seconds": time.perf_counter() - t2, "cluster_token_shards": n_shards,
                   "cluster_token_shards_built": n_shards - reused,
                   "cluster_token_shards_reused": reused, "cluster_tokens": n_tokens,
                   "cluster_vocabulary": n_terms, "cluster_partition_seconds": plan.partition_seconds,
                   "cluster_split_reused": plan.split.reused,
                   "cluster_tokenize_seconds": t1 - plan.t0,
                   "cluster_merge_index_seconds": t2 - t1}


def build_cluster_index(ingest_dir: Path, cluster_dir: Path, cfg: BM25Config, submit: Callable[..., Any],
                        tokens_per_shard: int, work_dir: Path, window: int = 8,
                        docs_per_range: int = 20_000, split_dir: Path | None = None,
                        tokens_dir: Path | None = None) -> tuple[BM25Index, dict[str, Any]]:
    """The cluster index, byte-identical to ``BM25Index.build(*reversed(cluster_texts(documents,
    members)), cfg)``, with the tokenization in shards of whole clusters of at most
    ``tokens_per_shard`` tokens (content-defined cuts, :func:`tasks.corpus.sharded.shards.cluster_ranges`),
    run through ``submit`` (:func:`cluster_token_shard`), each reading its own documents from a
    partition made first in one parallel pass of ``docs_per_range`` documents a task
    (:func:`tasks.corpus.sharded.shards.partition_documents`, in a scratch directory under ``work_dir``,
    removed after; or the build's shared split in ``split_dir``, made by the segment stage:
    :class:`tasks.corpus.sharded.shards.DocumentSplit`).

    The shards' token ids are kept in ``work_dir`` (shared with the workers) and reused when a
    shard's texts are unchanged. Returns the index and a summary: shard counts, reuse, seconds of
    the tokenization shards and of the coordinator's merge + bm25s index. In two halves
    (:func:`plan_cluster_tokens`, :func:`cluster_index_from_results`) for a caller that queues more
    shards behind these (the index stage: the passages' token shards, which the pool tokenizes
    while this process merges the cluster index). ``tokens_dir``: the tokens stage's output (the
    documents' text keys it kept; without it the shards hash the texts).
    """
    plan = plan_cluster_tokens(ingest_dir, cluster_dir, cfg, submit, tokens_per_shard, work_dir, window,
                               docs_per_range, split_dir, tokens_dir)
    return cluster_index_from_results(plan, ordered_results(submit, plan.calls, window, "cluster index token shards"), cfg)
