"""The BM25 shortlist's passage lookup (``tasks/funnel/fusion.py:PassageBM25.scores``, compiled)
against the plain numpy lookup it replaced (per query token and shard, a ``np.searchsorted`` of
the wanted rows in the token's posting list), on the lookups a progressive setting of
``bench_scaling.py`` makes: the same calls, the same scores (checked), both timed in one process.

The lookups are those of ``bench_scaling.py``'s worker for ``--setting`` (``prog-sl-f16``: the K'
clusters' passages of each question) over a home ``bench_scaling.py prepare`` has prepared (read
only). Each call is timed ``--repeats`` times per implementation, the implementations' turns
rotated, and the minimum kept (under load the minimum is the least disturbed); the figures are the
median over the calls. Also printed: per query token and shard, the wanted rows against the posting
list's length.

    python benchmarks/bench_passage_bm25.py --home H --corpus syn100k --questions 50 --repeats 12
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_scaling  # noqa: E402  (its worker makes the lookups)


class SearchsortedLookup:
    """The plain lookup: per shard the wanted rows, per query token their ``np.searchsorted`` in
    its posting list (the implementation before the compiled one; the same float32 sums, for the
    methods without a non-occurrence term: lucene, robertson, atire, what a sharded index holds)."""

    def __init__(self, index, passage_ids):
        self.shards = list(getattr(index, "shards", [index]))
        offsets = np.cumsum([0] + [len(s) for s in self.shards])
        row = {p: i for i, p in enumerate(index.doc_ids)}
        to_bm25 = np.fromiter((row[p] for p in passage_ids), np.int64, count=len(passage_ids))
        self.shard_of = np.searchsorted(offsets, to_bm25, side="right") - 1
        self.local = to_bm25 - offsets[self.shard_of]

    def scores(self, question: str, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.zeros(rows.size, np.float32)
        shard_of, local = self.shard_of[rows], self.local[rows]
        tokens = self.shards[0].tokenize([question])[0]
        for si, shard in enumerate(self.shards):
            m = shard.retriever.scores
            data, indices, indptr, vocab = m["data"], m["indices"], m["indptr"], shard.retriever.vocab_dict
            mine = np.flatnonzero(shard_of == si)
            want = local[mine]
            acc = np.zeros(mine.size, np.float32)
            for t in [vocab[t] for t in tokens if t in vocab]:
                lo, hi = int(indptr[t]), int(indptr[t + 1])
                if hi == lo or mine.size == 0:
                    continue
                post = np.asarray(indices[lo:hi])
                pos = np.minimum(np.searchsorted(post, want), post.size - 1)
                found = post[pos] == want
                acc[found] += np.asarray(data[lo:hi], np.float32)[pos[found]]
            out[mine] = acc
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--setting", default="prog-sl-f16", choices=[s for s in bench_scaling.SETTINGS if s.startswith("prog-sl")])
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=12)
    a = ap.parse_args()
    questions = bench_scaling._questions(a.questions + bench_scaling.N_WARMUP)
    vecs, _ = bench_scaling.encode_questions(questions)
    worker = bench_scaling.Worker(a.setting, a.home, a.corpus)
    worker.load()
    compiled = worker.passage_bm25
    calls: list[tuple[str, np.ndarray]] = []

    def capture(question: str, rows: np.ndarray) -> np.ndarray:
        calls.append((question, np.asarray(rows).copy()))
        return compiled.scores(question, rows)

    worker.passage_bm25 = type("Capture", (), {"scores": staticmethod(capture)})()
    for q, v in zip(questions, vecs):
        worker.query(q, v)
    calls = calls[bench_scaling.N_WARMUP:]
    plain = SearchsortedLookup(worker.bm25, worker.index.passage_ids)
    impls = {"numpy searchsorted": plain, "compiled": compiled}
    for q, rows in calls:                                   # also the first-use checks of posting lists
        if not np.array_equal(plain.scores(q, rows), compiled.scores(q, rows)):
            raise SystemExit(f"scores differ for {q!r}")
    pairs = []
    for q, rows in calls:
        tokens = plain.shards[0].tokenize([q])[0]
        shard_of = plain.shard_of[rows]
        for si, shard in enumerate(plain.shards):
            m, vocab, indptr = int((shard_of == si).sum()), shard.retriever.vocab_dict, shard.retriever.scores["indptr"]
            pairs += [(m, int(indptr[vocab[t] + 1] - indptr[vocab[t]])) for t in tokens if t in vocab]
    p = np.asarray(pairs)
    print(f"{a.corpus}, {a.setting}: {len(calls)} lookups of {np.median([r.size for _, r in calls]):.0f} rows (median), "
          f"{len(plain.shards)} shards; same scores: yes")
    print(f"per query token and shard ({len(p) / len(calls):.1f} a lookup): wanted rows median {np.median(p[:, 0]):.0f} "
          f"(mean {p[:, 0].mean():.0f}), posting list median {np.median(p[:, 1]):.0f} (mean {p[:, 1].mean():.0f}, "
          f"p90 {np.percentile(p[:, 1], 90):.0f}, max {p[:, 1].max()})")
    best = {k: [] for k in impls}
    names = list(impls)
    for q, rows in calls:
        times = {k: [] for k in impls}
        for r in range(a.repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:        # rotate who goes first
                t0 = time.perf_counter()
                impls[k].scores(q, rows)
                times[k].append(time.perf_counter() - t0)
        for k in impls:
            best[k].append(min(times[k]))
    for k in impls:
        print(f"{k}: median {np.median(best[k]) * 1e3:.3f} ms a lookup (p90 {np.percentile(best[k], 90) * 1e3:.3f})")
    print(f"speed-up: {np.median(best['numpy searchsorted']) / np.median(best['compiled']):.1f}x")


if __name__ == "__main__":
    main()
