"""A first run on a fresh machine: a real CLI command in a subprocess with a brand-new
PREFECT_HOME (the ephemeral API creates and migrates its database) and no startup limit of ours in
the environment exits 0, starts exactly one temporary API server (the spawned workers of the
process pool use the parent's), and shows progress and module log lines."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STRIPPED = ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "PREFECT_API_URL", "PREFECT_LOGGING_LEVEL",
            "PREFECT_LOGGING_EXTRA_LOGGERS", "PREFECT_PROFILE")


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_build_corpus_on_a_fresh_prefect_home_starts_one_server(tmp_path, data_mirror):
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(ROOT),
               NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    home = tmp_path / "home"
    # The start-up's numba warm-up (flows/numba_warmup.py), alone on an empty cache: the build
    # after it compiles nothing more (a new signature would rewrite its kernel's cache index).
    warm = subprocess.run([sys.executable, "-m", "flows.numba_warmup"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-4000:]
    compiled = _files(tmp_path / "numba-cache")
    kernel_files = {Path(name).name.split(".")[0] for name in compiled if name.endswith(".nbi")}
    assert {"lookup", "graph", "clustering", "bm25_csc", "bm25_query", "token_memo"} <= kernel_files, sorted(compiled)
    proc = subprocess.run(
        [sys.executable, "-m", "funnelrag.cli", "build-corpus", "--config", "configs/corpus_enwiki_sample.yaml",
         "--set", f"workspace.home={home}", "--set", f"workspace.data_mirror={data_mirror}",
         "--set", "runner.workers=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert log.count("Starting temporary server") == 1, log[-4000:]
    assert "ingest pass 1: " in log and "token counts: 98/98 documents" in log   # funnelrag.progress lines
    assert "funnelrag.store - published" in log                                 # module loggers reach the terminal
    assert "token counts of documents 0-97: 98/98 documents" in log             # and those of a pool worker
    assert (home / "stores" / "corpus" / "enwiki-sample").is_dir()
    assert _files(tmp_path / "numba-cache") == compiled            # every kernel the build called was warm
    assert "MLflow: creating the tracking store" not in log          # made while the API started
    assert (home / "mlflow.db").is_file()


PROBE = ("from funnelrag.cli import prefect_process_defaults; prefect_process_defaults(); "
         "from prefect.settings import get_current_settings as g; s = g(); "
         "print(s.server.ephemeral.startup_timeout_seconds, ','.join(s.logging.extra_loggers))")


@pytest.mark.parametrize("profile, env_value, expected", [
    (None, None, "300"),     # nothing set: the CLI's limit for a fresh 2-core box
    (77, None, "77"),        # the user's profile wins
    (77, "45", "45"),        # the environment wins over the profile, as in Prefect
])
def test_startup_limit_defers_to_the_users_setting(tmp_path, profile, env_value, expected):
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED}
    env.update(PREFECT_HOME=str(tmp_path), PYTHONPATH=str(ROOT), PREFECT_LOGGING_EXTRA_LOGGERS="mylib")
    if profile is not None:
        (tmp_path / "profiles.toml").write_text(
            f'active = "mine"\n[profiles.mine]\nPREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS = {profile}\n')
    if env_value is not None:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    timeout, loggers = out.stdout.split()
    assert timeout == expected
    assert set(loggers.split(",")) == {"mylib", "funnelrag", "flows", "tasks", "models"}   # the user's kept, ours added
