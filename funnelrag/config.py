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
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from funnelrag.datasets import default_home, default_mirror
from funnelrag.errors import BadInput

M = TypeVar("M", bound=BaseModel)


def environment_tracking_uri() -> str | None:
    """The user's ``$MLFLOW_TRACKING_URI`` (e.g. the deployment environment's MLflow server), or
    ``None`` when unset. :func:`funnelrag.tracking.configure` leaves the variable as it found it
    (``mlflow.set_tracking_uri`` would copy a home's store into it), so what is here is the user's."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None


class WorkspaceConfig(BaseModel):
    """Where a flow reads real data and writes artifacts and tracking.

    home : root of all outputs (artifact store, stage cache, MLflow SQLite + artifacts); default
        ``$FUNNELRAG_HOME``, else ``./funnelrag-home``.
    data_mirror : directory holding the real data sets (see funnelrag.datasets); ``None`` means
        "use ``../shared/data`` if it exists, else download from the canonical URLs".
    tracking_uri : MLflow tracking URI; default ``$MLFLOW_TRACKING_URI`` (an MLflow server: every
        artifact then links to its run), else ``None`` = ``sqlite:///{home}/mlflow.db``.
    """

    model_config = ConfigDict(extra="forbid")
    home: Path = Field(default_factory=default_home)
    data_mirror: Path | None = Field(default_factory=default_mirror)
    tracking_uri: str | None = Field(default_factory=lambda: environment_tracking_uri())


class FlowConfig(BaseModel):
    """Base of every flow's configuration model (frozen, no unknown keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig)


class ConfigError(BadInput, ValueError):
    """A configuration a person gave that cannot be used: a YAML syntax error (file, line,
    column), an unknown key (with the keys its section knows), a value of the wrong type (key,
    value, what was expected). The message is one or two lines, meant for a terminal."""


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested dict ``{"a": {"b": 1}, "c": "x"}``.

    Raises
    ------
    ConfigError
        A pair has no ``=``, an empty key, or a value that is not YAML (a ``ValueError``).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not of the form key.path=value")
        key, raw = pair.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {pair!r} has an empty key")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {pair!r}: {part} was given a value by an earlier override, not keys")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {pair!r}: the value is not YAML ({_yaml_problem(exc)})") from exc
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


def load_config(model: type[M], path: Path | None = None, overrides: Sequence[str] = (),
                home: Path | str | None = None) -> M:
    """Build ``model`` from the embedded defaults, then the YAML file ``path``, then ``home`` as
    ``workspace.home`` (the CLI's ``--home``), then overrides (as :func:`resolve_flow_config`).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ConfigError
        ``path`` is not YAML or its top level is not a mapping (file, line and column named).
    pydantic.ValidationError
        A value has the wrong type or a key is unknown (message names the key;
        :func:`explain_validation_error` makes it a :class:`ConfigError` naming where it came from).
    """
    data = read_config_file(path) if path is not None else {}
    if home is not None and str(home) != "":
        data = deep_merge(data, {"workspace": {"home": str(home)}})
    data = deep_merge(data, parse_overrides(overrides))
    return model.model_validate(data)


def _sections(annotation: Any) -> list[Any]:
    """The pydantic models and dataclasses an annotation can hold (``X | None`` → ``[X]``)."""
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _sections(arg)]
    return []


def _fields(section: Any) -> dict[str, Any]:
    """``{key: annotation}`` of a pydantic model or a dataclass, in declaration order."""
    if isinstance(section, type) and issubclass(section, BaseModel):
        return {name: f.annotation for name, f in section.model_fields.items()}
    try:
        hints = typing.get_type_hints(section)
    except (NameError, TypeError):   # an annotation that does not resolve here: the names still help
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(section)}


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("pathlib.", "")


def _walk(model: type[BaseModel], loc: Sequence[Any], unknown_last: bool = False) -> tuple[list[str], dict[str, Any]]:
    """Follow ``loc`` (a pydantic error location) through ``model``'s sections. Returns the path
    of keys it names (list items as ``[i]``; union member tags such as ``str`` dropped, except a
    last part that is an ``unknown_last`` key) and ``{key: annotation}`` of the section holding
    the last key."""
    keys: list[str] = []
    fields = section = _fields(model)
    for n, part in enumerate(loc):
        if isinstance(part, int):
            keys[-1:] = [f"{keys[-1]}[{part}]"] if keys else [f"[{part}]"]
        elif part in fields:
            keys.append(str(part))
            section = fields
            inner = _sections(fields[part])
            fields = _fields(inner[0]) if inner else {}
        elif unknown_last and n == len(loc) - 1:
            keys.append(str(part))
            section = fields
    return keys, section


def _origin(key: str, path: Path | None, overrides: Sequence[str], home: Path | str | None) -> str:
    """Where the value at dotted ``key`` came from: the ``--set`` that gave it, ``--home``, the
    config file, or the defaults."""
    for pair in reversed(list(overrides)):   # the last --set of the key, of a section above it, or below it
        given = pair.split("=", 1)[0].strip()
        if given in (key, key.split("[")[0]) or key.startswith(f"{given}.") or given.startswith(f"{key}."):
            return f"--set {pair}"
    if key == "workspace.home" and home is not None:
        return f"--home {home}"
    return f"config file {path}" if path is not None else "the defaults"


UNKNOWN_KEY_ERRORS = ("extra_forbidden", "unexpected_keyword_argument")
"""pydantic's error types of a key a section does not have (a model's, a dataclass's)."""


