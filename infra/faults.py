"""Fault injection for unattended builds: a copy of a real MediaWiki dump with a share of its
pages corrupted by invalid UTF-8 bytes (the pages stay parseable XML, so the ingest stage skips
and counts them, reason ``invalid_utf8``, and the build still succeeds with a smaller corpus).

Used by the quality-gate test, and by hand::

    python -m infra.faults ../shared/data/enwiki-sample/enwiki-20160501-pages-articles-shortened.xml.bz2 \\
        enwiki-corrupt-20.xml.bz2 --fraction 0.2
"""
from __future__ import annotations

import argparse
import bz2
import re
import sys
from pathlib import Path

_PAGE = re.compile(rb"<page>.*?</page>", re.S)
_TEXT = re.compile(rb"(<text[^>]*>)")
INVALID_BYTES = b"\xff\xfe"


def corrupt_dump(src: Path, dst: Path, fraction: float) -> tuple[int, int]:
    """Write ``dst`` (bz2) = ``src`` with every ``round(1 / fraction)``-th page's text corrupted.

    The first ``<text ...>`` of a chosen page gets :data:`INVALID_BYTES` after its opening tag;
    pages are chosen by position (deterministic), the first page never.

    Parameters
    ----------
    src : Path
        A ``.xml`` or ``.xml.bz2`` MediaWiki export.
    dst : Path
        Output path, written bz2-compressed.
    fraction : float
        Share of pages to corrupt, in (0, 1].

    Returns
    -------
    (corrupted, pages) : tuple of int

    Raises
    ------
    ValueError
        ``fraction`` outside (0, 1] or no ``<page>`` in ``src``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    raw = bz2.decompress(Path(src).read_bytes()) if str(src).endswith(".bz2") else Path(src).read_bytes()
    pages = list(_PAGE.finditer(raw))
    if not pages:
        raise ValueError(f"{src}: no <page> element")
    every = max(1, round(1 / fraction))
    out, last, corrupted = [], 0, 0
    for i, m in enumerate(pages):
        if i % every != every - 1:
            continue
        page = _TEXT.sub(lambda t: t.group(1) + INVALID_BYTES, m.group(0), count=1)
        out += [raw[last:m.start()], page]
        last = m.end()
        corrupted += page != m.group(0)
    out.append(raw[last:])
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_bytes(bz2.compress(b"".join(out), 9))
    return corrupted, len(pages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--fraction", type=float, default=0.2)
    args = parser.parse_args(argv)
    corrupted, pages = corrupt_dump(args.src, args.dst, args.fraction)
    print(f"{args.dst}: {corrupted} of {pages} pages corrupted ({corrupted / pages:.1%}) with invalid UTF-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
