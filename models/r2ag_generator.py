"""Retrieval-aware prompting for a decoder-only generator (R²AG, Sections 3.4–3.5).

* Eq. 3: a projection ``f_{→h2}`` (an MLP) maps the R²-Former embeddings H ``(batch, n_docs, h1)``
  into the generator's token-embedding space ``(batch, n_docs, h2)``.
* Eqs. 4–5: the prompt's token embeddings come from the generator's embedding layer; the
  embedding at the i-th ``<R>`` placeholder is replaced by ``e^R_i``, the projection of document
  i, so each retrieval embedding sits right before its document.
* Eq. 9: ``L = L_QDM + L_LM``; the generator is frozen by default (only R²-Former, QDM head and
  projection learn) and can be trained too.

The generator is any ``transformers`` causal LM passed in (built by
:func:`tasks.r2ag.generation.build_generator`); the modules do no file I/O. :func:`save_r2ag`
and :func:`load_r2ag` write and read a whole trained model directory::

    r2former.config.json, r2former.weights.safetensors   R²-Former + QDM head (models.r2former)
    projection.config.json, projection.weights.safetensors
    generator/                                            transformers save_pretrained
    tokenizer/                                            tokenizer with the <R> token
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.r2former import R2FormerQDM, load_r2former, load_weights, save_weights, write_r2former
from models.saving import atomic_directory, read_config, write_config

PROJECTION_CONFIG = "projection.config.json"
PROJECTION_WEIGHTS = "projection.weights.safetensors"
GENERATOR_DIR = "generator"
TOKENIZER_DIR = "tokenizer"
R_TOKEN = "<R>"


@dataclass(frozen=True)
class ProjectionConfig:
    """Eq. 3 projection: ``in_size`` (h1) → ``hidden_size`` → ``out_size`` (h2) with GELU.

    hidden_size : ``None`` = ``out_size``.
    """

    in_size: int = 256
    out_size: int = 256
    hidden_size: int | None = None
    dropout: float = 0.0


class RetrievalProjection(nn.Module):
    """Eq. 3: ``E^R = f_{→h2}(H)``, ``(batch, n_docs, h1) → (batch, n_docs, h2)``."""

    def __init__(self, cfg: ProjectionConfig):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.hidden_size or cfg.out_size
        self.mlp = nn.Sequential(nn.Linear(cfg.in_size, hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                                 nn.Linear(hidden, cfg.out_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(hidden)  # (batch, n_docs, out_size)


def assemble_inputs_embeds(token_embeds: torch.Tensor, input_ids: torch.Tensor, r_token_id: int,
                           retrieval_embeds: torch.Tensor, doc_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5: put ``e^R_i`` at the i-th ``<R>`` placeholder of every sequence.

    Parameters
    ----------
    token_embeds : ``(batch, seq_len, h2)`` generator token embeddings of ``input_ids`` (Eq. 4).
    input_ids : ``(batch, seq_len)``; the i-th occurrence of ``r_token_id`` in a row is the
        placeholder of that row's i-th document (retriever order).
    r_token_id : id of the ``<R>`` special token.
    retrieval_embeds : ``(batch, n_docs, h2)`` projected R²-Former embeddings (Eq. 3).
    doc_mask : ``(batch, n_docs)`` bool, True for real documents (a prefix of each row).

    Returns
    -------
    torch.Tensor ``(batch, seq_len, h2)``

    Raises
    ------
    ValueError
        A row's number of placeholders differs from its number of documents (names the rows),
        or the embedding sizes differ.
    """
    if token_embeds.shape[-1] != retrieval_embeds.shape[-1]:
        raise ValueError(f"retrieval embeddings have size {retrieval_embeds.shape[-1]}, "
                         f"the generator's token embeddings {token_embeds.shape[-1]}")
    is_r = input_ids == r_token_id  # (batch, seq_len)
    n_r = is_r.sum(dim=1)  # (batch,)
    n_docs = doc_mask.sum(dim=1)  # (batch,)
    bad = torch.nonzero(n_r != n_docs).flatten().tolist()
    if bad:
        raise ValueError(f"placeholder/document mismatch in batch row(s) {bad[:5]}: "
                         f"{n_r[bad].tolist()[:5]} <R> placeholders for {n_docs[bad].tolist()[:5]} documents")
    doc_index = (torch.cumsum(is_r.long(), dim=1) - 1).clamp(min=0)  # (batch, seq_len): i of the i-th <R>
    gathered = torch.gather(retrieval_embeds, 1,
                            doc_index.unsqueeze(-1).expand(-1, -1, retrieval_embeds.shape[-1]))  # (batch, seq_len, h2)
    return torch.where(is_r.unsqueeze(-1), gathered.to(token_embeds.dtype), token_embeds)


@dataclass
class R2AGOutput:
    """Output of :class:`R2AGModel`.

    loss : Eq. 9 ``L_QDM + L_LM`` (terms per ``use_qdm_loss``), or None without labels.
    lm_loss, qdm_loss : the two terms (None when not computed).
    logits : ``(batch, seq_len, vocab)`` generator logits.
    qdm_logits : ``(batch, n_docs)`` QDM logits (padding -inf).
    """

    loss: torch.Tensor | None
    lm_loss: torch.Tensor | None
    qdm_loss: torch.Tensor | None
    logits: torch.Tensor
    qdm_logits: torch.Tensor


