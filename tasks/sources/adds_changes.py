"""Wikimedia adds-changes dumps applied to a full multistream dump: the dump a full run would
have written with the same page texts.

An adds-changes day (``<wiki>-<YYYYMMDD>-pages-meta-hist-incr.xml.bz2``) is ordinary export XML
with every revision made that day, several ``<revision>`` elements per ``<page>``. Per page id the
newest revision (highest revision id; a later day over an earlier one) of a page in namespace 0
wins; with it the page's ``<title>`` (a title change in a new revision renames the page) and its
``<redirect title=…>`` (a page that became a redirect is one now). A page of another namespace is a
counted skip (``other_namespace``), as is a page without id, title, namespace or revision text
(``malformed``). Page moves out of namespace 0 and deletions are not in adds-changes dumps: they
take effect when the next full dump becomes the base.

The nightly applies them while it ingests the base dump (:func:`plan_changes`, then
:func:`tasks.sources.ingest.changes.merge_pages`): no merged dump is written, and the artifacts are
those of the dump a full run would have written (tested against one written out,
``tests/merged_dump.py``). The base dump must list its pages in increasing page id order, as
Wikimedia's do. Nothing here imports Prefect.
"""
from __future__ import annotations

import bz2
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from lxml import etree

from data_contracts.base import atomic_write, sha256_file
from funnelrag.errors import BadInput
from tasks.sources.ingest.changes import (ChangesFile, PageRevision, RowGroups, is_newer,  # noqa: F401 - re-exported
                                         revisions_table, write_changes)
from tasks.sources.ingest.mediawiki import release_element
from tasks.sources.ingest.multistream import index_path, index_summary

log = logging.getLogger(__name__)

OTHER_NAMESPACE, MALFORMED, STALE_REVISION = "other_namespace", "malformed", "stale_revision"


class AddsChangesError(BadInput):
    """An adds-changes file or the base dump cannot be read to the end; names file and reason."""


@dataclass
class DayCounts:
    """What one adds-changes file held: pages and revisions read, pages kept (ns 0), skipped."""

    date: str
    pages: int = 0
    revisions: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)   # the first few skips, "page id N: reason"
    from_memo: bool = False   # read from the day memo (:func:`read_day_memo`), not parsed tonight

    def as_dict(self) -> dict:
        return {"date": self.date, "pages": self.pages, "revisions": self.revisions, "kept": self.kept,
                "skipped": dict(sorted(self.skipped.items())), "examples": self.examples, "from_memo": self.from_memo}


def read_day(path: Path, date: str) -> tuple[pa.Table, DayCounts]:
    """``(revisions, counts)`` of the ns-0 pages of one adds-changes file: the newest revision of
    each page, one :func:`tasks.sources.ingest.changes.revisions_table` row a page, sorted by page id.

    Raises
    ------
    AddsChangesError
        Malformed XML or a truncated / corrupt bz2 file (names the file, the position and the
        last complete page).
    """
    path = Path(path)
    counts = DayCounts(date)
    pages: dict[int, PageRevision] = {}
    last = "none"
    try:
        with bz2.open(path, "rb") if path.suffix == ".bz2" else open(path, "rb") as raw:
            for _, elem in etree.iterparse(raw, events=("end",), tag="{*}page", huge_tree=True, remove_comments=True):
                counts.pages += 1
                rev = _page_revision(elem, date, counts)
                if rev is not None:
                    old = pages.get(rev.page_id)
                    if old is None or rev.rev_id >= old.rev_id:
                        pages[rev.page_id] = rev
                    last = f"{rev.title!r} (page id {rev.page_id})"
                release_element(elem)
    except etree.XMLSyntaxError as exc:
        raise AddsChangesError(f"{path}: malformed XML ({exc.msg}); last complete page: {last}") from exc
    except (EOFError, OSError) as exc:
        raise AddsChangesError(f"{path}: truncated or corrupt compressed data ({exc}); last complete page: {last}") from exc
    counts.kept = len(pages)
    return revisions_table(pages[pid] for pid in sorted(pages)), counts


def _local(tag) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _skip(counts: DayCounts, reason: str, what: str) -> None:
    counts.skipped[reason] += 1
    if len(counts.examples) < 5:
        counts.examples.append(f"{what}: {reason}")


