"""The one training loop of funnelrag, built on :class:`accelerate.Accelerator`.

Every trained model (FiD reader, DR-RAG classifier, R²-Former, BPR-distilled pre-ranker) plugs
in through two hooks and shares this loop (tevatron's ``compute_loss`` override pattern):

.. code-block:: python

    class MyHooks:                                     # satisfies TrainHooks
        def collate(self, examples: list) -> dict[str, torch.Tensor]: ...
        def loss(self, model, batch) -> tuple[torch.Tensor, dict[str, float]]:
            out = model(**batch)                      # call forward (DDP syncs gradients there)
            return out.loss, {"acc": ...}

    result = train(model, examples, MyHooks(), TrainConfig(output_dir="run/reader", max_steps=100),
                   log_metrics=lambda metrics, step: mlflow.log_metrics(metrics, step=step))
    result.global_step, result.losses, result.last_checkpoint

Contract
--------
* Data order: a sampler seeded by ``(seed, epoch)`` (:class:`EpochSeededSampler`); with ``P``
  processes each optimizer micro-step consumes ``batch_size * P`` examples (accelerate shards
  batches). A resumed run skips the batches already seen and sees exactly the same batches.
* A *step* is one optimizer step (``grad_accum`` micro-batches). ``losses[i]`` is the loss of
  step ``i + 1``: mean over its micro-batches and over processes.
* Checkpoints: ``output_dir/checkpoints/step_{N:08d}/`` = ``accelerator.save_state`` (model,
  optimizer, LR scheduler, RNG states per process) + ``trainer_state.json`` (step, epoch,
  position in the epoch, loss history, config fingerprint) + an empty ``COMPLETE`` marker,
  written under ``.step_{N:08d}.tmp`` and renamed into place. Resume (``resume=True``) takes
  the newest directory that has ``COMPLETE``; half-written ones are ignored. ``load_state`` does
  not restore the step counter, so ``trainer_state.json`` does. A final checkpoint is written
  when training ends (if ``checkpoint_every > 0``), so resuming a finished run is a no-op.
* Metrics: ``log_metrics(metrics, step)`` is called on the main process only, every
  :func:`log_interval` steps (``log_every``, made shorter for a short run so that a loss curve
  has at least :data:`MIN_LOG_POINTS` points: every step when there are fewer) and at the last
  step, with ``train/loss`` (mean over the window), ``train/lr``, ``train/epoch`` and the hook's
  extras as ``train/<name>`` (main-process values).
* Progress: the main process reports through :class:`funnelrag.progress.Progress` (unit
  ``steps``, rate, the last step's ``loss`` as postfix): a tqdm bar on a terminal, else an INFO
  line on ``funnelrag.progress`` at most every 30 s and one at the end.
* Precision: ``"no"`` (fp32) or ``"bf16"``. fp16 is refused: T5's activations overflow in fp16.
* Processes: run under ``accelerate launch --config_file infra/accelerate/<setup>.yaml``; on CPU
  use ``infra/accelerate/cpu_2proc.yaml`` (gloo) — ``cpu=True``/``ACCELERATE_USE_CPU=1`` is
  needed or every rank believes it is rank 0. Checkpoints assume one shared file system.
* After ``train`` returns, the caller's ``model`` object holds the trained weights (single
  process, DDP, ZeRO-1/2). Under ZeRO-3 parameters stay partitioned; the gathered weights are
  in ``TrainResult.full_state_dict`` on the main process: load them into a freshly built module
  with :func:`load_full_state_dict` before saving.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, Sampler

from funnelrag.progress import Progress

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
COMPLETE_MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
# TrainConfig fields that must not change between a checkpoint and its resumption.
_FINGERPRINT_FIELDS = ("seed", "epochs", "max_steps", "batch_size", "grad_accum", "lr",
                       "weight_decay", "warmup_steps", "scheduler")


@dataclass(frozen=True)
class TrainConfig:
    """Settings of :func:`train`.

    output_dir : run directory; checkpoints go to ``output_dir/checkpoints``. Left empty in
        configs (stages set it with ``dataclasses.replace``); :func:`train` refuses an empty one.
    seed : seeds parameters' RNG use (dropout) and the data order, with ``epoch``.
    epochs : passes over the data; ignored when ``max_steps`` is set.
    max_steps : total optimizer steps (overrides ``epochs``).
    batch_size : examples per process per micro-batch.
    grad_accum : micro-batches per optimizer step.
    lr, weight_decay : AdamW settings (no decay on biases and norm weights).
    warmup_steps : linear warm-up steps; then ``scheduler`` = ``"linear"`` (decay to 0 at the
        last step) or ``"constant"``.
    max_grad_norm : gradient clipping (L2 norm); 0 disables.
    mixed_precision : ``"no"`` or ``"bf16"``.
    gradient_checkpointing : call ``model.gradient_checkpointing_enable()`` when it exists.
    checkpoint_every : steps between checkpoints; 0 = never checkpoint.
    keep_checkpoints : newest complete checkpoints kept.
    log_every : steps between metric logs (at most; :func:`log_interval`).
    cpu : force CPU even where an accelerator exists (``ACCELERATE_USE_CPU`` semantics).
    """

    output_dir: str = ""
    seed: int = 0
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    scheduler: str = "linear"
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"
    gradient_checkpointing: bool = False
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 10
    cpu: bool = False

    def __post_init__(self) -> None:
        if self.mixed_precision == "fp16":
            raise ValueError("mixed_precision='fp16' is refused: T5 activations overflow in fp16 "
                             "(inf/NaN loss); use 'bf16' or 'no' (fp32)")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}")
        if self.scheduler not in ("linear", "constant"):
            raise ValueError(f"scheduler must be 'linear' or 'constant', got {self.scheduler!r}")
        for name in ("epochs", "batch_size", "grad_accum", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"TrainConfig.max_steps must be >= 1 or None, got {self.max_steps}")
        if self.checkpoint_every < 0 or self.warmup_steps < 0 or self.max_grad_norm < 0:
            raise ValueError("checkpoint_every, warmup_steps and max_grad_norm must be >= 0")


class TrainHooks(Protocol):
    """What a model plugs into :func:`train`."""

    def collate(self, examples: list) -> dict[str, torch.Tensor]:
        """Turn a list of training examples into a batch of CPU tensors (moved by accelerate)."""

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss of ``batch`` (calling ``model(...)``, the prepared model) and extra
        float metrics to log."""


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    global_step : optimizer steps taken in total (including those before a resume).
    epoch : 0-based epoch of the last step.
    losses : loss of every step, ``losses[i]`` for step ``i + 1``.
    last_checkpoint : newest complete checkpoint directory, or None.
    full_state_dict : gathered weights under DeepSpeed ZeRO-3 (main process), else None.
    """

    global_step: int
    epoch: int
    losses: list[float]
    last_checkpoint: Path | None
    full_state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)


class EpochSeededSampler(Sampler[int]):
    """Permutation of ``range(n)`` that is a pure function of ``(seed, epoch)`` (STYLE 10).

    Call :meth:`set_epoch` before each pass (accelerate's ``DataLoaderShard.set_epoch`` does).
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        gen = torch.Generator()
        gen.manual_seed((self.seed * 1_000_003 + self.epoch) % (2**63 - 1))
        return iter(torch.randperm(self.n, generator=gen).tolist())


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint directories under ``output_dir/checkpoints``, oldest first."""
    root = Path(output_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step_*") if p.is_dir() and (p / COMPLETE_MARKER).exists()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def load_checkpoint_weights(model: torch.nn.Module, checkpoint_dir: str | Path) -> torch.nn.Module:
    """Load the weights of a complete checkpoint of :func:`train` (``model.safetensors`` of the
    whole module) into ``model``, built the way the run built it; returns it in eval mode.

    Raises
    ------
    FileNotFoundError
        ``checkpoint_dir`` has no ``model.safetensors`` (not a complete checkpoint).
    RuntimeError
        The weights do not fit the module: a key missing (other than a tied parameter, which
        safetensors stores once) or unexpected.
    """
    weights = Path(checkpoint_dir) / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights} not found: not a complete training checkpoint")
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"{weights}: missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return model.eval()


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Load ``TrainResult.full_state_dict`` (ZeRO-3's gathered weights, possibly bf16) into a freshly
    built ``model``: the trained module's own parameters stay partitioned (empty) after ZeRO-3, so
    its weights go into a new instance. Tied parameters may be stored once.

    Raises
    ------
    RuntimeError
        A key is missing (other than a tied parameter) or unexpected.
    """
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"gathered weights do not fit {type(model).__name__}: missing "
                           f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return model


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """Newest complete checkpoint directory, or None when there is none."""
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


MIN_LOG_POINTS = 20   # a loss curve with fewer points cannot be read


def log_interval(log_every: int, total_steps: int) -> int:
    """Steps between metric logs: ``log_every``, or shorter so that a run of ``total_steps``
    steps logs at least :data:`MIN_LOG_POINTS` points (every step when it has fewer); >= 1."""
    return max(1, min(log_every, total_steps // MIN_LOG_POINTS))


def _lr_lambda(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        if cfg.scheduler == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - cfg.warmup_steps))
    return factor


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)


def _fingerprint(cfg: TrainConfig, n_examples: int, world_size: int) -> dict[str, Any]:
    fp = {k: asdict(cfg)[k] for k in _FINGERPRINT_FIELDS}
    fp.update(n_examples=n_examples, world_size=world_size)
    return fp


def train(model: torch.nn.Module, train_data: Sequence, hooks: TrainHooks, cfg: TrainConfig, *,
          log_metrics: Callable[[dict[str, float], int], None] | None = None,
          resume: bool = True) -> TrainResult:
    """Train ``model`` on ``train_data`` with AdamW through accelerate; checkpoint and resume.

    Parameters
    ----------
    model : the ``nn.Module`` to train (modified in place; moved to the accelerator's device).
    train_data : indexable sequence of examples, handed to ``hooks.collate`` in batches.
    hooks : :class:`TrainHooks` (collate, loss).
    cfg : :class:`TrainConfig`.
    log_metrics : ``(metrics, step) -> None``, called on the main process only.
    resume : continue from the newest complete checkpoint in ``cfg.output_dir`` if any.

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        Empty ``train_data`` or ``cfg.output_dir``; a checkpoint written with a different data order / schedule
        (seed, batch size, accumulation, LR settings, data size or number of processes).
    RuntimeError
        Launched as several processes but accelerate sees one (CPU without ``cpu=True``);
        launched with a DeepSpeed config that accelerate dropped (CPU).
    RunDirLocked
        Another live process is training into ``cfg.output_dir`` (:func:`run_dir_lock`).
    """
    from accelerate import Accelerator  # noqa: PLC0415  (heavy: accelerate, only when a model is trained)
    from accelerate.state import AcceleratorState  # noqa: PLC0415  (heavy: accelerate, only when a model is trained)
    from accelerate.utils import DistributedDataParallelKwargs, set_seed  # noqa: PLC0415  (heavy: accelerate, only when a model is trained)

    if len(train_data) == 0:
        raise ValueError("train_data is empty")
    if not cfg.output_dir:
        raise ValueError("TrainConfig.output_dir is empty: set the run directory before training")
    # DDP must tolerate parameters without a gradient: MiniLM's pooler is never used by mean pooling
    # (a plain DDP step fails on it); the check costs one graph traversal per step.
    accelerator = Accelerator(cpu=cfg.cpu, mixed_precision=cfg.mixed_precision,
                              gradient_accumulation_steps=cfg.grad_accum,
                              step_scheduler_with_optimizer=False,
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    try:
        launched = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
        if launched > 1 and accelerator.num_processes == 1:
            raise RuntimeError(f"launched as {launched} processes but accelerate sees 1 (every rank would "
                               "train alone as rank 0); on a CPU-only machine set TrainConfig(cpu=True) or "
                               "ACCELERATE_USE_CPU=1 (accelerate runs DeepSpeed on GPUs only)")
        if (os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
                and getattr(accelerator.state, "deepspeed_plugin", None) is None):
            raise RuntimeError("launched with a DeepSpeed config but accelerate runs without DeepSpeed (it drops "
                               "DeepSpeed on CPU, cpu=True / ACCELERATE_USE_CPU=1): use a GPU machine or a "
                               "non-DeepSpeed YAML (infra/accelerate/cpu_2proc.yaml)")
        with run_dir_lock(Path(cfg.output_dir), accelerator.is_main_process):
            return _run(accelerator, model, train_data, hooks, cfg, log_metrics, resume, set_seed)
    finally:
        accelerator.free_memory()
        # Leave no global accelerate state behind (another run may use other precision).
        AcceleratorState._reset_state(reset_partial_state=False)


class RunDirLocked(RuntimeError):
    """Another process holds the run directory's training lock."""


@contextmanager
def run_dir_lock(output_dir: Path, enabled: bool = True):
    """Exclusive, non-blocking ``flock`` on ``output_dir/.train.lock`` for the duration of a run.

    Two processes training into one run directory would interleave their checkpoints (each
    resumes from the other's); the second one is refused instead. The lock is released when the
    holder exits, killed or not (the kernel drops ``flock`` locks with the file descriptor), so a
    killed run never blocks its resumption. Only the main process of a multi-process run locks.

    Raises
    ------
    RunDirLocked
        The lock is held by another live process (names the directory).
    """
    if not enabled:
        yield
        return

    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / ".train.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RunDirLocked(f"{output_dir}: another process is training into this run directory") from exc
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(accelerator, model, train_data, hooks, cfg, log_metrics, resume, set_seed) -> TrainResult:
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    ckpt_root = out / CHECKPOINT_DIR
    if accelerator.is_main_process:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(".step_*.tmp"):
            logger.warning("removing half-written checkpoint %s", stale)
            shutil.rmtree(stale)
    accelerator.wait_for_everyone()
    _configure_deepspeed(accelerator, cfg, model)
    if cfg.gradient_checkpointing:
        _enable_gradient_checkpointing(model)

    sampler = EpochSeededSampler(len(train_data), cfg.seed)
    loader = DataLoader(train_data, batch_size=cfg.batch_size, sampler=sampler,
                        collate_fn=hooks.collate, num_workers=0,
                        # own generator: creating an epoch's iterator must not draw from the global
                        # torch RNG (restored by load_state), or a resumed run's dropout would differ
                        generator=torch.Generator().manual_seed(cfg.seed))
    optimizer = _optimizer(model, cfg)
    # accelerate shards each global batch over the processes: len(loader) = batches per process.
    n_batches = math.ceil(len(train_data) / (cfg.batch_size * accelerator.num_processes))
    steps_per_epoch = math.ceil(n_batches / cfg.grad_accum)
    total_steps = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg, total_steps))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if len(loader) != n_batches:
        raise RuntimeError(f"accelerate yields {len(loader)} batches per process, expected {n_batches}")

    fingerprint = _fingerprint(cfg, len(train_data), accelerator.num_processes)
    global_step, epoch, skip, losses = 0, 0, 0, []
    last_ckpt = latest_checkpoint(out) if resume else None
    if last_ckpt is not None:
        state = json.loads((last_ckpt / STATE_FILE).read_text())
        if state["fingerprint"] != fingerprint:
            raise ValueError(f"checkpoint {last_ckpt} was written with {state['fingerprint']}, "
                             f"this run has {fingerprint}; use a new output_dir or resume=False")
        accelerator.load_state(str(last_ckpt))
        global_step, epoch, skip, losses = (state["global_step"], state["epoch"],
                                            state["batch_in_epoch"], list(state["losses"]))
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", last_ckpt, global_step, epoch, skip)

    every = log_interval(cfg.log_every, total_steps)
    window: list[float] = []
    extras: dict[str, list[float]] = {}
    micro_losses: list[torch.Tensor] = []
    model.train()
    bar = (Progress(f"train {out.name}", total=total_steps - global_step, unit="steps")
           if accelerator.is_main_process else None)
    try:
        while global_step < total_steps:
            loader.set_epoch(epoch)
            epoch_loader = accelerator.skip_first_batches(loader, skip) if skip else loader
            epoch_loader.set_epoch(epoch)
            batch_idx = skip
            for batch in epoch_loader:
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        loss, metrics = hooks.loss(model, batch)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()
                batch_idx += 1
                micro_losses.append(loss.detach().float())
                for k, v in metrics.items():
                    extras.setdefault(k, []).append(float(v))
                if not accelerator.sync_gradients:
                    continue
                if not accelerator.optimizer_step_was_skipped:
                    scheduler.step()
                global_step += 1
                step_loss = accelerator.reduce(torch.stack(micro_losses).mean(), reduction="mean").item()
                micro_losses = []
                losses.append(step_loss)
                if bar is not None:
                    bar.update(1, loss=step_loss)
                window.append(step_loss)
                done = global_step >= total_steps
                if done or global_step % every == 0:
                    if accelerator.is_main_process and log_metrics is not None:
                        log = {"train/loss": sum(window) / len(window), "train/lr": scheduler.get_last_lr()[0],
                               "train/epoch": float(epoch)}
                        log.update({f"train/{k}": sum(v) / len(v) for k, v in extras.items()})
                        log_metrics(log, global_step)
                    window, extras = [], {}
                if cfg.checkpoint_every and (done or global_step % cfg.checkpoint_every == 0):
                    pos = (epoch + 1, 0) if batch_idx >= n_batches else (epoch, batch_idx)
                    last_ckpt = _save_checkpoint(accelerator, ckpt_root, cfg, global_step, pos, losses, fingerprint)
                if done:
                    break
            if global_step < total_steps:
                epoch, skip = epoch + 1, 0
    finally:
        if bar is not None:
            bar.close()
    accelerator.wait_for_everyone()
    full = _zero3_state_dict(accelerator, model)
    accelerator.unwrap_model(model, keep_fp32_wrapper=False)  # drop the autocast forward patch
    return TrainResult(global_step=global_step, epoch=epoch, losses=losses,
                       last_checkpoint=last_ckpt, full_state_dict=full)


