"""Active-set polish of a quadratic marginal loss over the junction tree's local polytope.

Entropic mirror descent (:mod:`cvxdp.solvers.marginal.mirror_descent`) keeps every cell positive, so an
optimum with many empty cells is only approached in the limit.  For the Gaussian (``"l2"``)
losses the problem is a quadratic program in the junction-tree clique tables ``x``::

    minimize   1/2 r^T H r - c^T r           (r = P x: the measured marginals)
    subject to E x = e                        (separator consistency, total N)
               x >= 0,

with ``H = sum_t A_t^T W_t A_t`` and ``c = sum_t A_t^T W_t b_t``; for a junction tree the
local polytope ``{x >= 0, E x = e}`` is the marginal polytope (Wainwright & Jordan 2008,
prop. 2.1), so its optimum is the optimum of McKenna et al.'s problem.

Guessing the zero cells ``Z`` from a mirror-descent iterate, the polish solves the equality
constrained QP on the support ``S`` and corrects ``Z`` by the primal-dual active-set rule
(Hintermueller, Ito & Kunisch 2002): cells that came out negative leave ``S``; zero cells
whose multiplier ``s = P^T lam + E^T nu`` is negative join it.  When neither happens, the KKT
conditions hold and the point is optimal; the caller certifies it with the exact max-product
bound, which is tight there (``s >= 0`` is dual feasibility).

Linear algebra.  With ``D = [P_S; E_S]`` and multipliers ``y = (lam, nu)`` the KKT system of the
support problem is

    [ 0    0    D^T ] [x]   [0]
    [ 0    H   -J^T ] [r] = [c]          J = [I; 0]
    [ D   -J    0   ] [y]   [(0; e)]

singular in general (``x`` is not identified beyond its marginals; ``D`` has dependent rows).
As in OSQP's polish (Stellato et al. 2020, section 4) it is solved by iterative refinement
with the quasi-definite regularisation ``(delta I, H + delta I, -delta I)`` on the diagonal.
Eliminating ``x`` (its block is ``delta I``) leaves a system in ``(r, y)`` of the size of the
measurements plus the separators, with ``D D^T`` (sparse: two rows share cells only inside
one clique) in place of the clique tables: one sparse LDL^T per active-set round, never a matrix
over the cells.  Refinement moves ``x`` only within ``range(D^T)`` of its starting point (the mirror-descent
point, then each round's clipped solution), so a support problem's many solutions resolve to
the one closest to it, which is what keeps the cells of ``S`` positive.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import qdldl

from .junction_tree import JunctionTree, marginalizer
from .loss import MarginalLoss

__all__ = ["LocalPolytopeQP", "PolishResult", "MAX_POLISH_CELLS", "local_polytope_matrices"]

#: largest local polytope (junction-tree cells) the polish builds matrices for
MAX_POLISH_CELLS = 2 ** 24
# Regularisation of the quasi-definite KKT system (problem scaled to unit H and total).
_DELTA = 1e-4
# Iterative-refinement steps, and the residual (scaled units) at which they stop.
_REFINE_STEPS = 30
_REFINE_TOL = 1e-15
# Refinement residual above which a support problem counts as inconsistent.
_CONSISTENT_TOL = 1e-9
# Active-set rounds per polish attempt.
_MAX_ROUNDS = 30
# ... and an attempt stops early when the number of sign violations has not reached a new
# minimum for this many rounds (the rule can cycle on degenerate problems).
_STALL_ROUNDS = 6
# A cell counts as negative below -_X_TOL (fraction of the total), a multiplier below
# -_S_TOL * max |lam| (the certificate, not these, decides optimality).
_X_TOL = 1e-12
_S_TOL = 1e-9


def local_polytope_matrices(tree: JunctionTree):
    """``(P, E, offsets)`` of the junction tree's local polytope over the flat vector ``x`` of
    its clique tables (``tree.cliques`` order, each C order; clique ``i`` is
    ``x[offsets[i]:offsets[i+1]]``): ``P x`` stacks the factor marginals (``tree.factors``, each
    summed from its home clique), and ``E x = (0, ..., 0, N)`` says that every clique ``i`` in
    ``tree.preorder[1:]`` agrees with its parent on their separator (rows: marginal of ``i``
    minus marginal of the parent, separator cells in C order; one row for an empty separator)
    and that the root sums to ``N`` (last row).  Raises ``ValueError`` above
    :data:`MAX_POLISH_CELLS` cells."""
    offsets = np.concatenate([[0], np.cumsum(tree.cells)]).astype(np.int64)
    nx = int(offsets[-1])
    if nx > MAX_POLISH_CELLS:
        raise ValueError(f"local polytope: {nx:,} junction-tree cells, above {MAX_POLISH_CELLS:,}")

    def block(i, M):                      # M acting on clique i's cells, as a row block
        return sp.hstack([sp.csr_matrix((M.shape[0], int(offsets[i]))), M,
                          sp.csr_matrix((M.shape[0], nx - int(offsets[i + 1])))])

    P = [block(tree.home[k], marginalizer(tree.sizes, tree.cliques[tree.home[k]], f))
         for k, f in enumerate(tree.factors)]
    E = []
    for i in tree.preorder[1:]:
        p, sep = tree.parent[i], tree.separators[i]
        E.append(block(i, marginalizer(tree.sizes, tree.cliques[i], sep))
                 - block(p, marginalizer(tree.sizes, tree.cliques[p], sep)))
    root = tree.preorder[0]
    E.append(block(root, marginalizer(tree.sizes, tree.cliques[root], ())))
    Pm = sp.vstack(P).tocsr() if P else sp.csr_matrix((0, nx))
    return Pm, sp.vstack(E).tocsr(), offsets


@dataclass
class PolishResult:
    """A polished point: ``x`` the junction-tree clique tables (counts, >= 0), ``mu`` the
    loss's flat marginal vector ``P x``, ``rounds`` active-set rounds, ``support`` cells kept,
    ``residual`` the largest ``|E x - e|`` (consistency and total, counts)."""

    x: list[np.ndarray]
    mu: np.ndarray
    rounds: int
    support: int
    residual: float


class LocalPolytopeQP:
    """The quadratic program above for a junction tree and an all-``"l2"`` loss.

    ``loss`` acts on the stacked factor marginals (``tree.factors``, C order), as in
    :class:`cvxdp.solvers.marginal.mirror_descent.MarginalProblem`.
    """

    def __init__(self, tree: JunctionTree, loss: MarginalLoss, total: float, *,
                 free_total: bool = False) -> None:
        if not loss.smooth:
            raise ValueError("LocalPolytopeQP: the polish needs a quadratic (all 'l2') loss")
        self.tree, self.total = tree, float(total)
        nc = len(tree.cliques)
        self.P, E, self.offsets = local_polytope_matrices(tree)
        # a free total (the cone over the polytope): the total row goes; ``total`` is then
        # only the unit of the scaled problem, and the polished tables carry their own total
        self.free_total = bool(free_total)
        if self.free_total:
            E = E[:-1]
        nx = int(self.offsets[-1])
        self.n = loss.n
        self.m = E.shape[0]
        if self.P.shape[0] != self.n:
            raise ValueError(f"LocalPolytopeQP: the loss has {self.n} cells, the factors {self.P.shape[0]}")
        self.D = sp.vstack([self.P, E]).tocsc()
        H = sp.csr_matrix((self.n, self.n))
        c = np.zeros(self.n)
        for t in loss.terms:
            A = sp.identity(self.n, format="csr")[t.A] if isinstance(t.A, slice) else t.A
            H = H + A.T @ sp.diags(t.w) @ A
            c += A.T @ (t.w * t.b)
        # scale to unit curvature and unit total: x = N x~, objective / (N^2 h)
        h = max(float(abs(H).max()) if H.nnz else 0.0, 1e-300)
        self._H = (H / h).tocsc()
        self._c = c / (h * self.total)
        off = self._H - sp.diags(self._H.diagonal())
        self._h_diag = self._H.diagonal().copy() if off.count_nonzero() == 0 else None
        self._e = np.zeros(self.m)
        if not self.free_total:
            self._e[-1] = 1.0
        self.nx, self.nc = nx, nc

    def _factor(self, M: sp.csc_matrix):
        """Solver of the regularised system in ``(dr, w)`` (``dy = delta w``)

            (H + dI) dr - d J^T w = a,    -J dr - (M + d^2 I) w = b.

        For a diagonal ``H`` (identity measurements) ``dr`` is eliminated, leaving the SPD
        matrix ``M + d^2 I + d J (H + dI)^{-1} J^T``; otherwise the quasi-definite block
        matrix in ``(dr, dy)`` is factorised as it is.  Both are quasi-definite, so an LDL^T factorisation in
        any symmetric order exists: QDLDL with an AMD ordering (the factorisation OSQP uses)."""
        n, m, d = self.n, self.m, _DELTA
        if self._h_diag is not None:
            rinv = 1.0 / (self._h_diag + d)
            K = M + sp.diags(np.concatenate([d * rinv, np.zeros(m)]) + d * d, format="csc")
        else:
            Jm = sp.csc_matrix((np.ones(n), (np.arange(n), np.arange(n))), shape=(n + m, n))
            Hd = self._H + d * sp.identity(n, format="csc")
            # symmetric in (dr, dy): [H + dI, -J^T; -J, -(M / d + d I)]
            K = sp.bmat([[Hd, -Jm.T], [-Jm, -(M / d + d * sp.identity(n + m))]], format="csc")
        try:
            ldl = qdldl.Solver(K.tocsc())
        except RuntimeError:              # a zero pivot: the support problem is singular
            return None
        lu_solve = ldl.solve

        if self._h_diag is not None:
            def solve(a, b):
                w = lu_solve(-b - np.concatenate([rinv * a, np.zeros(m)]))
                return rinv * (a + d * w[:n]), w
        else:
            def solve(a, b):
                sol = lu_solve(np.concatenate([a, b]))
                return sol[:n], sol[n:] / d
        return solve

    def polish(self, x0: np.ndarray, *, threshold: float = 1e-6, max_rounds: int = _MAX_ROUNDS,
               deadline: float = math.inf) -> PolishResult | None:
        """Polish from ``x0`` (flat clique cells as fractions of the total, e.g. mirror-descent
        beliefs).  Cells below ``threshold`` start in ``Z``.  Returns ``None`` if the active
        set does not settle (``max_rounds``, no progress for a few rounds, or
        ``time.perf_counter()`` past ``deadline`` after a round) or a support problem is
        inconsistent."""
        x0 = np.asarray(x0, dtype=float)
        if x0.shape != (self.nx,) or not np.all(np.isfinite(x0)):
            raise ValueError(f"polish: x0 must be {self.nx} finite cells")
        n, m, d = self.n, self.m, _DELTA
        rhs_y = np.concatenate([np.zeros(n), self._e])
        support = x0 > threshold
        start = x0
        best, best_round = math.inf, 0
        for rounds in range(1, max_rounds + 1):
            idx = np.flatnonzero(support)
            DS = self.D[:, idx]
            DSt = DS.T.tocsr()
            M = (DS @ DSt).tocsc()
            solve = self._factor(M)
            if solve is None:             # exactly singular: give up this attempt
                return None
            xs = start[idx].copy()
            r = (DS @ xs)[:n]             # the measured marginals of the starting point
            y = np.zeros(n + m)
            prev = math.inf
            for _ in range(_REFINE_STEPS):
                ex = -(DSt @ y)
                er = self._c - (self._H @ r - y[:n])
                ey = rhs_y - (DS @ xs)
                ey[:n] += r
                res = max(np.abs(ex).max(initial=0.0), np.abs(er).max(), np.abs(ey).max())
                if res <= _REFINE_TOL or res > 0.5 * prev:
                    break
                prev = res
                dr, w = solve(er, ey - DS @ ex / d)
                xs += ex / d - DSt @ w
                r += dr
                y += d * w
            if res > _CONSISTENT_TOL:     # the support problem is inconsistent
                return None
            x = np.zeros(self.nx)
            x[idx] = xs
            s = self.D.T @ y              # multipliers of x >= 0 (zero on S up to roundoff)
            neg = support & (x < -_X_TOL)
            dneg = ~support & (s < -_S_TOL * max(np.abs(y[:n]).max(initial=0.0), 1e-300))
            if not neg.any() and not dneg.any():
                np.maximum(x, 0.0, out=x)
                x *= self.total
                resid = float(np.abs(self.D[n:] @ x - self.total * self._e).max(initial=0.0))
                tables = [x[a:b].reshape(shape) for a, b, shape in
                          zip(self.offsets[:-1], self.offsets[1:], self.tree.shapes)]
                return PolishResult(x=tables, mu=self.P @ x, rounds=rounds,
                                    support=int(support.sum()), residual=resid)
            violations = int(neg.sum() + dneg.sum())
            if violations < best:
                best, best_round = violations, rounds
            elif rounds - best_round >= _STALL_ROUNDS:
                return None
            if time.perf_counter() > deadline:
                return None
            if rounds - best_round >= 2:
                # no progress for two rounds (the active-set rule can cycle): move only the
                # worst half of the violating cells
                if neg.any():
                    cut = np.quantile(x[neg], 0.5)
                    neg &= x <= cut
                if dneg.any():
                    cut = np.quantile(s[dneg], 0.5)
                    dneg &= s <= cut
            support = (support & ~neg) | dneg
            start = np.maximum(x, 0.0)      # the next support problem corrects this point
        return None
