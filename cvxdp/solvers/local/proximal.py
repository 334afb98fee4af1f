"""Proximal point steps solved by the dual semismooth Newton method: absolute (L1) rows on the
local polytope.

For a loss of one-cell rows in which some cells carry an absolute row (the Laplace likelihood
of noisy marginals, :mod:`cvxdp.solvers.local.loss`: ``f_i(x) = w_i |x - b_i| + A_i/2 (x -
c_i)^2 + r_i``, ``w_i > 0`` or ``A_i > 0`` on every cell) and no coupled rows, the problem

    minimize  L(t) = sum_i f_i(t_i)   over   L(N)

is piecewise linear where ``A = 0``: its dual is not smooth and the Newton method of
:mod:`cvxdp.solvers.local.newton` does not apply to it directly.  The proximal point method
(Rockafellar, SIAM J. Control Optim. 1976) solves instead

    t^{k+1} = argmin_{t in L(N)}  L(t) + ||t - t^k||^2 / (2 sigma),

each a strictly convex one-cell loss (curvature ``A_i + 1 / sigma``): its dual is concave and
piecewise quadratic, the inner minimiser is a soft threshold at ``b_i`` clipped at zero, and
the generalised Hessian is ``P M_a D M_a^T P`` over the cells on a sloped piece (neither at
zero nor at ``b_i``).  The dual multiplier is carried from one step to the next (the
subproblems change little) and a few Newton steps per proximal step suffice (SSNAL, Li, Sun &
Toh, SIAM J. Optim. 2018, is the same method seen from the dual: an augmented Lagrangian with
semismooth Newton inner solves).  The method converges for any ``sigma`` bounded away from
zero (the proximal point method on a polyhedral problem converges linearly, and finitely in the
limit); ``sigma`` starts at a few squared noise scales, where the steps' duals stay smooth
enough for Newton, and grows while the steps are solved in a Newton step or two.

Measured on Adult's 91 two-way marginals with Laplace noise of scale 10 (148,137 cells, known
total): certified below 1e-6 (with the duals) in 5.0 s on arrays and 5.1-6.5 s through
``prob.solve``, where the ADMM needs 1,900 iterations (35 s) for 1e-4.

Certificate, for ``L`` itself: the per-cell multiplier ``M^T lam`` of any step is orthogonal to
the consistent directions, so the ADMM's bound (:func:`cvxdp.solvers.local.admm.lower_bound`:
each clique minimised over ``[0, N]``, the total multiplier by a root search; for a free total
over ``N`` up to a proven bound from the point's loss) is a lower bound;
the step's point repaired into ``L(N)`` (:class:`cvxdp.solvers.local.newton._Primal`) is the
upper one.  Only the bound is passed in (``bound(lam) -> float``), so the numerical layer
keeps one copy of it.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from .. import result as R
from .newton import eligible as _plain_eligible
from .newton import (_EXTRA_STEPS, _FLAT, MAX_CELLS, NewtonOutcome, _Dual, _Primal, _step,
                           damping, start_from)

__all__ = ["eligible", "solve"]

# the first proximal weight: sigma = this over w^2 (w the median absolute-row weight: 1 / w is
# the Laplace scale, so the soft thresholds are a few noise scales wide).  Measured on Adult's
# two-way marginals, Laplace scale 10 (certified 1e-4, held fixed): sigma w^2 = 3 in 5.8 s, 10
# in 7.4 s, 30 in over 16 s; doubling it at every step stalled at 5e-4, where the step's
# problem is nearly the linear program and its dual Newton no longer converges.  So it grows
# only while the steps are easy (below): on a 30-cell instance held fixed it moved the loss by
# 2e-5 per step with the bound stuck (0.5 s, then the ADMM), growing it certified in 0.09 s
_SIGMA = 3.0
# Newton steps per proximal step at most, and the inner stop: the consistency residual below
# this fraction of its value at the step's start
_INNER_STEPS = 30
# the weight is multiplied by _GROW after a step solved in at most _EASY Newton steps, up to
# _SIGMA_MAX times its start, and divided by it after a step that used them all.  The cap was
# 1e4: at extreme scales (answers of 7e7 under weights of 10, a total of 1e7) the steps stayed
# easy at the cap and moved the loss by 9e4 a step out of 4e7; the ADMM after them stalled 5 %
# above the optimum for 10,000 iterations (stress seed 19, local_scales #11), where with 1e6
# the steps reach the optimum (optimal with duals, 234 steps).  Adult's two-way marginals with
# Laplace noise never reach the cap (167 iterations under either)
_EASY = 2
_GROW = 2.0
_SIGMA_MAX = 1e6
_INNER_FALL = 1e-2
# ... or at rounding: the step's problem is solved
_SOLVED = 1e-13
# proximal steps at most, and the hand-over to the ADMM when _STALL_STEPS steps running improve
# neither bound (relatively, by _STALL_GAIN): at counts of 1e7 measured to 1 the bound's
# digits run out (each step's problem solved to rounding, the gap stuck at 3.5e-3; the ADMM
# alone fails there too)
_OUTER_STEPS = 60
_STALL_STEPS = 3
_STALL_GAIN = 1e-12
# best points offered to the caller's ``finish`` at most (each costs it one factorisation;
# measured at extreme scales: the second or third offer certified, where the steps went on
# for 150 more Newton steps, 1.5 s, without closing the gap)
_FINISH_TRIES = 6
#: ``NewtonOutcome.stopped`` when the caller's ``finish`` certified an answer
FINISHED = "finished"


def eligible(p) -> bool:
    """No coupled rows, some cell under a row, at most
    :data:`cvxdp.solvers.local.newton.MAX_CELLS` cells (as for the Newton method it runs), and
    not the plain dual Newton's case: an absolute row somewhere, or a cell without curvature
    (a zero weight, a clique left unmeasured).  The proximal term gives every cell the
    curvature ``1 / sigma``, a cell under no row too (its step minimiser is ``max(0, t - sigma
    s)``); measured on the stress set's squared losses with zero-weight cells, the ADMM
    certified the gap there but its multipliers -- the gradient at a point off by ``1e-5`` --
    missed ``eps_rel`` in 26 of 100 instances."""
    c = p.cells
    return (p.Q is None and bool(np.any((c.A > 0) | (c.w > 0))) and not _plain_eligible(p)
            and 0 < p.graph.n <= MAX_CELLS)


class _ProxDual(_Dual):
    """The dual of one proximal step: the loss ``f_i(x) + (x - t_i)^2 / (2 sigma)`` (curvature
    ``A + 1/sigma``), its minimiser a soft threshold at ``b`` clipped at zero."""

    def __init__(self, p, t: np.ndarray, sigma: float) -> None:
        c = p.cells
        super().__init__(p, c.A + 1.0 / sigma)
        self.t, self.sigma = t, sigma
        self.k0 = c.C + t / sigma                # the linear term of the quadratic part
        self.w_over_A = c.w * self.inv_A

    def minimiser(self, s: np.ndarray) -> np.ndarray:
        """``max(0, b + soft(v - b, w / A))`` with ``v = (k0 - s) / A``: the soft threshold at
        ``b`` clipped at zero (in place: the general ``CellLoss.argmin`` is a third of a
        step's time on large tables)."""
        c = self.p.cells
        x = np.subtract(self.k0, s)
        x *= self.inv_A
        x -= c.b                                 # v - b
        shrink = np.abs(x)
        shrink -= self.w_over_A
        np.maximum(shrink, 0.0, out=shrink)
        np.copysign(shrink, x, out=x)
        x += c.b
        return np.maximum(x, 0.0, out=x)

    def active(self, x: np.ndarray) -> np.ndarray:
        c = self.p.cells
        return (x > 0) & ((c.w == 0) | (x != c.b))

    def evaluate(self, z: np.ndarray):
        """``(g, x, grad)``: the step's dual value (a bound for the step's problem only, used
        by the line search), its minimiser and the projected gradient."""
        s = self.cells_of(z)
        x = self.minimiser(s)
        d = x - self.t
        inner = self.p.cells.cell_values(x) + (0.5 / self.sigma) * d * d + s * x
        N = 0.0 if self.free else float(self.p.total)
        tau = z[self.base[-1]:]
        g = float(inner.sum()) - N * float(tau.sum()) + self.p.cells.K
        grad = self.rows_of(x)
        grad[self.base[-1]:] -= N
        return g, x, self.project(grad)


def solve(p, *, bound: Callable[[np.ndarray, np.ndarray, float], float], eps_rel: float,
          max_iters: int, deadline: float, log=None, stop=None, z0: np.ndarray | None = None,
          point0: np.ndarray | None = None,
          finish: Callable[[np.ndarray], bool] | None = None) -> NewtonOutcome:
    """Proximal steps until the certified gap is at most ``eps_rel``, ``max_iters`` Newton
    steps in all, the ``deadline``, or ``stop(row)`` returns a status; ``bound(lam, point,
    loss)`` is the lower bound of ``L`` at a per-cell multiplier orthogonal to the consistent
    directions (a point of ``L(N)`` and its loss: for a free total, a proven bound on it).
    ``z0`` and ``point0``: a previous solve's final multiplier and point (its ``z`` and
    ``face``), to start from.  ``finish(point)``, if given, is offered the best point when a
    step left the gap above ``eps_rel`` and improved neither the point nor the bound by more
    than ``eps_rel`` (each point once, :data:`_FINISH_TRIES` points at most): its
    ``True`` (the caller certified an answer from it) ends the steps, ``stopped`` set to
    :data:`FINISHED`."""
    t0 = time.perf_counter()
    G, c = p.graph, p.cells
    if point0 is not None and point0.shape == (G.n,) and np.all(np.isfinite(point0)):
        t = np.maximum(point0, 0.0)
    else:                                        # each cell's own minimiser, made consistent
        t = np.maximum(G.project(c.argmin(c.A, c.C.copy(), math.inf), p.total), 0.0)
    # the scale of the cells' sums, for the inner stop at rounding
    N = float(p.total) if p.total is not None else max(float(G.totals(t).mean()), 1.0)
    sigma = sigma0 = _first_sigma(c)
    best, lower, lam_best = _Primal(), -math.inf, None
    z, history, stopped, steps, cg_total, extra = None, [], None, 0, 0, 0
    x = face = t
    stall, before = 0, (math.inf, -math.inf)
    tried, offered = 0, None
    for outer in range(1, _OUTER_STEPS + 1):
        d = _ProxDual(p, t, sigma)
        if z is None:
            z = start_from(d, z0)
        z, x, grad, res, inner, cg = _newton_steps(d, z, _SOLVED * N, max_iters - steps)
        steps, cg_total = steps + inner, cg_total + cg
        # with the clique totals' multipliers: constant per clique, so as orthogonal to the
        # consistent directions, and the duals' subgradient at cells on b is chosen from it
        lam = d.cells_of(z)
        best.offer(p, d, x, grad, res, lower, eps_rel, always=True)
        lb = bound(lam, best.point, best.loss)
        if lb >= lower - _FLAT * max(1.0, abs(lb)):
            lam_best = lam                       # the latest near the best: it pairs with x
        lower = max(lower, lb)
        face = x
        row = {"iter": steps, "objective": best.loss, "lower bnd": lower,
               "rel gap": R.relative_gap(best.loss, lower), "pri res": res, "dua res": math.nan,
               "rho": 1.0 / sigma, "time [s]": time.perf_counter() - t0}
        history.append(row)
        if log is not None:
            log(row)
        if row["rel gap"] <= eps_rel:
            extra += 1                           # as in local_newton: for the duals
            if extra > _EXTRA_STEPS:
                break
        if steps >= max_iters or time.perf_counter() >= deadline:
            break
        gain = max(before[0] - best.loss, lower - before[1])
        if finish is not None and tried < _FINISH_TRIES and best.point is not offered and \
                row["rel gap"] > eps_rel and not gain > eps_rel * max(1.0, abs(best.loss)):
            tried, offered = tried + 1, best.point
            if finish(best.point):
                stopped = FINISHED
                break
        stall = stall + 1 if not gain > _STALL_GAIN * max(1.0, abs(best.loss)) else 0
        before = (best.loss, lower)
        if stall >= _STALL_STEPS:
            break
        stopped = stop(row) if stop is not None else None
        if stopped == R.OPTIMAL and extra:
            stopped = None
        if stopped is not None:
            break
        t = x
        # the weight grows while the steps' problems are easy (solved in at most _EASY Newton
        # steps: the proximal term holds the iterate back) and shrinks when they are hard
        if inner <= _EASY:
            sigma = min(sigma * _GROW, _SIGMA_MAX * sigma0)
        elif inner >= _INNER_STEPS:
            sigma = max(sigma / _GROW, sigma0)
    f = best.loss
    return NewtonOutcome(x=best.point, objective=f, lower=lower,
                         lam=lam_best if lam_best is not None else np.zeros(G.n),
                         iterations=steps, cg_steps=cg_total, seconds=time.perf_counter() - t0,
                         converged=R.relative_gap(f, lower) <= eps_rel, face=face,
                         stopped=stopped, history=history, z=z)


def _first_sigma(c) -> float:
    """:data:`_SIGMA` over the median absolute-row weight squared, or without absolute rows
    over the median curvature (``A = 1 / noise^2`` plays the part of ``w^2``)."""
    if np.any(c.w > 0):
        return _SIGMA / float(np.median(c.w[c.w > 0])) ** 2
    return _SIGMA / float(np.median(c.A[c.A > 0]))


def _newton_steps(d: _ProxDual, z: np.ndarray, floor: float, budget: int):
    """Newton steps on one proximal step's dual until its consistency residual falls below
    ``_INNER_FALL`` times its start or ``floor`` (rounding), at most ``_INNER_STEPS`` or
    ``budget``: ``(z, x, grad, residual, steps, CG steps)``."""
    g, x, grad = d.evaluate(z)
    res0 = res = float(np.abs(grad).max(initial=0.0))
    boost, steps, cg_total = 0.0, 0, 0
    while steps < min(_INNER_STEPS, budget) and res > max(_INNER_FALL * res0, floor):
        out = _step(d, z, g, x, grad, boost)
        if out is None:
            break
        (z, g, x, grad), step, cg = out
        steps, cg_total = steps + 1, cg_total + cg
        boost = damping(boost, step)
        res = float(np.abs(grad).max(initial=0.0))
    return z, x, grad, res, steps, cg_total

