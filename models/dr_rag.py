"""DR-RAG's compact classifier C(q, d1, d2) (Hei et al. 2024, Eq. 2): do two documents together
help answer q?

A sequence-pair transformer (offline: the real all-MiniLM-L6-v2 backbone with a new head; with
a hub: e.g. ``google/bigbird-roberta-base`` or ``allenai/longformer-base-4096`` by name) reads
``[CLS] q [SEP] d1 [SEP] d2 [SEP]`` (the model's own CLS/SEP tokens). ``num_labels=1`` gives a
logit trained with binary cross-entropy (``P = sigmoid``); ``num_labels=2`` gives two logits
trained with cross-entropy (``P = softmax[..., 1]``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.encoders import resolve_model_path
from models.saving import read_config, save_pretrained_dir

CONFIG_FILE = "classifier_config.json"


@dataclass(frozen=True)
class ClassifierConfig:
    """Classifier settings.

    name_or_path : ``"minilm"`` (offline weights), a local directory or a hub name.
    num_labels : 1 (sigmoid + BCE) or 2 (softmax + CE).
    max_length : tokens of the whole input, special tokens included.
    max_query_tokens : the question is cut to this many tokens; the rest of the budget is
        shared by d1 and d2 (equal halves, a short document leaves its unused half to the other).
    """

    name_or_path: str = "minilm"
    num_labels: int = 1
    max_length: int = 256
    max_query_tokens: int = 64

    def __post_init__(self) -> None:
        if self.num_labels not in (1, 2):
            raise ValueError(f"num_labels must be 1 or 2, got {self.num_labels}")
        if self.max_query_tokens < 1 or self.max_length < self.max_query_tokens + 6:
            raise ValueError(f"max_length {self.max_length} leaves no room for documents after "
                             f"{self.max_query_tokens} query tokens and 4 special tokens")


@dataclass
class ClassifierOutput:
    logits: torch.Tensor  # (batch, num_labels)
    probs: torch.Tensor  # (batch,) P(C(q, d1, d2) = 1)
    loss: torch.Tensor | None = None  # scalar when labels were given


class DRRAGClassifier(nn.Module):
    """``forward(input_ids, attention_mask, token_type_ids=None, labels=None)``, all
    ``(batch, seq_len)`` (labels ``(batch,)`` in {0, 1}) → :class:`ClassifierOutput`."""

    def __init__(self, backbone: nn.Module, cfg: ClassifierConfig):
        super().__init__()
        if backbone.config.num_labels != cfg.num_labels:
            raise ValueError(f"backbone has {backbone.config.num_labels} labels, config says {cfg.num_labels}")
        self.backbone = backbone
        self.cfg = cfg
        self.uses_token_types = getattr(backbone.config, "type_vocab_size", 0) >= 2

    @classmethod
    def from_pretrained(cls, cfg: ClassifierConfig = ClassifierConfig()) -> tuple["DRRAGClassifier", object]:
        """Backbone weights + a new classification head, and the tokenizer. Returns ``(model, tokenizer)``."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        path = resolve_model_path(cfg.name_or_path)
        tok = AutoTokenizer.from_pretrained(path)
        backbone = AutoModelForSequenceClassification.from_pretrained(path, num_labels=cfg.num_labels)
        return cls(backbone, cfg), tok

    def freeze_lower_layers(self, n_trainable: int) -> int:
        """Train only the top ``n_trainable`` transformer layers (plus pooler and head): freeze the
        embeddings and the layers below. Returns the number of trainable parameters.

        Raises
        ------
        ValueError
            The backbone has no ``base_model.encoder.layer`` list (not a BERT-like encoder).
        """
        base = self.backbone.base_model
        layers = getattr(getattr(base, "encoder", None), "layer", None)
        if layers is None:
            raise ValueError(f"{type(self.backbone).__name__}: no encoder.layer list to freeze")
        frozen = [base.embeddings, *list(layers)[:max(0, len(layers) - n_trainable)]]
        for module in frozen:
            for p in module.parameters():
                p.requires_grad_(False)
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        logits = self.backbone(**kwargs).logits  # (batch, num_labels)
        if self.cfg.num_labels == 1:
            score = logits.squeeze(-1)  # (batch,)
            probs = torch.sigmoid(score)
            loss = F.binary_cross_entropy_with_logits(score, labels.float()) if labels is not None else None
        else:
            probs = logits.softmax(-1)[:, 1]  # (batch,)
            loss = F.cross_entropy(logits, labels.long()) if labels is not None else None
        return ClassifierOutput(logits=logits, probs=probs, loss=loss)


