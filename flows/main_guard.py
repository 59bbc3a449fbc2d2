"""A flow started by a script without an ``if __name__ == "__main__":`` guard, said as such.

A local pool's worker processes start from ``spawn`` or a ``forkserver``
(:func:`flows.runners.worker_context`), and ``multiprocessing`` makes each one import the main
script first (as ``__mp_main__``, so that functions defined there can be unpickled). A script
that starts a flow at its top level, without the guard, then starts the flow again in every
worker (its own ephemeral API, a minute on a busy box), whose pool cannot start processes while
the worker is still bootstrapping (``RuntimeError: An attempt has been made to start a new
process before the current process has finished its bootstrapping phase``): the worker dies and
the parent sees only a broken pool, which read like a worker killed by the OOM killer. Such a
script fails on every try, so :func:`check_main_guard` refuses it before any worker starts, and
:class:`flows.runners.ShardFuture` names it instead of retrying when a pool broke anyway.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from funnelrag.errors import BadInput


class MainGuardMissing(BadInput):
    """The main script starts a flow with a process pool and has no ``__main__`` guard (the
    message names the script and the fix)."""


def unguarded_main_script() -> str | None:
    """The path of the main script when its worker processes would run it again: ``__main__`` is
    a file (``python script.py``, ``python -m pkg.script``) whose top level has no ``if`` testing
    ``__name__``. ``None`` otherwise: ``python -c``, a REPL or notebook, a package's
    ``__main__.py`` (``multiprocessing`` does not import those again), a console script or
    ``funnelrag`` itself (guarded), a file that cannot be read or parsed."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if not path or spec_name == "__main__" or spec_name.endswith(".__main__"):
        return None
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__"
                                            for n in ast.walk(node.test)):
            return None
    return str(path)


def guard_message(script: str) -> str:
    """Two lines: what went wrong with ``script`` and the fix."""
    return (f"{script} starts a flow whose shard tasks run in worker processes, and it has no "
            "`if __name__ == \"__main__\":` guard: each worker imports the main script as it starts and "
            "would run the flow again (and die: its pool cannot start processes while it bootstraps).\n"
            f"Fix: in {script}, put the code that starts the flow under `if __name__ == \"__main__\":` "
            "(or run the flow with `funnelrag <command>`).")


def check_main_guard() -> None:
    """Refuse to start worker processes for a main script without a ``__main__`` guard.

    Raises
    ------
    MainGuardMissing
        :func:`unguarded_main_script` found one; the message names it and the fix.
    """
    script = unguarded_main_script()
    if script is not None:
        raise MainGuardMissing(guard_message(script))
