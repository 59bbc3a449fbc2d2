"""Configuration at the flow boundary: pydantic models loaded from one YAML file plus overrides.

Stage cores take frozen dataclasses; flow configs are pydantic models whose sections are those
dataclasses (pydantic validates dataclass fields), so there is one definition of each setting.
Overrides use dotted keys: ``--set clustering.max_tokens=2048``; values are parsed as YAML
scalars (``true``, ``3``, ``0.5``, ``[a, b]``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from funnelrag.datasets import default_home, default_mirror

M = TypeVar("M", bound=BaseModel)


class WorkspaceConfig(BaseModel):
    """Where a flow reads real data and writes artifacts and tracking.

    home : root of all outputs (artifact store, stage cache, MLflow SQLite + artifacts); default
        ``$FUNNELRAG_HOME``, else ``./funnelrag-home``.
    data_mirror : directory holding the real data sets (see funnelrag.datasets); ``None`` means
        "use ``../shared/data`` if it exists, else download from the canonical URLs".
    tracking_uri : MLflow tracking URI; ``None`` = ``sqlite:///{home}/mlflow.db``.
    """

    model_config = ConfigDict(extra="forbid")
    home: Path = Field(default_factory=default_home)
    data_mirror: Path | None = Field(default_factory=default_mirror)
    tracking_uri: str | None = None


class FlowConfig(BaseModel):
    """Base of every flow's configuration model (frozen, no unknown keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested dict ``{"a": {"b": 1}, "c": "x"}``.

    Raises
    ------
    ValueError
        A pair has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"override {pair!r} is not of the form key.path=value")
        key, raw = pair.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ValueError(f"override {pair!r} has an empty key")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""
    return out


def deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base``."""
    merged = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
            merged[k] = deep_merge(dict(merged[k]), v)
        else:
            merged[k] = v
    return merged


def load_config(model: type[M], path: Path | None = None, overrides: Sequence[str] = ()) -> M:
    """Build ``model`` from the embedded defaults, then the YAML file ``path``, then overrides.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    pydantic.ValidationError
        A value has the wrong type or a key is unknown (message names the key).
    """
    data = read_config_file(path) if path is not None else {}
    data = deep_merge(data, parse_overrides(overrides))
    return model.model_validate(data)


def read_config_file(path: Path | str) -> dict[str, Any]:
    """The mapping in a YAML config file (an empty file is ``{}``).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        A YAML syntax error or a top level that is not a mapping; the message names the file
        (and the line and column of a syntax error).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"config file {path} is a directory; expected a YAML file (e.g. configs/evaluate_demo.yaml)")
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as fh:  # marks then say "in <path>, line L, column C"
            loaded = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path}: YAML syntax error: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {path}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded


RUN_LOGGERS = ("funnelrag", "flows", "tasks", "models")
"""Our module loggers: their lines (stage lines, progress every 30 s) also go to the Prefect run
logs when ``PREFECT_LOGGING_EXTRA_LOGGERS`` names them (the CLI sets it; so does the work pool's
environment in ``prefect.yaml``)."""


def default_run_log_levels() -> None:
    """Give :data:`RUN_LOGGERS` level INFO where none was set (a level set before is kept).

    A flow run that a worker starts loads its entrypoint file directly (no CLI, not even the
    ``flows`` package), and Prefect's root logger stays at WARNING: without a level of their own
    our INFO lines would be dropped before any handler sees them. Called by
    :func:`resolve_flow_config`, which every flow runs first.
    """
    for name in RUN_LOGGERS:
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.INFO)


def resolve_flow_config(model: type[M], config: BaseModel | Mapping[str, Any] | None = None,
                        config_file: Path | str | None = None, overrides: Sequence[str] | None = None,
                        home: Path | str | None = None) -> M:
    """The configuration of a flow run started by a deployment, an automation or the CLI.

    Deployment parameters replace each other whole (a ``config`` given to ``prefect deployment
    run --param`` replaces the deployment's nested config), so a flow takes its base config
    and the changes to it as separate parameters and merges them key by key here: the base
    (``config``, or the YAML file ``config_file``, or the model's defaults), then ``home`` as
    ``workspace.home``, then the dotted ``overrides`` (``["clustering.max_tokens=2048"]``).

    Raises
    ------
    ValueError
        Both ``config`` and ``config_file`` given; an override without ``=``; a config file
        that is not YAML (see :func:`read_config_file`).
    pydantic.ValidationError
        A merged value has the wrong type or a key is unknown.
    """
    default_run_log_levels()
    if config is not None and config_file is not None:
        raise ValueError("give either config or config_file, not both (put changes in overrides)")
    if config_file is not None:
        data = read_config_file(config_file)
    elif isinstance(config, BaseModel):
        if not overrides and home is None and isinstance(config, model):
            return config
        data = config.model_dump()
    else:
        data = dict(config or {})
    if home is not None and str(home) != "":
        data = deep_merge(data, {"workspace": {"home": str(home)}})
    data = deep_merge(data, parse_overrides(overrides or []))
    return model.model_validate(data)


def to_jsonable(obj: Any) -> Any:
    """Config → plain JSON types (dataclasses, pydantic models, Paths), keys sorted on dump."""
    if isinstance(obj, BaseModel):
        return to_jsonable(obj.model_dump(mode="python"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def config_hash(obj: Any) -> str:
    """sha256 hex of the canonical JSON of a config (dataclass, model or mapping)."""
    return hashlib.sha256(json.dumps(to_jsonable(obj), sort_keys=True).encode()).hexdigest()


def flatten_params(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten a config to ``{"a.b": "value"}`` strings for MLflow params."""
    data = to_jsonable(obj)
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten_params(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = json.dumps(data) if isinstance(data, list) else str(data)
    return out


@dataclasses.dataclass(frozen=True)
class FlowCommand:
    """A CLI subcommand: its config model and the function that runs the flow.

    ``run(cfg) -> dict`` returns a summary printed by the CLI as a table; with ``screen``,
    ``screen(cfg, summary) -> str`` is printed instead (one screen), the table with ``--verbose``.
    ``flags``: ``(flag, override, help)`` each, a switch that stands for ``--set override``
    (e.g. ``("--no-cache", "cache.read=false", ...)``). ``exit_status(summary) -> int``: the
    command's exit status after a run (0 when not given).
    """

    name: str
    help: str
    config_model: type[BaseModel]
    run: Callable[[Any], dict]
    screen: Callable[[Any, dict], str] | None = None
    flags: tuple[tuple[str, str, str], ...] = ()
    exit_status: Callable[[dict], int] | None = None
