"""Pass-1 shards: kept pages spilled to temporary Parquet files, each sorted by title, and
merged back in global title order in pass 2 (an external merge sort), so memory is bounded by
the shard size rather than the dump size."""
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
MERGE_ROWS = 512
"""Rows per shard row group; pass 2 holds one row group per shard."""


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
        columns = list(zip(*self._rows))
        table = pa.table([pa.array(c, type=f.type) for c, f in zip(columns, SHARD_SCHEMA)], schema=SHARD_SCHEMA)
        path = self.directory / f"shard-{len(self.paths):05d}.parquet"
        pq.write_table(table, path, compression="lz4", row_group_size=MERGE_ROWS)
        self.paths.append(path)
        self._rows = []


def merge_shards(paths: list[Path]) -> Iterator[tuple[str, str, int | None, str, list[str] | None]]:
    """Yield ``(title, text, page_id, source, links)`` of all shards in ascending title order.

    Titles are unique across shards (duplicates are rejected in pass 1), so the order is total.
    """
    return heapq.merge(*(_rows(p) for p in paths), key=lambda r: r[0])


def _rows(path: Path) -> Iterator[tuple]:
    with pq.ParquetFile(path) as pf:
        for i in range(pf.num_row_groups):
            table = pf.read_row_group(i)
            yield from zip(*(table.column(name).to_pylist() for name in SHARD_SCHEMA.names))
