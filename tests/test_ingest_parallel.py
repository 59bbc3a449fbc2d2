"""Parallel ingest of multistream dumps: same artifacts as the serial path.

Inputs: the real enwiki sample re-packed as a multistream dump (with and without its index,
with duplicate titles across pieces and an untitled page), and a small synthetic dump.
"""
from __future__ import annotations

import bz2
import os
import random
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from benchmarks.synth_dump import repack, write_dump
from data_contracts.base import sha256_file
from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS
from funnelrag.datasets import resolve
from funnelrag.store import entry_marker
from tasks.sources.ingest import IngestConfig, IngestError, ingest
from tasks.sources.ingest import multistream, parallel
from tasks.sources.ingest.changes import PageChanges
from tasks.sources.ingest.multistream import index_offsets, plan_layout, scan_offsets

NAMES = [c.name for c in (DOCUMENTS, REDIRECTS, LINKS, INGEST_REPORT)]
MW = IngestConfig(format="mediawiki")


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(2) as ex:
        yield ex


@pytest.fixture(scope="module")
def enwiki_xml(data_mirror) -> bytes:
    return bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes())


def _digests(out: Path) -> dict[str, str]:
    return {n: sha256_file(out / f"{n}.parquet") for n in NAMES}


def _same_as_serial(dump: Path, tmp: Path, pool, cfg: IngestConfig = MW, **kw) -> dict:
    serial = ingest([dump], tmp / "serial", cfg).to_dict()
    par = ingest([dump], tmp / "parallel", cfg, submit=pool.submit, **kw).to_dict()
    assert _digests(tmp / "serial") == _digests(tmp / "parallel")
    for key in ("documents", "redirects", "links", "records", "by_status", "skipped", "redirect_status",
                "link_counts", "uncompressed_bytes"):
        assert serial[key] == par[key], key
    return par


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_repacked_enwiki_sample_parallel_equals_serial(enwiki_xml, tmp_path, pool):
    dump = tmp_path / "enwiki-multistream.xml.bz2"
    assert repack(enwiki_xml, dump, pages_per_stream=7) == 30
    layout = plan_layout(dump, streams_per_piece=4)
    assert layout.source == "index" and len(layout.pieces) == 8
    assert sum(p.n_streams for p in layout.pieces) == 30
    par = _same_as_serial(dump, tmp_path, pool, streams_per_piece=4)
    assert par["records"] == 206 and par["uncompressed_bytes"] == len(enwiki_xml)


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_duplicates_across_pieces_and_untitled_page(enwiki_xml, tmp_path, pool):
    """A title seen in an earlier piece makes a later kept page, redirect or skip a
    ``duplicate_title``, exactly as in the serial pass; positions and ``page #N`` records match."""
    start, end = enwiki_xml.index(b"  <page>"), enwiki_xml.rindex(b"</mediawiki>")
    pages = [b"  <page>" + p for p in enwiki_xml[start:end].split(b"  <page>")[1:]]
    copies = [re.sub(rb"</text>", b" changed</text>", p, count=1) for p in pages[3:200:25]]
    untitled = re.sub(rb"<title>.*?</title>", b"", pages[5], count=1)
    xml = enwiki_xml[:start] + b"".join(pages + copies + [untitled] + pages[:4]) + enwiki_xml[end:]
    dump = tmp_path / "dups-multistream.xml.bz2"
    repack(xml, dump, pages_per_stream=5)
    par = _same_as_serial(dump, tmp_path, pool, cfg=IngestConfig(format="mediawiki", shard_size=16),
                          streams_per_piece=3)
    assert par["skipped"]["duplicate_title"] == len(copies) + 4
    report = INGEST_REPORT.read(tmp_path / "parallel")
    assert report["position"].to_pylist() == list(range(len(pages) + len(copies) + 5))
    assert f"page #{len(pages) + len(copies)}" in report["record"].to_pylist()


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_an_untitled_page_is_named_by_its_dump_position(enwiki_xml, tmp_path, pool):
    """A piece without duplicate titles and with an untitled page: the same artifacts as the serial
    pass, the page's record named by its position in the dump, not in its piece."""
    start, end = enwiki_xml.index(b"  <page>"), enwiki_xml.rindex(b"</mediawiki>")
    pages = [b"  <page>" + p for p in enwiki_xml[start:end].split(b"  <page>")[1:]]
    pages[40] = re.sub(rb"<title>.*?</title>", b"", pages[40], count=1)
    dump = tmp_path / "bulk-multistream.xml.bz2"
    repack(enwiki_xml[:start] + b"".join(pages) + enwiki_xml[end:], dump, pages_per_stream=5)
    _same_as_serial(dump, tmp_path / "bulk", pool, streams_per_piece=3)
    report = INGEST_REPORT.read(tmp_path / "bulk" / "parallel")
    assert report["record"][40].as_py() == "page #40"


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_offsets_by_scan_when_the_index_is_missing(enwiki_xml, tmp_path, pool):
    dump = tmp_path / "noindex-multistream.xml.bz2"
    repack(enwiki_xml, dump, pages_per_stream=10, index=False)
    layout = plan_layout(dump, streams_per_piece=5)
    assert layout.source == "scan" and sum(p.n_streams for p in layout.pieces) == 21
    _same_as_serial(dump, tmp_path, pool, streams_per_piece=5)


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_single_stream_and_plain_xml_are_read_serially(enwiki_xml, data_mirror, tmp_path, pool):
    dump = resolve("enwiki-sample", data_mirror)
    assert plan_layout(dump, 10) is None
    _same_as_serial(dump, tmp_path, pool)
    plain = tmp_path / "plain.xml"
    plain.write_bytes(enwiki_xml)
    assert plan_layout(plain, 10) is None


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_synthetic_dump_parallel_equals_serial(tmp_path, pool, data_mirror):
    info = write_dump(tmp_path / "dump", 1_500, seed=3, sample=resolve("enwiki-sample", data_mirror))
    dump = Path(info["dump"])
    offsets = index_offsets(Path(info["index"]))
    assert len(offsets) == 15 and scan_offsets(dump)[1:-1] == offsets
    par = _same_as_serial(dump, tmp_path, pool, cfg=IngestConfig(format="mediawiki", shard_size=100),
                          streams_per_piece=2)
    assert par["records"] == 1_500 and par["by_status"]["redirect"] > 0
    assert par["skipped"]["other_namespace"] > 0 and par["skipped"]["disambiguation"] > 0


