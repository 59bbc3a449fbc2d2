"""The Wikimedia mirror as a corpus source: finished full dumps and adds-changes days found on a
synthetic mirror served over HTTP (127.0.0.1) and read as a directory, downloads resumed and
checked, adds-changes applied so that the merged dump ingests exactly like a full dump holding the
same page texts, and the nightly's decision. No Prefect (the flow: tests/test_flow_nightly.py)."""
from __future__ import annotations

import bz2
import dataclasses
import json
import logging
import pickle
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from data_contracts.base import sha256_file
from tasks.sources import dump_source as D
from tasks.sources import adds_changes as A
from tasks.sources.adds_changes import AddsChangesError, day_memo_path, merge_days, read_day, read_day_memo
from tasks.sources.ingest import IngestConfig, IngestError, ingest
from tasks.sources.ingest import changes as changes_module
from tasks.sources.ingest.changes import (ChangesFile, PageChanges, PageRevision, merge_pages, revisions_from_table,
                                         revisions_table, write_changes)
from tasks.sources.ingest.multistream import index_path
from tasks.sources.ingest.parallel import piece_batches
from tasks.sources.ingest.records import RawPage
from tasks.sources.nightly import FULL, INCREMENTAL, NOTHING, plan_night, prepare_input
from tests.merged_dump import apply_changes, read_index
from tests.mirror_server import serve

TEXT_COLUMN = 4   # of a day memo: the fields of tasks.sources.ingest.changes.PageRevision
WIKI, BASE = "synwiki", "20260101"
DAYS = ["20260102", "20260103", "20260104"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory, data_mirror) -> dict:
    """1,000 pages, 3 adds-changes days of ~3% edits (+ new pages), and the full dump of the last
    day's texts (outside the mirror)."""
    root = tmp_path_factory.mktemp("synth")
    info = write_mirror(root / "mirror", 1000, 3, seed=7, wiki=WIKI, base_date=BASE, merged=root / "merged",
                        sample=data_mirror / SAMPLE, edit_share=0.03)
    return {"root": root / "mirror", "merged": Path(info["merged"]["dump"]), "info": info}


@pytest.fixture
def mirror(synth, tmp_path) -> Path:
    """A copy of the synthetic mirror a test may change."""
    return Path(shutil.copytree(synth["root"], tmp_path / "mirror"))


@pytest.fixture(params=["http", "directory"])
def source(request, mirror):
    """The mirror as an HTTP base URL (local server) and as a directory."""
    if request.param == "directory":
        with D.Mirror(str(mirror)) as m:
            yield m, mirror, None
        return
    with serve(mirror) as server, D.Mirror(server.url) as m:
        yield m, mirror, server


def _set_status(mirror: Path, date: str, status: str) -> Path:
    doc = json.loads((mirror / WIKI / BASE / "dumpstatus.json").read_text())
    job = doc["jobs"]["articlesmultistreamdump"]
    job["status"] = status
    job["files"] = {name.replace(BASE, date): f for name, f in job["files"].items()}
    newer = mirror / WIKI / date
    newer.mkdir()
    (newer / "dumpstatus.json").write_text(json.dumps(doc))
    return newer


def test_full_dump_with_a_running_job_is_passed_over(source):
    m, mirror, _ = source
    _set_status(mirror, "20260120", "in-progress")
    dump, passed = D.latest_full_dump(m, WIKI)
    assert dump.date == BASE and dump.dump.name == f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    assert dump.dump.algorithm == "sha1" and dump.dump.size == (mirror / dump.dump.relpath).stat().st_size
    assert "articlesmultistreamdump is 'in-progress'" in passed["20260120"]
    with pytest.raises(D.DumpNotReady, match="in-progress"):
        D.parse_dumpstatus((mirror / WIKI / "20260120" / "dumpstatus.json").read_text(), WIKI, "20260120", "x")


