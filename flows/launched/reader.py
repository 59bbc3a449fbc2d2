"""FiD reader training on every rank: ``accelerate launch … -m flows.launched.reader --spec <json>``.

Spec keys (written by :func:`launch_reader`):

* ``candidates_dir`` — a ``candidates`` stage directory (the train split's passages and questions);
* ``reader`` — :class:`tasks.funnel.reader.ReaderTrainConfig` as JSON (``train.batch_size`` is the
  global batch; each of the ``WORLD_SIZE`` ranks takes its share);
* ``work_dir`` — run directory (checkpoints; a relaunch resumes there); ``out_dir`` — where the
  main rank writes ``reader/`` and ``losses.json``, the bytes of the in-process stage
  (:func:`tasks.funnel.stages.run_reader`);
* ``tracking`` — :func:`funnelrag.launch.metrics_logger`; ``result_path``, ``errors_dir``.

The result JSON holds the stage summary (``summary``), ``global_step``, ``losses``,
``world_size`` and throughput (``examples_per_s``, ``tokens_per_s``: encoder tokens incl. padding).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from data_contracts.funnel import CANDIDATES, QUESTIONS
from funnelrag import launch as L

log = logging.getLogger(__name__)
MODULE = "flows.launched.reader"


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Train the reader of ``spec`` on this rank; the main rank writes the outputs and returns the result."""
    from tasks.funnel.reader import READER_CONFIG, READER_DIR, ReaderTrainConfig, train_reader  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)
    from tasks.funnel.stages import reader_examples  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)

    t0 = time.perf_counter()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    reader_cfg = ReaderTrainConfig.from_json(json.dumps(spec["reader"]))
    reader_cfg = replace(reader_cfg, train=replace(reader_cfg.train, output_dir=str(spec["work_dir"])))
    rank_cfg = replace(reader_cfg, train=L.per_process_train_config(reader_cfg.train, world))
    cd = Path(spec["candidates_dir"])
    examples = reader_examples(CANDIDATES.read(cd), QUESTIONS.read(cd))
    t_setup = time.perf_counter()
    result = train_reader(examples, rank_cfg, log_metrics=L.metrics_logger(spec) if L.is_main_process() else None)
    t_train = time.perf_counter()
    if result.model_dir is None:  # not the main rank
        return None
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / READER_DIR, ignore_errors=True)
    shutil.copytree(result.model_dir, out / READER_DIR)
    # the saved config names the global batch, as the in-process reader's does
    (out / READER_DIR / READER_CONFIG).write_text(reader_cfg.to_json())
    losses = result.train.losses
    (out / "losses.json").write_text(json.dumps([round(x, 6) for x in losses]))
    train_s = t_train - t_setup
    steps_here = max(1, len(losses))
    examples_per_s = steps_here * reader_cfg.train.batch_size * reader_cfg.train.grad_accum / max(train_s, 1e-9)
    summary = {"examples": len(examples), "kept": result.report.kept, "steps": result.train.global_step,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "skipped_too_few_passages": result.report.skipped_too_few_passages,
               "seconds": time.perf_counter() - t0}
    res = {"summary": summary, "global_step": result.train.global_step, "losses": losses, "world_size": world,
           "peak_gpu_mem_gib": L.peak_gpu_memory_gib(),
           "seconds": {"setup": t_setup - t0, "train": train_s, "save": time.perf_counter() - t_train},
           "examples_per_s": examples_per_s,
           "tokens_per_s": examples_per_s * reader_cfg.n_passages * reader_cfg.max_passage_tokens}
    L.write_result(spec, res)
    return res


def launch_reader(candidates_dir: Path, reader_cfg, work_dir: Path, out_dir: Path, launch_cfg: L.LaunchConfig, *,
                  tracking: dict[str, Any] | None = None, logger=None, **launch_kw) -> dict[str, Any]:
    """Flow side: train the reader under ``accelerate launch`` and return the ``reader`` stage
    summary (the keys of :func:`tasks.funnel.stages.run_reader`); ``out_dir`` receives its files.

    ``launch_kw`` go to :func:`funnelrag.launch.launch` (``env``, ``on_start``).

    Raises
    ------
    ValueError
        The global batch is not a multiple of the number of processes (before anything starts).
    funnelrag.launch.LaunchFailed
        A rank failed (its traceback in the message).
    """
    L.per_process_train_config(reader_cfg.train, L.resolve_processes(launch_cfg)[0])   # refuse before launching
    spec = {"candidates_dir": str(candidates_dir), "reader": json.loads(json.dumps(asdict(reader_cfg))),
            "work_dir": str(work_dir), "out_dir": str(out_dir), "tracking": tracking or {"kind": "none"}}
    result = L.launch(MODULE, spec, Path(work_dir) / "launch", launch_cfg, logger=logger, **launch_kw)
    return result["summary"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of every rank: ``python -m flows.launched.reader --spec <json>``."""
    L.entry_main(run, argv)


if __name__ == "__main__":
    main()