class R2AGModel(nn.Module):
    """R²-Former + QDM head + projection + decoder-only generator (Fig. 2 of the paper).

    Parameters
    ----------
    retrieval : :class:`R2FormerQDM` (possibly pre-trained by QDM alone).
    projection : :class:`RetrievalProjection` with ``out_size`` = generator embedding size.
    generator : a ``transformers`` causal LM whose vocabulary contains the ``<R>`` token.
    r_token_id : id of ``<R>``.
    freeze_generator : keep the generator's weights fixed (the paper's low-resource setting).
    use_qdm_loss : add L_QDM to the loss (Eq. 9); False = the "w/o L_QDM" ablation.
    """

    def __init__(self, retrieval: R2FormerQDM, projection: RetrievalProjection, generator: nn.Module,
                 r_token_id: int, freeze_generator: bool = True, use_qdm_loss: bool = True):
        super().__init__()
        emb = generator.get_input_embeddings()
        if projection.cfg.out_size != emb.embedding_dim:
            raise ValueError(f"projection out_size {projection.cfg.out_size} != generator embedding size {emb.embedding_dim}")
        if not 0 <= r_token_id < emb.num_embeddings:
            raise ValueError(f"<R> token id {r_token_id} is outside the generator vocabulary ({emb.num_embeddings})")
        self.retrieval = retrieval
        self.projection = projection
        self.generator = generator
        self.r_token_id = r_token_id
        self.use_qdm_loss = use_qdm_loss
        self.freeze_generator = freeze_generator
        if freeze_generator:
            generator.requires_grad_(False)

    def train(self, mode: bool = True) -> "R2AGModel":
        super().train(mode)
        if self.freeze_generator:
            self.generator.eval()  # a frozen generator keeps inference behaviour (no dropout)
        return self

    def inputs_embeds(self, features: torch.Tensor, doc_mask: torch.Tensor, input_ids: torch.Tensor,
                      doc_labels: torch.Tensor | None = None):
        """Eqs. 2–5: ``(inputs_embeds (batch, seq_len, h2), QDMOutput)``."""
        qdm = self.retrieval(features, doc_mask, doc_labels)
        e_r = self.projection(qdm.hidden)  # (batch, n_docs, h2)
        tok = self.generator.get_input_embeddings()(input_ids)  # (batch, seq_len, h2)
        return assemble_inputs_embeds(tok, input_ids, self.r_token_id, e_r, doc_mask), qdm

    def forward(self, features: torch.Tensor, doc_mask: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, labels: torch.Tensor | None = None,
                doc_labels: torch.Tensor | None = None) -> R2AGOutput:
        """``features (batch, n_docs, n_features)``, ``doc_mask (batch, n_docs)``, ``input_ids``
        and ``attention_mask (batch, seq_len)``, ``labels (batch, seq_len)`` (-100 = ignored),
        ``doc_labels (batch, n_docs)`` → :class:`R2AGOutput` with Eq. 9's loss."""
        embeds, qdm = self.inputs_embeds(features, doc_mask, input_ids, doc_labels)
        out = self.generator(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels)
        lm = out.loss if labels is not None else None
        q = qdm.loss if (doc_labels is not None and self.use_qdm_loss) else None
        terms = [t for t in (q, lm) if t is not None]
        loss = sum(terms) if terms else None
        return R2AGOutput(loss=loss, lm_loss=lm, qdm_loss=q, logits=out.logits, qdm_logits=qdm.logits)

    @torch.no_grad()
    def generate(self, features: torch.Tensor, doc_mask: torch.Tensor, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, max_new_tokens: int = 16, **generate_kwargs) -> torch.Tensor:
        """Greedy decoding from the assembled embeddings (Eq. 6); prompts must be left-padded.

        Returns the generated token ids ``(batch, n_new)`` (prompt not included).
        """
        embeds, _ = self.inputs_embeds(features, doc_mask, input_ids)
        return self.generator.generate(inputs_embeds=embeds, attention_mask=attention_mask,
                                       max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)


# ---------------------------------------------------------------------------- save / load
def save_r2ag(model: R2AGModel, features: tuple[str, ...], tokenizer, directory: Path) -> Path:
    """Save R²-Former, projection, generator and tokenizer into ``directory``, which appears
    complete or not at all (:func:`data_contracts.base.atomic_directory`)."""
    with atomic_directory(Path(directory)) as tmp:
        write_r2former(model.retrieval, features, tmp)
        write_config(tmp / PROJECTION_CONFIG, model.projection.cfg)
        save_weights(model.projection, tmp / PROJECTION_WEIGHTS)
        model.generator.save_pretrained(tmp / GENERATOR_DIR)
        tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
    return Path(directory)


def has_generator(directory: Path) -> bool:
    """Whether ``directory`` holds a full R²AG model (:func:`save_r2ag`), not only an R²-Former."""
    return (Path(directory) / GENERATOR_DIR / "config.json").exists()


def load_r2ag(directory: Path) -> tuple[R2AGModel, object, tuple[str, ...]]:
    """Inverse of :func:`save_r2ag`: ``(model in eval mode, tokenizer, feature names)``.

    Raises
    ------
    FileNotFoundError
        ``directory`` lacks the R²-Former, the projection or the generator.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

    directory = Path(directory)
    retrieval, features = load_r2former(directory)
    if not has_generator(directory):
        raise FileNotFoundError(f"{directory} holds an R²-Former but no generator (train with joint.enabled)")
    projection = RetrievalProjection(ProjectionConfig(**read_config(directory, PROJECTION_CONFIG, "R²AG projection")))
    load_weights(projection, directory / PROJECTION_WEIGHTS)
    tokenizer = AutoTokenizer.from_pretrained(directory / TOKENIZER_DIR)
    generator = AutoModelForCausalLM.from_pretrained(directory / GENERATOR_DIR)
    model = R2AGModel(retrieval, projection, generator, tokenizer.convert_tokens_to_ids(R_TOKEN))
    return model.eval(), tokenizer, features
