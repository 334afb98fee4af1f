"""Lower bounds for the non-negative L1 problem on a tree (:mod:`cvxdp.solvers.tree_l1`).

Problem: ``minimize F(x) = sum_rows w_i |(Q x_v - y_v)_i|`` over consistent ``x`` with
``x_leaf >= 0``.  Lagrange on the rows: for every ``mu`` with ``|mu_i| <= w_i``,
``F(x) >= mu^T (Q x - y)``, and summed over a consistent ``x`` the linear form is
``sum_leaves p_leaf^T x_leaf`` with ``p_leaf`` the sum of ``Q_v^T mu_v`` over the leaf and its
ancestors.  So for ``0 <= x_leaf <= U`` (any box holding the optimal leaves)

    F* >= -mu^T y + sum_{leaf cells} min(0, p) U,                                     (1)

and ``mu`` is *dual feasible* (the bound needs no box) when ``p >= 0`` at every leaf cell.

A scaled ADMM dual ``rho v`` clipped to ``|mu| <= w`` is near an optimal ``mu`` but leaves
some ``p`` slightly negative; with the only box known a priori, ``U = y + F / w`` for a leaf
cell with an identity row ``w |x - y|`` (that term alone is at most the optimal loss, which a
feasible ``F`` bounds), each such cell costs ``|p| F / w``: at national scale that alone is
larger than ``F``.  :func:`lower_bound` therefore first moves ``mu`` to a nearby point with
``p >= 0`` wherever the identity rows allow it; every move stays in ``|mu| <= w``, so (1)
holds for the result whatever the moves are (they only decide how sharp it is):

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
tree (88,152 units x 64 cells, Laplace rows at every unit): after 140 ADMM iterations (1)
with steps 1-4 is 7.7e-5 below the best point's loss; with step 2 alone 2.7 times the loss
*below zero* (the box), and it stayed above 2e-2 after 290 iterations.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .tree import Forest

__all__ = ["IdentityRows", "lower_bound"]


class IdentityRows:
    """For every (unit, cell): its identity row ``w |x - y|`` of largest weight, if it has one
    -- as a position in the concatenated multipliers (``-1`` where none), with its weight and
    answer.  Built once per problem; :func:`lower_bound` moves the multipliers at these."""

    def __init__(self, blocks: Sequence, forest: Forest, k: int) -> None:
        shape = (forest.n, k)
        self.index = np.full(shape, -1, dtype=np.int64)
        self.w = np.zeros(shape)
        self.y = np.full(shape, np.inf)
        offset = 0
        for b in blocks:
            m = b.Q.shape[0]
            for qi, q in enumerate(b.Q):
                nz = np.flatnonzero(q)
                if nz.size != 1 or q[nz[0]] != 1.0:
                    continue
                j = int(nz[0])
                rows = np.flatnonzero(b.w[qi] > self.w[b.nodes, j])
                nodes = b.nodes[rows]
                self.index[nodes, j] = offset + rows * m + qi
                self.w[nodes, j] = b.w[qi]
                self.y[nodes, j] = b.y[rows, qi]
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
        self.free, self.free_w = self.index[free], self.w[free]     # step 1's rows

    def box(self, F: float) -> np.ndarray:
        """``y + F / w`` per leaf cell (``inf`` without an identity row)."""
        w, y = self.w[self.leaves], self.y[self.leaves]
        with np.errstate(divide="ignore"):
            return np.where(w > 0, y + F / np.where(w > 0, w, 1.0), np.inf)


def lower_bound(forest: Forest, k: int, blocks: Sequence, mus: Sequence[np.ndarray],
                rows: IdentityRows, F: float) -> float:
    """Bound (1) of the module docstring at ``mus`` (one ``(units, m)`` array per block, within
    ``|mu| <= w``; not modified) moved by steps 1-4; ``F`` a feasible loss (for the box)."""
    mu = np.concatenate([np.asarray(m, dtype=float).ravel() for m in mus])
    if mu.size != rows.size:
        raise ValueError(f"lower_bound: {mu.size} multipliers for {rows.size} rows")
    mu[rows.free] = rows.free_w
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
    U = rows.box(F)
    if np.any(neg & ~np.isfinite(U)):
        return -math.inf
    return const + float(np.sum(P[neg] * U[neg]))


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
    idx, w, y = rows.index[leaf, j], rows.w[leaf, j], rows.y[leaf, j]
    other = P[li, j] - mu[idx]
    best = np.clip(np.where(y > 0, -other, w), -w, w)
    mu[idx] = best
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
            step = np.clip(rows.w[node[here], cell[here]] - mu[idx], 0.0, deficit[here])
            mu[idx] += step
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
