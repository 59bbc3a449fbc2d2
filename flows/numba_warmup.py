"""Compile the corpus build's numba kernels ahead of the build, on a core that would wait.

Every ``numba.njit(cache=True)`` kernel compiles once per checkout and type signature, then loads
from the ``__pycache__`` beside its module (``benchmarks/numba_compile.py`` lists them: ~14 CPU s
on a fresh checkout). A corpus build compiles them inside its stages while the other core of a
2-core box waits. :func:`warm_kernels` runs the public functions that call them (the title lookup,
the hyperlink graph's triangle pass, Algorithm 1, the BM25 score matrix and its top-k search
over a saved, memory-mapped index, as the gate and every later step search, the BM25 token
memo's vocabulary search, as every token shard makes it, and the BM25 shortlist's passage lookup,
as the evaluation's shortlist setting reads it) on a few tiny inputs, so their compiled code is on disk when the
build reaches them; the CLI runs it in a child process once the ephemeral Prefect API is up, beside
the build's first stage (:class:`funnelrag.cli.NumbaWarmup`). It writes nothing but numba's cache (the index it
saves goes to a temporary directory) and no output of any run depends on it: a kernel it did not
compile, or compiled with other argument types, compiles where the build calls it, as before.

Run: ``python -m flows.numba_warmup`` (exit 0 when every call returned).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

TEXTS = ("Charles Darwin wrote On the Origin of Species in 1859.",
         "The origin of the species is natural selection, wrote Darwin.",
         "Alfred Russel Wallace reached the same theory of evolution.")


def warm_kernels() -> float:
    """Call every corpus kernel's public caller on tiny inputs of the build's argument types.

    Returns
    -------
    float
        Wall seconds the calls took (compilations on a fresh checkout, cache loads after).
    """
    from tasks.corpus.clustering import ClusteringConfig, cluster_documents  # noqa: PLC0415  (heavy: numba kernels)
    from tasks.corpus.graph import build_graph, graph_metrics  # noqa: PLC0415  (heavy: numba kernels)
    from tasks.corpus.index import BM25Config, BM25Index, TokenIds, tokenize_ids  # noqa: PLC0415  (heavy: bm25s, numba)
    from tasks.corpus.sharded.token_memo import sorted_positions  # noqa: PLC0415  (heavy: numba kernel)
    from tasks.funnel.fusion import PassageBM25  # noqa: PLC0415  (heavy: numba kernels)
    from tasks.sources.ingest.lookup import TitleIndex  # noqa: PLC0415  (heavy: numba kernels)

    t0 = time.perf_counter()
    titles = pa.array(["Charles Darwin", "Alfred Russel Wallace", "Evolution"], pa.string())
    TitleIndex(titles).rows(pa.array(["Evolution", "Origin"], pa.string()))
    graph = build_graph(np.array([0, 1, 2, 0], np.int64), np.array([1, 2, 0, 2], np.int64), 3)
    cluster_documents(graph, graph_metrics(graph), np.array([40, 30, 20], np.int64), ClusteringConfig(max_tokens=64))
    sorted_positions(pa.array(["darwin", "evolution"], pa.string()), ["evolution", "wallace"])
    cfg = BM25Config()
    index = BM25Index.from_token_ids(TokenIds.from_tokenized(tokenize_ids(list(TEXTS), cfg)), ["a", "b", "c"], cfg)
    with tempfile.TemporaryDirectory(prefix="funnelrag-numba-warmup-") as tmp:
        loaded = BM25Index.load(index.save(Path(tmp) / "index"), mmap=True)
        loaded.search(["darwin evolution"], k=2)
        PassageBM25(loaded, ["a", "b", "c"]).scores("darwin evolution", np.array([2, 0], np.int64))
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"numba kernels warm in {warm_kernels():.1f} s", file=sys.stderr)
