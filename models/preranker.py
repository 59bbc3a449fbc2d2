"""The pre-ranker ``f(q, d)`` of FunnelRAG Eq. 1: scores (question, ~1K-token document unit) pairs.

Two real implementations behind one interface (``forward(**batch) -> PreRankerOutput`` with
``scores`` of shape ``(batch,)``, plus ``tokenize(tokenizer, queries, docs)``):

* :class:`BiEncoderPreRanker` — :class:`models.encoders.BiEncoder`, score = cosine similarity
  of the mean-pooled, L2-normalised embeddings. One shared encoder (``towers="shared"``, the
  sentence-transformers recipe) or a query tower beside the document tower
  (``towers="separate"``): query-side fine-tuning trains the query tower only, so the document
  tower — and every stored passage vector (:mod:`tasks.funnel.embeddings`) — stays valid.
* :class:`CrossEncoderPreRanker` — ``AutoModelForSequenceClassification(num_labels=1)`` over the
  concatenated pair, score = the single logit. From the offline MiniLM weights only the
  classification head is new; it is initialised from an explicit seed. Where a hub is
  reachable a trained reranker (``BAAI/bge-reranker-v2-m3``) loads with its own head.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.encoders import BiEncoder, EncoderConfig, encode, resolve_model_path
from models.saving import read_config, save_pretrained_dir

CONFIG_FILE = "preranker.json"
KINDS = ("bi", "cross")
TOWERS = ("shared", "separate")
QUERY_ENCODER_DIR = "query_encoder"


@dataclass(frozen=True)
class PreRankerConfig:
    """Pre-ranker settings.

    kind : ``"bi"`` (bi-encoder, cosine) or ``"cross"`` (cross-encoder, one logit).
    name_or_path : ``"minilm"`` (offline weights), a local directory, or a hub name
        (``BAAI/bge-reranker-v2-m3`` for ``kind="cross"`` where a hub is reachable).
    max_length : tokens per input (bi: per query and per document; cross: per pair). None
        (default): the model's own input length (:func:`native_max_length`, 256 for MiniLM).
        :func:`build_preranker` resolves it and :func:`save_preranker` stores the number with
        the weights, so every later load (registry versions included) runs at the length the
        model was trained with: the one source of a pre-ranker's input length.
    seed : seed of the initialisation of weights missing from the checkpoint (cross head).
    towers : bi-encoder only. ``"shared"``: one encoder ``E`` for questions and documents;
        ``"separate"``: a query tower ``E_q`` beside the document tower ``E_d``,
        ``f(q, d) = cos(E_q(q), E_d(d))``. The document tower loads from ``name_or_path``.
    query_name_or_path : the query tower's weights with ``towers="separate"`` (None: a copy of
        the document tower's, the start of query-side fine-tuning).
    """

    kind: str = "bi"
    name_or_path: str = "minilm"
    max_length: int | None = None
    seed: int = 0
    towers: str = "shared"
    query_name_or_path: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"pre-ranker kind must be one of {KINDS}, got {self.kind!r}")
        if self.towers not in TOWERS:
            raise ValueError(f"pre-ranker towers must be one of {TOWERS}, got {self.towers!r}")
        if self.kind != "bi" and self.towers != "shared":
            raise ValueError(f"towers={self.towers!r} needs a bi-encoder, got kind {self.kind!r}")


@dataclass
class PreRankerOutput:
    scores: torch.Tensor  # (batch,) relevance f(q, d), higher = more relevant


class BiEncoderPreRanker(nn.Module):
    """Bi-encoder pre-ranker: ``f(q, d) = cos(E_q(q), E_d(d))`` (FunnelRAG Eq. 1 with a dual
    encoder); ``E_q`` is ``E_d`` unless a separate ``query_encoder`` is given.

    ``encoder`` is the document tower: its weights alone define the stored passage vectors
    (:func:`tasks.funnel.embeddings.model_version`).
    """

    kind = "bi"

    def __init__(self, encoder: BiEncoder, cfg: PreRankerConfig, query_encoder: BiEncoder | None = None):
        super().__init__()
        self.encoder = encoder
        self.query_encoder = query_encoder
        self.cfg = cfg

    def query_tower(self) -> BiEncoder:
        """``E_q``: the query encoder, or the shared encoder."""
        return self.encoder if self.query_encoder is None else self.query_encoder

    def separate_towers(self) -> None:
        """Give the model its own query tower, a copy of the document tower (same scores until
        one of them is trained); a no-op when it has one already."""
        if self.query_encoder is None:
            self.query_encoder = copy.deepcopy(self.encoder)
            self.cfg = replace(self.cfg, towers="separate")

    def tokenize(self, tokenizer, queries: Sequence[str], docs: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tensors for :meth:`forward`: ``query_*`` and ``doc_*`` ids/masks, each ``(batch, seq_len)``."""
        q = tokenizer(list(queries), padding=True, truncation=True, max_length=self.cfg.max_length, return_tensors="pt")
        d = tokenizer(list(docs), padding=True, truncation=True, max_length=self.cfg.max_length, return_tensors="pt")
        return {"query_input_ids": q["input_ids"], "query_attention_mask": q["attention_mask"],
                "doc_input_ids": d["input_ids"], "doc_attention_mask": d["attention_mask"]}

    def forward(self, query_input_ids: torch.Tensor, query_attention_mask: torch.Tensor,
                doc_input_ids: torch.Tensor | None = None, doc_attention_mask: torch.Tensor | None = None,
                doc_vectors: torch.Tensor | None = None, doc_query: torch.Tensor | None = None) -> PreRankerOutput:
        """Scores of (query, document) rows.

        Parameters
        ----------
        query_input_ids, query_attention_mask : ``(n_queries, seq_len)``.
        doc_input_ids, doc_attention_mask : ``(n_docs, seq_len)``, encoded by the document tower;
            or instead
        doc_vectors : ``(n_docs, dim)`` precomputed L2-normalised document-tower vectors (stored
            passage vectors; no gradient reaches the document tower).
        doc_query : ``(n_docs,)`` int, the query row of each document; None: row ``i`` pairs
            query ``i`` with document ``i`` (``n_queries == n_docs``).

        Returns
        -------
        PreRankerOutput
            ``scores`` ``(n_docs,)``.

        Raises
        ------
        ValueError
            Neither or both of ``doc_input_ids`` and ``doc_vectors`` are given.
        """
        if (doc_input_ids is None) == (doc_vectors is None):
            raise ValueError("BiEncoderPreRanker.forward needs exactly one of doc_input_ids and doc_vectors")
        q = self.query_tower()(query_input_ids, query_attention_mask).embeddings  # (n_queries, dim)
        if doc_vectors is None:
            d = self.encoder(doc_input_ids, doc_attention_mask).embeddings        # (n_docs, dim)
            if not self.encoder.cfg.normalize:
                d = F.normalize(d, dim=-1)
        else:
            d = doc_vectors.to(q.dtype)                                           # (n_docs, dim)
        if not self.query_tower().cfg.normalize:
            q = F.normalize(q, dim=-1)
        if doc_query is not None:
            q = q[doc_query]                                                      # (n_docs, dim)
        return PreRankerOutput(scores=(q * d).sum(-1))  # (n_docs,)

    def backbone_module(self) -> nn.Module:
        return self.encoder.backbone


