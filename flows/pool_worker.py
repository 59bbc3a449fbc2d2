"""The modules a local pool's worker process runs shard tasks with, imported once per pool.

:class:`flows.runners.SharedAPIProcessPoolTaskRunner` starts its workers from a ``forkserver``
process that imports this module first (``multiprocessing``'s preload), so each worker forks with
Prefect's task engine, the corpus stages and Prefect's collections already loaded. Spawned from
scratch, each worker imported them itself: ~2.9 CPU s a worker (measured on the 2-core build box,
``python -c "import prefect, flows.corpus_build, ..."``), paid by every worker of every build, 16
times a night on a 16-core box. Importing this module has one side effect beyond imports: Prefect's
collections (its ``prefect.collections`` entry points, e.g. ``prefect_dask``), which a worker
otherwise loads when it first rebuilds its flow run's context.
"""
from __future__ import annotations

import bm25s  # noqa: F401  (the passage index's shards; the stages import it where they use it)
import pyarrow.dataset  # noqa: F401  (pq.read_table imports it on first use)
import prefect.engine  # noqa: F401
import prefect.task_engine  # noqa: F401  (what Prefect's process pool runs each task with)
from prefect.plugins import load_prefect_collections

import flows.corpus_build  # noqa: F401  (every corpus stage module a shard task calls into)

load_prefect_collections()
