"""The benchmarks' median interval (tunelab/report/stats.py), and the collector-overhead script that stops on it:
a deadline that leaves no time for a second pair, its JSON rewritten as it goes, bad arguments in one line."""

from __future__ import annotations

import math
import random

import pytest

from tunelab.report.stats import median_interval


def test_interval_is_the_binomial_order_statistics():
    xs = [float(v) for v in range(1, 13)]  # 12 values: P(Bin(12, 1/2) <= 2) = 79/4096, so k = 3
    ci = median_interval(list(reversed(xs)))
    assert (ci.median, ci.low, ci.high, ci.n) == (6.5, 3.0, 10.0, 12)
    assert ci.coverage == pytest.approx(1 - 2 * 79 / 4096)
    assert ci.half_width == pytest.approx(3.5 / 6.5)
    six = median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])  # the fewest values with a 95% interval: min and max
    assert (six.low, six.high) == (1.0, 6.0) and six.coverage == pytest.approx(1 - 2 / 64)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 5 values: min-max covers only 93.75%
    assert median_interval([]) is None
    with pytest.raises(ValueError):
        median_interval(xs, confidence=1.0)


def test_interval_covers_the_median_of_a_skewed_distribution():
    """Distribution-free: on exponential draws (skewed like timings on a busy machine) the interval holds the true
    median (ln 2) at least as often as it claims, within the sampling error of 4,000 trials."""
    rng = random.Random(7)
    for n in (6, 10, 25):
        hits, claimed = 0, None
        for _ in range(4000):
            ci = median_interval([rng.expovariate(1.0) for _ in range(n)])
            claimed = ci.coverage
            hits += ci.low <= math.log(2) <= ci.high
        assert hits / 4000 >= claimed - 3 * math.sqrt(claimed * (1 - claimed) / 4000), (n, hits, claimed)
        assert claimed >= 0.95
