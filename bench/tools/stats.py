"""The few statistics the report needs, without scipy (the GPU machines do not have it):
Student's t distribution, a mean with its 95 % confidence interval, Welch's t-test."""

from __future__ import annotations

import math
import statistics


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (not necessarily whole) degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (p > 0.5), by bisection on the two-sided tail."""
    tail = 2.0 * (1.0 - p)
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def variance(values: list[float], *, root: bool = False) -> float:
    """The sample variance (``root``: the standard deviation), infinite where it lies beyond
    a float: ``statistics`` sums exactly, in fractions, and its float of 1e600 was an
    OverflowError (a record of 1e300 img/s, consistent with itself, ended ``bench report``
    in a traceback)."""
    try:
        return statistics.stdev(values) if root else statistics.variance(values)
    except OverflowError:
        return math.inf


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its ``level`` confidence interval (NaN with one value)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    sem = variance(values, root=True) / math.sqrt(len(values))
    return mean, t_quantile(0.5 + level / 2.0, len(values) - 1) * sem


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """Difference of means (a - b) and Welch's two-sided p-value (NaN when either side has
    fewer than two values; 1.0 when both are constant and equal)."""
    a = [v for v in a if not math.isnan(v)]
    b = [v for v in b if not math.isnan(v)]
    if not a or not b:
        return math.nan, math.nan
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan
    va, vb = variance(a) / len(a), variance(b) / len(b)
    if va + vb == 0.0:
        return diff, 1.0 if diff == 0.0 else 0.0
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0)
                           + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    return diff, t_two_sided_p(t, df)
