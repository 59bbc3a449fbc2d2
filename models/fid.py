"""Fusion-in-Decoder reader on T5 (Izacard & Grave 2021; FunnelRAG Eq. 2, the post-ranker's reader).

Each ``question: q title: t context: p`` pair is encoded *separately* by the T5 encoder; the
encoder outputs of a question's ``n_passages`` passages are concatenated along the sequence, so
the decoder attends jointly over all of them while it generates the answer.

Tensors (names fixed project-wide):

* ``input_ids``, ``attention_mask`` : ``(batch, n_passages, seq_len)``; ``seq_len`` includes EOS
  and padding (``attention_mask`` 0 on padding).
* ``passage_token_mask`` : ``(batch, n_passages, seq_len)`` bool, True exactly on the tokens of
  ``title: t context: p`` that survived truncation (not ``question: q``, not EOS, not padding).
* ``cross_attentions`` : tuple of ``n_layers`` tensors ``(batch, n_heads, tgt_len,
  n_passages * seq_len)``, softmax weights of each decoder layer's cross-attention (they sum to 1
  over the last axis; padding gets ~0). Index ``k`` of the last axis is token ``k % seq_len`` of
  passage ``k // seq_len``.
* :meth:`FiDReader.first_token_cross_attention` : ``(n_layers, batch, n_heads, n_passages,
  seq_len)``, the cross-attention of the first decoder position only (query = the decoder start
  token, i.e. while predicting the first answer token; one decoder step), the input of
  FunnelRAG Eq. 3 (mean over layers, heads and the top-l_r representative tokens of each
  passage, chosen among the positions where ``passage_token_mask`` is True). Equal to
  ``cross_attentions[layer][:, :, 0]`` of a teacher-forced forward, reshaped; run in eval mode.

The model is always built with ``attn_implementation="eager"``: SDPA returns no attention
weights in transformers 5.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

SCRATCH = "scratch"
KIND = "t5"
IGNORE_INDEX = -100  # label positions ignored by the LM loss


@dataclass(frozen=True)
class FiDConfig:
    """FiD reader settings.

    kind : always ``"t5"`` (stored in ``reader_config.json`` to pick the reader class; see
        :mod:`models.readers`).
    base : a hub name or local directory of T5 weights (e.g. ``google-t5/t5-base``), or
        ``"scratch"`` for a T5 of the sizes below, initialised from ``seed``.
    tokenizer : directory of the T5 tokenizer (``resolve("t5-tokenizer", mirror).parent``);
        required for ``"scratch"``, defaults to ``base`` otherwise.
    d_model, n_layers, n_heads, d_ff : scratch sizes (``n_layers`` encoder and decoder layers,
        ``d_kv = d_model // n_heads``).
    dropout : T5 dropout rate (scratch only).
    seed : initialisation seed (scratch only).
    max_answer_tokens : generation length limit (tokens).
    """

    kind: str = KIND
    base: str = SCRATCH
    tokenizer: str | None = None
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    seed: int = 0
    max_answer_tokens: int = 20

    def __post_init__(self) -> None:
        if self.kind != KIND:
            raise ValueError(f"FiDConfig.kind must be {KIND!r}, got {self.kind!r}")


@dataclass
class FiDBatch:
    """Encoded FiD inputs, all ``(batch, n_passages, seq_len)``."""

    input_ids: torch.Tensor            # long
    attention_mask: torch.Tensor       # long, 1 on real tokens (incl. EOS)
    passage_token_mask: torch.Tensor   # bool, True on `title: t context: p` tokens


@dataclass
class FiDOutput:
    """``loss`` scalar (None without labels); ``logits`` ``(batch, tgt_len, vocab)``;
    ``cross_attentions`` tuple of ``n_layers`` ``(batch, n_heads, tgt_len, n_passages * seq_len)``
    or None when not requested."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    cross_attentions: tuple[torch.Tensor, ...] | None


def format_fid_input(question: str, title: str, text: str) -> tuple[str, int]:
    """``"question: q title: t context: p"`` and the character offset where ``title:`` starts."""
    prefix = f"question: {question} "
    return f"{prefix}title: {title} context: {text}", len(prefix)


def encode_fid_inputs(tokenizer, questions: Sequence[str],
                      passages_per_question: Sequence[Sequence[tuple[str, str]]],
                      max_length: int) -> FiDBatch:
    """Tokenize every (question, passage) pair FiD-style and mark the passage tokens.

    Parameters
    ----------
    tokenizer : a fast T5 tokenizer (offsets are needed).
    questions : ``batch`` questions.
    passages_per_question : per question, ``n_passages`` ``(title, text)`` pairs; every question
        must have the same number.
    max_length : tokens per pair after truncation, EOS included. Padding is to the longest pair
        of the batch, so ``seq_len <= max_length``.

    Returns
    -------
    FiDBatch
        ``passage_token_mask`` is computed from the character offsets of the *truncated*
        encoding: True for tokens starting at or after ``title:``, excluding EOS and padding.

    Raises
    ------
    ValueError
        Lengths differ between ``questions`` and ``passages_per_question``, a question has no
        passage, or questions have different numbers of passages (index named).
    """
    if len(questions) != len(passages_per_question):
        raise ValueError(f"{len(questions)} questions but {len(passages_per_question)} passage lists")
    if not questions:
        raise ValueError("empty batch")
    n_passages = len(passages_per_question[0])
    for i, passages in enumerate(passages_per_question):
        if len(passages) != n_passages or n_passages == 0:
            raise ValueError(f"question {i} has {len(passages)} passages; expected {n_passages} (> 0) for every question")
    texts, starts = [], []
    for q, passages in zip(questions, passages_per_question):
        for title, text in passages:
            s, start = format_fid_input(q, title, text)
            texts.append(s)
            starts.append(start)
    enc = tokenizer(texts, max_length=max_length, truncation=True, padding="longest",
                    return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    batch = len(questions)
    seq_len = enc["input_ids"].shape[1]
    offsets_start = enc["offset_mapping"][..., 0]                      # (batch * n_passages, seq_len)
    start = torch.tensor(starts).unsqueeze(1)                          # (batch * n_passages, 1)
    passage = (offsets_start >= start) & (enc["special_tokens_mask"] == 0) & (enc["attention_mask"] == 1)
    shape = (batch, n_passages, seq_len)
    return FiDBatch(input_ids=enc["input_ids"].view(shape),           # (batch, n_passages, seq_len)
                    attention_mask=enc["attention_mask"].view(shape),
                    passage_token_mask=passage.view(shape))


def t5_answer_labels(tokenizer, answers: Sequence[str], max_answer_tokens: int) -> torch.Tensor:
    """``(batch, tgt_len)`` labels: the answers' T5 tokens + EOS, ``-100`` on padding;
    ``tgt_len <= max_answer_tokens``."""
    target = tokenizer(list(answers), max_length=max_answer_tokens, truncation=True, padding="longest",
                       return_tensors="pt")
    return target["input_ids"].masked_fill(target["attention_mask"] == 0, IGNORE_INDEX)  # (batch, tgt_len)


class FusionInDecoder(nn.Module):
    """What every FiD reader shares: passages encoded separately and fused, the first decoder
    token's cross-attention (Eq. 3's input). Subclasses set ``encoder_module`` (the encoder stack),
    ``start_token_id`` (the decoder start token) and ``n_layers``, and implement ``forward``
    returning :class:`FiDOutput`."""

    encoder_module: nn.Module
    start_token_id: int
    n_layers: int

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode passages separately, fuse them: ``(batch, n_passages * seq_len, d_model)`` hidden
        states and the ``(batch, n_passages * seq_len)`` mask."""
        batch, n_passages, seq_len = input_ids.shape
        hidden = self.encoder_module(input_ids=input_ids.view(batch * n_passages, seq_len),
                                     attention_mask=attention_mask.view(batch * n_passages, seq_len),
                                     ).last_hidden_state              # (batch * n_passages, seq_len, d_model)
        hidden = hidden.view(batch, n_passages * seq_len, -1)           # (batch, n_passages * seq_len, d_model)
        return hidden, attention_mask.view(batch, n_passages * seq_len)

    def checked_cross_attentions(self, cross_attentions) -> tuple[torch.Tensor, ...]:
        """The ``n_layers`` cross-attention tensors of a model output.

        Raises
        ------
        RuntimeError
            The backend returned none (or not one per layer).
        """
        cross = tuple(cross_attentions or ())
        if len(cross) != self.n_layers or any(a is None for a in cross):
            raise RuntimeError(f"expected {self.n_layers} cross-attention tensors, got {len(cross)} "
                               f"(attn_implementation={self.attn_implementation!r})")
        return cross

    @torch.no_grad()
    def first_token_cross_attention(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Cross-attention of the first decoder token, one decoder step only (memory does not
        grow with answer length). Call in eval mode (no attention dropout).

        Returns
        -------
        torch.Tensor
            ``(n_layers, batch, n_heads, n_passages, seq_len)``, float; for each layer, example
            and head it sums to 1 over ``(n_passages, seq_len)``.
        """
        batch, n_passages, seq_len = input_ids.shape
        start = torch.full((batch, 1), self.start_token_id, dtype=torch.long, device=input_ids.device)  # (batch, 1)
        out = self.forward(input_ids, attention_mask, decoder_input_ids=start, output_attentions=True)
        att = torch.stack(out.cross_attentions)                         # (n_layers, batch, n_heads, 1, n_passages * seq_len)
        n_layers, _, n_heads = att.shape[:3]
        return att.view(n_layers, batch, n_heads, n_passages, seq_len).float()


class FiDReader(FusionInDecoder):
    """Fusion-in-Decoder around a ``T5ForConditionalGeneration`` (eager attention)."""

    def __init__(self, t5: nn.Module, cfg: FiDConfig):
        super().__init__()
        if t5.config._attn_implementation != "eager":
            raise ValueError(f"FiD needs attn_implementation='eager' to return cross-attentions, "
                             f"got {t5.config._attn_implementation!r}")
        self.t5 = t5
        self.cfg = cfg

    @classmethod
    def from_config(cls, cfg: FiDConfig) -> tuple["FiDReader", object]:
        """Build ``(model, tokenizer)``: scratch T5 seeded by ``cfg.seed``, or ``from_pretrained``.

        Raises
        ------
        ValueError
            ``base="scratch"`` without ``tokenizer``.
        """
        from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        if cfg.base != SCRATCH:
            tok = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.base)
            t5 = T5ForConditionalGeneration.from_pretrained(cfg.base, attn_implementation="eager")
            return cls(t5, cfg), tok
        if not cfg.tokenizer:
            raise ValueError("FiDConfig(base='scratch') needs tokenizer= the T5 tokenizer directory")
        tok = AutoTokenizer.from_pretrained(cfg.tokenizer)
        t5_cfg = T5Config(vocab_size=len(tok), d_model=cfg.d_model, d_kv=cfg.d_model // cfg.n_heads,
                          d_ff=cfg.d_ff, num_layers=cfg.n_layers, num_decoder_layers=cfg.n_layers,
                          num_heads=cfg.n_heads, dropout_rate=cfg.dropout, feed_forward_proj="relu",
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          decoder_start_token_id=tok.pad_token_id, attn_implementation="eager")
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
            torch.manual_seed(cfg.seed)
            t5 = T5ForConditionalGeneration(t5_cfg)
        return cls(t5, cfg), tok

    @property
    def n_layers(self) -> int:
        return self.t5.config.num_decoder_layers

    @property
    def encoder_module(self) -> nn.Module:
        return self.t5.encoder

    @property
    def start_token_id(self) -> int:
        return self.t5.config.decoder_start_token_id

    @property
    def attn_implementation(self) -> str:
        """Attention backend (must be ``"eager"`` for Eq. 3)."""
        return self.t5.config._attn_implementation

    def save(self, directory) -> None:
        """``save_pretrained`` of the T5 (safetensors + config)."""
        self.t5.save_pretrained(directory, safe_serialization=True)

    def answer_labels(self, tokenizer, answers: Sequence[str], max_answer_tokens: int) -> torch.Tensor:
        """:func:`t5_answer_labels`."""
        return t5_answer_labels(tokenizer, answers, max_answer_tokens)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Activation checkpointing of the T5 blocks (used by ``TrainConfig.gradient_checkpointing``)."""
        self.t5.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None, output_attentions: bool = False,
                decoder_input_ids: torch.Tensor | None = None) -> FiDOutput:
        """Teacher-forced decoding over the fused passages (FunnelRAG Eq. 2).

        Parameters
        ----------
        input_ids, attention_mask : ``(batch, n_passages, seq_len)``.
        labels : ``(batch, tgt_len)`` answer token ids, ``-100`` on ignored positions; the LM
            loss is their mean token cross-entropy.
        output_attentions : return the decoder cross-attentions.
        decoder_input_ids : ``(batch, tgt_len)``; default: ``labels`` shifted right.

        Raises
        ------
        RuntimeError
            Cross-attentions were requested but the backend returned none.
        """
        hidden, mask = self.encode(input_ids, attention_mask)
        out = self.t5(encoder_outputs=(hidden,), attention_mask=mask, labels=labels,
                      decoder_input_ids=decoder_input_ids, output_attentions=output_attentions,
                      use_cache=False, return_dict=True)
        cross = None
        if output_attentions:
            cross = self.checked_cross_attentions(out.cross_attentions)
        return FiDOutput(loss=out.loss, logits=out.logits, cross_attentions=cross)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 max_answer_tokens: int | None = None) -> torch.Tensor:
        """Greedy answers: ``(batch, <= max_answer_tokens + 1)`` token ids starting with the
        decoder start token (decode with ``skip_special_tokens=True``)."""
        from transformers.modeling_outputs import BaseModelOutput  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        hidden, mask = self.encode(input_ids, attention_mask)
        return self.t5.generate(encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=mask,
                                max_new_tokens=max_answer_tokens or self.cfg.max_answer_tokens,
                                do_sample=False, num_beams=1)
