"""Pass 2 of the ingest, in Arrow blocks: the block merge of the shards, the vectorized link
resolution and the documents' row groups give what the row-at-a-time pass gave."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.sources.ingest import IngestConfig, ingest
from tasks.sources.ingest.config import KEPT, REDIRECT, SKIPPED, LinkCounts
from tasks.sources.ingest.run import DOC_GROUP_BYTES, DOC_GROUP_ROWS, LinkTargets, _resolve_links
from tasks.sources.ingest.shards import ShardWriter, merge_shards

ALPHABET = "abcAB zé日\u00e9\U0001f600"


def _title(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8)))


@pytest.mark.parametrize("shard_size,fan_in", [(1, 64), (7, 3), (50, 64), (1000, 2)])
def test_block_merge_yields_every_page_in_title_order(tmp_path, shard_size, fan_in):
    rng = random.Random(shard_size)
    titles = list(dict.fromkeys(_title(rng) for _ in range(400)))
    writer = ShardWriter(tmp_path, shard_size)
    pages = {}
    for i, title in enumerate(titles):
        links = [_title(rng) for _ in range(rng.randint(0, 3))]
        pages[title] = (title, f"text {i} {title}", i if i % 5 else None, f"src{i % 2}", links)
        writer.add(*pages[title])
    writer.flush()
    blocks = list(merge_shards(writer.paths, writer.group_rows, fan_in=fan_in))
    rows = [row for b in blocks for row in zip(*(b.column(n).to_pylist() for n in b.column_names))]
    assert [r[0] for r in rows] == sorted(titles)            # Python's (code point) order
    assert rows == [pages[t] for t in sorted(titles)]
    shards_at_once = min(len(writer.paths), fan_in)
    assert max(b.num_rows for b in blocks) <= shards_at_once * max(writer.group_rows, shard_size)


def _reference_links(doc_targets, first_doc, title_to_id, resolved, titles, drop_self):
    """Pass 2's link loop as it was, one document and one target at a time."""
    counts, pairs = LinkCounts(), []
    for doc_id, targets in enumerate(doc_targets, first_doc):
        dsts: set[int] = set()
        for target in targets or ():
            dst = title_to_id.get(target)
            via = dst is None
            if via:
                dst = resolved.get(target)
                if dst is None:
                    if target in titles:
                        counts.to_excluded += 1
                    else:
                        counts.unresolved += 1
                    continue
            if dst in dsts:
                counts.duplicate += 1
            elif dst == doc_id and drop_self:
                counts.self_link += 1
            else:
                dsts.add(dst)
                counts.via_redirect += via
                counts.self_kept += dst == doc_id
        pairs += [(doc_id, d) for d in sorted(dsts)]
        counts.kept += len(dsts)
    return pairs, counts


@pytest.mark.parametrize("drop_self", [False, True])
def test_vectorized_link_resolution_equals_the_loop(drop_self):
    rng = random.Random(int(drop_self))
    kept = sorted({f"A{i}" for i in range(60)})
    title_to_id = {t: i for i, t in enumerate(kept)}
    titles = {**dict.fromkeys(kept, KEPT), **{f"R{i}": REDIRECT for i in range(30)},
              **{f"S{i}": SKIPPED for i in range(5)}}
    resolved = {f"R{i}": rng.randrange(len(kept)) for i in range(0, 30, 2)}   # odd redirects do not resolve
    names = list(titles) + [f"M{i}" for i in range(10)]                          # M*: missing pages
    doc_targets = [list(dict.fromkeys(rng.choice(names) for _ in range(rng.randint(0, 12)))) for _ in range(40)]
    doc_targets[3] = None
    doc_targets[4] = [kept[14], kept[3]]                      # a self link (doc 4 + first_doc = 14)
    doc_targets[5] = [kept[resolved["R0"]], "R0", "R0 "]      # the same article directly and through a redirect
    first_doc = 10

    class State:
        links = LinkCounts()
        cfg = IngestConfig(format="mediawiki", drop_self_links=drop_self)

    State.titles = titles
    src, dst = _resolve_links(pa.chunked_array([pa.array(doc_targets[:25], pa.list_(pa.string())),
                                                pa.array(doc_targets[25:], pa.list_(pa.string()))]),
                              first_doc, LinkTargets(kept, resolved), State)
    pairs, counts = _reference_links(doc_targets, first_doc, title_to_id, resolved, titles, drop_self)
    assert list(zip(src.tolist(), dst.tolist())) == pairs
    assert State.links == counts
    assert counts.duplicate and counts.via_redirect and counts.to_excluded and counts.unresolved


