"""One check shared by the sharded-index tests: two passage indexes give the same search results."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def assert_same_search(want_index, got_index, questions: Sequence[str], ks: Sequence[int] = (1, 10, 100)) -> None:
    """Same top-``k`` scores (rtol 1e-6) and ids for every question and ``k``.

    bm25s picks any of the rows tied at the k-th score (argpartition), so ids above that score
    are compared in order, the tied ones as a subset of all rows with that score."""
    for k in ks:
        want_ids, want = want_index.search(list(questions), k)
        got_ids, got = got_index.search(list(questions), k)
        assert got.shape == want.shape == (len(questions), min(k, len(want_index)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        for q in range(len(questions)):
            above = want[q] > want[q, -1]
            assert [i for i, a in zip(got_ids[q], above) if a] == [i for i, a in zip(want_ids[q], above) if a]
            tied = got_index.search([questions[q]], 3 * k)
            tied_ids = {i for i, sc in zip(tied[0][0], tied[1][0]) if sc == want[q, -1]}
            assert {i for i, a in zip(want_ids[q], above) if not a} <= tied_ids