class CrossEncoderPreRanker(nn.Module):
    """Cross-encoder pre-ranker: ``f(q, d) = w · BERT([CLS] q [SEP] d [SEP])`` (one logit)."""

    kind = "cross"

    def __init__(self, model: nn.Module, cfg: PreRankerConfig):
        super().__init__()
        self.model = model
        self.cfg = cfg

    def tokenize(self, tokenizer, queries: Sequence[str], docs: Sequence[str]) -> dict[str, torch.Tensor]:
        """Pair encoding ``(batch, seq_len)``; only the document is truncated (``only_second``)."""
        enc = tokenizer(list(queries), list(docs), padding=True, truncation="only_second",
                        max_length=self.cfg.max_length, return_tensors="pt")
        return dict(enc)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> PreRankerOutput:
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits  # (batch, 1)
        return PreRankerOutput(scores=logits.squeeze(-1))  # (batch,)

    def backbone_module(self) -> nn.Module:
        return self.model


PreRanker = BiEncoderPreRanker | CrossEncoderPreRanker


def _init_missing(model: nn.Module, missing: set[str], seed: int, std: float) -> None:
    """Re-initialise the parameters absent from the checkpoint from ``seed`` (normal(0, std), bias 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in sorted(missing):
            param = model.get_parameter(name)
            if name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def native_max_length(model_dir: str, cap: int = 512) -> int:
    """A model's own input length: sentence-transformers' ``max_seq_length``
    (``sentence_bert_config.json``, 256 for all-MiniLM-L6-v2), else the tokenizer's
    ``model_max_length``, else the position embeddings, capped at ``cap``."""
    path = Path(model_dir)
    st = path / "sentence_bert_config.json"
    if st.exists():
        return int(json.loads(st.read_text())["max_seq_length"])
    for name, key in (("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        f = path / name
        if f.exists() and isinstance(json.loads(f.read_text()).get(key), int):
            return min(int(json.loads(f.read_text())[key]), cap)
    return cap


def build_preranker(cfg: PreRankerConfig = PreRankerConfig()) -> tuple[PreRanker, object]:
    """Load a pre-ranker and its tokenizer (eval mode). Returns ``(model, tokenizer)``.

    Raises
    ------
    OSError
        The weights cannot be found (no local directory and no reachable hub).
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

    if cfg.max_length is None:
        cfg = replace(cfg, max_length=native_max_length(resolve_model_path(cfg.name_or_path)))
    if cfg.kind == "bi":
        encoder, tok = BiEncoder.from_pretrained(EncoderConfig(name_or_path=cfg.name_or_path, max_length=cfg.max_length))
        model: PreRanker = BiEncoderPreRanker(encoder, cfg)
        if cfg.towers == "separate":
            if cfg.query_name_or_path is None:
                model.separate_towers()
            else:
                model.query_encoder, _ = BiEncoder.from_pretrained(
                    EncoderConfig(name_or_path=cfg.query_name_or_path, max_length=cfg.max_length))
    else:
        path = resolve_model_path(cfg.name_or_path)
        tok = AutoTokenizer.from_pretrained(path)
        hf, info = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, output_loading_info=True)
        _init_missing(hf, set(info["missing_keys"]), cfg.seed, getattr(hf.config, "initializer_range", 0.02))
        model = CrossEncoderPreRanker(hf, cfg)
    model.eval()
    return model, tok


