"""Exact noise for a real release: OpenDP's vetted mechanisms behind ``sampler="opendp"``.

numpy's samplers (``sampler="numpy"``, the default of :func:`cvxdp.mechanisms.laplace`,
:func:`~cvxdp.mechanisms.gaussian` and :func:`~cvxdp.mechanisms.residual_gaussian`) draw
floating-point noise: right in distribution, and what simulations and benchmarks need, but
**for simulation only**.  A floating-point sample takes some doubles and never others, and
which ones depends on the value the noise was added to, so the low bits of a released answer
can reveal the true answer (Mironov, *On significance of the least significant bits for
differential privacy*, CCS 2012).  OpenDP (``pip install 'cvxdp[mbi]'``) samples exactly:

* integer answers (integer queries of integer counts, below ``2^53``): the discrete Laplace
  (geometric) and discrete Gaussian (Canonne, Kamath, Steinke, NeurIPS 2020) mechanisms on the
  integers, which return integers;
* other answers: OpenDP's floating-point mechanisms, which sample exactly on a grid of
  ``2^k`` and round, and account for the rounding in their privacy map.

Both have the continuous family's log-likelihood up to a constant (``-|e| / b`` or
``-e^2 / (2 sigma^2)``), so ``cvxdp.nll`` of the returned :class:`cvxdp.Measurement` is the
exact MLE; the discrete families' variances are at most the continuous ones'.

The scale is the one OpenDP's own privacy map certifies for the sensitivity ``d_in``: the
Laplace scale ``b`` with ``map(d_in) <= epsilon`` (``d_in / epsilon`` unless rounding of the
map asks for a hair more, then OpenDP's binary search), ``sigma`` with ``map(d_in) <= rho``
(zCDP), and for ``(epsilon, delta)`` the smallest ``sigma`` whose zCDP, converted by OpenDP
(``make_zCDP_to_approxDP``), meets both: a few per cent above the analytic Gaussian's
(:func:`cvxdp.privacy.gaussian_sigma`), which is exact for the real-valued mechanism only.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

__all__ = ["SAMPLERS", "import_opendp", "laplace", "gaussian"]

#: the noise samplers the mechanisms offer: numpy's (simulation only) and OpenDP's (exact)
SAMPLERS = ("numpy", "opendp")
# integers up to 2^53 are exact doubles: answers beyond take the floating-point mechanism
_MAX_EXACT_INT = 2.0 ** 53


def import_opendp(caller: str) -> Any:
    """``opendp.prelude`` with the ``contrib`` features on, or an ``ImportError`` naming
    ``caller`` and the extra that brings it."""
    try:
        import opendp.prelude as dp      # an optional extra: imported only when asked for
    except ImportError as exc:
        raise ImportError(f"{caller}(sampler='opendp') needs opendp: pip install "
                          f"'cvxdp[mbi]' ({exc})") from exc
    dp.enable_features("contrib")
    return dp


def check_sampler(caller: str, sampler: object, rng: object) -> None:
    """``ValueError`` for an unknown sampler, or a seed given to OpenDP's (it draws from the
    operating system's entropy: a release cannot be replayed from a seed)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"{caller}: sampler must be one of {SAMPLERS}, got {sampler!r}")
    if sampler == "opendp" and rng is not None:
        raise ValueError(f"{caller}: rng has no effect with sampler='opendp' (OpenDP draws "
                         "from the operating system's entropy); leave it None")


def is_integral(values: np.ndarray) -> bool:
    """Are all ``values`` integers of magnitude below ``2^53`` (exact as doubles)?"""
    return bool(np.all(np.abs(values) < _MAX_EXACT_INT) and np.all(values == np.round(values)))


def laplace(answers: np.ndarray, sensitivity: float, epsilon: float) -> tuple[np.ndarray, float]:
    """``(answers + noise, b)`` by OpenDP's Laplace mechanism, ``b`` the smallest scale whose
    privacy map gives ``epsilon`` at ``sensitivity`` (module docstring)."""
    dp = import_opendp("laplace")
    space = _space(dp, answers, dp.l1_distance(T=float))
    scale = _calibrated(dp, lambda b: space >> dp.m.then_laplace(scale=b), float(sensitivity),
                        float(epsilon), sensitivity / epsilon)
    return _release(space >> dp.m.then_laplace(scale=scale), answers), scale


def gaussian(answers: np.ndarray, sensitivity: float | None, sigma: float,
             rho: float | None = None, epsilon: float | None = None,
             delta: float | None = None) -> tuple[np.ndarray, float]:
    """``(answers + noise, sigma)`` by OpenDP's Gaussian mechanism.  ``sigma`` as given when
    neither ``rho`` nor ``epsilon`` is; else ``sigma`` is the first guess of the calibration
    to ``rho`` (zCDP) or ``(epsilon, delta)`` at ``sensitivity`` (module docstring)."""
    dp = import_opendp("gaussian")
    space = _space(dp, answers, dp.l2_distance(T=float))

    def zcdp(s: float):
        return space >> dp.m.then_gaussian(scale=s)

    if rho is not None:
        sigma = _calibrated(dp, zcdp, float(sensitivity), float(rho), sigma)
    elif epsilon is not None:
        def approx(s: float):
            return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(zcdp(s)), delta=float(delta))
        sigma = _calibrated(dp, approx, float(sensitivity), (float(epsilon), float(delta)), sigma)
    return _release(zcdp(sigma), answers), sigma


def _space(dp: Any, answers: np.ndarray, metric: Any) -> tuple:
    """The input space of the answers: integers (``i64``) when they are integral, floats
    without NaN otherwise; the distance is real-valued either way (an L2 sensitivity of
    integer queries is rarely an integer)."""
    atom = dp.atom_domain(T="i64") if is_integral(answers) else dp.atom_domain(T=float, nan=False)
    return dp.vector_domain(atom), metric


def _calibrated(dp: Any, make: Callable[[float], Any], d_in: float, d_out: Any,
                guess: float) -> float:
    """``guess`` if ``make(guess)`` maps ``d_in`` within ``d_out``, else the smallest scale
    that does (OpenDP's binary search; it only ever grows the scale by rounding)."""
    if _within(make(guess).map(d_in), d_out):
        return float(guess)
    return float(dp.binary_search_param(make, d_in=d_in, d_out=d_out))


def _within(got: Any, budget: Any) -> bool:
    if isinstance(budget, tuple):
        return got[0] <= budget[0] and got[1] <= budget[1]
    return got <= budget


def _release(mechanism: Any, answers: np.ndarray) -> np.ndarray:
    """Run ``mechanism`` on ``answers`` (as Python ints or floats, its domain's type)."""
    values = answers.astype(np.int64).tolist() if is_integral(answers) else answers.tolist()
    out = np.asarray(mechanism(values), dtype=float)
    if not math.isfinite(float(np.max(np.abs(out), initial=0.0))):
        raise ValueError("OpenDP returned a non-finite answer (the data are too large for "
                         "the floating-point mechanism)")
    return out
