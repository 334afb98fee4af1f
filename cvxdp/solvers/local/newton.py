"""Semismooth Newton on the dual of a squared loss that measures every cell of the local polytope.

When the loss is a sum of one-cell squared terms with positive curvature on *every* cell (the
Gaussian likelihood of noisy marginals of every clique, :mod:`cvxdp.solvers.local.loss`: ``f_i(x)
= A_i/2 (x - c_i)^2 + r_i`` with ``A_i > 0``) and there are no coupled rows, the problem

    minimize  sum_i f_i(t_i)   over   L(N) = {t >= 0, marg_R(t_k) = nu_R (R a region of clique k),
                                              sum(t_k) = N}

(module :mod:`cvxdp.solvers.local.region_graph`) has a smooth concave dual.  With multipliers
``lam_{R,j}`` on the region constraints of the ``j``-th member of region ``R`` (the free ``nu_R``
force ``sum_j lam_{R,j} = 0``) and ``tau_k`` on the clique totals, and ``s = M^T lam + tau`` per
cell (``M`` the stacked region marginalisers),

    g(lam, tau) = sum_i min_{x >= 0} [f_i(x) + s_i x]  -  N sum_k tau_k,
    x_i(lam, tau) = max(0, c_i - s_i / A_i),

a lower bound on the optimum at *every* point (weak duality; the inner minima are exact), and
``grad g = (P M x, totals(x) - N)`` with ``P`` the projection onto ``sum_j lam_{R,j} = 0``.  For
a free total the totals are only required to agree: ``sum_k tau_k = 0`` (projected too) and
no ``N`` term.  The gradient is piecewise linear, so ``g`` is semismooth with generalised Hessian

    -H = P M_act diag(1 / A_act) M_act^T P      (the cells with ``x_i > 0``),

and the semismooth Newton method (Qi & Sun 1993) converges locally quadratically; it is the
inner solver of SSNAL (Li, Sun & Toh, SIAM J. Optim. 2018) on a problem that needs no outer
augmented Lagrangian because the loss is already strongly convex.  Each step solves ``H d =
grad g`` inexactly by conjugate gradients with the Jacobi preconditioner ``diag(M_act D
M_act^T)`` (its entries are the active cells' curvature summed per dual row; the dual rows of a
clique total and of a one-attribute region differ by orders of magnitude, which plain CG
does not survive), with the forcing tolerance ``min(0.1, ||grad||^{1/2}) ||grad||`` (Eisenstat
& Walker), regularised (``H + mu diag(H)``, ``mu`` falling with the gradient: rows without an
active cell have no curvature) and damped after shortened steps (Levenberg-Marquardt), and
backtracks on ``g`` (Armijo).  ``H`` is applied through one sparse matrix over the
active cells only (about 3% of the cells on Adult's all three-way marginals), rebuilt once
per step.

Measured (Adult, ``benchmarks/local_polytope.py``): all 91 two-way marginals (148,137 cells)
reach a 1e-4 certified gap in 11 steps at noise 10 and 13 steps at noise 100; through
``prob.solve`` 0.4 s and 0.5 s with the duals (the ADMM: 100 and 200 iterations, 1.0 s and
5.6 s, without).  The three-way marginals of 9 attributes (156,078 cells) certify 1e-6 with
the duals in 16 steps / 3.0 s at noise 10 (the ADMM: 2.8 s, no duals) and 29 steps / 4.5-5.9 s
at noise 100 (the ADMM: 15-17 s).  All 364 three-way marginals (20.9 million cells, 3-8% of
them active) do not converge in 2 minutes: far from the solution the active set moves between
steps (40 steps, 226 s: lower bound 1.03228e7 against the optimum's 1.03233e7, the residual
still 1e1-1e3, the repaired point 37% above).  So the method is tried up to
:data:`MAX_CELLS` cells and hands over to the ADMM at once when a large dual has more than 2.5
rows per active cell, and later when its systems stay hard or its residual stalls (the
constants below).

Certificate.  The lower bound is ``g`` itself, less a rounding allowance.  The primal point
``x(lam)`` agrees on the regions only at the optimum, so the returned point is its exact
projection onto the consistent tables with total ``N`` made non-negative by
:func:`cvxdp.solvers.local.repair.mix`: a point of ``L(N)``, whose loss is the upper bound; as
the Newton steps drive the consistency residual to zero, the two meet.  Mixing spreads its
correction over every cell, so near the end ``x(lam)`` is first moved on its own face
(:func:`_face_repair`: the least change on the active cells that makes it consistent, one
conjugate-gradient solve with ``H`` unregularised), and only the cells that this leaves
negative are mixed away.  The per-cell multiplier
``M^T lam`` (orthogonal to every consistent direction, as ``sum_j lam_{R,j} = 0``) is handed to the
ADMM's certificate of the duals.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from .. import result as R
from .repair import mix
from .tau import tau_root

__all__ = ["eligible", "NewtonOutcome", "solve", "MAX_CELLS"]

# Armijo constant and the smallest backtracking step before giving up
_ARMIJO = 1e-4
_MIN_STEP = 1e-10
# conjugate-gradient steps per Newton step at most, and the forcing tolerance's cap
_CG_MAX = 100
_FORCING = 0.1
# once the gap is certified, _EXTRA_STEPS more steps (the duals are certified at the dual
# minimiser by a linearised bound, which needs it nearer the optimum than the gap alone: the
# face repair certifies the gap while the minimiser's residual is still 0.2 on Adult's
# two-way marginals)
_EXTRA_STEPS = 2
# relative tolerance of the face repair's conjugate gradients, and its regularisation (times
# the floored diagonal): ``H`` is singular (redundant regions, rows without an active cell),
# and a residual at rounding level has parts in its null space, along which unregularised
# conjugate gradients diverged (measured: multipliers of 1e18 and a move of 768 from a
# residual of 6e-10)
_FACE_TOL = 1e-6
_FACE_REG = 1e-10
# regularisation of the Newton system, mu = _REG min(1, ||grad||) times its diagonal, which is
# floored (in the regularisation and the preconditioner) at _DIAG_FLOOR times its median.  The
# floor damps the rows with few or no active cells: their curvature is near zero, so an
# undamped step moves their multipliers far and switches many cells on at once, and the line
# search then halves it.  Measured (Newton steps to a 1e-9 relative dual gap; floor 1e-6 -> 1):
# Adult's three-way marginals of 9 attributes 30 -> 12, two-way marginals 16 -> 9 (sigma 10)
# and 23 -> 12 (sigma 100); floors of 0.1 and 10 were slower on the three-way instance
_REG = 1e-2
_DIAG_FLOOR = 1.0
# ... raised (times _BOOST, at most _BOOST_MAX) after a shortened step and lowered after a full
# one (Levenberg-Marquardt): far from the solution the active set moves between steps
_BOOST = 4.0
_BOOST_MAX = 1e4
# relative rounding allowed for in the lower bound (sums of ~n terms of the loss's size)
_ROUND = 1e-13
# two dual values closer than this (relative) are equal to rounding: near the optimum the
# ascent of a step falls below it, and the step is accepted if it cuts the gradient instead
# (measured: on Adult's two-way marginals Armijo alone halved steps to 1e-7 with the residual
# stuck at 1e-5)
_FLAT = 1e-11
# Newton steps at most (it converges in tens; the ADMM takes over after these), and the
# hand-over when the consistency residual has not fallen below _STALL_RATIO of its least value
# for _STALL_STEPS steps (measured: on Adult's all three-way marginals, 20.9 million cells, it
# rose from 2.3e4 to 2.9e4 over 26 steps, 5 s each)
_MAX_STEPS = 100
_STALL_STEPS = 10
_STALL_RATIO = 0.5
# ... and when the conjugate gradients have averaged _HARD_CG of their cap over the last
# _HARD_STEPS steps: the active set is far from settling.  Set at stop 20 to 3 steps at 0.75
# (then the three-way marginals of 9 attributes, 156,078 cells, did not certify in 11 steps
# where the ADMM certified in 5 s); since the median floor they certify (sigma 10: 16 steps,
# 3.0 s; sigma 100: 29 steps, 4.5 s, where the ADMM takes 15-17 s), and the old rule handed
# sigma 100 over at its 25th step, so it is 5 steps at 0.9.  On all 14 attributes' three-way
# marginals (20.9 million cells, above MAX_CELLS) the steps take 10-60 CG steps and the
# residual stays at 1e1-1e3 for 40 steps
_HARD_STEPS = 5
_HARD_CG = 0.9
# ... or at once, when at the start the dual has more than this many rows per active cell
# (measured at the first step: two-way marginals 0.48 and 0.23, three-way marginals of 9
# attributes 0.82 (sigma 10) and 1.97 (sigma 100), where it certifies; of all 14 3.0, where
# it does not)
_ROWS_PER_ACTIVE = 2.5
# ... a rule for duals of at least this many rows (small problems' steps cost milliseconds, and
# there the totals and one-attribute regions make the ratio high however well it converges)
_RATIO_MIN_ROWS = 10_000
# largest problem (cells) it is tried on: Adult's 2-way marginals (148,137 cells) converge in
# 14-25 steps (0.6-1.1 s, against 1.0-5.6 s for the ADMM); the 3-way ones (20.9 million) do not
# get near in 2 minutes (see the module docstring)
MAX_CELLS = 4_000_000
# the point is repaired (projected and mixed) again once the consistency residual has fallen
# below this fraction of its value at the last repair
_REPAIR_RESIDUAL = 0.5
# ... and, once the residual is below _FACE_START times its first value and the mixed point
# does not certify, repaired on its own face first (:func:`_face_repair`, at most _CG_MAX
# conjugate-gradient steps).  Mixing spreads a correction over every cell, zero cells too, and
# the uniform tables it mixes with are small where cells are many: measured on Adult's
# three-way marginals of 9 attributes, at the same Newton step, the face repair's gap is 10-100
# times smaller (2.5e-6 against 2.7e-4 at a residual of 8e-3), and it certifies 1e-6 ten steps
# earlier
_FACE_START = 1e-3


def eligible(p) -> bool:
    """Whether the dual Newton applies: no coupled rows, squared one-cell rows only, and
    positive curvature on every cell (:class:`cvxdp.solvers.local.admm.LocalProblem`)."""
    c = p.cells
    return p.Q is None and bool(c.smooth) and bool(c.strict) and 0 < p.graph.n <= MAX_CELLS


@dataclass
class NewtonOutcome:
    """The best certified pair found: ``x`` a point of ``L(N)`` and its ``objective``, the
    ``lower`` bound, ``lam`` the per-cell multiplier ``M^T lam``, and bookkeeping."""

    x: np.ndarray
    objective: float
    lower: float
    lam: np.ndarray
    iterations: int
    cg_steps: int
    seconds: float
    converged: bool
    face: np.ndarray | None = None           # the dual's minimiser x(lam): its zeros are the face
    stopped: str | None = None               # the status ``stop`` returned, if it ended the run
    history: list[dict] = field(default_factory=list)
    z: np.ndarray | None = None              # the final dual vector (a warm start's)


class _Dual:
    """The dual vector's layout (per region: members x cells, then the clique totals) and
    the maps of the module docstring."""

    def __init__(self, p, A: np.ndarray | None = None) -> None:
        """``A``: the cells' curvature (default the loss's; :mod:`cvxdp.solvers.local.proximal`
        adds its proximal term)."""
        G = self.G = p.graph
        self.p, self.free = p, p.total is None
        self.sizes = [int(np.prod(r.shape)) for r in G.regions]
        counts = [r.members.size * s for r, s in zip(G.regions, self.sizes)]
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n_dual = int(self.base[-1]) + len(G.cliques)
        self.of_clique: list[list] = [[] for _ in G.cliques]
        for i, r in enumerate(G.regions):
            for j, k in enumerate(r.members.tolist()):
                axes = tuple(G.cliques[k].index(a) for a in r.attrs)
                self.of_clique[k].append((i, j, axes))
        self.A = p.cells.A if A is None else A
        self.c, self.r = p.cells.c, p.cells.r
        self.inv_A, self.half_A = 1.0 / self.A, 0.5 * self.A
        self.r_sum = float(self.r.sum())

    def project(self, z: np.ndarray) -> np.ndarray:
        """``P z``: each region's member multipliers less their mean (and the totals' for a
        free total)."""
        z = z.copy()
        for i, r in enumerate(self.G.regions):
            blk = z[self.base[i]:self.base[i + 1]].reshape(r.members.size, self.sizes[i])
            blk -= blk.mean(axis=0, keepdims=True)
        if self.free:
            z[self.base[-1]:] -= z[self.base[-1]:].mean()
        return z

    def cells_of(self, z: np.ndarray, with_tau: bool = True) -> np.ndarray:
        """``M^T lam (+ tau)`` per cell."""
        G = self.G
        s = np.repeat(z[self.base[-1]:], G.cells) if with_tau else np.zeros(G.n)
        lam = [z[self.base[i]:self.base[i + 1]].reshape((r.members.size,) + r.shape)
               for i, r in enumerate(G.regions)]
        G.add_region_arrays(s, lam)
        return s

    def rows_of(self, x: np.ndarray) -> np.ndarray:
        """``(M x, totals(x))`` as a dual-shaped vector."""
        G = self.G
        parts = [m.ravel() for m in G.region_marginals(x)] + [G.totals(x)]
        return np.concatenate(parts)

    def evaluate(self, z: np.ndarray):
        """``(g, x, grad)`` at ``z`` (``g`` less its rounding allowance)."""
        s = self.cells_of(z)
        # in place: a pass over the cells is most of a step's time on large tables
        x = np.multiply(s, self.inv_A)
        np.subtract(self.c, x, out=x)
        np.maximum(x, 0.0, out=x)
        d = np.subtract(x, self.c)
        np.multiply(d, d, out=d)
        d *= self.half_A                         # the centred form A/2 (x - c)^2 + r + s x
        quad, sx = float(d.sum()), float(s @ x)
        np.abs(s, out=d)
        N = 0.0 if self.free else float(self.p.total)
        tau = z[self.base[-1]:]
        g = quad + self.r_sum + sx - N * float(tau.sum()) + self.p.cells.K
        g -= _ROUND * (quad + self.r_sum + float(d @ x) + N * float(np.abs(tau).sum()))
        grad = self.rows_of(x)
        grad[self.base[-1]:] -= N
        return g, x, self.project(grad)

    def active(self, x: np.ndarray) -> np.ndarray:
        """The cells where ``x(lam)`` moves with the multiplier (``dx_i / ds_i = -1 / A_i``):
        for squared rows, the positive ones."""
        return x > 0

    def active_matrix(self, x: np.ndarray) -> sp.csr_matrix:
        """``M`` (with the totals' rows) restricted to the active cells of ``x``: rows dual,
        columns the active cells in order, each column scaled by ``1 / sqrt(A)``."""
        G = self.G
        act = self.active(x)
        rows, cols, vals, start = [], [], [], 0
        for k in range(len(G.cliques)):
            a, b = int(G.offsets[k]), int(G.offsets[k + 1])
            e = np.flatnonzero(act[a:b])
            if e.size == 0:
                continue
            multi = np.unravel_index(e, G.shapes[k])
            col = start + np.arange(e.size)
            scale = 1.0 / np.sqrt(self.A[a + e])
            for i, j, axes in self.of_clique[k]:
                cell = np.ravel_multi_index(tuple(multi[ax] for ax in axes), G.regions[i].shape)
                rows.append(self.base[i] + j * self.sizes[i] + cell)
                cols.append(col)
                vals.append(scale)
            rows.append(np.full(e.size, self.base[-1] + k))
            cols.append(col)
            vals.append(scale)
            start += e.size
        if not rows:
            return sp.csr_matrix((self.n_dual, 0))
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(self.n_dual, start))


def start_from(d: _Dual, z0: np.ndarray | None) -> np.ndarray:
    """A previous solve's dual vector if it has this problem's layout, else :func:`_start`."""
    if z0 is not None and z0.shape == (d.n_dual,) and np.all(np.isfinite(z0)):
        return d.project(z0)
    return _start(d)


def _start(d: _Dual) -> np.ndarray:
    """``lam = 0`` and each clique's ``tau`` making its own minimiser sum to ``N`` (or, free
    total, ``tau = 0``)."""
    z = np.zeros(d.n_dual)
    if d.free:
        return z
    N = float(d.p.total)
    # tau_root's multiplier enters the linear term with the opposite sign
    z[d.base[-1]:] = -tau_root(d.p, np.zeros(d.G.n), N, N)
    return z


def _cg(H, rhs: np.ndarray, prec: np.ndarray, d: _Dual, tol: float) -> tuple[np.ndarray, int]:
    """Preconditioned conjugate gradients for ``H x = rhs`` on the range of ``P``, at most
    ``_CG_MAX`` steps."""
    x = np.zeros_like(rhs)
    r = rhs.copy()
    s = d.project(prec * r)
    p = s.copy()
    rs = float(r @ s)
    if not rs > 0:                               # a zero right-hand side
        return x, 0
    for step in range(1, _CG_MAX + 1):
        Hp = H(p)
        pHp = float(p @ Hp)
        if not pHp > 0:
            return x, step
        a = rs / pHp
        x += a * p
        r -= a * Hp
        if float(np.linalg.norm(r)) <= tol:
            return x, step
        s = d.project(prec * r)
        rs_new = float(r @ s)
        if not rs_new > 0:                       # the residual left the range of P: done
            return x, step
        p = s + (rs_new / rs) * p
        rs = rs_new
    return x, _CG_MAX


def solve(p, *, eps_rel: float, max_iters: int, deadline: float, log=None,
          stop=None, z0: np.ndarray | None = None) -> NewtonOutcome:
    """Newton steps until the certified gap is at most ``eps_rel``, ``max_iters`` steps, the
    ``deadline`` (``time.perf_counter()``), a stall, or ``stop(row)`` returns a status; the best
    certified point.  ``log(row)`` receives each step's row (the ADMM table's columns); ``z0``
    is a previous solve's final multiplier (:attr:`NewtonOutcome.z`) to start from."""
    t0 = time.perf_counter()
    d = _Dual(p)
    z = start_from(d, z0)
    g, x, grad = d.evaluate(z)
    best, lower, lam_z = _Primal(), -math.inf, z
    cg_total, history, stopped = 0, [], None
    best_res, since, extra, boost = math.inf, 0, 0, 0.0
    recent_cg: list[int] = []
    it = 0
    for it in range(1, min(max_iters, _MAX_STEPS) + 1):
        lower, lam_z = _best_dual(g, z, lower, lam_z)
        res = float(np.abs(grad).max(initial=0.0))
        best.offer(p, d, x, grad, res, lower, eps_rel)
        row = {"iter": it, "objective": best.loss, "lower bnd": lower,
               "rel gap": R.relative_gap(best.loss, lower), "pri res": res, "dua res": math.nan,
               "rho": math.nan, "time [s]": time.perf_counter() - t0}
        history.append(row)
        if log is not None:
            log(row)
        if row["rel gap"] <= eps_rel:
            extra += 1                           # certified: a few more (quadratic) steps make
            if extra > _EXTRA_STEPS:             # the dual minimiser exact enough for its
                break                            # multipliers to certify too
        if time.perf_counter() >= deadline:
            break
        stopped = stop(row) if stop is not None else None
        if stopped == R.OPTIMAL and extra:       # the caller's rule sees the gap: those steps
            stopped = None                       # are still to come
        if stopped is not None:
            break
        out = _step(d, z, g, x, grad, boost, first=it == 1)
        if out is None:                          # too many constraints for the active cells
            break
        new, step, steps = out
        cg_total += steps
        recent_cg.append(steps)
        if len(recent_cg) >= _HARD_STEPS and \
                sum(recent_cg[-_HARD_STEPS:]) >= _HARD_CG * _CG_MAX * _HARD_STEPS:
            break                                # hard systems step after step: hand over
        if new[1] < g:                           # no ascent (rounding at the optimum): done
            break
        # Levenberg-Marquardt: a shortened step raises the damping, a full one lowers it
        boost = damping(boost, step)
        z, g, x, grad = new
        since = 0 if res < best_res * _STALL_RATIO else since + 1
        best_res = min(best_res, res) if since else res
        if since >= _STALL_STEPS:                # the residual does not fall: hand over
            break
    lower, lam_z = _best_dual(g, z, lower, lam_z)
    f, pt = best.loss, best.point
    return NewtonOutcome(x=pt, objective=f, lower=lower, lam=d.cells_of(lam_z, with_tau=False),
                         iterations=it, cg_steps=cg_total, seconds=time.perf_counter() - t0,
                         converged=R.relative_gap(f, lower) <= eps_rel, face=x, stopped=stopped,
                         history=history, z=z)


