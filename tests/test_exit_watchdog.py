"""The exit watchdog (tests/exit_watchdog.py) turns a hang after the last test into a failure
with tracebacks, and leaves a run that ends cleanly alone."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "test_case.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "FUNNELRAG_TEST_EXIT_LIMIT_S": "5",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.exit_watchdog", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_case.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return out, time.monotonic() - t0


@pytest.mark.slow
def test_a_thread_left_running_fails_the_run_with_its_traceback(tmp_path):
    out, seconds = _pytest(tmp_path, """
        import threading, time

        def sleeps_for_ever():
            while True:
                time.sleep(1)

        def test_leaves_a_thread():
            threading.Thread(target=sleeps_for_ever, name="left-behind").start()
    """)
    assert "1 passed" in out.stdout
    assert out.returncode != 0 and seconds < 60
    assert "sleeps_for_ever" in out.stderr and "exit watchdog" in out.stderr


@pytest.mark.slow
def test_a_clean_run_ends_with_its_own_status(tmp_path):
    out, seconds = _pytest(tmp_path, """
        def test_nothing_left():
            assert True
    """)
    assert out.returncode == 0 and seconds < 60, out.stderr
