"""Adds-changes revisions applied to a full dump *while it is ingested*, instead of writing the
merged dump first.

The merged dump of the nightly (the dump a full run would have written) is the base dump
in page-id order with each changed page replaced and each new page inserted where its id falls;
writing it decompresses and re-compresses every bz2 stream that holds a changed page, which after
a few days of ~1% edits is nearly all of them. :func:`merge_pages` gives the ingest the records of
that merged dump straight from the base dump's records and the revisions: a changed page's record
is read from the ``<page>`` element the merged dump would hold (:func:`page_xml`, parsed by
:func:`tasks.sources.ingest.mediawiki.page_from_xml`), positions are renumbered, and every record's
``source`` is the merged dump's file name, so the ingest artifacts are byte-identical to ingesting
the merged dump (tested). The base dump must list its pages in increasing page id (Wikimedia's
dumps do; :func:`merge_pages` raises otherwise). Nothing here imports Prefect.
"""
from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Iterator
from xml.sax.saxutils import escape, quoteattr

import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.base import atomic_write
from tasks.sources.ingest.config import IngestError
from tasks.sources.ingest.mediawiki import page_from_xml
from tasks.sources.ingest.records import RawPage

_TEXT_ENTITIES = {"\r": "&#13;"}   # a raw CR would be read back as LF


@dataclass(frozen=True)
class PageRevision:
    """The state of one ns-0 page after an adds-changes day: its newest revision."""

    page_id: int
    title: str
    ns: int
    redirect: str | None     # the page-level <redirect title=…>, None if the page is no redirect
    text: str
    rev_id: int
    timestamp: str
    model: str
    format: str
    day: str


_TYPES = {"page_id": pa.int64(), "ns": pa.int64(), "rev_id": pa.int64()}
_SCHEMA = pa.schema([pa.field(f.name, _TYPES.get(f.name, pa.string()), nullable=f.name == "redirect")
                     for f in fields(PageRevision)])
_FIELDS_OF = operator.attrgetter(*(f.name for f in fields(PageRevision)))


def revisions_table(revisions: Iterable[PageRevision]) -> pa.Table:
    """``revisions`` as an Arrow table, one row each in the given order (columns: the fields of
    :class:`PageRevision`; ``redirect`` the only nullable one)."""
    columns = list(zip(*map(_FIELDS_OF, revisions))) or [[] for _ in _SCHEMA]   # not astuple: it deep-copies (~40 µs a row)
    return pa.table([pa.array(list(c), f.type) for c, f in zip(columns, _SCHEMA)], schema=_SCHEMA)


def revisions_from_table(table: pa.Table) -> list[PageRevision]:
    """The revisions of a :func:`revisions_table` table, in row order."""
    rows = zip(*(table.column(f.name).to_pylist() for f in fields(PageRevision)))
    return [PageRevision(*row) for row in rows]


def page_xml(rev: PageRevision) -> bytes:
    """The ``<page>`` element of a full dump holding ``rev`` (the fields the ingest reads)."""
    redirect = f"\n    <redirect title={quoteattr(rev.redirect)} />" if rev.redirect is not None else ""
    text = escape(rev.text, _TEXT_ENTITIES)
    return (f"  <page>\n    <title>{escape(rev.title)}</title>\n    <ns>0</ns>\n    <id>{rev.page_id}</id>{redirect}\n"
            f"    <revision>\n      <id>{rev.rev_id}</id>\n      <timestamp>{escape(rev.timestamp)}</timestamp>\n"
            f"      <model>{escape(rev.model)}</model>\n      <format>{escape(rev.format)}</format>\n"
            f"      <text bytes=\"{len(rev.text.encode())}\" xml:space=\"preserve\">{text}</text>\n"
            f"    </revision>\n  </page>\n").encode("utf-8")


