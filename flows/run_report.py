"""What a flow run says about itself in Prefect: a descriptive run name and a final state message.

Prefect names a flow run at random (``ginger-lobster``) and ends it with a bare ``Completed``; a
user scanning ``prefect flow-run ls`` or the UI then has to open every run's artifact to see what
it did. Each flow of this project renames its run once its configuration is resolved
(:func:`name_run`: ``nightly-enwiki-incremental-20260103``) and returns its summary inside a
``Completed`` state whose message says what it did (:func:`completed`: ``incremental: 2 days,
18 documents re-tokenised, 558 reused``). The messages are built from the run's own summary by the
functions below, so they are tested without Prefect.

A flow that returns a ``Completed`` state still hands its caller (the CLI, a parent flow) the
summary itself: Prefect unwraps the state's data.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any, Mapping

from funnelrag.config import redact_url

log = logging.getLogger(__name__)

MAX_NAME = 80
"""Longest run name we set (Prefect accepts longer; the UI's list shows about this much)."""


def run_name(*parts: Any, day: dt.date | None = None) -> str:
    """A flow run's descriptive name: the non-empty ``parts``, then today's UTC date, joined by ``-``.

    Parameters
    ----------
    parts : words of the name (flow, corpus, action, ...); ``None`` and ``""`` are left out, and
        every character outside ``[A-Za-z0-9.]`` becomes ``-``, lower case.
    day : the date appended as ``YYYYMMDD`` (default: today, UTC).

    Returns
    -------
    str, at most :data:`MAX_NAME` characters, e.g. ``nightly-enwiki-incremental-20260103``.
    """
    day = day or dt.datetime.now(dt.timezone.utc).date()
    words = [re.sub(r"[^a-z0-9.]+", "-", str(p).lower()).strip("-") for p in parts if p not in (None, "")]
    name = "-".join([w for w in words if w] + [day.strftime("%Y%m%d")])
    return name[-MAX_NAME:].lstrip("-") if len(name) > MAX_NAME else name


def name_run(name: str) -> None:
    """Rename the flow run this code runs in to ``name`` (nothing outside a flow run).

    A failure to reach the API is logged at WARNING and otherwise ignored: a run's name is never
    worth failing the run.
    """
    from prefect.runtime import flow_run  # noqa: PLC0415  (heavy: prefect, only inside a flow run)

    run_id = flow_run.get_id()
    if not run_id:
        return
    from prefect.client.orchestration import get_client  # noqa: PLC0415  (heavy: prefect's client)

    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(run_id, name=name)
    except Exception as exc:  # noqa: BLE001  (the name is cosmetic; the run goes on)
        log.warning("could not rename flow run %s to %r: %s", run_id, name, exc)


def completed(message: str, data: Any) -> Any:
    """The final state of a flow run that did its work: ``Completed(message=message, data=data)``.

    The caller of the flow (CLI or parent flow) receives ``data``; the message is what
    ``prefect flow-run ls`` and the UI show beside the state (a URL's credentials redacted,
    :func:`funnelrag.config.redact_url`).
    """
    from prefect.states import Completed  # noqa: PLC0415  (heavy: prefect)

    return Completed(message=redact_url(message), data=data)


def _n(value: Any) -> str:
    return f"{int(value):,}"


def rebuilt_words(summary: Mapping[str, Any]) -> str:
    """How much of a corpus build was done again vs reused, from its summary's per-text report
    (``reused_texts``) or, without one, its per-shard report (``shards``).

    Returns ``"18 documents re-tokenised, 558 reused"``, ``"3 token shards built, 41 reused"`` or
    ``""`` when the summary has neither.
    """
    texts = summary.get("reused_texts") or {}
    for key, noun in (("window_token_documents", "documents re-tokenised"),
                      ("ingest_cleaned_pages", "pages cleaned"), ("passage_index_passages", "passages indexed")):
        if key in texts:
            return f"{_n(texts[key]['built'])} {noun}, {_n(texts[key]['reused'])} reused"
    shards = summary.get("shards") or {}
    if "token_shards" in shards:
        return f"{_n(shards['token_shards']['built'])} token shards built, {_n(shards['token_shards']['reused'])} reused"
    return ""


def build_message(summary: Mapping[str, Any]) -> str:
    """State message of a ``corpus-build`` run from its summary (:func:`flows.corpus_build.corpus_build_flow`).

    ``unchanged: current version <v> already holds these inputs``, ``verify: ...`` (``--verify``:
    the comparison with ``current``, nothing published), or ``published <v>: 4,598
    documents, 912 clusters, 146,402 passages; 18 documents re-tokenised, 558 reused``, or, when the
    quality gate refused the version, ``gate refused <v>: <reasons>``.
    """
    if "verify" in summary:   # --verify: a build without the cache compared with current, nothing published
        check = summary["verify"]
        if check.get("same"):
            return f"verify: a build without the cache equals current {check.get('current')}"
        return f"verify: current {check.get('current')} differs from a build without the cache: {check.get('first_difference')}"
    version = summary["version"]
    if summary.get("unchanged"):
        return f"unchanged: current version {version} already holds these inputs"
    gate = summary.get("gate")
    if gate is not None and not gate.get("passed", True):
        return f"gate refused {version}: " + "; ".join(gate.get("reasons", [])) + " (current did not move)"
    counts = summary.get("counts", {})
    head = (f"published {version}: {_n(counts.get('documents', 0))} documents, {_n(counts.get('clusters', 0))} "
            f"clusters, {_n(counts.get('passages', 0))} passages")
    work = rebuilt_words(summary)
    return f"{head}; {work}" if work else head


def nightly_message(action: str, reason: str, days: list[str], summary: Mapping[str, Any] | None) -> str:
    """State message of a ``corpus-build-nightly`` run.

    Parameters
    ----------
    action : ``full`` | ``incremental`` | ``nothing`` (:class:`tasks.sources.nightly.NightPlan`).
    reason : the plan's reason (shown for ``nothing``).
    days : the adds-changes days applied (``incremental``).
    summary : the build's summary (None when nothing was built).

    Returns
    -------
    ``nothing new: <why>`` (the plan's reason), ``full: published <v>: ...`` or ``incremental: 2 days, 18 documents
    re-tokenised, 558 reused; published <v>: ...``.
    """
    if summary is None:   # the plan's reason already says "nothing new: ..." where it says why
        return reason if reason.startswith("nothing") else f"nothing: {reason}"
    built = build_message(summary)
    if action == "incremental":
        work = rebuilt_words(summary)
        head = f"incremental: {len(days)} day{'s' if len(days) != 1 else ''}" + (f", {work}" if work else "")
        return f"{head}; {built.split('; ')[0]}"
    return f"{action}: {built}"


def embed_message(info: Mapping[str, Any]) -> str:
    """State message of an ``embed-corpus`` run from :func:`tasks.funnel.embeddings.ensure_embedding_index`'s
    info: ``embedded 1,204 passages, reused 145,198 (model 3f2a9c1b); 61.3 s`` or, for a
    published index found, ``index already published for model 3f2a9c1b: 146,402 passages``."""
    model = str(info.get("model_version", ""))[:8]
    passages = int(info.get("passages", 0))
    if info.get("cache_hit"):
        return f"index already published for model {model}: {_n(passages)} passages, nothing embedded"
    embedded = int(info.get("embedded", passages))
    reused = int(info.get("reused", passages - embedded))
    return (f"embedded {_n(embedded)} passages, reused {_n(reused)} (model {model}); "
            f"{float(info.get('seconds', 0.0)):.1f} s")


def embed_markdown(corpus: str, corpus_version: str, preranker: str, info: Mapping[str, Any],
                   mlflow_run: str) -> str:
    """The ``embed-corpus`` run's Prefect artifact: passages embedded and reused, the model
    version, seconds and rate, and the MLflow run (a link where MLflow is a server)."""
    passages = int(info.get("passages", 0))
    embedded = 0 if info.get("cache_hit") else int(info.get("embedded", passages))
    reused = passages - embedded if info.get("cache_hit") else int(info.get("reused", passages - embedded))
    rows = [("passages in the corpus version", _n(passages)), ("embedded now", _n(embedded)),
            ("reused (embedded before)", _n(reused)), ("model version", f"`{info.get('model_version', '')}`"),
            ("seconds", f"{float(info.get('seconds', 0.0)):.1f}"),
            ("passages per second", f"{float(info.get('passages_per_s', 0.0)):.1f}")]
    lines = [f"# embed-corpus `{corpus}` version `{corpus_version}` with `{preranker}`", "",
             f"- {embed_message(info)}", f"- MLflow run: {mlflow_run}", "", "| figure | value |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"
