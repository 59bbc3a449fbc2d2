"""The evaluate flow end to end on a small real sample under the Prefect harness.

Corpus: the real Wikipedia gold passages of the first NQ-open oracle records, built and
published by the real ``corpus-build`` flow (JSONL path, whitespace tokens, short passages so a
document has several). Questions: those records' questions plus real NQ-open dev questions
(whose answers are not in this corpus). Reader: a scratch FiD registered in the temp
MLflow registry and loaded through ``models:/funnelrag-reader@champion``.
"""
from __future__ import annotations

import gzip
import json

import mlflow
import pyarrow.parquet as pq
import numpy as np
import pytest

from data_contracts.evaluation import EVAL_PER_QUESTION, EVAL_RESULTS, EVAL_STAGES
from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from flows.evaluate import EvaluateConfig, evaluate_flow
from funnelrag.datasets import resolve
from funnelrag.workspace import Workspace
from tasks.corpus.published import open_corpus
from tasks.qa.questions import has_answer

N_DOCS = 8
N_TEST = 2


@pytest.fixture(scope="module")
def evaluated(prefect_harness, data_mirror, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate-flow")
    home = tmp / "home"
    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(N_DOCS), fh)]
    docs, seen = [], set()
    for r in records:
        title = r["ctxs"][0]["title"]
        if title not in seen:
            seen.add(title)
            docs.append({"title": title, "text": r["ctxs"][0]["text"]})
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    with open(resolve("nq-open-dev", data_mirror), encoding="utf-8") as fh:  # disjoint from the oracle (test) set
        test_lines = [next(fh) for _ in range(N_TEST)]
    from tasks.qa.questions import _parse_tsv  # noqa: PLC0415 - the loader's own parser

    extra = [_parse_tsv(tmp, i, line.rstrip("\n")) for i, line in enumerate(test_lines, 1)]
    qs = [{"question": r["question"], "answers": r["answers"]} for r in records]
    qs += [{"question": q, "answers": a} for q, a in extra]
    (tmp / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    ws_cfg = {"home": home, "data_mirror": data_mirror}
    corpus_build_flow(CorpusBuildConfig.model_validate({
        "name": "oracle-mini", "source": {"datasets": [], "paths": [str(tmp / "corpus.jsonl")]},
        "ingest": {"format": "jsonl"}, "clustering": {"tokenizer": "whitespace"},
        "segment": {"tokenizer": "whitespace", "passage_words": 30, "unit_max_tokens": 70},
        "workspace": ws_cfg}))

    # a scratch FiD reader, registered as the champion reader
    from funnelrag.registry import register_model  # noqa: PLC0415
    from funnelrag.tracking import flow_run  # noqa: PLC0415
    from funnelrag.training import TrainConfig  # noqa: PLC0415
    from models.fid import FiDConfig, FiDReader  # noqa: PLC0415
    from tasks.funnel.reader import ReaderTrainConfig, save_reader  # noqa: PLC0415

    tok_dir = resolve("t5-tokenizer", data_mirror).parent
    fid_cfg = FiDConfig(tokenizer=str(tok_dir), d_model=64, n_layers=2, n_heads=2, d_ff=128)
    reader, rtok = FiDReader.from_config(fid_cfg)
    reader_dir = save_reader(reader, rtok, ReaderTrainConfig(fid=fid_cfg, train=TrainConfig(output_dir=str(tmp))),
                             tmp / "reader")
    with flow_run(Workspace(home), "train-reader", "reader", {}):
        register_model(reader_dir, "funnelrag-reader", config={}, data_version="test", metrics={"em": 0.0},
                       gate_metric="em")

    cfg = EvaluateConfig.model_validate({
        "workspace": ws_cfg, "corpus": "oracle-mini",
        "questions": {"datasets": [], "paths": [str(tmp / "questions.jsonl")], "limit": None},
        "flat": {"retrievers": ["bm25", "dense"], "n_retrieve": 8},
        "progressive": [{"n_clusters": 3, "n_units": 2}, {"n_clusters": 3, "n_units": 2, "vectors": "stored"},
                        {"n_clusters": 3, "n_units": 2, "vectors": "stored", "passage_shortlist": 4}],
        "prerankers": {"minilm": "minilm", "ghost": "models:/no-such-preranker@champion"},
        "reader": "models:/funnelrag-reader@champion",
        "generator": {"settings": {"max_answer_tokens": 3}},
        "attention_run": {"max_passage_tokens": 64}, "torch_threads": 1, "block_questions": 4})
    summary = evaluate_flow(cfg)
    corpus = open_corpus(Workspace(home), "oracle-mini")
    return {"summary": summary, "home": home, "corpus": corpus, "questions": qs, "cfg": cfg}


def _tables(out):
    d = out["summary"]["artifacts"]
    return EVAL_RESULTS.read(d), EVAL_STAGES.read(d), EVAL_PER_QUESTION.read(d)


def test_settings_subsets_and_answerability(evaluated):
    s = evaluated["summary"]
    results, stages, per_q = _tables(evaluated)
    names = {r["setting"] for r in s["table"]}
    assert names == {"flat-bm25-8p-4p", "flat-bm25-8p-minilm-4p", "flat-dense-8p-4p", "flat-dense-8p-minilm-4p",
                     "prog-3c-2d-minilm-4p", "prog-3c-2d-minilm-fid-4p", "prog-3c-2d-minilm-stored-4p",
                     "prog-3c-2d-minilm-stored-fid-4p", "prog-3c-2d-minilm-stored-sl4-4p",
                     "prog-3c-2d-minilm-stored-sl4-fid-4p"}
    assert "preranker ghost" in s["skipped"] and "reader" not in s["skipped"]
    assert s["models"]["reader"]["reader.registry_version"] == "1"
    # answerability = DPR has_answer against every corpus passage, computed here directly
    texts = evaluated["corpus"].passages["text"].to_pylist()
    qs = evaluated["questions"]
    expected = sum(any(has_answer(q["answers"], t) for t in texts) for q in qs)
    assert s["questions"] == len(qs) and s["answer_in_corpus"] == expected
    assert N_DOCS - 2 <= expected < len(qs)   # gold passages answer (almost) all of theirs; not the test ones
    assert set(results["subset"].to_pylist()) == {"all", "answer_in_corpus"}


def test_flat_bm25_rows_match_the_index_and_dpr_has_answer(evaluated):
    _, _, per_q = _tables(evaluated)
    corpus = evaluated["corpus"]
    index = corpus.passage_index()
    text = dict(zip(corpus.passages["passage_id"].to_pylist(), corpus.passages["text"].to_pylist()))
    answers = {f"questions:{i + 1:06d}": q["answers"] for i, q in enumerate(evaluated["questions"])}
    rows = [r for r in per_q.to_pylist() if r["setting"] == "flat-bm25-8p-4p"]
    questions = {f"questions:{i + 1:06d}": q["question"] for i, q in enumerate(evaluated["questions"])}
    for r in rows:
        ids, _ = index.search([questions[r["question_id"]]], 8)
        assert r["passage_ids"] == ids[0][:4]
        assert r["has_answer"] == [has_answer(answers[r["question_id"]], text[p]) for p in r["passage_ids"]]
    ar4 = sum(any(r["has_answer"]) for r in rows) / len(rows)
    assert ar4 >= 0.5   # the gold passages are in this corpus: BM25 finds most of them


def test_the_bm25_shortlist_keeps_the_clusters_recall_and_picks_among_bm25s_best(evaluated):
    """With a shortlist of M = 4 the clusters' answer recall is the MaxP setting's (it counts every
    passage of the K clusters), and the final passages are among the 4 passages of the
    question's 3 clusters that score best by flat passage BM25."""
    _, stages, per_q = _tables(evaluated)
    corpus = evaluated["corpus"]
    recall = {r["setting"]: r["answer_recall"] for r in stages.to_pylist()
              if r["stage"] == "retrieval" and r["subset"] == "all"}
    assert recall["prog-3c-2d-minilm-stored-sl4-4p"] == recall["prog-3c-2d-minilm-stored-4p"]
    index, clusters = corpus.passage_index(), corpus.cluster_index()
    cluster_of = dict(zip(corpus.passages["passage_id"].to_pylist(), corpus.passages["cluster_id"].to_pylist()))
    questions = {f"questions:{i + 1:06d}": q["question"] for i, q in enumerate(evaluated["questions"])}
    rows = [r for r in per_q.to_pylist() if r["setting"] == "prog-3c-2d-minilm-stored-sl4-4p"]
    assert len(rows) == len(questions)
    for r in rows:
        q = questions[r["question_id"]]
        cids = {int(c) for c in clusters.search([q], 3)[0][0]}
        tokens = [t for t in index.tokenize([q])[0] if t in index.retriever.vocab_dict]
        scores = index.retriever.get_scores(tokens) if tokens else np.zeros(len(index.doc_ids))   # (n_passages,)
        mine = sorted((-float(scores[i]), i) for i, p in enumerate(index.doc_ids) if cluster_of[p] in cids)
        fourth = -mine[min(4, len(mine)) - 1][0]                               # ties at the 4th score: any of them
        best = {index.doc_ids[i] for s, i in mine if -s >= fourth}
        # the top 2 units' shortlisted passages: 1 to 4 of them
        assert set(r["passage_ids"]) <= best and 1 <= len(r["passage_ids"]) <= 4, r["question_id"]


def test_metrics_are_consistent_and_stages_follow_the_funnel(evaluated):
    results, stages, per_q = _tables(evaluated)
    for r in results.to_pylist():
        assert r["ar_1"] <= r["ar_2"] <= r["ar_3"] <= r["ar_4"] <= r["ar_candidates"] + 1e-12
        assert 0.0 <= r["entropy_top4"] <= 2.0 and r["em"] is not None and r["seconds_per_query"] > 0
    by = {r["setting"]: r for r in results.to_pylist() if r["subset"] == "all"}
    assert by["prog-3c-2d-minilm-4p"]["funnel"].endswith("→3c→2d→4p")
    assert by["flat-dense-8p-minilm-4p"]["funnel"].endswith("p→8p→4p")
    st = [r for r in stages.to_pylist() if r["setting"] == "prog-3c-2d-minilm-fid-4p" and r["subset"] == "all"]
    assert [r["stage"] for r in st] == ["retrieval", "chunking", "preranking", "postranking"]
    assert st[0]["n_out"] == 3 and st[2]["n_out"] == 2 and 1 <= st[3]["n_out"] <= 4
    assert st[0]["answer_recall"] >= st[2]["answer_recall"] >= st[3]["answer_recall"] - 1e-12
    # post-ranking re-orders the passages of the same top-N units the plain variant is cut from
    plain = {r["question_id"]: r for r in per_q.to_pylist() if r["setting"] == "prog-3c-2d-minilm-4p"}
    passages = evaluated["corpus"].passages
    unit_of = dict(zip(passages["passage_id"].to_pylist(), passages["unit_id"].to_pylist()))
    for r in per_q.to_pylist():
        if r["setting"] == "prog-3c-2d-minilm-fid-4p":
            assert 1 <= len(r["passage_ids"]) <= 4 and r["stage_counts"][:3] == plain[r["question_id"]]["stage_counts"]
            assert len({unit_of[p] for p in r["passage_ids"]}) <= 2


def test_mlflow_run_and_artifacts(evaluated):
    s, home = evaluated["summary"], evaluated["home"]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    run = client.get_run(s["mlflow_run_id"])
    m = run.data.metrics
    results, _, _ = _tables(evaluated)
    row = next(r for r in results.to_pylist() if r["setting"] == "flat-bm25-8p-4p" and r["subset"] == "all")
    assert m["flat-bm25-8p-4p.all.ar_4"] == pytest.approx(row["ar_4"])
    assert "prog-3c-2d-minilm-fid-4p.stage3_postranking.seconds" in m and m["questions"] == s["questions"]
    assert run.data.params["reader"] == "models:/funnelrag-reader@champion"
    # the registered reader version it used: tagged, and its figures linked to that logged model
    version = run.data.tags["model_version.funnelrag-reader"]
    from funnelrag.registry import logged_model_id  # noqa: PLC0415
    logged = client.get_logged_model(logged_model_id(client.get_model_version("funnelrag-reader", version)))
    assert {mm.key for mm in logged.metrics if mm.run_id == run.info.run_id} >= {"flat-bm25-8p-4p.all.ar_4"}
    names = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/results.evaluation.md", "evaluation/results.evaluation.csv",
            "evaluation/answer_recall_at_k.png", "evaluation/results.evaluation.parquet"} <= names
    md = (client.download_artifacts(run.info.run_id, "evaluation/results.evaluation.md"))
    text = open(md, encoding="utf-8").read()
    assert "| flat-bm25-8p-4p |" in text and "## answer_in_corpus" in text
    assert pq.read_metadata(f"{s['artifacts']}/per_question.evaluation.parquet").num_rows == 10 * s["questions"]
    # per-question results for paired comparisons, and each figure's 95% interval as metrics
    from funnelrag.tracking import read_question_scores  # noqa: PLC0415

    scores = read_question_scores(run.info.run_id).to_pylist()
    ar4 = [r["value"] for r in scores if r["metric"] == "flat-bm25-8p-4p.all.ar_4"]
    assert len(ar4) == s["questions"] and sum(ar4) / len(ar4) == pytest.approx(row["ar_4"])
    assert all(r["question"] for r in scores)
    assert m["flat-bm25-8p-4p.all.ar_4.ci95_low"] <= row["ar_4"] <= m["flat-bm25-8p-4p.all.ar_4.ci95_high"]
    assert m["flat-bm25-8p-4p.all.ar_4.n"] == s["questions"]


