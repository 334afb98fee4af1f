"""Measuring a marginal workload with a residual design: ``cvxdp.mechanisms.residual_gaussian``.

The design ``s`` (one variance per residual of ``W``; :mod:`.marginal_workload`) defines the
Gaussian mechanism that releases every residual query ``R_A x`` with noise ``N(0, s_A (x)
Sub Sub^T)``.  Its privacy cost ``sum_A p_A / s_A`` is its squared L2 sensitivity, so it is
``rho``-zCDP with ``rho = cost / 2`` and ``(epsilon, delta)``-DP as :mod:`cvxdp.privacy`
converts (:meth:`ResidualMeasurement.epsilon`).  :func:`scale_to_rho` rescales a design to a
given ``rho`` (the variances scale by ``cost / (2 rho)``; the targets met scale alike).

**Samplers.**  ``sampler="numpy"`` (the default) draws the noise with numpy's floating-point
Gaussian sampler: right in distribution, and what simulations and benchmarks need, but **for
simulation only** -- floating-point samplers leak through the low bits of their output
(Mironov, CCS 2012).  ``sampler="opendp"`` draws it with OpenDP's vetted Gaussian mechanism
(``pip install 'cvxdp[mbi]'`` brings ``opendp``), which samples exactly; use it for a release
(:mod:`cvxdp.modelling.opendp_samplers`; :func:`cvxdp.mechanisms.laplace` and
:func:`~cvxdp.mechanisms.gaussian` offer the same choice).
Either way only the residual answers are kept: the noisy marginal the noise is added to
(:mod:`cvxdp.solvers.residual.measure`) is discarded.  The accounting is the real-valued
mechanism's; the answers are floating-point differences of the exactly sampled noisy
marginal, and that post-processing can reveal no more than the noisy marginal itself, whose
zCDP is ``1 / (2 s_A)`` per residual (:meth:`ResidualMeasurement.rho_marginal_bound`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..solvers.residual.measure import marginal_counts, residual_answers, sub_pinv
from .marginal_workload import MarginalWorkload
from .opendp_samplers import SAMPLERS, import_opendp
from .privacy import zcdp_to_dp
from .randomness import as_rng

__all__ = ["ResidualMeasurement", "residual_gaussian", "scale_to_rho", "SAMPLERS"]



class ResidualMeasurement:
    """The residual answers of a marginal workload and the noise that was added.

    Attributes
    ----------
    workload : the :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload`.
    variances : ``s``, one per residual (a copy of the design).
    answers : ``answers[j]``: ``y_A`` of residual ``j`` (``W.residuals[j]``), shaped
        ``(n_i - 1 for i in A)`` (the total: a 0-d array).
    sampler : the sampler that drew the noise (``"numpy"``: simulation only).
    """

    def __init__(self, workload: MarginalWorkload, variances: np.ndarray, answers: list,
                 sampler: str) -> None:
        self.workload = workload
        self.variances = np.array(variances, dtype=float)
        self.answers = answers
        self.sampler = sampler
        self._components: list[np.ndarray] | None = None

    @property
    def components(self) -> list[np.ndarray]:
        """The answers in each residual's own coordinates, ``z_A = (x) Sub^+ y_A`` (shaped by
        ``A``'s sizes, centred along every axis; the total as it is), computed once: the
        unbiased reconstruction and the likelihood both read them."""
        if self._components is None:
            W, sizes = self.workload, self.workload.domain.sizes
            self._components = [
                sub_pinv(np.asarray(y, dtype=float), [sizes[a] for a in W.basis.residual(j)])
                if W.basis.residual_size[j] else np.asarray(y, dtype=float)
                for j, y in enumerate(self.answers)]
        return self._components

    @property
    def privacy_cost(self) -> float:
        """``sum_A p_A / s_A``: the squared L2 sensitivity of the mechanism."""
        p = self.workload.basis.p
        on = p > 0
        return float(np.sum(p[on] / self.variances[on]))

    @property
    def rho(self) -> float:
        """The zCDP ``rho = privacy_cost / 2`` (Bun & Steinke, TCC 2016)."""
        return self.privacy_cost / 2.0

    def epsilon(self, delta: float) -> float:
        """The ``epsilon`` of ``(epsilon, delta)``-DP from ``rho``-zCDP (Prop. 1.3)."""
        return zcdp_to_dp(self.rho, delta)

    @property
    def rho_marginal_bound(self) -> float:
        """``sum_A 1 / (2 s_A)``: the zCDP of the noisy marginals the answers are computed
        from (a bound for their floating-point post-processing; module docstring)."""
        on = self.workload.basis.p > 0
        return float(np.sum(0.5 / self.variances[on]))

    def __repr__(self) -> str:
        return (f"ResidualMeasurement({self.workload!r}, rho={self.rho:.6g}, "
                f"sampler={self.sampler!r})")


def scale_to_rho(W: MarginalWorkload, s, rho: float) -> np.ndarray:
    """The design ``s`` scaled to zCDP ``rho``: ``s * cost(s) / (2 rho)`` (cost is ``1/s``
    homogeneous, so the result costs exactly ``2 rho``; every variance, and so every target
    the design met, scales by the same factor)."""
    s = _design(W, s)
    if not (isinstance(rho, (int, float, np.floating)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"scale_to_rho: rho must be a positive number, got {rho!r}")
    on = W.basis.p > 0
    cost = float(np.sum(W.basis.p[on] / s[on]))
    return s * (cost / (2.0 * float(rho)))


def residual_gaussian(W: MarginalWorkload, s, records, rng: Any = None, *,
                      sampler: str = "numpy") -> ResidualMeasurement:
    """Release the residual answers of ``W`` for ``records`` with the design ``s``.

    Parameters
    ----------
    W : the :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload`.
    s : the residual variances (an array, or the solved ``cp.Variable``), positive where the
        residual has queries.
    records : integer codes, one row per record and one column per attribute of
        ``W.domain`` (in its order), or a pandas DataFrame with the attributes as columns.
    rng : ``None``, a seed or a ``numpy.random.Generator`` (``sampler="numpy"`` only).
    sampler : ``"numpy"`` (simulation only) or ``"opendp"`` (exact; module docstring).
    """
    s = _design(W, s)
    if sampler not in SAMPLERS:
        raise ValueError(f"residual_gaussian: sampler must be one of {SAMPLERS}, got {sampler!r}")
    gaussian = _opendp_gaussian() if sampler == "opendp" else _numpy_gaussian(as_rng(rng))
    tables = _residual_tables(W, records)
    answers = residual_answers(tables, s, gaussian)
    return ResidualMeasurement(W, s, answers, sampler)


def _design(W: MarginalWorkload, s) -> np.ndarray:
    if not isinstance(W, MarginalWorkload):
        raise TypeError(f"W must be a MarginalWorkload, got {type(W).__name__}")
    s = np.array(getattr(s, "value", s) if not isinstance(s, np.ndarray) else s, dtype=float)
    if s.shape != (W.n_residuals,):
        raise ValueError(f"s must hold one variance per residual ({W.n_residuals},), got "
                         f"shape {s.shape}")
    bad = np.flatnonzero(~np.isfinite(s) | ((W.basis.p > 0) & (s <= 0)))
    if bad.size:
        raise ValueError(f"s: the variance of residual {W.residuals[bad[0]]} is {s[bad[0]]!r}; "
                         f"it must be positive and finite")
    return s


def _residual_tables(W: MarginalWorkload, records) -> list[np.ndarray]:
    """The marginal on every residual, each clique's counted once from the records and summed
    down to its subsets."""
    dom = W.domain
    codes = dom._codes(records, dom.names)
    sizes = np.asarray(dom.sizes)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    home = W.basis.home
    out = []
    for j in range(W.n_residuals):
        A = W.basis.residual(j)
        C = W.basis.cliques[home[j]]
        key = tuple(sorted(C))
        if key not in cache:
            cache[key] = marginal_counts(codes[:, list(key)], sizes[list(key)])
        drop = tuple(k for k, a in enumerate(key) if a not in A)
        out.append(cache[key].sum(axis=drop) if drop else cache[key])
    return out


def _numpy_gaussian(rng: np.random.Generator):
    def draw(table: np.ndarray, var: float) -> np.ndarray:
        return table + rng.normal(0.0, math.sqrt(var), size=np.shape(table))
    return draw


def _opendp_gaussian():
    dp = import_opendp("residual_gaussian")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)

    def draw(table: np.ndarray, var: float) -> np.ndarray:
        mech = space >> dp.m.then_gaussian(scale=math.sqrt(var))
        flat = np.asarray(table, dtype=float).ravel()
        return np.asarray(mech(flat.tolist()), dtype=float).reshape(np.shape(table))
    return draw
