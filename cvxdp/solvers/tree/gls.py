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

from .forest import Forest

__all__ = ["Block", "Invariant", "TreeGLS"]


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

    def scatter_add(self, out: np.ndarray, rows: np.ndarray) -> None:
        """``out[nodes[i]] += rows[i]`` (a fancy ``+=`` when the units are distinct, which is
        many times faster than ``np.add.at``)."""
        if self._distinct:
            out[self.nodes] += rows
        else:
            np.add.at(out, self.nodes, rows)

    @property
    def _distinct(self) -> bool:
        d = self.__dict__.get("_distinct_cache")
        if d is None:
            d = self.__dict__["_distinct_cache"] = bool(np.unique(self.nodes).size == self.nodes.size)
        return d


@dataclass
class Invariant:
    """Exact linear facts ``E x_v = e[i]`` at the units ``nodes`` (``E`` ``(r, k)``, ``e``
    ``(u, r)``): known totals or queries that the estimate must meet exactly."""

    nodes: np.ndarray
    E: np.ndarray
    e: np.ndarray

    def __post_init__(self) -> None:
        self.nodes = np.asarray(self.nodes, dtype=np.int64).ravel()
        self.E = np.atleast_2d(np.asarray(self.E.toarray() if hasattr(self.E, "toarray") else self.E,
                                          dtype=float))
        self.e = np.asarray(self.e, dtype=float).reshape(self.nodes.size, self.E.shape[0])
        if not (np.all(np.isfinite(self.E)) and np.all(np.isfinite(self.e))):
            raise ValueError("Invariant: E and e must be finite")


