"""Exact generalised least squares over a tree with a histogram at every node, with variances.

Model.  A forest of units; unit ``v`` has a histogram ``x_v`` of ``k`` cells and every parent
is the sum of its children, ``x_p = sum_{c child of p} x_c`` (so the leaves determine
everything).  Measurement blocks ``y = Q x_v + e`` (``m`` queries over the ``k`` cells, noise
independent with variances ``1 / w``) are taken at any units, several blocks per unit allowed.
The GLS estimate minimises

    sum_blocks sum_v  1/2 (Q x_v - y_v)^T diag(w) (Q x_v - y_v)     over consistent trees,

the maximum-likelihood estimate for Gaussian noise (the two-pass estimator of Hay et al.,
VLDB 2010, for scalar counts and identity measurements; the Census Bureau's GLS uncertainty
work does the same per geography).  With ``A_v = sum Q^T diag(w) Q`` and
``b_v = sum Q^T diag(w) y`` the information each unit's own blocks carry:

Upward pass (Kalman filtering on the tree).  ``m_v, P_v`` is the estimate of ``x_v`` and its
covariance from the measurements in ``v``'s subtree.  For a leaf ``P_v = A_v^{-1}``,
``m_v = P_v b_v``.  For a parent, the children's estimates add up to an estimate of ``x_v``
with covariance ``S_v = sum_c P_c`` (the subtrees are independent); fusing it with ``v``'s own
measurements,

    P_v = (A_v + S_v^{-1})^{-1},     m_v = P_v (b_v + S_v^{-1} sum_c m_c).

Downward pass (smoothing).  At a root the estimate is final, ``xhat = m``.  Given its parent's
final estimate, children's estimates are the conditional mean of independent Gaussians
``N(m_c, P_c)`` given their sum:

    xhat_c = m_c + P_c S_v^{-1} (xhat_v - sum_c' m_c'),
    C_c    = P_c - P_c S_v^{-1} P_c + P_c S_v^{-1} C_v S_v^{-1} P_c,

``C_v`` the covariance of the estimate (``C = P`` at a root): its diagonal gives each cell's
variance, ``diag(Q C_v Q^T)`` each query's (the Rauch-Tung-Striebel recursion on a tree).

Cost: ``O(k^3)`` per distinct matrix and ``O(k^2)`` per unit.  Units whose blocks, and whose
subtrees' matrices, coincide share ``P``, ``S^{-1}`` and ``C`` (classes keyed by the block set
and the children's classes): a geography measured the same way at every level of a level has
a few hundred distinct matrices however many units it has, and the per-unit work is batched
matrix products.

Every leaf needs information on all its cells (``A_v`` positive definite): otherwise a
direction of a leaf's histogram is measured nowhere below it and the estimate is not unique
without its siblings' and parents' help, which this pass does not use; :class:`TreeGLS`
raises ``ValueError`` naming the leaf.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .tree import Forest

__all__ = ["Block", "TreeGLS"]


@dataclass
class Block:
    """Measurements ``y[i] = Q x_{nodes[i]} + e`` with noise variances ``1 / w`` per query.

    ``nodes`` (original unit indices, ``(u,)``), ``Q`` ``(m, k)``, ``w`` ``(m,)`` positive,
    ``y`` ``(u, m)``."""

    nodes: np.ndarray
    Q: np.ndarray
    w: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        self.nodes = np.asarray(self.nodes, dtype=np.int64).ravel()
        self.Q = np.atleast_2d(np.asarray(self.Q.toarray() if hasattr(self.Q, "toarray") else self.Q,
                                          dtype=float))
        m = self.Q.shape[0]
        self.w = np.broadcast_to(np.asarray(self.w, dtype=float), (m,)).copy()
        self.y = np.asarray(self.y, dtype=float).reshape(self.nodes.size, m)
        if not (np.all(np.isfinite(self.Q)) and np.all(np.isfinite(self.y))):
            raise ValueError("Block: Q and y must be finite")
        if not np.all(np.isfinite(self.w)) or np.any(self.w <= 0):
            raise ValueError("Block: weights (inverse variances) must be positive and finite")

    @property
    def info(self) -> np.ndarray:
        """``Q^T diag(w) Q``."""
        return self.Q.T @ (self.w[:, None] * self.Q)


class TreeGLS:
    """The two passes of the module docstring for a forest and measurement blocks.

    Parameters
    ----------
    forest : the units' tree.
    k : cells per histogram.
    blocks : the measurements.
    extra : optional ``(n, k)`` non-negative weights of an identity measurement on every
        cell (added information ``diag(extra_v)`` at each unit; the ADMM's proximal term).
    """

    def __init__(self, forest: Forest, k: int, blocks: Sequence[Block],
                 extra: np.ndarray | None = None) -> None:
        self.forest, self.k = forest, int(k)
        self.blocks = list(blocks)
        for b in self.blocks:
            if b.Q.shape[1] != self.k:
                raise ValueError(f"TreeGLS: a block has {b.Q.shape[1]} columns, the histograms {self.k}")
            if b.nodes.size and (b.nodes.min() < 0 or b.nodes.max() >= forest.n):
                raise ValueError("TreeGLS: a block names a unit outside the tree")
        self._info_classes(extra)
        self._factor()
        self._sums: dict[int, np.ndarray] = {}     # per level: the children's sums of m

    # ------------------------------------------------------------------ factorisation
    def _info_classes(self, extra: np.ndarray | None) -> None:
        """``a_class[pos]`` (BFS positions): units with the same blocks share ``A``."""
        f = self.forest
        n = f.n
        pos = np.empty(n, dtype=np.int64)
        pos[f.order] = np.arange(n)
        members: list[list[int]] = [[] for _ in range(n)]
        for i, b in enumerate(self.blocks):
            for v in pos[b.nodes]:
                members[v].append(i)
        infos = [b.info for b in self.blocks]
        keys: dict[tuple, int] = {}
        mats: list[np.ndarray] = []
        a_class = np.empty(n, dtype=np.int64)
        for p in range(n):
            key = tuple(members[p])
            if extra is not None:
                key = key + (("extra", p),)   # a proximal term makes every unit its own class
            c = keys.get(key)
            if c is None:
                A = np.zeros((self.k, self.k))
                for i in members[p]:
                    A += infos[i]
                if extra is not None:
                    A[np.diag_indices(self.k)] += extra[f.order[p]]
                c = keys[key] = len(mats)
                mats.append(A)
            a_class[p] = c
        self._A = mats
        self._a_class = a_class

    def _factor(self) -> None:
        """Upward pass over the matrices, one computation per distinct class."""
        f = self.forest
        n = f.n
        self._p_class = np.empty(n, dtype=np.int64)
        self._P: list[np.ndarray] = []          # per P-class: P_v
        self._T: list[np.ndarray | None] = []   # per P-class: S_v^{-1} (None for a leaf)
        self._G: list[np.ndarray | None] = []   # per P-class: P_v S_v^{-1}
        keys: dict[tuple, int] = {}
        child_key = np.zeros(n, dtype=object)
        for p in range(n):
            child_key[p] = ()
        for d in range(f.n_levels - 1, 0, -1):
            self._classes_of_level(d, keys, child_key)
            lo = f.level_bounds[d]
            parents, starts, sizes = f.level_children(d)
            for par, s, z in zip(parents, starts, sizes):
                child_key[par] = tuple(sorted(self._p_class[lo + s:lo + s + z].tolist()))
        self._classes_of_level(0, keys, child_key)

    def _classes_of_level(self, d: int, keys: dict, child_key: np.ndarray) -> None:
        f = self.forest
        for p in range(f.level_bounds[d], f.level_bounds[d + 1]):
            key = (int(self._a_class[p]), child_key[p])
            c = keys.get(key)
            if c is None:
                c = keys[key] = len(self._P)
                self._new_class(key, p)
            self._p_class[p] = c

    def _new_class(self, key: tuple, p: int) -> None:
        A = self._A[key[0]]
        kids = key[1]
        if not kids:
            try:
                L = np.linalg.cholesky(A)
            except np.linalg.LinAlgError:
                rank = int(np.linalg.matrix_rank(A))
                raise ValueError(f"TreeGLS: leaf {int(self.forest.order[p])} is measured on a rank "
                                 f"{rank} subspace of its {self.k} cells: every leaf needs "
                                 f"measurements that determine its histogram") from None
            Li = np.linalg.inv(L)
            self._P.append(Li.T @ Li)
            self._T.append(None)
            self._G.append(None)
            return
        S = np.zeros((self.k, self.k))
        for c in kids:
            S += self._P[c]
        T = _spd_inverse(S)
        P = _spd_inverse(A + T)
        self._P.append(P)
        self._T.append(T)
        self._G.append(P @ T)

    # ------------------------------------------------------------------ solves
    def rhs(self) -> np.ndarray:
        """``b_v = sum Q^T diag(w) y_v`` of the blocks, ``(n, k)`` in original unit order."""
        b = np.zeros((self.forest.n, self.k))
        for blk in self.blocks:
            np.add.at(b, blk.nodes, (blk.y * blk.w) @ blk.Q)
        return b

    def solve(self, b: np.ndarray | None = None) -> np.ndarray:
        """The minimiser of ``sum 1/2 x_v^T A_v x_v - b_v^T x_v`` over consistent trees
        (default ``b``: the blocks', the GLS estimate), ``(n, k)`` in original unit order."""
        f = self.forest
        bb = (self.rhs() if b is None else np.asarray(b, dtype=float).reshape(f.n, self.k))[f.order]
        m = self._upward(bb)
        x = self._downward(m)
        out = np.empty_like(x)
        out[f.order] = x
        return out

    def _upward(self, bb: np.ndarray) -> np.ndarray:
        f = self.forest
        m = _apply(self._P, self._p_class, bb, slice(0, f.n))
        for d in range(f.n_levels - 1, 0, -1):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, starts, _ = f.level_children(d)
            sums = np.add.reduceat(m[lo:hi], starts, axis=0)
            m[parents] += _apply(self._G, self._p_class[parents], sums)
            self._sums[d] = sums
        return m

    def _downward(self, m: np.ndarray) -> np.ndarray:
        f = self.forest
        x = m.copy()
        for d in range(1, f.n_levels):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, _, sizes = f.level_children(d)
            u = _apply(self._T, self._p_class[parents], x[parents] - self._sums[d])
            x[lo:hi] += _apply(self._P, self._p_class[lo:hi], np.repeat(u, sizes, axis=0))
        return x

    # ------------------------------------------------------------------ variances
    def covariances(self):
        """Yield ``(bfs positions, C)`` level by level: the covariance of the estimate of each
        unit (one ``(k, k)`` matrix shared by the positions listed)."""
        f = self.forest
        roots = np.arange(f.level_bounds[0], f.level_bounds[1])
        cur: dict[int, np.ndarray] = {}
        cls = np.empty(f.n, dtype=np.int64)
        for c in np.unique(self._p_class[roots]):
            cur[int(c)] = self._P[c]
        cls[roots] = self._p_class[roots]
        for c, mat in cur.items():
            yield roots[self._p_class[roots] == c], mat
        for d in range(1, f.n_levels):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, _, sizes = f.level_children(d)
            par_of = np.repeat(parents, sizes)
            keys: dict[tuple, int] = {}
            nxt: dict[int, np.ndarray] = {}
            pos = np.arange(lo, hi)
            for q in range(lo, hi):
                key = (int(self._p_class[q]), int(self._p_class[par_of[q - lo]]), int(cls[par_of[q - lo]]))
                c = keys.get(key)
                if c is None:
                    P, T, Cv = self._P[key[0]], self._T[key[1]], cur[key[2]]
                    J = P @ T
                    c = keys[key] = len(keys)
                    nxt[c] = P - J @ P + J @ Cv @ J.T
                cls[q] = c
            for c, mat in nxt.items():
                yield pos[cls[lo:hi] == c], mat
            cur = nxt

    def variances(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(cells, queries)``: each cell's variance ``(n, k)`` and, per block, each query's
        variance ``(u, m)``, in original unit order."""
        f = self.forest
        cells = np.empty((f.n, self.k))
        qvar = [np.empty((b.nodes.size, b.Q.shape[0])) for b in self.blocks]
        pos = np.empty(f.n, dtype=np.int64)
        pos[f.order] = np.arange(f.n)
        block_pos = [pos[b.nodes] for b in self.blocks]
        where = np.full(f.n, -1, dtype=np.int64)
        mats: list[np.ndarray] = []
        for p, C in self.covariances():
            where[p] = len(mats)
            mats.append(C)
            cells[f.order[p]] = np.diag(C)
        for i, b in enumerate(self.blocks):
            ids = where[block_pos[i]]
            for j in np.unique(ids):
                C = mats[j]
                qv = np.einsum("ij,jk,ik->i", b.Q, C, b.Q)
                qvar[i][ids == j] = qv
        return cells, qvar


def _spd_inverse(M: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive definite matrix (Cholesky), symmetrised."""
    L = np.linalg.cholesky(M)
    Li = np.linalg.inv(L)
    return Li.T @ Li


def _apply(mats: list, classes: np.ndarray, vecs: np.ndarray, rows: slice | None = None) -> np.ndarray:
    """``out[i] = mats[classes[i]] @ vecs[i]``, grouped by class (one matrix product each)."""
    if rows is not None:
        classes = classes[rows]
        vecs = vecs[rows]
    out = np.empty_like(vecs)
    uniq, inv = np.unique(classes, return_inverse=True)
    if uniq.size == 1:
        return vecs @ mats[int(uniq[0])].T
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
    for j, c in enumerate(uniq):
        idx = order[bounds[j]:bounds[j + 1]]
        out[idx] = vecs[idx] @ mats[int(c)].T
    return out
