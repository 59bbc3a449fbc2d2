"""Pass 1 of the ingest over the pieces of a multistream dump, in worker processes.

Each piece (a run of whole bz2 page streams, :mod:`tasks.sources.ingest.multistream`) is parsed
by :func:`parse_piece` with a fresh pass-1 state: report rows, kept pages spilled to title-sorted
shards in a piece directory, and for every record what it would do to the global state. The
coordinator then *replays* the pieces in dump order (:func:`replay_piece`), which is where the
decisions that need the whole dump so far are taken: a title already seen in an earlier piece
makes the record a ``duplicate_title`` (its kept page is removed from the piece's shards, its
links are not counted). Positions are renumbered from the piece's first page. The result — the
report, the titles (with each kept one's page id) and redirect tables, the link accounting and the set of kept pages — is the
one the serial pass builds, so the artifacts are byte-identical to the serial path's.

Workers are submitted through any executor with ``submit(fn, *args) -> future`` (a
``concurrent.futures`` pool, or the ingest stage's pool in the corpus-build flow); at most
``window`` tasks are in flight or finished-but-not-replayed, which bounds coordinator memory. A
full build submits one piece a task; a build that applies adds-changes submits runs of a few
consecutive pieces a task (:func:`piece_batches`, :func:`parse_pieces`): such a piece is patched
from the base dump's kept piece in ~0.4 s, not much more than a task costs the workflow engine.
"""
from __future__ import annotations

import hashlib
import json
import logging
import operator
import shutil
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.base import link_or_copy, move_into_place, temp_name
from funnelrag.store import mark_used
from funnelrag.verify import record_digests, verified_entry
from tasks.sources.ingest.config import DUPLICATE_TITLE, KEPT, REDIRECT, SKIPPED, IngestConfig, IngestError, LinkCounts
from tasks.sources.ingest.changes import ChangesFile, ChangesRange, PageChanges, is_newer, merge_pages, page_xml
from tasks.sources.ingest.mediawiki import MediaWikiReader, page_from_xml
from tasks.sources.ingest.multistream import Layout, Piece, index_path, open_header_footer, open_piece
from tasks.sources.ingest.page_memo import PageMemo, memo_dir, write_part
from tasks.sources.ingest.page_pass import PagePass
from tasks.sources.ingest.records import RawPage
from tasks.sources.ingest.shards import ShardWriter, write_shard

logger = logging.getLogger(__name__)
_LINK_FIELDS = [f.name for f in fields(LinkCounts)]


@dataclass
class PieceResult:
    """What one piece contributes to pass 1.

    report : the piece's ingest-report rows (columns of ``ingest_report``) in piece order, with
        ``position`` counted from the piece's first record.
    effects : per row ``(checked, mark, redirect, link_delta, untitled)``: whether the record
        reached the duplicate-title check, the title status it sets (kept/redirect/skipped or
        None), its redirect target, its link-count increments (tuple over ``LinkCounts``
        fields, or None) and whether its record name is the ``page #N`` placeholder.
    shards : title-sorted Parquet shards of the piece's kept pages.
    xml_bytes : decompressed bytes of the piece.
    reused : taken from the piece cache (bytes unchanged since a previous build).
    patched : the base dump's kept piece with tonight's revisions applied (:func:`patch_piece`):
        nothing decompressed.
    memo_parts : the files of the piece's page-memo rows (:func:`tasks.sources.ingest.page_memo.write_part`):
        one for a parsed or reused piece, the base piece's and tonight's for a patched one, none
        without the memo.
    cleaned : kept wikitext pages cleaned here / taken from the page memo (a parsed piece).
    revisions : per row, the record's revision id and timestamp (``([rev_id], [timestamp])``; a parsed
        piece): kept with the piece, so that :func:`patch_piece` can tell a stale revision.
    stale : adds-changes revisions skipped as not newer than the base record's
        (:func:`tasks.sources.ingest.changes.is_newer`).
    """

    index: int
    report: pa.Table
    effects: list[tuple]
    shards: list[str]
    xml_bytes: int
    reused: bool = False
    memo_parts: tuple[str, ...] = ()
    patched: bool = False
    cleaned: tuple[int, int] = (0, 0)
    revisions: tuple[list, list] | None = None
    stale: int = 0


