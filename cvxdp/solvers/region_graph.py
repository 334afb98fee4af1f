"""The local polytope of any set of cliques, and the exact projection onto its consistency set.

Cliques ``C_1 .. C_K`` (tuples of attribute indices; any set, not necessarily a junction tree)
each carry a table ``mu_k`` (C order, flattened and stacked into one vector ``t``).  The
*local polytope* with total ``N`` is

    L(N) = { t >= 0 :  sum(mu_k) = N,  marg_S(mu_i) = marg_S(mu_j) for every i, j, S = C_i & C_j },

a relaxation of the marginal polytope, equal to it when the cliques form a junction tree
(Wainwright & Jordan 2008, sections 4.1 and 2.5.2).  The *regions* are the non-empty attribute
sets contained in two or more cliques (all subsets of pairwise intersections: the region
graph closed under intersection).

Consistency in the ANOVA basis.  A table on ``C`` splits orthogonally into components, one per
subset ``A`` of ``C`` (Efron & Stein 1981; the "residual" basis of Mullins et al., NeurIPS
2024): with ``M_i`` the mean over attribute ``i`` and ``P_A = prod_{i in A} (I - M_i) prod_{i
not in A} M_i``, ``mu = sum_A P_A mu``.  Write ``h_A(mu) = prod_{i in A} (I - M_i) marg_A(mu)``,
the centred part of the ``A``-marginal; then ``P_A mu`` is ``h_A(mu)`` spread evenly over the
other attributes, ``P_A mu = bcast_C(h_A(mu)) / n(C \\ A)``, and

    marg_S(mu) = sum_{A subset S} bcast_S(h_A(mu)) / n(S \\ A).

Two tables agree on ``S`` iff their ``h_A`` agree for every ``A`` inside ``S`` (``A = {}``: the
totals).  So the consistency set is ``{h_A(mu_k) equal over all cliques k containing A, for
every region A, and all totals equal}``: one independent linear condition per (region,
component), and since the components are orthogonal, the Euclidean projection (weights
``a_k`` per clique: the metric ``sum_k a_k ||mu_k||^2``) acts on each region separately:

    h_A <- hbar_A = sum_{k ∋ A} w_k h_A(mu_k) / sum_{k ∋ A} w_k,   w_k = a_k / n(C_k \\ A),
    mu_k <- mu_k + bcast(hbar_A - h_A(mu_k)) / n(C_k \\ A),

and the totals go to ``N`` (or, free total, to their ``a_k / n(C_k)``-weighted mean).  One
projection costs two sparse products with the stacked region marginalisers and a few array
operations per region: ``O(sum_{(k, A)} n(C_k))``, exact to rounding.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["RegionGraph", "MAX_CLIQUE_ATTRIBUTES"]

#: cliques with more attributes than this are refused (2^k subsets are enumerated per clique)
MAX_CLIQUE_ATTRIBUTES = 24


@dataclass(frozen=True)
class _Region:
    attrs: tuple[int, ...]          # sorted attribute indices
    shape: tuple[int, ...]
    members: np.ndarray             # clique indices containing the region
    rows: slice                     # its rows in the stacked marginaliser (member-major)
    spread: np.ndarray              # n(C_k \ A) per member


class RegionGraph:
    """Cliques, their shared regions and the consistency projection (module docstring).

    Parameters
    ----------
    sizes : domain size of every attribute.
    cliques : attribute-index tuples, in any order within a tuple (the table's axis order);
        no clique may repeat.
    """

    def __init__(self, sizes: Sequence[int], cliques: Sequence[Sequence[int]]) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.cliques = [tuple(int(a) for a in c) for c in cliques]
        if not self.cliques:
            raise ValueError("RegionGraph: no cliques")
        seen = set()
        for c in self.cliques:
            key = frozenset(c)
            if len(key) != len(c):
                raise ValueError(f"RegionGraph: clique {c} repeats an attribute")
            if key in seen:
                raise ValueError(f"RegionGraph: clique {c} appears twice")
            if len(c) > MAX_CLIQUE_ATTRIBUTES:
                raise ValueError(f"RegionGraph: clique {c} has more than {MAX_CLIQUE_ATTRIBUTES} "
                                 f"attributes")
            seen.add(key)
        self.shapes = [tuple(self.sizes[a] for a in c) for c in self.cliques]
        self.cells = np.array([math.prod(s) for s in self.shapes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.cells)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self.regions = self._build_regions()
        self.components = self._components()

    # ------------------------------------------------------------------ structure
    def _build_regions(self) -> list[_Region]:
        holders: dict[tuple[int, ...], list[int]] = {}
        for k, c in enumerate(self.cliques):
            s = sorted(c)
            for r in range(1, len(s) + 1):
                for sub in itertools.combinations(s, r):
                    holders.setdefault(sub, []).append(k)
        regions, blocks, row = [], [], 0
        for attrs in sorted((a for a, ks in holders.items() if len(ks) > 1), key=lambda a: (len(a), a)):
            members = np.array(holders[attrs], dtype=np.int64)
            shape = tuple(self.sizes[a] for a in attrs)
            size = math.prod(shape)
            for j, k in enumerate(members):
                blocks.append(self._marginalizer(k, attrs, row + j * size))
            regions.append(_Region(attrs, shape, members, slice(row, row + members.size * size),
                                   self.cells[members] // size))
            row += members.size * size
        if blocks:
            r = np.concatenate([b[0] for b in blocks])
            c = np.concatenate([b[1] for b in blocks])
        else:
            r = c = np.zeros(0, dtype=np.int64)
        self.M = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(row, self.n))
        self.MT = self.M.T.tocsr()
        return regions

    def _marginalizer(self, k: int, attrs: tuple[int, ...], row0: int):
        """(rows, cols) of the 0/1 matrix summing clique ``k``'s table onto ``attrs``."""
        clique, shape = self.cliques[k], self.shapes[k]
        idx = np.unravel_index(np.arange(self.cells[k]), shape)
        tshape = tuple(self.sizes[a] for a in attrs)
        rows = np.ravel_multi_index(tuple(idx[clique.index(a)] for a in attrs), tshape)
        return row0 + rows, self.offsets[k] + np.arange(self.cells[k])

    def _components(self) -> np.ndarray:
        """Connected components of the cliques through shared regions (a label per clique)."""
        parent = list(range(len(self.cliques)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i
        for reg in self.regions:
            r0 = find(int(reg.members[0]))
            for k in reg.members[1:]:
                parent[find(int(k))] = r0
        return np.array([find(i) for i in range(len(self.cliques))])

    def block(self, t: np.ndarray, k: int) -> np.ndarray:
        """Clique ``k``'s table from the stacked vector, shaped by its clique."""
        return t[self.offsets[k]:self.offsets[k + 1]].reshape(self.shapes[k])

    def totals(self, t: np.ndarray) -> np.ndarray:
        return np.add.reduceat(t, self.offsets[:-1]) if self.n else np.zeros(len(self.cliques))

    def uniform(self, total: float) -> np.ndarray:
        """The uniform tables with the given total (a point of ``L(total)``)."""
        return np.repeat(total / self.cells, self.cells)

    def marginal(self, t: np.ndarray, k: int, attrs: Sequence[int]) -> np.ndarray:
        """Marginal of clique ``k``'s table on ``attrs`` (a subset, in the order given)."""
        tab = self.block(t, k)
        clique = self.cliques[k]
        keep = [clique.index(a) for a in attrs]
        out = tab.sum(axis=tuple(i for i in range(len(clique)) if i not in keep))
        left = sorted(keep)                     # the axes left, in clique order
        return np.transpose(out, [left.index(p) for p in keep]) if len(keep) > 1 else out

    # ------------------------------------------------------------------ projection
    def project(self, t: np.ndarray, total: float | None, weights: np.ndarray | None = None) -> np.ndarray:
        """Projection of ``t`` onto the consistent tables with total ``total`` (``None``: any
        common total), in the metric ``sum_k a_k ||mu_k||^2`` (``weights`` = ``a``, default 1).
        With ``total=0`` it is the orthogonal projection onto the consistent directions."""
        a = np.ones(len(self.cliques)) if weights is None else np.asarray(weights, dtype=float)
        m = self.M @ t
        d = np.empty_like(m)
        for reg in self.regions:
            k = reg.members.size
            h = _centre(m[reg.rows].reshape((k,) + reg.shape))
            w = a[reg.members] / reg.spread
            hbar = np.tensordot(w / w.sum(), h, axes=1)
            d[reg.rows] = ((hbar - h) / reg.spread.reshape((k,) + (1,) * len(reg.shape))).ravel()
        out = t + self.MT @ d if self.regions else np.array(t, dtype=float)
        s = self.totals(out)
        if total is None:
            w = a / self.cells
            total = float(np.dot(w, s) / w.sum())
        out += np.repeat((total - s) / self.cells, self.cells)
        return out

    def residual(self, t: np.ndarray, total: float | None = None) -> float:
        """Largest disagreement of two cliques' marginals on a region, or of a total with
        ``total`` (or with the first clique's total when ``None``)."""
        viol = 0.0
        m = self.M @ t
        for reg in self.regions:
            x = m[reg.rows].reshape(reg.members.size, -1)
            viol = max(viol, float(np.max(np.abs(x - x[0]), initial=0.0)))
        s = self.totals(t)
        ref = s[0] if total is None else total
        return max(viol, float(np.max(np.abs(s - ref))))


def _centre(x: np.ndarray) -> np.ndarray:
    """``prod_i (I - M_i)`` over every axis but the first (the stacked members)."""
    for ax in range(1, x.ndim):
        x = x - x.mean(axis=ax, keepdims=True)
    return x
