"""Exact solve of L1 (Laplace), mixed L1 + L2 and squared marginal losses on the junction tree's local polytope.

Entropic mirror descent (:mod:`cvxdp.solvers.marginal.mirror_descent`) on an L1 loss minimises a
nonsmooth function whose optimum sits on a face of the polytope (the residuals that vanish,
the cells that are empty): the Huber smoothing and the Frank-Wolfe bound both close slowly
there.  For a triangulated model the marginal polytope *is* the junction tree's local
polytope ``{x >= 0, E x = e}`` (clique tables ``x``, separator consistency and the total;
Wainwright & Jordan 2008, prop. 2.1), so the problem is a finite convex program in ``x``::

    minimize   sum_{L1 rows i} w_i |a_i^T P x - b_i|  +  sum_{L2 rows j} w_j/2 (a_j^T P x - b_j)^2
    subject to E x = e,  x >= 0,

with ``P`` the marginalisation of the clique tables onto the measured factors.  Splitting each
L1 residual into ``p - q`` (``p, q >= 0``) and naming each L2 residual ``v`` (free) gives

    minimize   w1^T (p + q) + 1/2 v^T W2 v
    subject to A1 P x - p + q = b1,   A2 P x - v = b2,   E x = e,   x, p, q >= 0,

a linear program when there is no L2 row.  It is solved in the units ``x = N u`` (total one).

* **Pure L1: a linear program**, solved exactly by HiGHS through ``scipy.optimize.linprog``:
  the dual simplex on models up to ``_SIMPLEX_MAX_NNZ`` nonzeros, the interior point with
  crossover (an optimal vertex with its basis duals) on larger ones or when the simplex does not
  finish in ``_SIMPLEX_BUDGET`` seconds (measurements at :meth:`LocalPolytopeLP._highs`), given
  the *routed* form of the program (:meth:`LocalPolytopeLP._routed`: the measured marginals as
  variables, each summed from the smallest table holding it; far fewer nonzeros); cold:
  the LP has no use for the mirror-descent iterate, and HiGHS' presolve takes much of the model
  apart anyway.  Should HiGHS fail, the interior point below is tried on the LP.
* **Mixed L1 + L2: a convex QP with a diagonal Hessian** (``W2`` on ``v``), solved by a
  primal-dual interior-point method with Mehrotra's predictor-corrector (Nocedal & Wright,
  2006, algorithm 16.4 for the QP), written here on numpy / scipy: each Newton step solves the
  quasi-definite augmented system ``[-D, A^T; A, 0] (dz, dy) = (.., ..)`` with the diagonal
  ``D = Q + Z^{-1} S``, regularised (``-/+ 1e-12`` on the diagonal, raised to 1e-9 and 1e-6 if a
  direction comes out non-finite), then refined against the exact system.  The regularised
  system is factorised through its normal equations ``A (D + d I)^{-1} A^T + d I`` (QDLDL with
  AMD), which couple only rows sharing a junction-tree clique; AMD on the augmented system
  itself can fill in badly (5.3 s against 0.02 s a factorisation, measured).  Unrefined, the
  normal equations once lost the primal residual to 1e-7 as ``D`` spans 1e-20 .. 1e20 near the
  optimum; refined against the exact augmented system they are kept only while they reach
  ``_NORMAL_TOL``, and the augmented system (symbolic analysis once: its pattern never
  changes) is factorised from then on otherwise (:class:`_KKT`).  The
  objective is scaled so that the uniform tables' loss is one unit, and the gap is measured
  relative to the loss (floor one loss unit, as in the certificate).  It converges to a point
  of the optimal face to ~1e-10 relative, not to a vertex; cells below 1e-12 of the total
  are then set to zero.
* **Pure L2 (squared losses only): the same interior point** on the program without the
  ``p, q`` columns.  Squared losses are normally finished by the active-set polish of
  :mod:`cvxdp.solvers.marginal.polish`, which is exact when its active set settles.  It does
  not always settle: the primal-dual active-set rule has no convergence guarantee for this QP
  (its Hessian in ``x``, ``P^T H P``, is singular and not an M-matrix), and on optima with
  most cells empty it was seen to cycle -- a 6-attribute cycle with 30 records and noise of
  sigma 30 keeps 50-160 cells changing sides every round.  The interior point does not
  guess the empty cells, so mirror descent hands over to it when the polish fails, and the
  free-total solve (:mod:`cvxdp.solvers.marginal.free_total`) starts with it on small programs
  and hands over to it on larger ones.

Certificate.  Nothing above is trusted: the caller certifies the returned point with the max-product
bound of :mod:`cvxdp.solvers.marginal.loss`.  The LP / QP multipliers ``y1`` of the L1 rows
are the dual point of the L1 terms: with ``lam1 = -y1`` clipped to ``[-w1, w1]`` (dual
feasibility of ``p`` and ``q`` says ``-w1 <= y1 <= w1``) and ``lam2 = W2 v`` the gradient of the
L2 terms at the returned point (or, second candidate, the solver's own ``lam2 = -y2``: the
caller keeps the better bound; measured, the latter is the tighter one, 1e-10 against 3e-9 on
Adult), weak duality gives

    L(mu) >= min_{mu' in M} <A1^T lam1 + A2^T lam2, mu'> - lam^T b - sum_j lam2_j^2 / (2 w_j),

one max-product pass.  At an optimum of the local polytope the right-hand side equals the LP /
QP dual objective (reduced costs ``s = P^T A^T lam - E^T nu >= 0`` vanish on the support), so
the bound is tight up to the solver's tolerances; the LP's own dual objective is returned as
well so that the two can be compared.

Feasibility.  The solvers' points satisfy ``E x = e`` to their feasibility tolerance (1e-10 of
the total is asked).  :func:`repair` then makes them exactly consistent (to roundoff) without
leaving the polytope: negative entries are set to zero, the root is scaled to the total, and
walking the tree from the root each clique is rescaled on each separator cell to its parent's
marginal (a separator cell the child has no mass on gets the parent's mass spread evenly).
The certificate is computed at the repaired point.

Multipliers.  With ``lam`` as above and ``g = sum_t A_t^T lam_t`` (a subgradient of the loss
at ``mu = P x``), the local-polytope multipliers returned satisfy, in count units,

    s = P^T g - E^T nu >= 0,     s * x = 0,

``nu`` one entry per row of ``E`` (:func:`cvxdp.solvers.marginal.polish.local_polytope_matrices`:
separator rows child minus parent, last row the total) and ``s`` one per junction-tree cell.
``nu[-1]`` is the derivative of the optimal loss with respect to the total.

Free total.  With ``free_total=True`` the total row leaves ``E x = e`` (``total`` is then only the
unit of the scaled program, e.g. an estimate): the program is the minimum over the whole cone
``{N p : N >= 0, p in M(1)}``, the returned tables sum to the fitted total, and ``nu[-1]`` is
zero (the optimality of the total).  Its multipliers certify the free-total problem through
:func:`cvxdp.solvers.marginal.free_total.free_lower_bound`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
import qdldl

from .._ldl import PatternLDL
from .._level_cholesky import LevelCholesky

from .junction_tree import JunctionTree, marginalizer
from .loss import MarginalLoss
from .polish import local_polytope_matrices

__all__ = ["LocalPolytopeLP", "LPResult", "MAX_LP_SIZE", "repair", "lp_duals"]

#: largest program (junction-tree cells + L1 residual pairs + L2 residuals, i.e. LP columns)
#: the exact polish builds; beyond it mirror descent goes on alone
MAX_LP_SIZE = 2 ** 21
# Feasibility / optimality tolerances asked of HiGHS (problem scaled to total 1).
_HIGHS_TOL = 1e-10
# the dual simplex is tried first on LPs with at most this many constraint nonzeros, for at
# most this many seconds (then the interior point; see LocalPolytopeLP._highs)
_SIMPLEX_MAX_NNZ = 400_000
_SIMPLEX_BUDGET = 10.0
# Interior point: iterations, stopping tolerance (relative), step-to-boundary fraction,
# regularisations of the augmented system tried in turn (objective scaled to about one,
# total one) and iterative-refinement steps against the unregularised system.
_IPM_MAX_ITERS = 200
_IPM_TOL = 1e-10
# ... the looser one the best iterate of a stalled run is returned at (no new best for
# _IPM_STALL iterations once it is met: the normal equations lose accuracy as the
# complementarity vanishes)
_IPM_LOOSE_TOL = 1e-6
_IPM_STALL = 5
# cells below this fraction of the total in an interior-point solution are set to zero
_IPM_ZERO = 1e-12
_IPM_STEP = 0.995
_IPM_REGS = (1e-12, 1e-9, 1e-6)
_IPM_REFINE = 10
# the refined residual (relative to the right-hand side) the normal equations must reach, else
# the augmented system is factorised from then on (_KKT)
_NORMAL_TOL = 1e-10
# the normal equations by independent sets and LAPACK (LevelCholesky) once QDLDL's first
# factorisation takes at least this many multiply-adds and the dense part's work is at most
# _LEVEL_RATIO times it
_LEVEL_MIN_FLOPS = 5e7
_LEVEL_RATIO = 10.0


@dataclass
class LPResult:
    """The exact solve of an L1 / mixed / squared loss.  ``x`` clique tables (counts, consistent to
    roundoff), ``mu`` the loss's flat marginals ``P x``, ``lams`` one dual vector per loss term
    (for :meth:`MarginalLoss.dual_constant`), ``nu`` / ``s`` the local-polytope multipliers
    (module docstring), ``dual_bound`` the solver's own dual objective (loss units, not
    certified here), ``alt_lams`` (losses with L2 terms) a second dual point, the solver's own L2
    multipliers in place of the gradient (the caller keeps the better bound), ``method`` ``"highs"`` or ``"ipm"``, ``iterations`` the solver's,
    ``residual`` the largest ``|E x - e|`` after :func:`repair` and ``repaired`` the largest
    change it made (counts)."""

    x: list[np.ndarray]
    mu: np.ndarray
    lams: list[np.ndarray]
    nu: np.ndarray
    s: np.ndarray
    dual_bound: float
    method: str
    iterations: int
    residual: float
    repaired: float
    alt_lams: list[np.ndarray] | None = None
    info: dict = field(default_factory=dict)


def repair(tree: JunctionTree, tables: list[np.ndarray], total: float) -> list[np.ndarray]:
    """Nearly consistent clique tables -> exactly consistent, nonnegative ones summing to
    ``total`` (module docstring).  Fresh arrays; the inputs are not modified."""
    out = [np.maximum(np.asarray(t, dtype=float), 0.0) for t in tables]
    root = tree.preorder[0]
    s = float(out[root].sum())
    out[root] = out[root] * (total / s) if s > 0 else np.full(out[root].shape, total / out[root].size)
    for i in tree.preorder[1:]:
        p = tree.parent[i]
        # separator marginals, broadcast into the child's axes
        want = out[p].sum(axis=tree._sep_axes[i]) if tree._sep_axes[i] else out[p]
        have = out[i].sum(axis=tree._own_axes[i]) if tree._own_axes[i] else out[i]
        # align the parent's separator marginal with the child's axis order (both sorted)
        want = np.asarray(want).reshape(tree._sep_shape_in[i])
        have = np.asarray(have).reshape(tree._sep_shape_in[i])
        own = math.prod(tree.sizes[a] for a in tree.cliques[i] if a not in tree.separators[i])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(have > 0, want / np.where(have > 0, have, 1.0), 0.0)
        fill = np.where(have > 0, 0.0, want / own)
        out[i] = out[i] * ratio + fill
    return out


class LocalPolytopeLP:
    """The program of the module docstring for a junction tree and any loss (L1, mixed, or
    squared terms only, the last solved by the interior point).

    ``loss`` acts on the stacked factor marginals (``tree.factors``, C order), as in
    :class:`cvxdp.solvers.marginal.mirror_descent.MarginalProblem`.  Raises ``ValueError`` for a
    program above :data:`MAX_LP_SIZE` columns.
    """

    def __init__(self, tree: JunctionTree, loss: MarginalLoss, total: float, *,
                 free_total: bool = False) -> None:
        self.tree, self.loss, self.total = tree, loss, float(total)
        self.free_total = bool(free_total)
        n1 = sum(int(np.count_nonzero(t.w)) for t in loss.terms if t.kind == "l1")
        n2 = sum(int(np.count_nonzero(t.w)) for t in loss.terms if t.kind == "l2")
        ncells = int(sum(tree.cells))
        size = ncells + 2 * n1 + n2
        if size > MAX_LP_SIZE:
            raise ValueError(f"LocalPolytopeLP: {size:,} columns, above {MAX_LP_SIZE:,}")
        self.P, self.E_full, self.offsets = local_polytope_matrices(tree)
        # a free total: the total row leaves the program (``total`` is then only the unit)
        self.E = self.E_full[:-1] if self.free_total else self.E_full
        if self.P.shape[0] != loss.n:
            raise ValueError(f"LocalPolytopeLP: the loss has {loss.n} cells, the factors {self.P.shape[0]}")
        self.nx, self.n1, self.n2, self.m = ncells, n1, n2, self.E.shape[0]
        self.pure = n2 == 0
        N = self.total
        rows1, b1, w1, rows2, b2, w2 = [], [], [], [], [], []
        loss_rows1 = []                               # the L1 rows on the loss's cells (routed form)
        self._term_keep = []                          # per term: its rows with w > 0
        for t in loss.terms:
            A = sp.identity(loss.n, format="csr")[t.A] if isinstance(t.A, slice) else t.A
            AP = (A @ self.P).tocsr()
            keep = np.flatnonzero(t.w > 0)            # rows of weight zero play no part
            self._term_keep.append(keep)
            if t.kind == "l1":
                rows1.append(AP[keep])
                loss_rows1.append(sp.csr_matrix(A)[keep])
                b1.append(t.b[keep] / N)
                w1.append(t.w[keep])
            else:
                rows2.append(AP[keep])
                b2.append(t.b[keep] / N)
                w2.append(t.w[keep] * N)              # (N w/2) r~^2 per unit of N
        A1 = sp.vstack(rows1).tocsr() if rows1 else sp.csr_matrix((0, ncells))
        self._A1_loss = sp.vstack(loss_rows1).tocsr() if loss_rows1 else sp.csr_matrix((0, loss.n))
        self._routed_lp = None
        A2 = sp.vstack(rows2).tocsr() if rows2 else sp.csr_matrix((0, ncells))
        w1 = np.concatenate(w1) if w1 else np.zeros(0)
        w2 = np.concatenate(w2) if w2 else np.zeros(0)
        # objective scale: the loss of the uniform tables becomes one unit (an interior point
        # is not invariant to it in floating point: the complementarity must fall to
        # tol * objective; with the weights as the unit a loss much below N max(w) was lost)
        uni = np.concatenate([np.full(c, N / c) for c in tree.cells])
        f_uni = loss.value(self.P @ uni) - loss.constant
        self.scale = max(f_uni / N, 1e-300) if f_uni > 0 else \
            max(float(w1.max(initial=0.0)), float(w2.max(initial=0.0)), 1e-300)
        I1, I2 = sp.identity(n1, format="csr"), sp.identity(n2, format="csr")
        Z = sp.csr_matrix
        self.A = sp.bmat([[A1, -I1, I1, Z((n1, n2))],
                          [A2, Z((n2, n1)), Z((n2, n1)), -I2],
                          [self.E, Z((self.m, n1)), Z((self.m, n1)), Z((self.m, n2))]], format="csr")
        e = np.zeros(self.m)
        if not self.free_total:
            e[-1] = 1.0
        self.b = np.concatenate(b1 + b2 + [e]) if (b1 or b2) else e
        self.c = np.concatenate([np.zeros(ncells), w1, w1, np.zeros(n2)]) / self.scale
        self.q = np.concatenate([np.zeros(ncells + 2 * n1), w2 / self.scale])
        self.bounded = np.concatenate([np.ones(ncells + 2 * n1, bool), np.zeros(n2, bool)])
        self.w1 = w1

    # ------------------------------------------------------------------ solvers
    def _highs(self, time_limit: float):
        """HiGHS on the routed LP: the dual simplex on smaller models, then (or, on larger
        ones, at once) the interior point with crossover.  Measured on Adult's one- and two-way
        marginals (scipy 1.17; nonzeros before routing): 24,000 / 64,000 columns (107k / 166k
        nonzeros), dual simplex 0.34 / 0.87 s against interior point 2.6 / 3.8 s; with a
        59,500-cell clique under six marginals (97,000 columns, 795k nonzeros) the interior
        point took 21 s and the dual simplex had not finished in 60 s; routed (111,000
        columns, 265k nonzeros) 7.9 s and 9.9 s.  The routed nonzeros decide."""
        A = self._routed()[0]
        start = time.perf_counter()
        if A.nnz <= _SIMPLEX_MAX_NNZ:
            out = self._linprog("highs-ds", min(time_limit, _SIMPLEX_BUDGET))
            if out is not None:
                return out
        return self._linprog("highs-ipm", time_limit - (time.perf_counter() - start))

    def _linprog(self, method: str, time_limit: float):
        """HiGHS on the routed form of the LP (:meth:`_routed`), read back in the original
        variables and rows: ``(z, y, iterations)`` or ``None``."""
        opts = dict(primal_feasibility_tolerance=_HIGHS_TOL, dual_feasibility_tolerance=_HIGHS_TOL)
        if math.isfinite(time_limit):
            opts["time_limit"] = max(float(time_limit), 0.01)
        Ar, br, cr, nm = self._routed()
        res = linprog(cr, A_eq=Ar, b_eq=br, bounds=(0, None), method=method, options=opts)
        if res.status != 0 or res.x is None:
            return None
        nx = self.nx
        z = np.concatenate([res.x[:nx], res.x[nx + nm:]])
        y = np.asarray(res.eqlin.marginals)[nm:]
        return z, y, int(getattr(res, "nit", 0) or 0)

    def _routed(self):
        """The pure L1 program with the measured marginals ``m = P x`` as variables of their
        own, each summed from the smallest table that holds it -- another measured marginal of
        the same clique, or the clique -- and the separator and total rows likewise:

            m - R_m m - R_x x = 0,   A1 m - p + q = b1,   E_x x + E_m m = e,   x, m, p, q >= 0.

        The same feasible set in ``(x, p, q)`` (``m`` is ``P x`` there), with far fewer
        nonzeros when a large clique holds several measured marginals: a cell of the clique
        table enters only the largest ones (measured, Adult's 1-way + 2-way seed 0, a 59,500-cell
        clique under six marginals: 795,435 -> 265,319 nonzeros, HiGHS's interior point 26 s ->
        10 s).  Its multipliers are the original's: with ``y_E`` the routed ``E`` rows' and
        ``s_x, s_m`` the routed reduced costs, ``s_x + P^T s_m = P^T A1^T (-y1) - E^T y_E`` is
        the original reduced cost, non-negative and complementary to ``x`` (``s_m . m = s_m .
        P x``); ``y_R`` is dropped.  Returns ``(A, b, c, number of m variables)``: the original
        program (and zero) when routing does not cut the nonzeros (cliques not much larger than
        their marginals)."""
        if self._routed_lp is not None:
            return self._routed_lp
        tree, nx, nm, n1 = self.tree, self.nx, self.loss.n, self.n1
        fsz = [math.prod(tree.sizes[a] for a in f) for f in tree.factors]
        foff = np.concatenate([[0], np.cumsum(fsz)]).astype(np.int64)
        ncols = nx + nm + 2 * n1

        def block(start, width, M):                 # M on columns start .. start + width
            return sp.hstack([sp.csr_matrix((M.shape[0], start)), M,
                              sp.csr_matrix((M.shape[0], ncols - start - width))], format="csr")

        def source(clique, attrs):
            """The marginal on ``attrs`` from the smallest measured marginal of ``clique``
            strictly holding them, or from the clique's table."""
            held = [g for g, f in enumerate(tree.factors)
                    if tree.home[g] == clique and set(attrs) < set(f)]
            if held:
                g = min(held, key=lambda g: fsz[g])
                return block(nx + int(foff[g]), fsz[g], marginalizer(tree.sizes, tree.factors[g], attrs))
            return block(int(self.offsets[clique]), int(tree.cells[clique]),
                         marginalizer(tree.sizes, tree.cliques[clique], attrs))

        rows = [block(nx + int(foff[k]), fsz[k], sp.identity(fsz[k], format="csr"))
                - source(tree.home[k], f) for k, f in enumerate(tree.factors)]
        rows.append(sp.hstack([sp.csr_matrix((n1, nx)), self._A1_loss, -sp.identity(n1), sp.identity(n1)],
                              format="csr"))
        E = [source(i, tree.separators[i]) - source(tree.parent[i], tree.separators[i])
             for i in tree.preorder[1:]]
        if not self.free_total:
            E.append(source(tree.preorder[0], ()))
        A = sp.vstack(rows + E, format="csc")
        if A.nnz >= self.A.nnz:                     # small cliques: the m variables cost more
            self._routed_lp = (self.A.tocsc(), self.b, self.c, 0)
        else:
            self._routed_lp = (A, np.concatenate([np.zeros(nm), self.b]),
                               np.concatenate([np.zeros(nx + nm), self.c[nx:]]), nm)
        return self._routed_lp

    def _ipm(self, deadline: float):
        """Mehrotra predictor-corrector for ``min c^T z + 1/2 z^T diag(q) z, A z = b,
        z_B >= 0`` (``z`` free off ``B``, where ``q > 0``).  Returns ``(z, y, iterations)`` or
        ``None`` when it does not converge."""
        A, b, c, q, B = self.A.tocsr(), self.b, self.c, self.q, self.bounded
        AT = A.T.tocsr()
        nz, m = A.shape[1], A.shape[0]
        # start: uniform clique tables (consistent, total one), residual splits a margin apart
        z = np.zeros(nz)
        for i, (a, bb) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            z[a:bb] = 1.0 / (bb - a)
        n1, n2, nx = self.n1, self.n2, self.nx
        r0 = A[:n1 + n2] @ z                           # measurement rows (slacks still zero)
        r1 = r0[:n1] - b[:n1]
        margin = max(float(np.abs(r1).max(initial=0.0)), 1.0 / max(nx, 1))
        z[nx:nx + n1] = np.maximum(r1, 0.0) + margin
        z[nx + n1:nx + 2 * n1] = np.maximum(-r1, 0.0) + margin
        z[nx + 2 * n1:] = r0[n1:] - b[n1:n1 + n2]
        s = np.where(B, 1.0, 0.0)
        y = np.zeros(m)
        nb = int(B.sum())
        bnorm, cnorm = 1.0 + float(np.abs(b).max(initial=0.0)), 1.0 + float(np.abs(c).max(initial=0.0))
        ones_B = B.astype(float)
        units = self.total * self.scale                # loss units per unit of the objective

        def step_len(v, dv):
            neg = B & (dv < 0)
            return min(1.0, float(np.min(-v[neg] / dv[neg]))) if neg.any() else 1.0

        def accuracy():
            rp = b - A @ z
            rd = c + q * z - AT @ y - s
            pobj = float(np.dot(c, z) + 0.5 * np.dot(q * z, z))
            dobj = float(np.dot(b, y) - 0.5 * np.dot(q * z, z))
            # the gap relative to the objective, which can be tiny in these units:
            # one loss unit is the floor, as in the certificate's max(1, |f|)
            return rp, rd, max(float(np.abs(rp).max(initial=0.0)) / bnorm,
                               float(np.abs(rd).max(initial=0.0)) / cnorm,
                               abs(pobj - dobj) / max(abs(pobj), 1.0 / units))

        it, best, best_it = 0, (math.inf, None, None), 0
        kkt = _KKT(A, AT)
        for it in range(1, _IPM_MAX_ITERS + 1):
            rp, rd, acc = accuracy()
            mu = float(np.dot(z[B], s[B])) / max(nb, 1)
            if acc <= _IPM_TOL:
                return z, y, it
            if acc < best[0]:
                best, best_it = (acc, z.copy(), y.copy()), it
            elif it - best_it >= _IPM_STALL and best[0] <= _IPM_LOOSE_TOL:
                break
            if time.perf_counter() > deadline:
                return None
            zb = np.where(B, z, 1.0)
            dvec = q + np.where(B, s / zb, 0.0)
            for delta in _IPM_REGS:                    # dynamic regularisation: larger on failure
                if not kkt.factor(dvec, delta):
                    continue

                def solve(rc):
                    # -(Q + Z^-1 S) dz + A^T dy = rd - Z^-1 rc,  A dz = rp: the quasi-definite
                    # augmented system, regularised, refined against the exact one
                    sol = kkt.solve(np.concatenate([rd - np.where(B, rc / zb, 0.0), rp]))
                    dz, dy = sol[:nz], sol[nz:]
                    ds = np.where(B, (rc - s * dz) / zb, 0.0)
                    return dz, dy, ds

                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    dz, dy, ds = solve(-z * s * ones_B)    # (a failed factorisation: inf / nan)
                    ap, ad = step_len(z, dz), step_len(s, ds)
                    mu_aff = float(np.dot((z + ap * dz)[B], (s + ad * ds)[B])) / max(nb, 1)
                    sigma = (mu_aff / mu) ** 3 if mu > 0 else 0.0
                    rc = (sigma * mu - z * s - dz * ds) * ones_B
                    dz, dy, ds = solve(rc)
                if np.all(np.isfinite(dz)) and np.all(np.isfinite(dy)) and np.all(np.isfinite(ds)):
                    break
            else:
                break                                  # no regularisation gives a direction
            ap, ad = _IPM_STEP * step_len(z, dz), _IPM_STEP * step_len(s, ds)
            if q.any():                                # a QP: one step length for both
                ap = ad = min(ap, ad)
            z = z + ap * dz
            y = y + ad * dy
            s = s + ad * ds
            if max(ap, ad) < 1e-10:                    # stalled at roundoff
                break
        _, _, acc = accuracy()
        if acc < best[0]:
            best = (acc, z, y)
        return (best[1], best[2], it) if best[0] <= _IPM_LOOSE_TOL else None

    def solve(self, *, method: str = "auto", deadline: float = math.inf) -> LPResult | None:
        """Solve (``method`` ``"auto"``: HiGHS for a pure L1 loss, the interior point otherwise;
        ``"highs"`` needs a pure L1 loss; ``"ipm"`` takes any).  ``None`` if the solver fails
        or runs past ``deadline`` (``time.perf_counter()`` clock)."""
        if method == "auto":
            method = "highs" if self.pure else "ipm"
        if method == "highs" and not self.pure:
            raise ValueError("LocalPolytopeLP: HiGHS through scipy solves LPs only (the loss has L2 terms)")
        if method not in ("highs", "ipm"):
            raise ValueError(f"method must be 'auto', 'highs' or 'ipm', got {method!r}")
        out = self._highs(deadline - time.perf_counter()) if method == "highs" else self._ipm(deadline)
        if out is None and method == "highs" and time.perf_counter() < deadline:
            method = "ipm"                             # HiGHS failed: the interior point may not
            out = self._ipm(deadline)
        if out is None:
            return None
        z, y, iters = out
        N, nx, n1 = self.total, self.nx, self.n1
        u = z[:nx]
        if method == "ipm":                            # an interior point: its empty cells are tiny,
            u = np.where(u > _IPM_ZERO, u, 0.0)        # not zero (repair restores the sums)
        raw = [u[a:b].reshape(sh) * N for a, b, sh in zip(self.offsets[:-1], self.offsets[1:], self.tree.shapes)]
        # a free total: the fitted one, the root clique's sum (the others agree to tolerance)
        fitted = float(np.maximum(raw[self.tree.preorder[0]], 0.0).sum()) if self.free_total else N
        tables = repair(self.tree, raw, fitted)
        x = np.concatenate([t.ravel() for t in tables])
        repaired = float(np.abs(x - u * N).max(initial=0.0))
        mu = self.P @ x
        resid = float(np.abs(self.E @ x - N * self.b[-self.m:]).max(initial=0.0)) if self.m else 0.0
        # loss duals: lam1 = -scale y1 (clipped into the conjugate's domain), lam2 = W r at
        # the returned point; and, for L2 terms, the solver's own lam2 = -scale y2 as well
        lams, lams_y, k1, k2 = [], [], 0, n1
        for t, keep in zip(self.loss.terms, self._term_keep):
            if t.kind == "l1":
                lam = np.zeros(t.b.size)
                lam[keep] = np.clip(-self.scale * y[k1:k1 + keep.size], -t.w[keep], t.w[keep])
                k1 += keep.size
                lams.append(lam)
                lams_y.append(lam)
            else:
                lams.append(t.w * t.apply(mu))
                lam = np.zeros(t.b.size)
                lam[keep] = -self.scale * y[k2:k2 + keep.size]
                k2 += keep.size
                lams_y.append(lam)
        nu = self.scale * y[n1 + self.n2:]
        if self.free_total:                            # the total's multiplier: zero, as the
            nu = np.concatenate([nu, [0.0]])           # total is optimised (d loss* / d total = 0)
        g = self.loss.adjoint(lams)
        s = self.P.T @ g - self.E_full.T @ nu
        # the solver's own dual objective, in loss units (scaled problem times N * scale)
        z_obj = float(np.dot(self.b, y) - 0.5 * np.dot(self.q * z, z)) * N * self.scale + self.loss.constant
        return LPResult(x=tables, mu=mu, lams=lams, nu=nu, s=s, dual_bound=z_obj, method=method,
                        iterations=iters, residual=resid, repaired=repaired,
                        alt_lams=None if self.pure else lams_y)


