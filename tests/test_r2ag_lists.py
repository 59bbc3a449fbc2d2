"""R²AG ranked lists on real data: HotpotQA contexts ranked by MiniLM, NQ-open BM25 lists over
real Wikispeedia passages labelled by DPR has_answer."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from data_contracts import corpus as C
from data_contracts import r2ag as R
from funnelrag.datasets import resolve
from tasks.r2ag.lists import ListConfig, hotpotqa_candidates, nq_bm25_lists, rank_by_relevance, relevant_counts


@pytest.fixture(scope="module")
def hotpot_records(data_mirror):
    from tasks.dr_rag.hotpotqa import load_hotpotqa

    return load_hotpotqa(resolve("hotpotqa-dev-subsampled", data_mirror))


def test_hotpotqa_lists_keep_supporting_paragraphs_as_relevant(hotpot_records):
    lists, report = hotpotqa_candidates(hotpot_records, ListConfig(k=10, min_docs=5))
    small = sum(1 for r in hotpot_records if len(r.paragraphs) < 5)
    assert report["skipped_too_few_docs"] == small > 0  # the subsample has 2-paragraph questions
    assert report["lists"] == len(hotpot_records) - small
    counts = relevant_counts(lists)
    assert counts["relevant_documents"] == 2 * report["lists"]  # two supporting paragraphs each
    first = hotpot_records[0]
    rows = lists.filter(pa.compute.equal(lists["query_id"], first.question_id))
    assert rows["title"].to_pylist() == [p.title for p in first.paragraphs]
    assert rows["label"].to_pylist() == [int(p.is_supporting) for p in first.paragraphs]


def test_rank_by_relevance_orders_by_cosine_and_carries_embeddings(hotpot_records):
    lists, _ = hotpotqa_candidates(hotpot_records[:3])
    rng = np.random.default_rng(0)
    q = rng.normal(size=(3, 8)).astype(np.float32)
    d = rng.normal(size=(lists.num_rows, 8)).astype(np.float32)
    ranked, d2 = rank_by_relevance(lists, q, d)
    R.RANKED_LISTS.validate(ranked)
    for qi, qid in enumerate(dict.fromkeys(ranked["query_id"].to_pylist())):
        sel = np.flatnonzero(np.asarray(ranked["query_id"].to_pylist()) == qid)
        scores = ranked["retriever_score"].to_numpy()[sel]
        assert np.all(np.diff(scores) <= 1e-7)  # descending relevance
        cos = d2[sel] @ q[qi] / (np.linalg.norm(d2[sel], axis=1) * np.linalg.norm(q[qi]))
        np.testing.assert_allclose(scores, cos, rtol=1e-5, atol=1e-6)  # embeddings follow their rows
    assert sorted(ranked["doc_id"].to_pylist()) == sorted(lists["doc_id"].to_pylist())


@pytest.fixture(scope="module")
def wikispeedia_passages(data_mirror) -> pa.Table:
    """Real 100-word passages of the first 150 Wikispeedia articles (corpus PASSAGES contract)."""
    from tasks.sources.ingest.wikispeedia import WikispeediaReader, strip_header_footer
    from tasks.corpus.segment import article_windows, passage_id, unit_id

    rows = {name: [] for name in C.PASSAGES.schema.names}
    reader = WikispeediaReader([resolve("wikispeedia-articles", data_mirror)], max_page_bytes=1 << 20)
    n_docs = 0
    for page in reader.pages():
        if page.error or not page.text:
            continue
        for j, window in enumerate(article_windows(strip_header_footer(page.text), 100)):
            rows["passage_id"].append(passage_id(page.title, j))
            rows["unit_id"].append(unit_id(page.title, 0))
            rows["cluster_id"].append(n_docs)
            rows["doc_id"].append(n_docs)
            rows["title"].append(page.title)
            rows["text"].append(window)
            rows["n_words"].append(len(window.split()))
            rows["n_tokens"].append(len(window.split()))
        n_docs += 1
        if n_docs == 150:
            break
    return C.PASSAGES.validate(pa.table(rows, schema=C.PASSAGES.schema))


def test_nq_bm25_lists_follow_bm25_order_and_has_answer(data_mirror, wikispeedia_passages):
    from tasks.corpus.index import BM25Index
    from tasks.qa.questions import QuestionsConfig, has_answer, load_questions

    passages = wikispeedia_passages
    index = BM25Index.build(passages["text"].to_pylist(), passages["passage_id"].to_pylist())
    questions, _ = load_questions([resolve("nq-open-dev", data_mirror)], QuestionsConfig(limit=120))
    lists, report = nq_bm25_lists(questions, index, passages, ListConfig(k=5))
    assert report["lists"] == 120 and lists.num_rows == 600
    assert report["lists_with_relevant"] == relevant_counts(lists)["lists_with_relevant"] > 0
    text_of = dict(zip(passages["passage_id"].to_pylist(), passages["text"].to_pylist()))
    ids, scores = index.search(questions["question"].to_pylist()[:3], 5)
    for qi in range(3):
        rows = lists.slice(qi * 5, 5)
        assert rows["doc_id"].to_pylist() == ids[qi]
        np.testing.assert_allclose(rows["retriever_score"].to_numpy(), scores[qi], rtol=1e-6)
    answers = lists["answers"].to_pylist()
    for i in range(lists.num_rows):
        assert lists["label"][i].as_py() == int(has_answer(answers[i], text_of[lists["doc_id"][i].as_py()]))
    with pytest.raises(KeyError, match="not in the passages table"):
        nq_bm25_lists(questions.slice(0, 2), index, passages.slice(0, 5), ListConfig(k=5))


def test_r2ag_reads_a_file_of_ones_own_through_data_path(tmp_path, data_mirror):
    """``data.path`` (as in the DR-RAG flows) is read instead of the registered file; a path given
    where a registered name is expected says where it belongs."""
    import pytest  # noqa: PLC0415

    from flows.r2ag import data_file  # noqa: PLC0415
    from tasks.r2ag.stages import R2AGDataConfig  # noqa: PLC0415

    own = tmp_path / "mine.jsonl"
    own.write_text((data_mirror / "hotpotqa" / "hotpotqa_dev_subsampled.jsonl").read_text().splitlines()[0] + "\n")
    path, sha = data_file(R2AGDataConfig(path=str(own)), data_mirror, tmp_path)
    assert path == own and len(sha) == 64
    registered, _ = data_file(R2AGDataConfig(), data_mirror, tmp_path)
    assert registered.name == "hotpotqa_dev_subsampled.jsonl"
    with pytest.raises(ValueError, match=r"data.hotpotqa_file: .* is not a registered data set .*data.path="):
        data_file(R2AGDataConfig(hotpotqa_file=str(own)), data_mirror, tmp_path)
    with pytest.raises(FileNotFoundError, match="data.path"):
        data_file(R2AGDataConfig(path=str(tmp_path / "absent.jsonl")), data_mirror, tmp_path)
