"""Consistent integer rounding of a real, non-negative, consistent tree of counts.

Problem.  A forest (parent array), real values ``x`` with one row per node and ``k`` columns
(histogram cells; ``k = 1`` for scalar counts) satisfying ``x_p = sum_{c child of p} x_c``
column by column, weights ``w >= 0`` of the same shape, and optionally *fixed* entries (the
invariants), which must be integers.  Find integers ``X`` with

    X_p = sum_{c child of p} X_c             (every internal node, every column)
    X_v in {floor(x_v), ceil(x_v)}            (each entry within one of its value)
    X_v = x_v where fixed,

minimising ``sum_v w_v |X_v - x_v|``.  The columns are independent problems.  For one column
the constraint matrix (a tree's parent-minus-children rows) is a network matrix, hence
totally unimodular: the LP relaxation has an integral optimum and a rounding always exists
without fixed entries (``sum_c floor(x_c) <= floor(x_p)`` and ``ceil(x_p) <= sum_c ceil(x_c)``;
Cox 1987, "A constructive procedure for unbiased controlled rounding", JASA 82).  For two
nested (laminar) families over the same cells -- the geography tree and a hierarchy of
cell groups -- the constraint matrix is still totally unimodular (the union of two laminar
families, Edmonds & Giles 1977), so an LP solver's vertex is an integral rounding; this module
solves the one-tree case.

Method: exact dynamic programming over the two admissible values of every node.  Bottom-up,
``cost_v(X) = w_v |X - x_v| + min { sum_c cost_c(X_c) : sum_c X_c = X }``; the inner minimum
starts every child at its lower value and rounds up the ``m = X - sum_c lower_c`` children with
the smallest increase ``cost_c(upper) - cost_c(lower)`` (a sort per parent: the children's
costs are separable).  Top-down, the root takes its cheaper value and each parent hands the
round-ups to those children.  ``O(n log n)`` per column, vectorised per level over all
parents and columns; no MIP solver.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .forest import Forest

__all__ = ["round_consistent", "RoundingError"]


class RoundingError(ValueError):
    """The input is not a rounding problem this module solves (the message says where)."""


@dataclass
class _Options:
    """Per node and column (BFS order): the lower admissible value, and the cost at it and at
    ``lower + 1`` (``inf``: not admissible)."""
    low: np.ndarray
    c0: np.ndarray
    c1: np.ndarray


def round_consistent(forest: Forest, x: np.ndarray, *, weights: np.ndarray | None = None,
                     fixed: np.ndarray | None = None, tol: float = 1e-9) -> np.ndarray:
    """Integers ``X`` of the module docstring, shape of ``x`` (``(n,)`` or ``(n, k)``, original
    node order).

    ``tol``: an entry within ``tol * max(1, |x|)`` of an integer counts as that integer (it is
    kept), and consistency is checked to ``tol`` times the scale of the sums.  Raises
    :class:`RoundingError` (a ``ValueError``) for a negative entry, an inconsistent node, a
    fixed entry that is not an integer, or fixed entries that no rounding satisfies, naming
    the node (original index) and column."""
    x = np.asarray(x, dtype=float)
    one = x.ndim == 1
    X = x.reshape(-1, 1) if one else x
    if X.ndim != 2 or X.shape[0] != forest.n:
        raise RoundingError(f"x must have one row per node ({forest.n}), got shape {x.shape}")
    W = _per_entry(weights, X.shape, "weights", float, 1.0)
    F = _per_entry(fixed, X.shape, "fixed", bool, False)
    order = forest.order
    xb, wb, fb = X[order], W[order], F[order]
    _check(forest, xb, wb, tol)
    opts = _options(forest, xb, wb, fb, tol)
    _upward(forest, opts, xb, wb)
    out = np.empty_like(xb)
    _downward(forest, opts, out)
    res = np.empty_like(out)
    res[order] = out
    return res.ravel() if one else res


def _per_entry(arr, shape: tuple[int, int], name: str, dtype, default) -> np.ndarray:
    """``arr`` per node (``(n,)``) or per entry (``shape``) as an array of ``shape``."""
    if arr is None:
        return np.full(shape, default, dtype=dtype)
    a = np.asarray(arr, dtype=dtype)
    if a.shape == (shape[0],):
        a = a[:, None]
    elif a.shape != shape and a.shape != (shape[0], 1):
        raise RoundingError(f"{name} must have one entry per node {(shape[0],)} or per entry "
                            f"{shape}, got shape {a.shape}")
    return np.broadcast_to(a, shape)


def _children_sum(forest: Forest, xb: np.ndarray) -> np.ndarray:
    """Row sums of each node's children (BFS order; zero for leaves)."""
    out = np.zeros_like(xb)
    for d in range(1, forest.n_levels):
        lo, hi = forest.level_bounds[d], forest.level_bounds[d + 1]
        parents, starts, _ = forest.level_children(d)
        out[parents] = np.add.reduceat(xb[lo:hi], starts, axis=0)
    return out


