"""The BM25 cluster index, its tokenization in cluster-range shards on worker processes.

The cluster index is one bm25s index over every cluster's text (its members' ``title\\ntext``
joined in cluster order, :func:`cluster_texts`): ~all article text of the dump. Tokenizing it is
most of its cost and holding it is most of the coordinator's memory, so it is split by ranges of
whole clusters (the segment shards' :func:`tasks.corpus.shards.cluster_ranges`):
:func:`cluster_token_shard` (a worker-process call through ``submit``) reads its clusters' member
documents, tokenizes their texts with :func:`tasks.corpus.index.tokenize_ids` and keeps the token
ids with the shard's own vocabulary (:class:`tasks.corpus.index.TokenIds`) in the work directory,
keyed by the sha256 of the texts, so an unchanged shard is reused by the next build.

:func:`merge_vocabularies` gives the vocabulary the one-process tokenization of all texts gives:
:func:`tasks.corpus.index.tokenize_ids` numbers stems in sorted order (the sorted union of the
shards' stems), or without a stemmer raw tokens by first occurrence (shards in cluster order, each
shard's tokens in its own first-occurrence order). Token ids are per-token maps (split, lower-case,
stop words, stem), so remapping each shard's ids to the global vocabulary gives exactly the ids of
the one-process path, and bm25s builds the same index from them: the saved files are
byte-identical to ``BM25Index.build(cluster_texts(...))`` (``tests/test_cluster_index.py``).

What the coordinator holds: the members table (3 integers a document), every shard's vocabulary
while the shards come in, then the global vocabulary and all token ids as one int32 array
(4 bytes a token, read back shard by shard from the work directory), and bm25s's index arrays;
no article text (one shard's at a time when ``submit`` runs in this process).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts import corpus as C
from tasks.corpus.index import BM25Config, BM25Index, TokenIds, _stemmer, bm25_from_token_ids, tokenize_ids
from tasks.corpus.shards import texts_key, cluster_ranges, ordered_results, put_cached

CLUSTER_TOKENS_VERSION = "1"


def cluster_texts(documents: pa.Table, cluster_members: pa.Table) -> tuple[list[str], list[str]]:
    """``(cluster ids as str, texts)``: each cluster's members' ``title\\ntext`` joined in
    cluster order — the coarse retrieval units of the progressive path.

    ``documents`` holds at least the members' documents (``doc_id``, ``title``, ``text``; all of
    them or a subset); raises ``ValueError`` if a member's document is missing."""
    members = cluster_members.sort_by([("cluster_id", "ascending"), ("position", "ascending")])
    docs = documents.sort_by("doc_id")
    have, want = docs.column("doc_id").to_numpy(), members.column("doc_id").to_numpy()
    rows = np.searchsorted(have, want)
    if want.size and (rows.max() >= have.size or not np.array_equal(have[rows], want)):
        raise ValueError("cluster texts: cluster members refer to documents that are not in the documents table")
    rows = pa.array(rows)
    titles = docs.column("title").take(rows).to_pylist()
    texts = docs.column("text").take(rows).to_pylist()
    cids = members.column("cluster_id").to_numpy()
    out_ids: list[str] = []
    out_texts: list[str] = []
    start = 0
    for end in list(np.flatnonzero(cids[1:] != cids[:-1]) + 1) + [cids.size]:
        if end > start:
            out_ids.append(str(int(cids[start])))
            out_texts.append("\n\n".join(f"{t}\n{x}" for t, x in zip(titles[start:end], texts[start:end])))
        start = end
    return out_ids, out_texts


def cluster_token_shard(ingest_dir: str, cluster_dir: str, lo: int, hi: int, cfg: BM25Config,
                        work_dir: str) -> tuple[list[str], list[str], str, bool]:
    """Token ids of the cluster texts of clusters ``lo <= cluster_id < hi`` (a worker-process
    call), kept in ``work_dir/cluster-tokens/<sha256 of the shard's cluster ids and texts>/``
    (:meth:`tasks.corpus.index.TokenIds.save`).

    Reads only the shard's members and their documents (Parquet filters). Returns
    ``(cluster ids as str, the shard's vocabulary in id order, key, reused)``; ``reused`` when
    the shard's texts are unchanged since a build that kept them."""
    members = pq.read_table(Path(cluster_dir) / C.CLUSTER_MEMBERS.filename, columns=["cluster_id", "position", "doc_id"],
                            filters=[("cluster_id", ">=", lo), ("cluster_id", "<", hi)])
    wanted = sorted(set(members.column("doc_id").to_pylist()))
    docs = pq.read_table(Path(ingest_dir) / C.DOCUMENTS.filename, columns=["doc_id", "title", "text"],
                         filters=[("doc_id", "in", wanted)])
    ids, texts = cluster_texts(docs, members)
    del docs
    key = texts_key(CLUSTER_TOKENS_VERSION, cfg, ids, texts)
    cached = Path(work_dir) / "cluster-tokens" / key
    if (cached / "COMPLETE").exists():
        return ids, pq.read_table(cached / TokenIds.TERMS_FILE).column("term").to_pylist(), key, True
    tokens = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
    del texts

    def write(tmp: Path) -> None:
        tokens.save(tmp)
        (tmp / "COMPLETE").write_text(f"{len(tokens)}\n")
    cached.parent.mkdir(parents=True, exist_ok=True)
    put_cached(cached, write)
    return ids, tokens.terms, key, False