@dataclass(frozen=True)
class PageChanges:
    """Revisions to apply to one base dump while it is ingested.

    source : the merged dump's file name: the ``source`` of every ingested record.
    pages : the revisions, sorted by page id, one per page id.
    """

    source: str
    pages: tuple[PageRevision, ...]

    @classmethod
    def of(cls, source: str, pages: dict[int, PageRevision] | Iterable[PageRevision]) -> "PageChanges":
        """From ``{page_id: revision}`` (:func:`tasks.sources.adds_changes.merge_days`) or revisions;
        raises ``ValueError`` when a page id repeats."""
        revs = sorted(pages.values() if isinstance(pages, dict) else pages, key=lambda r: r.page_id)
        ids = [r.page_id for r in revs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"page changes for {source}: a page id appears twice")
        return cls(source, tuple(revs))

    def in_range(self, lo: int | None, hi: int | None) -> tuple[PageRevision, ...]:
        """The revisions with ``lo <= page_id < hi`` (``None``: unbounded), in page id order."""
        return tuple(r for r in self.pages if (lo is None or r.page_id >= lo) and (hi is None or r.page_id < hi))

    def save(self, path: Path) -> None:
        """Write the revisions as Parquet (the merged dump's name in the file's metadata), atomically."""
        table = revisions_table(self.pages).replace_schema_metadata({b"source": self.source.encode("utf-8")})
        atomic_write(Path(path), lambda p: pq.write_table(table, p, compression="zstd"))

    @classmethod
    def load(cls, path: Path) -> "PageChanges":
        """Read what :meth:`save` wrote. Raises ``ValueError`` for a file without the merged dump's name."""
        table = pq.read_table(path)
        source = (table.schema.metadata or {}).get(b"source")
        if source is None:
            raise ValueError(f"{path}: not a page-changes file (no merged dump name in its metadata)")
        return cls.of(source.decode("utf-8"), revisions_from_table(table))

    def digest(self) -> str:
        """sha256 over the merged dump's name and every revision's ``<page>`` element."""
        h = hashlib.sha256(self.source.encode("utf-8") + b"\0")
        for rev in self.pages:
            body = page_xml(rev)
            h.update(len(body).to_bytes(8, "little"))
            h.update(body)
        return h.hexdigest()


def is_newer(rev: PageRevision, rev_id: int | None, timestamp: str | None) -> bool:
    """Whether ``rev`` is newer than the revision ``(rev_id, timestamp)`` a base dump (or an earlier
    day) holds for its page: the higher revision id wins (MediaWiki hands them out in increasing
    order), then, for equal or unknown ids, the later ISO 8601 timestamp; the same revision is not
    newer. A base revision with neither id nor timestamp is older than any revision.
    """
    if rev_id is not None and rev.rev_id != rev_id:
        return rev.rev_id > rev_id
    if timestamp and rev.timestamp:
        return rev.timestamp > timestamp
    return rev_id is None and not timestamp


def merge_pages(pages: Iterator[RawPage], changes: Iterable[PageRevision], source: str,
                stale: list[int] | None = None) -> Iterator[RawPage]:
    """The records of the merged dump: ``pages`` (a base dump's records, or one piece's, in page id
    order) with a changed page's record replaced, each new page's record inserted before the
    first base record with a higher page id (new pages past the last one at the end), positions
    renumbered from 0 and ``source`` set on every record.

    A revision that is not newer than the base record's (:func:`is_newer`, on the record's
    ``rev_id`` and ``timestamp``) is skipped: the base record stays and its page id is appended to
    ``stale`` (counted as the build's ``stale_revisions``).

    Raises
    ------
    IngestError
        The base records' page ids do not increase (names the source and the two ids).
    """
    pending = list(changes)
    at = 0
    position = 0
    last_id = None

    def changed(rev: PageRevision) -> RawPage:
        return page_from_xml(page_xml(rev), source, position)

    for page in pages:
        pid = page.page_id
        if pid is not None:
            if last_id is not None and pid <= last_id:
                raise IngestError(f"{source}: base dump pages are not in increasing page id order ({last_id} then "
                                  f"{pid}); adds-changes can only be applied to a dump in page id order")
            last_id = pid
            while at < len(pending) and pending[at].page_id < pid:
                yield changed(pending[at])
                position += 1
                at += 1
            if at < len(pending) and pending[at].page_id == pid:
                rev = pending[at]
                at += 1
                if is_newer(rev, page.rev_id, page.timestamp):
                    yield changed(rev)
                    position += 1
                    continue
                if stale is not None:
                    stale.append(pid)
        page.source, page.position = source, position
        if not page.title:
            page.record = f"page #{position}"
        yield page
        position += 1
    for rev in pending[at:]:
        yield changed(rev)
        position += 1