def _best_dual(g: float, z: np.ndarray, lower: float, lam_z: np.ndarray):
    """``(lower bound, multiplier)``: the bound is the largest dual value, the multiplier the
    latest one within rounding of it, so that it pairs with the latest dual minimiser (the
    duals are certified with both; near the optimum the values differ only by rounding)."""
    if g >= lower - _FLAT * max(1.0, abs(g)):
        lam_z = z
    return max(g, lower), lam_z


class _Primal:
    """The best point of ``L(N)`` found, from the dual minimisers ``x(lam)``: each is repaired
    (projected onto the consistent tables, mixed into the orthant) once the consistency
    residual has halved since the last repair -- a repair of a far-off ``x`` costs two passes
    and certifies nothing -- and, near the end, first moved on its own face
    (:func:`_face_repair`)."""

    def __init__(self) -> None:
        self.loss, self.point = math.inf, None
        self.first = self.mixed = self.faced = math.inf      # residuals: first, last repairs

    def offer(self, p, d: "_Dual", x: np.ndarray, grad: np.ndarray, res: float, lower: float,
              eps_rel: float, *, always: bool = False) -> None:
        """``always``: repair whatever the residual (the proximal steps' points improve while
        each step's residual stays at rounding)."""
        if self.point is None:
            self.first = res
        if always:
            self.mixed = self.faced = math.inf
        if res < _REPAIR_RESIDUAL * self.mixed:
            self.mixed = res
            self._keep(p, x)
        if R.relative_gap(self.loss, lower) > eps_rel and res <= _FACE_START * self.first \
                and res < _REPAIR_RESIDUAL * self.faced:
            self.faced = res
            self._keep(p, _face_repair(d, x, grad))

    def _keep(self, p, x: np.ndarray) -> None:
        G = p.graph
        pt = mix(G, G.project(x, p.total), p.total)
        f = p.loss.value(pt)
        if f < self.loss:
            self.loss, self.point = f, pt


