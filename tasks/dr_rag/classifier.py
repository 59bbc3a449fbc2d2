"""Training and inference of the DR-RAG classifier C(q, d1, d2) (paper Eq. 2, Appendix A.1).

Training plugs :class:`ClassifierHooks` into the shared accelerate loop
(:func:`funnelrag.training.train`). Inference scores triples in length-sorted batches; CFS and
CIS read probabilities through :class:`PairProbs`, which scores a pair the first time it is asked
for and caches it (CFS usually examines only a few of its candidates).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from models.dr_rag import ClassifierConfig, DRRAGClassifier, encode_triples
from tasks.dr_rag.pairs import ClassifierPair

log = logging.getLogger(__name__)


class ClassifierHooks:
    """:class:`funnelrag.training.TrainHooks` for :class:`DRRAGClassifier`.

    Parameters
    ----------
    tokenizer : the backbone's tokenizer.
    cfg : :class:`ClassifierConfig` (lengths).
    questions : ``{question_id: question text}``.
    texts : ``{paragraph_id: "title: text"}``.
    """

    def __init__(self, tokenizer, cfg: ClassifierConfig, questions: Mapping[str, str], texts: Mapping[str, str]):
        self.tokenizer, self.cfg, self.questions, self.texts = tokenizer, cfg, questions, texts

    def collate(self, examples: list[ClassifierPair]) -> dict[str, torch.Tensor]:
        triples = [(self.questions[e.question_id], self.texts[e.d1_id], self.texts[e.d2_id]) for e in examples]
        batch = encode_triples(self.tokenizer, triples, self.cfg)  # each (batch, seq_len)
        batch["labels"] = torch.tensor([e.label for e in examples], dtype=torch.long)  # (batch,)
        return batch

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(**batch)
        acc = ((out.probs >= 0.5).long() == batch["labels"]).float().mean().item()
        return out.loss, {"acc": acc}


@torch.no_grad()
def score_triples(model: DRRAGClassifier, tokenizer, triples: Sequence[tuple[str, str, str]],
                  batch_size: int = 32) -> np.ndarray:
    """``P(C(q, d1, d2) = 1)`` per triple, float32 ``(len(triples),)``, in input order.

    Triples are batched by length (less padding); the model is put in eval mode.
    """
    model.eval()
    out = np.zeros(len(triples), dtype=np.float32)
    order = sorted(range(len(triples)), key=lambda i: sum(len(t) for t in triples[i]))
    device = next(model.parameters()).device
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = encode_triples(tokenizer, [triples[i] for i in idx], model.cfg)
        probs = model(**{k: v.to(device) for k, v in batch.items()}).probs  # (batch,)
        out[idx] = probs.float().cpu().numpy()
    return out


class PairProbs(Mapping):
    """``{(anchor_id, doc_id): P(C(q, anchor, doc) = 1)}`` for one question, computed on demand.

    ``score(pairs) -> probs`` scores a list of ``(anchor_id, doc_id)``; :meth:`prefetch` scores
    many pairs in one batch. Iteration and ``len`` cover the pairs scored so far.
    """

    def __init__(self, score: Callable[[list[tuple[str, str]]], np.ndarray]):
        self._score = score
        self._cache: dict[tuple[str, str], float] = {}

    def prefetch(self, pairs: Iterable[tuple[str, str]]) -> None:
        todo = sorted({p for p in pairs if p not in self._cache})
        if todo:
            self._cache.update(zip(todo, (float(x) for x in self._score(todo))))

    def __getitem__(self, pair: tuple[str, str]) -> float:
        if pair not in self._cache:
            self.prefetch([pair])
        return self._cache[pair]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


def question_scorer(model: DRRAGClassifier, tokenizer, question: str, texts: Mapping[str, str],
                    batch_size: int = 32) -> Callable[[list[tuple[str, str]]], np.ndarray]:
    """``pairs -> probs`` for one question, for :class:`PairProbs`."""
    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        return score_triples(model, tokenizer, [(question, texts[a], texts[d]) for a, d in pairs], batch_size)
    return score
