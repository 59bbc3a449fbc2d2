"""Ranked lists of k documents per question for R²AG: HotpotQA contexts and NQ-open BM25 lists.

* HotpotQA (multi-hop): the question's own context paragraphs (10 in the distractor setting),
  supporting paragraphs relevant. The paragraphs come unordered, so the retriever is the
  bi-encoder: they are ranked by its relevance ``r_i`` (Eq. 10), as the paper ranks candidates
  by its retriever (Appendix D) rather than placing gold documents at fixed positions.
* NQ-open: the pipeline's own BM25 top-k over the published corpus passages, in BM25 order;
  a passage is relevant when it contains an answer by DPR ``has_answer``.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import r2ag as R
from funnelrag.progress import Progress, progress
from models.encoders import encode
from tasks.qa.questions import AnswerMatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListConfig:
    """Ranked-list settings.

    k : documents per list (NQ: BM25 depth; HotpotQA: at most k paragraphs, file order first).
    min_docs : lists with fewer documents are skipped and counted.
    """

    k: int = 10
    min_docs: int = 2

    def __post_init__(self) -> None:
        if self.k < 1 or self.min_docs < 1 or self.min_docs > self.k:
            raise ValueError(f"ListConfig needs 1 <= min_docs <= k, got k={self.k}, min_docs={self.min_docs}")


def _table(rows: dict[str, list]) -> pa.Table:
    return R.RANKED_LISTS.validate(pa.table(rows, schema=R.RANKED_LISTS.schema))


def _empty_rows() -> dict[str, list]:
    return {name: [] for name in R.RANKED_LISTS.schema.names}


def hotpotqa_candidates(records: Sequence, cfg: ListConfig = ListConfig()) -> tuple[pa.Table, dict]:
    """Unranked HotpotQA lists (``rank`` = file order, ``retriever_score`` = 0).

    Parameters
    ----------
    records : :class:`tasks.dr_rag.hotpotqa.QARecord` sequence.
    cfg : ListConfig

    Returns
    -------
    table : ``RANKED_LISTS`` rows; rank them with :func:`rank_by_relevance`.
    report : ``{"lists": n, "skipped_too_few_docs": n, "list_sizes": {k: count}}``.
    """
    rows = _empty_rows()
    skipped, sizes = 0, Counter()
    for rec in records:
        paras = list(rec.paragraphs)[:cfg.k]
        if len(paras) < cfg.min_docs:
            skipped += 1
            continue
        sizes[len(paras)] += 1
        for i, p in enumerate(paras):
            rows["query_id"].append(rec.question_id)
            rows["question"].append(rec.question)
            rows["answers"].append(list(rec.answers))
            rows["rank"].append(i)
            rows["doc_id"].append(f"{rec.question_id}/{i}")
            rows["title"].append(p.title)
            rows["text"].append(p.text)
            rows["retriever_score"].append(0.0)
            rows["label"].append(int(p.is_supporting))
    if skipped:
        log.warning("hotpotqa: skipped %d question(s) with fewer than %d paragraphs", skipped, cfg.min_docs)
    report = {"lists": sum(sizes.values()), "skipped_too_few_docs": skipped,
              "list_sizes": {str(k): v for k, v in sorted(sizes.items())}}
    return _table(rows), report


def nq_bm25_lists(questions: pa.Table, index, passages: pa.Table, cfg: ListConfig = ListConfig(),
                  batch_size: int = 256) -> tuple[pa.Table, dict]:
    """BM25 top-k passage lists for NQ-open questions, labelled by DPR ``has_answer``.

    Parameters
    ----------
    questions : ``data_contracts.funnel.QUESTIONS`` table (question_id, question, answers, ...).
    index : :class:`tasks.corpus.index.BM25Index` whose ids are ``passage_id`` (the corpus passage index).
    passages : ``data_contracts.corpus.PASSAGES`` table (passage_id, title, text, ...).
    cfg : ListConfig
    batch_size : questions per BM25 call.

    Returns
    -------
    table : ``RANKED_LISTS`` rows in BM25 order (``retriever_score`` = BM25 score).
    report : lists built, skipped (fewer than ``min_docs`` hits), lists with a relevant passage.

    Raises
    ------
    KeyError
        The index returns a passage id missing from ``passages`` (index and table disagree).
    """
    row_of = {pid: i for i, pid in enumerate(passages["passage_id"].to_pylist())}
    titles, texts = passages["title"], passages["text"]
    qids, qs, answers = (questions[c].to_pylist() for c in ("question_id", "question", "answers"))
    rows = _empty_rows()
    skipped = with_relevant = 0
    for start in progress(range(0, len(qs), batch_size), "BM25 lists", unit="batches"):
        ids, scores = index.search(qs[start:start + batch_size], cfg.k)
        for j, (hit_ids, hit_scores) in enumerate(zip(ids, scores)):
            q = start + j
            if len(hit_ids) < cfg.min_docs:
                skipped += 1
                continue
            try:
                take = pa.array([row_of[h] for h in hit_ids], pa.int64())
            except KeyError as exc:
                raise KeyError(f"BM25 index returned passage id {exc.args[0]!r} that is not in the passages table") from None
            hit_titles, hit_texts = titles.take(take).to_pylist(), texts.take(take).to_pylist()
            match = AnswerMatcher(answers[q])
            labels = [int(match(t)) for t in hit_texts]
            with_relevant += int(any(labels))
            for rank, (pid, score, title, text, label) in enumerate(zip(hit_ids, hit_scores.tolist(), hit_titles, hit_texts, labels)):
                rows["query_id"].append(qids[q])
                rows["question"].append(qs[q])
                rows["answers"].append(list(answers[q]))
                rows["rank"].append(rank)
                rows["doc_id"].append(pid)
                rows["title"].append(title)
                rows["text"].append(text)
                rows["retriever_score"].append(float(score))
                rows["label"].append(label)
    n_lists = len(qs) - skipped
    report = {"lists": n_lists, "skipped_too_few_docs": skipped, "lists_with_relevant": with_relevant}
    return _table(rows), report


def list_texts(lists: pa.Table, include_title: bool = True) -> tuple[list[str], list[str]]:
    """Texts to embed: one per distinct ``query_id`` (order of first appearance) and one per row.

    Documents are ``"title. text"`` when ``include_title`` (the way MiniLM passages are embedded).
    """
    qids, questions = lists["query_id"].to_pylist(), lists["question"].to_pylist()
    seen: dict[str, str] = {}
    for qid, q in zip(qids, questions):
        seen.setdefault(qid, q)
    titles, texts = lists["title"].to_pylist(), lists["text"].to_pylist()
    docs = [f"{t}. {x}" if include_title and t else x for t, x in zip(titles, texts)]
    return list(seen.values()), docs


def embed_lists(lists: pa.Table, model, tokenizer, include_title: bool = True,
                batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Bi-encoder representations of the queries and documents of ``lists``.

    Each distinct document text is encoded once (BM25 lists share passages).

    Returns
    -------
    query_embs : float32 ``(n_queries, dim)`` in order of first appearance of ``query_id``.
    doc_embs : float32 ``(lists.num_rows, dim)`` row-aligned with ``lists``.
    """
    queries, docs = list_texts(lists, include_title)
    unique = list(dict.fromkeys(docs))
    where = {t: i for i, t in enumerate(unique)}
    with Progress("embed queries and documents", total=len(queries) + len(unique), unit="texts") as bar:
        q = encode(model, tokenizer, queries, batch_size=batch_size, bar=bar).numpy()  # (n_queries, dim)
        u = encode(model, tokenizer, unique, batch_size=batch_size, bar=bar).numpy()  # (n_unique, dim)
    return q, u[np.asarray([where[t] for t in docs], dtype=np.int64)]


