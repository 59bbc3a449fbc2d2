"""The nightly bench's CPU accounting of a process tree (what ``--server`` charges a night with)."""
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
