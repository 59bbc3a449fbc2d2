"""Peak RSS of the corpus build's memory-bound steps, each in a fresh process, for the
bytes-per-unit bounds of ``docs/results/corpus-build-memory.md``.

Input: the stage directories of a build (``ingest/``, ``tokens/``, ``cluster/``, ``segment/``), kept by
``bench_nightly.py DUMP --stages --keep DIR`` (then ``DIR/workers-2``). Every figure is the process's
peak RSS (Linux ``VmHWM``) over its RSS just before the step, after the imports (bm25s, numba, pyarrow;
the numba kernels loaded), plus the step's CPU seconds; a ratio is the slope between two sizes.

* ``tasks STAGES --kind K --sizes A B``: one worker task: for ``tokens`` (T5 window counts) the first
  shard of ``docs_per_shard`` = A, then B documents; for the cluster-range kinds — ``segment``,
  ``cluster_tokens`` (the cluster index's tokenization), ``passage_tokens`` (the passage index's),
  ``passage_index`` (after its token shard and statistics, in the same process) — the shard with the most tokens when shards hold at
  most A, then B tokens (:func:`tasks.corpus.sharded.shards.read_cluster_ranges`); the slope is per token.
* ``cluster-index STAGES --tokens-per-shard N --tile 1 4 16``: the coordinator's cluster index
  (:func:`tasks.corpus.sharded.cluster_index.index_from_token_shards`) over the kept token ids of the shards,
  the shard list repeated K times (K x the tokens, pairs and clusters; same vocabulary).
* ``reuse STAGES --kind K --size N --tasks T``: the first T shard tasks (shards of at most N tokens)
  run one after another in one worker process (as in a nightly build), without and with
  :func:`funnelrag.memory.release_memory` after each: every task's tokens, RSS at its start,
  its peak and its end.
* ``token-memo SHARD_DIRS... --tile 1 3``: the coordinator's BM25 token memo write
  (:func:`tasks.corpus.sharded.token_memo.write_token_memo`) from a build's token shards (the
  ``passage-tokens/<key>`` or ``cluster-tokens/<key>`` entries of its cache), the shard list repeated
  K times (K x the token ids written; same pieces and vocabulary).
* ``memo-lookup --terms 500000 2000000``: one token shard's lookup in the BM25 token memo
  (:func:`tasks.corpus.sharded.token_memo.open_token_memo`, then
  :func:`tasks.corpus.sharded.token_memo.memo_token_ids`), as every cluster and passage token shard
  of a night makes it: a memo of N random 9-letter terms (texts of 20 terms), a shard of 20,000 of
  its texts and 200 edited ones (a new term each); the slope is per memo term.
* ``adds-changes --days 3 12``: a nightly's adds-changes revisions, from the day memos to the pieces'
  ranges, as the coordinator handles them: every day since the base full dump merged
  (:func:`tasks.sources.adds_changes.merge_days`, each day's memo written by an earlier night), the
  changes file opened, its revisions' digest (the content check printed) and its split by 100 pieces, each piece's
  revisions loaded in turn (what a worker holds). Synthetic days of ``--pages`` pages (ids drawn from
  20 x as many) of ``--text-kb`` KB of text, made in another process; the slope is per byte of the
  merged revisions' text (the newest revision of each page, what the night applies). Runs on code whose ``merge_days`` returns the revisions (before the changes file), too.
* ``vocabulary --terms 450000 1800000``: bytes a vocabulary term: 8 shards of random 9-letter terms
  (each term in ~2 shards, 3 tokens each), merged, indexed and saved.

Run: ``python benchmarks/bench_memory.py tasks KEEP/workers-2 --kind segment --sizes 8000000 32000000``.
"""
from __future__ import annotations

import argparse
import inspect
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from funnelrag.memory import status_mb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _warm() -> None:
    """Import the libraries and load the numba kernels, so that the base RSS holds them."""
    import bm25s  # noqa: F401, PLC0415
    import pyarrow.parquet  # noqa: F401, PLC0415

    from tasks.corpus import bm25_csc  # noqa: PLC0415

    i32, i64 = np.zeros(1, np.int32), np.zeros(1, np.int64)
    bm25_csc._doc_freqs(i32, np.array([0, 1]), np.zeros(1, np.int32), i64.copy())
    bm25_csc._scatter_scores(i32[:0], np.array([0]), 0, np.zeros(1, np.int32), i64.copy(), i64.copy(),
                             np.zeros(1, np.float32), 1.0, 0.9, 0.4, False, np.zeros(0, np.float32), i32[:0])


