"""Sensitivities and the Laplace / Gaussian releases of linear queries.

Neighbouring databases differ by adding or removing one record, which changes
one cell of the data vector ``x`` by 1.  The answers ``Q x`` then move by one
column of ``Q``, so the sensitivities are column norms::

    Delta_1(Q) = max_j sum_i |Q_ij|,        Delta_2(Q) = max_j sqrt(sum_i Q_ij^2).

* Laplace mechanism: ``y = Q x + Lap(b)^m`` with ``b = Delta_1 / epsilon`` is
  ``epsilon``-DP (Dwork, McSherry, Nissim, Smith, TCC 2006).  On a hierarchy
  ``Delta_1`` is the number of levels (Hay et al., VLDB 2010); on the weighted
  Haar strategy it is ``1 + log2 n``, Privlet's generalized sensitivity (Xiao,
  Wang, Gehrke, ICDE 2010 / TKDE 2011).
* Gaussian mechanism: ``y = Q x + N(0, sigma^2 I)`` is ``rho``-zCDP with
  ``rho = Delta_2^2 / (2 sigma^2)`` (Bun & Steinke, TCC 2016) and exactly
  ``(epsilon, delta)``-DP on the curve of Balle & Wang (ICML 2018), see
  :mod:`cvxdp.privacy`.

Both return a :class:`cvxdp.Measurement`, the input of ``cvxdp.nll``.

**Simulation or release.**  ``sampler="numpy"`` (the default) draws the noise with numpy's
floating-point generators, seeded by ``rng``: for simulations, benchmarks and tests only.
Floating-point Laplace and Gaussian samples leak the value they were added to through their
low bits (Mironov, CCS 2012), so they must not be published.  ``sampler="opendp"`` draws the
same noise with OpenDP's exact samplers (``pip install 'cvxdp[mbi]'``; integer answers get the
discrete Laplace / Gaussian, others OpenDP's floating-point mechanisms) and returns the same
:class:`cvxdp.Measurement` with the scale OpenDP's privacy map certifies
(:mod:`cvxdp.modelling.opendp_samplers`): use it for a real release.

A release OpenDP made itself (``make_count_by_categories``, ``then_b_ary_tree``,
``then_laplace``) is a :class:`cvxdp.Measurement` of its queries: the histogram's identity
(with the trailing unknown-category count as one more cell), or
``cvxdp.workloads.hierarchy(leaf_count, branching_factor, layout="opendp").queries``, with the
scale passed to OpenDP.

* Marginal workloads in the residual basis: :func:`residual_gaussian` releases the residual
  answers of a :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload` with a design ``s``
  (:mod:`cvxdp.modelling.residual_measurement`: samplers, accounting, :func:`scale_to_rho`).
"""
from __future__ import annotations


import numpy as np
import scipy.sparse as sp

from . import opendp_samplers
from .measurement import Measurement
from .opendp_samplers import check_sampler
from .privacy import _positive, _probability, gaussian_sigma
from .randomness import as_rng as _as_rng
from .residual_measurement import ResidualMeasurement, residual_gaussian, scale_to_rho

__all__ = ["l1_sensitivity", "l2_sensitivity", "laplace", "gaussian", "residual_gaussian",
           "scale_to_rho", "ResidualMeasurement"]