def test_prefect_markdown_artifact(evaluated):
    from prefect.client.orchestration import get_client  # noqa: PLC0415
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey  # noqa: PLC0415

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["evaluate-oracle-mini"])))
    assert arts and arts[-1].type == "markdown"
    assert "| prog-3c-2d-minilm-fid-4p |" in arts[-1].data and "## stages" in arts[-1].data
    assert "MLflow run: `" in arts[-1].data and "mlflow ui --backend-store-uri sqlite:///" in arts[-1].data


def test_stored_vectors_rank_as_on_the_fly_and_embed_flow_reuses_them(evaluated):
    """Progressive retrieval from the published embedding index returns the on-the-fly MaxP
    ranking; ``embed-corpus`` finds the index the evaluation published (same corpus digest and
    model version) and does not re-embed."""
    from flows.embed import EmbedConfig, embed_flow  # noqa: PLC0415

    s = evaluated["summary"]
    _, stages, per_q = _tables(evaluated)
    rows = per_q.to_pylist()
    fly = {r["question_id"]: r["passage_ids"] for r in rows if r["setting"] == "prog-3c-2d-minilm-4p"}
    stored = {r["question_id"]: r["passage_ids"] for r in rows if r["setting"] == "prog-3c-2d-minilm-stored-4p"}
    assert fly == stored and len(fly) == s["questions"]
    st = [r["stage"] for r in stages.to_pylist() if r["setting"] == "prog-3c-2d-minilm-stored-fid-4p" and r["subset"] == "all"]
    assert st == ["retrieval", "preranking", "postranking"]
    assert s["models"]["preranker.minilm"]["preranker.minilm.max_length"] == "256"
    emb = s["embeddings"]["minilm"]
    assert emb["cache_hit"] is False and emb["passages"] == evaluated["corpus"].passages.num_rows
    out = embed_flow(EmbedConfig.model_validate({"workspace": evaluated["cfg"].workspace.model_dump(),
                                                 "corpus": "oracle-mini", "torch_threads": 1}))
    assert out["cache_hit"] is True and out["model_version"] == emb["model_version"] and out["version"] == emb["version"]


