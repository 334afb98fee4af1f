"""Junction trees for discrete graphical models, and exact belief propagation on them.

A graphical model over attributes ``0 .. d-1`` (attribute ``a`` takes ``sizes[a]`` values) with
*factors* on attribute sets ``C_k`` (the measured cliques) has the distribution

    p_theta(x) = exp( sum_k theta_k(x_{C_k}) ) / Z(theta).

The junction tree is built by triangulating the factors' interaction graph (greedy elimination,
each step eliminating the attribute whose new clique has the fewest cells), taking the
elimination cliques, merging those contained in a neighbour, and joining components with empty
separators.  Every factor lives in one junction-tree clique (its *home*).  Calibration is the
two-pass sum-product (or max-product) algorithm in log space, so it is exact and cannot overflow
or underflow at any parameter scale (McKenna, Sheldon, Miklau, ICML 2019, MARGINAL-ORACLE;
Koller & Friedman, ch. 10).

Arrays over a clique keep the clique's attributes in increasing order; a factor's arrays keep
the order in which the caller listed its attributes.  Nothing here imports cvxpy.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["JunctionTree", "TreeSummary", "ModelTooLarge", "DEFAULT_MAX_CELLS", "marginalizer"]

#: largest junction-tree clique (number of cells) accepted by default: 2^27 float64 cells are
#: 1 GiB per array, and calibration keeps about three arrays per clique.
DEFAULT_MAX_CELLS = 2 ** 27


class ModelTooLarge(ValueError):
    """The junction tree of the requested cliques has a clique too large to store."""


@dataclass(frozen=True)
class TreeSummary:
    """What calibration will cost, known before any array is allocated."""

    n_attributes: int
    n_factors: int
    cliques: tuple[tuple[int, ...], ...]
    cells: tuple[int, ...]
    largest_clique: tuple[int, ...]
    largest_cells: int
    total_cells: int

    @property
    def memory_bytes(self) -> int:
        """Working memory of one calibration: potentials, beliefs and a scratch copy (float64)."""
        return 8 * (3 * self.total_cells + self.largest_cells)

    def describe(self, names: Sequence[str] | None = None) -> str:
        def label(c):
            return "(" + ", ".join(str(names[a]) if names is not None else str(a) for a in c) + ")"
        return (f"junction tree: {len(self.cliques)} cliques over {self.n_attributes} attributes "
                f"from {self.n_factors} factors; largest clique {label(self.largest_clique)} with "
                f"{self.largest_cells:,} cells; {self.total_cells:,} cells in all; about "
                f"{self.memory_bytes / 2**20:,.1f} MiB per calibration")

    __str__ = describe


def _elimination_order(sizes: Sequence[int], adj: list[set[int]]) -> tuple[list[int], list[set[int]]]:
    """Greedy elimination (min weight: fewest cells in the clique formed); returns the order
    and each vertex's neighbourhood at its elimination.  Costs are updated lazily in a heap:
    eliminating ``v`` changes only the neighbourhoods of ``v``'s neighbours."""
    adj = [set(a) for a in adj]
    logsize = [math.log(max(s, 1)) for s in sizes]

    def cost(v):
        return logsize[v] + sum(logsize[u] for u in adj[v])

    heap = [(cost(v), v) for v in range(len(sizes))]
    heapq.heapify(heap)
    current = {v: c for c, v in heap}
    done = [False] * len(sizes)
    order, neigh = [], []
    while heap:
        c, v = heapq.heappop(heap)
        if done[v] or c != current[v]:
            continue
        done[v] = True
        nb = adj[v]
        order.append(v)
        neigh.append(set(nb))
        for u in nb:                       # connect the neighbours (fill-in), drop v
            adj[u].discard(v)
            adj[u].update(w for w in nb if w != u)
        for u in nb:
            current[u] = cost(u)
            heapq.heappush(heap, (current[u], u))
        adj[v] = set()
    return order, neigh


