"""Choosing the BPR learning rate and epochs on a validation part of the TRAIN split, never on
the held-out questions.

The train-split questions are split again by hash (:func:`tasks.qa.questions.split_of` with
its own seed): distillation runs on the answerable questions of the *fit* part, once per learning
rate, with a checkpoint after every epoch's worth of pairs; every checkpoint re-ranks the unit
pools of the *validation* part (every validation question, answerable or not, as the held-out
pool is measured) and its answer recall AR@k is recorded. The best (learning rate, epochs) by
validation AR@1 (ties: fewer epochs, then the smaller rate) is what the experiment's
distillations then train with on the whole train split (``ExperimentConfig.distill_select``).
BPR trains one pass over ``epochs × questions`` shuffled items (:class:`tasks.funnel.distill.PairDataset`),
so a checkpoint every ``round(questions / batch)`` steps falls within a batch of each epoch's end;
a run's ``epochs`` is the share of those items seen (2.99: one batch short of 3). The chosen
epochs are rounded for the final run, whose learning rate decays over its own length.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.funnel import LABELS, QUESTIONS, UNIT_POOL, UNITS
from funnelrag.training import checkpoint_dirs, load_checkpoint_weights
from models.preranker import build_preranker
from tasks.funnel import stages as S
from tasks.funnel.candidates import answer_recall, rerank_pool, unit_passages
from tasks.funnel.distill import prepare_for_distillation
from tasks.qa.questions import split_of


@dataclass(frozen=True)
class ValidationConfig:
    """The validation search.

    fraction : share of the train-split questions (by hash) held out for validation.
    seed : seed of that hash (independent of the train/held-out split's).
    lrs : learning rates tried.
    epochs : epochs of each run; a checkpoint after each one is measured.
    """

    fraction: float = 0.2
    seed: int = 1
    lrs: tuple[float, ...] = (2e-5, 5e-5, 1e-4)
    epochs: int = 6

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"validation fraction must lie in (0, 1), got {self.fraction}")
        if not self.lrs or self.epochs < 1:
            raise ValueError(f"validation needs learning rates and epochs >= 1, got {self.lrs}, {self.epochs}")


def validation_ids(questions: pa.Table, cfg: ValidationConfig) -> set[str]:
    """Question ids of the validation part (hash of the question text with ``cfg.seed``)."""
    return {q for q, text in zip(questions["question_id"].to_pylist(), questions["question"].to_pylist())
            if split_of(text, cfg.seed, cfg.fraction) == "dev"}


def load_checkpoint_preranker(checkpoint_dir: Path, preranker_cfg, distill_cfg):
    """The pre-ranker of a distillation checkpoint (``model.safetensors`` of the whole module,
    query tower included). Returns ``(model, tokenizer)`` in eval mode.

    Raises
    ------
    FileNotFoundError
        The checkpoint has no ``model.safetensors``.
    RuntimeError
        The weights do not fit the module.
    """
    model, tok = build_preranker(preranker_cfg)
    prepare_for_distillation(model, distill_cfg)   # the query tower the checkpoint holds
    return load_checkpoint_weights(model, checkpoint_dir), tok


def validation_curve(train_dir: Path, data_dir: Path, labels_dir: Path, passages: pa.Table, preranker_cfg,
                     distill_cfg, train_cfg, cfg: ValidationConfig, work_dir: Path, ks: Sequence[int],
                     index=None) -> dict[str, Any]:
    """Validation AR@k of every (learning rate, epoch) of answer-only BPR.

    Parameters
    ----------
    train_dir : the train split's candidates stage (its ``unit_pool`` covers every train question).
    data_dir, labels_dir : the distillation questions' candidates and their labels (D+ / D−).
    passages : the corpus ``passages`` table (the units' passages for MaxP re-ranking).
    preranker_cfg, distill_cfg, train_cfg : as for :func:`tasks.funnel.stages.run_distill`.
    cfg : ValidationConfig
    work_dir : scratch directory (labels of the fit part, runs and checkpoints).
    ks : cut-offs of AR@k.
    index : the stored passage vectors of the pre-ranker's document tower (or None: computed).

    Returns
    -------
    dict
        ``{"validation_questions", "fit_questions", "base": {"k": AR}, "runs": [{"lr", "step",
        "epochs", "ar": {"k": AR}}], "best": {"lr", "epochs", "ar"}}`` (AR@k in [0, 1], keys
        the cut-offs as strings, JSON-ready).
    """
    questions = QUESTIONS.read(train_dir)
    val = validation_ids(questions, cfg)
    keep = pa.array(sorted(val), pa.string())
    pool = UNIT_POOL.read(train_dir)
    vpool = pool.filter(pc.is_in(pool["question_id"], keep))
    vquestions = questions.filter(pc.is_in(questions["question_id"], keep))
    units = UNITS.read(train_dir)
    passages_of = unit_passages(passages, vpool["unit_id"].to_pylist())
    vids = sorted(val)
    labels = LABELS.read(labels_dir)
    fit = labels.filter(pc.invert(pc.is_in(labels["question_id"], keep)))
    fit_dir = Path(work_dir) / "fit_labels"
    LABELS.write(fit, fit_dir)
    by_q: dict[str, set[bool]] = {}
    for q, positive in zip(fit["question_id"].to_pylist(), fit["positive"].to_pylist()):
        by_q.setdefault(q, set()).add(bool(positive))
    n_fit = sum(1 for v in by_q.values() if v == {True, False})     # questions with pairs
    per_step = train_cfg.batch_size * train_cfg.grad_accum
    steps_per_epoch = max(1, round(n_fit / per_step))

    def measure(model, tok) -> dict[str, float]:
        ranked = rerank_pool(vpool, units, vquestions, model, tok, 64, passages_of, index)
        return {str(k): v for k, v in answer_recall(ranked, ks, vids).items()}

    base_model, base_tok = build_preranker(preranker_cfg)
    out: dict[str, Any] = {"validation_questions": len(vids), "fit_questions": n_fit,
                           "base": measure(base_model, base_tok), "runs": []}
    for lr in cfg.lrs:
        d_cfg = replace(distill_cfg, epochs=cfg.epochs)
        run_dir = Path(work_dir) / f"lr-{lr:g}"
        S.run_distill(data_dir, fit_dir, preranker_cfg, d_cfg, replace(
            train_cfg, lr=lr, checkpoint_every=steps_per_epoch, keep_checkpoints=cfg.epochs + 1),
            run_dir / "train", run_dir / "out", index=index)
        for ckpt in checkpoint_dirs(run_dir / "train"):   # one per epoch's worth of pairs, and the last
            step = int(ckpt.name.split("_")[1])
            model, tok = load_checkpoint_preranker(ckpt, preranker_cfg, d_cfg)
            seen = min(step * per_step, cfg.epochs * n_fit)   # questions' pair sets trained on (last batch may be short)
            out["runs"].append({"lr": lr, "step": step, "epochs": round(seen / n_fit, 2),
                                "ar": measure(model, tok)})
    k1 = str(min(ks))
    best = max(out["runs"], key=lambda r: (r["ar"][k1], -r["epochs"], -r["lr"]))
    out["best"] = {"lr": best["lr"], "epochs": best["epochs"], "ar": best["ar"]}
    return out


def validation_table(curve: dict[str, Any]) -> str:
    """The validation curve as a text table (AR@k in %)."""
    ks = sorted(curve["base"], key=int)
    head = " | ".join(f"AR@{k}" for k in ks)
    lines = [f"BPR validation on the train split ({curve['validation_questions']} validation questions, "
             f"{curve['fit_questions']} fit questions with answer-only pairs); AR@k (%)",
             f"  {'lr':>8} | {'epochs':>6} | {'step':>5} | {head}",
             f"  {'base':>8} | {0:>6} | {0:>5} | " + " | ".join(f"{100 * curve['base'][k]:5.1f}" for k in ks)]
    for r in curve["runs"]:
        lines.append(f"  {r['lr']:>8g} | {r['epochs']:>6} | {r['step']:>5} | " + " | ".join(f"{100 * r['ar'][k]:5.1f}" for k in ks))
    b = curve["best"]
    lines.append(f"  chosen by validation AR@{ks[0]}: lr {b['lr']:g}, {b['epochs']} epochs")
    return "\n".join(lines)


