"""Three steps of an adds-changes night measured apart, on a synthetic mirror
(``python benchmarks/synth_dump.py MIRROR --pages N --mirror-days D``).

``ingest``: pass 1 + pass 2 of the base full dump with a piece cache (what night 1 keeps), then of
the same dump with every adds-changes day of the mirror applied while ingesting, three ways:
pieces parsed without the page memo, parsed with it (a piece cache holding only the page memo),
and patched from the kept base pieces (the nightly's path). Prints wall time, CPU seconds (workers and coordinator) and the pieces'
outcome for each, and checks that the three give the same artifacts.

``segment``: the sharded segment stage on a nightly home's newest ingest, tokens and cluster outputs,
with a fresh shard cache and a copy of the home's segmentation memo (the parts it names, renamed so
that no shard entry is reused whole, and a manifest naming them; ``--no-memo``: without it, the
memo this run writes left in ``--work``; ``--memo-home``: the memo of another home, e.g. the night
before's, or such a ``--work`` directory, so that only tonight's changed clusters are segmented).
Prints wall time, workers' CPU seconds, the clusters taken from the memo, the coordinator's CPU
seconds checking the memo and writing the next one, the new memo's bytes, and the top of a cProfile
of the coordinator.

``days``: the revisions of every adds-changes day of the mirror, parsed (what each night did before
the day memo) and read from the day memo (what a night does for the days an earlier night parsed);
CPU seconds of each, and a check that both give the same revisions in the same order.

``passage-tokens``: the passage index's token ids of a nightly home's newest passages, taken from
the passage token memo of another home (the night before's), in ``--shards`` ranges that each open
the memo as a passage token shard does: CPU seconds, passages reused, and a digest of the ids.

``page-memo``: pass 1's page memo written from the parts in a nightly home's piece cache: user and
system CPU seconds of three writes.

``memo-writes``: the passage token memo written after night N from the night before's memo
(``--memo-home``), rewritten whole with tonight's passages (what every night does): user and
system CPU seconds, best of three, on a fresh hard-linked copy of the memo each time, and a digest
of the passage token ids the new memo gives; and the share of the night before's segmentation
memo that tonight's clusters would leave stale if it were extended instead.

``index``: what a night reads of its base dump's multistream index, the way it was done before
(the stream offsets for the pieces, then the first page id of each stream for the adds-changes: two
passes over the decompressed index) and now (the summary kept in the piece cache under the index's
sha256: a hash of the file and two small arrays read): CPU seconds, best of three, and a check that
both give the same offsets and first ids.

``joined-keys``: one call in a fresh process, as a night makes it: the token-memo keys of a nightly
home's newest passages' or documents' (in cluster-like shuffled order) ``title\\ntext``, joined by
Arrow first (the code before) or hashed from the two columns; user and system CPU seconds and the
peak RSS the call added.

``piece-keys``: the BM25 token memos' keys of one passage token shard and one cluster token shard
(the first range of ``--tokens-per-shard`` tokens, the build's default: all of Wikispeedia) of a
home's newest stage outputs, hashed from every piece's ``title\ntext`` (the code before,
:meth:`funnelrag.content_store.JoinedTexts.keys`) and derived from the documents' text keys the
tokens stage kept (:mod:`tasks.corpus.sharded.piece_keys`); the shards' inputs read first, as the
shards read them (what the derived passage keys need beside: the plan's document rows of the range
and the passages' ``doc_id`` and ``n_words`` columns, timed apart). CPU seconds of each,
``--repeats`` alternations, medians, and per million pieces;
a check that the derived keys are the same from the kept text keys and from the texts hashed.

``shard-stats``: the passage index's global ``df`` merged from ``--shards`` synthetic passage token
shards (each ``--terms`` distinct terms drawn from a Zipf law over ``--vocab`` terms, as a shard of
a large dump holds its rare terms): CPU seconds, best of ``--repeat``, of
:func:`tasks.corpus.sharded.sharded_index.merge_token_shard_stats`, rows in and out, and the
file's sha256 (the same for the same shards whichever way it is merged).

``vocabulary-merge``: the coordinator's cluster index from a build's cluster token shards (the
``cluster-tokens/<key>`` entries of its cache, in any order: only the CPU is measured): the shards' vocabularies
merged as the index stage merges them (:class:`tasks.corpus.sharded.cluster_index.VocabularyMerge`,
each shard's terms read from its entry as an Arrow array, or with ``--as-lists`` as Python lists,
as token shards returned them before), then
:func:`tasks.corpus.sharded.cluster_index.index_from_token_shards`; CPU seconds of each.

``read``: one read in a fresh process, as a stage makes it: a nightly home's newest
``passages.parquet`` (``passage_id``, ``title``, ``text``) or ``documents.parquet`` (``doc_id``,
``title``, ``text``), memory-mapped (how the stages read now) or read into buffers (before): user and
system CPU seconds; run it in fresh processes, alternating.

``copies``: on a nightly home's newest outputs, the steps that read, hash or copy every text of
the corpus, each the way it was done before and the way it is done now (CPU seconds, the best of
three, and a check that both give the same result): a full garbage collection in a process with
the flow's modules imported, before and after ``gc.freeze``; a row range of
``documents.parquet`` sliced from the whole file vs read by row group; the passages' ``title\\ntext`` keys
from a column Arrow joined vs from the two columns (:class:`funnelrag.content_store.JoinedTexts`); the
same for every document in a shuffled (cluster) order, taken and joined vs hashed in place; the
passage token memo's lookup in the callers' order vs in key order; its values gathered one by one vs copied
by runs; a segment shard's passages written and read back as lz4 Parquet vs uncompressed Arrow
IPC; the page memo sorted by key as a table vs as a key index.

``segment-rows``: the one segmentation (:func:`tasks.corpus.segment.segment_clusters`) of every
Wikispeedia article (from ``FUNNELRAG_DATA_MIRROR``), clustered by Algorithm 1 over its real links
(4K T5 tokens), with the window token counts precomputed as the corpus build has them: CPU seconds
(median of ``--repeat``), µs a passage, and a digest of the rows (equal across code versions).

Run:
``python benchmarks/bench_incremental_stages.py ingest MIRROR --work DIR [--wiki synwiki] [--workers 2]``
``python benchmarks/bench_incremental_stages.py segment --home NIGHTLY_HOME --work DIR [--no-memo] [--memo-home HOME]``
``python benchmarks/bench_incremental_stages.py passage-tokens --home NIGHTLY_HOME --memo-home HOME``
``python benchmarks/bench_incremental_stages.py page-memo --home NIGHTLY_HOME --work DIR``
``python benchmarks/bench_incremental_stages.py days MIRROR --work DIR [--wiki synwiki]``
``python benchmarks/bench_incremental_stages.py memo-writes --home NIGHTLY_HOME --memo-home HOME --work DIR``
``python benchmarks/bench_incremental_stages.py copies --home NIGHTLY_HOME``
``python benchmarks/bench_incremental_stages.py piece-keys --home HOME [--repeats 3]`` (``HOME``: e.g.
``funnelrag build-corpus --config configs/corpus_wikispeedia.yaml --home HOME``)
``python benchmarks/bench_incremental_stages.py read --home NIGHTLY_HOME --table passages|documents --way mapped|buffered``
``FUNNELRAG_DATA_MIRROR=DATA python benchmarks/bench_incremental_stages.py segment-rows [--repeat 3]``
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import json
import os
import pstats
import resource
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_contracts.base import sha256_file  # noqa: E402
from tasks.sources.adds_changes import merge_days, plan_changes  # noqa: E402
from tasks.sources.ingest import IngestConfig, ingest  # noqa: E402


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _newest(home: Path, stage: str) -> Path:
    """The most recently built complete cache entry of ``stage`` in the nightly home ``home``."""
    root = home / "cache" / "corpus" / stage
    return max((d for d in root.iterdir() if (d / "COMPLETE").exists()), key=lambda d: d.stat().st_mtime)


def _measure(step):
    t0, w0, c0 = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
    out = step()
    return out, {"wall_s": round(time.perf_counter() - t0, 1), "workers_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - w0, 1),
                 "coordinator_cpu_s": round(_cpu(resource.RUSAGE_SELF) - c0, 1)}


def bench_ingest(mirror: Path, work: Path, wiki: str, workers: int) -> None:
    full = sorted((mirror / wiki).iterdir())[0]
    base = full / f"{wiki}-{full.name}-pages-articles-multistream.xml.bz2"
    days = sorted((d.name, d / f"{wiki}-{d.name}-pages-meta-hist-incr.xml.bz2")
                  for d in (mirror / "other" / "incr" / wiki).iterdir())
    changes, _ = merge_days(days, work.parent / f"{work.name}.changes.parquet",
                            f"{wiki}-{days[-1][0]}-pages-articles-multistream.xml.bz2")
    report = plan_changes(base, changes)
    print(f"{base.name} + days {[d for d, _ in days]}: {report.replaced} pages replaced, {report.added} added", flush=True)
    cfg = IngestConfig(format="mediawiki")
    shutil.rmtree(work, ignore_errors=True)
    digests = {}

    def run(name, **kw):
        def step():
            with ProcessPoolExecutor(workers) as pool:   # workers' CPU counts once they are reaped
                return ingest([base], work / name, cfg, submit=pool.submit, **kw)
        summary, figures = _measure(step)
        digests[name] = {p.name: sha256_file(p) for p in sorted((work / name).glob("*.parquet"))}
        print(json.dumps({"run": name, **figures, "pieces": summary.pieces, "cleaned_pages": summary.cleaned_pages,
                          "pass2_s": round(summary.pass2_seconds, 1)}), flush=True)

    run("parsed", changes=changes)
    run("base", piece_cache=work / "pieces")
    (work / "memo-only").mkdir()   # the page memo without the base pieces: every piece is parsed
    for memo in (work / "pieces").glob("page-memo-*"):
        shutil.copytree(memo, work / "memo-only" / memo.name)
    run("parsed-with-page-memo", changes=changes, piece_cache=work / "memo-only")
    run("patched", changes=changes, piece_cache=work / "pieces")
    same = digests["parsed"] == digests["parsed-with-page-memo"] == digests["patched"]
    print(json.dumps({"same_artifacts": same}), flush=True)


def bench_segment(home: Path, work: Path, memo: bool, memo_home: Path | None = None) -> None:
    from tasks.corpus.sharded import segment_memo as SM  # noqa: PLC0415 (heavy: after argument parsing)
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from tasks.corpus.sharded.shards import run_segment_sharded  # noqa: PLC0415

    newest = functools.partial(_newest, home)
    cfg = SegmentConfig()
    shutil.rmtree(work, ignore_errors=True)
    cache = work / "segment-shards"
    cache.mkdir(parents=True)
    if memo:   # a nightly home's memo, or the one an earlier run of this step left in its --work
        source = memo_home or home
        shards = source / "segment-shards" if (source / "segment-shards").is_dir() else source / "cache" / "corpus" / "segment-shards"
        # the parts the memo names, under names no shard of this run has (else a shard of the same
        # inputs would reuse its entry whole), and a manifest naming them
        parts = [cache / f"memo-{part.name}" for part, *_ in SM.listed_parts(SM.memo_dir(shards, cfg))]
        for part in parts:
            shutil.copytree(shards / part.name.removeprefix("memo-"), part)
        SM.write_manifest(SM.memo_dir(cache, cfg), parts)
    mirror = os.environ.get("FUNNELRAG_DATA_MIRROR")
    profile = cProfile.Profile()

    def step():
        with ProcessPoolExecutor(2) as pool:   # workers' CPU counts once they are reaped
            profile.enable()
            try:
                return run_segment_sharded(newest("ingest"), newest("tokens"), newest("cluster"), work / "out", cfg,
                                           Path(mirror) if mirror else None, pool.submit, 32_000_000, cache_dir=cache)
            finally:
                profile.disable()
    summary, figures = _measure(step)
    memo_bytes = sum(f.stat().st_size for f in SM.memo_dir(cache, cfg).rglob("*") if f.is_file())
    print(json.dumps({**figures, "memo_bytes": memo_bytes,
                      **{k: summary[k] for k in ("clusters", "clusters_reused", "passages", "partition_seconds",
                                                 "memo_verify_cpu_seconds", "memo_write_cpu_seconds") if k in summary}}))
    pstats.Stats(profile).sort_stats("cumtime").print_stats(14)


def _derived_passage_keys(home: Path, segment: Path):
    """``home``'s newest passages (``doc_id``, ``title``, ``text``, ``n_words``), their ``title\ntext``
    and the token-memo keys the passage token shards derive for them
    (:func:`tasks.corpus.sharded.piece_keys.passage_keys`)."""
    import pyarrow.compute as pc  # noqa: PLC0415

    from data_contracts import corpus as C  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from tasks.corpus.sharded.passage_tokens import document_rows_by_range  # noqa: PLC0415
    from tasks.corpus.sharded.piece_keys import passage_keys  # noqa: PLC0415

    ingest = _newest(home, "ingest")
    passages = C.PASSAGES.read(segment, columns=["doc_id", "title", "text", "n_words"])
    texts = pc.binary_join_element_wise(passages.column("title"), passages.column("text"), "\n")
    doc_rows = document_rows_by_range(segment, ingest, [(0, passages.num_rows)])[0]   # as the passage token shards plan them
    keys = passage_keys(passages, doc_rows, ingest / C.DOCUMENTS.filename, _newest(home, "tokens"),
                        SegmentConfig().passage_words, str(segment))
    return passages, texts, keys


def bench_passage_tokens(home: Path, memo_home: Path, shards: int) -> None:
    """The passage index's token ids of ``home``'s newest passages (title and text, as the index
    stage joins them; keys derived as the shards derive them) taken from ``memo_home``'s passage
    token memo, in ``shards`` consecutive ranges each opening the memo as a passage token shard
    does: CPU seconds (the best of three), the process's peak RSS (the passages' texts included),
    passages reused, and a digest of the ids (equal across code versions)."""
    import hashlib  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import memo_token_ids, open_token_memo, token_memo_dir  # noqa: PLC0415

    _, texts, keys = _derived_passage_keys(home, _newest(home, "segment"))
    cfg = BM25Config()
    memo_dir = token_memo_dir(memo_home / "cache" / "corpus", "passages", cfg)
    bounds = np.linspace(0, len(texts), shards + 1).astype(np.int64)

    def lookups():
        return [memo_token_ids(texts[a:b], cfg, *open_token_memo(memo_dir), keys=keys[a:b])
                for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    seconds, out = _best(lookups)
    digest = hashlib.sha256()
    for found in out:
        digest.update(found.tokens.ids.tobytes())
    print(json.dumps({"cpu_s": seconds, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "passages": len(texts), "shards": shards, "reused": sum(f.reused for f in out),
                      "ids": sum(int(f.tokens.ids.size) for f in out), "ids_sha256": digest.hexdigest()[:16]}))


def bench_index(dump: Path, work: Path) -> None:
    """``index`` (module docstring): the base dump's index read twice vs its kept summary."""
    from tasks.sources.ingest.multistream import index_first_ids, index_offsets, index_path, index_summary  # noqa: PLC0415

    index = index_path(dump)
    cache = Path(work) / "index-cache"
    shutil.rmtree(cache, ignore_errors=True)
    before, (offsets, first) = _best(lambda: (index_offsets(index), index_first_ids(index)))
    index_summary(index, cache)   # what the first night keeps
    now, summary = _best(lambda: index_summary(index, cache))
    print(json.dumps({"index": index.name, "index_bytes": index.stat().st_size, "streams": len(offsets),
                      "before_cpu_s": before, "now_cpu_s": now,
                      "same_result": summary.offsets == offsets and summary.first_ids == first}), flush=True)
    shutil.rmtree(cache, ignore_errors=True)


