"""Training under ``accelerate launch``: the launcher (flow side) and the spec helpers (rank side).

A trained model's flow task either trains in its own process (``kind: in_process``) or writes a
*spec* (one JSON file: inputs, configs, output paths, tracking) and runs

.. code-block:: text

    python -m accelerate.commands.launch --config_file infra/accelerate/<setup>.yaml \\
        --num_processes N --main_process_port P -m <entry module> --spec <spec.json>

(:func:`launch`). Every rank runs the entry module (``flows/launched/``), which trains with
:func:`funnelrag.training.train`; the main rank logs metrics (:func:`metrics_logger`) and writes
the outputs and the result JSON (:func:`write_result`). The launcher streams the ranks' log
lines to the caller's logger, and when a rank fails raises :class:`LaunchFailed` with that
rank's traceback (:func:`rank_guard` writes it to ``<spec dir>/errors/rank<r>.txt``). A
relaunch of the same spec resumes from the newest complete checkpoint of its run directory
(``train(resume=True)``): a killed launch loses at most ``checkpoint_every`` steps.

Global batch: ``TrainConfig.batch_size`` in a flow config is the batch of one micro-step over
all processes; :func:`per_process_train_config` divides it by the number of processes, so a
launch on N processes trains on the same batches as one process (same weights within floating
point tolerance), which is why the launch settings are not part of any cache key.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import psutil
import yaml
from pydantic import BaseModel, ConfigDict, Field

from data_contracts.base import atomic_write_bytes

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC_FILE = "spec.json"
RESULT_FILE = "result.json"
ERRORS_DIR = "errors"
TAIL_LINES = 40


class LaunchConfig(BaseModel):
    """How a flow trains a model (the ``training.launch`` section of a flow config).

    kind : ``in_process`` (the flow task's own process; default, CPU and demo) or ``accelerate``
        (``accelerate launch`` of the model's entry module, one process per rank).
    config : accelerate YAML, relative to the repository root or absolute
        (``infra/accelerate/single_gpu.yaml``, ``multi_gpu_deepspeed_zero2.yaml``, ...).
    num_processes : ranks; None = every visible GPU, or on a machine without one the YAML's count.
    cpu : run the ranks on CPU (gloo); None = when no GPU is visible.
    timeout_s : wall-clock limit of one launch (None: none); the process group is killed past it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["in_process", "accelerate"] = "in_process"
    config: str = "infra/accelerate/single_gpu.yaml"
    num_processes: int | None = Field(default=None, ge=1)
    cpu: bool | None = None
    timeout_s: float | None = Field(default=None, gt=0)


class TrainingSection(BaseModel):
    """``training:`` section of a flow config: how its models are trained (not what)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    launch: LaunchConfig = LaunchConfig()


class LaunchFailed(RuntimeError):
    """A launched training failed: ``rank`` (None if unknown), ``returncode``, ``tail`` (its last lines)."""

    def __init__(self, message: str, rank: int | None, returncode: int, tail: str):
        super().__init__(message)
        self.rank, self.returncode, self.tail = rank, returncode, tail


# ---------------------------------------------------------------------------- flow side
def config_path(config: str | Path) -> Path:
    """The accelerate YAML ``config`` (relative to the repository root), checked to exist.

    Raises
    ------
    FileNotFoundError
        No such file.
    """
    path = Path(config)
    path = path if path.is_absolute() else REPO_ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"training.launch.config: {path} does not exist")
    return path


def _yaml(config: str | Path) -> dict[str, Any]:
    return yaml.safe_load(config_path(config).read_text()) or {}


def yaml_num_processes(config: str | Path) -> int:
    """``num_processes`` of an accelerate YAML (1 when absent)."""
    return int(_yaml(config).get("num_processes", 1))


def resolve_processes(cfg: LaunchConfig) -> tuple[int, bool]:
    """``(num_processes, cpu)`` of a launch: GPUs visible → all of them, on GPU (one for a
    single-process YAML, ``distributed_type: 'NO'``); else the YAML's count, on CPU. Explicit
    ``num_processes`` / ``cpu`` win."""
    import torch  # noqa: PLC0415  (heavy: torch, only to count the GPUs)

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpu = cfg.cpu if cfg.cpu is not None else gpus == 0
    if cfg.num_processes:
        return cfg.num_processes, cpu
    if cpu or gpus == 0 or str(_yaml(cfg.config).get("distributed_type", "NO")).upper() == "NO":
        return yaml_num_processes(cfg.config), cpu
    return gpus, cpu


def per_process_train_config(train_cfg, num_processes: int):
    """``train_cfg`` with its global ``batch_size`` split over ``num_processes`` ranks.

    Raises
    ------
    ValueError
        ``batch_size`` is not a multiple of ``num_processes``.
    """
    if train_cfg.batch_size % num_processes:
        raise ValueError(f"batch_size {train_cfg.batch_size} (the global batch) is not a multiple of "
                         f"{num_processes} processes: pick a multiple or training.launch.num_processes")
    return replace(train_cfg, batch_size=train_cfg.batch_size // num_processes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_command(config: str | Path, num_processes: int, module: str, spec: Path, port: int) -> list[str]:
    """The ``accelerate launch`` command line of ``module`` with ``spec``."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_path(config)),
            "--num_processes", str(num_processes), "--num_machines", "1", "--main_process_port", str(port),
            "-m", module, "--spec", str(spec)]


def child_env(cpu: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the launched ranks: this checkout first on ``PYTHONPATH`` (the ranks import
    the code that launched them, not another installed copy), CPU selection, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                           "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if cpu:
        env["ACCELERATE_USE_CPU"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def launch(module: str, spec: dict[str, Any], spec_dir: Path, cfg: LaunchConfig, *,
           logger: logging.Logger | logging.LoggerAdapter | None = None,
           env: dict[str, str] | None = None, on_start: Callable[[subprocess.Popen], None] | None = None) -> dict[str, Any]:
    """Run ``module`` under ``accelerate launch`` with ``spec`` and return its result JSON.

    Parameters
    ----------
    module : entry module (``flows.launched.reader``), run with ``--spec`` on every rank.
    spec : JSON-ready settings of the entry module; ``result_path`` is added (``spec_dir/result.json``).
    spec_dir : where the spec, the result and the ranks' error files go (a stable directory: a
        relaunch there resumes the run's checkpoints).
    cfg : :class:`LaunchConfig` (``kind`` is not looked at).
    logger : receives every output line of the ranks at INFO (default: this module's).
    env : extra environment variables of the ranks.
    on_start : called with the ``Popen`` of the launcher (tests kill its process group).

    Returns
    -------
    dict
        The result JSON the main rank wrote.

    Raises
    ------
    LaunchFailed
        A rank failed (message: rank, exit status and the last lines of its traceback), the
        launch ran past ``cfg.timeout_s`` (launcher and ranks killed), or it ended without a result.
    """
    logger = logger or log
    spec_dir = Path(spec_dir)
    spec_dir.mkdir(parents=True, exist_ok=True)
    errors = spec_dir / ERRORS_DIR
    for stale in errors.glob("rank*.txt") if errors.is_dir() else ():
        stale.unlink()
    result_path = spec_dir / RESULT_FILE
    result_path.unlink(missing_ok=True)
    n, cpu = resolve_processes(cfg)
    spec = {**spec, "result_path": str(result_path), "errors_dir": str(errors)}
    spec_path = spec_dir / SPEC_FILE
    atomic_write_bytes(spec_path, json.dumps(spec, indent=1, sort_keys=True).encode())
    cmd = build_command(cfg.config, n, module, spec_path, free_port())
    logger.info("launching %s on %d %s process(es): %s", module, n, "CPU" if cpu else "GPU", " ".join(cmd))
    t0 = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=200)
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=child_env(cpu, env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    if on_start is not None:
        on_start(proc)
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        _kill_group(proc)

    timer = threading.Timer(cfg.timeout_s, on_timeout) if cfg.timeout_s is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            logger.info("%s", line)
        rc = proc.wait()
    except BaseException:  # interrupt, a failing logger: no rank may outlive its launcher
        _kill_group(proc)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
    seconds = time.monotonic() - t0
    if timed_out.is_set():
        raise LaunchFailed(f"{module}: killed after training.launch.timeout_s={cfg.timeout_s} s (resumes from its "
                           f"last checkpoint when relaunched):\n" + "\n".join(list(tail)[-TAIL_LINES:]),
                           None, rc, "\n".join(list(tail)[-TAIL_LINES:]))
    if rc != 0 or not result_path.is_file():
        rank, text = failed_rank(errors)
        where = f"rank {rank}" if rank is not None else "a rank"
        body = text or "\n".join(list(tail)[-TAIL_LINES:])
        raise LaunchFailed(f"{module} failed on {where} (launcher exit status {rc}) after {seconds:.0f} s:\n{body}",
                           rank, rc, body)
    result = json.loads(result_path.read_text())
    result.setdefault("launch", {}).update(num_processes=n, cpu=cpu, config=str(cfg.config), wall_s=seconds)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank. torchrun starts each rank in a session of its own, so
    the launcher's process group does not hold them: the descendants are collected first."""
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait()


def failed_rank(errors_dir: Path) -> tuple[int | None, str]:
    """``(rank, last lines of its traceback)`` of the first rank that wrote an error file
    (:func:`rank_guard`), or ``(None, "")``."""
    files = sorted(Path(errors_dir).glob("rank*.txt"), key=lambda p: p.stat().st_mtime) if Path(errors_dir).is_dir() else []
    if not files:
        return None, ""
    lines = files[0].read_text().splitlines()
    return int(files[0].stem[4:]), "\n".join(lines[-TAIL_LINES:])


# ---------------------------------------------------------------------------- rank side
def read_spec(argv: list[str] | None = None) -> dict[str, Any]:
    """The spec of ``--spec <file>`` on the command line of an entry module."""
    parser = argparse.ArgumentParser(description="a funnelrag training entry point (run under accelerate launch)")
    parser.add_argument("--spec", required=True, type=Path, help="spec JSON written by funnelrag.launch.launch")
    return json.loads(parser.parse_args(argv).spec.read_text())


def die_with_parent() -> None:
    """Have the kernel SIGKILL this rank when its parent (the torchrun agent) dies (Linux
    ``PR_SET_PDEATHSIG``). torchrun puts every rank in a session of its own, so a SIGKILL of the
    launch's process group (a killed flow task or worker) would otherwise leave the ranks training
    as orphans, holding the run directory's lock against the relaunch that should resume it."""
    if not sys.platform.startswith("linux"):
        return

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the call: do not train as an orphan
        os._exit(1)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def configure_logging() -> None:
    """INFO lines on stderr, prefixed with the rank (entry modules only; the flow process keeps its own)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format=f"[rank {rank()}] %(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("urllib3", "filelock", "httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def rank_guard(spec: dict[str, Any]) -> Iterator[None]:
    """Write the traceback of an exception of this rank to ``<errors_dir>/rank<r>.txt`` and re-raise."""
    try:
        yield
    except BaseException as exc:
        errors = spec.get("errors_dir")
        if errors and not isinstance(exc, KeyboardInterrupt):
            Path(errors).mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(Path(errors) / f"rank{rank()}.txt", traceback.format_exc().encode())
        raise


def entry_main(run: Callable[[dict[str, Any]], Any], argv: list[str] | None = None) -> None:
    """The ``main`` of every training entry module: read ``--spec``, die with the torchrun agent,
    log with the rank, and run ``run(spec)`` with this rank's error written for the launcher."""
    spec = read_spec(argv)
    die_with_parent()
    configure_logging()
    with rank_guard(spec):
        run(spec)


def metrics_logger(spec: dict[str, Any]) -> Callable[[dict[str, float], int], None] | None:
    """``log_metrics`` of the main rank from ``spec["tracking"]``:

    * ``{"kind": "mlflow", "uri": ..., "run_id": ..., "prefix": "reader"}``: step metrics into the
      flow's MLflow run (the flow's own run, ``train/loss`` → ``reader/loss``; no new run);
    * ``{"kind": "jsonl", "path": ..., "prefix": ...}``: one JSON line per call (no MLflow needed);
    * absent or ``{"kind": "none"}``: nothing.
    """
    tracking = spec.get("tracking") or {"kind": "none"}
    prefix = tracking.get("prefix")

    def rename(metrics: dict[str, float]) -> dict[str, float]:
        if not prefix:
            return dict(metrics)
        return {f"{prefix}/{k.split('/', 1)[-1]}": float(v) for k, v in metrics.items()}

    if tracking["kind"] == "mlflow":
        from mlflow import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when a rank logs to MLflow)
        from mlflow.entities import Metric  # noqa: PLC0415  (heavy: mlflow, only when a rank logs to MLflow)

        client = MlflowClient(tracking_uri=tracking["uri"])

        def log_mlflow(metrics: dict[str, float], step: int) -> None:
            now = int(time.time() * 1000)
            client.log_batch(tracking["run_id"], metrics=[Metric(k, v, now, step) for k, v in rename(metrics).items()])
        return log_mlflow
    if tracking["kind"] == "jsonl":
        path = Path(tracking["path"])
        path.parent.mkdir(parents=True, exist_ok=True)

        def log_jsonl(metrics: dict[str, float], step: int) -> None:
            with open(path, "a") as fh:
                fh.write(json.dumps({"step": step, **rename(metrics)}) + "\n")
        return log_jsonl
    if tracking["kind"] != "none":
        raise ValueError(f"spec tracking kind must be mlflow, jsonl or none, got {tracking['kind']!r}")
    return None


def write_result(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """The main rank's result JSON, written atomically (its presence means success)."""
    atomic_write_bytes(Path(spec["result_path"]), json.dumps(result, indent=1, sort_keys=True).encode())


def is_main_process() -> bool:
    return rank() == 0


def peak_gpu_memory_gib() -> float | None:
    """Peak GPU memory allocated by this process (GiB), None without CUDA."""
    import torch  # noqa: PLC0415  (heavy: torch, only to read the peak GPU memory)

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