@pytest.mark.parametrize("block", [5, 1 << 24])
def test_index_offsets_by_block_equal_line_by_line(tmp_path, monkeypatch, block):
    """The regex over whole blocks of lines gives the offsets (and errors) of reading line by line."""
    monkeypatch.setattr(multistream, "_INDEX_BLOCK", block)
    index = tmp_path / "x-index.txt.bz2"
    cases = [
        (b"10:1:A\n10:2:B\n7:3:C\n", [7, 10]),
        (b"10:1:A\r\n12:2:B", [10, 12]),                          # CRLF, no final newline
        (b" 12 :1:A\n\xd9\xa1\xd9\xa2:2:B\n", [12]),                # white space; Arabic-Indic "12"
        (b"10:1:A\n" * 40 + b"9:2:B\n11:3:C\rD\n", "line 43"),     # a lone CR starts a line
        (b"10:1:A\n\n", "line 2"),
        (b"10:1:A\nno offset\n", "line 2"),
    ]
    for data, expected in cases:
        index.write_bytes(bz2.compress(data))
        if isinstance(expected, str):
            with pytest.raises(ValueError, match=expected):
                index_offsets(index)
        else:
            assert index_offsets(index) == expected
    index.write_bytes(b"10:1:A\n3:2:B\xff\n")
    with pytest.raises(UnicodeDecodeError):
        index_offsets(index)