def bench_page_memo(home: Path, work: Path) -> None:
    """Pass 1's page memo written from the parts kept in ``home``'s piece cache (one a piece, what
    a full build hands to :meth:`tasks.sources.ingest.page_memo.PageMemo.write`) into ``work``:
    user and system CPU seconds of each of three writes, and the keys written."""
    from tasks.sources.ingest.page_memo import PageMemo  # noqa: PLC0415 (heavy: after argument parsing)

    parts = sorted((home / "cache" / "corpus" / "ingest-pieces").glob("*/page-memo-part.arrow"))
    times, n = [], 0
    for _ in range(3):
        shutil.rmtree(work, ignore_errors=True)
        before = resource.getrusage(resource.RUSAGE_SELF)
        n = PageMemo.write(work, parts)
        after = resource.getrusage(resource.RUSAGE_SELF)
        times.append([round(after.ru_utime - before.ru_utime, 3), round(after.ru_stime - before.ru_stime, 3)])
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"parts": len(parts), "bytes": sum(p.stat().st_size for p in parts), "keys": n,
                      "user_sys_s": times}))


def bench_days(mirror: Path, work: Path, wiki: str) -> None:
    days = [(d.name, next(d.glob("*-pages-meta-hist-incr.xml*")))
            for d in sorted((mirror / "other" / "incr" / wiki).iterdir()) if d.is_dir()]
    memo = work / "day-memo"
    shutil.rmtree(memo, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    t = time.process_time()
    parsed, _ = merge_days(days, work / "parsed.changes.parquet", "merged.xml.bz2")
    t_parsed = time.process_time() - t
    merge_days(days, work / "first.changes.parquet", "merged.xml.bz2", memo_dir=memo)   # the nights that first applied each day
    t = time.process_time()
    kept, counts = merge_days(days, work / "kept.changes.parquet", "merged.xml.bz2", memo_dir=memo)
    t_memo = time.process_time() - t
    if kept.digest() != parsed.digest() or not all(c.from_memo for c in counts):
        raise SystemExit("the day memo gave other revisions than parsing")
    print(json.dumps({"days": len(days), "revisions": len(parsed), "parsed_cpu_s": round(t_parsed, 2),
                      "from_memo_cpu_s": round(t_memo, 2)}))


def bench_memo_writes(home: Path, memo_home: Path, work: Path) -> None:
    """The passage token memo of ``home``'s newest passages written over a copy of ``memo_home``'s:
    user and system CPU seconds (best of 3), the files written and the digest of the ids the memo
    gives; and the stale share an extended
    segmentation memo would have (``memo_home``'s memo against ``home``'s newest shard parts)."""
    import hashlib  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from tasks.corpus.sharded import segment_memo as SM  # noqa: PLC0415
    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import memo_token_ids, open_token_memo, token_memo_dir, write_token_memo  # noqa: PLC0415

    root, old_root = home / "cache" / "corpus", memo_home / "cache" / "corpus"
    segment = _newest(home, "segment")
    passages, texts, keys = _derived_passage_keys(home, segment)   # the keys the passage token shards derive
    cfg = BM25Config()
    old_tokens = token_memo_dir(old_root, "passages", cfg)
    found = memo_token_ids(texts, cfg, *open_token_memo(old_tokens), keys=keys)

    def fresh(src: Path, name: str) -> Path:
        dst = work / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
        return dst

    report = {"passages": len(texts), "passages_from_memo": found.reused}
    best = None
    for _ in range(3):
        target = fresh(old_tokens, "tokens")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        write_token_memo(target, [found])
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        got = (round(r1.ru_utime - r0.ru_utime, 3), round(r1.ru_stime - r0.ru_stime, 3))
        best = got if best is None or sum(got) < sum(best) else best
    again = memo_token_ids(texts, cfg, *open_token_memo(work / "tokens"), keys=keys)
    report["rewritten"] = {"user_sys_s": best, "files": sorted(p.name for p in (work / "tokens").iterdir()),
                           "ids_sha256": hashlib.sha256(again.tokens.ids.tobytes()).hexdigest()[:16]}
    # tonight's segment shard parts: the entries written with the newest segment output
    parts = [d for d in (root / "segment-shards").iterdir()
             if SM.has_part(d) and abs(d.stat().st_mtime - segment.stat().st_mtime) < 600]
    kept = SM.SegmentMemo.open(SM.memo_dir(old_root / "segment-shards", SegmentConfig()))
    keys = np.concatenate([np.load(p / SM.KEYS_FILE) for p in parts])
    rows = kept.lookup(keys)
    new = np.unique(keys[rows < 0], axis=0).shape[0]
    live = np.unique(rows[rows >= 0]).size + new
    report["segment_memo"] = {"parts": len(parts), "memo_clusters": len(kept), "tonight_clusters": live,
                              "new_clusters": new, "stale_share_if_extended": round(1 - live / (len(kept) + new), 3)}
    print(json.dumps(report, indent=1))


def _best(fn, repeat: int = 3) -> tuple[float, object]:
    """The least CPU seconds (this process) of ``repeat`` calls of ``fn``, and its last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return round(best, 3), out


def bench_copies(home: Path) -> None:
    import gc  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.ipc as ipc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    import flows.corpus_build  # noqa: F401, PLC0415 (what a shard worker process holds)
    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from funnelrag.content_store import JoinedTexts, arrow_text_keys  # noqa: PLC0415
    from tasks.corpus.sharded.shards import read_rows  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import TERMS_FIELD, open_token_memo, token_memo_dir  # noqa: PLC0415

    root = home / "cache" / "corpus"
    newest = functools.partial(_newest, home)
    rows = []

    def row(step, before, now, same):
        rows.append({"step": step, "before_cpu_s": before, "now_cpu_s": now, "same_result": bool(same)})
        print(json.dumps(rows[-1]), flush=True)

    objects = len(gc.get_objects())
    before, _ = _best(gc.collect)
    gc.freeze()
    now, _ = _best(gc.collect)
    gc.unfreeze()
    row(f"full garbage collection ({objects:,} objects, flow modules imported)", before, now, True)

    ingest = newest("ingest")
    n = min(20_000, pq.read_metadata(ingest / "documents.parquet").num_rows)
    cols = ["doc_id", "title", "text"]
    before, old = _best(lambda: pq.read_table(ingest / "documents.parquet", columns=cols).slice(0, n))
    now, new = _best(lambda: read_rows(ingest / "documents.parquet", 0, n, cols))
    row(f"documents in rows 0..{n - 1:,} read (the whole file sliced before)", before, now, old.equals(new))

    # partition_range: a range's documents split into 6 shards (rows dealt out by a seeded draw)
    shard = np.random.default_rng(0).integers(0, 6, new.num_rows)
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    groups = list(zip([0, *cuts.tolist()], [*cuts.tolist(), shard.size]))
    def one_take():
        by_shard = new.take(pa.array(order))
        return [by_shard.slice(a, b - a) for a, b in groups]

    def one_chunk():   # partition_range: the range as one chunk, then a take a shard
        whole = new.combine_chunks()
        return [whole.take(pa.array(order[a:b])) for a, b in groups]
    before, old = _best(one_take)
    now, parts = _best(one_chunk)
    row(f"documents 0..{n - 1:,} split into 6 shards, warm (one take, then slices before; one chunk, then a take "
        "a shard)", before, now, all(x.equals(y) for x, y in zip(old, parts)))

    passages = pq.read_table(newest("segment") / "passages.parquet", columns=["title", "text"])
    before, old = _best(lambda: arrow_text_keys(pc.binary_join_element_wise(passages.column("title"),
                                                                            passages.column("text"), "\n")))
    now, new = _best(lambda: JoinedTexts(passages.column("title"), passages.column("text")).keys())
    row(f"text keys of {passages.num_rows:,} passages' title\\ntext (joined by Arrow before; hashed from the columns)",
        before, now, np.array_equal(old, new))

    docs = pq.read_table(ingest / "documents.parquet", columns=["title", "text"])
    in_clusters = np.random.default_rng(0).permutation(docs.num_rows)     # the members' order: not the documents'
    before, old_pieces = _best(lambda: arrow_text_keys(pc.binary_join_element_wise(
        docs.column("title").take(pa.array(in_clusters)), docs.column("text").take(pa.array(in_clusters)), "\n")))
    now, new_pieces = _best(lambda: JoinedTexts(docs.column("title"), docs.column("text"), "\n", in_clusters).keys())
    row(f"text keys of {docs.num_rows:,} cluster members' title\\ntext in cluster order (taken and joined before)",
        before, now, np.array_equal(old_pieces, new_pieces))

    memo, _ = open_token_memo(token_memo_dir(root, "passages", BM25Config()))
    if memo is not None:
        def lookup_in_callers_order():
            high, low = np.asarray(memo.keys[:, 0]), np.asarray(memo.keys[:, 1])
            left = np.searchsorted(high, new[:, 0], side="left")
            found = np.full(len(new), -1, np.int64)
            one = np.flatnonzero(np.searchsorted(high, new[:, 0], side="right") == left + 1)
            match = low[left[one]] == new[one, 1]
            found[one[match]] = left[one[match]]
            return found
        before, old_rows = _best(lookup_in_callers_order)
        now, new_rows = _best(lambda: memo.lookup(new))
        row(f"token memo lookup of {len(new):,} passages (searched in the callers' order before, in key order now)",
            before, now, np.array_equal(old_rows, new_rows))

    memo, _ = open_token_memo(token_memo_dir(root, "passages", BM25Config()))
    if memo is not None:
        found = memo.lookup(new)
        hit = found[found >= 0]
        bounds, data = memo.fields[TERMS_FIELD]
        picked = np.asarray(bounds[hit])

        def gather():
            lengths = picked[:, 1] - picked[:, 0]
            first = np.repeat(picked[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
            return np.asarray(data[first + np.arange(int(lengths.sum()), dtype=np.int64)])
        before, old = _best(gather)
        now, (_, new_values) = _best(lambda: memo.take(TERMS_FIELD, hit))
        row(f"token memo values of {hit.size:,} passages", before, now, np.array_equal(old, new_values))

    from tasks.corpus.sharded import segment_memo as SM  # noqa: PLC0415

    shard = max((root / "segment-shards").glob(f"*/{SM.PASSAGES_FILE}"), key=lambda f: f.stat().st_size,
                default=None)
    if shard is not None:   # a segment shard's rows: written by a worker, read back by the coordinator
        import tempfile  # noqa: PLC0415

        rows_table = SM.read_rows(shard).combine_chunks()
        with tempfile.TemporaryDirectory() as tmp:
            def parquet_lz4():
                options = {"compression": "lz4", "use_dictionary": False, "write_statistics": False}
                pq.write_table(rows_table, Path(tmp) / "p.parquet", **options)
                return pq.read_table(Path(tmp) / "p.parquet", memory_map=True)

            def arrow_ipc():
                SM.write_rows(Path(tmp) / "p.arrow", rows_table)
                return SM.read_rows(Path(tmp) / "p.arrow")
            before, old = _best(parquet_lz4)
            now, new = _best(arrow_ipc)
        row(f"segment shard of {rows_table.num_rows:,} passages written and read back (lz4 Parquet → IPC)", before, now,
            old.equals(new))

    memos = sorted((root / "ingest-pieces").glob("page-memo-*/pages.arrow"))
    if memos:
        table = ipc.open_file(pa.memory_map(str(memos[0]))).read_all()
        before, old = _best(lambda: table.sort_by([("hi", "ascending"), ("lo", "ascending")]))
        now, order = _best(lambda: np.lexsort((table.column("lo").to_numpy(), table.column("hi").to_numpy())))
        row(f"page memo of {table.num_rows:,} pages sorted by key", before, now,
            old.column("hi").equals(table.column("hi").take(pa.array(order))))


def bench_joined_keys(home: Path, texts: str, way: str) -> None:
    """One call, as a night makes it in a process: the token-memo keys of the newest passages'
    (``texts="passages"``) or of every document's (``"members"``, in a seeded shuffled order as
    cluster members come) ``title\\ntext``, joined by Arrow first (``way="join"``, the code before) or
    hashed from the two columns (``"columns"``, :class:`funnelrag.content_store.JoinedTexts`). Prints user
    and system CPU seconds and the peak RSS the call added; run it in fresh processes, alternating."""
    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from funnelrag.content_store import JoinedTexts, arrow_text_keys  # noqa: PLC0415

    stage, name = ("segment", "passages.parquet") if texts == "passages" else ("ingest", "documents.parquet")
    newest = _newest(home, stage)
    table = pq.read_table(newest / name, columns=["title", "text"])
    order = None if texts == "passages" else np.random.default_rng(0).permutation(table.num_rows)
    before = resource.getrusage(resource.RUSAGE_SELF)
    if way == "join":
        title, text = table.column("title"), table.column("text")
        if order is not None:
            title, text = title.take(pa.array(order)), text.take(pa.array(order))
        keys = arrow_text_keys(pc.binary_join_element_wise(title, text, "\n"))
    else:
        keys = JoinedTexts(table.column("title"), table.column("text"), "\n", order).keys()
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"texts": texts, "way": way, "rows": len(keys), "user_s": round(after.ru_utime - before.ru_utime, 3),
                      "sys_s": round(after.ru_stime - before.ru_stime, 3),
                      "peak_rss_added_mb": round((after.ru_maxrss - before.ru_maxrss) / 1024)}))



def bench_read(home: Path, table: str, way: str) -> None:
    """One read of the newest ``passages.parquet`` or ``documents.parquet`` of ``home`` (the id,
    title and text columns), memory-mapped (``way="mapped"``: the compressed pages decoded from the
    page cache in place) or read into fresh buffers first (``"buffered"``, the code before). Prints
    user and system CPU seconds; run it in fresh processes, alternating."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    stage, name, key = (("segment", "passages.parquet", "passage_id") if table == "passages"
                        else ("ingest", "documents.parquet", "doc_id"))
    newest = _newest(home, stage)
    before = resource.getrusage(resource.RUSAGE_SELF)
    got = pq.read_table(newest / name, columns=[key, "title", "text"], memory_map=way == "mapped")
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"table": table, "way": way, "rows": got.num_rows, "user_s": round(after.ru_utime - before.ru_utime, 3),
                      "sys_s": round(after.ru_stime - before.ru_stime, 3)}))