_counts = operator.attrgetter(*_LINK_FIELDS)
"""``LinkCounts`` as a tuple of its fields (``dataclasses.astuple`` deep-copies: 10x slower)."""


class _PiecePass(PagePass):
    """Pass-1 state of one piece: rows and effects collected instead of written."""

    def __init__(self, cfg: IngestConfig, shards: ShardWriter):
        super().__init__(cfg, shards, None)
        self.out_rows: list[tuple] = []
        self.effects: list[tuple] = []
        self.rev_ids: list[int | None] = []
        self.timestamps: list[str | None] = []

    def process(self, page: RawPage, namespaces: frozenset[str]) -> None:
        before = _counts(self.links)
        super().process(page, namespaces)
        row = self.out_rows[-1]
        title, reason = row[4], row[6]
        checked = page.error is None and title is not None and page.namespace == 0
        mark = self.titles[title] if checked and reason != DUPLICATE_TITLE else None
        after = _counts(self.links)
        delta = tuple(a - b for a, b in zip(after, before)) if after != before else None
        self.effects.append((checked, mark, self.redirects.get(title) if mark == REDIRECT else None,
                             delta, not page.title))

    def _row(self, page, title, status, reason, detail) -> None:
        self.out_rows.append((page.source, page.position, page.record, page.page_id, title, status, reason,
                              page.n_bytes, detail))
        self.rev_ids.append(page.rev_id)
        self.timestamps.append(page.timestamp)


PIECE_VERSION = "3"   # bump when parse_piece's output changes for the same bytes; 2: the page-memo part kept;
# 3: each row's revision id and timestamp kept (stale adds-changes revisions told apart)
MEMO_PART = "page-memo-part.arrow"
_ROW_NAMES = ("source", "position", "record", "page_id", "title", "status", "reason", "n_bytes", "detail")
_EFFECT_NAMES = ("checked", "mark", "redirect", "link_delta", "untitled")


def piece_key(path: Path, piece: Piece, namespaces: frozenset[str], cfg: IngestConfig) -> str:
    """sha256 over the piece's compressed bytes, the namespaces, the config and :data:`PIECE_VERSION`.
    Not the file name (tonight's dump has a new one): a reused piece gets it in its ``source``."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(piece.start)
        left = piece.end - piece.start
        while left:
            block = fh.read(min(left, 1 << 22))
            if not block:
                raise IngestError(f"{path}: piece {piece.index} ends after the end of the file")
            h.update(block)
            left -= len(block)
    meta = json.dumps([PIECE_VERSION, sorted(namespaces), asdict(cfg)], sort_keys=True, default=str)
    h.update(meta.encode())
    return h.hexdigest()


def _report_table(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows)) if rows else [[] for _ in _ROW_NAMES]
    return pa.table([pa.array(list(c), t) for c, t in zip(columns, _ROW_TYPES)], names=list(_ROW_NAMES))


def _save_piece(result: PieceResult, directory: Path) -> None:
    """Keep a piece's pass-1 output: report rows + effects as Parquet, shards copied; atomic rename."""
    tmp = directory.with_name(temp_name(directory.name))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    effects = list(zip(*result.effects)) if result.effects else [[] for _ in _EFFECT_NAMES]
    table = result.report
    for n, c, t in zip(_EFFECT_NAMES, effects, _EFFECT_TYPES):
        table = table.append_column(n, pa.array(list(c), t))
    rev_ids, timestamps = result.revisions or ([None] * table.num_rows, [None] * table.num_rows)
    table = table.append_column("rev_id", pa.array(rev_ids, pa.int64()))
    table = table.append_column("timestamp", pa.array(timestamps, pa.string()))
    pq.write_table(table, tmp / "rows.parquet")
    for k, shard in enumerate(result.shards):
        shutil.copyfile(shard, tmp / f"shard-{k:05d}.parquet")
    if result.memo_parts:   # a parsed piece has one part; linked, as the memo links it too
        (part,) = result.memo_parts
        link_or_copy(Path(part), tmp / MEMO_PART)
    (tmp / "piece.json").write_text(json.dumps({"xml_bytes": result.xml_bytes, "shards": len(result.shards),
                                                "stale": result.stale}))
    record_digests(tmp)
    move_into_place(tmp, directory)   # another worker may have kept the same piece first


