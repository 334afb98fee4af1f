"""What every ADMM splitting offers the iteration loop of :mod:`cvxdp.solvers.consistency.admm`.

A splitting holds its iterates and exposes: ``init_iterates``, ``step``,
``residuals``/``adapt_rho`` (residual balancing), ``check`` (residuals, a certified
lower bound, feasible candidates), ``violation``, ``duals``/``loss_multiplier_guess``
(cvxpy's multipliers at a point), ``active_signature``/``polish`` (the active-set polish,
a :class:`~cvxdp.solvers.consistency.polish.PolishResult`), ``repair`` and ``export_state``.
This module holds the shared parts: rho heuristics and bounds, residual balancing,
and the KKT test of a candidate's multipliers.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .kkt import constraint_gradient, kkt_check, separable_loss_multiplier
from .polish import PolishResult
from .problem import ADMMSettings, ConsistencyData

__all__ = ["Candidate", "Splitting", "initial_rho", "weight_scale"]

# Initial rho for L1 terms, relative to (1/b)^2.
L1_RHO_FACTOR = 0.5
# rho is kept within [_RHO_MIN_FACTOR, _RHO_MAX_FACTOR] x its initial value: residual
# balancing on a degenerate iterate (a zero residual, a dual that vanished) would
# otherwise drive it to 1e-32 or to overflow, after which nothing moves.
_RHO_MIN_FACTOR = 1e-2
_RHO_MAX_FACTOR = 1e2
# Multipliers below this (relative) size are rounding noise in the dual bound.
DUAL_ZERO_RTOL = 1e-9


class Candidate(NamedTuple):
    """A point to return: its objective, cvxpy's multipliers (``None``: ask the
    splitting) and the loss multipliers ``w`` when known."""

    objective: float
    x: np.ndarray
    duals: dict | None = None
    w: np.ndarray | None = None


def weight_scale(w1: np.ndarray, w2: np.ndarray) -> float:
    """Typical size of the loss weights (the dual variables scale with it)."""
    vals = np.r_[w1[w1 > 0], np.sqrt(w2[w2 > 0])]
    return float(np.median(vals)) if vals.size else 1.0


def initial_rho(w1: np.ndarray, w2: np.ndarray) -> float:
    """rho has the units of a curvature; for |r|/b the natural one is 1/b^2, and half
    of it did best on hierarchies of 2^12 - 2^20 leaves (benchmarks/consistency.py)."""
    parts = []
    if np.any(w1 > 0):
        parts.append(L1_RHO_FACTOR * float(np.median(w1[w1 > 0])) ** 2)
    if np.any(w2 > 0):
        parts.append(float(np.median(w2[w2 > 0])))
    return max(parts) if parts else 1.0


class Splitting:
    """Base of the splittings: options, rho range and the shared helpers."""

    name = "base"
    infeasible_setup = False
    surely_feasible = False          # a point satisfying every constraint is known

    def __init__(self, data: ConsistencyData, settings: ADMMSettings) -> None:
        self.data = data
        self.s = settings

    @property
    def adaptive(self) -> bool:
        """Residual balancing is on unless switched off (or, for ``None``, unless the
        splitting knows better)."""
        return self.s.adaptive_rho is not False

    def balanced_rho(self, pri: float, dua: float) -> float | None:
        """Residual balancing (OSQP): rho * sqrt(pri / dua) for the normalized primal and
        dual residuals, or None while their ratio is within the tolerance."""
        if pri <= 0 or dua <= 0:
            return None
        ratio = math.sqrt(pri / dua)
        tol = self.s.adaptive_rho_tolerance
        if ratio > tol or ratio < 1.0 / tol:
            new = min(max(self.rho * ratio, self.rho_min), self.rho_max)
            return new if new != self.rho else None
        return None

    def set_rho_range(self) -> None:
        self.rho_min = _RHO_MIN_FACTOR * self.rho
        self.rho_max = _RHO_MAX_FACTOR * self.rho

    def repair(self, x):
        """An exactly feasible point near ``x``, or ``None``."""
        return None

    def loss_multiplier_guess(self):
        """The loss multipliers ``w`` at the current iterate, when the splitting has them."""
        return None

    def polish(self, thorough: bool = True) -> PolishResult:
        """An exact point on the iterate's active set (``thorough=False``: a scheduled try,
        which may skip what failed at the previous one)."""
        return PolishResult(reason="not available for this splitting")

    def unbelow(self, best: Candidate) -> Candidate:
        """A point whose objective is below the certified bound gains from its (allowed)
        violation; replace it by an exactly feasible repair when there is one."""
        xr = self.repair(best.x)
        if xr is not None and self.violation(xr) <= min(self.s.eps_abs, self.violation(best.x)):
            obj_r = self.data.objective(xr)
            if obj_r >= best.objective:
                return Candidate(obj_r, xr)
        return best

    def multipliers_of(self, cand: Candidate) -> tuple[dict, np.ndarray | None]:
        """``(duals, w)`` of a candidate: its own, else the splitting's at its point."""
        duals = self.duals(cand.x) if cand.duals is None else cand.duals
        w = cand.w if cand.w is not None else self.loss_multiplier_guess()
        return duals, w

    def duals_certify(self, cand: Candidate) -> bool:
        """Do the multipliers of ``cand`` (or those the splitting gives at its point)
        pass the KKT check?"""
        duals, w = self.multipliers_of(cand)
        if w is None and self.data.separable_loss() is not None:
            c = constraint_gradient(self.data, duals)
            w = None if c is None else separable_loss_multiplier(self.data, c)
        return bool(kkt_check(self.data, cand.x, duals, w, self.s.eps_abs, self.s.eps_rel)["ok"])