def bench_piece_keys(home: Path, repeats: int, tokens_per_shard: int) -> None:
    """``piece-keys`` (module docstring): the keys of one passage and one cluster token shard, hashed vs derived."""
    import statistics  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415

    from data_contracts import corpus as C  # noqa: PLC0415
    from funnelrag.content_store import JoinedTexts  # noqa: PLC0415
    from tasks.corpus.sharded.cluster_index import cluster_pieces  # noqa: PLC0415
    from tasks.corpus.sharded.passage_tokens import document_rows_by_range  # noqa: PLC0415
    from tasks.corpus.sharded.piece_keys import member_keys, passage_keys  # noqa: PLC0415
    from tasks.corpus.sharded.shards import document_text_keys  # noqa: PLC0415
    from tasks.corpus.sharded.shards import (ROW, passage_row_ranges, read_cluster_members, read_cluster_ranges,  # noqa: PLC0415
                                             read_rows)

    ingest, tokens, cluster, segment = (_newest(home, s) for s in ("ingest", "tokens", "cluster", "segment"))
    documents = ingest / C.DOCUMENTS.filename
    (plo, phi), = passage_row_ranges(segment, cluster, tokens_per_shard)[:1]
    passages = read_rows(segment / C.PASSAGES.filename, plo, phi, ["doc_id", "title", "text", "n_words"])
    doc_rows = document_rows_by_range(segment, ingest, [(plo, phi)])[0]
    (clo, chi), = read_cluster_ranges(cluster, tokens_per_shard)[:1]
    members = read_cluster_members(cluster, clo, chi)
    docs = C.DOCUMENTS.read(ingest, columns=["doc_id", "title", "text"])   # the shard's partition: here every document
    docs = docs.append_column(ROW, pa.array(np.arange(docs.num_rows, dtype=np.int64)))
    docs = docs.take(pa.array(np.flatnonzero(np.isin(docs["doc_id"].to_numpy(), members["doc_id"].to_numpy()))))
    _, pieces, _ = cluster_pieces(docs, members)

    def derived_members(tokens_dir):
        keys = document_text_keys(tokens_dir, docs.column(ROW).to_numpy(), lambda: docs.column("text"))
        return member_keys(docs.column("title"), keys)[pieces.rows]
    steps = {
        "passages hashed": lambda: JoinedTexts(passages.column("title"), passages.column("text"), "\n").keys(),
        "passages derived": lambda: passage_keys(passages, doc_rows, documents, tokens, 100, "bench"),
        "passages derived, its extra costs: the plan's document rows": lambda: document_rows_by_range(segment, ingest, [(plo, phi)]),
        "passages derived, its extra costs: doc_id and n_words read": lambda: read_rows(
            segment / C.PASSAGES.filename, plo, phi, ["doc_id", "n_words"]),
        "members hashed": pieces.keys,
        "members derived": lambda: derived_members(tokens),
    }
    if not (tokens / "text_keys.npy").is_file():
        raise SystemExit(f"{tokens}: no kept text keys (a one-process tokens stage): build the home with the sharded stages")
    same = (np.array_equal(steps["passages derived"](), passage_keys(passages, doc_rows, documents, None, 100, "bench"))
            and np.array_equal(steps["members derived"](), derived_members(None)))
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            c0 = time.process_time()
            step()
            times[name].append(time.process_time() - c0)
    sizes = {"passages": passages.num_rows, "members": len(pieces)}
    out = {"passages": sizes["passages"], "members": sizes["members"], "derived_same_kept_or_hashed": same}
    for name, got in times.items():
        median = statistics.median(got)
        out[f"{name} cpu_s"] = round(median, 4)
        out[f"{name} cpu_s_per_million"] = round(median / sizes[name.split()[0].rstrip(",")] * 1e6, 3)
        out[f"{name} all_s"] = [round(t, 4) for t in got]
    print(json.dumps(out, indent=1))