def _kept_rows(table: pa.Table, source: str) -> tuple[pa.Table, list[tuple]]:
    """A kept piece's ``rows.parquet`` (or rows of it) as report rows named ``source`` and effects."""
    report = table.select(list(_ROW_NAMES)).set_column(0, "source", pa.array([source] * table.num_rows, pa.string()))
    effects = [(c, m, r, tuple(d) if d is not None else None, u)
               for c, m, r, d, u in zip(*(table.column(n).to_pylist() for n in _EFFECT_NAMES))]
    return report, effects


def _renamed(pages: pa.Table, source: str) -> pa.Table:
    """Kept pages (a shard's rows) with ``source`` set to tonight's file name."""
    at = pages.schema.get_field_index("source")
    return pages.set_column(at, pages.schema.field("source"), pa.array([source] * pages.num_rows, pa.string()))


def _load_piece(piece: Piece, directory: Path, shard_dir: Path, source: str, group_rows: int) -> PieceResult:
    """A kept piece, its ``source`` set to the current file name; shards are copies (the
    coordinator may rewrite or delete them)."""
    meta = json.loads((directory / "piece.json").read_text())
    report, effects = _kept_rows(pq.read_table(directory / "rows.parquet", memory_map=True), source)
    shard_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(meta["shards"]):
        shards.append(str(shard_dir / f"shard-{k:05d}.parquet"))
        kept = pq.read_table(directory / f"shard-{k:05d}.parquet", memory_map=True)
        if set(kept.column("source").unique().to_pylist()) == {source}:
            shutil.copyfile(directory / f"shard-{k:05d}.parquet", shards[-1])
        else:
            write_shard(_renamed(kept, source), Path(shards[-1]), group_rows)
    parts = (str(directory / MEMO_PART),) if (directory / MEMO_PART).is_file() else ()   # read in place
    return PieceResult(piece.index, report, effects, shards, meta["xml_bytes"], reused=True, memo_parts=parts,
                       stale=meta.get("stale", 0))


_ROW_TYPES = (pa.string(), pa.int64(), pa.string(), pa.int64(), pa.string(), pa.string(), pa.string(), pa.int64(),
              pa.string())
_EFFECT_TYPES = (pa.bool_(), pa.string(), pa.string(), pa.list_(pa.int64()), pa.bool_())


def parse_piece(path: str, piece: Piece, namespaces: frozenset[str], cfg: IngestConfig, shard_dir: str,
                cache_dir: str | None = None, changes: PageChanges | ChangesRange | None = None,
                memo: str | None = None) -> PieceResult:
    """Pass 1 over one piece of a multistream dump (runs in a worker process).

    With ``cache_dir``, a piece whose key (:func:`piece_key`) is there is loaded instead of parsed,
    and a parsed piece is kept there. With ``changes`` (the adds-changes revisions whose page ids
    fall in this piece, or where to read them: :class:`tasks.sources.ingest.changes.ChangesRange`),
    the piece's records are those of the merged dump
    (:func:`tasks.sources.ingest.changes.merge_pages`), named by ``changes.source``; a piece without
    revisions has the key and output of the base dump's piece, renamed. With ``memo`` (the page
    memo's directory, :func:`tasks.sources.ingest.page_memo.memo_dir`), a kept page whose wikitext
    the last build cleaned takes its cleaned text and links from it, and the piece writes its
    pages' rows for the next memo (``PieceResult.memo_parts``).

    Raises
    ------
    IngestError
        The piece does not decompress or parse; names the file, the piece's byte range and,
        from the reader, the position within the piece and the last complete page.
    """
    changes = changes.load() if changes is not None else None
    key = piece_key(Path(path), piece, namespaces, cfg) if cache_dir else None
    base = Path(cache_dir) / key if key is not None else None
    if key is not None and changes is not None and changes.pages:
        key = hashlib.sha256(f"{key}:{changes.digest()}".encode()).hexdigest()
    cached = Path(cache_dir) / key if key is not None else None
    source = changes.source if changes is not None else Path(path).name
    state = _PiecePass(cfg, ShardWriter(Path(shard_dir), cfg.shard_size))
    if verified_entry(cached):
        mark_used(cached)
        return _load_piece(piece, cached, Path(shard_dir), source, state.shards.group_rows)
    if base is not None and base != cached and verified_entry(base):
        mark_used(base)   # the base dump's piece: every night until the next full dump patches it
        patched = patch_piece(piece, base, changes, namespaces, cfg, shard_dir, memo)
        if patched is not None:
            return patched   # not kept: rebuilt from the base piece in a fraction of a parse
    wrapped = []

    def opener():
        wrapped.append(open_piece(Path(path), piece.start, piece.end))
        return wrapped[-1]

    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    if memo is not None:
        state.page_memo, state.memo_rows = PageMemo.open(memo), []
    reader = MediaWikiReader(Path(path), opener)
    reader.namespaces = namespaces
    stale: list[int] = []
    pages = reader.pages() if changes is None else merge_pages(reader.pages(), changes.pages, source, stale)
    try:
        for page in pages:
            state.process(page, namespaces)
    except IngestError as exc:
        raise IngestError(f"piece {piece.index} (bytes {piece.start}-{piece.end}): {exc}") from exc
    state.shards.flush()
    part = None
    if state.memo_rows is not None:
        part = str(Path(shard_dir) / MEMO_PART)
        write_part(Path(part), state.memo_rows)
    result = PieceResult(piece.index, _report_table(state.out_rows), state.effects,
                         [str(p) for p in state.shards.paths], wrapped[-1].inner_bytes,
                         memo_parts=(part,) if part is not None else (),
                         cleaned=(len(state.memo_rows or ()) - state.memo_hits, state.memo_hits),
                         revisions=(state.rev_ids, state.timestamps), stale=len(stale))
    if cached is not None:
        _save_piece(result, cached)
    return result


