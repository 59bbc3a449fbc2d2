"""Pass-1 shards: kept pages spilled to temporary Parquet files, each sorted by title, and
merged back in global title order in pass 2 (an external merge sort), so memory is bounded by
the shard size rather than the dump size.

Pass 2 reads one row group per shard at a time; row groups hold ``shard_size // FAN_IN`` pages
(clamped to 8..128), and when there are more than :data:`FAN_IN` shards they are first merged
``FAN_IN`` at a time into longer sorted runs, so a merge holds at most ``max(shard_size, 512)``
pages (plus the block being sorted, as much again) and ``FAN_IN`` open files whatever the dump
size. The merge moves Arrow blocks, not Python rows (:func:`merge_shards`).
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SHARD_SCHEMA = pa.schema([
    pa.field("title", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("page_id", pa.int64()),
    pa.field("source", pa.string(), nullable=False),
    pa.field("links", pa.list_(pa.string())),   # normalised link-target titles, deduplicated
])
FAN_IN = 64
"""Shards merged at once."""
SHARD_WRITE_OPTIONS = {"compression": "lz4", "use_dictionary": ["source"], "write_statistics": False}
"""Parquet settings of the temporary shards and merge runs: lz4, no dictionary for titles, texts
and links (mostly distinct: the dictionary is built and dropped), no min/max statistics (never
read). They change the temporary files only, not the artifacts."""


class ShardWriter:
    """Buffer kept pages and write them as title-sorted shards of ``shard_size`` pages.

    Parameters
    ----------
    directory : Path
        Temporary directory for ``shard-00000.parquet``, ...
    shard_size : int
        Pages per shard.
    """

    def __init__(self, directory: Path, shard_size: int):
        self.directory, self.shard_size = Path(directory), shard_size
        self.group_rows = min(128, max(8, shard_size // FAN_IN))  # rows per row group
        self.paths: list[Path] = []
        self._rows: list[tuple[str, str, int | None, str, list[str]]] = []

    def add(self, title: str, text: str, page_id: int | None, source: str, links: list[str]) -> None:
        self._rows.append((title, text, page_id, source, links))
        if len(self._rows) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        self._rows.sort(key=lambda r: r[0])
        path = self.directory / f"shard-{len(self.paths):05d}.parquet"
        write_shard(_table(self._rows), path, self.group_rows)
        self.paths.append(path)
        self._rows = []


def write_shard(table: pa.Table, path: Path, group_rows: int) -> None:
    """Write ``table`` (:data:`SHARD_SCHEMA`, sorted by title) as a shard of row groups of ``group_rows`` pages."""
    pq.write_table(table, path, row_group_size=group_rows, **SHARD_WRITE_OPTIONS)


def merge_shards(paths: list[Path], group_rows: int, fan_in: int = FAN_IN) -> Iterator[pa.Table]:
    """Yield the pages of all shards as tables (:data:`SHARD_SCHEMA`) in ascending title order.

    Titles are unique across shards (duplicates are rejected in pass 1), so the order is total.
    Each table holds the rows that can be placed with what is read so far: at least the rest of
    one shard's current row group, at most one row group per shard; texts stay in Arrow, never
    become Python strings. With more than ``fan_in`` shards, groups of ``fan_in`` are first merged into run
    files (``run-<level>-<k>.parquet``, row groups of at most ``group_rows`` pages) beside the
    shards; inputs are deleted once merged.
    """
    paths, level = list(paths), 0
    while len(paths) > fan_in:
        runs = []
        for k in range(0, len(paths), fan_in):
            group = paths[k:k + fan_in]
            run = group[0].parent / f"run-{level:02d}-{k // fan_in:05d}.parquet"
            with pq.ParquetWriter(run, SHARD_SCHEMA, **SHARD_WRITE_OPTIONS) as writer:
                for table in _merge_sorted([_row_groups(p) for p in group]):
                    writer.write_table(table, row_group_size=group_rows)
            for p in group:
                p.unlink()
            runs.append(run)
        paths, level = runs, level + 1
    return _merge_sorted([_row_groups(p) for p in paths])


def _merge_sorted(sources: list[Iterator[pa.Table]]) -> Iterator[pa.Table]:
    """k-way merge of title-sorted table streams, a block at a time: every row whose title is at
    most the smallest last title of the current blocks can be placed, so those rows of every
    block are taken at once and sorted together (Arrow compares UTF-8 bytes, which orders
    strings as Python does: by code point)."""
    heads = []   # [table, its titles, rows of it already taken, the rest of its stream]
    for source in sources:
        head = _next_head(source)
        if head is not None:
            heads.append(head)
    while heads:
        bound = min(titles[-1] for _, titles, _, _ in heads)
        parts = []
        for head in heads:
            table, titles, taken, _ = head
            end = bisect.bisect_right(titles, bound, taken)
            if end > taken:
                parts.append(table.slice(taken, end - taken))
                head[2] = end
        heads = [h if h[2] < len(h[1]) else _next_head(h[3]) for h in heads]
        heads = [h for h in heads if h is not None]
        merged = pa.concat_tables(parts)
        if len(parts) > 1:
            merged = merged.take(pc.sort_indices(merged, sort_keys=[("title", "ascending")]))
        yield merged


def _next_head(source: Iterator[pa.Table]) -> list | None:
    for table in source:
        if table.num_rows:
            return [table, table.column("title").to_pylist(), 0, source]
    return None


def _table(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows))
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, SHARD_SCHEMA)], schema=SHARD_SCHEMA)


def _row_groups(path: Path) -> Iterator[pa.Table]:
    with pq.ParquetFile(path) as pf:
        for i in range(pf.num_row_groups):
            yield pf.read_row_group(i)