def bench_segment_rows(mirror: Path, repeat: int) -> None:
    """``segment-rows`` (module docstring): ``segment_clusters`` on the clustered Wikispeedia articles."""
    import hashlib  # noqa: PLC0415
    import tarfile  # noqa: PLC0415
    from urllib.parse import unquote  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415

    from funnelrag.datasets import resolve  # noqa: PLC0415
    from tasks.corpus.clustering import ClusteringConfig, cluster_documents  # noqa: PLC0415
    from tasks.corpus.graph import build_graph, graph_metrics  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig, count_window_tokens, segment_clusters  # noqa: PLC0415
    from tasks.corpus.tokenize import load_token_counter  # noqa: PLC0415
    from tasks.sources.ingest.wikispeedia import strip_header_footer  # noqa: PLC0415

    texts: dict[str, str] = {}
    with tarfile.open(resolve("wikispeedia-articles", mirror)) as tf:
        for member in tf:
            if member.isfile() and member.name.startswith("plaintext_articles/") and member.name.endswith(".txt"):
                texts[Path(member.name).stem] = strip_header_footer(tf.extractfile(member).read().decode("utf-8"))
    names = sorted(texts)   # URL-quoted, as links.tsv names them; doc id = rank
    row = {t: i for i, t in enumerate(names)}
    with tarfile.open(resolve("wikispeedia-graph", mirror)) as tf:
        raw = tf.extractfile("wikispeedia_paths-and-graph/links.tsv").read().decode("utf-8")
    links = [(row[a], row[b]) for a, b in (line.split("\t") for line in raw.splitlines() if line and not line.startswith("#"))
             if a in row and b in row]
    titles = [unquote(t).replace("_", " ") for t in names]
    texts_of = [texts[t] for t in names]
    cfg = SegmentConfig()
    counter = load_token_counter(cfg.tokenizer, mirror)
    wt = count_window_tokens(texts_of, cfg, counter)
    graph = build_graph(np.array([a for a, _ in links]), np.array([b for _, b in links]), len(names))
    clustering = cluster_documents(graph, graph_metrics(graph), wt.article_tokens(), ClusteringConfig())
    clusters = []
    for c in range(clustering.n_clusters):
        rows = clustering.members[clustering.indptr[c]:clustering.indptr[c + 1]].tolist()
        clusters.append((rows[0], np.array(rows, np.int64), [titles[r] for r in rows], [texts_of[r] for r in rows],
                         [wt.of(r) for r in rows]))
    seconds = []
    for _ in range(repeat):
        t = time.process_time()
        units, passages, _ = segment_clusters(clusters, cfg, counter)
        seconds.append(time.process_time() - t)
    digest = hashlib.sha256()
    for table in (units, passages):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        digest.update(sink.getvalue())
    cpu_s = sorted(seconds)[len(seconds) // 2]
    print(json.dumps({"documents": len(names), "clusters": len(clusters), "units": units.num_rows,
                      "passages": passages.num_rows, "cpu_s": round(cpu_s, 3), "runs_cpu_s": [round(x, 3) for x in seconds],
                      "us_a_passage": round(cpu_s / max(passages.num_rows, 1) * 1e6, 2),
                      "rows_sha256": digest.hexdigest()[:16]}))


def bench_vocabulary_merge(dirs: list[Path], as_lists: bool) -> None:
    """``vocabulary-merge`` (module docstring)."""
    import numpy as np  # noqa: PLC0415 (heavy: after argument parsing)
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.index import BM25Config, TokenIds  # noqa: PLC0415
    from tasks.corpus.sharded.cluster_index import VocabularyMerge, index_from_token_shards  # noqa: PLC0415

    n_docs = sum(int(np.load(d / TokenIds.OFFSETS_FILE, mmap_mode="r").size - 1) for d in dirs)
    c0 = time.process_time()
    merge = VocabularyMerge(sorted_terms=BM25Config().stemmer is not None)
    for d in dirs:
        terms = pq.read_table(d / TokenIds.TERMS_FILE).column("term").combine_chunks()
        merge.add(terms.to_pylist() if as_lists else terms)
    c1 = time.process_time()
    index_from_token_shards(dirs, [str(i) for i in range(n_docs)], merge, BM25Config())
    c2 = time.process_time()
    print(json.dumps({"shards": len(dirs), "texts": n_docs, "terms": len(merge.vocab),
                      "merge_cpu_s": round(c1 - c0, 3), "index_cpu_s": round(c2 - c1, 3)}))


def bench_shard_stats(work: Path, n_shards: int, n_terms: int, vocab: int, repeat: int) -> None:
    """``shard-stats`` (module docstring)."""
    import numpy as np  # noqa: PLC0415 (heavy: after argument parsing)
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from tasks.corpus.index import TokenIds  # noqa: PLC0415
    from tasks.corpus.sharded.cluster_index import DF_FILE  # noqa: PLC0415
    from tasks.corpus.sharded.sharded_index import merge_token_shard_stats  # noqa: PLC0415

    rng = np.random.default_rng(0)
    names = pa.array([f"w{i:07x}" for i in range(vocab)], pa.string())
    dirs, rows = [], 0
    for s in range(n_shards):
        ids = np.unique(np.minimum(rng.zipf(1.2, n_terms * 4), vocab) - 1)
        ids = rng.permutation(ids)[:n_terms]
        d = work / f"shard-{s:04d}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"term": names.take(pa.array(ids))}), d / TokenIds.TERMS_FILE)
        np.save(d / DF_FILE, rng.integers(1, 100, ids.size).astype(np.int64))
        np.save(d / TokenIds.OFFSETS_FILE, np.arange(0, 1001, 1, dtype=np.int64))
        dirs.append(d)
        rows += ids.size
    seconds, out = [], None
    for k in range(repeat):
        t = time.process_time()
        _, _, path, _ = merge_token_shard_stats(dirs, work / f"out-{k}")
        seconds.append(time.process_time() - t)
        out = path
    print(json.dumps({"shards": n_shards, "rows_in": rows, "terms_out": pq.read_metadata(out).num_rows,
                      "cpu_s": round(min(seconds), 3), "runs_cpu_s": [round(x, 3) for x in seconds],
                      "sha256": sha256_file(out)[:16]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    a = sub.add_parser("ingest")
    a.add_argument("mirror", type=Path)
    a.add_argument("--work", type=Path, required=True)
    a.add_argument("--wiki", default="synwiki")
    a.add_argument("--workers", type=int, default=2)
    b = sub.add_parser("segment")
    b.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    b.add_argument("--work", type=Path, required=True)
    b.add_argument("--no-memo", action="store_true")
    b.add_argument("--memo-home", type=Path, help="take the segmentation memo from this home (the night before's), "
                   "or from the --work directory of this step run on it (with --no-memo: the memo it wrote)")
    f = sub.add_parser("page-memo")
    f.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    f.add_argument("--work", type=Path, required=True)
    e = sub.add_parser("passage-tokens")
    e.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    e.add_argument("--memo-home", type=Path, required=True, help="the home of the night before (its passage token memo)")
    e.add_argument("--shards", type=int, default=6, help="consecutive ranges, each opening the memo as a token shard does")
    c = sub.add_parser("days")
    c.add_argument("mirror", type=Path)
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--wiki", default="synwiki")
    g = sub.add_parser("memo-writes")
    g.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    g.add_argument("--memo-home", type=Path, required=True, help="the home of the night before (its memos)")
    g.add_argument("--work", type=Path, required=True)
    h = sub.add_parser("index")
    h.add_argument("dump", type=Path, help="a multistream dump with its index beside it")
    h.add_argument("--work", type=Path, required=True)
    j = sub.add_parser("joined-keys")
    j.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    j.add_argument("--texts", choices=["passages", "members"], required=True)
    j.add_argument("--way", choices=["join", "columns"], required=True)
    r = sub.add_parser("read")
    r.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    r.add_argument("--table", choices=["passages", "documents"], required=True)
    r.add_argument("--way", choices=["mapped", "buffered"], required=True)
    k = sub.add_parser("piece-keys")
    k.add_argument("--home", type=Path, required=True, help="a home with a corpus build (e.g. Wikispeedia's)")
    k.add_argument("--repeats", type=int, default=3)
    k.add_argument("--tokens-per-shard", type=int, default=32_000_000, help="the build's (runner.tokens_per_shard)")
    s = sub.add_parser("segment-rows")
    s.add_argument("--repeat", type=int, default=3, help="calls timed (their median is printed)")
    v = sub.add_parser("vocabulary-merge")
    v.add_argument("dirs", type=Path, nargs="+", help="a build's cluster-tokens/<key> entries (any order: only timed)")
    v.add_argument("--as-lists", action="store_true", help="each shard's vocabulary as a Python list")
    t = sub.add_parser("shard-stats")
    t.add_argument("--work", type=Path, required=True)
    t.add_argument("--shards", type=int, default=140, help="passage token shards (the full English dump: ~140)")
    t.add_argument("--terms", type=int, default=400_000, help="distinct terms a shard")
    t.add_argument("--vocab", type=int, default=8_000_000, help="terms the shards draw from")
    t.add_argument("--repeat", type=int, default=1)
    d = sub.add_parser("copies")
    d.add_argument("--home", type=Path, required=True, help="a nightly home (the bench's <home>/nightly)")
    args = ap.parse_args()
    if args.step == "ingest":
        bench_ingest(args.mirror, args.work, args.wiki, args.workers)
    elif args.step == "segment":
        bench_segment(args.home, args.work, not args.no_memo, args.memo_home)
    elif args.step == "page-memo":
        bench_page_memo(args.home, args.work)
    elif args.step == "joined-keys":
        bench_joined_keys(args.home, args.texts, args.way)
    elif args.step == "passage-tokens":
        bench_passage_tokens(args.home, args.memo_home, args.shards)
    elif args.step == "memo-writes":
        bench_memo_writes(args.home, args.memo_home, args.work)
    elif args.step == "index":
        bench_index(args.dump, args.work)
    elif args.step == "copies":
        bench_copies(args.home)
    elif args.step == "piece-keys":
        bench_piece_keys(args.home, args.repeats, args.tokens_per_shard)
    elif args.step == "vocabulary-merge":
        bench_vocabulary_merge(args.dirs, args.as_lists)
    elif args.step == "shard-stats":
        bench_shard_stats(args.work, args.shards, args.terms, args.vocab, args.repeat)
    elif args.step == "read":
        bench_read(args.home, args.table, args.way)
    elif args.step == "segment-rows":
        mirror = os.environ.get("FUNNELRAG_DATA_MIRROR")
        if not mirror:
            raise SystemExit("segment-rows reads Wikispeedia from FUNNELRAG_DATA_MIRROR; set it to the data mirror")
        bench_segment_rows(Path(mirror), args.repeat)
    else:
        bench_days(args.mirror, args.work, args.wiki)


if __name__ == "__main__":
    main()