def _page_revision(elem, date: str, counts: DayCounts) -> PageRevision | None:
    title = ns = pid = redirect = None
    revisions = []
    for child in elem:
        name = _local(child.tag)
        if name == "title" and title is None:
            title = child.text or ""
        elif name == "ns" and ns is None:
            ns = (child.text or "").strip()
        elif name == "id" and pid is None:
            pid = (child.text or "").strip()
        elif name == "redirect" and redirect is None:
            redirect = child.get("title") or ""
        elif name == "revision":
            revisions.append(child)
    counts.revisions += len(revisions)
    what = f"page id {pid}" if pid else f"page {title!r}"
    if not (pid and pid.isdigit() and title and ns and ns.lstrip("-").isdigit()):
        _skip(counts, MALFORMED, what + " (missing or bad <id>, <title> or <ns>)")
        return None
    if int(ns) != 0:
        _skip(counts, OTHER_NAMESPACE, f"{what} in namespace {ns}")
        return None
    best = None
    for rev in revisions:
        fields = {_local(c.tag): c for c in rev}
        rid = (fields["id"].text or "").strip() if "id" in fields else ""
        text = fields.get("text")
        if not rid.isdigit() or text is None or text.get("deleted") is not None:
            continue
        if best is None or int(rid) >= best[0]:
            best = (int(rid), text.text or "", (fields["timestamp"].text or "") if "timestamp" in fields else "",
                    (fields["model"].text or "wikitext") if "model" in fields else "wikitext",
                    (fields["format"].text or "text/x-wiki") if "format" in fields else "text/x-wiki")
    if best is None:
        _skip(counts, MALFORMED, what + " (no revision with an id and text)")
        return None
    return PageRevision(int(pid), title, 0, redirect, best[1], best[0], best[2], best[3], best[4], date)


# Bump when read_day gives other revisions or counts for the same file: every day memo is read again.
# 2: rows sorted by page id, in row groups of DAY_ROW_GROUP (a night reads a day a range at a time).
DAY_MEMO_VERSION = "2"
DAY_ROW_GROUP = 200
MERGE_ROWS = 2_000
"""Revisions :func:`merge_days` writes at a time: its memory is theirs, not all the days'."""


class DayRevisions:
    """One day's revisions (:func:`read_day`'s rows, sorted by page id) with their page ids, revision
    ids and timestamps in memory and their texts read a range of rows at a time (:meth:`rows`), from
    the day memo's Parquet file (:class:`tasks.sources.ingest.changes.RowGroups`) or from a table
    already in memory."""

    def __init__(self, source: pa.Table | Path):
        self.path = source if isinstance(source, Path) else None
        self._groups = RowGroups(source) if self.path is not None else None
        keys = (self._groups.file.read(columns=["page_id", "rev_id", "timestamp"]) if self._groups is not None
                else source.select(["page_id", "rev_id", "timestamp"]))
        self._table = source if self._groups is None else None
        self.page_ids = keys.column("page_id").to_numpy()
        self.rev_ids = keys.column("rev_id").to_pylist()
        self.timestamps = keys.column("timestamp").to_pylist()

    def __len__(self) -> int:
        return int(self.page_ids.size)

    def rows(self, start: int, stop: int) -> pa.Table:
        """Rows ``start`` to ``stop - 1`` (from a file: a page whose checksum fails raises ``OSError``)."""
        return self._table.slice(start, stop - start) if self._groups is None else self._groups.rows(start, stop)


def day_memo_path(memo_dir: Path, date: str, path: Path) -> Path:
    """Where :func:`read_day_memo` keeps what ``path`` (the adds-changes file of ``date``) held:
    ``<memo_dir>/<date>/<file name>.revisions.parquet``."""
    return Path(memo_dir) / date / f"{Path(path).name}.revisions.parquet"


