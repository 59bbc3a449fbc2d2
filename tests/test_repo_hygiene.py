"""Tracked files name no path of a development machine and no issue number.

Docs, code, configs and deployments must work on a user's machine: an absolute path of the machine
they were written on (its work tree, its temporary or home directories) means nothing there, and an
"issue N" reference means nothing without the tracker. Paths are checked in every tracked text
file outside ``tests/`` (tests may build such paths); issue references in every tracked text file.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Not preceded by a character that would make the match part of a longer name, a relative path or a
# URL (``../shared/data``, ``https://host/work/x``, ``$HOME/tmp/x``).
_START = r"(?<![\w.~/$-])"


def _root_patterns(root: Path) -> list[str]:
    """The checkout's own absolute root and its parent (where sibling work trees live)."""
    out = []
    for p in (root, root.parent):
        if len(p.parts) > 1:  # never "/" itself
            out.append(re.escape(p.as_posix()) + r"(?=[/\s'\"`)\]:,;]|$)")
    return out


PATH_PATTERNS = [
    *_root_patterns(ROOT),
    r"/work/",                  # work trees of the development machines
    r"/tmp/[\w.-]",             # a temporary directory's contents
    r"/var/tmp/[\w.-]",
    r"/root/",                  # the superuser's home
    r"/home/[\w.-]+/",          # a user's home
    r"/Users/[\w.-]+/",         # a user's home on macOS
]
# ... and the rest of the path, so that a failure shows it whole.
PATH_RE = re.compile("(?:" + "|".join(f"{_START}(?:{p})" for p in PATH_PATTERNS) + r")[^\s'\"`)\]>,;]*")
ISSUE_RE = re.compile(r"\b[Ii]ssues?[ \t-]*(?:no\.?|number)?[ \t]*#?[ \t]*\d+")

# (file, exact text, reason): a path the patterns catch that is the same on every machine, e.g. a
# system default a script documents. Keep it short and give the reason; prefer rewording.
ALLOWED: list[tuple[str, str, str]] = []


def offending_paths(text: str) -> list[str]:
    return [m.group(0) for m in PATH_RE.finditer(text)]


def issue_references(text: str) -> list[str]:
    return [m.group(0) for m in ISSUE_RE.finditer(text)]


def _tracked_text_files() -> list[tuple[str, str]]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        try:
            files.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue  # binary
    return files


def _allowed(name: str, hit: str, line: str) -> bool:
    return any(name == f and hit in text and text in line for f, text, _ in ALLOWED)


def _hits(find, skip_tests: bool) -> list[str]:
    found = []
    for name, text in _tracked_text_files():
        if name == THIS or (skip_tests and name.startswith("tests/")):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{lineno}: {hit!r} in {line.strip()[:120]!r}"
                      for hit in find(line) if not _allowed(name, hit, line)]
    return found


def test_no_development_machine_paths_outside_tests():
    found = _hits(offending_paths, skip_tests=True)
    assert not found, ("absolute paths of a development machine (write <dump>, $HOME/..., or a path "
                       "relative to the repository):\n" + "\n".join(found))


def test_no_issue_references():
    found = _hits(issue_references, skip_tests=False)
    assert not found, "issue references (name the feature instead):\n" + "\n".join(found)


PLANTED = ["log in /work/i12big/w2_partition.log", "--keep /tmp/keep/workers-2", "`/root/.cache/x`",
           "cd /home/alice/src", "(/Users/bob/funnelrag)", f"see {ROOT.as_posix()}/README.md"]
if len(ROOT.parent.parts) > 1:
    PLANTED.append(f'home="{ROOT.parent.as_posix()}/other"')


@pytest.mark.parametrize("text", PLANTED)
def test_planted_paths_are_found(text):
    assert offending_paths(text), text


@pytest.mark.parametrize("text", [
    "../shared/data", "https://dumps.wikimedia.org/work/x", "$HOME/tmp/x", "/srv/funnelrag",
    "/data/enwiki/enwiki-latest.xml.bz2", "~/.prefect/funnelrag-server.pid", "/usr/bin/time -v",
    "the /tmp default", "sqlite:///funnelrag-home/mlflow.db",
])
def test_generic_paths_pass(text):
    assert not offending_paths(text), text


# The positive cases are assembled from the word and a number, so this file itself names no
# issue; the checks on them are unchanged.
_WORD = "iss" + "ue"


@pytest.mark.parametrize("text, hit", [
    (f"the speed-ups of {_WORD} 12", True), (f"{_WORD.title()} #10", True), (f"({_WORD}s 4 and 6)", True),
    (f"{_WORD}-13 findings", True), ("an issue with the gate", False), ("tissue 3", False),
])
def test_issue_pattern(text, hit):
    assert bool(issue_references(text)) is hit, text
