"""Retrieval settings under evaluation: flat (BM25 / dense over passages, optional re-ranking)
and progressive (FunnelRAG: clusters → document units → passages, optional FiD post-ranking).

Flat (FunnelRAG Table 2, "flat"): the retriever returns the top ``n_retrieve`` passages of the
whole passage collection (paper: 21M → 400p); optionally the pre-ranker re-ranks them and the
top ``n_final`` are kept (400p → 4p); without re-ranking the retriever's top ``n_final`` are kept.

Progressive (Table 2, "progressive"; Tables 11–13 vary K and N): BM25 over clusters → top-K
clusters (600K → 80c); later chunking into document units and pre-ranking → top-N units
(80c → 8d), :func:`tasks.funnel.candidates.build_candidates`; then either the FiD post-ranker ranks
the passages of those units by their Eq. 3 cross-attention score (:mod:`tasks.funnel.attention`) and
the top ``n_final`` are kept (8d → 4p), or, without post-ranking, the ``n_final`` passages with
the best pre-ranker passage scores (whole-unit MaxP scoring), or with ``unit_scoring="first"``
the first ones in pre-ranker order (unit rank, then position inside the unit).

Every question is run on its own and timed per stage (:mod:`tasks.evaluate.timing`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data_contracts.base import atomic_write
from models.preranker import score_grouped
from tasks.evaluate.timing import StageClock, StageOutcome
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, score_candidates
from tasks.funnel.candidates import CandidatesConfig, build_candidates
from tasks.funnel.fusion import FusionConfig
from tasks.funnel.unit_scoring import UNIT_SCORING
from tasks.qa.metrics import TokenCache, passage_hits

log = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")
VECTORS = ("on-the-fly", "stored")   # pre-ranker passage vectors: encoded per query, or the embedding index


@dataclass(frozen=True)
class FlatSetting:
    """A flat setting: ``retriever`` (``bm25`` | ``dense``) over passages → ``n_retrieve``
    passages → ``n_final`` passages, in retriever order or re-ranked by a pre-ranker."""

    retriever: str = "bm25"
    n_retrieve: int = 400
    n_final: int = 4

    def __post_init__(self) -> None:
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"FlatSetting.retriever must be one of {RETRIEVERS}, got {self.retriever!r}")
        if self.n_final < 1 or self.n_retrieve < self.n_final:
            raise ValueError(f"FlatSetting needs n_retrieve >= n_final >= 1, got {self}")


@dataclass(frozen=True)
class ProgressiveSetting:
    """A progressive setting: K clusters → N document units → H passages (``n_final``); the
    last step is run both ways, in pre-ranker order and by the FiD post-ranker (with a reader).

    unit_scoring : ``"maxp"`` (a unit scores as its best passage; the final passages without
        post-ranking are the best-scoring ones) or ``"first"`` (the unit text, truncated by the
        pre-ranker; the final passages are the first ones of the best units).
    vectors : ``"on-the-fly"`` (the pre-ranker encodes the units' passages per query) or
        ``"stored"`` (bi-encoder only: the published embedding index,
        :mod:`tasks.evaluate.stored_retrieval`).
    fusion, bm25_weight, rrf_k, bm25_pool : the unit score (:class:`tasks.funnel.fusion.FusionConfig`):
        ``"none"`` is MaxP alone; ``"convex"`` / ``"rrf"`` fuse it with the units' BM25 scores
        (stored vectors only).
    passage_bm25_weight : ``w`` of the final passages' score (stored vectors only): 0 ranks the
        passages of the top-N units by their dense score; ``w`` > 0 by ``w · mm(BM25) + (1 − w) ·
        mm(dense)`` over them (:func:`tasks.funnel.fusion.fuse_passages`).
    passage_shortlist : M (stored vectors only): 0 scores every passage of the K clusters; M > 0
        scores only the M with the highest passage BM25 scores (the BM25 shortlist,
        :func:`tasks.funnel.stored.bm25_shortlist`), so units rank by their best shortlisted
        passage and the final passages are shortlisted ones.
    """

    n_clusters: int = 80
    n_units: int = 8
    n_final: int = 4
    unit_scoring: str = "maxp"
    vectors: str = "on-the-fly"
    fusion: str = "none"
    bm25_weight: float = 0.5
    rrf_k: float = 60.0
    bm25_pool: str = "max"
    passage_bm25_weight: float = 0.0
    passage_shortlist: int = 0

    def __post_init__(self) -> None:
        if min(self.n_clusters, self.n_units, self.n_final) < 1:
            raise ValueError(f"ProgressiveSetting sizes must be >= 1, got {self}")
        if self.unit_scoring not in UNIT_SCORING or self.vectors not in VECTORS:
            raise ValueError(f"ProgressiveSetting: unit_scoring must be one of {UNIT_SCORING} and vectors one of "
                             f"{VECTORS}, got {self.unit_scoring!r}, {self.vectors!r}")
        if self.vectors == "stored" and self.unit_scoring != "maxp":
            raise ValueError("ProgressiveSetting: stored vectors are passage vectors, so unit_scoring must be 'maxp'")
        self.fusion_config()   # checks the fusion fields
        if self.fusion != "none" and self.vectors != "stored":
            raise ValueError(f"ProgressiveSetting: fusion {self.fusion!r} needs vectors='stored'")
        if not 0.0 <= self.passage_bm25_weight <= 1.0:
            raise ValueError(f"ProgressiveSetting: passage_bm25_weight must be in [0, 1], got {self.passage_bm25_weight}")
        if self.passage_bm25_weight and self.vectors != "stored":
            raise ValueError("ProgressiveSetting: passage_bm25_weight needs vectors='stored'")
        if self.passage_shortlist and (self.vectors != "stored" or self.passage_shortlist < self.n_final):
            raise ValueError("ProgressiveSetting: passage_shortlist needs vectors='stored' and at least n_final "
                             f"passages, got {self.passage_shortlist} with {self.vectors!r}, n_final {self.n_final}")

    @property
    def uses_bm25(self) -> bool:
        """Whether the setting reads the passages' BM25 scores (a unit fusion, a passage weight or
        a shortlist)."""
        return self.fusion != "none" or self.passage_bm25_weight > 0 or self.passage_shortlist > 0

    def fusion_config(self) -> FusionConfig:
        """The unit-score fusion of this setting."""
        return FusionConfig(self.fusion, self.bm25_weight, self.rrf_k, self.bm25_pool)

    def label(self) -> str:
        """Short name of the unit and passage scores: ``""`` (MaxP, dense passages),
        ``"convex-w0.3-max"``, ``"rrf-w0.5-k60-max"``, ``"pw0.3"`` (passages fused with BM25, w = 0.3),
        ``"sl50"`` (a BM25 shortlist of 50 passages)."""
        parts = []
        if self.fusion != "none":
            k = f"-k{self.rrf_k:g}" if self.fusion == "rrf" else ""
            parts.append(f"{self.fusion}-w{self.bm25_weight:g}{k}-{self.bm25_pool}")
        if self.passage_bm25_weight:
            parts.append(f"pw{self.passage_bm25_weight:g}")
        if self.passage_shortlist:
            parts.append(f"sl{self.passage_shortlist}")
        return "-".join(parts)


@dataclass(frozen=True)
class Question:
    """One evaluation question (a row of the ``questions`` table)."""

    question_id: str
    question: str
    answers: tuple[str, ...]


@dataclass
class QueryResult:
    """Outcome of one question in one setting.

    passages : final ranking ``[(passage_id, title, text)]``, best first, ``n_final`` long (or
        fewer when fewer candidates exist).
    hits : DPR ``has_answer`` of each final passage.
    stages : per-stage counts, seconds and answer hits, in funnel order.
    """

    question_id: str
    passages: list[tuple[str, str, str]]
    hits: list[bool]
    stages: list[StageOutcome]


def questions_from_table(table: pa.Table) -> list[Question]:
    """:class:`Question` rows of a ``questions`` table (in table order)."""
    return [Question(q, text, tuple(a)) for q, text, a in zip(
        table["question_id"].to_pylist(), table["question"].to_pylist(), table["answers"].to_pylist())]


class PassageLookup:
    """``passage_id → (title, text)`` over the corpus ``passages`` table (the texts a flat
    retriever hands to the re-ranker)."""

    def __init__(self, passages: pa.Table):
        ids = passages["passage_id"].to_pylist()
        self._row = {p: i for i, p in enumerate(ids)}
        # one contiguous array each: ``take`` on a ChunkedArray costs ~14 ms per call on
        # the 146K Wikispeedia passages (3 chunks), ~0.2 ms on one array (measured here);
        # large_string so that one array may hold more than 2 GiB of text (full Wikipedia)
        self._titles = passages["title"].cast(pa.large_string()).combine_chunks()
        self._texts = passages["text"].cast(pa.large_string()).combine_chunks()

    def __len__(self) -> int:
        return len(self._row)

    def get(self, passage_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """``[(passage_id, title, text)]`` in the order asked.

        Raises
        ------
        KeyError
            An id is not a corpus passage (names it).
        """
        try:
            rows = pa.array([self._row[p] for p in passage_ids], pa.int64())
        except KeyError as exc:
            raise KeyError(f"passage id {exc.args[0]!r} is not in the corpus passages table") from exc
        return list(zip(passage_ids, self._titles.take(rows).to_pylist(), self._texts.take(rows).to_pylist()))


PASSAGE_TEXT_FILE = "passages.text.arrow"   # with its by-id permutation (content ids)


def write_passage_text_store(passages_parquet: Path, out: Path, batch_rows: int = 65_536) -> Path:
    """Copy ``passage_id``, ``title``, ``text`` of a corpus ``passages.parquet`` into an
    uncompressed Arrow IPC file that :class:`MappedPassageLookup` memory-maps (streamed batch by
    batch after one read of the id column; written atomically), with a fourth column ``by_id``:
    row ``i`` holds the corpus row of the ``i``-th smallest passage id (ids are content ids and do
    not sort in file order), for the lookup's binary search.

    Raises
    ------
    ValueError
        A passage id repeats (names it and its rows).
    """
    pf = pq.ParquetFile(passages_parquet)
    cols = ["passage_id", "title", "text"]
    ids = pf.read(columns=["passage_id"]).column("passage_id")
    by_id = pc.sort_indices(ids).to_numpy().astype(np.int64)   # (n_passages,) rows in id order
    if by_id.size > 1:
        ordered = ids.take(pa.array(by_id))
        same = pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1)).to_numpy(zero_copy_only=False)
        if same.any():
            i = int(np.flatnonzero(same)[0])
            raise ValueError(f"{passages_parquet}: passage id {ordered[i].as_py()!r} repeats "
                             f"(rows {int(by_id[i])} and {int(by_id[i + 1])}); the text store needs unique ids")
    schema = pa.schema([pf.schema_arrow.field(k) for k in cols] + [pa.field("by_id", pa.int64(), nullable=False)])

    def write(tmp: Path) -> None:
        row = 0
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
                n = batch.num_rows
                writer.write_batch(pa.RecordBatch.from_arrays([*batch.columns, pa.array(by_id[row:row + n])], schema=schema))
                row += n

    atomic_write(Path(out), write)
    return Path(out)


class MappedPassageLookup:
    """``passage_id → (title, text)`` over the memory-mapped Arrow copy of the passages table
    (:func:`write_passage_text_store`): opening it reads nothing that grows with the corpus, a
    lookup finds a row by binary search over the ids in the order of the ``by_id`` column (~23 probes at 5M passages) and reads
    only that row's pages. Same ``get`` as :class:`PassageLookup`; ``get_rows`` takes corpus rows
    (the BM25 passage index's and the mapped embedding index's row numbers)."""

    def __init__(self, path: Path):
        self._source = pa.memory_map(str(path))
        reader = pa.ipc.open_file(self._source)
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches])        # (n_batches + 1,)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _cell(self, row: int, column: str):
        b = int(np.searchsorted(self._starts, row, side="right") - 1)
        return self._batches[b].column(column)[row - int(self._starts[b])].as_py()

    def row_of(self, passage_id: str) -> int:
        """The corpus row of ``passage_id``.

        Raises
        ------
        KeyError
            Not a corpus passage (names it).
        """
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._cell(self._cell(mid, "by_id"), "passage_id") < passage_id:
                lo = mid + 1
            else:
                hi = mid
        row = self._cell(lo, "by_id") if lo < len(self) else -1
        if row < 0 or self._cell(row, "passage_id") != passage_id:
            raise KeyError(f"passage id {passage_id!r} is not in the corpus passages table")
        return row

    def get_rows(self, rows: Sequence[int]) -> list[tuple[str, str, str]]:
        """``[(passage_id, title, text)]`` of corpus ``rows``, in the order asked."""
        out = []
        for r in rows:
            b = int(np.searchsorted(self._starts, int(r), side="right") - 1)
            batch, i = self._batches[b], int(r) - int(self._starts[b])
            out.append((batch.column(0)[i].as_py(), batch.column(1)[i].as_py(), batch.column(2)[i].as_py()))
        return out

    def get(self, passage_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """``[(passage_id, title, text)]`` in the order asked.

        Raises
        ------
        KeyError
            An id is not a corpus passage (names it).
        """
        return self.get_rows([self.row_of(p) for p in passage_ids])


class LabeledPreRanker:
    """A loaded pre-ranker (:mod:`models.preranker`) with a label; ``score(q, docs)`` is Eq. 1."""

    def __init__(self, label: str, model, tokenizer, batch_size: int = 32):
        self.label, self.model, self.tokenizer, self.batch_size = label, model, tokenizer, batch_size

    def score(self, question: str, docs: Sequence[str]) -> np.ndarray:
        """``f(q, d)`` for each document, float32 ``(len(docs),)``."""
        return score_grouped(self.model, self.tokenizer, [question], list(docs),
                             [(0, j) for j in range(len(docs))], self.batch_size)

    def score_passages(self, question: str, passages: Sequence[tuple[str, str, str]]) -> np.ndarray:
        """``f(q, p)`` of ``[(passage_id, title, text)]`` from their texts, float32 ``(len(passages),)``."""
        return self.score(question, [t for _, _, t in passages])


Retrieve = Callable[[str, int], list[str]]  # (question, k) -> passage ids, best first


def run_flat(questions: Sequence[Question], retrieve: Retrieve, lookup: PassageLookup, setting: FlatSetting,
             prerankers: Sequence[LabeledPreRanker], tokens: TokenCache) -> dict[str, list[QueryResult]]:
    """Evaluate one flat setting question by question, without and with re-ranking.

    The retrieval stage runs once per question and is shared by the plain variant and by one
    re-ranked variant per pre-ranker.

    Parameters
    ----------
    questions : the evaluation questions.
    retrieve : ``retrieve(question, k) -> passage ids`` (BM25 or dense; query encoding included).
    lookup : passage texts for re-ranking and answer matching.
    setting : FlatSetting
    prerankers : re-rankers, one re-ranked variant each (labels must be unique and non-empty).
    tokens : DPR-token cache shared across settings.

    Returns
    -------
    dict
        ``{"": plain results, label: re-ranked results}``. Stages: ``retrieval`` (→
        ``n_retrieve`` p, passage text lookup included) and, re-ranked, ``reranking`` (→
        ``n_final`` p).

    Raises
    ------
    ValueError
        Pre-ranker labels repeat or are empty.
    """
    labels = [r.label for r in prerankers]
    if len(set(labels)) != len(labels) or "" in labels:
        raise ValueError(f"pre-ranker labels must be unique and non-empty, got {labels}")
    out: dict[str, list[QueryResult]] = {"": [], **{label: [] for label in labels}}
    for q in questions:
        clock = StageClock()
        with clock.stage("retrieval"):
            ids = retrieve(q.question, setting.n_retrieve)
            retrieved = lookup.get(ids)                                   # passage texts from the store
        hits = passage_hits(q.answers, [(p, t) for p, _, t in retrieved], tokens)
        first = StageOutcome("retrieval", "p", len(lookup), len(ids), clock["retrieval"], any(hits))
        out[""].append(QueryResult(q.question_id, retrieved[:setting.n_final], hits[:setting.n_final], [first]))
        for ranker in prerankers:
            clock = StageClock()
            with clock.stage("reranking"):
                scores = ranker.score_passages(q.question, retrieved)              # (n_retrieve,)
                order = sorted(range(len(retrieved)), key=lambda j: (-float(scores[j]), j))[:setting.n_final]
            top_hits = [hits[j] for j in order]
            rerank = StageOutcome("reranking", "p", len(retrieved), len(order), clock["reranking"], any(top_hits))
            out[ranker.label].append(QueryResult(q.question_id, [retrieved[j] for j in order], top_hits, [first, rerank]))
    return out


def run_progressive(questions: pa.Table, cluster_index, members_of, seg_cfg, token_counter,
                    setting: ProgressiveSetting, preranker: LabeledPreRanker, reader=None, attention_cfg=None,
                    attention_run=None) -> dict[bool, list[QueryResult]]:
    """Evaluate one progressive setting question by question (FunnelRAG's funnel).

    The stages up to pre-ranking are shared by the variants without and with post-ranking, so
    they run once per question; the post-ranked variant's time adds the post-ranking stage.

    Parameters
    ----------
    questions : pa.Table
        ``questions`` rows (:data:`data_contracts.funnel.QUESTIONS`).
    cluster_index : BM25 over clusters (:meth:`tasks.corpus.published.CorpusVersion.cluster_index`).
    members_of : :meth:`tasks.corpus.published.CorpusVersion.members_of`.
    seg_cfg, token_counter : the corpus build's segmentation config and token counter, so later
        chunking cuts the same units and passages as the corpus.
    setting : ProgressiveSetting
    preranker : the pre-ranker scoring document units (Eq. 1).
    reader : ``(model, tokenizer)`` of the FiD post-ranker (:class:`models.fid.FiDReader`, eager
        attention), or None for no post-ranked variant.
    attention_cfg, attention_run : :class:`tasks.funnel.attention.AttentionScoreConfig` /
        :class:`tasks.funnel.attention.AttentionRunConfig` of Eq. 3 (defaults: Eq. 3 as published).

    Returns
    -------
    dict
        ``{False: results without post-ranking, True: results with it}`` (``True`` only with a
        reader). Stages: ``retrieval`` (→ K c), ``chunking`` (→ units d), ``preranking``
        (→ N d) and, post-ranked, ``postranking`` (→ H p).
    """
    cand_cfg = CandidatesConfig(n_clusters=setting.n_clusters, n_units=setting.n_units, batch_size=preranker.batch_size,
                                unit_scoring=setting.unit_scoring)
    attention_cfg = attention_cfg or AttentionScoreConfig()
    attention_run = attention_run or AttentionRunConfig()
    n_clusters_total = len(cluster_index)
    out: dict[bool, list[QueryResult]] = {False: []}
    if reader is not None:
        out[True] = []
    for i in range(questions.num_rows):
        qrow = questions.slice(i, 1)
        qid = qrow["question_id"][0].as_py()
        cs = build_candidates(qrow, cluster_index, members_of, seg_cfg, token_counter,
                              preranker.model, preranker.tokenizer, cand_cfg)
        t = cs.timings
        pool = cs.unit_pool.to_pydict()
        any_unit = any(pool["has_answer"])
        top_units = [h for h, r in zip(pool["has_answer"], pool["prerank_rank"]) if r < setting.n_units]
        c = cs.candidates
        cands = sorted(zip(c["unit_rank"].to_pylist(), c["passage_position"].to_pylist(), c["passage_id"].to_pylist(),
                           c["title"].to_pylist(), c["text"].to_pylist(), c["has_answer"].to_pylist()))
        n_clusters = len(set(pool["cluster_id"]))
        stages = [
            StageOutcome("retrieval", "c", n_clusters_total, n_clusters, t["retrieval"], any_unit),
            StageOutcome("chunking", "d", n_clusters, len(pool["unit_id"]), t["chunking"], any_unit),
            StageOutcome("preranking", "d", len(pool["unit_id"]), len(top_units), t["preranking"], any(top_units)),
        ]
        if cs.passage_scores:            # MaxP: the best passages of the top-N units
            cands.sort(key=lambda r: (-cs.passage_scores[(qid, r[2])], r[0], r[1]))
        plain = cands[:setting.n_final]
        out[False].append(QueryResult(qid, [(r[2], r[3], r[4]) for r in plain], [bool(r[5]) for r in plain], stages))
        if reader is None:
            continue
        clock = StageClock()
        with clock.stage("postranking"):
            if cands:
                scored = score_candidates(c, qrow, reader[0], reader[1], attention_cfg, attention_run, show_progress=False)
                score = dict(zip(scored["passage_id"].to_pylist(), scored["score"].to_pylist()))
                ranked = sorted(range(len(cands)), key=lambda j: (-score[cands[j][2]], j))[:setting.n_final]
            else:
                ranked = []
        final = [cands[j] for j in ranked]
        post = StageOutcome("postranking", "p", len(cands), len(final), clock["postranking"], any(r[5] for r in final))
        out[True].append(QueryResult(qid, [(r[2], r[3], r[4]) for r in final], [bool(r[5]) for r in final],
                                     [*stages, post]))
    return out
