"""Every relative link between the repository's Markdown files resolves.

A link ``[text](path)`` or ``[text](path#anchor)`` in a tracked ``.md`` file must name a file or
folder of the checkout, relative to the linking file; an anchor into a Markdown file must be one
of its headings (GitHub's slug: lower case, punctuation dropped, spaces as ``-``, a repeated
heading numbered ``-1``, ``-2``, ...) or an explicit ``<a id="...">``. Links to other sites are
not followed (no network here). Code spans and fenced blocks are skipped: they quote, they do not
link.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^()\s]+(?:\([^()\s]*\))?[^()\s]*)\)|!\[[^\]\n]*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`+[^`\n]*`+")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their 1-based numbers."""
    out, fenced = [], False
    for lineno, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((lineno, line))
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (repeats numbered) and explicit ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        found.update(EXPLICIT_ID.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def links(text: str) -> list[tuple[int, str]]:
    """The link targets of a Markdown text outside code, with their line numbers."""
    out = []
    for lineno, line in prose_lines(text):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            out.append((lineno, m.group(1) or m.group(2)))
    return out


def broken_links(md: Path, root: Path) -> list[str]:
    """``file:line: target (reason)`` for each relative link of ``md`` that does not resolve."""
    bad = []
    for lineno, target in links(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):   # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (md.parent / path_part).resolve() if path_part else md
        where = f"{md.relative_to(root).as_posix()}:{lineno}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif not dest.resolve().is_relative_to(root):
            bad.append(f"{where} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{where} (no such heading)")
    return bad


def _tracked_markdown() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_every_relative_link_between_docs_resolves():
    files = _tracked_markdown()
    assert any(f.name == "README.md" for f in files)
    bad = [b for md in files for b in broken_links(md, ROOT)]
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def test_the_check_finds_a_planted_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Results (2026-11-28)\n\n## Runs\n\n## Runs\n\n<a id=\"kept\"></a>text\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md#results-2026-11-28) [again](docs/a.md#runs-1) [id](docs/a.md#kept) "
        "[web](https://example.org/x.md) [self](#top)\n\n# Top\n\n"
        "`[quoted](docs/none.md)`\n\n```\n[fenced](docs/none.md)\n```\n"
        "[gone](docs/b.md) [no heading](docs/a.md#runs-2) [up](../../x.md)\n", encoding="utf-8")
    bad = broken_links(page, tmp_path)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "docs/b.md (no such file)", "docs/a.md#runs-2 (no such heading)", "../../x.md (no such file)"]


@pytest.mark.parametrize("heading, anchor", [
    ("The shortlist's size chosen again, on 600 validation questions (2026-11-28)",
     "the-shortlists-size-chosen-again-on-600-validation-questions-2026-11-28"),
    ("3c. Turn a schedule on, with your overrides kept", "3c-turn-a-schedule-on-with-your-overrides-kept"),
    ("`funnelrag demo` end to end", "funnelrag-demo-end-to-end"),
])
def test_slug_follows_github(heading, anchor):
    assert slug(heading) == anchor
