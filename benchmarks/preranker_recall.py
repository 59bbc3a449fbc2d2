"""Where the pre-ranker's answers go: answer recall of the units kept by MaxP, by BM25-MaxP, by
their union and by the chosen fusion, over the same questions as the evaluation (a diagnostic:
nothing is chosen by it).

    funnelrag build-corpus --home <home>
    funnelrag evaluate --home <home> --config configs/fusion_validation_cpu.yaml   # fills the vectors these read
    python benchmarks/preranker_recall.py --home <home>

For each question set (the validation part of the train split, then NQ-open test; 300 questions
each, sampled as ``funnelrag evaluate`` samples them): BM25 top-K clusters, then the units of
those clusters ranked by MaxP (:func:`tasks.funnel.stored.rank_units_stored`), by BM25-MaxP
(``convex``, w = 1) and by the fusion given; prints the % of questions whose clusters, top-N
units of each ranking, union of the MaxP and BM25-MaxP top-N, and MaxP top-2N hold an answer.
Reads the stored vectors from the lazily filled cache of the home (every row it needs must be
filled: run the evaluations first) or the published embedding index.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.embed import corpus_digest  # noqa: E402
from funnelrag import datasets  # noqa: E402
from funnelrag.datasets import default_mirror  # noqa: E402
from funnelrag.workspace import Workspace  # noqa: E402
from tasks.corpus.published import open_corpus  # noqa: E402
from tasks.evaluate.models import load_preranker_ref  # noqa: E402
from tasks.evaluate.stages import sample_questions, validation_part  # noqa: E402
from tasks.funnel.embeddings import embed_queries, find_embedding_index, model_version  # noqa: E402
from tasks.funnel.fusion import FusionConfig, PassageBM25  # noqa: E402
from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex, lazy_root  # noqa: E402
from tasks.funnel.stored import rank_units_stored  # noqa: E402
from tasks.qa.metrics import TokenCache, passage_hits  # noqa: E402
from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True)
    ap.add_argument("--data-mirror", default=None, help="data mirror (default: the workspace's)")
    ap.add_argument("--n-clusters", type=int, default=3)
    ap.add_argument("--n-units", type=int, default=8)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--fusion", default="convex", choices=["convex", "rrf"])
    ap.add_argument("--bm25-weight", type=float, default=0.9)
    args = ap.parse_args()
    ws = Workspace(args.home)
    corpus = open_corpus(ws, "wikispeedia")
    model, tok, _ = load_preranker_ref("minilm", ws.cache_dir / "preranker-recall")
    digest, version = corpus_digest(corpus), model_version(model)
    index = find_embedding_index(ws.home / "stores", "wikispeedia", digest, model)
    if index is None:
        enc = model.encoder
        index = LazyEmbeddingIndex.open(lazy_root(ws.cache_dir, version), corpus.passages, digest, version,
                                        enc.backbone.config.hidden_size, enc.cfg.max_length)
    clusters, bm25 = corpus.cluster_index(), PassageBM25(corpus.passage_index(), index.passage_ids)
    fused = FusionConfig(args.fusion, args.bm25_weight)
    texts, tokens, n = corpus.passages["text"], TokenCache(), args.n_units
    for name, dataset, val in (("validation part of the train split", "nq-open-dev", True),
                               ("NQ-open test", "nq-open-test", False)):
        table, _ = load_questions([datasets.resolve(dataset, Path(args.data_mirror) if args.data_mirror else default_mirror())], QuestionsConfig())
        table = sample_questions(validation_part(table) if val else table, args.questions, 0)
        count = dict.fromkeys(["clusters", "maxp", "bm25", "union", "fused", "maxp_2n"], 0)
        for q, answers in zip(table["question"].to_pylist(), table["answers"].to_pylist()):
            ids, _ = clusters.search([q], args.n_clusters)
            cids = [int(c) for c in ids[0]]
            query = embed_queries(model, tok, [q])[0]

            def bm25_of(rows, q=q):
                return bm25.scores(q, rows)

            dense = rank_units_stored(query, index, cids)
            lexical = rank_units_stored(query, index, cids, bm25_of, FusionConfig("convex", 1.0))
            both = rank_units_stored(query, index, cids, bm25_of, fused)
            rows = dense.passage_rows
            if hasattr(index, "filled") and not bool(index.filled[rows].all()):
                raise SystemExit(f"{name}: vectors of {q!r}'s clusters are not filled: run the evaluations first")
            hits = passage_hits(answers, [(index.passage_ids[r], texts[int(r)].as_py()) for r in rows], tokens)
            unit_hit: dict[str, bool] = {}
            for r, h in zip(rows, hits):
                unit_hit[index.unit_ids[r]] = unit_hit.get(index.unit_ids[r], False) or h

            def held(units) -> bool:
                return any(unit_hit[u] for u in units)

            count["clusters"] += any(hits)
            count["maxp"] += held(dense.unit_ids[:n])
            count["bm25"] += held(lexical.unit_ids[:n])
            count["union"] += held(set(dense.unit_ids[:n]) | set(lexical.unit_ids[:n]))
            count["fused"] += held(both.unit_ids[:n])
            count["maxp_2n"] += held(dense.unit_ids[:2 * n])
        print(f"{name} ({table.num_rows} questions): " + ", ".join(
            f"{k} {100 * v / table.num_rows:.1f}%" for k, v in count.items()), flush=True)


if __name__ == "__main__":
    main()