def _check(forest: Forest, xb: np.ndarray, wb: np.ndarray, tol: float) -> None:
    """Finite, non-negative, consistent input (BFS order; errors name original indices)."""
    def where(mask):
        p, j = np.argwhere(mask)[0]
        return int(forest.order[p]), int(j), p
    if not np.all(np.isfinite(xb)):
        v, j, _ = where(~np.isfinite(xb))
        raise RoundingError(f"x is not finite at node {v}, column {j}")
    if not np.all(np.isfinite(wb)) or np.any(wb < 0):
        raise RoundingError("weights must be finite and non-negative")
    neg = xb < -tol * np.maximum(1.0, np.abs(xb))
    if neg.any():
        v, j, p = where(neg)
        raise RoundingError(f"x is negative at node {v}, column {j}: {xb[p, j]:.6g}")
    s = _children_sum(forest, xb)
    internal = forest.is_internal[forest.order]
    scale = np.maximum(1.0, np.abs(xb) + _children_sum(forest, np.abs(xb)))
    off = (np.abs(xb - s) > tol * scale) & internal[:, None]
    if off.any():
        v, j, p = where(off)
        raise RoundingError(f"x is not consistent at node {v}, column {j}: {xb[p, j]:.10g} against "
                            f"{s[p, j]:.10g}, the sum of its children")


def _options(forest: Forest, x: np.ndarray, w: np.ndarray, fixed: np.ndarray, tol: float) -> _Options:
    r = np.round(x)
    integral = np.abs(x - r) <= tol * np.maximum(1.0, np.abs(x))
    if np.any(fixed & ~integral):
        p, j = np.argwhere(fixed & ~integral)[0]
        raise RoundingError(f"fixed entry at node {forest.order[p]}, column {j} is not an integer: "
                            f"{x[p, j]:.10g}")
    low = np.where(integral, r, np.floor(x))
    c0 = w * np.abs(low - x)
    c1 = np.where(integral, np.inf, w * np.abs(low + 1 - x))
    return _Options(low, c0, c1)


def _upward(forest: Forest, o: _Options, x: np.ndarray, w: np.ndarray) -> None:
    """Add to each parent's ``c0`` / ``c1`` the least cost of its children summing to that
    value (module docstring), deepest level first."""
    for d in range(forest.n_levels - 1, 0, -1):
        lo, hi = forest.level_bounds[d], forest.level_bounds[d + 1]
        parents, starts, sizes = forest.level_children(d)
        base, bcost, inc = _child_base(o, lo, hi)
        k = base.shape[1]
        s_low = np.add.reduceat(base, starts, axis=0)
        s_cost = np.add.reduceat(bcost, starts, axis=0)
        pref, n_up = _sorted_prefix(inc, starts, sizes)
        for col, cost in ((o.low[parents], o.c0), (o.low[parents] + 1, o.c1)):
            m = col - s_low
            ok = (m >= 0) & (m <= n_up)
            mi = np.clip(m, 0, None).astype(np.int64)
            extra = np.where(ok, _take_prefix(pref, starts, mi, k), np.inf)
            with np.errstate(invalid="ignore"):
                cost[parents] = np.where(np.isfinite(cost[parents]), cost[parents] + s_cost + extra, np.inf)
        _raise_if_stuck(forest, o, parents)


def _child_base(o: _Options, lo: int, hi: int):
    """Children of a level: the value each starts at, its cost, and the increase of rounding
    it up (``inf`` when it cannot move up)."""
    c0, c1 = o.c0[lo:hi], o.c1[lo:hi]
    must_up = ~np.isfinite(c0)
    base = np.where(must_up, o.low[lo:hi] + 1, o.low[lo:hi])
    bcost = np.where(must_up, c1, c0)
    inc = np.where(must_up, np.inf, c1 - c0)
    return base, bcost, inc


