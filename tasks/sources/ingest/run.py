"""The ingest stage: raw Wikipedia-like inputs → documents, redirects, links, ingest report.

Two passes, memory bounded by ``IngestConfig.shard_size`` (plus the title → id map):

1. stream every input record, account for it in the ingest report, clean kept pages and
   extract their links, spill them to title-sorted temporary shards; collect titles, each kept
   title's page id and the redirect table;
2. sort the kept titles (the documents' row order) and give each its ``doc_id`` (from the page:
   :func:`document_ids`), resolve redirects, merge the shards in title order and write
   ``documents`` and ``links`` (link targets resolved through redirects, written with the ids).

This is the corpus-build input of FunnelRAG (Wikipedia articles and their hyperlink graph,
from which clusters are built, Algorithm 1).
"""
from __future__ import annotations

import itertools
import logging
import tempfile
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS, title_doc_id
from funnelrag.progress import Progress
from tasks.sources.ingest.changes import ChangesFile, PageChanges, merge_pages
from tasks.sources.ingest.config import KEPT, IngestConfig, IngestError, IngestSummary
from tasks.sources.ingest.jsonl import JsonlReader
from tasks.sources.ingest.lookup import TitleIndex
from tasks.sources.ingest.mediawiki import MediaWikiReader
from tasks.sources.ingest.multistream import plan_layout
from tasks.sources.ingest.page_pass import PagePass
from tasks.sources.ingest.parallel import run_pieces
from tasks.sources.ingest.redirects import resolve_redirects
from tasks.sources.ingest.shards import ShardWriter, merge_shards
from tasks.sources.ingest.titles import DEFAULT_NAMESPACES
from tasks.sources.ingest.wikispeedia import WikispeediaReader

logger = logging.getLogger(__name__)

DOC_GROUP_ROWS = 4_096          # a documents row group ends after this many rows ...
DOC_GROUP_BYTES = 8 * 1024 * 1024  # ... or this many characters of text (bounds pass-2 memory)
_LINK_BATCH = 200_000
MERGE_BLOCK_DOCS = 1_024   # documents of one merged block in pass 2 (merge bounds: every 1,024th kept title)
LINK_RESOLVE_DOCS = 4_096   # documents whose links are resolved together (distinct targets looked up once)