def test_the_lazily_filled_index_reads_the_corpus_versions_kept_text_keys(evaluated, monkeypatch):
    """``embeddings: lazy`` for a model version with no published index: the evaluation opens the
    lazily filled index over the text keys the version's first embedding kept, hashing no passage."""
    from types import SimpleNamespace  # noqa: PLC0415

    from flows.evaluate import embeddings_task  # noqa: PLC0415
    from models.preranker import PreRankerConfig, build_preranker  # noqa: PLC0415
    from funnelrag.content_store import text_keys  # noqa: PLC0415
    from tasks.funnel import embeddings, lazy_embeddings  # noqa: PLC0415
    from tasks.funnel.embeddings import passage_texts  # noqa: PLC0415
    from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex  # noqa: PLC0415

    model, tok = build_preranker(PreRankerConfig(kind="bi", max_length=128))   # another model version than minilm's 256
    hashed = []
    for module in (embeddings, lazy_embeddings):                          # every text hashed on the way
        monkeypatch.setattr(module, "text_keys", lambda texts: hashed.extend(texts) or text_keys(texts))
    cfg = evaluated["cfg"].model_copy(update={"embeddings": "lazy"})
    corpus = evaluated["corpus"]
    index, info = embeddings_task.fn(cfg, Workspace(evaluated["home"]), corpus, SimpleNamespace(model=model, tokenizer=tok))
    assert isinstance(index, LazyEmbeddingIndex) and info["lazy"] and info["filled_before"] == 0
    assert hashed == []                                                   # the kept keys, not the passages again
    monkeypatch.undo()
    np.testing.assert_array_equal(index._keys, text_keys(passage_texts(corpus.passages)))
