"""Whole-unit (MaxP) pre-ranking, the passage embedding index, and progressive retrieval from
stored vectors, on a real mini corpus (NQ-open oracle gold passages, 3 articles per cluster)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle_corpus import oracle_clusters

from models.preranker import PreRankerConfig, build_preranker, score
from tasks.corpus.segment import SegmentConfig, segment_cluster, segments_to_tables
from tasks.corpus.tokenize import WhitespaceCounter
from tasks.funnel.candidates import CandidatesConfig, build_candidates
from tasks.funnel.embeddings import (
    EmbeddingConfig,
    EmbeddingIndexMismatch,
    build_embedding_index,
    embed_texts,
    ensure_embedding_index,
    model_version,
    open_embedding_index,
    passage_text,
    publish_embedding_index,
    store_root,
)
from tasks.corpus.index import BM25Index
from tasks.evaluate.retrieval import LabeledPreRanker
from tasks.evaluate.stored_retrieval import fill_lazy_rows
from tasks.funnel.fusion import PassageBM25
from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex
from tasks.funnel.stored import rank_units_stored
from tasks.funnel.unit_scoring import group_max
from tasks.qa.questions import QuestionsConfig, load_questions

N_RECORDS = 24
SEG = SegmentConfig(passage_words=30, unit_max_tokens=70, tokenizer="whitespace")
N_Q = 6


@pytest.fixture(scope="module")
def mini(data_mirror):
    path, clusters, index = oracle_clusters(data_mirror, N_RECORDS)
    questions, _ = load_questions([path], QuestionsConfig(limit=N_Q))
    segs = [segment_cluster(c, clusters[c], SEG, WhitespaceCounter()) for c in sorted(clusters)]
    _, passages = segments_to_tables(segs)
    model, tok = build_preranker(PreRankerConfig(kind="bi", max_length=64))
    return {"questions": questions, "clusters": clusters, "index": index, "passages": passages,
            "members_of": lambda ids: {c: clusters[c] for c in ids}, "model": model, "tok": tok}


def _maxp_candidates(mini, model, tok, n_clusters=3):
    cfg = CandidatesConfig(n_clusters=n_clusters, n_units=2, batch_size=8, unit_scoring="maxp")
    return build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(),
                            model, tok, cfg)


def test_group_max_is_the_maximum_per_group():
    rng = np.random.default_rng(0)
    scores, groups = rng.normal(size=50).astype(np.float32), rng.integers(0, 7, size=50)
    expected = [max((s for s, g in zip(scores, groups) if g == k), default=-np.inf) for k in range(8)]
    np.testing.assert_array_equal(group_max(scores, groups, 8), np.asarray(expected, np.float32))


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_maxp_scores_equal_a_brute_force_reference(mini, kind, one_torch_thread):
    model, tok = (mini["model"], mini["tok"]) if kind == "bi" else build_preranker(PreRankerConfig(kind="cross", max_length=64))
    cs = _maxp_candidates(mini, model, tok, n_clusters=2)
    text = {q: t for q, t in zip(mini["questions"]["question_id"].to_pylist(), mini["questions"]["question"].to_pylist())}
    passages = {}
    for seg in (segment_cluster(c, mini["clusters"][c], SEG, WhitespaceCounter()) for c in mini["clusters"]):
        for u in seg.units:
            passages[u.unit_id] = [(p.passage_id, passage_text(p.title, p.text)) for p in u.passages]
    pool = cs.unit_pool.to_pylist()
    assert pool and all(len(passages[r["unit_id"]]) >= 1 for r in pool)
    tol = 1e-5 if kind == "bi" else 1e-4
    for r in pool:
        one_by_one = [float(score(model, tok, text[r["question_id"]], [t])[0]) for _, t in passages[r["unit_id"]]]
        assert r["prerank_score"] == pytest.approx(max(one_by_one), abs=tol)        # MaxP = max over its passages
        for (pid, _), s in zip(passages[r["unit_id"]], one_by_one):
            assert cs.passage_scores[(r["question_id"], pid)] == pytest.approx(s, abs=tol)


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_stored_vectors_equal_on_the_fly_encoding(mini, one_torch_thread):
    model, tok, passages = mini["model"], mini["tok"], mini["passages"]
    index, info = build_embedding_index(passages, model, tok, "digest-a", EmbeddingConfig(batch_size=5, shard_rows=7))
    assert info["passages"] == passages.num_rows and index.meta["max_length"] == 64
    with torch.no_grad():
        for j in range(0, passages.num_rows, 5):
            text = passage_text(passages["title"][j].as_py(), passages["text"][j].as_py())
            enc = tok([text], truncation=True, max_length=64, return_tensors="pt")
            one = model.encoder(enc["input_ids"], enc["attention_mask"]).embeddings[0].numpy()   # (dim,)
            np.testing.assert_allclose(index.vectors[j], one, atol=1e-5)


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_index_is_published_reused_and_rejected_on_mismatch(mini, tmp_path, one_torch_thread):
    model, tok, passages = mini["model"], mini["tok"], mini["passages"]
    index, info = ensure_embedding_index(tmp_path / "stores", tmp_path / "cache", "mini", "digest-a", passages,
                                         model, tok, EmbeddingConfig(batch_size=16, shard_rows=10))
    assert not info["cache_hit"] and info["embedded"] == passages.num_rows
    assert list((tmp_path / "cache" / "embed-vectors").glob("*/seg-*/digests.json"))   # kept by content for the next version
    again, info2 = ensure_embedding_index(tmp_path / "stores", tmp_path / "cache", "mini", "digest-a", passages,
                                          model, tok, build=False)
    assert info2["cache_hit"] and info2["version"] == info["version"]
    np.testing.assert_array_equal(again.vectors, index.vectors)
    assert again.passage_ids == passages["passage_id"].to_pylist()
    root = store_root(tmp_path / "stores", "mini", model_version(model))
    with pytest.raises(EmbeddingIndexMismatch, match="corpus_digest"):
        open_embedding_index(root, "digest-b", model_version(model))
    with pytest.raises(EmbeddingIndexMismatch, match="model_version"):
        open_embedding_index(root, "digest-a", "0" * 64)
    other, _ = build_preranker(PreRankerConfig(kind="bi", max_length=32))   # same weights, other input length
    assert model_version(other) != model_version(model)
    with torch.no_grad():
        changed, _ = build_preranker(PreRankerConfig(kind="bi", max_length=64))
        next(changed.parameters()).add_(1e-3)
    assert model_version(changed) != model_version(model)
    with pytest.raises(FileNotFoundError):
        ensure_embedding_index(tmp_path / "stores", tmp_path / "cache", "mini", "digest-a", passages, changed, tok,
                               build=False)
    publish_embedding_index(root, index)                                     # a second version: current moves
    assert len(list((root / "versions").iterdir())) == 2


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_progressive_from_stored_vectors_ranks_as_on_the_fly(mini, one_torch_thread):
    model, tok = mini["model"], mini["tok"]
    cs = _maxp_candidates(mini, model, tok)
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    q_ids, q_text = mini["questions"]["question_id"].to_pylist(), mini["questions"]["question"].to_pylist()
    pool = cs.unit_pool.to_pylist()
    unit_of = dict(zip(mini["passages"]["passage_id"].to_pylist(), mini["passages"]["unit_id"].to_pylist()))
    ids, _ = mini["index"].search(q_text, 3)
    for qid, text, clusters in zip(q_ids, q_text, ids):
        ranking = rank_units_stored(embed_texts(model, tok, [text])[0], index, [int(c) for c in clusters])
        mine = sorted((r for r in pool if r["question_id"] == qid), key=lambda r: r["prerank_rank"])
        assert ranking.unit_ids == [r["unit_id"] for r in mine]
        np.testing.assert_allclose(ranking.unit_scores, [r["prerank_score"] for r in mine], atol=1e-5)
        for row, s in zip(ranking.passage_rows, ranking.passage_scores):
            assert cs.passage_scores[(qid, index.passage_ids[row])] == pytest.approx(float(s), abs=1e-5)
        top = ranking.top_passages(index, 2, 4)
        expected = sorted(((-s, pid) for (q, pid), s in cs.passage_scores.items()
                           if q == qid and unit_of[pid] in {r["unit_id"] for r in mine[:2]}))[:4]
        assert [index.passage_ids[r] for r, _ in top] == [pid for _, pid in expected]


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_lazy_index_fills_on_demand_and_persists(mini, tmp_path, one_torch_thread):
    model, tok, passages = mini["model"], mini["tok"], mini["passages"]
    full, _ = build_embedding_index(passages, model, tok, "digest-a")
    version = model_version(model)
    lazy = LazyEmbeddingIndex.open(tmp_path / "lazy", passages, "digest-a", version, full.dim, 64)
    rows = lazy.rows_of_clusters([1, 3])
    assert lazy.ensure(rows, model, tok) == len(rows) and lazy.ensure(rows, model, tok) == 0
    np.testing.assert_allclose(lazy.vectors[rows], full.vectors[rows], atol=1e-5)
    reopened = LazyEmbeddingIndex.open(tmp_path / "lazy", passages, "digest-a", version, full.dim, 64)
    assert reopened.n_filled == len(rows) and reopened.filled[rows].all()
    np.testing.assert_array_equal(reopened.vectors[rows], lazy.vectors[rows])
    other = LazyEmbeddingIndex.open(tmp_path / "lazy", passages, "digest-b", version, full.dim, 64)
    assert other.filled[rows].all() and other.meta["corpus_digest"] == "digest-b"   # kept by content, not version


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_a_shortlist_setting_fills_only_its_shortlisted_passages(mini, tmp_path, one_torch_thread):
    """With a BM25 shortlist the lazy fill embeds the M shortlisted passages of each question's K
    clusters, no other, and the shortlist ranks from them exactly as from the full index."""
    model, tok, passages = mini["model"], mini["tok"], mini["passages"]
    full, _ = build_embedding_index(passages, model, tok, "digest-a")
    lazy = LazyEmbeddingIndex.open(tmp_path / "lazy", passages, "digest-a", model_version(model), full.dim, 64)
    bm25 = PassageBM25(BM25Index.build([f"{t} {x}" for t, x in zip(passages["title"].to_pylist(),
                                                                       passages["text"].to_pylist())],
                                       passages["passage_id"].to_pylist()), full.passage_ids)
    questions = mini["questions"]["question"].to_pylist()
    k, m = 3, 4
    n, _ = fill_lazy_rows(lazy, questions, LabeledPreRanker("bi", model, tok, 8), mini["index"],
                          shortlists=[(k, m)], passage_bm25=bm25)
    ids, _ = mini["index"].search(questions, k)
    expected = set()
    for q, clusters in zip(questions, ids):
        rows = full.rows_of_clusters([int(c) for c in clusters])
        b = bm25.scores(q, rows)
        top = sorted(range(len(rows)), key=lambda j: (-float(b[j]), int(rows[j])))[:m]   # by hand
        expected |= {int(rows[j]) for j in top}
        query = embed_texts(model, tok, [q])[0]
        of = lambda rr, q=q: bm25.scores(q, rr)   # noqa: E731
        mine, ref = (rank_units_stored(query, ix, [int(c) for c in clusters], of, shortlist=m) for ix in (lazy, full))
        assert mine.unit_ids == ref.unit_ids
        (mine_top, ref_top) = (r.top_passages(ix, 2, 4) for r, ix in ((mine, lazy), (ref, full)))
        assert [r for r, _ in mine_top] == [r for r, _ in ref_top]      # rows alike; scores up to batching
        np.testing.assert_allclose([s for _, s in mine_top], [s for _, s in ref_top], atol=1e-5)
    assert 0 < len(expected) < len(passages) and n == len(expected)
    assert set(np.flatnonzero(lazy.filled).tolist()) == expected
    with pytest.raises(ValueError, match="passage_bm25"):
        fill_lazy_rows(lazy, questions, LabeledPreRanker("bi", model, tok, 8), mini["index"], shortlists=[(k, m)])


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_faiss_flat_dense_is_exact_and_approximate_kinds_recall(mini, one_torch_thread):
    from tasks.evaluate.flat_dense import FlatDenseConfig, build_faiss_index, faiss_retriever  # noqa: PLC0415
    from tasks.evaluate.retrieval import LabeledPreRanker  # noqa: PLC0415

    model, tok = mini["model"], mini["tok"]
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    retrieve = faiss_retriever(index, build_faiss_index(index.vectors), LabeledPreRanker("minilm", model, tok))
    for text in mini["questions"]["question"].to_pylist():
        scores = index.vectors @ embed_texts(model, tok, [text])[0]                     # (n,)
        expected = [index.passage_ids[i] for i in np.argsort(-scores, kind="stable")[:5]]
        assert retrieve(text, 5) == expected
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:50] + 0.1 * rng.normal(size=(50, 32)).astype(np.float32)
    truth = np.argsort(-(q @ x.T), axis=1)[:, :10]
    for cfg in (FlatDenseConfig(kind="hnsw"), FlatDenseConfig(kind="ivf", n_probe=32)):
        _, rows = build_faiss_index(x, cfg).search(q, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, truth)])
        assert recall >= 0.9, (cfg.kind, recall)
    with pytest.raises(ValueError, match="kind"):
        FlatDenseConfig(kind="lsh")


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_candidates_from_stored_vectors_equal_on_the_fly_maxp(mini, one_torch_thread):
    """``build_candidates(index=...)`` (the experiment's train pool) ranks units, keeps candidates
    and scores passages as the on-the-fly MaxP funnel, up to float rounding."""
    model, tok = mini["model"], mini["tok"]
    on_the_fly = _maxp_candidates(mini, model, tok)
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    cfg = CandidatesConfig(n_clusters=3, n_units=2, batch_size=8, unit_scoring="maxp")
    stored = build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(),
                              model, tok, cfg, index=index)
    for name in ("question_id", "unit_id", "prerank_rank", "has_answer", "cluster_id"):
        assert stored.unit_pool[name].to_pylist() == on_the_fly.unit_pool[name].to_pylist(), name
    np.testing.assert_allclose(stored.unit_pool["prerank_score"].to_numpy(),
                               on_the_fly.unit_pool["prerank_score"].to_numpy(), atol=1e-5)
    assert stored.candidates["passage_id"].to_pylist() == on_the_fly.candidates["passage_id"].to_pylist()
    assert stored.passage_scores.keys() == on_the_fly.passage_scores.keys()
    for key, s in on_the_fly.passage_scores.items():
        assert stored.passage_scores[key] == pytest.approx(s, abs=1e-5)
    with pytest.raises(ValueError, match="unit_scoring='maxp'"):
        build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(), model, tok,
                         CandidatesConfig(n_clusters=3, n_units=2, unit_scoring="first"), index=index)
    partial = build_embedding_index(mini["passages"].slice(1), model, tok, "digest-a")[0]
    with pytest.raises(KeyError, match="not in the embedding index"):
        build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(), model, tok,
                         cfg, index=partial)


@pytest.mark.slow  # the real MiniLM over the mini funnel (module fixture)
def test_mapped_layout_from_the_embedding_stage_ranks_as_the_table(mini, tmp_path, one_torch_thread):
    from tasks.funnel.embeddings import MappedEmbeddingIndex  # noqa: PLC0415  (only this test)

    model, tok, passages = mini["model"], mini["tok"], mini["passages"]
    table, _ = ensure_embedding_index(tmp_path / "a", tmp_path / "cache", "mini", "digest-a", passages, model, tok,
                                      EmbeddingConfig(batch_size=16))
    mapped, info = ensure_embedding_index(tmp_path / "b", tmp_path / "cache", "mini", "digest-a", passages, model, tok,
                                          EmbeddingConfig(batch_size=16, layout="mapped"))
    assert isinstance(mapped, MappedEmbeddingIndex) and not info["cache_hit"]
    again, info = ensure_embedding_index(tmp_path / "b", tmp_path / "cache", "mini", "digest-a", passages, model, tok,
                                         build=False)
    assert isinstance(again, MappedEmbeddingIndex) and info["cache_hit"]
    for text, clusters in zip(mini["questions"]["question"].to_pylist(), mini["index"].search(
            mini["questions"]["question"].to_pylist(), 3)[0]):
        q = embed_texts(model, tok, [text])[0]
        a, b = (rank_units_stored(q, ix, [int(c) for c in clusters]) for ix in (table, again))
        assert a.unit_ids == b.unit_ids
        np.testing.assert_array_equal(a.unit_scores, b.unit_scores)
        assert [table.passage_ids[r] for r, _ in a.top_passages(table, 2, 4)] == \
            [again.passage_ids[r] for r, _ in b.top_passages(again, 2, 4)]