def test_adds_changes_days_missing_and_not_done(source):
    m, mirror, _ = source
    scan = D.scan_days(m, WIKI, BASE)
    assert [d.date for d in scan.days] == DAYS and not scan.missing and not scan.waiting
    assert all(d.max_rev_id and d.file.algorithm == "md5" for d in scan.days)
    shutil.rmtree(mirror / "other" / "incr" / WIKI / DAYS[1])          # a gap: counted, skipped
    scan = D.scan_days(m, WIKI, BASE)
    assert [d.date for d in scan.days] == [DAYS[0], DAYS[2]] and scan.missing == [DAYS[1]]
    assert "no such adds-changes day" in scan.reasons[DAYS[1]]
    (mirror / "other" / "incr" / WIKI / DAYS[0] / "status.txt").write_text("in-progress\n")   # not done: waits
    scan = D.scan_days(m, WIKI, BASE)
    assert scan.days == [] and scan.waiting == [DAYS[0], DAYS[2]]
    assert "'in-progress', not 'done'" in scan.reasons[DAYS[0]]


def test_download_killed_half_way_resumes(mirror, tmp_path):
    with serve(mirror) as server, D.Mirror(server.url, retries=0) as m:
        dump, _ = D.latest_full_dump(m, WIKI)
        size = dump.dump.size
        server.cut[dump.dump.relpath] = size // 2
        with pytest.raises(httpx.HTTPError):
            D.fetch(m, dump.dump, tmp_path / "dl")
        part = tmp_path / "dl" / (dump.dump.relpath + ".part")
        assert part.stat().st_size == size // 2
        got = D.fetch(m, dump.dump, tmp_path / "dl")
        assert server.requests[-1] == (dump.dump.relpath, f"bytes={size // 2}-")
        assert got.read_bytes() == (mirror / dump.dump.relpath).read_bytes() and not part.exists()
        n = len(server.requests)
        assert D.fetch(m, dump.dump, tmp_path / "dl") == got and len(server.requests) == n   # verified once, not again


def test_server_without_ranges_restarts_the_download(mirror, tmp_path):
    with serve(mirror, ranges=False) as server, D.Mirror(server.url) as m:
        dump, _ = D.latest_full_dump(m, WIKI)
        part = tmp_path / "dl" / (dump.dump.relpath + ".part")
        part.parent.mkdir(parents=True)
        part.write_bytes(b"garbage!")
        assert D.fetch(m, dump.dump, tmp_path / "dl").read_bytes() == (mirror / dump.dump.relpath).read_bytes()


def test_checksum_mismatch_names_the_file(source, tmp_path):
    m, mirror, _ = source
    dump, _ = D.latest_full_dump(m, WIKI)
    path = mirror / dump.dump.relpath
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF   # same size, other bytes
    path.write_bytes(bytes(data))
    with pytest.raises(D.ChecksumMismatch, match=rf"{dump.dump.name}.*sha1 [0-9a-f]{{40}}, expected {dump.dump.digest}"):
        D.fetch(m, dump.dump, tmp_path / "dl")
    assert not (tmp_path / "dl" / dump.dump.relpath).exists()
    assert not (tmp_path / "dl" / (dump.dump.relpath + ".part")).exists()


def _ingest(dump: Path, out: Path) -> dict[str, str]:
    with ThreadPoolExecutor(2) as pool:
        ingest([dump], out, IngestConfig(format="mediawiki"), submit=pool.submit, streams_per_piece=2)
    return {p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))}


