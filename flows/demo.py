"""``funnelrag demo``: the main job on the embedded defaults and the real sample data.

Runs, in order, each step's flow with its YAML config from ``configs/`` (all sharing one
workspace: artifact store, cache and MLflow SQLite under ``workspace.home``), then prints one
summary. Steps whose flow module is missing are reported, not skipped silently.

A step's settings, lowest first: its shipped YAML file (the same file a deployment or a user's
``funnelrag <command> --config`` runs), the demo's own sizes for that step
(``configs/demo.yaml``: what keeps the demo within minutes on two CPU cores, and nothing else
uses), the user's ``overrides``, then the demo's workspace.
"""
from __future__ import annotations

import importlib
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from flows.demo_screen import SUMMARY_FILE, demo_screen
from funnelrag.config import FlowCommand, FlowConfig, deep_merge
from funnelrag.store import write_json

log = logging.getLogger(__name__)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEMO_SIZES = "demo.yaml"     # {step: settings} over each step's shipped config, for the demo only

# (step name, flow module, command name, config file in configs/)
STEPS: dict[str, tuple[str, str, str]] = {
    "corpus-wikispeedia": ("flows.corpus_build", "build-corpus", "corpus_wikispeedia.yaml"),
    "corpus-enwiki-sample": ("flows.corpus_build", "build-corpus", "corpus_enwiki_sample.yaml"),
    "distillation": ("flows.funnel", "distill", "distillation_wikispeedia_cpu.yaml"),
    "evaluate": ("flows.evaluate", "evaluate", "evaluate_demo.yaml"),
    "dr-rag": ("flows.dr_rag", "dr-rag", "dr_rag_demo.yaml"),
    "r2ag": ("flows.r2ag", "train-r2former", "r2ag_demo.yaml"),
}
# Heavy modules a step's code imports at its first use (function-level imports: the model code is
# optional for the other commands), imported with the steps' flow modules while the ephemeral API
# starts (:func:`step_modules`): matplotlib's pyplot (the corpus build's histogram), the
# pre-ranker's BERT and the reader's T5 through transformers' Auto classes, and deepspeed, which
# accelerate imports at the first model it unwraps when it is installed. ~7 CPU s on a fresh
# process, besides the flow modules' ~5 (torch).
LAZY_IMPORTS: dict[str, tuple[str, ...]] = {
    "corpus-wikispeedia": ("matplotlib.pyplot",),     # the build's cluster-size histogram
    "distillation": ("transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
                     "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5", "deepspeed"),
    "evaluate": ("transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
                 "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5"),
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
    """Run the selected steps; return ``{step: summary}`` plus seconds per step (also written to
    :func:`summary_path`)."""
    unknown = [s for s in [*cfg.steps, *cfg.overrides] if s not in STEPS]
    if unknown:
        raise ValueError(f"demo: unknown step(s) {unknown}; known: {list(STEPS)}")
    missing = [f for _, _, f in (STEPS[s] for s in cfg.steps) if not (CONFIG_DIR / f).is_file()]
    missing += [] if (CONFIG_DIR / DEMO_SIZES).is_file() else [DEMO_SIZES]
    if missing:
        raise FileNotFoundError(f"demo: step config(s) {missing} missing in {CONFIG_DIR}")
    out: dict[str, Any] = {}
    for i, step in enumerate(cfg.steps, 1):
        cmd, step_cfg = step_command(cfg, step)
        log.info("demo: step %d/%d %s (%s, %s)", i, len(cfg.steps), step, cmd.name, STEPS[step][2])
        t0 = time.perf_counter()
        out[step] = cmd.run(step_cfg)
        out[step]["step_seconds"] = time.perf_counter() - t0
        log.info("demo: step %s done in %.0f s", step, out[step]["step_seconds"])
    write_json(summary_path(cfg), out)
    return out


def step_command(cfg: DemoConfig, step: str) -> tuple[FlowCommand, Any]:
    """The command of ``step`` and its config: the YAML file, the demo's sizes for the step
    (:func:`demo_sizes`), ``cfg.overrides[step]``, the demo's workspace."""

    module, command, config_file = STEPS[step]
    cmd = next(c for c in importlib.import_module(module).COMMANDS if c.name == command)
    data = yaml.safe_load((CONFIG_DIR / config_file).read_text()) or {}
    for layer in (demo_sizes().get(step, {}), cfg.overrides.get(step, {}), {"workspace": cfg.workspace.model_dump()}):
        data = deep_merge(data, layer)
    return cmd, cmd.config_model.model_validate(data)


def demo_sizes(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The demo's own settings per step (``configs/demo.yaml``), merged over the step's shipped config.

    Raises
    ------
    ValueError
        The file is not a mapping of known step names to mappings (names the file and the step).
    """
    path = path or CONFIG_DIR / DEMO_SIZES
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of step name to settings, got {type(data).__name__}")
    for step, settings in data.items():
        if step not in STEPS or not isinstance(settings, dict):
            raise ValueError(f"{path}: {step!r} must be one of {list(STEPS)} with a mapping of settings")
    return data


def step_modules(cfg: DemoConfig) -> list[str]:
    """The flow modules of ``cfg``'s steps and the heavy modules they import at first use
    (:data:`LAZY_IMPORTS`), in step order without repeats: the CLI imports them while the
    ephemeral API starts (:attr:`funnelrag.config.FlowCommand.imports`), so a later step does not
    import torch and transformers on one core while the other waits."""
    return list(dict.fromkeys(m for s in cfg.steps if s in STEPS for m in (STEPS[s][0], *LAZY_IMPORTS.get(s, ()))))


def summary_path(cfg: DemoConfig) -> Path:
    """Where the demo writes its full summary (every step's): ``<home>/demo-summary.json``."""
    return Path(cfg.workspace.home) / SUMMARY_FILE


COMMANDS = [FlowCommand("demo", "run the main job on the embedded defaults and the real sample data", DemoConfig, run_demo,
                        screen=lambda cfg, out: demo_screen(out, cfg, step_command, summary_path(cfg)),
                        imports=step_modules)]
