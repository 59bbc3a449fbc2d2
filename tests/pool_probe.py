"""What a local pool worker sees, in a module that imports nothing heavy (a worker imports the
module of each function it runs, so a probe kept in a test module would load Prefect there)."""
from __future__ import annotations

import gc
import os
import sys


def worker_facts(name: str) -> dict:
    """A pool worker's pid and parent, whether it forked from the preloaded forkserver, the
    parent's environment variable ``name``, its young collection threshold, whether Prefect is
    loaded in it."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "preloaded": "flows.pool_worker" in sys.modules,
            "env": os.environ.get(name), "young": gc.get_threshold()[0], "prefect": "prefect" in sys.modules}


def warn_and_tell(text: str) -> int:
    """Logs ``text`` at INFO and at WARNING on a logger of the run (``funnelrag.verify``, as a cache
    check does in a worker); returns the worker's pid."""
    import logging

    logging.getLogger("funnelrag.verify").info("progress: %s", text)
    logging.getLogger("funnelrag.verify").warning("discarded: %s", text)
    return os.getpid()
