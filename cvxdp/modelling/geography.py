"""Geographies: any tree of named units (nation, states, counties, tracts, ...).

:func:`geography` builds one from a parent array or a nested mapping of names; the result
holds the tree (:class:`cvxdp.solvers.tree.forest.Forest`), the names, the levels, and the sparse
parent-minus-children matrix that states consistency (``x_p = sum_{c child of p} x_c`` for a
count per unit, row by row for a histogram per unit).  Unlike
:func:`cvxdp.workloads.hierarchy`, the units need not form a complete ``k``-ary tree: a state
has as many counties as it has.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from ..solvers.tree.forest import Forest

__all__ = ["Geography", "geography"]


class Geography:
    """A forest of units: ``parent[v]`` (``-1`` for a root) and ``names[v]``."""

    def __init__(self, parent: np.ndarray, names: Sequence[Hashable] | None = None) -> None:
        parent = np.asarray(parent)
        if parent.ndim != 1 or parent.size == 0 or not np.issubdtype(parent.dtype, np.integer):
            raise ValueError("geography: parents must be a non-empty 1-D integer array "
                             f"(-1 for a root), got {parent.dtype} of shape {parent.shape}")
        self._forest = Forest(parent)          # validates indices and refuses cycles
        self._parent = self._forest.parent.copy()
        self._parent.setflags(write=False)
        self._names = list(range(parent.size)) if names is None else list(names)
        if len(self._names) != parent.size:
            raise ValueError(f"geography: {len(self._names)} names for {parent.size} units")
        self._index = {}
        for i, name in enumerate(self._names):
            if name in self._index:
                raise ValueError(f"geography: the name {name!r} is used twice")
            self._index[name] = i

    # ------------------------------------------------------------------ structure
    @property
    def n_nodes(self) -> int:
        return int(self._parent.size)

    @property
    def parent(self) -> np.ndarray:
        """``parent[v]`` (int64, read-only), ``-1`` for a root."""
        return self._parent

    @property
    def names(self) -> list:
        return list(self._names)

    @property
    def forest(self) -> Forest:
        """The tree for the structured solvers."""
        return self._forest

    def index(self, name: Hashable) -> int:
        """The position of the unit called ``name``."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"geography: no unit called {name!r}") from None

    @cached_property
    def depth(self) -> np.ndarray:
        """Depth of every unit (roots 0)."""
        f = self._forest
        out = np.empty(self.n_nodes, dtype=np.int64)
        for d in range(f.n_levels):
            out[f.order[f.level_bounds[d]:f.level_bounds[d + 1]]] = d
        return out

    @property
    def levels(self) -> list[np.ndarray]:
        """Unit indices of each level (depth), roots first, ascending within a level."""
        return [np.flatnonzero(self.depth == d) for d in range(self._forest.n_levels)]

    @cached_property
    def _children(self) -> list[np.ndarray]:
        kids = np.flatnonzero(self._parent >= 0)
        order = np.argsort(self._parent[kids], kind="stable")
        kids = kids[order]
        bounds = np.searchsorted(self._parent[kids], np.arange(self.n_nodes + 1))
        return [kids[bounds[v]:bounds[v + 1]] for v in range(self.n_nodes)]

    def children(self, v: int | Hashable) -> np.ndarray:
        """Indices of the children of unit ``v`` (an index or a name)."""
        i = v if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else self.index(v)
        return self._children[int(i)]

    @property
    def internal(self) -> np.ndarray:
        """Units with children, ascending."""
        return self._forest.internal

    @property
    def leaves(self) -> np.ndarray:
        """Units without children, ascending."""
        return self._forest.leaves

    @cached_property
    def consistency(self) -> sp.csr_matrix:
        """``n_internal x n_nodes`` CSR: the row of internal unit ``p`` (in :attr:`internal`
        order) is ``x_p - sum_{c child of p} x_c``."""
        rows, cols, vals = [], [], []
        for r, p in enumerate(self.internal):
            kids = self._children[p]
            rows.append(np.full(kids.size + 1, r))
            cols.append(np.r_[p, kids])
            vals.append(np.r_[1.0, -np.ones(kids.size)])
        if not rows:
            return sp.csr_matrix((0, self.n_nodes))
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(rows), self.n_nodes))

    @cached_property
    def aggregation(self) -> sp.csr_matrix:
        """``n_nodes x n_leaves`` 0/1 CSR: row ``v`` sums the leaves below ``v`` (columns in
        :attr:`leaves` order), so ``aggregation @ x_leaves`` is the consistent tree."""
        leaves = self.leaves
        col = np.full(self.n_nodes, -1)
        col[leaves] = np.arange(leaves.size)
        rows, cols = [], []
        for j, leaf in enumerate(leaves):
            v = int(leaf)
            while v >= 0:
                rows.append(v)
                cols.append(j)
                v = int(self._parent[v])
        return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(self.n_nodes, leaves.size))

    def aggregate(self, x_leaves: np.ndarray) -> np.ndarray:
        """The consistent tree from the leaves' values (``(n_leaves,)`` or ``(n_leaves, k)``, in
        :attr:`leaves` order), summed level by level."""
        x_leaves = np.asarray(x_leaves, dtype=float)
        out = np.zeros((self.n_nodes,) + x_leaves.shape[1:])
        out[self.leaves] = x_leaves
        for d in range(self._forest.n_levels - 1, 0, -1):
            nodes = self.levels[d]
            np.add.at(out, self._parent[nodes], out[nodes])
        return out

    def __repr__(self) -> str:
        sizes = ", ".join(str(lv.size) for lv in self.levels)
        return f"Geography({self.n_nodes} units; per level: {sizes})"