def test_applied_days_ingest_like_the_full_dump_of_the_same_texts(synth, tmp_path):
    mirror = synth["root"]
    base = mirror / WIKI / BASE / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    days = [(d, mirror / "other" / "incr" / WIKI / d / f"{WIKI}-{d}-pages-meta-hist-incr.xml.bz2") for d in DAYS]
    merged, counts = merge_days(days, tmp_path / "changes.parquet", synth["merged"].name)
    changes = {r.page_id: r for r in merged.revisions()}
    assert [c.date for c in counts] == DAYS
    assert all(c.revisions > c.pages > c.kept > 0 and c.skipped["other_namespace"] > 0 for c in counts)
    out = tmp_path / synth["merged"].name
    report = apply_changes(base, changes, out)
    assert report.added == 3   # one new article a day
    assert report.replaced > 0 and report.streams_copied + report.streams_rewritten == 10
    assert report.streams_new >= 1                 # new page ids past the base's last one
    assert any("(renamed" in c.title for c in changes.values())
    assert any(c.redirect for c in changes.values())
    assert _ingest(out, tmp_path / "inc") == _ingest(synth["merged"], tmp_path / "full")
    again = tmp_path / "again" / out.name
    apply_changes(base, changes, again)
    assert again.read_bytes() == out.read_bytes()   # same inputs, same bytes


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "pieces"])
def test_days_applied_while_ingesting_give_the_full_dumps_artifacts(synth, tmp_path, parallel):
    """No merged dump written: the base dump's records with the days' revisions merged in, named
    as the merged dump, give its four ingest artifacts byte for byte; a piece without a revision
    is the base dump's piece (a piece-cache hit after a base build)."""
    mirror = synth["root"]
    base = mirror / WIKI / BASE / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    days = [(d, mirror / "other" / "incr" / WIKI / d / f"{WIKI}-{d}-pages-meta-hist-incr.xml.bz2") for d in DAYS]
    changes, _ = merge_days(days, tmp_path / "changes.parquet", synth["merged"].name)
    in_memory = PageChanges.of(changes.source, changes.revisions())
    assert in_memory.digest() == changes.digest() and len(in_memory.pages) == len(changes) > 0
    cfg = IngestConfig(format="mediawiki")

    def artifacts(out, **kw):
        if parallel:
            with ThreadPoolExecutor(2) as pool:
                summary = ingest([base], out, cfg, submit=pool.submit, streams_per_piece=2, **kw)
        else:
            summary = ingest([base], out, cfg, **kw)
        return summary, {p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))}
    full = _ingest(synth["merged"], tmp_path / "full")
    _, folded = artifacts(tmp_path / "folded", changes=changes)
    assert folded == full
    if parallel:   # one page changed: the other pieces are the base build's
        one = PageChanges("one.xml.bz2", in_memory.pages[:1])
        artifacts(tmp_path / "base", piece_cache=tmp_path / "pieces")
        summary, _ = artifacts(tmp_path / "one", changes=one, piece_cache=tmp_path / "pieces")
        assert summary.pieces == {"patched": 1, "reused": 4}   # the changed piece: the base's, patched
        cleaned = summary.cleaned_pages   # the patched piece's other pages are the base piece's
        assert cleaned["reused"] > 0 and cleaned["built"] <= 1
        summary, again = artifacts(tmp_path / "memo", changes=changes, piece_cache=tmp_path / "pieces")
        assert again == full and summary.pieces == {"patched": 5}
        tasks = []   # at most `window` tasks of consecutive pieces: the same artifacts, piece by piece
        with ThreadPoolExecutor(2) as pool:
            def submit(fn, *args):
                tasks.append((fn.__name__, [a[1].index for a in args[0]]))
                return pool.submit(fn, *args)
            batched = ingest([base], tmp_path / "batched", cfg, submit=submit, streams_per_piece=2, window=2,
                             changes=changes, piece_cache=tmp_path / "pieces")
        assert tasks == [("parse_pieces", [0, 1]), ("parse_pieces", [2, 3, 4])]
        assert batched.pieces == {"patched": 5}
        assert {p.name: sha256_file(p) for p in sorted((tmp_path / "batched").glob("*.parquet"))} == full
        assert summary.cleaned_pages["reused"] > summary.cleaned_pages["built"] > 0
        shutil.rmtree(tmp_path / "pieces")   # no base piece kept: each piece is parsed with its revisions
        summary, parsed = artifacts(tmp_path / "parsed", changes=changes, piece_cache=tmp_path / "pieces")
        assert parsed == full and summary.pieces == {"built": 5}
    with pytest.raises(ValueError, match="one MediaWiki dump"):
        ingest([base, synth["merged"]], tmp_path / "two", cfg, changes=changes)


