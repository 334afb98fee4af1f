"""Lower bounds for the non-negative L1 problem on a tree (:mod:`cvxdp.solvers.tree_l1`).

Problem: ``minimize F(x) = sum_rows w_i |(Q x_v - y_v)_i|`` over consistent ``x`` with
``x_leaf >= 0``.  Lagrange on the rows: for every ``mu`` with ``|mu_i| <= w_i``,
``F(x) >= mu^T (Q x - y)``, and summed over a consistent ``x`` the linear form is
``sum_leaves p_leaf^T x_leaf`` with ``p_leaf`` the sum of ``Q_v^T mu_v`` over the leaf and its
ancestors.  So for ``0 <= x_leaf <= U`` (any box holding the optimal leaves)

    F* >= -mu^T y + sum_{leaf cells} min(0, p) U,                                     (1)

and ``mu`` is *dual feasible* (the bound needs no box) when ``p >= 0`` at every leaf cell.

A scaled ADMM dual ``rho v`` clipped to ``|mu| <= w`` is near an optimal ``mu`` but leaves
some ``p`` slightly negative, and the only box known a priori is loose: a row
``w |q^T x_v - y|`` with ``q >= 0`` gives ``q^T x_v <= y + F / w`` at any point of loss at most
a feasible ``F``, so ``x_vj <= (y + F / w) / q_j`` there and at every unit below ``v`` (the
cells are non-negative) -- at national scale one such term costs ``|p| F / w``, more than
``F`` itself.  :func:`lower_bound` therefore first moves ``mu`` to a nearby point with
``p >= 0`` wherever the *identity rows* allow it (a row ``w |a x_j - y|``, read as
``w |a| |x_j - y / a|``; recognised models fold the weights into ``a``); every move stays in
``|mu| <= w``, so (1) holds for the result whatever the moves are (they only decide how sharp
it is):

1. an identity row of an internal unit whose answer ``y <= 0`` is set to ``w`` (it raises
   ``-mu^T y`` and every ``p`` below it: an optimal ``mu`` has it there, as
   ``x >= 0 >= y``);
2. each leaf cell's identity row is set to its best value given the rest: the least that keeps
   ``p >= 0`` when ``y > 0`` (each unit of ``mu`` costs ``y`` in ``-mu^T y``), ``w`` when
   ``y <= 0``;
3. what is still negative (a row at ``w``, or a leaf cell without a row) is a *deficit*, lifted
   from below: bottom-up, a unit's deficit is the largest of its children's, and a unit with an
   identity row raises it by as much of the deficit as ``w - mu`` allows, passing the rest up.
   A raise at ``v`` costs ``y_v`` per unit and lifts ``p`` under ``v`` by as much, which
4. step 2, repeated, takes back from the leaves' rows (about ``y_v`` per unit, the counts
   agreeing up the tree).

Only what no unit on the path can lift meets the box.  Measured on the national benchmark's
tree (88,152 units x 64 cells, Laplace rows at every unit, ``benchmarks/national.py``): the
certified gap is 7.7e-5 after 130 ADMM iterations (114 s) and 5.6e-6 after 220; with step 2
alone the bound was still below zero after 140 iterations and the gap above 2e-2 after 290.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .tree import Forest

__all__ = ["IdentityRows", "lower_bound"]


class IdentityRows:
    """For every (unit, cell): its identity row of largest weight, if it has one -- a row
    ``w |a x_j - y|`` of one non-zero ``a``, read as ``W |x_j - Y|`` with ``W = w |a|`` and
    ``Y = y / a`` (recognised models fold the weights into ``a``).  Kept: its position in the
    concatenated multipliers (``-1`` where none), ``W``, ``Y`` and ``a``.  Moves are made on
    ``nu = a mu``, the row's term in ``p`` (``|nu| <= W``, and ``-mu y = -nu Y``).  Built once
    per problem; :func:`lower_bound` moves the multipliers at these."""

    def __init__(self, blocks: Sequence, forest: Forest, k: int) -> None:
        shape = (forest.n, k)
        self.index = np.full(shape, -1, dtype=np.int64)
        self.w = np.zeros(shape)
        self.y = np.full(shape, np.inf)
        self.a = np.ones(shape)
        offset = 0
        for b in blocks:
            m = b.Q.shape[0]
            for qi, q in enumerate(b.Q):
                nz = np.flatnonzero(q)
                if nz.size != 1:
                    continue
                j, a = int(nz[0]), float(q[nz[0]])
                rows = np.flatnonzero(b.w[qi] * abs(a) > self.w[b.nodes, j])
                nodes = b.nodes[rows]
                self.index[nodes, j] = offset + rows * m + qi
                self.w[nodes, j] = b.w[qi] * abs(a)
                self.y[nodes, j] = b.y[rows, qi] / a
                self.a[nodes, j] = a
            offset += b.y.size
        self.size = offset
        self.leaves = forest.leaves
        self.depth = np.empty(forest.n, dtype=np.int64)
        for d in range(forest.n_levels):
            self.depth[forest.order[forest.level_bounds[d]:forest.level_bounds[d + 1]]] = d
        has = self.index[self.leaves] >= 0
        self.leaf_cells = np.nonzero(has)                     # (leaf position, cell)
        inner = np.ones(forest.n, dtype=bool)
        inner[self.leaves] = False
        free = (self.index >= 0) & (self.y <= 0) & inner[:, None]
        self.free, self.free_mu = self.index[free], (self.w / self.a)[free]   # step 1's rows


def lower_bound(forest: Forest, k: int, blocks: Sequence, mus: Sequence[np.ndarray],
                rows: IdentityRows, F: float) -> float:
    """Bound (1) of the module docstring at ``mus`` (one ``(units, m)`` array per block, within
    ``|mu| <= w``; not modified) moved by steps 1-4; ``F`` a feasible loss (for the box)."""
    mu = np.concatenate([np.asarray(m, dtype=float).ravel() for m in mus])
    if mu.size != rows.size:
        raise ValueError(f"lower_bound: {mu.size} multipliers for {rows.size} rows")
    mu[rows.free] = rows.free_mu
    P = _path_sums(forest, k, blocks, mu)[rows.leaves]
    _best_leaf_rows(mu, P, rows)
    lift = _lift(forest, k, mu, P, rows)
    if lift is not None:
        P += lift
        _best_leaf_rows(mu, P, rows)
    y = np.concatenate([b.y.ravel() for b in blocks])
    const = -float(mu @ y)
    neg = P < 0
    if not np.any(neg):
        return const
    U = _box(forest, k, blocks, F)[rows.leaves]
    if np.any(neg & ~np.isfinite(U)):
        return -math.inf
    return const + float(np.sum(P[neg] * U[neg]))


def _box(forest: Forest, k: int, blocks: Sequence, F: float) -> np.ndarray:
    """Upper bounds on every unit's cells at any point of loss at most ``F`` (``(n, k)``,
    ``inf`` where none): a row ``w |q^T x_v - y|`` with ``q >= 0`` gives ``q^T x_v <= y + F / w``,
    so ``x_vj <= (y + F / w) / q_j`` for ``q_j > 0`` (the cells are non-negative), and a unit's
    cells bound those of every unit below it."""
    U = np.full((forest.n, k), np.inf)
    for b in blocks:
        for qi, q in enumerate(b.Q):
            if np.any(q < 0) or not np.any(q > 0):
                continue
            j = np.flatnonzero(q > 0)
            cap = (b.y[:, qi] + F / b.w[qi])[:, None] / q[j]
            np.minimum.at(U, (b.nodes[:, None], j[None, :]), cap)
    for d in range(1, forest.n_levels):
        units = forest.order[forest.level_bounds[d]:forest.level_bounds[d + 1]]
        U[units] = np.minimum(U[units], U[forest.parent[units]])
    return U


def _path_sums(forest: Forest, k: int, blocks: Sequence, mu: np.ndarray) -> np.ndarray:
    """``sum of Q_v^T mu_v`` over every unit and its ancestors, ``(n, k)``."""
    c = np.zeros((forest.n, k))
    offset = 0
    for b in blocks:
        size = b.y.size
        b.scatter_add(c, mu[offset:offset + size].reshape(b.y.shape) @ b.Q)
        offset += size
    _push_down(forest, c)
    return c


def _push_down(forest: Forest, c: np.ndarray) -> None:
    """``c_v += c_parent`` from the roots down (in place): sums over the path to the root."""
    for d in range(1, forest.n_levels):
        units = forest.order[forest.level_bounds[d]:forest.level_bounds[d + 1]]
        c[units] += c[forest.parent[units]]


def _best_leaf_rows(mu: np.ndarray, P: np.ndarray, rows: IdentityRows) -> None:
    """Step 2: each leaf cell's identity row at its best value given the rest (in place, with
    the leaves' path sums ``P``)."""
    li, j = rows.leaf_cells
    leaf = rows.leaves[li]
    idx, w, y, a = rows.index[leaf, j], rows.w[leaf, j], rows.y[leaf, j], rows.a[leaf, j]
    other = P[li, j] - a * mu[idx]
    best = np.clip(np.where(y > 0, -other, w), -w, w)
    mu[idx] = best / a
    P[li, j] = other + best