def _face_repair(d: _Dual, x: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``x`` moved on its face ``{t: t_i = 0 where x_i = 0}`` to the consistent tables nearest
    in the loss's metric: ``x - D M_a^T y`` with ``H y = grad`` (``grad``, the gradient at
    ``x``, is its consistency residual; ``H = P M_a D M_a^T P``, ``D = diag(1 / A)``, all but
    unregularised), solved by conjugate gradients, then clipped at zero (cells leaving the
    face)."""
    Ma = d.active_matrix(x)
    if Ma.shape[1] == 0:
        return x
    MaT = Ma.T.tocsr()
    diag = _floored_diagonal(Ma)
    reg = _FACE_REG * diag
    y, _ = _cg(lambda v: d.project(Ma @ (MaT @ v) + reg * v), grad, 1.0 / (diag + reg), d,
               _FACE_TOL * float(np.linalg.norm(grad)))
    e = np.flatnonzero(d.active(x))          # the columns of Ma, in order
    out = x.copy()
    out[e] -= (MaT @ y) / np.sqrt(d.A[e])
    return np.maximum(out, 0.0, out=out)


def damping(boost: float, step: float) -> float:
    """Levenberg-Marquardt: a full step lowers the damping ``boost``, a shortened one raises
    it (to at least ``_REG``, at most ``_BOOST_MAX``)."""
    return boost / _BOOST if step == 1.0 else min(max(boost * _BOOST, _REG), _BOOST_MAX)


def _floored_diagonal(Ma: sp.csr_matrix) -> np.ndarray:
    """The diagonal of ``Ma Ma^T`` (the Newton system's, unprojected), floored at
    ``_DIAG_FLOOR`` times its median over the rows with an active cell."""
    diag = np.asarray(Ma.multiply(Ma).sum(axis=1)).ravel()
    typical = float(np.median(diag[diag > 0])) if np.any(diag > 0) else 1.0
    return np.maximum(diag, _DIAG_FLOOR * max(typical, 1e-300))


def _step(d: _Dual, z, g: float, x, grad, boost: float, *, first: bool = False):
    """One damped Newton step: ``((z, g, x, grad) at the new point, step length, CG steps)``,
    or ``None`` on the ``first`` step when the dual (of at least ``_RATIO_MIN_ROWS`` rows) has
    more than ``_ROWS_PER_ACTIVE`` rows per active cell (``H`` then has a large null space and the active set is far from settled).
    The system is regularised, ``H + mu diag(H)``: rows whose cells are all inactive have no
    curvature; ``mu`` falls with the gradient (the steps stay superlinear) unless the damping
    ``boost`` is up."""
    Ma = d.active_matrix(x)
    if first and Ma.shape[0] >= _RATIO_MIN_ROWS and Ma.shape[0] > _ROWS_PER_ACTIVE * Ma.shape[1]:
        return None
    MaT = Ma.T.tocsr()
    gn = float(np.linalg.norm(grad))
    diag = _floored_diagonal(Ma)
    mu = max(boost, _REG * min(1.0, gn))
    direction, steps = _cg(lambda v: d.project(Ma @ (MaT @ v) + mu * diag * v), grad,
                           1.0 / ((1.0 + mu) * diag), d, min(_FORCING, math.sqrt(gn)) * gn)
    slope, step = float(grad @ direction), 1.0
    while True:
        z_new = d.project(z + step * direction)    # in the range of P to rounding: a free
        # total's bound needs sum(tau) = 0, which a long step's rounding breaks
        g_new, x_new, grad_new = d.evaluate(z_new)
        flat = g_new >= g - _FLAT * max(1.0, abs(g)) and \
            float(np.linalg.norm(grad_new)) <= (1.0 - _ARMIJO * step) * gn
        if g_new >= g + _ARMIJO * step * slope or flat or step < _MIN_STEP:
            return (z_new, g_new, x_new, grad_new), step, steps
        step *= 0.5