class TreeGLS:
    """The two passes of the module docstring for a forest and measurement blocks.

    Parameters
    ----------
    forest : the units' tree.
    k : cells per histogram.
    blocks : the measurements.
    invariants : exact linear facts; each is imposed by conditioning the unit's estimate on
        it in the upward pass (a Kalman update with no noise), so the estimate and its
        covariance meet it exactly and the covariance is singular in its directions
        (pseudo-inverses in the passes, as the formulas allow; see :meth:`_new_class`).
    prox : information ``prox * I`` added at every leaf (the ADMM's proximal term).
    """

    def __init__(self, forest: Forest, k: int, blocks: Sequence[Block],
                 invariants: Sequence[Invariant] = (), prox: float = 0.0) -> None:
        self.forest, self.k = forest, int(k)
        self.blocks, self.invariants = list(blocks), list(invariants)
        self.prox = float(prox)
        for b in self.blocks + self.invariants:
            width = b.Q.shape[1] if isinstance(b, Block) else b.E.shape[1]
            if width != self.k:
                raise ValueError(f"TreeGLS: a block has {width} columns, the histograms {self.k}")
            if b.nodes.size and (b.nodes.min() < 0 or b.nodes.max() >= forest.n):
                raise ValueError("TreeGLS: a block names a unit outside the tree")
        self._pos = np.empty(forest.n, dtype=np.int64)
        self._pos[forest.order] = np.arange(forest.n)
        self._info_classes()
        self._factor()
        self._sums: dict[int, np.ndarray] = {}     # per level: the children's sums of m

    # ------------------------------------------------------------------ factorisation
    def _info_classes(self) -> None:
        """``a_class[pos]`` (BFS positions): units with the same blocks and invariants share
        ``A`` and the invariant rows ``E``."""
        f = self.forest
        n = f.n
        members: list[list] = [[] for _ in range(n)]
        for i, b in enumerate(self.blocks):
            for v in self._pos[b.nodes]:
                members[v].append(i)
        inv_of = np.full(n, -1, dtype=np.int64)
        for i, b in enumerate(self.invariants):
            pos = self._pos[b.nodes]
            if np.any(inv_of[pos] >= 0):
                v = int(f.order[pos[inv_of[pos] >= 0][0]])
                raise ValueError(f"TreeGLS: unit {v} is in two invariant blocks; stack their rows")
            inv_of[pos] = i
        self._inv_of = inv_of
        leaf = ~f.is_internal[f.order]
        infos = [b.info for b in self.blocks]
        keys: dict[tuple, int] = {}
        self._A: list[np.ndarray] = []
        self._E: list[np.ndarray | None] = []
        a_class = np.empty(n, dtype=np.int64)
        for p in range(n):
            key = (tuple(members[p]), int(inv_of[p]), bool(leaf[p] and self.prox > 0))
            c = keys.get(key)
            if c is None:
                A = np.zeros((self.k, self.k))
                for i in members[p]:
                    A += infos[i]
                if key[2]:
                    A[np.diag_indices(self.k)] += self.prox
                c = keys[key] = len(self._A)
                self._A.append(A)
                self._E.append(self.invariants[key[1]].E if key[1] >= 0 else None)
            a_class[p] = c
        self._a_class = a_class

    def _factor(self) -> None:
        """Upward pass over the matrices, one computation per distinct class."""
        f = self.forest
        n = f.n
        self._p_class = np.empty(n, dtype=np.int64)
        self._P: list[np.ndarray] = []          # per P-class: P_v
        self._T: list[np.ndarray | None] = []   # per P-class: S_v^+ (None for a leaf)
        self._G: list[np.ndarray | None] = []   # per P-class: (S_v A_v + I)^{-1}
        self._K: list[np.ndarray | None] = []   # per P-class: the invariant's gain
        keys: dict[tuple, int] = {}
        child_key = np.empty(n, dtype=object)
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
        """``P``, ``S^+``, ``G`` and the invariant's gain ``K`` of one class.

        Fusion in covariance form, ``P = S (A S + I)^{-1}`` and ``m = P b + (S A + I)^{-1} m_s``
        (equal to the information form when ``S`` is invertible, and still exact when
        invariants below make it singular: ``A S + I`` is always invertible).  An invariant
        ``E x = e`` then conditions the estimate, ``K = P E^T (E P E^T)^+``,
        ``m <- m + K (e - E m)``, ``P <- P - K E P``."""
        A, E = self._A[key[0]], self._E[key[0]]
        kids = key[1]
        k = self.k
        if not kids:
            try:
                L = np.linalg.cholesky(A)
            except np.linalg.LinAlgError:
                rank = int(np.linalg.matrix_rank(A))
                raise ValueError(f"TreeGLS: leaf {int(self.forest.order[p])} is measured on a rank "
                                 f"{rank} subspace of its {k} cells: every leaf needs "
                                 f"measurements that determine its histogram") from None
            Li = np.linalg.inv(L)
            P, T, G = Li.T @ Li, None, None
        else:
            S = np.zeros((k, k))
            for c in kids:
                S += self._P[c]
            # (S A + I)^{-1} is the transpose of (A S + I)^{-1} (A, S symmetric): one inverse
            H = np.linalg.inv(A @ S + np.eye(k))
            P, G = _sym(S @ H), H.T
            # without invariants S is a sum of positive definite P's: its inverse by Cholesky;
            # invariants below make it singular, then the pseudo-inverse
            T = _pinv_psd(S) if self.invariants else _inv_pd(S)
        K = None
        if E is not None:
            M = E @ P @ E.T
            K = P @ E.T @ _pinv_psd(M)
            P = _sym(P - K @ E @ P)
        self._P.append(P)
        self._T.append(T)
        self._G.append(G)
        self._K.append(K)

    def leaf_curvature(self) -> float:
        """The median curvature of a leaf cell as a function of the leaves (the diagonal of
        the information on its own and on every ancestor's histogram: a leaf cell enters each
        of them), a scale for proximal terms."""
        f = self.forest
        diag = np.array([np.diag(A) for A in self._A])[self._a_class]     # BFS positions
        for d in range(1, f.n_levels):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, _, sizes = f.level_children(d)
            diag[lo:hi] += np.repeat(diag[parents], sizes, axis=0)
        leaf = diag[~f.is_internal[f.order]]
        leaf = leaf[leaf > 0]
        return float(np.median(leaf)) if leaf.size else 1.0

    # ------------------------------------------------------------------ solves
    def rhs(self) -> np.ndarray:
        """``b_v = sum Q^T diag(w) y_v`` of the blocks, ``(n, k)`` in original unit order."""
        b = np.zeros((self.forest.n, self.k))
        for blk in self.blocks:
            blk.scatter_add(b, (blk.y * blk.w) @ blk.Q)
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
        lo, hi = f.level_bounds[-2], f.level_bounds[-1]
        self._condition(m, np.arange(lo, hi))
        for d in range(f.n_levels - 1, 0, -1):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, starts, _ = f.level_children(d)
            sums = np.add.reduceat(m[lo:hi], starts, axis=0)
            m[parents] += _apply(self._G, self._p_class[parents], sums)
            self._sums[d] = sums
            # a level's leaves were conditioned above with the deepest ones; its parents now
            self._condition(m, parents)
            leaves = np.arange(f.level_bounds[d - 1], f.level_bounds[d])
            leaves = leaves[~f.is_internal[f.order[leaves]]]
            self._condition(m, leaves)
        return m

    def _condition(self, m: np.ndarray, rows: np.ndarray) -> None:
        """``m <- m + K (e - E m)`` at the rows (BFS positions) with an invariant."""
        if not self.invariants or rows.size == 0:
            return
        inv = self._inv_of[rows]
        for i in np.unique(inv[inv >= 0]):
            sel = rows[inv == i]
            blk = self.invariants[int(i)]
            e = blk.e[self._rows_of(blk, sel)]
            m[sel] += self._gain(sel, e - m[sel] @ blk.E.T)
            # an invariant the invariants below already fix can only be met if it agrees
            left = np.abs(e - m[sel] @ blk.E.T)
            scale = 1.0 + np.abs(e) + np.abs(m[sel]) @ np.abs(blk.E.T)
            bad = left > _INVARIANT_TOL * scale
            if bad.any():
                r, q = np.argwhere(bad)[0]
                raise ValueError(f"TreeGLS: the invariants contradict at unit "
                                 f"{int(self.forest.order[sel[r]])} (row {q}): {e[r, q]:.10g} "
                                 f"against {e[r, q] - left[r, q]:.10g} from the invariants below it")

    def _rows_of(self, blk: Invariant, sel: np.ndarray) -> np.ndarray:
        """Rows of ``blk.e`` for the BFS positions ``sel``."""
        where = {int(v): i for i, v in enumerate(blk.nodes)}
        return np.array([where[int(v)] for v in self.forest.order[sel]], dtype=np.int64)

    def _gain(self, sel: np.ndarray, resid: np.ndarray) -> np.ndarray:
        """``K_v resid_v`` for the positions ``sel`` (grouped by class)."""
        out = np.empty((sel.size, self.k))
        cls = self._p_class[sel]
        for c in np.unique(cls):
            rows = cls == c
            out[rows] = resid[rows] @ self._K[int(c)].T
        return out

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
    def covariances(self) -> tuple[np.ndarray, np.ndarray]:
        """``(where, mats)``: the covariance of the estimate of each unit (bfs position ``p``)
        is ``mats[where[p]]``, one ``(k, k)`` matrix per class of units that share it.

        Level by level: ``C_v = P_v - J P_v + J C_u J^T`` with ``J = P_v T_u``, ``u`` the
        parent, so units with the same own class, parent class and parent covariance share
        ``C_v``; the classes are found with one ``np.unique`` over those triples per level."""
        f = self.forest
        roots = np.arange(f.level_bounds[0], f.level_bounds[1])
        where = np.empty(f.n, dtype=np.int64)
        root_cls, where[roots] = np.unique(self._p_class[roots], return_inverse=True)
        # T is indexed by parent classes only (a leaf's None never read)
        zero = np.zeros((self.k, self.k))
        P_all = np.stack(self._P)
        T_all = np.stack([zero if T is None else T for T in self._T])
        mats = P_all[root_cls]
        for d in range(1, f.n_levels):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents, _, sizes = f.level_children(d)
            par_of = np.repeat(parents, sizes)
            keys, inv = _unique_triples(self._p_class[lo:hi], self._p_class[par_of], where[par_of],
                                        P_all.shape[0], mats.shape[0])
            where[lo:hi] = mats.shape[0] + inv
            mats = np.concatenate([mats, _child_covariances(P_all, T_all, mats, keys)])
        return where, mats

    def variances(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """``(cells, queries)``: each cell's variance ``(n, k)`` and, per block, each query's
        variance ``(u, m)``, in original unit order."""
        f = self.forest
        where, mats = self.covariances()
        pos = np.empty(f.n, dtype=np.int64)
        pos[f.order] = np.arange(f.n)
        cells = np.diagonal(mats, axis1=1, axis2=2)[where[pos]]
        qvar = []
        for b in self.blocks:
            used, inv = np.unique(where[pos[b.nodes]], return_inverse=True)
            qvar.append(_quad_diag(b.Q, mats, used)[inv.ravel()])
        return cells, qvar


def _unique_triples(a: np.ndarray, b: np.ndarray, c: np.ndarray, nb: int, nc: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``[a, b, c]`` (``0 <= b < nb``, ``0 <= c < nc``) and each row's
    index among them: one integer key per row when it fits in int64 (a sort of integers is
    several times faster than ``np.unique(axis=0)``'s)."""
    if (int(a.max(initial=0)) + 1) * nb * nc < 2 ** 62:
        uniq, inv = np.unique((a * nb + b) * nc + c, return_inverse=True)
        keys = np.column_stack([uniq // (nb * nc), (uniq // nc) % nb, uniq % nc])
        return keys, inv.ravel()
    keys, inv = np.unique(np.column_stack([a, b, c]), axis=0, return_inverse=True)
    return keys, inv.ravel()


def _child_covariances(P_all: np.ndarray, T_all: np.ndarray, mats: np.ndarray, keys: np.ndarray,
                       chunk: int = 256) -> np.ndarray:
    """``C_v = P - J P + J C_u J^T = P + J (C_u J^T - P)``, ``J = P T``, for each row
    ``(own class, parent class, parent covariance)`` of ``keys``: batched matrix products in
    chunks (bounded memory)."""
    out = np.empty((keys.shape[0],) + P_all.shape[1:])
    for a in range(0, keys.shape[0], chunk):
        kk = keys[a:a + chunk]
        P = P_all[kk[:, 0]]
        J = np.matmul(P, T_all[kk[:, 1]])
        out[a:a + chunk] = P + np.matmul(J, np.matmul(mats[kk[:, 2]], np.swapaxes(J, 1, 2)) - P)
    return out


def _quad_diag(Q: np.ndarray, mats: np.ndarray, used: np.ndarray, chunk: int = 256) -> np.ndarray:
    """``diag(Q C Q^T)`` for each ``C = mats[j]``, ``j`` in ``used``: batched matrix products in
    chunks of classes (bounded memory)."""
    out = np.empty((used.size, Q.shape[0]))
    for a in range(0, used.size, chunk):
        QC = np.matmul(Q, mats[used[a:a + chunk]])            # (c, m, k)
        out[a:a + chunk] = np.sum(QC * Q, axis=2)
    return out


def _sym(M: np.ndarray) -> np.ndarray:
    return 0.5 * (M + M.T)


# an invariant left unmet by this much (relative) after conditioning contradicts the others
_INVARIANT_TOL = 1e-8
# eigenvalues of a covariance below this fraction of its largest are exact zeros (invariants)
_PINV_TOL = 1e-11


def _inv_pd(M: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive definite matrix by Cholesky (the pseudo-inverse if
    rounding made it indefinite)."""
    try:
        Li = np.linalg.inv(np.linalg.cholesky(M))
    except np.linalg.LinAlgError:
        return _pinv_psd(M)
    return Li.T @ Li


def _pinv_psd(M: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a symmetric positive semidefinite matrix (eigenvalues below
    ``_PINV_TOL`` of the largest are zeros: directions an invariant made exact)."""
    w, V = np.linalg.eigh(_sym(M))
    big = w > _PINV_TOL * max(float(w.max(initial=0.0)), 1e-300)
    return (V[:, big] / w[big]) @ V[:, big].T


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