def geography(parents) -> Geography:
    """A geography from its units' parents.

    ``parents`` is one of

    * a parent array: ``parents[v]`` the index of ``v``'s parent, ``-1`` for a root (units are
      named by their index);
    * a mapping ``{name: parent name}`` with ``None`` for a root (units in the mapping's order);
    * a nested mapping ``{name: children}`` where ``children`` is again a nested mapping, or a
      sequence of leaf names, or empty (units in breadth-first order, roots first).

    >>> geo = geography({"US": {"PA": ["Centre", "Erie"], "NY": ["Kings"]}})
    >>> geo.names, geo.parent.tolist()
    (['US', 'PA', 'NY', 'Centre', 'Erie', 'Kings'], [-1, 0, 0, 1, 1, 2])
    """
    if isinstance(parents, Mapping):
        if parents and all(isinstance(v, (Mapping, list, tuple)) for v in parents.values()):
            return _nested(parents)
        return _flat(parents)
    arr = np.asarray(parents)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError("geography: parents must be an integer parent array or a mapping of names")
    return Geography(arr)


def _flat(parents: Mapping) -> Geography:
    names = list(parents)
    index = {n: i for i, n in enumerate(names)}
    parent = np.empty(len(names), dtype=np.int64)
    for i, name in enumerate(names):
        p = parents[name]
        if p is None:
            parent[i] = -1
        elif p in index:
            parent[i] = index[p]
        else:
            raise ValueError(f"geography: the parent {p!r} of {name!r} is not a unit")
    return Geography(parent, names)


def _nested(tree: Mapping) -> Geography:
    names, parent = [], []
    queue = [(name, -1, sub) for name, sub in tree.items()]
    while queue:
        nxt = []
        for name, p, sub in queue:
            i = len(names)
            names.append(name)
            parent.append(p)
            if isinstance(sub, Mapping):
                nxt.extend((c, i, s) for c, s in sub.items())
            elif isinstance(sub, (list, tuple)):
                nxt.extend((c, i, {}) for c in sub)
            else:
                raise TypeError(f"geography: the children of {name!r} must be a mapping or a "
                                f"sequence of names, got {type(sub).__name__}")
        queue = nxt
    return Geography(np.array(parent, dtype=np.int64), names)