@pytest.mark.parametrize("block", [7, 1 << 24])
def test_index_summary_in_one_pass_equals_reading_each_line(tmp_path, monkeypatch, block):
    """One pass gives the offsets of reading line by line and, per offset, the smallest page id
    listed at it (ids unsorted within a stream, offsets repeated in other blocks, odd lines)."""
    monkeypatch.setattr(multistream, "_INDEX_BLOCK", block)
    rng = random.Random(4)
    lines = [(o, i) for o in (30, 10, 20, 40) for i in rng.sample(range(1, 500), 9)]
    rng.shuffle(lines)
    data = b"".join(b"%d:%d:Title %d: with a colon\n" % (o, i, i) for o, i in lines)
    cases = [(data, [10, 20, 30, 40], {o: min(i for oo, i in lines if oo == o) for o in (10, 20, 30, 40)},
              [i for _, i in lines]),
             (b"10:5:A\r\n10:3:B\n12:x:C\n", [10, 12], {10: 3}, [5, 3]),     # CRLF; a page id that is no integer
             (b"", [], {}, [])]
    index = tmp_path / "x-index.txt.bz2"
    for raw, offsets, first, page_ids in cases:
        index.write_bytes(bz2.compress(raw))
        summary = multistream.read_index_summary(index)
        assert summary.offsets == offsets == index_offsets(index)
        assert summary.first_ids == first
        assert summary.page_ids.tolist() == page_ids   # every line's, in file order (across blocks)
    with pytest.raises(ValueError, match="no offset:page_id:title line"):
        multistream.index_first_ids(index)
    index.write_bytes(bz2.compress(b"10:1:A\n" + b"9" * 30 + b":2:B\n"))
    with pytest.raises(ValueError, match="does not fit 64 bits"):
        multistream.read_index_summary(index)


def test_index_summary_is_kept_by_the_index_bytes(tmp_path, monkeypatch):
    """A nightly reads its base dump's index once: the summary is kept under the sha256 of the
    file, found again without reading the index (its use recorded for retention), and a changed
    index is read again; an unusable index keeps nothing."""
    index, cache = tmp_path / "x-index.txt.bz2", tmp_path / "cache"
    index.write_bytes(bz2.compress(b"10:5:A\n10:3:B\n20:7:C\n"))
    first = multistream.index_summary(index, cache)
    (entry,) = cache.iterdir()
    os.utime(entry_marker(entry), (0, 0))
    read = multistream._read_index_summary
    monkeypatch.setattr(multistream, "_read_index_summary", lambda path: pytest.fail("read the index again"))
    again = multistream.index_summary(index, cache)
    assert again == first == multistream.IndexSummary([10, 20], {10: 3, 20: 7})
    assert again.page_ids.tolist() == first.page_ids.tolist() == [5, 3, 7]
    assert entry_marker(entry).stat().st_mtime > 0
    monkeypatch.setattr(multistream, "_read_index_summary", read)
    index.write_bytes(bz2.compress(b"10:5:A\n20:7:C\n30:8:D\n"))
    assert multistream.index_summary(index, cache).offsets == [10, 20, 30]
    assert len(list(cache.iterdir())) == 2
    index.write_bytes(b"BZh9 not bz2")
    with pytest.raises(ValueError, match="truncated or corrupt"):
        multistream.index_summary(index, cache)
    assert len([d for d in cache.iterdir() if not d.name.startswith(".")]) == 2


