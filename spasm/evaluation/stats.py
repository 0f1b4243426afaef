"""Small statistics helpers shared by the metrics: confidence intervals, paired tests and
:func:`finite`. scipy is imported by the functions that need it, so :func:`finite` costs
nothing to import (the viewer's agreement statistics use it)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

__all__ = ["cohen_dz_interval", "finite", "holm", "mean_ci", "paired_test", "wilson_interval"]


def finite(value: object) -> float | None:
    """``value`` as a float, or ``None`` when it is missing, not a number (a string, a bool) or
    not finite: what every metric stores where a statistic is undefined (JSON has no NaN)."""
    if value is None or isinstance(value, (str, bool)):
        return None
    number = float(value)  # type: ignore[arg-type]  # an int, a float or a numpy scalar
    return number if math.isfinite(number) else None


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (good for small n and p near 0 or 1).

    Returns ``(nan, nan)`` when ``n == 0``.
    """
    from scipy import stats

    if n <= 0:
        return (math.nan, math.nan)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At k = 0 or k = n one bound is exactly 0 or 1; pin it against rounding.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, int]:
    """Mean and Student-t confidence interval of the finite values: ``(mean, low, high, n)``.

    With one value the interval collapses to it; with none everything is NaN.
    """
    from scipy import stats

    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(arr.size)
    if n == 0:
        return (math.nan, math.nan, math.nan, 0)
    mean = float(arr.mean())
    if n == 1:
        return (mean, mean, mean, 1)
    sem = float(arr.std(ddof=1)) / math.sqrt(n)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sem
    return (mean, mean - half, mean + half, n)


def paired_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int | str | None]:
    """Compare paired samples ``a`` and ``b`` (same length, pair i = a[i], b[i]).

    Returns ``n_pairs``, ``mean_a``, ``mean_b``, ``delta`` (mean of a − b), its 95% CI,
    the paired Cohen's d (mean difference / sd of differences), the paired t-test and
    Wilcoxon signed-rank p-values, and a ``note`` when something could not be computed.
    """
    from scipy import stats

    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(x.size)
    out: dict[str, float | int | str | None] = {
        "n_pairs": n,
        "mean_a": float(x.mean()) if n else None,
        "mean_b": float(y.mean()) if n else None,
        "delta": None,
        "delta_ci_low": None,
        "delta_ci_high": None,
        "cohen_d": None,
        "p_ttest": None,
        "p_wilcoxon": None,
        "note": None,
    }
    if n == 0:
        out["note"] = "no complete pairs"
        return out
    diff = x - y
    mean, low, high, _ = mean_ci(diff.tolist())
    out["delta"], out["delta_ci_low"], out["delta_ci_high"] = mean, low, high
    if n < 2:
        out["note"] = "fewer than 2 pairs: no test"
        return out
    sd = float(diff.std(ddof=1))
    if sd == 0.0:
        out["note"] = "all paired differences are equal: no test"
        return out
    out["cohen_d"] = mean / sd
    with warnings.catch_warnings():
        # scipy warns about small samples (exact vs normal approximation); the p-values
        # are still the right ones to report, with n_pairs next to them.
        warnings.simplefilter("ignore")
        out["p_ttest"] = float(stats.ttest_rel(x, y).pvalue)
        if np.any(diff != 0):
            out["p_wilcoxon"] = float(stats.wilcoxon(x, y).pvalue)
    return out


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values (family-wise error), ``None`` kept in place.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m − j + 1) · p_(j))`` with m
    the number of p-values present. scipy has no Holm (``scipy.stats.false_discovery_control``
    is Benjamini–Hochberg/Yekutieli, which controls the false discovery rate instead); Holm
    controls the family-wise error under any dependence between the tests — the metrics
    compared here are correlated — and is uniformly more powerful than Bonferroni.
    """
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    m = len(present)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def cohen_dz_interval(dz: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Approximate confidence interval of a paired Cohen's d_z from ``n`` pairs.

    Normal approximation with ``se = sqrt(1/n + d_z² / (2n))`` (the large-sample variance of
    a one-sample standardised mean; Hedges & Olkin 1985). ``(nan, nan)`` when ``n < 2``.
    """
    from scipy import stats

    if n < 2 or not math.isfinite(dz):
        return (math.nan, math.nan)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    se = math.sqrt(1.0 / n + dz * dz / (2.0 * n))
    return (dz - z * se, dz + z * se)