def _budget(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """Token counts kept of d1 and d2 (lengths ``n1``, ``n2``) within ``budget`` tokens."""
    half = budget // 2
    if n1 + n2 <= budget:
        return n1, n2
    if n1 <= half:
        return n1, budget - n1
    if n2 <= budget - half:
        return budget - n2, n2
    return half, budget - half


def encode_triples(tokenizer, triples: Sequence[tuple[str, str, str]], cfg: ClassifierConfig) -> dict[str, torch.Tensor]:
    """Tokenize ``(q, d1, d2)`` triples as ``CLS q SEP d1 SEP d2 SEP``, right-padded.

    The question keeps at most ``cfg.max_query_tokens`` tokens; d1 and d2 share the remaining
    ``max_length - 4 - len(q)`` tokens (see :class:`ClassifierConfig`); each is cut at its end.

    Returns
    -------
    dict with ``input_ids``, ``attention_mask``, ``token_type_ids`` (0 for CLS q SEP, 1 after),
    each a long tensor ``(len(triples), seq_len)``, ``seq_len <= cfg.max_length``.

    Raises
    ------
    ValueError
        The tokenizer has no CLS/SEP (or BOS/EOS) token, or ``triples`` is empty.
    """
    if not triples:
        raise ValueError("encode_triples: no triples")
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if cls_id is None or sep_id is None:
        raise ValueError("tokenizer has neither CLS/SEP nor BOS/EOS tokens")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    texts = sorted({t for triple in triples for t in triple})
    tok = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=cfg.max_length)["input_ids"]
    ids_of = dict(zip(texts, tok))
    rows, types = [], []
    for q, d1, d2 in triples:
        q_ids = ids_of[q][:cfg.max_query_tokens]
        n1, n2 = _budget(len(ids_of[d1]), len(ids_of[d2]), cfg.max_length - 4 - len(q_ids))
        head = [cls_id, *q_ids, sep_id]
        tail = [*ids_of[d1][:n1], sep_id, *ids_of[d2][:n2], sep_id]
        rows.append(head + tail)
        types.append([0] * len(head) + [1] * len(tail))
    seq_len = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)  # (batch, seq_len)
    attention_mask = torch.zeros((len(rows), seq_len), dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), seq_len), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, types)):
        input_ids[i, :len(r)] = torch.tensor(r)
        attention_mask[i, :len(r)] = 1
        token_type_ids[i, :len(t)] = torch.tensor(t)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


# ---------------------------------------------------------------------------- save / load
def save_classifier(model: DRRAGClassifier, tokenizer, directory: Path) -> Path:
    """Write weights (safetensors), backbone config, tokenizer and :class:`ClassifierConfig`
    into a temporary sibling directory, then rename it onto ``directory``."""
    return save_pretrained_dir(directory, model.backbone, tokenizer, CONFIG_FILE, model.cfg)


def load_classifier(directory: Path) -> tuple[DRRAGClassifier, object]:
    """Load a classifier written by :func:`save_classifier`. Returns ``(model, tokenizer)`` in eval mode.

    Raises
    ------
    FileNotFoundError
        ``directory`` has no ``classifier_config.json``.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

    directory = Path(directory)
    saved = read_config(directory, CONFIG_FILE, "DR-RAG classifier")
    cfg = ClassifierConfig(**saved)  # name_or_path: the base weights it was fine-tuned from
    backbone = AutoModelForSequenceClassification.from_pretrained(str(directory))
    model = DRRAGClassifier(backbone, cfg)
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(directory))
