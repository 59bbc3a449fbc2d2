"""Intra-op thread count of torch for the duration of a flow run."""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Set ``torch.set_num_threads(n)`` inside the block and restore the previous count after
    it (also on error); ``None`` or 0 leaves the count alone. Per-query latency on a shared CPU
    is far more stable with 1."""
    import torch  # noqa: PLC0415  (heavy: torch, only when a flow sets its thread count)

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
