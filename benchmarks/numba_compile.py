"""What numba compiles on a fresh checkout, and how long each compilation takes.

Every ``numba.njit(cache=True)`` kernel of the project keeps its compiled code in the
``__pycache__`` beside its module, one entry per type signature it was called with; a fresh
checkout (a new user, a CI run) compiles every signature a run calls once. This script lists,
for a checkout where a run has just finished (e.g. ``funnelrag demo``), every kernel signature
its numba cache holds, then compiles each of them again in a child process with an empty
cache (``NUMBA_CACHE_DIR`` set to a new temporary directory) and reports the wall and CPU
seconds of each compilation (a kernel's inlined or called kernels compile with their first
caller and count there), plus the numba import and LLVM start-up that any first compilation
of a process pays. (The CLI compiles the corpus build's kernels beside the build's first
stage, ``flows/numba_warmup.py``; this script measures what that child does.)

Run: ``python benchmarks/numba_compile.py [--checkout DIR] [--json FILE]`` (``DIR``: the
checkout whose numba cache to read, default this one; run it from that checkout, or with
``PYTHONPATH`` set to it, so that its modules are the ones imported).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "funnelrag", "models", "flows")


def kernel_modules(checkout: Path) -> list[str]:
    """Dotted names of the checkout's modules that define a numba kernel (``numba.njit``)."""
    out = []
    for package in PACKAGES:
        for path in sorted((checkout / package).rglob("*.py")):
            if "numba.njit" in path.read_text(encoding="utf-8"):
                out.append(".".join(path.relative_to(checkout).with_suffix("").parts))
    return out


def kernels(module: str) -> dict[str, object]:
    """``{name: dispatcher}`` of the numba kernels defined in ``module``."""
    from numba.core.registry import CPUDispatcher  # noqa: PLC0415  (heavy: numba)

    mod = importlib.import_module(module)
    return {name: f for name, f in vars(mod).items()
            if isinstance(f, CPUDispatcher) and f.py_func.__module__ == module}


def cached_signatures(module: str) -> list[tuple[str, tuple]]:
    """``[(kernel name, argument types)]`` that the on-disk cache of ``module``'s kernels holds."""
    out = []
    for name, f in sorted(kernels(module).items()):
        if f._cache is None or not hasattr(f._cache, "_cache_file"):   # not cache=True
            continue
        for key in f._cache._cache_file._load_index():                  # key[0]: the signature
            out.append((name, tuple(key[0])))
    return out


def compile_all(todo: list[tuple[str, str, tuple]]) -> list[dict]:
    """In this process (whose ``NUMBA_CACHE_DIR`` is empty): compile each ``(module, kernel,
    signature)`` and time it; the first entry is numba's import and a trivial compilation."""
    t0, c0 = time.perf_counter(), time.process_time()
    import numba  # noqa: PLC0415  (heavy: numba)

    numba.njit(lambda x: x + 1)(1)
    rows = [{"kernel": "numba import + LLVM start-up", "signature": "",
             "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}]
    for module, name, sig in todo:
        f = kernels(module)[name]
        t0, c0 = time.perf_counter(), time.process_time()
        f.compile(sig)
        rows.append({"kernel": f"{module}.{name}", "signature": ", ".join(map(str, sig)),
                     "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT, help="checkout whose numba cache to read")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:                                   # the fresh-cache compiling process
        rows = compile_all(pickle.loads(args.child.read_bytes()))
        args.child.with_suffix(".json").write_text(json.dumps(rows))
        return 0
    todo = [(m, name, sig) for m in kernel_modules(args.checkout) for name, sig in cached_signatures(m)]
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "todo.pkl"
        job.write_bytes(pickle.dumps(todo))
        env = {**os.environ, "NUMBA_CACHE_DIR": str(Path(tmp) / "numba-cache")}
        subprocess.run([sys.executable, __file__, "--child", str(job)], check=True, env=env)
        rows = json.loads(job.with_suffix(".json").read_text())
    print(f"{len(todo)} cached kernel signatures in {args.checkout}; compiled again with an empty cache:")
    for r in rows:
        print(f"  {r['wall_s']:6.2f} s wall {r['cpu_s']:6.2f} s CPU  {r['kernel']}  ({r['signature']})")
    print(f"  total {sum(r['wall_s'] for r in rows):.1f} s wall, {sum(r['cpu_s'] for r in rows):.1f} s CPU")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