class JunctionTree:
    """The junction tree of a set of factors, with log-space calibration.

    Parameters
    ----------
    sizes : number of values of each attribute (positive integers).
    factors : attribute tuples (any order, no repeats); attributes in no factor get a
        singleton clique of their own.
    max_cells : refuse (``ModelTooLarge``) a junction-tree clique with more cells.
    """

    def __init__(self, sizes: Sequence[int], factors: Sequence[Sequence[int]], *,
                 max_cells: int = DEFAULT_MAX_CELLS) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        d = len(self.sizes)
        if any(s < 1 for s in self.sizes):
            raise ValueError(f"sizes must be positive integers, got {self.sizes}")
        self.factors = [tuple(int(a) for a in f) for f in factors]
        for f in self.factors:
            if len(set(f)) != len(f) or any(not 0 <= a < d for a in f):
                raise ValueError(f"factor {f} must list distinct attributes in 0..{d - 1}")
        adj: list[set[int]] = [set() for _ in range(d)]
        for f in self.factors:
            for a in f:
                adj[a].update(b for b in f if b != a)
        order, neigh = _elimination_order(self.sizes, adj)
        pos = {v: i for i, v in enumerate(order)}
        cl = [frozenset({v} | nb) for v, nb in zip(order, neigh)]
        parent = [min(nb, key=pos.__getitem__) if nb else None for nb in neigh]
        # tree over elimination steps: node i (vertex order[i]) -> node pos[parent]
        nodes = {i: cl[i] for i in range(d)}
        tadj: dict[int, set[int]] = {i: set() for i in range(d)}
        for i, p in enumerate(parent):
            if p is not None:
                tadj[i].add(pos[p])
                tadj[pos[p]].add(i)
        # merge cliques contained in a neighbour (keeps the running intersection property)
        changed = True
        while changed:
            changed = False
            for i in list(nodes):
                if i not in nodes:
                    continue
                for j in list(tadj[i]):
                    if nodes[i] <= nodes[j]:
                        small, big = i, j
                    elif nodes[j] <= nodes[i]:
                        small, big = j, i
                    else:
                        continue
                    for k in tadj.pop(small):
                        tadj[k].discard(small)
                        if k != big:
                            tadj[k].add(big)
                            tadj[big].add(k)
                    del nodes[small]
                    changed = True
                    break
        keys = sorted(nodes, key=lambda i: -math.prod(self.sizes[a] for a in nodes[i]))
        index = {k: n for n, k in enumerate(keys)}
        self.cliques: list[tuple[int, ...]] = [tuple(sorted(nodes[k])) for k in keys]
        self.shapes = [tuple(self.sizes[a] for a in c) for c in self.cliques]
        self.cells = [math.prod(s) for s in self.shapes]
        nbrs = [sorted(index[j] for j in tadj[k]) for k in keys]
        # preorder from the largest clique; other components hang off it with empty separators
        n = len(self.cliques)
        self.parent = [-1] * n
        seen = [False] * n
        self.preorder: list[int] = []
        for r in range(n):
            if seen[r]:
                continue
            if r != 0:
                self.parent[r] = 0
            seen[r] = True
            stack = [r]
            while stack:
                i = stack.pop()
                self.preorder.append(i)
                for j in nbrs[i]:
                    if not seen[j]:
                        seen[j] = True
                        self.parent[j] = i
                        stack.append(j)
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i in self.preorder[1:]:
            self.children[self.parent[i]].append(i)
        self.separators = [tuple(sorted(set(self.cliques[i]) & set(self.cliques[self.parent[i]])))
                           if self.parent[i] >= 0 else () for i in range(n)]
        # where each factor lives: the smallest clique containing it
        self.home = []
        for f in self.factors:
            fs = set(f)
            best = min((i for i in range(n) if fs <= set(self.cliques[i])), key=self.cells.__getitem__)
            self.home.append(best)
        self._summary = TreeSummary(
            n_attributes=d, n_factors=len(self.factors), cliques=tuple(self.cliques),
            cells=tuple(self.cells), largest_clique=self.cliques[0], largest_cells=self.cells[0],
            total_cells=int(sum(self.cells)))
        if self.cells[0] > max_cells:
            raise ModelTooLarge(
                f"the junction tree of these cliques has a clique of {self.cells[0]:,} cells "
                f"(attributes {self.cliques[0]}), above max_cells={max_cells:,}; "
                f"{self._summary.describe()}. Measure smaller or fewer overlapping cliques.")
        # precomputed index plans
        self._sep_axes = [tuple(k for k, a in enumerate(self.cliques[self.parent[i]])
                                if a not in self.separators[i]) if self.parent[i] >= 0 else ()
                          for i in range(n)]                      # parent axes summed out for child i
        self._own_axes = [tuple(k for k, a in enumerate(self.cliques[i]) if a not in self.separators[i])
                          for i in range(n)]                      # own axes summed out toward the parent
        self._sep_shape_in = [tuple(self.sizes[a] if a in self.separators[i] else 1 for a in self.cliques[i])
                              for i in range(n)]
        self._sep_shape_in_parent = [tuple(self.sizes[a] if a in self.separators[i] else 1
                                           for a in self.cliques[self.parent[i]]) if self.parent[i] >= 0 else ()
                                     for i in range(n)]
        self._fplan = [self._factor_plan(k) for k in range(len(self.factors))]

    # ------------------------------------------------------------------ layout helpers
    def summary(self) -> TreeSummary:
        return self._summary

    def factor_shape(self, k: int) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.factors[k])

    def _factor_plan(self, k: int):
        f, c = self.factors[k], self.cliques[self.home[k]]
        perm = tuple(int(p) for p in np.argsort(f))          # factor axes -> sorted order
        inv = tuple(int(p) for p in np.argsort(perm))        # sorted order -> factor axes
        bshape = tuple(self.sizes[a] if a in f else 1 for a in c)
        axes = tuple(i for i, a in enumerate(c) if a not in f)
        return perm, inv, bshape, axes

    def clique_potentials(self, theta: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``log psi_C = sum of theta_k over the factors living in C`` (fresh arrays)."""
        pots = [np.zeros(s) for s in self.shapes]
        for k, t in enumerate(theta):
            perm, _, bshape, _ = self._fplan[k]
            pots[self.home[k]] += np.transpose(t, perm).reshape(bshape)
        return pots

    def factor_marginal(self, k: int, clique_array: np.ndarray) -> np.ndarray:
        """Sum a (linear-space) array over the home clique of factor ``k`` down to the factor."""
        _, inv, _, axes = self._fplan[k]
        m = clique_array.sum(axis=axes) if axes else clique_array
        return np.transpose(m, inv)

    # ------------------------------------------------------------------ calibration
    def calibrate(self, log_pots: Sequence[np.ndarray], *, mode: str = "sum", overwrite: bool = False):
        """Two-pass message passing in log space.

        Returns ``(log_beliefs, log_z)``: per clique, ``log sum_{x outside C} prod psi``
        (``mode="sum"``) or ``log max_{x outside C} prod psi`` (``mode="max"``), and
        ``log Z`` (or the log of the maximum).  Potentials are not modified unless
        ``overwrite`` (then the beliefs are computed in their place).  Entries ``-inf``
        (structural zeros) are allowed; the NaN guards they need are skipped when every
        potential is finite.
        """
        finite = all(np.isfinite(p).all() for p in log_pots)
        reduce = (_lse_finite if finite else _lse) if mode == "sum" else _lmax
        n = len(self.cliques)
        up: list[np.ndarray | None] = [None] * n
        acc = [None] * n
        for i in reversed(self.preorder):                 # leaves to root
            a = log_pots[i] if overwrite else np.array(log_pots[i], dtype=float, copy=True)
            for c in self.children[i]:
                a += up[c].reshape(self._sep_shape_in_parent[c])
            acc[i] = a
            if self.parent[i] >= 0:
                up[i] = reduce(a, self._own_axes[i])
        root_total = [reduce(acc[r], tuple(range(acc[r].ndim))) for r in self.preorder if self.parent[r] < 0]
        log_z = float(sum(root_total))
        beliefs = acc                                      # root's is final; children get the down message
        for i in self.preorder:                            # root to leaves
            for c in self.children[i]:
                if finite:
                    rest = beliefs[i] - up[c].reshape(self._sep_shape_in_parent[c])
                else:
                    with np.errstate(invalid="ignore"):
                        rest = beliefs[i] - up[c].reshape(self._sep_shape_in_parent[c])
                    rest[np.isnan(rest)] = -np.inf        # -inf - -inf: a structural zero stays zero
                msg = reduce(rest, self._sep_axes[c])
                beliefs[c] += msg.reshape(self._sep_shape_in[c])
        return beliefs, log_z

    def marginals(self, theta: Sequence[np.ndarray], total: float = 1.0):
        """Factor marginals scaled to ``total``, the normalised clique beliefs, and ``log Z``."""
        beliefs, log_z = self.calibrate(self.clique_potentials(theta), overwrite=True)
        probs = []
        for b in beliefs:
            b -= log_z
            np.exp(b, out=b)
            probs.append(b)
        mus = [total * self.factor_marginal(k, probs[self.home[k]]) for k in range(len(self.factors))]
        return mus, probs, log_z

    def max_value(self, scores: Sequence[np.ndarray]) -> float:
        """``max_x sum_k scores_k(x_{C_k})`` by max-product (the linear minimisation oracle of
        the marginal polytope: ``min_{mu in M} <g, mu> = -total * max_x sum_k -g_k(x)``)."""
        _, log_max = self.calibrate(self.clique_potentials(scores), mode="max", overwrite=True)
        return log_max


def _lse(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """log-sum-exp over ``axes`` (stable: subtract the max first)."""
    if not axes:
        return a.copy()
    m = a.max(axis=axes, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    s = np.exp(a - m).sum(axis=axes)
    with np.errstate(divide="ignore"):
        return np.log(s) + m.reshape(s.shape)


def _lse_finite(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """log-sum-exp over ``axes`` for finite ``a`` (no guards needed)."""
    if not axes:
        return a.copy()
    m = a.max(axis=axes, keepdims=True)
    e = a - m
    np.exp(e, out=e)
    s = e.sum(axis=axes)
    if np.ndim(s) == 0:
        return np.log(s) + m.reshape(())
    np.log(s, out=s)
    s += m.reshape(s.shape)
    return s


def _lmax(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return a.max(axis=axes) if axes else a.copy()


def marginalizer(sizes: Sequence[int], clique: Sequence[int], target: Sequence[int]) -> sp.csr_matrix:
    """The 0/1 matrix summing a C-order table over ``clique`` (attributes in increasing order)
    down to ``target`` (any subset, in the order given; ``()`` gives the total)."""
    clique, target = tuple(clique), tuple(target)
    shape = tuple(sizes[a] for a in clique)
    n = math.prod(shape)
    idx = np.unravel_index(np.arange(n), shape)
    tshape = tuple(sizes[a] for a in target)
    rows = (np.ravel_multi_index(tuple(idx[clique.index(a)] for a in target), tshape)
            if target else np.zeros(n, dtype=np.int64))
    return sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(math.prod(tshape), n))
