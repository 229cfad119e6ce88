"""Statistics the benchmarks report: the median of paired ratios with a distribution-free interval.

Timings on a shared machine are not normal (a busy neighbour makes one run slow, never one fast), so the interval
is the one for a median that assumes nothing about the distribution: between two order statistics chosen from the
binomial distribution of how many values fall below the median (any continuous distribution: each value is below
it with probability 1/2).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class MedianInterval:
    """The median of ``n`` values and an interval that holds the true median with probability >= ``coverage``."""

    median: float
    low: float
    high: float
    n: int
    coverage: float
    """The interval's exact coverage (at least the confidence asked for)."""

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the median (0.01: the median is known to about +-1%)."""
        return (self.high - self.low) / 2 / abs(self.median) if self.median else math.inf


def median_interval(values: list[float], confidence: float = 0.95) -> MedianInterval | None:
    """The median of ``values`` and its distribution-free ``confidence`` interval [x_(k), x_(n+1-k)] with the
    largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is still >= ``confidence``; None when no k does
    (fewer than 6 values at 95%)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    xs = sorted(values)
    n = len(xs)
    best = None
    below = 0.0  # P(Binomial(n, 1/2) <= k - 1)
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2**n
        coverage = 1 - 2 * below
        if coverage < confidence:
            break
        best = (k, coverage)
    if best is None:
        return None
    k, coverage = best
    return MedianInterval(statistics.median(xs), xs[k - 1], xs[n - k], n, coverage)