def read_day_memo(path: Path, date: str, memo_dir: Path, read: bool = True) -> tuple[DayRevisions, DayCounts]:
    """:func:`read_day` of ``path``, parsed once: the night that first applies a day keeps its
    revisions and counts in a Parquet file (:func:`day_memo_path`, rows sorted by page id in row
    groups of :data:`DAY_ROW_GROUP`, written atomically); a later night whose base is the same full
    dump applies that day again and reads the file instead of decompressing and parsing the day's
    XML. The memo names the sha256, size and modification time of the file it was made from and
    :data:`DAY_MEMO_VERSION`; a file whose size or time differs is hashed again, and one with other
    bytes (a day republished), an older version or an unreadable memo is parsed again and the memo
    replaced. ``read`` False (``cache.read: false``): parsed again, the memo replaced.

    Returns the day's revisions (the same rows as :func:`read_day`'s, texts left in the file) and
    its counts, ``counts.from_memo`` telling which path gave them.

    Raises
    ------
    AddsChangesError
        As :func:`read_day`, for the day's file.
    """
    path = Path(path)
    memo = day_memo_path(memo_dir, date, path)
    st = path.stat()
    file_stat = [st.st_size, st.st_mtime_ns]   # the same size and time: the sha256 the memo names is the file's
    if read and memo.is_file():
        try:
            meta = json.loads((pq.read_schema(memo).metadata or {}).get(b"day_memo", b"{}"))
            same = meta.get("memo_version") == DAY_MEMO_VERSION and meta.get("date") == date and (
                meta.get("day_file_stat") == file_stat or meta.get("day_file_sha256") == sha256_file(path))
            if same:
                counts = DayCounts(date, **meta["counts"], from_memo=True)
                counts.skipped = Counter(counts.skipped)
                return DayRevisions(memo), counts
            log.info("%s: made from other bytes or by another version; %s is parsed again", memo.name, path.name)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            log.warning("%s: unreadable day memo (%s); %s is parsed again", memo, exc, path.name)
    table, counts = read_day(path, date)
    stamp = {"day_file_sha256": sha256_file(path), "day_file_stat": file_stat, "memo_version": DAY_MEMO_VERSION,
             "date": date, "counts": {k: v for k, v in counts.as_dict().items() if k not in ("date", "from_memo")}}
    table = table.replace_schema_metadata({b"day_memo": json.dumps(stamp, sort_keys=True).encode("utf-8")})
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(memo, lambda p: pq.write_table(table, p, compression="zstd", row_group_size=DAY_ROW_GROUP,
                                                write_page_checksum=True))
    return DayRevisions(memo), counts


class _Key(NamedTuple):
    rev_id: int
    timestamp: str


def merge_days(days: list[tuple[str, Path]], out: Path, source: str, memo_dir: Path | None = None,
               read_memos: bool = True) -> tuple[ChangesFile, list[DayCounts]]:
    """The pages of every day, in date order, written to the changes file ``out`` (named ``source``,
    the merged dump's file name; :func:`tasks.sources.ingest.changes.write_changes`): a later day's
    revision replaces an earlier one's when it is newer (:func:`tasks.sources.ingest.changes.is_newer`:
    revision id, then timestamp); one that is not is skipped and counted on its day
    (``skipped["stale_revision"]``).

    The winners are chosen on the days' page ids, revision ids and timestamps; their texts are then
    copied :data:`MERGE_ROWS` at a time, so no process holds the days' texts (a nightly applies
    every day since its base full dump, up to ~20 of them before the next full dump).

    ``memo_dir``: each day through :func:`read_day_memo` (``read=read_memos``), so a day is parsed
    by the first night that applies it only; None: each day parsed into memory. A memo's pages
    carry checksums: one that fails, or any other error reading a memo's texts, logs the memo's
    path, parses that day again (its memo replaced) and writes the file again.

    Returns ``(the changes file, each day's counts)``. Raises ``AddsChangesError`` as :func:`read_day`.
    """
    revisions: list[DayRevisions] = []
    counts: list[DayCounts] = []
    for date, path in sorted(days):
        if memo_dir is not None:
            rows, day_counts = read_day_memo(path, date, memo_dir, read=read_memos)
        else:
            table, day_counts = read_day(path, date)
            rows = DayRevisions(table)
        revisions.append(rows)
        counts.append(day_counts)
    merged: dict[int, tuple[int, int, _Key]] = {}   # page id -> (day, row, key)
    for d, rows in enumerate(revisions):
        for row, (pid, key) in enumerate(zip(rows.page_ids.tolist(), map(_Key, rows.rev_ids, rows.timestamps))):
            old = merged.get(pid)
            if old is None or is_newer(key, old[2].rev_id, old[2].timestamp):
                merged[pid] = (d, row, key)
            else:
                _skip(counts[d], STALE_REVISION, f"page id {pid} revision {key.rev_id} (day {counts[old[0]].date} "
                                                 f"holds revision {old[2].rev_id})")
    pids = sorted(merged)
    winner_day = np.array([merged[p][0] for p in pids], np.int64)
    winner_row = np.array([merged[p][1] for p in pids], np.int64)
    del merged

    def chunks():
        for at in range(0, len(pids), MERGE_ROWS):
            day, row = winner_day[at:at + MERGE_ROWS], winner_row[at:at + MERGE_ROWS]
            parts = []
            for d in np.unique(day).tolist():
                taken = row[day == d]   # increasing: a day's rows and the winners are both in page id order
                lo = int(taken[0])
                try:
                    parts.append(revisions[d].rows(lo, int(taken[-1]) + 1).take(pa.array(taken - lo)))
                except (OSError, pa.ArrowException) as exc:
                    raise _UnreadableDay(d) from exc
            table = pa.concat_tables([p.replace_schema_metadata(None) for p in parts])
            yield table.take(pc.sort_indices(table.column("page_id")))

    while True:
        try:
            return write_changes(out, source, chunks()), counts
        except _UnreadableDay as bad:
            d, (date, path) = bad.day, sorted(days)[bad.day]
            if memo_dir is None or not counts[d].from_memo:
                raise AddsChangesError(f"{revisions[d].path or path}: unreadable revisions ({bad.__cause__})") from bad
            log.warning("%s: unreadable day memo (%s); %s is parsed again", revisions[d].path, bad.__cause__, path.name)
            fresh, _ = read_day_memo(path, date, memo_dir, read=False)
            if not np.array_equal(fresh.page_ids, revisions[d].page_ids) or fresh.rev_ids != revisions[d].rev_ids:
                raise AddsChangesError(f"{path}: its revisions differ from its memo's, which was read as whole") from bad
            revisions[d] = fresh
            counts[d].from_memo = False   # its stale skips, counted above, stand