def ingest(inputs: Sequence[Path], out_dir: Path, cfg: IngestConfig, submit: Callable[..., Any] | None = None,
           streams_per_piece: int = 100, window: int = 8, piece_cache: Path | None = None,
           changes: PageChanges | ChangesFile | None = None) -> IngestSummary:
    """Ingest raw article dumps into the corpus tables.

    Writes, atomically and validated against their contracts, into ``out_dir``:
    ``documents.parquet`` (one row per kept main-namespace article, in sorted title order;
    ``doc_id`` from the page, :func:`document_ids`), ``redirects.parquet`` (sorted by
    source title), ``links.parquet`` (distinct ``(src_doc_id, dst_doc_id)`` pairs in the
    documents' row order, source then target; self links kept unless ``cfg.drop_self_links``) and ``ingest_report.parquet`` (every input
    record, in input order). The same inputs (same order) and config give byte-identical
    files, whatever ``shard_size``.

    Parameters
    ----------
    inputs : sequence of Path
        Input files, read in the given order (the first of two pages with the same title wins).
        ``mediawiki``: XML dumps (``.xml``, ``.bz2``, ``.gz``); ``wikispeedia``: the articles
        and paths-and-graph ``.tar.gz`` archives (any order); ``jsonl``: JSON-lines files.
    out_dir : Path
        Directory for the four artifacts (created if missing). Temporary shards live in a
        hidden sub-directory that is removed afterwards.
    cfg : IngestConfig
        Format, shard size, size limits and disambiguation handling.
    submit : callable, optional
        ``submit(fn, *args) -> future`` (``concurrent.futures`` executor ``submit``, or a task
        runner's): multistream ``.xml.bz2`` MediaWiki inputs are then cut into pieces of
        ``streams_per_piece`` bz2 streams (offsets from the ``-index.txt.bz2`` beside the dump,
        else a scan for stream headers) parsed in parallel, at most ``window`` pieces at a time
        (:mod:`tasks.sources.ingest.parallel`). Other inputs, and every input without ``submit``,
        are read serially. The artifacts are the same either way.
    piece_cache : Path, optional
        Directory (shared by the workers) where each piece's pass-1 output is kept under the
        sha256 of its compressed bytes and the config: a nightly rebuild re-parses only the
        pieces whose bytes changed (``IngestSummary.pieces`` counts built and reused ones).
    changes : PageChanges or ChangesFile, optional
        Adds-changes revisions (in memory, or a changes file read a row group at a time) applied to
        the one MediaWiki input while it is read (:mod:`tasks.sources.ingest.changes`): the
        artifacts are those of ingesting the merged dump named ``changes.source`` (a changed page
        replaced, a new one inserted by page id), without writing that dump. With ``submit``, the
        dump's multistream index places each revision in its piece, and a piece without revisions
        is the base dump's (piece cache hit).

    Returns
    -------
    IngestSummary
        Counts by status, skip reason, redirect status, link fate; bytes read; seconds.

    Raises
    ------
    FileNotFoundError
        An input does not exist.
    ValueError
        No inputs, or two inputs with the same file name (the report keys on it); ``changes`` with
        another format than ``mediawiki`` or another number of inputs than one.
    tasks.sources.ingest.IngestError
        An input cannot be read to the end (truncated archive, malformed XML); names the file,
        the position and the last complete record; or two kept articles have the same ``doc_id``
        (names both titles). Nothing is written.
    """
    wall0, cpu0 = time.perf_counter(), time.process_time()
    inputs = [Path(p) for p in inputs]
    if not inputs:
        raise ValueError("ingest: no input files")
    for path in inputs:
        if not path.is_file():
            raise FileNotFoundError(f"ingest: input {path} does not exist")
    names = Counter(p.name for p in inputs)
    if max(names.values()) > 1:
        dups = sorted(n for n, c in names.items() if c > 1)
        raise ValueError(f"ingest: input file names must be distinct (the report keys on them), got {dups}")
    if changes is not None and (cfg.format != "mediawiki" or len(inputs) != 1):
        raise ValueError(f"ingest: adds-changes apply to one MediaWiki dump, got format {cfg.format!r} and "
                         f"{len(inputs)} inputs")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ingest-shards-", dir=out_dir) as tmp, ExitStack() as stack:
        report = stack.enter_context(INGEST_REPORT.open_writer(out_dir))
        state = _FirstPass(cfg, ShardWriter(Path(tmp), cfg.shard_size), report)
        state.changes = changes
        if submit is not None:
            state.parallel = (submit, streams_per_piece, window, piece_cache)
        uncompressed = state.run(inputs)
        pass2_start = time.perf_counter()
        kept = sorted(t for t, s in state.titles.items() if s == KEPT)
        ids = document_ids(cfg.format, kept, pa.array([state.page_ids[t] for t in kept], pa.int64()))
        state.page_ids = {}   # pass 2 needs only the ids
        check_distinct_ids(ids, kept)
        title_to_id = dict(zip(kept, range(len(kept))))
        rows, resolved = resolve_redirects(state.redirects, title_to_id, state.titles)
        redirects = stack.enter_context(REDIRECTS.open_writer(out_dir, sorted_keys=True))
        for start in range(0, len(rows), _LINK_BATCH):
            redirects.write(dict(zip(("source_title", "target_title", "status", "hops"),
                                     map(list, zip(*rows[start:start + _LINK_BATCH])))))
        docs = stack.enter_context(DOCUMENTS.open_writer(out_dir, row_group_size=None))
        links = stack.enter_context(LINKS.open_writer(out_dir))
        _second_pass(state, kept, ids, LinkTargets(kept, resolved), docs, links)
        counts = state.links
        if counts.accounted() != counts.seen:
            raise AssertionError(f"link accounting broken: {counts}")
        outputs = {c.name: w.final for c, w in ((DOCUMENTS, docs), (REDIRECTS, redirects), (LINKS, links),
                                                (INGEST_REPORT, report))}
        # leaving the block commits links, documents, redirects, then the report (atomic renames)
    summary = IngestSummary(
        documents=len(title_to_id), redirects=len(rows), links=counts.kept, records=state.records,
        by_status=dict(sorted(state.by_status.items())), skipped=dict(sorted(state.skipped.items())),
        redirect_status=dict(sorted(Counter(r[2] for r in rows).items())), link_counts=counts,
        input_bytes=sum(p.stat().st_size for p in inputs), uncompressed_bytes=uncompressed,
        shards=len(state.shards.paths), seconds=time.perf_counter() - wall0,
        cpu_seconds=time.process_time() - cpu0, outputs=outputs, pieces=dict(sorted(state.pieces.items())),
        cleaned_pages=dict(sorted(state.cleaned.items())), stale_revisions=state.stale_revisions,
        pass2_seconds=time.perf_counter() - pass2_start)
    logger.info("ingest %s: %d documents, %d redirects, %d links, skipped %s (%.1f s)", cfg.format,
                summary.documents, summary.redirects, summary.links, summary.skipped, summary.seconds)
    return summary


