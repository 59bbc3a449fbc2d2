"""Where the index stage of a night goes, on the stage outputs and BM25 token memos a nightly home
holds (``benchmarks/bench_nightly_mirror.py``'s ``<home>/nightly/cache/corpus``).

``profile``: :func:`tasks.corpus.stages.run_index` (cluster index, then the one passage index)
under ``cProfile``, every shard in this process, in a scratch work directory holding hard links of
the home's token memos (the home is not written): its CPU seconds, the summary's seconds, and the
functions by cumulative time (``--top``). No cluster token shard is in the scratch directory, so
every shard is assembled from the memo, as on a night whose clusters all changed; the document
split is made here too (a night shares the segment stage's).

``lookup``: the passage index's memo lookup alone
(:func:`tasks.corpus.sharded.token_memo.memo_token_ids` over every passage of ``SEGMENT`` with the
memo ``MEMO``), ``--repeat`` times, the CPU seconds of each call; the token ids and vocabulary are
saved under ``--save`` to compare two versions of the code (run once with each first on
``PYTHONPATH``).

Run: ``python benchmarks/profile_index_stage.py profile INGEST CLUSTER SEGMENT CACHE OUT [--top 45]``;
``python benchmarks/profile_index_stage.py lookup SEGMENT MEMO [--repeat 3] [--save DIR]``.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # `python benchmarks/<script>.py` from anywhere


def profile(args: argparse.Namespace) -> None:
    from tasks.corpus.index import BM25Config
    from tasks.corpus.stages import run_index

    work = args.out / "work"
    shutil.rmtree(args.out, ignore_errors=True)
    work.mkdir(parents=True)
    for memo in sorted(args.cache.glob("bm25-memo-*")):
        shutil.copytree(memo, work / memo.name, copy_function=os.link)
    prof = cProfile.Profile()
    t0 = time.process_time()
    prof.enable()
    summary = run_index(args.ingest, args.cluster, args.segment, args.out / "index", BM25Config(), work_dir=work)
    prof.disable()
    cpu = time.process_time() - t0
    prof.dump_stats(args.out / "index.prof")
    print(json.dumps({"cpu_s": round(cpu, 2), **{k: v for k, v in summary.items() if "seconds" in k or "reused" in k}}))
    pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


def lookup(args: argparse.Namespace) -> None:
    import numpy as np

    from data_contracts import corpus as C
    from funnelrag.memo import JoinedTexts
    from tasks.corpus.index import BM25Config
    from tasks.corpus.sharded.token_memo import memo_token_ids, open_token_memo

    passages = C.PASSAGES.read(args.segment, columns=["title", "text"])
    texts = JoinedTexts(passages.column("title"), passages.column("text"), "\n")
    keys = texts.keys()
    memo, terms = open_token_memo(args.memo)
    seconds = []
    for _ in range(args.repeat):
        t0 = time.process_time()
        found = memo_token_ids(texts, BM25Config(), memo, terms, keys=keys)
        seconds.append(round(time.process_time() - t0, 3))
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        np.save(args.save / "ids.npy", found.tokens.ids)
        (args.save / "terms.json").write_text(json.dumps(found.tokens.terms))
    print(json.dumps({"cpu_s": seconds, "passages": len(texts), "from_memo": found.reused,
                      "terms": len(found.tokens.terms)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile")
    for name in ("ingest", "cluster", "segment", "cache", "out"):
        p.add_argument(name, type=Path)
    p.add_argument("--top", type=int, default=45)
    q = sub.add_parser("lookup")
    q.add_argument("segment", type=Path)
    q.add_argument("memo", type=Path)
    q.add_argument("--repeat", type=int, default=3)
    q.add_argument("--save", type=Path)
    args = ap.parse_args()
    (profile if args.command == "profile" else lookup)(args)


if __name__ == "__main__":
    main()
