"""``funnelrag compare RUN_OR_MODEL ...``: MLflow runs or model versions side by side; two paired on their questions.

Two references are paired question by question with the 95% interval of each difference.

A reference is an MLflow run id, or a registered model version ``models:/<name>/<version>`` /
``models:/<name>@<alias>`` (shown through the run that logged it, plus the version's
``metric.*`` tags written by :func:`funnelrag.registry.register_model` and the metrics later runs
attached to its logged model, e.g. an ``evaluate`` run's figures).

With two references whose runs logged per-question results (the ``per_question`` artifact of
:func:`funnelrag.tracking.log_question_scores`: ``evaluate``, ``distill-preranker``,
``train-reader``), the first table pairs them on the same questions (matched by question text,
else by question id): each metric of both, the difference B − A, its 95% percentile-bootstrap
interval (:mod:`funnelrag.paired`), n, the direction of better, and the verdict — "no measurable
difference" when the interval holds 0. Different question sets are refused (``--unpaired``
prints the side-by-side table only). The second table has one row per param (``param.<key>``),
model-version alias list (``model.aliases``), tag-metric (``version.<key>``), logged-model metric
(``model.<key>``) and run metric (``metric.<key>``), one column per reference, and with two
references the difference and the direction of better; rows whose values differ are marked
``*``. Example::

    funnelrag compare models:/funnelrag-preranker/1 models:/funnelrag-preranker@champion
    funnelrag compare 3f2a... 9b1c... --metrics 'prog-*' --home eval-home
"""
from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence, TextIO

from funnelrag.datasets import default_home
from funnelrag.display import format_value
from funnelrag.paired import N_BOOTSTRAP, SEED, pair_by_question, paired_difference
from funnelrag.registry import is_registry_ref, logged_model_id, resolve_version
from funnelrag.tracking import configure, read_question_scores
from funnelrag.workspace import Workspace

METRIC_TAG = "metric."


NO_DIFFERENCE = "no measurable difference"
# Metric name parts that say which way is better (matched on the words of the name).
_HIGHER = ("ar", "recall", "em", "accuracy", "auc", "map", "mrr", "ndcg", "f1", "precision", "hit", "promoted")
_LOWER = ("seconds", "loss", "latency", "rss", "bytes", "error")   # also their plurals ("losses")


@dataclass
class Column:
    """One compared reference: its label, run id, the rows it contributes and its per-question
    results (``scores``: ``{metric: {question id: value}}``; ``questions``: their texts)."""

    ref: str
    label: str
    run_id: str
    values: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    questions: dict[str, str] = field(default_factory=dict)


def better_direction(metric: str) -> str:
    """``"↑"`` (higher is better: recall, EM, accuracy, ...), ``"↓"`` (seconds, loss, ...) or
    ``""`` (unknown) from the words of a metric name."""
    words = [w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w]
    if words and words[-1] in ("n", "questions"):        # a count of questions (``<metric>.n``): no direction
        return ""
    if any(w.startswith(_LOWER) for w in words):
        return "↓"
    if any(w in _HIGHER for w in words):
        return "↑"
    return ""