def parse_pieces(calls: list[tuple]) -> list[PieceResult]:
    """:func:`parse_piece` of each argument tuple of ``calls``, in order, in one worker task (the
    task :func:`run_pieces` submits): one piece for a full build; a few for a build that applies
    adds-changes, each patched from the base dump's kept piece (:func:`patch_piece`) in ~0.4 s,
    not much more than the ~0.17 CPU s a task costs the workflow engine and its API
    (``benchmarks/bench_task_overhead.py``). Errors are :func:`parse_piece`'s (the first piece
    that fails; its message names it)."""
    return [parse_piece(*args) for args in calls]


PIECES_PER_PATCH_TASK = 4
"""The most pieces a task of a build that applies adds-changes patches (:func:`piece_batches`):
enough to spread a task's ~0.17 CPU s of workflow engine (``benchmarks/bench_task_overhead.py``)
over ~1.6 s of patching, few enough that ``window`` tasks' results waiting to be replayed stay
small in the coordinator (~4 MB a piece of 10,000 records)."""


def piece_batches(n_pieces: int, window: int, changes: bool, most: int = PIECES_PER_PATCH_TASK) -> list[range]:
    """The pieces ``0..n_pieces - 1`` grouped into the tasks :func:`run_pieces` submits: one piece
    a task for a full build (``changes`` false: each parses megabytes of XML, so a task's cost
    does not matter and the pool balances best); else runs of consecutive pieces, at most
    ``most`` a task and, for a small dump, no fewer tasks than ``window`` allows (sizes as even as
    can be, differing by at most one). ``run_pieces`` keeps at most ``window`` tasks in flight or
    waiting to be replayed, so the coordinator holds at most ``window * most`` pieces' results.

    Raises
    ------
    ValueError
        ``window < 1``, ``most < 1`` or ``n_pieces < 0``.
    """
    if window < 1 or most < 1 or n_pieces < 0:
        raise ValueError(f"piece_batches: window {window} and most {most} must be >= 1, n_pieces {n_pieces} >= 0")
    if not changes:
        return [range(k, k + 1) for k in range(n_pieces)]
    per_task = min(most, -(-n_pieces // window))
    n_tasks = -(-n_pieces // per_task) if n_pieces else 0
    bounds = [n_pieces * t // n_tasks for t in range(n_tasks + 1)] if n_tasks else [0]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def patch_piece(piece: Piece, base: Path, changes: PageChanges, namespaces: frozenset[str], cfg: IngestConfig,
                shard_dir: str, memo: str | None = None) -> PieceResult | None:
    """Pass 1 of one piece of the merged dump from the base dump's kept piece (``base``, a piece-cache
    directory written by :func:`parse_piece` without changes) and tonight's revisions that fall in
    it, without decompressing anything: the revisions' records go through a fresh pass-1 state
    (with the page memo when ``memo`` is given), every other record keeps the base piece's report
    row, effects and kept page (its ``source`` renamed, its position renumbered), and the records
    are ordered by page id as :func:`tasks.sources.ingest.changes.merge_pages` orders them. A
    revision not newer than the base record's (the revision id and timestamp the base piece kept,
    :func:`tasks.sources.ingest.changes.is_newer`) is skipped and counted (``PieceResult.stale``),
    as ``merge_pages`` skips it.

    A record's pass-1 decision depends on the records before it only through duplicate titles, so
    the result equals parsing the merged piece whenever no title repeats among the merged piece's
    checked records and the base piece decided no duplicate; otherwise (and when a base record has
    no page id or the ids do not increase) this returns ``None`` and the caller parses the piece.

    Returns
    -------
    PieceResult or None
        ``patched=True``; ``cleaned`` counts the revisions' kept pages cleaned here, and those taken
        from the page memo plus the base piece's kept pages as reused. Its memo parts are the base
        piece's part (read in place, not copied) and a part of the revisions' rows only.
    """
    table = pq.read_table(base / "rows.parquet", memory_map=True)
    ids = table.column("page_id")
    if ids.null_count or pc.any(pc.equal(table.column("reason"), DUPLICATE_TITLE)).as_py():
        return None
    base_ids = ids.to_numpy()
    if base_ids.size > 1 and not bool(np.all(np.diff(base_ids) > 0)):
        return None
    source = changes.source
    at = dict(zip(base_ids.tolist(), zip(table.column("rev_id").to_pylist(), table.column("timestamp").to_pylist())))
    revisions = [r for r in changes.pages if r.page_id not in at or is_newer(r, *at[r.page_id])]
    rev_ids = np.fromiter((r.page_id for r in revisions), np.int64, count=len(revisions))
    merged_ids = np.union1d(base_ids, rev_ids)
    keep = ~np.isin(base_ids, rev_ids)
    state = _PiecePass(cfg, ShardWriter(Path(shard_dir), cfg.shard_size))
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    if memo is not None:
        state.page_memo, state.memo_rows = PageMemo.open(memo), []
    for rev, position in zip(revisions, np.searchsorted(merged_ids, rev_ids).tolist()):
        state.process(page_from_xml(page_xml(rev), source, position), namespaces)
    state.shards.flush()

    kept = table.filter(pa.array(keep))
    checked = [t for t, c in zip(kept.column("title").to_pylist(), kept.column("checked").to_pylist()) if c]
    checked += [row[4] for row, effect in zip(state.out_rows, state.effects) if effect[0]]
    if len(set(checked)) != len(checked):
        shutil.rmtree(shard_dir, ignore_errors=True)
        return None
    report, effects = _kept_rows(kept, source)   # an untitled record's name is set by replay_piece
    report = report.set_column(1, "position", pa.array(np.searchsorted(merged_ids, base_ids[keep]), pa.int64()))
    report = pa.concat_tables([report, _report_table(state.out_rows)])
    effects += state.effects
    order = np.argsort(report.column("position").to_numpy(), kind="stable")
    report = report.take(pa.array(order))
    effects = [effects[i] for i in order.tolist()]

    meta = json.loads((base / "piece.json").read_text())
    shards = [str(p) for p in state.shards.paths]
    drop = pa.array(rev_ids, pa.int64())
    for k in range(meta["shards"]):
        pages = pq.read_table(base / f"shard-{k:05d}.parquet", memory_map=True)
        pages = pages.filter(pc.invert(pc.is_in(pages.column("page_id"), value_set=drop)))
        if pages.num_rows:
            shards.append(str(Path(shard_dir) / f"base-{k:05d}.parquet"))
            write_shard(_renamed(pages, source), Path(shards[-1]), state.shards.group_rows)
    parts: tuple[str, ...] = ()
    base_pages = int(np.count_nonzero(pc.equal(kept.column("status"), KEPT).to_numpy(zero_copy_only=False)))
    if state.memo_rows is not None:   # the base piece's part as it is, then tonight's revisions' rows
        parts = (str(base / MEMO_PART),) if (base / MEMO_PART).is_file() else ()
        parts += (str(Path(shard_dir) / MEMO_PART),)
        write_part(Path(parts[-1]), state.memo_rows)
    cleaned = (0, 0) if state.memo_rows is None else (len(state.memo_rows) - state.memo_hits,
                                                      state.memo_hits + base_pages)
    return PieceResult(piece.index, report, effects, shards, meta["xml_bytes"], memo_parts=parts, cleaned=cleaned,
                       patched=True, stale=len(changes.pages) - len(revisions))


def read_siteinfo(layout: Layout) -> tuple[frozenset[str], int]:
    """Namespaces of the dump's ``<siteinfo>`` and the decompressed bytes of header + footer."""
    reader = MediaWikiReader(layout.path, lambda: open_header_footer(layout))
    for _ in reader.pages():
        raise IngestError(f"{layout.path}: a page outside the page streams")
    return reader.namespaces, reader.bytes_read


def replay_piece(state, result: PieceResult, first_position: int) -> None:
    """Apply one piece's records to the coordinator's pass-1 ``state``, in dump order.

    The piece's own decisions stand, taken in bulk (titles, redirects, link counts, report rows),
    except for a record whose title an earlier piece already holds: it becomes a
    ``duplicate_title`` (as the serial pass decides it), with no effect on the state, and its kept
    page leaves the piece's shards. A repeat within the piece the piece decided itself.
    """
    report, effects = result.report, list(result.effects)
    titles = report.column("title").to_pylist()
    seen = [i for i, (t, e) in enumerate(zip(titles, effects)) if e[0] and t in state.titles]
    dropped = {titles[i] for i in seen if effects[i][1] == KEPT}
    if seen:
        statuses, reasons, details = (report.column(n).to_pylist() for n in ("status", "reason", "detail"))
        for i in seen:
            statuses[i], reasons[i] = SKIPPED, DUPLICATE_TITLE
            details[i] = f"title already seen ({state.titles[titles[i]]})"
            effects[i] = (True, None, None, None, effects[i][4])
        for at, name, values in ((5, "status", statuses), (6, "reason", reasons), (8, "detail", details)):
            report = report.set_column(at, name, pa.array(values, pa.string()))
    state.titles.update([(t, e[1]) for t, e in zip(titles, effects) if e[1] is not None])
    state.page_ids.update([(t, pid) for t, e, pid in zip(titles, effects, report.column("page_id").to_pylist())
                           if e[1] == KEPT])
    state.redirects.update([(t, e[2]) for t, e in zip(titles, effects) if e[1] == REDIRECT])
    deltas = [e[3] for e in effects if e[3] is not None]
    links = state.links
    for name, d in zip(_LINK_FIELDS, map(sum, zip(*deltas))):
        if d:
            setattr(links, name, getattr(links, name) + d)
    statuses = report.column("status").to_pylist()
    state.by_status.update(statuses)
    state.skipped.update(r for s, r in zip(statuses, report.column("reason").to_pylist()) if s == SKIPPED)
    state.records += report.num_rows
    positions = pc.add(report.column("position"), pa.scalar(first_position, pa.int64()))
    report = report.set_column(1, "position", positions)
    untitled = [i for i, e in enumerate(effects) if e[4]]
    if untitled:
        records, numbers = report.column("record").to_pylist(), positions.to_pylist()
        for i in untitled:
            records[i] = f"page #{numbers[i]}"
        report = report.set_column(2, "record", pa.array(records, pa.string()))
    state._flush_report()
    state.report.write(report)
    _take_shards(state, result, dropped)


def _take_shards(state, result: PieceResult, dropped: set[str]) -> None:
    """Add the piece's shards to the coordinator's, without the kept pages of ``dropped`` titles."""
    for shard in result.shards:
        path = Path(shard)
        if dropped:
            _drop_titles(path, dropped, state.shards.group_rows)
        if path.exists():
            state.shards.paths.append(path)


def _drop_titles(path: Path, titles: set[str], group_rows: int) -> None:
    table = pq.read_table(path)
    table = table.filter(pc.invert(pc.is_in(table.column("title"), value_set=pa.array(sorted(titles), pa.string()))))
    if table.num_rows:
        write_shard(table, path, group_rows)
    else:
        path.unlink()


def piece_changes(layout: Layout, changes: PageChanges | ChangesFile) -> list[PageChanges | ChangesRange]:
    """``changes`` split by the pieces of ``layout`` (a changes file into ranges each piece reads in its
    worker, :meth:`tasks.sources.ingest.changes.ChangesFile.split`): piece ``k`` gets the page ids from the first id
    of its first stream up to the first id of the next piece's (the first piece from the lowest,
    the last to the highest), the stream the merged dump puts each page in (the first ids the
    layout was planned with from the multistream index beside the dump, :attr:`Layout.first_ids`).

    Raises
    ------
    IngestError
        The layout was found by a scan (no index), the index does not list a piece's first
        stream, or the pieces' first ids do not increase (a dump not in page id order).
    """
    if layout.source != "index":
        raise IngestError(f"{layout.path}: applying adds-changes while ingesting needs its multistream index "
                          f"({index_path(layout.path).name})")
    first = layout.first_ids or {}   # read with the index when the layout was planned
    starts = []
    for piece in layout.pieces:
        if piece.start not in first:
            raise IngestError(f"{index_path(layout.path)}: no page listed for the stream at byte {piece.start}")
        starts.append(first[piece.start])
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise IngestError(f"{layout.path}: its streams are not in increasing page id order; adds-changes can only "
                          "be applied while ingesting a dump in page id order")
    return changes.split([None, *starts[1:], None])


def run_pieces(state, layout: Layout, submit: Callable[..., Any], shard_root: Path, window: int,
               piece_cache: Path | None = None, changes: PageChanges | ChangesFile | None = None) -> int:
    """Pass 1 over a multistream dump: pieces parsed through ``submit``, replayed in order; with
    ``changes``, each piece with the revisions that fall in it (:func:`piece_changes`), several
    consecutive pieces a task (:func:`piece_batches`, :func:`parse_pieces`).

    Returns the decompressed bytes of the whole file (header, pages, footer).
    """
    per_piece = piece_changes(layout, changes) if changes is not None else [None] * len(layout.pieces)
    namespaces, total = read_siteinfo(layout)
    memo = memo_dir(piece_cache, state.cfg, namespaces) if piece_cache is not None else None
    verified_entry(memo)   # checked once here, not by each piece that opens it: a bad memo is discarded
    parts: list[str] = []
    with_parts = 0   # pieces that gave memo parts: the memo is written when every piece did
    pending: deque = deque()
    batches = iter(piece_batches(len(layout.pieces), window, changes is not None))
    position = 0
    logger.info("ingest %s: %d pieces of <= %d streams (offsets from %s)", layout.path.name, len(layout.pieces),
                max((p.n_streams for p in layout.pieces), default=0), layout.source)

    def call(piece: Piece) -> tuple:
        return (str(layout.path), piece, namespaces, state.cfg,
                str(shard_root / f"{layout.path.name}.piece-{piece.index:06d}"),
                str(piece_cache) if piece_cache else None, per_piece[piece.index], str(memo) if memo else None)

    try:
        while True:
            while len(pending) < window:
                batch = next(batches, None)
                if batch is None:
                    break
                pending.append(submit(parse_pieces, [call(layout.pieces[k]) for k in batch]))
            if not pending:
                if memo is not None and with_parts == len(layout.pieces):
                    PageMemo.write(memo, parts)   # the pages of this dump, for the next build
                return total
            for result in pending.popleft().result():
                replay_piece(state, result, position)
                state.pieces["reused" if result.reused else "patched" if result.patched else "built"] += 1
                state.stale_revisions += result.stale
                parts.extend(result.memo_parts)
                with_parts += bool(result.memo_parts)
                if memo is not None and not result.reused:
                    state.cleaned.update(built=result.cleaned[0], reused=result.cleaned[1])
                position += result.report.num_rows
                if getattr(state, "progress", None) is not None:
                    state.progress.update(result.report.num_rows, pieces=sum(state.pieces.values()))
                total += result.xml_bytes
    except BaseException:
        _drain(pending)   # workers still writing into the shard directory must stop first
        raise


def _drain(pending: deque) -> None:
    """Cancel what has not started and wait for the rest (their errors are not the first one)."""
    for future in pending:
        cancel = getattr(future, "cancel", None)
        if cancel is not None:
            cancel()
    for future in pending:
        try:
            future.result()
        except BaseException:  # noqa: BLE001 - the first failure is the one re-raised
            pass
