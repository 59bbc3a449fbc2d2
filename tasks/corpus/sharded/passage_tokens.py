"""The passage index's BM25 tokenization in token shards on the stage's workers.

The passage index tokenizes about as much text as the cluster index: in the build process alone it
kept one core busy while the other waited (~18 CPU s of the Wikispeedia demo's ~39 s index stage).
Here its passages are cut into ranges of whole clusters
(:func:`tasks.corpus.sharded.shards.passage_row_ranges`); each range is a
:func:`passage_token_shard` call on a worker, which keeps the range's token ids and vocabulary in
the stage cache (reused while its passages are unchanged) and takes each passage the token memo
holds from it. One index (``index.passage_shard_tokens: 0``, ranges of ``runner.tokens_per_shard``):
the coordinator merges the vocabularies and builds the index from the kept ids one shard at a time
(:func:`tasks.corpus.sharded.cluster_index.index_from_token_shards`, as for the clusters): the same
ids and vocabulary as tokenizing all passages in one call, so the same index bytes
(``tests/test_passage_tokens.py``; the corpus build's pinned digests); the index stage queues these
shards behind the cluster index's (:func:`tasks.corpus.stages.run_index`), so the workers tokenize
passages while the coordinator merges and saves the cluster index. Sharded (``> 0``): each range's
kept ids are one BM25 shard's (:func:`tasks.corpus.sharded.sharded_index.build_passage_shards`), and
the shard's document frequencies, counted by the worker that keeps its ids and kept in the same
entry, are what the coordinator sums into the corpus-wide statistics (``keep_df``; the one index
does not keep them: its build counts them in its own first pass).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.corpus import DOCUMENTS, PASSAGES, rows_of
from funnelrag.content_store import JoinedTexts, keys_digest
from funnelrag.verify import verified_entry
from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.cluster_index import VocabularyMerge, index_from_token_shards, kept_token_ids
from tasks.corpus.sharded.piece_keys import passage_keys
from tasks.corpus.sharded.shards import passage_row_ranges, read_rows
from tasks.corpus.sharded.token_memo import token_memo_dir, write_token_memo

PASSAGE_TOKENS_VERSION = "3"   # 2: the entry keeps the shard's document frequencies; 3: keyed on derived passage keys
TOKENS_DIR = "passage-tokens"


def passage_token_shard(segment_dir: str, lo: int, hi: int, cfg: BM25Config, work_dir: str,
                        memo_dir: str | None, keep_df: bool, ingest_dir: str, tokens_dir: str | None,
                        passage_words: int, doc_rows: np.ndarray) -> tuple[pa.Array, str, bool, int]:
    """Token ids of the passages in rows ``lo <= row < hi`` of ``passages.parquet`` (a
    worker-process call), each ``title\\ntext`` as the one passage index indexes it, kept in
    ``work_dir/passage-tokens/<sha256 of the passages' keys>/``
    (:func:`tasks.corpus.sharded.cluster_index.kept_token_ids`; a passage the token memo
    ``memo_dir`` holds is not tokenized again); with ``keep_df`` (the sharded index, whose
    corpus-wide statistics sum them) also the shard's document frequencies
    (:data:`tasks.corpus.sharded.cluster_index.DF_FILE`, counted here, on the worker, in the same
    entry; ``keep_df`` is part of the entry's key).

    A passage's key is derived, not hashed from its bytes (:mod:`tasks.corpus.sharded.piece_keys`):
    its document's member key (title, and the text key the tokens stage kept in ``tokens_dir``, or
    the text of ``ingest_dir``'s ``documents.parquet`` hashed here) mixed with its window number
    and ``passage_words``. ``doc_rows``: ``(n_documents,)`` int, the row in ``documents.parquet`` of
    each document of the range, in order of first passage (:meth:`PassageTokenShards.plan`).

    Returns ``(the shard's vocabulary in id order (Arrow strings), key, reused, passages taken from the memo)``.

    Raises
    ------
    ValueError
        As :func:`tasks.corpus.sharded.piece_keys.passage_keys`: the passages are not windows of
        ``passage_words`` words of their documents, or ``doc_rows`` does not hold one row a document.
    """
    path = Path(segment_dir) / PASSAGES.filename
    table = read_rows(path, lo, hi, ["doc_id", "title", "text", "n_words"])
    keys = passage_keys(table, doc_rows, Path(ingest_dir) / DOCUMENTS.filename, tokens_dir, passage_words,
                        f"{path} rows {lo}..{hi - 1}")
    texts = JoinedTexts(table.column("title"), table.column("text"), "\n")   # joined only where tokenized
    key = keys_digest(PASSAGE_TOKENS_VERSION, {**asdict(cfg), "keep_df": keep_df}, [], keys)
    terms, reused, from_memo = kept_token_ids(Path(work_dir) / TOKENS_DIR / key, texts, keys, cfg, memo_dir,
                                              keep_df=keep_df)
    return terms, key, reused, from_memo


def document_rows_by_range(segment_dir: Path, ingest_dir: Path, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
    """Per row range of ``passages.parquet``, ``(n_documents,)`` int64: the row in
    ``documents.parquet`` of each document of the range's passages, in order of first passage (a
    document's passages are consecutive: one cluster's). Raises ``ValueError`` naming the file
    when a passage's document is not in ``documents.parquet``."""
    passage_docs = pq.read_table(Path(segment_dir) / PASSAGES.filename, columns=["doc_id"]).column("doc_id").to_numpy()
    starts = np.r_[True, passage_docs[1:] != passage_docs[:-1]] if passage_docs.size else np.zeros(0, bool)
    starts[[lo for lo, hi in ranges if hi > lo]] = True        # a range starts a document
    doc_ids = pq.read_table(Path(ingest_dir) / DOCUMENTS.filename, columns=["doc_id"]).column("doc_id").to_numpy()
    rows = rows_of(doc_ids, passage_docs[starts], str(Path(ingest_dir) / DOCUMENTS.filename))
    first = np.r_[0, np.cumsum(starts, dtype=np.int64)]
    return [rows[first[lo]:first[hi]] for lo, hi in ranges]


@dataclass
class PassageTokenShards:
    """The passage index's token shards: :meth:`plan` them, run :attr:`calls` through the stage's
    ``submit``, then :meth:`index` their results."""

    segment_dir: Path
    work_dir: Path
    memo_dir: Path
    ranges: list[tuple[int, int]]
    calls: list[tuple]

    @classmethod
    def plan(cls, segment_dir: Path, cluster_dir: Path, ingest_dir: Path, cfg: BM25Config, work_dir: Path,
             tokens_per_shard: int, keep_df: bool = False, tokens_dir: Path | None = None,
             passage_words: int = SegmentConfig.passage_words) -> "PassageTokenShards":
        """One :func:`passage_token_shard` call per range of whole clusters of at most
        ``tokens_per_shard`` tokens (:func:`tasks.corpus.sharded.shards.passage_row_ranges`); ``keep_df``:
        each shard also keeps its document frequencies (:func:`passage_token_shard`). The passages'
        keys come from their documents' text keys (``tokens_dir``: the tokens stage's, which keeps
        them; ``None`` or a stage that kept none: hashed from ``ingest_dir``'s documents) and
        ``passage_words`` (``segment.passage_words``; a value the passages contradict is refused by
        the shards, :func:`tasks.corpus.sharded.piece_keys.passage_windows`).

        Raises
        ------
        ValueError
            ``passages.parquet`` holds passages of clusters that ``clusters.parquet`` lacks, or
            is not in cluster order (:func:`tasks.corpus.sharded.shards.passage_row_ranges`), or of
            documents that ``documents.parquet`` lacks.
        """
        ranges = passage_row_ranges(segment_dir, cluster_dir, tokens_per_shard)
        doc_rows = document_rows_by_range(segment_dir, ingest_dir, ranges)
        memo_dir = token_memo_dir(work_dir, "passages", cfg)
        verified_entry(memo_dir)   # checked once here, not by each shard that opens it: a bad memo is discarded
        calls = [(passage_token_shard, str(segment_dir), lo, hi, cfg, str(work_dir), str(memo_dir), keep_df,
                  str(ingest_dir), str(tokens_dir) if tokens_dir is not None else None, passage_words, rows)
                 for (lo, hi), rows in zip(ranges, doc_rows)]
        return cls(Path(segment_dir), Path(work_dir), memo_dir, ranges, calls)

    def collect(self, results: Iterable[Any],
                add_terms: Callable[[pa.Array], Any] = lambda terms: None) -> tuple[list[Path], dict[str, int]]:
        """The shards' kept directories (in shard order) from their ``results`` (of :attr:`calls`,
        in order), each shard's vocabulary passed to ``add_terms`` as it comes, and a summary
        (``passages_reused``: passages taken from the memo; shard counts).

        Raises
        ------
        ValueError
            Fewer results than shards.
        """
        keys: list[str] = []
        reused = from_memo = 0
        for terms, key, hit, n_memo in results:
            add_terms(terms)
            keys.append(key)
            reused += hit
            from_memo += n_memo
        if len(keys) != len(self.calls):
            raise ValueError(f"passage index: {len(keys)} token shard results for {len(self.calls)} shards")
        return [self.work_dir / TOKENS_DIR / key for key in keys], {
            "passages_reused": from_memo, "passage_token_shards": len(keys),
            "passage_token_shards_built": len(keys) - reused, "passage_token_shards_reused": reused}

    def index(self, results: Iterable[Any], cfg: BM25Config) -> tuple[BM25Index, dict[str, Any]]:
        """The one passage index from the shards' ``results`` (of :attr:`calls`, in order), the
        token memo rewritten with this build's passages. Returns the index and the summary of
        :meth:`collect`.

        Raises
        ------
        ValueError
            Fewer results than shards, or the shards' texts are not one a passage.
        """
        merge = VocabularyMerge(sorted_terms=cfg.stemmer is not None)
        shard_dirs, summary = self.collect(results, merge.add)
        ids = PASSAGES.read(self.segment_dir, columns=["passage_id"]).column("passage_id").to_pylist()
        index = index_from_token_shards(shard_dirs, ids, merge, cfg, name="passage index")
        write_token_memo(self.memo_dir, shard_dirs)
        return index, summary