def test_a_changes_file_is_written_and_read_a_range_at_a_time(synth, tmp_path, monkeypatch):
    """merge_days copies the winning revisions a few rows at a time and a piece reads only its row
    groups: with tiny row groups and chunks the file holds the same revisions (same digest, same
    counts) as with the defaults, each range of ChangesFile.split loads what PageChanges.split
    gives, and what a piece is sent holds no text."""
    days = [(d, synth["root"] / "other" / "incr" / WIKI / d / f"{WIKI}-{d}-pages-meta-hist-incr.xml.bz2")
            for d in DAYS]
    name = synth["merged"].name
    big, big_counts = merge_days(days, tmp_path / "big.parquet", name, memo_dir=tmp_path / "memo-big")
    monkeypatch.setattr(A, "MERGE_ROWS", 7)
    monkeypatch.setattr(A, "DAY_ROW_GROUP", 5)
    monkeypatch.setattr(changes_module, "CHANGES_ROW_GROUP", 3)
    small, small_counts = merge_days(days, tmp_path / "small.parquet", name, memo_dir=tmp_path / "memo-small")
    meta = pq.ParquetFile(small.path).metadata
    assert meta.num_row_groups > 10 and max(meta.row_group(g).num_rows for g in range(meta.num_row_groups)) == 3
    assert list(small.revisions()) == list(big.revisions()) and small.digest() == big.digest()
    assert [c.as_dict() for c in small_counts] == [c.as_dict() for c in big_counts]
    in_memory = PageChanges.of(name, small.revisions())
    ids = small.page_ids.tolist()
    bounds = [None, ids[3], ids[3] + 1, ids[10], ids[-1] + 1, None]
    ranges, expected = small.split(bounds), in_memory.split(bounds)
    assert [r.load() for r in ranges] == expected
    assert [len(e.pages) for e in expected] == [3, 1, 6, len(ids) - 10, 0]
    assert [r.stop - r.start for r in ranges] == [3, 1, 6, len(ids) - 10, 0]
    assert len(pickle.dumps(ranges[3])) < 400 < sum(len(r.text) for r in expected[3].pages)
    with pytest.raises(ValueError, match="do not increase"):
        write_changes(tmp_path / "bad.parquet", name, [revisions_table(expected[2].pages[::-1])])
    assert not (tmp_path / "bad.parquet").exists()


def test_a_revision_taking_a_title_of_its_piece_parses_the_piece(synth, tmp_path):
    """A patched piece equals parsing it only while no title repeats in it: a revision renamed to
    the title of another page of its piece makes that piece parsed (and one of the two a
    duplicate), the artifacts still those of the merged dump."""
    mirror = synth["root"]
    base = mirror / WIKI / BASE / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    revisions = _merged([(DAYS[0], mirror / "other" / "incr" / WIKI / DAYS[0] /
                          f"{WIKI}-{DAYS[0]}-pages-meta-hist-incr.xml.bz2")], tmp_path)
    streams = read_index(index_path(base))
    offset, rev = next((off, revisions[pid]) for off, pages in sorted(streams.items()) for pid, _ in pages
                       if pid in revisions and revisions[pid].redirect is None)
    other = next(title for pid, title in streams[offset] if pid != rev.page_id and ":" not in title)
    clash = {rev.page_id: dataclasses.replace(rev, title=other)}
    merged = tmp_path / "clash" / f"{WIKI}-{DAYS[0]}-pages-articles-multistream.xml.bz2"
    apply_changes(base, clash, merged)
    expected = _ingest(merged, tmp_path / "full")
    with ThreadPoolExecutor(2) as pool:
        ingest([base], tmp_path / "base", IngestConfig(format="mediawiki"), submit=pool.submit, streams_per_piece=2,
               piece_cache=tmp_path / "pieces")
        summary = ingest([base], tmp_path / "inc", IngestConfig(format="mediawiki"), submit=pool.submit,
                         streams_per_piece=2, piece_cache=tmp_path / "pieces",
                         changes=PageChanges.of(merged.name, clash))
    assert summary.pieces == {"built": 1, "reused": 4}
    assert summary.skipped.get("duplicate_title", 0) >= 1
    assert {p.name: sha256_file(p) for p in sorted((tmp_path / "inc").glob("*.parquet"))} == expected


