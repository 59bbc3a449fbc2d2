"""R²AG stages wired by ``flows/r2ag.py``: lists + features, train/test split, QDM training of
every feature ablation, and the ranking comparison against the retriever (paper Table 3's shape,
measured on the QDM ranking instead of downstream accuracy).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from data_contracts import r2ag as R
from funnelrag.stages import stage
from funnelrag.training import TrainConfig
from funnelrag.training import train as run_training
from models.r2former import R2FormerConfig, R2FormerQDM
from tasks.dr_rag.hotpotqa import load_hotpotqa, split_unit
from tasks.qa.questions import QuestionsConfig, load_questions, split_of
from tasks.r2ag.features import FeatureConfig, feature_table
from tasks.r2ag.lists import (
    ListConfig,
    embed_lists,
    hotpotqa_candidates,
    nq_bm25_lists,
    rank_by_relevance,
    relevant_counts,
)
from tasks.r2ag.metrics import DEFAULT_KS, ranking_metrics
from tasks.r2ag.qdm import ABLATIONS, ListExample, QDMHooks, list_examples

log = logging.getLogger(__name__)

DATASETS = ("hotpotqa", "nq")


@dataclass(frozen=True)
class R2AGDataConfig:
    """Which questions and retriever lists R²AG is trained and evaluated on.

    dataset : ``"hotpotqa"`` (context paragraphs, supporting = relevant) or ``"nq"`` (BM25 over
        the published corpus passages, relevant = DPR has_answer).
    hotpotqa_file, nq_file : registered data-file names (:mod:`funnelrag.datasets`).
    path : a file of one's own (HotpotQA JSON Lines / JSON for ``hotpotqa``, an NQ-open TSV for
        ``nq``), read instead of the registered file; as ``data.path`` of the DR-RAG flows.
    max_questions : keep the first N questions (file order; NQ by question_id); None = all.
    test_fraction : share of questions (by hash) held out for evaluation.
    split_seed : seed of the split hash.
    corpus : corpus name in the workspace store (NQ only); corpus_version None = current.
    """

    dataset: str = "hotpotqa"
    hotpotqa_file: str = "hotpotqa-dev-subsampled"
    nq_file: str = "nq-open-dev"
    path: str | None = None
    max_questions: int | None = None
    test_fraction: float = 0.2
    split_seed: int = 0
    corpus: str = "wikispeedia"
    corpus_version: str | None = None

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"R2AGDataConfig.dataset must be one of {DATASETS}, got {self.dataset!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {self.test_fraction}")


@stage("r2ag-features", version="1")
def build_lists_and_features(data: R2AGDataConfig, lists_cfg: ListConfig, feat_cfg: FeatureConfig, encoder,
                             tokenizer, *, data_path: Path, corpus=None) -> tuple[pa.Table, pa.Table, dict]:
    """Ranked lists of every question and their retrieval features (Eqs. 10–12).

    Parameters
    ----------
    data, lists_cfg, feat_cfg : configs.
    encoder, tokenizer : the bi-encoder (:class:`models.encoders.BiEncoder`) giving ``x^q, x^d``.
    data_path : the HotpotQA or NQ-open file.
    corpus : :class:`tasks.corpus.published.CorpusVersion` (NQ only: passages + passage BM25 index).

    Returns
    -------
    (RANKED_LISTS table, RETRIEVAL_FEATURES table, report dict)

    Raises
    ------
    ValueError
        NQ without a corpus.
    """
    if data.dataset == "hotpotqa":
        records = load_hotpotqa(data_path)[:data.max_questions]
        lists, report = hotpotqa_candidates(records, lists_cfg)
        q_emb, d_emb = embed_lists(lists, encoder, tokenizer, feat_cfg.include_title)
        lists, d_emb = rank_by_relevance(lists, q_emb, d_emb)  # the bi-encoder is the retriever
    else:
        if corpus is None:
            raise ValueError("dataset 'nq' needs a published corpus (passages + BM25 index)")

        questions, qreport = load_questions([data_path], QuestionsConfig(limit=data.max_questions))
        lists, report = nq_bm25_lists(questions, corpus.passage_index(), corpus.passages, lists_cfg)
        report["questions"] = qreport.as_dict()
        q_emb, d_emb = embed_lists(lists, encoder, tokenizer, feat_cfg.include_title)
    features = feature_table(lists, q_emb, d_emb, feat_cfg)
    report.update(relevant_counts(lists))
    return lists, features, report


def test_query_ids(lists: pa.Table, data: R2AGDataConfig) -> set[str]:
    """Held-out questions: hash of ``(split_seed, question_id)`` (HotpotQA, as
    :func:`tasks.dr_rag.hotpotqa.split_train_dev`) or of the question text (NQ, as
    :func:`tasks.qa.questions.split_of`, so the split agrees with the other flows')."""
    qids = lists["query_id"].to_pylist()
    questions = dict(zip(qids, lists["question"].to_pylist()))
    if data.dataset == "hotpotqa":
        return {q for q in questions if split_unit(data.split_seed, q) < data.test_fraction}

    return {q for q, text in questions.items() if split_of(text, data.split_seed, data.test_fraction) == "dev"}


def split_examples(features: pa.Table, test_ids: set[str]) -> tuple[list[ListExample], list[ListExample]]:
    """(train, test) list examples, each sorted by query_id."""
    examples = list_examples(features)
    return [e for e in examples if e.query_id not in test_ids], [e for e in examples if e.query_id in test_ids]


@dataclass(frozen=True)
class QDMTrainConfig(TrainConfig):
    """R²-Former training: the shared loop's :class:`funnelrag.training.TrainConfig` with the
    paper's Appendix D defaults (Adam, lr 2e-4; AdamW with weight decay 0 is Adam;
    ``batch_size`` = lists per step) plus

    ablations : also train one R²-Former without each retrieval feature (Table 3).
    """

    epochs: int = 40
    batch_size: int = 32
    lr: float = 2e-4
    scheduler: str = "constant"
    log_every: int = 20
    ablations: bool = True


def train_qdm(train: Sequence[ListExample], features: tuple[str, ...], model_cfg: R2FormerConfig,
              cfg: QDMTrainConfig, output_dir: Path,
              log_metrics: Callable[[dict, int], None] | None = None) -> tuple[R2FormerQDM, list[float]]:
    """Train one R²-Former + QDM head on ``train`` with the shared accelerate loop.

    Returns the trained model (eval mode, CPU) and the loss of every step.
    """
    max_k = max(len(e.labels) for e in train)
    mcfg = replace(model_cfg, n_features=len(features), max_docs=max(model_cfg.max_docs, max_k))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = R2FormerQDM(mcfg)
    tcfg = replace(cfg, output_dir=str(output_dir), checkpoint_every=0, cpu=cfg.cpu or not torch.cuda.is_available())
    result = run_training(model, list(train), QDMHooks(features), tcfg, log_metrics=log_metrics, resume=False)
    model = model.cpu().eval()
    return model, result.losses


def variants(cfg: QDMTrainConfig) -> dict[str, tuple[str, ...]]:
    """Feature subsets to train: the full R²-Former, plus each ablation when enabled."""
    return dict(ABLATIONS) if cfg.ablations else {"full": ABLATIONS["full"]}


def compare_rankings(test: Sequence[ListExample], qdm_scores: dict[str, list[np.ndarray]],
                     ks: Sequence[int] = DEFAULT_KS) -> tuple[pa.Table, list[dict]]:
    """Ranking metrics of the retriever order, of the bi-encoder relevance ``r_i`` alone and of
    every trained variant's QDM scores on the same test lists.

    Returns
    -------
    (RANKING_METRICS table, rows for printing: one dict per ranking)
    """
    labels = [e.labels for e in test]
    rankings: dict[str, list[np.ndarray] | None] = {
        "retriever": None,
        "relevance r_i": [e.features[:, 0] for e in test],
    }
    rankings.update({f"qdm {name}": s for name, s in qdm_scores.items()})
    rows, cols = [], {name: [] for name in R.RANKING_METRICS.schema.names}
    for name, scores in rankings.items():
        m = ranking_metrics(labels, scores, ks)
        rows.append({"ranking": name, **{k: v for k, v in m.items() if k != "n_lists_without_relevant"}})
        for metric, value in m.items():
            if metric.startswith("n_lists"):
                continue
            cols["ranking"].append(name)
            cols["metric"].append(metric)
            cols["value"].append(float(value))
            cols["n_lists"].append(int(m["n_lists"]))
    table = R.RANKING_METRICS.validate(pa.table(cols, schema=R.RANKING_METRICS.schema))
    return table, rows


def mlflow_key(*parts: str) -> str:
    """An MLflow-safe metric name (``@`` and spaces are not allowed)."""
    key = "/".join(parts)
    return key.replace("@", "_at_").replace(" ", "_")
