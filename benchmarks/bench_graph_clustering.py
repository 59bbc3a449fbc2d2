"""Benchmark: CSR graph build, local clustering coefficients and FunnelRAG Algorithm 1.

Synthetic power-law graphs (Chung–Lu, degree exponent 2.5, seeded, generated with numpy) of
100K, 300K and 1M nodes with 10 links per node on average (1M nodes → 10M links), plus the
real Wikispeedia graph. Each graph runs in a fresh child process. For each step it prints
wall and CPU seconds (the machine may be shared; the kernels are single-threaded, so CPU
seconds are the compute time) and memory: the process's peak resident set size during the
step (absolute, sampled every 5 ms, so numba allocations count), its rise above the level
before the step, and the tracemalloc peak of the step (NumPy buffers only).

Targets: coefficients at 1M/10M in ≤ 30 s and ≤ 2 GB; Algorithm 1 in ≤ 120 s.

Usage::

    python benchmarks/bench_graph_clustering.py                  # 100K, 300K, 1M + Wikispeedia
    python benchmarks/bench_graph_clustering.py --sizes 100000   # one size
    python benchmarks/bench_graph_clustering.py --igraph         # + igraph reference timing
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tarfile
import threading
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from funnelrag.datasets import default_mirror, resolve  # noqa: E402
from tasks.corpus.clustering import ClusteringConfig, check_clustering, cluster_documents  # noqa: E402
from tasks.corpus.graph import build_graph, graph_metrics  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


@contextmanager
def measure(label: str, rows: list):
    """Time a step and record its peak RSS above the starting level and its tracemalloc peak."""
    start_rss = rss_bytes()
    peak = [start_rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes())
            stop.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    tracemalloc.reset_peak()
    thread.start()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        stop.set()
        thread.join()
        peak[0] = max(peak[0], rss_bytes())
        _, traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rows.append((label, seconds, peak[0] / 2**20, traced / 2**20))
        print(f"  {label:<26s} {seconds:7.2f} s wall {cpu:7.2f} s CPU   peak RSS {peak[0] / 2**20:8.1f} MiB "
              f"(+{(peak[0] - start_rss) / 2**20:7.1f})   tracemalloc peak {traced / 2**20:8.1f} MiB", flush=True)


def chung_lu(n_nodes: int, links_per_node: float, exponent: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Directed links of a Chung–Lu graph: endpoints drawn i.i.d. with probability proportional
    to the weight ``(i + 1) ** (-1 / (exponent - 1))``; ``(n_links,)`` int32 arrays."""
    rng = np.random.default_rng(seed)
    n_links = int(n_nodes * links_per_node)
    weights = (np.arange(1, n_nodes + 1, dtype=np.float64)) ** (-1.0 / (exponent - 1.0))
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    src = np.searchsorted(cdf, rng.random(n_links)).astype(np.int32)
    dst = np.searchsorted(cdf, rng.random(n_links)).astype(np.int32)
    perm = rng.permutation(n_nodes).astype(np.int32)  # hubs not at low ids
    return perm[src], perm[dst]


def article_lengths(n_nodes: int, seed: int) -> np.ndarray:
    """``(n_nodes,)`` synthetic article lengths in tokens: log-normal, median ~600, heavy tail."""
    rng = np.random.default_rng(seed + 1)
    return np.minimum(rng.lognormal(mean=np.log(600), sigma=1.0, size=n_nodes), 200_000).astype(np.int64)


