"""The separable splitting ``min f(x) + I_C(z)  s.t.  x = z``.

Used when ``M`` has at most one entry per row and per column (e.g. the noisy nodes of a
hierarchy measured directly): the loss and the bounds form one separable function
``f`` whose prox is the (elastic-net) soft threshold of Lee et al. eqs. 13-14 followed
by a clip; the constraint set ``C`` (tree consistency, general ``A x = b``, or an order
cone) is handled by its projection: the tree two-pass projection of Hay et al.
(Algorithm 3's HTREE), a cached factorization for general ``A`` (Algorithms 1-2), or
pool-adjacent-violators for order constraints.  Two-block ADMM
``x = prox_f(z - u)``, ``z = P_C(x + u)``, written in Douglas-Rachford form on
``w = z + u``.
"""
from __future__ import annotations

import math

import numpy as np

from .._linalg import norm as _norm
from .certify import separating_hyperplane
from .chain_polish import polish_chain_point
from .duals import (exact_separable_multipliers, separable_dual_value, separable_multipliers,
                    subdifferential_box)
from .kkt import constraint_gradient, kkt_check, lagrangian_bound, separable_loss_multiplier
from .polish import PolishResult, SeparablePoint, polish_separable
from .problem import ADMMSettings, ADMMState, ConsistencyData
from .splitting import L1_RHO_FACTOR, Splitting, initial_rho, weight_scale
from .affine import ForestProjector, make_projector
from .losses import SeparableLoss

__all__ = ["SeparableADMM"]

# The fixed rho for pure L1 on a forest, relative to (1/b)^2.
_L1_FOREST_RHO = 2.0


