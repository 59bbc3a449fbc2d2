"""Pass 1 of the ingest over the pieces of a multistream dump, in worker processes.

Each piece (a run of whole bz2 page streams, :mod:`tasks.corpus.ingest.multistream`) is parsed
by :func:`parse_piece` with a fresh pass-1 state: report rows, kept pages spilled to title-sorted
shards in a piece directory, and for every record what it would do to the global state. The
coordinator then *replays* the pieces in dump order (:func:`replay_piece`), which is where the
decisions that need the whole dump so far are taken: a title already seen in an earlier piece
makes the record a ``duplicate_title`` (its kept page is removed from the piece's shards, its
links are not counted). Positions are renumbered from the piece's first page. The result — the
report, the titles and redirect tables, the link accounting and the set of kept pages — is the
one the serial pass builds, so the artifacts are byte-identical to the serial path's.

Workers are submitted through any executor with ``submit(fn, *args) -> future`` (a
``concurrent.futures`` pool, or the Prefect task runner of the corpus-build flow); at most
``window`` pieces are in flight or finished-but-not-replayed, which bounds coordinator memory.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.corpus.ingest.config import DUPLICATE_TITLE, KEPT, REDIRECT, SKIPPED, IngestConfig, IngestError, LinkCounts
from tasks.corpus.ingest.mediawiki import MediaWikiReader
from tasks.corpus.ingest.multistream import Layout, Piece, open_header_footer, open_piece
from tasks.corpus.ingest.records import RawPage
from tasks.corpus.ingest.shards import ShardWriter

logger = logging.getLogger(__name__)
_LINK_FIELDS = [f.name for f in fields(LinkCounts)]


@dataclass
class PieceResult:
    """What one piece contributes to pass 1.

    rows : report rows ``(source, position-in-piece, record, page_id, title, status, reason,
        n_bytes, detail)`` in piece order.
    effects : per row ``(checked, mark, redirect, link_delta, untitled)``: whether the record
        reached the duplicate-title check, the title status it sets (kept/redirect/skipped or
        None), its redirect target, its link-count increments (tuple over ``LinkCounts``
        fields, or None) and whether its record name is the ``page #N`` placeholder.
    shards : title-sorted Parquet shards of the piece's kept pages.
    xml_bytes : decompressed bytes of the piece.
    """

    index: int
    rows: list[tuple]
    effects: list[tuple]
    shards: list[str]
    xml_bytes: int


def _pass_class():
    from tasks.corpus.ingest.run import _FirstPass  # noqa: PLC0415 - run imports this module

    class _PiecePass(_FirstPass):
        """Pass-1 state of one piece: rows and effects collected instead of written."""

        def __init__(self, cfg: IngestConfig, shards: ShardWriter):
            super().__init__(cfg, shards, None)
            self.out_rows: list[tuple] = []
            self.effects: list[tuple] = []

        def process(self, page: RawPage, namespaces: frozenset[str]) -> None:
            before = astuple(self.links)
            super().process(page, namespaces)
            row = self.out_rows[-1]
            title, reason = row[4], row[6]
            checked = page.error is None and title is not None and page.namespace == 0
            mark = self.titles[title] if checked and reason != DUPLICATE_TITLE else None
            after = astuple(self.links)
            delta = tuple(a - b for a, b in zip(after, before)) if after != before else None
            self.effects.append((checked, mark, self.redirects.get(title) if mark == REDIRECT else None,
                                 delta, not page.title))

        def _row(self, page, title, status, reason, detail) -> None:
            self.out_rows.append((page.source, page.position, page.record, page.page_id, title, status, reason,
                                  page.n_bytes, detail))

    return _PiecePass


def parse_piece(path: str, piece: Piece, namespaces: frozenset[str], cfg: IngestConfig, shard_dir: str) -> PieceResult:
    """Pass 1 over one piece of a multistream dump (runs in a worker process).

    Raises
    ------
    IngestError
        The piece does not decompress or parse; names the file, the piece's byte range and,
        from the reader, the position within the piece and the last complete page.
    """
    wrapped = []

    def opener():
        wrapped.append(open_piece(Path(path), piece.start, piece.end))
        return wrapped[-1]

    state = _pass_class()(cfg, ShardWriter(Path(shard_dir), cfg.shard_size))
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    reader = MediaWikiReader(Path(path), opener)
    reader.namespaces = namespaces
    try:
        for page in reader.pages():
            state.process(page, namespaces)
    except IngestError as exc:
        raise IngestError(f"piece {piece.index} (bytes {piece.start}-{piece.end}): {exc}") from exc
    state.shards.flush()
    return PieceResult(piece.index, state.out_rows, state.effects, [str(p) for p in state.shards.paths],
                       wrapped[-1].inner_bytes)


def read_siteinfo(layout: Layout) -> tuple[frozenset[str], int]:
    """Namespaces of the dump's ``<siteinfo>`` and the decompressed bytes of header + footer."""
    reader = MediaWikiReader(layout.path, lambda: open_header_footer(layout))
    for _ in reader.pages():
        raise IngestError(f"{layout.path}: a page outside the page streams")
    return reader.namespaces, reader.bytes_read


def replay_piece(state, result: PieceResult, first_position: int) -> None:
    """Apply one piece's records to the coordinator's pass-1 ``state``, in dump order."""
    dropped: set[str] = set()
    links = state.links
    for row, (checked, mark, redirect, delta, untitled) in zip(result.rows, result.effects):
        source, pos, record, page_id, title, status, reason, n_bytes, detail = row
        pos += first_position
        if untitled:
            record = f"page #{pos}"
        if checked and title in state.titles:
            if mark == KEPT:
                dropped.add(title)
            status, reason, detail = SKIPPED, DUPLICATE_TITLE, f"title already seen ({state.titles[title]})"
        else:
            if mark is not None:
                state.titles[title] = mark
            if mark == REDIRECT:
                state.redirects[title] = redirect
            if delta is not None:
                for name, d in zip(_LINK_FIELDS, delta):
                    if d:
                        setattr(links, name, getattr(links, name) + d)
        state.by_status[status] += 1
        if status == SKIPPED:
            state.skipped[reason] += 1
        state.records += 1
        state._rows.append((source, pos, record, page_id, title, status, reason, n_bytes, detail))
        if len(state._rows) >= 20_000:
            state._flush_report()
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
        pq.write_table(table, path, compression="lz4", row_group_size=group_rows)
    else:
        path.unlink()


def run_pieces(state, layout: Layout, submit: Callable[..., Any], shard_root: Path, window: int) -> int:
    """Pass 1 over a multistream dump: pieces parsed through ``submit``, replayed in order.

    Returns the decompressed bytes of the whole file (header, pages, footer).
    """
    namespaces, total = read_siteinfo(layout)
    pending: deque = deque()
    pieces = iter(layout.pieces)
    position = 0
    logger.info("ingest %s: %d pieces of <= %d streams (offsets from %s)", layout.path.name, len(layout.pieces),
                max((p.n_streams for p in layout.pieces), default=0), layout.source)
    while True:
        while len(pending) < window:
            piece = next(pieces, None)
            if piece is None:
                break
            pending.append(submit(parse_piece, str(layout.path), piece, namespaces, state.cfg,
                                  str(shard_root / f"{layout.path.name}.piece-{piece.index:06d}")))
        if not pending:
            return total
        result = pending.popleft().result()
        replay_piece(state, result, position)
        position += len(result.rows)
        total += result.xml_bytes
