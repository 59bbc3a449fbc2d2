"""Pass 1 of the ingest, one record at a time: the decision every pass-1 state shares.

:class:`PagePass` accounts for a record in the ingest report (kept, redirect or skipped with its
reason), cleans a kept page's wikitext and spills it with its link targets to the title-sorted
shards, and collects the titles (a kept one's page id beside it), the redirect table and the link
accounting. The serial driver
over whole inputs (:mod:`tasks.sources.ingest.run`) and the worker state of one multistream piece
(:mod:`tasks.sources.ingest.parallel`) extend it, so neither module imports the other's class.
Part of the corpus-build input of FunnelRAG (articles and their hyperlink graph, Algorithm 1).
"""
from __future__ import annotations

import logging
import operator
from collections import Counter
from dataclasses import fields

from data_contracts.corpus import INGEST_REPORT
from funnelrag.content_store import text_key
from tasks.sources.ingest.config import (DISAMBIGUATION, DUPLICATE_TITLE, EMPTY_TEXT, KEPT, MALFORMED_PAGE,
                                        OTHER_NAMESPACE, OVERSIZE, REDIRECT, SKIPPED, IngestConfig, LinkCounts)
from tasks.sources.ingest.page_memo import PageMemo
from tasks.sources.ingest.records import WIKITEXT, RawPage
from tasks.sources.ingest.shards import ShardWriter
from tasks.sources.ingest.titles import ARTICLE, classify_link, normalise_title
from tasks.sources.ingest.wikitext import clean_wikitext, extract_link_targets, is_disambiguation, remove_comments

logger = logging.getLogger(__name__)

_REPORT_BATCH = 20_000
_PROGRESS_EVERY = 100_000
_LINK_CACHE = 500_000  # distinct raw link targets remembered (cleared when full)
_REPORT_FIELDS = [f.name for f in INGEST_REPORT.schema]
_LINK_FIELDS = [f.name for f in fields(LinkCounts)]
_link_counts = operator.attrgetter(*_LINK_FIELDS)


class PagePass:
    """Pass 1's decision for one record at a time: account for it in the report, clean a kept page
    into the shards, collect titles, redirects and link counts. The whole-input driver
    (:class:`tasks.sources.ingest.run._FirstPass`) and the one-piece worker state
    (:class:`tasks.sources.ingest.parallel._PiecePass`) both extend it."""

    def __init__(self, cfg: IngestConfig, shards: ShardWriter, report):
        self.cfg, self.shards, self.report = cfg, shards, report
        self.templates = cfg.template_set()
        self.titles: dict[str, str] = {}             # normalised title -> kept | redirect | skipped
        self.page_ids: dict[str, int | None] = {}    # kept title -> its page id (a doc_id before pass 2)
        self.redirects: dict[str, str | None] = {}   # redirect title -> normalised target
        self.links = LinkCounts()
        self.by_status: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.records = 0
        self._rows: list[tuple] = []
        self._link_cache: dict[str, tuple[str, str | None]] = {}   # raw link target -> classify_link
        self._cache_namespaces: frozenset[str] | None = None
        self.page_memo: PageMemo | None = None      # cleaned pages of the last build (pieces with a piece cache)
        self.memo_rows: list[tuple] | None = None   # with a memo: this pass's rows for the next one
        self.memo_hits = 0

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
        if self.cfg.exclude_disambiguation and is_disambiguation(title, page.text if wikitext else None,
                                                                 self.templates):
            return self._skip(page, title, DISAMBIGUATION, None)
        if wikitext and self.memo_rows is not None:
            text, targets = self._cleaned(page, namespaces)
        else:
            markup = remove_comments(page.text) if wikitext else None   # once, for the cleaner and the links
            text = clean_wikitext(markup, comments_removed=True) if wikitext else page.text
            targets = None if len(text) < self.cfg.min_text_chars else self._link_targets(page, namespaces, markup)
        if targets is None:
            return self._skip(page, title, EMPTY_TEXT, f"{len(text)} characters after cleaning")
        self.shards.add(title, text, page.page_id, page.source, targets)
        self.titles[title] = KEPT
        self.page_ids[title] = page.page_id
        self._row(page, title, KEPT, None, None)

    def _cleaned(self, page: RawPage, namespaces: frozenset[str]) -> tuple[str, list[str] | None]:
        """A kept wikitext page's cleaned text and link targets (None: too short to keep), from the
        page memo when it holds the page's wikitext, else computed; the link accounting is
        incremented either way, and the page's row goes to :attr:`memo_rows` for the next memo."""
        key = text_key(page.text)
        hit = self.page_memo.get(key) if self.page_memo is not None else None
        if hit is not None:
            text, targets, delta = hit
            for name, d in zip(_LINK_FIELDS, delta):
                if d:
                    setattr(self.links, name, getattr(self.links, name) + d)
            self.memo_hits += 1
        else:
            before = _link_counts(self.links)
            markup = remove_comments(page.text)   # once, for the cleaner and the links
            text = clean_wikitext(markup, comments_removed=True)
            targets = None if len(text) < self.cfg.min_text_chars else self._link_targets(page, namespaces, markup)
            delta = [a - b for a, b in zip(_link_counts(self.links), before)]
        self.memo_rows.append((key, text, targets, delta))
        return text, targets

    def _link_targets(self, page: RawPage, namespaces: frozenset[str], markup: str | None) -> list[str]:
        """Normalised, deduplicated article targets of the page's links, counting the others;
        ``markup`` is the wikitext of a wikitext page without comments (:func:`remove_comments`),
        None for other formats (their links come with the record)."""
        counts = self.links
        if markup is not None:
            raw = extract_link_targets(markup, comments_removed=True)
            if namespaces is not self._cache_namespaces or len(self._link_cache) > _LINK_CACHE:
                self._link_cache, self._cache_namespaces = {}, namespaces
            cache = self._link_cache
            hits = list(map(cache.get, raw))
            if None in hits:
                for i, hit in enumerate(hits):
                    if hit is None:
                        target = raw[i]
                        hits[i] = cache.get(target) or cache.setdefault(target, classify_link(target, namespaces))
            found = [title for kind, title in hits if kind == ARTICLE]
            if len(found) < len(hits):
                for kind, n in Counter(kind for kind, _ in hits if kind != ARTICLE).items():
                    setattr(counts, kind, getattr(counts, kind) + n)
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
