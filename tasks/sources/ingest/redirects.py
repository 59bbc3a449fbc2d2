"""Redirect resolution: follow chains to a kept article, detect cycles and dead ends."""
from __future__ import annotations

from collections.abc import Container, Mapping

RESOLVED, CYCLE, DANGLING, EXCLUDED = "resolved", "cycle", "dangling", "excluded"
_MAX_HOPS = 32_767  # int16 column


def resolve_redirects(targets: Mapping[str, str | None], title_to_id: Mapping[str, int],
                      excluded: Container[str]) -> tuple[list[tuple[str, str | None, str, int]], dict[str, int]]:
    """Resolve every redirect to the kept article at the end of its chain.

    Parameters
    ----------
    targets : mapping
        ``{redirect title: normalised target title or None}`` (None: the target is not a
        main-namespace title, e.g. ``Wikipedia:...``).
    title_to_id : mapping
        ``{kept article title: doc_id}``.
    excluded : container
        Titles of pages that exist in the input but were not kept (disambiguation, empty, ...).

    Returns
    -------
    rows : list of (source_title, target_title, status, hops)
        Sorted by source title; ``status`` is ``resolved`` (``target_title`` = final article),
        ``cycle`` (the chain revisits a title), ``dangling`` (ends at a missing or
        other-namespace title) or ``excluded`` (ends at a skipped page); ``hops`` = redirects
        followed (1 for a direct redirect).
    resolved : dict
        ``{redirect title: doc_id}`` for resolved redirects (to resolve links).
    """
    outcome: dict[str, tuple[str | None, str, int]] = {}
    starts = sorted(targets)
    for start in starts:
        if start in outcome:
            continue
        path, on_path = [start], {start}
        target = targets[start]
        extra = 0
        while True:
            if target is None:
                final, status = None, DANGLING
            elif target in title_to_id:
                final, status = target, RESOLVED
            elif target in on_path:
                final, status = None, CYCLE
            elif target in outcome:
                final, status, extra = outcome[target]
            elif target in targets:
                path.append(target)
                on_path.add(target)
                target = targets[target]
                continue
            elif target in excluded:
                final, status = None, EXCLUDED
            else:
                final, status = None, DANGLING
            break
        for i, title in enumerate(path):
            outcome[title] = (final, status, min(_MAX_HOPS, len(path) - i + extra))
    # Every title on a path is a key of ``targets``, so ``outcome`` has exactly those keys: the
    # sorted starts are the sorted rows (no second sort).
    rows = [(src, *outcome[src]) for src in starts]
    resolved = {src: title_to_id[final] for src, final, status, _ in rows if status == RESOLVED}
    return rows, resolved
