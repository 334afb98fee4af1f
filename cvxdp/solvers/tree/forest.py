"""Rooted forests and the O(n) least-squares projection onto tree consistency.

A *consistent* forest assigns values ``x`` to nodes such that every internal
node equals the sum of its children plus an offset,

    x_p = sum_{c in children(p)} x_c + b_p .                       (Hay et al. 2010, eq. 4 of Lee et al. 2015)

:class:`TreeLSQ` computes the weighted least-squares projection

    minimize  sum_v a_v (x_v - v_v)^2   subject to consistency      (Hay et al., VLDB 2010, Thm 3)

with two linear passes.  Bottom up, each subtree's optimal cost as a function
of its root value is a quadratic ``(t - beta_v)^2 / kappa_v``: ``beta_v`` is the
best estimate of ``x_v`` from the subtree and ``kappa_v`` its variance.  Children
combine by adding estimates and variances; a node then averages its own
measurement (variance ``1/a_v``) with the children's sum, weighting by
precision.  Top down, a parent's final value is split among its children in
proportion to their variances.  With unit weights on a complete k-ary tree this
is exactly the two-pass algorithm of Hay et al. (:func:`hay_projection`).

Weights may be ``inf`` (the node is fixed to ``v_v``) or ``0`` (no measurement):
the polishing step of ADMM uses both.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["Forest", "TreeLSQ", "hay_projection", "forest_from_rows"]

# Relative tolerance to call two row coefficients equal when recognising the
# "parent minus children" pattern in a user's sparse matrix.
_PATTERN_RTOL = 1e-12


class Forest:
    """A rooted forest stored in level (breadth-first) order.

    Parameters
    ----------
    parent : int array of length n; ``parent[v] = -1`` for roots.

    Internally nodes are renumbered breadth first so that the children of every
    node are contiguous and each level is a contiguous block; ``order[k]`` is the
    original index of the node at BFS position ``k``.
    """

    def __init__(self, parent: np.ndarray) -> None:
        parent = np.asarray(parent)
        if parent.ndim != 1 or not np.issubdtype(parent.dtype, np.integer):
            raise ValueError(f"parent must be a 1-D integer array, got dtype {parent.dtype} "
                             f"and shape {parent.shape}")
        n = parent.size
        if n and (parent.min() < -1 or parent.max() >= n):
            raise ValueError("parent entries must be -1 (root) or a node index in [0, n)")
        if np.any(parent == np.arange(n)):
            raise ValueError("a node cannot be its own parent")
        self.n = n
        self.parent = parent.astype(np.int64, copy=True)
        order, pos, bounds = self._bfs_order()
        self.order = order
        self.level_bounds = bounds              # level d occupies BFS positions [bounds[d], bounds[d+1])
        self.n_levels = len(bounds) - 1
        # Parent of each BFS position, in BFS positions (-1 for roots).
        ppos = np.full(n, -1, dtype=np.int64)
        nonroot = self.parent[order] >= 0
        ppos[nonroot] = pos[self.parent[order][nonroot]]
        self._blocks = self._child_blocks(ppos)
        counts = np.bincount(ppos[ppos >= 0], minlength=n) if n else np.zeros(0, np.int64)
        self._n_children_pos = counts
        self.is_internal = np.zeros(n, dtype=bool)
        self.is_internal[order[counts > 0]] = True
        self._identity = bool(np.array_equal(order, np.arange(n)))
        # parents of level d are a contiguous range when every node of level d-1
        # has children (complete trees): then slices replace fancy indexing.
        self._parent_slices = [None]
        for d in range(1, self.n_levels):
            parents = self._blocks[d][0]
            contiguous = parents.size and parents[-1] - parents[0] + 1 == parents.size
            self._parent_slices.append(slice(int(parents[0]), int(parents[-1]) + 1)
                                       if contiguous else parents)

    def _bfs_order(self):
        """``(order, pos, level bounds)``: BFS order by depth, then by the BFS position
        of the parent, then index; ``pos`` its inverse."""
        n = self.n
        depth = _depths(self.parent)
        order = np.empty(n, dtype=np.int64)
        pos = np.empty(n, dtype=np.int64)
        roots = np.flatnonzero(self.parent < 0)
        order[: roots.size] = roots
        pos[roots] = np.arange(roots.size)
        bounds = [0, roots.size]
        nodes_by_depth = np.argsort(depth, kind="stable")
        depth_sorted = depth[nodes_by_depth]
        max_depth = int(depth.max()) if n else -1
        cuts = np.searchsorted(depth_sorted, np.arange(max_depth + 2))
        for d in range(1, max_depth + 1):
            nodes = nodes_by_depth[cuts[d]:cuts[d + 1]]
            key = pos[self.parent[nodes]]
            nodes = nodes[np.argsort(key, kind="stable")]
            s = bounds[-1]
            order[s: s + nodes.size] = nodes
            pos[nodes] = np.arange(s, s + nodes.size)
            bounds.append(s + nodes.size)
        return order, pos, bounds

    def _child_blocks(self, ppos: np.ndarray) -> list:
        """Per level ``d >= 1``: the distinct parents (BFS positions, increasing), where
        each one's block of children starts in the level, the block sizes, and the
        common size ``k`` (0 when they differ)."""
        blocks = [None]
        for d in range(1, self.n_levels):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            pp = ppos[s:e]
            starts = np.flatnonzero(np.r_[True, pp[1:] != pp[:-1]])
            sizes = np.diff(np.r_[starts, e - s])
            k = int(sizes[0]) if sizes.size and np.all(sizes == sizes[0]) else 0
            blocks.append((pp[starts], starts, sizes, k))
        return blocks

    def level_children(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Level ``d >= 1`` in BFS positions: ``(parents, starts, sizes)``, the distinct
        parents (BFS positions, increasing) and, for each, where its block of children starts
        within the level and how many children it has."""
        if not 1 <= d < self.n_levels:
            raise ValueError(f"level_children: level {d} is not in 1 .. {self.n_levels - 1}")
        parents, starts, sizes, _ = self._blocks[d]
        return parents, starts, sizes

    # ------------------------------------------------- level-wise primitives
    def _to_bfs(self, x: np.ndarray, copy: bool = True) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self._identity:
            return x.copy() if copy else x
        return x[self.order]

    def _from_bfs(self, xp: np.ndarray) -> np.ndarray:
        if self._identity:
            return xp
        out = np.empty(self.n)
        out[self.order] = xp
        return out

    def _block_sum(self, d: int, vals: np.ndarray) -> np.ndarray:
        """Per-parent sums of ``vals`` (values of level ``d``, BFS order)."""
        _, starts, _, k = self._blocks[d]
        if 0 < k <= 8:
            out = vals[0::k].copy()
            for j in range(1, k):
                out += vals[j::k]
            return out
        return np.add.reduceat(vals, starts)

    def _block_reduce(self, d: int, vals: np.ndarray, op: np.ufunc) -> np.ndarray:
        """Per-parent ``op``-reduction (``np.maximum``/``np.minimum``) over level ``d``."""
        _, starts, _, k = self._blocks[d]
        if 0 < k <= 8:
            out = vals[0::k].copy()
            for j in range(1, k):
                op(out, vals[j::k], out=out)
            return out
        return op.reduceat(vals, starts)

    def _expand(self, d: int, per_parent: np.ndarray) -> np.ndarray:
        """Repeat per-parent values over the children of level ``d``."""
        _, _, sizes, k = self._blocks[d]
        return np.repeat(per_parent, k if k else sizes)

    # ------------------------------------------------------------------ basics
    @property
    def internal(self) -> np.ndarray:
        """Original indices of internal nodes (those with children), ascending."""
        return np.flatnonzero(self.is_internal)

    @property
    def leaves(self) -> np.ndarray:
        """Original indices of leaves, ascending."""
        return np.flatnonzero(~self.is_internal)

    def children_sum(self, x: np.ndarray) -> np.ndarray:
        """``s_p = sum of x over the children of p`` (zero for leaves), original order."""
        xp = self._to_bfs(x)
        out = np.zeros(self.n)
        for d in range(1, self.n_levels):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            out[self._parent_slices[d]] = self._block_sum(d, xp[s:e])
        return self._from_bfs(out)

    def residual(self, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``x_p - sum_children x_c - b_p`` for every internal node (ascending index)."""
        x = np.asarray(x, dtype=float)
        r = x - self.children_sum(x)
        if b is not None:
            r = r - b
        return r[self.is_internal]

    def sum_up(self, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """Keep the leaves of ``x`` and recompute every internal node bottom up."""
        xp = self._to_bfs(x)
        bp = None if b is None else self._to_bfs(b)
        for d in range(self.n_levels - 1, 0, -1):
            par = self._parent_slices[d]
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            xp[par] = self._block_sum(d, xp[s:e])
            if bp is not None:
                xp[par] += bp[par]
        return self._from_bfs(xp)

    def consistency_matrix(self) -> sp.csr_matrix:
        """Rows ``x_p - sum_c x_c`` for internal nodes ``p`` in ascending index order."""
        internal = self.internal
        row_of = np.full(self.n, -1, dtype=np.int64)
        row_of[internal] = np.arange(internal.size)
        child = np.flatnonzero(self.parent >= 0)
        rows = np.r_[np.arange(internal.size), row_of[self.parent[child]]]
        cols = np.r_[internal, child]
        vals = np.r_[np.ones(internal.size), -np.ones(child.size)]
        return sp.csr_matrix((vals, (rows, cols)), shape=(internal.size, self.n))

    def multipliers(self, g: np.ndarray) -> np.ndarray:
        """Solve ``C^T lam = g`` for ``lam`` (one per internal node, ascending index),
        where ``C = consistency_matrix()``.

        ``(C^T lam)_v = lam_v [v internal] - lam_parent(v) [v not a root]``, so
        top down: ``lam_root = g_root`` and ``lam_v = g_v + lam_parent(v)``.  Exact
        when ``g`` lies in the range of ``C^T``; callers project first.
        """
        gp = self._to_bfs(g)
        lam = np.zeros(self.n)
        s0, e0 = self.level_bounds[0], self.level_bounds[1]
        lam[s0:e0] = gp[s0:e0]
        for d in range(1, self.n_levels):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            lam[s:e] = gp[s:e] + self._expand(d, lam[self._parent_slices[d]])
        return self._from_bfs(lam)[self.is_internal]


    def interval_multipliers(self, L: np.ndarray, U: np.ndarray, y_ref: np.ndarray,
                             slack: float) -> np.ndarray | None:
        """``lam = C^T y`` with ``L <= lam <= U`` (``C = consistency_matrix()``), the ``y``
        closest to ``y_ref`` (one per node, zero on leaves) level by level; ``None`` if
        the intervals conflict by more than ``slack``.

        ``lam_v = y_v [v internal] - y_parent(v)``: difference constraints
        ``y_v - y_p in [L_v, U_v]``.  Bottom up, each internal node gets the interval of
        ``y_v`` its subtree allows; top down, each ``y_v`` is ``y_ref`` clipped to its
        interval intersected with what its parent's value leaves."""
        Ilo, Ihi = self._subtree_intervals(L[self.order], U[self.order])
        internal = self._n_children_pos > 0
        if np.any(Ilo[internal] > Ihi[internal] + slack):
            return None
        yv = self._closest_within(Ilo, Ihi, L[self.order], U[self.order], y_ref[self.order])
        lam_p = np.where(internal, yv, 0.0)
        for d in range(1, self.n_levels):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            lam_p[s:e] -= self._expand(d, yv[self._parent_slices[d]])
        lam = np.empty(self.n)
        lam[self.order] = lam_p
        return lam

    def _subtree_intervals(self, Lp: np.ndarray, Up: np.ndarray):
        """Bottom-up pass of :meth:`interval_multipliers` (BFS positions)."""
        Ilo = np.full(self.n, -np.inf)
        Ihi = np.full(self.n, np.inf)
        internal = self._n_children_pos > 0
        for d in range(self.n_levels - 1, 0, -1):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            par = self._parent_slices[d]
            kid_int = internal[s:e]
            # constraint on the parent's y from each child: y_p in [y_c - U_c, y_c - L_c]
            jlo = np.where(kid_int, Ilo[s:e] - Up[s:e], -Up[s:e])
            jhi = np.where(kid_int, Ihi[s:e] - Lp[s:e], -Lp[s:e])
            Ilo[par] = self._block_reduce(d, jlo, np.maximum)
            Ihi[par] = self._block_reduce(d, jhi, np.minimum)
        roots = slice(self.level_bounds[0], self.level_bounds[1])
        Ilo[roots] = np.where(internal[roots], np.maximum(Ilo[roots], Lp[roots]), Ilo[roots])
        Ihi[roots] = np.where(internal[roots], np.minimum(Ihi[roots], Up[roots]), Ihi[roots])
        return Ilo, Ihi

    def _closest_within(self, Ilo, Ihi, Lp, Up, y_ref) -> np.ndarray:
        """Top-down pass of :meth:`interval_multipliers` (BFS positions)."""
        internal = self._n_children_pos > 0
        roots = slice(self.level_bounds[0], self.level_bounds[1])
        yv = np.zeros(self.n)
        yv[roots] = np.clip(y_ref[roots], Ilo[roots], Ihi[roots])
        for d in range(1, self.n_levels):
            s, e = self.level_bounds[d], self.level_bounds[d + 1]
            ypar = self._expand(d, yv[self._parent_slices[d]])
            lo = np.maximum(Ilo[s:e], ypar + Lp[s:e])
            hi = np.minimum(Ihi[s:e], ypar + Up[s:e])
            hi = np.maximum(hi, lo)            # within slack: collapse
            yv[s:e] = np.where(internal[s:e], np.clip(y_ref[s:e], lo, hi), 0.0)
        return yv


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every node by pointer jumping (list ranking), O(n log depth).

    Raises ``ValueError`` if the parent pointers contain a cycle.
    """
    anc = parent.copy()
    dist = (anc >= 0).astype(np.int64)
    for _ in range(64):
        active = anc >= 0
        if not active.any():
            return dist
        a = np.where(active, anc, 0)
        new_dist = np.where(active, dist + dist[a], dist)
        new_anc = np.where(active, anc[a], -1)
        if np.any(new_dist > parent.size):
            break
        dist, anc = new_dist, new_anc
    raise ValueError("parent array contains a cycle")


class TreeLSQ:
    """Weighted least-squares projection onto consistency of a :class:`Forest`.

    Parameters
    ----------
    forest : the forest.
    weights : ``a_v >= 0`` per node (default ones); ``inf`` fixes a node to its
        input value, ``0`` leaves it unmeasured.

    The coefficients of both passes depend only on the weights, so they are
    computed once here and every :meth:`project` costs a handful of vector
    operations per level.
    """

    def __init__(self, forest: Forest, weights: np.ndarray | None = None) -> None:
        self.forest = f = forest
        n = f.n
        a = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
        if a.shape != (n,):
            raise ValueError(f"weights must have shape ({n},), got {a.shape}")
        if np.any(np.isnan(a)) or np.any(a < 0):
            raise ValueError("weights must be non-negative (inf fixes a node)")
        # one errstate for both passes: their 0 / 0 and inf / inf are resolved explicitly
        # (entering an errstate costs as much as a level's arithmetic)
        with np.errstate(divide="ignore", invalid="ignore"):
            cself, kappa, pchild = self._upward(f._to_bfs(a))
            share = self._shares(kappa, pchild)
        self._kappa, self._share = kappa, share        # for variances()
        # Per-level coefficients collapse to scalars when uniform (unit weights on a
        # complete tree): scalar multiplies and strided adds keep project() cheap.
        # Which levels are uniform is read off per-level minima and maxima, four reductions
        # for the whole tree (two comparisons per level cost more on trees of ~1,000 nodes).
        self._c_level = [None]
        self._share_level = [None]
        if f.n_levels < 2:
            return
        starts = np.asarray(f.level_bounds[:-1])
        has = f._n_children_pos > 0
        c_flat = _uniform_levels(np.where(has, cself, np.inf), np.where(has, cself, -np.inf), starts)
        sh_flat = _uniform_levels(share, share, starts)
        for d in range(1, f.n_levels):
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            # level d's parents are level d - 1's nodes with children
            self._c_level.append(c_flat[d - 1] if c_flat[d - 1] is not None
                                 else cself[f._parent_slices[d]])
            self._share_level.append(sh_flat[d] if sh_flat[d] is not None else share[s:e])

    def _upward(self, a: np.ndarray):
        """Bottom-up coefficients (BFS positions), in precisions: a node's own weight
        ``a_v`` (the precision of its measurement, ``1 / ks``) and its children's
        ``pchild_v = 1 / kchild_v``, where ``kchild_v`` is the variance of the children's
        sum (the sum of their ``kappa``; infinite for a node without children: no
        information).  The two estimates of ``x_v`` combine as ``P = a_v + pchild_v``:
        ``kappa_v = 1 / P``, the subtree estimate's variance, and ``cself_v = a_v / P``, the
        weight of the node's own measurement.  ``0 / 0`` (no information on either side)
        takes ``cself = 0``; ``inf / inf`` (the node fixed) keeps its own value, ``1``.
        (The variance form, ``c = kc / (ks + kc)``, needs a case per infinity: these few
        vector operations per level are most of a projection's set-up, built once per
        round of the ADMM's polish.)  Called under ``np.errstate(divide="ignore",
        invalid="ignore")``."""
        f = self.forest
        n = f.n
        kappa = np.empty(n)
        pchild = np.zeros(n)
        cself = np.ones(n)
        for d in range(f.n_levels - 1, -1, -1):
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            if d + 1 < f.n_levels:
                s1, e1 = f.level_bounds[d + 1], f.level_bounds[d + 2]
                pchild[f._parent_slices[d + 1]] = 1.0 / f._block_sum(d + 1, kappa[s1:e1])
            own = a[s:e]
            P = own + pchild[s:e]
            c = own / P
            kappa[s:e] = 1.0 / P
            bad = np.isnan(c)
            if bad.any():
                c[bad] = own[bad] > 0
            cself[s:e] = c
        return cself, kappa, pchild

    def _shares(self, kappa: np.ndarray, pchild: np.ndarray) -> np.ndarray:
        """Top-down: the share ``kappa_c / kchild_p = kappa_c pchild_p`` of a parent's
        correction that each child takes; ``0 x inf`` (all children fixed) is none, and
        with infinite ``kchild_p`` the children of infinite variance split it equally (the
        others take none)."""
        f = self.forest
        share = np.zeros(f.n)
        for d in range(1, f.n_levels):
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            kk = kappa[s:e]
            sh = kk * f._expand(d, pchild[f._parent_slices[d]])
            bad = np.isnan(sh)
            if bad.any():
                infk = np.isinf(kk)
                n_inf = f._expand(d, f._block_sum(d, infk.astype(float)))
                sh[bad] = np.where(infk[bad], 1.0 / n_inf[bad], 0.0)
            share[s:e] = sh
        return share

    def variances(self) -> np.ndarray | None:
        """Each node's variance in the projection of noisy values of variances ``1 / a_v``
        (original order), or ``None`` if some node is unmeasured (an infinite ``kappa``).

        The Rauch-Tung-Striebel smoother on the tree, scalar: at a root ``C = kappa``; a
        child ``c`` of ``p`` takes ``share_c = kappa_c / kchild_p`` of its parent's
        correction, so ``C_c = kappa_c - share_c kappa_c + share_c^2 C_p`` (the scalar case
        of :meth:`cvxdp.solvers.tree.gls.TreeGLS.covariances`)."""
        f = self.forest
        kappa, share = self._kappa, self._share
        if not np.all(np.isfinite(kappa)):
            return None
        C = np.empty(f.n)
        C[f.level_bounds[0]:f.level_bounds[1]] = kappa[f.level_bounds[0]:f.level_bounds[1]]
        for d in range(1, f.n_levels):
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            Cp = f._expand(d, C[f._parent_slices[d]])
            sh, kk = share[s:e], kappa[s:e]
            C[s:e] = kk - sh * kk + sh * sh * Cp
        return f._from_bfs(C)

    def project(self, v: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """The weighted projection of ``v`` onto ``{x : x_p = sum_c x_c + b_p}``."""
        f = self.forest
        vp = f._to_bfs(v, copy=False)
        bp = None if b is None else f._to_bfs(b, copy=False)
        beta = np.array(vp, dtype=float, copy=True)
        csum = np.empty(f.n)
        for d in range(f.n_levels - 1, 0, -1):
            par = f._parent_slices[d]
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            cs = f._block_sum(d, beta[s:e])
            if bp is not None:
                cs += bp[par]
            csum[par] = cs
            c = self._c_level[d]
            # beta_p = c v_p + (1 - c) * (sum of children's beta + b_p)
            if np.ndim(c) == 0:
                if c == 1.0:
                    continue                    # beta already holds v_p
                beta[par] = c * vp[par] + (1.0 - c) * cs
            else:
                beta[par] = c * vp[par] + (1.0 - c) * cs
        x = beta                                # roots keep beta; children corrected below
        for d in range(1, f.n_levels):
            par = f._parent_slices[d]
            s, e = f.level_bounds[d], f.level_bounds[d + 1]
            corr = x[par] - csum[par]
            sh = self._share_level[d]
            k = f._blocks[d][3]
            if np.ndim(sh) == 0 and 0 < k <= 8:
                corr *= sh
                for j in range(k):
                    x[s + j:e:k] += corr
            else:
                x[s:e] += sh * f._expand(d, corr)
        return f._from_bfs(x)


def _uniform_levels(lo_vals: np.ndarray, hi_vals: np.ndarray, starts: np.ndarray) -> list:
    """Per level (BFS positions from ``starts``): its one value as a float when the minimum
    of ``lo_vals`` equals the maximum of ``hi_vals`` over the level, else ``None``."""
    lo = np.minimum.reduceat(lo_vals, starts)
    hi = np.maximum.reduceat(hi_vals, starts)
    return [float(u) if u == v else None for u, v in zip(lo.tolist(), hi.tolist())]


def hay_projection(v: np.ndarray, branching: int) -> np.ndarray:
    """Hay et al. (VLDB 2010, Thm 3) two-pass least squares for a complete
    ``branching``-ary tree stored breadth first (root first).

    Pass 1 (bottom up, height ``l`` = 1 for leaves):
    ``z_v = (k^l - k^(l-1)) / (k^l - 1) * v_v + (k^(l-1) - 1) / (k^l - 1) * sum_children z_c``.
    Pass 2 (top down): ``x_v = z_v + (x_parent - sum_siblings z) / k``.
    """
    v = np.asarray(v, dtype=float)
    k = int(branching)
    n = v.size
    h = 0
    size = 1
    while size < n:
        h += 1
        size = (k ** (h + 1) - 1) // (k - 1)
    if size != n:
        raise ValueError(f"v has {n} entries, not the size of a complete {k}-ary tree")
    starts = [(k ** l - 1) // (k - 1) for l in range(h + 2)]
    z = v.copy()
    for depth in range(h - 1, -1, -1):
        l = h - depth + 1                      # height counted from leaves = 1
        s, e = starts[depth], starts[depth + 1]
        kids = z[e: starts[depth + 2]].reshape(-1, k).sum(axis=1)
        z[s:e] = ((k ** l - k ** (l - 1)) * v[s:e] + (k ** (l - 1) - 1) * kids) / (k ** l - 1)
    x = z.copy()
    for depth in range(h):
        s, e = starts[depth], starts[depth + 1]
        kids = z[e: starts[depth + 2]].reshape(-1, k)
        corr = (x[s:e] - kids.sum(axis=1)) / k
        x[e: starts[depth + 2]] = (kids + corr[:, None]).ravel()
    return x


def distinct(idx: np.ndarray, n: int) -> bool:
    """Are the indices ``idx`` (integers in ``[0, n)``) pairwise distinct?  One counting
    pass (``np.unique`` sorts or hashes, ten times slower on a million entries)."""
    return idx.size == 0 or int(np.bincount(idx, minlength=n).max()) <= 1

def forest_from_rows(A: sp.spmatrix, b: np.ndarray | None = None):
    """Recognise ``A x = b`` as forest consistency ``s_r (x_p - sum_c x_c) = b_r``.

    Returns ``(forest, row_parent, row_scale, offsets)`` where ``row_parent[r]`` is
    the parent node of row ``r``, ``row_scale[r] = s_r`` and ``offsets`` holds
    ``b_r / s_r`` at each parent (zero elsewhere); or ``None`` if some row is not
    of that form, a node is the child of two rows or the parent of two, or the
    rows form a cycle.
    """
    A = sp.csr_matrix(A, copy=True)    # cleaned in place below: never the caller's arrays
    A.sum_duplicates()
    A.eliminate_zeros()
    p, n = A.shape
    if p == 0:
        return None
    nnz_row = np.diff(A.indptr)
    if np.any(nnz_row < 2):
        return None
    data, cols = A.data, A.indices
    row_id = np.repeat(np.arange(p), nnz_row)
    pos = data > 0
    npos = np.bincount(row_id, weights=pos.astype(float), minlength=p).astype(np.int64)
    nneg = nnz_row - npos
    # parent sign: the sign that appears exactly once; rows with one entry of each
    # sign (x_a = x_b) are ambiguous and oriented below
    parent_positive = (npos == 1) & (nneg >= 2)
    parent_negative = (nneg == 1) & (npos >= 2)
    ambiguous = (npos == 1) & (nneg == 1)
    if not np.all(parent_positive | parent_negative | ambiguous):
        return None
    is_parent_entry = np.where(parent_positive[row_id], pos, ~pos)
    is_parent_entry[ambiguous[row_id]] = False
    amb_rows = np.flatnonzero(ambiguous)
    if amb_rows.size:
        first = A.indptr[amb_rows]
        chosen = _orient_pairs(cols, first, is_parent_entry, row_id, n)
        if chosen is None:
            return None
        is_parent_entry[chosen] = True
    par_idx = np.flatnonzero(is_parent_entry)
    if par_idx.size != p:
        return None
    row_parent = cols[par_idx]
    row_scale = data[par_idx]
    child_idx = np.flatnonzero(~is_parent_entry)
    child_rows = row_id[child_idx]
    if not np.allclose(data[child_idx], -row_scale[child_rows], rtol=_PATTERN_RTOL, atol=0):
        return None
    children = cols[child_idx]
    if not (distinct(row_parent, n) and distinct(children, n)):
        return None
    parent = np.full(n, -1, dtype=np.int64)
    parent[children] = row_parent[child_rows]
    try:
        forest = Forest(parent)
    except ValueError:
        return None
    offsets = np.zeros(n)
    if b is not None:
        offsets[row_parent] = np.asarray(b, dtype=float) / row_scale
    return forest, row_parent, row_scale, offsets


def _orient_pairs(cols, first, is_parent_entry, row_id, n):
    """Choose the parent of each two-entry row ``x_a = x_b`` so that no node is the
    parent of two rows or the child of two.  Returns the chosen entry positions.

    Entries fixed by the unambiguous rows constrain the choice; what remains free
    is oriented towards the smaller index (breadth-first order puts parents first).
    """
    fixed_parent = np.zeros(n, dtype=bool)
    fixed_child = np.zeros(n, dtype=bool)
    pair = np.zeros(row_id.size, dtype=bool)
    pair[first] = pair[first + 1] = True
    known = np.flatnonzero(~pair)
    fixed_parent[cols[known[is_parent_entry[known]]]] = True
    fixed_child[cols[known[~is_parent_entry[known]]]] = True
    a, b = cols[first], cols[first + 1]
    choice = np.full(first.size, -1, dtype=np.int64)     # 0: a is parent, 1: b is parent
    pending = list(range(first.size))
    while pending:
        progress = False
        rest = []
        for r in pending:
            ar, br = a[r], b[r]
            a_can = not fixed_parent[ar] and not fixed_child[br]
            b_can = not fixed_parent[br] and not fixed_child[ar]
            if a_can and b_can:
                rest.append(r)
                continue
            if not (a_can or b_can):
                return None
            choice[r] = 0 if a_can else 1
            par, kid = (ar, br) if a_can else (br, ar)
            fixed_parent[par] = fixed_child[kid] = True
            progress = True
        if not progress and rest:
            r = rest.pop(0)
            choice[r] = 0 if a[r] < b[r] else 1
            par, kid = (a[r], b[r]) if choice[r] == 0 else (b[r], a[r])
            fixed_parent[par] = fixed_child[kid] = True
        pending = rest
    return np.where(choice == 0, first, first + 1)


def ancestor_sums(forest: Forest, s: np.ndarray) -> np.ndarray:
    """``t_v = sum of s over v and its ancestors`` (top down, one pass per level)."""
    sp_ = forest._to_bfs(s)
    out = sp_.copy()
    for d in range(1, forest.n_levels):
        a, e = forest.level_bounds[d], forest.level_bounds[d + 1]
        out[a:e] += forest._expand(d, out[forest._parent_slices[d]])
    return forest._from_bfs(out)


class TreeQueries:
    """A measurement matrix whose rows are (scaled) indicators of a laminar family of
    sets of columns: the query matrix of a hierarchy written over the leaf counts.

    Node space: one node per row with an entry (row ``rows[i]`` is node ``i``) and one
    leaf node per column that is not itself a singleton row; a node's parent is the
    smallest row set strictly containing it.  Then ``(M x)[rows]`` is ``row_scale *
    z[:rows.size]`` for the consistent node vector ``z`` whose leaves are ``x`` (``z = Q
    x``), ``x = z[leaf_node]``, and the other rows of ``M`` (queries of no column, such as
    the empty nodes of OpenDP's tree) are zero whatever ``x``.
    """

    def __init__(self, forest: Forest, leaf_node: np.ndarray, row_scale: np.ndarray, m: int,
                 rows: np.ndarray | None = None) -> None:
        self.forest = forest
        self.leaf_node = leaf_node
        self.row_scale = row_scale
        self.m = m
        self.rows = np.arange(m) if rows is None else rows
        self.n_nodes = forest.n

    def nodes_from_leaves(self, x: np.ndarray) -> np.ndarray:
        z = np.zeros(self.n_nodes)
        z[self.leaf_node] = x
        return self.forest.sum_up(z)

    def bounds_from_leaves(self, lo: np.ndarray, up: np.ndarray):
        """Leaf bounds, and on every internal node the (implied) sums of its leaves'."""
        L = np.zeros(self.n_nodes)
        U = np.zeros(self.n_nodes)
        L[self.leaf_node] = lo
        U[self.leaf_node] = up
        with np.errstate(invalid="ignore"):
            L = self.forest.sum_up(L)
            U = self.forest.sum_up(U)
        L = np.where(np.isnan(L), -np.inf, L)
        U = np.where(np.isnan(U), np.inf, U)
        return L, U


def forest_from_queries(M: sp.spmatrix) -> TreeQueries | None:
    """Recognise ``M`` as a :class:`TreeQueries` (``None`` if it is not one: a row with
    unequal entries, sets that overlap without nesting, or no row with two or more
    columns).  A set repeated in several rows becomes a chain of single-child nodes;
    rows without an entry are no node (their loss is a constant)."""
    M = sp.csr_matrix(M, copy=True)    # cleaned in place below: never the caller's arrays
    M.sum_duplicates()
    M.eliminate_zeros()
    m_all = M.shape[0]
    rows = np.flatnonzero(np.diff(M.indptr) > 0)
    if rows.size < m_all:
        M = M[rows]
    m, n = M.shape
    size = np.diff(M.indptr)
    if m == 0 or size.max() < 2:
        return None
    row_of = np.repeat(np.arange(m), size)
    first = M.data[M.indptr[:-1]]
    if not np.allclose(M.data, first[row_of], rtol=_PATTERN_RTOL, atol=0):
        return None
    cols = M.indices
    # entries sorted by column, then by the size of their row set (equal sets: by row,
    # so that a repeated set becomes a chain of single-child nodes)
    order = np.lexsort((row_of, size[row_of], cols))
    c_s, r_s = cols[order], row_of[order]
    same_col = np.r_[c_s[1:] == c_s[:-1], False]
    nxt = np.where(same_col, np.r_[r_s[1:], -1], -1)         # next larger set containing the column
    pmin = np.full(m, np.iinfo(np.int64).max)
    pmax = np.full(m, -2)
    np.minimum.at(pmin, r_s, nxt)
    np.maximum.at(pmax, r_s, nxt)
    if np.any(pmin != pmax):
        return None                                          # not laminar
    parent_rows = pmin
    # leaves: a singleton row is its column's leaf; other columns get a new node whose
    # parent is the smallest row containing them (or none)
    col_start = np.r_[True, c_s[1:] != c_s[:-1]]
    smallest = np.full(n, -1)
    smallest[c_s[col_start]] = r_s[col_start]
    leaf_node = np.empty(n, dtype=np.int64)
    is_single = (smallest >= 0) & (size[np.maximum(smallest, 0)] == 1)
    leaf_node[is_single] = smallest[is_single]
    extra = np.flatnonzero(~is_single)
    leaf_node[extra] = m + np.arange(extra.size)
    parent = np.r_[parent_rows, smallest[extra]].astype(np.int64)
    try:
        forest = Forest(parent)
    except ValueError:
        return None
    return TreeQueries(forest, leaf_node, first.astype(float), m_all, rows)
