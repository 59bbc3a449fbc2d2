"""Two parts of ``funnelrag demo`` measured alone, before and after, on a published corpus:

* BM25 tokenization of every passage (``title\\ntext``): bm25s's own ``tokenize`` loop
  (:func:`tasks.corpus.index.tokenize_ids_bm25s`) against :func:`tasks.corpus.index.tokenize_ids`;
  CPU seconds, and whether ids and vocabulary are the same.
* FiD answers for ``--settings`` copies of ``--questions`` NQ-open test questions with their BM25
  top-4 passages (as evaluate's settings, several of which share their final passages): one
  ``generate`` a question at ``max_answer_tokens`` 20 against batched answers of each distinct
  input (:func:`tasks.evaluate.stages.generate_answers`) at 20 and at 10; CPU seconds, and whether
  the answers at 20 are the same.

One torch thread. Run: ``python benchmarks/bench_demo_parts.py --version-dir HOME/stores/corpus/wikispeedia/versions/V
--reader-dir DIR [--questions 10] [--settings 7] [--json FILE]`` (``DIR``: a saved FiD reader, e.g.
the distillation's ``reader`` stage output in the demo's home).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from funnelrag import datasets  # noqa: E402
from tasks.corpus.index import BM25Config, BM25Index, TokenIds, _stemmer, tokenize_ids, tokenize_ids_bm25s  # noqa: E402
from tasks.evaluate.retrieval import QueryResult  # noqa: E402
from tasks.evaluate.stages import generate_answers, sample_questions  # noqa: E402
from tasks.funnel.reader import load_reader  # noqa: E402
from tasks.qa.generation import FiDGenerator, GenerationConfig  # noqa: E402
from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: E402


def cpu(fn):
    c0 = time.process_time()
    out = fn()
    return out, round(time.process_time() - c0, 2)


def bm25_tokenize(version_dir: Path) -> dict:
    t = pq.read_table(version_dir / "passages.parquet", columns=["title", "text"])
    texts = [a + "\n" + b for a, b in zip(t["title"].to_pylist(), t["text"].to_pylist())]
    cfg = BM25Config(**json.loads((version_dir / "index" / "passages.bm25" / "tokenizer.index.json").read_text()))
    fast, fast_s = cpu(lambda: TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer))))
    plain, plain_s = cpu(lambda: TokenIds.from_tokenized(tokenize_ids_bm25s(texts, cfg, _stemmer(cfg.stemmer))))
    same = np.array_equal(fast.ids, plain.ids) and np.array_equal(fast.offsets, plain.offsets) and fast.terms == plain.terms
    return {"passages": len(texts), "tokens": int(fast.ids.size), "terms": len(fast.terms),
            "bm25s_cpu_s": plain_s, "fast_cpu_s": fast_s, "same_ids": same}


def fid_answers(version_dir: Path, reader_dir: Path, n_questions: int, n_settings: int) -> dict:
    index = BM25Index.load(version_dir / "index" / "passages.bm25")
    passages = pq.read_table(version_dir / "passages.parquet", columns=["passage_id", "title", "text"])
    row = {pid: i for i, pid in enumerate(passages["passage_id"].to_pylist())}
    titles, bodies = passages["title"].to_pylist(), passages["text"].to_pylist()
    table, _ = load_questions([datasets.resolve("nq-open-test", datasets.default_mirror())], QuestionsConfig(dev_fraction=0.0))
    qs = sample_questions(table, n_questions, 0)
    qids, texts = qs["question_id"].to_pylist(), qs["question"].to_pylist()
    ids, _ = index.search(texts, 8)
    settings = []   # setting s: top 4 of BM25's top 4 + s // 2 (pairs of settings share their final passages)
    for s in range(n_settings):
        shift = s // 2
        settings.append([QueryResult(q, [(p, titles[row[p]], bodies[row[p]]) for p in top[shift:shift + 4]], [], [])
                         for q, top in zip(qids, ids)])
    model, tok, rcfg = load_reader(reader_dir)
    model.eval()
    question = dict(zip(qids, texts))

    def one_by_one(cap: int) -> list[list[str]]:
        gen = FiDGenerator("fid", model, tok, GenerationConfig(n_passages=4, max_passage_tokens=200, max_answer_tokens=cap))
        return [[gen(question[r.question_id], [(t, x) for _, t, x in r.passages]) for r in rs] for rs in settings]

    def batched(cap: int) -> list[list[str]]:
        gen = FiDGenerator("fid", model, tok, GenerationConfig(n_passages=4, max_passage_tokens=200, max_answer_tokens=cap))
        return [[g.answers[r.question_id] for r in rs] for g, rs in zip(generate_answers(gen, settings, question), settings)]

    before, before_s = cpu(lambda: one_by_one(20))
    after20, after20_s = cpu(lambda: batched(20))
    after10, after10_s = cpu(lambda: batched(10))
    distinct = len({(r.question_id, tuple(p for p, _, _ in r.passages)) for rs in settings for r in rs})
    return {"questions": n_questions, "settings": n_settings, "inputs": n_questions * n_settings, "distinct_inputs": distinct,
            "one_by_one_20_cpu_s": before_s, "batched_20_cpu_s": after20_s, "batched_10_cpu_s": after10_s,
            "same_answers_at_20": before == after20, "same_answers_10_vs_20": after10 == after20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version-dir", type=Path, required=True, help="a published corpus version directory")
    parser.add_argument("--reader-dir", type=Path, required=True, help="a saved FiD reader directory")
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--settings", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {"bm25_tokenize": bm25_tokenize(args.version_dir),
           "fid_answers": fid_answers(args.version_dir, args.reader_dir, args.questions, args.settings)}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
