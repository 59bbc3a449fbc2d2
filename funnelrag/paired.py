"""Percentile bootstrap over questions: a mean's 95% interval and the paired difference of two
systems measured on the same questions (one implementation for every report, the champion gate
and ``funnelrag compare``).

Resampling: ``n_boot`` sets of ``n`` question indices drawn with replacement from a generator
fixed by ``seed`` (:func:`bootstrap_indices`); the same index sets serve every row of a table,
so two systems' paired difference is resampled question by question (Efron & Tibshirani 1993,
ch. 13, percentile interval; Koehn 2004 for paired bootstrap over test items). Same inputs and
seed give the same interval.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

N_BOOTSTRAP = 2000
SEED = 0


def bootstrap_indices(n: int, n_boot: int = N_BOOTSTRAP, seed: int = SEED) -> np.ndarray:
    """``(n_boot, n)`` resampled question indices (with replacement), fixed by ``seed``.

    Raises
    ------
    ValueError
        ``n`` < 1 or ``n_boot`` < 1.
    """
    if n < 1 or n_boot < 1:
        raise ValueError(f"bootstrap needs at least one question and one resample (n={n}, n_boot={n_boot})")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def interval(values: np.ndarray, idx: np.ndarray) -> tuple[float, float, float]:
    """Mean of ``values`` ``(n,)`` and its percentile-bootstrap 95% interval over ``idx``
    ``(n_boot, n)`` (:func:`bootstrap_indices`): ``(mean, low, high)``."""
    values = np.asarray(values, dtype=np.float64)
    means = values[idx].mean(axis=1)                                    # (n_boot,)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(lo), float(hi)


def mean_interval(values: Sequence[float], n_boot: int = N_BOOTSTRAP, seed: int = SEED) -> tuple[float, float, float]:
    """``(mean, low, high)`` of per-question ``values`` ``(n,)``: :func:`interval` over fresh indices."""
    values = np.asarray(values, dtype=np.float64)
    return interval(values, bootstrap_indices(len(values), n_boot, seed))


@dataclass(frozen=True)
class PairedDifference:
    """System B minus system A on the same ``n`` questions.

    mean_a, mean_b : each system's mean of the per-question values.
    diff, low, high : mean of the per-question differences ``b - a`` and its 95% percentile
        bootstrap interval.
    n : questions paired.
    """

    mean_a: float
    mean_b: float
    diff: float
    low: float
    high: float
    n: int

    @property
    def holds_zero(self) -> bool:
        """The interval includes 0: no measurable difference at 95%."""
        return self.low <= 0.0 <= self.high

    def text(self, scale: float = 1.0, digits: int = 3, with_n: bool = True) -> str:
        """``"+0.040 [+0.010, +0.070], n=300"`` (values times ``scale``; ``with_n=False``: no n)."""
        d, lo, hi = (scale * v for v in (self.diff, self.low, self.high))
        return f"{d:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]" + (f", n={self.n:,}" if with_n else "")


def paired_difference(a: Sequence[float], b: Sequence[float], n_boot: int = N_BOOTSTRAP,
                      seed: int = SEED, idx: np.ndarray | None = None) -> PairedDifference:
    """Paired bootstrap of ``b - a`` over questions.

    Parameters
    ----------
    a, b : ``(n,)`` per-question values of two systems, question ``i`` in both at position ``i``.
    n_boot, seed : resamples and their seed (ignored when ``idx`` is given).
    idx : ``(n_boot, n)`` resampled indices shared with other rows of a table.

    Raises
    ------
    ValueError
        The lengths differ, or there is no question.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need the same questions: shapes {a.shape} and {b.shape}")
    idx = bootstrap_indices(len(a), n_boot, seed) if idx is None else idx
    diff, lo, hi = interval(b - a, idx)
    return PairedDifference(float(a.mean()), float(b.mean()), diff, lo, hi, len(a))


def pair_by_question(a: Mapping[str, float], b: Mapping[str, float], what: str = "the two sets"
                     ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Align two ``{question key: value}`` maps: ``(sorted keys, (n,) a, (n,) b)``.

    Raises
    ------
    ValueError
        The question sets differ (names ``what``, the counts and a few keys found in one only),
        or they are empty.
    """
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        raise ValueError(f"{what}: the question sets differ ({len(a):,} vs {len(b):,} questions; "
                         f"{len(only_a):,} only in the first, e.g. {only_a[:3]}; {len(only_b):,} only in the second, "
                         f"e.g. {only_b[:3]}): a paired comparison needs the same questions")
    if not a:
        raise ValueError(f"{what}: no question to compare")
    keys = sorted(a)
    return keys, np.array([a[k] for k in keys], np.float64), np.array([b[k] for k in keys], np.float64)
