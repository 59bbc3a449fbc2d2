"""Local re-clustering (``clustering.mode: local``) against the paper's full Algorithm 1 on a real
corpus after a simulated ~1% day: clusters unchanged, and AR@k of cluster retrieval on validation
questions, paired.

From a published corpus version (e.g. Wikispeedia: ``funnelrag build-corpus --config
configs/corpus_wikispeedia.yaml``, then ``<home>/stores/corpus/wikispeedia/versions/<id>``):

1. **yesterday**: the version without ``--new-share`` of its pages (chosen by a hash of seed and
   title), clustered by the full algorithm (the published ``S``, tokenizer and lengths);
2. **tonight**: every page, ``--edit-share`` others edited: the last fifth of the text dropped
   (lengths counted again with the version's tokenizer) and a third of the page's links dropped,
   three links to pages chosen by hash added;
3. tonight clustered twice: ``full`` (Algorithm 1) and ``local`` (over yesterday's clusters);
4. ``clusters_unchanged``: share of yesterday's clusters with the same member titles in the same
   order tonight (as :func:`tasks.corpus.survival.id_survival`);
5. AR@k of cluster retrieval, the funnel's first stage: BM25 (the version's ``bm25`` settings)
   over each clustering's cluster texts (members' ``title\\ntext``, tonight's texts), a hit when a
   top-k cluster's member holds an answer (DPR ``has_answer``), on the **validation** part of
   NQ-open dev (:func:`tasks.evaluate.stages.validation_part`; never NQ-open test); local − full
   with the paired 95% bootstrap interval (:func:`funnelrag.paired.paired_difference`).

Run: ``python benchmarks/bench_local_clustering.py VERSION_DIR [--edit-share 0.01] [--new-share 0.005]
[--seed 0] [--k 3 32] [--limit N] [--out results.json]``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from data_contracts import corpus as C
from funnelrag import datasets
from funnelrag.paired import paired_difference
from tasks.corpus.clustering import Clustering, ClusteringConfig, check_clustering, cluster_documents
from tasks.corpus.graph import build_graph, graph_metrics
from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.local_clustering import PreviousClusters, cluster_documents_local
from tasks.corpus.segment import SegmentConfig, count_window_tokens
from tasks.corpus.tokenize import load_token_counter
from tasks.evaluate.stages import validation_part
from tasks.qa.metrics import TokenCache, passage_hits, recall_per_question
from tasks.qa.questions import QuestionsConfig, load_questions


def pick(titles: list[str], seed: int, salt: str) -> list[float]:
    """A uniform value in [0, 1) per title from a hash of (seed, salt, title)."""
    return [int.from_bytes(hashlib.sha256(f"{seed}\0{salt}\0{t}".encode()).digest()[:8], "big") / 2**64 for t in titles]


def night(pages: dict[str, str], links: list[tuple[str, str]], tokens: dict[str, int], cfg: ClusteringConfig):
    """``(titles, graph, lengths, full clustering)`` of one version (graph nodes: ranks of the titles)."""
    titles = sorted(pages)
    rank = {t: i for i, t in enumerate(titles)}
    src = np.array([rank[a] for a, b in links if a in rank and b in rank], dtype=np.int64)
    dst = np.array([rank[b] for a, b in links if a in rank and b in rank], dtype=np.int64)
    graph = build_graph(src, dst, len(titles))
    n_tokens = np.array([tokens[t] for t in titles], dtype=np.int64)
    return pa.array(titles), graph, n_tokens, cluster_documents(graph, graph_metrics(graph), n_tokens, cfg)


def named(titles: pa.Array, res: Clustering) -> list[tuple[str, ...]]:
    t = titles.to_pylist()
    return [tuple(t[d] for d in res.members_of(c).tolist()) for c in range(res.n_clusters)]


def cluster_recall(titles: list[str], texts: dict[str, str], res: Clustering, questions: list[tuple[str, list[str]]],
                   ks: list[int], bm25: BM25Config, cache: TokenCache) -> dict[int, np.ndarray]:
    """``{k: (n_questions,) 0/1}``: a top-k cluster (BM25 over cluster texts) has a member holding an answer."""
    clusters = [[titles[d] for d in res.members_of(c).tolist()] for c in range(res.n_clusters)]
    index = BM25Index.build(("\n\n".join(f"{t}\n{texts[t]}" for t in m) for m in clusters), list(range(len(clusters))), bm25)
    ranked, _ = index.search([q for q, _ in questions], k=max(ks))
    first = []
    for (_, answers), ids in zip(questions, ranked):
        hit = None
        for r, cid in enumerate(ids):
            members = clusters[int(cid)]
            if any(passage_hits(answers, [(t, texts[t]) for t in members], cache)):
                hit = r
                break
        first.append(hit)
    return recall_per_question(first, ks)


def paired(full: np.ndarray, local: np.ndarray) -> dict[str, float | str]:
    """AR of both, and local − full with its paired 95% bootstrap interval (in points)."""
    d = paired_difference(full, local)
    return {"full": d.mean_a, "local": d.mean_b, "diff": d.diff, "low": d.low, "high": d.high,
            "local_minus_full_points": d.text(100, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version_dir", type=Path)
    ap.add_argument("--edit-share", type=float, default=0.01)
    ap.add_argument("--new-share", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 32])
    ap.add_argument("--limit", type=int, default=None, help="the first N validation questions (default: all)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    manifest = json.loads((args.version_dir / "manifest.json").read_text())
    section = lambda name: C.BUILD_CONFIG.section(manifest, name, args.version_dir / "manifest.json")  # noqa: E731
    cfg = ClusteringConfig(**{k: v for k, v in section("clustering").items() if k in ("max_tokens", "tokenizer")})
    seg = SegmentConfig(**section("segment"))
    bm25 = BM25Config(**section("bm25"))
    docs = C.DOCUMENTS.read(args.version_dir, columns=["doc_id", "title", "text"])   # title order
    titles = docs["title"].to_pylist()
    texts = dict(zip(titles, docs["text"].to_pylist()))
    ids = docs["doc_id"].to_numpy()
    metrics = C.GRAPH_METRICS.read(args.version_dir, columns=["doc_id", "n_tokens"])
    tokens = dict(zip((titles[r] for r in C.rows_of(ids, metrics["doc_id"].to_numpy(), "documents")),
                      metrics["n_tokens"].to_pylist()))
    ln = C.LINKS.read(args.version_dir)
    links = [(titles[a], titles[b]) for a, b in zip(C.rows_of(ids, ln["src_doc_id"].to_numpy(), "documents"),
                                                    C.rows_of(ids, ln["dst_doc_id"].to_numpy(), "documents"))]

    # the simulated day: new pages, and edited texts and links (disjoint sets, by hash)
    u = pick(titles, args.seed, "page")
    new = {t for t, x in zip(titles, u) if x < args.new_share}
    edited = sorted(t for t, x in zip(titles, u) if args.new_share <= x < args.new_share + args.edit_share)
    texts_tonight = dict(texts)
    for t in edited:
        words = texts[t].split(" ")
        texts_tonight[t] = " ".join(words[: max(1, (4 * len(words)) // 5)])
    counted = count_window_tokens([texts_tonight[t] for t in edited], seg, load_token_counter(cfg.tokenizer, datasets.default_mirror()))
    tokens_tonight = {**tokens, **dict(zip(edited, counted.article_tokens().tolist()))}
    edited_set = set(edited)
    drop = pick([f"{a}\0{b}" for a, b in links], args.seed, "drop")
    links_tonight = [(a, b) for (a, b), x in zip(links, drop) if not (a in edited_set and x < 1 / 3)]
    for t in edited:
        targets = sorted(titles, key=lambda s, t=t: hashlib.sha256(f"{args.seed}\0add\0{t}\0{s}".encode()).digest())[:3]
        links_tonight += [(t, s) for s in targets if s != t]

    y_titles, y_graph, y_tokens, yesterday = night({t: texts[t] for t in titles if t not in new}, links, tokens, cfg)
    previous = PreviousClusters(titles=y_titles, n_tokens=y_tokens, graph=y_graph, indptr=yesterday.indptr,
                                members=yesterday.members, max_tokens=cfg.max_tokens, tokenizer=cfg.tokenizer)
    n_titles, graph, n_tokens, full = night(texts_tonight, links_tonight, tokens_tonight, cfg)
    t1 = time.perf_counter()
    local, change = cluster_documents_local(graph, graph_metrics(graph), n_tokens, n_titles,
                                            ClusteringConfig(cfg.max_tokens, cfg.tokenizer, "local"), previous)
    local_seconds = time.perf_counter() - t1
    check_clustering(graph, full, n_tokens, cfg)
    check_clustering(graph, local, n_tokens, cfg)
    before = named(y_titles, yesterday)
    unchanged = {name: sum(c in set(named(n_titles, res)) for c in before) / len(before)
                 for name, res in (("full", full), ("local", local))}

    qfile = datasets.resolve("nq-open-dev", datasets.default_mirror())
    table, _ = load_questions([qfile], QuestionsConfig())
    table = validation_part(table)
    if args.limit:
        table = table.slice(0, args.limit)
    questions = list(zip(table["question"].to_pylist(), table["answers"].to_pylist()))
    cache = TokenCache()
    order = n_titles.to_pylist()
    recall = {name: cluster_recall(order, texts_tonight, res, questions, args.k, bm25, cache)
              for name, res in (("full", full), ("local", local))}
    result = {
        "content_digest": manifest["content_digest"], "pages": len(titles), "new_pages": len(new), "edited_pages": len(edited),
        "seed": args.seed, "max_tokens": cfg.max_tokens, "questions": len(questions),
        "clusters": {"yesterday": yesterday.n_clusters, "full": full.n_clusters, "local": local.n_clusters},
        "clusters_unchanged": unchanged, "local": change.summary(), "local_algorithm1_seconds": local_seconds,
        "answer_recall": {str(k): paired(recall["full"][k], recall["local"][k]) for k in args.k},
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