class _FirstPass(PagePass):
    """Pass 1: account for every record, clean kept pages into shards, collect titles."""

    def __init__(self, cfg: IngestConfig, shards: ShardWriter, report):
        super().__init__(cfg, shards, report)
        self.parallel: tuple | None = None   # (submit, streams per piece, window, piece cache)
        self.pieces: Counter[str] = Counter()  # multistream pieces built / reused
        self.cleaned: Counter[str] = Counter()  # kept wikitext pages cleaned / taken from the page memo
        self.progress: Progress | None = None   # pages read, while :meth:`run` runs
        self.changes: PageChanges | ChangesFile | None = None   # adds-changes applied while the one input is read
        self.stale_revisions = 0   # adds-changes revisions not newer than the base's, skipped

    def run(self, inputs: list[Path]) -> int:
        """Read all inputs; returns the uncompressed bytes read (pages counted on ``self.progress``)."""
        with Progress("ingest pass 1", unit="pages") as self.progress:
            return self._run(inputs)

    def _run(self, inputs: list[Path]) -> int:
        fmt, total, bar = self.cfg.format, 0, self.progress
        if fmt == "wikispeedia":
            reader = WikispeediaReader(inputs, self.cfg.max_page_bytes)
            for page in reader.pages():
                self.process(page, DEFAULT_NAMESPACES)
                bar.update()
            stats = reader.link_stats
            self.links.seen += stats["malformed"] + stats["unknown_source"]
            self.links.malformed += stats["malformed"]
            self.links.unknown_source += stats["unknown_source"]
            total = reader.bytes_read
        for path in inputs if fmt != "wikispeedia" else ():
            layout = (plan_layout(path, self.parallel[1], index_cache=self.parallel[3])
                      if self.parallel and fmt == "mediawiki" else None)
            if layout is not None:
                total += run_pieces(self, layout, self.parallel[0], self.shards.directory, self.parallel[2],
                                    self.parallel[3], self.changes)
                continue
            reader = MediaWikiReader(path) if fmt == "mediawiki" else JsonlReader(path, self.cfg.max_page_bytes)
            pages = reader.pages()
            stale: list[int] = []
            if self.changes is not None:
                pages = merge_pages(pages, self.changes.revisions(), self.changes.source, stale)
            for page in pages:
                self.process(page, getattr(reader, "namespaces", DEFAULT_NAMESPACES))
                bar.update()
            self.stale_revisions += len(stale)
            total += reader.bytes_read
        self._flush_report()
        self.shards.flush()
        return total


