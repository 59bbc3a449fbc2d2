"""The Prefect artifact of a flow run that trains or evaluates: its figures as markdown tables,
with the MLflow run that holds them (a link where MLflow is a server, see
:func:`funnelrag.tracking.run_link`)."""
from __future__ import annotations

from typing import Any, Mapping

from prefect.artifacts import create_markdown_artifact

from funnelrag.display import format_value
from funnelrag.tracking import run_link

MAX_DEPTH = 3
"""Nesting levels of a summary flattened into the figures table (``a.b.c``); deeper ones are left out."""


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _flatten(prefix: str, value: Any, depth: int, rows: list[tuple[str, Any]],
             tables: list[tuple[str, list[Mapping[str, Any]]]]) -> None:
    if _scalar(value):
        rows.append((prefix, value))
    elif isinstance(value, Mapping) and depth < MAX_DEPTH:
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), sub, depth + 1, rows, tables)
    elif (isinstance(value, list) and value and all(isinstance(r, Mapping) for r in value)
          and all(_scalar(v) for r in value for v in r.values())):
        tables.append((prefix, value))


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def summary_markdown(title: str, mlflow_run: str, summary: Mapping[str, Any]) -> str:
    """Markdown of a flow's summary: a ``figure | value`` table of its scalar values (nested
    mappings flattened to dotted names, up to :data:`MAX_DEPTH` levels, in the summary's order),
    then one table per list of flat records (e.g. ranking rows), its columns those of the first
    record. Other values (lists of scalars, deeper nesting) are left out; the MLflow run holds
    everything.

    Parameters
    ----------
    title : the heading (the flow and what it ran on).
    mlflow_run : markdown naming the MLflow run (:func:`funnelrag.tracking.run_link`).
    summary : the flow's returned summary.
    """
    rows: list[tuple[str, Any]] = []
    tables: list[tuple[str, list[Mapping[str, Any]]]] = []
    _flatten("", summary, 0, rows, tables)
    lines = [f"# {title}", "", f"- MLflow run: {mlflow_run}", ""]
    if rows:
        lines += ["| figure | value |", "|---|---:|"]
        lines += [f"| {_escape(name)} | {_escape(format_value(value))} |" for name, value in rows]
    for name, records in tables:
        cols = list(records[0])
        lines += ["", f"**{_escape(name)}**", "", "| " + " | ".join(map(_escape, cols)) + " |",
                  "|" + "---:|" * len(cols)]
        lines += ["| " + " | ".join(_escape(format_value(r.get(c))) for c in cols) + " |" for r in records]
    return "\n".join(lines) + "\n"


def summary_artifact(key: str, title: str, run: Any, tracking_uri: str | None, summary: Mapping[str, Any],
                     description: str) -> None:
    """Create the flow run's markdown artifact :func:`summary_markdown` (Prefect's key: lower
    case, ``-`` for ``_``)."""
    create_markdown_artifact(key=key.lower().replace("_", "-"), description=description,
                             markdown=summary_markdown(title, run_link(run, tracking_uri), summary))
