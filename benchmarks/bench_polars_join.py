"""Would polars do pass 2 of the ingest better? A measured experiment (prints its figures).

Pass 2 (:func:`tasks.sources.ingest.run._second_pass`) does two things polars is built for:

* the external merge of the title-sorted pass-1 shards (:func:`~tasks.sources.ingest.shards.merge_shards`,
  a k-way merge of Arrow blocks), against polars reading every shard and sorting by title
  (``read_parquet(...).sort``), its streaming engine (``scan_parquet(...).sort().collect(engine="streaming")``)
  and its merge of sorted frames (``merge_sorted``, folded over the shards);
* the link join: every document's link targets -> ``doc_id`` of the kept article or of the end of
  a resolved redirect, then distinct sorted ``(src, dst)`` pairs and the link counts
  (:func:`~tasks.sources.ingest.run._resolve_links` through the compiled
  :class:`~tasks.sources.ingest.lookup.TitleIndex`, :data:`LINK_RESOLVE_DOCS` documents at a
  time), against ``explode`` + ``join`` + ``unique`` + ``sort`` in polars over all documents at once
  (its best case: one call, no memory bound).

Each polars result is checked equal to ours (same titles and texts in the same order; same pairs
and counts). Shards come from pass 1 on a synthetic dump (:mod:`benchmarks.synth_dump`). Times are
the best of ``--repeats``, the variants interleaved; CPU is the process's (all threads).

Measured here (2026-11-26, 2 cores shared with six other jobs, load average 10-17; polars 2.1.0 on
2 threads, pyarrow 25.0.1; ``--pages 20000 --shard-size 500 --repeats 3 --memory``: 5,544 kept
articles in 12 shards, 282,984 link targets; best of 3, CPU of all threads):

=========================================  ==========  =========================================
step                                       CPU ms      note
=========================================  ==========  =========================================
merge: ours (``merge_shards``, k-way)        180-243   bounded: FAN_IN row groups + one block
merge: polars ``read_parquet().sort()``      140-148   holds every document (whole corpus)
merge: polars streaming sort                 138-158   collects the whole sorted frame too
merge: polars ``merge_sorted`` fold          348-382
link join: ours (``_resolve_links``)           44-50   TitleIndex build 3 ms
link join: polars explode/join/unique/sort   124-132   all documents at once (its best case)
=========================================  ==========  =========================================

Peak RSS of the merge alone (fresh process, 56 MB of text): ours +189 MB, polars sort +145 MB,
streaming +151 MB: at this size everything fits and allocator caching dominates; the merge's bound
matters at enwiki scale (~7M articles), where a polars sort would hold all documents' text.

Decision: no change to the ingest. The link join is 2.6-2.8x more CPU in polars than the compiled
TitleIndex; the merge would save ~40 ms CPU per 5.5k documents (~20%) but gives up the memory
bound, and the merge is not what bounds pass 2 (the documents writer is). polars stays a test and
benchmark tool (``dev`` and ``bench`` extras).

Run: ``python benchmarks/bench_polars_join.py [--pages 20000] [--shard-size 500] [--repeats 3] [--dump-dir DIR] [--memory]``.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.synth_dump import write_dump  # noqa: E402
from tasks.sources.ingest.config import KEPT, IngestConfig, LinkCounts  # noqa: E402
from tasks.sources.ingest.redirects import resolve_redirects  # noqa: E402
from tasks.sources.ingest.run import LINK_RESOLVE_DOCS, MERGE_BLOCK_DOCS, LinkTargets, _FirstPass, _resolve_links  # noqa: E402
from tasks.sources.ingest.shards import ShardWriter, merge_shards  # noqa: E402


class _NoReport:
    def write(self, batch: dict) -> None:
        pass


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def pass_one(dump: Path, shard_dir: Path, shard_size: int) -> _FirstPass:
    shard_dir.mkdir()
    state = _FirstPass(IngestConfig(format="mediawiki", shard_size=shard_size), ShardWriter(shard_dir, shard_size),
                       _NoReport())
    state.run([dump])
    return state


# -- the merge -----------------------------------------------------------------------------------

def merge_ours(state: _FirstPass, bounds: list[str]) -> pa.Table:
    return pa.concat_tables(merge_shards(state.shards.paths, state.shards.group_rows, bounds=bounds))


def merge_polars_sort(paths: list[Path]) -> pa.Table:
    return pl.read_parquet(paths).sort("title").to_arrow()


def merge_polars_streaming(paths: list[Path]) -> pa.Table:
    return pl.scan_parquet(paths).sort("title").collect(engine="streaming").to_arrow()


def merge_polars_merge_sorted(paths: list[Path]) -> pa.Table:
    frames = [pl.scan_parquet(p).set_sorted("title") for p in paths]
    return functools.reduce(lambda a, b: a.merge_sorted(b, key="title"), frames).collect().to_arrow()


# -- the link join -------------------------------------------------------------------------------

def links_ours(merged: pa.Table, targets: LinkTargets, state: _FirstPass) -> tuple[np.ndarray, np.ndarray, LinkCounts]:
    state.links = LinkCounts()
    links = merged.column("links")
    src, dst = [], []
    for first in range(0, merged.num_rows, LINK_RESOLVE_DOCS):
        s, d = _resolve_links(links.slice(first, LINK_RESOLVE_DOCS), first, targets, state)
        src.append(s)
        dst.append(d)
    return np.concatenate(src), np.concatenate(dst), state.links


def title_frames(kept: list[str], resolved: dict[str, int], titles: dict[str, str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``ends``: title -> doc_id (kept articles, then resolved redirects); ``known``: every title of the input."""
    ends = pl.DataFrame({"target": kept + list(resolved),
                         "dst": np.concatenate([np.arange(len(kept)), np.fromiter(resolved.values(), np.int64, len(resolved))]),
                         "via": np.arange(len(kept) + len(resolved)) >= len(kept)})
    known = pl.DataFrame({"target": list(titles)})
    return ends, known


