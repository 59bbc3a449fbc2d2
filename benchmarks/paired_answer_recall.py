"""Paired comparison of evaluation settings on the same questions: AR@k of each, the difference
to a baseline setting with its percentile-bootstrap 95% interval (the same resampled question
sets for every row: ``funnelrag.paired``), and the questions won / lost.

    python benchmarks/paired_answer_recall.py <home>/runs/evaluate/<run>/per_question.evaluation.parquet \
        --baseline 'prog-3c-8d-minilm-stored-4p' [--k 4] [--settings S ...]

Reads the evaluation's ``per_question`` table (contract ``evaluation_per_question``): a question
counts as answered at k when one of its first k final passages has the answer (``has_answer``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from data_contracts.evaluation import EVAL_PER_QUESTION
from funnelrag.paired import bootstrap_indices, paired_difference


def hits_at_k(path: Path, k: int) -> dict[str, dict[str, bool]]:
    """``{setting: {question_id: answered in the top k}}`` of a per-question table."""
    t = EVAL_PER_QUESTION.read(path, columns=["setting", "question_id", "has_answer"]).to_pylist()
    out: dict[str, dict[str, bool]] = {}
    for r in t:
        out.setdefault(r["setting"], {})[r["question_id"]] = any(r["has_answer"][:k])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("per_question", type=Path)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--settings", nargs="*", help="default: every setting of the table")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n-bootstrap", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    hits = hits_at_k(args.per_question, args.k)
    if args.baseline not in hits:
        raise SystemExit(f"{args.per_question}: no setting {args.baseline!r} (has: {sorted(hits)})")
    qids = sorted(hits[args.baseline])
    base = np.asarray([hits[args.baseline][q] for q in qids], np.float64)
    idx = bootstrap_indices(len(qids), args.n_bootstrap, args.seed)
    print(f"| setting | AR@{args.k} | − baseline [95% CI] | won / lost |")
    print("|---|---:|---:|---:|")
    for name in args.settings or sorted(hits):
        if set(hits[name]) != set(qids):
            raise SystemExit(f"{args.per_question}: setting {name!r} has other questions than the baseline")
        x = np.asarray([hits[name][q] for q in qids], np.float64)
        d = paired_difference(base, x, idx=idx)
        won, lost = int(((x == 1) & (base == 0)).sum()), int(((x == 0) & (base == 1)).sum())
        print(f"| {name} | {100 * x.mean():.1f} | {d.text(scale=100, digits=1, with_n=False)} | {won} / {lost} |")


if __name__ == "__main__":
    main()
