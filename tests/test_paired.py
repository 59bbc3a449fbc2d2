"""The one percentile bootstrap over questions: a mean's interval and the paired difference."""
from __future__ import annotations

import numpy as np
import pytest

from funnelrag.paired import bootstrap_indices, mean_interval, pair_by_question, paired_difference


def test_identical_systems_differ_by_exactly_zero():
    a = np.array([1.0, 0.0, 1.0, 1.0, 0.0] * 20)
    d = paired_difference(a, a.copy())
    assert (d.diff, d.low, d.high, d.n) == (0.0, 0.0, 0.0, 100) and d.holds_zero
    assert d.text() == "+0.000 [+0.000, +0.000], n=100"


def test_a_clearly_better_system_has_an_interval_above_zero_and_a_noisy_one_holds_zero():
    rng = np.random.default_rng(1)
    a = (rng.random(300) < 0.3).astype(float)
    better = np.maximum(a, (rng.random(300) < 0.3).astype(float))        # wins ~21% of the questions, never loses
    d = paired_difference(a, better)
    assert d.low > 0.1 and not d.holds_zero and d.mean_b > d.mean_a
    noisy = a.copy()
    noisy[:10] = 1 - noisy[:10]                                          # a few flips either way
    assert paired_difference(a, noisy).holds_zero


def test_same_seed_same_interval_and_the_mean_interval_brackets_the_mean():
    values = np.array([1.0] * 30 + [0.0] * 70)
    assert np.array_equal(bootstrap_indices(100, 50, 3), bootstrap_indices(100, 50, 3))
    m, lo, hi = mean_interval(values)
    assert m == pytest.approx(0.3) and lo < 0.3 < hi and hi - lo == pytest.approx(0.18, abs=0.04)
    assert mean_interval(values) == (m, lo, hi)


def test_pairing_by_question_refuses_different_sets():
    keys, a, b = pair_by_question({"q2": 1.0, "q1": 0.0}, {"q1": 1.0, "q2": 1.0})
    assert keys == ["q1", "q2"] and a.tolist() == [0.0, 1.0] and b.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="question sets differ.*1 only in the first.*q3"):
        pair_by_question({"q1": 1.0, "q3": 0.0}, {"q1": 1.0, "q2": 1.0}, "dev AR@8")
    with pytest.raises(ValueError, match="shapes"):
        paired_difference([1.0, 0.0], [1.0])