def links_polars(merged: pa.Table, ends: pl.DataFrame, known: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, dict]:
    flat = (pl.from_arrow(merged.select(["links"])).with_row_index("src")
            .explode("links").drop_nulls("links").rename({"links": "target"}))
    joined = flat.join(ends, on="target", how="left", maintain_order="left")
    lost = joined.filter(pl.col("dst").is_null()).select("target")
    lost_known = lost.join(known, on="target", how="semi").height
    found = (joined.drop_nulls("dst").with_columns(pl.col("src").cast(pl.Int64))
             .with_row_index("seen")           # first occurrence of a pair wins (as in ours)
             .sort(["src", "dst", "seen"]))
    pairs = found.unique(["src", "dst"], keep="first", maintain_order=True)
    counts = {"to_excluded": lost_known, "unresolved": lost.height - lost_known,
              "duplicate": found.height - pairs.height, "via_redirect": int(pairs["via"].sum()),
              "self_kept": int((pairs["src"] == pairs["dst"]).sum()), "kept": pairs.height}
    return pairs["src"].to_numpy().astype(np.int32), pairs["dst"].to_numpy().astype(np.int32), counts


def _child_merge(variant: str, paths: list[Path], group_rows: int) -> None:
    """Peak RSS (MB, above the RSS before it) of one merge of ``paths``, consuming its output as
    pass 2 does (ours: block by block; polars: the whole sorted frame)."""
    titles = sorted(pl.read_parquet(paths, columns=["title"])["title"].to_list())
    bounds = titles[MERGE_BLOCK_DOCS - 1::MERGE_BLOCK_DOCS] + ([titles[-1]] if len(titles) % MERGE_BLOCK_DOCS else [])
    del titles
    Path("/proc/self/clear_refs").write_text("5")   # Linux: the peak (VmHWM) restarts from the current RSS
    before = _status_kb("VmRSS")
    if variant == "ours":
        rows = sum(block.num_rows for block in merge_shards(paths, group_rows, bounds=bounds))
    else:
        rows = {"sort": merge_polars_sort, "streaming": merge_polars_streaming}[variant](paths).num_rows
    print(f"{rows} {(_status_kb('VmHWM') - before) / 1024:.1f}")


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def memory(paths: list[Path], group_rows: int) -> None:
    import subprocess  # noqa: PLC0415

    data_mb = pl.read_parquet(paths, columns=["text"])["text"].str.len_bytes().sum() / 1e6
    print(f"\npeak RSS of the merge alone, each in a fresh process ({data_mb:.0f} MB of text in the shards):")
    for variant in ("ours", "sort", "streaming"):
        out = subprocess.run([sys.executable, __file__, "--child-merge", variant, str(group_rows), *map(str, paths)],
                             capture_output=True, text=True, check=True).stdout.split()
        print(f"  {variant:10s} +{float(out[1]):7.1f} MB peak RSS ({int(out[0]):,} rows)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-merge":
        return _child_merge(sys.argv[2], [Path(p) for p in sys.argv[4:]], int(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=20_000)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="also the peak RSS of each merge (fresh processes)")
    ap.add_argument("--dump-dir", type=Path, help="keep the synthetic dump here and reuse it (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-polars-") as tmp:
        dump_dir = args.dump_dir or Path(tmp)
        dump = dump_dir / f"synwiki-{args.pages}.xml.bz2"
        if not dump.exists():
            info, wall, _ = _timed(lambda: write_dump(dump_dir, args.pages, workers=1, name=f"synwiki-{args.pages}"))
            print(f"synthetic dump: {args.pages:,} pages, {info['xml_bytes'] / 1e6:.1f} MB XML ({wall:.1f} s)")
        state, wall, cpu = _timed(lambda: pass_one(dump, Path(tmp) / "shards", args.shard_size))
        kept = sorted(t for t, s in state.titles.items() if s == KEPT)
        _, resolved = resolve_redirects(state.redirects, dict(zip(kept, range(len(kept)))), state.titles)
        bounds = kept[MERGE_BLOCK_DOCS - 1::MERGE_BLOCK_DOCS] + ([kept[-1]] if len(kept) % MERGE_BLOCK_DOCS else [])
        paths = state.shards.paths
        shard_mb = sum(p.stat().st_size for p in paths) / 1e6
        print(f"pass 1: {len(kept):,} kept articles, {len(resolved):,} resolved redirects, {len(paths)} shards "
              f"({shard_mb:.1f} MB lz4 Parquet), {wall:.1f} s wall / {cpu:.1f} CPU s")
        print(f"polars {pl.__version__}, {pl.thread_pool_size()} threads; pyarrow {pa.__version__}; "
              f"{os.cpu_count()} cores shared with other jobs\n")

        merges = {"ours: merge_shards (k-way, Arrow blocks)": lambda: merge_ours(state, bounds),
                  "polars read_parquet + sort": lambda: merge_polars_sort(paths),
                  "polars scan_parquet + sort, streaming": lambda: merge_polars_streaming(paths),
                  "polars merge_sorted folded over shards": lambda: merge_polars_merge_sorted(paths)}
        best: dict[str, tuple[float, float]] = {}
        reference = None
        for _ in range(args.repeats):
            for name, fn in merges.items():
                table, wall, cpu = _timed(fn)
                if reference is None:
                    reference = table
                else:   # same titles, texts and links, same order
                    for col in ("title", "text", "page_id", "links"):
                        assert table.column(col).to_pylist() == reference.column(col).to_pylist(), (name, col)
                w, c = best.get(name, (np.inf, np.inf))
                best[name] = (min(w, wall), min(c, cpu))
        print(f"merge of {len(paths)} shards into {reference.num_rows:,} documents in title order (same rows, checked):")
        for name, (w, c) in best.items():
            print(f"  {name:45s} {w * 1e3:8.1f} ms wall {c * 1e3:8.1f} ms CPU")

        targets = LinkTargets(kept, resolved)
        ends, known = title_frames(kept, resolved, state.titles)
        n_targets = sum(len(x) for x in reference.column("links").to_pylist() if x)
        builds = {"ours: TitleIndex over kept + resolved titles": lambda: LinkTargets(kept, resolved),
                  "polars: title frames (ends, known)": lambda: title_frames(kept, resolved, state.titles)}
        joins = {"ours: _resolve_links, 4,096 docs a batch": lambda: links_ours(reference, targets, state),
                 "polars: explode + join + unique + sort, all": lambda: links_polars(reference, ends, known)}
        best = {}
        ours = None
        for _ in range(args.repeats):
            for name, fn in {**builds, **joins}.items():
                out, wall, cpu = _timed(fn)
                if name in joins:
                    if name.startswith("ours"):
                        ours = out
                    else:
                        assert np.array_equal(out[0], ours[0]) and np.array_equal(out[1], ours[1]), name
                        assert all(getattr(ours[2], k) == v for k, v in out[2].items()), (name, out[2], ours[2])
                w, c = best.get(name, (np.inf, np.inf))
                best[name] = (min(w, wall), min(c, cpu))
        print(f"\nlink join: {n_targets:,} link targets of {reference.num_rows:,} documents -> {len(ours[0]):,} "
              f"distinct pairs (same pairs and counts, checked):")
        for name, (w, c) in best.items():
            print(f"  {name:45s} {w * 1e3:8.1f} ms wall {c * 1e3:8.1f} ms CPU")
        if args.memory:
            memory(paths, state.shards.group_rows)


if __name__ == "__main__":
    main()
