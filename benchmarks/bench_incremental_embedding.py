"""Incremental embedding after a real night: how much of the corpus ``embed-corpus`` embeds after
one adds-changes night, how long that takes beside a full embedding, and whether the reused plus
new vectors equal a from-scratch embedding of the night's corpus.

On a synthetic mirror (:func:`benchmarks.bench_id_survival.mirror_nights`: night 1 builds the full
dump, night 2 applies one day of ~1% edits and new pages, both with ``corpus-build-nightly``):

1. ``embed-corpus`` (MiniLM, CPU fp32) over night 1's version (run once both nights are built, so
   the count below comes first; the store holds the same vectors either way): every passage embedded; its rate
   (passages/s) projects a full embedding's time;
2. ``embed-corpus`` over night 2's version in the same home: only texts the vector store lacks are
   embedded (``embedded``, ``reused``, ``share`` of the passages, ``seconds``);
3. a from-scratch embedding of night 2's passages (no store; ``--check-rows``: of that many drawn at
   random): its time, and the max abs difference between its vectors and the published index of
   step 2, row by row.

``--count-only`` skips the embedding: it counts the distinct passage texts of night 2 that night 1
did not hold (what step 2 would embed, since the store then holds exactly night 1's texts), so the
share is measured at sizes whose full embedding does not fit the box. ``--versions BEFORE AFTER``
gives the same count for two published version directories built elsewhere (e.g. two nights of
``benchmarks/bench_nightly_mirror.py``'s home, ``<home>/nightly/stores/corpus/synwiki/versions/<id>``),
building nothing (``OUT_DIR`` is not written); with ``--rate`` (passages per second of a full
embedding measured elsewhere) it adds the night's and the full embedding's projected seconds.

``--prune-only`` skips the embedding too and times ``embed-corpus``'s pruning step
(:func:`tasks.funnel.embeddings.prune_vector_store`) over the home's two kept versions, with a
vector store holding a random unit vector for every kept text: ``first`` with no version's text
keys kept yet (every kept version's passages read and hashed, as every night did before the keys
were kept), then ``later`` (what each later night costs: the kept keys read and verified).

Run: ``python benchmarks/bench_incremental_embedding.py OUT_DIR [--pages 3000] [--seed 0]
[--workers 2] [--threads 1] [--count-only | --prune-only] [--check-rows N] [--out results.json]``;
``python benchmarks/bench_incremental_embedding.py OUT_DIR --versions BEFORE AFTER [--rate 6.8]``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # `python benchmarks/<script>.py` from anywhere

from benchmarks.bench_id_survival import WIKI, mirror_nights, night_arguments  # noqa: E402


def new_texts(before: Path, after: Path) -> dict[str, int]:
    """Passages of ``after`` and the distinct texts (as embedded) it holds that ``before`` does not."""
    from data_contracts.corpus import PASSAGES
    from tasks.funnel.embeddings import passage_texts
    from funnelrag.content_store import distinct_keys, join_keys, key_order, text_keys

    old, new = (text_keys(passage_texts(PASSAGES.read(v, columns=["title", "text"]))) for v in (before, after))
    distinct = distinct_keys(new)[0]
    found = join_keys(old[key_order(old)], distinct) >= 0
    return {"passages": int(new.shape[0]), "distinct_texts": int(distinct.shape[0]), "new_texts": int((~found).sum())}


def embed(ws, version: str, threads: int) -> dict:
    """``embed-corpus`` of corpus version ``version`` with MiniLM on the CPU; its figures and wall seconds."""
    from flows.embed import EmbedConfig, embed_flow
    from funnelrag.datasets import default_mirror

    cfg = EmbedConfig.model_validate({"corpus": WIKI, "corpus_version": version, "preranker": "minilm",
                                      "torch_threads": threads, "device": "cpu",
                                      "workspace": {"home": str(ws.home), "data_mirror": default_mirror()}})
    t0 = time.perf_counter()
    info = embed_flow(cfg)
    return {**{k: info[k] for k in ("passages", "embedded", "reused", "discarded_segments", "seconds",
                                    "passages_per_s", "vectors_pruned", "compaction") if k in info},
            "flow_seconds": time.perf_counter() - t0}


def from_scratch(ws, version: str, threads: int, check_rows: int | None = None) -> dict:
    """Night 2's passages (all, or ``check_rows`` of them drawn at random, seed 0) embedded with no
    store, against the rows of the index ``embed-corpus`` published."""
    from flows.embed import corpus_digest
    from funnelrag.threads import torch_threads
    from tasks.corpus.published import open_corpus
    from tasks.evaluate.models import load_preranker_ref
    from tasks.funnel.embeddings import build_embedding_index, model_version, open_embedding_index, store_root

    corpus = open_corpus(ws, WIKI, version)
    n = corpus.passages.num_rows
    rows = np.arange(n) if not check_rows or check_rows >= n else np.sort(
        np.random.default_rng(0).choice(n, check_rows, replace=False))
    with torch_threads(threads):
        model, tok, _ = load_preranker_ref("minilm", ws.home / "bench-models")
        fresh, info = build_embedding_index(corpus.passages.take(rows), model, tok, corpus_digest(corpus), store=None)
    published = open_embedding_index(store_root(ws.home / "stores", WIKI, model_version(model)), corpus_digest(corpus),
                                      model_version(model))
    assert published.passage_ids_at(rows) == fresh.passage_ids, "the published index is not in corpus order"
    return {"rows": int(rows.size), "of": n, "embedded": info["embedded"], "seconds": info["seconds"],
            "passages_per_s": info["passages_per_s"],
            "max_abs_difference": float(np.abs(published.gather(rows) - fresh.vectors).max())}


def prune_timing(ws, dim: int = 384, repeats: int = 3) -> dict:
    """Seconds of the pruning step over the home's kept corpus versions: the first run (no text
    keys kept: every kept version read and hashed) and the best of ``repeats`` later runs (the
    kept keys read), in a scratch keys cache under ``ws.cache_dir``; a store of random unit
    vectors, one per kept text (nothing dead, so nothing is rewritten)."""
    import shutil

    from tasks.funnel.embeddings import prune_vector_store, retained_text_keys
    from funnelrag.content_store import distinct_keys
    from tasks.funnel.vector_store import VectorStore

    stores, scratch = ws.home / "stores", ws.cache_dir / "bench-prune"
    shutil.rmtree(scratch, ignore_errors=True)
    live = distinct_keys(retained_text_keys(stores, scratch / "fill"))[0]
    vectors = np.random.default_rng(0).standard_normal((live.shape[0], dim)).astype(np.float32)
    store = VectorStore(scratch / "store", dim)
    store.add(live, vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    first = prune_vector_store(store, stores, scratch / "keys", 0.2)
    later = [prune_vector_store(store, stores, scratch / "keys", 0.2) for _ in range(repeats)]
    shutil.rmtree(scratch, ignore_errors=True)
    return {"kept_texts": int(live.shape[0]), "rewritten": first.rewritten, "first_seconds": first.seconds,
            "later_seconds": min(r.seconds for r in later)}


def main() -> None:
    ap = night_arguments(__doc__)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of every embedding")
    ap.add_argument("--count-only", action="store_true", help="count the texts to embed; embed nothing")
    ap.add_argument("--prune-only", action="store_true", help="time the pruning step over the kept versions; "
                    "embed nothing")
    ap.add_argument("--check-rows", type=int, help="compare this many random rows with a from-scratch embedding "
                    "(default: every row)")
    ap.add_argument("--versions", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                    help="count the texts to embed of two published version directories; build and embed nothing")
    ap.add_argument("--rate", type=float, help="with --versions: passages per second of a full embedding, "
                    "measured elsewhere, for the projected seconds")
    args = ap.parse_args()
    if args.versions:
        counts = new_texts(*args.versions)
        out = {**counts, "share": counts["new_texts"] / counts["passages"]}
        if args.rate:
            out.update(rate=args.rate, projected_night_seconds=counts["new_texts"] / args.rate,
                       projected_full_seconds=counts["passages"] / args.rate)
        print(json.dumps({"count": out}), flush=True)
        return
    from tasks.corpus.published import corpus_store

    result: dict = {"pages": args.pages, "edit_share": args.edit_share, "seed": args.seed, "threads": args.threads}

    def report(key: str, value) -> None:
        result[key] = value
        print(json.dumps({key: value}), flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")

    t0 = time.perf_counter()
    nights = mirror_nights(args.out_dir, args.pages, args.seed, args.workers, args.edit_share)
    ws, first = next(nights)
    report("night1", {"version": first["version"], "seconds": time.perf_counter() - t0})
    t1 = time.perf_counter()
    ws, second = next(nights)
    report("night2", {"version": second["version"], "action": second["nightly"]["action"],
                      "seconds": time.perf_counter() - t1})
    versions = corpus_store(ws, WIKI).versions_dir
    counts = new_texts(versions / first["version"], versions / second["version"])
    report("count", {**counts, "share": counts["new_texts"] / counts["passages"]})
    if args.prune_only:
        report("prune", prune_timing(ws))
    if args.count_only or args.prune_only:
        return
    # night 1's version embedded after night 2 was built: the store then holds what it would have
    # held had it run between the nights (night 1's vectors; nothing is pruned while both are kept)
    report("embed_full", embed(ws, first["version"], args.threads))
    night = embed(ws, second["version"], args.threads)
    rate = result["embed_full"]["passages_per_s"]
    report("embed_night", {**night, "share": night["embedded"] / night["passages"],
                           "projected_full_seconds": night["passages"] / rate,
                           "night_over_projected_full": night["seconds"] / (night["passages"] / rate)})
    report("from_scratch", from_scratch(ws, second["version"], args.threads, args.check_rows))
    report("total_seconds", time.perf_counter() - t0)


if __name__ == "__main__":
    main()