class SeparableADMM(Splitting):
    """``min f(x) + I_C(z)  s.t. x = z`` with separable ``f`` (loss + bounds)."""

    def __init__(self, data: ConsistencyData, f: SeparableLoss, settings: ADMMSettings) -> None:
        super().__init__(data, settings)
        self.f = f
        self.n = data.n
        # f keeps the rows of M with an entry; the others' loss is a constant
        self.constant = data.constant + data.empty_rows_constant()
        self.proj = None
        self.chains = data.chains if data.has_chains else None
        self.last_dual_point = None        # the last coordinate-wise repaired dual point
        # the polish's candidates that won / failed last time (polish.polish_separable)
        self.polish_first, self.polish_later = None, ()
        if data.has_eq:
            self.proj = make_projector(data.A, data.b, data.forest_hint,
                                       found=data.forest_rows() if data.forest_hint is None else None)
            self.infeasible_setup = not self.proj.feasible
            self.name = "separable/tree" if isinstance(self.proj, ForestProjector) else "separable/affine"
        else:
            self.name = "separable/order" if self.chains is not None else "separable/none"
        # Pure L1 on a forest: the certified gap (with the node-wise dual repair) converges
        # fastest at a fixed rho = 2/b^2; residual balancing drives rho down by 3-5x there
        # and needs 3-5x the iterations (hierarchies of 2^10 - 2^20 leaves, eps 0.1 and 1).
        self._l1_forest = isinstance(self.proj, ForestProjector) and not np.any(f.w2)
        default_rho = initial_rho(f.w1, f.w2)
        if self._l1_forest:
            default_rho *= _L1_FOREST_RHO / L1_RHO_FACTOR
        self.rho = settings.rho or default_rho
        self.set_rho_range()
        self.surely_feasible = self._feasible_point_known()

    def _feasible_point_known(self) -> bool:
        """A point of ``C`` inside the bounds proves feasibility: then no infeasibility test."""
        f, proj = self.f, self.proj
        if proj is None and self.chains is not None and f.has_bounds:
            pt = f.clip(self.chains.project(f.clip(np.zeros(self.n))))
            return f.bound_violation(pt) == 0.0 and self.chains.violation(pt) == 0.0
        if proj is None or not f.has_bounds or f.bound_violation(proj.particular) == 0.0:
            return True
        if not isinstance(proj, ForestProjector):
            return False
        pt = proj.feasible_from(f.clip(proj.particular))
        return f.bound_violation(pt) == 0.0 and float(np.max(np.abs(proj.residual(pt)), initial=0.0)) == 0.0

    # projection onto C ----------------------------------------------------
    def P(self, v: np.ndarray) -> np.ndarray:
        if self.proj is not None:
            return self.proj.project(v)
        if self.chains is not None:
            return self.chains.project(v)
        return v

    def init_iterates(self, x0, state) -> None:
        f = self.f
        if state is not None and state.shape == self.name and state.z.size == self.n:
            # Keep this problem's rho (the data, e.g. a noise-scale Parameter, may have
            # changed); carry the multipliers lam = rho u over, rescaled by how much the
            # loss weights changed, since the dual scales with them.
            z = state.z.copy() if x0 is None else self.P(np.asarray(x0, float))
            ws = weight_scale(f.w1, f.w2)
            u = state.u * (state.rho * (ws / state.extra.get("weight_scale", ws)) / self.rho)
        else:
            start = f.clip(np.where(f.w1 + f.w2 > 0, f.y, 0.0)) if x0 is None else np.asarray(x0, float)
            z = self.P(start)
            u = np.zeros(self.n)
        # Douglas-Rachford form of the same iteration: w = z + u is the projection's input.
        self.w = z + u
        self.z = self.z_prev = z
        self.w_used = self.w
        self.x = f.prox(z - u, self.rho)

    @property
    def u(self) -> np.ndarray:
        """The scaled dual matching the current ``(x, z)``: ``u = w - P(w)``."""
        return self.w_used - self.z

    def step(self) -> None:
        """``z = P(w)``, ``x = prox_f(2z - w)``, ``w += alpha (x - z)``: ADMM with
        over-relaxation ``alpha`` written on ``w = z + u`` (fewer passes over memory)."""
        self.z_prev = self.z
        z = self.P(self.w)
        t = np.subtract(z, self.w)
        t += z
        x = self.f.prox(t, self.rho, out_of_place=False)
        d = x - z
        d *= self.s.alpha
        self.w_used = self.w
        self.w = self.w + d
        self.x, self.z = x, z

    def current_x(self) -> np.ndarray:
        return self.z

    @property
    def adaptive(self) -> bool:
        if self.s.adaptive_rho is None:
            return not self._l1_forest
        return bool(self.s.adaptive_rho)

    def residuals(self) -> dict:
        return {"r_prim": float(_norm(self.x - self.z)),
                "r_dual": float(self.rho * _norm(self.z - self.z_prev))}

    def adapt_rho(self, chk) -> None:
        """Residual balancing (OSQP): scale rho by sqrt of the normalized residual ratio."""
        xn = max(_norm(self.x), _norm(self.z), 1e-300)
        un = max(self.rho * _norm(self.u), 1e-300)
        new = self.balanced_rho(chk["r_prim"] / xn, chk["r_dual"] / un)
        if new is not None:
            # rescale the scaled dual u = w - z: w = z + u * rho / rho_new
            self.w = self.z + (self.w - self.z) * (self.rho / new)
            self.w_used = self.w
            self.x = self.f.prox(self.z - (self.w - self.z), new)
            self.rho = new

    def violation(self, x) -> float:
        v = self.f.bound_violation(x)
        if self.proj is not None:
            v = max(v, float(np.max(np.abs(self.proj.residual(x)), initial=0.0)))
        if self.chains is not None:
            v = max(v, self.chains.violation(x))
        return v

    def dual_value(self, lam: np.ndarray) -> float:
        """``D(lam) = -f*(-lam) - sigma_C(lam)`` after the repair of
        :func:`cvxdp.solvers.consistency.duals.separable_dual_value`; a coordinate-wise repaired
        point is kept for the polish's active-set identification."""
        val, repaired = separable_dual_value(self.f, self.proj, self.chains, lam, self.constant)
        if repaired is not None:
            self.last_dual_point = repaired
        return val

    def _candidates(self):
        """Feasible candidates ``(point, needs the full check)``: ``z`` is in ``C`` by
        construction (only its bounds need checking); with a forest, the clipped leaves
        of ``x`` summed up are consistent too; with chains, the clipped ``z``."""
        cands = [(self.z, False)]
        if isinstance(self.proj, ForestProjector):
            cands.append((self.proj.feasible_from(self.f.clip(self.x)), False))
        if self.chains is not None and self.f.has_bounds:
            cands.append((self.f.clip(self.z), True))
        return cands

    def check(self) -> dict:
        f, tol = self.f, self.s.eps_abs
        r_prim = float(_norm(self.x - self.z))
        r_dual = float(self.rho * _norm(self.z - self.z_prev))
        lower = self.dual_value(self.rho * self.u)
        feasible_x, pobj, z_ok = None, math.inf, None
        for c, full in self._candidates():
            viol = self.violation(c) if full else f.bound_violation(c)
            if c is self.z:
                z_ok = viol <= tol
            if viol <= tol:
                val = f.value(c) + self.constant
                if val < pobj:
                    feasible_x, pobj = c, val
        out = {"r_prim": r_prim, "r_dual": r_dual, "lower": lower, "feasible_x": feasible_x,
               "primal_obj": pobj if feasible_x is not None else f.value(self.z) + self.constant,
               "x_candidate": self.z, "x_candidate_ok": bool(z_ok)}
        xn = max(_norm(self.x), _norm(self.z))
        eps_p = tol * math.sqrt(self.n) + self.s.eps_rel * xn
        eps_d = tol * math.sqrt(self.n) + self.s.eps_rel * self.rho * _norm(self.u)
        out["residuals_converged"] = r_prim <= eps_p and r_dual <= eps_d and not math.isfinite(lower)
        if r_prim > eps_p and self.proj is not None and f.has_bounds and not self.surely_feasible:
            # z - x separates the box from the affine set when the two do not meet
            cert = separating_hyperplane(self.z - self.x, f.lower, f.upper, self.proj, _norm(self.x))
            if cert is not None:
                out["infeasible"] = True
                out["certificate"] = cert
        return out

    def duals(self, x: np.ndarray) -> dict:
        """Multipliers from the ADMM dual ``lam = rho u`` (``lam in N_C``, ``-lam in df``),
        made exact for ``x`` on forests and chains."""
        return exact_separable_multipliers(self.f, self.proj, self.chains, x, self.rho * self.u,
                                           self.s.eps_abs)

    def repair(self, x):
        """An exactly consistent point near ``x``: the clipped leaves summed up (forests)."""
        if not isinstance(self.proj, ForestProjector):
            if self.proj is None and self.chains is None:
                return self.f.clip(x)
            return None
        return self.proj.feasible_from(self.f.clip(x))

    def export_state(self) -> ADMMState:
        return ADMMState(self.name, self.rho, self.z.copy(), self.u.copy(),
                         extra={"weight_scale": weight_scale(self.f.w1, self.f.w2)})

    # polish ---------------------------------------------------------------
    def active_signature(self):
        """Status code per coordinate of the prox output: 0 free, 1 zero residual,
        2 on the lower bound, 3 on the upper bound."""
        if self.proj is None:
            return None
        f, x = self.f, self.x
        sig = ((f.w1 > 0) & (x == f.y)).astype(np.int8)
        sig[x <= f.lower] = 2
        sig[x >= f.upper] = 3
        return sig

    def polish(self, thorough: bool = True) -> PolishResult:
        if self.proj is None and self.chains is not None:
            return self._polish_chains()
        if self.proj is None:
            return PolishResult(reason="not available without equality constraints or order chains")
        pol = polish_separable(SeparablePoint(
            f=self.f, proj=self.proj, x=self.x, lam=self.rho * self.u, lam_dual=self.last_dual_point,
            rho=self.rho, constant=self.constant, eps_abs=self.s.eps_abs, eps_rel=self.s.eps_rel,
            first=self.polish_first, later=() if thorough else self.polish_later,
            scheduled=not thorough))
        if pol.ok:
            self.polish_first = pol.variant
        self.polish_later = pol.failed
        return pol

    def _polish_chains(self) -> PolishResult:
        """Order chains: the exact optimum pooled from the blocks of ``z`` and its
        multipliers (:mod:`cvxdp.solvers.consistency.chain_polish`), kept when they pass the
        KKT check; their Lagrangian bound certifies the point."""
        f, data, s = self.f, self.data, self.s
        found = polish_chain_point(f, self.chains, self.z, self.rho * self.u,
                                   lambda pt: subdifferential_box(f, pt, 0.0))
        if found is None:
            return PolishResult(reason="no order multipliers at the pooled point", rounds=1)
        x, lam = found
        duals = separable_multipliers(f, None, self.chains, x, lam, 0.0)
        c = constraint_gradient(data, duals)
        w = separable_loss_multiplier(data, c)
        chk = kkt_check(data, x, duals, w, s.eps_abs, s.eps_rel)
        if not chk["ok"]:
            return PolishResult(reason="the pooled point's multipliers fail the KKT check", rounds=1)
        duals, w = chk.get("duals", duals), chk.get("w", w)
        return PolishResult(x=x, objective=f.value(x) + self.constant, duals=duals,
                            lower_bound=lagrangian_bound(data, duals, w), reason="ok", rounds=1, w=w)

