"""Parallel ingest of a (synthetic) multistream dump with 1 and 2 worker processes: seconds, peak
RSS of the coordinator and of the largest worker, parallel efficiency, MB of XML per core-second
(bz2 decompression included) of the whole run, of the workers and of the coordinator, and the
artifacts' digests (identical for every worker count).

Each run is a fresh process (so ``ru_maxrss`` is that run's own); workers come from a
``ProcessPoolExecutor``. Dump: ``python benchmarks/synth_dump.py DIR --pages N``.

``--stages``: the whole build (ingest, tokens, cluster, segment, index: the pure stage cores, the
per-shard ones — ingest pieces, token shards of ``--docs-per-shard`` documents, segment and the
cluster index's tokenization by cluster ranges of at most ``--tokens-per-shard`` tokens, and with
``--passage-shard-tokens N`` > 0 the passage index shards of at most N tokens — through a fresh
pool per stage) with seconds
per stage, CPU seconds per stage (coordinator, and coordinator + workers), the coordinator's RSS at
the start of the stage and its peak RSS during that stage (Linux ``VmHWM``, reset before each stage —
which resets ``ru_maxrss`` too; elsewhere the peak so far), and the largest worker task's peak RSS in
that stage (each task's ``VmHWM``, reset when the task starts; Linux only).

Run: ``python benchmarks/bench_nightly.py DUMP.xml.bz2 [--workers 1 2] [--streams-per-piece 100] [--stages]
[--docs-per-shard 20000] [--tokens-per-shard 32000000] [--passage-shard-tokens 0] [--keep DIR]
[--only segment index --inputs KEPT/workers-2]``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def one_run(dump: Path, workers: int, streams_per_piece: int, out: Path, **_: int) -> dict:
    from data_contracts.base import sha256_file  # noqa: PLC0415
    from tasks.sources.ingest import IngestConfig, ingest  # noqa: PLC0415

    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        summary = ingest([dump], out, IngestConfig(format="mediawiki"), submit=pool.submit,
                         streams_per_piece=streams_per_piece, window=2 * workers + 2)
    wall = time.perf_counter() - t0
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    mb = summary.uncompressed_bytes / 1e6
    coordinator = own.ru_utime + own.ru_stime
    return {"workers": workers, "pages": summary.records, "documents": summary.documents, "xml_mb": mb,
            "wall_s": wall, "pass2_wall_s": summary.pass2_seconds, "cpu_s": cpu, "coordinator_cpu_s": coordinator,
            "workers_cpu_s": cpu - coordinator,
            "mb_per_wall_s": mb / wall, "mb_per_core_s": mb / wall / workers, "mb_per_cpu_s": mb / cpu,
            "mb_per_worker_cpu_s": mb / (cpu - coordinator), "mb_per_coordinator_cpu_s": mb / coordinator,
            "coordinator_peak_rss_mb": own.ru_maxrss / 1024, "worker_peak_rss_mb": kids.ru_maxrss / 1024,
            "digests": {p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))}}


def _stage_peak_rss_mb(reset: bool = False) -> float | None:
    """This process's peak RSS since the last reset (Linux ``VmHWM``, reset through
    ``/proc/self/clear_refs``); None where that is not available."""
    from funnelrag.memory import status_mb  # noqa: PLC0415 - not in the ingest-only runs' coordinator

    if reset:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return None
    return status_mb("VmHWM")


def _peak_call(fn, *args):
    """``fn(*args)`` in a worker through the flows' own shard body
    (``flows.runners.run_shard``: the call, then the freed memory back to the OS), with the
    worker's RSS (MB) when the call starts (what earlier tasks left in that process) and its peak
    RSS (the high-water mark, which the release does not lower)."""
    from flows.runners import run_shard  # noqa: PLC0415
    from funnelrag.memory import status_mb  # noqa: PLC0415

    _stage_peak_rss_mb(reset=True)
    start = status_mb("VmRSS")
    value = run_shard(fn, list(args))
    return value, start, _stage_peak_rss_mb()


class _PeakFuture:
    def __init__(self, future, peaks: "_WorkerPeaks"):
        self.future, self.peaks = future, peaks

    def result(self):
        value, start, peak = self.future.result()
        self.peaks.max_mb = max(self.peaks.max_mb, peak or 0.0)
        self.peaks.max_start_mb = max(self.peaks.max_start_mb, start or 0.0)
        self.peaks.max_rise_mb = max(self.peaks.max_rise_mb, (peak or 0.0) - (start or 0.0))
        return value


class _WorkerPeaks:
    """``submit`` over a pool that records the largest peak RSS of any task, the largest RSS a
    task started at and the largest rise within one task (:func:`_peak_call`)."""

    def __init__(self, pool: ProcessPoolExecutor):
        self.pool, self.max_mb, self.max_start_mb, self.max_rise_mb = pool, 0.0, 0.0, 0.0

    def submit(self, fn, *args) -> _PeakFuture:
        return _PeakFuture(self.pool.submit(_peak_call, fn, *args), self)


def _cpu_s() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def stages_run(dump: Path, workers: int, streams_per_piece: int, out: Path, docs_per_shard: int = 20_000,
               tokens_per_shard: int = 32_000_000, passage_shard_tokens: int = 0, inputs: Path | None = None,
               only: list[str] | None = None) -> dict:
    """The build's stages (``only``: those; the earlier stages' outputs are read from ``inputs``, a
    kept ``workers-N`` directory, by symbolic links) with their seconds, CPU and peak RSS."""
    from funnelrag.datasets import default_mirror  # noqa: PLC0415
    from tasks.corpus import stages as S  # noqa: PLC0415
    from tasks.corpus.clustering import ClusteringConfig  # noqa: PLC0415
    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.sources.ingest import IngestConfig  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from funnelrag.memory import status_mb  # noqa: PLC0415
    from tasks.corpus.sharded.shards import run_segment_sharded, run_tokens_sharded  # noqa: PLC0415

    mirror, seg = default_mirror(), SegmentConfig()
    dirs = {k: out / k for k in ("ingest", "tokens", "cluster", "segment", "index")}
    if only:
        for name, path in dirs.items():
            if name not in only:
                if inputs is None or not (Path(inputs) / name).is_dir():
                    raise SystemExit(f"--only {' '.join(only)}: stage {name} must come from --inputs (a kept workers-N dir)")
                path.symlink_to((Path(inputs) / name).resolve(), target_is_directory=True)
    calls = {
        "ingest": lambda submit: S.run_ingest([dump], dirs["ingest"], IngestConfig(format="mediawiki"), submit=submit,
                                              streams_per_piece=streams_per_piece, window=2 * workers + 2),
        "tokens": lambda submit: run_tokens_sharded(dirs["ingest"], dirs["tokens"], seg, mirror, submit, docs_per_shard,
                                                    window=2 * workers + 2),
        "cluster": lambda _: S.run_cluster(dirs["ingest"], dirs["tokens"], dirs["cluster"], ClusteringConfig(max_tokens=4096)),
        "segment": lambda submit: run_segment_sharded(dirs["ingest"], dirs["tokens"], dirs["cluster"], dirs["segment"],
                                                      seg, mirror, submit, tokens_per_shard, window=2 * workers + 2,
                                                      docs_per_range=docs_per_shard),
        "index": lambda submit: S.run_index(dirs["ingest"], dirs["cluster"], dirs["segment"], dirs["index"], BM25Config(),
                                            passage_shard_tokens=passage_shard_tokens, submit=submit,
                                            window=2 * workers + 2, tokens_per_shard=tokens_per_shard,
                                            docs_per_range=docs_per_shard),
    }
    rows = {}
    for name, call in calls.items():
        if only and name not in only:
            continue
        _stage_peak_rss_mb(reset=True)
        start_rss = status_mb("VmRSS")
        t0, (own0, kids0) = time.perf_counter(), _cpu_s()
        # spawned workers (a stage pool's workers fork from a forkserver, not from the coordinator): a
        # worker forked from this process would count the coordinator's pages (GBs by the later stages) in its RSS
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            peaks = _WorkerPeaks(pool)
            summary = call(peaks.submit)
        own1, kids1 = _cpu_s()
        rows[name] = {"seconds": time.perf_counter() - t0, "coordinator_cpu_s": own1 - own0,
                      "cpu_s": own1 - own0 + kids1 - kids0, "coordinator_start_rss_mb": start_rss,
                      "coordinator_peak_rss_mb": _stage_peak_rss_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_task_peak_rss_mb": peaks.max_mb, "worker_task_start_rss_mb": peaks.max_start_mb,
                      "worker_task_rise_mb": peaks.max_rise_mb,
                      **{k: v for k, v in summary.items() if isinstance(v, (int, float)) and k != "seconds"}}
    return {"workers": workers, "tokens_per_shard": tokens_per_shard, "passage_shard_tokens": passage_shard_tokens,
            "stages": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", type=Path)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--streams-per-piece", type=int, default=100)
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--docs-per-shard", type=int, default=20_000, help="documents per token-counting shard (--stages)")
    ap.add_argument("--tokens-per-shard", type=int, default=32_000_000,
                    help="most tokens of a segment / cluster-index shard (--stages)")
    ap.add_argument("--passage-shard-tokens", type=int, default=0,
                    help="most tokens of a passage BM25 shard; 0 = one passage index (--stages)")
    ap.add_argument("--keep", type=Path, help="keep each run's stage directories in KEEP/workers-N (--stages)")
    ap.add_argument("--only", nargs="+", choices=["ingest", "tokens", "cluster", "segment", "index"],
                    help="run only these stages, the others read from --inputs (--stages)")
    ap.add_argument("--inputs", type=Path, help="a kept workers-N directory with the stages --only leaves out")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fn = stages_run if args.stages else one_run
        kw = {"docs_per_shard": args.docs_per_shard, "tokens_per_shard": args.tokens_per_shard,
              "passage_shard_tokens": args.passage_shard_tokens}
        if args.only:
            kw.update(only=args.only, inputs=args.inputs)
        if args.keep:
            out = args.keep / f"workers-{args.one}"
            out.mkdir(parents=True, exist_ok=False)
            print(json.dumps(fn(args.dump, args.one, args.streams_per_piece, out, **kw)))
            return
        with tempfile.TemporaryDirectory(dir=args.dump.parent) as tmp:
            print(json.dumps(fn(args.dump, args.one, args.streams_per_piece, Path(tmp), **kw)))
        return
    runs = []
    for w in args.workers:
        res = subprocess.run([sys.executable, __file__, str(args.dump), "--one", str(w), *(["--stages"] if args.stages else []),
                              "--streams-per-piece", str(args.streams_per_piece), "--docs-per-shard", str(args.docs_per_shard),
                              "--tokens-per-shard", str(args.tokens_per_shard),
                              "--passage-shard-tokens", str(args.passage_shard_tokens), *(["--keep", str(args.keep)] if args.keep else []),
                              *(["--only", *args.only] if args.only else []), *(["--inputs", str(args.inputs)] if args.inputs else [])],
                             stdout=subprocess.PIPE, text=True, check=True)  # stderr passes through: a failing run shows why
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "digests"}), flush=True)
    base = min(runs, key=lambda r: r["workers"]) if runs else None
    if args.stages:
        for r in runs:
            if r is not base:
                for name, row in r["stages"].items():
                    speedup = base["stages"][name]["seconds"] / row["seconds"]
                    print(f"{name}: {r['workers']} workers speed-up {speedup:.2f} over {base['workers']}, parallel efficiency "
                          f"{speedup * base['workers'] / r['workers']:.0%}")
        return
    for r in runs:
        if r is base:
            continue
        speedup = base["wall_s"] / r["wall_s"]
        print(f"{r['workers']} workers: speed-up {speedup:.2f} over {base['workers']}, parallel efficiency "
              f"{speedup * base['workers'] / r['workers']:.0%}; artifacts identical: {r['digests'] == base['digests']}")


if __name__ == "__main__":
    main()
