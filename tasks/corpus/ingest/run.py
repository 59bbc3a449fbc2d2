"""The ingest stage: raw Wikipedia-like inputs → documents, redirects, links, ingest report.

Two passes, memory bounded by ``IngestConfig.shard_size`` (plus the title → id map):

1. stream every input record, account for it in the ingest report, clean kept pages and
   extract their links, spill them to title-sorted temporary shards; collect titles and the
   redirect table;
2. assign ``doc_id`` in sorted title order, resolve redirects, merge the shards in title order
   and write ``documents`` and ``links`` (link targets resolved through redirects).

This is the corpus-build input of FunnelRAG (Wikipedia articles and their hyperlink graph,
from which clusters are built, Algorithm 1).
"""
from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS
from tasks.corpus.ingest.config import (DISAMBIGUATION, DUPLICATE_TITLE, EMPTY_TEXT, KEPT, MALFORMED_PAGE,
                                 OTHER_NAMESPACE, OVERSIZE, REDIRECT, SKIPPED, IngestConfig,
                                 IngestSummary, LinkCounts)
from tasks.corpus.ingest.jsonl import JsonlReader
from tasks.corpus.ingest.mediawiki import MediaWikiReader
from tasks.corpus.ingest.multistream import plan_layout
from tasks.corpus.ingest.parallel import run_pieces
from tasks.corpus.ingest.records import WIKITEXT, RawPage
from tasks.corpus.ingest.redirects import resolve_redirects
from tasks.corpus.ingest.shards import ShardWriter, merge_shards
from tasks.corpus.ingest.titles import ARTICLE, DEFAULT_NAMESPACES, classify_link, normalise_title
from tasks.corpus.ingest.wikispeedia import WikispeediaReader
from tasks.corpus.ingest.wikitext import clean_wikitext, extract_link_targets, is_disambiguation

logger = logging.getLogger(__name__)

_REPORT_BATCH = 20_000
DOC_GROUP_ROWS = 4_096          # a documents row group ends after this many rows ...
DOC_GROUP_BYTES = 8 * 1024 * 1024  # ... or this many bytes of text (bounds pass-2 memory)
_LINK_BATCH = 200_000
_PROGRESS_EVERY = 100_000
_LINK_CACHE = 500_000  # distinct raw link targets remembered (cleared when full)
_REPORT_FIELDS = [f.name for f in INGEST_REPORT.schema]


