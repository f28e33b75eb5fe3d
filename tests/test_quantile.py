"""One quantile for every benchmark's p10/p50/p90/p99 (the disk, network and workload benchmarks
had three: p10 of 1..10 read 1, 2 or 1.9), the one NumPy and statistics.quantiles ("inclusive") use."""

from __future__ import annotations

import statistics

import pytest

from gpuvet.samples import quantile


def test_p10_of_one_to_ten_is_the_interpolated_one():
    values = list(range(1, 11))
    assert quantile(values, 0.1) == pytest.approx(1.9)
    assert quantile(values, 0.5) == statistics.median(values)
    assert quantile(values, 0.9) == pytest.approx(9.1)


@pytest.mark.parametrize("values", [[7], [3, 1], [5, 1, 9, 2, 2, 8, 100], list(range(1000, 0, -7))])
def test_it_agrees_with_the_standard_library(values):
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    for q in (10, 50, 90, 99):
        assert quantile(values, q / 100) == pytest.approx(cuts[q - 1])
    assert quantile(values, 0) == min(values) and quantile(values, 1) == max(values)


def test_no_values_is_an_error_not_a_figure():
    with pytest.raises(ValueError):
        quantile([], 0.5)