def run_graph(name: str, src: np.ndarray, dst: np.ndarray, n_nodes: int, n_tokens: np.ndarray, cfg: ClusteringConfig,
              with_igraph: bool = False) -> None:
    print(f"{name}: {n_nodes:,} nodes, {src.size:,} links, S = {cfg.max_tokens} tokens", flush=True)
    rows: list = []
    with measure("build CSR graph", rows):
        graph = build_graph(src, dst, n_nodes)
    with measure("clustering coefficients", rows):
        metrics = graph_metrics(graph)
    if with_igraph:  # reference: igraph's C local transitivity (coefficients only, no edge support)
        import igraph as ig  # noqa: PLC0415

        u, v = graph.edge_list()
        g = ig.Graph(n=n_nodes, edges=np.column_stack([u, v]))
        with measure("igraph transitivity (ref)", rows):
            cc = np.asarray(g.transitivity_local_undirected(mode="zero"))
        print(f"  -> max |ours - igraph| = {np.abs(cc - metrics.clustering).max():.2e}")
        del g, cc
    with measure("Algorithm 1", rows):
        res = cluster_documents(graph, metrics, n_tokens, cfg)
    with measure("check_clustering", rows):
        check_clustering(graph, res, n_tokens, cfg)
    nm = res.n_members()
    print(f"  -> {graph.n_edges:,} undirected edges, max degree {int(metrics.degree.max())}, "
          f"mean cc {metrics.clustering.mean():.4f}, {int(metrics.triangles.sum()) // 3:,} triangles")
    print(f"  -> {res.n_clusters:,} clusters, {(nm > 1).sum():,} multi-document, "
          f"{nm[res.cluster_of].__gt__(1).mean():.1%} of documents in multi-document clusters, "
          f"mean fill of multi-document clusters {res.n_tokens[nm > 1].mean() / cfg.max_tokens:.1%}, "
          f"{res.n_merged:,} merges, {res.n_skipped:,} skipped for size", flush=True)


def wikispeedia(mirror: Path) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Real links (doc ids by sorted title) and article lengths in whitespace words."""
    with tarfile.open(resolve("wikispeedia-graph", mirror)) as tf:
        def rows(member: str) -> list[list[str]]:
            raw = tf.extractfile(member).read().decode("utf-8")
            return [line.split("\t") for line in raw.splitlines() if line and not line.startswith("#")]
        titles = sorted(r[0] for r in rows("wikispeedia_paths-and-graph/articles.tsv"))
        links = rows("wikispeedia_paths-and-graph/links.tsv")
    doc_id = {t: i for i, t in enumerate(titles)}
    n_words = np.zeros(len(titles), dtype=np.int64)
    with tarfile.open(resolve("wikispeedia-articles", mirror)) as tf:
        for member in tf:
            if member.isfile() and member.name.endswith(".txt"):
                n_words[doc_id[Path(member.name).stem]] = len(tf.extractfile(member).read().decode("utf-8").split())
    src = np.array([doc_id[a] for a, _ in links], dtype=np.int32)
    dst = np.array([doc_id[b] for _, b in links], dtype=np.int32)
    return src, dst, len(titles), n_words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--links-per-node", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-wikispeedia", action="store_true")
    parser.add_argument("--igraph", action="store_true", help="also time igraph's local transitivity")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # "wikispeedia" or a node count
    args = parser.parse_args()
    if args.child is None:
        jobs = ([] if args.no_wikispeedia else ["wikispeedia"]) + [str(n) for n in args.sizes]
        for job in jobs:
            cmd = [sys.executable, __file__, "--child", job, "--links-per-node", str(args.links_per_node),
                   "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)] + (["--igraph"] if args.igraph else [])
            subprocess.run(cmd, check=True)
        return
    cfg = ClusteringConfig(max_tokens=args.max_tokens)
    # compile (or load cached) numba kernels before timing
    warm = build_graph(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)
    cluster_documents(warm, graph_metrics(warm), np.ones(3, np.int64), cfg)
    if args.child == "wikispeedia":
        mirror = default_mirror()
        if mirror is None:
            print("Wikispeedia: no data mirror, skipped")
            return
        src, dst, n, n_words = wikispeedia(mirror)
        print(f"[RSS before the graph steps: {rss_bytes() / 2**20:.0f} MiB]")
        run_graph("Wikispeedia (real, lengths in words)", src, dst, n, n_words, cfg, args.igraph)
        return
    n = int(args.child)
    t0 = time.perf_counter()
    src, dst = chung_lu(n, args.links_per_node, 2.5, args.seed)
    n_tokens = article_lengths(n, args.seed)
    print(f"[generated in {time.perf_counter() - t0:.1f} s; RSS before the graph steps: {rss_bytes() / 2**20:.0f} MiB]")
    run_graph(f"Chung-Lu power law n={n:,}", src, dst, n, n_tokens, cfg, args.igraph)
    print(f"  (process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
