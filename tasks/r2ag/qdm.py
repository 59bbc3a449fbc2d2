"""Training and scoring the R²-Former with the QDM task (R²AG Section 3.5, Eqs. 7–8).

Training goes through the shared accelerate loop :func:`funnelrag.training.train` with
:class:`QDMHooks`; the feature ablations of the paper's Table 3 train one R²-Former per feature
subset (``without_relevance`` = ``[gamma, zeta]`` etc.).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pyarrow as pa
import torch

from data_contracts import r2ag as R
from tasks.r2ag.features import FEATURE_NAMES, feature_columns

log = logging.getLogger(__name__)

ABLATIONS: dict[str, tuple[str, ...]] = {
    "full": FEATURE_NAMES,
    "without_relevance": ("precedent_similarity", "neighbor_similarity"),
    "without_precedent": ("relevance", "neighbor_similarity"),
    "without_neighbor": ("relevance", "precedent_similarity"),
}


@dataclass(frozen=True)
class ListExample:
    """One ranked list: ``features (k, 3)`` float32 in rank order, ``labels (k,)`` int8."""

    query_id: str
    features: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    doc_ids: tuple[str, ...] = field(default=(), repr=False)


def list_examples(features: pa.Table) -> list[ListExample]:
    """Group a ``RETRIEVAL_FEATURES`` table into :class:`ListExample` s, sorted by query_id.

    Raises
    ------
    ContractViolation
        ``features`` breaks its contract.
    """
    features = R.RETRIEVAL_FEATURES.validate(features)
    table = features.sort_by([("query_id", "ascending"), ("rank", "ascending")])
    qids = table["query_id"].to_pylist()
    x = np.stack([table[c].to_numpy() for c in FEATURE_NAMES], axis=1).astype(np.float32)  # (n_rows, 3)
    y = table["label"].to_numpy().astype(np.int8)  # (n_rows,)
    docs = table["doc_id"].to_pylist()
    out: list[ListExample] = []
    start = 0
    for i in range(1, len(qids) + 1):
        if i == len(qids) or qids[i] != qids[start]:
            out.append(ListExample(qids[start], x[start:i], y[start:i], tuple(docs[start:i])))
            start = i
    return out


def collate_lists(examples: Sequence[ListExample], columns: Sequence[int]) -> dict[str, torch.Tensor]:
    """Pad lists to the longest in the batch.

    Returns ``features (batch, n_docs, len(columns))`` float32, ``doc_mask (batch, n_docs)`` bool,
    ``labels (batch, n_docs)`` float32 (0 on padding).
    """
    n_docs = max(len(e.labels) for e in examples)
    cols = list(columns)
    feats = torch.zeros(len(examples), n_docs, len(cols))
    mask = torch.zeros(len(examples), n_docs, dtype=torch.bool)
    labels = torch.zeros(len(examples), n_docs)
    for b, e in enumerate(examples):
        k = len(e.labels)
        feats[b, :k] = torch.from_numpy(e.features[:, cols])
        mask[b, :k] = True
        labels[b, :k] = torch.from_numpy(e.labels.astype(np.float32))
    return {"features": feats, "doc_mask": mask, "labels": labels}


@dataclass(frozen=True)
class QDMHooks:
    """:class:`funnelrag.training.TrainHooks` of the QDM task for one feature subset."""

    features: tuple[str, ...] = FEATURE_NAMES

    def collate(self, examples: list) -> dict[str, torch.Tensor]:
        return collate_lists(examples, feature_columns(self.features))

    def loss(self, model, batch) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(batch["features"], batch["doc_mask"], batch["labels"])
        with torch.no_grad():
            pred = out.logits > 0
            mask = batch["doc_mask"]
            acc = (pred == batch["labels"].bool())[mask].float().mean().item()
        return out.loss, {"doc_accuracy": acc}


@torch.no_grad()
def score_lists(model, examples: Sequence[ListExample], features: Sequence[str] = FEATURE_NAMES,
                batch_size: int = 256) -> list[np.ndarray]:
    """QDM scores ŝ (Eq. 7, sigmoid) per list, ``(k_list,)`` float32 each, model in eval mode."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    cols = feature_columns(features)
    out: list[np.ndarray] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        batch = collate_lists(chunk, cols)
        scores = model(batch["features"].to(device), batch["doc_mask"].to(device)).scores.cpu().numpy()  # (batch, n_docs)
        out.extend(scores[b, :len(e.labels)].astype(np.float32) for b, e in enumerate(chunk))
    model.train(was_training)
    return out


def qdm_score_table(variant: str, examples: Sequence[ListExample], scores: Sequence[np.ndarray]) -> pa.Table:
    """``QDM_SCORES`` rows of one variant (rank = retriever rank)."""
    cols: dict[str, list] = {name: [] for name in R.QDM_SCORES.schema.names}
    for e, s in zip(examples, scores):
        k = len(e.labels)
        cols["variant"].extend([variant] * k)
        cols["query_id"].extend([e.query_id] * k)
        cols["rank"].extend(range(k))
        cols["doc_id"].extend(e.doc_ids if e.doc_ids else [f"{e.query_id}/{i}" for i in range(k)])
        cols["label"].extend(e.labels.tolist())
        cols["qdm_score"].extend(np.asarray(s, dtype=np.float32).tolist())
    return R.QDM_SCORES.validate(pa.table(cols, schema=R.QDM_SCORES.schema))