def ingest(inputs: Sequence[Path], out_dir: Path, cfg: IngestConfig, submit: Callable[..., Any] | None = None,
           streams_per_piece: int = 100, window: int = 8, piece_cache: Path | None = None) -> IngestSummary:
    """Ingest raw article dumps into the corpus tables.

    Writes, atomically and validated against their contracts, into ``out_dir``:
    ``documents.parquet`` (one row per kept main-namespace article, ``doc_id`` dense int32
    0..n-1 in sorted title order, sorted by ``doc_id``), ``redirects.parquet`` (sorted by
    source title), ``links.parquet`` (distinct ``(src_doc_id, dst_doc_id)`` pairs, sorted;
    self links kept unless ``cfg.drop_self_links``) and ``ingest_report.parquet`` (every input
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
        (:mod:`tasks.corpus.ingest.parallel`). Other inputs, and every input without ``submit``,
        are read serially. The artifacts are the same either way.
    piece_cache : Path, optional
        Directory (shared by the workers) where each piece's pass-1 output is kept under the
        sha256 of its compressed bytes and the config: a nightly rebuild re-parses only the
        pieces whose bytes changed (``IngestSummary.pieces`` counts built and reused ones).

    Returns
    -------
    IngestSummary
        Counts by status, skip reason, redirect status, link fate; bytes read; seconds.

    Raises
    ------
    FileNotFoundError
        An input does not exist.
    ValueError
        No inputs, or two inputs with the same file name (the report keys on it).
    tasks.corpus.ingest.IngestError
        An input cannot be read to the end (truncated archive, malformed XML); names the file,
        the position and the last complete record. Nothing is written.
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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ingest-shards-", dir=out_dir) as tmp, ExitStack() as stack:
        report = stack.enter_context(INGEST_REPORT.open_writer(out_dir))
        state = _FirstPass(cfg, ShardWriter(Path(tmp), cfg.shard_size), report)
        if submit is not None:
            state.parallel = (submit, streams_per_piece, window, piece_cache)
        uncompressed = state.run(inputs)
        title_to_id = {t: i for i, t in enumerate(sorted(t for t, s in state.titles.items() if s == KEPT))}
        rows, resolved = resolve_redirects(state.redirects, title_to_id, state.titles)
        redirects = stack.enter_context(REDIRECTS.open_writer(out_dir, sorted_keys=True))
        for start in range(0, len(rows), _LINK_BATCH):
            redirects.write(dict(zip(("source_title", "target_title", "status", "hops"),
                                     map(list, zip(*rows[start:start + _LINK_BATCH])))))
        docs = stack.enter_context(DOCUMENTS.open_writer(out_dir, sorted_keys=True, row_group_size=None))
        links = stack.enter_context(LINKS.open_writer(out_dir, sorted_keys=True))
        _second_pass(state, title_to_id, resolved, docs, links)
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
        cpu_seconds=time.process_time() - cpu0, outputs=outputs, pieces=dict(sorted(state.pieces.items())))
    logger.info("ingest %s: %d documents, %d redirects, %d links, skipped %s (%.1f s)", cfg.format,
                summary.documents, summary.redirects, summary.links, summary.skipped, summary.seconds)
    return summary


class _FirstPass:
    """Pass 1: account for every record, clean kept pages into shards, collect titles."""

    def __init__(self, cfg: IngestConfig, shards: ShardWriter, report):
        self.cfg, self.shards, self.report = cfg, shards, report
        self.templates = cfg.template_set()
        self.titles: dict[str, str] = {}             # normalised title -> kept | redirect | skipped
        self.redirects: dict[str, str | None] = {}   # redirect title -> normalised target
        self.links = LinkCounts()
        self.by_status: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.records = 0
        self._rows: list[tuple] = []
        self._link_cache: dict[str, tuple[str, str | None]] = {}   # raw link target -> classify_link
        self._cache_namespaces: frozenset[str] | None = None
        self.parallel: tuple | None = None   # (submit, streams per piece, window, piece cache)
        self.pieces: Counter[str] = Counter()  # multistream pieces built / reused

    def run(self, inputs: list[Path]) -> int:
        """Read all inputs; returns the uncompressed bytes read."""
        fmt, total = self.cfg.format, 0
        if fmt == "wikispeedia":
            reader = WikispeediaReader(inputs, self.cfg.max_page_bytes)
            for page in reader.pages():
                self.process(page, DEFAULT_NAMESPACES)
            stats = reader.link_stats
            self.links.seen += stats["malformed"] + stats["unknown_source"]
            self.links.malformed += stats["malformed"]
            self.links.unknown_source += stats["unknown_source"]
            total = reader.bytes_read
        for path in inputs if fmt != "wikispeedia" else ():
            layout = plan_layout(path, self.parallel[1]) if self.parallel and fmt == "mediawiki" else None
            if layout is not None:
                total += run_pieces(self, layout, self.parallel[0], self.shards.directory, self.parallel[2],
                                    self.parallel[3])
                continue
            reader = MediaWikiReader(path) if fmt == "mediawiki" else JsonlReader(path, self.cfg.max_page_bytes)
            for page in reader.pages():
                self.process(page, getattr(reader, "namespaces", DEFAULT_NAMESPACES))
            total += reader.bytes_read
        self._flush_report()
        self.shards.flush()
        return total

    def process(self, page: RawPage, namespaces: frozenset[str]) -> None:
        """Decide the fate of one record and write its report row."""
        title = normalise_title(page.title) if page.title else None
        if page.error:
            return self._skip(page, title, page.error, page.detail, mark=False)
        if title is None:
            return self._skip(page, None, MALFORMED_PAGE, f"{page.title!r} is not a valid page title", mark=False)
        if page.namespace != 0:
            return self._skip(page, title, OTHER_NAMESPACE, f"namespace {page.namespace}", mark=False)
        if title in self.titles:
            return self._skip(page, title, DUPLICATE_TITLE, f"title already seen ({self.titles[title]})", mark=False)
        if page.n_bytes > self.cfg.max_page_bytes:
            return self._skip(page, title, OVERSIZE, f"{page.n_bytes} bytes > {self.cfg.max_page_bytes}")
        wikitext = page.markup == WIKITEXT
        if page.redirect is not None:
            kind, target = classify_link(page.redirect, namespaces)
            self.redirects[title] = target if kind == ARTICLE else None
            self.titles[title] = REDIRECT
            return self._row(page, title, REDIRECT, None, f"-> {page.redirect}")
        markup = page.text if wikitext else None
        if self.cfg.exclude_disambiguation and is_disambiguation(title, markup, self.templates):
            return self._skip(page, title, DISAMBIGUATION, None)
        text = clean_wikitext(page.text) if wikitext else page.text
        if len(text) < self.cfg.min_text_chars:
            return self._skip(page, title, EMPTY_TEXT, f"{len(text)} characters after cleaning")
        targets = self._link_targets(page, namespaces)
        self.shards.add(title, text, page.page_id, page.source, targets)
        self.titles[title] = KEPT
        self._row(page, title, KEPT, None, None)

    def _link_targets(self, page: RawPage, namespaces: frozenset[str]) -> list[str]:
        counts = self.links
        if page.markup == WIKITEXT:
            raw = extract_link_targets(page.text)
            if namespaces is not self._cache_namespaces or len(self._link_cache) > _LINK_CACHE:
                self._link_cache, self._cache_namespaces = {}, namespaces
            cache = self._link_cache
            found = []
            for target in raw:
                hit = cache.get(target)
                if hit is None:
                    hit = cache[target] = classify_link(target, namespaces)
                if hit[0] == ARTICLE:
                    found.append(hit[1])
                else:
                    setattr(counts, hit[0], getattr(counts, hit[0]) + 1)
        else:
            raw = page.links or []
            found = [t for t in map(normalise_title, raw) if t is not None]
            counts.invalid += len(raw) - len(found)
        unique = list(dict.fromkeys(found))
        counts.seen += len(raw)
        counts.duplicate += len(found) - len(unique)
        return unique

    def _skip(self, page: RawPage, title: str | None, reason: str, detail: str | None, mark: bool = True) -> None:
        if page.links:  # links that came with a skipped page (Wikispeedia, JSONL)
            self.links.seen += len(page.links)
            self.links.source_skipped += len(page.links)
        if mark and title is not None:
            self.titles[title] = SKIPPED
        self.skipped[reason] += 1
        self._row(page, title, SKIPPED, reason, detail)

    def _row(self, page: RawPage, title: str | None, status: str, reason: str | None, detail: str | None) -> None:
        self.by_status[status] += 1
        self.records += 1
        if self.records % _PROGRESS_EVERY == 0:
            logger.info("ingest pass 1: %d records (%s), %d shards", self.records, dict(self.by_status),
                        len(self.shards.paths))
        self._rows.append((page.source, page.position, page.record, page.page_id, title, status, reason,
                           page.n_bytes, detail))
        if len(self._rows) >= _REPORT_BATCH:
            self._flush_report()

    def _flush_report(self) -> None:
        if self._rows:
            self.report.write(dict(zip(_REPORT_FIELDS, map(list, zip(*self._rows)))))
            self._rows = []


def _second_pass(state: _FirstPass, title_to_id: dict[str, int], resolved: dict[str, int], docs, links) -> None:
    """Pass 2: merge shards in title order, write documents and resolved, deduplicated links.

    Documents go out in row groups cut after :data:`DOC_GROUP_ROWS` rows or
    :data:`DOC_GROUP_BYTES` bytes of text, whichever comes first (a function of the documents
    only, so the file does not depend on ``shard_size``).
    """
    counts, drop_self = state.links, state.cfg.drop_self_links
    doc_rows: list[tuple] = []
    doc_bytes = 0
    src_ids: list[int] = []
    dst_ids: list[int] = []
    merged = merge_shards(state.shards.paths, state.shards.group_rows)
    for doc_id, (title, text, page_id, source, targets) in enumerate(merged):
        if title_to_id[title] != doc_id:
            raise AssertionError(f"shard merge out of order at {title!r}")
        doc_rows.append((doc_id, title, text, page_id, source))
        doc_bytes += len(text)
        dsts: set[int] = set()
        for target in targets or ():
            dst = title_to_id.get(target)
            via = dst is None
            if via:
                dst = resolved.get(target)
                if dst is None:
                    if target in state.titles:
                        counts.to_excluded += 1
                    else:
                        counts.unresolved += 1
                    continue
            if dst in dsts:
                counts.duplicate += 1
            elif dst == doc_id and drop_self:
                counts.self_link += 1
            else:
                dsts.add(dst)
                counts.via_redirect += via
                counts.self_kept += dst == doc_id
        ordered = sorted(dsts)
        src_ids.extend([doc_id] * len(ordered))
        dst_ids.extend(ordered)
        counts.kept += len(ordered)
        if len(doc_rows) >= DOC_GROUP_ROWS or doc_bytes >= DOC_GROUP_BYTES:
            _write_docs(docs, doc_rows)
            doc_rows, doc_bytes = [], 0
        if len(src_ids) >= _LINK_BATCH:
            links.write({"src_doc_id": src_ids, "dst_doc_id": dst_ids})
            src_ids, dst_ids = [], []
    if doc_rows:
        _write_docs(docs, doc_rows)
    if src_ids:
        links.write({"src_doc_id": src_ids, "dst_doc_id": dst_ids})
    if len(title_to_id) != docs.rows_written:
        raise AssertionError(f"{len(title_to_id)} kept titles but {docs.rows_written} documents merged")


def _write_docs(docs, rows: list[tuple]) -> None:
    docs.write(dict(zip(("doc_id", "title", "text", "page_id", "source"), map(list, zip(*rows)))))
