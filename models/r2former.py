"""R²-Former and its query-document matching (QDM) head.

Ye et al. 2024, R²AG, Section 3.3 (Eq. 2) and Section 3.5 (Eqs. 7–8); hyper-parameters from
Appendix D (hidden size 256, 4 attention heads, dropout 0.1). The paper does not give the number
of encoder layers or the feed-forward width; ``n_layers`` and ``ffn_size`` default to 2 and 4·h1.

Inputs are the list-wise retrieval features of :mod:`tasks.r2ag.features` (``[r, gamma, zeta]``
per document, or a subset for the feature ablations), padded to ``n_docs`` with a boolean
``doc_mask`` (True = a real document).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from models.saving import atomic_directory, read_config, write_config

R2FORMER_CONFIG = "r2former.config.json"
R2FORMER_WEIGHTS = "r2former.weights.safetensors"


@dataclass(frozen=True)
class R2FormerConfig:
    """R²-Former shape.

    n_features : retrieval features per document (3, fewer in an ablation).
    hidden_size : h1, the Transformer width (Appendix D: 256).
    n_heads : attention heads (Appendix D: 4).
    n_layers : Transformer encoder layers (not given in the paper).
    ffn_size : feed-forward width of each layer; ``None`` = 4 * hidden_size.
    dropout : dropout in the encoder (Appendix D: 0.1).
    max_docs : rows of the learned positional embedding ``p`` (Eq. 2): the longest list.
    """

    n_features: int = 3
    hidden_size: int = 256
    n_heads: int = 4
    n_layers: int = 2
    ffn_size: int | None = None
    dropout: float = 0.1
    max_docs: int = 64

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.max_docs < 1 or self.n_layers < 1:
            raise ValueError("R2FormerConfig: n_features, n_layers and max_docs must be >= 1")
        if self.hidden_size % self.n_heads:
            raise ValueError(f"R2FormerConfig: hidden_size {self.hidden_size} is not divisible by n_heads {self.n_heads}")


@dataclass
class R2FormerOutput:
    """``hidden``: H of Eq. 2, ``(batch, n_docs, hidden_size)``; padded rows are meaningless."""

    hidden: torch.Tensor


@dataclass
class QDMOutput:
    """Output of :class:`R2FormerQDM`.

    hidden : ``(batch, n_docs, hidden_size)`` R²-Former embeddings H.
    logits : ``(batch, n_docs)`` QDM logits (Eq. 7 before the sigmoid); padding = -inf.
    scores : ``(batch, n_docs)`` relevance predictions ŝ = sigmoid(logits); padding = 0.
    loss : scalar L_QDM (Eq. 8) when labels were given, else None.
    """

    hidden: torch.Tensor
    logits: torch.Tensor
    scores: torch.Tensor
    loss: torch.Tensor | None = None


def _check_inputs(features: torch.Tensor, doc_mask: torch.Tensor, cfg: R2FormerConfig) -> None:
    if features.ndim != 3 or features.shape[-1] != cfg.n_features:
        raise ValueError(f"features must be (batch, n_docs, {cfg.n_features}), got {tuple(features.shape)}")
    if doc_mask.shape != features.shape[:2]:
        raise ValueError(f"doc_mask {tuple(doc_mask.shape)} does not match features {tuple(features.shape[:2])}")
    if features.shape[1] > cfg.max_docs:
        raise ValueError(f"{features.shape[1]} documents per list exceed max_docs={cfg.max_docs}")
    if not bool(doc_mask.any(dim=1).all()):
        raise ValueError("every ranked list needs at least one document (a doc_mask row is all False)")


class R2Former(nn.Module):
    """Eq. 2: ``H = f_att[f_{→h1}(input) + p]``.

    ``f_{→h1}`` is a linear map of the feature vector to ``hidden_size``, ``p`` learned positional
    embeddings (one per rank), ``f_att`` a Transformer encoder in which every document attends to
    every other document of its list (padding masked out).
    """

    def __init__(self, cfg: R2FormerConfig):
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.n_features, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_docs, cfg.hidden_size)
        layer = nn.TransformerEncoderLayer(cfg.hidden_size, cfg.n_heads, cfg.ffn_size or 4 * cfg.hidden_size,
                                           cfg.dropout, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)

    def forward(self, features: torch.Tensor, doc_mask: torch.Tensor) -> R2FormerOutput:
        """``features (batch, n_docs, n_features)``, ``doc_mask (batch, n_docs)`` bool.

        Raises
        ------
        ValueError
            Wrong shapes, more documents than ``max_docs``, or a list without documents.
        """
        _check_inputs(features, doc_mask, self.cfg)
        n_docs = features.shape[1]
        pos = torch.arange(n_docs, device=features.device)  # (n_docs,)
        x = self.input_proj(features) + self.position(pos)[None]  # (batch, n_docs, hidden_size)
        hidden = self.encoder(x, src_key_padding_mask=~doc_mask.bool())  # (batch, n_docs, hidden_size)
        return R2FormerOutput(hidden=hidden)


class QDMHead(nn.Module):
    """Eq. 7: ``ŝ = f_{→1}(H)``, a binary classification head; returns logits ``(batch, n_docs)``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)  # (batch, n_docs)


