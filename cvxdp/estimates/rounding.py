"""``round_consistent``: integer, non-negative, consistent counts from a real consistent solution.

The estimates of a hierarchy (GLS, non-negative least squares, L1) are real numbers; a
statistical office publishes integers that still add up: every parent equals the sum of its
children, cell by cell, and every invariant holds.  :func:`round_consistent` rounds each entry
to its floor or ceiling so that this holds exactly, at the least (weighted) L1 distance to the
real solution, without a MIP solver (the tree's constraint matrix is totally unimodular; the
algorithm and what holds for two nested query families are in
:mod:`cvxdp.solvers.tree.rounding`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from ..solvers.tree.rounding import round_consistent as _round
from ..solvers.tree.forest import Forest

__all__ = ["round_consistent", "forest_of"]


def forest_of(consistency) -> Forest:
    """The forest behind ``consistency``: an object with a ``forest`` attribute
    (:func:`cvxdp.workloads.hierarchy`, :func:`cvxdp.workloads.geography`), a parent array
    (``parent[v]``, ``-1`` for a root), or a sparse parent-minus-children matrix (one row per
    internal node: ``+1`` at the parent, ``-1`` at each child, as ``hierarchy(...).consistency``)."""
    forest = getattr(consistency, "forest", None)
    if isinstance(forest, Forest):
        return forest
    if sp.issparse(consistency):
        # a copy: its duplicates are summed in place, and the caller's matrix is not ours to change
        return Forest(_parents_from_matrix(sp.csr_matrix(consistency, copy=True)))
    arr = np.asarray(consistency)
    if arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer):
        return Forest(arr)
    raise TypeError("consistency must be a hierarchy or geography, a parent array, or a sparse "
                    f"parent-minus-children matrix; got {type(consistency).__name__}")


def _parents_from_matrix(C: sp.csr_matrix) -> np.ndarray:
    n = C.shape[1]
    parent = np.full(n, -1, dtype=np.int64)
    C.sum_duplicates()
    for r in range(C.shape[0]):
        cols = C.indices[C.indptr[r]:C.indptr[r + 1]]
        vals = C.data[C.indptr[r]:C.indptr[r + 1]]
        heads, kids = cols[vals == 1], cols[vals == -1]
        if heads.size != 1 or kids.size == 0 or heads.size + kids.size != cols.size:
            raise ValueError(f"consistency row {r} is not one parent (+1) minus its children (-1)")
        taken = kids[parent[kids] >= 0]
        if taken.size:
            raise ValueError(f"consistency: node {int(taken[0])} is a child in two rows (row {r} "
                             f"and an earlier one): not a tree")
        parent[kids] = heads[0]
    return parent


def round_consistent(consistency, x, *, weights=None, fixed=None, invariants=None,
                     tol: float = 1e-9) -> np.ndarray:
    """Integer counts ``X`` from a real, non-negative, consistent ``x``.

    Parameters
    ----------
    consistency : a hierarchy or geography (``cvxdp.workloads.hierarchy(...)``,
        ``cvxdp.workloads.geography(...)``), a parent array, or its sparse parent-minus-children
        matrix (``hierarchy(...).consistency``).
    x : array, one entry per node (``(n,)``) or one row per node with one column per histogram
        cell (``(n, k)``), in the nodes' order; consistent (``x_p = sum`` of its children's rows,
        to ``tol``) and non-negative.  Not modified.
    weights : non-negative weights of ``|X - x|`` (per node ``(n,)`` or per entry), default 1.
    fixed : entries of ``x`` kept exactly (they must be integers) -- a boolean mask (per node
        or per entry) or a sequence of node indices (all of their cells).
    invariants : known exact values, ``{node: value}`` (a number for a scalar tree or for every
        cell, or one value per cell with ``nan`` for cells that are not invariant): integers,
        which ``x`` must already satisfy; they are kept like ``fixed`` entries.
    tol : integrality and consistency tolerance (relative to the values).

    Returns
    -------
    numpy array of ``x``'s shape with integer values (float dtype): every parent is the sum of
    its children exactly, every entry is ``floor(x)`` or ``ceil(x)`` (``x`` itself where it is an
    integer), fixed entries are kept, and ``sum w |X - x|`` is the least possible.

    Raises ``ValueError`` naming the node and column for input that is negative, not finite or
    not consistent, a fixed entry that is not an integer, or fixed entries that contradict each
    other (no rounding keeps them all).
    """
    forest = forest_of(consistency)
    x = np.asarray(x, dtype=float)
    if np.iscomplexobj(x):
        raise ValueError("x must be real")
    if fixed is not None and not (isinstance(fixed, np.ndarray) and fixed.dtype == bool):
        fixed = _node_mask(fixed, forest.n, x)
    if invariants:
        inv = _invariant_mask(forest, invariants, x, tol)
        fixed = inv if fixed is None else (np.broadcast_to(
            np.asarray(fixed).reshape(fixed.shape + (1,) * (x.ndim - np.ndim(fixed))), x.shape) | inv)
    return _round(forest, x, weights=weights, fixed=fixed, tol=tol)


def _invariant_mask(forest: Forest, invariants, x: np.ndarray, tol: float) -> np.ndarray:
    """The entries the invariants fix, after checking them: integers, not contradicting each
    other (a parent and all its children invariant must add up), and met by ``x``."""
    if not isinstance(invariants, dict):
        raise TypeError("invariants must be a dict {node: value}")
    vals = np.full(x.shape, np.nan)
    for node, value in invariants.items():
        v = int(node)
        if not 0 <= v < forest.n:
            raise ValueError(f"invariants: node {node!r} is not in [0, {forest.n})")
        val = np.asarray(value, dtype=float)
        if x.ndim == 1 and val.ndim:
            raise ValueError(f"invariants: node {v} takes one number (x has one entry per node)")
        vals[v] = val
    mask = ~np.isnan(vals)
    bad = mask & (np.abs(vals - np.round(np.where(mask, vals, 0))) > 0)
    if bad.any():
        v, *j = np.argwhere(bad)[0]
        raise ValueError(f"invariant at node {v}{_col(j)} is not an integer: {vals[tuple([v] + j)]!r}")
    children = [[] for _ in range(forest.n)]
    for c, p in enumerate(forest.parent):
        if p >= 0:
            children[p].append(c)
    for p, kids in enumerate(children):
        if kids and mask[p].all() and mask[kids].all():
            s = vals[kids].sum(axis=0)
            off = np.abs(s - vals[p]) > tol * np.maximum(1.0, np.abs(vals[p]))
            if np.any(off):
                j = list(np.argwhere(np.atleast_1d(off))[0]) if x.ndim > 1 else []
                raise ValueError(f"invariants contradict at node {p}{_col(j)}: its invariant is "
                                 f"{vals[tuple([p] + j)]:g}, its children's add up to "
                                 f"{s[tuple(j)] if j else s:g}")
    off = mask & (np.abs(np.where(mask, vals, 0) - x) > tol * np.maximum(1.0, np.abs(x)))
    if off.any():
        v, *j = np.argwhere(off)[0]
        raise ValueError(f"x does not meet the invariant at node {v}{_col(j)}: invariant "
                         f"{vals[tuple([v] + j)]:g}, x {x[tuple([v] + j)]:.10g}")
    return mask


def _col(j) -> str:
    return f", column {int(j[0])}" if len(j) else ""


def _node_mask(fixed, n: int, x: np.ndarray) -> np.ndarray:
    arr = np.asarray(fixed)
    if arr.dtype == bool:
        return arr
    idx = np.asarray(list(fixed) if isinstance(fixed, Sequence) else arr, dtype=np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"fixed: node indices must be in [0, {n})")
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask
