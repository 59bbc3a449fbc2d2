"""Run names and state messages (flows/run_report.py): what ``prefect flow-run ls`` shows of a run."""
from __future__ import annotations

import datetime as dt

from flows.evaluate import evaluate_message
from flows.funnel import distill_message
from flows.run_report import MAX_NAME, build_message, embed_markdown, embed_message, nightly_message, run_name

DAY = dt.date(2026, 1, 3)
SUMMARY = {"version": "20260103T020000Z-1a2b3c4d", "unchanged": False,
           "counts": {"documents": 4598, "clusters": 912, "passages": 146402},
           "reused_texts": {"window_token_documents": {"built": 18, "reused": 558}},
           "shards": {"token_shards": {"built": 1, "reused": 7}}}


def test_run_names_are_words_and_the_utc_date():
    assert run_name("nightly", "enwiki", "incremental", day=DAY) == "nightly-enwiki-incremental-20260103"
    assert run_name("embed", "Wiki Speedia", None, "", "models:/x@champion", day=DAY) == \
        "embed-wiki-speedia-models-x-champion-20260103"
    long = run_name("evaluate", "c" * 200, day=DAY)
    assert len(long) <= MAX_NAME and long.endswith("-20260103")


def test_a_build_says_what_it_published_and_what_it_redid():
    assert build_message(SUMMARY) == ("published 20260103T020000Z-1a2b3c4d: 4,598 documents, 912 clusters, "
                                      "146,402 passages; 18 documents re-tokenised, 558 reused")
    no_memo = {**SUMMARY, "reused_texts": {}}
    assert build_message(no_memo).endswith("; 1 token shards built, 7 reused")
    assert build_message({**SUMMARY, "unchanged": True}).startswith("unchanged: current version 20260103T")
    refused = {**SUMMARY, "gate": {"passed": False, "reasons": ["AR@20 0.1 < 0.2"]}}
    assert build_message({"verify": {"current": "v1", "same": True}}) == \
        "verify: a build without the cache equals current v1"
    assert build_message({"verify": {"current": "v1", "same": False, "first_difference": "passages.parquet row 17"}}) \
        .endswith("differs from a build without the cache: passages.parquet row 17")
    assert build_message(refused) == "gate refused 20260103T020000Z-1a2b3c4d: AR@20 0.1 < 0.2 (current did not move)"


def test_a_night_says_its_action():
    assert nightly_message("nothing", "no new dump or day", [], None) == "nothing: no new dump or day"
    assert nightly_message("nothing", "nothing new: full dump 20260101 already built", [], None) == \
        "nothing new: full dump 20260101 already built"
    assert nightly_message("incremental", "", ["20260102", "20260103"], SUMMARY) == (
        "incremental: 2 days, 18 documents re-tokenised, 558 reused; published 20260103T020000Z-1a2b3c4d: "
        "4,598 documents, 912 clusters, 146,402 passages")
    assert nightly_message("full", "", [], SUMMARY).startswith("full: published 20260103T020000Z-1a2b3c4d")


def test_an_embedding_says_what_it_embedded_and_reused():
    info = {"passages": 146402, "embedded": 1204, "reused": 145198, "model_version": "3f2a9c1b" * 8,
            "seconds": 61.25, "passages_per_s": 19.7, "cache_hit": False}
    assert embed_message(info) == "embedded 1,204 passages, reused 145,198 (model 3f2a9c1b); 61.2 s"
    assert embed_message({"passages": 10, "seconds": 1.0, "model_version": "ab", "cache_hit": False}) == \
        "embedded 10 passages, reused 0 (model ab); 1.0 s"
    hit = {**info, "cache_hit": True}
    assert embed_message(hit) == "index already published for model 3f2a9c1b: 146,402 passages, nothing embedded"
    md = embed_markdown("wikispeedia", "v1", "minilm", hit, "[run](http://127.0.0.1:5000/#/x)")
    assert "| embedded now | 0 |" in md and "| reused (embedded before) | 146,402 |" in md
    assert "[run](http://127.0.0.1:5000/#/x)" in md


def test_distillation_and_evaluation_messages():
    recall = [{"k": 4, "before": 0.3, "after": 0.35}, {"k": 8, "before": 0.433, "after": 0.467}]
    gate = {"name": "funnelrag-preranker", "version": "3", "reason": "better", "promoted": True}
    assert distill_message(recall, gate) == "AR@8 0.433 → 0.467; funnelrag-preranker v3 — better (now champion)"
    table = [{"setting": "flat", "AR@4": 0.187}, {"setting": "prog", "AR@4": 0.173}]
    assert evaluate_message({"table": table, "questions": 300}) == \
        "evaluated 2 settings on 300 questions; best AR@4 0.187: flat"
    assert evaluate_message({"table": [], "questions": 0}) == "evaluated 0 settings on 0 questions"


def test_clusters_over_s_are_single_articles_and_the_report_says_so():
    import numpy as np  # noqa: PLC0415
    import pytest  # noqa: PLC0415

    from flows.corpus_build import oversize_clusters, summary_markdown  # noqa: PLC0415

    tokens, members = np.array([4000, 110_000, 5000, 300]), np.array([3, 1, 1, 1])
    assert oversize_clusters(tokens, members, 4096) == 2
    with pytest.raises(ValueError, match="1 clusters of several members exceed S = 4096"):
        oversize_clusters(np.array([5000]), np.array([2]), 4096)
    md = summary_markdown({**SUMMARY, "corpus": "w", "mlflow_run_id": "r", "store": "s", "path": "p",
                           "max_cluster_tokens_S": 4096, "clusters_over_S": 2, "stages": {},
                           "counts": {**SUMMARY["counts"], "max_cluster_tokens": 110_000}})
    assert ("S (max cluster tokens): 4,096; 2 clusters are single articles longer than S (the largest 110,000 "
            "tokens), which Algorithm 1 never merges") in md
