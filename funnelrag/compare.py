"""``funnelrag compare RUN_OR_MODEL ...``: MLflow runs or registered model versions side by side.

A reference is an MLflow run id, or a registered model version ``models:/<name>/<version>`` /
``models:/<name>@<alias>`` (shown through the run that logged it, plus the version's
``metric.*`` tags written by :func:`funnelrag.registry.register_model`). The table has one row
per param (``param.<key>``), model-version alias list (``model.aliases``), tag-metric
(``version.<key>``) and metric (``metric.<key>``) and
one column per reference; rows whose values differ are marked ``*``. Example::

    funnelrag compare models:/funnelrag-preranker@champion models:/funnelrag-preranker@challenger
    funnelrag compare 3f2a... 9b1c... --metrics 'prog-*' --home eval-home
"""
from __future__ import annotations

import argparse
import fnmatch
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence, TextIO

from funnelrag.datasets import default_home
from funnelrag.display import format_value
from funnelrag.tracking import configure
from funnelrag.workspace import Workspace
from funnelrag.registry import is_registry_ref, resolve_version

METRIC_TAG = "metric."


@dataclass
class Column:
    """One compared reference: its label, run id and the rows it contributes."""

    ref: str
    label: str
    run_id: str
    values: dict[str, Any] = field(default_factory=dict)


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
        else:
            run_id = ref
        run = client.get_run(run_id)
    except MlflowException as exc:
        raise ValueError(f"{ref}: not an MLflow run id or registered model version ({exc.message})") from exc
    label = label if is_registry_ref(ref) else (run.info.run_name or run_id[:12])
    values.update({f"param.{k}": v for k, v in run.data.params.items()})
    values.update({f"metric.{k}": v for k, v in run.data.metrics.items()})
    return Column(ref, label, run.info.run_id, values)


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def compare_table(columns: Sequence[Column], metrics: Sequence[str] = (), params: bool = True,
                  only_diff: bool = False) -> list[list[str]]:
    """Rows ``[key, mark, value_1, ..., value_n]`` with a header row first.

    Parameters
    ----------
    columns : the resolved references.
    metrics : glob patterns (``fnmatch``) on metric / version keys without their prefix; empty = all.
    params : include ``param.*`` rows.
    only_diff : keep only rows whose values differ between references.
    """
    keys = sorted({k for c in columns for k in c.values})
    rows = [["key", "", *(f"{c.label} [{c.run_id[:8]}]" for c in columns)]]
    for key in keys:
        kind, _, name = key.partition(".")
        if kind == "param" and not params:
            continue
        if kind in ("metric", "version") and metrics and not any(fnmatch.fnmatch(name, p) for p in metrics):
            continue
        vals = [c.values.get(key) for c in columns]
        differs = len({format_value(v) for v in vals}) > 1
        if only_diff and not differs:
            continue
        rows.append([key, "*" if differs else "", *(format_value(v) for v in vals)])
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
    print(format_rows(compare_table(columns, args.metrics, not args.no_params, args.diff), args.width), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(compare_main())
