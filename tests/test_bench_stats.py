"""Percentiles and summaries: exact cases, and agreement with numpy's definition."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stats import EmptySampleError, percentile, summarize


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([5.0], 0, 5.0),
        ([5.0], 50, 5.0),
        ([5.0], 100, 5.0),
        ([1.0, 2.0], 50, 1.5),
        ([2.0, 1.0], 25, 1.25),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 90, 4.6),
        ([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0], 90, 100.0),
        ([0.0] * 99 + [100.0], 99, 1.0),
        ([0.0] * 99 + [100.0], 100, 100.0),
        ([3.0, 3.0, 3.0], 95, 3.0),
    ],
)
def test_percentile_table(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected, abs=1e-9)


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(EmptySampleError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 100),
)
def test_percentile_matches_numpy_linear(values: list[float], p: float) -> None:
    expected = float(np.percentile(np.asarray(values), p, method="linear"))
    assert percentile(values, p) == pytest.approx(expected, rel=1e-9, abs=1e-6)


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60))
def test_percentiles_are_ordered_and_bounded(values: list[float]) -> None:
    ps = [percentile(values, p) for p in (0, 50, 90, 95, 99, 100)]
    assert ps[0] == min(values)
    assert ps[-1] == max(values)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(ps))


def test_summarize_exact() -> None:
    s = summarize([4.0, None, 1.0, math.nan, 3.0, 2.0, math.inf])
    assert s == {
        "n": 4,
        "mean": 2.5,
        "min": 1.0,
        "p50": 2.5,
        "p90": 3.7,
        "p95": 3.85,
        "p99": 3.97,
        "max": 4.0,
    }


def test_summarize_empty() -> None:
    assert summarize([]) == {"n": 0}
    assert summarize([None, math.nan]) == {"n": 0}
