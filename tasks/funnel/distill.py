"""L2G distillation of the pre-ranker with the pairwise BPR loss (FunnelRAG Eq. 6).

For every question, every pair of a positive document ``d+ ∈ D+`` and a negative ``d− ∈ D−``
(Eq. 5, :mod:`tasks.funnel.labels`) contributes::

    L = − log σ( S(q, d+) − S(q, d−) )                                         (Eq. 6)

computed as ``−logsigmoid(·)`` (stable for large differences), averaged over the pairs of a
question and then over the questions of a batch.

``S(q, d)`` is the pre-ranker's score of the document unit: from its text (``unit_scoring="first"``,
the first ``max_length`` tokens, :class:`BPRHooks`) or, as the funnel ranks units, the best of its
passages' scores ``S(q, d) = max_{p ∈ d} f(q, p)`` (``"maxp"``, :class:`MaxPBPRHooks`; the
gradient reaches the best passage of each unit). With ``towers="query"`` only the query tower of
a bi-encoder is trained (query-side fine-tuning): the document tower is frozen, so its passage
vectors are read from the published embedding index (or computed once) and stay valid after
distillation. When a question has more than
``max_pairs_per_question`` pairs, a subset is drawn from a hash of
``(seed, epoch, question, pair)``, so a resumed or repeated run sees the same pairs. Training
uses the shared loop :func:`funnelrag.training.train` through :class:`BPRHooks`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DistillConfig:
    """BPR distillation settings.

    epochs : passes over the questions (each pass re-draws the pair subsets).
    max_pairs_per_question : cap on (d+, d−) pairs per question per epoch.
    score_scale : multiplies ``S(q, d+) − S(q, d−)`` inside σ; 1 for a cross-encoder's logits,
        ~20 for a bi-encoder's cosine in [−1, 1] (the sentence-transformers scale).
    seed : seed of the pair sampling.
    freeze_embeddings : keep the trained encoder's input embeddings fixed (half of MiniLM's 22.7M
        parameters; a few hundred questions do not need them and AdamW then updates half as much).
    unit_scoring : ``"first"`` — ``S(q, d)`` from the unit text (truncated to ``max_length``);
        ``"maxp"`` — ``max`` over the unit's passages (:mod:`tasks.funnel.unit_scoring`).
    towers : ``"both"`` — the whole pre-ranker is trained (a bi-encoder's shared encoder);
        ``"query"`` — bi-encoder query-side fine-tuning: a separate query tower is trained, the
        document tower and its stored passage vectors stay as they are.
    """

    epochs: int = 1
    max_pairs_per_question: int = 16
    score_scale: float = 1.0
    seed: int = 0
    freeze_embeddings: bool = True
    unit_scoring: str = "first"
    towers: str = "both"

    def __post_init__(self) -> None:
        if self.unit_scoring not in ("first", "maxp"):
            raise ValueError(f"DistillConfig.unit_scoring must be 'first' or 'maxp', got {self.unit_scoring!r}")
        if self.towers not in ("both", "query"):
            raise ValueError(f"DistillConfig.towers must be 'both' or 'query', got {self.towers!r}")


def prepare_for_distillation(model: torch.nn.Module, cfg: DistillConfig) -> int:
    """Set what BPR trains; returns the trainable parameter count.

    ``towers="query"``: the bi-encoder gets a separate query tower (a copy of the document tower,
    :meth:`models.preranker.BiEncoderPreRanker.separate_towers`) and the document tower is
    frozen. ``freeze_embeddings``: the trained encoder's input embeddings are frozen.

    Raises
    ------
    ValueError
        ``towers="query"`` with a pre-ranker that is not a bi-encoder.
    """
    trained = model.backbone_module()
    if cfg.towers == "query":
        if getattr(model, "kind", None) != "bi":
            raise ValueError(f"towers='query' needs a bi-encoder pre-ranker, got kind {getattr(model, 'kind', None)!r}")
        model.separate_towers()
        model.encoder.requires_grad_(False)
        trained = model.query_encoder.backbone
    if cfg.freeze_embeddings:
        for p in trained.get_input_embeddings().parameters():
            p.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def bpr_loss(pos_scores: torch.Tensor, neg_scores: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Per-pair Eq. 6 loss ``−log σ(scale · (s+ − s−))``, shape ``(n_pairs,)``."""
    return -F.logsigmoid(scale * (pos_scores - neg_scores))


@dataclass(frozen=True)
class DistillExample:
    """One question's documents for Eq. 6: D+ and D− (sorted by unit id), each unit as
    ``(unit_id, payload)``: its text (``unit_scoring="first"``) or the tuple of its passages
    (``"maxp"``: passage texts, or rows of stored passage vectors)."""

    question_id: str
    question: str
    positives: tuple[tuple[str, Any], ...]   # (unit_id, text or passages)
    negatives: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class PairItem:
    """A question's (d+, d−) pairs for one epoch, as indices into ``docs``."""

    question: str
    docs: tuple[Any, ...]                    # unit payloads (texts or passages), positives first
    pairs: tuple[tuple[int, int], ...]       # (index of d+, index of d−)


def build_examples(labels: pa.Table, questions: pa.Table, units: pa.Table,
                   passages_of: dict[str, tuple] | None = None) -> tuple[list[DistillExample], dict]:
    """Distillation examples from the labels, questions and units tables.

    Questions with an empty D+ or D− give no pair and are skipped (counted in the report).
    With ``passages_of`` (``unit_id → tuple of the unit's passages``, for MaxP), a unit's payload
    is its passages instead of its text.

    Returns
    -------
    examples : list of DistillExample, sorted by question id.
    report : ``{"questions": n, "used": n, "no_positive": n, "no_negative": n, "pairs": n}``.

    Raises
    ------
    KeyError
        A labelled question or unit is missing from ``questions`` / ``units`` / ``passages_of``
        (names it).
    """
    text_of = dict(zip(units["unit_id"].to_pylist(), units["text"].to_pylist()))
    if passages_of is not None:
        missing = sorted(set(labels["unit_id"].to_pylist()) - set(passages_of))
        if missing:
            raise KeyError(f"labels: unit {missing[0]} has no passages ({len(missing)} units without)")
        text_of = {u: passages_of[u] for u in text_of if u in passages_of}
    q_text = dict(zip(questions["question_id"].to_pylist(), questions["question"].to_pylist()))
    per_q: dict[str, tuple[list, list]] = {}
    for q, u, pos in zip(labels["question_id"].to_pylist(), labels["unit_id"].to_pylist(),
                         labels["positive"].to_pylist()):
        if u not in text_of:
            raise KeyError(f"labels: unit {u} (question {q}) is not in the units table")
        per_q.setdefault(q, ([], []))[0 if pos else 1].append((u, text_of[u]))
    report = {"questions": len(per_q), "used": 0, "no_positive": 0, "no_negative": 0, "pairs": 0}
    examples = []
    for q in sorted(per_q):
        if q not in q_text:
            raise KeyError(f"labels: question {q} is not in the questions table")
        pos, neg = per_q[q]
        if not pos:
            report["no_positive"] += 1
            continue
        if not neg:
            report["no_negative"] += 1
            continue
        report["used"] += 1
        report["pairs"] += len(pos) * len(neg)
        examples.append(DistillExample(q, q_text[q], tuple(sorted(pos)), tuple(sorted(neg))))
    return examples, report


def _pair_key(seed: int, epoch: int, question_id: str, pos: str, neg: str) -> bytes:
    return hashlib.sha256(f"{seed}\x00{epoch}\x00{question_id}\x00{pos}\x00{neg}".encode()).digest()


def sample_pairs(example: DistillExample, epoch: int, cfg: DistillConfig) -> PairItem:
    """All (d+, d−) pairs of ``example``, or ``max_pairs_per_question`` of them chosen by
    sha256(seed, epoch, question, d+, d−) — a pure function of its arguments."""
    docs = [t for _, t in example.positives] + [t for _, t in example.negatives]
    n_pos = len(example.positives)
    pairs = [(i, n_pos + j) for i in range(n_pos) for j in range(len(example.negatives))]
    if len(pairs) > cfg.max_pairs_per_question:
        ids = [u for u, _ in example.positives] + [u for u, _ in example.negatives]
        pairs = sorted(pairs, key=lambda p: _pair_key(cfg.seed, epoch, example.question_id, ids[p[0]], ids[p[1]]))
        pairs = sorted(pairs[:cfg.max_pairs_per_question])
    used = sorted({i for p in pairs for i in p})
    remap = {old: new for new, old in enumerate(used)}
    return PairItem(example.question, tuple(docs[i] for i in used),
                    tuple((remap[a], remap[b]) for a, b in pairs))


class PairDataset(torch.utils.data.Dataset):
    """``epochs × n_questions`` items; item ``i`` is question ``i % n`` with the pairs of epoch
    ``i // n``. Train it for one loop epoch: the loop's seeded sampler shuffles all items."""

    def __init__(self, examples: Sequence[DistillExample], cfg: DistillConfig):
        if not examples:
            raise ValueError("no distillation example: every question lacks D+ or D−")
        self.examples, self.cfg = list(examples), cfg

    def __len__(self) -> int:
        return len(self.examples) * self.cfg.epochs

    def __getitem__(self, i: int) -> PairItem:
        epoch, q = divmod(i, len(self.examples))
        return sample_pairs(self.examples[q], epoch, self.cfg)


class BPRHooks:
    """:class:`funnelrag.training.TrainHooks` for Eq. 6 on any pre-ranker.

    Parameters
    ----------
    tokenize : ``tokenize(tokenizer, queries, docs) -> dict`` of the pre-ranker (its method).
    tokenizer : the pre-ranker's tokenizer.
    scale : :attr:`DistillConfig.score_scale`.
    """

    def __init__(self, tokenize: Callable, tokenizer, scale: float = 1.0):
        self.tokenize, self.tokenizer, self.scale = tokenize, tokenizer, scale

    def collate(self, items: list[PairItem]) -> dict[str, torch.Tensor]:
        """Model inputs over every (question, document) of the batch ``(n_docs, seq_len)``,
        plus ``pair_pos``/``pair_neg`` (indices into those docs) and ``pair_question``
        (question index of each pair), each ``(n_pairs,)``."""
        queries, docs, pos, neg, owner = [], [], [], [], []
        for qi, item in enumerate(items):
            offset = len(docs)
            queries.extend([item.question] * len(item.docs))
            docs.extend(item.docs)
            for a, b in item.pairs:
                pos.append(offset + a), neg.append(offset + b), owner.append(qi)
        batch = dict(self.tokenize(self.tokenizer, queries, docs))
        batch["pair_pos"] = torch.tensor(pos, dtype=torch.long)
        batch["pair_neg"] = torch.tensor(neg, dtype=torch.long)
        batch["pair_question"] = torch.tensor(owner, dtype=torch.long)
        return batch

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Eq. 6 averaged over each question's pairs, then over questions; extra: pair accuracy."""
        inputs = {k: v for k, v in batch.items() if not k.startswith("pair_")}
        scores = model(**inputs).scores                                   # (n_docs,)
        return question_mean_bpr(scores, batch, self.scale)


def question_mean_bpr(doc_scores: torch.Tensor, batch: dict, scale: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 6 over the batch's pairs, averaged over each question's pairs, then over questions.

    Parameters
    ----------
    doc_scores : ``(n_docs,)`` S(q, d) of every document of the batch.
    batch : ``pair_pos``, ``pair_neg`` (indices into ``doc_scores``) and ``pair_question``
        (question index), each ``(n_pairs,)``.
    scale : :attr:`DistillConfig.score_scale`.

    Returns
    -------
    (loss, extras) : scalar loss and ``{"pair_accuracy": share of pairs with S(q, d+) > S(q, d−)}``.
    """
    pos, neg = doc_scores[batch["pair_pos"]], doc_scores[batch["pair_neg"]]   # (n_pairs,)
    per_pair = bpr_loss(pos, neg, scale)                                      # (n_pairs,)
    owner = batch["pair_question"]
    n_q = int(owner.max().item()) + 1
    sums = torch.zeros(n_q, dtype=per_pair.dtype, device=per_pair.device).index_add(0, owner, per_pair)
    counts = torch.bincount(owner, minlength=n_q).clamp(min=1).to(per_pair.dtype)
    return (sums / counts).mean(), {"pair_accuracy": float((pos > neg).float().mean().item())}


class MaxPBPRHooks:
    """:class:`funnelrag.training.TrainHooks` for Eq. 6 with MaxP document scores
    ``S(q, d) = max_{p ∈ d} f(q, p)`` of a bi-encoder pre-ranker.

    Each unit's payload (:class:`PairItem` ``docs``) is the tuple of its passages: texts, encoded
    by the document tower with the gradient (``vectors=None``), or rows of ``vectors``, the
    stored passage vectors of the frozen document tower (query-side fine-tuning).

    Parameters
    ----------
    tokenizer : the pre-ranker's tokenizer.
    max_length : tokens per question and per passage (the pre-ranker's own).
    scale : :attr:`DistillConfig.score_scale`.
    vectors : float32 ``(n_rows, dim)`` L2-normalised passage vectors, or None.
    """

    def __init__(self, tokenizer, max_length: int, scale: float = 1.0, vectors: np.ndarray | None = None):
        self.tokenizer, self.max_length, self.scale = tokenizer, max_length, scale
        self.vectors = vectors

    def collate(self, items: list[PairItem]) -> dict[str, torch.Tensor]:
        """``query_*`` ``(n_questions, seq_len)``; the passages of every unit of the batch as
        ``doc_vectors`` ``(n_passages, dim)`` or ``doc_*`` ``(n_passages, seq_len)``;
        ``doc_query`` and ``passage_unit`` ``(n_passages,)``; ``pair_*`` ``(n_pairs,)`` with
        ``pair_pos``/``pair_neg`` indexing the batch's units."""
        queries = [item.question for item in items]
        passages, doc_query, passage_unit, pos, neg, owner = [], [], [], [], [], []
        n_units = 0
        for qi, item in enumerate(items):
            for j, unit in enumerate(item.docs):
                for p in unit:
                    passages.append(p), doc_query.append(qi), passage_unit.append(n_units + j)
            for a, b in item.pairs:
                pos.append(n_units + a), neg.append(n_units + b), owner.append(qi)
            n_units += len(item.docs)
        q = self.tokenizer(queries, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        batch = {"query_input_ids": q["input_ids"], "query_attention_mask": q["attention_mask"]}
        if self.vectors is None:
            d = self.tokenizer(passages, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            batch.update(doc_input_ids=d["input_ids"], doc_attention_mask=d["attention_mask"])
        else:
            batch["doc_vectors"] = torch.from_numpy(self.vectors[np.asarray(passages, dtype=np.int64)])
        batch["doc_query"] = torch.tensor(doc_query, dtype=torch.long)
        batch["passage_unit"] = torch.tensor(passage_unit, dtype=torch.long)
        batch["pair_pos"] = torch.tensor(pos, dtype=torch.long)
        batch["pair_neg"] = torch.tensor(neg, dtype=torch.long)
        batch["pair_question"] = torch.tensor(owner, dtype=torch.long)
        return batch

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Passage scores → unit scores (max per unit) → Eq. 6 per question, then mean."""
        inputs = {k: v for k, v in batch.items() if not k.startswith(("pair_", "passage_"))}
        scores = model(**inputs).scores                                            # (n_passages,)
        unit = batch["passage_unit"]
        n_units = int(unit.max().item()) + 1
        unit_scores = torch.full((n_units,), float("-inf"), dtype=scores.dtype, device=scores.device)
        unit_scores = unit_scores.scatter_reduce(0, unit, scores, reduce="amax")     # (n_units,)
        return question_mean_bpr(unit_scores, batch, self.scale)