def document_ids(fmt: str, titles: Sequence[str], page_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The ``doc_id`` of each kept article (``(n,)`` int64): its dump page id for MediaWiki dumps
    (stable for as long as the page exists, whatever its title), the 63-bit title hash
    :func:`data_contracts.corpus.title_doc_id` for sources without page ids (``wikispeedia``,
    ``jsonl``: stable for as long as the title is).

    Raises
    ------
    IngestError
        A MediaWiki page without a page id (names its title).
    """
    if fmt != "mediawiki":
        return np.fromiter((title_doc_id(t) for t in titles), np.int64, count=len(titles))
    if page_ids.null_count:
        missing = pc.indices_nonzero(pc.is_null(page_ids)).to_pylist()[0]
        raise IngestError(f"ingest: page {titles[missing]!r} has no page id, which a MediaWiki document's doc_id is")
    return page_ids.to_numpy().astype(np.int64)


def check_distinct_ids(ids: np.ndarray, kept: list[str]) -> None:
    """Raise :class:`IngestError` naming two titles when ``ids`` (one a kept title, title order) repeat."""
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if same.size:
        a, b = int(order[same[0]]), int(order[same[0] + 1])
        raise IngestError(f"ingest: articles {kept[a]!r} and {kept[b]!r} have the same doc_id {int(ids[a])}")


def _second_pass(state: _FirstPass, kept: list[str], ids: np.ndarray, targets: "LinkTargets", docs, links) -> None:
    """Pass 2: merge shards in title order, write documents and resolved, deduplicated links.

    ``ids`` (``(len(kept),)`` int64) is each kept title's ``doc_id`` (:func:`document_ids` of the
    page ids pass 1 collected beside the titles); links are resolved to document rows (title
    order) and written with those ids.

    The shards are merged in blocks of :data:`MERGE_BLOCK_DOCS` kept titles (merge bounds taken
    from ``kept``; with more than ``FAN_IN`` shards the runs are merged first, in the workers
    when the ingest has a ``submit``). Documents go out in row groups cut after
    :data:`DOC_GROUP_ROWS` rows or :data:`DOC_GROUP_BYTES` characters of text, whichever comes
    first (a function of the documents only, so the file does not depend on ``shard_size`` or
    the block size). Texts go from the shards to ``documents.parquet`` as Arrow arrays; links
    are resolved :data:`LINK_RESOLVE_DOCS` documents at a time (:func:`_resolve_links`, through
    the compiled title index of ``targets``). The Parquet writes (zstd compression, which
    releases the GIL) run on background threads, one for ``documents`` and one for ``links``,
    each in order and at most two behind (:class:`_WriteBehind`), while this thread merges,
    resolves the next block and joins each row group's chunks (so the documents writer, which
    bounds pass 2's wall time, only encodes and compresses).
    """
    doc_id = 0   # the row (rank in sorted titles) of the next document
    group: list[pa.Table] = []   # documents of the row group being filled
    group_rows = group_chars = 0
    src_parts: list[np.ndarray] = []
    dst_parts: list[np.ndarray] = []
    n_links = 0
    pending_links: list[pa.ChunkedArray] = []   # link targets of documents link_first, ... not resolved yet
    link_first = n_pending = 0
    bounds = kept[MERGE_BLOCK_DOCS - 1::MERGE_BLOCK_DOCS]
    if kept and len(kept) % MERGE_BLOCK_DOCS:
        bounds.append(kept[-1])
    submit = state.parallel[0] if state.parallel else None
    with _WriteBehind() as writes, _WriteBehind() as link_writes:
        for block in merge_shards(state.shards.paths, state.shards.group_rows, bounds=bounds, submit=submit):
            n = block.num_rows
            titles = block.column("title").to_pylist()
            if titles != kept[doc_id:doc_id + n]:
                bad = next(i for i, t in enumerate(titles) if doc_id + i >= len(kept) or kept[doc_id + i] != t)
                raise AssertionError(f"shard merge out of order at {titles[bad]!r}")
            table = pa.table({"doc_id": pa.array(ids[doc_id:doc_id + n]),
                              **{name: block.column(name) for name in ("title", "text", "page_id", "source")}})
            pending_links.append(block.column("links"))
            n_pending += n
            if n_pending >= LINK_RESOLVE_DOCS or doc_id + n == len(kept):
                src, dst = _resolve_links(pa.chunked_array([c for a in pending_links for c in a.chunks],
                                                           type=block.schema.field("links").type),
                                          link_first, targets, state)
                pending_links, link_first, n_pending = [], doc_id + n, 0
                src_parts.append(src)
                dst_parts.append(dst)
                n_links += len(src)
                if n_links >= _LINK_BATCH:
                    link_writes.submit(_write_links, links, ids, np.concatenate(src_parts), np.concatenate(dst_parts))
                    src_parts, dst_parts, n_links = [], [], 0
            chars = pc.utf8_length(block.column("text")).to_numpy()
            start = 0
            while start < n:   # cut row groups exactly where the row-at-a-time rule would
                cumulative = np.cumsum(chars[start:], dtype=np.int64) + group_chars
                cut = min(start + DOC_GROUP_ROWS - group_rows - 1,
                          start + int(np.searchsorted(cumulative, DOC_GROUP_BYTES, side="left")))
                if cut >= n:
                    group.append(table.slice(start))
                    group_rows += n - start
                    group_chars = int(cumulative[-1])
                    break
                group.append(table.slice(start, cut + 1 - start))
                writes.submit(docs.write, pa.concat_tables(group).combine_chunks())
                group, group_rows, group_chars = [], 0, 0
                start = cut + 1
            doc_id += n
        if doc_id != len(kept):   # the last batch of links is resolved at the last kept title
            raise AssertionError(f"{len(kept)} kept titles but {doc_id} documents merged")
        if group:
            writes.submit(docs.write, pa.concat_tables(group).combine_chunks())
        if n_links:
            link_writes.submit(_write_links, links, ids, np.concatenate(src_parts), np.concatenate(dst_parts))
    if len(kept) != docs.rows_written:
        raise AssertionError(f"{len(kept)} kept titles but {docs.rows_written} documents merged")


def _write_links(links, ids: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """Write links given as document rows (``src``, ``dst``) with the documents' ids ``ids``."""
    links.write({"src_doc_id": ids[src], "dst_doc_id": ids[dst]})


