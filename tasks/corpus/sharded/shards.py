"""Per-shard execution of the corpus build's document-parallel stages (tokens, segment).

A *shard* is a contiguous row range ``[lo, hi)`` of ``documents.parquet`` (in title order: the
build's private document order; a range is read through the row groups' row counts without the
rest of the file).
Token counting of the ~100-word windows (the article lengths of Algorithm 1, and the windows of
segmentation) is independent per document, so shards are counted in worker processes through
``submit(fn, *args) -> future`` and concatenated in row order: ``window_tokens.parquet`` is
byte-identical to :func:`tasks.corpus.stages.run_tokens`' whatever the shard size or worker count.
Segmentation is independent per cluster, so its shards are ranges of whole clusters cut by
tokens (:func:`cluster_ranges`), concatenated in cluster order (:func:`run_segment_sharded`). The passage
BM25 index in shards: :mod:`tasks.corpus.sharded.sharded_index`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts import corpus as C
from data_contracts.base import atomic_write, move_into_place, names_disk_full, temp_name
from funnelrag.config import config_hash
from funnelrag.content_store import ContentMemo, Utf8Rows, arrow_text_keys, settings_dir, take_texts
from funnelrag.progress import Progress, progress
from funnelrag.reaper import scratch_dir
from funnelrag.store import mark_used
from funnelrag.verify import record_digests, verified_entry
from tasks.corpus.sharded import segment_memo as SM
from tasks.corpus.segment import SegmentConfig, check_members, count_window_tokens, segment_clusters
from tasks.corpus.tokenize import load_token_counter

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- helpers
def run_here(fn: Callable[..., Any], *args: Any) -> Future:
    """``submit(fn, *args)`` that runs the call in this process (no runner): a finished future."""
    done: Future = Future()
    done.set_result(fn(*args))
    return done


def ordered_results(submit: Callable[..., Any], calls: list[tuple], window: int,
                    desc: str | None = None) -> Iterator[Any]:
    """Results of ``submit(*call)`` for each call, in call order, with at most ``window`` calls
    submitted and not yet consumed (bounds the coordinator's memory). With ``desc``, finished
    shards are reported (:class:`funnelrag.progress.Progress`, unit ``shards``)."""
    pending: deque = deque()
    bar = Progress(desc, total=len(calls), unit="shards") if desc else None
    try:
        for call in calls:
            pending.append(submit(*call))
            if len(pending) >= max(window, 1):
                yield pending.popleft().result()
                if bar is not None:
                    bar.update()
        while pending:
            yield pending.popleft().result()
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()


def put_cached(cached: Path, write: Callable[[Path], None], record: bool = True) -> None:
    """Write a cache entry: ``write(tmp_dir)`` into ``.tmp-<pid>-<name>-<thread>`` beside ``cached``
    (:func:`data_contracts.base.temp_name`: a killed writer's directory is swept, a live one's kept),
    then its digest manifest (:func:`funnelrag.verify.record_digests`, checked by
    :func:`funnelrag.verify.verified_entry` before the entry is read; ``record`` False: none, for a
    build's own scratch that no later build reads), then rename it onto ``cached``
    (:func:`data_contracts.base.move_into_place`: a concurrent writer of the same key wins; both
    wrote the same bytes). If ``write`` raises, its temporary directory is removed and the error
    passes on (a disk-full error naming no file names ``cached``,
    :func:`data_contracts.base.names_disk_full`); ``cached`` is left as it was.

    Raises
    ------
    OSError
        The finished directory could not be renamed onto ``cached`` (other than a concurrent
        writer's entry being there): both paths named.
    """
    tmp = cached.with_name(temp_name(f"{cached.name}-{threading.get_ident()}"))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with names_disk_full(cached):
            write(tmp)
        if record:
            record_digests(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    move_into_place(tmp, cached)


# ---------------------------------------------------------------------------------- tokens
def doc_shards(n_docs: int, docs_per_shard: int) -> list[tuple[int, int]]:
    """``[(lo, hi)]`` covering ``0..n_docs`` in ranges of ``docs_per_shard`` documents."""
    return [(lo, min(lo + docs_per_shard, n_docs)) for lo in range(0, n_docs, docs_per_shard)]


def read_rows(path: Path, lo: int, hi: int, columns: list[str]) -> pa.Table:
    """Rows ``lo <= row < hi`` of the Parquet file ``path`` (:func:`read_rows_at`)."""
    return read_rows_at(path, np.arange(lo, hi, dtype=np.int64), columns)


def read_rows_at(path: Path, rows: np.ndarray, columns: list[str]) -> pa.Table:
    """Rows ``rows`` (ascending, distinct) of the Parquet file ``path``, one row group at a time
    (only the row groups that hold them are decoded; a run of consecutive rows is a slice of its row
    group): memory is one row group plus the rows taken.

    Raises ``ValueError`` naming the file when some of the rows are not in it."""
    rows = np.asarray(rows, np.int64)
    parquet = pq.ParquetFile(path, memory_map=True)
    parts, start = [parquet.schema_arrow.empty_table().select(columns)], 0
    for rg in range(parquet.num_row_groups):
        n = parquet.metadata.row_group(rg).num_rows
        a, b = np.searchsorted(rows, [start, start + n])
        if b > a:
            group, first = parquet.read_row_group(rg, columns=columns).select(columns), int(rows[a]) - start
            consecutive = int(rows[b - 1]) - int(rows[a]) == b - a - 1
            parts.append(group.slice(first, b - a) if consecutive else group.take(pa.array(rows[a:b] - start)))
        start += n
    table = pa.concat_tables(parts)
    if table.num_rows != rows.size:
        raise ValueError(f"{path}: the rows wanted are not all present ({table.num_rows} of {rows.size}; "
                         f"the file has {start} rows)")
    return table


# ------------------------------------------------------------------ documents by cluster shard
DOC_COLUMNS = ["doc_id", "title", "text"]
ROW = "row"
"""Column a shard's documents carry beside :data:`DOC_COLUMNS` when they come from a partition:
each document's row in ``documents.parquet`` (the index of :data:`TEXT_KEYS_FILE` and of
``window_tokens.parquet``)."""


def partition_range(ingest_dir: str, lo: int, hi: int, shard_of_doc: str, out_dir: str) -> int:
    """Documents in rows ``lo <= row < hi`` split by the cluster shard of each (a worker-process call):
    ``out_dir/<shard:06d>/<lo:010d>.parquet`` (``doc_id``, ``title``, ``text``, ``row``; row order;
    uncompressed: a scratch file read once) for every shard with a member in the range.

    ``shard_of_doc`` is an ``.npy`` int32 array ``(n_docs,)``: the shard index of each document
    row, -1 for none. Reads one contiguous row range (:func:`read_rows`); memory: that
    range's text. Writes are atomic (a retried task rewrites the same bytes). Returns the rows written."""
    table = read_rows(Path(ingest_dir) / C.DOCUMENTS.filename, lo, hi, DOC_COLUMNS).combine_chunks()
    table = table.append_column(ROW, pa.array(np.arange(lo, hi, dtype=np.int64)))
    shard = np.load(shard_of_doc, mmap_mode="r")[lo:hi].astype(np.int64)
    order = np.argsort(shard, kind="stable")
    grouped = shard[order]
    bounds = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if shard.size else np.zeros(0, np.int64)
    # A take a shard from the range's one chunk (the stable sort keeps row order within a
    # shard; a take from many chunks would join them first, for every shard): each copy is freed
    # once written, where one take of the whole range in shard order held a second copy of all its
    # text at once. Same CPU warm (benchmarks/bench_incremental_stages.py copies).
    written = 0
    for a, b in zip(bounds.tolist(), [*bounds[1:].tolist(), shard.size]):
        k = int(grouped[a])
        if k < 0:
            continue
        rows = table.take(pa.array(order[a:b]))
        path = Path(out_dir) / f"{k:06d}" / f"{lo:010d}.parquet"
        atomic_write(path, functools.partial(pq.write_table, rows, compression="none"))
        written += rows.num_rows
    return written


def partition_documents(ingest_dir: Path, ranges: list[tuple[int, int]], cluster_ids: np.ndarray,
                        doc_rows: np.ndarray, out_dir: Path, submit: Callable[..., Any], docs_per_range: int,
                        window: int = 8) -> list[Path]:
    """Each cluster shard's member documents in a directory of its own, in one pass over
    ``documents.parquet`` (a shuffle by cluster range), before the segment or cluster-token shards.

    Why: a shard's members are spread over every row group of ``documents.parquet`` (clusters
    follow the link graph, the file follows titles), so a shard that reads its members from it
    decodes ~all the article text; at 1M pages that was 3.0–3.8 CPU s a shard, and at full scale
    (~227 shards × 20 GB of text) ~70% of the segment and cluster-index CPU. Here row
    ranges of ``docs_per_range`` documents are read once each, in parallel through ``submit``
    (:func:`partition_range`), and every shard then reads only its own rows
    (:func:`read_shard_documents`).

    Parameters
    ----------
    ranges : ``[(lo, hi)]`` cluster ranges of the shards (ranks in ``clusters.parquet``, :func:`read_cluster_ranges`).
    cluster_ids, doc_rows : ``(n_members,)`` the members' clusters (ranks) and documents (rows
        of ``documents.parquet``).
    out_dir : a scratch directory (on storage the workers share); the caller removes it.

    Returns ``[out_dir/<shard:06d>]``, one a range (a shard without documents: a missing directory).

    Raises
    ------
    ValueError
        A member's cluster is in no range; the rows written differ from the members.
    """
    n_docs = pq.read_metadata(Path(ingest_dir) / C.DOCUMENTS.filename).num_rows
    starts = np.array([lo for lo, _ in ranges], np.int64)
    shard = np.searchsorted(starts, np.asarray(cluster_ids, np.int64), side="right") - 1
    if cluster_ids.size and (shard.min() < 0 or np.any(np.asarray(cluster_ids) >= np.array([hi for _, hi in ranges])[shard])):
        raise ValueError(f"{ingest_dir}: cluster members fall outside the shards' cluster ranges")
    shard_of_doc = np.full(n_docs, -1, np.int32)
    shard_of_doc[np.asarray(doc_rows, np.int64)] = shard
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "shard_of_doc.npy", shard_of_doc)
    calls = [(partition_range, str(ingest_dir), lo, hi, str(out_dir / "shard_of_doc.npy"), str(out_dir))
             for lo, hi in doc_shards(n_docs, docs_per_range)]
    written = sum(ordered_results(submit, calls, window, "split documents by shard"))
    if written != int(np.count_nonzero(shard_of_doc >= 0)):
        raise ValueError(f"{out_dir}: {written} documents partitioned, {int(np.count_nonzero(shard_of_doc >= 0))} expected")
    return [out_dir / f"{k:06d}" for k in range(len(ranges))]


class DocumentSplit:
    """Where the cluster shards' documents are split (:func:`partition_documents`): a scratch
    directory of one stage, removed when it ends, or one a build shares between its segment and
    cluster-index stages, which cut the same cluster ranges from the same documents.

    ``shared`` (a directory the build creates and removes, on storage the workers share): a split
    is kept there under the sha256 of what it depends on (the documents file, the ranges, each
    member's cluster and document) and taken as it is by the next stage that asks for the same one
    (``reused``); ``None``: the split goes to a new directory under ``scratch_parent``, removed by
    :meth:`close`.
    """

    def __init__(self, shared: Path | None, scratch_parent: Path):
        self.shared, self.scratch_parent = (Path(shared) if shared is not None else None), Path(scratch_parent)
        self.scratch: Path | None = None
        self.reused = False

    def close(self) -> None:
        """Remove this stage's own scratch split (a shared one stays for the build to remove)."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def partition(self, ingest_dir: Path, ranges: list[tuple[int, int]], cluster_ids: np.ndarray, doc_rows: np.ndarray,
                  submit: Callable[..., Any], docs_per_range: int, window: int = 8) -> list[Path]:
        """:func:`partition_documents` into this split's directory, or the shared split of the same
        inputs when a stage of this build made it. Returns one directory a range."""
        if self.shared is None:
            self.scratch = scratch_dir(self.scratch_parent, "documents-by-shard")
            return partition_documents(ingest_dir, ranges, cluster_ids, doc_rows, self.scratch, submit, docs_per_range,
                                       window)
        documents = Path(ingest_dir) / C.DOCUMENTS.filename
        st = documents.stat()
        h = hashlib.sha256(json.dumps([str(documents.resolve()), st.st_size, st.st_mtime_ns, docs_per_range,
                                       [list(r) for r in ranges]]).encode())
        h.update(np.asarray(cluster_ids, np.int64).tobytes())
        h.update(np.asarray(doc_rows, np.int64).tobytes())
        done = self.shared / h.hexdigest()
        if (done / "COMPLETE").exists():   # this build's scratch (removed when it ends): no digests
            self.reused = True
            return [done / f"{k:06d}" for k in range(len(ranges))]

        def write(tmp: Path) -> None:
            partition_documents(ingest_dir, ranges, cluster_ids, doc_rows, tmp, submit, docs_per_range, window)
            (tmp / "COMPLETE").write_text("\n")
        put_cached(done, write, record=False)
        return [done / f"{k:06d}" for k in range(len(ranges))]


def read_shard_documents(docs_dir: str) -> pa.Table:
    """One shard's documents, in ``documents.parquet``'s row order, with each one's :data:`ROW`: its
    partition ``docs_dir`` (:func:`partition_documents`; a shard without documents has none)."""
    files = sorted(Path(docs_dir).glob("*.parquet")) if Path(docs_dir).is_dir() else []
    parts = [pq.read_table(f, memory_map=True) for f in files]
    empty = C.DOCUMENTS.schema.empty_table().select(DOC_COLUMNS).append_column(ROW, pa.array([], pa.int64()))
    return pa.concat_tables(parts) if parts else empty


TOKENS_MEMO_VERSION = "1"
TOKENS_MEMO_FIELD = "window_tokens"
TEXT_KEYS_FILE = "text_keys.npy"
"""Beside ``window_tokens.parquet`` of the sharded tokens stage: ``(n_docs, 2)`` uint64, each
document's text key (:func:`funnelrag.content_store.arrow_text_keys`) by document row, which the stage computes
for its memo anyway; the segment shards read theirs instead of hashing the texts again
(:func:`read_text_keys`)."""


def read_text_keys(tokens_dir: Path, doc_rows: np.ndarray) -> np.ndarray | None:
    """The text keys of the documents in rows ``doc_rows`` (``(m,)`` int) the tokens stage kept
    (:data:`TEXT_KEYS_FILE`, memory-mapped), ``(m, 2)`` uint64; ``None`` when the stage kept none
    (the one-process stage, or an entry cached before they were kept). Raises ``ValueError`` when
    the file does not hold one key per document of ``window_tokens.parquet``."""
    path = Path(tokens_dir) / TEXT_KEYS_FILE
    if not path.is_file():
        return None
    keys = np.load(path, mmap_mode="r")
    n_docs = pq.read_metadata(Path(tokens_dir) / C.WINDOW_TOKENS.filename).num_rows
    if keys.ndim != 2 or keys.shape != (n_docs, 2) or keys.dtype != np.uint64:
        raise ValueError(f"{path}: {keys.shape} {keys.dtype} text keys for {n_docs} documents")
    return np.asarray(keys[np.asarray(doc_rows, np.int64)])


def document_text_keys(tokens_dir: Path | str | None, doc_rows: np.ndarray,
                       texts: Callable[[], pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """``(m, 2)`` uint64: the text keys of the documents in rows ``doc_rows`` of ``documents.parquet``,
    those the tokens stage kept in ``tokens_dir`` (:func:`read_text_keys`),
    else :func:`funnelrag.content_store.arrow_text_keys` of ``texts()`` (the same documents' texts,
    in the same order: the one-process tokens stage keeps none). Same keys either way."""
    kept = read_text_keys(Path(tokens_dir), doc_rows) if tokens_dir is not None else None
    return kept if kept is not None else arrow_text_keys(texts())


def tokens_memo_dir(root: Path, cfg: SegmentConfig) -> Path:
    """The window-token memo of ``cfg``'s tokenizer and window size under ``root`` (the stage
    cache): one memo per setting, so a build with other settings never reads another's counts."""
    return settings_dir(root, "tokens-memo", TOKENS_MEMO_VERSION, cfg)


