"""``funnelrag demo``: the main job on the embedded defaults and the real sample data.

Runs, in order, each step's flow with its YAML config from ``configs/`` (all sharing one
workspace: artifact store, cache and MLflow SQLite under ``workspace.home``), then prints one
summary. Steps whose flow module is missing are reported, not skipped silently.
"""
from __future__ import annotations

import importlib
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from funnelrag.config import FlowCommand, FlowConfig, deep_merge

log = logging.getLogger(__name__)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

# (step name, flow module, command name, config file in configs/)
STEPS: dict[str, tuple[str, str, str]] = {
    "corpus-wikispeedia": ("flows.corpus_build", "build-corpus", "corpus_wikispeedia.yaml"),
    "corpus-enwiki-sample": ("flows.corpus_build", "build-corpus", "corpus_enwiki_sample.yaml"),
    "distillation": ("flows.funnel", "distill", "distillation_wikispeedia_cpu.yaml"),
    "evaluate": ("flows.evaluate", "evaluate", "evaluate_demo.yaml"),
    "dr-rag": ("flows.dr_rag", "dr-rag", "dr_rag_demo.yaml"),
    "r2ag": ("flows.r2ag", "train-r2former", "r2ag_demo.yaml"),
}
# The main job: the FunnelRAG pipeline. DR-RAG and R²AG run with --set 'steps=[dr-rag, r2ag]'.
DEFAULT_STEPS = ["corpus-wikispeedia", "corpus-enwiki-sample", "distillation", "evaluate"]


class DemoConfig(FlowConfig):
    """Which steps to run, in order, and per-step settings over their YAML files.

    steps : step names (default: the FunnelRAG pipeline; ``dr-rag`` and ``r2ag`` on request).
    overrides : ``{step: {key: value}}`` merged over the step's YAML config, e.g.
        ``--set overrides.distillation.n_train=8``.
    """

    steps: list[str] = Field(default_factory=lambda: list(DEFAULT_STEPS))
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the selected steps; return ``{step: summary}`` plus seconds per step."""
    unknown = [s for s in [*cfg.steps, *cfg.overrides] if s not in STEPS]
    if unknown:
        raise ValueError(f"demo: unknown step(s) {unknown}; known: {list(STEPS)}")
    missing = [f for _, _, f in (STEPS[s] for s in cfg.steps) if not (CONFIG_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(f"demo: step config(s) {missing} missing in {CONFIG_DIR}")
    out: dict[str, Any] = {}
    for step in cfg.steps:
        module, command, config_file = STEPS[step]
        cmd = next(c for c in importlib.import_module(module).COMMANDS if c.name == command)
        data = yaml.safe_load((CONFIG_DIR / config_file).read_text()) or {}
        data = deep_merge(deep_merge(data, cfg.overrides.get(step, {})), {"workspace": cfg.workspace.model_dump()})
        step_cfg = cmd.config_model.model_validate(data)
        log.info("demo: step %s (%s, %s)", step, command, config_file)
        t0 = time.perf_counter()
        out[step] = cmd.run(step_cfg)
        out[step]["step_seconds"] = time.perf_counter() - t0
    return out


COMMANDS = [FlowCommand("demo", "run the main job on the embedded defaults and the real sample data", DemoConfig, run_demo)]
