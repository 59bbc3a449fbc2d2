"""Prefect flow ``corpus-build-nightly``: ``corpus-build`` with its stages' shards on the runner
named in the config (``runner.kind: local`` processes on this box, or ``dask``: a Dask cluster,
:mod:`flows.runners`). The entrypoint of the nightly full-dump deployments in ``prefect.yaml``.

With ``source.mirror`` (a Wikimedia dumps site such as https://dumps.wikimedia.org, or a local
directory in its layout) the flow follows Wikipedia by itself (:mod:`tasks.sources.nightly`): a new
finished full dump → a full build on it; otherwise new finished adds-changes days → an incremental
build (the base dump with every day since it applied; unchanged shards reused); otherwise a
completed run that says there is nothing to do. Downloads resume and are checked against the
published checksums before any stage runs, so a failed download or check never moves ``current``;
the quality gate stays in front of ``current`` as in every build. Without a mirror it builds
``source.paths`` as before.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE as NO_CACHE

from flows.corpus_build import PIECE_CACHE, CorpusBuildConfig, corpus_build_flow
from flows.run_report import build_message, completed, name_run, nightly_message, run_name
from funnelrag.config import FlowCommand, redact_url, resolve_flow_config
from funnelrag.inputs import check_inputs
from funnelrag.locks import exclusive_lock
from funnelrag.workspace import Workspace
from tasks.sources import nightly as N
from tasks.sources.dump_source import Mirror, mirror_auth, prune_downloads
from tasks.corpus.published import corpus_store

# One download / merge per home at a time: this file in the dumps directory holds the flock.
FETCH_LOCK = ".fetch.lock"


def dumps_dir(ws: Workspace) -> Path:
    """Where mirror files are downloaded and merged dumps written: ``<home>/downloads/dumps``."""
    return ws.downloads_dir / "dumps"


@task(name="nightly-plan", cache_policy=NO_CACHE)
def plan_task(config: CorpusBuildConfig, ws: Workspace, unusable: dict[str, str] | None = None) -> N.NightPlan:
    """Tonight's action from the mirror and the current version's inputs; ``unusable``: full dumps
    whose files failed tonight, passed over."""
    store = corpus_store(ws, config.name)
    current = store.current_version()
    manifest = store.read_manifest(current) if current else None
    previous = N.last_build(manifest, N.read_state(store.root), current)
    with Mirror(config.source.mirror, auth=mirror_auth(os.environ)) as mirror:
        return N.plan_night(mirror, config.source.wiki, previous, unusable)


@task(name="nightly-fetch", cache_policy=NO_CACHE)
def fetch_task(config: CorpusBuildConfig, ws: Workspace, plan: N.NightPlan) -> tuple[Path, dict[str, Any]]:
    """Download and verify tonight's files; for an incremental night, the days' revisions the ingest
    applies to the base dump (the base's index summary kept in the ingest's piece cache, where the
    build reads it again; none with ``cache.read: false`` or ``cache.verify``)."""
    read = config.cache.read and not config.cache.verify
    with exclusive_lock(dumps_dir(ws) / FETCH_LOCK, f"dump download into {dumps_dir(ws)}"), \
            Mirror(config.source.mirror, auth=mirror_auth(os.environ)) as mirror:
        return N.prepare_input(mirror, plan, dumps_dir(ws), read_cache=read,
                               index_cache=ws.cache_dir / "corpus" / PIECE_CACHE if read else None)


def nightly_markdown(name: str, plan: N.NightPlan, summary: dict[str, Any] | None) -> str:
    """The run's Prefect artifact when the build was skipped or as a header of what ran."""
    lines = [f"# corpus-build-nightly `{name}`: {plan.action}", "", f"- {plan.reason}",
             f"- mirror: `{plan.mirror}`, wiki `{plan.wiki}`, base full dump `{plan.base.date if plan.base else None}`"]
    if plan.days:
        lines.append(f"- adds-changes days applied: {', '.join(plan.days)}; {N.MOVES_NOTE}")
    if plan.scan.missing:
        lines.append(f"- missing days (skipped): {', '.join(plan.scan.missing)}")
    if plan.scan.waiting:
        lines.append(f"- waiting days (not done yet): {', '.join(plan.scan.waiting)}")
    for date, why in sorted(plan.unusable.items()):
        lines.append(f"- full dump {date} passed over (files missing or failing their checksum): {why}")
    if summary is not None:
        lines.append(f"- version `{summary['version']}`" + (" (unchanged)" if summary.get("unchanged") else ""))
        lines += ["", "| shards | built | reused |", "|---|---:|---:|"]
        lines += [f"| {k} | {v['built']:,} | {v['reused']:,} |" for k, v in summary.get("shards", {}).items()]
        lines += ["", "| texts (per-document memo) | tokenized | reused |", "|---|---:|---:|"]
        lines += [f"| {k} | {v['built']:,} | {v['reused']:,} |" for k, v in summary.get("reused_texts", {}).items()]
        if summary.get("retention"):
            kept = summary["retention"]
            cache = kept.get("cache", {})
            lines += ["", f"- retention: {len(kept.get('versions_removed', []))} old versions removed, "
                          f"{cache.get('entries', 0):,} cache entries unused for the configured age removed "
                          f"({cache.get('bytes_freed', 0) / 1e9:.2f} GB freed)"]
    return "\n".join(lines) + "\n"


