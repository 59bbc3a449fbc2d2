"""The fused unit pre-ranker (BM25 + MaxP dense) on a tiny hand-made corpus, against a hand
computation: every number below is worked out in the comments, not read off the code."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.corpus.index import BM25Index
from tasks.evaluate.retrieval import ProgressiveSetting
from tasks.funnel.embeddings import EmbeddingIndex
from tasks.funnel.fusion import FusionConfig, PassageBM25, fuse, fuse_passages, min_max, pool_bm25, ranks
from tasks.funnel.stored import bm25_shortlist, rank_units_stored

# Six passages of two tokens each (so every passage has the average length and BM25's length
# normalisation is 1), three units, two clusters. Question "Zebra and the tiger?" → tokens
# [zebra, tiger] ("and", "the" are stop words).
TEXTS = ["zebra zebra", "moon river", "tiger lamp", "cloud stone", "zebra tiger", "grass field"]
PIDS = [f"p{i}" for i in range(6)]
UNITS = ["A", "A", "B", "B", "C", "C"]
CLUSTERS = [0, 0, 0, 0, 1, 1]
DENSE = [0.2, 0.5, 0.9, 0.1, 0.6, 0.3]   # E(q)·E(p) with E(q) = (1, 0), E(p) = (s, √(1 − s²))
QUESTION = "Zebra and the tiger?"

# BM25 (bm25s "lucene", k1 = 0.9, b = 0.4): idf = ln(1 + (N − df + 0.5) / (df + 0.5)), N = 6,
# df(zebra) = df(tiger) = 2 → idf = ln(1 + 4.5 / 2.5) = ln 2.8 = 1.0296194; term score
# tf / (tf + k1) at average length: tf = 1 → 1 / 1.9 = 0.5263158, tf = 2 → 2 / 2.9 = 0.6896552.
IDF = math.log(2.8)
BM25 = [IDF * 2 / 2.9,          # p0 "zebra zebra": 0.7100824
        0.0,
        IDF / 1.9,              # p2 "tiger lamp": 0.5419050
        0.0,
        2 * IDF / 1.9,          # p4 "zebra tiger": 1.0838099
        0.0]


@pytest.fixture(scope="module")
def corpus():
    vectors = np.asarray([[s, math.sqrt(1 - s * s)] for s in DENSE], np.float32)
    index = EmbeddingIndex(PIDS, UNITS, np.asarray(CLUSTERS), vectors)
    bm25 = BM25Index.build(TEXTS, PIDS)
    return index, bm25


def test_passage_bm25_equals_the_hand_computation_and_the_flat_index(corpus):
    index, bm25 = corpus
    assert [round(x, 7) for x in BM25] == [0.7100824, 0.0, 0.541905, 0.0, 1.0838099, 0.0]
    scores = PassageBM25(bm25, PIDS).scores(QUESTION, np.arange(6))
    np.testing.assert_allclose(scores, BM25, rtol=1e-6)
    # exactly the scores flat BM25 ranks the whole corpus by
    tokens = [t for t in bm25.tokenize([QUESTION])[0] if t in bm25.retriever.vocab_dict]
    np.testing.assert_array_equal(scores, bm25.retriever.get_scores(tokens))
    # a subset, in another order, through another id order (an embedding index need not share the BM25 rows)
    shuffled = PassageBM25(bm25, PIDS[::-1])
    np.testing.assert_array_equal(shuffled.scores(QUESTION, np.asarray([1, 5, 0])), scores[[4, 0, 5]])
    assert shuffled.scores(QUESTION, np.zeros(0, np.int64)).shape == (0,)
    with pytest.raises(KeyError, match="p9"):
        PassageBM25(bm25, ["p0", "p9"])
    # the ids of a memory-mapped embedding index (Arrow-backed), in the BM25 order or not
    import pyarrow as pa

    from tasks.funnel.embeddings import _ArrowStrings
    np.testing.assert_array_equal(PassageBM25(bm25, _ArrowStrings(pa.array(PIDS))).scores(QUESTION, np.arange(6)), scores)
    np.testing.assert_array_equal(PassageBM25(bm25, _ArrowStrings(pa.array(PIDS[::-1]))).scores(QUESTION, np.arange(6)),
                                  scores[::-1])


def test_fused_unit_scores_and_ranking_equal_the_hand_computation(corpus):
    index, bm25 = corpus
    q = np.asarray([1.0, 0.0], np.float32)
    passage_bm25 = PassageBM25(bm25, index.passage_ids)

    def ranking(cfg: FusionConfig):
        return rank_units_stored(q, index, [0, 1], lambda rows: passage_bm25.scores(QUESTION, rows), cfg)

    # MaxP alone: A = max(0.2, 0.5) = 0.5, B = max(0.9, 0.1) = 0.9, C = max(0.6, 0.3) = 0.6 → B, C, A
    maxp = rank_units_stored(q, index, [0, 1])
    assert maxp.unit_ids == ["B", "C", "A"]
    np.testing.assert_allclose(maxp.unit_scores, [0.9, 0.6, 0.5], atol=1e-6)

    # unit BM25 (max): A 0.7100824, B 0.5419050, C 1.0838099; min-max over the three units:
    # BM25 A (0.7100824 − 0.5419050) / 0.5419050 = 0.3103448, B 0, C 1;
    # dense A (0.5 − 0.5) / 0.4 = 0, B 1, C (0.6 − 0.5) / 0.4 = 0.25
    # convex w = 0.5: A 0.5·0.3103448 = 0.1551724, B 0.5·1 = 0.5, C 0.5·1 + 0.5·0.25 = 0.625 → C, B, A
    r = ranking(FusionConfig("convex", 0.5))
    assert r.unit_ids == ["C", "B", "A"]
    np.testing.assert_allclose(r.unit_scores, [0.625, 0.5, 0.1551724], atol=1e-6)
    # convex w = 0.8: A 0.8·0.3103448 = 0.2482759, B 0.2·1 = 0.2, C 0.8 + 0.2·0.25 = 0.85 → C, A, B
    r = ranking(FusionConfig("convex", 0.8))
    assert r.unit_ids == ["C", "A", "B"]
    np.testing.assert_allclose(r.unit_scores, [0.85, 0.2482759, 0.2], atol=1e-6)
    # convex w = 0 is MaxP's order (dense min-max is monotone): B, C, A
    assert ranking(FusionConfig("convex", 0.0)).unit_ids == ["B", "C", "A"]

    # RRF k = 60, w = 0.5: BM25 ranks C 1, A 2, B 3; dense ranks B 1, C 2, A 3
    # A 0.5/62 + 0.5/63 = 0.0160010, B 0.5/63 + 0.5/61 = 0.0161332, C 0.5/61 + 0.5/62 = 0.0162612 → C, B, A
    r = ranking(FusionConfig("rrf", 0.5, rrf_k=60))
    assert r.unit_ids == ["C", "B", "A"]
    np.testing.assert_allclose(r.unit_scores, [0.0162612, 0.0161332, 0.0160010], atol=1e-7)
    # RRF k = 1, w = 0.5: A 0.5/3 + 0.5/4 = 0.2916667, B 0.5/4 + 0.5/2 = 0.375, C 0.5/2 + 0.5/3 = 0.4166667
    r = ranking(FusionConfig("rrf", 0.5, rrf_k=1))
    np.testing.assert_allclose(r.unit_scores, [0.4166667, 0.375, 0.2916667], atol=1e-7)

    # the final passages are still the best dense passages of the top-N units: top 2 units C, B
    # → passages p2 (0.9), p4 (0.6), p5 (0.3), p3 (0.1)
    r = ranking(FusionConfig("convex", 0.5))
    assert [index.passage_ids[row] for row, _ in r.top_passages(index, 2, 3)] == ["p2", "p4", "p5"]


def test_final_passages_fused_with_bm25_equal_the_hand_computation(corpus):
    index, bm25 = corpus
    q = np.asarray([1.0, 0.0], np.float32)
    passage_bm25 = PassageBM25(bm25, index.passage_ids)
    bm25_of = lambda rows: passage_bm25.scores(QUESTION, rows)   # noqa: E731
    r = rank_units_stored(q, index, [0, 1])                      # MaxP: B, C, A
    top = lambda n_units, n_final, w: [index.passage_ids[row] for row, _ in   # noqa: E731
                                       r.top_passages(index, n_units, n_final, bm25_of, w)]
    # top 2 units B, C → passages p2, p3, p4, p5 (row order); dense 0.9, 0.1, 0.6, 0.3 → min-max
    # 1, 0, 0.625, 0.25; BM25 0.5419050, 0, 1.0838099, 0 → min-max 0.5, 0, 1, 0
    # w = 0.5: p2 0.75, p3 0, p4 0.8125, p5 0.125 → p4, p2, p5
    assert top(2, 3, 0.5) == ["p4", "p2", "p5"]
    got = r.top_passages(index, 2, 4, bm25_of, 0.5)
    np.testing.assert_allclose([s for _, s in got], [0.8125, 0.75, 0.125, 0.0], atol=1e-6)
    # w = 0.2: p2 0.1 + 0.8 = 0.9, p4 0.2 + 0.5 = 0.7 → p2 first; w = 0: the dense order
    assert top(2, 2, 0.2) == ["p2", "p4"] and top(2, 3, 0.0) == ["p2", "p4", "p5"]
    # w = 1: BM25 alone, ties (p3, p5 at 0) by row
    assert top(2, 4, 1.0) == ["p4", "p2", "p3", "p5"]
    # only the top-N units' passages compete: N = 1 (unit B) → p2, p3 whatever the weight
    assert top(1, 4, 1.0) == ["p2", "p3"]
    # with a unit fusion, the passages' BM25 scores it read are reused (one scoring a question)
    calls = []
    counted = lambda rows: calls.append(len(rows)) or bm25_of(rows)   # noqa: E731
    fused = rank_units_stored(q, index, [0, 1], counted, FusionConfig("convex", 0.5))    # C, B, A
    got = fused.top_passages(index, 2, 4, counted, 0.5)
    # units C, B → p2, p3, p4, p5: the same passages and fused scores as above
    assert [index.passage_ids[row] for row, _ in got] == ["p4", "p2", "p5", "p3"] and calls == [6]
    np.testing.assert_allclose([s for _, s in got], [0.8125, 0.75, 0.125, 0.0], atol=1e-6)
    np.testing.assert_allclose(fuse_passages(np.asarray([0.9, 0.1]), np.asarray([0.0, 2.0]), 0.25), [0.75, 0.25])
    with pytest.raises(ValueError, match="BM25 scores"):
        r.top_passages(index, 2, 3, None, 0.5)
    with pytest.raises(ValueError, match="bm25_weight"):
        fuse_passages(np.zeros(2), np.zeros(2), 1.5)
    with pytest.raises(ValueError, match="dense and"):
        fuse_passages(np.zeros(2), np.zeros(3), 0.5)
    with pytest.raises(ValueError, match="passage_bm25_weight needs vectors='stored'"):
        ProgressiveSetting(n_clusters=3, passage_bm25_weight=0.5)
    setting = ProgressiveSetting(n_clusters=3, vectors="stored", passage_bm25_weight=0.3)
    assert setting.uses_bm25 and setting.label() == "pw0.3" and not ProgressiveSetting().uses_bm25
    assert ProgressiveSetting(vectors="stored", fusion="convex", bm25_weight=0.9, passage_bm25_weight=0.3).label() \
        == "convex-w0.9-max-pw0.3"


def test_bm25_shortlist_ranks_units_and_passages_as_the_hand_computation(corpus):
    index, bm25 = corpus
    q = np.asarray([1.0, 0.0], np.float32)
    passage_bm25 = PassageBM25(bm25, index.passage_ids)
    calls = []

    def bm25_of(rows):
        calls.append(len(rows))
        return passage_bm25.scores(QUESTION, rows)

    def shortlisted(m: int):
        return rank_units_stored(q, index, [0, 1], bm25_of, shortlist=m)

    # BM25 p4 1.0838 > p0 0.7101 > p2 0.5419 > p1 = p3 = p5 = 0 (ties by row: p1, p3, p5)
    # M = 2 → p0, p4: A = 0.2 (p0), C = 0.6 (p4); B has no shortlisted passage and drops out → C, A
    r = shortlisted(2)
    assert r.unit_ids == ["C", "A"] and r.passage_rows.tolist() == [0, 4] and calls == [6]
    np.testing.assert_allclose(r.unit_scores, [0.6, 0.2], atol=1e-6)
    assert r.all_rows.tolist() == [0, 1, 2, 3, 4, 5]          # the clusters' answer recall reads every row
    assert [index.passage_ids[row] for row, _ in r.top_passages(index, 2, 2)] == ["p4", "p0"]
    # M = 3 adds p2: B = 0.9 → B, C, A; the top 2 units' shortlisted passages p2 (0.9), p4 (0.6)
    r = shortlisted(3)
    assert r.unit_ids == ["B", "C", "A"] and r.passage_rows.tolist() == [0, 2, 4]
    assert [index.passage_ids[row] for row, _ in r.top_passages(index, 2, 3)] == ["p2", "p4"]
    # M = 4 adds p1 (the first zero by row): A = max(0.2, 0.5) = 0.5; M = 6 is MaxP over every passage
    np.testing.assert_allclose(shortlisted(4).unit_scores, [0.9, 0.6, 0.5], atol=1e-6)
    full, maxp = shortlisted(6), rank_units_stored(q, index, [0, 1])
    assert full.unit_ids == maxp.unit_ids and full.passage_rows.tolist() == maxp.passage_rows.tolist()
    assert maxp.cluster_rows is None and maxp.all_rows is maxp.passage_rows
    # cluster 1 alone (p4, p5), M = 1 → p4, unit C
    assert rank_units_stored(q, index, [1], bm25_of, shortlist=1).unit_ids == ["C"]
    assert bm25_shortlist(np.asarray([0.5, 2.0, 0.5, 1.0]), np.asarray([9, 4, 3, 7]), 3).tolist() == [1, 3, 2]
    with pytest.raises(ValueError, match="BM25 scores"):
        rank_units_stored(q, index, [0, 1], None, shortlist=2)
    with pytest.raises(ValueError, match="shortlist must be"):
        rank_units_stored(q, index, [0, 1], bm25_of, shortlist=-1)
    with pytest.raises(ValueError, match="size 0"):
        bm25_shortlist(np.zeros(2), np.arange(2), 0)
    with pytest.raises(ValueError, match="passage_shortlist needs"):
        ProgressiveSetting(n_clusters=3, passage_shortlist=50)
    with pytest.raises(ValueError, match="passage_shortlist needs"):
        ProgressiveSetting(n_clusters=3, vectors="stored", n_final=4, passage_shortlist=3)
    setting = ProgressiveSetting(n_clusters=3, vectors="stored", passage_shortlist=50)
    assert setting.uses_bm25 and setting.label() == "sl50"


@pytest.mark.parametrize("seed", range(5))
def test_with_maxp_units_and_dense_passages_n_units_beyond_n_final_changes_nothing(seed):
    """Why N was no lever for MaxP (docs/results/funnel.md): the best H dense passages lie in at
    most H units, and MaxP ranks exactly those units first, so any N >= H gives the same H passages."""
    rng = np.random.default_rng(seed)
    n = 60
    vectors = rng.normal(size=(n, 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    units = [f"u{int(u):02d}" for u in rng.integers(0, 15, n)]
    index = EmbeddingIndex([f"p{i}" for i in range(n)], units, rng.integers(0, 3, n), vectors)
    r = rank_units_stored(vectors[0], index, [0, 1, 2])
    every = r.top_passages(index, len(r.unit_ids), 4)
    assert all(r.top_passages(index, k, 4) == every for k in range(4, len(r.unit_ids) + 1))


def test_fusion_parts_by_hand():
    np.testing.assert_allclose(min_max(np.asarray([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_array_equal(min_max(np.asarray([7.0, 7.0])), [0.0, 0.0])      # no spread: all zero
    assert ranks(np.asarray([0.3, 0.7, 0.3]), ["b", "c", "a"]).tolist() == [3, 1, 2]   # tie → name asc
    scores, groups = np.asarray([1.0, 2.0, 4.0, 0.5]), np.asarray([0, 0, 1, 1])
    assert pool_bm25(scores, groups, 2, "max").tolist() == [2.0, 4.0]
    assert pool_bm25(scores, groups, 2, "sum").tolist() == [3.0, 4.5]
    names = ["u", "v"]
    np.testing.assert_array_equal(fuse(np.asarray([0.1, 0.2]), np.asarray([5.0, 1.0]), names, FusionConfig()), [0.1, 0.2])
    with pytest.raises(ValueError, match="2 units"):
        fuse(np.zeros(3), np.zeros(3), names, FusionConfig("convex"))


def test_bad_fusion_settings_are_refused(corpus):
    index, _ = corpus
    with pytest.raises(ValueError, match="fusion method"):
        FusionConfig("sum")
    with pytest.raises(ValueError, match="bm25_weight"):
        FusionConfig("convex", 1.5)
    with pytest.raises(ValueError, match="needs vectors='stored'"):
        ProgressiveSetting(n_clusters=3, fusion="convex")
    with pytest.raises(ValueError, match="BM25 scores"):
        rank_units_stored(np.asarray([1.0, 0.0], np.float32), index, [0], None, FusionConfig("rrf"))
    setting = ProgressiveSetting(n_clusters=3, vectors="stored", fusion="rrf", bm25_weight=0.5, rrf_k=60)
    assert setting.label() == "rrf-w0.5-k60-max" and ProgressiveSetting().label() == ""


def test_the_validation_part_is_the_experiments_and_never_its_held_out_part(tmp_path):
    from tasks.evaluate.stages import validation_part
    from tasks.funnel.experiment_validation import ValidationConfig
    from tasks.qa.questions import QuestionsConfig, load_questions, split_of

    path = tmp_path / "q.tsv"
    path.write_text("".join(f"question number {i}\t[\"a{i}\"]\n" for i in range(400)))
    table, _ = load_questions([path], QuestionsConfig())
    part = validation_part(table)
    texts = part["question"].to_pylist()
    expected = [f"question number {i}" for i in range(400)
                if split_of(f"question number {i}", 0, 0.2) == "train" and split_of(f"question number {i}", 1, 0.2) == "dev"]
    assert texts == expected and 30 < len(texts) < 100         # ≈ 400 · 0.8 · 0.2 = 64
    assert len(validation_part(table, ValidationConfig(fraction=0.5))) > len(texts)
    with pytest.raises(KeyError, match="split"):
        validation_part(table.drop_columns(["split"]))


def test_the_shipped_configs_load_with_their_fusions():
    from funnelrag.config import load_config
    from flows.evaluate import EvaluateConfig

    sweep = load_config(EvaluateConfig, "configs/fusion_validation_cpu.yaml")
    assert sweep.questions.part == "validation" and sweep.questions.datasets == ["nq-open-dev"]
    for name in ("units_validation_cpu.yaml", "passage_fusion_validation_cpu.yaml",
                 "clusters_validation_cpu.yaml"):   # sweeps: never on test
        other = load_config(EvaluateConfig, f"configs/{name}")
        assert other.questions.part == "validation" and other.questions.datasets == ["nq-open-dev"], name
    passages = load_config(EvaluateConfig, "configs/passage_fusion_validation_cpu.yaml")
    assert [s.passage_bm25_weight for s in passages.progressive] == [0.0, *(w / 10 for w in range(1, 10))]
    assert {s.fusion for s in sweep.progressive} == {"none", "convex", "rrf"}
    table = load_config(EvaluateConfig, "configs/evaluate_wikispeedia_cpu.yaml")
    assert table.questions.part == "all" and table.questions.datasets == ["nq-open-test"]
    assert [s.fusion for s in table.progressive] == ["none", "convex", "none", "none", "none", "none"]   # MaxP beside
    chosen = table.progressive[1]
    assert chosen in sweep.progressive and chosen.label() == "convex-w0.9-max"   # one of the swept settings
    assert table.progressive[2] in passages.progressive and table.progressive[2].label() == "pw0.1"
    clusters = load_config(EvaluateConfig, "configs/clusters_validation_cpu.yaml")   # K: MaxP, N = 8, stored
    assert [s.n_clusters for s in clusters.progressive] == [3, 5, 8, 12, 20, 32]
    assert {(s.fusion, s.n_units, s.n_final, s.vectors, s.passage_bm25_weight) for s in clusters.progressive} == {
        ("none", 8, 4, "stored", 0.0)}
    assert table.progressive[3] in clusters.progressive and table.progressive[3].n_clusters == 32   # the chosen K
    shortlists = load_config(EvaluateConfig, "configs/shortlist_validation_cpu.yaml")   # (K, M), MaxP baseline
    assert shortlists.questions.part == "validation" and shortlists.questions.datasets == ["nq-open-dev"]
    assert [(s.n_clusters, s.passage_shortlist) for s in shortlists.progressive] == [
        (3, 0), *((k, m) for k in (3, 8, 32) for m in (20, 50, 100))]
    assert table.progressive[4] in shortlists.progressive and table.progressive[4].label() == "sl20"   # the chosen (K, M)
    sizes = load_config(EvaluateConfig, "configs/shortlist_size_validation_cpu.yaml")   # (K, M) again, 600 questions
    assert sizes.questions.part == "validation" and sizes.questions.datasets == ["nq-open-dev"]
    assert sizes.questions.limit == 2 * shortlists.questions.limit and sizes.questions.seed == shortlists.questions.seed
    assert [(s.n_clusters, s.passage_shortlist) for s in sizes.progressive] == [(32, 20), (32, 50), (64, 20), (64, 50)]
    assert table.progressive[5] in sizes.progressive and (table.progressive[5].n_clusters,
                                                          table.progressive[5].passage_shortlist) == (64, 20)
