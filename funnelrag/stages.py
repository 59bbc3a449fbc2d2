"""Flow plumbing shared by every pipeline: stage declarations, the cached stage run, input sources.

* :func:`stage` declares a stage's cache name and code version on the pure function that
  produces its output (``@stage("index", version="2")`` above ``run_index``), so the version is
  bumped where the bytes change; :func:`run_cached` runs it through the content-keyed
  :class:`funnelrag.store.StageCache` (key: name, version, config, input digests).
* :func:`stage_task` is the Prefect ``@task`` every cached stage is wrapped in (retries, no
  Prefect-side caching: Prefect's INPUTS policy keys on paths, ours on content).
* :class:`DataSource` names the input files of a flow: registered data sets (checksum-verified
  in the data mirror) and/or explicit paths; :meth:`DataSource.resolve` returns them with their
  sha256, which is what cache keys use.

No Prefect import at module level: stage cores in ``tasks/`` import :func:`stage` from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from data_contracts.base import sha256_file
from funnelrag import datasets
from funnelrag.errors import BadInput
from funnelrag.store import StageCache, StageResult

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Stage:
    """A cached stage: its cache directory name and the version of the code producing its bytes."""

    name: str
    version: str

    def key(self, config: Any, inputs: Mapping[str, str]) -> str:
        """sha256 cache key over name, version, ``config`` and the input digests ``inputs``."""
        return StageCache.key(self.name, self.version, config, inputs)


def stage(name: str, version: str) -> Callable[[F], F]:
    """Declare the function below as the core of cached stage ``name`` at code ``version``.

    Bump ``version`` whenever a change to the function (or what it calls) changes its output
    bytes: the version is part of the cache key, so stale cached outputs are not reused.
    The declaration is stored as ``fn.stage`` (a :class:`Stage`); the function is unchanged.
    """
    def declare(fn: F) -> F:
        fn.stage = Stage(name, version)  # type: ignore[attr-defined]
        return fn
    return declare


def stage_of(core: Callable[..., Any]) -> Stage:
    """The :class:`Stage` declared on ``core`` by :func:`stage`.

    Raises
    ------
    TypeError
        ``core`` carries no stage declaration.
    """
    spec = getattr(core, "stage", None)
    if not isinstance(spec, Stage):
        raise TypeError(f"{getattr(core, '__qualname__', core)} is not declared with @stage(name, version)")
    return spec


def run_cached(cache: StageCache, core: Callable[..., Any], config: Any, inputs: Mapping[str, str],
               build: Callable[[Path, str], dict[str, Any]]) -> StageResult:
    """Outputs of stage ``core`` for ``(config, inputs)``: from ``cache`` or built now.

    Parameters
    ----------
    cache : StageCache
    core : the stage's pure function, declared with :func:`stage`.
    config : what the output depends on besides the inputs (dataclass, model or mapping).
    inputs : ``{input name: sha256 digest}`` (content, never paths).
    build : ``build(tmp_dir, key) -> summary`` writes the outputs into ``tmp_dir`` (usually a
        call of ``core``); ``key`` lets a stage name its work directory after the cache key.
    """
    spec = stage_of(core)
    key = spec.key(config, inputs)
    return cache.run(spec.name, key, lambda out: build(out, key))


def stage_task(name: str) -> Callable[[F], F]:
    """The Prefect ``@task`` of a cached stage: one retry after 2 s of a failure that may be
    transient (:func:`retry_transient`), Prefect caching off."""
    from prefect import task  # noqa: PLC0415  (heavy: prefect; stage cores import this module without it)
    from prefect.cache_policies import NONE  # noqa: PLC0415  (heavy: prefect; stage cores import this module without it)

    return task(name=name, retries=1, retry_delay_seconds=2, retry_condition_fn=retry_transient, cache_policy=NONE)


def retry_transient(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: retry only failures that may pass on a second try (I/O,
    a killed subprocess). Bad input (:class:`funnelrag.errors.BadInput` and its subclasses) or
    config fails the same way every time (a full dump would be read twice before failing), so
    those errors are never retried."""
    try:
        state.result()
    except (BadInput, ValueError, TypeError, KeyError, FileNotFoundError):  # deterministic
        return False
    except Exception:  # noqa: BLE001 - anything else may be transient
        return True
    return True


class DataSource(BaseModel):
    """Input files: registered data sets (:mod:`funnelrag.datasets`, resolved in the data mirror
    and checksum-verified) and/or explicit paths (e.g. a full ``enwiki-*-pages-articles*.xml.bz2``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    datasets: list[str] = Field(default_factory=list)
    paths: list[Path] = Field(default_factory=list)
    expected_file: ClassVar[str] = "an input file"   # what each of ``paths`` must be, for error messages

    def input_files(self) -> list[tuple[str, Path, str]]:
        """``(key, path, expected)`` of ``paths``, checked at the flow boundary
        (:func:`funnelrag.inputs.check_inputs`) before anything starts."""
        return [("paths", p, self.expected_file) for p in self.paths]

    def resolve(self, mirror: Path | None, downloads_dir: Path | None,
                label: str = "paths") -> list[tuple[Path, str]]:
        """``[(path, sha256)]``: registered sets first (registry checksum), then the paths (hashed).

        Raises
        ------
        FileNotFoundError
            An explicit path does not exist (message names ``label``, the config key of ``paths``).
        KeyError, ValueError, funnelrag.datasets.DataUnavailable
            From :func:`resolve_dataset`.
        """
        return ([resolve_dataset(n, mirror, downloads_dir) for n in self.datasets]
                + [hash_path(p, label) for p in self.paths])


def resolve_dataset(name: str, mirror: Path | None, downloads_dir: Path | None) -> tuple[Path, str]:
    """``(path, sha256)`` of registered data set ``name`` (verified against the registry)."""
    return datasets.resolve(name, mirror, cache_dir=downloads_dir), datasets.REGISTRY[name].sha256


def hash_path(path: Path | str, field: str = "path") -> tuple[Path, str]:
    """``(path, sha256)`` of an explicit input file.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file (message names the config ``field``).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{field}: {path} is a directory; expected a file (list each file, not the folder)")
    if not path.is_file():
        raise FileNotFoundError(f"{field}: {path} does not exist")
    return path, sha256_file(path)


def input_digests(files: list[tuple[Path, str]]) -> dict[str, str]:
    """Cache-key inputs of a list of files: ``{"input<i>:<file name>": sha256}`` (order matters)."""
    return {f"input{i}:{p.name}": sha for i, (p, sha) in enumerate(files)}
