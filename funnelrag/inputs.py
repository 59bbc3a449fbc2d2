"""Input files checked at the flow boundary, before a Prefect server, an MLflow run or a stage starts.

A config section that names input files (:class:`funnelrag.stages.DataSource`: ``source.paths``,
``questions.paths``, ...) lists them with ``input_files() -> [(key, path, expected)]``;
:func:`check_inputs` walks a flow config for such sections and checks every file at once (exists,
is a file and not a directory, readable), so a wrong path fails in a second with its config key,
not minutes later inside a stage.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel

QUESTIONS_FILE = "a questions file (.tsv, .jsonl, .jsonl.gz or DPR .qa.csv)"


class InputFileError(ValueError):
    """One or more input files are missing, directories or unreadable; one line per file."""


def file_problem(path: Path | str, key: str, expected: str = "a file") -> str | None:
    """Why ``path`` (config key ``key``) cannot be read as an input file, or None when it can."""
    path = Path(path)
    if path.is_dir():
        return f"{key}: {path} is a directory; expected {expected} (list each file, not the folder)"
    if not path.exists():
        where = "" if path.parent.is_dir() else f" (nor does its folder {path.parent})"
        return f"{key}: {path} does not exist{where}; expected {expected}"
    if not path.is_file():
        return f"{key}: {path} is not a regular file; expected {expected}"
    if not os.access(path, os.R_OK):
        return f"{key}: {path} is not readable by this user; expected {expected}"
    return None


def check_file(path: Path | str, key: str, expected: str = "a file") -> Path:
    """``path`` when it is a readable file, else :class:`InputFileError` naming ``key``."""
    problem = file_problem(path, key, expected)
    if problem:
        raise InputFileError(problem)
    return Path(path)


def input_files(config: Any, prefix: str = "") -> Iterator[tuple[str, Path, str]]:
    """``(config key, path, what is expected)`` of every input file named in ``config``: sections
    with an ``input_files()`` method, found in pydantic models and dataclasses at any depth."""
    if hasattr(config, "input_files") and not isinstance(config, type):
        for key, path, expected in config.input_files():
            yield f"{prefix}{key}", Path(path), expected
        return
    if isinstance(config, BaseModel):
        names = type(config).model_fields
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        names = [f.name for f in dataclasses.fields(config)]
    else:
        return
    for name in names:
        yield from input_files(getattr(config, name), f"{prefix}{name}.")


def check_inputs(config: Any) -> None:
    """Check every input file of ``config`` (see :func:`input_files`).

    Raises
    ------
    InputFileError
        One line per file that is missing, a directory or unreadable, each with its config key.
    """
    problems = [p for key, path, expected in input_files(config) if (p := file_problem(path, key, expected))]
    if problems:
        raise InputFileError("input files:\n  " + "\n  ".join(problems))
