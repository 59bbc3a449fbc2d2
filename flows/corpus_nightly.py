"""Prefect flow ``corpus-build-nightly``: ``corpus-build`` with its per-shard tasks on the runner
named in the config (``runner.kind: local`` processes on this box, or ``dask``: a Dask cluster
through prefect-dask). The entrypoint of the nightly full-dump deployments in ``prefect.yaml``.
"""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from flows.runners import build_task_runner
from funnelrag.config import resolve_flow_config
from funnelrag.inputs import check_inputs


@flow(name="corpus-build-nightly", log_prints=True)
def corpus_build_nightly(config: CorpusBuildConfig | None = None, config_file: str | None = None,
                         overrides: list[str] | None = None, home: str | None = None) -> dict[str, Any]:
    """Resolve the config as ``corpus-build`` does (file + key-by-key overrides + home), then run
    ``corpus-build`` as a subflow whose task runner is ``config.runner``'s."""
    config = resolve_flow_config(CorpusBuildConfig, config, config_file, overrides, home)
    check_inputs(config)
    return corpus_build_flow.with_options(task_runner=build_task_runner(config.runner))(config)
