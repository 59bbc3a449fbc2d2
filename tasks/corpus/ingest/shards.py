"""Pass-1 shards: kept pages spilled to temporary Parquet files, each sorted by title, and
merged back in global title order in pass 2 (an external merge sort), so memory is bounded by
the shard size rather than the dump size.

Pass 2 reads one row group per shard at a time; row groups hold ``shard_size // FAN_IN`` pages
(clamped to 8..128), and when there are more than :data:`FAN_IN` shards they are first merged
``FAN_IN`` at a time into longer sorted runs, so a merge holds at most ``max(shard_size, 512)``
pages and ``FAN_IN`` open files whatever the dump size.
"""
from __future__ import annotations

import heapq
from pathlib import Path
from typing import Iterator

import pyarrow as pa
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
        pq.write_table(_table(self._rows), path, compression="lz4", row_group_size=self.group_rows)
        self.paths.append(path)
        self._rows = []


def merge_shards(paths: list[Path], group_rows: int, fan_in: int = FAN_IN
                 ) -> Iterator[tuple[str, str, int | None, str, list[str] | None]]:
    """Yield ``(title, text, page_id, source, links)`` of all shards in ascending title order.

    Titles are unique across shards (duplicates are rejected in pass 1), so the order is total.
    With more than ``fan_in`` shards, groups of ``fan_in`` are first merged into run files
    (``run-<level>-<k>.parquet``, row groups of ``group_rows``) beside the shards; inputs are
    deleted once merged.
    """
    paths, level = list(paths), 0
    while len(paths) > fan_in:
        runs = []
        for k in range(0, len(paths), fan_in):
            group = paths[k:k + fan_in]
            run = group[0].parent / f"run-{level:02d}-{k // fan_in:05d}.parquet"
            with pq.ParquetWriter(run, SHARD_SCHEMA, compression="lz4") as writer:
                rows: list[tuple] = []
                for row in heapq.merge(*(_rows(p) for p in group), key=lambda r: r[0]):
                    rows.append(row)
                    if len(rows) == group_rows:
                        writer.write_table(_table(rows))
                        rows = []
                if rows:
                    writer.write_table(_table(rows))
            for p in group:
                p.unlink()
            runs.append(run)
        paths, level = runs, level + 1
    return heapq.merge(*(_rows(p) for p in paths), key=lambda r: r[0])


def _table(rows: list[tuple]) -> pa.Table:
    columns = list(zip(*rows))
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, SHARD_SCHEMA)], schema=SHARD_SCHEMA)


def _rows(path: Path) -> Iterator[tuple]:
    with pq.ParquetFile(path) as pf:
        for i in range(pf.num_row_groups):
            table = pf.read_row_group(i)
            yield from zip(*(table.column(name).to_pylist() for name in SHARD_SCHEMA.names))
