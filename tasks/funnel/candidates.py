"""The FunnelRAG funnel per question: BM25 clusters → later chunking → pre-ranking → passages.

1. Retrieval stage: BM25 over cluster texts (:class:`tasks.corpus.index.BM25Index`), top-K clusters
   (FunnelRAG: K = 80).
2. Later chunking: every retrieved cluster is cut into ~1K-token document units of ~100-word
   passages with :func:`tasks.corpus.segment.segment_cluster` — the very function the corpus build
   uses, so ids equal the corpus ``document_units``/``passages`` ids. A cluster retrieved by
   several questions is chunked once.
3. Pre-ranking stage: the pre-ranker ``f(q, d)`` (Eq. 1) scores every unit of the K clusters
   (from its text, or from all of its passages: ``unit_scoring="maxp"``); the top-N units
   (FunnelRAG: N = 8) go on.
4. Their passages form the post-ranker's input (the candidates table).

Answer recall uses DPR ``has_answer`` (:mod:`tasks.qa.questions`) on unit and passage texts.
Per-stage wall times are reported in seconds.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.funnel import CANDIDATES, UNIT_POOL, UNITS
from funnelrag.progress import Progress, progress
from models.preranker import score_grouped
from tasks.corpus.segment import ClusterSegments, DocumentUnit, Passage, SegmentConfig, segment_cluster
from tasks.funnel.embeddings import passage_text
from tasks.funnel.unit_scoring import UNIT_SCORING, maxp_pool_scores, stored_maxp_pool_scores, stored_text_scores
from tasks.qa.metrics import first_hit_ranks, recall_at_ranks
from tasks.qa.questions import AnswerMatcher, dpr_tokens

log = logging.getLogger(__name__)

MembersOf = Callable[[list[int]], dict[int, list[tuple[int, str, str]]]]


@dataclass(frozen=True)
class CandidatesConfig:
    """Funnel sizes.

    n_clusters : K, BM25 clusters per question (FunnelRAG: 80).
    n_units : N, pre-ranked document units kept per question (FunnelRAG: 8).
    batch_size : pre-ranker pairs (or texts) per forward pass.
    unit_scoring : ``"first"`` — the pre-ranker reads the unit text (truncated to its
        ``max_length``); ``"maxp"`` — whole-unit scoring, the best of its passages' scores
        (:mod:`tasks.funnel.unit_scoring`), which also scores every candidate passage.
    """

    n_clusters: int = 80
    n_units: int = 8
    batch_size: int = 32
    unit_scoring: str = "first"

    def __post_init__(self) -> None:
        if self.n_clusters < 1 or self.n_units < 1 or self.batch_size < 1:
            raise ValueError(f"CandidatesConfig sizes must be >= 1, got {self}")
        if self.unit_scoring not in UNIT_SCORING:
            raise ValueError(f"unit_scoring must be one of {UNIT_SCORING}, got {self.unit_scoring!r}")


@dataclass
class CandidateSet:
    """Output of :func:`build_candidates`.

    unit_pool : every (question, unit of its K clusters) with BM25 and pre-ranker scores.
    candidates : passages of each question's top-N units.
    units : text of every unit in the pool (for re-ranking and distillation).
    timings : seconds per stage (``retrieval``, ``chunking``, ``answer_matching``, ``preranking``).
    passage_scores : ``{(question_id, passage_id): f(q, p)}`` of every passage of the pool's
        units (``unit_scoring="maxp"`` only; empty otherwise).
    """

    unit_pool: pa.Table
    candidates: pa.Table
    units: pa.Table
    timings: dict[str, float] = field(default_factory=dict)
    passage_scores: dict[tuple[str, str], float] = field(default_factory=dict)


def chunk_clusters(cluster_ids: Sequence[int], members_of: MembersOf, seg_cfg: SegmentConfig,
                   token_counter) -> dict[int, ClusterSegments]:
    """Later chunking of the distinct ``cluster_ids``: ``{cluster_id: ClusterSegments}``."""
    unique = sorted({int(c) for c in cluster_ids})
    members = members_of(unique)
    return {c: segment_cluster(c, members[c], seg_cfg, token_counter)
            for c in progress(unique, "later chunking of candidate clusters", unit="clusters")}


def published_segments(passages: pa.Table, cluster_ids: Sequence[int]) -> dict[int, ClusterSegments]:
    """Later chunking of published clusters, read back: ``{cluster_id: ClusterSegments}`` of the
    distinct ``cluster_ids`` from a corpus ``passages`` table.

    The corpus build cut every cluster with :func:`tasks.corpus.segment.segment_cluster` and
    wrote its units' passages in order (:func:`tasks.corpus.segment.segments_to_tables`), so
    these are the units and passages :func:`chunk_clusters` would cut again from the members
    (same ids, texts and token counts), without tokenizing the clusters a second time.

    Raises
    ------
    KeyError
        A cluster id has no passage in ``passages`` (not a cluster of this corpus version).
    """
    unique = sorted({int(c) for c in cluster_ids})
    sub = passages.filter(pc.is_in(passages["cluster_id"], pa.array(unique, pa.int64())))
    by_unit: dict[str, list[Passage]] = {}
    cols = [sub[n].to_pylist() for n in ("passage_id", "unit_id", "cluster_id", "doc_id", "title", "text",
                                          "n_words", "n_tokens")]
    for pid, uid, cid, did, title, text, n_words, n_tokens in zip(*cols):   # table order = position order
        by_unit.setdefault(uid, []).append(Passage(pid, uid, cid, did, title, text, n_words, n_tokens))
    units: dict[int, list[DocumentUnit]] = {c: [] for c in unique}
    for uid, ps in by_unit.items():
        cid = ps[0].cluster_id
        units[cid].append(DocumentUnit(uid, cid, len(units[cid]), tuple(ps)))
    empty = [c for c in unique if not units[c]]
    if empty:
        raise KeyError(f"cluster {empty[0]} has no passage in the corpus passages table ({len(empty)} such)")
    return {c: ClusterSegments(c, tuple(units[c])) for c in unique}


def _units_table(segments: dict[int, ClusterSegments]) -> pa.Table:
    rows = [(u.unit_id, u.cluster_id, u.title, u.text, len(u.passages))
            for c in sorted(segments) for u in segments[c].units]
    cols = dict(zip(UNITS.schema.names, map(list, zip(*rows)))) if rows else {n: [] for n in UNITS.schema.names}
    return UNITS.validate(pa.table(cols, schema=UNITS.schema))


def build_candidates(questions: pa.Table, cluster_index, members_of: MembersOf, seg_cfg: SegmentConfig,
                     token_counter, model, tokenizer, cfg: CandidatesConfig = CandidatesConfig(),
                     index=None, unit_store=None, segments_of=None) -> CandidateSet:
    """Run the funnel for every question.

    Parameters
    ----------
    questions : pa.Table
        ``questions`` rows (question_id, question, answers, ...).
    cluster_index : tasks.corpus.index.BM25Index
        BM25 over cluster texts; ids are cluster ids as strings.
    members_of : callable
        ``members_of(cluster_ids) -> {cluster_id: [(doc_id, title, text), ...]}`` in cluster
        order (:meth:`tasks.corpus.published.CorpusVersion.members_of`).
    seg_cfg, token_counter : the corpus build's segmentation config and its token counter.
    model, tokenizer : the pre-ranker (:mod:`models.preranker`).
    cfg : CandidatesConfig
    index : optional :class:`tasks.funnel.embeddings.EmbeddingIndex` of ``model``'s weights over
        this corpus (checked by the caller): with ``unit_scoring="maxp"``, passage vectors are read
        from it instead of computed (:func:`tasks.funnel.unit_scoring.stored_maxp_pool_scores`;
        same ranking up to float rounding).
    unit_store : optional :class:`tasks.funnel.vector_store.VectorStore` of ``model``'s document
        tower (a bi-encoder with ``unit_scoring="first"``): unit vectors are read from it, and the
        units it lacks embedded once and added (:func:`tasks.funnel.unit_scoring.stored_text_scores`;
        same ranking up to float rounding).
    segments_of : optional ``segments_of(cluster_ids) -> {cluster_id: ClusterSegments}``: the
        published corpus's own cut (:func:`published_segments`) instead of later chunking the
        members again (the same units and passages).

    Returns
    -------
    CandidateSet
        Contract-checked ``unit_pool``, ``candidates`` and ``units`` tables, sorted by
        question id then rank, and the per-stage timings (seconds).

    Raises
    ------
    ValueError
        The index returns an id that is not an integer cluster id, ``index`` is given with
        ``unit_scoring="first"`` (stored vectors are passage vectors), or ``unit_store`` with
        ``unit_scoring="maxp"`` or a pre-ranker that is not a bi-encoder.
    """
    if index is not None and cfg.unit_scoring != "maxp":
        raise ValueError("stored passage vectors (index=...) need unit_scoring='maxp', "
                         f"got {cfg.unit_scoring!r}")
    _check_unit_store(unit_store, model, cfg.unit_scoring == "first")
    timings: dict[str, float] = {}
    qids = questions["question_id"].to_pylist()
    texts = questions["question"].to_pylist()
    answers = questions["answers"].to_pylist()

    t0 = time.perf_counter()
    ids, bm25 = cluster_index.search(texts, cfg.n_clusters)   # (n_questions, K') each
    try:
        cluster_ids = [[int(c) for c in row] for row in ids]
    except ValueError as exc:
        raise ValueError(f"cluster index returned a non-integer cluster id: {exc}") from exc
    timings["retrieval"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    retrieved = [c for row in cluster_ids for c in row]
    segments = (chunk_clusters(retrieved, members_of, seg_cfg, token_counter) if segments_of is None
                else segments_of(retrieved))
    units = {u.unit_id: u for seg in segments.values() for u in seg.units}
    timings["chunking"] = time.perf_counter() - t0

    # one pool row per (question, unit of its clusters), clusters in BM25 order
    pool = [(qi, rank, c, float(bm25[qi][rank]), u.unit_id)
            for qi, row in enumerate(cluster_ids) for rank, c in enumerate(row) for u in segments[c].units]
    t0 = time.perf_counter()
    token_cache: dict[str, list[str]] = {}

    def tokens(key: str, text: str) -> list[str]:
        if key not in token_cache:
            token_cache[key] = dpr_tokens(text)
        return token_cache[key]

    matchers = [AnswerMatcher(a) for a in answers]
    unit_answer = [matchers[qi].tokens_match(tokens(uid, units[uid].text)) for qi, _, _, _, uid in pool]
    timings["answer_matching"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    unit_order = sorted(units)
    unit_row = {uid: j for j, uid in enumerate(unit_order)}
    passage_scores: dict[tuple[str, str], float] = {}
    if cfg.unit_scoring == "maxp":
        passages_of = {uid: [(p.passage_id, passage_text(p.title, p.text)) for p in units[uid].passages] for uid in units}
        rows = [(qi, uid) for qi, _, _, _, uid in pool]
        if index is not None:
            scores, by_qi = stored_maxp_pool_scores(model, tokenizer, texts, rows, passages_of, index,
                                                    cfg.batch_size)                    # (n_pool,)
        else:
            scores, by_qi = maxp_pool_scores(model, tokenizer, texts, rows, passages_of, cfg.batch_size)
        passage_scores = {(qids[qi], pid): s for (qi, pid), s in by_qi.items()}
    elif unit_store is not None:
        scores, _ = stored_text_scores(model, tokenizer, texts, [units[u].text for u in unit_order],
                                       [(qi, unit_row[uid]) for qi, _, _, _, uid in pool], unit_store,
                                       cfg.batch_size)                                          # (n_pool,)
    else:
        with Progress("pre-rank candidate units", total=len(unit_order), unit="units") as bar:
            scores = score_grouped(model, tokenizer, texts, [units[u].text for u in unit_order],
                                   [(qi, unit_row[uid]) for qi, _, _, _, uid in pool], cfg.batch_size, bar)  # (n_pool,)
    timings["preranking"] = time.perf_counter() - t0

    by_q: dict[int, list[int]] = {}
    for r, (qi, *_rest) in enumerate(pool):
        by_q.setdefault(qi, []).append(r)
    pool_cols = {n: [] for n in UNIT_POOL.schema.names}
    cand_cols = {n: [] for n in CANDIDATES.schema.names}
    t0 = time.perf_counter()
    for qi in sorted(by_q, key=lambda i: qids[i]):
        ranked = sorted(by_q[qi], key=lambda r: (-scores[r], pool[r][4]))
        for prerank, r in enumerate(ranked):
            _, crank, cid, bscore, uid = pool[r]
            for key, value in (("question_id", qids[qi]), ("cluster_id", cid), ("cluster_rank", crank),
                               ("bm25_score", bscore), ("unit_id", uid), ("prerank_score", float(scores[r])),
                               ("prerank_rank", prerank), ("has_answer", unit_answer[r])):
                pool_cols[key].append(value)
            if prerank >= cfg.n_units:
                continue
            for pos, p in enumerate(units[uid].passages):
                hit = matchers[qi].tokens_match(tokens(p.passage_id, p.text))
                for key, value in (("question_id", qids[qi]), ("cluster_id", cid), ("bm25_score", bscore),
                                   ("unit_id", uid), ("unit_rank", prerank), ("prerank_score", float(scores[r])),
                                   ("unit_has_answer", unit_answer[r]), ("passage_id", p.passage_id),
                                   ("passage_position", pos), ("title", p.title), ("text", p.text),
                                   ("has_answer", hit)):
                    cand_cols[key].append(value)
    timings["answer_matching"] += time.perf_counter() - t0
    return CandidateSet(unit_pool=UNIT_POOL.validate(pa.table(pool_cols, schema=UNIT_POOL.schema)),
                        candidates=CANDIDATES.validate(pa.table(cand_cols, schema=CANDIDATES.schema)),
                        units=_units_table(segments), timings=timings, passage_scores=passage_scores)


def rerank_pool(pool: pa.Table, units: pa.Table, questions: pa.Table, model, tokenizer,
                batch_size: int = 32, passages_of: dict[str, list[tuple[str, str]]] | None = None,
                index=None, unit_store=None) -> pa.Table:
    """The same unit pool re-scored and re-ranked by another pre-ranker (e.g. after distillation).

    Parameters
    ----------
    pool, units, questions : ``unit_pool``, ``units`` and ``questions`` tables.
    model, tokenizer : the pre-ranker (:mod:`models.preranker`).
    batch_size : pairs (or texts) per forward pass.
    passages_of : ``unit_id → [(passage_id, text)]`` of every pool unit: units score by MaxP
        (:mod:`tasks.funnel.unit_scoring`); None: from the unit text (``unit_scoring="first"``).
    index : with ``passages_of``, an :class:`tasks.funnel.embeddings.EmbeddingIndex` of the
        model's document tower (checked by the caller): passage vectors are read, not computed.
    unit_store : without ``passages_of``, an optional :class:`tasks.funnel.vector_store.VectorStore`
        of a bi-encoder's document tower: unit vectors are read from it (and the missing ones
        embedded once and added), as in :func:`build_candidates`.

    Raises
    ------
    KeyError
        A pool row names a question or unit missing from ``questions`` / ``units``.
    ValueError
        ``unit_store`` with ``passages_of`` or with a pre-ranker that is not a bi-encoder.
    """
    _check_unit_store(unit_store, model, passages_of is None)
    q_row = {q: i for i, q in enumerate(questions["question_id"].to_pylist())}
    u_row = {u: j for j, u in enumerate(units["unit_id"].to_pylist())}
    qids, uids = pool["question_id"].to_pylist(), pool["unit_id"].to_pylist()
    for q, u in zip(qids, uids):
        if q not in q_row or u not in u_row:
            raise KeyError(f"unit pool row ({q}, {u}) has no question or unit text")
    texts = questions["question"].to_pylist()
    if passages_of is None and unit_store is not None:
        scores, _ = stored_text_scores(model, tokenizer, texts, units["text"].to_pylist(),
                                       [(q_row[q], u_row[u]) for q, u in zip(qids, uids)], unit_store,
                                       batch_size)                                              # (n_pool,)
    elif passages_of is None:
        with Progress("re-rank pool units", total=units.num_rows, unit="units") as bar:
            scores = score_grouped(model, tokenizer, texts, units["text"].to_pylist(),
                                   [(q_row[q], u_row[u]) for q, u in zip(qids, uids)], batch_size, bar)  # (n_pool,)
    else:
        rows = [(q_row[q], u) for q, u in zip(qids, uids)]
        if index is not None:
            scores, _ = stored_maxp_pool_scores(model, tokenizer, texts, rows, passages_of, index, batch_size)
        else:
            scores, _ = maxp_pool_scores(model, tokenizer, texts, rows, passages_of, batch_size)   # (n_pool,)
    order = sorted(range(len(qids)), key=lambda r: (qids[r], -scores[r], uids[r]))
    ranks = np.zeros(len(qids), dtype=np.int64)
    prev, k = None, 0
    for r in order:
        k = 0 if qids[r] != prev else k + 1
        prev, ranks[r] = qids[r], k
    out = pool.set_column(pool.schema.get_field_index("prerank_score"), "prerank_score", pa.array(scores, pa.float32()))
    out = out.set_column(out.schema.get_field_index("prerank_rank"), "prerank_rank", pa.array(ranks, pa.int16()))
    return UNIT_POOL.validate(out.take(pa.array(order)))


def _check_unit_store(unit_store, model, from_unit_text: bool) -> None:
    """Stored unit vectors are a bi-encoder's document-tower vectors of the unit text."""
    if unit_store is not None and (not from_unit_text or getattr(model, "kind", None) != "bi"):
        raise ValueError("stored unit vectors (unit_store=...) need unit_scoring='first' and a bi-encoder, "
                         f"got kind {getattr(model, 'kind', None)!r}")


