"""Ingest of generic JSONL built from real Wikispeedia articles and links; bad lines."""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from urllib.parse import unquote

import pytest

from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS
from funnelrag.datasets import resolve
from tasks.sources.ingest import IngestConfig, IngestError, ingest

JSONL = IngestConfig(format="jsonl")
N_ARTICLES = 80


@pytest.fixture(scope="module")
def real(data_mirror, tmp_path_factory):
    """``(records, wikispeedia_out)``: JSONL records (title, text, links) of the first 80 real
    Wikispeedia articles, and the Wikispeedia ingest of the same articles and links."""
    articles_tar, graph_tar = resolve("wikispeedia-articles", data_mirror), resolve("wikispeedia-graph", data_mirror)
    members = []
    with tarfile.open(articles_tar) as tf:
        for m in tf:
            if m.isfile():
                members.append((m, tf.extractfile(m).read()))
                if len(members) == N_ARTICLES:
                    break
    with tarfile.open(graph_tar) as tf:
        raw = tf.extractfile("wikispeedia_paths-and-graph/links.tsv").read().decode("utf-8")
    names = [m.name.rsplit("/", 1)[-1][:-4] for m, _ in members]
    links: dict[str, list[str]] = {n: [] for n in names}
    for line in raw.splitlines():
        if line and not line.startswith("#"):
            a, b = line.split("\t")
            if a in links:
                links[a].append(b)
    d = tmp_path_factory.mktemp("ws")
    tars = [d / "articles.tar.gz", d / "graph.tar.gz"]
    with tarfile.open(tars[0], "w:gz") as tf:
        for m, data in members:
            tf.addfile(m, io.BytesIO(data))
    tsv = "\n".join(f"{a}\t{b}" for a in names for b in links[a]).encode()
    with tarfile.open(tars[1], "w:gz") as tf:
        info = tarfile.TarInfo("wikispeedia_paths-and-graph/links.tsv")
        info.size = len(tsv)
        tf.addfile(info, io.BytesIO(tsv))
    ingest(tars, d / "out", IngestConfig(format="wikispeedia"))
    docs = DOCUMENTS.read(d / "out")
    text = dict(zip(docs["title"].to_pylist(), docs["text"].to_pylist()))
    # JSONL titles/links as written in the wild: spaces, URL-decoded; text already plain
    records = []
    for n in names:
        title = unquote(n).replace("_", " ")
        records.append({"title": title, "text": text[" ".join(title.split())],
                        "links": [unquote(b).replace("_", " ") for b in links[n]]})
    return records, d / "out"


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _dump(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def test_jsonl_matches_the_wikispeedia_ingest_of_the_same_articles(real, tmp_path):
    records, ws_out = real
    path = _write(tmp_path / "corpus.jsonl", [_dump(r) for r in records])
    res = ingest([path], tmp_path / "out", JSONL)
    docs, ws_docs = DOCUMENTS.read(tmp_path / "out"), DOCUMENTS.read(ws_out)
    for col in ("doc_id", "title", "text"):
        assert docs[col].equals(ws_docs[col]), col
    assert set(docs["source"].to_pylist()) == {"corpus.jsonl"}
    assert LINKS.read(tmp_path / "out").equals(LINKS.read(ws_out))
    assert res.documents == N_ARTICLES and res.link_counts.accounted() == res.link_counts.seen
    assert res.link_counts.seen == sum(len(r["links"]) for r in records)
    assert res.link_counts.unresolved > 0          # links to articles outside the 80


def test_gzipped_jsonl_reads_the_same_and_truncation_is_an_error(real, tmp_path):
    records, ws_out = real
    lines = [_dump(r) for r in records]
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(b"\n".join(lines) + b"\n", mtime=0))
    ingest([gz], tmp_path / "out", JSONL)
    assert DOCUMENTS.read(tmp_path / "out")["text"].equals(DOCUMENTS.read(ws_out)["text"])
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(IngestError, match=r"cut\.jsonl\.gz: truncated or corrupt input after line \d+"):
        ingest([cut], tmp_path / "out2", JSONL)


