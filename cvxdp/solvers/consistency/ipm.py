"""A primal-dual interior-point method for the consistency problem with any loss matrix.

The problem of :mod:`~cvxdp.solvers.consistency.problem` with squared or elastic-net rows is
the convex QP, in the variables ``x`` and per loss row ``i`` its private columns,

* ``w1_i > 0``: ``p_i, q_i >= 0`` with ``M_i x - p_i + q_i = y_i``, objective
  ``w1_i (p_i + q_i) + (w2_i / 2) (p_i - q_i)^2``;
* ``w1_i = 0 < w2_i``: ``v_i`` free with ``M_i x - v_i = y_i``, objective ``(w2_i / 2) v_i^2``;

per order edge a slack ``g_e >= 0`` with ``D_e x + g_e = 0``; ``A x = b`` and
``lower <= x <= upper``.  Mehrotra's predictor-corrector (Nocedal & Wright 2006, alg. 16.4,
with two-sided bounds) solves it.  Every Newton system is reduced to the variables ``x``: a
row's private columns enter only its own row, so eliminating them leaves the row with the
scalar curvature

    phi_i = w2_i + d_p d_q / (d_p + d_q)       (d = s / t, the columns' barrier curvatures)

(``w2_i`` for a squared row, ``d_g`` for an order edge), and the step solves

    [ -(H_x + M^T Phi M + D^T Phi_D D)   A^T ] [dx]   [..]
    [               A                     0  ] [dy] = [..]

with ``H_x`` the bounds' barrier curvature: QDLDL (AMD ordering, one symbolic analysis) on
this quasi-definite system up to ``_QDLDL_MAX`` unknowns, then LAPACK's dense Cholesky of the
``n x n`` block and of ``A``'s Schur complement up to ``_DENSE_MAX`` variables (random 0/1
rows fill a sparse factor to ~40 % anyway), SuperLU beyond; refined against the
unregularised system.  (On a loaded 2-core machine OpenBLAS's threads made a 600 x 600 Cholesky take 0.2 s
against 0.016 s with one thread; ``OPENBLAS_NUM_THREADS=1`` helps there.)
The loss-row multipliers ``y_R`` are the loss multipliers
``w = -y_R`` of :mod:`~cvxdp.solvers.consistency.kkt`, the equality ones ``-y_A``, the bound
ones the dual slacks; the caller certifies them, after the exact solution on the active set
the iterate points at (:mod:`~cvxdp.solvers.consistency.active_set_qp`).  The Newton
matrices' values go into patterns found once (:mod:`~cvxdp.solvers.consistency.newton_assembly`).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable

import numpy as np

from .._blas import threads
from .._ldl import PatternLDL
from scipy.linalg import blas, lapack
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .dense_kkt import DenseKKT
from .newton_assembly import NewtonAssembly
from .kkt import has_chains, has_eq, order_matrix, split_order

__all__ = ["solve_qp", "IPMResult"]

_LOG = logging.getLogger("cvxdp")

_MAX_ITERS = 100
# the objective's scale is taken again at the starting point when the loss there is below this
# fraction of the loss at the origin (and lowered by at most this factor)
_RESCALE = 1e-3
# stop at this relative accuracy (residuals, gap) of the scaled problem
_TOL = 1e-10
# ... or earlier, when the caller's polish and certificate accept the first iterate at one
# of these accuracies (each tried once; the exact polish needs only the active set, not the
# last digits: at 1e-8 two of 16 iterations saved at n = 3,000, at 1e-5 two of 9 at n = 100,
# a fifth of the time there, measured; a refused attempt costs one polish)
_EARLY_TOLS = (1e-5, 1e-8)
# ... or the best iterate within _LOOSE_TOL once no progress is made for _STALL iterations
_LOOSE_TOL = 1e-8
_STALL = 5
# ... and give up after this many iterations without a new best (the constraints may have
# no solution: the caller asks HiGHS)
_NO_PROGRESS = 10
_STEP = 0.995
_SAME_STEP = True
# regularisation of the reduced system (relative to its diagonal) tried in turn
_REGS = (1e-13, 1e-10, 1e-7)
_REFINE = 10
# the equality rows' regularisation (relative): quasi-definite LDL without pivoting needs it
# well above rounding, iterative refinement removes its effect
_DUAL_REG = 1e-10
# QDLDL (one symbolic analysis, then numeric updates) up to this many unknowns of the reduced
# system, SuperLU (minimum degree on A + A^T, less fill measured on random 0/1 rows) beyond
_QDLDL_MAX = 2000
# ... LAPACK's dense Cholesky of the n x n block (and of A's Schur complement) up to this n:
# random 0/1 rows fill the sparse factor to ~40 % anyway (n = 3000: SuperLU 3 s, QDLDL 5.6 s,
# one-thread dense Cholesky 0.5 s, measured on the loaded 2-core machine; n = 10,000: SuperLU
# 22.7 s a factorisation, 45 % of the dense fill, dense 4.8 s; the buffer is 8 n^2 bytes,
# 1.15 GB here)
_DENSE_MAX = 12_000
# ... and below _QDLDL_MAX too when the first sparse factorisation shows this much work
# (multiply-adds) and at least this fraction of a dense one's
_DENSE_FLOPS = 5e7
_DENSE_FRACTION = 0.15
# small problems: dense copies of R and A (products, the Newton matrix by syrk, the KKT matrix
# by LU, the polish's system by LU) up to this many entries and this many unknowns (plus
# equality rows): the dense KKT matrix is (n + p)^2 whatever the rows, so a long vector with a
# handful of rows is not small
_DENSE_PRODUCTS = 60_000
_SMALL_UNKNOWNS = 400


def _small(rows: int, n: int, p: int) -> bool:
    """Whether a problem of ``rows`` loss / order rows, ``n`` unknowns and ``p`` equality rows
    takes the small problems' dense path (see :data:`_DENSE_PRODUCTS`)."""
    return (rows + p) * n <= _DENSE_PRODUCTS and n + p <= _SMALL_UNKNOWNS