def test_layout_carries_the_index_first_ids(tmp_path, data_mirror, monkeypatch):
    """plan_layout with an index cache: the pieces of the plain call, the index's first ids on the
    layout (what piece_changes places the adds-changes with), the index read once for two plans."""
    info = write_dump(tmp_path / "dump", 1_500, seed=5, sample=resolve("enwiki-sample", data_mirror))
    dump, cache = Path(info["dump"]), tmp_path / "pieces"
    plain = plan_layout(dump, 2)
    kept = plan_layout(dump, 2, index_cache=cache)
    assert kept == plain and kept.first_ids == plain.first_ids == multistream.index_first_ids(Path(info["index"]))
    monkeypatch.setattr(multistream, "_read_index_summary", lambda path: pytest.fail("read the index again"))
    again = plan_layout(dump, 2, index_cache=cache)
    assert again == plain and again.first_ids == plain.first_ids
    per_piece = parallel.piece_changes(again, PageChanges.of("tonight.xml.bz2", []))   # from the layout's first ids
    assert len(per_piece) == len(again.pieces) and all(not c.pages for c in per_piece)


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_corrupt_piece_names_the_piece(enwiki_xml, tmp_path, pool):
    dump = tmp_path / "bad-multistream.xml.bz2"
    repack(enwiki_xml, dump, pages_per_stream=20)
    offsets = index_offsets(dump.with_name("bad-multistream-index.txt.bz2"))
    data = bytearray(dump.read_bytes())
    data[offsets[3] + 200: offsets[3] + 260] = b"\x00" * 60
    dump.write_bytes(bytes(data))
    with pytest.raises(IngestError, match=r"piece 1 \(bytes"):
        ingest([dump], tmp_path / "out", MW, submit=pool.submit, streams_per_piece=2)
    assert not (tmp_path / "out" / "documents.parquet").exists()


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_nightly_rebuild_reuses_unchanged_pieces(tmp_path, pool, data_mirror):
    """Second ingest of the same dump reuses every piece; tonight's dump (new name) with one
    changed page re-parses one piece and gives the artifacts of a from-scratch ingest."""
    info = write_dump(tmp_path / "night1", 1_500, seed=5, sample=resolve("enwiki-sample", data_mirror))
    dump, cache = Path(info["dump"]), tmp_path / "pieces"
    kw = {"submit": pool.submit, "streams_per_piece": 2, "piece_cache": cache}
    first = ingest([dump], tmp_path / "a", MW, **kw)
    assert first.pieces == {"built": 8}
    second = ingest([dump], tmp_path / "b", MW, **kw)
    assert second.pieces == {"reused": 8}
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")

    xml = bz2.decompress(dump.read_bytes())
    at = xml.index(b"</text>", len(xml) // 2)
    changed = xml[:at] + b" One more sentence tonight." + xml[at:]
    tonight = tmp_path / "night2" / "synwiki-20260102-pages-articles-multistream.xml.bz2"
    tonight.parent.mkdir()
    repack(changed, tonight, pages_per_stream=100)
    third = ingest([tonight], tmp_path / "c", MW, **kw)
    assert third.pieces == {"built": 1, "reused": 7}
    ingest([tonight], tmp_path / "scratch", MW)
    assert _digests(tmp_path / "c") == _digests(tmp_path / "scratch")
    assert _digests(tmp_path / "c")["documents"] != _digests(tmp_path / "a")["documents"]


class _Outstanding:
    """``submit`` that records how many results were submitted and not yet taken (the bound on
    what the coordinator holds)."""

    def __init__(self, pool):
        self.pool, self.live, self.peak, self.calls = pool, 0, 0, 0

    def __call__(self, fn, *args):
        future, self.live, self.calls = self.pool.submit(fn, *args), self.live + 1, self.calls + 1
        self.peak = max(self.peak, self.live)
        outer = self

        class _Taken:
            def result(self):
                outer.live -= 1
                return future.result()

        return _Taken()


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_coordinator_holds_at_most_window_pieces(enwiki_xml, tmp_path, pool):
    dump = tmp_path / "window-multistream.xml.bz2"
    repack(enwiki_xml, dump, pages_per_stream=3)
    submit = _Outstanding(pool)
    ingest([dump], tmp_path / "out", MW, submit=submit, streams_per_piece=2, window=3)
    assert submit.calls == 35 and submit.peak == 3


@pytest.fixture()
def three_streams(tmp_path) -> tuple[Path, list[bytes], bytes]:
    """A file of three bz2 streams (one ~1 MB, so it spans bz2 blocks), their payloads."""
    payloads = [b"<page>one</page>", " ".join(str(i * 7919 % 10007) for i in range(200_000)).encode(),
                b"<page>three</page>"]
    streams = [bz2.compress(p) for p in payloads]
    path = tmp_path / "three.bz2"
    path.write_bytes(b"".join(streams))
    return path, streams, b"".join(payloads)


def test_open_piece_decompresses_every_stream_of_the_range(three_streams):
    path, streams, payload = three_streams
    with multistream.open_piece(path, 0, path.stat().st_size) as piece:
        assert piece.read() == multistream.PIECE_OPEN + payload + multistream.PIECE_CLOSE
        assert piece.inner_bytes == len(payload)
    with multistream.open_piece(path, len(streams[0]), len(streams[0]) + len(streams[1])) as piece:
        assert piece.read()[len(multistream.PIECE_OPEN):-len(multistream.PIECE_CLOSE)] == bz2.decompress(streams[1])


@pytest.mark.parametrize("damage", ["garbage between streams", "garbage after the last stream", "bit flip",
                                    "range ends inside a stream", "file ends inside the range"])
def test_open_piece_refuses_a_damaged_range(three_streams, damage):
    """The decoder stops silently at bytes that are not a stream; the piece reader must not."""
    path, streams, _ = three_streams
    data, end = bytearray(path.read_bytes()), path.stat().st_size
    if damage == "garbage between streams":
        data[len(streams[0]):len(streams[0])] = b"\0" * 16
        end += 16
    elif damage == "garbage after the last stream":
        data += b"xyz"
        end += 3
    elif damage == "bit flip":
        data[len(streams[0]) + len(streams[1]) // 2] ^= 0x10
    elif damage == "range ends inside a stream":
        end -= len(streams[2]) // 2
    else:
        end += 100
    path.write_bytes(bytes(data))
    with pytest.raises((OSError, EOFError)), multistream.open_piece(path, 0, end) as piece:
        piece.read()


@pytest.mark.slow  # parses in a pool of worker processes (module fixture)
def test_garbage_between_streams_of_a_piece_names_the_piece(enwiki_xml, tmp_path, pool):
    """Bytes that start no stream inside a piece (offsets of the index past them shifted, so the
    layout is valid): the ingest fails naming the piece, nothing is published."""
    dump = tmp_path / "gap-multistream.xml.bz2"
    repack(enwiki_xml, dump, pages_per_stream=20)
    index = dump.with_name("gap-multistream-index.txt.bz2")
    offsets = index_offsets(index)
    data = dump.read_bytes()
    cut, gap = offsets[3], b"\0" * 16
    dump.write_bytes(data[:cut] + gap + data[cut:])
    lines = []
    for line in bz2.decompress(index.read_bytes()).decode().splitlines():
        offset, rest = line.split(":", 1)
        lines.append(f"{int(offset) + len(gap) if int(offset) >= cut else offset}:{rest}")
    index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(IngestError, match=r"piece 1 \(bytes.*not a bz2 stream"):
        ingest([dump], tmp_path / "out", MW, submit=pool.submit, streams_per_piece=2)
    assert not (tmp_path / "out" / "documents.parquet").exists()


@pytest.mark.slow  # bz2-compresses 4 MB of random bytes and reads them twice
def test_open_piece_frees_the_compressed_bytes(tmp_path):
    """indexed_bzip2 keeps the file object it reads from after ``close``: the piece reader must
    free the compressed bytes anyway, or a worker's memory grows by every piece it reads."""
    from funnelrag.memory import status_mb
    path = tmp_path / "random.bz2"
    path.write_bytes(bz2.compress(random.Random(3).randbytes(4_000_000)))
    size = path.stat().st_size
    for _ in range(2):
        with multistream.open_piece(path, 0, size) as piece:
            piece.read()
    before = status_mb("VmRSS")
    if before is None:
        pytest.skip("no /proc/self/status here")
    for _ in range(8):
        with multistream.open_piece(path, 0, size) as piece:
            piece.read()
    assert status_mb("VmRSS") - before < 2 * size / 2**20   # leaking: 8 x 4 MB