def save_preranker(model: PreRanker, tokenizer, directory: Path) -> Path:
    """Write weights (safetensors), tokenizer and ``preranker.json`` into ``directory``.

    A separate query tower goes to ``directory/query_encoder``. The directory then loads with
    :func:`load_preranker` and is what the model registry logs; it appears complete or not at all
    (:func:`data_contracts.base.atomic_directory`).
    """
    query = getattr(model, "query_encoder", None)
    if query is None:
        return save_pretrained_dir(directory, model.backbone_module(), tokenizer, CONFIG_FILE,
                                   replace(model.cfg, name_or_path="."))
    return save_pretrained_dir(directory, model.backbone_module(), tokenizer, CONFIG_FILE,
                               replace(model.cfg, name_or_path=".", towers="separate",
                                       query_name_or_path=QUERY_ENCODER_DIR),
                               extra={QUERY_ENCODER_DIR: query.backbone})


def load_preranker(directory: Path) -> tuple[PreRanker, object]:
    """Load a pre-ranker saved by :func:`save_preranker`.

    Raises
    ------
    FileNotFoundError
        ``directory`` has no ``preranker.json``.
    """
    saved = read_config(directory, CONFIG_FILE, "pre-ranker")
    if saved.get("query_name_or_path"):
        saved["query_name_or_path"] = str(Path(directory) / saved["query_name_or_path"])
    return build_preranker(PreRankerConfig(**{**saved, "name_or_path": str(directory)}))


class NonFiniteScoresError(ValueError):
    """A pre-ranker produced NaN or infinite scores or embeddings (damaged or diverged weights)."""


