"""Pass-1 shards: kept pages spilled to temporary Parquet files, each sorted by title, and
merged back in global title order in pass 2 (an external merge sort), so memory is bounded by
the shard size rather than the dump size.

Pass 2 reads one row group per shard at a time; row groups hold ``shard_size // 64`` pages
(clamped to 8..128), and when there are more than :data:`FAN_IN` shards they are first merged
``FAN_IN`` at a time into longer sorted runs (in worker processes when a ``submit`` is given), so
the final merge holds at most ``FAN_IN`` row groups (plus the block being sorted) and ``FAN_IN``
open files whatever the dump size. The merge moves Arrow blocks, not Python rows
(:func:`merge_shards`).
"""
from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.base import atomic_write

SHARD_SCHEMA = pa.schema([
    pa.field("title", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("page_id", pa.int64()),
    pa.field("source", pa.string(), nullable=False),
    pa.field("links", pa.list_(pa.string())),   # normalised link-target titles, deduplicated
])
FAN_IN = 128
"""Shards (or runs) merged at once: a merge holds one row group of each (at most 128 pages) and
keeps each file open. A multistream dump gives one shard per piece of 100 streams (~10,000 pages),
so a dump of up to ~1.3M pages is merged without a run level."""
_GROUP_DIVISOR = 64   # shard row groups hold shard_size // 64 pages (8..128)
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
        self.group_rows = min(128, max(8, shard_size // _GROUP_DIVISOR))  # rows per row group
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


def merge_shards(paths: list[Path], group_rows: int, fan_in: int = FAN_IN, bounds: list[str] | None = None,
                 submit: Callable[..., Any] | None = None) -> Iterator[pa.Table]:
    """Yield the pages of all shards as tables (:data:`SHARD_SCHEMA`) in ascending title order.

    Titles are unique across shards (duplicates are rejected in pass 1), so the order is total;
    texts stay in Arrow, never become Python strings. With more than ``fan_in`` shards, groups of
    ``fan_in`` are first merged into run files (:func:`merge_run`, ``run-<level>-<k>.parquet``
    beside the shards, row groups of at most ``group_rows`` pages), through ``submit(fn, *args) ->
    future`` when given (the runs of one level in parallel), else here; inputs are deleted once
    merged.

    Parameters
    ----------
    bounds : list of str, optional
        Ascending titles, the last at least every title in the shards: the i-th table holds the
        pages with titles in ``(bounds[i-1], bounds[i]]`` (empty ones are not yielded), so a caller
        that knows the titles chooses its block size (pass 2 passes every 1,024th kept title).
        Without it, each table holds the rows that can be placed with what is read so far (at
        least the rest of one shard's row group, often a few rows).

    Raises
    ------
    AssertionError
        A shard holds a title after ``bounds[-1]``.
    """
    paths, level = [Path(p) for p in paths], 0
    while len(paths) > fan_in:
        groups = [paths[k:k + fan_in] for k in range(0, len(paths), fan_in)]
        outs = [group[0].parent / f"run-{level:02d}-{k:05d}.parquet" for k, group in enumerate(groups)]
        jobs = [([str(p) for p in group], str(out), group_rows) for group, out in zip(groups, outs)]
        if submit is None:
            paths = [Path(merge_run(*job)) for job in jobs]
        else:
            paths = [Path(p) for p in _wait_all([submit(merge_run, *job) for job in jobs])]
        level += 1
    return _merge_sorted([_row_groups(p) for p in paths], bounds)


def merge_run(paths: list[str], out: str, group_rows: int) -> str:
    """Merge title-sorted shards ``paths`` into one title-sorted run file ``out`` (row groups of
    at most ``group_rows`` pages, written under a temporary name and renamed), delete the inputs
    and return ``out``. A pass-2 step that runs in a worker process (:func:`merge_shards`)."""
    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, SHARD_SCHEMA, **SHARD_WRITE_OPTIONS) as writer:
            for table in _merge_sorted([_row_groups(Path(p)) for p in paths]):
                writer.write_table(table, row_group_size=group_rows)

    atomic_write(Path(out), write, durable=False)   # scratch of pass 2: a crash discards the whole directory
    for p in paths:
        Path(p).unlink()
    return out


def _wait_all(futures: list) -> list:
    """Results of all ``futures`` in order; when one fails, the others are still waited for (they
    write into the shard directory) before the first error is raised."""
    results, error = [], None
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others finish
            error = error or exc
    if error is not None:
        raise error
    return results


def _merge_sorted(sources: list[Iterator[pa.Table]], bounds: list[str] | None = None) -> Iterator[pa.Table]:
    """k-way merge of title-sorted table streams, a block at a time. Without ``bounds``, every row
    whose title is at most the smallest last title of the current blocks can be placed; with them,
    block ``i`` is every row with a title in ``(bounds[i-1], bounds[i]]``. The rows of a block are
    taken from every stream at once and sorted together (Arrow compares UTF-8 bytes, which orders
    strings as Python does: by code point)."""
    heads = []   # [table, its titles, rows of it already taken, the rest of its stream]
    for source in sources:
        head = _next_head(source)
        if head is not None:
            heads.append(head)
    steps = iter(bounds) if bounds is not None else None
    while heads:
        if steps is None:
            bound = min(titles[-1] for _, titles, _, _ in heads)
        else:
            bound = next(steps, None)
            if bound is None:
                raise AssertionError(f"shard title {heads[0][1][heads[0][2]]!r} after the last merge bound")
        parts, kept = [], []
        for head in heads:
            while head is not None:
                table, titles, taken, source = head
                end = bisect.bisect_right(titles, bound, taken)
                if end > taken:
                    parts.append(table.slice(taken, end - taken))
                    head[2] = end
                if end < len(titles):
                    kept.append(head)
                    break
                head = _next_head(source)
        heads = kept
        if not parts:
            continue
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
    with pq.ParquetFile(path, memory_map=True) as pf:
        for i in range(pf.num_row_groups):
            yield pf.read_row_group(i)
