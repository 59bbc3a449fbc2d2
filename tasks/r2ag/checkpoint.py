"""Saving and loading trained R²AG parts: R²-Former (+ QDM head), projection, generator.

Layout of a model directory::

    r2former.config.json         R2FormerConfig + the feature names it reads
    r2former.weights.safetensors R2FormerQDM state dict
    projection.config.json       ProjectionConfig               (joint training only)
    projection.weights.safetensors
    generator/                   transformers save_pretrained   (joint training only)
    tokenizer/                   tokenizer with the <R> token   (joint training only)

Every file is written atomically; weights in safetensors (no pickles).
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from data_contracts.base import atomic_write
from models.r2ag_generator import ProjectionConfig, RetrievalProjection
from models.r2former import R2FormerConfig, R2FormerQDM

R2FORMER_CONFIG = "r2former.config.json"
R2FORMER_WEIGHTS = "r2former.weights.safetensors"
PROJECTION_CONFIG = "projection.config.json"
PROJECTION_WEIGHTS = "projection.weights.safetensors"
GENERATOR_DIR = "generator"
TOKENIZER_DIR = "tokenizer"


def _save_weights(module, path: Path) -> None:
    from safetensors.torch import save_file  # noqa: PLC0415

    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp)))


def _load_weights(module, path: Path) -> None:
    from safetensors.torch import load_file  # noqa: PLC0415

    if not path.exists():
        raise FileNotFoundError(f"no weights at {path}")
    module.load_state_dict(load_file(str(path)))


def _write_json(path: Path, obj) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n"))


def save_r2former(model: R2FormerQDM, features: tuple[str, ...], directory: Path) -> Path:
    """Write the R²-Former + QDM head of ``model`` and the feature names it was trained on."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / R2FORMER_CONFIG, {"config": asdict(model.cfg), "features": list(features)})
    _save_weights(model, directory / R2FORMER_WEIGHTS)
    return directory


def load_r2former(directory: Path) -> tuple[R2FormerQDM, tuple[str, ...]]:
    """Inverse of :func:`save_r2former`: ``(model in eval mode, feature names)``.

    Raises
    ------
    FileNotFoundError
        The directory lacks the config or weights file.
    """
    directory = Path(directory)
    cfg_path = directory / R2FORMER_CONFIG
    if not cfg_path.exists():
        raise FileNotFoundError(f"{directory} holds no R²-Former ({R2FORMER_CONFIG} missing)")
    meta = json.loads(cfg_path.read_text())
    model = R2FormerQDM(R2FormerConfig(**meta["config"]))
    _load_weights(model, directory / R2FORMER_WEIGHTS)
    model.eval()
    return model, tuple(meta["features"])


def save_projection(projection: RetrievalProjection, directory: Path) -> None:
    directory = Path(directory)
    _write_json(directory / PROJECTION_CONFIG, asdict(projection.cfg))
    _save_weights(projection, directory / PROJECTION_WEIGHTS)


def load_projection(directory: Path) -> RetrievalProjection | None:
    """The saved projection, or None when ``directory`` holds only an R²-Former."""
    directory = Path(directory)
    if not (directory / PROJECTION_CONFIG).exists():
        return None
    proj = RetrievalProjection(ProjectionConfig(**json.loads((directory / PROJECTION_CONFIG).read_text())))
    _load_weights(proj, directory / PROJECTION_WEIGHTS)
    proj.eval()
    return proj


def has_generator(directory: Path) -> bool:
    return (Path(directory) / GENERATOR_DIR / "config.json").exists()