@flow(name="corpus-build-nightly", log_prints=True)
def corpus_build_nightly(config: CorpusBuildConfig | None = None, config_file: str | None = None,
                         overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Resolve the config as ``corpus-build`` does (file + key-by-key overrides + home), then run
    ``corpus-build`` as a subflow, its shards on ``config.runner``: on ``source.paths``, or
    with ``source.mirror`` on tonight's input (module docstring). Returns the build's summary with
    a ``nightly`` entry (action, reason, base dump, days applied, missing and waiting days, what
    the fetch did), or, with nothing to do, ``{"corpus", "nightly", "version"}`` only.

    Raises
    ------
    tasks.sources.dump_source.DumpSourceError
        No usable dump, a day or dump file missing, a checksum mismatch (``ChecksumMismatch``,
        naming the file); ``current`` is left as it is.
    """
    config = resolve_flow_config(CorpusBuildConfig, config, config_file, overrides, home)
    check_inputs(config)
    if not config.source.mirror:
        name_run(run_name("nightly", config.name, "paths"))
        summary = corpus_build_flow(config)
        return completed(build_message(summary), summary)
    logger = get_run_logger()
    ws = Workspace(config.workspace.home)
    t0 = time.perf_counter()
    plan, dump_path, fetched = N.plan_and_fetch(lambda unusable: plan_task(config, ws, unusable),
                                                lambda night: fetch_task(config, ws, night))
    logger.info("nightly %s: %s (%s)", config.name, plan.action, plan.reason)
    name_run(run_name("nightly", config.name, plan.action))
    store = corpus_store(ws, config.name)
    key = f"corpus-build-nightly-{config.name}".lower().replace("_", "-")
    if plan.action == N.NOTHING:
        create_markdown_artifact(key=key, markdown=redact_url(nightly_markdown(config.name, plan, None)),
                                 description="corpus-build-nightly: nothing new")
        return completed(nightly_message(plan.action, plan.reason, plan.days, None),
                         {"corpus": config.name, "version": store.current_version(), "nightly": plan.as_dict(),
                          "total_seconds": time.perf_counter() - t0})
    dump = {**plan.dump_entry(), "stale_revisions_before_ingest": int(fetched.get("stale_revisions", 0))}
    source = config.source.model_copy(update={"paths": [dump_path], "datasets": [], "dump": dump,
                                              "changes": fetched.get("changes_file")})
    summary = corpus_build_flow(config.model_copy(update={"source": source}))
    summary["nightly"] = {**plan.as_dict(), "fetch": fetched, "seconds": time.perf_counter() - t0}
    if summary.get("unchanged"):   # nothing published: the state file says current holds tonight's inputs
        N.write_state(store.root, summary["version"], plan.dump_entry())
    prune_downloads(dumps_dir(ws), config.source.wiki, config.source.keep_dumps,
                    in_use=[plan.base.date] if plan.base else [])
    create_markdown_artifact(key=key, markdown=redact_url(nightly_markdown(config.name, plan, summary)),
                             description=f"corpus-build-nightly: {plan.action}")
    return completed(nightly_message(plan.action, plan.reason, plan.days, summary), summary)


COMMANDS = [
    FlowCommand("nightly", "follow a Wikimedia dumps mirror (source.mirror): a new full dump → a full build, new "
                "adds-changes days → an incremental build, else nothing (without a mirror: build-corpus on source.paths)",
                CorpusBuildConfig, corpus_build_nightly),
]
