"""The general splitting: any ``M`` (e.g. the matrix mechanism ``min |A x - r|_1,
x >= 0``, Lee et al. Algorithm 4).

Residual split ``r = M x - y`` plus one consensus copy ``x_j = x`` per constraint set
(the bounds, the affine set ``A x = b``, the order cone); the x-update solves with
``M^T M + k I`` (``k`` the number of copies) factorized once.  With
``equality_split="penalty"`` (Algorithm 1) ``A x - b`` is one more residual held at zero.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .._linalg import dot as _dot, norm as _norm
from .polish import GeneralPoint, PolishResult, polish_general
from .problem import ADMMSettings, ADMMState, ConsistencyData
from .splitting import DUAL_ZERO_RTOL, Splitting, initial_rho
from .affine import make_projector
from .losses import SeparableLoss

__all__ = ["GeneralADMM"]

# The general splitting starts from a rho scaled to diag(M^T M); residual balancing
# there trades primal for dual progress and stalls the certificate when it strays far
# (600 variables, 200 random 0/1 rows, elastic net: 1e-3 x the scaled rho never
# certified in 10000 iterations; the scaled rho itself does in 381), so it gets a
# narrower range.
_GENERAL_RHO_RANGE = 3.0
# Dense Cholesky factors (Woodbury on m x m, or n x n) up to this size.
_DENSE_FACTOR_MAX = 3000
# A point of the affine set counts as on it within this (relative) residual.
_PARTICULAR_RTOL = 1e-12
# A multiplier that must vanish (outside the conjugate's domain) may be this large
# (relative) and still count as zero.
_DOMAIN_RTOL = 1e-9


class GeneralADMM(Splitting):
    """Residual split ``r = M x - y`` plus consensus copies ``x_j = x`` for the
    bounds, the affine set and the order cone; x-update with ``M^T M + k I``."""

    name = "general"

    def __init__(self, data: ConsistencyData, settings: ADMMSettings) -> None:
        super().__init__(data, settings)
        self.n = n = data.n
        self.penalty = data.has_eq and settings.equality_split == "penalty"
        self._loss_rows(data)
        self.box = SeparableLoss(np.zeros(n), np.zeros(n), np.zeros(n), data.lower, data.upper)
        self.proj = None
        self.chains = data.chains if data.has_chains else None
        self.blocks: list[tuple[str, Callable]] = []
        if self.box.has_bounds:
            self.blocks.append(("bounds", self.box.clip))
        if data.has_eq and not self.penalty:
            self.proj = make_projector(data.A, data.b, data.forest_hint,
                                       found=data.forest_rows() if data.forest_hint is None else None)
            self.infeasible_setup = not self.proj.feasible
            self.blocks.append(("eq", self.proj.project))
        if self.chains is not None:
            self.blocks.append(("order", self.chains.project))
        if not self.blocks:
            self.blocks.append(("free", lambda v: v))
        self.block_names = [nm for nm, _ in self.blocks]
        self.surely_feasible = not self.penalty and self._feasible_point_known()
        self._factor(len(self.blocks))
        # the consensus blocks live in x-space, where the loss's curvature per unit weight
        # is diag(M^T M): scale rho by its mean (1 for a node-wise M)
        col_sq = float(data.M.multiply(data.M).sum()) / max(n, 1)
        self.rho = settings.rho or initial_rho(data.w1, data.w2) * max(col_sq, 1e-12)
        self.rho_min = self.rho / _GENERAL_RHO_RANGE
        self.rho_max = self.rho * _GENERAL_RHO_RANGE
        self.name = "general/penalty" if self.penalty else "general"

    def _loss_rows(self, data: ConsistencyData) -> None:
        """The residual block: the loss rows, and with the penalty split ``A x - b``
        as more rows held at zero by their prox (the indicator of {0})."""
        M, y = data.M.tocsr(), data.y
        w1, w2 = data.w1, data.w2
        lo_r, hi_r = np.full(M.shape[0], -np.inf), np.full(M.shape[0], np.inf)
        self.m_loss = M.shape[0]
        if self.penalty:
            p = data.A.shape[0]
            M = sp.vstack([M, data.A]).tocsr()
            y = np.concatenate([y, data.b])
            w1, w2 = np.r_[w1, np.zeros(p)], np.r_[w2, np.zeros(p)]
            lo_r, hi_r = np.r_[lo_r, np.zeros(p)], np.r_[hi_r, np.zeros(p)]
        self.M, self.MT, self.y_ext = M, M.T.tocsr(), y
        self.m = M.shape[0]
        self.loss = SeparableLoss(np.zeros(self.m), w1, w2, lo_r, hi_r)
        self._free_rows = np.isinf(lo_r) & (w2 == 0)      # their dual must lie in [-w1, w1]

    def _feasible_point_known(self) -> bool:
        """A point of the affine set (or the origin) satisfying everything proves feasibility."""
        n = self.n
        pt = self.proj.particular if self.proj is not None else (
            self.box.clip(np.zeros(n)) if self.chains is None else np.zeros(n))
        return bool(self.box.bound_violation(pt) == 0.0
                    and (self.chains is None or self.chains.violation(pt) == 0.0)
                    and (self.proj is None or float(np.max(np.abs(self.proj.residual(pt)), initial=0.0))
                         <= _PARTICULAR_RTOL * (1 + _norm(pt))))

    def _factor(self, k: int) -> None:
        """Cache a factorization of ``G = M^T M + k I`` (never dense for large n)."""
        n, m = self.n, self.m
        if m < n and m <= _DENSE_FACTOR_MAX:
            # Woodbury: G^{-1} = (I - M^T (k I + M M^T)^{-1} M) / k, with a dense m x m factor
            S = (self.M @ self.MT).toarray()
            S[np.diag_indices_from(S)] += k
            c = la.cho_factor(S, lower=True, check_finite=False)
            self._solveG = lambda r: (r - self.MT @ la.cho_solve(c, self.M @ r, check_finite=False)) / k
        elif n <= _DENSE_FACTOR_MAX:
            G = (self.MT @ self.M).toarray()
            G[np.diag_indices_from(G)] += k
            c = la.cho_factor(G, lower=True, check_finite=False)
            self._solveG = lambda r: la.cho_solve(c, r, check_finite=False)
        else:
            G = (self.MT @ self.M + k * sp.identity(n, format="csr")).tocsc()
            self._solveG = spla.splu(G).solve

    def init_iterates(self, x0, state) -> None:
        n, m, k = self.n, self.m, len(self.blocks)
        if state is not None and state.shape == self.name and state.z.size == n:
            self.x = state.z.copy()
            self.rho = min(max(state.rho, self.rho_min), self.rho_max) if not self.s.rho else self.rho
            self.r = state.extra["r"].copy()
            self.mu = state.extra["mu"].copy()
            self.xs = [v.copy() for v in state.extra["xs"]]
            self.us = [v.copy() for v in state.extra["us"]]
            if len(self.xs) != k:
                state = None
        if state is None or state.shape != self.name:
            # least squares start: (M^T M + k I) x = M^T y
            x = self._solveG(self.MT @ self.y_ext) if x0 is None else np.asarray(x0, float).copy()
            self.x = x
            self.r = self.M @ x - self.y_ext
            self.mu = np.zeros(m)
            self.xs = [fn(x) for _, fn in self.blocks]
            self.us = [np.zeros(n) for _ in self.blocks]
        self.r_prev = self.r
        self.xs_prev = self.xs

    def step(self) -> None:
        a = self.s.alpha
        y = self.y_ext
        rhs = self.MT @ (y + self.r - self.mu)
        for xj, uj in zip(self.xs, self.us):
            rhs += xj - uj
        self.x = self._solveG(rhs)
        mx = self.M @ self.x - y
        mxr = a * mx + (1 - a) * self.r
        self.r_prev = self.r
        self.r = self.loss.prox(mxr + self.mu, self.rho)
        self.mu += mxr - self.r
        self.xs_prev = self.xs
        new_xs = []
        for (name, fn), xj, uj in zip(self.blocks, self.xs, self.us):
            xr = a * self.x + (1 - a) * xj
            xn = fn(xr + uj)
            uj += xr - xn
            new_xs.append(xn)
        self.xs = new_xs

    def current_x(self) -> np.ndarray:
        return self.x

    def _residuals(self):
        mx = self.M @ self.x - self.y_ext
        rp = _norm(mx - self.r) ** 2
        for xj in self.xs:
            rp += _norm(self.x - xj) ** 2
        rd_vec = self.MT @ (self.r - self.r_prev)
        for xj, xjp in zip(self.xs, self.xs_prev):
            rd_vec = rd_vec + (xj - xjp)
        return math.sqrt(rp), float(self.rho * _norm(rd_vec))

    def residuals(self) -> dict:
        r_prim, r_dual = self._residuals()
        return {"r_prim": r_prim, "r_dual": r_dual}

    def _dual_scale(self) -> float:
        return self.rho * (_norm(self.MT @ self.mu) + sum(_norm(u) for u in self.us))

    def adapt_rho(self, chk) -> None:
        scale_p = max(_norm(self.x), _norm(self.r), 1e-300)
        scale_d = max(self._dual_scale(), 1e-300)
        new = self.balanced_rho(chk["r_prim"] / scale_p, chk["r_dual"] / scale_d)
        if new is not None:
            f = self.rho / new
            self.mu *= f
            for u in self.us:
                u *= f
            self.rho = new

    def violation(self, x) -> float:
        v = self.box.bound_violation(x)
        if self.proj is not None:
            v = max(v, float(np.max(np.abs(self.proj.residual(x)), initial=0.0)))
        elif self.penalty:
            v = max(v, float(np.max(np.abs(self.data.A @ x - self.data.b), initial=0.0)))
        if self.chains is not None:
            v = max(v, self.chains.violation(x))
        return v

    def _block_multipliers(self, mu: np.ndarray):
        """``lam_j = rho u_j`` moved into each conjugate's domain, the absorbing block
        (bounds, or the single block) set so that ``M^T mu + sum_j lam_j = 0``; ``None``
        when no block can absorb."""
        names = self.block_names
        lams = [self.rho * u for u in self.us]
        for j, nm in enumerate(names):
            if nm == "eq":
                lams[j] = lams[j] - self.proj.project_nullspace(lams[j])
            elif nm == "order":
                lams[j] = lams[j] - self.chains.project(lams[j])
        absorb = names.index("bounds") if "bounds" in names else (0 if len(names) == 1 else None)
        if absorb is None:
            return None
        lams[absorb] = -(self.MT @ mu) - sum(l for j, l in enumerate(lams) if j != absorb)
        return lams, absorb

    def _dual_value(self) -> float:
        """``D = -phi*(mu') - mu'^T y - sum_j g_j^*(lam_j)`` with stationarity
        ``M^T mu' + sum_j lam_j = 0`` enforced by the absorbing block; ``-inf`` when a
        block's multiplier leaves its conjugate's domain."""
        mu = self.rho * self.mu
        w1 = self.loss.w1
        mu = np.where(self._free_rows, np.clip(mu, -w1, w1), mu)
        blocks = self._block_multipliers(mu)
        if blocks is None:
            return -math.inf
        lams, absorb = blocks
        total = -self.loss.conjugate_sum(mu) - _dot(mu, self.y_ext)
        for j, nm in enumerate(self.block_names):
            support = self._support(nm, lams[j], j == absorb, mu)
            if not math.isfinite(support):
                return -math.inf
            total -= support
        return total + self.data.constant

    def _support(self, nm: str, lam: np.ndarray, absorbing: bool, mu: np.ndarray) -> float:
        """The support function ``g_j^*(lam)`` of block ``nm`` (``inf`` off its domain)."""
        d = self.data
        if nm == "bounds":
            # multipliers at rounding level on an unbounded side count as zero
            tiny = DUAL_ZERO_RTOL * max(1.0, float(np.max(np.abs(lam), initial=0.0)))
            lam = np.where(np.abs(lam) <= tiny, 0.0, lam)
            with np.errstate(invalid="ignore"):
                sup = np.where(lam > 0, lam * d.upper, np.where(lam < 0, lam * d.lower, 0.0))
            return float(sup.sum()) if np.all(np.isfinite(sup)) else math.inf
        if nm == "eq":
            if absorbing:
                resid = lam - (lam - self.proj.project_nullspace(lam))
                if _norm(resid) > _DOMAIN_RTOL * (1 + _norm(lam)):
                    return math.inf
            return _dot(lam, self.proj.particular)
        if nm == "order":
            if absorbing and _norm(self.chains.project(lam)) > _DOMAIN_RTOL * (1 + _norm(lam)):
                return math.inf
            return 0.0
        # "free": only the zero multiplier
        return math.inf if _norm(lam) > _DOMAIN_RTOL * (1 + _norm(mu)) else 0.0

    def check(self) -> dict:
        r_prim, r_dual = self._residuals()
        lower = self._dual_value()
        tol = self.s.eps_abs
        # candidates: each block's copy satisfies its own set exactly
        feasible_x, pobj = None, math.inf
        for c in [self.x] + list(self.xs):
            if self.violation(c) <= tol:
                val = self.data.objective(c)
                if val < pobj:
                    feasible_x, pobj = c, val
        dim = self.n * len(self.blocks) + self.m
        scale_p = max(_norm(self.x), _norm(self.r))
        eps_p = tol * math.sqrt(dim) + self.s.eps_rel * scale_p
        eps_d = tol * math.sqrt(self.n) + self.s.eps_rel * self._dual_scale()
        cand = self.xs[-1] if self.blocks[-1][0] != "free" else self.x
        return {"r_prim": r_prim, "r_dual": r_dual, "lower": lower, "feasible_x": feasible_x,
                "primal_obj": pobj if feasible_x is not None else self.data.objective(self.x),
                "x_candidate": cand, "x_candidate_ok": self.violation(cand) <= max(tol, eps_p),
                "residuals_converged": r_prim <= eps_p and r_dual <= eps_d and not math.isfinite(lower)}

    def duals(self, x: np.ndarray) -> dict:
        out = {}
        if self.penalty:
            out["eq"] = self.rho * self.mu[self.m_loss:]
        for (nm, _), u in zip(self.blocks, self.us):
            lam = self.rho * u
            if nm == "eq":
                lam = lam - self.proj.project_nullspace(lam)
                out["eq"] = self.proj.multipliers(lam)
            elif nm == "order":
                lam = lam - self.chains.project(lam)
                out["order"] = [np.maximum(o, 0.0) for o in self.chains.multipliers(lam)]
            elif nm == "bounds":
                out["lower"] = np.maximum(-lam, 0.0) * (x <= self.data.lower + self.s.eps_abs)
                out["upper"] = np.maximum(lam, 0.0) * (x >= self.data.upper - self.s.eps_abs)
        if "bounds" not in self.block_names:
            out["lower"] = np.zeros(self.n)
            out["upper"] = np.zeros(self.n)
        return out

    def loss_multiplier_guess(self):
        mu = self.rho * self.mu[:self.m_loss]
        w1 = self.data.w1
        free = self._free_rows[:self.m_loss]
        return np.where(free, np.clip(mu, -w1, w1), mu)

    def _bounds_copy(self) -> np.ndarray | None:
        if "bounds" not in self.block_names:
            return None
        return self.xs[self.block_names.index("bounds")]

    def active_signature(self):
        """Zero residuals of the prox and bound hits of the bounds block."""
        xb = self._bounds_copy()
        if xb is None or self.chains is not None:
            return None
        d = self.data
        return np.r_[((d.w1 > 0) & (self.r[:self.m_loss] == 0)).astype(np.int8),
                     (xb <= d.lower).astype(np.int8) + 2 * (xb >= d.upper).astype(np.int8)]

    def polish(self, thorough: bool = True) -> PolishResult:
        if self.chains is not None:
            return PolishResult(reason="not available with order chains")
        xb = self._bounds_copy()
        return polish_general(GeneralPoint(self.data, x=self.x, r=self.r[:self.m_loss],
                                           x_bounds=self.x if xb is None else xb,
                                           rho=self.rho, eps_abs=self.s.eps_abs))

    def export_state(self) -> ADMMState:
        return ADMMState(self.name, self.rho, self.x.copy(), np.zeros(0),
                         extra={"r": self.r.copy(), "mu": self.mu.copy(),
                                "xs": [v.copy() for v in self.xs], "us": [v.copy() for v in self.us]})
