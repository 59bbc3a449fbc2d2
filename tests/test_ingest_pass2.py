"""Pass 2 of the ingest, in Arrow blocks: the block merge of the shards, the vectorized link
resolution and the documents' row groups give what the row-at-a-time pass gave."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.corpus.ingest import IngestConfig, ingest
from tasks.corpus.ingest.config import KEPT, REDIRECT, SKIPPED, LinkCounts
from tasks.corpus.ingest.run import DOC_GROUP_BYTES, DOC_GROUP_ROWS, _resolve_links
from tasks.corpus.ingest.shards import ShardWriter, merge_shards

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
                              first_doc, title_to_id, resolved, State)
    pairs, counts = _reference_links(doc_targets, first_doc, title_to_id, resolved, titles, drop_self)
    assert list(zip(src.tolist(), dst.tolist())) == pairs
    assert State.links == counts
    assert counts.duplicate and counts.via_redirect and counts.to_excluded and counts.unresolved


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
