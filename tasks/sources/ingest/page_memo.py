"""Pass 1's per-page memo: a kept wikitext page's cleaned text, link targets and link accounting,
kept under the 128-bit BLAKE2b of its wikitext (:func:`funnelrag.content_store.text_key`) and
reused by the next build of the same dump settings, whatever piece the page falls in.

Cleaning wikitext and extracting links (:func:`tasks.sources.ingest.wikitext.clean_wikitext`,
:meth:`tasks.sources.ingest.page_pass.PagePass._link_targets`) are most of a piece's CPU after the
bz2 decompression; a nightly that edited ~1% of the pages finds every other page's wikitext
unchanged. The memo is an entry of the content store (:class:`funnelrag.content_store.ContentMemo`:
sorted keys, field ``page`` the row of each key's page) with the rows in Arrow IPC files beside
it (``part-00000.arrow``, ...: the parts that made it, hard-linked, not copied; read
memory-mapped and concatenated without a copy, so a lookup reads only the rows it hits), columns
``hi``, ``lo`` (the digest's two words), ``text`` (the cleaned text), ``targets`` (the
normalised, deduplicated article targets, null when the cleaned text was too short to keep) and
``delta`` (the page's increments of every :class:`tasks.sources.ingest.config.LinkCounts` field).
A repeated key points at its first row (rows count through the parts in order). Each piece
writes the rows of its pages as a part (:func:`write_part`); a piece patched from the base dump's
kept piece contributes that piece's part as it is and a part of tonight's revisions only. After
pass 1 the parts replace the memo (:meth:`PageMemo.write`, atomic), so it holds the last build's
pages, and, until the next full dump, the base dump's rows of pages revised since (their old
wikitext's key is never asked again; they cost only space). Writing a memo copies no text: at
200K pages it linked 0.66 GB that each build wrote again before. Its directory name carries the
settings and namespaces the values depend on (:func:`memo_dir`); a memo of an earlier layout has
another name, is never read, and is swept by retention. Nothing here imports Prefect.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from data_contracts.base import link_or_copy
from funnelrag.content_store import ContentMemo, settings_dir
from tasks.sources.ingest.config import IngestConfig

PAGE_MEMO_VERSION = "2"   # 2: a content-store entry (keys and rows as every memo's), parts beside it
PAGE_FIELD = "page"
PART_GLOB = "part-*.arrow"
_SCHEMA = pa.schema([pa.field("hi", pa.uint64(), nullable=False), pa.field("lo", pa.uint64(), nullable=False),
                     pa.field("text", pa.large_string(), nullable=False), pa.field("targets", pa.list_(pa.string())),
                     pa.field("delta", pa.list_(pa.int64()), nullable=False)])


def memo_dir(root: Path, cfg: IngestConfig, namespaces: frozenset[str]) -> Path:
    """The page memo under ``root`` (the piece cache) for ``cfg`` and the dump's ``namespaces``."""
    return settings_dir(root, "page-memo", PAGE_MEMO_VERSION, cfg, sorted(namespaces))


class PageMemo:
    """A page memo opened for lookups (:meth:`open`): ``memo`` its keys, ``table`` its rows."""

    def __init__(self, memo: ContentMemo, table: pa.Table):
        self.memo, self.table = memo, table
        self._text, self._targets, self._delta = (table.column(n) for n in ("text", "targets", "delta"))

    @classmethod
    def open(cls, directory: Path | str | None) -> "PageMemo | None":
        """The memo in ``directory`` (memory-mapped), or ``None`` when there is none.

        Raises ``FileNotFoundError`` when its keys name more rows than its parts hold (a part
        removed by hand)."""
        memo = ContentMemo.open(directory, [PAGE_FIELD])
        if memo is None:
            return None
        table = _read_parts(sorted(Path(directory).glob(PART_GLOB)))
        rows = memo.fields[PAGE_FIELD][1]
        if len(rows) and int(np.max(rows)) >= table.num_rows:
            raise FileNotFoundError(f"page memo {directory}: its keys name row {int(np.max(rows))} "
                                    f"but its parts hold {table.num_rows} rows")
        return cls(memo, table)

    def get(self, key: tuple[int, int]) -> tuple[str, list[str] | None, list[int]] | None:
        """``(cleaned text, targets or None, link-count increments)`` of the page whose wikitext has
        ``key``, or ``None``."""
        at = self.memo.find(key)
        if at < 0:
            return None
        bounds, rows = self.memo.fields[PAGE_FIELD]
        row = int(rows[bounds[at, 0]])
        return self._text[row].as_py(), self._targets[row].as_py(), self._delta[row].as_py()

    @staticmethod
    def write(directory: Path, parts: Sequence[Path]) -> int:
        """Replace the memo in ``directory`` with the parts ``parts`` (:func:`write_part` files),
        hard-linked in order (copied across file systems), keyed by their pages' keys (a repeated
        key points at its first row); atomic. Returns the distinct keys."""
        table = _read_parts(parts)
        keys = np.stack([table.column("hi").to_numpy().astype(np.uint64),
                         table.column("lo").to_numpy().astype(np.uint64)], axis=1)
        n = keys.shape[0]
        links = {f"part-{k:05d}.arrow": (lambda path, part=Path(part): link_or_copy(part, path))
                 for k, part in enumerate(parts)}
        return ContentMemo.write(Path(directory), keys, {PAGE_FIELD: (np.arange(n + 1), np.arange(n, dtype=np.int64))},
                                 extra=links)


def _read_parts(parts: Sequence[Path | str]) -> pa.Table:
    """The parts' rows one after the other (memory-mapped, concatenated without a copy)."""
    tables = [ipc.open_file(pa.memory_map(str(p))).read_all().cast(_SCHEMA) for p in parts]
    return pa.concat_tables(tables) if tables else _SCHEMA.empty_table()


def write_part(path: Path, rows: list[tuple]) -> None:
    """One piece's memo rows ``(key, cleaned text, targets or None, delta)`` as an Arrow IPC file."""
    columns = list(zip(*rows)) if rows else [[], [], [], []]
    keys = np.array(columns[0], dtype=np.uint64).reshape(-1, 2)
    table = pa.table([pa.array(keys[:, 0], pa.uint64()), pa.array(keys[:, 1], pa.uint64()),
                      pa.array(list(columns[1]), pa.large_string()), pa.array(list(columns[2]), pa.list_(pa.string())),
                      pa.array(list(columns[3]), pa.list_(pa.int64()))], schema=_SCHEMA)
    with ipc.new_file(str(path), _SCHEMA) as writer:
        writer.write_table(table)