@pytest.mark.slow  # ingests 60 pages of up to 1.9M characters (~57M characters in all)
def test_documents_row_groups_are_cut_by_rows_or_characters(tmp_path):
    rng = random.Random(3)
    lengths = [rng.choice([10, 300_000, 1_900_000, DOC_GROUP_BYTES // 5]) for _ in range(60)] + [5] * 9_000
    path = tmp_path / "pages.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, n in enumerate(lengths):
            char = "é" if i % 3 else "a"                     # characters, not bytes, are counted
            fh.write(json.dumps({"title": f"T{i:05d}", "text": char * n}) + "\n")
    summary = ingest([path], tmp_path / "out", IngestConfig(format="jsonl", shard_size=500, max_page_bytes=1 << 26))
    assert summary.documents == len(lengths)
    expected, rows, chars = [], 0, 0
    for n in lengths:                                        # the row-at-a-time rule, in title order
        rows, chars = rows + 1, chars + n
        if rows >= DOC_GROUP_ROWS or chars >= DOC_GROUP_BYTES:
            expected.append(rows)
            rows, chars = 0, 0
    expected += [rows] if rows else []
    meta = pq.ParquetFile(Path(tmp_path / "out" / "documents.parquet")).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == expected
    assert len(expected) > 5


def _shards(tmp_path: Path, n: int, shard_size: int, seed: int = 5) -> tuple[ShardWriter, dict]:
    rng = random.Random(seed)
    titles = list(dict.fromkeys(_title(rng) for _ in range(n)))
    writer = ShardWriter(tmp_path, shard_size)
    pages = {}
    for i, title in enumerate(titles):
        pages[title] = (title, f"text {i}", i, "src", [_title(rng)])
        writer.add(*pages[title])
    writer.flush()
    return writer, pages


def _rows(blocks) -> list[tuple]:
    return [row for b in blocks for row in zip(*(b.column(n).to_pylist() for n in b.column_names))]


def test_block_merge_with_bounds_yields_one_block_per_title_window(tmp_path):
    writer, pages = _shards(tmp_path, 500, 9)
    order = sorted(pages)
    bounds = order[49::50] + ([order[-1]] if len(order) % 50 else [])
    bounds.insert(3, bounds[2])                       # an empty window is skipped, not yielded
    blocks = list(merge_shards(writer.paths, writer.group_rows, fan_in=4, bounds=bounds))
    assert _rows(blocks) == [pages[t] for t in order]
    assert [b.num_rows for b in blocks] == [50] * (len(order) // 50) + ([len(order) % 50] if len(order) % 50 else [])
    assert [b.column("title")[b.num_rows - 1].as_py() for b in blocks] == [b for i, b in enumerate(bounds) if i != 3]


def test_block_merge_raises_on_a_title_after_the_last_bound(tmp_path):
    writer, pages = _shards(tmp_path, 100, 10)
    order = sorted(pages)
    with pytest.raises(AssertionError, match="after the last merge bound"):
        list(merge_shards(writer.paths, writer.group_rows, bounds=[order[10], order[-2]]))


@pytest.mark.slow  # merge runs in spawned worker processes
def test_merge_runs_through_submit_in_other_processes(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    writer, pages = _shards(tmp_path, 300, 4)                 # ~70 shards, fan-in 8: two run levels
    level1 = -(-len(writer.paths) // 8)
    assert 8 < level1 <= 64 and len(writer.paths) > 64
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        submitted = []

        def submit(fn, *args):
            submitted.append(fn.__name__)
            return pool.submit(fn, *args)

        blocks = list(merge_shards(writer.paths, writer.group_rows, fan_in=8, submit=submit))
    assert _rows(blocks) == [pages[t] for t in sorted(pages)]
    assert submitted == ["merge_run"] * (level1 + 2)           # shards -> runs -> 2 runs -> merged here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-01-00000.parquet", "run-01-00001.parquet"]


def test_a_failed_merge_run_is_raised_after_the_others_finish(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    writer, _ = _shards(tmp_path, 200, 5)
    writer.paths[7].write_bytes(b"not parquet")
    finished = []

    def submit(fn, *args):
        future = pool.submit(fn, *args)
        future.add_done_callback(lambda f: finished.append(f.exception() is None))
        return future

    with ThreadPoolExecutor(2) as pool, pytest.raises(Exception, match="Parquet|parquet|magic"):
        list(merge_shards(writer.paths, writer.group_rows, fan_in=8, submit=submit))
        assert False, "not reached"
    assert len(finished) == -(-len(writer.paths) // 8) and finished.count(False) == 1   # all waited for


def test_write_behind_keeps_order_and_raises_the_first_error():
    import threading

    from tasks.sources.ingest.run import _WriteBehind

    seen, main = [], threading.get_ident()

    def write(i):
        assert threading.get_ident() != main
        if i == 5:
            raise ValueError("block 5 is bad")
        seen.append(i)

    with pytest.raises(ValueError, match="block 5"):
        with _WriteBehind(depth=2) as writes:
            for i in range(20):
                writes.submit(write, i)
    assert seen == [0, 1, 2, 3, 4]
    with _WriteBehind(depth=3) as writes:
        for i in range(6, 12):
            writes.submit(write, i)
    assert seen == list(range(5)) + list(range(6, 12))


def test_ingest_error_in_a_background_write_leaves_no_artifact(tmp_path, monkeypatch):
    from data_contracts.base import ContractWriter

    path = tmp_path / "pages.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(50):
            fh.write(json.dumps({"title": f"T{i:03d}", "text": "word " * 30}) + "\n")
    real_write = ContractWriter.write

    def failing(self, table):
        if self.contract.name == "documents":
            raise OSError("disk full while writing documents")
        return real_write(self, table)

    monkeypatch.setattr(ContractWriter, "write", failing)
    with pytest.raises(OSError, match="disk full"):
        ingest([path], tmp_path / "out", IngestConfig(format="jsonl"))
    assert not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.slow  # ingests all of Wikispeedia twice
def test_pass2_block_sizes_and_fan_in_do_not_change_the_artifacts(tmp_path, monkeypatch, data_mirror):
    """All of Wikispeedia (4,598 articles, 119,879 links): the default pass 2 against tiny merge
    blocks and link batches (boundaries inside every documents row group) and a fan-in of 3 over
    41 shards (run files in two levels): the same bytes."""
    from data_contracts.base import sha256_file
    from funnelrag.datasets import resolve
    import tasks.sources.ingest.run as run
    import tasks.sources.ingest.shards as shards

    inputs = [resolve("wikispeedia-articles", data_mirror), resolve("wikispeedia-graph", data_mirror)]
    base = ingest(inputs, tmp_path / "a", IngestConfig(format="wikispeedia"))
    monkeypatch.setattr(run, "MERGE_BLOCK_DOCS", 37)
    monkeypatch.setattr(run, "LINK_RESOLVE_DOCS", 101)
    real_merge = shards.merge_shards
    monkeypatch.setattr(run, "merge_shards", lambda paths, rows, **kw: real_merge(paths, rows, fan_in=3, **kw))
    small = ingest(inputs, tmp_path / "b", IngestConfig(format="wikispeedia", shard_size=113))
    assert base.shards == 1 and small.shards == 41 and base.links > 100_000
    assert base.link_counts == small.link_counts
    for name in ("documents", "links", "redirects", "ingest_report"):
        assert sha256_file(tmp_path / "a" / f"{name}.parquet") == sha256_file(tmp_path / "b" / f"{name}.parquet")
