"""Evaluation tables and plots: per-question results → FunnelRAG Table 2 / 11–13 shaped tables.

:func:`summarize` turns one setting's :class:`tasks.evaluate.retrieval.QueryResult` list into
rows of the three evaluation contracts (:mod:`data_contracts.evaluation`); :func:`to_markdown`
renders the results and stage tables, AR@k and EM with their 95% percentile-bootstrap intervals
over the questions (:mod:`funnelrag.paired`); :func:`question_scores` gives the per-question
values MLflow keeps (``per_question`` artifact) for paired comparisons; :func:`plot_answer_recall`
draws AR@k per setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.csv as pcsv

from data_contracts.base import atomic_write
from data_contracts.evaluation import EVAL_PER_QUESTION, EVAL_RESULTS, EVAL_STAGES, SUBSETS
from funnelrag.paired import mean_interval
from tasks.evaluate.retrieval import QueryResult
from tasks.evaluate.timing import StageOutcome, funnel_label
from tasks.qa.metrics import answer_recall, exact_match_rate, title_entropy

KS = (1, 2, 3, 4)
ENTROPY_TOP = 4  # Table 9: entropy of the titles of the top-4 passages
FINAL_STAGES = ("reranking", "postranking")  # stages whose output is the final list


@dataclass(frozen=True)
class SettingSpec:
    """What a setting is: its name, path (``flat`` | ``progressive``), first-stage retriever,
    pre-ranker and post-ranker labels (``""`` = none) and the number of final passages."""

    name: str
    path: str
    retriever: str
    preranker: str = ""
    postranker: str = ""
    n_final: int = 4


@dataclass
class Generated:
    """Reader answers of one setting: ``{question_id: answer}`` and seconds per question."""

    label: str
    answers: dict[str, str]
    seconds: dict[str, float]


def _candidates_hit(stages: Sequence[StageOutcome]) -> bool:
    """Answer among the set the final passages are chosen from (the last stage's input when
    that stage produces the final list, else the last stage's output)."""
    if len(stages) >= 2 and stages[-1].name in FINAL_STAGES:
        return stages[-2].hit
    return stages[-1].hit


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def summarize(spec: SettingSpec, results: Sequence[QueryResult], in_corpus: Mapping[str, bool],
              answers: Mapping[str, Sequence[str]], generated: Generated | None = None
              ) -> tuple[list[dict], list[dict], list[dict]]:
    """Rows of the results, stages and per-question tables for one setting.

    Parameters
    ----------
    spec : SettingSpec
    results : one :class:`QueryResult` per question.
    in_corpus : ``{question_id: answer occurs in the corpus}`` (the ``answer_in_corpus`` subset).
    answers : gold answers per question id (for EM).
    generated : reader answers, or None (EM columns null).

    Returns
    -------
    results_rows, stage_rows, per_question_rows : lists of dicts with the columns of
        :data:`EVAL_RESULTS`, :data:`EVAL_STAGES` and :data:`EVAL_PER_QUESTION`.

    Raises
    ------
    KeyError
        A question id is missing from ``in_corpus``/``answers`` (or from ``generated``).
    """
    res_rows, stage_rows = [], []
    for subset in SUBSETS:
        rs = [r for r in results if subset == "all" or in_corpus[r.question_id]]
        ar = answer_recall([r.hits for r in rs], KS)
        em = gen_s = None
        if generated is not None:
            em = exact_match_rate([generated.answers[r.question_id] for r in rs], [answers[r.question_id] for r in rs])
            gen_s = _mean([generated.seconds[r.question_id] for r in rs])
        stages = _mean_stages(rs)
        res_rows.append({
            "setting": spec.name, "path": spec.path, "retriever": spec.retriever, "preranker": spec.preranker,
            "postranker": spec.postranker, "funnel": funnel_label(stages, spec.n_final) if stages else "",
            "subset": subset, "n_questions": len(rs), **{f"ar_{k}": ar[k] for k in KS},
            "ar_candidates": _mean([float(_candidates_hit(r.stages)) for r in rs]),
            "entropy_top4": _mean([title_entropy([p[1] for p in r.passages[:ENTROPY_TOP]]) for r in rs]),
            "em": em, "seconds_per_query": _mean([sum(s.seconds for s in r.stages) for r in rs]),
            "generation_seconds_per_query": gen_s,
        })
        stage_rows += [{"setting": spec.name, "subset": subset, "stage_index": i, "stage": s.name, "unit": s.unit,
                        "n_in": s.n_in, "n_out": s.n_out, "seconds_per_query": s.seconds,
                        "answer_recall": s.answer_recall} for i, s in enumerate(stages)]
    q_rows = [{
        "setting": spec.name, "question_id": r.question_id, "answer_in_corpus": bool(in_corpus[r.question_id]),
        "passage_ids": [p[0] for p in r.passages], "titles": [p[1] for p in r.passages], "has_answer": list(r.hits),
        "stage_hits": [s.hit for s in r.stages], "stage_counts": [s.n_out for s in r.stages],
        "stage_seconds": [s.seconds for s in r.stages],
        "entropy_top4": title_entropy([p[1] for p in r.passages[:ENTROPY_TOP]]),
        "prediction": None if generated is None else generated.answers[r.question_id],
        "em": None if generated is None else bool(exact_match_rate([generated.answers[r.question_id]],
                                                                   [answers[r.question_id]])),
    } for r in results]
    return res_rows, stage_rows, q_rows


@dataclass(frozen=True)
class StageSummary:
    """One stage averaged over questions: counts (rounded means), seconds per query, and the
    answer recall of its output."""

    name: str
    unit: str
    n_in: int
    n_out: int
    seconds: float
    answer_recall: float


def _mean_stages(results: Sequence[QueryResult]) -> list[StageSummary]:
    """Stage-wise means over questions (all results of a setting have the same stages)."""
    if not results:
        return []
    n = len(results)
    out = []
    for i, s in enumerate(results[0].stages):
        col = [r.stages[i] for r in results]
        out.append(StageSummary(s.name, s.unit, round(sum(c.n_in for c in col) / n), round(sum(c.n_out for c in col) / n),
                                sum(c.seconds for c in col) / n, sum(c.hit for c in col) / n))
    return out


def tables(results_rows: list[dict], stage_rows: list[dict], q_rows: list[dict]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Contract-checked tables, sorted by (setting, subset[, stage_index | question_id])."""
    def build(contract, rows, keys):
        rows = sorted(rows, key=lambda r: tuple(r[k] for k in keys))
        cols = {f.name: [r[f.name] for r in rows] for f in contract.schema}
        return contract.validate(pa.table(cols, schema=contract.schema))

    return (build(EVAL_RESULTS, results_rows, ("setting", "subset")),
            build(EVAL_STAGES, stage_rows, ("setting", "subset", "stage_index")),
            build(EVAL_PER_QUESTION, q_rows, ("setting", "question_id")))


SUBSET_KEY = {"all": "all", "answer_in_corpus": "in_corpus"}
RESULT_METRICS = ("ar_1", "ar_2", "ar_3", "ar_4", "ar_candidates", "entropy_top4", "em", "seconds_per_query",
                  "generation_seconds_per_query")


def metric_dict(results: pa.Table, stages: pa.Table) -> dict[str, float]:
    """MLflow metrics: ``{setting}.{all|in_corpus}.{metric}`` per results row and
    ``{setting}.stage{i}_{stage}.{seconds|ar|n_out}`` per stage (all questions)."""
    out: dict[str, float] = {}
    for r in results.to_pylist():
        for m in RESULT_METRICS:
            if r[m] is not None:
                out[f"{r['setting']}.{SUBSET_KEY[r['subset']]}.{m}"] = float(r[m])
    for r in stages.to_pylist():
        if r["subset"] == "all":
            key = f"{r['setting']}.stage{r['stage_index']}_{r['stage']}"
            out.update({f"{key}.seconds": r["seconds_per_query"], f"{key}.ar": r["answer_recall"],
                        f"{key}.n_out": float(r["n_out"])})
    return out


def question_scores(per_question: pa.Table) -> dict[str, dict[str, float]]:
    """Per-question values of the evaluation's metrics, named like :func:`metric_dict`'s:
    ``{"<setting>.<all|in_corpus>.<ar_k | em | entropy_top4>": {question id: value}}`` (AR@k and
    EM 0/1; EM only for settings with a reader). The mean of each is the results table's figure.

    Parameters
    ----------
    per_question : an :data:`EVAL_PER_QUESTION` table.
    """
    out: dict[str, dict[str, float]] = {}
    for r in per_question.to_pylist():
        subsets = ("all", "in_corpus") if r["answer_in_corpus"] else ("all",)
        values = {f"ar_{k}": float(any(r["has_answer"][:k])) for k in KS}
        values["entropy_top4"] = r["entropy_top4"]
        if r["em"] is not None:
            values["em"] = float(r["em"])
        for subset in subsets:
            for m, v in values.items():
                out.setdefault(f"{r['setting']}.{subset}.{m}", {})[r["question_id"]] = v
    return out


def write_tables(out_dir: Path, results: pa.Table, stages: pa.Table, per_question: pa.Table,
                 markdown: str) -> list[Path]:
    """Write the three contract tables (Parquet), ``results.evaluation.csv`` and
    ``results.evaluation.md`` into ``out_dir`` atomically; returns the paths."""
    out_dir = Path(out_dir)
    files = [EVAL_RESULTS.write(results, out_dir), EVAL_STAGES.write(stages, out_dir),
             EVAL_PER_QUESTION.write(per_question, out_dir)]
    csv_path, md_path = out_dir / "results.evaluation.csv", out_dir / "results.evaluation.md"
    atomic_write(csv_path, lambda p: pcsv.write_csv(results, p))
    atomic_write(md_path, lambda p: p.write_text(markdown, encoding="utf-8"))
    return [*files, csv_path, md_path]


def _f(v, digits: int = 2, pct: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.{digits - 1}f}" if pct else f"{v:.{digits}f}"


def _ci(scores: Mapping[str, Mapping[str, float]], key: str, value) -> str:
    """``"41.0 [37.2, 44.9]"``: a fraction in % with its 95% interval over the questions of
    ``scores[key]``; the bare value when there are no per-question values."""
    if value is None or not scores.get(key):
        return _f(value, 3, True)
    _, lo, hi = mean_interval(list(scores[key].values()))
    return f"{_f(value, 3, True)} [{_f(lo, 3, True)}, {_f(hi, 3, True)}]"


def to_markdown(results: pa.Table, stages: pa.Table, title: str = "Evaluation",
                per_question: pa.Table | None = None) -> str:
    """Markdown: one Table-2-shaped table per subset (AR in %, seconds per query), then the
    per-stage table (Tables 11–13: candidates in → out, seconds per query, AR of the output).
    With ``per_question`` (:data:`EVAL_PER_QUESTION`), AR@k and EM carry their 95%
    percentile-bootstrap interval over the questions (:func:`funnelrag.paired.mean_interval`)."""
    scores = question_scores(per_question) if per_question is not None else {}
    lines = [f"# {title}", ""]
    rows = results.to_pylist()
    for subset in SUBSETS:
        sub = [r for r in rows if r["subset"] == subset]
        if not sub:
            continue
        lines += [f"## {subset} ({sub[0]['n_questions']} questions)", "",
                  "| setting | funnel | pre-ranker | post-ranker | s/query | AR@1 | AR@2 | AR@3 | AR@4 "
                  "| AR cand. | entropy@4 | EM |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sub:
            key = f"{r['setting']}.{SUBSET_KEY[subset]}."
            lines.append(f"| {r['setting']} | {r['funnel']} | {r['preranker'] or '–'} | {r['postranker'] or '–'} | "
                         f"{r['seconds_per_query']:.3f} | " + " | ".join(_ci(scores, f"{key}ar_{k}", r[f'ar_{k}'])
                                                                         for k in KS) +
                         f" | {_f(r['ar_candidates'], 3, True)} | {_f(r['entropy_top4'], 3)} | "
                         f"{_ci(scores, key + 'em', r['em'])} |")
        lines.append("")
    if scores:
        lines += ["AR@k and EM in %, each with its 95% percentile-bootstrap interval over the questions.", ""]
    lines += ["## stages (all questions)", "", "| setting | # | stage | in → out | s/query | AR of output |",
              "|---|---:|---|---|---:|---:|"]
    for r in stages.to_pylist():
        if r["subset"] != "all":
            continue
        lines.append(f"| {r['setting']} | {r['stage_index']} | {r['stage']} | {r['n_in']:,} → {r['n_out']:,}{r['unit']} | "
                     f"{r['seconds_per_query']:.4f} | {_f(r['answer_recall'], 3, True)} |")
    return "\n".join(lines) + "\n"


def plot_answer_recall(results: pa.Table, out_png: Path) -> Path:
    """AR@1..4 per setting, one panel per subset, saved as a PNG (no timestamp metadata)."""
    import matplotlib  # noqa: PLC0415  (heavy: matplotlib, only when a plot is drawn)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (heavy: matplotlib, only when a plot is drawn)

    rows = results.to_pylist()
    fig, axes = plt.subplots(1, len(SUBSETS), figsize=(12, 4.5), sharey=True)
    for ax, subset in zip(axes, SUBSETS):
        for r in (r for r in rows if r["subset"] == subset):
            ax.plot(KS, [100 * r[f"ar_{k}"] for k in KS], marker="o",
                    linestyle="-" if r["path"] == "progressive" else "--", label=r["setting"])
        n = next((r["n_questions"] for r in rows if r["subset"] == subset), 0)
        ax.set_title(f"{subset} ({n} questions)")
        ax.set_xlabel("k (passages)")
        ax.set_xticks(KS)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("answer recall AR@k (%)")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return out_png
