"""BPR distillation of the pre-ranker (Eq. 6) on every rank:
``accelerate launch … -m flows.launched.preranker --spec <json>``.

Spec keys (written by :func:`launch_distill`): ``candidates_dir``, ``labels_dir`` (stage
directories), ``preranker``, ``distill``, ``train`` (the dataclasses as JSON; ``train.batch_size``
is the global batch), ``index`` (``{"stores_dir", "corpus", "corpus_digest"}`` where query-side
MaxP distillation reads the published embedding index, else null), ``work_dir``, ``out_dir``
(``preranker/``, as :func:`tasks.funnel.stages.run_distill` writes it), ``tracking``.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from funnelrag import launch as L

log = logging.getLogger(__name__)
MODULE = "flows.launched.preranker"


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Train the pre-ranker of ``spec`` on this rank; the main rank writes the outputs and returns the result."""
    from funnelrag.training import TrainConfig, load_full_state_dict, train  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)
    from models.preranker import PreRankerConfig, build_preranker, save_preranker  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)
    from tasks.funnel.distill import DistillConfig, prepare_for_distillation  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)
    from tasks.funnel.embeddings import find_embedding_index  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)
    from tasks.funnel.stages import PRERANKER_DIR, distill_setup, distill_summary  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)

    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pre, dcfg = PreRankerConfig(**spec["preranker"]), DistillConfig(**spec["distill"])
    train_cfg = replace(TrainConfig(**spec["train"]), output_dir=str(spec["work_dir"]))
    index = None
    if spec.get("index"):
        i = spec["index"]
        index = find_embedding_index(Path(i["stores_dir"]), i["corpus"], i["corpus_digest"], build_preranker(pre)[0])
    model, tok, trainable, data, hooks, report = distill_setup(Path(spec["candidates_dir"]), Path(spec["labels_dir"]),
                                                               pre, dcfg, index)
    t_setup = time.perf_counter()
    result = train(model, data, hooks, L.per_process_train_config(train_cfg, world),
                   log_metrics=L.metrics_logger(spec) if L.is_main_process() else None)
    t_train = time.perf_counter()
    if not L.is_main_process():
        return None
    if result.full_state_dict is not None:  # ZeRO-3: the module's own parameters are partitioned
        fresh = build_preranker(pre)[0]
        prepare_for_distillation(fresh, dcfg)
        model = load_full_state_dict(fresh, result.full_state_dict)
    save_preranker(model, tok, Path(spec["out_dir"]) / PRERANKER_DIR)
    summary = distill_summary(report, trainable, result, dcfg, time.perf_counter() - t0)
    train_s = t_train - t_setup
    res = {"summary": summary, "global_step": result.global_step, "losses": result.losses, "world_size": world,
           "peak_gpu_mem_gib": L.peak_gpu_memory_gib(),
           "seconds": {"setup": t_setup - t0, "train": train_s, "save": time.perf_counter() - t_train},
           "examples_per_s": len(result.losses) * train_cfg.batch_size * train_cfg.grad_accum / max(train_s, 1e-9)}
    L.write_result(spec, res)
    return res


def launch_distill(candidates_dir: Path, labels_dir: Path, preranker, distill, train_cfg, work_dir: Path, out_dir: Path,
                   launch_cfg: L.LaunchConfig, *, index: dict[str, str] | None = None,
                   tracking: dict[str, Any] | None = None, logger=None, **launch_kw) -> dict[str, Any]:
    """Flow side: BPR distillation under ``accelerate launch``; returns the ``distill`` stage summary.

    Raises
    ------
    funnelrag.launch.LaunchFailed
        A rank failed (its traceback in the message).
    """
    L.per_process_train_config(train_cfg, L.resolve_processes(launch_cfg)[0])   # refuse before launching
    spec = {"candidates_dir": str(candidates_dir), "labels_dir": str(labels_dir),
            "preranker": asdict(preranker), "distill": asdict(distill),
            "train": json.loads(json.dumps(asdict(train_cfg))), "index": index,
            "work_dir": str(work_dir), "out_dir": str(out_dir), "tracking": tracking or {"kind": "none"}}
    return L.launch(MODULE, spec, Path(work_dir) / "launch", launch_cfg, logger=logger, **launch_kw)["summary"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank: ``python -m flows.launched.preranker --spec <json>``."""
    L.entry_main(run, argv)


if __name__ == "__main__":
    main()