def _measured(step) -> dict:
    """Run ``step()``; its result dict plus the peak RSS over the start (MB) and CPU seconds."""
    Path("/proc/self/clear_refs").write_text("5")
    base, r0 = status_mb("VmRSS"), resource.getrusage(resource.RUSAGE_SELF)
    out = step()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {**out, "base_mb": base, "peak_over_base_mb": status_mb("VmHWM") - base,
            "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime}


def shard_ranges(stages: Path, max_tokens: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The cluster ranges of a build's shards of at most ``max_tokens`` tokens and their tokens."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.sharded.shards import read_cluster_ranges  # noqa: PLC0415

    ranges = read_cluster_ranges(stages / "cluster", max_tokens)
    tokens = pq.read_table(stages / "cluster" / "clusters.parquet", columns=["n_tokens"]).column("n_tokens").to_numpy()
    return ranges, [int(tokens[lo:hi].astype(np.int64).sum()) for lo, hi in ranges]   # ranges of cluster ranks


def shard_documents(stages: Path, ranges: list[tuple[int, int]], work: Path) -> list[str]:
    """Each shard's documents split out in this process, as the build splits them before its shards
    (:func:`tasks.corpus.sharded.shards.partition_documents`): one directory a range."""
    import pyarrow.parquet as pq  # noqa: PLC0415
    from tasks.corpus.segment import check_members  # noqa: PLC0415
    from tasks.corpus.sharded import shards as SH  # noqa: PLC0415

    ids = pq.read_table(stages / "ingest" / "documents.parquet", columns=["doc_id"]).column("doc_id").to_numpy()
    members = pq.read_table(stages / "cluster" / "cluster_members.parquet", columns=["cluster_id", "doc_id"])
    rows = check_members(ids, members.column("doc_id").to_numpy())
    ranks = SH.member_cluster_ranks(members.column("cluster_id").to_numpy())
    return [str(d) for d in SH.partition_documents(stages / "ingest", ranges, ranks, rows, work, SH.run_here, 20_000)]


def one_task(stages: Path, kind: str, size: int, tmp: Path) -> dict:
    import pyarrow.parquet as pq  # noqa: PLC0415

    from funnelrag.datasets import default_mirror  # noqa: PLC0415
    from tasks.corpus.sharded import cluster_index as CI  # noqa: PLC0415
    from tasks.corpus.sharded import passage_tokens as PT  # noqa: PLC0415
    from tasks.corpus.sharded import sharded_index as SI  # noqa: PLC0415
    from tasks.corpus.sharded import shards as SH  # noqa: PLC0415
    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415

    _warm()
    seg, cfg, mirror = SegmentConfig(), BM25Config(), str(default_mirror())
    n_members = pq.read_table(stages / "cluster" / "clusters.parquet", columns=["n_members"]).column("n_members").to_numpy()
    first = np.r_[0, np.cumsum(n_members, dtype=np.int64)]   # member rows of each cluster rank
    units: dict = {"kind": kind, "size": size}
    if kind == "tokens":
        lo, hi = SH.doc_shards(int(first[-1]), size)[0]
        units["docs"] = hi - lo
        call = (SH.count_shard, str(stages / "ingest"), lo, hi, seg, mirror, None)
    elif kind in ("segment", "cluster_tokens", "passage_tokens", "passage_index"):
        ranges, tokens = shard_ranges(stages, size)
        lo, hi = ranges[int(np.argmax(tokens))]
        docs = shard_documents(stages, ranges, tmp / "split")[int(np.argmax(tokens))] if kind != "passage_tokens" else ""
        rows = SH.passage_row_ranges(stages / "segment", stages / "cluster", size)[int(np.argmax(tokens))]
        units.update(tokens=max(tokens), shards=len(ranges), docs=int(first[hi] - first[lo]), passages=rows[1] - rows[0])
        call = ((SH.segment_shard, str(stages / "ingest"), str(stages / "tokens"), str(stages / "cluster"), lo, hi,
                 seg, mirror, str(tmp), docs) if kind == "segment" else
                (CI.cluster_token_shard, str(stages / "ingest"), str(stages / "cluster"), lo, hi, cfg, str(tmp), docs)
                if kind == "cluster_tokens" else (PT.passage_token_shard, str(stages / "segment"), *rows, cfg, str(tmp)))
        if kind == "passage_index":
            lo, hi = rows   # the passage steps read rows of passages.parquet
            kept = tmp / PT.TOKENS_DIR / PT.passage_token_shard(str(stages / "segment"), lo, hi, cfg, str(tmp), keep_df=True)[1]
            (n_docs,), total, global_df, global_key = SI.merge_token_shard_stats([kept], tmp)
            call = (SI.passage_index_shard, str(stages / "segment"), lo, hi, cfg, str(tmp), str(kept), str(global_df),
                    n_docs, total, global_key)
    else:
        raise ValueError(f"unknown task kind {kind!r}")
    return _measured(lambda: {**units, "reused": _REUSED[kind](call[0](*call[1:]))})


_REUSED = {   # whether a shard call's result says it reused a kept shard
    "tokens": lambda r: bool(r[0].size) and r[2] == r[0].size,   # every document's counts from the memo
    "segment": lambda r: bool(r[-1]),
    "cluster_tokens": lambda r: bool(r[3]),
    "passage_tokens": lambda r: bool(r[2]),
    "passage_index": lambda r: bool(r[-1]),
}


def _reuse_task(call: tuple, release: bool) -> dict:
    """One shard task in a reused worker: its RSS at the start, its peak and, after
    :func:`funnelrag.memory.release_memory` when ``release``, its RSS at the end (MB)."""
    from funnelrag.memory import release_memory  # noqa: PLC0415

    Path("/proc/self/clear_refs").write_text("5")
    start = status_mb("VmRSS")
    call[0](*call[1:])
    peak = status_mb("VmHWM")
    if release:
        release_memory()
    return {"start_mb": start, "peak_mb": peak, "end_mb": status_mb("VmRSS")}


def reuse_run(stages: Path, kind: str, size: int, n_tasks: int, release: bool, tmp: Path) -> dict:
    """The first ``n_tasks`` shard tasks of ``kind`` (``segment``, ``cluster_tokens``,
    ``passage_tokens``; shards of at most ``size`` tokens) one after another in ONE worker process,
    as a nightly build's worker runs them."""
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    from funnelrag.datasets import default_mirror  # noqa: PLC0415
    from tasks.corpus.sharded import cluster_index as CI  # noqa: PLC0415
    from tasks.corpus.sharded import passage_tokens as PT  # noqa: PLC0415
    from tasks.corpus.sharded import shards as SH  # noqa: PLC0415
    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415

    seg, cfg, mirror = SegmentConfig(), BM25Config(), str(default_mirror())
    ranges, tokens = shard_ranges(stages, size)
    docs = shard_documents(stages, ranges, tmp / "split") if kind in ("segment", "cluster_tokens") else []
    if kind == "segment":
        calls = [(SH.segment_shard, str(stages / "ingest"), str(stages / "tokens"), str(stages / "cluster"), lo, hi,
                  seg, mirror, str(tmp), d) for (lo, hi), d in zip(ranges, docs)]
    elif kind == "cluster_tokens":
        calls = [(CI.cluster_token_shard, str(stages / "ingest"), str(stages / "cluster"), lo, hi, cfg, str(tmp), d)
                 for (lo, hi), d in zip(ranges, docs)]
    elif kind == "passage_tokens":   # the passage steps read rows of passages.parquet
        calls = [(PT.passage_token_shard, str(stages / "segment"), lo, hi, cfg, str(tmp))
                 for lo, hi in SH.passage_row_ranges(stages / "segment", stages / "cluster", size)]
    else:
        raise ValueError(f"unknown task kind {kind!r}")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_warm) as pool:
        tasks = [{"tokens": n, **pool.submit(_reuse_task, call, release).result()}
                 for call, n in zip(calls[:n_tasks], tokens)]
    return {"kind": kind, "size": size, "shards": len(ranges), "release": release, "tasks": tasks,
            "max_peak_mb": max(t["peak_mb"] for t in tasks), "max_start_mb": max(t["start_mb"] for t in tasks)}


def shard_order(stages: Path, tokens_per_shard: int, work: Path) -> list[str]:
    """Tokenize the cluster index's shards once into ``work`` (kept) and return their keys in order."""
    from tasks.corpus.sharded.cluster_index import cluster_token_shard  # noqa: PLC0415
    from tasks.corpus.index import BM25Config  # noqa: PLC0415

    ranges = shard_ranges(stages, tokens_per_shard)[0]
    return [cluster_token_shard(str(stages / "ingest"), str(stages / "cluster"), lo, hi, BM25Config(), str(work), d)[2]
            for (lo, hi), d in zip(ranges, shard_documents(stages, ranges, work / "split"))]


def one_tiled_index(work: Path, keys: list[str], tile: int) -> dict:
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.sharded.cluster_index import VocabularyMerge, index_from_token_shards  # noqa: PLC0415
    from tasks.corpus.index import BM25Config, TokenIds  # noqa: PLC0415

    _warm()
    dirs = [work / "cluster-tokens" / key for key in keys] * tile
    n_texts = sum(int(np.load(d / TokenIds.OFFSETS_FILE, mmap_mode="r").size - 1) for d in dirs)
    n_tokens = sum(int(np.load(d / TokenIds.OFFSETS_FILE, mmap_mode="r")[-1]) for d in dirs)

    def step() -> dict:
        merge = VocabularyMerge(sorted_terms=True)
        for d in dirs:
            merge.add(pq.read_table(d / TokenIds.TERMS_FILE).column("term").to_pylist())
        index = index_from_token_shards(dirs, [str(i) for i in range(n_texts)], merge, BM25Config())
        with tempfile.TemporaryDirectory(dir=work) as out:
            index.save(Path(out) / "index")
        scores = index.retriever.scores
        return {"tile": tile, "clusters": n_texts, "tokens": n_tokens, "pairs": int(scores["data"].size),
                "vocabulary": int(scores["indptr"].size - 1)}
    return _measured(step)


def one_token_memo(dirs: list[Path], tile: int, tmp: Path) -> dict:
    from tasks.corpus.index import TokenIds  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import write_token_memo  # noqa: PLC0415

    tokens = tile * sum(int(np.load(d / TokenIds.OFFSETS_FILE, mmap_mode="r")[-1]) for d in dirs)
    return _measured(lambda: {"tile": tile, "tokens": tokens, "pieces": write_token_memo(tmp / "memo", dirs * tile)})


def _make_memo(n_terms: int, tmp: Path) -> None:
    """``memo-lookup``'s memo and shard texts (``tmp/memo``, ``tmp/shard.parquet``), made in another
    process so that the measured one holds none of the memory that made them."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import memo_token_ids, write_token_memo  # noqa: PLC0415

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    terms = ["".join(w) for w in letters[rng.integers(0, 26, (n_terms, 9))].tolist()]
    texts = [" ".join(terms[i:i + 20]) for i in range(0, n_terms, 20)]
    write_token_memo(tmp / "memo", [memo_token_ids(texts, BM25Config(stopwords=None), None, [])])
    picked = rng.choice(len(texts), min(20_000, len(texts)), replace=False)
    shard = [texts[i] for i in picked] + [f"{texts[i]} edited{k}zz" for k, i in enumerate(picked[:200])]
    pq.write_table(pa.table({"text": pa.array(shard, pa.string())}), tmp / "shard.parquet")


def one_memo_lookup(n_terms: int, tmp: Path) -> dict:
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import memo_token_ids, open_token_memo  # noqa: PLC0415

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_make_memo, n_terms, tmp).result()
    shard = pq.read_table(tmp / "shard.parquet").column("text").to_pylist()
    cfg = BM25Config(stopwords=None)
    memo_token_ids(shard[:10], cfg, None, [])   # tokenizer and stemmer loaded before the measure

    def lookup() -> dict:
        found = memo_token_ids(shard, cfg, *open_token_memo(tmp / "memo"))
        return {"vocabulary": n_terms, "shard_texts": len(shard), "from_memo": found.reused,
                "shard_terms": len(found.tokens.terms)}
    return _measured(lookup)


def one_vocabulary(n_terms: int, tmp: Path) -> dict:
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.sharded.cluster_index import VocabularyMerge, index_from_token_shards  # noqa: PLC0415
    from tasks.corpus.index import BM25Config, TokenIds  # noqa: PLC0415

    _warm()
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    terms = sorted({"".join(rng.choice(letters, 9)) for _ in range(n_terms)})
    dirs, n_shards, docs = [], 8, 2000
    for s in range(n_shards):
        local = np.sort(rng.choice(len(terms), len(terms) // 4, replace=False))
        ids = rng.permutation(np.repeat(np.arange(local.size, dtype=np.int32), 3))
        d = tmp / f"shard-{s}"
        d.mkdir()
        TokenIds(ids, np.linspace(0, ids.size, docs + 1).astype(np.int64), [terms[i] for i in local]).save(d)
        dirs.append(d)
    del terms

    def step() -> dict:
        merge = VocabularyMerge(sorted_terms=True)
        for d in dirs:
            merge.add(pq.read_table(d / TokenIds.TERMS_FILE).column("term").to_pylist())
        index = index_from_token_shards(dirs, [str(i) for i in range(docs * n_shards)], merge, BM25Config())
        index.save(tmp / "index")
        scores = index.retriever.scores
        return {"vocabulary": int(scores["indptr"].size - 1), "pairs": int(scores["data"].size)}
    return _measured(step)


def _make_days(n_days: int, pages: int, text_kb: int, tmp: Path) -> None:
    """``adds-changes``'s day files (plain XML, ``tmp/days/<date>.xml``) and their memos
    (``tmp/memo``), made in another process."""
    from tasks.sources import adds_changes as A  # noqa: PLC0415

    rng = np.random.default_rng(0)
    words = np.array([f"w{k}" for k in range(2_000)])
    blocks = np.array([" ".join(words[rng.integers(0, words.size, 170)].tolist())[:1023] + " " for _ in range(500)])
    (tmp / "days").mkdir()
    days = []
    for d in range(n_days):
        date = f"202601{d + 2:02d}"
        with open(tmp / "days" / f"{date}.xml", "w", encoding="utf-8") as fh:
            fh.write("<mediawiki>\n")
            for pid in np.sort(rng.choice(20 * pages, pages, replace=False)).tolist():
                text = "".join(blocks[rng.integers(0, blocks.size, text_kb)].tolist())
                fh.write(f"<page><title>Page {pid}</title><ns>0</ns><id>{pid + 1}</id><revision><id>{d * 10 * pages + pid}"
                         f"</id><timestamp>2026-01-{d + 2:02d}T00:00:00Z</timestamp><text>{text}</text></revision></page>\n")
            fh.write("</mediawiki>\n")
        days.append((date, tmp / "days" / f"{date}.xml"))
    if "out" in inspect.signature(A.merge_days).parameters:
        A.merge_days(days, tmp / "warm.parquet", "m.xml.bz2", memo_dir=tmp / "memo")
    else:
        A.merge_days(days, memo_dir=tmp / "memo")


def one_adds_changes(n_days: int, pages: int, text_kb: int, tmp: Path) -> dict:
    import multiprocessing  # noqa: PLC0415
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    import pyarrow.parquet  # noqa: F401, PLC0415

    from tasks.sources import adds_changes as A  # noqa: PLC0415
    from tasks.sources.ingest import changes as C  # noqa: PLC0415

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_make_days, n_days, pages, text_kb, tmp).result()
    days = sorted((f.stem, f) for f in (tmp / "days").iterdir())
    bounds = [None, *range(20 * pages // 100, 20 * pages, 20 * pages // 100), None]
    new_api = "out" in inspect.signature(A.merge_days).parameters

    def step() -> dict:
        if new_api:
            changes, _ = A.merge_days(days, tmp / "changes.parquet", "m.xml.bz2", memo_dir=tmp / "memo")
            changes = C.ChangesFile.open(tmp / "changes.parquet")
            digest = changes.digest()
            loaded = [[len(p.text) for p in r.load().pages] for r in changes.split(bounds)]
        else:   # the revisions in memory, saved, then loaded again by the build and cut by piece
            merged, _ = A.merge_days(days, memo_dir=tmp / "memo")
            C.PageChanges.of("m.xml.bz2", merged).save(tmp / "changes.parquet")
            del merged
            changes = C.PageChanges.load(tmp / "changes.parquet")
            digest = changes.digest()
            loaded = [[len(p.text) for p in changes.in_range(lo, hi)] for lo, hi in zip(bounds[:-1], bounds[1:])]
        return {"days": n_days, "revisions": sum(map(len, loaded)), "digest": digest[:12],
                "days_file_bytes": sum(f.stat().st_size for _, f in days), "text_bytes": sum(map(sum, loaded))}
    return _measured(step)


def _child(args: list[str]) -> dict:
    res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tasks")
    t.add_argument("stages", type=Path)
    t.add_argument("--kind", required=True, choices=["tokens", "segment", "cluster_tokens", "passage_tokens", "passage_index"])
    t.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    c = sub.add_parser("cluster-index")
    c.add_argument("stages", type=Path)
    c.add_argument("--tokens-per-shard", type=int, default=2_000_000)
    c.add_argument("--tile", type=int, nargs="+", default=[1, 4, 16])
    r = sub.add_parser("reuse")
    r.add_argument("stages", type=Path)
    r.add_argument("--kind", required=True, choices=["segment", "cluster_tokens", "passage_tokens"])
    r.add_argument("--size", type=int, default=32_000_000, help="the most tokens of a shard")
    r.add_argument("--tasks", type=int, default=6)
    r.add_argument("--release", choices=["no", "yes", "both"], default="both")
    m = sub.add_parser("token-memo")
    m.add_argument("dirs", type=Path, nargs="+")
    m.add_argument("--tile", type=int, nargs="+", default=[1, 3])
    q = sub.add_parser("memo-lookup")
    q.add_argument("--terms", type=int, nargs="+", default=[500_000, 2_000_000])
    v = sub.add_parser("vocabulary")
    v.add_argument("--terms", type=int, nargs="+", default=[450_000, 1_800_000])
    a = sub.add_parser("adds-changes")
    a.add_argument("--days", type=int, nargs="+", default=[3, 12])
    a.add_argument("--pages", type=int, default=3_000, help="pages a day")
    a.add_argument("--text-kb", type=int, default=20, help="KB of text a page")
    for p in (t, c, r, m, q, v, a):
        p.add_argument("--one", help=argparse.SUPPRESS)
        p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        with tempfile.TemporaryDirectory() as tmp:
            if args.what == "tasks":
                out = one_task(args.stages, args.kind, int(args.one), Path(tmp))
            elif args.what == "token-memo":
                out = one_token_memo(args.dirs, int(args.one), Path(tmp))
            elif args.what == "memo-lookup":
                out = one_memo_lookup(int(args.one), Path(tmp))
            elif args.what == "adds-changes":
                out = one_adds_changes(int(args.one), args.pages, args.text_kb, Path(tmp))
            elif args.what == "cluster-index":
                out = one_tiled_index(args.work, json.loads((args.work / "order.json").read_text()), int(args.one))
            else:
                out = one_vocabulary(int(args.one), Path(tmp))
        print(json.dumps(out))
        return
    if args.what == "reuse":
        for release in ([False, True] if args.release == "both" else [args.release == "yes"]):
            with tempfile.TemporaryDirectory() as tmp:
                print(json.dumps(reuse_run(args.stages, args.kind, args.size, args.tasks, release, Path(tmp))), flush=True)
        return
    if args.what == "tasks":
        rows = [_child(["tasks", str(args.stages), "--kind", args.kind, "--one", str(n)]) for n in args.sizes]
        unit = "docs" if args.kind == "tokens" else "tokens"
    elif args.what == "cluster-index":
        work = Path(tempfile.mkdtemp(dir=args.stages))
        try:
            (work / "order.json").write_text(json.dumps(shard_order(args.stages, args.tokens_per_shard, work)))
            rows = [_child(["cluster-index", str(args.stages), "--work", str(work), "--one", str(k)]) for k in args.tile]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        unit = "pairs"
    elif args.what == "token-memo":
        rows = [_child(["token-memo", *map(str, args.dirs), "--one", str(k)]) for k in args.tile]
        unit = "tokens"
    elif args.what == "memo-lookup":
        rows = [_child(["memo-lookup", "--one", str(n)]) for n in args.terms]
        unit = "vocabulary"
    elif args.what == "adds-changes":
        rows = [_child(["adds-changes", "--pages", str(args.pages), "--text-kb", str(args.text_kb), "--one", str(n)])
                for n in args.days]
        unit = "text_bytes"
    else:
        rows = [_child(["vocabulary", "--one", str(n)]) for n in args.terms]
        unit = "vocabulary"
    for row in rows:
        print(json.dumps(row), flush=True)
    label = {"text_bytes": "byte of merged revision text", "docs": "document", "tokens": "token", "pairs": "(cluster, term) pair", "vocabulary": "vocabulary term"}
    for a, b in zip(rows[:-1], rows[1:]):
        if b[unit] != a[unit]:
            print(f"slope: {(b['peak_over_base_mb'] - a['peak_over_base_mb']) * 2**20 / (b[unit] - a[unit]):.1f} "
                  f"bytes of peak RSS a {label[unit]}")


if __name__ == "__main__":
    main()
