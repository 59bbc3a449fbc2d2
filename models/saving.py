"""Model directories: one style for every model in :mod:`models`.

A model is saved into a directory that appears complete or not at all
(:func:`data_contracts.base.atomic_directory`: built under a temporary sibling name, then
renamed); its settings go to one sorted, indented JSON file beside the weights (safetensors or
``transformers`` ``save_pretrained``), which is also what marks the directory as that model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from data_contracts.base import atomic_directory

__all__ = ["atomic_directory", "read_config", "save_pretrained_dir", "write_config"]


def write_config(path: Path, config: Any) -> None:
    """``config`` (a dataclass or a JSON-able mapping) as sorted, indented JSON at ``path``."""
    data = asdict(config) if is_dataclass(config) and not isinstance(config, type) else config
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_config(directory: Path, filename: str, what: str) -> dict[str, Any]:
    """The JSON settings file ``filename`` of the ``what`` saved in ``directory``.

    Raises
    ------
    FileNotFoundError
        ``directory`` holds no ``filename`` (it is not a saved ``what``).
    """
    path = Path(directory) / filename
    if not path.exists():
        raise FileNotFoundError(f"{directory} is not a saved {what} (no {filename})")
    return json.loads(path.read_text())


def save_pretrained_dir(directory: Path, backbone, tokenizer, config_file: str, config: Any,
                        extra: dict[str, Any] | None = None) -> Path:
    """Save a ``transformers`` ``backbone`` (safetensors), its ``tokenizer`` and the model's
    ``config`` (as ``config_file``) into ``directory``, atomically; each ``extra`` backbone
    (``{subdirectory: backbone}``, e.g. a second tower) into its subdirectory, in the same
    atomic write."""
    directory = Path(directory)
    with atomic_directory(directory) as tmp:
        backbone.save_pretrained(tmp)
        for name, other in sorted((extra or {}).items()):
            other.save_pretrained(tmp / name)
        tokenizer.save_pretrained(tmp)
        write_config(tmp / config_file, config)
    return directory
