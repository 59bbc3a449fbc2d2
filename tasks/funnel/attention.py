"""FiD cross-attention passage scores (FunnelRAG Eq. 3) and their Table 7/8 variants.

Eq. 3 scores passage ``p`` for question ``q`` by the cross-attention of the *first* decoder
token over the encoder outputs of ``p``, averaged over all layers ``l``, all heads ``h`` and
the ``lr`` *representative tokens* of ``p`` — the ``lr`` passage tokens with the highest
attention, selected per layer and head::

    s(q, p) = 1 / (L · H · lr) · Σ_l Σ_h Σ_{t ∈ top-lr_{l,h}(p)} α^{l,h}_{0,t}

Question tokens (FiD encodes ``question: q title: ... context: ...`` for every passage) are
excluded unless ``include_query`` is set (Table 8, "all tokens with query"). The attention
probabilities come from HF T5 with ``attn_implementation="eager"``, i.e. they are
post-softmax (:data:`ATTENTION_KIND`), softmax taken over all ``n_passages · seq_len``
encoder positions.

:func:`passage_scores` is the pure tensor core; :func:`score_candidates` applies it to the
candidates table with the FiD reader's single-decoder-step method
(:meth:`models.fid.FiDReader.first_token_cross_attention`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import groupby

import pyarrow as pa
import torch

from data_contracts.funnel import ATTENTION_SCORES
from funnelrag.progress import Progress
from models.fid import encode_fid_inputs

log = logging.getLogger(__name__)

ATTENTION_KIND = "post_softmax"  # HF eager attention returns softmax probabilities
REDUCTIONS = ("mean", "max")


@dataclass(frozen=True)
class AttentionScoreConfig:
    """Which Eq. 3 variant to compute (FunnelRAG Tables 7 and 8).

    n_representative : ``lr``, representative tokens per passage, chosen per layer and head
        (default 4); ``None`` = all tokens of the passage (Table 8).
    include_query : count the question tokens of the passage's encoder input as well
        (Table 8 "with query"); default ``False`` (Eq. 3).
    layer_reduce, head_reduce, token_reduce : ``"mean"`` (Eq. 3) or ``"max"`` (Table 7 "max over
        layers / heads / tokens").
    last_layers : use only the last ``n`` decoder layers (Table 7 "last-6 layers"); ``None`` = all.
    """

    n_representative: int | None = 4
    include_query: bool = False
    layer_reduce: str = "mean"
    head_reduce: str = "mean"
    token_reduce: str = "mean"
    last_layers: int | None = None

    def __post_init__(self) -> None:
        for name in ("layer_reduce", "head_reduce", "token_reduce"):
            if getattr(self, name) not in REDUCTIONS:
                raise ValueError(f"AttentionScoreConfig.{name} must be one of {REDUCTIONS}, got {getattr(self, name)!r}")
        if self.n_representative is not None and self.n_representative < 1:
            raise ValueError(f"n_representative must be >= 1 or None, got {self.n_representative}")
        if self.last_layers is not None and self.last_layers < 1:
            raise ValueError(f"last_layers must be >= 1 or None, got {self.last_layers}")


def _reduce(x: torch.Tensor, dim: int, how: str) -> torch.Tensor:
    return x.mean(dim) if how == "mean" else x.amax(dim)


def passage_scores(cross_attn: torch.Tensor, passage_token_mask: torch.Tensor, cfg: AttentionScoreConfig,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 3 passage scores from the first decoder token's cross-attention.

    Parameters
    ----------
    cross_attn : torch.Tensor
        ``(n_layers, batch, n_heads, n_passages, seq_len)`` attention probabilities of decoder
        position 0 over the encoder positions (FiD's ``(n_passages · seq_len)`` axis unfolded).
    passage_token_mask : torch.Tensor
        ``(batch, n_passages, seq_len)`` bool, True on the passage's own tokens (title and
        context), False on question tokens and padding.
    cfg : AttentionScoreConfig
    attention_mask : torch.Tensor, optional
        ``(batch, n_passages, seq_len)`` non-padding mask; required when ``cfg.include_query``.

    Returns
    -------
    torch.Tensor
        ``(batch, n_passages)`` float32 scores. Passages without a counted token (padding
        passages) score 0. With ``n_representative = lr``, a passage with fewer than ``lr``
        counted tokens averages over the tokens it has.

    Raises
    ------
    ValueError
        Shapes disagree, or ``include_query`` without ``attention_mask``.
    """
    if cross_attn.dim() != 5:
        raise ValueError(f"cross_attn must be (n_layers, batch, n_heads, n_passages, seq_len), got {tuple(cross_attn.shape)}")
    n_layers, batch, n_heads, n_passages, seq_len = cross_attn.shape
    if cfg.include_query:
        if attention_mask is None:
            raise ValueError("include_query=True needs the attention_mask (question + passage tokens)")
        token_mask = attention_mask.bool()
    else:
        token_mask = passage_token_mask.bool()
    if tuple(token_mask.shape) != (batch, n_passages, seq_len):
        raise ValueError(f"token mask shape {tuple(token_mask.shape)} does not match cross_attn {tuple(cross_attn.shape)}")
    attn = cross_attn.float()
    if cfg.last_layers is not None:
        attn = attn[-cfg.last_layers:]                           # (n_layers', batch, n_heads, n_passages, seq_len)
    mask = token_mask[None, :, None].expand_as(attn)            # (n_layers', batch, n_heads, n_passages, seq_len)
    if cfg.n_representative is None:
        values = attn.masked_fill(~mask, 0.0)
        count = mask.sum(-1)                                     # (n_layers', batch, n_heads, n_passages)
        valid = mask
    else:
        lr = min(cfg.n_representative, seq_len)
        top = attn.masked_fill(~mask, float("-inf")).topk(lr, dim=-1).values  # (n_layers', batch, n_heads, n_passages, lr)
        valid = torch.isfinite(top)
        values = top.masked_fill(~valid, 0.0)
        count = valid.sum(-1)                                    # (n_layers', batch, n_heads, n_passages)
    if cfg.token_reduce == "mean":
        per_head = values.sum(-1) / count.clamp(min=1)          # (n_layers', batch, n_heads, n_passages)
    else:
        per_head = values.masked_fill(~valid, float("-inf")).amax(-1)
        per_head = per_head.masked_fill(count == 0, 0.0)        # (n_layers', batch, n_heads, n_passages)
    per_layer = _reduce(per_head, 2, cfg.head_reduce)           # (n_layers', batch, n_passages)
    return _reduce(per_layer, 0, cfg.layer_reduce)              # (batch, n_passages)


# ---------------------------------------------------------------------------- runner
@dataclass(frozen=True)
class AttentionRunConfig:
    """How the reader is run over the candidates.

    max_passage_tokens : tokens per ``question: q title: t context: p`` encoder input (EOS included).
    batch_size : questions per forward pass (only questions with the same number of passages
        are batched together, so no passage is padding).
    """

    max_passage_tokens: int = 200
    batch_size: int = 1


def score_candidates(candidates: pa.Table, questions: pa.Table, model, tokenizer,
                     cfg: AttentionScoreConfig = AttentionScoreConfig(),
                     run: AttentionRunConfig = AttentionRunConfig(), show_progress: bool = True) -> pa.Table:
    """Eq. 3 score of every candidate passage: one FiD pass per question over all its passages
    (``show_progress``: report the questions scored, :class:`funnelrag.progress.Progress`; off for
    the one-question calls of query-time post-ranking).

    Parameters
    ----------
    candidates : pa.Table
        ``candidates`` rows; a question's passages are read in (unit_rank, passage_position)
        order, i.e. the pre-ranker's order.
    questions : pa.Table
        ``questions`` rows (question_id, question).
    model, tokenizer : a FiD reader of :mod:`models.readers` (eager attention) and its tokenizer.
    cfg, run : score variant and batching.

    Returns
    -------
    pa.Table
        :data:`data_contracts.funnel.ATTENTION_SCORES`, one row per candidate passage, sorted
        by (question_id, passage_id); ``attention`` = ``"post_softmax"``.

    Raises
    ------
    ValueError
        The reader does not use eager attention, or a candidate question is missing from
        ``questions``.
    """
    impl = model.attn_implementation
    if impl != "eager":
        raise ValueError(f"attention scores need the reader built with attn_implementation='eager', got {impl!r}")
    q_text = dict(zip(questions["question_id"].to_pylist(), questions["question"].to_pylist()))
    rows = sorted(zip(candidates["question_id"].to_pylist(), candidates["unit_rank"].to_pylist(),
                      candidates["passage_position"].to_pylist(), candidates["unit_id"].to_pylist(),
                      candidates["passage_id"].to_pylist(), candidates["title"].to_pylist(),
                      candidates["text"].to_pylist()))
    per_q = [(q, list(g)) for q, g in groupby(rows, key=lambda r: r[0])]
    missing = [q for q, _ in per_q if q not in q_text]
    if missing:
        raise ValueError(f"candidates name {len(missing)} question(s) not in the questions table, e.g. {missing[0]}")
    per_q.sort(key=lambda item: (len(item[1]), item[0]))  # equal passage counts become neighbours
    out = {n: [] for n in ATTENTION_SCORES.schema.names}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    bar = Progress("Eq. 3 attention scores", total=len(per_q), unit="questions") if show_progress else None
    try:
        for _, group in groupby(per_q, key=lambda item: len(item[1])):
            group = list(group)
            for start in range(0, len(group), run.batch_size):
                batch = group[start:start + run.batch_size]
                enc = encode_fid_inputs(tokenizer, [q_text[q] for q, _ in batch],
                                        [[(r[5], r[6]) for r in ps] for _, ps in batch], run.max_passage_tokens)
                attn = model.first_token_cross_attention(enc.input_ids.to(device), enc.attention_mask.to(device))
                scores = passage_scores(attn.cpu(), enc.passage_token_mask, cfg, enc.attention_mask)  # (batch, n_passages)
                for b, (q, ps) in enumerate(batch):
                    for j, r in enumerate(ps):
                        out["question_id"].append(q), out["unit_id"].append(r[3]), out["passage_id"].append(r[4])
                        out["score"].append(float(scores[b, j])), out["attention"].append(ATTENTION_KIND)
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    model.train(was_training)
    table = pa.table(out, schema=ATTENTION_SCORES.schema)
    return ATTENTION_SCORES.validate(table.sort_by([("question_id", "ascending"), ("passage_id", "ascending")]))
