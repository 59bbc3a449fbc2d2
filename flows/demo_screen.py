"""The one screen ``funnelrag demo`` ends on: what was built, what was registered, the figures
with 95% bootstrap intervals (or a smoke-run mark), and where to look next.

The full summary of every step stays in ``<home>/demo-summary.json`` (``funnelrag demo --verbose``
prints it). AR@k and EM are means of per-question 0/1 values, so their percentile bootstrap over
the questions depends only on the mean and the number of questions: the interval is computed from
those (:func:`binary_interval`, the resampling of :mod:`tasks.funnel.experiment_eval`).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

from funnelrag.paired import bootstrap_indices, interval

log = logging.getLogger(__name__)

SUMMARY_FILE = "demo-summary.json"
SMOKE_QUESTIONS = 100      # fewer held-out questions: a smoke run, not a measurement
N_BOOTSTRAP, BOOTSTRAP_SEED = 1000, 0
MAX_TABLE_ROWS = 8


def binary_interval(mean: float, n: int) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the 95% percentile-bootstrap interval of a mean of ``n`` 0/1 values."""
    if not n or mean is None or isinstance(mean, str):
        return None
    values = np.zeros(n)
    values[:int(round(float(mean) * n))] = 1.0                         # (n,) the same mean
    return interval(values, bootstrap_indices(n, N_BOOTSTRAP, BOOTSTRAP_SEED))


def _ci(mean: Any, n: int) -> str:
    ci = binary_interval(mean, n)
    if ci is None:
        return "–"
    m, lo, hi = (100 * v for v in ci)
    return f"{m:.0f} [{lo:.0f}, {hi:.0f}]"


def _registered(tracking_uri: str) -> list[str]:
    """``name vN (champion vM)`` of every registered model in the demo's MLflow."""
    try:
        from mlflow import MlflowClient  # noqa: PLC0415  (heavy: mlflow; inside the try: the screen must not fail)

        client = MlflowClient(tracking_uri=tracking_uri)
        lines = []
        for model in sorted(client.search_registered_models(), key=lambda m: m.name):
            versions = [int(v.version) for v in client.search_model_versions(f"name='{model.name}'")]
            champion = (model.aliases or {}).get("champion")
            lines.append(f"  {model.name:<26} v{max(versions, default=0):<3} "
                         f"{'champion v' + str(champion) if champion else 'no champion (gate: worse)'}")
        return lines or ["  none"]
    except Exception as exc:  # noqa: BLE001  (the screen must not fail after a finished run)
        log.debug("registry listing failed: %s", exc)
        return [f"  (could not list the registry: {exc})"]


def _prefect_db() -> str:
    try:
        from prefect.settings import get_current_settings  # noqa: PLC0415  (heavy: prefect; inside the try: the screen must not fail)

        settings = get_current_settings()
        url = settings.server.database.connection_url
        url = url.get_secret_value() if hasattr(url, "get_secret_value") else url
        return str(url or f"{settings.home}/prefect.db").replace("sqlite+aiosqlite:///", "")
    except Exception:  # noqa: BLE001
        return "$PREFECT_HOME/prefect.db"


def _reader_line(cfg: Any, step_command: Callable[[Any, str], tuple]) -> str:
    try:
        step_cfg = step_command(cfg, "distillation")[1]
        reader = step_cfg.reader
        fid, train = reader.fid, reader.train
        steps = f"{train.max_steps} steps" if train.max_steps else f"{train.epochs} epochs"
        steps += f" on {step_cfg.n_train} questions"
        if reader.kind == "t5" and fid.base == "scratch":
            what = (f"a tiny T5 trained from scratch (d_model {fid.d_model}, {fid.n_layers} layers, no pretrained "
                    f"weights offline) for {steps}")
        else:
            what = f"a {reader.kind} reader from {getattr(fid, 'base', '?')} trained for {steps}"
    except Exception:  # noqa: BLE001
        what = "a tiny T5 trained from scratch for a few steps"
    return (f"  The FiD reader is {what}:\n"
            "  EM 0 is expected; it is there to exercise Eq. 3 attention scoring and the pipeline, not to answer.")


