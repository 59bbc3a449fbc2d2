"""The BM25 cluster index built in one process (all cluster texts, ``BM25Index.build``) against its
tokenization in cluster-range shards (``build_cluster_index``, 1 and 2 worker processes): seconds,
CPU seconds and peak RSS of the building process (each variant a fresh process), and whether the
saved files are byte-identical. Also the building process's RSS before the build (imports; the
peak's base) and the index's size: cluster tokens, (cluster, term) pairs and vocabulary, the units
of the bytes-per-unit memory figures.

Input: the stage directories of a build (``ingest/``, ``cluster/``), e.g. kept by
``bench_nightly.py DUMP --stages --keep DIR`` (then ``DIR/workers-1``).

Run: ``python benchmarks/bench_cluster_index.py STAGES_DIR [--tokens-per-shard 2000000]``.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def one(stages: Path, variant: str, tokens_per_shard: int, out: Path) -> dict:
    from data_contracts import corpus as C  # noqa: PLC0415
    from data_contracts.base import sha256_file  # noqa: PLC0415
    from tasks.corpus.sharded.cluster_index import build_cluster_index, cluster_texts  # noqa: PLC0415
    from tasks.corpus.index import BM25Config, BM25Index  # noqa: PLC0415
    from tasks.corpus.sharded.shards import run_here  # noqa: PLC0415

    import bm25s  # noqa: F401, PLC0415 - imported before the base RSS is taken
    import numba  # noqa: F401, PLC0415

    cfg = BM25Config()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary: dict = {}
    t0 = time.perf_counter()
    if variant == "one-process":
        docs = C.DOCUMENTS.read(stages / "ingest", columns=["doc_id", "title", "text"])
        ids, texts = cluster_texts(docs, C.CLUSTER_MEMBERS.read(stages / "cluster"))
        del docs
        index = BM25Index.build(texts, ids, cfg)
        del texts
    else:
        workers = int(variant.split("-")[1])
        if workers == 0:
            index, summary = build_cluster_index(stages / "ingest", stages / "cluster", cfg, run_here, tokens_per_shard,
                                                 out / "work")
        else:
            with ProcessPoolExecutor(workers) as pool:
                index, summary = build_cluster_index(stages / "ingest", stages / "cluster", cfg, pool.submit,
                                                     tokens_per_shard, out / "work", window=2 * workers + 2)
    index.save(out / "index")
    wall = time.perf_counter() - t0
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    scores = index.retriever.scores
    return {"variant": variant, "clusters": len(index), "cluster_tokens": summary.get("cluster_tokens"),
            "pairs": int(scores["data"].size), "vocabulary": int(scores["indptr"].size - 1), "wall_s": wall,
            "merge_index_s": summary.get("cluster_merge_index_seconds"),
            "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime,
            "coordinator_cpu_s": own.ru_utime + own.ru_stime,
            "coordinator_start_rss_mb": start_rss, "coordinator_peak_rss_mb": own.ru_maxrss / 1024,
            "worker_peak_rss_mb": kids.ru_maxrss / 1024,
            "files": {p.name: sha256_file(p) for p in sorted((out / "index").iterdir())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stages", type=Path)
    ap.add_argument("--tokens-per-shard", type=int, default=2_000_000)
    ap.add_argument("--variants", nargs="+", default=["one-process", "shards-0", "shards-1", "shards-2"],
                    help="one-process, or shards-N (N worker processes; 0: the shards in the building process)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory(dir=args.stages) as tmp:
            print(json.dumps(one(args.stages, args.one, args.tokens_per_shard, Path(tmp))))
        return
    runs = []
    for v in args.variants:
        res = subprocess.run([sys.executable, __file__, str(args.stages), "--one", v, "--tokens-per-shard",
                              str(args.tokens_per_shard)], capture_output=True, text=True, check=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "files"}), flush=True)
    print("files identical:", all(r["files"] == runs[0]["files"] for r in runs))


if __name__ == "__main__":
    main()
