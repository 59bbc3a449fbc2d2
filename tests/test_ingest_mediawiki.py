"""Ingest of the real enwiki ``pages-articles`` sample, and bad inputs cut from it."""
from __future__ import annotations

import bz2
import io
import re
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
from lxml import etree

from data_contracts.base import sha256_file
from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS
from funnelrag.datasets import resolve
from tasks.sources.ingest import IngestConfig, IngestError, ingest
from tasks.sources.ingest.streams import INVALID_UTF8_MARK, Utf8Guard

ARTIFACTS = (DOCUMENTS, REDIRECTS, LINKS, INGEST_REPORT)
MW = IngestConfig(format="mediawiki")


@pytest.fixture(scope="module")
def dump_path(data_mirror) -> Path:
    return resolve("enwiki-sample", data_mirror)


@pytest.fixture(scope="module")
def dump_parts(dump_path) -> tuple[bytes, list[bytes], bytes]:
    """The real XML split into (header, [<page> ... </page>], footer), to build bad inputs."""
    xml = bz2.decompress(dump_path.read_bytes())
    starts = [m.start() for m in re.finditer(rb"  <page>", xml)]
    end = xml.rindex(b"</page>") + len(b"</page>\n")
    pages = [xml[a:b] for a, b in zip(starts, starts[1:] + [end])]
    assert len(pages) == 206
    return xml[:starts[0]], pages, xml[end:]


@pytest.fixture(scope="module")
def sample(dump_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("enwiki")
    return ingest([dump_path], out, MW), out


def _write(path: Path, header: bytes, pages: list[bytes], footer: bytes) -> Path:
    path.write_bytes(header + b"".join(pages) + footer)
    return path


def _page(pages: list[bytes], title: str) -> int:
    return next(i for i, p in enumerate(pages) if f"<title>{title}</title>".encode() in p)


# ----------------------------------------------------------------------------- the real sample
def test_every_page_of_the_sample_is_accounted_for(sample):
    summary, out = sample
    report = INGEST_REPORT.read(out)
    assert report.num_rows == summary.records == 206
    assert report["position"].to_pylist() == list(range(206))
    status = Counter(report["status"].to_pylist())
    skipped = Counter(r for r in report["reason"].to_pylist() if r)
    # 106 main-namespace articles (98 kept + 8 disambiguation pages), 99 redirects, 1 other namespace
    assert status == {"kept": 98, "redirect": 99, "skipped": 9}
    assert skipped == {"disambiguation": 8, "other_namespace": 1}
    assert summary.by_status == dict(status) and summary.skipped == dict(skipped)
    assert summary.uncompressed_bytes == 6_089_746


def test_documents_are_sorted_by_title_with_page_ids_as_doc_ids_and_clean(sample):
    summary, out = sample
    docs = DOCUMENTS.read(out)
    titles = docs["title"].to_pylist()
    assert docs["doc_id"].to_pylist() == docs["page_id"].to_pylist() and docs.num_rows == summary.documents
    assert titles == sorted(titles)
    kept = INGEST_REPORT.read(out).filter(pc.equal(pc.field("status"), "kept"))
    assert sorted(kept["title"].to_pylist()) == titles
    assert set(docs["source"].to_pylist()) == {"enwiki-20160501-pages-articles-shortened.xml.bz2"}
    assert all(pid is not None for pid in docs["page_id"].to_pylist())
    text = dict(zip(titles, docs["text"].to_pylist()))
    assert text["Anarchism"].startswith("Anarchism is a political philosophy")
    assert not any(marker in t for t in text.values() for marker in ("{{", "}}", "<ref", "'''", "\n{|"))
    # "[[" survives only where the source is unbalanced ("[[Target|label]" in Aldous Huxley)
    assert not any(re.search(r"\[\[[^\[\]\n]*\]\]", t) for t in text.values())


def test_redirects_and_links_are_consistent(sample):
    summary, out = sample
    docs = DOCUMENTS.read(out)
    title_to_id = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))
    redirects = REDIRECTS.read(out).to_pylist()
    assert len(redirects) == summary.redirects == 99   # the ns-4 redirect is not a main-namespace redirect
    for r in redirects:
        assert (r["status"] == "resolved") == (r["target_title"] in title_to_id)
    assert {r["status"] for r in redirects} <= {"resolved", "dangling", "excluded", "cycle"}
    assert any(r["status"] == "resolved" for r in redirects) and any(r["status"] == "dangling" for r in redirects)
    links = LINKS.read(out)
    assert links.num_rows == summary.links > 0
    row = {d: i for i, d in enumerate(docs["doc_id"].to_pylist())}   # links in the documents' row order
    pairs = [(row[a], row[b]) for a, b in zip(links["src_doc_id"].to_pylist(), links["dst_doc_id"].to_pylist())]
    assert pairs == sorted(set(pairs))
    counts = summary.link_counts
    assert counts.accounted() == counts.seen
    assert counts.unresolved > counts.kept          # the sample's link graph is very sparse
    assert counts.other_namespace > 0 and counts.interwiki > 0


