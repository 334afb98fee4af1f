"""Each clique's total multiplier ``tau_k`` on the local polytope: the value at which the
clique's one-cell minimisers sum to the total.

For a per-cell loss ``f_i`` (:class:`cvxdp.solvers.local.loss.CellLoss`) and a per-cell linear
term ``g``, the Lagrangian of the clique-total constraint ``sum_{i in C_k} x_i = N`` is
minimised cell by cell, ``x_i(tau_k) = argmin_{0 <= x <= upper} f_i(x) + (g_i - tau_k) x``,
and the dual is concave in ``tau_k`` with its maximiser where ``sum_i x_i(tau_k) = N`` (the
weighted rule of the projection onto a simplex; Held, Wolfe & Crowder 1974).  Used by the
ADMM's lower bound (:mod:`cvxdp.solvers.local.admm`) and by the dual Newton's start
(:mod:`cvxdp.solvers.local.newton`).  ``p`` is a ``LocalProblem`` (its ``cells`` and
``graph``); any ``tau`` gives a valid bound, these only find a good one.
"""
from __future__ import annotations

import numpy as np

__all__ = ["TAU_STEPS", "TAU_TOL", "per_cell", "tau_bisect", "tau_root"]

# bisection (or safeguarded Newton) steps for each clique's multiplier at most
TAU_STEPS = 60
# ... which stop once the clique sums meet the total to this relative error
TAU_TOL = 1e-14


def per_cell(p, v: np.ndarray) -> np.ndarray:
    """A per-clique value repeated over the clique's cells."""
    return np.repeat(v, p.graph.cells)


def tau_bisect(p, g: np.ndarray, target: float, upper: float,
               strict: bool = False) -> np.ndarray:
    """Per-clique ``tau`` (bisection): the largest with the clique's minimiser summing to at
    most ``target`` (``strict``: to less than ``target``).  The bound is concave in ``tau_k``
    and flat between the two: any ``tau_k`` there is a maximiser."""
    c, G = p.cells, p.graph
    off = G.offsets[:-1]
    base = c.C - g
    # below lo every cell's minimiser is 0; at hi some cell alone reaches the target
    lo = np.minimum.reduceat(-base - c.w, off)
    hi = np.maximum(np.minimum.reduceat(c.A * target + c.w - base, off), lo)
    for _ in range(TAU_STEPS):
        mid = 0.5 * (lo + hi)
        sums = np.add.reduceat(c.argmin(c.A, base + per_cell(p, mid), upper), off)
        over = sums >= target if strict else sums > target
        hi = np.where(over, mid, hi)
        lo = np.where(over, lo, mid)
    return lo


def tau_root(p, g: np.ndarray, target: float, upper: float) -> np.ndarray:
    """Per-clique ``tau`` with the clique's minimiser summing to ``target`` (the maximiser of
    the concave bound in ``tau_k``), by safeguarded Newton steps on the clique sums: they are
    piecewise linear and non-decreasing in ``tau`` (convex while no cell reaches ``upper``),
    so Newton from the right converges in a few passes where bisection needs sixty; a step
    leaving the bracket is replaced by its midpoint.  Any ``tau`` gives a valid bound: the
    result only has to be near the maximiser."""
    c, G = p.cells, p.graph
    off = G.offsets[:-1]
    base = c.C - g
    if not np.any(c.A > 0):
        return _step_root(p, base, target, upper)
    lo = np.minimum.reduceat(-base - c.w, off)
    hi = np.maximum(np.minimum.reduceat(c.A * target + c.w - base, off), lo)
    inv = np.where(c.A > 0, 1.0 / np.where(c.A > 0, c.A, 1.0), 0.0)
    t = hi.copy()
    for _ in range(TAU_STEPS):
        x = c.argmin(c.A, base + per_cell(p, t), upper)
        sums = np.add.reduceat(x, off)
        over = sums > target
        hi = np.where(over, np.minimum(hi, t), hi)
        lo = np.where(over, lo, np.maximum(lo, t))
        done = np.abs(sums - target) <= TAU_TOL * target
        done |= (hi - lo) <= TAU_TOL * np.maximum(np.abs(lo), np.abs(hi))
        if np.all(done):
            break
        # a cell held at its kink (an absolute row's b) does not move with tau: slope 0 there
        # (counted, Newton stalled on a plateau of the sums short of the target)
        moving = (x > 0) & (x < upper) & ~((c.w > 0) & (x == c.b))
        slope = np.add.reduceat(np.where(moving, inv, 0.0), off)
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = t - (sums - target) / slope
        inside = (slope > 0) & (newton > lo) & (newton < hi)
        t = np.where(done, t, np.where(inside, newton, 0.5 * (lo + hi)))
    return t


def _step_root(p, base: np.ndarray, target: float, upper: float) -> np.ndarray:
    """:func:`tau_root` when every cell is piecewise linear (absolute rows only, ``A = 0``):
    cell ``i``'s minimiser is 0 below ``t = -w_i - base_i``, ``b_i`` (clipped into ``[0,
    upper]``) up to ``w_i - base_i`` and ``upper`` above, so each clique sum is a step
    function and its root the first breakpoint at which the sum reaches ``target``: exact by
    one sort, where bisection needs sixty passes (the safeguarded Newton has no slope here)."""
    c, G = p.cells, p.graph
    K = len(G.cliques)
    b = np.clip(c.b, 0.0, upper)
    clique = np.repeat(np.arange(K), G.cells)
    t = np.concatenate([-c.w - base, c.w - base])
    # the jumps, capped above the target (an infinite upper would make the sums inf - inf)
    jump = np.minimum(np.concatenate([b, upper - b]), 2.0 * target + 1.0)
    k = np.concatenate([clique, clique])
    order = np.lexsort((t, k))
    t, jump, k = t[order], jump[order], k[order]
    cum = np.cumsum(jump)
    start = np.concatenate([[0], np.flatnonzero(np.diff(k)) + 1])
    before = np.concatenate([[0.0], cum])[start]
    cum -= np.repeat(before, np.diff(np.concatenate([start, [k.size]])))
    reached = cum >= target * (1.0 - TAU_TOL)
    # the first index reaching the target in each clique (its last breakpoint if none does)
    first = np.where(reached, np.arange(k.size), k.size)
    idx = np.minimum.reduceat(first, start)
    last = np.concatenate([start[1:], [k.size]]) - 1
    return t[np.where(idx < k.size, idx, last)]

