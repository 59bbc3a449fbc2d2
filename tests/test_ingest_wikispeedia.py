"""Ingest of the real Wikispeedia archives (4,598 articles, 119,879 links), and bad archives
built from them."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path
from urllib.parse import unquote

import pytest

from data_contracts.base import sha256_file
from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS, title_doc_id
from funnelrag.datasets import resolve
from tasks.sources.ingest import IngestConfig, IngestError, ingest
from tasks.sources.ingest.wikispeedia import strip_header_footer

ARTIFACTS = (DOCUMENTS, REDIRECTS, LINKS, INGEST_REPORT)
LINKS_TSV = "wikispeedia_paths-and-graph/links.tsv"


def _title(quoted: str) -> str:
    """URL-unquote, ``_`` -> space, collapse runs ("Avatar__The_Last_Airbender": a ':' lost in the file name)."""
    return " ".join(unquote(quoted).replace("_", " ").split())


@pytest.fixture(scope="module")
def archives(data_mirror) -> tuple[Path, Path]:
    return resolve("wikispeedia-articles", data_mirror), resolve("wikispeedia-graph", data_mirror)


@pytest.fixture(scope="module")
def graph_tsv(archives) -> dict[str, list[list[str]]]:
    """articles.tsv and links.tsv rows, read independently of the reader under test."""
    out = {}
    with tarfile.open(archives[1]) as tf:
        for name in ("articles", "links"):
            raw = tf.extractfile(f"wikispeedia_paths-and-graph/{name}.tsv").read().decode("utf-8")
            out[name] = [line.split("\t") for line in raw.splitlines() if line and not line.startswith("#")]
    return out


@pytest.fixture(scope="module")
def full(archives, tmp_path_factory):
    out = tmp_path_factory.mktemp("wikispeedia")
    return ingest(list(archives), out, IngestConfig(format="wikispeedia")), out


@pytest.mark.slow  # ingests all of Wikispeedia (4,598 articles, module fixture)
def test_full_wikispeedia_has_every_article_and_link(full, graph_tsv):
    summary, out = full
    docs = DOCUMENTS.read(out)
    titles = docs["title"].to_pylist()
    assert summary.documents == docs.num_rows == 4_598
    assert sorted(_title(r[0]) for r in graph_tsv["articles"]) == titles       # same titles, in title order
    assert docs["doc_id"].to_pylist() == [title_doc_id(t) for t in titles]       # no page ids: the title's hash
    rank = {t: i for i, t in enumerate(titles)}
    expected = sorted({(rank[_title(a)], rank[_title(b)]) for a, b in graph_tsv["links"]})
    links = LINKS.read(out)
    assert summary.links == links.num_rows == len(graph_tsv["links"]) == 119_879
    ids = docs["doc_id"].to_pylist()   # links in the documents' row order, with their ids
    assert list(zip(links["src_doc_id"].to_pylist(), links["dst_doc_id"].to_pylist())) == [(ids[a], ids[b]) for a, b in expected]
    c = summary.link_counts
    assert c.seen == c.kept == 119_879 and c.accounted() == c.seen
    assert c.self_kept == sum(a == b for a, b in graph_tsv["links"]) > 0
    report = INGEST_REPORT.read(out)
    assert report.num_rows == 4_598 and set(report["status"].to_pylist()) == {"kept"}
    assert REDIRECTS.read(out).num_rows == 0
    assert summary.uncompressed_bytes > summary.input_bytes


@pytest.mark.slow  # ingests all of Wikispeedia (4,598 articles, module fixture)
def test_wikispeedia_header_and_footer_are_stripped(full):
    _, out = full
    docs = DOCUMENTS.read(out)
    texts = dict(zip(docs["title"].to_pylist(), docs["text"].to_pylist()))
    for title, text in texts.items():
        assert "#copyright" not in text[:100] and "Schools Wikipedia Selection" not in text[:300], title
        assert "Retrieved from" not in text[-400:] and text == text.strip(), title
    assert texts["Zebra"].startswith("iZebras\nScientific classification")
    assert texts["Zebra"].endswith("more horse-like than other\nzebras.")


def test_strip_header_footer_keeps_text_without_a_header():
    assert strip_header_footer("Plain   text\n\n\n\nmore ") == "Plain text\n\nmore"
    raw = ('   #copyright\n\nColour\n\n2007 Schools Wikipedia Selection. Related subjects: Art;\nDesign\n\n'
           '   Colour is seen.\n   Retrieved from " http://en.wikipedia.org/wiki/Color"\n   Licence.\n')
    assert strip_header_footer(raw) == "Colour is seen."


# ----------------------------------------------------------------------------- small archives cut from the real ones
def _real_members(path: Path, n: int) -> list[tuple[str, bytes]]:
    out = []
    with tarfile.open(path) as tf:
        for member in tf:
            if member.isfile():
                out.append((member.name, tf.extractfile(member).read()))
                if len(out) == n:
                    break
    return out


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def subset(archives, graph_tsv):
    """The first 120 real articles, the real links among them, and 25 real links from them to
    articles outside the subset (missing pages); ``(articles, links.tsv text, n_missing)``."""
    articles = _real_members(archives[0], 120)
    names = {name.rsplit("/", 1)[-1][:-4] for name, _ in articles}
    inside = [f"{a}\t{b}" for a, b in graph_tsv["links"] if a in names and b in names]
    outside = [f"{a}\t{b}" for a, b in graph_tsv["links"] if a in names and b not in names][:25]
    links = "# comment\n\n" + "\n".join(sorted(inside + outside)) + "\n"
    return articles, links, len(outside)


def _inputs(d: Path, articles, links: str) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    return [_tar(d / "articles.tar.gz", articles),
            _tar(d / "graph.tar.gz", [(LINKS_TSV, links.encode("utf-8"))])]


def test_subset_is_byte_identical_across_shard_sizes(subset, tmp_path):
    articles, links, n_missing = subset
    inputs = _inputs(tmp_path / "in", articles, links)
    a = ingest(inputs, tmp_path / "a", IngestConfig(shard_size=7))
    b = ingest(list(reversed(inputs)), tmp_path / "b", IngestConfig(shard_size=10_000))
    assert a.shards == 18 and b.shards == 1
    for contract in ARTIFACTS:
        assert sha256_file(tmp_path / "a" / contract.filename) == sha256_file(tmp_path / "b" / contract.filename)
    assert a.documents == 120 and a.link_counts.unresolved == n_missing == 25
    assert a.links == a.link_counts.seen - n_missing


def test_bad_articles_and_link_lines_are_counted(subset, tmp_path):
    articles, links, _ = subset
    bad = list(articles)
    name0, data0 = bad[0]
    bad[0] = (name0, data0.replace(b"\n\n", b"\n\n\xff\xfe", 1))            # invalid UTF-8
    bad[1] = (bad[1][0], b"   #copyright\n\nX\n\n2007 Schools Wikipedia Selection. Related subjects: X\n\n")  # empty
    bad.append(("plaintext_articles/README", b"not an article"))
    src0 = name0.rsplit("/", 1)[-1][:-4]
    n_src0 = sum(1 for line in links.splitlines() if line.startswith(src0 + "\t"))
    extra = "broken line without tab\nNo_such_source\tZebra\n\tZebra\n"
    res = ingest(_inputs(tmp_path / "in", bad, links + extra), tmp_path / "out", IngestConfig(max_page_bytes=200_000))
    report = INGEST_REPORT.read(tmp_path / "out").to_pylist()
    reasons = {r["record"]: r["reason"] for r in report}
    assert reasons[name0] == "invalid_utf8" and reasons[bad[1][0]] == "empty_text"
    assert reasons["plaintext_articles/README"] == "malformed_page"
    too_big = {n for n, data in articles if len(data) > 200_000}
    assert all(reasons[n] == "oversize" for n in too_big)
    assert sorted(r["record"] for r in report if r["reason"] == "malformed_link") == [
        f"{LINKS_TSV}:line {links.count(chr(10)) + k}" for k in (1, 3)]
    c = res.link_counts
    assert c.malformed == 2 and c.unknown_source == 1
    assert c.source_skipped >= n_src0 > 0
    assert c.accounted() == c.seen == len(links.splitlines()) - 2 + 3   # minus comment and blank line
    assert res.records == len(report) == len(bad) + 2
    assert res.documents == len(articles) - 2 - len(too_big)


def test_truncated_archive_is_an_error_naming_the_file(archives, tmp_path):
    cut = tmp_path / "wikispeedia_articles_plaintext.tar.gz"
    cut.write_bytes(archives[0].read_bytes()[:2_000_000])
    with pytest.raises(IngestError, match=r"wikispeedia_articles_plaintext\.tar\.gz: truncated or corrupt"):
        ingest([cut, archives[1]], tmp_path / "out", IngestConfig())
    assert not any((tmp_path / "out").glob("*.parquet"))
