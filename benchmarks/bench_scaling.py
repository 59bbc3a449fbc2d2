"""Query-time cost of flat and progressive retrieval as the corpus grows: per-stage seconds per
query (median, p95), one-time load seconds and peak RSS of every setting, over published corpora
of several sizes, all settings interleaved question by question.

Settings (each in its own worker process, so that its peak RSS is its own; the driver sends the
questions one at a time to the workers in turn, so a change of load on the box hits all alike):

* ``bm25``        flat BM25 over passages → 50p → 4p (the retriever's top 4)
* ``rerank-f32``, ``rerank-f16``  flat BM25 → 50p → stored-vector re-rank (one dot product each,
  vectors read from the memory-mapped embedding index) → 4p
* ``dense-exact`` faiss ``IndexFlatIP`` over every passage vector (float32, in memory) → 50p → 4p
* ``dense-ivfpq`` faiss ``IndexIVFPQ`` (√n lists, 48 × 8-bit sub-quantisers, 16 lists probed;
  built by ``prepare``, which records its build time and peak RSS) → 50p → 4p
* ``prog-f32``, ``prog-f16``  progressive: BM25 over clusters → K clusters → MaxP pre-ranking of
  their units from the stored vectors (``tasks/funnel/stored.py``) → N = 8 units → 4p; K keeps
  the Wikispeedia evaluation's token budget (3 clusters of S = 16K tokens): K = 49,152 / S.

* ``prog-sl-f32``, ``prog-sl-f16``  progressive with the BM25 shortlist: BM25 over clusters → K'
  clusters → the passage BM25 scores of their passages (``tasks/funnel/fusion.py:PassageBM25``
  over the flat passage index) → the 20 best (``tasks/funnel/stored.py:bm25_shortlist``) →
  MaxP pre-ranking of their units from the stored vectors → N = 8 units → 4p; K' keeps the token
  budget of the Wikispeedia evaluation's shortlist setting (K = 32 clusters of S = 16K tokens).
  ``prog-sl64-f32``, ``prog-sl64-f16``: the same with the budget of its K = 64 setting.

* ``prog-before`` the progressive path as it was before the speed work: the embedding index in
  the Parquet layout read into memory (ids as Python lists, float32 vectors), per-candidate
  Python loops for MaxP and the final passages, bm25s's retrieve with a one-thread pool per call.

Every setting ends with the passage-text lookup of its 4 passages (``text`` stage, from an
uncompressed Arrow IPC copy of the passages table, memory-mapped:
``tasks/evaluate/retrieval.py:MappedPassageLookup``). The question is encoded once
by MiniLM in the driver (the ``encode`` stage, reported on its own: every dense setting pays it).
Each worker answers 3 other questions first, unmeasured (first-call costs of the libraries).

Vectors: unit vectors of MiniLM's dimension (384) drawn from a fixed seed and published through
the real embedding-index publisher (``publish_mapped_embedding_index``), float32 and float16. The
cost of a search does not depend on the values (exact search, gathers, dot products and MaxP do
the same work for any vector; IVF-PQ's lists are balanced for these vectors, as they are meant to
be for trained cells), so the figures hold for real vectors; answer recall is not measured here.

    python benchmarks/bench_scaling.py prepare --home H --corpus syn100k        # vectors, texts, IVF-PQ
    python benchmarks/bench_scaling.py run --home H --corpora wikispeedia syn100k --questions 100 --out R.json
    python benchmarks/bench_scaling.py report R.json                            # markdown tables, slopes
    python benchmarks/bench_scaling.py profile --home H --corpus syn300k        # cProfile of prog-f16
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import math
import os
import pstats
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tasks.evaluate.retrieval import PASSAGE_TEXT_FILE, MappedPassageLookup, write_passage_text_store

DIM = 384
SEED = 0
N_RETRIEVE, N_FINAL, N_UNITS = 50, 4, 8
N_WARMUP = 3                        # questions each worker answers before the measured ones
TOKEN_BUDGET = 3 * 16_384           # the Wikispeedia evaluation's K = 3 clusters of S = 16K tokens
SHORTLIST_BUDGET = 32 * 16_384      # its shortlist setting's K = 32 clusters of S = 16K tokens
                                    # (prog-slNN: NN clusters of 16K tokens)
SHORTLIST = 20                      # M, the shortlist's passages
DPR_PASSAGES = 21_015_324
SETTINGS = ("bm25", "rerank-f32", "rerank-f16", "dense-exact", "dense-ivfpq", "prog-f32", "prog-f16", "prog-sl-f32",
            "prog-sl-f16", "prog-sl64-f32", "prog-sl64-f16", "prog-before")
DTYPES = {"f32": "float32", "f16": "float16"}


def _mb(field: str) -> float:
    from funnelrag.memory import status_mb  # noqa: PLC0415  (Linux /proc reader of the project)

    return status_mb(field) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _version(dtype: str) -> str:
    """The "model version" of the synthetic vectors (it keys their store like a real model's)."""
    return hashlib.sha256(f"unit-vectors dim={DIM} seed={SEED} dtype={dtype}".encode()).hexdigest()


def _paths(home: Path, corpus: str):
    from funnelrag.workspace import Workspace  # noqa: PLC0415
    from tasks.corpus.published import open_corpus  # noqa: PLC0415

    c = open_corpus(Workspace(home), corpus)
    bench = Path(home) / "cache" / "bench-scaling" / corpus / c.manifest["content_digest"][:16]
    return c, bench


def _store(home: Path, corpus: str, dtype: str) -> Path:
    """The store of the synthetic vectors: ``float32``, ``float16`` (mapped) or ``parquet``."""
    from tasks.funnel.embeddings import store_root  # noqa: PLC0415

    return store_root(Path(home) / "stores", corpus, _version(dtype))


def _unit_block(rows: np.ndarray) -> np.ndarray:
    """Seeded unit vectors per block of rows (row-wise seeding is ~40 µs a row: too slow at 5M)."""
    rows = np.asarray(rows)
    v = np.random.default_rng([SEED, int(rows[0]), len(rows)]).standard_normal((len(rows), DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def index_order(cluster_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row maps between the corpus (``passages.parquet``, the BM25 index and the text store) and
    the mapped embedding index, whose rows are grouped by ascending cluster id
    (``publish_mapped_embedding_index``: a stable argsort of the cluster ids; cluster ids are
    content ids, so the corpus's clusters are contiguous but not ascending). Returns
    ``to_corpus`` (index row → corpus row) and ``to_index`` (corpus row → index row), int64 ``(n,)``."""
    to_corpus = np.argsort(np.asarray(cluster_ids, dtype=np.int64), kind="stable")
    to_index = np.empty_like(to_corpus)
    to_index[to_corpus] = np.arange(to_corpus.size)
    return to_corpus, to_index


def prepare(home: Path, corpus: str, ivf: bool = True, before: bool = True,
            dtypes: tuple[str, ...] = ("float32", "float16")) -> dict:
    """Publish the embedding indexes of ``dtypes`` (float32 and float16 by default: the ``-f32``
    and ``-f16`` settings), write the text store and build the IVF-PQ index of one corpus
    (``before``: also the float32 vectors in the Parquet layout, for ``prog-before``; IVF-PQ and
    ``before`` need float32); returns the one-time figures (seconds, bytes, peak RSS)."""
    from data_contracts import corpus as C  # noqa: PLC0415
    from tasks.funnel.embeddings import open_embedding_index, publish_mapped_embedding_index  # noqa: PLC0415

    c, bench = _paths(home, corpus)
    bench.mkdir(parents=True, exist_ok=True)
    info: dict = {"corpus": corpus}
    ids = C.PASSAGES.read(c.path, columns=["passage_id", "unit_id", "cluster_id"])
    cids = ids["cluster_id"].to_numpy()
    info["passages"] = ids.num_rows
    meta = {"corpus_digest": c.manifest["content_digest"], "dim": DIM, "max_length": 0, "text": "synthetic"}
    if (ivf or before) and "float32" not in dtypes:
        raise SystemExit("prepare: IVF-PQ and the Parquet copy are built from the float32 vectors: "
                         "add float32 to --dtypes, or pass --no-ivf --no-before")
    for dtype in dtypes:
        root = _store(home, corpus, dtype)
        try:
            open_embedding_index(root, meta["corpus_digest"], _version(dtype))
            continue
        except FileNotFoundError:
            pass
        t0 = time.perf_counter()
        publish_mapped_embedding_index(root, ids["passage_id"].to_pylist(), ids["unit_id"].to_pylist(), cids,
                                       _unit_block, {**meta, "model_version": _version(dtype)}, dtype=dtype)
        info[f"publish_{dtype}_s"] = time.perf_counter() - t0
    root = _store(home, corpus, "parquet")
    if before and not (root / "current").exists():
        from tasks.funnel.embeddings import EmbeddingIndex, publish_embedding_index  # noqa: PLC0415

        t0 = time.perf_counter()
        mapped = open_embedding_index(_store(home, corpus, "float32"), meta["corpus_digest"], _version("float32"))
        _, to_index = index_order(cids)
        full = EmbeddingIndex(ids["passage_id"].to_pylist(), ids["unit_id"].to_pylist(), cids,
                              np.asarray(mapped.vectors, dtype=np.float32)[to_index],
                              {**meta, "model_version": _version("parquet")})
        publish_embedding_index(root, full)
        info["publish_parquet_s"] = time.perf_counter() - t0
        del full, mapped
    del ids
    text = bench / PASSAGE_TEXT_FILE
    if not text.exists():
        t0 = time.perf_counter()
        write_passage_text_store(c.path / C.PASSAGES.filename, text)
        info["text_store_s"] = time.perf_counter() - t0
    if ivf and not (bench / "ivfpq.faiss").exists():
        res = subprocess.run([sys.executable, __file__, "build-ivfpq", "--home", str(home), "--corpus", corpus],
                             stdout=subprocess.PIPE, text=True, check=True)
        info.update(json.loads(res.stdout.strip().splitlines()[-1]))
    return info


def build_ivfpq(home: Path, corpus: str) -> dict:
    """Train and fill an IVF-PQ index over the float32 vectors (in its own process: its peak RSS)."""
    import faiss  # noqa: PLC0415

    from tasks.funnel.embeddings import open_embedding_index  # noqa: PLC0415

    faiss.omp_set_num_threads(1)
    c, bench = _paths(home, corpus)
    ix = open_embedding_index(_store(home, corpus, "float32"), c.manifest["content_digest"], _version("float32"))
    n = len(ix)
    n_lists = max(16, int(round(math.sqrt(n))))
    t0 = time.perf_counter()
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(DIM), DIM, n_lists, 48, 8, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed, index.cp.niter = SEED, 10
    sample = np.random.default_rng(SEED).choice(n, size=min(n, 40 * n_lists), replace=False)
    index.train(np.ascontiguousarray(ix.vectors[np.sort(sample)]))
    train_s = time.perf_counter() - t0
    for start in range(0, n, 65_536):
        index.add(np.ascontiguousarray(ix.vectors[start:start + 65_536]))
    build_s = time.perf_counter() - t0
    faiss.write_index(index, str(bench / "ivfpq.faiss.tmp"))
    os.replace(bench / "ivfpq.faiss.tmp", bench / "ivfpq.faiss")
    return {"ivfpq_lists": n_lists, "ivfpq_train_s": train_s, "ivfpq_build_s": build_s,
            "ivfpq_bytes": (bench / "ivfpq.faiss").stat().st_size, "ivfpq_build_peak_rss_mb": _mb("VmHWM")}


# ---------------------------------------------------------------------------- worker
class Worker:
    """One setting over one corpus: ``load()`` once, then ``query(text, vector) -> {stage: s}``."""

    def __init__(self, setting: str, home: Path, corpus: str):
        self.setting, self.home, self.corpus = setting, home, corpus

    def load(self) -> dict:
        from tasks.funnel.embeddings import open_embedding_index  # noqa: PLC0415

        c, bench = _paths(self.home, self.corpus)
        s = self.setting
        self.texts = MappedPassageLookup(bench / PASSAGE_TEXT_FILE)
        info = {}
        if s == "bm25" or s.startswith(("rerank", "prog-sl")):
            self.bm25 = c.passage_index()
        if s.startswith(("rerank", "prog", "dense")):
            from data_contracts import corpus as C  # noqa: PLC0415

            cids = C.PASSAGES.read(c.path, columns=["cluster_id"])["cluster_id"].to_numpy()
            self.to_corpus, self.to_index = index_order(cids)
            if s == "prog-before":                      # the Parquet copy is in corpus order
                self.to_corpus = self.to_index = np.arange(cids.size)
        if s.startswith(("rerank", "prog")) or s == "dense-exact":
            dtype = "parquet" if s == "prog-before" else DTYPES.get(s.rsplit("-", 1)[-1], "float32")
            self.index = open_embedding_index(_store(self.home, self.corpus, dtype), c.manifest["content_digest"],
                                              _version(dtype))
            probe = np.linspace(0, len(self.index) - 1, 16).astype(np.int64)
            corpus_ids = C.PASSAGES.read(c.path, columns=["passage_id"])["passage_id"].take(self.to_corpus[probe])
            if list(self.index.passage_ids_at(probe)) != corpus_ids.to_pylist():
                raise SystemExit(f"{self.corpus}: the embedding index's rows are not the corpus rows in cluster order")
        if s == "dense-exact":
            import faiss  # noqa: PLC0415

            faiss.omp_set_num_threads(1)
            self.faiss = faiss.IndexFlatIP(DIM)
            for start in range(0, len(self.index), 65_536):
                self.faiss.add(np.ascontiguousarray(self.index.vectors[start:start + 65_536], dtype=np.float32))
        if s == "dense-ivfpq":
            import faiss  # noqa: PLC0415

            faiss.omp_set_num_threads(1)
            self.faiss = faiss.read_index(str(bench / "ivfpq.faiss"))
            self.faiss.nprobe = 16
        if s.startswith("prog"):
            self.clusters = c.cluster_index()
            s_tokens = int(c.build_config("clustering")["max_tokens"])
            self.k = max(1, round(_budget(s) / s_tokens))
            info["k"] = self.k
            info["clusters"] = len(self.clusters)
        if s.startswith("prog-sl"):
            from tasks.funnel.fusion import PassageBM25  # noqa: PLC0415

            self.passage_bm25 = PassageBM25(self.bm25, self.index.passage_ids)
        return info

    def query(self, text: str, vec: np.ndarray) -> tuple[dict, dict]:
        from tasks.funnel.stored import rank_units_stored  # noqa: PLC0415

        s, t, n = self.setting, {}, {}
        t0 = time.perf_counter()
        if s == "bm25" or s.startswith("rerank"):
            rows, _ = self.bm25.search_rows([text], N_RETRIEVE)
            rows = rows[0]
            t1 = time.perf_counter()
            t["bm25"] = t1 - t0
            if s == "bm25":
                final = rows[:N_FINAL]
            else:
                scores = self.index.gather(self.to_index[rows]) @ vec        # (50,)
                final = rows[np.lexsort((np.arange(len(rows)), -scores))[:N_FINAL]]
                t["rerank"] = time.perf_counter() - t1
        elif s.startswith("dense"):
            _, rows = self.faiss.search(vec.reshape(1, -1), N_RETRIEVE)
            final = self.to_corpus[rows[0][rows[0] >= 0][:N_FINAL]]
            t["search"] = time.perf_counter() - t0
        elif s == "prog-before":
            vocab = self.clusters.retriever.vocab_dict
            tokens = [tok for tok in self.clusters.tokenize([text])[0] if tok in vocab]
            rows, _ = self.clusters.retriever.retrieve([tokens], k=self.k, show_progress=False, n_threads=1)
            cids = [int(self.clusters.doc_ids[r]) for r in rows[0]]
            t1 = time.perf_counter()
            t["bm25_clusters"] = t1 - t0
            final, n_scored, n_units = _rank_before(vec, self.index, cids)
            t["prerank"] = time.perf_counter() - t1
            n["passages_scored"], n["units"] = n_scored, n_units
        else:
            ids, _ = self.clusters.search([text], self.k)
            cids = [int(x) for x in ids[0]]
            t1 = time.perf_counter()
            t["bm25_clusters"] = t1 - t0
            spent: list[float] = []          # seconds in the passage BM25 lookup (prog-sl), apart from prerank

            def bm25_of(rows: np.ndarray) -> np.ndarray:
                t_in = time.perf_counter()
                out = self.passage_bm25.scores(text, rows)
                spent.append(time.perf_counter() - t_in)
                return out

            if s.startswith("prog-sl"):
                ranking = rank_units_stored(vec, self.index, cids, bm25_of, shortlist=SHORTLIST)
            else:
                ranking = rank_units_stored(vec, self.index, cids)
            final = self.to_corpus[[r for r, _ in ranking.top_passages(self.index, N_UNITS, N_FINAL)]]
            t["prerank"] = time.perf_counter() - t1 - sum(spent)
            if spent:
                t["bm25_passages"] = sum(spent)
            n["passages_scored"], n["units"] = len(ranking.all_rows), len(ranking.unit_ids)
        t2 = time.perf_counter()
        got = self.texts.get_rows(final)
        t["text"] = time.perf_counter() - t2
        n["final"] = len(got)
        return t, n


def _budget(setting: str) -> int:
    """The cluster token budget of a progressive setting: ``prog-sl[NN]-…`` NN (default 32)
    Wikispeedia clusters of 16K tokens, any other ``prog…`` 3 of them."""
    m = re.fullmatch(r"prog-sl(\d*)-f(?:16|32)", setting)
    if m is None:
        return TOKEN_BUDGET
    return (int(m.group(1)) * 16_384) if m.group(1) else SHORTLIST_BUDGET


def _rank_before(q: np.ndarray, index, cluster_ids: list[int]) -> tuple[list[int], int, int]:
    """The stored MaxP pre-ranking as it was before the speed work (per-candidate Python loops):
    the final rows, the passages scored and the units ranked."""
    from tasks.funnel.unit_scoring import group_max  # noqa: PLC0415

    rows = index.rows_of_clusters(cluster_ids)
    scores = index.vectors[rows] @ q
    units = [index.unit_ids[r] for r in rows]
    names = sorted(set(units))
    pos = {u: i for i, u in enumerate(names)}
    best = group_max(scores, np.asarray([pos[u] for u in units], np.int64), len(names))
    order = sorted(range(len(names)), key=lambda i: (-float(best[i]), names[i]))
    keep = {names[i] for i in order[:N_UNITS]}
    cand = sorted(((float(sc), int(r)) for r, sc in zip(rows, scores) if index.unit_ids[r] in keep),
                  key=lambda x: (-x[0], x[1]))
    return [r for _, r in cand[:N_FINAL]], len(rows), len(names)


def worker_main(setting: str, home: Path, corpus: str) -> None:
    """Line protocol on stdin/stdout: ``load`` result, then one answer per ``{"q", "v"}`` line,
    then ``{"peak_rss_mb"}`` on ``END``."""
    t0 = time.perf_counter()
    import bm25s  # noqa: F401, PLC0415  (the libraries every setting imports: timed apart from the load)
    import faiss  # noqa: F401, PLC0415

    import tasks.corpus.published  # noqa: F401, PLC0415
    import tasks.funnel.stored  # noqa: F401, PLC0415  (imports torch through the embeddings module)

    imports = {"import_s": time.perf_counter() - t0, "rss_after_import_mb": _mb("VmRSS")}
    w = Worker(setting, home, corpus)
    t0 = time.perf_counter()
    info = w.load()
    print(json.dumps({"load_s": time.perf_counter() - t0, "rss_after_load_mb": _mb("VmRSS"), **imports, **info}),
          flush=True)
    for line in sys.stdin:
        if line.strip() == "END":
            break
        msg = json.loads(line)
        t, n = w.query(msg["q"], np.asarray(msg["v"], dtype=np.float32))
        print(json.dumps({"t": t, "n": n}), flush=True)
    print(json.dumps({"peak_rss_mb": _mb("VmHWM"), "rss_end_mb": _mb("VmRSS"), "rss_anon_end_mb": _mb("RssAnon"),
                      "rss_file_end_mb": _mb("RssFile")}), flush=True)


# ---------------------------------------------------------------------------- driver
def _questions(n: int) -> list[str]:
    from funnelrag.datasets import default_mirror, resolve  # noqa: PLC0415
    from tasks.qa.questions import QuestionsConfig, load_questions  # noqa: PLC0415

    table, _ = load_questions([resolve("nq-open-test", default_mirror())], QuestionsConfig(limit=n))
    return table["question"].to_pylist()


def encode_questions(questions: list[str]) -> tuple[np.ndarray, list[float]]:
    """MiniLM question vectors ``(n, 384)``, one question at a time, and the seconds of each."""
    import torch  # noqa: PLC0415

    from models.encoders import BiEncoder, EncoderConfig, encode  # noqa: PLC0415

    torch.set_num_threads(1)
    model, tok = BiEncoder.from_pretrained(EncoderConfig())
    encode(model, tok, questions[:2], batch_size=1)                   # warm-up
    vecs, secs = [], []
    for q in questions:
        t0 = time.perf_counter()
        vecs.append(np.asarray(encode(model, tok, [q], batch_size=1), dtype=np.float32)[0])
        secs.append(time.perf_counter() - t0)
    return np.stack(vecs), secs


def run(home: Path, corpora: list[str], n_questions: int, settings: list[str], out: Path) -> dict:
    """All ``settings`` over each corpus, interleaved question by question; appends to ``out``."""
    questions = _questions(n_questions + N_WARMUP)
    vecs, enc = encode_questions(questions)
    enc = enc[N_WARMUP:]
    results = json.loads(out.read_text()) if out.exists() else {"corpora": {}}
    results["encode_s"] = enc
    results["questions"] = n_questions
    for corpus in corpora:
        c, _ = _paths(home, corpus)
        row = {"passages": int(c.manifest["counts"].get("passages", 0)), "clusters": int(c.manifest["counts"].get("clusters", 0)),
               "load_avg_start": os.getloadavg()[0], "settings": {}}
        procs = {}
        for s in settings:
            p = subprocess.Popen([sys.executable, __file__, "worker", "--setting", s, "--home", str(home), "--corpus", corpus],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs[s] = p
            row["settings"][s] = {**json.loads(p.stdout.readline()), "t": [], "n": []}   # one load at a time
            print(corpus, s, row["settings"][s]["load_s"], flush=True)
        for i, (q, v) in enumerate(zip(questions, vecs)):
            order = settings[i % len(settings):] + settings[:i % len(settings)]          # rotate who goes first
            for s in order:
                procs[s].stdin.write(json.dumps({"q": q, "v": v.tolist()}) + "\n")
                procs[s].stdin.flush()
                ans = json.loads(procs[s].stdout.readline())
                if i >= N_WARMUP:                            # the first questions only warm the process up
                    row["settings"][s]["t"].append(ans["t"])
                    row["settings"][s]["n"].append(ans["n"])
        for s, p in procs.items():
            p.stdin.write("END\n")
            p.stdin.flush()
            row["settings"][s].update(json.loads(p.stdout.readline()))
            p.wait()
        row["load_avg_end"] = os.getloadavg()[0]
        results["corpora"][corpus] = row
        out.write_text(json.dumps(results))
        print(json.dumps({corpus: {s: round(float(np.median([sum(t.values()) for t in r["t"]])), 6)
                                   for s, r in row["settings"].items()}}), flush=True)
    return results


# ---------------------------------------------------------------------------- report
def _stats(values) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(np.median(a)), float(np.percentile(a, 95))


def report(path: Path) -> str:
    """Markdown: per corpus and setting the per-stage median / p95 ms, load s, peak RSS; then the
    log-log slope of each setting's median total over the corpus sizes and its 21M projection."""
    res = json.loads(Path(path).read_text())
    enc_med, enc_p95 = _stats(res["encode_s"])
    lines = [f"Question encoding (MiniLM, 1 thread, one question at a time, {len(res['encode_s'])} questions): "
             f"median {enc_med * 1e3:.1f} ms, p95 {enc_p95 * 1e3:.1f} ms; the dense settings' totals below exclude it.", ""]
    corpora = sorted(res["corpora"].items(), key=lambda kv: kv[1]["passages"])
    head = " | ".join(f"{name} ({row['passages'] / 1e3:,.0f}K p)" for name, row in corpora)
    lines += ["Summary, median (p95) ms per query, question encoding excluded:", "",
              f"| setting | {head} |", "|---|" + "---:|" * len(corpora)]
    for s in corpora[0][1]["settings"]:
        cells = []
        for _, row in corpora:
            r = row["settings"].get(s)
            if r is None:
                cells.append("")
                continue
            med, p95 = _stats([sum(t.values()) for t in r["t"]])
            cells.append(f"{med * 1e3:.2f} ({p95 * 1e3:.2f})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "Peak RSS MB (anonymous at the end) per setting:", "", f"| setting | {head} |",
              "|---|" + "---:|" * len(corpora)]
    for s in corpora[0][1]["settings"]:
        cells = [f"{row['settings'][s]['peak_rss_mb']:.0f} ({row['settings'][s].get('rss_anon_end_mb', 0):.0f})"
                 if s in row["settings"] else "" for _, row in corpora]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    totals: dict[str, list[tuple[int, float]]] = {}
    for name, row in corpora:
        lines += [f"### {name}: {row['passages']:,} passages, {row['clusters']:,} clusters "
                  f"(load average {row['load_avg_start']:.1f} → {row['load_avg_end']:.1f})", "",
                  "| setting | stages: median / p95 ms | total median ms | total p95 ms | load s | RSS after imports / after load MB | peak RSS MB | at the end: anonymous / file-backed MB |",
                  "|---|---|---:|---:|---:|---|---:|---|"]
        for s, r in row["settings"].items():
            stages = list(r["t"][0])
            parts = []
            for st in stages:
                m, p = _stats([t[st] for t in r["t"]])
                parts.append(f"{st} {m * 1e3:.2f} / {p * 1e3:.2f}")
            tot_m, tot_p = _stats([sum(t.values()) for t in r["t"]])
            totals.setdefault(s, []).append((row["passages"], tot_m))
            extra = ""
            if "k" in r:
                extra = f" (K = {r['k']}: {np.mean([n['passages_scored'] for n in r['n']]):.0f} passages, " \
                        f"{np.mean([n['units'] for n in r['n']]):.0f} units)"
            lines.append(f"| {s}{extra} | {'; '.join(parts)} | {tot_m * 1e3:.2f} | {tot_p * 1e3:.2f} | {r['load_s']:.2f} | "
                         f"{r.get('rss_after_import_mb', 0):.0f} / {r['rss_after_load_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
                         f"{r.get('rss_anon_end_mb', 0):.0f} / {r.get('rss_file_end_mb', 0):.0f} |")
        lines.append("")
    lines += ["### Log-log slope and projection to 21M passages", "",
              "| setting | slope (least squares over the sizes) | median at the largest size | × (21,015,324 / n)^slope | projected s/query |",
              "|---|---:|---:|---|---:|"]
    for s, pts in totals.items():
        if len(pts) < 2:
            continue
        x, y = np.log([p for p, _ in pts]), np.log([t for _, t in pts])
        slope = float(np.polyfit(x, y, 1)[0])
        n_max, t_max = max(pts)
        proj = t_max * (DPR_PASSAGES / n_max) ** slope
        lines.append(f"| {s} | {slope:.2f} | {t_max * 1e3:.2f} ms at {n_max:,} | × ({DPR_PASSAGES / n_max:.2f})^{slope:.2f} "
                     f"= × {(DPR_PASSAGES / n_max) ** slope:.2f} | {proj:.3f} |")
    return "\n".join(lines)


def profile(home: Path, corpus: str, setting: str, n_questions: int, out: Path) -> None:
    """cProfile of one setting's queries (a worker in this process); prints the top functions."""
    questions = _questions(n_questions)
    vecs, _ = encode_questions(questions)
    w = Worker(setting, home, corpus)
    w.load()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for q, v in zip(questions, vecs):
        w.query(q, v)
    prof.disable()
    print(f"{setting} on {corpus}: {(time.perf_counter() - t0) / len(questions) * 1e3:.2f} ms/query under cProfile")
    prof.dump_stats(str(out))
    pstats.Stats(str(out)).sort_stats("cumulative").print_stats(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--no-ivf", action="store_true")
    p.add_argument("--no-before", action="store_true", help="no Parquet-layout copy (no prog-before setting)")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES.values()), default=list(DTYPES.values()),
                   help="vector precisions to publish (float16 alone: the -f16 settings only)")
    p = sub.add_parser("build-ivfpq")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--corpus", required=True)
    p = sub.add_parser("worker")
    p.add_argument("--setting", choices=SETTINGS, required=True)
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--corpus", required=True)
    p = sub.add_parser("run")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--corpora", nargs="+", required=True)
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("report")
    p.add_argument("results", type=Path)
    p = sub.add_parser("profile")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--setting", choices=SETTINGS, default="prog-f16")
    p.add_argument("--questions", type=int, default=50)
    p.add_argument("--out", type=Path, default=Path("bench_scaling.prof"))
    a = ap.parse_args()
    if a.cmd == "prepare":
        print(json.dumps(prepare(a.home, a.corpus, not a.no_ivf, not a.no_before, tuple(a.dtypes))))
    elif a.cmd == "build-ivfpq":
        print(json.dumps(build_ivfpq(a.home, a.corpus)))
    elif a.cmd == "worker":
        worker_main(a.setting, a.home, a.corpus)
    elif a.cmd == "run":
        run(a.home, a.corpora, a.questions, a.settings, a.out)
    elif a.cmd == "report":
        print(report(a.results))
    else:
        profile(a.home, a.corpus, a.setting, a.questions, a.out)


if __name__ == "__main__":
    main()