class IPMResult:
    """``x``, the loss multipliers ``w`` (one per row of ``M``), ``duals`` (family keys),
    ``iterations`` and the final relative accuracy."""

    def __init__(self, x, w, duals, iterations, accuracy, at_lo, at_hi, kink, filled=False):
        self.x, self.w, self.duals, self.iterations, self.accuracy = x, w, duals, iterations, accuracy
        # the Newton matrices' sparse factors fill in (the dense path runs): a sparse solve
        # of the polish's system, a sub-matrix of the same rows, costs several iterations
        self.filled = filled
        # the active set the iterate points at (a dual slack above its primal one, both
        # scaled): bounds hit and L1 rows at their kink (p and q both vanishing)
        self.at_lo, self.at_hi, self.kink = at_lo, at_hi, kink


class _Problem:
    """The QP's arrays: ``R = [M_rows; D]`` (rows with private columns), ``A``, bounds and
    the per-row kinds."""

    def __init__(self, d) -> None:
        self.d = d
        n = d.n
        rows = np.flatnonzero((d.w1 > 0) | (d.w2 > 0))
        self.rows = rows
        M = d.M.tocsr()[rows]
        D = order_matrix(d.chains, n) if has_chains(d) else sp.csr_matrix((0, n))
        self.k, self.nd = rows.size, D.shape[0]
        self.R = sp.vstack([M, D]).tocsr()
        self.RT = self.R.T.tocsr()
        self.yR = np.r_[d.y[rows], np.zeros(self.nd)]
        self.w1 = np.r_[d.w1[rows], np.zeros(self.nd)]
        self.w2 = np.r_[d.w2[rows], np.zeros(self.nd)]
        self.split = self.w1 > 0                     # p, q columns
        self.edge = np.r_[np.zeros(self.k, bool), np.ones(self.nd, bool)]
        self.vrow = ~self.split & ~self.edge          # free v column
        self.A = d.A.tocsr() if has_eq(d) else sp.csr_matrix((0, n))
        self.AT = self.A.T.tocsr()
        self.b = d.b if has_eq(d) else np.zeros(0)
        # the products' operands: dense for a small problem, where scipy's sparse product
        # costs ~10 us of overhead against numpy's ~1 us and a solve makes ~200 of them
        small = _small(self.R.shape[0], n, self.A.shape[0])
        self.Rp, self.RTp, self.Ap, self.ATp = (
            (m.toarray() if small else m) for m in (self.R, self.RT, self.A, self.AT))
        self.lo_f, self.up_f = np.isfinite(d.lower), np.isfinite(d.upper)
        self.l = np.where(self.lo_f, d.lower, 0.0)
        self.u = np.where(self.up_f, d.upper, 0.0)


def solve_qp(d, deadline: float = math.inf, verbose: bool = False,
             accept: Callable[[IPMResult], bool] | None = None) -> IPMResult | None:
    """Solve ``d`` (any loss weights; pure L1 too) by the interior point; ``None`` when it
    does not converge (or runs past ``deadline``, a ``time.perf_counter()`` time).
    ``accept``, if given, sees the first iterate at each accuracy of :data:`_EARLY_TOLS`:
    ``True`` (it finished the solve, say by the polish and the certificate) stops the
    iteration there."""
    P = _Problem(d)
    with threads(1):               # many short BLAS calls: see cvxdp.solvers._blas
        return _Solver(P, verbose).run(deadline, accept)