def count_shard(ingest_dir: str, lo: int, hi: int, cfg: SegmentConfig, mirror: str | None,
                memo_dir: str | None = None) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Window token counts of the documents in rows ``[lo, hi)`` (a worker-process call).

    With ``memo_dir`` (:func:`tokens_memo_dir`, written by the previous build), a document whose
    text the memo holds takes its counts from it (:class:`funnelrag.content_store.ContentMemo`, keyed
    by the BLAKE2b-128 of the text); only the others are tokenized.

    Returns ``(windows per doc (hi-lo,) int32, tokens per window int32, documents taken from the
    memo, text keys (hi-lo, 2) uint64)``."""
    texts = read_rows(Path(ingest_dir) / C.DOCUMENTS.filename, lo, hi, ["text"]).column("text")
    keys = arrow_text_keys(texts)   # from the Arrow buffer: only the texts the memo lacks become str
    memo = ContentMemo.open(memo_dir, [TOKENS_MEMO_FIELD])
    rows = memo.lookup(keys) if memo is not None else np.full(len(texts), -1, np.int64)
    missing = np.flatnonzero(rows < 0)
    windows = np.zeros(len(texts), np.int32)
    per_doc: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
    if missing.size:
        with Progress(f"token counts of documents {lo:,}-{hi - 1:,}", total=int(missing.size), unit="documents") as bar:
            wt = count_window_tokens(take_texts(texts, missing), cfg,
                                     load_token_counter(cfg.tokenizer, Path(mirror) if mirror else None),
                                     batch_windows=4096, bar=bar)   # smaller batches: a line at least every ~30 s
        for k, i in enumerate(missing.tolist()):
            per_doc[i] = wt.n_tokens[wt.indptr[k]:wt.indptr[k + 1]]
    hits = np.flatnonzero(rows >= 0)
    if hits.size:
        lengths, values = memo.take(TOKENS_MEMO_FIELD, rows[hits])
        for i, part in zip(hits.tolist(), np.split(values.astype(np.int32), np.cumsum(lengths)[:-1])):
            per_doc[i] = part
    windows[:] = [p.size for p in per_doc]
    tokens = np.concatenate(per_doc).astype(np.int32) if per_doc else np.zeros(0, np.int32)
    return windows, tokens, int(hits.size), keys


def run_tokens_sharded(ingest_dir: Path, out_dir: Path, cfg: SegmentConfig, mirror: Path | None,
                       submit: Callable[..., Any], docs_per_shard: int, window: int = 8,
                       cache_dir: Path | None = None) -> dict[str, Any]:
    """:func:`tasks.corpus.stages.run_tokens` over document shards counted through ``submit``.

    At most ``window`` shards are in flight or waiting to be concatenated (coordinator memory).
    With ``cache_dir`` (shared by the workers), the window-token memo there
    (:func:`tokens_memo_dir`) gives every document whose text is unchanged since the last build
    its counts without tokenizing it, and is then replaced by this build's documents. The summary
    says how many documents were counted and taken from the memo (``documents_counted``,
    ``documents_reused``), and how many shards needed no tokenizer at all (``shards_reused``;
    ``shards_built`` the others). Beside the table it keeps every document's text key
    (:data:`TEXT_KEYS_FILE`) for the segment shards.
    """
    t0 = time.perf_counter()
    doc_ids = pq.read_table(Path(ingest_dir) / C.DOCUMENTS.filename, columns=["doc_id"]).column("doc_id")
    n_docs = len(doc_ids)
    shards = doc_shards(n_docs, docs_per_shard)
    per_doc: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    reused_docs = reused_shards = 0
    memo_dir = tokens_memo_dir(cache_dir, cfg) if cache_dir is not None else None
    verified_entry(memo_dir)   # checked once here, not by each shard that opens it: a bad memo is discarded
    calls = [(count_shard, str(ingest_dir), lo, hi, cfg, str(mirror) if mirror else None,
              str(memo_dir) if memo_dir else None) for lo, hi in shards]
    with Progress("token counts", total=n_docs, unit="documents") as bar:
        for windows, n_tokens, hits, shard_keys in ordered_results(submit, calls, window):
            reused_docs += hits
            reused_shards += hits == windows.size
            per_doc.append(windows)
            tokens.append(n_tokens)
            keys.append(shard_keys)
            bar.update(len(windows), shards=len(per_doc))
    counts = np.concatenate(per_doc) if per_doc else np.zeros(0, np.int32)
    n_tokens = np.concatenate(tokens) if tokens else np.zeros(0, np.int32)
    offsets = np.zeros(n_docs + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    table = pa.table({
        "doc_id": doc_ids,
        "n_tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(n_tokens.astype(np.int32), pa.int32())),
        "tokenizer": pa.array([cfg.tokenizer] * n_docs, pa.string()),
    })
    C.WINDOW_TOKENS.write(table, out_dir)
    text_keys = np.concatenate(keys) if keys else np.zeros((0, 2), np.uint64)
    np.save(Path(out_dir) / TEXT_KEYS_FILE, np.ascontiguousarray(text_keys, np.uint64))
    if memo_dir is not None:
        ContentMemo.write(memo_dir, text_keys, {TOKENS_MEMO_FIELD: (offsets.astype(np.int64), n_tokens)})
    seconds = time.perf_counter() - t0
    return {"documents": n_docs, "windows": int(n_tokens.size), "tokens": int(n_tokens.sum()), "tokenizer": cfg.tokenizer,
            "shards": len(shards), "shards_reused": reused_shards, "shards_built": len(shards) - reused_shards,
            "documents_reused": reused_docs, "documents_counted": n_docs - reused_docs,
            "seconds": seconds, "tokens_per_s": float(n_tokens.sum()) / max(seconds, 1e-9)}


# ---------------------------------------------------------------------------------- segment
SEGMENT_SHARD_VERSION = "7"   # 6: doc and cluster ids from the page; 7: rows as the memo keeps them, no relabelling



def anchor_keys(names: Sequence[str]) -> np.ndarray:
    """``(n,)`` uint64: the first 8 bytes of BLAKE2b of each name (a cluster's first member title),
    the stable identity that places content-defined cuts (:func:`cluster_ranges`); the same on
    every machine and Python (no ``PYTHONHASHSEED``)."""
    return np.array([int.from_bytes(hashlib.blake2b(n.encode("utf-8"), digest_size=8).digest(), "little")
                     for n in names], dtype=np.uint64)


def cluster_ranges(cluster_ids: np.ndarray, n_tokens: np.ndarray, keys: np.ndarray,
                   max_tokens: int) -> list[tuple[int, int]]:
    """``[(lo, hi)]`` ranges of whole clusters (of ``cluster_ids``), each holding at most ``max_tokens``
    tokens (a cluster larger than that alone), with content-defined cuts.

    Shards of the segment, cluster-token and passage stages are ranges of whole clusters; a
    worker's memory grows with the text of its shard (measured at 1M pages: ~27 bytes a token for
    segmentation, ~34 for passage statistics), so shards are cut by tokens, not by member or
    cluster counts (Algorithm 1's order puts the long singleton articles last: equal member counts
    held 7x more text in the last shard). A cut must also stay put when a page elsewhere is edited,
    or the next nightly build rebuilds shards whose content did not change; cuts at running-sum
    multiples of a budget would all move with one edited page. So the cuts are content-defined
    (as in deduplicating backup chunkers): walking the clusters in order with ``acc`` tokens
    since the last cut,

    1. cut before cluster ``i`` if ``acc > 0`` and ``acc + n_tokens[i] > max_tokens`` (the bound);
    2. cut after cluster ``i`` if ``acc >= max_tokens / 2`` and cluster ``i`` is an *anchor*:
       ``keys[i] / 2**64 < 1 - exp(-n_tokens[i] / (max_tokens / 8))``, i.e. every token is an
       anchor point with probability ``8 / max_tokens``, decided by the cluster's own key and size.

    An anchor depends only on its own cluster, so an edit inside one shard moves no cut after the
    next anchor cut: the following shards keep their bytes. Shards hold ``max_tokens / 2`` to
    ``max_tokens`` tokens (mean ~0.62 ``max_tokens``; rule 1 fires in ~2% of shards: e^-4).

    Parameters
    ----------
    cluster_ids : ``(n_clusters,)`` distinct ascending numbers of the clusters (their ranks in
        ``clusters.parquet``, Algorithm 1's order, for the build's shards).
    n_tokens : ``(n_clusters,)`` tokens of each cluster (``clusters.parquet`` ``n_tokens``).
    keys : ``(n_clusters,)`` uint64 stable identities (:func:`anchor_keys` of first-member titles).
    max_tokens : the most tokens of a shard (>= 1).

    Raises
    ------
    ValueError
        ``max_tokens < 1``; lengths differ; ids not strictly ascending; a negative token count.
    """
    if max_tokens < 1:
        raise ValueError(f"cluster_ranges: max_tokens must be >= 1, got {max_tokens}")
    ids, w, keys = np.asarray(cluster_ids, np.int64), np.asarray(n_tokens, np.int64), np.asarray(keys, np.uint64)
    if not (ids.shape == w.shape == keys.shape) or ids.ndim != 1:
        raise ValueError(f"cluster_ranges: {ids.shape} ids, {w.shape} token counts, {keys.shape} keys")
    if ids.size == 0:
        return []
    if np.any(np.diff(ids) <= 0):
        raise ValueError("cluster_ranges: cluster ids are not strictly ascending")
    if np.any(w < 0):
        raise ValueError(f"cluster_ranges: negative token count for cluster {int(ids[np.argmax(w < 0)])}")
    anchor = (keys.astype(np.float64) / 2.0 ** 64 < -np.expm1(-w / (max_tokens / 8.0))).tolist()
    starts, acc, half = [0], 0, max_tokens / 2
    for i, t in enumerate(w.tolist()):
        if acc > 0 and acc + t > max_tokens:
            starts.append(i)
            acc = 0
        acc += t
        if acc >= half and anchor[i] and i + 1 < ids.size:
            starts.append(i + 1)
            acc = 0
    ends = [*starts[1:], ids.size]
    return [(int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, ends)]


def read_cluster_ranges(cluster_dir: Path, max_tokens: int,
                        member_cluster_ids: np.ndarray | None = None) -> list[tuple[int, int]]:
    """:func:`cluster_ranges` of a cluster stage's ``clusters.parquet`` (``n_tokens``, first
    member titles as anchor keys): a few columns of one row per cluster, not the texts. A range
    is of cluster ranks, rows of ``clusters.parquet`` (Algorithm 1's order; the members of ranks
    ``[lo, hi)``: :func:`read_cluster_members`).

    ``member_cluster_ids`` (``cluster_members.parquet``'s column, any order): raises
    ``ValueError`` naming the files unless its distinct ids are exactly the clusters' ids, so that
    no member falls outside every range."""
    table = C.CLUSTERS.read(cluster_dir, columns=["cluster_id", "n_tokens", "title"])
    ids = table.column("cluster_id").to_numpy()
    if member_cluster_ids is not None:
        used, have = np.unique(np.asarray(member_cluster_ids)), np.unique(ids)
        if not np.array_equal(used, have):
            extra, empty = np.setdiff1d(used, have)[:5].tolist(), np.setdiff1d(have, used)[:5].tolist()
            raise ValueError(f"{cluster_dir}: {C.CLUSTER_MEMBERS.filename} and {C.CLUSTERS.filename} disagree "
                             f"(member cluster ids not in clusters: {extra}; clusters without members: {empty})")
    return cluster_ranges(np.arange(ids.size), table.column("n_tokens").to_numpy(),
                          anchor_keys(table.column("title").to_pylist()), max_tokens)


def read_cluster_members(cluster_dir: Path, lo: int, hi: int) -> pa.Table:
    """The members of the clusters of ranks ``[lo, hi)`` (rows of ``clusters.parquet``), in file
    order (cluster, then position): ``cluster_members.parquet`` holds them in that order, so they
    are the rows between the clusters' running member counts."""
    counts = pq.read_table(Path(cluster_dir) / C.CLUSTERS.filename, columns=["n_members"]).column("n_members")
    first = np.r_[0, np.cumsum(counts.to_numpy(), dtype=np.int64)]
    return read_rows(Path(cluster_dir) / C.CLUSTER_MEMBERS.filename, int(first[lo]), int(first[hi]),
                     ["cluster_id", "position", "doc_id"])


def member_cluster_ranks(cluster_ids: np.ndarray) -> np.ndarray:
    """``(n_members,)`` int64: each member's cluster rank, from ``cluster_members.cluster_id`` in
    file order (clusters consecutive, in ``clusters.parquet``'s order)."""
    cids = np.asarray(cluster_ids)
    return np.cumsum(np.r_[False, cids[1:] != cids[:-1]], dtype=np.int64) if cids.size else np.zeros(0, np.int64)


def passage_row_ranges(segment_dir: Path, cluster_dir: Path, max_tokens: int) -> list[tuple[int, int]]:
    """The rows of ``passages.parquet`` that hold the passages of each range of
    :func:`read_cluster_ranges` (passages are in cluster order; a cluster whose articles have no
    words has none). Raises ``ValueError`` naming the file when a passage's cluster is not in
    ``clusters.parquet`` or the passages are not in cluster order."""
    ranges = read_cluster_ranges(cluster_dir, max_tokens)
    ids = C.CLUSTERS.read(cluster_dir, columns=["cluster_id"]).column("cluster_id").to_numpy()
    path = Path(segment_dir) / C.PASSAGES.filename
    pcids = pq.read_table(path, columns=["cluster_id"]).column("cluster_id").to_numpy()
    known = np.isin(pcids, ids)
    if not known.all():
        raise ValueError(f"{path}: {pcids.size} passages, but the cluster ranges of {cluster_dir} hold "
                         f"{int(known.sum())} (passages of clusters missing from {C.CLUSTERS.filename})")
    rank = C.rows_of(ids, pcids, str(Path(cluster_dir) / C.CLUSTERS.filename))
    if np.any(rank[1:] < rank[:-1]):
        raise ValueError(f"{path}: the passages are not in the cluster order of {Path(cluster_dir) / C.CLUSTERS.filename} "
                         f"(row {int(np.argmax(rank[1:] < rank[:-1])) + 1} is of an earlier cluster than the row before)")
    first = np.searchsorted(rank, np.arange(ids.size + 1), side="left")
    return [(int(first[lo]), int(first[hi])) for lo, hi in ranges]


def _segment_key(members: pa.Table, docs: pa.Table, text_keys: np.ndarray, tokens: pa.Table, cfg: SegmentConfig) -> str:
    h = hashlib.sha256(json.dumps([SEGMENT_SHARD_VERSION, config_hash(cfg), members.num_rows]).encode())   # the whole section
    for name in ("cluster_id", "position", "doc_id"):
        h.update(members.column(name).to_numpy().astype(np.int64).tobytes())
    Utf8Rows(docs.column("title")).hash_into(h)
    h.update(np.ascontiguousarray(text_keys, np.uint64).tobytes())   # the texts, each hashed once a shard
    h.update(pc.list_value_length(tokens.column("n_tokens")).to_numpy().astype(np.int64).tobytes())
    h.update(pc.list_flatten(tokens.column("n_tokens")).to_numpy().astype(np.int32).tobytes())
    h.update(json.dumps(sorted(set(tokens.column("tokenizer").to_pylist()))).encode())
    return h.hexdigest()


def segment_shard(ingest_dir: str, tokens_dir: str, cluster_dir: str, lo: int, hi: int, cfg: SegmentConfig,
                  mirror: str | None, cache_dir: str, docs_dir: str,
                  memo: str | None = None) -> tuple[str, int, int, bool]:
    """Units and passages of the clusters of ranks ``lo <= rank < hi`` (a worker-process call), rows in
    cluster order exactly as :func:`tasks.corpus.segment.segment_corpus` makes them (the same
    :func:`tasks.corpus.segment.segment_clusters`, on the clusters the memo lacks), written to
    ``cache_dir/<sha256 of the shard's inputs>/{units,passages}.arrow`` (:func:`tasks.corpus.sharded.segment_memo.write_rows`).

    Returns ``(that directory, articles without words, clusters taken from the memo or the entry,
    reused)``; ``reused`` when the directory was already complete (the shard's members, texts and
    token counts are unchanged). The rows go back through the files rather than through ``submit``, so
    the coordinator reads one shard's rows at a time however many shards are in flight. Reads only
    the shard's members, their documents (``docs_dir``, the shard's partition by
    :func:`partition_documents`) and their window token counts (:func:`read_rows_at`: memory
    bounded by a row group, not by the files).

    With ``memo`` (the segmentation memo's manifest, :func:`tasks.corpus.sharded.segment_memo.memo_dir`,
    checked by the build before), a cluster whose id, members' ids, titles, texts and token counts
    the last build segmented takes its rows from the part of the last build that holds it as they
    are (:func:`tasks.corpus.sharded.segment_memo.cluster_keys`), and the directory also keeps the
    shard's part, which the next memo names (:func:`tasks.corpus.sharded.segment_memo.write_part`).
    """
    members = read_cluster_members(Path(cluster_dir), lo, hi)
    wanted = np.unique(members.column("doc_id").to_numpy())
    docs = read_shard_documents(docs_dir)
    doc_ids, doc_rows = docs.column("doc_id").to_numpy(), docs.column(ROW).to_numpy()
    tokens = read_rows_at(Path(tokens_dir) / C.WINDOW_TOKENS.filename, doc_rows, C.WINDOW_TOKENS.schema.names)
    if doc_ids.size != wanted.size or not np.array_equal(tokens.column("doc_id").to_numpy(), doc_ids):
        raise ValueError(f"clusters {lo}..{hi - 1}: members refer to documents missing from documents or window tokens")
    docs = docs.select(DOC_COLUMNS)
    text_keys = document_text_keys(tokens_dir, doc_rows, lambda: docs.column("text"))   # the shard's key, the clusters' keys
    cached = Path(cache_dir) / _segment_key(members, docs, text_keys, tokens, cfg)
    if verified_entry(cached):
        mark_used(cached)
        n_clusters = len(set(members.column("cluster_id").to_pylist()))
        return str(cached), int((cached / "COMPLETE").read_text()), n_clusters, True
    text_bytes = Utf8Rows(docs.column("text"))
    col = tokens.column("n_tokens").combine_chunks()
    offsets, values = col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False).astype(np.int32)
    counter = load_token_counter(cfg.tokenizer, Path(mirror) if mirror else None)
    names = set(tokens.column("tokenizer").to_pylist())
    if names and names != {counter.name}:
        raise ValueError(f"window tokens were counted with {sorted(names)}, segment.tokenizer is {counter.name!r}")
    cids, dids = members.column("cluster_id").to_numpy(), members.column("doc_id").to_numpy()
    rows = C.rows_of(doc_ids, dids, f"documents of clusters {lo}..{hi - 1}")
    starts = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1]]) if cids.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], cids.size]
    bounds = list(zip(starts.tolist(), ends.tolist()))
    titles = docs.column("title")
    keys = (SM.cluster_keys(bounds, rows.tolist(), cids[starts], doc_ids, titles, text_keys, offsets, values)
            if memo is not None else None)
    kept = SM.SegmentMemo.open(memo, warn=False) if memo is not None else None   # the build logged skipped parts
    found = kept.lookup(keys) if kept is not None else np.full(len(bounds), -1, np.int64)
    todo = [b for b, f in zip(bounds, found.tolist()) if f < 0]
    # Python strings only of the documents of the clusters segmented tonight, not of the memo's
    needed = np.unique(np.concatenate([rows[s:e] for s, e in todo])) if todo else np.zeros(0, np.int64)
    texts = dict(zip(needed.tolist(), take_texts(docs.column("text"), needed)))
    names_of = dict(zip(needed.tolist(), take_texts(titles, needed)))
    what = f"segment clusters {lo:,}-{hi - 1:,}"

    def clusters():
        for s, e in progress(todo, what, unit="clusters"):
            rs = rows[s:e].tolist()
            yield (int(cids[s]), dids[s:e], [names_of[r] for r in rs], [texts[r] for r in rs],
                   [values[offsets[r]:offsets[r + 1]] for r in rs])

    computed = segment_clusters(clusters(), cfg, counter)
    if kept is not None:
        units, passages, counts = SM.interleave(computed, kept.take(found[found >= 0]), found >= 0)
    else:
        units, passages, counts = computed
    n_empty = text_bytes.count_blank()

    def write(tmp: Path) -> None:
        SM.write_rows(tmp / SM.UNITS_FILE, units)
        SM.write_rows(tmp / SM.PASSAGES_FILE, passages)
        if memo is not None:
            SM.write_part(tmp, keys, counts)
        (tmp / "COMPLETE").write_text(f"{n_empty}\n")
    put_cached(cached, write)
    return str(cached), n_empty, len(bounds) - len(todo), False


