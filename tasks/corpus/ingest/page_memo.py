"""Pass 1's per-page memo: a kept wikitext page's cleaned text, link targets and link accounting,
kept under the 128-bit BLAKE2b of its wikitext and reused by the next build of the same dump
settings, whatever piece the page falls in.

Cleaning wikitext and extracting links (:func:`tasks.corpus.ingest.wikitext.clean_wikitext`,
:meth:`tasks.corpus.ingest.page_pass.PagePass._link_targets`) are most of a piece's CPU after the
bz2 decompression; a nightly that edited ~1% of the pages finds every other page's wikitext
unchanged. The memo is a directory of Arrow IPC files (``part-00000.arrow``, ...: the parts that made
it, hard-linked, not copied; read memory-mapped and concatenated without a copy, so a lookup reads
only the rows it hits), with columns ``hi``, ``lo`` (the digest's two words), ``text`` (the cleaned
text), ``targets`` (the normalised, deduplicated article targets, null when the cleaned text was
too short to keep) and ``delta`` (the page's increments of every
:class:`tasks.corpus.ingest.config.LinkCounts` field), and its index ``keys.npy``: ``(n, 3)``
uint64 rows ``(hi, lo, row)`` sorted by key, each key once (the first row that has it; ``row``
counts through the parts in order). Each piece writes the rows of its pages as a part
(:func:`write_part`); a piece patched from the base dump's kept piece contributes that piece's
part as it is and a part of tonight's revisions only. After pass 1 the parts replace the memo
(:meth:`PageMemo.write`, atomic), so it holds the last build's pages, and, until the next full
dump, the base dump's rows of pages revised since (their old wikitext's key is never asked again;
they cost only space). Writing a memo copies no text: at 200K pages it linked 0.66 GB that each
build wrote again before. Earlier layouts are still read: one ``pages.arrow`` with ``keys.npy``,
or one ``pages.arrow`` sorted by key without it. Its directory name carries the settings and
namespaces the values depend on (:func:`memo_dir`). Nothing here imports Prefect.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from data_contracts.base import atomic_directory, link_or_copy
from funnelrag.verify import record_digests
from tasks.corpus.memo import first_of_each_key, settings_dir, text_key
from tasks.corpus.ingest.config import IngestConfig

PAGE_MEMO_VERSION = "1"
MEMO_FILE = "pages.arrow"   # the earlier layout: one file
INDEX_FILE = "keys.npy"
PART_GLOB = "part-*.arrow"
_SCHEMA = pa.schema([pa.field("hi", pa.uint64(), nullable=False), pa.field("lo", pa.uint64(), nullable=False),
                     pa.field("text", pa.large_string(), nullable=False), pa.field("targets", pa.list_(pa.string())),
                     pa.field("delta", pa.list_(pa.int64()), nullable=False)])


def memo_dir(root: Path, cfg: IngestConfig, namespaces: frozenset[str]) -> Path:
    """The page memo under ``root`` (the piece cache) for ``cfg`` and the dump's ``namespaces``."""
    return settings_dir(root, "page-memo", PAGE_MEMO_VERSION, cfg, sorted(namespaces))


page_key = text_key
"""The key of a page's wikitext (:func:`tasks.corpus.memo.text_key`)."""


class PageMemo:
    """A page memo opened for lookups (:meth:`open`)."""

    def __init__(self, table: pa.Table, index: np.ndarray):
        self.table = table
        self.hi, self.lo, self.rows = index[:, 0], index[:, 1], index[:, 2]

    @classmethod
    def open(cls, directory: Path | str | None) -> "PageMemo | None":
        """The memo in ``directory`` (memory-mapped), or ``None`` when there is none. A memo written
        before the index existed holds its rows sorted by key: its index is its own key columns.

        Raises ``FileNotFoundError`` when the index names more rows than the parts hold (a
        part removed by hand)."""
        if directory is None:
            return None
        directory = Path(directory)
        if (directory / MEMO_FILE).is_file():
            table = ipc.open_file(pa.memory_map(str(directory / MEMO_FILE))).read_all()
        elif (directory / INDEX_FILE).is_file():
            table = _read_parts(sorted(directory.glob(PART_GLOB)))
        else:
            return None
        if (directory / INDEX_FILE).is_file():
            index = np.load(directory / INDEX_FILE, mmap_mode="r")
            if index.shape[0] and int(np.max(index[:, 2])) >= table.num_rows:
                raise FileNotFoundError(f"page memo {directory}: its index names row {int(np.max(index[:, 2]))} "
                                        f"but its parts hold {table.num_rows} rows")
            return cls(table, index)
        hi, lo = table.column("hi").to_numpy(), table.column("lo").to_numpy()
        return cls(table, np.stack([hi, lo, np.arange(hi.size, dtype=np.uint64)], axis=1))

    def get(self, key: tuple[int, int]) -> tuple[str, list[str] | None, list[int]] | None:
        """``(cleaned text, targets or None, link-count increments)`` of the page whose wikitext has
        ``key``, or ``None``."""
        hi, lo = np.uint64(key[0]), np.uint64(key[1])
        a = int(np.searchsorted(self.hi, hi, side="left"))
        b = int(np.searchsorted(self.hi, hi, side="right"))
        for at in range(a, b):
            if self.lo[at] == lo:
                row = int(self.rows[at])
                return (self.table.column("text")[row].as_py(), self.table.column("targets")[row].as_py(),
                        self.table.column("delta")[row].as_py())
        return None

    @staticmethod
    def write(directory: Path, parts: Sequence[Path]) -> int:
        """Replace the memo in ``directory`` with the parts ``parts`` (:func:`write_part` files),
        hard-linked in order (copied across file systems), and their index sorted by key (a
        repeated key points at its first row); atomic. Returns the distinct keys."""
        table = _read_parts(parts)
        hi = table.column("hi").to_numpy().astype(np.uint64)
        lo = table.column("lo").to_numpy().astype(np.uint64)
        rows = first_of_each_key(np.stack([hi, lo], axis=1))
        index = np.stack([hi[rows], lo[rows], rows.astype(np.uint64)], axis=1) if rows.size else np.zeros((0, 3), np.uint64)
        with atomic_directory(Path(directory)) as tmp:
            for k, part in enumerate(parts):
                link_or_copy(Path(part), tmp / f"part-{k:05d}.arrow")
            np.save(tmp / INDEX_FILE, np.ascontiguousarray(index, np.uint64))
            record_digests(tmp)
        return int(rows.size)


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

