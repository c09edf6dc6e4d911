"""bench.stats against numpy/statistics references on random data."""

import random
import statistics

import numpy as np
import pytest

from edge_runtime.bench.stats import Summary, mean, percentile, ratio, stddev


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentile_matches_numpy_linear(n):
    rng = random.Random(n)
    xs = [rng.uniform(-5, 50) for _ in range(n)]
    for q in (0, 5, 25, 50, 90, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12)


def test_percentile_empty_and_range():
    assert percentile([], 50) is None
    with pytest.raises(AssertionError):
        percentile([1.0], 101)


@pytest.mark.parametrize("n", [2, 7, 50])
def test_mean_stddev_match_statistics(n):
    rng = random.Random(100 + n)
    xs = [rng.gauss(3.0, 2.0) for _ in range(n)]
    assert mean(xs) == pytest.approx(statistics.mean(xs))
    assert stddev(xs) == pytest.approx(statistics.stdev(xs))


def test_summary_edges():
    assert stddev([4.2]) == 0.0
    assert Summary.of([]).fmt() == "n/a"
    s = Summary.of([1.0, 3.0])
    assert s.fmt(1) == "2.0 ± 1.4"
    assert s.to_dict() == {"mean": 2.0, "stddev": pytest.approx(2**0.5), "n": 2}
    assert ratio(6.0, 2.0) == 3.0 and ratio(1.0, 0.0) is None and ratio(None, 1.0) is None