def _lift(forest: Forest, k: int, mu: np.ndarray, P: np.ndarray,
          rows: IdentityRows) -> np.ndarray | None:
    """Step 3 (in place on ``mu``): the leaves' deficits lifted bottom-up by the identity rows
    with room; returns what that adds to the leaves' path sums (``None``: nothing raised)."""
    li, cell = np.nonzero(P < 0)
    if li.size == 0:
        return None
    node, deficit = rows.leaves[li], -P[li, cell]
    raised = np.zeros((forest.n, k))
    for d in range(forest.n_levels - 1, -1, -1):
        # merge entries now at the same (unit, cell): the unit must lift the largest
        key = node * k + cell
        uniq, inv = np.unique(key, return_inverse=True)
        merged = np.zeros(uniq.size)
        np.maximum.at(merged, inv, deficit)
        node, cell, deficit = uniq // k, uniq % k, merged
        here = np.flatnonzero((rows.depth[node] == d) & (rows.index[node, cell] >= 0))
        if here.size:
            idx = rows.index[node[here], cell[here]]
            a = rows.a[node[here], cell[here]]
            step = np.clip(rows.w[node[here], cell[here]] - a * mu[idx], 0.0, deficit[here])
            mu[idx] += step / a
            raised[node[here], cell[here]] += step
            deficit[here] -= step
        up = (rows.depth[node] == d) & (deficit > 0) & (forest.parent[node] >= 0)
        keep = (rows.depth[node] != d) | up
        node = np.where(up, forest.parent[node], node)[keep]
        cell, deficit = cell[keep], deficit[keep]
        if node.size == 0:
            break
    if not np.any(raised):
        return None
    _push_down(forest, raised)
    return raised[rows.leaves]