def run_segment_sharded(ingest_dir: Path, tokens_dir: Path, cluster_dir: Path, out_dir: Path, cfg: SegmentConfig,
                        mirror: Path | None, submit: Callable[..., Any], tokens_per_shard: int, window: int = 8,
                        cache_dir: Path | None = None, docs_per_range: int = 20_000,
                        split_dir: Path | None = None) -> dict[str, Any]:
    """:func:`tasks.corpus.stages.run_segment` over cluster ranges segmented through ``submit``.

    Shards are ranges of whole clusters of at most ``tokens_per_shard`` tokens (content-defined
    cuts, :func:`cluster_ranges`); their rows are written in cluster order, so ``document_units.parquet``
    and ``passages.parquet`` are byte-identical to the one-process stage's. The coordinator checks
    the members (every document in exactly one cluster) and reads the shards' rows back from
    their files one shard at a time (at most ``window`` shards in flight). The shards' documents
    are first split by shard in one parallel pass over ``documents.parquet`` of ``docs_per_range``
    documents a task (:func:`partition_documents`, a scratch directory removed after), so each
    shard reads its own documents only, not every row group. With ``cache_dir`` (shared by the
    workers) a shard whose members, texts and token counts are unchanged reuses its rows; the
    summary's ``shards_reused`` / ``shards_built`` say how many; and a cluster of any other shard
    that the last build segmented (same id, members, titles, texts) takes its rows from the segmentation memo
    (:mod:`tasks.corpus.sharded.segment_memo`: the last build's shard entries, checked once here
    before the shards open it, then replaced after the shards by a manifest of this build's;
    ``clusters_reused`` of ``clusters``). Without it the shards' rows pass
    through ``out_dir/.segment-shards`` (removed after). ``split_dir``: the build's shared
    :class:`DocumentSplit` directory (the cluster index takes the same split from it). Summary:
    counts, shards, the partition's and the whole stage's seconds, and the coordinator's CPU
    seconds checking the memo (its manifest and parts) and writing the next one.
    """
    t0 = time.perf_counter()
    doc_ids = pq.read_table(Path(ingest_dir) / C.DOCUMENTS.filename, columns=["doc_id"]).column("doc_id").to_numpy()
    members = C.CLUSTER_MEMBERS.read(cluster_dir, columns=["cluster_id", "position", "doc_id"])
    cids = members.column("cluster_id").to_numpy()
    doc_rows = check_members(doc_ids, members.column("doc_id").to_numpy())
    ranks = member_cluster_ranks(cids)
    n_clusters = int(ranks[-1]) + 1 if cids.size else 0
    ranges = read_cluster_ranges(cluster_dir, tokens_per_shard, cids)
    rows_dir = Path(out_dir) / ".segment-shards" if cache_dir is None else Path(cache_dir)
    rows_dir.mkdir(parents=True, exist_ok=True)
    split = DocumentSplit(split_dir, rows_dir)
    n_units = n_passages = unit_tokens = n_empty = reused = clusters_reused = 0
    try:
        docs_dirs = split.partition(ingest_dir, ranges, ranks, doc_rows, submit, docs_per_range, window)
        del members
        t_partition = time.perf_counter() - t0
        memo = SM.memo_dir(rows_dir, cfg) if cache_dir is not None else None
        # checked once here, not by each shard that opens it: the manifest and every part it lists
        # (a bad one is discarded and its clusters cut again)
        verify_cpu = write_cpu = 0.0
        if memo is not None:
            t_verify = time.process_time()
            SM.verify_memo(memo)
            verify_cpu = time.process_time() - t_verify
        calls = [(segment_shard, str(ingest_dir), str(tokens_dir), str(cluster_dir), lo, hi, cfg,
                  str(mirror) if mirror else None, str(rows_dir), str(d), str(memo) if memo else None)
                 for (lo, hi), d in zip(ranges, docs_dirs)]
        parts: list[Path] = []   # this build's shard entries: the next memo names them
        with C.DOCUMENT_UNITS.open_writer(out_dir) as units_out, C.PASSAGES.open_writer(out_dir) as passages_out:
            for kept, empty, from_memo, hit in ordered_results(submit, calls, window, "segment shards"):
                clusters_reused += from_memo
                units = SM.read_rows(Path(kept) / SM.UNITS_FILE)
                units_out.write(units)
                n_units += units.num_rows
                unit_tokens += int(pc.sum(units.column("n_tokens")).as_py() or 0)
                passages = SM.read_rows(Path(kept) / SM.PASSAGES_FILE)
                passages_out.write(passages)
                n_passages += passages.num_rows
                if memo is not None and SM.has_part(Path(kept)):
                    parts.append(Path(kept))
                del units, passages
                n_empty, reused = n_empty + empty, reused + hit
        # put in place after the last shard (no shard reads the memo then)
        if memo is not None:
            t_write = time.process_time()
            SM.write_manifest(memo, parts)
            write_cpu = time.process_time() - t_write
    finally:
        split.close()
        if cache_dir is None:
            shutil.rmtree(rows_dir, ignore_errors=True)
    if n_empty:
        log.warning("segmentation: %d article(s) have no words and contribute no passage", n_empty)
    return {"document_units": n_units, "passages": n_passages,
            "mean_unit_tokens": unit_tokens / n_units if n_units else 0.0,
            "articles_without_passages": n_empty, "shards": len(ranges), "shards_reused": reused,
            "shards_built": len(ranges) - reused, "clusters": n_clusters, "clusters_reused": clusters_reused,
            "partition_seconds": t_partition, "split_reused": split.reused,
            "memo_verify_cpu_seconds": verify_cpu, "memo_write_cpu_seconds": write_cpu,
            "seconds": time.perf_counter() - t0}
