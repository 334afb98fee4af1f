"""Privacy accounting for the Gaussian mechanism: exact (epsilon, delta) and zCDP.

Exact (analytic) Gaussian mechanism
-----------------------------------
Adding ``N(0, sigma^2)`` noise to a query with L2 sensitivity ``Delta`` is
``(epsilon, delta)``-DP exactly when ``delta >= delta(epsilon)`` with
(Balle & Wang, *Improving the Gaussian mechanism for differential privacy:
analytical calibration and optimal denoising*, ICML 2018, Thm 8)

    delta(epsilon) = Phi(Delta / (2 sigma) - epsilon sigma / Delta)
                     - e^epsilon Phi(-Delta / (2 sigma) - epsilon sigma / Delta),

where ``Phi`` is the standard normal CDF.  The curve depends on ``sigma`` and
``Delta`` only through ``s = sigma / Delta``, decreases in ``s`` and in
``epsilon``, and is the tightest possible: the classical calibration
``sigma = Delta sqrt(2 ln(1.25 / delta)) / epsilon`` (Dwork & Roth 2014, Thm A.1)
is never smaller for ``epsilon < 1`` and is not valid at all for ``epsilon >= 1``.

Zero-concentrated DP
--------------------
The same mechanism is ``rho``-zCDP with ``rho = Delta^2 / (2 sigma^2)`` and
``rho``-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP for every
``delta > 0`` (Bun & Steinke, *Concentrated differential privacy:
simplifications, extensions, and lower bounds*, TCC 2016, Prop. 1.6 and 1.3).

All functions take and return Python floats and raise ``ValueError`` naming the
offending argument.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

__all__ = ["gaussian_delta", "gaussian_sigma", "gaussian_epsilon", "zcdp_rho", "zcdp_to_dp"]

# Bracket expansion stops after this many doublings/halvings (2**±200 covers
# every representable use; beyond it the inputs are degenerate).
_MAX_EXPANSIONS = 200


# ------------------------------------------------------------------ validation
def _scalar(x: object, name: str) -> float:
    """``x`` as a float; ``ValueError`` if it is not a real scalar."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, np.ndarray)):
        raise ValueError(f"{name} must be a real number, got {x!r}")
    if isinstance(x, np.ndarray):
        if x.ndim != 0 or not np.issubdtype(x.dtype, np.number):
            raise ValueError(f"{name} must be a real scalar, got an array of shape {x.shape}")
        x = x.item()
    return float(x)


def _positive(x: object, name: str) -> float:
    v = _scalar(x, name)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be positive and finite, got {x!r}")
    return v


def _nonnegative(x: object, name: str) -> float:
    v = _scalar(x, name)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be non-negative and finite, got {x!r}")
    return v


def _probability(x: object, name: str) -> float:
    v = _scalar(x, name)
    if not (0.0 < v < 1.0):
        raise ValueError(f"{name} must be in the open interval (0, 1), got {x!r}")
    return v


