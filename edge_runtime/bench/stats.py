"""Summary statistics for benchmark samples: mean ± stddev and percentiles.

Pure Python (no numpy, no torch) so it is cheap to import and trivially testable.

Conventions (stated because every tool picks differently):
- `stddev` is the *sample* standard deviation (n - 1 denominator), as llama-bench reports it; a single
  sample has stddev 0.0.
- `percentile(xs, q)` interpolates linearly between the two nearest ranks, like
  `numpy.percentile(..., method="linear")`: rank = q / 100 * (n - 1).
- Empty input gives `None` (rendered as "n/a"), never a made-up number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def stddev(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1); 0.0 for one sample, None for none."""
    if not xs:
        return None
    if len(xs) == 1:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def percentile(xs: Iterable[float], q: float) -> float | None:
    """Linear-interpolation percentile, q in [0, 100]."""
    assert 0.0 <= q <= 100.0, f"percentile q out of range: {q}"
    data = sorted(xs)
    if not data:
        return None
    rank = q / 100.0 * (len(data) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    frac = rank - lo
    return data[lo] + (data[hi] - data[lo]) * frac


@dataclass(frozen=True)
class Summary:
    """mean ± stddev of repeated measurements of one quantity."""

    mean: float | None
    stddev: float | None
    n: int

    @classmethod
    def of(cls, xs: Sequence[float]) -> "Summary":
        return cls(mean(xs), stddev(xs), len(xs))

    def fmt(self, digits: int = 2) -> str:
        if self.mean is None:
            return "n/a"
        return f"{self.mean:.{digits}f} ± {self.stddev:.{digits}f}"

    def to_dict(self) -> dict:
        return {"mean": self.mean, "stddev": self.stddev, "n": self.n}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b