class _Solver:
    def __init__(self, P: _Problem, verbose: bool) -> None:
        self.P = P
        self.verbose = verbose
        n, nr, p = P.d.n, P.R.shape[0], P.A.shape[0]
        self.n, self.nr, self.p = n, nr, p
        self._lu = None
        self._ldl = PatternLDL()
        self._fill_checked = False
        self._dense: DenseKKT | None = None
        self._asm: NewtonAssembly | None = None
        if not sp.issparse(P.Rp):
            # small (dense products): H = R^T Phi R by one BLAS product and the whole KKT
            # matrix by LAPACK's LU; the sparse assembly's set-up alone took 1.7 ms of a 17 ms
            # solve at n = 100
            self.mode = "small"
            self._small_lu = None
            return
        if _QDLDL_MAX < n + p and n <= _DENSE_MAX:
            self.mode = "dense"
        else:
            self.mode = "qdldl" if n + p <= _QDLDL_MAX else "splu"
        self._asm = NewtonAssembly(P.R, P.A)

    # ---------------------------------------------------------------- start and scaling
    def _start(self):
        """Mehrotra's starting point (Nocedal & Wright 2006, sec. 16.6 / 14.2): ``x`` from the
        equality-constrained least squares with the curvatures ``w1 + w2`` (one factorisation),
        the loss multipliers its gradient, then primal and dual slacks shifted positive and
        balanced."""
        P = self.P
        n = self.n
        # scale: the loss per row at the origin clipped into the bounds (objective ~ one unit)
        x_c = np.clip(np.zeros(n), P.d.lower, P.d.upper)
        r_c = P.Rp @ x_c - P.yR
        f = float(P.w1 @ np.abs(r_c) + 0.5 * P.w2 @ (r_c * r_c))
        self.scale = max(f / max(P.k, 1), 1e-12 * max(float(np.max(P.w1, initial=0.0)), 1.0), 1e-300)
        c1, c2 = P.w1 / self.scale, P.w2 / self.scale
        self.c1, self.c2 = c1, c2
        curv = np.where(P.edge, 0.0, c2 + c1 / (1.0 + np.abs(r_c)))
        curv = np.where(curv > 0, curv, 1.0)
        hx = 1e-6 * float(np.mean(curv)) * np.ones(n)
        x = x_c
        if self._assemble(np.where(P.edge, 0.0, curv), hx, 1e-10):
            # min 1/2 sum curv (R x - y)^2 + 1/2 hx |x - x_c|^2  s.t.  A x = b
            fx = -(P.RTp @ (curv * np.where(P.edge, 0.0, P.yR)) + hx * x_c)
            with np.errstate(over="ignore", invalid="ignore"):
                xs, _ = self._apply(fx, P.b)
            if np.all(np.isfinite(xs)):
                x = xs
        self._rescale(x, f)
        c1, c2 = self.c1, self.c2
        # into the bounds by a margin (a uniform shift by the most negative slack, as in
        # Mehrotra's rule, moved every coordinate by the worst one's 1e3)
        mag = float(np.median(np.abs(P.yR[:P.k]))) if P.k else 1.0
        theta = np.minimum(0.1 * max(mag, 1e-8), 0.25 * np.where(P.lo_f & P.up_f, P.u - P.l, np.inf))
        x = np.where(P.lo_f, np.maximum(x, P.l + theta), x)
        x = np.where(P.up_f, np.minimum(x, P.u - theta), x)
        r = P.Rp @ x - P.yR
        # loss multipliers: the gradient at x (-yR in the Lagrangian's sign)
        yR = np.where(P.split, -(c1 * np.sign(r) + c2 * r), np.where(P.vrow, -c2 * r, 0.0))
        g = -(P.RTp @ yR)                                     # = s_lo - s_up wanted
        t_pairs = [np.where(P.lo_f, x - P.l, np.inf), np.where(P.up_f, P.u - x, np.inf),
                   np.where(P.split, np.maximum(r, 0.0), np.inf), np.where(P.split, np.maximum(-r, 0.0), np.inf),
                   np.where(P.edge, np.maximum(-r, 0.0), np.inf)]
        s_lo = np.where(P.lo_f, np.maximum(g, 0.0), 0.0)
        s_up = np.where(P.up_f, np.maximum(-g, 0.0), 0.0)
        s_p = np.where(P.split, c1 + c2 * r + yR, 0.0)
        s_q = np.where(P.split, c1 - c2 * r - yR, 0.0)
        s_g = np.where(P.edge, 1.0, 0.0)
        masks = [P.lo_f, P.up_f, P.split, P.split, P.edge]
        s_pairs = [s_lo, s_up, s_p, s_q, s_g]
        T = np.concatenate([t[mk] for t, mk in zip(t_pairs, masks)])
        S = np.concatenate([v[mk] for v, mk in zip(s_pairs, masks)])
        if T.size == 0:
            dt = ds = 0.0
        else:
            dt = max(-1.5 * float(T.min()), 0.0) + 1e-8
            ds = max(-1.5 * float(S.min()), 0.0) + 1e-8
            T2, S2 = T + dt, S + ds
            dot = float(T2 @ S2)
            dt += 0.5 * dot / float(S2.sum())
            ds += 0.5 * dot / float(T2.sum())
        # the primal shift moves x into the bounds (half the width at most)
        width = np.where(P.lo_f & P.up_f, P.u - P.l, np.inf)
        shift = np.minimum(dt, 0.5 * width)
        x = np.where(P.lo_f, np.maximum(x, P.l + shift), x)
        x = np.where(P.up_f, np.minimum(x, P.u - shift), x)
        r = P.Rp @ x - P.yR
        pp = np.where(P.split, np.maximum(r, 0.0) + dt, 0.0)
        qq = np.where(P.split, np.maximum(-r, 0.0) + dt, 0.0)
        v = np.where(P.vrow, r, 0.0)
        gg = np.where(P.edge, np.maximum(-r, 0.0) + dt, 0.0)
        return dict(x=x, p=pp, q=qq, v=v, g=gg, yR=yR, yA=np.zeros(self.p),
                    sp=np.where(P.split, s_p + ds, 0.0), sq=np.where(P.split, s_q + ds, 0.0),
                    sg=np.where(P.edge, s_g + ds, 0.0), sl=np.where(P.lo_f, s_lo + ds, 0.0),
                    su=np.where(P.up_f, s_up + ds, 0.0))

    def _rescale(self, x: np.ndarray, f_origin: float) -> None:
        """The scale again from the loss at ``x`` (the least-squares start) clipped into the
        bounds, when that is far below the loss at the origin: the tolerances are relative to
        one scaled unit, and an optimum many orders below the origin's loss (answers of 1e6
        against a total of 1e4: 1.76 against 1e13) was resolved to 1 % only."""
        P = self.P
        r = P.Rp @ np.clip(x, P.d.lower, P.d.upper) - P.yR
        f = float(P.w1 @ np.abs(r) + 0.5 * P.w2 @ (r * r))
        if math.isfinite(f) and f < _RESCALE * f_origin:
            self.scale = max(f / max(P.k, 1), _RESCALE * self.scale)
            self.c1, self.c2 = P.w1 / self.scale, P.w2 / self.scale

    # ---------------------------------------------------------------- residuals
    def _residuals(self, z):
        """Primal / dual residuals of the scaled KKT conditions."""
        P = self.P
        c1, c2 = self.c1, self.c2
        # primal: R x - p + q - v + g = yR ; A x = b
        rR = P.yR - (P.Rp @ z["x"] - z["p"] + z["q"] - z["v"] + z["g"])
        rA = P.b - P.Ap @ z["x"]
        # dual (stationarity): objective gradient - (constraint^T y) - s_lower + s_upper = 0
        diff = z["p"] - z["q"]
        dx = -(P.RTp @ z["yR"]) - P.ATp @ z["yA"] - z["sl"] + z["su"]
        dp = np.where(P.split, c1 + c2 * diff + z["yR"] - z["sp"], 0.0)
        dq = np.where(P.split, c1 - c2 * diff - z["yR"] - z["sq"], 0.0)
        dv = np.where(P.vrow, c2 * z["v"] + z["yR"], 0.0)
        dg = np.where(P.edge, -z["yR"] - z["sg"], 0.0)
        return rR, rA, dx, dp, dq, dv, dg

    def _objectives(self, z):
        P = self.P
        diff = z["p"] - z["q"]
        quad = float(np.sum(np.where(P.split, self.c2 * diff * diff, 0.0))
                     + np.sum(np.where(P.vrow, self.c2 * z["v"] ** 2, 0.0)))
        pobj = float(np.sum(np.where(P.split, self.c1 * (z["p"] + z["q"]), 0.0))) + 0.5 * quad
        dobj = (float(z["yR"] @ P.yR + z["yA"] @ P.b) - 0.5 * quad
                + float(z["sl"][P.lo_f] @ P.l[P.lo_f]) - float(z["su"][P.up_f] @ P.u[P.up_f]))
        return pobj, dobj

    def _accuracy(self, z, res):
        rR, rA, dx, dp, dq, dv, dg = res
        pobj, dobj = self._objectives(z)
        bn = 1.0 + float(max(np.abs(self.P.yR).max(initial=0.0), np.abs(self.P.b).max(initial=0.0)))
        cn = 1.0 + float(np.abs(self.c1).max(initial=0.0))
        prim = max(float(np.abs(rR).max(initial=0.0)), float(np.abs(rA).max(initial=0.0))) / bn
        dual = max(float(np.abs(a).max(initial=0.0)) for a in (dx, dp, dq, dv, dg)) / cn
        gap = abs(pobj - dobj) / max(abs(pobj), 1.0)
        return max(prim, dual, gap)

    # ---------------------------------------------------------------- complementarity
    def _pairs(self, z):
        """(primal slack, dual slack, mask) of every bound."""
        P = self.P
        return [(z["x"] - P.l, z["sl"], P.lo_f), (P.u - z["x"], z["su"], P.up_f),
                (z["p"], z["sp"], P.split), (z["q"], z["sq"], P.split), (z["g"], z["sg"], P.edge)]

    def _mu(self, z):
        tot, cnt = 0.0, 0
        for t, s, mk in self._pairs(z):
            tot += float(np.dot(t[mk], s[mk]))
            cnt += int(mk.sum())
        return tot / max(cnt, 1)

    # ---------------------------------------------------------------- Newton system
    def _factor(self, z, reg):
        """Reduce and factorise for the current barrier curvatures."""
        P = self.P
        with np.errstate(divide="ignore", invalid="ignore"):
            hl = np.where(P.lo_f, z["sl"] / (z["x"] - P.l), 0.0)
            hu = np.where(P.up_f, z["su"] / (P.u - z["x"]), 0.0)
            dp = np.where(P.split, z["sp"] / np.where(P.split, z["p"], 1.0), 0.0)
            dq = np.where(P.split, z["sq"] / np.where(P.split, z["q"], 1.0), 0.0)
            dg = np.where(P.edge, z["sg"] / np.where(P.edge, z["g"], 1.0), 0.0)
            c2 = self.c2
            # per-row 2x2 Hessian of (p, q): [[c2 + dp, -c2], [-c2, c2 + dq]]
            det = c2 * (dp + dq) + dp * dq
            phi = np.where(P.split, det / np.where(P.split, dp + dq, 1.0),
                           np.where(P.vrow, c2, dg))
            self.h = self._elimination(z, dp, dq, dg, det, phi)
        return self._assemble(phi, hl + hu, reg)

    def _elimination(self, z, dp, dq, dg, det, phi) -> dict:
        """What the two directions of an iteration share: the primal slacks ``t`` and each
        row's private step as ``u + k dy`` (see :meth:`_direction`), ``u`` linear in the
        right-hand sides ``bp, bq`` with the coefficients ``up = ep_p bp + c_pq bq``,
        ``uq = c_pq bp + eq_q bq``."""
        P, c2 = self.P, self.c2
        split, vrow, edge = P.split, P.vrow, P.edge
        h = dict(phi=phi,
                 tl=np.where(P.lo_f, z["x"] - P.l, 1.0), tu=np.where(P.up_f, P.u - z["x"], 1.0),
                 tp=np.where(split, z["p"], 1.0), tq=np.where(split, z["q"], 1.0),
                 tg=np.where(edge, z["g"], 1.0))
        # p,q: [[a, -c],[-c, e]] [dp; dq] = [bp - dy; bq + dy]  (a = c2 + dp, e = c2 + dq),
        # inverse 1/det [[e, c],[c, a]]
        det = np.where(split, det, 1.0)
        a_, e_ = c2 + dp, c2 + dq
        h["ep"] = np.where(split, e_ / det, 0.0)
        h["cpq"] = np.where(split, c2 / det, 0.0)
        h["aq"] = np.where(split, a_ / det, 0.0)
        h["kp"] = np.where(split, (c2 - e_) / det, 0.0)       # coefficient of dy in dp
        h["kq"] = np.where(split, (a_ - c2) / det, 0.0)       # coefficient of dy in dq
        cv = np.where(vrow, c2, 1.0)
        h["iv"], h["kv"] = np.where(vrow, 1.0 / cv, 0.0), np.where(vrow, -1.0 / cv, 0.0)
        cg = np.where(edge, dg, 1.0)
        h["kg"] = np.where(edge, 1.0 / cg, 0.0)
        return h

    def _assemble(self, phi, Hx, reg):
        """Factorise ``[-(Hx + R^T Phi R)  A^T; A  d I]`` (regularised)."""
        if self.mode == "small":
            return self._assemble_small(phi, Hx, reg)
        asm = self._asm
        hdata = asm.h_values(phi, Hx)
        self._H = asm.h_matrix(hdata.copy())         # unregularised, for the refinement
        diag_scale = max(float(np.abs(hdata[asm.h_diag]).max(initial=0.0)), 1e-300)
        self.reg = reg * diag_scale
        hdata[asm.h_diag] += self.reg
        dreg = max(reg, _DUAL_REG) * diag_scale
        if self.mode == "qdldl":
            try:
                self._ldl.factor(asm.kkt(hdata, dreg, upper=True), upper=True)
            except (RuntimeError, ValueError):
                self._ldl.reset()
                return False
            if not self._fill_makes_dense():
                return True
        if self.mode == "dense":
            if self._dense is None:
                self._dense = DenseKKT(self.n, self.P.A, (asm.h_indptr, asm.h_indices))
            return self._dense.factor(hdata, dreg)
        try:
            self._lu = spla.splu(asm.kkt(hdata, dreg), permc_spec="MMD_AT_PLUS_A")
        except (RuntimeError, ValueError):
            return False
        return True

    def _assemble_small(self, phi, Hx, reg) -> bool:
        """The dense ``H`` by BLAS's ``syrk`` on ``Phi^{1/2} R`` (its lower triangle, then
        mirrored), and ``[-H  A^T; A  d I]`` by LU with partial pivoting: not by ``H``'s
        Cholesky factor and ``A``'s Schur complement, which squares the conditioning (a
        column no loss row reads has only the barrier's curvature, and with duplicate rows
        of ``A`` the complement's rounding outgrew its regularisation: a local polytope of 18
        cells whose interior point gave up, where the quasi-definite LDL converged)."""
        P = self.P
        self._H = None
        self._phi_hx = (phi, Hx)                        # H v = R^T (phi R v) + Hx v
        with np.errstate(invalid="ignore", over="ignore"):
            H = blas.dsyrk(1.0, np.sqrt(phi)[:, None] * P.Rp, trans=1, lower=1)
        diag = np.einsum("ii->i", H)                    # a writable view of the diagonal
        diag += Hx
        diag_scale = max(float(np.abs(diag).max(initial=0.0)), 1e-300)
        if not math.isfinite(diag_scale):
            return False
        self.reg = reg * diag_scale
        diag += self.reg
        n = self.n
        K = np.empty((n + self.p, n + self.p), order="F")
        K[:n, :n] = -H
        K[:n, :n] -= np.tril(H, -1).T
        if self.p:
            K[n:, :n] = P.Ap
            K[:n, n:] = P.ATp
            K[n:, n:] = np.diag(np.full(self.p, max(reg, _DUAL_REG) * diag_scale))
        lu, piv, info = lapack.dgetrf(K, overwrite_a=1)
        if info != 0 or not np.all(np.isfinite(lu.diagonal())):
            self._small_lu = None
            return False
        self._small_lu = (lu, piv)
        return True

    def _h_times(self, v: np.ndarray) -> np.ndarray:
        """The unregularised ``H v``."""
        if self._H is not None:
            return self._H @ v
        phi, Hx = self._phi_hx
        return self.P.RTp @ (phi * (self.P.Rp @ v)) + Hx * v

    def _fill_makes_dense(self) -> bool:
        """After the first sparse factorisation: when the fill made it nearly dense, LAPACK's
        dense Cholesky takes over from this iteration on (random 0/1 rows: ``sum c_j^2`` about
        a quarter of ``(n + p)^3 / 3``, and at n = 1,000 QDLDL's update took 41 ms against
        21 ms dense; at n = 500, 3.3 ms against 3.1 ms)."""
        if self._fill_checked:
            return False
        self._fill_checked = True
        size = self.n + self.p
        flops = self._ldl.flops()
        if self.n <= _DENSE_MAX and flops > max(_DENSE_FLOPS, _DENSE_FRACTION * size ** 3 / 3.0):
            self.mode = "dense"
            return True
        return False

    def _solve_reduced(self, fx, fA):
        """``[-H  A^T; A  0] (dx, dyA) = (fx, fA)``, refined against the unregularised system."""
        dx, dy = self._apply(fx, fA)
        scale = 1.0 + float(max(np.abs(fx).max(initial=0.0), np.abs(fA).max(initial=0.0)))
        for _ in range(_REFINE):
            r1 = fx - (-self._h_times(dx) + self.P.ATp @ dy)
            r2 = fA - self.P.Ap @ dx
            # refined to rounding level: looser directions were measured to cost interior-point
            # iterations (stopping once a step gained less than a digit: 16 instead of 11)
            if max(float(np.abs(r1).max(initial=0.0)), float(np.abs(r2).max(initial=0.0))) <= 1e-15 * scale:
                break
            ex, ey = self._apply(r1, r2)
            dx, dy = dx + ex, dy + ey
        return dx, dy

    def _apply(self, fx, fA):
        """The regularised system's solution from the current factorisation."""
        if self.mode == "small":
            sol = lapack.dgetrs(*self._small_lu, np.concatenate((fx, fA)))[0]
            return sol[:self.n], sol[self.n:]
        if self.mode == "dense":
            return self._dense.solve(fx, fA)
        rhs = np.concatenate((fx, fA))
        sol = self._ldl.solve(rhs) if self.mode == "qdldl" else self._lu.solve(rhs)
        return sol[:self.n], sol[self.n:]

    def _direction(self, z, res, rc):
        """The Newton direction for the residuals ``res`` and complementarity targets ``rc``
        (a dict of ``sigma mu - t s - corrections`` per bound)."""
        P, h = self.P, self.h
        rR, rA, ex, ep, eq_, ev, eg = res
        tl, tu, tp, tq, tg = h["tl"], h["tu"], h["tp"], h["tq"], h["tg"]
        # linearised: (grad of col) d - constraint^T dy - ds_lo + ds_up = -dual residual, with
        # ds = (rc - s dt) / t ; so per column:  Hcol dcol - a^T dy = -e + rc_lo/t - rc_up/t
        # (rc is zero off its mask: no masks needed here)
        bx = rc["l"] / tl - rc["u"] / tu - ex
        bp = rc["p"] / tp - ep
        bq = rc["q"] / tq - eq_
        bg = rc["g"] / tg - eg
        # row i: R_i dx - dp + dq - dv + dg = rR_i ; columns: p: (c2+dp) dp_ - c2 dq_ + dy = bp
        # (constraint coefficient of p is -1: "- a^T dy" = + dy), q: -c2 dp_ + (c2+dq) dq_ - dy = bq,
        # v: c2 dv + dy = bv, g: dg_ * dg - dy = bg.
        # Eliminate: express each row's private step as u_i + k_i dy_i (the coefficients from
        # :meth:`_elimination`), then the row equation gives dy_i = phi_i (R_i dx - rR_i + ...)
        up = h["ep"] * bp + h["cpq"] * bq
        uq = h["cpq"] * bp + h["aq"] * bq
        uv = -h["iv"] * ev
        ug = h["kg"] * bg
        # row: R dx - (up + kp dy) + (uq + kq dy) - (uv + kv dy) + (ug + kg dy) = rR
        # -> R dx + (kq - kp - kv + kg) dy = rR + up - uq + uv - ug ; kq - kp - kv + kg = 1/phi
        const = rR + up - uq + uv - ug
        phi = h["phi"]
        # dy = phi (const - R dx);  x columns: Hx dx - R^T dy - A^T dyA = bx
        # -> (Hx + R^T phi R) dx - A^T dyA = bx + R^T phi const ; A dx = rA
        fx = -(bx + P.RTp @ (phi * const))
        dx, dyA = self._solve_reduced(fx, rA)
        dyR = phi * (const - P.Rp @ dx)
        d = dict(x=dx, yA=dyA, yR=dyR, p=up + h["kp"] * dyR, q=uq + h["kq"] * dyR,
                 v=uv + h["kv"] * dyR, g=ug + h["kg"] * dyR)
        d["sl"] = np.where(P.lo_f, (rc["l"] - z["sl"] * dx) / tl, 0.0)
        d["su"] = np.where(P.up_f, (rc["u"] + z["su"] * dx) / tu, 0.0)
        d["sp"] = np.where(P.split, (rc["p"] - z["sp"] * d["p"]) / tp, 0.0)
        d["sq"] = np.where(P.split, (rc["q"] - z["sq"] * d["q"]) / tq, 0.0)
        d["sg"] = np.where(P.edge, (rc["g"] - z["sg"] * d["g"]) / tg, 0.0)
        return d

    def _step_length(self, z, d):
        P = self.P
        ap, ad = 1.0, 1.0
        prim = [(z["x"] - P.l, d["x"], P.lo_f), (P.u - z["x"], -d["x"], P.up_f),
                (z["p"], d["p"], P.split), (z["q"], d["q"], P.split), (z["g"], d["g"], P.edge)]
        dual = [(z[k], d[k], mk) for k, mk in (("sl", P.lo_f), ("su", P.up_f), ("sp", P.split),
                                                ("sq", P.split), ("sg", P.edge))]
        for t, dt, mk in prim:
            neg = mk & (dt < 0)
            if neg.any():
                ap = min(ap, float(np.min(-t[neg] / dt[neg])))
        for t, dt, mk in dual:
            neg = mk & (dt < 0)
            if neg.any():
                ad = min(ad, float(np.min(-t[neg] / dt[neg])))
        return ap, ad

    @staticmethod
    def _move(z, d, ap, ad):
        out = dict(z)
        for k in ("x", "p", "q", "v", "g"):
            out[k] = z[k] + ap * d[k]
        for k in ("yR", "yA", "sl", "su", "sp", "sq", "sg"):
            out[k] = z[k] + ad * d[k]
        return out

    def _rc(self, z, sigma_mu, d_aff=None):
        P = self.P
        out = {}
        pairs = {"l": (z["x"] - P.l, z["sl"], P.lo_f, "x", "sl", 1.0),
                 "u": (P.u - z["x"], z["su"], P.up_f, "x", "su", -1.0),
                 "p": (z["p"], z["sp"], P.split, "p", "sp", 1.0),
                 "q": (z["q"], z["sq"], P.split, "q", "sq", 1.0),
                 "g": (z["g"], z["sg"], P.edge, "g", "sg", 1.0)}
        for key, (t, s, mk, kt, ks, sg) in pairs.items():
            val = sigma_mu - t * s
            if d_aff is not None:
                val = val - sg * d_aff[kt] * d_aff[ks]
            out[key] = np.where(mk, val, 0.0)
        return out

    # ---------------------------------------------------------------- the iteration
    def run(self, deadline: float, accept=None) -> IPMResult | None:
        z = self._start()
        best, best_it = (math.inf, None), 0
        # the last iteration that cut mu tenfold and the primal residual by half: progress
        # the accuracy may not show (its relative gap grows while a large objective falls to
        # its small optimum: a local polytope with answers of 1e6-1e7 and a total of 1e4
        # was given up after 11 iterations whose mu and residuals fell by 1e4 and 5e5)
        moved_it, moved = 0, (math.inf, math.inf)
        it = tries = 0
        for it in range(1, _MAX_ITERS + 1):
            res = self._residuals(z)
            acc = self._accuracy(z, res)
            mu = self._mu(z)
            prim = max(float(np.abs(res[0]).max(initial=0.0)), float(np.abs(res[1]).max(initial=0.0)))
            if mu <= 0.1 * moved[0] and prim <= 0.5 * moved[1]:
                moved_it, moved = it, (mu, prim)
            if self.verbose:
                _LOG.info(f"ipm {it:3d} acc {acc:.2e} mu {self._mu(z):.2e} " + " ".join(
                    f"{float(np.abs(a).max(initial=0.0)):.1e}" for a in res) + " obj %.6e %.6e" % self._objectives(z))
            if acc < best[0]:
                best, best_it = (acc, z), it
            if acc <= _TOL:
                break
            if accept is not None and tries < len(_EARLY_TOLS) and acc <= _EARLY_TOLS[tries]:
                out = self._unpack(z, it, acc)
                if accept(out):
                    return out
                tries = sum(acc <= t for t in _EARLY_TOLS)        # each accuracy once
            if it - best_it >= _STALL and best[0] <= _LOOSE_TOL:
                break
            if it - max(best_it, moved_it) >= _NO_PROGRESS:   # diverging (infeasible constraints)
                break
            if time.perf_counter() > deadline:
                return None
            for reg in _REGS:
                if not self._factor(z, reg):
                    continue
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    d_aff = self._direction(z, res, self._rc(z, 0.0))
                    ap, ad = self._step_length(z, d_aff)
                    mu_aff = self._mu(self._move(z, d_aff, ap, ad))
                    sigma = (mu_aff / mu) ** 3 if mu > 0 else 0.0
                    d = self._direction(z, res, self._rc(z, sigma * mu, d_aff))
                if all(np.all(np.isfinite(v)) for v in d.values()):
                    break
            else:
                break
            ap, ad = self._step_length(z, d)
            ap, ad = _STEP * ap, _STEP * ad
            if _SAME_STEP and np.any(self.c2 > 0):
                ap = ad = min(ap, ad)
            z = self._move(z, d, ap, ad)
            if self.verbose:
                _LOG.info(f"      step {ap:.3f} {ad:.3f} sigma {sigma:.2e}")
            if max(ap, ad) < 1e-12:
                break
        acc, z = best
        if z is None or acc > _LOOSE_TOL:
            return None
        return self._unpack(z, it, acc)

    def _unpack(self, z, it, acc) -> IPMResult:
        P, d = self.P, self.P.d
        sc = self.scale
        w = np.zeros(d.M.shape[0])
        yR = z["yR"] * sc
        w[P.rows] = -yR[:P.k]
        flat = P.split[:P.k] & (P.w2[:P.k] == 0)
        w1 = P.w1[:P.k]
        w[P.rows[flat]] = np.clip(w[P.rows[flat]], -w1[flat], w1[flat])
        duals = {"lower": np.where(P.lo_f, z["sl"] * sc, 0.0), "upper": np.where(P.up_f, z["su"] * sc, 0.0)}
        if self.p:
            duals["eq"] = -z["yA"] * sc
        if P.nd:
            duals["order"] = split_order(d.chains, np.maximum(z["sg"][P.k:] * sc, 0.0))
        x = np.clip(z["x"], d.lower, d.upper)
        at_lo = P.lo_f & (z["sl"] > z["x"] - P.l)
        at_hi = P.up_f & (z["su"] > P.u - z["x"])
        kink = np.zeros(d.M.shape[0], dtype=bool)
        kink[P.rows] = self._kinks(z)
        return IPMResult(x, w, duals, it, acc, at_lo, at_hi, kink, filled=self.mode == "dense")

    def _kinks(self, z) -> np.ndarray:
        """The L1 rows at their kink: both parts ``p, q`` of the residual small against
        their multipliers ``s_p, s_q``, each side measured in its own unit: ``p`` against the
        row's magnitude ``rho = max(|y|, |M x|)``, ``s_p`` against its weight ``c1`` (both
        ``s_p + s_q = 2 c1``).  Comparing ``p`` with ``s_p`` directly mixes the residual's
        unit with the scaled objective's: with answers of 1e6-1e7 and an optimum of 1.76
        (weights 1,000, a stress instance) every ``s`` was 1e-10 and every ``p`` 1e-8, no
        kink was seen, and the polish, started without it, cycled."""
        P, k = self.P, self.P.k
        split = P.split[:k]
        c1 = np.where(split, self.c1[:k], 1.0)
        rho = np.maximum(np.abs(P.yR[:k]), np.abs(P.R[:k] @ z["x"]))
        return split & (z["p"][:k] * c1 < z["sp"][:k] * rho) & (z["q"][:k] * c1 < z["sq"][:k] * rho)
