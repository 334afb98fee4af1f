"""A histogram at every unit of a tree, read from the arrays of a consistency problem.

The plain cvxpy spelling of a geography with a ``k``-cell histogram per unit is one variable
``X`` of shape ``(n, k)``, the Kronecker-structured consistency ``C @ X == 0`` (``C`` the
units' parent-minus-children matrix, acting on every cell column alike), squared losses whose
rows each read one unit's cells (``X[level] @ Q.T - Y`` per level, any ``Q``), optionally
``X >= 0`` and exact invariants (rows reading one unit's cells).  :func:`detect` finds that
structure in :class:`~cvxdp.solvers.admm_problem.ConsistencyData` (flat column-major ``x``:
entry ``(v, j)`` at ``v + n j``) and returns the tree, the measurement blocks and the
invariants; :func:`solve` runs the exact GLS (:mod:`cvxdp.solvers.tree_gls`) or, with
non-negativity, the tree ADMM (:mod:`cvxdp.solvers.tree_nonneg`) and hands back a result
over the flat vector with the multipliers of the rows it was given.

Multipliers.  With ``g = grad f`` per unit, the Lagrangian
``f(x) + sum_p nu_p^T (x_p - sum_c x_c) - sum_v lam_v^T x_v`` is stationary when, from the
roots down, ``nu_root = -g_root``, ``nu_v = nu_parent - g_v`` at inner units and
``lam_leaf = g_leaf - nu_parent`` at leaves (``lam = 0`` at inner units, whose
non-negativity the leaves' implies); without invariants these are exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from . import result as R
from .tree import Forest
from .tree_gls import Block, Invariant, TreeGLS
from .tree_nonneg import NonnegSettings, objective, solve_nonneg

__all__ = ["HistogramTree", "detect", "solve"]

# a leaf multiplier may be this far (relative to the loss gradient) below zero, or, without
# bounds, from zero: rounding of the exact passes and the ADMM's last step
_DUAL_TOL = 1e-7


@dataclass
class HistogramTree:
    """What :func:`detect` read: the tree, ``k`` cells per unit, the blocks, the invariants,
    whether the leaves are non-negative, and which rows of ``A`` are consistency rows (unit
    ``p``, cell ``j``) -- for the multipliers."""

    forest: Forest
    n_units: int
    k: int
    blocks: list[Block]
    invariants: list[Invariant]
    nonneg: bool
    cons_rows: np.ndarray          # rows of A that state consistency
    cons_unit: np.ndarray          # ... their parent unit
    cons_cell: np.ndarray          # ... and cell
    cons_sign: np.ndarray          # ... +1 for x_p - sum x_c, -1 for sum x_c - x_p
    n_rows: int                    # rows of A


def detect(data, shape: tuple[int, int] | None) -> HistogramTree | None:
    """The structure of the module docstring, or ``None`` (then the general ADMM runs)."""
    if shape is None or len(shape) != 2 or data.has_chains or data.A is None:
        return None
    n, k = int(shape[0]), int(shape[1])
    if n * k != data.n or n < 2 or np.any(data.w1 > 0) or np.any(np.isfinite(data.upper)):
        return None
    A = sp.csr_matrix(data.A)
    found = _consistency_rows(A, data.b, n, k)
    if found is None:
        return None
    parent, rows, units, cells, signs = found
    try:
        forest = Forest(parent)
    except ValueError:
        return None
    nonneg = _nonneg(data.lower, forest, n, k)
    if nonneg is None:
        return None
    rest = np.setdiff1d(np.arange(A.shape[0]), rows)
    invariants = _row_groups(A[rest], data.b[rest], n, k, Invariant) if rest.size else []
    blocks = _row_groups(data.M, data.y, n, k, Block, data.w2)
    if invariants is None or blocks is None:
        return None
    tree = HistogramTree(forest, n, k, blocks, invariants, nonneg, rows, units, cells, signs,
                         A.shape[0])
    return tree if _leaves_determined(tree) else None


def _consistency_rows(A: sp.csr_matrix, b: np.ndarray, n: int, k: int):
    """Rows ``x_p - sum_c x_c = 0`` within one cell column, the same parents in every
    column: ``(parent, rows, parent unit, cell)`` or ``None``."""
    indptr, idx, val = A.indptr, A.indices, A.data
    parent = np.full(n, -1, dtype=np.int64)
    seen: set[tuple[int, int]] = set()
    rows, units, cells, signs = [], [], [], []
    children: dict[int, tuple] = {}
    for r in range(A.shape[0]):
        cols, vals = idx[indptr[r]:indptr[r + 1]], val[indptr[r]:indptr[r + 1]]
        if b[r] != 0 or cols.size < 2:
            continue
        sign = 1.0 if np.count_nonzero(vals == 1) == 1 else -1.0
        if np.count_nonzero(vals == sign) != 1 or np.count_nonzero(vals == -sign) != cols.size - 1:
            continue
        cell = cols // n
        if np.any(cell != cell[0]):
            continue
        head = int(cols[vals == sign][0] % n)
        kids = tuple(sorted(int(c) for c in cols[vals == -sign] % n))
        if children.setdefault(head, kids) != kids or (head, int(cell[0])) in seen:
            return None
        seen.add((head, int(cell[0])))
        rows.append(r)
        units.append(head)
        cells.append(int(cell[0]))
        signs.append(sign)
    if not children or len(seen) != len(children) * k:
        return None                  # some parent is not consistent in every cell column
    for head, kids in children.items():
        if np.any(parent[list(kids)] >= 0):
            return None
        parent[list(kids)] = head
    return parent, np.array(rows), np.array(units), np.array(cells), np.array(signs)


def _nonneg(lower: np.ndarray, forest: Forest, n: int, k: int) -> bool | None:
    """``True`` when every leaf cell is bounded below by zero (other bounds zero or none),
    ``False`` for no bounds, ``None`` for anything else."""
    lo = lower.reshape(k, n).T                        # (unit, cell)
    if np.all(np.isneginf(lo)):
        return False
    if not np.all((lo == 0) | np.isneginf(lo)):
        return None
    return bool(np.all(lo[forest.leaves] == 0))


def _row_groups(M, y: np.ndarray, n: int, k: int, kind, w: np.ndarray | None = None):
    """Rows reading one unit's cells, grouped into blocks of units with equal rows."""
    M = sp.csr_matrix(M)
    per_unit: dict[int, list[int]] = {}
    for r in range(M.shape[0]):
        cols = M.indices[M.indptr[r]:M.indptr[r + 1]]
        if cols.size == 0:
            return None
        unit = cols % n
        if np.any(unit != unit[0]):
            return None
        per_unit.setdefault(int(unit[0]), []).append(r)
    groups: dict[bytes, list] = {}
    for unit, rs in per_unit.items():
        Q = np.zeros((len(rs), k))
        for i, r in enumerate(rs):
            cols = M.indices[M.indptr[r]:M.indptr[r + 1]]
            Q[i, cols // n] = M.data[M.indptr[r]:M.indptr[r + 1]]
        ww = None if w is None else w[rs]
        key = Q.tobytes() + (b"" if ww is None else ww.tobytes())
        g = groups.setdefault(key, [Q, ww, [], []])
        g[2].append(unit)
        g[3].append(y[rs])
    out = []
    for Q, ww, units, ys in groups.values():
        if kind is Block:
            out.append(Block(np.array(units), Q, ww, np.array(ys)))
        else:
            out.append(Invariant(np.array(units), Q, np.array(ys)))
    return out


def _leaves_determined(tree: HistogramTree) -> bool:
    info = np.zeros((tree.n_units, tree.k, tree.k))
    leaf = np.zeros(tree.n_units, dtype=bool)
    leaf[tree.forest.leaves] = True
    for b in tree.blocks:
        sel = leaf[b.nodes]
        if sel.any():
            np.add.at(info, b.nodes[sel], b.info)
    for v in tree.forest.leaves:
        if np.linalg.matrix_rank(info[v]) < tree.k:
            return False
    return True


def solve(tree: HistogramTree, *, eps_rel: float, max_iters: int, time_limit: float,
          verbose: bool, callback) -> R.SolverResult:
    """GLS (no bounds) or non-negative GLS (ADMM); the result over the flat vector."""
    f, k, n = tree.forest, tree.k, tree.n_units
    if tree.nonneg:
        if tree.invariants:
            return None            # the tree ADMM has no invariants yet: the general path runs
        res = solve_nonneg(f, k, tree.blocks, NonnegSettings(
            eps_rel=eps_rel, max_iters=max_iters, time_limit=time_limit, verbose=verbose,
            callback=callback))
        X = res.x
    else:
        g = TreeGLS(f, k, tree.blocks, tree.invariants)
        X = g.solve()
        fval = objective(tree.blocks, X)
        res = R.SolverResult(x=None, status=R.OPTIMAL, objective=fval, lower_bound=fval,
                             gap=0.0, iterations=1, info={"splitting": "tree GLS (exact)"})
    res.x = X.ravel(order="F")
    res.info["splitting"] = "histogram tree" + (" (non-negative ADMM)" if tree.nonneg else " GLS")
    if not tree.invariants and res.status == R.OPTIMAL:
        if tree.nonneg:
            lam = np.zeros((n, k))
            lam[f.leaves] = res.duals.get("nonneg", 0.0)
            duals, ok = _multipliers(tree, res.info.pop("bound_point"), lam)
        else:
            duals, ok = _multipliers(tree, X, None)
        res.info["duals_certified"] = ok
        if ok:
            res.duals = duals
    res.primal_residual = 0.0
    return res


def _multipliers(tree: HistogramTree, X: np.ndarray,
                 lam: np.ndarray | None) -> tuple[dict[str, np.ndarray], bool]:
    """``eq`` (one per row of ``A``: the consistency rows' ``nu``) and ``lower`` (per flat
    coordinate: ``lam``, the bound multipliers of the leaves) of the module docstring, read
    off a point ``X`` at which ``f - lam^T x`` is stationary over consistent trees (the GLS
    solution, or the minimiser behind the non-negative run's certified bound), and whether
    they certify: the leaves' stationarity residual must be rounding, so that the Lagrangian's
    value is the bound the solver certified."""
    f, n, k = tree.forest, tree.n_units, tree.k
    g = np.zeros((n, k))
    for b in tree.blocks:
        np.add.at(g, b.nodes, ((X[b.nodes] @ b.Q.T - b.y) * b.w) @ b.Q)
    if lam is not None:
        g -= lam
    nu = np.zeros((n, k))
    resid = np.zeros((n, k))
    order = f.order
    for d in range(f.n_levels):
        units = order[f.level_bounds[d]:f.level_bounds[d + 1]]
        par = f.parent[units]
        base = np.where((par >= 0)[:, None], nu[np.maximum(par, 0)], 0.0)
        internal = f.is_internal[units]
        nu[units[internal]] = base[internal] - g[units[internal]]
        resid[units[~internal]] = g[units[~internal]] - base[~internal]
    eq = np.zeros(tree.n_rows)
    eq[tree.cons_rows] = tree.cons_sign * nu[tree.cons_unit, tree.cons_cell]
    out = {"eq": eq}
    if lam is not None:
        out["lower"] = lam.ravel(order="F")
    scale = max(1.0, float(np.abs(g).max(initial=0.0)))
    return out, float(np.max(np.abs(resid), initial=0.0)) <= _DUAL_TOL * scale
