"""Non-negative L1 (Laplace maximum likelihood) over a tree of histograms: ADMM, certified gap.

Problem (:mod:`cvxdp.solvers.tree_gls` for the model; Laplace noise of scale ``b`` gives the
weights ``w = 1 / b``):

    minimize  F(x) = sum_blocks sum_v  sum_i w_i |(Q x_v - y_v)_i|
    subject to x consistent,  x_leaf >= 0.

Splitting (Boyd et al. 2011, section 6.4; the tree solve handles consistency exactly):
``r = Q x`` per block row, ``z = x_leaf``:

    x <- argmin_{x consistent} rho/2 ||Q x - (r - v)||^2 + rho/2 ||x_leaf - (z - u)||^2
         (one TreeGLS solve; its matrices do not change over the run)
    r <- y + soft(alpha Q x + (1 - alpha) r - y + v, w / rho)
    z <- max(0, alpha x_leaf + (1 - alpha) z + u)
    v, u <- the scaled dual updates.

Certificate.  *Primal*: the leaves ``z`` summed up the tree.  *Dual*: for ``|mu_i| <= w_i``,
``F(x) >= mu^T (Q x - y)``; summed over a consistent ``x`` the linear form is
``sum_leaves p_leaf^T x_leaf`` with ``p_leaf`` the sum of ``Q_v^T mu_v`` over the leaf and its
ancestors, so over ``0 <= x_leaf <= U``

    F* >= -mu^T y + sum_{leaf cells} min(0, p) U,

valid when ``U`` bounds the optimal leaves: a leaf cell measured by an identity row
``w |x - y|`` has ``x* <= y + F(z) / w`` (that term alone is at most the optimal loss, which a
feasible ``F(z)`` bounds); elsewhere ``U = inf`` (the bound is ``-inf`` if ``p < 0`` there).
``mu`` is the scaled dual ``rho v`` clipped to ``[-w, w]``; then each leaf cell's identity row
(its largest-weight one) is set to its best value given the rest of ``mu``: the least that keeps
``p >= 0`` when ``y > 0`` (each unit of ``mu`` costs ``y`` in ``-mu^T y``), ``w`` when ``y <= 0``.
The box, loose at national scale (``F`` is the whole tree's loss), then only meets what that
cannot fix.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from . import result as R
from ._table import IterationTable
from .tree import Forest
from .tree_gls import Block, TreeGLS
from .tree_nonneg import NonnegSettings, _aggregate

__all__ = ["solve_l1", "l1_objective"]

# default rho: this multiple of the weight over a typical leaf value (see _default_rho)
_RHO_FACTOR = 10.0

_COLUMNS = [("iter", "d"), ("objective", ".8e"), ("lower bnd", ".8e"), ("rel gap", ".2e"),
            ("rho", ".2e"), ("time [s]", ".2f")]


def l1_objective(blocks: Sequence[Block], x: np.ndarray) -> float:
    return float(sum(np.sum(b.w * np.abs(x[b.nodes] @ b.Q.T - b.y)) for b in blocks))


def solve_l1(forest: Forest, k: int, blocks: Sequence[Block],
             settings: NonnegSettings | None = None) -> R.SolverResult:
    """The ADMM of the module docstring (``blocks``' ``w`` are the L1 weights)."""
    s = settings or NonnegSettings()
    t0 = time.perf_counter()
    leaves = forest.leaves
    rho = s.rho if s.rho is not None else _default_rho(blocks, forest, k)
    unit = [Block(b.nodes, b.Q, np.ones_like(b.w), b.y) for b in blocks]
    solver = TreeGLS(forest, k, unit, prox=1.0)      # rho scales out of the x step
    leaf_rows = _LeafRows(blocks, forest, k)
    r = [b.y.copy() for b in blocks]
    v = [np.zeros_like(b.y) for b in blocks]
    z = np.maximum(_start(forest, k, blocks), 0.0)
    u = np.zeros_like(z)
    table = IterationTable(_COLUMNS, s.verbose)
    table.header(f"cvxdp ADMM, non-negative L1 on a tree: {forest.n} units x {k} cells, rho {rho:.3g}")
    best_f, best_z, lower, history, status, it = math.inf, z, -math.inf, [], None, 0
    for it in range(1, s.max_iters + 1):
        rhs = np.zeros((forest.n, k))
        for b, rb, vb in zip(blocks, r, v):
            b.scatter_add(rhs, (rb - vb) @ b.Q)
        rhs[leaves] += z - u
        x = solver.solve(rhs)
        for i, b in enumerate(blocks):
            qx = x[b.nodes] @ b.Q.T
            qh = s.alpha * qx + (1 - s.alpha) * r[i]
            d = qh + v[i] - b.y
            r[i] = b.y + np.sign(d) * np.maximum(np.abs(d) - b.w / rho, 0.0)
            v[i] += qh - r[i]
        xh = s.alpha * x[leaves] + (1 - s.alpha) * z
        z = np.maximum(xh + u, 0.0)
        u += xh - z
        if it % s.check_every and it < s.max_iters:
            continue
        f = l1_objective(blocks, _aggregate(forest, z, k))
        if f < best_f:
            best_f, best_z = f, z.copy()
        mus = [np.clip(rho * vb, -b.w, b.w) for b, vb in zip(blocks, v)]
        lower = max(lower, _bound(forest, k, blocks, mus, leaf_rows, best_f))
        gap = R.relative_gap(best_f, lower)
        row = {"iter": it, "objective": best_f, "lower bnd": lower, "rel gap": gap, "rho": rho,
               "time [s]": time.perf_counter() - t0}
        history.append(row)
        table.row(row)
        status = R.check_stop(row, eps_rel=s.eps_rel, callback=s.callback,
                              time_limit=s.time_limit, elapsed=row["time [s]"])
        if status is not None:
            break
    status = status or R.OPTIMAL_INACCURATE
    table.footer(f"status {status}: objective {best_f:.8e}, lower bound {lower:.8e}, {it} iterations")
    return R.SolverResult(x=_aggregate(forest, best_z, k), status=status, objective=best_f,
                          lower_bound=lower, gap=R.relative_gap(best_f, lower), iterations=it,
                          primal_residual=0.0, solve_time=time.perf_counter() - t0,
                          history=history, info={"rho": rho})


def _default_rho(blocks, forest: Forest, k: int) -> float:
    """Ten times the L1 weight over a typical leaf cell's size.  Measured on a US-shaped tree
    (3,156 units x 64 cells, Laplace scales 2 and 10, gap 1e-4): 100-120 iterations at 10x,
    230 / 130 at 100x / 30x, 380-450 at 1x, 1,700 at 0.1x."""
    w = np.concatenate([b.w for b in blocks])
    leaf_vals = [np.abs(b.y[np.isin(b.nodes, forest.leaves)]) for b in blocks]
    typical = float(np.median(np.concatenate([lv.ravel() for lv in leaf_vals]))) if leaf_vals else 1.0
    return _RHO_FACTOR * float(np.median(w)) / max(typical, 1.0)


def _start(forest: Forest, k: int, blocks) -> np.ndarray:
    """The least-squares estimate's leaves (a start: the L1 optimum is near it)."""
    try:
        return TreeGLS(forest, k, blocks).solve()[forest.leaves]
    except ValueError:
        return np.zeros((forest.leaves.size, k))


class _LeafRows:
    """For every leaf cell, its identity row ``w |x - y|`` of largest weight (block, row in the
    block, query), if it has one: where the dual point is repaired and the box is read."""

    def __init__(self, blocks, forest: Forest, k: int) -> None:
        pos = np.full(forest.n, -1)
        pos[forest.leaves] = np.arange(forest.leaves.size)
        shape = (forest.leaves.size, k)
        self.w = np.zeros(shape)
        self.y = np.full(shape, np.inf)
        self.block = np.full(shape, -1)
        self.row = np.zeros(shape, dtype=np.int64)
        self.query = np.zeros(shape, dtype=np.int64)
        for bi, b in enumerate(blocks):
            rows = np.flatnonzero(pos[b.nodes] >= 0)
            if rows.size == 0:
                continue
            leaf = pos[b.nodes[rows]]
            for qi, q in enumerate(b.Q):
                nz = np.flatnonzero(q)
                if nz.size != 1 or q[nz[0]] != 1.0:
                    continue
                j = int(nz[0])
                better = b.w[qi] > self.w[leaf, j]
                lb, rb = leaf[better], rows[better]
                self.w[lb, j] = b.w[qi]
                self.y[lb, j] = b.y[rb, qi]
                self.block[lb, j], self.row[lb, j], self.query[lb, j] = bi, rb, qi

    def box(self, F: float) -> np.ndarray:
        """``y + F / w`` per leaf cell (``inf`` without an identity row)."""
        with np.errstate(divide="ignore"):
            return np.where(self.w > 0, self.y + F / np.where(self.w > 0, self.w, 1.0), np.inf)


def _bound(forest: Forest, k: int, blocks, mus, leaf: _LeafRows, F: float) -> float:
    """``-mu^T y + sum min(0, p) U`` (module docstring), after setting ``mu`` on the leaves'
    identity rows to their best values given the rest (the bound is separable in them)."""
    c = np.zeros((forest.n, k))
    for b, mu in zip(blocks, mus):
        b.scatter_add(c, mu @ b.Q)
    # path sums from the roots down: every leaf's cells see all their ancestors' terms
    for d in range(1, forest.n_levels):
        lo, hi = forest.level_bounds[d], forest.level_bounds[d + 1]
        units = forest.order[lo:hi]
        c[units] += c[forest.parent[units]]
    p = c[forest.leaves]
    has = leaf.block >= 0
    if has.any():
        li, j = np.nonzero(has)
        bi, ri, qi = leaf.block[li, j], leaf.row[li, j], leaf.query[li, j]
        for b_idx in np.unique(bi):
            sel = bi == b_idx
            mu, w = mus[int(b_idx)], blocks[int(b_idx)].w[qi[sel]]
            cur = mu[ri[sel], qi[sel]]
            other = p[li[sel], j[sel]] - cur
            y = leaf.y[li[sel], j[sel]]
            # the best value of this coordinate given the others: as low as keeps p >= 0 when
            # y > 0 (each unit lowers -mu y by y), as high as allowed when y <= 0
            best = np.clip(np.where(y > 0, -other, w), -w, w)
            mu[ri[sel], qi[sel]] = best
            p[li[sel], j[sel]] = other + best
    const = -float(sum(np.sum(mu * b.y) for b, mu in zip(blocks, mus)))
    U = leaf.box(F)
    neg = p < 0
    if np.any(neg & ~np.isfinite(U)):
        return -math.inf
    return const + float(np.sum(np.where(neg, p * np.where(np.isfinite(U), U, 0.0), 0.0)))