def test_bad_jsonl_lines_are_counted_skips(real, tmp_path):
    records, _ = real
    good = [_dump(r) for r in records[:5]]
    bad = [
        b'{"title": "Broken", "text": ',                                   # 6 invalid JSON
        b'["not", "an", "object"]',                                        # 7
        _dump({"text": "no title"}),                                       # 8
        _dump({"title": "No text", "text": 3}),                            # 9
        _dump({"title": "Bad links", "text": "x", "links": "Paris"}),      # 10
        _dump({"title": "Bad bytes", "text": "caf"}).replace(b"caf", b"caf\xe9"),  # 11 Latin-1 byte
        b'{"title": "Surrogate", "text": "\\ud800"}',                       # 12 lone surrogate escape
        _dump(records[0]),                                                 # 13 duplicate title
        _dump({"title": "Empty", "text": "   "}),                          # 14
        b"",                                                               # blank line: not a record
        _dump({"title": "Bad id", "text": "x", "id": "7"}),                # 16
    ]
    res = ingest([_write(tmp_path / "bad.jsonl", good + bad)], tmp_path / "out", JSONL)
    report = {r["record"].split(":")[0]: r for r in INGEST_REPORT.read(tmp_path / "out").to_pylist()}
    expected = {6: "malformed_page", 7: "malformed_page", 8: "malformed_page", 9: "malformed_page",
                10: "malformed_page", 11: "invalid_utf8", 12: "invalid_utf8", 13: "duplicate_title",
                14: "empty_text", 16: "malformed_page"}
    assert {int(k.split()[1]): r["reason"] for k, r in report.items() if r["status"] == "skipped"} == expected
    assert res.records == len(good) + len(bad) - 1 and res.documents == len(good)
    assert "invalid JSON" in report["line 6"]["detail"] and "'links'" in report["line 10"]["detail"]
    assert res.link_counts.source_skipped == len(records[0]["links"])   # the duplicate's links


def test_unknown_format_and_missing_input_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="format"):
        IngestConfig(format="csv")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        ingest([tmp_path / "nope.jsonl"], tmp_path / "out", JSONL)


def test_an_article_added_before_the_others_changes_no_other_doc_id_or_untouched_cluster_id(real, tmp_path):
    """Build ids from content: an article whose title sorts before every other (it shifts every
    title rank and every row) leaves each other article's ``doc_id`` and every cluster it does not
    join with the same ``cluster_id`` and members; Algorithm 1 still runs on the rows in title
    order (same clusters, in the same order, as without the new article)."""
    from data_contracts.corpus import CLUSTER_MEMBERS, CLUSTERS, title_doc_id
    from tasks.corpus import stages as S
    from tasks.corpus.clustering import ClusteringConfig
    from tasks.corpus.segment import SegmentConfig

    records, _ = real
    first = {"title": "!! " + records[0]["title"], "text": "an article added tonight that links nowhere", "links": []}
    built = {}
    for name, recs in (("night1", records), ("night2", [first, *records])):
        out = tmp_path / name
        S.run_ingest([_write(tmp_path / f"{name}.jsonl", [_dump(r) for r in recs])], out / "ingest", JSONL)
        S.run_tokens(out / "ingest", out / "tokens", SegmentConfig(tokenizer="whitespace"), None)
        S.run_cluster(out / "ingest", out / "tokens", out / "cluster", ClusteringConfig(max_tokens=2_000, tokenizer="whitespace"))
        docs = DOCUMENTS.read(out / "ingest")
        members = CLUSTER_MEMBERS.read(out / "cluster")
        clusters: dict[int, list[int]] = {}
        for cid, did in zip(members["cluster_id"].to_pylist(), members["doc_id"].to_pylist()):
            clusters.setdefault(cid, []).append(did)
        built[name] = (dict(zip(docs["title"].to_pylist(), docs["doc_id"].to_pylist())), clusters,
                       CLUSTERS.read(out / "cluster")["cluster_id"].to_pylist())
    (ids1, clusters1, order1), (ids2, clusters2, order2) = built["night1"], built["night2"]
    assert list(ids2)[0] == first["title"] and ids2.pop(first["title"]) == title_doc_id(first["title"])
    assert ids2 == ids1                                     # every other article keeps its doc_id
    new = title_doc_id(first["title"])
    assert clusters2.pop(new) == [new]                      # the new article is a cluster of its own, named by it
    assert clusters2 == clusters1 and len(clusters1) > 10   # every other cluster: same id, same members
    assert [c for c in order2 if c != new] == order1        # and Algorithm 1's order is unchanged
