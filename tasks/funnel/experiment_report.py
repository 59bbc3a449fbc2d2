"""The text tables and JSON figures of the distillation experiment (:mod:`flows.experiment`):
pre-ranker answer recall before / after distillation, the reader's learning curve, and FiD Eq. 3
post-ranking against the pre-ranker's passage order — each with bootstrap 95% intervals
(:mod:`tasks.funnel.experiment_eval`).

``cfg`` is the experiment's configuration (``flows.experiment.ExperimentConfig``; the fields
read are named where they are used); ``done`` maps step names to their cached outputs."""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, READER_PREDICTIONS
from funnelrag.paired import bootstrap_indices, interval
from funnelrag.registry import question_set_digest
from funnelrag.store import StageResult
from tasks.funnel import experiment_eval as E


def distillation_report(cfg: Any, recalls: dict[str, StageResult], done: dict[str, StageResult]) -> tuple[str, dict]:
    """Pre-ranker AR@k before / after answer-only (and, when done, L2G) distillation on the
    held-out pool; ``recalls``: the ``recall.json`` steps ``"before"``, ``"answer_only"`` and
    optionally ``"l2g"`` (:func:`tasks.funnel.experiment_steps.build_preranker_recall`)."""
    c = cfg
    per = {n: json.loads((r.path / "recall.json").read_text()) for n, r in recalls.items()}
    qids = per["before"]["question_ids"]
    ks = [k for k in per["before"] if k != "question_ids"]
    idx = bootstrap_indices(len(qids), c.n_bootstrap, c.bootstrap_seed)
    rows = {"before distillation": {int(k): np.asarray(per["before"][k]) for k in ks},
            "BPR, answer-only (K=0)": {int(k): np.asarray(per["answer_only"][k]) for k in ks}}
    if "l2g" in per:
        rows[f"BPR, L2G (K={c.l2g_top_k})"] = {int(k): np.asarray(per["l2g"][k]) for k in ks}
    length = c.preranker.max_length or "the model's own"
    scoring = (f"units by MaxP over their passages, {'stored' if c.heldout_vectors == 'stored' else 'computed'} "
               "passage vectors" if c.candidates.unit_scoring == "maxp" else "units by their text")
    text, fig = E.recall_table(f"Pre-ranker answer recall (%), {len(qids)} held-out NQ-open dev questions, "
                               f"same pool and input length ({length} tokens; {scoring}); BPR {c.distill.epochs} "
                               f"epochs, unit scoring {c.distill.unit_scoring}, trained towers: {c.distill.towers}; "
                               "95% bootstrap intervals", rows, idx, baseline="before distillation")
    return text, {"preranker": fig, "n_heldout": len(qids), "heldout_digest": question_set_digest(qids),
                  **{n: done[n].summary for n in ("answer_only", "l2g") if n in done}}


def reader_curve_report(cfg: Any, done: dict[str, StageResult]) -> tuple[str, dict]:
    """The reader's learning curve: training loss (mean over the steps up to each checkpoint
    since the previous one) and held-out EM with its 95% bootstrap interval per checkpoint."""
    c = cfg
    curve = json.loads((done["reader_curve"].path / "curve.json").read_text())
    losses = json.loads((done["reader"].path / "losses.json").read_text())
    n = len(curve[0]["per_question"]) if curve else 0
    idx = bootstrap_indices(n, c.n_bootstrap, c.bootstrap_seed) if n else None
    lines = [f"Reader ({c.reader.fid.kind}) learning curve: held-out EM (%) on {n} dev-split questions whose flat "
             f"BM25 top {c.reader_search_k} holds an answer (reader input built like the training input), 95% "
             "bootstrap intervals", "", "| step | epoch | train loss (since previous) | held-out EM |", "|---|---|---|---|"]
    rows, prev = [], 0
    for point in curve:
        window = losses[prev:point["step"]]
        loss = sum(window) / len(window) if window else float("nan")
        em = interval(np.asarray(point["per_question"], float), idx)
        lines.append(f"| {point['step']} | {point['epoch']} | {loss:.3f} | {E.fmt(em)} |")
        rows.append({"step": point["step"], "epoch": point["epoch"], "train_loss": loss, "em": em})
        prev = point["step"]
    return "\n".join(lines), {"reader_curve": rows}


def postranker_report(cfg: Any, done: dict[str, StageResult]) -> tuple[str, dict]:
    """Eq. 3 post-ranking vs pre-ranker passage order (same N units), and the reader's EM."""
    c = cfg
    cands = CANDIDATES.read(done["postrank_data"].path)
    pq = sorted(set(cands["question_id"].to_pylist()))
    att = ATTENTION_SCORES.read(done["postrank"].path)
    scores = dict(zip(zip(att["question_id"].to_pylist(), att["passage_id"].to_pylist()), att["score"].to_pylist()))
    pks = list(c.recall_at)
    prows = {"pre-ranker passage order": E.per_question_passage_recall(cands, pks, pq)}
    if "postrank_prerank" in done:   # a MaxP funnel keeps a unit's best passages first
        triples = json.loads((done["postrank_prerank"].path / "passage_scores.json").read_text())
        prows["pre-ranker passage scores"] = E.per_question_passage_recall(
            cands, pks, pq, {(q, p): v for q, p, v in triples})
    prows["FiD Eq. 3 post-ranking"] = E.per_question_passage_recall(cands, pks, pq, scores)
    t2, f2 = E.recall_table(f"Passage answer recall (%) over the same {c.candidates.n_units} units, {len(pq)} held-out "
                            "questions whose units hold an answer", prows,
                            bootstrap_indices(len(pq), c.n_bootstrap, c.bootstrap_seed), baseline="pre-ranker passage order")
    preds = READER_PREDICTIONS.read(done["reader_eval"].path)
    em = np.asarray(preds["exact_match"].to_pylist(), dtype=float)
    em_ci = interval(em, bootstrap_indices(len(em), c.n_bootstrap, c.bootstrap_seed))
    t3 = (f"Reader ({c.reader.fid.kind}) EM (%) on {len(em)} held-out questions whose reader input "
          f"(top {c.reader.n_passages} passages) holds an answer: {E.fmt(em_ci)}")
    return f"{t2}\n\n{t3}", {"postranker": f2, "postrank_digest": question_set_digest(pq), "reader_em": em_ci,
                              "reader": done["reader"].summary, "reader_eval": done["reader_eval"].summary}


def experiment_report(cfg: Any, done: dict[str, StageResult], recalls: dict[str, StageResult]) -> tuple[str, dict]:
    """The tables (text, ``""`` when no reported step ran) and figures of the steps in ``done``:
    the validation search, pre-ranker recall before / after distillation (``recalls``), the
    reader's learning curve, post-ranking and reader EM."""
    texts, figures = [], {}
    if "validation" in done:
        from tasks.funnel.experiment_validation import validation_table  # noqa: PLC0415  (heavy: torch via tasks.funnel.experiment_validation, only when the validation step ran)

        curve = json.loads((done["validation"].path / "validation.json").read_text())
        texts.append(validation_table(curve))
        figures["validation"] = curve
    parts = []
    if "answer_only" in done:
        parts.append(distillation_report(cfg, recalls, done))
    if "reader_curve" in done:
        parts.append(reader_curve_report(cfg, done))
    if {"postrank", "reader_eval"} <= set(done):
        parts.append(postranker_report(cfg, done))
    for text, fig in parts:
        texts.append(text)
        figures.update(fig)
    return "\n\n".join(texts), figures