def unit_passages(passages: pa.Table, unit_ids) -> dict[str, list[tuple[str, str]]]:
    """``unit_id → [(passage_id, passage_text)]`` of ``unit_ids`` from a corpus ``passages``
    table, passages in table (= position) order; the text is what a pre-ranker reads
    (:func:`tasks.funnel.embeddings.passage_text`)."""
    wanted = sorted(set(unit_ids))
    sub = passages.filter(pc.is_in(passages["unit_id"], pa.array(wanted, pa.string())))
    out: dict[str, list[tuple[str, str]]] = {}
    for uid, pid, title, text in zip(sub["unit_id"].to_pylist(), sub["passage_id"].to_pylist(),
                                     sub["title"].to_pylist(), sub["text"].to_pylist()):
        out.setdefault(uid, []).append((pid, passage_text(title, text)))
    return out


def answer_recall(pool: pa.Table, ks: Sequence[int], questions: Sequence[str] | None = None) -> dict[int, float]:
    """Answer recall of the pre-ranking stage: AR@k = share of questions with an answer-bearing
    unit among their top-k pre-ranked units (DPR has_answer).

    Parameters
    ----------
    pool : pa.Table
        ``unit_pool`` rows (question_id, prerank_rank, has_answer).
    ks : cut-offs (each >= 1).
    questions : question ids to average over (default: those in ``pool``); a question without
        pool rows counts as a miss.

    Returns
    -------
    dict
        ``{k: AR@k}``, each in [0, 1] (:func:`tasks.qa.metrics.recall_at_ranks`).

    Raises
    ------
    ValueError
        A cut-off is < 1.
    """
    first = first_hit_ranks(pool["question_id"].to_pylist(), pool["prerank_rank"].to_pylist(),
                            pool["has_answer"].to_pylist())
    qs = list(questions) if questions is not None else sorted(first)
    return recall_at_ranks([first.get(q) for q in qs], ks)