def resolve_column(client, ref: str) -> Column:
    """Fetch the params and metrics of a run id or ``models:/`` reference.

    Raises
    ------
    ValueError
        The reference names no run or model version (message names the reference).
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    values: dict[str, Any] = {}
    try:
        if is_registry_ref(ref):
            mv = resolve_version(ref)
            if not mv.run_id:
                raise ValueError(f"{ref}: model version {mv.name} v{mv.version} has no run")
            run_id, label = mv.run_id, f"{mv.name} v{mv.version}"
            values["model.aliases"] = ",".join(sorted(getattr(mv, "aliases", []) or [])) or "–"
            values.update({f"version.{k[len(METRIC_TAG):]}": _number(v) for k, v in mv.tags.items()
                           if k.startswith(METRIC_TAG)})
            values.update(_logged_model_metrics(client, mv))
        else:
            run_id = ref
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise ValueError(f"{ref}: not an MLflow run id or registered model version ({exc.message})") from exc
    label = label if is_registry_ref(ref) else (run.info.run_name or run_id[:12])
    values.update({f"param.{k}": v for k, v in run.data.params.items()})
    values.update({f"metric.{k}": v for k, v in run.data.metrics.items()})
    column = Column(ref, label, run.info.run_id, values)
    table = read_question_scores(run.info.run_id)
    if table is not None:
        for m, q, text, v in zip(table["metric"].to_pylist(), table["question_id"].to_pylist(),
                                 table["question"].to_pylist(), table["value"].to_pylist()):
            column.scores.setdefault(m, {})[q] = v
            column.questions[q] = text
    return column


def _logged_model_metrics(client, mv) -> dict[str, float]:
    """``model.<key>``: the metrics attached to a version's logged model (at registration and by
    later runs, e.g. an evaluation of that version); the latest value of each key."""
    model_id = logged_model_id(mv)
    if not model_id:
        return {}
    latest: dict[str, Any] = {}
    for m in client.get_logged_model(model_id).metrics or []:
        if m.key not in latest or (m.timestamp, m.step) >= (latest[m.key].timestamp, latest[m.key].step):
            latest[m.key] = m
    return {f"model.{k}": float(m.value) for k, m in latest.items()}


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _pair_keys(a: Column, b: Column) -> tuple[dict[str, str], dict[str, str]]:
    """Each column's ``{question id: pairing key}``: the question text when every question of
    both has a distinct non-empty text, else the question id."""
    def by_text(c: Column) -> bool:
        texts = list(c.questions.values())
        return bool(texts) and all(texts) and len(set(texts)) == len(texts)

    if by_text(a) and by_text(b):
        return dict(a.questions), dict(b.questions)
    return {q: q for q in a.questions}, {q: q for q in b.questions}


def paired_rows(a: Column, b: Column, metrics: Sequence[str] = (), n_boot: int = N_BOOTSTRAP,
                seed: int = SEED) -> list[list[str]]:
    """Rows ``[metric, better, A, B, B − A, 95% interval, n, verdict]`` (header first) for every
    per-question metric both columns logged (``metrics``: glob patterns; empty = all).

    Raises
    ------
    ValueError
        A metric's question sets differ between the two (names the metric and the counts).
    """
    key_a, key_b = _pair_keys(a, b)
    rows = [["metric (per question)", "better", a.label, b.label, "B − A", "95% interval", "n", "verdict"]]
    for m in sorted(set(a.scores) & set(b.scores)):
        if metrics and not any(fnmatch.fnmatch(m, p) for p in metrics):
            continue
        _, va, vb = pair_by_question({key_a[q]: v for q, v in a.scores[m].items()},
                                     {key_b[q]: v for q, v in b.scores[m].items()}, f"metric {m}")
        d = paired_difference(va, vb, n_boot, seed)
        better = better_direction(m)
        if d.holds_zero:
            verdict = NO_DIFFERENCE
        elif better:
            verdict = f"{b.label if (d.diff > 0) == (better == '↑') else a.label} better"
        else:
            verdict = f"{b.label} {'higher' if d.diff > 0 else 'lower'}"
        rows.append([m, better, format_value(d.mean_a), format_value(d.mean_b), f"{d.diff:+.4g}",
                     f"[{d.low:+.4g}, {d.high:+.4g}]", format_value(d.n), verdict])
    return rows


def compare_table(columns: Sequence[Column], metrics: Sequence[str] = (), params: bool = True,
                  only_diff: bool = False) -> list[list[str]]:
    """Rows ``[key, mark, value_1, ..., value_n]`` with a header row first; with exactly two
    columns also ``B − A`` (numbers only) and the direction of better (:func:`better_direction`).

    Parameters
    ----------
    columns : the resolved references.
    metrics : glob patterns (``fnmatch``) on metric / version / model keys without their prefix; empty = all.
    params : include ``param.*`` rows.
    only_diff : keep only rows whose values differ between references.
    """
    two = len(columns) == 2
    keys = sorted({k for c in columns for k in c.values})
    rows = [["key", "", *(f"{c.label} [{c.run_id[:8]}]" for c in columns), *(["B − A", "better"] if two else [])]]
    for key in keys:
        kind, _, name = key.partition(".")
        if kind == "param" and not params:
            continue
        if kind in ("metric", "version", "model") and metrics and not any(fnmatch.fnmatch(name, p) for p in metrics):
            continue
        vals = [c.values.get(key) for c in columns]
        differs = len({format_value(v) for v in vals}) > 1
        if only_diff and not differs:
            continue
        row = [key, "*" if differs else "", *(format_value(v) for v in vals)]
        if two:
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
            row += [f"{vals[1] - vals[0]:+.4g}" if numeric and differs else "",
                    better_direction(name) if kind != "param" else ""]
        rows.append(row)
    return rows


def format_rows(rows: list[list[str]], max_cell: int = 40) -> str:
    """Aligned text: first column left-aligned, value columns right-aligned.

    A value longer than ``max_cell`` characters (a whole config as JSON, a long list) is cut to
    its first ``max_cell - 1`` characters and ``…``, so a line stays readable on a terminal;
    ``max_cell=0`` prints every value whole.
    """
    if max_cell > 0:
        rows = [r[:2] + [c if len(c) <= max_cell else c[:max_cell - 1] + "…" for c in r[2:]] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])] + [c.rjust(w) for c, w in zip(r[2:], widths[2:])]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def compare_main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """CLI core of ``funnelrag compare``; returns the exit status (2 on a bad reference)."""
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="funnelrag compare", description=__doc__.split("\n")[0])
    p.add_argument("refs", nargs="+", metavar="RUN_OR_MODEL", help="run id, models:/name/version or models:/name@alias")
    p.add_argument("--home", default=None,
                   help="funnelrag home holding mlflow.db (default: $FUNNELRAG_HOME, else ./funnelrag-home)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///HOME/mlflow.db)")
    p.add_argument("--metrics", action="append", default=[], metavar="GLOB", help="only metrics matching (repeatable)")
    p.add_argument("--no-params", action="store_true", help="leave out the params")
    p.add_argument("--diff", action="store_true", help="only rows whose values differ")
    p.add_argument("--width", type=int, default=40, metavar="N",
                   help="cut values longer than N characters (default 40; 0 = print whole values)")
    p.add_argument("--unpaired", action="store_true",
                   help="leave out the paired per-question table (e.g. runs on different question sets)")
    p.add_argument("--n-bootstrap", type=int, default=N_BOOTSTRAP, metavar="N",
                   help=f"bootstrap resamples of the paired intervals (default {N_BOOTSTRAP:,})")
    args = p.parse_args(list(argv) if argv is not None else None)
    if len(args.refs) < 2:
        p.error("give at least two runs or model versions to compare")
    from mlflow import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    configure(Workspace(args.home or default_home()), args.tracking_uri)
    client = MlflowClient()
    try:
        columns = [resolve_column(client, ref) for ref in args.refs]
    except ValueError as exc:
        print(f"funnelrag compare: {exc}", file=sys.stderr)
        return 2
    if len(columns) == 2 and not args.unpaired:
        a, b = columns
        try:
            paired = paired_rows(a, b, args.metrics, args.n_bootstrap)
        except ValueError as exc:
            print(f"funnelrag compare: {a.label} and {b.label}: {exc} (--unpaired: the side-by-side table only)",
                  file=sys.stderr)
            return 2
        if len(paired) > 1:
            print(f"Paired on the same questions: A = {a.label}, B = {b.label}; B − A with its 95% percentile-bootstrap "
                  "interval over the questions", file=out)
            print(format_rows(paired, 0), "", sep="\n", file=out)
        else:
            print(f"No per-question results logged by both {a.label} and {b.label}: no paired intervals "
                  "(runs of evaluate, distill-preranker and train-reader log them).", "", sep="\n", file=out)
    print(format_rows(compare_table(columns, args.metrics, not args.no_params, args.diff), args.width), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(compare_main())
