"""A flow run started by a worker (no CLI) keeps our INFO lines: the worker loads the entrypoint
file directly and Prefect's root logger stays at WARNING, so the flow's config resolution gives
our loggers level INFO where none was set, and the work pool's environment in prefect.yaml routes
them to the run logs (tests/test_deploy_server.py checks that the lines arrive)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from funnelrag.config import RUN_LOGGERS

ROOT = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
ENTRYPOINTS = sorted({d["entrypoint"] for d in SPEC["deployments"]})


def _run(code: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_a_worker_loaded_entrypoint_alone_leaves_our_info_lines_dropped():
    """Why the flows set the levels: loading an entrypoint as the worker does sets none."""
    code = ("import logging, prefect\n"
            "from prefect.flows import load_flow_from_entrypoint\n"
            "load_flow_from_entrypoint('flows/embed.py:embed_flow')\n"
            "print(logging.getLogger('funnelrag.progress').isEnabledFor(logging.INFO))")
    assert _run(code) == ["False"]


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_every_deployed_flow_resolves_its_config_first(entrypoint):
    """Each deployment's flow function calls resolve_flow_config (which sets the levels) before
    anything else it does: its first statement after the docstring and its deferred imports."""
    import ast

    path, name = entrypoint.split(":")
    tree = ast.parse((ROOT / path).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            and not isinstance(s, (ast.Import, ast.ImportFrom))]
    calls = {n.func.id for n in ast.walk(body[0]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "resolve_flow_config" in calls, f"{entrypoint}: first statement is {ast.unparse(body[0])[:120]}"


def test_resolving_a_flow_config_sets_our_loggers_to_info_and_keeps_a_level_set_before():
    code = ("import logging, prefect\n"
            "logging.getLogger('tasks').setLevel(logging.DEBUG)\n"
            "from prefect.flows import load_flow_from_entrypoint\n"
            "load_flow_from_entrypoint('flows/embed.py:embed_flow')\n"
            "from flows.embed import EmbedConfig\n"
            "from funnelrag.config import RUN_LOGGERS, resolve_flow_config\n"
            "resolve_flow_config(EmbedConfig, None, None, [], 'unused-home')\n"
            "print(logging.getLogger().getEffectiveLevel(), *(logging.getLogger(n).level for n in RUN_LOGGERS), "
            "logging.getLogger('funnelrag.progress').isEnabledFor(logging.INFO))")
    root, funnelrag, flows, tasks, models, progress_info = _run(code)
    assert root == "30" and (funnelrag, flows, tasks, models) == ("20", "20", "10", "20") and progress_info == "True"


def test_every_deployment_sends_our_loggers_to_the_run_logs():
    for dep in SPEC["deployments"]:
        env = dep["work_pool"]["job_variables"]["env"]
        assert env["PREFECT_LOGGING_EXTRA_LOGGERS"].split(",") == list(RUN_LOGGERS), dep["name"]
