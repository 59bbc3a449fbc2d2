"""Real data: T5 token counts, and later chunking at query time == the offline passage table,
on a connected sample of real Wikispeedia articles clustered by Algorithm 1."""
from __future__ import annotations

import tarfile
from collections import deque
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from data_contracts.corpus import CLUSTER_MEMBERS, DOCUMENT_UNITS, DOCUMENTS, PASSAGES
from funnelrag.datasets import resolve
from tasks.corpus.clustering import ClusteringConfig, check_clustering, cluster_documents, cluster_members_table
from tasks.corpus.graph import build_graph, graph_metrics
from tasks.corpus.segment import SegmentConfig, article_windows, count_window_tokens, segment_cluster, segment_corpus
from tasks.corpus.tokenize import load_token_counter

N_ARTICLES = 250


@pytest.fixture(scope="module")
def t5(data_mirror):
    return load_token_counter("t5", data_mirror)


@pytest.fixture(scope="module")
def sample(data_mirror):
    """``N_ARTICLES`` real articles around "Bede" (breadth-first over the real links), their
    texts, and the links among them, as ``(documents table, src, dst)``."""
    with tarfile.open(resolve("wikispeedia-graph", data_mirror)) as tf:
        raw = tf.extractfile("wikispeedia_paths-and-graph/links.tsv").read().decode("utf-8")
    links = [line.split("\t") for line in raw.splitlines() if line and not line.startswith("#")]
    adjacency: dict[str, list[str]] = {}
    for a, b in links:
        adjacency.setdefault(a, []).append(b)
        adjacency.setdefault(b, []).append(a)
    chosen, queue = {"Bede"}, deque(["Bede"])
    while queue and len(chosen) < N_ARTICLES:
        for nb in sorted(adjacency[queue.popleft()]):
            if len(chosen) < N_ARTICLES and nb not in chosen:
                chosen.add(nb)
                queue.append(nb)
    titles = sorted(chosen)
    doc_id = {t: i for i, t in enumerate(titles)}
    texts = [""] * len(titles)
    with tarfile.open(resolve("wikispeedia-articles", data_mirror)) as tf:
        for t in titles:
            texts[doc_id[t]] = tf.extractfile(f"plaintext_articles/{t}.txt").read().decode("utf-8")
    documents = DOCUMENTS.validate(pa.table({
        "doc_id": pa.array(range(len(titles)), pa.int32()),
        "title": [unquote(t).replace("_", " ") for t in titles],
        "text": texts,
        "page_id": pa.array([None] * len(titles), pa.int64()),
        "source": ["wikispeedia_articles_plaintext.tar.gz"] * len(titles)}))
    inside = [(doc_id[a], doc_id[b]) for a, b in links if a in doc_id and b in doc_id]
    return documents, np.array([a for a, _ in inside]), np.array([b for _, b in inside])


@pytest.mark.slow  # the T5 tokenizer over Wikispeedia articles against transformers
def test_t5_counts_equal_transformers_without_special_tokens(data_mirror, t5, sample):
    from transformers import AutoTokenizer

    documents, _, _ = sample
    auto = AutoTokenizer.from_pretrained(str(resolve("t5-tokenizer", data_mirror).parent))
    text = documents.column("text")[0].as_py()
    windows = article_windows(text, 100)[:20] + [" ".join(text.split()[:1500]), "a"]
    got = t5.count(windows)
    want = [len(auto(w, add_special_tokens=False)["input_ids"]) for w in windows]
    assert got.tolist() == want
    assert got[-2] > 256 and got[-1] < 5  # the file's fixed padding/truncation to 256 is off


@pytest.mark.slow  # later chunking of Wikispeedia articles with the T5 tokenizer
def test_later_chunking_equals_offline_tables(tmp_path, t5, sample):
    documents, src, dst = sample
    n = documents.num_rows
    scfg = SegmentConfig()  # 100 words, 1,024 T5 tokens
    texts = documents.column("text").to_pylist()
    wt = count_window_tokens(texts, scfg, t5)
    n_tokens = wt.article_tokens()
    graph = build_graph(src, dst, n)
    ccfg = ClusteringConfig(max_tokens=16_384)  # room for several of these long articles
    clustering = cluster_documents(graph, graph_metrics(graph), n_tokens, ccfg)
    check_clustering(graph, clustering, n_tokens, ccfg)
    assert (clustering.n_members() > 1).sum() > 10
    members = cluster_members_table(clustering)
    out = segment_corpus(documents, members, scfg, t5, window_tokens=wt)
    # offline tables go through their contracts (parquet) like in the corpus build
    for contract, table in ((CLUSTER_MEMBERS, members), (DOCUMENT_UNITS, out.units), (PASSAGES, out.passages)):
        contract.write(table, tmp_path)
    members = CLUSTER_MEMBERS.read(tmp_path)
    units, passages = DOCUMENT_UNITS.read(tmp_path), PASSAGES.read(tmp_path)
    assert pc.max(units["n_tokens"]).as_py() <= scfg.unit_max_tokens
    assert pc.sum(passages["n_tokens"]).as_py() == int(n_tokens.sum())
    # query time: re-cut sampled clusters from documents + cluster_members, re-tokenizing
    rng = np.random.default_rng(0)
    multi = np.flatnonzero(clustering.n_members() > 1)
    sampled = sorted(set(rng.choice(multi, 8, replace=False).tolist()) | {0, clustering.n_clusters - 1})
    titles, docs_text = documents.column("title").to_pylist(), documents.column("text").to_pylist()
    for cid in sampled:
        rows = members.filter(pc.equal(members["cluster_id"], cid)).sort_by("position")
        cluster = [(d, titles[d], docs_text[d]) for d in rows["doc_id"].to_pylist()]
        seg = segment_cluster(cid, cluster, scfg, t5)
        want_p = passages.filter(pc.equal(passages["cluster_id"], cid)).to_pylist()
        got_p = [{k: getattr(p, k) for k in PASSAGES.schema.names} for p in seg.passages]
        assert got_p == want_p
        want_u = units.filter(pc.equal(units["cluster_id"], cid)).to_pylist()
        got_u = [{"unit_id": u.unit_id, "cluster_id": u.cluster_id, "position": u.position, "n_tokens": u.n_tokens,
                  "n_passages": len(u.passages), "title": u.title} for u in seg.units]
        assert got_u == want_u
