"""Model references of an evaluation: baseline names, local directories, MLflow registry URIs.

A reference is one of

* ``"minilm"`` — the untrained baseline pre-ranker: the offline MiniLM bi-encoder
  (:func:`models.preranker.build_preranker`), i.e. "before distillation";
* ``"scratch"`` — (reader only) a FiD reader initialised from scratch with the real T5
  tokenizer, seed 0: its cross-attention is untrained, so it exercises the post-ranking stage
  and its timing, not its quality;
* ``"models:/<name>@<alias>"`` or ``"models:/<name>/<version>"`` — a registered model version
  (:mod:`funnelrag.registry`, e.g. the distilled pre-ranker ``@champion``), downloaded first;
* a local directory written by :func:`models.preranker.save_preranker` /
  :func:`tasks.funnel.reader.save_reader`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from funnelrag.registry import download_model, find_model_dir, is_registry_ref, resolve_version
from models.encoders import MINILM
from models.fid import FiDConfig, FiDReader
from models.preranker import CONFIG_FILE as PRERANKER_FILE  # the file that marks a saved pre-ranker
from models.preranker import PreRankerConfig, build_preranker, load_preranker
from tasks.funnel.reader import READER_CONFIG as READER_FILE  # ... and a saved FiD reader
from tasks.funnel.reader import load_reader

log = logging.getLogger(__name__)

SCRATCH = "scratch"


@dataclass(frozen=True)
class ResolvedRef:
    """Where a reference points: a local model directory (None for built-in baselines) and,
    for registry references, the registered model name, version and training run id."""

    ref: str
    directory: Path | None
    name: str | None = None
    version: str | None = None
    run_id: str | None = None

    def as_params(self, prefix: str) -> dict[str, str]:
        """``{prefix.ref, prefix.version, ...}`` for MLflow params (None values dropped)."""
        out = {"ref": self.ref, "registry_name": self.name, "registry_version": self.version, "run_id": self.run_id}
        return {f"{prefix}.{k}": str(v) for k, v in out.items() if v is not None}


def resolve(ref: str, marker: str, download_dir: Path) -> ResolvedRef:
    """Resolve a registry or directory reference to a local model directory holding ``marker``.

    Raises
    ------
    FileNotFoundError
        A directory reference does not exist or holds no ``marker``.
    mlflow.exceptions.MlflowException
        A registry reference names no model version.
    """
    if is_registry_ref(ref):
        mv = resolve_version(ref)
        dst = Path(download_dir) / f"{mv.name}-v{mv.version}"
        local = download_model(f"models:/{mv.name}/{mv.version}", dst, version=mv)
        return ResolvedRef(ref, find_model_dir(local, marker), mv.name, str(mv.version), mv.run_id)
    path = Path(ref)
    if not path.is_dir():
        raise FileNotFoundError(f"model reference {ref!r} is neither a built-in name, a models:/ URI nor a directory")
    return ResolvedRef(ref, find_model_dir(path, marker))


def load_preranker_ref(ref: str, download_dir: Path):
    """``(model, tokenizer, ResolvedRef)`` of a pre-ranker reference (model in eval mode).

    The input length is the model's own: MiniLM's 256 for the baseline, the length stored in
    ``preranker.json`` for a saved or registered pre-ranker (no override: before/after
    comparisons run both at the lengths they were built with, reported per model).
    """
    if ref == MINILM:
        cfg = PreRankerConfig(kind="bi", name_or_path=MINILM)
        model, tok = build_preranker(cfg)
        return model, tok, ResolvedRef(ref, None)
    resolved = resolve(ref, PRERANKER_FILE, download_dir)
    model, tok = load_preranker(resolved.directory)
    return model, tok, resolved


def load_reader_ref(ref: str, download_dir: Path, tokenizer_dir: Path | None):
    """``(model, tokenizer, ResolvedRef)`` of a FiD reader reference (eager attention, eval mode).

    Raises
    ------
    ValueError
        ``"scratch"`` without the T5 tokenizer directory.
    """
    if ref == SCRATCH:
        if tokenizer_dir is None:
            raise ValueError("reader 'scratch' needs the T5 tokenizer directory")
        model, tok = FiDReader.from_config(FiDConfig(tokenizer=str(tokenizer_dir), seed=0))
        model.eval()
        return model, tok, ResolvedRef(ref, None)
    resolved = resolve(ref, READER_FILE, download_dir)
    model, tok, _ = load_reader(resolved.directory)
    return model, tok, resolved
