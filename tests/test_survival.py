"""What of one corpus version survives into the next (tasks.corpus.survival): two versions cut by
the real segmentation from hand-made documents and clusters; an article added before the others
shifts every title rank and Algorithm 1's cluster order, but no doc_id, cluster_id of an unchanged
anchor, or passage id of an unchanged article."""
from __future__ import annotations

import pyarrow as pa
import pytest

from data_contracts import corpus as C
from tasks.corpus.segment import SegmentConfig, segment_corpus
from tasks.corpus.survival import id_survival
from tasks.corpus.tokenize import WhitespaceCounter

CFG = SegmentConfig(passage_words=5, unit_max_tokens=12, tokenizer="whitespace")


def _version(root, name: str, articles: dict[str, str], clusters: list[list[str]]):
    """A version directory with documents (title order, doc_id from the title as for a source without
    page ids), clusters and cluster_members (cluster_id = the first member's doc_id), units, passages."""
    titles = sorted(articles)
    doc_id = {t: C.title_doc_id(t) for t in titles}
    docs = pa.table({"doc_id": pa.array([doc_id[t] for t in titles], pa.int64()), "title": titles,
                     "text": [articles[t] for t in titles], "page_id": pa.array([None] * len(titles), pa.int64()),
                     "source": ["x"] * len(titles)})
    members = pa.table({"cluster_id": pa.array([doc_id[ts[0]] for ts in clusters for _ in ts], pa.int64()),
                        "position": pa.array([p for ts in clusters for p in range(len(ts))], pa.int32()),
                        "doc_id": pa.array([doc_id[t] for ts in clusters for t in ts], pa.int64())})
    table = pa.table({"cluster_id": pa.array([doc_id[ts[0]] for ts in clusters], pa.int64()),
                      "n_members": pa.array([len(ts) for ts in clusters], pa.int32()),
                      "n_tokens": pa.array([1] * len(clusters), pa.int32()), "title": [ts[0] for ts in clusters]})
    seg = segment_corpus(docs, members, CFG, WhitespaceCounter())
    out = root / name
    for contract, table in ((C.DOCUMENTS, docs), (C.CLUSTERS, table), (C.CLUSTER_MEMBERS, members),
                            (C.DOCUMENT_UNITS, seg.units), (C.PASSAGES, seg.passages)):
        contract.write(table, out)
    return out, seg


def words(n: int, prefix: str) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_unchanged_articles_keep_their_ids_when_everything_positional_shifts(tmp_path):
    night1 = {"Beta": words(12, "b"), "Delta": words(7, "d"), "Gamma": words(9, "g")}
    night2 = {**night1, "Alpha": words(6, "a"), "Gamma": words(9, "G")}   # one added (ranks first), one edited
    before, seg1 = _version(tmp_path, "v1", night1, [["Beta", "Delta"], ["Gamma"]])
    after, seg2 = _version(tmp_path, "v2", night2, [["Alpha", "Delta"], ["Beta"], ["Gamma"]])
    rows = lambda seg: {(p["passage_id"], p["title"], p["text"]) for p in seg.passages.to_pylist()}  # noqa: E731
    unchanged = {r for r in rows(seg1) if r[1] in ("Beta", "Delta")}
    assert unchanged <= rows(seg2)   # other cluster, other position, other doc_id: same ids
    beta = C.title_doc_id("Beta")
    assert {p["doc_id"] for p in seg2.passages.to_pylist() if p["title"] == "Beta"} == {beta}   # rank 0, then 1: same id
    got = id_survival(before, after)
    assert got["documents_before"] == 3 and got["documents_kept_ids"] == 1.0   # Alpha, ranked first, shifts no id
    # [Beta, Delta] -> [Beta] keeps its anchor's id (other members); [Gamma] keeps its id
    assert got["clusters_kept_ids"] == 1.0
    # 3 + 2 + 2 passages before; Gamma's 2 windows keep their ids (edited text, same windows)
    assert got["passages_before"] == 7 and got["passages_kept_ids"] == 1.0
    assert got["clusters_before"] == 2 and got["clusters_unchanged"] == pytest.approx(0.5)   # [Gamma] again
    units1 = seg1.units.to_pylist()
    kept_units = {u["unit_id"] for u in seg2.units.to_pylist()}
    assert got["units_kept_ids"] == pytest.approx(sum(u["unit_id"] in kept_units for u in units1) / len(units1))
    assert got["units_unchanged"] <= got["units_kept_ids"]
    assert id_survival(after, after) == {**id_survival(after, after), "passages_kept_ids": 1.0, "units_kept_ids": 1.0,
                                         "units_unchanged": 1.0, "clusters_unchanged": 1.0, "documents_kept_ids": 1.0,
                                         "clusters_kept_ids": 1.0}