@pytest.mark.slow  # ingests the enwiki sample again (twice or more)
@pytest.mark.parametrize("shard_size", [1, 7])
def test_output_is_byte_identical_across_runs_and_shard_sizes(sample, dump_path, tmp_path, shard_size):
    """shard_size=1 gives 98 shards, more than the merge fan-in (64): a two-level merge."""
    _, out = sample
    again = ingest([dump_path], tmp_path / "a", IngestConfig(format="mediawiki", shard_size=shard_size))
    assert again.shards == -(-98 // shard_size)
    for contract in ARTIFACTS:
        assert sha256_file(out / contract.filename) == sha256_file(tmp_path / "a" / contract.filename)
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # shards removed


def test_utf8_guard_marks_invalid_bytes_across_chunk_boundaries(dump_parts):
    header, pages, _ = dump_parts
    data = header + pages[1][:3000]
    assert data[1999] < 0x80 and data[2499] < 0x80                       # cut between characters
    bad = data[:2000] + b"\xff" + data[2000:2500] + b"\xe2\x82" + data[2500:]   # stray byte, cut sequence
    mark = INVALID_UTF8_MARK.encode("utf-8")                                # one marker per invalid byte
    expected = data[:2000] + mark + data[2000:2500] + 2 * mark + data[2500:]
    for chunk in (1, 2, 3, 5, 64, 1 << 20):
        guard = Utf8Guard(io.BytesIO(bad), chunk_size=chunk)
        out = b"".join(iter(lambda: guard.read(333), b""))
        assert out == expected and guard.invalid_bytes == 3 and guard.bytes_read == len(bad)
    assert Utf8Guard(io.BytesIO(data)).read() == data                  # valid input passes unchanged


@pytest.mark.slow  # ingests the enwiki sample again (twice or more)
def test_multistream_and_plain_xml_give_the_same_tables(sample, dump_parts, tmp_path):
    """A multistream dump (concatenated bz2 streams) and the plain XML read like the original."""
    _, out = sample
    header, pages, footer = dump_parts
    name = "enwiki-20160501-pages-articles-shortened.xml.bz2"   # same name: same `source` column
    multi = tmp_path / "multi" / name
    multi.parent.mkdir()
    multi.write_bytes(bz2.compress(header + b"".join(pages[:100])) + bz2.compress(b"".join(pages[100:]) + footer))
    (tmp_path / "plain").mkdir()
    plain = _write(tmp_path / "plain" / name, header, pages, footer)
    for path in (multi, plain):
        res = ingest([path], path.parent / "out", MW)
        assert res.records == 206
        for contract in ARTIFACTS:
            assert contract.read(path.parent / "out").equals(contract.read(out)), (path, contract.name)


@pytest.mark.slow  # ingests the enwiki sample again (twice or more)
def test_keeping_disambiguation_pages(dump_path, tmp_path):
    res = ingest([dump_path], tmp_path, IngestConfig(format="mediawiki", exclude_disambiguation=False))
    assert res.documents == 106 and "disambiguation" not in res.skipped


# ----------------------------------------------------------------------------- bad inputs
def test_truncated_bz2_is_an_error_naming_the_file(dump_path, tmp_path):
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(dump_path.read_bytes()[: dump_path.stat().st_size * 6 // 10])
    with pytest.raises(IngestError, match=r"cut\.xml\.bz2.*truncated.*last complete page"):
        ingest([cut], tmp_path / "out", MW)
    assert not any((tmp_path / "out").glob("*.parquet"))   # nothing half-written


def test_broken_xml_is_an_error_naming_file_and_line(dump_parts, tmp_path):
    header, pages, footer = dump_parts
    bad = list(pages)
    bad[50] = bad[50].replace(b"</title>", b"</titel>", 1)
    path = _write(tmp_path / "broken.xml", header, bad, footer)
    with pytest.raises(IngestError, match=r"broken\.xml: malformed XML at line \d+"):
        ingest([path], tmp_path / "out", MW)


def test_page_without_title_or_text_is_a_counted_skip(dump_parts, tmp_path):
    header, pages, footer = dump_parts
    bad = list(pages)
    i, j = _page(bad, "Anarchism"), _page(bad, "Autism")
    bad[i] = re.sub(rb"<title>.*?</title>", b"", bad[i])
    bad[j] = re.sub(rb"<text[^>]*>.*?</text>", b"", bad[j], flags=re.S)
    res = ingest([_write(tmp_path / "d.xml", header, bad, footer)], tmp_path / "out", MW)
    report = INGEST_REPORT.read(tmp_path / "out").to_pylist()
    assert res.records == 206 and res.skipped["malformed_page"] == 2 and res.documents == 96
    assert report[i]["reason"] == "malformed_page" and "missing <title>" in report[i]["detail"]
    assert report[i]["record"] == f"page #{i}" and report[i]["page_id"] == 12
    assert report[j]["record"] == "Autism" and "missing <revision><text>" in report[j]["detail"]


def test_invalid_utf8_skips_only_the_page_holding_it(dump_parts, tmp_path):
    header, pages, footer = dump_parts
    bad = list(pages)
    i = _page(bad, "Albedo")
    bad[i] = bad[i].replace(b"albedo", b"alb\xffedo", 1)
    res = ingest([_write(tmp_path / "u.xml", header, bad, footer)], tmp_path / "out", MW)
    row = INGEST_REPORT.read(tmp_path / "out").to_pylist()[i]
    assert (row["record"], row["status"], row["reason"]) == ("Albedo", "skipped", "invalid_utf8")
    assert res.documents == 97 and res.records == 206
    assert "Albedo" not in DOCUMENTS.read(tmp_path / "out")["title"].to_pylist()


def test_redirect_cycle_and_missing_link_target(dump_parts, sample, tmp_path):
    header, pages, footer = dump_parts
    base, out = sample
    bad = list(pages)
    names = ["AccessibleComputing", "AfghanistanHistory", "AfghanistanGeography"]
    for k, name in enumerate(names):      # three real redirects rewired into a cycle
        i = _page(bad, name)
        nxt = names[(k + 1) % 3]
        bad[i] = re.sub(rb'<redirect title="[^"]*" />', f'<redirect title="{nxt}" />'.encode(), bad[i])
    a = _page(bad, "Anarchism")
    bad[a] = bad[a].replace(b"</text>", b" See [[No such page at all]] and [[Autism|autism]].</text>", 1)
    res = ingest([_write(tmp_path / "c.xml", header, bad, footer)], tmp_path / "out", MW)
    rows = {r["source_title"]: r for r in REDIRECTS.read(tmp_path / "out").to_pylist()}
    assert all(rows[n]["status"] == "cycle" and rows[n]["target_title"] is None for n in names)
    assert res.redirect_status["cycle"] == 3
    assert res.link_counts.unresolved == base.link_counts.unresolved + 1   # counted, not kept
    assert res.link_counts.seen == base.link_counts.seen + 2
    docs = DOCUMENTS.read(tmp_path / "out")
    ids = dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist()))
    pairs = set(zip(*(LINKS.read(tmp_path / "out")[c].to_pylist() for c in ("src_doc_id", "dst_doc_id"))))
    base_pairs = set(zip(*(LINKS.read(out)[c].to_pylist() for c in ("src_doc_id", "dst_doc_id"))))
    assert (ids["Anarchism"], ids["Autism"]) in pairs
    assert len(pairs) == len(base_pairs | {(ids["Anarchism"], ids["Autism"])})


def test_duplicate_title_and_oversize(dump_parts, tmp_path):
    header, pages, footer = dump_parts
    i = _page(pages, "Anarchism")
    res = ingest([_write(tmp_path / "x.xml", header, pages + [pages[i]], footer)], tmp_path / "out",
                 IngestConfig(format="mediawiki", max_page_bytes=100_000))
    report = INGEST_REPORT.read(tmp_path / "out").to_pylist()
    assert res.records == 207
    assert report[-1]["reason"] == "duplicate_title" and report[-1]["record"] == "Anarchism"
    assert report[i]["reason"] == "oversize" and report[i]["n_bytes"] > 100_000
    big = sum(1 for r in report[:206] if r["status"] != "redirect" and r["n_bytes"] > 100_000)
    assert res.skipped["oversize"] == big > 1


def _reference_fields(elem) -> tuple:
    """What ``_page`` read before its one pass over the children: five wildcard searches."""
    revisions = elem.findall("{*}revision")
    text_elem = revisions[-1].find("{*}text") if revisions else None
    redirect = elem.find("{*}redirect")
    return (elem.findtext("{*}title"), elem.findtext("{*}ns"), elem.findtext("{*}id"),
            None if text_elem is None else (text_elem.text or ""), None if redirect is None else redirect.get("title"))


@pytest.mark.parametrize("xmlns", ['xmlns="http://www.mediawiki.org/xml/export-0.10/"', ""])
@pytest.mark.parametrize("body, expected", [
    # title, ns, page id, text, redirect, error
    (("<title>A</title><ns>0</ns><id>5</id><revision><id>9</id><text>old</text></revision>"
      "<revision><id>10</id><text>new</text></revision>"), ("A", 0, 5, "new", None, None)),
    (("<!-- c --><title>A</title><title>B</title><ns>0</ns><id>5</id><revision><!-- c --><text>t</text>"
      "<text>u</text></revision>"), ("A", 0, 5, "t", None, None)),
    (("<title>A</title><ns>0</ns><id>5</id><redirect title='B'/><redirect title='C'/><revision><text>x</text>"
      "</revision>"), ("A", 0, 5, "x", "B", None)),
    ("<title>A</title><ns>0</ns><id>5</id><revision><text>t</text></revision><revision><id>1</id></revision>",
     ("A", 0, 5, None, None, "malformed_page")),
    ("<title/><ns>4</ns><revision><text/></revision>", ("", 4, None, "", None, "malformed_page")),
    ("<ns>0</ns><id>x</id><title>A</title><revision><text>t</text></revision>",
     ("A", 0, None, "t", None, "malformed_page")),
])
def test_page_fields_are_the_first_child_of_each_name_and_the_last_revision(xmlns, body, expected):
    """``_page`` walks the children once; it must pick what ``findtext("{*}title")`` & co. picked:
    the first <title>/<ns>/<id>/<redirect>, the <text> of the last <revision>; comments are not tags."""
    from tasks.sources.ingest.mediawiki import _page  # noqa: PLC0415

    elem = etree.fromstring(f"<page {xmlns}>{body}</page>".encode())
    page = _page(elem, "dump.xml", 3)
    title, _, _, text, redirect = _reference_fields(elem)
    assert (page.title, page.text, page.redirect) == (title, text, redirect)
    assert (page.title, page.namespace, page.page_id, page.text, page.redirect, page.error) == expected
