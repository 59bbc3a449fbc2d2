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

import numpy as np
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


CHANGES_ROW_GROUP = 1_000
"""Revisions a row group of a changes file holds (:func:`write_changes`): a piece reads the few
row groups its page ids fall in (:meth:`ChangesFile.split`), never the file."""


def _cuts(page_ids: np.ndarray, bounds: list[int | None]) -> list[int]:
    """The row of each bound in the increasing ``page_ids`` (``None``: first the start, then the end)."""
    return [0 if b is None and k == 0 else page_ids.size if b is None else int(np.searchsorted(page_ids, b))
            for k, b in enumerate(bounds)]


def _digest(source: str, revisions: Iterable[PageRevision]) -> str:
    h = hashlib.sha256(source.encode("utf-8") + b"\0")
    for rev in revisions:
        body = page_xml(rev)
        h.update(len(body).to_bytes(8, "little"))
        h.update(body)
    return h.hexdigest()


@dataclass(frozen=True)
class PageChanges:
    """Revisions to apply to one base dump, or one piece of it, while it is ingested, in memory.

    source : the merged dump's file name: the ``source`` of every ingested record.
    pages : the revisions, sorted by page id, one per page id.

    A nightly's revisions since its base full dump are a :class:`ChangesFile` instead, which no
    process holds whole; each piece loads its own (:meth:`ChangesRange.load`).
    """

    source: str
    pages: tuple[PageRevision, ...]

    @classmethod
    def of(cls, source: str, pages: dict[int, PageRevision] | Iterable[PageRevision]) -> "PageChanges":
        """From ``{page_id: revision}`` or revisions; raises ``ValueError`` when a page id repeats."""
        revs = sorted(pages.values() if isinstance(pages, dict) else pages, key=lambda r: r.page_id)
        ids = [r.page_id for r in revs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"page changes for {source}: a page id appears twice")
        return cls(source, tuple(revs))

    def revisions(self) -> Iterator[PageRevision]:
        """The revisions in page id order."""
        return iter(self.pages)

    def split(self, bounds: list[int | None]) -> list["PageChanges"]:
        """The revisions of each range ``bounds[k] <= page_id < bounds[k + 1]`` (``None``: unbounded)."""
        at = _cuts(np.array([r.page_id for r in self.pages], np.int64), bounds)
        return [PageChanges(self.source, self.pages[a:b]) for a, b in zip(at[:-1], at[1:])]

    def load(self) -> "PageChanges":
        """Itself: revisions already in memory (what :meth:`ChangesRange.load` gives a piece)."""
        return self

    def digest(self) -> str:
        """sha256 over the merged dump's name and every revision's ``<page>`` element."""
        return _digest(self.source, self.pages)


def write_changes(path: Path, source: str, tables: Iterable[pa.Table]) -> "ChangesFile":
    """Write a changes file, atomically: the rows of ``tables`` (:func:`revisions_table` rows, each
    table sorted by page id, every page id higher than the last table's) in row groups of
    :data:`CHANGES_ROW_GROUP`, the merged dump's name ``source`` in the file's metadata. Memory: one
    table at a time.

    Raises
    ------
    ValueError
        A page id is not higher than the one before it (names the file and the last page id written;
        the file is not written).
    """
    schema = _SCHEMA.with_metadata({b"source": source.encode("utf-8")})

    def write(tmp: Path) -> None:
        last = None
        with pq.ParquetWriter(tmp, schema, compression="zstd", write_page_checksum=True) as out:
            for table in tables:
                ids = table.column("page_id").to_numpy()
                if ids.size and ((last is not None and ids[0] <= last) or bool(np.any(np.diff(ids) <= 0))):
                    raise ValueError(f"{path}: the revisions' page ids do not increase (after page id {last})")
                if ids.size:
                    last = int(ids[-1])
                    out.write_table(table.cast(_SCHEMA), row_group_size=CHANGES_ROW_GROUP)
    atomic_write(Path(path), write)
    return ChangesFile.open(path)


class RowGroups:
    """A Parquet file read a range of rows at a time: only the row groups that hold the range are
    decoded, and every page's checksum is verified (a page that fails raises ``OSError``)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.file = pq.ParquetFile(path, page_checksum_verification=True)
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])   # (n_groups + 1,)

    def rows(self, start: int, stop: int) -> pa.Table:
        """Rows ``start`` to ``stop - 1``."""
        first = int(np.searchsorted(self.starts, start, "right")) - 1
        last = int(np.searchsorted(self.starts, stop, "left"))
        table = self.file.read_row_groups(list(range(first, last)))
        return table.slice(start - int(self.starts[first]), stop - start)


@dataclass(frozen=True, eq=False)
class ChangesFile:
    """The revisions of a changes file (:func:`write_changes`) without their texts: the merged
    dump's name and each revision's page id (``(n,)`` int64, increasing). 8 bytes a revision in
    memory; texts are read a row group at a time."""

    path: Path
    source: str
    page_ids: np.ndarray

    @classmethod
    def open(cls, path: Path) -> "ChangesFile":
        """Raises ``ValueError`` for a file without the merged dump's name, or whose page ids do not
        increase (names the file)."""
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        source = (pf.schema_arrow.metadata or {}).get(b"source")
        if source is None:
            raise ValueError(f"{path}: not a changes file (no merged dump name in its metadata)")
        ids = pf.read(columns=["page_id"]).column("page_id").to_numpy()
        if bool(np.any(np.diff(ids) <= 0)):
            raise ValueError(f"{path}: the revisions' page ids do not increase")
        return cls(Path(path), source.decode("utf-8"), ids)

    def __len__(self) -> int:
        return int(self.page_ids.size)

    def revisions(self) -> Iterator[PageRevision]:
        """Every revision in page id order, one row group in memory at a time."""
        pf = pq.ParquetFile(self.path, page_checksum_verification=True)
        for g in range(pf.num_row_groups):
            yield from revisions_from_table(pf.read_row_group(g))

    def split(self, bounds: list[int | None]) -> list["ChangesRange"]:
        """A :class:`ChangesRange` for each range ``bounds[k] <= page_id < bounds[k + 1]``
        (``None``: unbounded), as :meth:`PageChanges.split`."""
        at = _cuts(self.page_ids, bounds)
        return [ChangesRange(str(self.path), self.source, a, b) for a, b in zip(at[:-1], at[1:])]

    def digest(self) -> str:
        """:meth:`PageChanges.digest` of the same revisions, a row group at a time."""
        return _digest(self.source, self.revisions())


@dataclass(frozen=True)
class ChangesRange:
    """Rows ``start`` to ``stop - 1`` of a changes file, not read yet: what a piece of the ingest is
    sent (:meth:`ChangesFile.split`) and reads in its worker."""

    path: str
    source: str
    start: int
    stop: int

    def load(self) -> PageChanges:
        """The range's revisions in memory (:class:`RowGroups`: only its row groups read)."""
        if self.stop <= self.start:
            return PageChanges(self.source, ())
        return PageChanges(self.source, tuple(revisions_from_table(RowGroups(self.path).rows(self.start, self.stop))))


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
    pending = iter(changes)   # read as the base records pass: a changes file is never held whole
    head = next(pending, None)
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
            while head is not None and head.page_id < pid:
                yield changed(head)
                position += 1
                head = next(pending, None)
            if head is not None and head.page_id == pid:
                rev, head = head, next(pending, None)
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
    while head is not None:
        yield changed(head)
        position += 1
        head = next(pending, None)
