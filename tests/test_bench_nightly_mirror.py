"""Bench tools: the nightly bench's CPU accounting of a process tree (what ``--server`` charges a
night with) and the collector timing of ``benchmarks/gc_time``."""
import subprocess
import sys
import time

import pytest

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_tree_cpu_counts_a_processs_children_live_and_exited():
    """A process that burns 0.3 CPU s in a child it waited for, then starts a grandchild that burns
    and sleeps: the tree's CPU covers both children's burns; a process that is gone counts 0."""
    import os
    import signal

    from benchmarks.bench_nightly_mirror import _tree_cpu_s, _TreeCPU

    script = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN.format(s=0.3)!r}])\n"
              f"subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.3) + 'time.sleep(60)'!r}]).wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while _tree_cpu_s(proc.pid) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _tree_cpu_s(proc.pid) >= 0.6   # 0.3 s exited (the parent's children time) + 0.3 s live
    finally:
        for pid in reversed(_TreeCPU.tree(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
    assert _tree_cpu_s(proc.pid) == 0.0


def test_gc_time_site_writes_each_processs_collections(tmp_path):
    """benchmarks/gc_time: a process started with it and FUNNELRAG_GC_TIME_DIR writes its full
    collections and their CPU time; without the variable it writes nothing."""
    import ast
    import os
    from pathlib import Path

    site = Path(__file__).resolve().parents[1] / "benchmarks" / "gc_time"
    code = "import gc\nfor _ in range(3): gc.collect()\n"
    env = {**os.environ, "PYTHONPATH": str(site), "FUNNELRAG_GC_TIME_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    lines = [p.read_text() for p in tmp_path.glob("*.txt")]
    assert len(lines) == 1
    collections = ast.literal_eval(lines[0].split("collections=")[1].split(" cpu_s=")[0])
    assert collections[2] >= 3
    env.pop("FUNNELRAG_GC_TIME_DIR")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert len(list(tmp_path.glob("*.txt"))) == 1


@pytest.mark.slow  # starts a Prefect server (~20 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_bench_server_is_the_deploying_script_and_stops(tmp_path):
    """--server's server comes from infra/server/prefect-server.sh: healthy, its CPU readable while
    it runs, gone after stop."""
    from pathlib import Path

    import httpx

    from benchmarks.bench_nightly_mirror import _PrefectServer

    server = _PrefectServer(tmp_path / "prefect")
    try:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        assert server.cpu_s() > 0
    finally:
        server.stop()
    assert not Path(f"/proc/{server.pid}").exists()
    assert server.cpu_s() == 0.0
