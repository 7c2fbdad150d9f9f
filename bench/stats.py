"""Percentiles and summaries used by every bench report.

Percentiles use linear interpolation between closest ranks (numpy's default
``"linear"`` method, Hyndman & Fan type 7): for sorted values ``x[0..n-1]`` the
p-th percentile sits at fractional rank ``h = (n - 1) * p / 100`` and is
``x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

SUMMARY_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


class EmptySampleError(ValueError):
    """A percentile of no values was asked for."""


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0 ≤ p ≤ 100) of ``values`` by linear interpolation."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    if not values:
        raise EmptySampleError("percentile of an empty sample")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = rank - lower
    return ordered[lower] + fraction * (ordered[upper] - ordered[lower])


def _finite(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def summarize(values: Iterable[float | None], digits: int = 4) -> dict[str, float | int]:
    """``n``, ``mean``, ``min``, p50/p90/p95/p99 and ``max`` of the finite values.

    ``None`` and non-finite values are dropped (a stream that never produced
    audio has no TTFA); an empty sample summarizes to ``{"n": 0}``.
    """
    sample = _finite(values)
    if not sample:
        return {"n": 0}
    out: dict[str, float | int] = {
        "n": len(sample),
        "mean": round(math.fsum(sample) / len(sample), digits),
        "min": round(min(sample), digits),
    }
    for p in SUMMARY_PERCENTILES:
        out[f"p{p}"] = round(percentile(sample, p), digits)
    out["max"] = round(max(sample), digits)
    return out
