"""A flow run started by a worker (no CLI) keeps our INFO lines: the flows package gives our
loggers level INFO where none was set, and the work pool's environment in prefect.yaml routes them
to the run logs (the real-server test checks the lines arrive)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from flows import RUN_LOGGERS

ROOT = Path(__file__).resolve().parents[1]


def _levels(code: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_a_flow_module_sets_our_loggers_to_info_under_prefects_warning_root():
    code = ("import logging, prefect, flows.embed\n"
            "print(logging.getLogger().getEffectiveLevel(), "
            "*(logging.getLogger(n).getEffectiveLevel() for n in flows.RUN_LOGGERS), "
            "logging.getLogger('tasks.corpus.ingest').isEnabledFor(logging.INFO))")
    root, *ours, child_info = _levels(code)
    assert int(root) == 30 and ours == ["20"] * len(RUN_LOGGERS) and child_info == "True"


def test_a_level_set_before_the_import_is_kept():
    code = "import logging; logging.getLogger('tasks').setLevel(logging.DEBUG); import flows; print(logging.getLogger('tasks').level)"
    assert _levels(code) == ["10"]


def test_every_deployment_sends_our_loggers_to_the_run_logs():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for dep in spec["deployments"]:
        env = dep["work_pool"]["job_variables"]["env"]
        assert env["PREFECT_LOGGING_EXTRA_LOGGERS"].split(",") == list(RUN_LOGGERS), dep["name"]
