"""The modules a local pool's worker process runs shards with, imported once per build process.

:class:`flows.runners.LocalShardPool` forks its workers from a ``forkserver`` process that
imports this module first (``multiprocessing``'s preload), so each worker starts with the corpus
stages, pyarrow's dataset layer and bm25s already loaded. Spawned from scratch, each worker
imported them itself: ~2.9 CPU s a worker (measured on the 2-core build box), paid by every
worker of every stage. A worker runs plain Python (:func:`flows.runners.run_shard`): no Prefect
is imported here. Importing this module has no side effect beyond imports.
"""
from __future__ import annotations

import bm25s  # noqa: F401  (the passage index's shards; the stages import it where they use it)
import pyarrow.dataset  # noqa: F401  (pq.read_table imports it on first use)

import flows.runners  # noqa: F401  (run_shard, init_worker: what the pool runs in each worker)
import tasks.corpus.stages  # noqa: F401  (every corpus stage module a shard calls into)
import tasks.corpus.sharded.shards  # noqa: F401
import tasks.sources.ingest.parallel  # noqa: F401
