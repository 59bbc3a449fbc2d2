"""DR-RAG throughput on the real HotpotQA subsample: SM encoding (paragraphs/s), classifier
scoring and training (pairs/s, CPU seconds), and the pure selection walks (questions/s).

Run: ``python benchmarks/bench_dr_rag.py [--paragraphs 200] [--pairs 64]``. Prints its figures;
wall time on a shared machine depends on load, so CPU seconds (``time.process_time``) are given too.
"""
from __future__ import annotations

import argparse
import time
import zlib

import torch


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    from funnelrag.datasets import default_mirror, resolve
    from models.dr_rag import ClassifierConfig, DRRAGClassifier
    from models.encoders import BiEncoder, EncoderConfig, encode
    from tasks.dr_rag.classifier import ClassifierHooks, score_triples
    from tasks.dr_rag.collection import build_collection
    from tasks.dr_rag.pairs import PairSamplingConfig, build_pairs
    from tasks.dr_rag.selection import cfs_select, cis_select, qdc_select
    from tasks.dr_rag.hotpotqa import load_hotpotqa

    ap = argparse.ArgumentParser()
    ap.add_argument("--paragraphs", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=64)
    args = ap.parse_args()
    records = load_hotpotqa(resolve("hotpotqa-dev-subsampled", default_mirror()))
    coll, questions = build_collection(records)
    texts = dict(zip(coll.ids, coll.retrieval_texts()))
    print(f"torch threads {torch.get_num_threads()}; collection {len(coll)} paragraphs, {len(questions)} questions")

    model, tok = BiEncoder.from_pretrained(EncoderConfig(max_length=256))
    sample = coll.retrieval_texts()[:args.paragraphs]
    _, wall, cpu = _timed(lambda: encode(model, tok, sample))
    print(f"SM encode (MiniLM, max_length 256): {len(sample) / wall:.1f} paragraphs/s wall, "
          f"{cpu / len(sample) * 1000:.1f} CPU-ms/paragraph -> full collection ≈ {cpu / len(sample) * len(coll):.0f} CPU-s")

    pairs, _ = build_pairs(questions, PairSamplingConfig())
    qtext = {q.question_id: q.question for q in questions}
    sub = pairs[:args.pairs]
    triples = [(qtext[p.question_id], texts[p.d1_id], texts[p.d2_id]) for p in sub]
    for max_length, layers in ((128, 3), (256, None)):
        cfg = ClassifierConfig(max_length=max_length, max_query_tokens=48)
        clf, ctok = DRRAGClassifier.from_pretrained(cfg)
        _, wall, cpu = _timed(lambda: score_triples(clf, ctok, triples, batch_size=32))
        print(f"classifier score (max_length {max_length}): {len(triples) / wall:.1f} pairs/s wall, "
              f"{cpu / len(triples) * 1000:.0f} CPU-ms/pair")
        if layers is not None:
            clf.freeze_lower_layers(layers)
        hooks = ClassifierHooks(ctok, cfg, qtext, texts)
        opt = torch.optim.AdamW([p for p in clf.parameters() if p.requires_grad], lr=1e-5)
        clf.train()

        def step(batch_pairs):
            loss, _ = hooks.loss(clf, hooks.collate(batch_pairs))
            loss.backward()
            opt.step()
            opt.zero_grad()
        _, wall, cpu = _timed(lambda: [step(sub[i:i + 16]) for i in range(0, len(sub), 16)])
        print(f"classifier train (max_length {max_length}, trainable layers {layers or 'all'}): "
              f"{len(sub) / wall:.1f} pairs/s wall, {cpu / len(sub) * 1000:.0f} CPU-ms/pair -> "
              f"~{int(len(pairs) * 0.8)} train pairs (80% split) ≈ {cpu / len(sub) * len(pairs) * 0.8:.0f} CPU-s per epoch")

    ids = list(coll.ids)
    n = len(ids)
    first = {q.question_id: [ids[(i * 7 + j) % n] for j in range(6)] for i, q in enumerate(questions)}
    second = {qid: {p: [ids[(zlib.crc32(p.encode()) + j) % n] for j in range(30)] for p in f[:3]}
              for qid, f in first.items()}

    def walk():
        for qid, f in first.items():
            qdc = qdc_select(f, second[qid], 6)
            prob = {(a, d): zlib.crc32(f"{a}{d}".encode()) % 100 / 100.0 for a in f[:3] for d in second[qid][a]}
            prob.update({(f[0], d.paragraph_id): 0.7 for d in qdc[1:]})
            cis_select(qdc, prob, 0.5)
            cfs_select(f, second[qid], prob, 6, 0.5, max_candidates=5)
    _, wall, _ = _timed(walk)
    print(f"selection (QDC + CIS + CFS, k=6): {len(first) / wall:.0f} questions/s")


if __name__ == "__main__":
    main()
