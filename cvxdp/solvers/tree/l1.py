"""Non-negative L1 (Laplace maximum likelihood) over a tree of histograms: ADMM, certified gap.

Problem (:mod:`cvxdp.solvers.tree.gls` for the model; Laplace noise of scale ``b`` gives the
weights ``w = 1 / b``)::

    minimize  F(x) = sum_blocks sum_v  sum_i w_i |(Q x_v - y_v)_i|
    subject to x consistent,  x_leaf >= 0.

Splitting (Boyd et al. 2011, section 6.4; the tree solve handles consistency exactly):
``r = Q x`` per block row, ``z = x_leaf``::

    x <- argmin_{x consistent} rho/2 ||Q x - (r - v)||^2 + rho/2 ||x_leaf - (z - u)||^2
         (one TreeGLS solve; its matrices do not change over the run)
    r <- y + soft(alpha Q x + (1 - alpha) r - y + v, w / rho)
    z <- max(0, alpha x_leaf + (1 - alpha) z + u)
    v, u <- the scaled dual updates.

Certificate.  *Primal*: the leaves ``z`` summed up the tree.  *Dual*: ``mu``, the scaled dual
``rho v`` clipped to ``|mu| <= w``, moved to a nearby dual-feasible point by the identity rows
(:mod:`cvxdp.solvers.tree.l1_bound`: the leaves' rows at their best values, what they cannot
make non-negative lifted by their ancestors' rows); the bound ``-mu^T y`` then needs the
a-priori box on the optimal leaves only where no row on the path can lift it.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from .. import result as R
from .._table import IterationTable
from .forest import Forest
from .gls import Block, TreeGLS
from .l1_bound import IdentityRows, dual_point
from .nonneg import NonnegSettings, _aggregate

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
    rows = IdentityRows(blocks, forest, k)
    r = [b.y.copy() for b in blocks]
    v = [np.zeros_like(b.y) for b in blocks]
    z = np.maximum(_start(forest, k, blocks), 0.0)
    u = np.zeros_like(z)
    table = IterationTable(_COLUMNS, s.verbose)
    table.header(f"cvxdp ADMM, non-negative L1 on a tree: {forest.n} units x {k} cells, rho {rho:.3g}")
    best_f, best_z, lower, history, status, it = math.inf, z, -math.inf, [], None, 0
    best_dual = None
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
        point = dual_point(forest, k, blocks, mus, rows, best_f)
        lower = max(lower, point.bound)
        if point.mu is not None and (best_dual is None or point.value > best_dual.value):
            best_dual = point            # the multipliers returned: the best dual-feasible one
        gap = R.relative_gap(best_f, lower)
        row = {"iter": it, "objective": best_f, "lower bnd": lower, "rel gap": gap, "rho": rho,
               "time [s]": time.perf_counter() - t0}
        status = R.record_check(row, history, table, s)
        if status is not None:
            break
    status = status or R.OPTIMAL_INACCURATE
    table.footer(f"status {status}: objective {best_f:.8e}, lower bound {lower:.8e}, {it} iterations")
    return R.SolverResult(x=_aggregate(forest, best_z, k), status=status, objective=best_f,
                          lower_bound=lower, gap=R.relative_gap(best_f, lower), iterations=it,
                          primal_residual=0.0, solve_time=time.perf_counter() - t0,
                          history=history,
                          info={"rho": rho, "dual_point": _certifying(best_dual, best_f, s.eps_rel)})


def _certifying(point, objective: float, eps_rel: float) -> np.ndarray | None:
    """The dual-feasible multiplier if its own bound certifies ``objective`` to ``eps_rel``
    (the run's best bound may come from a point that needed the box), else ``None``."""
    if point is None or R.relative_gap(objective, point.value) > eps_rel:
        return None
    return point.mu


def _default_rho(blocks, forest: Forest, k: int) -> float:
    """Ten times the L1 weight over a typical leaf cell's size.  Measured on a US-shaped tree
    (3,156 units x 64 cells, Laplace scales 2 and 10, gap 1e-4): 100-120 iterations at 10x,
    230 / 130 at 100x / 30x, 380-450 at 1x, 1,700 at 0.1x."""
    w = np.concatenate([b.w for b in blocks])
    leaf_vals = np.concatenate([np.abs(b.y[np.isin(b.nodes, forest.leaves)]).ravel() for b in blocks])
    if leaf_vals.size == 0:          # no leaf measured: the answers of the units that are
        leaf_vals = np.concatenate([np.abs(b.y).ravel() for b in blocks])
    typical = float(np.median(leaf_vals)) if leaf_vals.size else 1.0
    return _RHO_FACTOR * float(np.median(w)) / max(typical, 1.0)


def _start(forest: Forest, k: int, blocks) -> np.ndarray:
    """The least-squares estimate's leaves (a start: the L1 optimum is near it)."""
    try:
        return TreeGLS(forest, k, blocks).solve()[forest.leaves]
    except ValueError:
        return np.zeros((forest.leaves.size, k))