def demo_screen(out: dict[str, Any], cfg: Any, step_command: Callable[[Any, str], tuple], full_summary: Path) -> str:
    """At most ~40 lines for the end of ``funnelrag demo`` (see the module docstring)."""
    home = Path(cfg.workspace.home).resolve()
    total = sum(float(s.get("step_seconds", 0.0)) for s in out.values() if isinstance(s, dict))
    lines = [f"funnelrag demo: {len(out)} steps in {total / 60:.1f} min; home {home}", "",
             "Built and published:"]
    for step, s in out.items():
        if isinstance(s, dict) and "counts" in s and "corpus" in s:
            c = s["counts"]
            lines.append(f"  corpus {s['corpus']:<14} version {s['version']}: {c.get('documents', 0):,} documents, "
                         f"{c.get('clusters', 0):,} clusters, {c.get('passages', 0):,} passages")
    tracking_uri = cfg.workspace.tracking_uri or f"sqlite:///{home / 'mlflow.db'}"
    lines += ["Registered models (MLflow registry):", *_registered(tracking_uri)]

    figures: list[str] = []
    sizes: list[int] = []
    dist = out.get("distillation")
    if isinstance(dist, dict):
        n = int(dist.get("distill_preranker", {}).get("evaluate", {}).get("questions", 0) or 0)
        sizes.append(n)
        figures.append(f"  pre-ranker answer recall before -> after distillation ({n} dev questions, %):")
        for r in dist.get("answer_recall", []):
            figures.append(f"    AR@{r['k']}  {_ci(r['before'], n):<16} -> {_ci(r['after'], n)}")
        r_eval = dist.get("train_reader", {}).get("reader_eval", {})
        if r_eval:
            sizes.append(int(r_eval.get("questions", 0)))
            figures.append(f"  FiD reader exact match ({r_eval.get('questions', 0)} dev questions, %): "
                           f"{_ci(r_eval.get('em'), int(r_eval.get('questions', 0)))}")
    ev = out.get("evaluate")
    if isinstance(ev, dict) and ev.get("table"):
        n = int(ev.get("questions", 0))
        sizes.append(n)
        figures.append(f"  evaluate, {n} NQ-open questions on {ev.get('corpus')} (%):")
        figures.append(f"    {'setting':<34} {'AR@1':<15} {'AR@4':<15} EM")
        for r in ev["table"][:MAX_TABLE_ROWS]:
            figures.append(f"    {r['setting'][:34]:<34} {_ci(r.get('AR@1'), n):<15} {_ci(r.get('AR@4'), n):<15} "
                           f"{_ci(r.get('EM'), n)}")
        if len(ev["table"]) > MAX_TABLE_ROWS:
            figures.append(f"    ... {len(ev['table']) - MAX_TABLE_ROWS} more settings in the full summary")
    for step in ("dr-rag", "r2ag"):
        if isinstance(out.get(step), dict):
            figures.append(f"  {step}: tables in the full summary")
    if figures:
        lines += ["", "Figures (95% bootstrap intervals over the questions):"]
        if sizes and min(sizes) < SMOKE_QUESTIONS:
            lines.append(f"  SMOKE RUN at demo size: {min(sizes)}-{max(sizes)} questions; differences below are noise "
                         "(overlapping intervals).")
        lines += figures
        if isinstance(dist, dict):
            lines.append(_reader_line(cfg, step_command))

    lines += ["", "Where to look:",
              "  MLflow runs and models : " + (f"mlflow ui --backend-store-uri {tracking_uri}"
                                                if tracking_uri.startswith("sqlite:") else tracking_uri),
              f"  Prefect flow runs, logs: prefect server start   (then http://127.0.0.1:4200; database {_prefect_db()})",
              f"  full summary           : {full_summary}   (or: funnelrag demo --verbose)",
              "  step seconds           : " + ", ".join(f"{k} {float(v.get('step_seconds', 0)):.0f}"
                                                      for k, v in out.items() if isinstance(v, dict))]
    return "\n".join(lines)
