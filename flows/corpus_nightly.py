"""Prefect flow ``corpus-build-nightly``: ``corpus-build`` with its per-shard tasks on the runner
named in the config (``runner.kind: local`` processes on this box, or ``dask``: a Dask cluster
through prefect-dask). The entrypoint of the nightly deployments in ``prefect.yaml``; the CLI's
``build-corpus`` goes the same way.
"""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from flows.runners import build_task_runner


@flow(name="corpus-build-nightly", log_prints=True)
def corpus_build_nightly(config: CorpusBuildConfig) -> dict[str, Any]:
    """Run ``corpus-build`` as a subflow whose task runner is ``config.runner``'s."""
    return corpus_build_flow.with_options(task_runner=build_task_runner(config.runner))(config)