def merge_vocabularies(parts: Sequence[list[str]], sorted_terms: bool) -> tuple[list[str], list[np.ndarray]]:
    """The vocabulary of all parts' texts as :func:`tasks.corpus.index.tokenize_ids` numbers it
    when tokenizing them in one call, and each part's map from its own ids to it.

    Parameters
    ----------
    parts : each part's vocabulary in its id order (``TokenIds.terms``), parts in text order.
    sorted_terms : True when stemming (ids in sorted stem order), False for first-occurrence order.

    Returns
    -------
    terms : the global vocabulary in id order.
    lookups : per part, int32 ``(len(part),)``: local id → global id.
    """
    if sorted_terms:
        terms = sorted(set().union(*parts))
        index = {t: i for i, t in enumerate(terms)}
    else:
        index = {}
        for part in parts:
            for t in part:
                index.setdefault(t, len(index))
        terms = list(index)
    return terms, [np.fromiter((index[t] for t in part), dtype=np.int32, count=len(part)) for part in parts]


def build_cluster_index(ingest_dir: Path, cluster_dir: Path, cfg: BM25Config, submit: Callable[..., Any],
                        docs_per_shard: int, work_dir: Path, window: int = 8) -> tuple[BM25Index, dict[str, Any]]:
    """The cluster index, byte-identical to ``BM25Index.build(*reversed(cluster_texts(documents,
    members)), cfg)``, with the tokenization in shards of whole clusters holding about
    ``docs_per_shard`` member documents, run through ``submit`` (:func:`cluster_token_shard`).

    The shards' token ids are kept in ``work_dir`` (shared with the workers) and reused when a
    shard's texts are unchanged. Returns the index and a summary: shard counts, reuse, seconds of
    the tokenization shards and of the coordinator's merge + bm25s index.
    """
    t0 = time.perf_counter()
    cids = pq.read_table(Path(cluster_dir) / C.CLUSTER_MEMBERS.filename, columns=["cluster_id"]).column("cluster_id")
    ranges = cluster_ranges(np.sort(cids.to_numpy()), docs_per_shard)
    calls = [(cluster_token_shard, str(ingest_dir), str(cluster_dir), lo, hi, cfg, str(work_dir)) for lo, hi in ranges]
    doc_ids: list[str] = []
    parts: list[tuple[str, list[str]]] = []
    reused = 0
    for ids, terms, key, hit in ordered_results(submit, calls, window):
        doc_ids.extend(ids)
        parts.append((key, terms))
        reused += hit
    t1 = time.perf_counter()
    terms, lookups = merge_vocabularies([t for _, t in parts], sorted_terms=cfg.stemmer is not None)
    sizes = []
    for key, _ in parts:
        sizes.append(np.load(Path(work_dir) / "cluster-tokens" / key / TokenIds.OFFSETS_FILE, mmap_mode="r")[-1])
    token_ids = np.empty(int(sum(sizes)), dtype=np.int32)
    offsets = [np.zeros(1, dtype=np.int64)]
    at = 0
    for (key, _), lookup, size in zip(parts, lookups, sizes):
        kept = Path(work_dir) / "cluster-tokens" / key
        token_ids[at:at + size] = lookup[np.load(kept / TokenIds.IDS_FILE)]
        offsets.append(np.load(kept / TokenIds.OFFSETS_FILE)[1:] + at)
        at += int(size)
    del parts, lookups
    tokens = TokenIds(token_ids, np.concatenate(offsets), terms)
    if len(tokens) != len(doc_ids):
        raise ValueError(f"cluster index: {len(doc_ids)} clusters but {len(tokens)} token id lists")
    if len(set(doc_ids)) != len(doc_ids):
        raise ValueError("cluster index: cluster ids are not unique")
    index = BM25Index(bm25_from_token_ids(tokens, cfg), doc_ids, cfg)
    return index, {"cluster_token_shards": len(ranges), "cluster_token_shards_built": len(ranges) - reused,
                   "cluster_token_shards_reused": reused, "cluster_tokens": int(token_ids.size),
                   "cluster_vocabulary": len(terms), "cluster_tokenize_seconds": t1 - t0,
                   "cluster_merge_index_seconds": time.perf_counter() - t1}