# ------------------------------------------------------------------ validation
def _as_query_matrix(queries: object, name: str = "queries") -> sp.csr_matrix:
    """A finite 2-D float CSR matrix (a copy when conversion is needed)."""
    if sp.issparse(queries):
        Q = sp.csr_matrix(queries, dtype=float)
    else:
        try:
            arr = np.asarray(queries, dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a 2-D numeric matrix: {exc}") from None
        if arr.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {arr.shape}")
        Q = sp.csr_matrix(arr)
    if not np.all(np.isfinite(Q.data)):
        raise ValueError(f"{name} must be finite (contains NaN or inf)")
    return Q


def _as_data(data: object, n: int, shape: tuple[int, int]) -> np.ndarray:
    """The data vector, flattened in C order; never writes to the caller's array."""
    try:
        x = np.asarray(data, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data must be a numeric array: {exc}") from None
    if x.size != n or x.ndim == 0:
        raise ValueError(f"data must have {n} entries (queries have shape {shape}), "
                         f"got shape {np.shape(data)}")
    x = x.reshape(-1)
    if not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise ValueError(f"data must be finite (NaN or inf at index {bad})")
    return x


def _column_norms(queries: object, p: int) -> np.ndarray:
    Q = _as_query_matrix(queries)
    if p == 1:
        return np.asarray(abs(Q).sum(axis=0)).ravel()
    return np.sqrt(np.asarray(Q.multiply(Q).sum(axis=0)).ravel())


# --------------------------------------------------------------- sensitivities
def l1_sensitivity(queries: np.ndarray | sp.spmatrix) -> float:
    """``max_j sum_i |Q_ij|``: the largest change of ``Q x`` in L1 norm when one
    cell of ``x`` changes by 1 (add/remove-one-record neighbours).  ``0`` for a
    matrix without columns."""
    norms = _column_norms(queries, 1)
    return float(norms.max()) if norms.size else 0.0


def l2_sensitivity(queries: np.ndarray | sp.spmatrix) -> float:
    """``max_j sqrt(sum_i Q_ij^2)``: the L2 analogue of :func:`l1_sensitivity`."""
    norms = _column_norms(queries, 2)
    return float(norms.max()) if norms.size else 0.0


def _sensitivity(given: object, queries: sp.csr_matrix, p: int) -> float:
    if given is not None:
        return _positive(given, "sensitivity")
    value = l1_sensitivity(queries) if p == 1 else l2_sensitivity(queries)
    if value <= 0:
        raise ValueError(f"queries have zero L{p} sensitivity (all entries are zero); "
                         "nothing to protect")
    return value


# ------------------------------------------------------------------ mechanisms
def laplace(queries: np.ndarray | sp.spmatrix, data: np.ndarray, epsilon: float,
            rng: int | np.random.Generator | None = None,
            sensitivity: float | None = None, *, sampler: str = "numpy") -> Measurement:
    """Laplace mechanism: ``y = Q x + e`` with ``e_i ~ Lap(b)`` i.i.d., ``b = Delta_1 / epsilon``.

    Density ``exp(-|e| / b) / (2 b)``, variance ``2 b^2``; ``epsilon``-DP for
    add/remove neighbours when ``Delta_1 >= l1_sensitivity(Q)`` (Dwork et al. 2006).
    The default sampler is for simulation only (module docstring); ``sampler="opendp"``
    releases.

    Parameters
    ----------
    queries : (m, n) dense or sparse query matrix ``Q``.
    data : the ``n`` cell counts ``x`` (a 1-D array, or a contingency table
        flattened in C order, the layout of :func:`cvxdp.workloads.marginal`).
    epsilon : privacy parameter, > 0.
    rng : ``None``, an int seed or a ``numpy.random.Generator``; the same seed
        gives the same answers (``sampler="numpy"`` only).
    sensitivity : L1 sensitivity to calibrate to (default ``l1_sensitivity(Q)``).
    sampler : ``"numpy"`` (floating point, seeded: simulation only) or ``"opendp"``
        (OpenDP's exact sampler, for a release; the discrete Laplace when ``Q x`` is integral).

    Returns
    -------
    Measurement with ``noise="laplace"`` and ``scale=b`` (with ``"opendp"``: the ``b`` its
    privacy map certifies for ``epsilon``, ``Delta_1 / epsilon`` up to rounding).
    """
    check_sampler("laplace", sampler, rng)
    Q = _as_query_matrix(queries)
    x = _as_data(data, Q.shape[1], Q.shape)
    eps = _positive(epsilon, "epsilon")
    delta_1 = _sensitivity(sensitivity, Q, 1)
    if sampler == "opendp":
        answers, b = opendp_samplers.laplace(Q @ x, delta_1, eps)
        return Measurement(Q, answers, noise="laplace", scale=b)
    b = delta_1 / eps
    answers = Q @ x + _as_rng(rng).laplace(0.0, b, size=Q.shape[0])
    return Measurement(Q, answers, noise="laplace", scale=b)


def gaussian(queries: np.ndarray | sp.spmatrix, data: np.ndarray, *,
             sigma: float | None = None, epsilon: float | None = None,
             delta: float | None = None, rho: float | None = None,
             rng: int | np.random.Generator | None = None,
             sensitivity: float | None = None, sampler: str = "numpy") -> Measurement:
    """Gaussian mechanism: ``y = Q x + e`` with ``e ~ N(0, sigma^2 I)``.

    Give exactly one of

    * ``sigma`` — the noise standard deviation itself;
    * ``rho`` — zCDP budget: ``sigma = Delta_2 / sqrt(2 rho)`` (Bun & Steinke 2016);
    * ``epsilon`` and ``delta`` — the smallest ``sigma`` that is exactly
      ``(epsilon, delta)``-DP (analytic Gaussian mechanism, Balle & Wang 2018,
      :func:`cvxdp.privacy.gaussian_sigma`).

    ``Delta_2`` is ``sensitivity`` (default ``l2_sensitivity(Q)``); it is not
    used, and must not be given, with ``sigma``.  Other parameters as in
    :func:`laplace`: ``sampler="numpy"`` is for simulation only, ``sampler="opendp"``
    (OpenDP's exact sampler; the discrete Gaussian when ``Q x`` is integral) for a release.

    Returns
    -------
    Measurement with ``noise="gaussian"`` and ``scale=sigma`` (with ``"opendp"`` and ``rho``
    or ``(epsilon, delta)``: the ``sigma`` OpenDP's privacy map certifies; for
    ``(epsilon, delta)`` its zCDP conversion asks a few per cent more than the analytic
    Gaussian, :mod:`cvxdp.modelling.opendp_samplers`).
    """
    check_sampler("gaussian", sampler, rng)
    Q = _as_query_matrix(queries)
    x = _as_data(data, Q.shape[1], Q.shape)
    s, budget = _gaussian_scale(Q, sigma, rho, epsilon, delta, sensitivity)
    if sampler == "opendp":
        d2 = _sensitivity(sensitivity, Q, 2) if budget else None
        answers, s = opendp_samplers.gaussian(Q @ x, d2, s, **budget)
        return Measurement(Q, answers, noise="gaussian", scale=s)
    answers = Q @ x + _as_rng(rng).normal(0.0, s, size=Q.shape[0])
    return Measurement(Q, answers, noise="gaussian", scale=s)


def _gaussian_scale(Q: sp.csr_matrix, sigma, rho, epsilon, delta,
                    sensitivity) -> tuple[float, dict]:
    """``(sigma, budget)``: the standard deviation :func:`gaussian`'s arguments ask for, and
    the budget it was calibrated to (``{}`` when ``sigma`` was given, ``{"rho": ...}`` or
    ``{"epsilon": ..., "delta": ...}``), which OpenDP's sampler calibrates to again."""
    given = [name for name, v in (("sigma", sigma), ("rho", rho), ("epsilon", epsilon),
                                  ("delta", delta)) if v is not None]
    if sigma is not None:
        if len(given) > 1:
            raise ValueError(f"give exactly one of sigma, rho, or (epsilon, delta); got {given}")
        if sensitivity is not None:
            raise ValueError("sensitivity has no effect when sigma is given; pass one or the other")
        return _positive(sigma, "sigma"), {}
    if rho is not None:
        if len(given) > 1:
            raise ValueError(f"give exactly one of sigma, rho, or (epsilon, delta); got {given}")
        r = _positive(rho, "rho")
        return float(_sensitivity(sensitivity, Q, 2) / np.sqrt(2.0 * r)), {"rho": r}
    if epsilon is not None and delta is not None:
        eps = _positive(epsilon, "epsilon")
        dlt = _probability(delta, "delta")
        return (float(gaussian_sigma(eps, dlt, _sensitivity(sensitivity, Q, 2))),
                {"epsilon": eps, "delta": dlt})
    if given:
        missing = "delta" if epsilon is not None else "epsilon"
        raise ValueError(f"epsilon and delta must be given together; {missing} is missing")
    raise ValueError("give exactly one of sigma, rho, or (epsilon, delta) to set the noise")