def rank_by_relevance(lists: pa.Table, query_embs: np.ndarray, doc_embs: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Re-rank every list by cosine relevance ``r_i`` (Eq. 10), descending; ties keep the old rank.

    ``retriever_score`` becomes ``r_i``. Returns the re-ranked table (rows grouped by query in
    order of first appearance, sorted by new rank) and the row-aligned document embeddings.
    """
    qids = lists["query_id"].to_pylist()
    order_q = list(dict.fromkeys(qids))
    q_index = {qid: i for i, qid in enumerate(order_q)}
    qn = query_embs / np.maximum(np.linalg.norm(query_embs, axis=1, keepdims=True), 1e-12)  # (n_queries, dim)
    dn = doc_embs / np.maximum(np.linalg.norm(doc_embs, axis=1, keepdims=True), 1e-12)  # (n_rows, dim)
    rel = np.einsum("nd,nd->n", dn, qn[np.asarray([q_index[q] for q in qids], dtype=np.int64)])  # (n_rows,)
    old_rank = lists["rank"].to_numpy()
    rows_of: dict[str, list[int]] = {}
    for row, qid in enumerate(qids):
        rows_of.setdefault(qid, []).append(row)
    new_rows: list[int] = []
    for qid in order_q:
        rows = np.asarray(rows_of[qid])
        new_rows.extend(rows[np.lexsort((old_rank[rows], -rel[rows]))].tolist())
    take = pa.array(new_rows, pa.int64())
    out = lists.take(take)
    counts = Counter(qids)
    ranks = [r for qid in order_q for r in range(counts[qid])]
    out = out.set_column(out.schema.get_field_index("rank"), "rank", pa.array(ranks, pa.int16()))
    out = out.set_column(out.schema.get_field_index("retriever_score"), "retriever_score",
                         pa.array(rel[new_rows].astype(np.float32)))
    return R.RANKED_LISTS.validate(out), doc_embs[np.asarray(new_rows, dtype=np.int64)]


def relevant_counts(lists: pa.Table) -> dict:
    """Lists, rows and relevant rows of a ``RANKED_LISTS`` table (for reports)."""
    n_lists = pc.count_distinct(lists["query_id"]).as_py() if lists.num_rows else 0
    grouped = lists.group_by("query_id").aggregate([("label", "max")]) if lists.num_rows else None
    with_rel = int(pc.sum(grouped["label_max"]).as_py() or 0) if grouped is not None else 0
    return {"lists": n_lists, "documents": lists.num_rows,
            "relevant_documents": int(pc.sum(lists["label"]).as_py() or 0), "lists_with_relevant": with_rel}
