"""CPU seconds of the corpus build's two tokenisations on a built home: the T5 window counts of each
token shard (:func:`tasks.corpus.sharded.shards.count_shard`, in this process) and the index
stage (:func:`tasks.corpus.stages.run_index` with a pool of 2 forkserver workers: the build
process's own CPU, the critical path the workers' shards do not count in, and the workers' CPU read
through ``psutil`` before the pool ends).

CPU seconds, not wall: on a shared box they are what a change moves. Run it on the checkout to
measure (``PYTHONPATH`` set to it), e.g. before and after a change, alternating.

Run: ``python benchmarks/bench_corpus_tokenize.py --home H [--docs-per-shard 2300]`` where ``H``
is a funnelrag home whose stage cache holds one corpus build's stages (``funnelrag demo --home H
--set 'steps=[corpus-wikispeedia]'``).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.corpus import stages as S  # noqa: E402
from tasks.corpus.index import BM25Config  # noqa: E402
from tasks.corpus.segment import SegmentConfig  # noqa: E402
from tasks.corpus.sharded.shards import count_shard, doc_shards  # noqa: E402


def stage_dir(home: Path, stage: str) -> Path:
    """The one cache entry of ``stage`` under ``home``'s corpus stage cache."""
    found = sorted((home / "cache" / "corpus" / stage).iterdir())
    if len(found) != 1:
        raise SystemExit(f"{home}: expected one {stage} entry in the stage cache, found {len(found)}")
    return found[0]


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--docs-per-shard", type=int, default=2300, help="documents a token shard (the demo's)")
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    args = parser.parse_args()
    ingest, cluster, segment = (stage_dir(args.home, s) for s in ("ingest", "cluster", "segment"))
    seg = SegmentConfig(passage_words=100, unit_max_tokens=1024, tokenizer="t5")
    n_docs = pq.read_metadata(ingest / "documents.parquet").num_rows
    result: dict[str, float] = {}
    for lo, hi in doc_shards(n_docs, args.docs_per_shard):
        c0 = cpu()
        count_shard(str(ingest), lo, hi, seg, str(args.mirror))
        result[f"window counts {lo}-{hi - 1} CPU s"] = round(cpu() - c0, 2)
    with tempfile.TemporaryDirectory(prefix="bench-corpus-tokenize-") as tmp:
        c0, w0 = cpu(), time.perf_counter()
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
            summary = S.run_index(ingest, cluster, segment, Path(tmp) / "index", BM25Config(), submit=pool.submit,
                                  window=6, work_dir=Path(tmp) / "work")
            # the pool's workers: children of the forkserver (the direct children are it and the resource tracker)
            workers = sum(p.cpu_times().user + p.cpu_times().system
                          for p in psutil.Process().children(recursive=True) if p.ppid() != os.getpid())
        result["index stage: build process CPU s"] = round(cpu() - c0, 2)
        result["index stage: workers CPU s"] = round(workers, 2)
        result["index stage: wall s"] = round(time.perf_counter() - w0, 1)
        result["index stage: token shards"] = summary.get("cluster_token_shards", 0) + summary.get("passage_token_shards", 0)
    result["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
