"""Progressive retrieval from the stored embedding index (FunnelRAG's funnel, offline vectors).

Per question: BM25 over clusters → top-K clusters (``retrieval``); the question is embedded
once by the bi-encoder pre-ranker, the stored vectors of every passage of the K clusters are
gathered and scored by dot product, units rank by MaxP (or, with a fusion, by MaxP fused with
their passages' BM25 scores, :mod:`tasks.funnel.fusion`) and the top-N go on (``preranking``,
the ``n_final`` best passages of those units are the plain result); optionally the FiD
post-ranker ranks the top-N units' passages by Eq. 3 (``postranking``). No later chunking runs
at query time: the corpus build's units and passages are the ones later chunking would cut.

Answer matching (DPR ``has_answer``) runs outside the timed blocks; a unit holds the answer when
one of its passages does.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pyarrow as pa

from data_contracts.funnel import CANDIDATES
from tasks.evaluate.retrieval import LabeledPreRanker, PassageLookup, ProgressiveSetting, QueryResult, Question
from tasks.evaluate.timing import StageClock, StageOutcome
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, score_candidates
from tasks.funnel.embeddings import EmbeddingIndex, embed_queries
from tasks.funnel.stored import rank_units_stored, shortlist_rows
from tasks.qa.metrics import TokenCache, passage_hits


class StoredPreRanker:
    """A bi-encoder pre-ranker that re-ranks passages from the embedding index: ``f(q, p) =
    E(q) · E(p)`` with ``E(p)`` read, not computed (same interface as
    :class:`tasks.evaluate.retrieval.LabeledPreRanker` for :func:`tasks.evaluate.retrieval.run_flat`)."""

    def __init__(self, preranker: LabeledPreRanker, index: EmbeddingIndex):
        self.label, self.preranker, self.index = preranker.label, preranker, index
        self._row = index.row_of()

    def score_passages(self, question: str, passages: Sequence[tuple[str, str, str]]):
        """Scores of ``[(passage_id, title, text)]``, float32 ``(len(passages),)``.

        Raises
        ------
        KeyError
            A passage is not in the embedding index (names it).
        """
        try:
            rows = [self._row[p] for p, _, _ in passages]
        except KeyError as exc:
            raise KeyError(f"passage {exc.args[0]!r} is not in the embedding index") from exc
        query = embed_queries(self.preranker.model, self.preranker.tokenizer, [question])[0]   # (dim,)
        return self.index.gather(np.asarray(rows, dtype=np.int64)) @ query                 # (n,)


def _candidates(qid: str, index: EmbeddingIndex, ranking, top_units: list[str], lookup: PassageLookup,
                hit: dict[str, bool], unit_hit: dict[str, bool], bm25: dict[int, float]) -> pa.Table:
    """The ``candidates`` table of one question: passages of its top-N units, in unit rank then
    passage order (what the FiD post-ranker reads)."""
    rank = {u: k for k, u in enumerate(top_units)}
    unit_score = dict(zip(ranking.unit_ids, ranking.unit_scores.tolist()))
    rows = sorted((rank[index.unit_ids[r]], int(r)) for r in ranking.all_rows if index.unit_ids[r] in rank)
    texts = lookup.get([index.passage_ids[r] for _, r in rows])
    cols: dict[str, list] = {n: [] for n in CANDIDATES.schema.names}
    pos: dict[str, int] = {}
    for (k, r), (pid, title, text) in zip(rows, texts):
        uid, cid = index.unit_ids[r], int(index.cluster_ids[r])
        pos[uid] = pos.get(uid, -1) + 1
        for key, value in (("question_id", qid), ("cluster_id", cid), ("bm25_score", bm25[cid]), ("unit_id", uid),
                           ("unit_rank", k), ("prerank_score", unit_score[uid]), ("unit_has_answer", unit_hit[uid]),
                           ("passage_id", pid), ("passage_position", pos[uid]), ("title", title), ("text", text),
                           ("has_answer", hit[pid])):
            cols[key].append(value)
    return CANDIDATES.validate(pa.table(cols, schema=CANDIDATES.schema))


def run_progressive_stored(questions: Sequence[Question], cluster_index, index: EmbeddingIndex, lookup: PassageLookup,
                           setting: ProgressiveSetting, preranker: LabeledPreRanker, tokens: TokenCache, reader=None,
                           attention_cfg=None, attention_run=None, passage_bm25=None) -> dict[bool, list[QueryResult]]:
    """Evaluate one progressive setting from stored vectors, question by question.

    Parameters
    ----------
    questions : the evaluation questions.
    cluster_index : BM25 over clusters (ids = cluster ids as strings).
    index : the embedding index of this corpus and of ``preranker``'s weights (the caller
        checks both with :meth:`EmbeddingIndex.check`).
    lookup : passage texts (final passages, answer matching, FiD input).
    setting : ProgressiveSetting (``vectors="stored"``).
    preranker : the bi-encoder pre-ranker that embeds the question.
    tokens : DPR-token cache shared across settings.
    reader, attention_cfg, attention_run : FiD post-ranker, as in
        :func:`tasks.evaluate.retrieval.run_progressive`.
    passage_bm25 : :class:`tasks.funnel.fusion.PassageBM25` over ``index.passage_ids`` (needed
        when the setting fuses a unit or passage score with BM25; timed within ``preranking``).

    Returns
    -------
    dict
        ``{False: results, True: post-ranked results}`` (``True`` only with a reader). Stages:
        ``retrieval`` (→ K c), ``preranking`` (units of the K clusters → N d) and, post-ranked,
        ``postranking`` (→ H p).

    Raises
    ------
    ValueError
        The setting fuses BM25 scores and no ``passage_bm25`` is given.
    """
    fusion = setting.fusion_config()
    if setting.uses_bm25 and passage_bm25 is None:
        raise ValueError(f"progressive setting {setting} fuses BM25 scores: pass passage_bm25")
    attention_cfg = attention_cfg or AttentionScoreConfig()
    attention_run = attention_run or AttentionRunConfig()
    n_total = len(cluster_index)
    out: dict[bool, list[QueryResult]] = {False: [], **({True: []} if reader is not None else {})}
    for q in questions:
        clock = StageClock()
        with clock.stage("retrieval"):
            ids, bm25 = cluster_index.search([q.question], setting.n_clusters)
            cids = [int(c) for c in ids[0]]
        with clock.stage("preranking"):
            query = embed_queries(preranker.model, preranker.tokenizer, [q.question])[0]     # (dim,)
            bm25_of = None if not setting.uses_bm25 else (lambda rows: passage_bm25.scores(q.question, rows))
            ranking = rank_units_stored(query, index, cids, bm25_of, fusion, setting.passage_shortlist)
            top_units = ranking.unit_ids[:setting.n_units]
            final = lookup.get([index.passage_ids[r] for r, _ in ranking.top_passages(
                index, setting.n_units, setting.n_final, bm25_of, setting.passage_bm25_weight)])
        pids = [index.passage_ids[r] for r in ranking.all_rows]
        hit = dict(zip(pids, passage_hits(q.answers, [(p, t) for p, _, t in lookup.get(pids)], tokens)))
        unit_hit: dict[str, bool] = {}
        for r in ranking.all_rows:
            unit_hit[index.unit_ids[r]] = unit_hit.get(index.unit_ids[r], False) or hit[index.passage_ids[r]]
        stages = [StageOutcome("retrieval", "c", n_total, len(cids), clock["retrieval"], any(hit.values())),
                  StageOutcome("preranking", "d", len(ranking.unit_ids), len(top_units), clock["preranking"],
                               any(unit_hit[u] for u in top_units))]
        out[False].append(QueryResult(q.question_id, final, [hit[p] for p, _, _ in final], stages))
        if reader is None:
            continue
        with clock.stage("postranking"):
            cands = _candidates(q.question_id, index, ranking, top_units, lookup, hit, unit_hit,
                                {int(c): float(s) for c, s in zip(ids[0], bm25[0])})
            qtable = pa.table({"question_id": [q.question_id], "question": [q.question]})
            scored = score_candidates(cands, qtable, reader[0], reader[1], attention_cfg, attention_run,
                                      show_progress=False)
            score = dict(zip(scored["passage_id"].to_pylist(), scored["score"].to_pylist()))
            order = sorted(range(cands.num_rows), key=lambda j: (-score[cands["passage_id"][j].as_py()], j))
            post = [(cands["passage_id"][j].as_py(), cands["title"][j].as_py(), cands["text"][j].as_py())
                    for j in order[:setting.n_final]]
        post_hits = [hit[p] for p, _, _ in post]
        out[True].append(QueryResult(q.question_id, post, post_hits, [
            *stages, StageOutcome("postranking", "p", cands.num_rows, len(post), clock["postranking"], any(post_hits))]))
    return out


def fill_lazy_rows(index, questions: Sequence[str], preranker: LabeledPreRanker, cluster_index=None,
                   cluster_ks: Sequence[int] = (), passage_index=None, n_retrieve: int = 0,
                   shortlists: Sequence[tuple[int, int]] = (), passage_bm25=None) -> tuple[int, float]:
    """Embed, into a lazily filled index (:class:`tasks.funnel.lazy_embeddings.LazyEmbeddingIndex`),
    every passage the stored-vector settings will read for ``questions``.

    Parameters
    ----------
    index : the lazily filled index (any other index: a no-op).
    questions : the question texts of one block.
    preranker : the bi-encoder whose vectors the index holds.
    cluster_index : BM25 over clusters (needed with ``cluster_ks`` or ``shortlists``).
    cluster_ks : K of each setting that scores every passage of its top-K clusters.
    passage_index, n_retrieve : the flat passage BM25 index and the flat setting's candidates
        (flat re-ranking from stored vectors reads its top ``n_retrieve`` passages).
    shortlists : ``(K, M)`` of each BM25-shortlist setting: only the M shortlisted passages of
        its K clusters are read (:func:`tasks.funnel.stored.shortlist_rows`, the rows
        :func:`tasks.funnel.stored.rank_units_stored` scores), so only those are embedded.
    passage_bm25 : :class:`tasks.funnel.fusion.PassageBM25` over ``index.passage_ids`` (needed
        with ``shortlists``).

    Returns
    -------
    (passages embedded, seconds)

    Raises
    ------
    ValueError
        ``shortlists`` without ``passage_bm25``.
    """
    if not hasattr(index, "ensure") or not questions:
        return 0, 0.0
    if shortlists and passage_bm25 is None:
        raise ValueError("fill_lazy_rows: shortlist settings need passage_bm25")
    t0 = time.perf_counter()
    rows = []
    for k in sorted(set(cluster_ks)):
        ids, _ = cluster_index.search(list(questions), k)
        rows += [index.rows_of_clusters([int(c) for c in r]) for r in ids]
    for k, m in sorted(set(shortlists)):
        ids, _ = cluster_index.search(list(questions), k)
        for question, r in zip(questions, ids):
            _, kept, _ = shortlist_rows(index, [int(c) for c in r],
                                        lambda rr, q=question: passage_bm25.scores(q, rr), m)
            rows.append(kept)
    if passage_index is not None and n_retrieve:
        row_of = index.row_of()
        ids, _ = passage_index.search(list(questions), n_retrieve)
        rows.append(np.asarray([row_of[p] for r in ids for p in r], np.int64))
    n = index.ensure(np.concatenate(rows), preranker.model, preranker.tokenizer, preranker.batch_size) if rows else 0
    return n, time.perf_counter() - t0
