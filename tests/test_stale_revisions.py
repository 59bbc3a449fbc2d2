"""An adds-changes revision applies only when it is newer than what the base dump (or an earlier
day) holds for its page: revision id, then timestamp. An older one (page id 10 at revision 5,
2019, over the base's revision 1,000,000 of 2026) is skipped and counted, on every merge path:
the merged dump written out (``tests/merged_dump.py``, the reference), the serial ingest's ``merge_pages``, the parallel
ingest's pieces parsed with their revisions and the pieces patched from the base build's kept
pieces, and the merge of several days."""
from __future__ import annotations

import bz2
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.synth_dump import SAMPLE, write_dump
from data_contracts.base import sha256_file
from tasks.sources.adds_changes import STALE_REVISION, merge_days
from tasks.sources.ingest import IngestConfig, ingest
from tasks.sources.ingest.changes import PageChanges, PageRevision, is_newer, page_xml
from tasks.sources.ingest.multistream import index_path
from tests.merged_dump import apply_changes, read_index

WIKI = "synwiki"
MERGED = f"{WIKI}-20260102-pages-articles-multistream.xml.bz2"


@pytest.fixture(scope="module")
def base(tmp_path_factory, data_mirror) -> Path:
    """A 500-page multistream dump (page ids from 10, revision 1,000,000 + i of 2026-01-01)."""
    out = tmp_path_factory.mktemp("base")
    write_dump(out, 500, 11, 1, data_mirror / SAMPLE, name=f"{WIKI}-20260101-pages-articles-multistream")
    return out / f"{WIKI}-20260101-pages-articles-multistream.xml.bz2"


def _revision(base: Path, page_id: int, rev_id: int, timestamp: str, text: str, day: str = "20260102") -> PageRevision:
    titles = {pid: t for pages in read_index(index_path(base)).values() for pid, t in pages}
    return PageRevision(page_id, titles[page_id], 0, None, text, rev_id, timestamp, "wikitext", "text/x-wiki", day)


@pytest.fixture(scope="module")
def revisions(base) -> tuple[PageRevision, PageRevision]:
    """(stale, fresh): page 10 at revision 5 of 2019; page 11 at a revision newer than the base's."""
    return (_revision(base, 10, 5, "2019-03-01T00:00:00Z", "An old text of 2019 that must not win."),
            _revision(base, 11, 2_000_000, "2026-01-02T08:00:00Z", "A fresh text of tonight."))


def _artifacts(out: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))}


def test_newer_compares_revision_id_then_timestamp(revisions):
    stale, fresh = revisions
    assert not is_newer(stale, 1_000_000, "2026-01-01T00:00:00Z")
    assert is_newer(fresh, 1_000_001, "2026-01-01T00:00:00Z")
    assert not is_newer(fresh, 2_000_000, "2026-01-02T08:00:00Z")          # the same revision
    assert is_newer(fresh, 2_000_000, "2026-01-01T00:00:00Z")              # same id: the later timestamp
    assert not is_newer(fresh, None, "2026-02-01T00:00:00Z")               # no id: the timestamp decides
    assert is_newer(fresh, None, None)


def test_a_stale_revision_is_skipped_by_the_merged_dump(base, revisions, tmp_path):
    stale, fresh = revisions
    both = apply_changes(base, {10: stale, 11: fresh}, tmp_path / "both" / MERGED)
    good = apply_changes(base, {11: fresh}, tmp_path / "good" / MERGED)
    assert (both.replaced, both.stale_revisions, good.stale_revisions) == (1, 1, 0)
    assert (tmp_path / "both" / MERGED).read_bytes() == (tmp_path / "good" / MERGED).read_bytes()
    alone = apply_changes(base, {10: stale}, tmp_path / "alone" / MERGED)   # its stream is copied as it is
    assert (alone.replaced, alone.stale_revisions, alone.streams_rewritten) == (0, 1, 0)


@pytest.mark.parametrize("how", ["serial", "pieces", "patched"])
def test_a_stale_revision_is_skipped_while_ingesting(base, revisions, tmp_path, how):
    stale, fresh = revisions
    apply_changes(base, {11: fresh}, tmp_path / "good" / MERGED)
    expected = _artifacts(_ingested(tmp_path / "good" / MERGED, tmp_path / "expected"))
    cfg = IngestConfig(format="mediawiki")
    changes = PageChanges.of(MERGED, [stale, fresh])
    if how == "serial":
        summary = ingest([base], tmp_path / "out", cfg, changes=changes)
    else:
        cache = tmp_path / "pieces" if how == "patched" else None
        with ThreadPoolExecutor(2) as pool:
            if cache is not None:   # the base build keeps its pieces: tonight's are patched from them
                ingest([base], tmp_path / "base", cfg, submit=pool.submit, streams_per_piece=2, piece_cache=cache)
            summary = ingest([base], tmp_path / "out", cfg, submit=pool.submit, streams_per_piece=2,
                             piece_cache=cache, changes=changes)
        assert ("patched" in summary.pieces) == (how == "patched")
    assert summary.stale_revisions == 1
    assert _artifacts(tmp_path / "out") == expected


def _ingested(dump: Path, out: Path) -> Path:
    ingest([dump], out, IngestConfig(format="mediawiki"))
    return out


def _day_file(tmp_path: Path, date: str, revs: list[PageRevision]) -> Path:
    path = tmp_path / date / f"{WIKI}-{date}-pages-meta-hist-incr.xml.bz2"
    path.parent.mkdir(parents=True)
    path.write_bytes(bz2.compress(b"<mediawiki>\n" + b"".join(map(page_xml, revs)) + b"</mediawiki>\n"))
    return path


def test_a_later_day_holding_an_older_revision_is_skipped(base, revisions, tmp_path):
    _, fresh = revisions
    older = _revision(base, 11, 1_500_000, "2026-01-01T12:00:00Z", "An older edit listed by a later day.", "20260103")
    days = [("20260102", _day_file(tmp_path, "20260102", [fresh])),
            ("20260103", _day_file(tmp_path, "20260103", [older]))]
    changes, counts = merge_days(days, tmp_path / "changes.parquet", MERGED)
    merged = {r.page_id: r for r in changes.revisions()}
    assert merged[11].text == fresh.text and merged[11].rev_id == 2_000_000
    assert [c.skipped.get(STALE_REVISION, 0) for c in counts] == [0, 1]
    assert any("page id 11" in e for e in counts[1].examples)
