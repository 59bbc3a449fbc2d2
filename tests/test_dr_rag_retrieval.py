"""DR-RAG retrievers (BM25, SM on the real MiniLM), QDC rankings and the Table 5 metrics."""
from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from data_contracts import dr_rag as C
from funnelrag.datasets import resolve
from tasks.dr_rag.collection import Question, build_collection
from tasks.dr_rag.evaluate import (EvalConfig, compute_rankings, rankings_from_table, rankings_table,
                                   select_all, selections_table, table5, table5_wide)
from tasks.dr_rag.retrieval import BM25Retriever, SMRetriever, concat_query, encoder_fn
from tasks.dr_rag.selection import Selected
from tasks.dr_rag.hotpotqa import load_hotpotqa


@pytest.fixture(scope="module")
def small(data_mirror):
    records = load_hotpotqa(resolve("hotpotqa-dev-subsampled", data_mirror))[:4]
    return build_collection(records)


@pytest.fixture(scope="module")
def retrievers(small):
    from models.encoders import BiEncoder, EncoderConfig, encode

    coll, _ = small
    model, tok = BiEncoder.from_pretrained(EncoderConfig(max_length=64))
    emb = encode(model, tok, coll.retrieval_texts())  # (n_docs, 384)
    return {"bm25": BM25Retriever.build(coll), "sm": SMRetriever(emb, coll.ids, encoder_fn(model, tok))}


@pytest.mark.slow  # the real MiniLM encoder (module fixture)
def test_retrievers_find_a_paragraph_from_its_own_text(small, retrievers):
    coll, _ = small
    texts = coll.retrieval_texts()
    for name, r in retrievers.items():
        ranked = r.search([texts[0], texts[7]], k=5)
        assert [row[0] for row in ranked] == [coll.ids[0], coll.ids[7]], name
        assert all(len(row) == 5 and len(set(row)) == 5 for row in ranked)
        assert len(r.search(["x"], k=10_000)[0]) == len(coll)


def test_sm_ties_are_broken_by_row():
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
    r = SMRetriever(emb, ["d0", "d1", "d2", "d3"], lambda texts: torch.tensor([[1.0, 0.0]] * len(texts)))
    assert r.search(["q"], 4) == [["d0", "d2", "d3", "d1"]]
    with pytest.raises(ValueError):
        SMRetriever(emb, ["d0"], None)


def test_concat_query_puts_the_question_first():
    assert concat_query("Who?", "Title", "Body.") == "Who? Title: Body."


@pytest.mark.slow  # the real MiniLM encoder (module fixture)
def test_rankings_qdc_and_roundtrip(small, retrievers):
    coll, questions = small
    cfg = EvalConfig(top_ks=(3, 4), max_candidates=2)
    rk = compute_rankings(questions, coll, retrievers, cfg)
    for q in questions:
        d1 = rk.first["sm"][q.question_id][:cfg.max_k1()]
        assert list(rk.second[q.question_id]) == d1
        assert all(len(v) == cfg.second_depth() for v in rk.second[q.question_id].values())
        assert len(rk.first["bm25"][q.question_id]) == 4
    table = C.RANKINGS.validate(rankings_table(rk))
    assert rankings_from_table(table, "sm") == rk
    sel = select_all(questions, rk, None, cfg)
    assert set(sel) == {(m, k) for m in ("bm25", "sm", "qdc") for k in (3, 4)}
    C.SELECTIONS.validate(selections_table(sel, questions))
    with pytest.raises(ValueError):
        select_all(questions, rk, None, EvalConfig(top_ks=(3, 4), base="bm25"))


def test_table5_recall_and_documents_kept():
    qs = [Question("q1", "?", ("s1", "s2"), ("s1", "s2", "n1")), Question("q2", "?", ("t1", "t2"), ("t1", "t2", "n2")),
          Question("q3", "?", (), ("n3",))]  # no supporting paragraph: left out
    sel = {("sm", 3): {"q1": [Selected("s1", 1), Selected("n1", 1), Selected("s2", 1)],
                       "q2": [Selected("n2", 1), Selected("t1", 1), Selected("x", 1)], "q3": [Selected("n3", 1)]},
           ("cfs", 3): {"q1": [Selected("s1", 1)], "q2": [Selected("t1", 1), Selected("t2", 2, "t1", 0.9)]}}
    rows = table5(sel, qs)
    assert [(r["method"], r["k"]) for r in rows] == [("sm", 3), ("cfs", 3)]
    sm, cfs = rows
    assert sm["recall"] == pytest.approx((1.0 + 0.5) / 2) and sm["all_supporting"] == 0.5
    assert sm["mean_docs"] == 3.0 and sm["n_questions"] == 2
    assert cfs["recall"] == pytest.approx((0.5 + 1.0) / 2) and cfs["mean_docs"] == 1.5
    wide = table5_wide(rows)
    assert wide[0] == {"method": "SM", "R@3": 0.75, "docs@3": 3.0}
    C.TABLE5.validate(pa.table({c: [r[c] for r in rows] for c in rows[0]}))


def test_eval_config_validation():
    with pytest.raises(ValueError):
        EvalConfig(base="dense")
    with pytest.raises(ValueError):
        EvalConfig(top_ks=(3,), k1=4)
    assert EvalConfig(top_ks=(3, 6), max_candidates=2).second_depth() == 6 + 2 * 3
