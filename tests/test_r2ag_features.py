"""R²AG retrieval features (Eqs. 10–12) against hand-computed values, and their contract."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from data_contracts import r2ag as R
from data_contracts.base import ContractViolation
from tasks.r2ag.features import FeatureConfig, feature_columns, feature_table, retrieval_features
from tasks.r2ag.metrics import average_precision, ranking_metrics, recall_at

SQ2 = math.sqrt(2.0)


def test_cosine_features_match_hand_computation():
    q = np.array([1.0, 0.0, 0.0])
    d = np.array([[1.0, 0.0, 0.0],   # d1: same as the query
                  [0.0, 1.0, 0.0],   # d2: orthogonal
                  [1.0, 1.0, 0.0]])  # d3: 45 degrees from both
    x = retrieval_features(q, d, "cosine")
    # Eq. 10: r_i = cos(q, d_i)
    r = np.array([1.0, 0.0, 1 / SQ2])
    np.testing.assert_allclose(x[:, 0], r, atol=1e-12)
    # Eq. 11: w = softmax(r) over all k; gamma_1 = 0 (empty precedent sum)
    w = np.exp(r) / np.exp(r).sum()
    prec3 = w[0] * d[0] + w[1] * d[1]
    gamma3 = d[2] @ prec3 / (np.linalg.norm(d[2]) * np.linalg.norm(prec3))
    np.testing.assert_allclose(x[:, 1], [0.0, 0.0, gamma3], atol=1e-12)
    assert gamma3 == pytest.approx((w[0] + w[1]) / (SQ2 * math.hypot(w[0], w[1])))
    # Eq. 12: first = sim(d1, d2), middle = mean of both neighbours, last = sim(d2, d3)
    np.testing.assert_allclose(x[:, 2], [0.0, (0.0 + 1 / SQ2) / 2, 1 / SQ2], atol=1e-12)


def test_dot_product_features_use_softmax_weights_over_all_documents():
    q = np.array([2.0, 0.0])
    d = np.array([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 1.0]])
    x = retrieval_features(q, d, "dot")
    r = np.array([2.0, 0.0, 2.0, 0.0])
    np.testing.assert_allclose(x[:, 0], r)
    w = np.exp(r) / np.exp(r).sum()  # normalised over all four documents, not the precedents only
    gamma = [0.0, d[1] @ (w[0] * d[0]), d[2] @ (w[0] * d[0] + w[1] * d[1]),
             d[3] @ (w[0] * d[0] + w[1] * d[1] + w[2] * d[2])]
    np.testing.assert_allclose(x[:, 1], gamma, atol=1e-12)
    adj = [d[0] @ d[1], d[1] @ d[2], d[2] @ d[3]]  # 0, 3, 1
    np.testing.assert_allclose(x[:, 2], [adj[0], (adj[0] + adj[1]) / 2, (adj[1] + adj[2]) / 2, adj[2]])


def test_two_and_one_document_lists():
    q = np.array([0.0, 1.0])
    d2 = np.array([[0.0, 2.0], [1.0, 1.0]])
    x = retrieval_features(q, d2)
    np.testing.assert_allclose(x[:, 0], [1.0, 1 / SQ2])
    np.testing.assert_allclose(x[:, 1], [0.0, 1 / SQ2])  # gamma_2 = cos(d2, w1 d1)
    np.testing.assert_allclose(x[:, 2], [1 / SQ2, 1 / SQ2])  # first and last cases of Eq. 12
    x1 = retrieval_features(q, d2[:1])
    np.testing.assert_allclose(x1, [[1.0, 0.0, 0.0]])  # no precedent, no neighbour


def test_zero_vector_and_bad_shapes():
    x = retrieval_features(np.zeros(3), np.eye(3)[:2])
    assert np.all(np.isfinite(x)) and np.all(x[:, 0] == 0.0)
    with pytest.raises(ValueError, match="k, dim"):
        retrieval_features(np.ones(3), np.ones((2, 4)))
    with pytest.raises(ValueError, match="at least one"):
        retrieval_features(np.ones(3), np.ones((0, 3)))
    with pytest.raises(ValueError, match="similarity"):
        FeatureConfig(similarity="l2")


def _lists(rows: list[tuple[str, int, int]]) -> pa.Table:
    n = len(rows)
    return pa.table({
        "query_id": [r[0] for r in rows], "question": ["q?"] * n, "answers": [["a"]] * n,
        "rank": pa.array([r[1] for r in rows], pa.int16()), "doc_id": [f"{r[0]}-{r[1]}" for r in rows],
        "title": ["t"] * n, "text": ["x"] * n, "retriever_score": pa.array([0.0] * n, pa.float32()),
        "label": pa.array([r[2] for r in rows], pa.int8()),
    })


def test_feature_table_orders_each_list_by_rank():
    # rows of list "b" arrive out of rank order; features must follow the rank, not the row order
    lists = _lists([("b", 1, 0), ("a", 0, 1), ("b", 0, 1), ("a", 1, 0), ("b", 2, 0)])
    rng = np.random.default_rng(0)
    q_emb = rng.normal(size=(2, 5))  # order of first appearance: b, a
    d_emb = rng.normal(size=(5, 5))
    table = feature_table(lists, q_emb, d_emb)
    assert table["query_id"].to_pylist() == ["b", "b", "b", "a", "a"]
    assert table["rank"].to_pylist() == [0, 1, 2, 0, 1]
    expected_b = retrieval_features(q_emb[0], d_emb[[2, 0, 4]])
    got_b = np.stack([table[c].to_numpy()[:3] for c in ("relevance", "precedent_similarity", "neighbor_similarity")], 1)
    np.testing.assert_allclose(got_b, expected_b, rtol=1e-6, atol=1e-6)
    assert table["label"].to_pylist() == [1, 0, 0, 1, 0]


def test_contract_rejects_rank_gaps_and_bad_labels():
    with pytest.raises(ContractViolation, match="0..k-1"):
        R.RANKED_LISTS.validate(_lists([("a", 0, 1), ("a", 2, 0)]))
    with pytest.raises(ContractViolation, match="label"):
        R.RANKED_LISTS.validate(_lists([("a", 0, 2)]))
    with pytest.raises(ValueError, match="query embeddings"):
        feature_table(_lists([("a", 0, 1)]), np.ones((2, 3)), np.ones((1, 3)))


def test_feature_columns_for_ablations():
    assert feature_columns(["relevance", "neighbor_similarity"]) == [0, 2]
    with pytest.raises(ValueError, match="unknown"):
        feature_columns(["relevance", "bm25"])
    with pytest.raises(ValueError, match="at least one"):
        feature_columns([])


def test_ranking_metrics_by_hand():
    labels = np.array([0, 1, 0, 1])
    assert average_precision(labels) == pytest.approx((1 / 2 + 2 / 4) / 2)
    assert recall_at(labels, 1) == 0.0 and recall_at(labels, 2) == 0.5
    # scores that put both relevant documents first give AP 1; a list without relevant is excluded
    m = ranking_metrics([labels, np.zeros(3)], [np.array([0.1, 0.9, 0.2, 0.8]), np.ones(3)], ks=(1, 2))
    assert m == {"map": 1.0, "recall@1": 0.5, "recall@2": 1.0, "n_lists": 1, "n_lists_without_relevant": 1}
    # retriever order (scores None) keeps the given order; ties keep the retriever order too
    assert ranking_metrics([labels], None, ks=(1,))["map"] == pytest.approx(0.5)
    assert ranking_metrics([labels], [np.zeros(4)], ks=(1,))["map"] == pytest.approx(0.5)
