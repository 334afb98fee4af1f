"""A histogram at every unit of a tree, read from the arrays of a consistency problem.

The plain cvxpy spelling of a geography with a ``k``-cell histogram per unit is one variable
``X`` of shape ``(n, k)``, the Kronecker-structured consistency ``C @ X == 0`` (``C`` the
units' parent-minus-children matrix, acting on every cell column alike), squared losses whose
rows each read one unit's cells (``X[level] @ Q.T - Y`` per level, any ``Q``), optionally
``X >= 0`` and exact invariants (rows reading one unit's cells); or absolute losses (Laplace) with ``X >= 0``.
:func:`detect` finds that
structure in :class:`~cvxdp.solvers.consistency.problem.ConsistencyData` (flat column-major ``x``:
entry ``(v, j)`` at ``v + n j``) and returns the tree, the measurement blocks and the
invariants; :func:`solve` runs the exact GLS (:mod:`cvxdp.solvers.tree.gls`) or, with
non-negativity, the tree ADMM (:mod:`cvxdp.solvers.tree.nonneg`; absolute losses:
:mod:`cvxdp.solvers.tree.l1`) and hands back a result
over the flat vector with the multipliers of the rows it was given.

Multipliers.  With ``g = grad f`` per unit, the Lagrangian
``f(x) + sum_p nu_p^T (x_p - sum_c x_c) - sum_v lam_v^T x_v`` is stationary when, from the
roots down, ``nu_root = -g_root``, ``nu_v = nu_parent - g_v`` at inner units and
``lam_leaf = g_leaf - nu_parent`` at leaves (``lam = 0`` at inner units, whose
non-negativity the leaves' implies); without invariants these are exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import result as R
from .problem import memoised
from ..tree.forest import Forest
from ..tree.gls import Block, Invariant, TreeGLS
from ..tree.l1 import solve_l1
from ..tree.l1_bound import leaf_sums, unit_terms
from ..tree.nonneg import NonnegSettings, objective, solve_nonneg

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
    l1: bool                       # absolute losses (the blocks' w are L1 weights)
    cons_rows: np.ndarray          # rows of A that state consistency
    cons_unit: np.ndarray          # ... their parent unit
    cons_cell: np.ndarray          # ... and cell
    cons_sign: np.ndarray          # ... +1 for x_p - sum x_c, -1 for sum x_c - x_p
    n_rows: int                    # rows of A


def detect(data, shape: tuple[int, int] | None) -> HistogramTree | None:
    """The structure of the module docstring, or ``None`` (then the general ADMM runs);
    read once per problem (``solver=None``'s cost model reads it before the solver)."""
    if shape == data.shape:
        return memoised(data, "histogram_tree", lambda d: _detect(d, shape))
    return _detect(data, shape)


def _detect(data, shape: tuple[int, int] | None) -> HistogramTree | None:
    if shape is None or len(shape) != 2 or data.has_chains or data.A is None:
        return None
    n, k = int(shape[0]), int(shape[1])
    l1 = bool(np.any(data.w1 > 0))
    if n * k != data.n or n < 2 or np.any(np.isfinite(data.upper)) or (l1 and np.any(data.w2 > 0)):
        return None                  # mixed L1 + L2 losses take the general ADMM
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
    blocks = _row_groups(data.M, data.y, n, k, Block, data.w1 if l1 else data.w2,
                         starts=data.loss_starts)
    if invariants is None or blocks is None:
        return None
    if l1 and (not nonneg or invariants):
        return None                  # the tree L1 ADMM needs x >= 0 and has no invariants
    tree = HistogramTree(forest, n, k, blocks, invariants, nonneg, l1, rows, units, cells, signs,
                         A.shape[0])
    return tree


def _row_stats(M: sp.csr_matrix, n: int):
    """Per row of ``M`` (no empty rows): ``(unit, cell_lo, cell_hi, unit_hi)`` of its entries
    (``unit = column % n``, ``cell = column // n``)."""
    starts = M.indptr[:-1]
    unit = M.indices % n
    cell = M.indices // n
    return (np.minimum.reduceat(unit, starts), np.minimum.reduceat(cell, starts),
            np.maximum.reduceat(cell, starts), np.maximum.reduceat(unit, starts))


def _consistency_rows(A: sp.csr_matrix, b: np.ndarray, n: int, k: int):
    """Rows ``x_p - sum_c x_c = 0`` (or its negative) within one cell column, the same
    children in every column: ``(parent, rows, parent unit, cell, sign)`` or ``None``."""
    nnz = np.diff(A.indptr)
    if A.nnz == 0 or np.any(nnz == 0):
        return None
    starts = A.indptr[:-1]
    plus = np.add.reduceat((A.data == 1).astype(np.int64), starts)
    minus = np.add.reduceat((A.data == -1).astype(np.int64), starts)
    _, clo, chi, _ = _row_stats(A, n)
    sign = np.where(plus == 1, 1.0, -1.0)
    ok = (b == 0) & (nnz >= 2) & (clo == chi) & (plus + minus == nnz) & \
        (((plus == 1) & (minus == nnz - 1)) | ((minus == 1) & (plus == nnz - 1)))
    rows = np.flatnonzero(ok)
    if rows.size == 0:
        return None
    entry_row = np.repeat(np.arange(A.shape[0]), nnz)
    entry_sign = sign[entry_row]
    is_head = A.data == entry_sign
    sel = ok[entry_row]
    head_entries = sel & is_head
    kid_entries = sel & ~is_head
    head_unit = np.full(A.shape[0], -1, dtype=np.int64)
    head_unit[entry_row[head_entries]] = A.indices[head_entries] % n
    # int64: scipy's int32 indices would overflow in kids_unit * n for n > 46,340 units
    kids_unit = A.indices[kid_entries].astype(np.int64) % n
    kids_parent = head_unit[entry_row[kid_entries]]
    key = np.unique(kids_unit * n + kids_parent)
    pairs = np.stack([key // n, key % n], axis=1)
    if np.unique(pairs[:, 0]).size != pairs.shape[0]:
        return None                  # a unit under two parents
    parent = np.full(n, -1, dtype=np.int64)
    parent[pairs[:, 0]] = pairs[:, 1]
    heads = head_unit[rows]
    cells = clo[rows]
    hc = np.unique(heads * k + cells)
    n_heads = np.unique(heads).size
    n_kids = np.bincount(pairs[:, 1], minlength=n)
    # every parent in every cell column, once, with all of its children each time
    if hc.size != rows.size or rows.size != n_heads * k or kids_unit.size != int(n_kids.sum()) * k:
        return None
    return parent, rows, heads, cells, sign[rows]


def _nonneg(lower: np.ndarray, forest: Forest, n: int, k: int) -> bool | None:
    """``True`` when every leaf cell is bounded below by zero (other bounds zero or none),
    ``False`` for no bounds, ``None`` for anything else."""
    lo = lower.reshape(k, n).T                        # (unit, cell)
    if np.all(np.isneginf(lo)):
        return False
    if not np.all((lo == 0) | np.isneginf(lo)):
        return None
    return bool(np.all(lo[forest.leaves] == 0))


def _row_ids(T: np.ndarray) -> np.ndarray:
    """An id per row of ``T`` (equal rows, equal ids; ``0 ..``).  Rows are keyed by two
    random projections, the keys ranked column by column, and the grouping checked exactly
    (every row equal to its group's first); a collision -- two different rows with equal
    keys, which would need an exact floating-point coincidence -- falls back to one
    lexicographic sort."""
    n = T.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if T.shape[1] > 2:
        proj = np.random.default_rng(2024).standard_normal((T.shape[1], 2))
        keys = np.asarray(T, dtype=float) @ proj
    else:
        keys = np.asarray(T, dtype=float)
    ids = np.zeros(n, dtype=np.int64)
    for j in range(keys.shape[1]):
        _, rank = np.unique(keys[:, j], return_inverse=True)
        _, ids = np.unique(ids * (int(rank.max()) + 1) + rank.ravel(), return_inverse=True)
        ids = ids.ravel()
    first = np.full(int(ids.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, ids, np.arange(n))
    if np.array_equal(T, T[first[ids]]):
        return ids.astype(np.int64, copy=False)
    order = np.lexsort(T.T[::-1])
    new = np.r_[True, np.any(T[order][1:] != T[order][:-1], axis=1)]
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _row_groups(M, y: np.ndarray, n: int, k: int, kind, w: np.ndarray | None = None,
                starts: np.ndarray | None = None):
    """Rows reading one unit's cells, grouped into blocks of units with the same rows (same
    cells, coefficients and weights, in the same order); ``None`` if a row reads several
    units.  Loss terms (rows ``starts[t]`` on) of the form ``X[units] @ Q.T - Y`` are read
    off whole (:func:`_term_block`); other rows are told apart by random projections of
    their coefficients (a collision would need two different rows to agree on three
    independent random sums)."""
    M = sp.csr_matrix(M)
    if M.shape[0] == 0:
        return []
    if np.any(np.diff(M.indptr) == 0):
        return None
    unit, _, _, uhi = _row_stats(M, n)
    if np.any(unit != uhi):
        return None
    out, rest = [], np.arange(M.shape[0])
    if starts is not None and kind is Block:
        out, rest = _term_blocks(M, y, np.asarray(w, dtype=float), unit, n, k, starts)
    if rest.size == M.shape[0]:
        return out + _grouped(M, y, w, unit, n, k, kind)
    if rest.size:
        out += _grouped(M[rest], y[rest], np.asarray(w)[rest], unit[rest], n, k, kind)
    return out


def _term_blocks(M: sp.csr_matrix, y, w, unit, n: int, k: int, starts):
    """``(blocks, other rows)``: a block for each loss term whose rows have the Kronecker
    layout of ``X[units] @ Q.T`` in cvxpy's column-major order (row ``i + m j`` reads unit
    ``units[i]`` through ``Q[j]``), checked entry by entry."""
    ends = np.r_[starts[1:], M.shape[0]]
    cell = M.indices // n
    blocks, rest = [], []
    for s, e in zip(starts.tolist(), ends.tolist()):
        b = _term_block(M, y, w, unit, cell, k, s, e)
        if b is None:
            rest.append(np.arange(s, e))
        else:
            blocks.append(b)
    return blocks, np.concatenate(rest) if rest else np.zeros(0, dtype=np.int64)


def _term_block(M: sp.csr_matrix, y, w, unit, cell, k: int, s: int, e: int) -> Block | None:
    """Rows ``s:e`` as one :class:`Block`, or ``None`` when they are not laid out as
    ``m`` distinct units repeated once per query, each query's rows alike."""
    u = unit[s:e]
    again = np.flatnonzero(u[1:] == u[0])
    m = int(again[0]) + 1 if again.size else e - s
    if (e - s) % m:
        return None
    q = (e - s) // m
    grid = u.reshape(q, m)
    nnz = np.diff(M.indptr[s:e + 1]).reshape(q, m)
    ww = w[s:e].reshape(q, m)
    if np.any(grid != grid[0]) or np.unique(grid[0]).size != m or np.any(nnz != nnz[:, :1]) \
            or np.any(ww != ww[:, :1]):
        return None
    lo, hi = int(M.indptr[s]), int(M.indptr[e])
    rows = np.repeat(np.arange(s, e), nnz.ravel())
    offset = np.arange(lo, hi) - M.indptr[rows]
    head = M.indptr[s + (rows - s) // m * m] + offset     # the same entry of the query's first row
    if not (np.array_equal(M.data[lo:hi], M.data[head]) and np.array_equal(cell[lo:hi], cell[head])):
        return None
    first = s + m * np.arange(q)
    he = np.repeat(M.indptr[first], nnz[:, 0]) + \
        (np.arange(int(nnz[:, 0].sum())) - np.repeat(np.cumsum(nnz[:, 0]) - nnz[:, 0], nnz[:, 0]))
    Q = np.zeros((q, k))
    np.add.at(Q, (np.repeat(np.arange(q), nnz[:, 0]), cell[he]), M.data[he])
    return Block(grid[0], Q, ww[:, 0], y[s:e].reshape(q, m).T)


def _grouped(M: sp.csr_matrix, y, w, unit, n: int, k: int, kind):
    """Rows grouped by unit and coefficient pattern (the general case of :func:`_row_groups`)."""
    rng = np.random.default_rng(12345)
    proj = rng.standard_normal((3, k))
    cell = M.indices // n
    starts = M.indptr[:-1]
    sig = [np.add.reduceat(M.data * proj[i][cell], starts) for i in range(3)]
    sig.append(np.diff(M.indptr).astype(float))
    if w is not None:
        sig.append(np.asarray(w, dtype=float))
    pattern = _row_ids(np.round(np.stack(sig, axis=1), 12))
    order = np.argsort(unit, kind="stable")
    units_sorted = unit[order]
    bounds = np.flatnonzero(np.r_[True, units_sorted[1:] != units_sorted[:-1], True])
    counts = np.diff(bounds)
    out = []
    for m in np.unique(counts):
        which = np.flatnonzero(counts == m)
        rows = order[bounds[which][:, None] + np.arange(m)[None, :]]      # (units, m)
        group = _row_ids(pattern[rows])
        for g in range(int(group.max()) + 1):
            rs = rows[group == g]
            first = rs[0]
            Q = np.zeros((m, k))
            for i, r in enumerate(first):
                lo, hi = M.indptr[r], M.indptr[r + 1]
                Q[i, cell[lo:hi]] = M.data[lo:hi]
            units = unit[rs[:, 0]]
            ys = y[rs]
            if kind is Block:
                out.append(Block(units, Q, np.asarray(w)[first], ys))
            else:
                out.append(Invariant(units, Q, ys))
    return out


#: what :func:`solve` reports as ``info["route"]``
ROUTE_GLS = "tree GLS (exact)"
ROUTE_NONNEG = "tree ADMM (non-negative GLS)"
ROUTE_L1 = "tree ADMM (non-negative L1)"


def solve(tree: HistogramTree, *, eps_rel: float, max_iters: int, time_limit: float,
          verbose: bool, callback) -> R.SolverResult | None:
    """GLS (no bounds), non-negative GLS or non-negative L1 (ADMM with exact tree steps); the
    result over the flat vector, or ``None`` when the tree route cannot take the problem
    (a leaf not determined, invariants it cannot meet): then the general ADMM runs."""
    settings = NonnegSettings(eps_rel=eps_rel, max_iters=max_iters, time_limit=time_limit,
                              verbose=verbose, callback=callback)
    if tree.l1:
        return _solve_l1(tree, settings)
    try:
        res = _solve_squared(tree, settings)
    except ValueError:           # a leaf not determined, or invariants it cannot meet
        return None
    # (with invariants no multipliers are read off here: none are written unless the
    # family's certificate finds them, never the run's partial ones, which mapped to zeros)
    res.info["duals_certified"] = False
    duals_of_run, res.duals = res.duals, {}
    if not tree.invariants and res.status == R.OPTIMAL:
        res.duals = duals_of_run
        if tree.nonneg:
            lam = np.zeros((tree.n_units, tree.k))
            lam[tree.forest.leaves] = res.duals.get("nonneg", 0.0)
            duals, ok = _multipliers(tree, res.info.pop("bound_point"), lam)
        else:
            duals, ok = _multipliers(tree, res.x.reshape((tree.n_units, tree.k), order="F"),
                                     None)
        res.info["duals_certified"] = ok
        res.duals = duals if ok else {}
    res.primal_residual = 0.0
    return res


def _solve_squared(tree: HistogramTree, settings: NonnegSettings) -> R.SolverResult:
    """Squared losses: the exact GLS, or with ``x >= 0`` the tree ADMM."""
    if tree.nonneg:
        res = solve_nonneg(tree.forest, tree.k, tree.blocks, settings,
                           invariants=tree.invariants)
        X = res.x
    else:
        X = TreeGLS(tree.forest, tree.k, tree.blocks, tree.invariants).solve()
        fval = objective(tree.blocks, X)
        res = R.SolverResult(x=None, status=R.OPTIMAL, objective=fval, lower_bound=fval,
                             gap=0.0, iterations=1)
    res.x = X.ravel(order="F")
    res.info["route"] = ROUTE_NONNEG if tree.nonneg else ROUTE_GLS
    return res


def _solve_l1(tree: HistogramTree, settings: NonnegSettings) -> R.SolverResult:
    """Absolute losses with ``x >= 0``: the tree L1 ADMM; duals from its certified bound's
    multiplier."""
    f, k = tree.forest, tree.k
    res = solve_l1(f, k, tree.blocks, settings)
    res.x = res.x.ravel(order="F")
    res.info["route"] = ROUTE_L1
    mu = res.info.pop("dual_point")
    res.info["duals_certified"] = False
    if mu is not None and res.status == R.OPTIMAL:
        # the certified bound's multiplier: the loss's subgradient per unit, and the leaves'
        # path sums as the bound multipliers (non-negative: the point is dual feasible)
        g = unit_terms(f, k, tree.blocks, mu)
        lam = np.zeros((tree.n_units, k))
        # (the bound checked them >= 0; summed again here they may differ by rounding)
        lam[f.leaves] = np.maximum(leaf_sums(f, g, f.leaves), 0.0)
        duals, ok = _multipliers_of_gradient(tree, g, lam)
        res.info["duals_certified"] = ok
        res.duals = duals if ok else {}
    else:
        res.duals = {}
    return res


def _multipliers(tree: HistogramTree, X: np.ndarray,
                 lam: np.ndarray | None) -> tuple[dict[str, np.ndarray], bool]:
    """``eq`` (one per row of ``A``: the consistency rows' ``nu``) and ``lower`` (per flat
    coordinate: ``lam``, the bound multipliers of the leaves) of the module docstring, read
    off a point ``X`` at which ``f - lam^T x`` is stationary over consistent trees (the GLS
    solution, or the minimiser behind the non-negative run's certified bound), and whether
    they certify: the leaves' stationarity residual must be rounding, so that the Lagrangian's
    value is the bound the solver certified."""
    g = np.zeros((tree.n_units, tree.k))
    for b in tree.blocks:
        b.scatter_add(g, ((X[b.nodes] @ b.Q.T - b.y) * b.w) @ b.Q)
    return _multipliers_of_gradient(tree, g, lam)


def _multipliers_of_gradient(tree: HistogramTree, grad: np.ndarray,
                             lam: np.ndarray | None) -> tuple[dict[str, np.ndarray], bool]:
    """:func:`_multipliers` given the loss's (sub)gradient ``grad`` per unit (not modified)."""
    f, n, k = tree.forest, tree.n_units, tree.k
    g = grad - lam if lam is not None else grad
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