# ------------------------------------------------------------------ exact curve
def _log_delta(s: float, eps: float) -> float:
    """``log delta(eps)`` at ``s = sigma / Delta``, stable for tiny delta.

    With ``u = Phi(1/(2s) - eps s)`` and ``w = e^eps Phi(-1/(2s) - eps s)``,
    ``delta = u - w = u (1 - w/u)`` and ``log(w/u)`` is a difference of
    ``log_ndtr`` values, so neither term is formed outside log space.
    """
    a = 0.5 / s
    b = eps * s
    lu = float(log_ndtr(a - b))
    lw = eps + float(log_ndtr(-a - b))
    r = lw - lu                                  # <= 0 in exact arithmetic
    if r >= 0.0:
        return -math.inf
    return lu + math.log(-math.expm1(r))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact ``delta`` of the Gaussian mechanism at privacy level ``epsilon``.

    ``delta = Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D)``
    with ``D`` the L2 sensitivity (Balle & Wang, ICML 2018, Thm 8).  Computed in
    log space (``scipy.special.log_ndtr``), so values down to ~1e-300 keep full
    relative accuracy.

    Parameters
    ----------
    sigma : noise standard deviation, > 0.
    epsilon : privacy level, >= 0.
    sensitivity : L2 sensitivity ``D`` of the query, > 0.
    """
    sigma = _positive(sigma, "sigma")
    eps = _nonnegative(epsilon, "epsilon")
    d2 = _positive(sensitivity, "sensitivity")
    return math.exp(_log_delta(sigma / d2, eps))


def _solve_log(f, x0: float) -> float:
    """Root of the decreasing function ``f`` on ``(0, inf)``, bracketed from ``x0``
    by doubling/halving, to the last few bits (brentq)."""
    lo = hi = x0
    for _ in range(_MAX_EXPANSIONS):
        if f(hi) <= 0.0:
            break
        lo, hi = hi, 2.0 * hi
    else:
        raise ValueError("could not bracket the root (degenerate inputs)")
    if lo == hi:                                  # f(x0) <= 0: expand downwards
        for _ in range(_MAX_EXPANSIONS):
            lo = hi / 2.0
            if f(lo) > 0.0:
                break
            hi = lo
        else:
            raise ValueError("could not bracket the root (degenerate inputs)")
    if f(hi) == 0.0:
        return hi
    return brentq(f, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)


def _round_up(x: float, ok) -> float:
    """Smallest float ``>= x`` (up to a few ulps) with ``ok(value)`` true: makes a
    root-finder's answer satisfy the inequality exactly, never below it."""
    step = np.spacing(x)
    while not ok(x):
        x += step
        step *= 2.0
    return x


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest ``sigma`` with ``gaussian_delta(sigma, epsilon, sensitivity) <= delta``.

    The analytic Gaussian mechanism calibration (Balle & Wang, ICML 2018, Alg. 1):
    ``delta(sigma)`` decreases in ``sigma``, so the answer is the root of
    ``log delta(sigma) = log delta``, found by ``scipy.optimize.brentq`` on an
    expanding bracket to ~1e-15 relative precision, then rounded up so that the
    returned value is never below the exact threshold.

    Parameters
    ----------
    epsilon : >= 0.
    delta : in (0, 1).
    sensitivity : L2 sensitivity, > 0; ``sigma`` scales linearly with it.
    """
    eps = _nonnegative(epsilon, "epsilon")
    dlt = _probability(delta, "delta")
    d2 = _positive(sensitivity, "sensitivity")
    target = math.log(dlt)
    s = _solve_log(lambda t: _log_delta(t, eps) - target, 1.0)
    # the check is the one gaussian_delta evaluates, so the guarantee holds as reported
    return _round_up(s * d2, lambda t: math.exp(_log_delta(t / d2, eps)) <= dlt)


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest ``epsilon >= 0`` with ``gaussian_delta(sigma, epsilon, sensitivity) <= delta``.

    ``delta(epsilon)`` decreases in ``epsilon`` (Balle & Wang 2018, Thm 8), so
    this is ``0`` when ``delta(0) = 2 Phi(D / (2 sigma)) - 1 <= delta`` and the
    root of ``log delta(epsilon) = log delta`` otherwise (brentq, rounded up).
    """
    s = _positive(sigma, "sigma")
    dlt = _probability(delta, "delta")
    s /= _positive(sensitivity, "sensitivity")
    if math.exp(_log_delta(s, 0.0)) <= dlt:
        return 0.0
    target = math.log(dlt)
    eps = _solve_log(lambda e: _log_delta(s, e) - target, 1.0)
    return _round_up(eps, lambda e: math.exp(_log_delta(s, e)) <= dlt)


# ------------------------------------------------------------------------ zCDP
def zcdp_rho(sigma: float, sensitivity: float = 1.0) -> float:
    """zCDP parameter of the Gaussian mechanism: ``rho = Delta^2 / (2 sigma^2)``
    (Bun & Steinke, TCC 2016, Prop. 1.6)."""
    s = _positive(sigma, "sigma")
    d2 = _positive(sensitivity, "sensitivity")
    return d2 * d2 / (2.0 * s * s)


def zcdp_to_dp(rho: float, delta: float) -> float:
    """``epsilon`` such that ``rho``-zCDP implies ``(epsilon, delta)``-DP:
    ``epsilon = rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke, TCC 2016, Prop. 1.3)."""
    r = _nonnegative(rho, "rho")
    d = _probability(delta, "delta")
    return r + 2.0 * math.sqrt(r * math.log(1.0 / d))