class _KKT:
    """The Newton systems of :meth:`LocalPolytopeLP._ipm`: the regularised quasi-definite
    augmented system

        Kr = [ -(D + d I)   A^T ]
             [     A        d I ]        (D = Q + Z^{-1} S diagonal, d the regularisation)

    factorised either through its Schur complement, the normal equations
    ``M = A (D + d I)^{-1} A^T + d I`` (SPD), with ``dz = (D + d I)^{-1} (A^T dy - r1)``, or as it
    is (QDLDL with AMD either way).  Both solve the same system, and :meth:`solve` refines either
    against the exact one.  The normal equations come first: ``M`` couples only rows that share
    a junction-tree clique, while AMD on the augmented system was measured to fill in badly (a
    4,410-cell clique under four marginals, 8,381 rows: 5.3 s a factorisation against 0.02 s for
    ``M``).  As ``D`` spans 1e-20 .. 1e20 near an optimum the normal equations can lose accuracy
    (the primal residual was seen stuck at 1e-7): when their refined solution misses
    ``_NORMAL_TOL`` the augmented system is used from then on."""

    def __init__(self, A: sp.csr_matrix, AT: sp.csr_matrix) -> None:
        self.A, self.AT = A, AT
        self.normal = True
        self._nrm, self._aug = PatternLDL(), None
        self._levels: LevelCholesky | None = None       # the normal equations' dense way
        self._checked = False
        self._dvec, self._delta = np.zeros(A.shape[1]), 0.0

    def factor(self, dvec: np.ndarray, delta: float) -> bool:
        """Factorise ``Kr`` for the diagonal ``dvec`` (``D``) and ``delta``; ``False`` on a zero
        pivot.  ``M``'s pattern may lose entries that cancel: a new symbolic analysis then."""
        self._dvec, self._delta = dvec, delta
        m = self.A.shape[0]
        try:
            if self.normal:
                M = (self.A @ sp.diags(1.0 / (dvec + delta)) @ self.AT
                     + delta * sp.identity(m)).tocsc()
                if self._levels is not None:
                    # (all BLAS threads: one took 17.5 s against 15.7 s on that round)
                    return self._levels.factor(M)
                self._nrm.factor(M)
                self._choose_levels(M)
            else:                                      # one pattern: the symbolic analysis once
                Kr = sp.bmat([[sp.diags(-(dvec + delta)), self.AT],
                              [self.A, delta * sp.identity(m)]], format="csc")
                if self._aug is None:
                    self._aug = qdldl.Solver(Kr)
                else:
                    self._aug.update(Kr)
        except (RuntimeError, ValueError):
            return False
        return True

    def _choose_levels(self, M: sp.csc_matrix) -> None:
        """After the first sparse factorisation of the normal equations: when it is heavy and
        LAPACK's dense work on what independent sets leave is at most :data:`_LEVEL_RATIO`
        times QDLDL's (which runs at scalar speed, LAPACK at BLAS-3 speed),
        :class:`~cvxdp.solvers._level_cholesky.LevelCholesky` factorises from the
        next iteration on (measured on an AIM round's 3,661 rows: 6.5e8 multiply-adds for QDLDL,
        0.40 s; 2,440 rows left dense, 0.21 s)."""
        if self._checked:
            return
        self._checked = True
        flops = self._nrm.flops()
        if flops < _LEVEL_MIN_FLOPS:
            return
        lev = LevelCholesky(M)
        if lev.tail ** 3 / 3.0 <= _LEVEL_RATIO * flops and lev.factor(M):
            self._levels = lev                 # (factorised now: this iteration solves with it)

    def _normal_solve(self, v: np.ndarray) -> np.ndarray:
        if self._levels is not None:
            return self._levels.backward(self._levels.forward(v))
        return self._nrm.solve(v)

    def _apply(self, rhs: np.ndarray) -> np.ndarray:
        """``Kr^{-1} rhs`` from the current factorisation."""
        if not self.normal:
            return self._aug.solve(rhs)
        nz = self.A.shape[1]
        dinv = 1.0 / (self._dvec + self._delta)
        dy = self._normal_solve(rhs[nz:] + self.A @ (dinv * rhs[:nz]))
        return np.concatenate([dinv * (self.AT @ dy - rhs[:nz]), dy])

    def _times(self, sol: np.ndarray) -> np.ndarray:
        """The exact ``K sol``, ``K = [-D A^T; A 0]`` (never assembled: scipy's ``bmat`` of it
        took 2 s of an AIM round's 24 s interior point)."""
        nz = self.A.shape[1]
        return np.concatenate([-self._dvec * sol[:nz] + self.AT @ sol[nz:], self.A @ sol[:nz]])

    def _refined(self, rhs: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
        """Iterative refinement of ``K sol = rhs`` with the factorisation of ``Kr``: the
        solution and its residual (max norm)."""
        sol = self._apply(rhs)
        for _ in range(_IPM_REFINE):
            r = rhs - self._times(sol)
            if np.abs(r).max(initial=0.0) <= 1e-15 * scale:
                break
            sol = sol + self._apply(r)
        else:
            r = rhs - self._times(sol)
        return sol, float(np.abs(r).max(initial=0.0))

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """The solution of the exact system ``K sol = rhs`` (``K`` for the ``D`` of the last
        factorisation), refined; the normal equations give way to the augmented system (for
        good) when they miss ``_NORMAL_TOL`` (a failed factorisation then gives NaN, which the
        caller treats as such)."""
        scale = 1.0 + float(np.abs(rhs).max(initial=0.0))
        sol, res = self._refined(rhs, scale)
        if self.normal and not res <= _NORMAL_TOL * scale:
            self.normal = False
            if not self.factor(self._dvec, self._delta):
                return np.full(rhs.shape, np.nan)
            sol, _ = self._refined(rhs, scale)
        return sol


def lp_duals(pol: LPResult) -> dict[str, np.ndarray]:
    """``SolverResult.duals`` of an exact L1 / mixed solve (count units; see
    :mod:`cvxdp.solvers.marginal.lp`): the multipliers ``s >= 0`` of the junction-tree cells,
    ``nu`` of the consistency rows and the loss duals ``lam_t`` of the terms, concatenated."""
    return dict(local_nonneg=pol.s, local_consistency=pol.nu,
                loss=np.concatenate(pol.lams) if pol.lams else np.zeros(0))