def _save_checkpoint(accelerator, root: Path, cfg: TrainConfig, step: int, pos: tuple[int, int],
                     losses: list[float], fingerprint: dict) -> Path:
    """accelerate state + trainer_state.json + COMPLETE into a temp dir, renamed into place."""
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))  # every rank writes its RNG state; rank 0 model/optimizer
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"global_step": step, "epoch": pos[0], "batch_in_epoch": pos[1],
                 "losses": losses, "fingerprint": fingerprint, "train_config": asdict(cfg)}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        (tmp / COMPLETE_MARKER).write_text("")
        if final.exists():  # an incomplete leftover of a crashed run (complete ones are never rewritten)
            shutil.rmtree(final)
        tmp.rename(final)
        for old in checkpoint_dirs(cfg.output_dir)[:-cfg.keep_checkpoints]:
            shutil.rmtree(old)
        logger.info("checkpoint %s", final)
    accelerator.wait_for_everyone()
    return final


def _enable_gradient_checkpointing(model: torch.nn.Module) -> bool:
    """transformers 5's ``activation_checkpointing_enable`` or the older ``gradient_checkpointing_enable``
    (non-reentrant: works with DDP and unused parameters)."""
    for method, kwarg in (("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
                          ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs")):
        enable = getattr(model, method, None)
        if callable(enable):
            enable(**{kwarg: {"use_reentrant": False}})
            return True
    logger.warning("gradient_checkpointing requested but %s has no checkpointing switch; ignored",
                   type(model).__name__)
    return False


DEEPSPEED_HIDDEN_SIZE_KEYS = ("zero_optimization.reduce_bucket_size",
                              "zero_optimization.stage3_prefetch_bucket_size",
                              "zero_optimization.stage3_param_persistence_threshold")
"""DeepSpeed keys whose ``"auto"`` accelerate derives from ``model.config.hidden_size`` at ``prepare``."""


def model_hidden_size(model: torch.nn.Module) -> int:
    """The largest ``config.hidden_size`` of ``model`` or any of its submodules.

    Our models (the FiD reader, the bi-encoder pre-ranker) are plain ``nn.Module`` s wrapping
    Hugging Face models, so accelerate, which reads only ``model.config``, cannot size DeepSpeed's
    buckets from them. T5 configs answer ``hidden_size`` with ``d_model``; an encoder-decoder
    (bert2bert) has one config per side: the largest is taken, as accelerate does for
    ``hidden_sizes``.

    Raises
    ------
    ValueError
        No submodule has a config with a hidden size (names the model's class).
    """
    sizes = [int(size) for module in model.modules()
             if isinstance(size := getattr(getattr(module, "config", None), "hidden_size", None), int)]
    if not sizes:
        raise ValueError(f"{type(model).__name__}: no submodule has config.hidden_size, so the DeepSpeed "
                         f"'auto' values of {', '.join(DEEPSPEED_HIDDEN_SIZE_KEYS)} cannot be filled; "
                         "set them to integers in the DeepSpeed JSON")
    return max(sizes)


def _configure_deepspeed(accelerator, cfg: TrainConfig, model: torch.nn.Module) -> None:
    """Fill the DeepSpeed ``"auto"`` values accelerate cannot fill for our models: gradient clipping
    from the TrainConfig, and the ZeRO bucket sizes from the model's hidden size ``h`` with the
    rules accelerate applies to a model with ``config.hidden_size`` (``h²``, ``0.9·h²``, ``10·h``).
    Batch size, accumulation and precision are filled by accelerate from the dataloader and the
    Accelerator. No-op without DeepSpeed.

    Raises
    ------
    ValueError
        A bucket size is ``"auto"`` and the model has no hidden size (:func:`model_hidden_size`).
    """
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    if plugin.deepspeed_config.get("gradient_clipping", "auto") == "auto":
        plugin.deepspeed_config["gradient_clipping"] = cfg.max_grad_norm
    if any(plugin.is_auto(key) for key in DEEPSPEED_HIDDEN_SIZE_KEYS):
        h = model_hidden_size(model)
        fills = dict(zip(DEEPSPEED_HIDDEN_SIZE_KEYS, (h * h, int(0.9 * h * h), 10 * h)))
        for key, value in fills.items():     # fill_match sets a key only where it is "auto"
            plugin.fill_match(key, must_match=False, **{key: value})


def _zero3_state_dict(accelerator, model) -> dict[str, torch.Tensor] | None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None or plugin.zero_stage != 3:
        return None
    state = accelerator.get_state_dict(model)  # collective: every rank must call it
    return state if accelerator.is_main_process else None