class _UnreadableDay(Exception):
    """Reading day ``day``'s texts failed (the cause says why)."""

    def __init__(self, day: int):
        super().__init__(day)
        self.day = day


@dataclass
class ApplyReport:
    """What :func:`plan_changes` found: base pages a day replaces (counted before the ingest compares
    revision ids: the stale ones it then skips and counts are among them) and page ids not in the
    base dump."""

    replaced: int = 0
    added: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


def plan_changes(base: Path, changes: ChangesFile, index_cache: Path | None = None) -> ApplyReport:
    """The pages tonight's revisions (``changes``, :func:`merge_days`) replace in ``base`` and add,
    after checking that the ingest can apply them while it reads ``base``.

    The base's page ids are those of its multistream index's summary
    (:func:`tasks.sources.ingest.multistream.index_summary`), kept in ``index_cache`` (the ingest's
    piece cache, whose pieces read the same entry) under the index's sha256: the index is
    decompressed once per base dump, not every night (~2 CPU µs a page: 0.4 s at 200K pages,
    ~50 s at the English dump's ~24M).

    Raises
    ------
    AddsChangesError
        ``base`` has no multistream index beside it, the index is unreadable, or it does not list
        the pages in increasing page id order (a Wikimedia dump does; the days cannot be merged in).
    """
    t0 = time.perf_counter()
    ix = index_path(Path(base))
    if not ix.is_file():
        raise AddsChangesError(f"{base}: its multistream index {ix.name} is missing (needed to apply adds-changes)")
    try:
        ids = index_summary(ix, index_cache).page_ids
    except ValueError as exc:   # truncated, not bz2, not UTF-8, a line without an offset
        raise AddsChangesError(f"{ix}: unreadable multistream index ({exc})") from exc
    if not (ids.size and bool(np.all(np.diff(ids) > 0))):
        raise AddsChangesError(f"{ix}: the pages are not listed in increasing page id order; adds-changes can only "
                               "be applied to a dump in page id order (Wikimedia's are)")
    at = np.minimum(np.searchsorted(ids, changes.page_ids), ids.size - 1)
    replaced = int(np.count_nonzero(ids[at] == changes.page_ids))
    return ApplyReport(replaced=replaced, added=len(changes) - replaced, seconds=time.perf_counter() - t0)