class _WriteBehind:
    """Calls handed to one background thread, run in the order given, at most ``depth`` not yet
    finished (so at most ``depth`` blocks are held for it). Used for Parquet writes, whose encoding
    and compression release the GIL. After a call fails, the calls queued behind it are skipped;
    the first error is raised by the next :meth:`submit` or on leaving the ``with`` block; leaving
    it on an error waits for the thread and keeps that error."""

    def __init__(self, depth: int = 2):
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-write")
        self._pending: deque = deque()
        self._failed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        while len(self._pending) >= self.depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._call, fn, args))

    def _call(self, fn: Callable[..., Any], args: tuple) -> None:
        if self._failed:
            return
        try:
            fn(*args)
        except BaseException:
            self._failed = True
            raise

    def __enter__(self) -> "_WriteBehind":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            while self._pending:
                future = self._pending.popleft()
                if exc_type is None:
                    future.result()
                else:
                    future.exception()   # wait; the error being raised is the one to report
        finally:
            for future in self._pending:
                future.exception()
            self._pool.shutdown(wait=True)


class LinkTargets:
    """Where a link target leads: a kept article (its ``doc_id``) or a resolved redirect (the
    ``doc_id`` at the end of its chain), looked up by :class:`~tasks.sources.ingest.lookup.TitleIndex`.

    Parameters
    ----------
    kept : list of str
        Kept titles in ``doc_id`` order (row ``i`` of the index is ``doc_id`` ``i``).
    resolved : dict
        ``{redirect title: doc_id}`` of the resolved redirects (:func:`resolve_redirects`); their
        rows follow the kept titles.

    Raises
    ------
    ValueError
        A title is both kept and a redirect (pass 1 gives every title one status).
    """

    def __init__(self, kept: list[str], resolved: dict[str, int]):
        self.n_kept = len(kept)
        self.index = TitleIndex(pa.array(itertools.chain(kept, resolved), pa.large_string(),
                                         size=len(kept) + len(resolved)))
        self.ends = np.concatenate([np.arange(len(kept), dtype=np.int64),       # (n_kept + n_resolved,)
                                    np.fromiter(resolved.values(), dtype=np.int64, count=len(resolved))])


