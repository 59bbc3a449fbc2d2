"""A flow started by a script without an ``if __name__ == "__main__":`` guard: refused before its
pool starts a worker, naming the script and the fix (not "a worker died ... OOM killer?"), and named
instead of retried when a pool broke under such a script."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from flows.main_guard import MainGuardMissing, unguarded_main_script
from flows.runners import ShardFuture, ShardWorkerDied

ROOT = Path(__file__).resolve().parents[1]
FLOW = '''from prefect import flow

from flows.runners import RunnerConfig, ShardRunner


@flow
def tiny():
    with ShardRunner(RunnerConfig(workers=1)) as runner, runner.pool("tiny") as pool:
        return pool.submit(abs, -3).result()

'''
CALL = 'print("result", tiny())\n'
GUARDED = FLOW + 'if __name__ == "__main__":\n    ' + CALL


def _main_module(monkeypatch, path: Path | None, spec_name: str | None = None) -> None:
    main = types.ModuleType("__main__")
    if path is not None:
        main.__file__ = str(path)
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    monkeypatch.setitem(sys.modules, "__main__", main)


@pytest.mark.parametrize("source, unguarded", [
    (FLOW + CALL, True),
    (GUARDED, False),
    (FLOW + 'if "__main__" == __name__:\n    ' + CALL, False),
    (FLOW + "def main():\n    tiny()\n\n\nmain()\n", True),
])
def test_unguarded_main_script(monkeypatch, tmp_path, source, unguarded):
    script = tmp_path / "run_flow.py"
    script.write_text(source)
    _main_module(monkeypatch, script)
    assert unguarded_main_script() == (str(script) if unguarded else None)


def test_no_script_no_guard_needed(monkeypatch, tmp_path):
    _main_module(monkeypatch, None)                  # python -c, a REPL
    assert unguarded_main_script() is None
    script = tmp_path / "__main__.py"
    script.write_text(FLOW + CALL)
    _main_module(monkeypatch, script, "mypkg.__main__")   # python -m mypkg: not imported again by workers
    assert unguarded_main_script() is None
    _main_module(monkeypatch, tmp_path / "gone.py")  # unreadable: no claim
    assert unguarded_main_script() is None


class BrokenEveryTime:
    """A pool whose every attempt finds its worker dead (what a real pool of a dying script gives)."""

    def __init__(self, interrupted: bool = False):
        self.calls: list[tuple] = []
        self.renewed = 0
        self.interrupted = interrupted

    def submit_once(self, fn, args):
        self.calls.append(args)
        future = Future()
        future.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
        return len(self.calls), future

    def renew(self, broken) -> bool:
        self.renewed += 1
        return True


def test_broken_pool_under_an_unguarded_script_is_named_not_retried(monkeypatch, tmp_path):
    script = tmp_path / "nightly_by_hand.py"
    script.write_text(FLOW + CALL)
    _main_module(monkeypatch, script)
    pool = BrokenEveryTime()
    with pytest.raises(MainGuardMissing, match=r"shard abs\(-3\) of builtins: its worker process died; .*nightly_by_hand\.py"):
        ShardFuture(pool, abs, (-3,)).result()
    assert pool.calls == [(-3,)] and pool.renewed == 0   # no retry: it would fail the same way

    script.write_text(GUARDED)   # a guarded script: a dead worker is retried on a fresh pool, then named
    pool = BrokenEveryTime()
    with pytest.raises(ShardWorkerDied, match="OOM killer"):
        ShardFuture(pool, abs, (-3,)).result()
    assert len(pool.calls) == 3 and pool.renewed == 2


def _run(script: Path, api_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api_url}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_real_script_without_a_guard_is_told_the_fix(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL  # noqa: PLC0415  (heavy: prefect)

    script = tmp_path / "nightly_by_hand.py"
    script.write_text(FLOW + CALL)
    proc = _run(script, PREFECT_API_URL.value())
    assert proc.returncode != 0
    assert f"MainGuardMissing: {script} starts a flow" in proc.stderr, proc.stderr[-3000:]
    assert f'Fix: in {script}, put the code that starts the flow under `if __name__ == "__main__":`' in proc.stderr
    assert "OOM" not in proc.stderr and "bootstrapping phase" not in proc.stderr   # no worker started

    script.write_text(GUARDED)   # the fix works: its worker imports the script and runs the shard
    proc = _run(script, PREFECT_API_URL.value())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result 3" in proc.stdout


def test_a_pool_broken_by_an_interrupt_is_not_renewed():
    """After the run's SIGTERM / Ctrl-C handler stopped the pool's workers (``interrupted``), a
    broken shard raises at once: no fresh pool, no second attempt."""
    pool = BrokenEveryTime(interrupted=True)
    with pytest.raises(BrokenProcessPool):
        ShardFuture(pool, abs, (-3,)).result()
    assert pool.calls == [(-3,)] and pool.renewed == 0
