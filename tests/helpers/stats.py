"""Goodness-of-fit for the sampling tests: is a sampler's output distributed as it must be?"""
from __future__ import annotations

import math


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable with df degrees of freedom (regularized upper gamma)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for the lower gamma
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= z / n
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction for the upper gamma (Lentz)
    b = z + 1 - a
    c = 1 / 1e-300
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def chi2_gof(counts: dict, expected_p: dict, n: int, min_expected: float = 5.0) -> float:
    """Goodness-of-fit p-value of observed counts against exact probabilities; cells expected to
    hold fewer than `min_expected` draws are pooled into one."""
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for cell, p in expected_p.items():
        e = p * n
        if e < min_expected:
            pool_o += counts.get(cell, 0)
            pool_e += e
        else:
            obs.append(counts.get(cell, 0))
            exp.append(e)
    unknown = sum(c for cell, c in counts.items() if cell not in expected_p)
    pool_o += unknown
    if pool_e > 0 or pool_o > 0:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-9))
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return chi2_sf(stat, len(obs) - 1)