def _resolve_links(targets: pa.ChunkedArray, first_doc: int, lookup: LinkTargets,
                   state: _FirstPass) -> tuple[np.ndarray, np.ndarray]:
    """Links of documents ``first_doc, first_doc + 1, ...`` (``targets``: their normalised link
    targets, distinct per document) as sorted, distinct ``(src_doc_id, dst_doc_id)`` pairs.

    Targets go to a kept article directly or through a resolved redirect (one compiled lookup of
    every target, :class:`LinkTargets`); the others count as ``to_excluded`` (the title exists
    but was not kept) or ``unresolved``. A pair seen again
    (two targets reaching one article) counts as ``duplicate``; self links are kept and counted
    (``self_kept``) unless ``drop_self_links``. Same counts as going through the targets of each
    document in order: the first occurrence of a pair is the one kept (a stable sort).

    Returns
    -------
    src, dst : np.ndarray of int32, shape (n_links,)
        Sorted by ``(src, dst)``.
    """
    counts = state.links
    targets = targets.combine_chunks()
    lengths = pc.list_value_length(targets).fill_null(0).to_numpy()
    flat = targets.flatten()
    rows = lookup.index.rows(flat)                 # (n_targets,) row in the index, -1: neither kept nor resolved
    hit = rows >= 0
    dst = np.full(len(rows), -1, dtype=np.int64)
    dst[hit] = lookup.ends[rows[hit]]
    via = rows >= lookup.n_kept
    lost = np.flatnonzero(~hit)
    if lost.size:   # not a kept article nor a resolved redirect: an excluded page, or missing
        encoded = pc.dictionary_encode(flat.take(pa.array(lost)))
        names = encoded.dictionary.to_pylist()
        times = np.bincount(encoded.indices.to_numpy(), minlength=len(names))
        exists = np.fromiter(map(state.titles.__contains__, names), dtype=bool, count=len(names))
        counts.to_excluded += int(times[exists].sum())
        counts.unresolved += int(times[~exists].sum())
    src = np.repeat(np.arange(first_doc, first_doc + len(lengths), dtype=np.int64), lengths)
    found = dst >= 0
    src, dst, via = src[found], dst[found], via[found]
    if state.cfg.drop_self_links:
        self_link = src == dst
        counts.self_link += int(self_link.sum())
        src, dst, via = src[~self_link], dst[~self_link], via[~self_link]
    pairs = (src << 32) | dst                      # doc ids < 2**31: one key, ordered as (src, dst)
    order = np.argsort(pairs, kind="stable")       # stable: the first occurrence of a pair comes first
    pairs, via = pairs[order], via[order]
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = pairs[1:] != pairs[:-1]
    counts.duplicate += int(len(pairs) - first.sum())
    pairs, via = pairs[first], via[first]
    src, dst = pairs >> 32, pairs & 0xFFFFFFFF
    counts.via_redirect += int(via.sum())
    counts.self_kept += int((src == dst).sum())
    counts.kept += len(pairs)
    return src.astype(np.int32), dst.astype(np.int32)
