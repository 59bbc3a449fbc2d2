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

:func:`passage_scores` is the pure tensor core; :mod:`tasks.attention_runner` applies it to
the candidates table with the FiD reader.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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