def qdm_loss(logits: torch.Tensor, labels: torch.Tensor, doc_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ``L_QDM = -sum_i [s_i log ŝ_i + (1 - s_i) log(1 - ŝ_i)]`` per list, mean over lists.

    Parameters
    ----------
    logits : ``(batch, n_docs)`` QDM logits (sigmoid gives ŝ; computed stably from logits).
    labels : ``(batch, n_docs)`` 0/1 relevance labels s.
    doc_mask : ``(batch, n_docs)`` bool; padded documents do not count.
    """
    mask = doc_mask.to(logits.dtype)  # (batch, n_docs)
    safe = torch.where(doc_mask.bool(), logits, torch.zeros_like(logits))
    per_doc = F.binary_cross_entropy_with_logits(safe, labels.to(logits.dtype), reduction="none")  # (batch, n_docs)
    return (per_doc * mask).sum(dim=1).mean()


class R2FormerQDM(nn.Module):
    """R²-Former with its QDM head: the model trained by QDM alone (generator-free stage)."""

    def __init__(self, cfg: R2FormerConfig):
        super().__init__()
        self.cfg = cfg
        self.r2former = R2Former(cfg)
        self.qdm_head = QDMHead(cfg.hidden_size)

    def forward(self, features: torch.Tensor, doc_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> QDMOutput:
        """``features (batch, n_docs, n_features)``, ``doc_mask (batch, n_docs)``, optional
        ``labels (batch, n_docs)`` → :class:`QDMOutput` (loss = Eq. 8 when labels are given)."""
        hidden = self.r2former(features, doc_mask).hidden  # (batch, n_docs, hidden_size)
        logits = self.qdm_head(hidden)  # (batch, n_docs)
        mask = doc_mask.bool()
        loss = qdm_loss(logits, labels, mask) if labels is not None else None
        logits = logits.masked_fill(~mask, float("-inf"))
        scores = torch.sigmoid(logits)  # padding: sigmoid(-inf) = 0
        return QDMOutput(hidden=hidden, logits=logits, scores=scores, loss=loss)


# ---------------------------------------------------------------------------- save / load
def save_weights(module: nn.Module, path: Path) -> None:
    """``module``'s state dict as safetensors at ``path`` (inside a directory being built)."""
    save_file({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, str(path))


def load_weights(module: nn.Module, path: Path) -> None:
    """Load safetensors weights into ``module``.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    """
    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    module.load_state_dict(load_file(str(path)))


def write_r2former(model: R2FormerQDM, features: tuple[str, ...], directory: Path) -> None:
    """Write ``r2former.config.json`` (config + feature names) and the weights into ``directory``
    (a directory under construction: see :func:`save_r2former`)."""
    write_config(directory / R2FORMER_CONFIG, {"config": asdict(model.cfg), "features": list(features)})
    save_weights(model, directory / R2FORMER_WEIGHTS)


def save_r2former(model: R2FormerQDM, features: tuple[str, ...], directory: Path) -> Path:
    """Save the R²-Former + QDM head and the feature names it reads; the directory appears
    complete or not at all (:func:`data_contracts.base.atomic_directory`)."""
    with atomic_directory(Path(directory)) as tmp:
        write_r2former(model, features, tmp)
    return Path(directory)


def load_r2former(directory: Path) -> tuple[R2FormerQDM, tuple[str, ...]]:
    """Inverse of :func:`save_r2former`: ``(model in eval mode, feature names)``.

    Raises
    ------
    FileNotFoundError
        The directory lacks the config or weights file.
    """
    directory = Path(directory)
    meta = read_config(directory, R2FORMER_CONFIG, "R²-Former")
    model = R2FormerQDM(R2FormerConfig(**meta["config"]))
    load_weights(model, directory / R2FORMER_WEIGHTS)
    model.eval()
    return model, tuple(meta["features"])
