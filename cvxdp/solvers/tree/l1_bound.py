"""Lower bounds for the non-negative L1 problem on a tree (:mod:`cvxdp.solvers.tree.l1`).

Problem: ``minimize F(x) = sum_rows w_i |(Q x_v - y_v)_i|`` over consistent ``x`` with
``x_leaf >= 0``.  Lagrange on the rows: for every ``mu`` with ``|mu_i| <= w_i``,
``F(x) >= mu^T (Q x - y)``, and summed over a consistent ``x`` the linear form is
``sum_leaves p_leaf^T x_leaf`` with ``p_leaf`` the sum of ``Q_v^T mu_v`` over the leaf and its
ancestors.  So for ``0 <= x_leaf <= U`` (any box holding the optimal leaves)::

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
   identity row raises it by as much of the deficit as ``w - mu`` allows; then each of its
   *sums* (rows ``q >= 0`` of two or more entries: totals, group sums) with room is raised by
   the largest ``deficit_j / q_j`` among the cells it covers (lifting all of them); the rest
   passes up.  A raise at ``v`` costs ``y_v`` per unit and lifts ``p`` under ``v``, which
4. step 2, repeated, takes back from the leaves' rows (about ``y_v`` per unit for an identity
   row, the counts agreeing up the tree);
5. if some ``p`` is still negative, ``mu`` is mixed with ``mu0`` (every chosen identity row at
   ``w``, the other rows at 0; its ``p0`` is positive wherever a path has an identity row),
   ``(1 - theta) mu + theta mu0`` with the least ``theta`` making every ``p >= 0``: dual
   feasible, so its bound and its multipliers (the constraints' duals,
   :mod:`cvxdp.solvers.consistency.histogram_tree`) certify.

Only where no feasible point is found does the box come in (the better of the two bounds is
kept).  Measured on the national benchmark's
tree (88,152 units x 64 cells, Laplace rows at every unit, ``benchmarks/national.py``): the
certified gap is 7.7e-5 after 130 ADMM iterations (114 s) and 5.6e-6 after 220; with step 2
alone the bound was still below zero after 140 iterations and the gap above 2e-2 after 290.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .forest import Forest

__all__ = ["IdentityRows", "DualPoint", "dual_point", "lower_bound", "unit_terms", "leaf_sums"]


class IdentityRows:
    """For every (unit, cell): its identity row of largest weight, if it has one -- a row
    ``w |a x_j - y|`` of one non-zero ``a``, read as ``W |x_j - Y|`` with ``W = w |a|`` and
    ``Y = y / a`` (recognised models fold the weights into ``a``).  Kept: its position in the
    concatenated multipliers (``-1`` where none), ``W``, ``Y`` and ``a``.  Moves are made on
    ``nu = a mu``, the row's term in ``p`` (``|nu| <= W``, and ``-mu y = -nu Y``).  Built once
    per problem; :func:`lower_bound` moves the multipliers at these."""

    def __init__(self, blocks: Sequence, forest: Forest, k: int) -> None:
        self.index, self.w, self.y, self.a = _identity_rows(blocks, forest.n, k)
        self.size = int(sum(b.y.size for b in blocks))
        self.answers = np.concatenate([b.y.ravel() for b in blocks])    # y, flat like mu
        self.sums = _sum_rows(blocks, forest.n)
        self.leaves = forest.leaves
        self.depth = np.empty(forest.n, dtype=np.int64)
        for d in range(forest.n_levels):
            self.depth[forest.order[forest.level_bounds[d]:forest.level_bounds[d + 1]]] = d
        has_row = self.index >= 0
        self.leaf_cells = np.nonzero(has_row[self.leaves])          # (leaf position, cell)
        inner = np.ones(forest.n, dtype=bool)
        inner[self.leaves] = False
        free = has_row & (self.y <= 0) & inner[:, None]
        self.free, self.free_mu = self.index[free], (self.w / self.a)[free]   # step 1's rows
        # step 5's point: every chosen identity row at its upper end W, the other rows at 0
        self.mu0 = np.zeros(self.size)
        self.mu0[self.index[has_row]] = (self.w / self.a)[has_row]
        self.p0 = leaf_sums(forest, np.where(has_row, self.w, 0.0), self.leaves)


def _identity_rows(blocks: Sequence, n: int, k: int):
    """``(index, W, Y, a)`` of :class:`IdentityRows`, ``(n, k)`` each."""
    index = np.full((n, k), -1, dtype=np.int64)
    W, Y, A = np.zeros((n, k)), np.full((n, k), np.inf), np.ones((n, k))
    offset = 0
    for b in blocks:
        m = b.Q.shape[0]
        for qi, q in enumerate(b.Q):
            nz = np.flatnonzero(q)
            if nz.size != 1:
                continue
            j, a = int(nz[0]), float(q[nz[0]])
            rows = np.flatnonzero(b.w[qi] * abs(a) > W[b.nodes, j])
            nodes = b.nodes[rows]
            index[nodes, j] = offset + rows * m + qi
            W[nodes, j], Y[nodes, j], A[nodes, j] = b.w[qi] * abs(a), b.y[rows, qi] / a, a
        offset += b.y.size
    return index, W, Y, A


def _sum_rows(blocks: Sequence, n: int) -> list:
    """The rows with ``q >= 0`` and two or more entries (totals, group sums), step 3's second
    resource: ``(position of the block's first row + the row, rows per unit, unit -> row of
    the block, q, w)`` each."""
    out, offset = [], 0
    for b in blocks:
        m = b.Q.shape[0]
        pos = np.full(n, -1, dtype=np.int64)
        pos[b.nodes] = np.arange(b.nodes.size)
        for qi, q in enumerate(b.Q):
            if np.count_nonzero(q) > 1 and not np.any(q < 0):
                out.append((offset + qi, m, pos, q, float(b.w[qi])))
        offset += b.y.size
    return out


@dataclass
class DualPoint:
    """The multipliers moved by steps 1-5 (flat, the blocks' rows in order): ``mu`` dual
    feasible with its exact bound ``value`` (``None`` / ``-inf`` if none was found), and
    ``bound``, the best bound (1) at hand: ``value`` or the box bound at the point before step
    5, whichever is higher."""

    mu: np.ndarray | None
    value: float
    bound: float


def dual_point(forest: Forest, k: int, blocks: Sequence, mus: Sequence[np.ndarray],
               rows: IdentityRows, F: float) -> DualPoint:
    """``mus`` (one ``(units, m)`` array per block, within ``|mu| <= w``; not modified) moved
    by steps 1-5 of the module docstring, and bound (1) there; ``F`` a feasible loss (for the
    box)."""
    mu = np.concatenate([np.asarray(m, dtype=float).ravel() for m in mus])
    if mu.size != rows.size:
        raise ValueError(f"lower_bound: {mu.size} multipliers for {rows.size} rows")
    mu[rows.free] = rows.free_mu
    P = leaf_sums(forest, unit_terms(forest, k, blocks, mu), rows.leaves)
    _best_leaf_rows(mu, P, rows)
    lift = _lift(forest, k, mu, P, rows)
    if lift is not None:
        P += lift
        _best_leaf_rows(mu, P, rows)
    y = rows.answers
    neg = P < 0
    if not np.any(neg):
        value = -float(mu @ y)
        return DualPoint(mu, value, value)
    U = _box(forest, k, blocks, F)[rows.leaves]
    boxed = -math.inf if np.any(neg & ~np.isfinite(U)) else \
        -float(mu @ y) + float(np.sum(P[neg] * U[neg]))
    # step 5: mixed with the strictly feasible point mu0 (p0 > 0 where it has a row on the path)
    if np.all(rows.p0[neg] > 0):
        theta = float(np.max(-P[neg] / (rows.p0[neg] - P[neg])))
        mixed = (1.0 - theta) * mu + theta * rows.mu0
        value = -float(mixed @ y)
        return DualPoint(mixed, value, max(value, boxed))
    return DualPoint(None, -math.inf, boxed)


def lower_bound(forest: Forest, k: int, blocks: Sequence, mus: Sequence[np.ndarray],
                rows: IdentityRows, F: float) -> float:
    """Bound (1) at ``mus`` moved by steps 1-5 (:func:`dual_point`)."""
    return dual_point(forest, k, blocks, mus, rows, F).bound


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


def unit_terms(forest: Forest, k: int, blocks: Sequence, mu: np.ndarray) -> np.ndarray:
    """``Q_v^T mu_v`` summed per unit, ``(n, k)`` (``mu`` flat, the blocks' rows in order):
    the loss's subgradient at each unit when ``mu`` is one of the loss."""
    c = np.zeros((forest.n, k))
    offset = 0
    for b in blocks:
        size = b.y.size
        b.scatter_add(c, mu[offset:offset + size].reshape(b.y.shape) @ b.Q)
        offset += size
    return c


def leaf_sums(forest: Forest, c: np.ndarray, leaves: np.ndarray) -> np.ndarray:
    """``p``: the unit terms ``c`` summed over each leaf and its ancestors (``c`` not
    modified), at ``leaves``."""
    c = c.copy()
    _push_down(forest, c)
    return c[leaves]


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
    with room, then by the sums; returns what that adds to the leaves' path sums (``None``:
    nothing raised)."""
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
        for first, m, pos, q, w in rows.sums:
            here = np.flatnonzero((rows.depth[node] == d) & (deficit > 0) & (pos[node] >= 0)
                                  & (q[cell] > 0))
            if here.size == 0:
                continue
            # one raise per unit: enough for its largest need among the cells the row covers
            units, inv = np.unique(node[here], return_inverse=True)
            need = np.zeros(units.size)
            np.maximum.at(need, inv, deficit[here] / q[cell[here]])
            idx = first + pos[units] * m
            step = np.clip(w - mu[idx], 0.0, need)
            mu[idx] += step
            raised[units] += step[:, None] * q
            deficit[here] -= step[inv] * q[cell[here]]
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