def require_finite(values: np.ndarray, what: str) -> np.ndarray:
    """Return ``values`` unchanged if every element is finite.

    Parameters
    ----------
    values : any float array (scores ``(n,)`` or embeddings ``(n, dim)``).
    what : what the values are, for the message (e.g. ``"pre-ranker scores"``).

    Raises
    ------
    NonFiniteScoresError
        Some element is NaN or ±inf: ranking on them would be silently arbitrary.
    """
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    if bad:
        raise NonFiniteScoresError(f"{what}: {bad} of {values.size} values are NaN or infinite "
                                   "(damaged weights or a diverged model); refusing to rank on them")
    return values


@torch.no_grad()
def score_pairs(model: PreRanker, tokenizer, queries: Sequence[str], docs: Sequence[str],
                batch_size: int = 32) -> np.ndarray:
    """Pre-ranker scores of ``(queries[i], docs[i])`` pairs, float32 ``(n_pairs,)``.

    Pairs are batched by document length (less padding) and returned in input order.

    Raises
    ------
    ValueError
        ``queries`` and ``docs`` differ in length.
    NonFiniteScoresError
        A score is NaN or infinite.
    """
    if len(queries) != len(docs):
        raise ValueError(f"score_pairs: {len(queries)} queries but {len(docs)} documents")
    out = np.zeros(len(docs), dtype=np.float32)
    if not docs:
        return out
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(docs)), key=lambda i: len(docs[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = model.tokenize(tokenizer, [queries[i] for i in idx], [docs[i] for i in idx])
        scores = model(**{k: v.to(device) for k, v in batch.items()}).scores  # (len(idx),)
        out[np.asarray(idx)] = scores.float().cpu().numpy()
    model.train(was_training)
    return require_finite(out, "pre-ranker scores")


@torch.no_grad()
def score_grouped(model: PreRanker, tokenizer, queries: Sequence[str], docs: Sequence[str],
                  pairs: Sequence[tuple[int, int]], batch_size: int = 32, bar=None) -> np.ndarray:
    """Scores of ``(queries[i], docs[j])`` for each ``(i, j)`` in ``pairs``, float32 ``(n_pairs,)``;
    ``bar`` (:class:`funnelrag.progress.Progress`, optional) counts a bi-encoder's documents embedded.

    Same values as :func:`score_pairs`; a bi-encoder embeds each distinct query and document
    once (documents shared by many questions, as in the FunnelRAG funnel, are encoded once),
    a cross-encoder scores every pair.

    Raises
    ------
    NonFiniteScoresError
        A score is NaN or infinite.
    """
    if not pairs:
        return np.zeros(0, dtype=np.float32)
    if model.kind != "bi":
        return score_pairs(model, tokenizer, [queries[i] for i, _ in pairs], [docs[j] for _, j in pairs], batch_size)

    was_training = model.training
    model.eval()
    q_idx = sorted({i for i, _ in pairs})
    d_idx = sorted({j for _, j in pairs})
    q_emb = encode(model.query_tower(), tokenizer, [queries[i] for i in q_idx], batch_size)  # (n_q, dim)
    d_emb = encode(model.encoder, tokenizer, [docs[j] for j in d_idx], batch_size, bar)      # (n_d, dim)
    if not model.query_tower().cfg.normalize:
        q_emb = F.normalize(q_emb, dim=-1)
    if not model.encoder.cfg.normalize:
        d_emb = F.normalize(d_emb, dim=-1)
    q_row = {i: r for r, i in enumerate(q_idx)}
    d_row = {j: r for r, j in enumerate(d_idx)}
    qi = torch.tensor([q_row[i] for i, _ in pairs])
    dj = torch.tensor([d_row[j] for _, j in pairs])
    model.train(was_training)
    scores = (q_emb[qi] * d_emb[dj]).sum(-1).numpy().astype(np.float32)  # (n_pairs,)
    return require_finite(scores, "pre-ranker scores")


def score(model: PreRanker, tokenizer, query: str, docs: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """Scores ``f(query, d)`` of one query against ``docs``, float32 ``(len(docs),)`` (Eq. 1)."""
    return score_pairs(model, tokenizer, [query] * len(docs), docs, batch_size)