def explain_validation_error(exc: ValidationError, model: type[BaseModel], path: Path | None = None,
                             overrides: Sequence[str] = (), home: Path | str | None = None,
                             shown: int = 2) -> ConfigError:
    """A :class:`ConfigError` for a person, one line per problem (at most ``shown``, then a
    count), each naming its key and where the value came from (``--set``, ``--home``, the config
    file ``path``): an unknown key with the keys its section knows, a wrong value with the type
    the key expects and pydantic's reason."""
    lines = []
    for err in exc.errors():
        unknown = err["type"] in UNKNOWN_KEY_ERRORS
        keys, section = _walk(model, err["loc"], unknown_last=unknown)
        key = ".".join(keys)
        where = _origin(key, path, overrides, home)
        if unknown:
            holder = ".".join(keys[:-1]) or "the top level"
            lines.append(f"{where}: unknown key {key!r}; {holder} has the keys: {', '.join(section) or 'none'}")
        elif err["type"] in ("value_error", "assertion_error"):   # a section's own check: its message says it
            reason = err["msg"].split(", ", 1)[-1]
            lines.append(f"{where}: {key}: {reason}" if key else f"config: {reason}")
        elif key:
            expected = section.get(keys[-1].split("[")[0])
            want = f" (expected {_type_name(expected)})" if expected is not None else ""
            value = err.get("input")
            given = f" = {value!r}" if not isinstance(value, (dict, list)) else ""
            lines.append(f"{where}: {key}{given}: {err['msg']}{want}")
        else:
            lines.append(f"{where}: {err['msg']}")
    more = f" (and {len(lines) - shown} more)" if len(lines) > shown else ""
    return ConfigError("\n".join(lines[:shown]) + more)


def read_config_file(path: Path | str) -> dict[str, Any]:
    """The mapping in a YAML config file (an empty file is ``{}``).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ConfigError
        A YAML syntax error or a top level that is not a mapping (a ``ValueError``); the message
        names the file (and the line and column of a syntax error, counted from 1).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"config file {path} is a directory; expected a YAML file (e.g. configs/evaluate_demo.yaml)")
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}, {_yaml_problem(exc)}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``line L, column C: YAML syntax error: <problem> (<context> at line L')`` of a YAML error
    (lines and columns from 1, as editors count them)."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"YAML syntax error: {exc}"
    text = f"line {mark.line + 1}, column {mark.column + 1}: YAML syntax error: {exc.problem}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None:
        text += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    return text


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
    """Flatten a config to ``{"a.b": "value"}`` strings for MLflow params, credentials of URLs
    redacted (:func:`redact_url`)."""
    data = to_jsonable(obj)
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten_params(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = redact_url(json.dumps(data) if isinstance(data, list) else str(data))
    return out


REDACTED = "***"
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s?#\"'<>]+@")   # to the last @ of the authority


def redact_url(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: ``https://user:password@host/x``
    → ``https://***@host/x`` (user name too: a token is often passed as one). The one redaction of
    the platform: every writer of a config, a URL or a message that may hold one (manifests, run
    summaries, MLflow params, Prefect parameters, artifacts and logs) goes through it or
    :func:`redact`."""
    return _URL_USERINFO.sub(rf"\g<1>{REDACTED}@", text) if "@" in text else text


def redact(obj: Any) -> Any:
    """:func:`redact_url` over every string of a JSON-like value (dicts, lists, tuples); other
    values are returned as they are, keys unchanged."""
    if isinstance(obj, str):
        return redact_url(obj)
    if isinstance(obj, Mapping):
        return {k: redact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def split_url_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without its user info, (user, password) or None)``; percent-escapes in the user
    info are decoded. A user info already redacted (``***@``, as stored by a run) gives None: the
    credentials must then come from elsewhere (environment, netrc)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    clean = urlunsplit(parts._replace(netloc=host))
    if userinfo == REDACTED:
        return clean, None
    user, _, password = userinfo.partition(":")
    return clean, (unquote(user), unquote(password))


@dataclasses.dataclass(frozen=True)
class FlowCommand:
    """A CLI subcommand: its config model and the function that runs the flow.

    ``run(cfg) -> dict`` returns a summary printed by the CLI as a table; with ``screen``,
    ``screen(cfg, summary) -> str`` is printed instead (one screen), the table with ``--verbose``.
    ``check(cfg)``, when given, runs before any Prefect API or flow run starts and raises
    :class:`ConfigError` for a config this command cannot run (e.g. ``build-corpus`` with a mirror,
    which ``nightly`` follows).
    ``flags``: ``(flag, override, help)`` each, a switch that stands for ``--set override``
    (e.g. ``("--no-cache", "cache.read=false", ...)``). ``exit_status(summary) -> int``: the
    command's exit status after a run (0 when not given). ``imports(cfg) -> [module, ...]``: the
    modules a run of ``cfg`` imports later than its start (e.g. the demo's later steps' flow
    modules, with torch), imported while the ephemeral API starts (``funnelrag/cli.py:while_api_starts``).
    """

    name: str
    help: str
    config_model: type[BaseModel]
    run: Callable[[Any], dict]
    screen: Callable[[Any, dict], str] | None = None
    check: Callable[[Any], None] | None = None
    flags: tuple[tuple[str, str, str], ...] = ()
    exit_status: Callable[[dict], int] | None = None
    imports: Callable[[Any], Sequence[str]] | None = None
