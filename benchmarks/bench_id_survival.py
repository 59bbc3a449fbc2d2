"""Id survival across one adds-changes night on a synthetic mirror: how many passage, unit and
cluster ids of night 1's corpus version are still there after night 2 (one day of ~1% edits and
new pages), and how the content ids compare with the positional ids the build used before
(``c{cluster:07d}.u{k:03d}.p{j:03d}``, rebuilt here from each version's row order).

Night 1 builds the mirror's full dump (the day's ``status.txt`` held at "in-progress"), night 2
applies the day; both with ``corpus-build-nightly`` in this process (ephemeral Prefect API), the
mirror read as a directory. Figures (shares of night 1's rows):

- ``passages_same_text``: passages whose (title, text) is also a passage tonight;
- ``content_ids``: :func:`tasks.corpus.survival.id_survival` (what the nightly reports), and
  ``passages_same_text_same_id``: of the passages with the same (title, text), those with the same id;
- ``positional_ids``: the same shares under the old positional ids.

``--clustering-mode local`` builds both nights with ``clustering.mode: local`` (night 1 has no
current version and runs the full algorithm; night 2 re-runs Algorithm 1 only where the graph
changed): compare its ``clusters_unchanged`` with the default's. ``--max-tokens`` sets ``S``
(default: the build's default, 16,384).

Run: ``python benchmarks/bench_id_survival.py OUT_DIR [--pages 3000] [--seed 0] [--workers 2]
[--edit-share 0.01] [--clustering-mode full|local] [--max-tokens S] [--out results.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # `python benchmarks/<script>.py` from anywhere

from benchmarks.synth_dump import SAMPLE, synthetic_arguments, write_mirror  # noqa: E402
from data_contracts import corpus as C
from funnelrag.workspace import Workspace

WIKI = "synwiki"


def positional_ids(version_dir: Path) -> tuple[list[str], list[str]]:
    """The passage and unit ids the build gave before content ids: ``c{cluster:07d}.u{k:03d}`` for
    the unit at position ``k`` of its cluster, ``.p{j:03d}`` for its ``j``-th passage (row order of
    ``passages.parquet``: cluster, unit, passage)."""
    units = C.DOCUMENT_UNITS.read(version_dir, columns=["unit_id", "cluster_id", "position"]).to_pydict()
    rank = {c: r for r, c in enumerate(C.CLUSTERS.read(version_dir, columns=["cluster_id"])["cluster_id"].to_pylist())}
    old_unit = {u: f"c{rank[c]:07d}.u{k:03d}" for u, c, k in zip(units["unit_id"], units["cluster_id"], units["position"])}
    passages = C.PASSAGES.read(version_dir, columns=["unit_id"]).column("unit_id").to_pylist()
    pids, j, last = [], 0, None
    for u in passages:
        j = j + 1 if u == last else 0
        last = u
        pids.append(f"{old_unit[u]}.p{j:03d}")
    return pids, list(old_unit.values())


def text_figures(before: Path, after: Path) -> dict[str, float | int]:
    """Shares of ``before``'s passages with the same (title, text) in ``after``, and of those with the same id
    (content and positional)."""
    cols = ["passage_id", "title", "text"]
    a, b = (C.PASSAGES.read(v, columns=cols).to_pydict() for v in (before, after))
    old_a, old_b = positional_ids(before)[0], positional_ids(after)[0]
    pairs_b = set(zip(b["title"], b["text"]))
    ids_b, old_ids_b = set(zip(b["passage_id"], b["title"], b["text"])), set(zip(old_b, b["title"], b["text"]))
    same = [i for i, pair in enumerate(zip(a["title"], a["text"])) if pair in pairs_b]
    n = len(a["passage_id"])
    return {
        "passages_before": n, "passages_after": len(b["passage_id"]),
        "passages_same_text": len(same) / n,
        "passages_same_text_same_id": sum((a["passage_id"][i], a["title"][i], a["text"][i]) in ids_b for i in same) / len(same),
        "positional_same_text_same_id": sum((old_a[i], a["title"][i], a["text"][i]) in old_ids_b for i in same) / len(same),
    }


def positional_titles(version_dir: Path) -> tuple[set, set]:
    """``{(rank, title)}`` of the documents (rank in sorted titles: the positional ``doc_id``) and
    of the clusters (rank in Algorithm 1's output, first member title: the positional ``cluster_id``)."""
    return tuple(set(enumerate(contract.read(version_dir, columns=["title"])["title"].to_pylist()))
                 for contract in (C.DOCUMENTS, C.CLUSTERS))


def positional_survival(before: Path, after: Path) -> dict[str, float]:
    """``documents_kept_ids``, ``clusters_kept_ids``, ``passages_kept_ids`` and ``units_kept_ids``
    under the positional ids."""
    (pa_, ua), (pb, ub) = positional_ids(before), positional_ids(after)
    (da, ca), (db, cb) = positional_titles(before), positional_titles(after)
    return {"documents_kept_ids": len(da & db) / len(da), "clusters_kept_ids": len(ca & cb) / len(ca),
            "passages_kept_ids": len(set(pa_) & set(pb)) / len(pa_), "units_kept_ids": len(set(ua) & set(ub)) / len(ua)}


def mirror_nights(out_dir: Path, pages: int, seed: int = 0, workers: int = 2, edit_share: float = 0.01,
                  clustering_mode: str = "full", max_tokens: int | None = None) -> Iterator[tuple[Workspace, dict]]:
    """Night 1 (the full dump, its one day held "in-progress") and night 2 (that day applied) of
    ``corpus-build-nightly`` over a synthetic mirror written under ``out_dir/mirror``
    (:func:`benchmarks.synth_dump.write_mirror`), home ``out_dir/home``: yields the home and each
    night's summary after it ran (a caller may work on night 1's version before night 2 runs).
    ``clustering_mode`` and ``max_tokens`` (S; default the build's) set Algorithm 1's run."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")   # a loaded box starts it slowly
    from flows.corpus_build import CorpusBuildConfig
    from flows.corpus_nightly import corpus_build_nightly
    from funnelrag.datasets import default_mirror

    mirror = out_dir / "mirror"
    write_mirror(mirror, pages, 1, seed=seed, wiki=WIKI, sample=Path(default_mirror()) / SAMPLE,
                 edit_share=edit_share, workers=workers)
    day = next((mirror / "other" / "incr" / WIKI).iterdir())
    done = (day / "status.txt").read_text()
    home = out_dir / "home"
    cfg = CorpusBuildConfig.model_validate({
        "name": WIKI, "source": {"datasets": [], "wiki": WIKI, "mirror": str(mirror)}, "ingest": {"format": "mediawiki"},
        "gate": {"enabled": False}, "runner": {"kind": "local", "workers": workers},
        "workspace": {"home": str(home), "data_mirror": default_mirror()}})
    cfg = cfg.model_copy(update={"clustering": replace(cfg.clustering, mode=clustering_mode,
                                                       max_tokens=max_tokens or cfg.clustering.max_tokens)})
    (day / "status.txt").write_text("in-progress\n")
    try:
        first = corpus_build_nightly(cfg)
    finally:
        (day / "status.txt").write_text(done)
    yield Workspace(home), first
    yield Workspace(home), corpus_build_nightly(cfg)


def night_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of a bench over :func:`mirror_nights` (``OUT_DIR``, ``--pages``, ``--seed``,
    ``--workers`` of :func:`benchmarks.synth_dump.synthetic_arguments`, ``--edit-share``,
    ``--clustering-mode``, ``--max-tokens``, ``--out``), described by ``doc``'s first paragraph."""
    ap = synthetic_arguments(doc, pages=3_000, workers=2)
    ap.add_argument("--edit-share", type=float, default=0.01)
    ap.add_argument("--clustering-mode", choices=("full", "local"), default="full")
    ap.add_argument("--max-tokens", type=int, default=None, help="S of Algorithm 1 (default: the build's)")
    ap.add_argument("--out", type=Path)
    return ap


def main() -> None:
    args = night_arguments(__doc__).parse_args()

    from tasks.corpus.published import corpus_store
    from tasks.corpus.survival import id_survival

    t0 = time.perf_counter()
    (ws, first), (_, second) = mirror_nights(args.out_dir, args.pages, args.seed, args.workers, args.edit_share,
                                             args.clustering_mode, args.max_tokens)
    versions = corpus_store(ws, WIKI).versions_dir
    before, after = versions / first["version"], versions / second["version"]
    result = {
        "pages": args.pages, "edit_share": args.edit_share, "seed": args.seed, "clustering_mode": args.clustering_mode,
        "max_tokens": args.max_tokens, "clustering": second.get("clustering"),
        "night2": second["nightly"]["action"], "days": second["nightly"]["days"],
        "content_ids": id_survival(before, after), "positional_ids": positional_survival(before, after),
        **text_figures(before, after), "seconds": time.perf_counter() - t0,
    }
    assert result["content_ids"] == second["survival"], "the nightly's report and the bench disagree"
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