def _block_order(inc: np.ndarray, starts: np.ndarray, sizes: np.ndarray):
    """Sort each parent's children by increase, every column at once: the (block, column)
    groups of the column-major flattening, as ``(idx, group, first)`` -- the sorting
    permutation of the flattened increases, each flattened entry's group, and each group's
    first position."""
    n, k = inc.shape
    nb = starts.size
    block = np.repeat(np.arange(nb), sizes)
    group = (np.arange(k)[:, None] * nb + block[None, :]).ravel()
    flat = inc.T.ravel()
    idx = np.lexsort((flat, group))              # group first, increase within it
    first = (np.arange(k)[:, None] * n + starts[None, :]).ravel()
    return idx, group, first


def _sorted_prefix(inc: np.ndarray, starts: np.ndarray, sizes: np.ndarray):
    """Per parent block and column: cumulative sums of the increases sorted ascending, with a
    leading zero per group (a flat array), and how many increases are finite
    (``(blocks, k)``)."""
    n, k = inc.shape
    nb = starts.size
    idx, group, first = _block_order(inc, starts, sizes)
    v = inc.T.ravel()[idx]
    finite = np.isfinite(v)
    n_up = np.add.reduceat(finite.astype(float), first).reshape(k, nb).T
    c = np.cumsum(np.where(finite, v, 0.0))
    before = np.r_[0.0, c][first]                # cumulative sum before each group
    within = c - np.repeat(before, np.tile(sizes, k))
    out = np.zeros(n * k + nb * k)
    out[np.arange(n * k) + group[idx] + 1] = within
    return out, n_up


def _take_prefix(pref: np.ndarray, starts: np.ndarray, m: np.ndarray, k: int) -> np.ndarray:
    """The prefix sums of each (block, column) group at ``m`` round-ups (``(blocks, k)``)."""
    nb = starts.size
    n = pref.size // k - nb
    lead = (np.arange(k)[None, :] * n + starts[:, None]) + (np.arange(k)[None, :] * nb + np.arange(nb)[:, None])
    return pref[np.minimum(lead + m, pref.size - 1)]


def _raise_if_stuck(forest: Forest, o: _Options, parents: np.ndarray) -> None:
    stuck = ~np.isfinite(o.c0[parents]) & ~np.isfinite(o.c1[parents])
    if stuck.any():
        p, j = np.argwhere(stuck)[0]
        raise RoundingError(f"no consistent rounding below node {forest.order[parents[p]]}, column "
                            f"{j}: the fixed entries there contradict each other")


def _downward(forest: Forest, o: _Options, out: np.ndarray) -> None:
    """Values from the roots down: each parent's value decides how many of its children
    round up, the cheapest increases first."""
    lo, hi = forest.level_bounds[0], forest.level_bounds[1]
    stuck = ~np.isfinite(o.c0[lo:hi]) & ~np.isfinite(o.c1[lo:hi])
    if stuck.any():
        p, j = np.argwhere(stuck)[0]
        raise RoundingError(f"no consistent rounding at root {forest.order[lo + p]}, column {j}: "
                            f"the fixed entries contradict each other")
    out[lo:hi] = np.where(o.c1[lo:hi] < o.c0[lo:hi], o.low[lo:hi] + 1, o.low[lo:hi])
    for d in range(1, forest.n_levels):
        lo, hi = forest.level_bounds[d], forest.level_bounds[d + 1]
        parents, starts, sizes = forest.level_children(d)
        base, _, inc = _child_base(o, lo, hi)
        m = out[parents] - np.add.reduceat(base, starts, axis=0)
        # rank of each child's increase within its block (0 = cheapest), all columns at once
        idx, group, first = _block_order(inc, starts, sizes)
        r = np.empty(idx.size, dtype=np.int64)
        r[idx] = np.arange(idx.size) - np.repeat(first, np.tile(sizes, inc.shape[1]))
        rank = r.reshape(inc.shape[1], -1).T
        up = rank < np.repeat(m, sizes, axis=0)
        out[lo:hi] = base + up