def test_piece_batches_one_piece_a_task_unless_changes_are_applied():
    assert piece_batches(3, 8, changes=False) == [range(0, 1), range(1, 2), range(2, 3)]
    assert piece_batches(20, 6, changes=True) == [range(0, 4), range(4, 8), range(8, 12), range(12, 16),
                                                  range(16, 20)]
    assert piece_batches(2, 6, changes=True) == [range(0, 1), range(1, 2)]
    assert piece_batches(5, 2, changes=True) == [range(0, 2), range(2, 5)]
    assert piece_batches(0, 6, changes=True) == []
    for n, window in ((101, 7), (2_100, 34), (9, 9)):   # even runs of at most 4, no fewer tasks than needed
        batches = piece_batches(n, window, changes=True)
        sizes = {len(b) for b in batches}
        assert [k for b in batches for k in b] == list(range(n)) and max(sizes) <= 4 and max(sizes) - min(sizes) <= 1
        assert len(batches) == -(-n // min(4, -(-n // window)))
    with pytest.raises(ValueError, match="window 0"):
        piece_batches(3, 0, changes=True)


def test_changes_need_a_dump_in_page_id_order():
    pages = iter([RawPage("b.xml", 0, "A", page_id=5, title="A"), RawPage("b.xml", 1, "B", page_id=3, title="B")])
    with pytest.raises(IngestError, match="not in increasing page id order"):
        list(merge_pages(pages, [], "m.xml"))


def test_base_stream_bytes_are_copied_when_untouched(synth, tmp_path):
    mirror = synth["root"]
    base = mirror / WIKI / BASE / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    changes = _merged([(DAYS[0], mirror / "other" / "incr" / WIKI / DAYS[0] /
                        f"{WIKI}-{DAYS[0]}-pages-meta-hist-incr.xml.bz2")], tmp_path)
    one = {pid: rev for pid, rev in changes.items() if pid < 500}
    one = dict([next(iter(sorted(one.items())))])  # one changed page in the base
    out = tmp_path / "one.xml.bz2"
    report = apply_changes(base, one, out)
    assert (report.streams_rewritten, report.streams_copied, report.replaced, report.added) == (1, 9, 1, 0)
    kept = bytes(a for a, b in zip(base.read_bytes()[-200_000:], out.read_bytes()[-200_000:]) if a == b)
    assert len(kept) > 150_000   # the streams after the changed one are the base's bytes


def _merged(days: list, tmp_path: Path) -> dict:
    """``{page_id: revision}`` of :func:`merge_days` (its changes file under ``tmp_path``)."""
    changes, _ = merge_days(days, tmp_path / "merged-days.changes.parquet", "merged.xml.bz2")
    return {r.page_id: r for r in changes.revisions()}


def _day(path: Path, memo: Path) -> tuple[dict, object]:
    """``({page_id: revision}, counts)`` of :func:`read_day_memo` of the day 20260102."""
    rows, counts = read_day_memo(path, "20260102", memo)
    return {r.page_id: r for r in revisions_from_table(rows.rows(0, len(rows)))}, counts


def test_adds_changes_file_skips_are_counted(tmp_path):
    xml = """<mediawiki><siteinfo><dbname>x</dbname></siteinfo>
  <page><title>Alpha</title><ns>0</ns><id>5</id>
    <revision><id>12</id><timestamp>t</timestamp><text>newest</text></revision>
    <revision><id>11</id><timestamp>t</timestamp><text>older, listed last</text></revision></page>
  <page><title>Wikipedia:Rules</title><ns>4</ns><id>6</id><revision><id>13</id><text>x</text></revision></page>
  <page><title>No id</title><ns>0</ns><revision><id>14</id><text>x</text></revision></page>
  <page><title>Beta</title><ns>0</ns><id>7</id><redirect title="Alpha" />
    <revision><id>15</id><text>#REDIRECT [[Alpha]]</text></revision></page>
  <page><title>Gone</title><ns>0</ns><id>8</id><revision><id>16</id><text deleted="deleted" /></revision></page>
</mediawiki>"""
    path = tmp_path / "x-20260102-pages-meta-hist-incr.xml.bz2"
    path.write_bytes(bz2.compress(xml.encode()))
    table, counts = read_day(path, "20260102")
    pages = {r.page_id: r for r in revisions_from_table(table)}
    assert list(pages) == [5, 7] and pages[5].text == "newest" and pages[7].redirect == "Alpha"
    assert (counts.pages, counts.revisions, counts.kept) == (5, 6, 2)
    assert counts.skipped == {"other_namespace": 1, "malformed": 2}
    assert any("page id 6 in namespace 4" in e for e in counts.examples)
    path.write_bytes(bz2.compress(xml.encode())[:-40])
    with pytest.raises(AddsChangesError, match=path.name):
        read_day(path, "20260102")


def test_a_day_is_parsed_once_then_read_from_its_memo(synth, tmp_path, monkeypatch):
    """The first night that applies a day parses it and keeps its revisions; a later night reads the
    memo (same revisions in the same order, same counts) without parsing; a day republished with
    other bytes, or a damaged memo, is parsed again."""
    mirror = synth["root"]
    days = [(d, mirror / "other" / "incr" / WIKI / d / f"{WIKI}-{d}-pages-meta-hist-incr.xml.bz2") for d in DAYS]
    memo = tmp_path / "memo"
    plain, plain_counts = merge_days(days, tmp_path / "plain.parquet", "m.xml.bz2")
    first, first_counts = merge_days(days, tmp_path / "first.parquet", "m.xml.bz2", memo_dir=memo)
    assert not any(c.from_memo for c in first_counts)
    assert all(day_memo_path(memo, d, p).is_file() for d, p in days)

    def no_parsing(path, date):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(A, "read_day", no_parsing)
    monkeypatch.setattr(A, "sha256_file", no_parsing)   # an unchanged file (size, time) is not even hashed
    again, again_counts = merge_days(days, tmp_path / "again.parquet", "m.xml.bz2", memo_dir=memo)
    monkeypatch.undo()
    assert all(c.from_memo for c in again_counts)
    assert list(again.revisions()) == list(first.revisions()) == list(plain.revisions())
    assert again.digest() == plain.digest()
    # the ingest keys on the file's bytes: the same revisions give the same bytes, parsed or from the memos
    assert again.path.read_bytes() == first.path.read_bytes() == plain.path.read_bytes()
    for a, b in zip(again_counts, plain_counts):
        assert {**a.as_dict(), "from_memo": False} == b.as_dict() and a.skipped == b.skipped

    day = tmp_path / "day" / f"{WIKI}-20260102-pages-meta-hist-incr.xml.bz2"   # republished: other bytes
    day.parent.mkdir()
    xml = ('<mediawiki><page><title>Alpha</title><ns>0</ns><id>5</id><revision><id>{rev}</id><timestamp>t</timestamp>'
           '<text>{text}</text></revision></page></mediawiki>')
    day.write_bytes(bz2.compress(xml.format(rev=1, text="first").encode()))
    pages, counts = _day(day, memo)
    assert pages[5].text == "first" and not counts.from_memo
    day.write_bytes(bz2.compress(xml.format(rev=2, text="second").encode()))
    pages, counts = _day(day, memo)
    assert pages[5].text == "second" and pages[5].rev_id == 2 and not counts.from_memo
    assert read_day_memo(day, "20260102", memo)[1].from_memo
    day.write_bytes(day.read_bytes())   # the same bytes written again (another time): hashed, still the memo's
    assert read_day_memo(day, "20260102", memo)[1].from_memo
    kept = day_memo_path(memo, "20260102", day)
    kept.write_bytes(kept.read_bytes()[:40])   # damaged: parsed again, memo replaced
    pages, counts = _day(day, memo)
    assert pages[5].text == "second" and not counts.from_memo
    assert read_day_memo(day, "20260102", memo)[1].from_memo


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete"])
def test_a_damaged_day_memo_is_parsed_again(synth, tmp_path, fault, caplog):
    """A day memo is read across nights: a same-size flip in its texts (caught by the pages'
    checksums when the texts are copied), a truncation (caught when it is opened) or a deletion
    makes that day parsed again and its memo replaced, its path logged; the changes file is the
    clean one and the counts are the same."""
    days = [(d, synth["root"] / "other" / "incr" / WIKI / d / f"{WIKI}-{d}-pages-meta-hist-incr.xml.bz2")
            for d in DAYS]
    name, memo = synth["merged"].name, tmp_path / "memo"
    clean, clean_counts = merge_days(days, tmp_path / "clean.parquet", name, memo_dir=memo)
    bad = day_memo_path(memo, DAYS[1], days[1][1])
    if fault == "flip":   # one byte in the middle of the texts' column chunk
        chunk = pq.ParquetFile(bad).metadata.row_group(0).column(TEXT_COLUMN)
        data = bytearray(bad.read_bytes())
        data[(chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size // 2] ^= 0x01
        bad.write_bytes(bytes(data))
    elif fault == "truncate":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    else:
        bad.unlink()
    with caplog.at_level(logging.WARNING, logger=A.__name__):
        again, counts = merge_days(days, tmp_path / "again.parquet", name, memo_dir=memo)
    assert again.digest() == clean.digest()
    assert [c.from_memo for c in counts] == [True, False, True]
    assert [{**c.as_dict(), "from_memo": None} for c in counts] == [{**c.as_dict(), "from_memo": None}
                                                                    for c in clean_counts]
    assert (str(bad) in caplog.text) == (fault != "delete")
    assert merge_days(days, tmp_path / "third.parquet", name, memo_dir=memo)[1][1].from_memo   # replaced


def test_the_nightly_decides_by_itself(source, tmp_path):
    m, mirror, _ = source
    first = plan_night(m, WIKI, None)
    assert first.action == FULL and first.base.date == BASE and first.days == []
    built = first.dump_entry()
    tonight = plan_night(m, WIKI, built)
    assert tonight.action == INCREMENTAL and tonight.days == DAYS
    assert plan_night(m, WIKI, tonight.dump_entry()).action == NOTHING
    _set_status(mirror, "20260120", "done")   # a newer finished full dump wins over the days
    newer = plan_night(m, WIKI, tonight.dump_entry())
    assert newer.action == FULL and newer.base.date == "20260120"


def test_prepare_input_hands_the_days_to_the_ingest(source, synth, tmp_path):
    m, mirror, server = source
    plan = plan_night(m, WIKI, {"wiki": WIKI, "base": BASE, "days": []})
    folded, info = prepare_input(m, plan, tmp_path / "dl")   # the days go to the ingest: no dump written
    assert folded.name == f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    changes = ChangesFile.open(Path(info["changes_file"]))
    assert changes.source == synth["merged"].name and [d["date"] for d in info["days"]] == DAYS
    assert info["apply"]["replaced"] + info["apply"]["added"] == len(changes) and info["apply"]["added"] == 3
    if server is not None:   # downloaded into the home: dump, index and each day
        assert (tmp_path / "dl" / WIKI / BASE / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2").is_file()
        assert len(list((tmp_path / "dl" / "other" / "incr" / WIKI).glob("*/*.xml.bz2"))) == 3
    day = mirror / "other" / "incr" / WIKI / DAYS[2]
    (day / "md5sums.txt").write_text("0" * 32 + f"  {WIKI}-{DAYS[2]}-pages-meta-hist-incr.xml.bz2\n")
    plan = plan_night(m, WIKI, {"wiki": WIKI, "base": BASE, "days": []})
    with pytest.raises(D.ChecksumMismatch, match=f"{WIKI}-{DAYS[2]}-pages-meta-hist-incr.xml.bz2"):
        prepare_input(m, plan, tmp_path / "dl2")


def test_a_base_not_in_page_id_order_is_refused(synth, tmp_path):
    """plan_changes names the index of a base whose pages are not in increasing page id order."""
    base = tmp_path / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    src = synth["root"] / WIKI / BASE / base.name
    shutil.copyfile(src, base)
    lines = bz2.decompress(index_path(src).read_bytes()).decode().splitlines(keepends=True)
    index_path(base).write_bytes(bz2.compress("".join([lines[1], lines[0], *lines[2:]]).encode()))
    with pytest.raises(AddsChangesError, match="not listed in increasing page id order"):
        A.plan_changes(base, None)


def test_the_base_index_is_read_once_for_the_days_and_the_ingest(synth, tmp_path, monkeypatch):
    """With the piece cache, plan_changes takes the base's page ids from the index summary the
    ingest keeps: a later night (and the ingest's layout) finds them without decompressing the
    index, with the same report; an unreadable index is named."""
    from tasks.sources.ingest import multistream

    base = tmp_path / f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"
    src = synth["root"] / WIKI / BASE / base.name
    shutil.copyfile(src, base)
    shutil.copyfile(index_path(src), index_path(base))
    ids = multistream.read_index_summary(index_path(base)).page_ids
    revisions = [PageRevision(int(p), f"T{p}", 0, None, "x", 10**9 + k, "2026-01-02T00:00:00Z", "wikitext",
                              "text/x-wiki", DAYS[0]) for k, p in enumerate([ids[0], ids[5], ids[-1] + 1])]
    changes = write_changes(tmp_path / "c.parquet", "merged.xml.bz2", [revisions_table(revisions)])
    cache = tmp_path / "pieces"
    first = A.plan_changes(base, changes, cache)
    assert (first.replaced, first.added) == (2, 1)
    monkeypatch.setattr(multistream, "_read_index_summary", lambda path: pytest.fail("read the index again"))
    again = A.plan_changes(base, changes, cache)
    assert (again.replaced, again.added) == (2, 1)
    assert multistream.plan_layout(base, 10, index_cache=cache) is not None
    monkeypatch.undo()
    index_path(base).write_bytes(b"BZh9 not bz2")
    with pytest.raises(AddsChangesError, match="unreadable multistream index"):
        A.plan_changes(base, changes, cache)


def test_retention_keeps_the_newest_dumps(tmp_path):
    for date in ("20260101", "20260120", "20260201"):
        (tmp_path / WIKI / date).mkdir(parents=True)
    for date in ("20260110", "20260125"):
        (tmp_path / "other" / "incr" / WIKI / date).mkdir(parents=True)
    removed = D.prune_downloads(tmp_path, WIKI, keep_dumps=2, in_use=[])
    assert sorted(p.name for p in removed) == ["20260101", "20260110"]
    assert D.prune_downloads(tmp_path, WIKI, keep_dumps=1, in_use=["20260120"]) == []


def test_last_build_reads_the_state_of_an_unchanged_build(tmp_path):
    from tasks.sources.nightly import last_build, read_state, write_state

    manifest = {"dump": {"wiki": WIKI, "base": BASE, "days": [DAYS[0]]}}
    assert last_build(manifest, None, "v1") == manifest["dump"]
    write_state(tmp_path, "v1", {"wiki": WIKI, "base": BASE, "days": DAYS[:2]})   # day 2 changed nothing
    assert last_build(manifest, read_state(tmp_path), "v1")["days"] == DAYS[:2]
    assert last_build(manifest, read_state(tmp_path), "v2") == manifest["dump"]   # a newer version: its manifest
    assert last_build(None, None, None) is None
