"""Query matrices (workloads and strategies) over a domain of ``n`` cells.

Every function returns a ``scipy.sparse.csr_matrix`` of floats whose columns are
the cells ``0 .. n-1`` of the data vector; multi-attribute tables are flattened
in C (row-major) order, ``cell = np.ravel_multi_index(values, domain)``.

* :func:`identity`, :func:`total`, :func:`prefix` (the CDF), :func:`all_ranges`,
  :func:`range_queries`, :func:`random_ranges` — one-dimensional range workloads.
* :func:`hierarchy` — the hierarchical strategy of Hay, Rastogi, Miklau, Suciu
  (*Boosting the accuracy of differentially private histograms through
  consistency*, VLDB 2010): noisy counts of every node of a k-ary tree over the
  cells, plus the tree's consistency constraints and least-squares projection.
* :func:`sqrt_tree` — the two-level hierarchical strategy of Xiao, He, Zhang, Kifer's
  experiments (VLDB 2021): total, ``floor(sqrt n)`` blocks, cells.
* :func:`wavelet` — Privlet, the Haar wavelet strategy of Xiao, Wang, Gehrke
  (*Differential privacy via wavelet transforms*, ICDE 2010; TKDE 2011).
* :func:`marginal`, :func:`marginals`, :func:`kron` — marginals of a
  multi-attribute contingency table as Kronecker products.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from ..solvers.tree.forest import Forest, TreeLSQ
from .geography import Geography, geography
from .marginal_workload import MarginalWorkload, marginal_workload

from .randomness import as_rng as _as_rng

__all__ = ["identity", "total", "prefix", "all_ranges", "range_queries", "random_ranges",
           "sqrt_tree", "wavelet", "marginal", "marginals", "kron", "Hierarchy", "hierarchy",
           "Geography", "geography", "MarginalWorkload", "marginal_workload"]

# Largest full table a marginal matrix is built over (one non-zero per cell).
_MAX_CELLS = 2 ** 31 - 1
# node orders of a hierarchy: cvxdp's (empty nodes pruned), OpenDP's make_b_ary_tree
LAYOUTS = ("cvxdp", "opendp")


# ------------------------------------------------------------------ helpers
def _int(x: object, name: str, minimum: int = 1) -> int:
    """``x`` as a Python int ``>= minimum``; ``ValueError`` otherwise."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    v = int(x)
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v}")
    return v


def _index_dtype(*bounds: int) -> type:
    return np.int32 if max(bounds) < np.iinfo(np.int32).max else np.int64


def _csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
         shape: tuple[int, int]) -> sp.csr_matrix:
    """A CSR matrix from already sorted, duplicate-free arrays (no re-sorting)."""
    idx = _index_dtype(int(indptr[-1]), shape[0], shape[1])
    M = sp.csr_matrix((np.asarray(data, dtype=float), indices.astype(idx, copy=False),
                       indptr.astype(idx, copy=False)), shape=shape)
    M.has_sorted_indices = True
    return M


def _intervals_matrix(n: int, lo: np.ndarray, hi: np.ndarray) -> sp.csr_matrix:
    """Row ``r`` = indicator of the cells ``[lo[r], hi[r])`` (validated by callers)."""
    lengths = hi - lo
    indptr = np.zeros(lo.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    nnz = int(indptr[-1])
    # entry t of row r is cell lo[r] + (t - indptr[r])
    indices = np.arange(nnz, dtype=np.int64) - np.repeat(indptr[:-1] - lo, lengths)
    return _csr(np.ones(nnz), indices, indptr, (lo.size, n))


# ------------------------------------------------------------ 1-D workloads
def identity(n: int) -> sp.csr_matrix:
    """The ``n x n`` identity: every cell count on its own."""
    n = _int(n, "n")
    return sp.identity(n, dtype=float, format="csr")


def total(n: int) -> sp.csr_matrix:
    """The ``1 x n`` row of ones: the total count."""
    n = _int(n, "n")
    return _csr(np.ones(n), np.arange(n), np.array([0, n]), (1, n))


def prefix(n: int) -> sp.csr_matrix:
    """The ``n x n`` lower-triangular ones: row ``i`` counts cells ``0 .. i`` (the CDF)."""
    n = _int(n, "n")
    return _intervals_matrix(n, np.zeros(n, dtype=np.int64), np.arange(1, n + 1))


def all_ranges(n: int) -> sp.csr_matrix:
    """Every interval ``[i, j]``, ``0 <= i <= j < n``: ``n (n + 1) / 2`` rows in
    lexicographic order of ``(i, j)``.  It has ``n (n+1) (n+2) / 6`` non-zeros."""
    n = _int(n, "n")
    i, j = np.triu_indices(n)
    return _intervals_matrix(n, i.astype(np.int64), j.astype(np.int64) + 1)


def range_queries(n: int, intervals: np.ndarray | Sequence[Sequence[int]]) -> sp.csr_matrix:
    """One row per half-open interval ``[lo, hi)`` of ``intervals`` (shape ``(k, 2)``),
    with ``0 <= lo < hi <= n`` (an empty interval is rejected: it usually means a
    closed interval ``[i, i]`` was passed)."""
    n = _int(n, "n")
    iv = np.asarray(intervals)
    if iv.size == 0:
        iv = iv.reshape(0, 2)
    if iv.ndim != 2 or iv.shape[1] != 2:
        raise ValueError(f"intervals must have shape (k, 2), got {iv.shape}")
    if not np.issubdtype(iv.dtype, np.integer):
        if not (np.issubdtype(iv.dtype, np.number) and np.all(np.isfinite(iv))
                and np.all(iv == np.round(iv))):
            raise ValueError("intervals must hold integer (lo, hi) pairs")
    iv = iv.astype(np.int64)
    lo, hi = iv[:, 0], iv[:, 1]
    bad = (lo < 0) | (hi > n) | (lo >= hi)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise ValueError(f"intervals must satisfy 0 <= lo < hi <= n = {n}; "
                         f"row {r} is ({lo[r]}, {hi[r]})")
    return _intervals_matrix(n, lo.copy(), hi.copy())


def random_ranges(n: int, k: int, rng: int | np.random.Generator | None = None,
                  length: int | None = None) -> sp.csr_matrix:
    """``k`` random range queries over ``n`` cells.

    Without ``length`` each interval is drawn uniformly from the ``n (n + 1) / 2``
    intervals ``[i, j]`` (so a single cell is as likely as any other interval,
    unlike sorting two uniform endpoints); with ``length = L`` the start is
    uniform on ``0 .. n - L``.  ``rng`` is ``None``, an int seed or a
    ``numpy.random.Generator``; the same seed gives the same matrix.
    """
    n = _int(n, "n")
    k = _int(k, "k", minimum=0)
    gen = _as_rng(rng)
    if length is not None:
        L = _int(length, "length")
        if L > n:
            raise ValueError(f"length must be at most n = {n}, got {L}")
        lo = gen.integers(0, n - L + 1, size=k, dtype=np.int64)
        return _intervals_matrix(n, lo, lo + L)
    # interval t (lexicographic (i, j)) starts row i at offset i n - i (i - 1) / 2
    n_int = n * (n + 1) // 2
    t = gen.integers(0, n_int, size=k, dtype=np.int64)
    i = np.arange(n, dtype=np.int64)
    starts = i * n - i * (i - 1) // 2
    lo = np.searchsorted(starts, t, side="right") - 1
    hi = lo + (t - starts[lo]) + 1
    return _intervals_matrix(n, lo, hi)


# ------------------------------------------------------------------ wavelet
def wavelet(n: int) -> sp.csr_matrix:
    """The Haar wavelet strategy with Privlet weights, ``n x n`` for ``n = 2^h``.

    Privlet (Xiao, Wang, Gehrke, ICDE 2010, sec. IV) releases the Haar
    coefficients of the complete binary tree over the cells: the base
    coefficient ``c_0 = sum(x) / n`` and, for each internal node ``c`` whose
    subtree holds ``m`` cells, ``c = (a - b) / 2 = (sum_left - sum_right) / m``
    (``a``, ``b`` the averages of its left and right halves).  Each coefficient
    gets Laplace noise of scale ``lambda / W(c)`` with weight ``W(c_0) = n`` and
    ``W(c) = m``.  Scaling every coefficient by its weight gives the rows here:

    * row 0: all ones (``n c_0``);
    * then one row per internal node, breadth first (root first, left to right):
      ``+1`` on the node's left half, ``-1`` on its right half (``m c``).

    One cell changes ``c_0`` and the ``h`` coefficients on its root-to-leaf path,
    each weighted change being 1, so the L1 sensitivity (max column L1 norm) is
    ``1 + log2 n``: Privlet's generalized sensitivity.  The matrix is invertible
    (its rows are orthogonal) and answering it with the Laplace mechanism is
    exactly Privlet.
    """
    n = _int(n, "n")
    h = n.bit_length() - 1
    if n != 1 << h:
        raise ValueError(f"n must be a power of 2, got {n}")
    cells = np.arange(n, dtype=np.int64)
    data = [np.ones(n)]
    row_len = [np.array([n])]
    for d in range(h):                              # level d: 2^d nodes of m cells
        m = n >> d
        data.append(np.where(cells % m < m // 2, 1.0, -1.0))
        row_len.append(np.full(1 << d, m))
    indptr = np.r_[0, np.cumsum(np.concatenate(row_len))]
    # rows of one level partition the cells left to right, so columns are 0..n-1 per level
    return _csr(np.concatenate(data), np.tile(cells, h + 1), indptr, (n, n))


# --------------------------------------------------------------- marginals
def kron(*matrices: np.ndarray | sp.spmatrix) -> sp.csr_matrix:
    """Kronecker product ``M_1 (x) M_2 (x) ... (x) M_p`` (left to right), sparse CSR.

    With cells in C order, ``kron(A, B)`` applies ``A`` to the first attribute and
    ``B`` to the second: ``(A (x) B) vec_C(X) = vec_C(A X B^T)``.
    """
    if not matrices:
        raise ValueError("kron needs at least one matrix")
    mats = []
    for i, M in enumerate(matrices):
        if sp.issparse(M):
            mats.append(sp.csr_matrix(M, dtype=float))
            continue
        A = np.asarray(M, dtype=float)
        if A.ndim != 2:
            raise ValueError(f"matrices[{i}] must be 2-D, got shape {A.shape}")
        mats.append(sp.csr_matrix(A))
    out = mats[0].copy()
    for M in mats[1:]:
        out = sp.kron(out, M, format="csr")
    return sp.csr_matrix(out, dtype=float)


def _domain_sizes(domain: Sequence[int] | Mapping[object, int]) -> tuple[list[int], list | None]:
    """Attribute sizes and, for a mapping, the attribute names (in domain order)."""
    if isinstance(domain, Mapping):
        names = list(domain.keys())
        sizes = [domain[a] for a in names]
    elif isinstance(domain, (str, bytes)) or not isinstance(domain, (Sequence, np.ndarray)):
        raise ValueError(f"domain must be a sequence of attribute sizes or a mapping "
                         f"name -> size, got {type(domain).__name__}")
    else:
        names = None
        sizes = list(np.asarray(domain).reshape(-1).tolist()) if isinstance(domain, np.ndarray) \
            else list(domain)
    if not sizes:
        raise ValueError("domain must have at least one attribute")
    return [_int(s, f"domain size of attribute {names[i] if names else i}")
            for i, s in enumerate(sizes)], names


def _attr_positions(attrs: object, sizes: list[int], names: list | None) -> list[int]:
    """Positions (in domain order) of ``attrs``: names for a mapping domain, ints otherwise."""
    if names is not None:
        if isinstance(attrs, (str, bytes)) or not isinstance(attrs, (Sequence, np.ndarray, set,
                                                                     frozenset)):
            attrs = (attrs,)
        lookup = {a: i for i, a in enumerate(names)}
        pos = []
        for a in attrs:
            if a not in lookup:
                raise ValueError(f"attrs: unknown attribute {a!r}; domain has {names}")
            pos.append(lookup[a])
    else:
        if isinstance(attrs, numbers.Integral):
            attrs = (attrs,)
        pos = []
        for a in attrs:
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Integral) \
                    or not 0 <= int(a) < len(sizes):
                raise ValueError(f"attrs must be attribute positions in [0, {len(sizes)}), "
                                 f"got {a!r}")
            pos.append(int(a))
    if len(set(pos)) != len(pos):
        raise ValueError(f"attrs must not repeat an attribute, got {list(attrs)}")
    return pos


def marginal(domain: Sequence[int] | Mapping[object, int], attrs: Sequence) -> sp.csr_matrix:
    """The marginal over ``attrs`` of a contingency table with attribute sizes ``domain``.

    ``domain`` is ``(d_1, ..., d_k)`` (then ``attrs`` are positions) or a mapping
    ``name -> size`` (then ``attrs`` are names).  Columns are the cells of the full
    table in C order; the matrix is

        M = F_1 (x) F_2 (x) ... (x) F_k,  F_a = I_{d_a} if a in attrs else 1_{d_a}^T,

    so row ``r`` counts the records whose kept attributes take the values
    ``np.unravel_index(r, kept sizes)``.  **Row order follows the domain order of
    the kept attributes, whatever order ``attrs`` lists them in**: the result equals
    ``table.sum(axis=<other attributes>).ravel()``.  Empty ``attrs`` gives the total.

    Every column of ``M`` has a single 1, in the row of its kept coordinates, so
    the CSR arrays come from one transpose of the cell indices (kept axes first,
    then the summed ones) in O(cells), rather than from chained sparse Kronecker
    products (same matrix, an order of magnitude faster).
    """
    sizes, names = _domain_sizes(domain)
    keep = set(_attr_positions(attrs, sizes, names))
    kept = [a for a in range(len(sizes)) if a in keep]
    summed = [a for a in range(len(sizes)) if a not in keep]
    N = math.prod(sizes)
    if N > _MAX_CELLS:
        raise ValueError(f"domain has {N} cells; a query matrix over the full table needs at "
                         f"most {_MAX_CELLS} (model marginals without the full table instead)")
    n_rows = math.prod(sizes[a] for a in kept)
    idx = _index_dtype(N, n_rows)
    cells = np.arange(N, dtype=idx).reshape(sizes)
    # row r holds the cells whose kept coordinates unravel from r, in increasing order
    indices = cells.transpose(kept + summed).ravel()
    indptr = np.arange(n_rows + 1, dtype=np.int64) * (N // n_rows)
    return _csr(np.ones(N), indices, indptr, (n_rows, N))


def marginals(domain: Sequence[int] | Mapping[object, int],
              attr_sets: Sequence[Sequence]) -> sp.csr_matrix:
    """:func:`marginal` for each attribute set, stacked vertically in the given order."""
    if isinstance(attr_sets, (str, bytes)) or not isinstance(attr_sets, (Sequence, np.ndarray)):
        raise ValueError(f"attr_sets must be a sequence of attribute sets, "
                         f"got {type(attr_sets).__name__}")
    if len(attr_sets) == 0:
        raise ValueError("attr_sets must contain at least one attribute set")
    return sp.csr_matrix(sp.vstack([marginal(domain, a) for a in attr_sets], format="csr"),
                         dtype=float)


# --------------------------------------------------------------- hierarchy
class Hierarchy:
    """A breadth-first ``k``-ary tree of range counts over ``n_leaves`` cells.

    The strategy of Hay et al. (VLDB 2010): each node counts the cells of its
    interval.  Layout, with ``h = ceil(log_k n_leaves)`` and the root at level 0:

    * node ``i`` of level ``d`` covers cells ``[i k^(h-d), (i+1) k^(h-d))`` cut to
      ``[0, n_leaves)``, and its parent is node ``i // k`` of level ``d-1``; levels are
      stored one after the other, root first;
    * ``layout="cvxdp"`` (the default) keeps the ``ceil(n_leaves / k^(h-d))`` nodes of
      level ``d`` that hold a cell: for ``n_leaves = k^h`` the complete tree with the
      children of node ``v`` at ``k v + 1 .. k v + k`` (Lee, Wang, Kifer, KDD 2015, eq. 4,
      0-based); otherwise the complete tree over ``k^h`` cells with empty subtrees
      pruned, so a node near the right edge may have fewer than ``k`` children
      (possibly one, repeating its child's interval);
    * ``layout="opendp"`` is the vector OpenDP's ``make_b_ary_tree`` releases: every
      internal level complete (``k^d`` nodes), only the leaf level cut to ``n_leaves``,
      ``(k^h - 1) / (k - 1) + n_leaves`` nodes.  Nodes right of the last cell count no
      cell (:attr:`empty`, a zero row of :attr:`queries`); an empty node on level
      ``h - 1`` has no children, so consistency fixes it to zero;
    * all leaves are on level ``h``: the leaves are the last ``n_leaves`` nodes,
      leaf ``j`` counting cell ``j``, and the internal nodes are ``0 .. n_internal-1``.

    Consistency means ``x_p = sum_{c child of p} x_c`` for every internal ``p``.
    :meth:`project` is the least-squares projection onto it (Hay et al., Thm 3;
    weighted form in :class:`cvxdp.solvers.tree.forest.TreeLSQ`), linear in the number of nodes.

    ``queries``, ``consistency``, ``forest`` are built on first use and cached.  In the
    ``"opendp"`` layout the childless empty nodes are leaves of :attr:`forest`; estimators
    that read the forest alone (:func:`cvxdp.histograms.gls`) fix them with invariants of
    zero (``invariants={v: (np.eye(1), [0.0]) for v in tree.empty}``).
    """

    def __init__(self, n_leaves: int, branching: int = 2, layout: str = "cvxdp") -> None:
        n = _int(n_leaves, "n_leaves")
        k = _int(branching, "branching", minimum=2)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        h = 0
        while k ** h < n:
            h += 1
        # nodes of level d that hold a cell; OpenDP keeps every internal level complete
        nonempty = [-(-n // k ** (h - d)) for d in range(h + 1)]
        counts = nonempty if layout == "cvxdp" else [k ** d for d in range(h)] + [n]
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
        n_nodes = int(offsets[-1])
        parent = np.empty(n_nodes, dtype=np.int64)
        intervals = np.empty((n_nodes, 2), dtype=np.int64)
        for d in range(h + 1):
            i = np.arange(counts[d], dtype=np.int64)
            width = k ** (h - d)
            s, e = offsets[d], offsets[d + 1]
            intervals[s:e, 0] = np.minimum(i * width, n)
            intervals[s:e, 1] = np.minimum((i + 1) * width, n)
            parent[s:e] = offsets[d - 1] + i // k if d else -1
        parent.setflags(write=False)
        intervals.setflags(write=False)
        self._n, self._k, self._h, self._layout = n, k, h, layout
        self._counts = counts
        self._nonempty = nonempty
        self._offsets = offsets
        self._parent = parent
        self._intervals = intervals
        self._lsq_unit: TreeLSQ | None = None

    def __getstate__(self) -> dict:
        """Pickled as its layout only: the matrices and operators built on first use
        (:attr:`queries`, :attr:`consistency`, :attr:`forest`, the projection's operator) are
        rebuilt, the same, where they are next needed.  A model shipped to another process
        (:func:`cvxdp.solve_many`) then carries a few integers per node, not the matrices."""
        state = dict(self.__dict__)
        for name in ("queries", "consistency", "forest"):
            state.pop(name, None)
        state["_lsq_unit"] = None
        return state

    # ---------------------------------------------------------------- layout
    @property
    def n_leaves(self) -> int:
        """Number of cells (leaves)."""
        return self._n

    @property
    def branching(self) -> int:
        """Maximum number of children ``k`` of a node."""
        return self._k

    @property
    def layout(self) -> str:
        """``"cvxdp"`` (empty nodes pruned) or ``"opendp"`` (OpenDP's ``make_b_ary_tree``)."""
        return self._layout

    @property
    def empty(self) -> np.ndarray:
        """Indices of the nodes that count no cell (int64; none in the ``"cvxdp"`` layout)."""
        return np.flatnonzero(self._intervals[:, 0] == self._intervals[:, 1])

    @property
    def height(self) -> int:
        """``h = ceil(log_k n_leaves)``: the leaves are on level ``h``, the root on 0."""
        return self._h

    @property
    def n_nodes(self) -> int:
        """Total number of nodes (queries)."""
        return int(self._offsets[-1])

    @property
    def n_internal(self) -> int:
        """Number of internal nodes (every level above the leaves); they are nodes
        ``0 .. n_internal - 1``."""
        return int(self._offsets[-2]) if self._h else 0

    @property
    def parent(self) -> np.ndarray:
        """``parent[v]`` (int64, read-only), ``-1`` for the root."""
        return self._parent

    @property
    def levels(self) -> list[slice]:
        """Node indices of each level, root level first."""
        o = self._offsets
        return [slice(int(o[d]), int(o[d + 1])) for d in range(self._h + 1)]

    @property
    def leaves(self) -> slice:
        """Node indices of the leaves (the last level): leaf ``j`` is node ``leaves.start + j``."""
        return slice(int(self._offsets[-2]), int(self._offsets[-1]))

    @property
    def intervals(self) -> np.ndarray:
        """``(n_nodes, 2)`` int64 (read-only): node ``v`` covers cells ``[lo, hi)``."""
        return self._intervals

    @property
    def sensitivity(self) -> int:
        """L1 sensitivity of :attr:`queries`: each cell lies in one node per level, ``h + 1``."""
        return self._h + 1

    # -------------------------------------------------------------- matrices
    @cached_property
    def queries(self) -> sp.csr_matrix:
        """``n_nodes x n_leaves`` CSR: row ``v`` is the indicator of ``v``'s interval."""
        lo, hi = self._intervals[:, 0], self._intervals[:, 1]
        indptr = np.r_[0, np.cumsum(hi - lo)]
        # each level partitions 0..n-1 left to right, so its columns are just 0..n-1
        idx = _index_dtype(int(indptr[-1]), self.n_nodes, self._n)
        indices = np.tile(np.arange(self._n, dtype=idx), self._h + 1)
        return _csr(np.ones(indices.size), indices, indptr, (self.n_nodes, self._n))

    @cached_property
    def consistency(self) -> sp.csr_matrix:
        """``n_internal x n_nodes`` CSR: row ``p`` is ``x_p - sum_{c child of p} x_c``.

        Rows follow the internal nodes ``0 .. n_internal - 1``; ``consistency @ queries = 0``.
        """
        p, N = self.n_internal, self.n_nodes
        n_children = np.bincount(self._parent[1:], minlength=p)[:p]
        indptr = np.r_[0, np.cumsum(1 + n_children)]
        nnz = int(indptr[-1])
        head = indptr[:-1]
        data = -np.ones(nnz)
        data[head] = 1.0
        indices = np.empty(nnz, dtype=np.int64)
        indices[head] = np.arange(p)
        # non-root nodes in index order are grouped by parent (BFS), children follow their head
        is_child = np.ones(nnz, dtype=bool)
        is_child[head] = False
        indices[is_child] = np.arange(1, N)
        return _csr(data, indices, indptr, (p, N))

    @cached_property
    def forest(self) -> Forest:
        """The tree as a :class:`cvxdp.solvers.tree.forest.Forest` (for the structured solvers)."""
        return Forest(np.array(self._parent))

    # ------------------------------------------------------------- operations
    def project(self, v: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Weighted least-squares projection onto consistency:

            argmin_x  sum_v a_v (x_v - v_v)^2   s.t.  x_p = sum_{c child of p} x_c,

        ``a = weights`` (default ones; ``inf`` fixes a node, ``0`` ignores it; the
        :attr:`empty` nodes are fixed at zero, the count of no cell).  Two
        linear passes (Hay et al., VLDB 2010, Thm 3) via :class:`cvxdp.solvers.tree.forest.TreeLSQ`;
        the unit-weight operator is cached.  Returns a new array.
        """
        x = np.asarray(v, dtype=float)
        if x.shape != (self.n_nodes,):
            raise ValueError(f"v must have shape ({self.n_nodes},), got {np.shape(v)}")
        if not np.all(np.isfinite(x)):
            raise ValueError("v must be finite (contains NaN or inf)")
        empty = self.empty
        if empty.size:                  # counts of no cell: known zeros, fixed (weight inf)
            x = x.copy()
            x[empty] = 0.0
        if weights is None:
            if self._lsq_unit is None:
                self._lsq_unit = TreeLSQ(self.forest, self._fixed_empty(np.ones(self.n_nodes)))
            lsq = self._lsq_unit
        else:
            lsq = TreeLSQ(self.forest, self._fixed_empty(np.array(weights, dtype=float)))
        return np.array(lsq.project(x), dtype=float)

    def _fixed_empty(self, weights: np.ndarray) -> np.ndarray:
        """``weights`` with ``inf`` on the empty nodes (their value, zero, is known)."""
        if weights.shape == (self.n_nodes,):
            weights[self.empty] = np.inf
        return weights

    def sum_up(self, leaf_values: np.ndarray) -> np.ndarray:
        """Node values of a leaf vector: ``queries @ leaf_values``, by summing children
        level by level (float array of length ``n_nodes``)."""
        x = np.asarray(leaf_values, dtype=float)
        if x.shape != (self._n,):
            raise ValueError(f"leaf_values must have shape ({self._n},), "
                             f"got {np.shape(leaf_values)}")
        out = np.zeros(self.n_nodes)
        o, k = self._offsets, self._k
        out[o[-2]:o[-1]] = x
        for d in range(self._h, 0, -1):
            child = out[o[d]:o[d] + self._nonempty[d]]     # empty nodes stay zero
            sums = np.add.reduceat(child, np.arange(0, child.size, k))
            out[o[d - 1]:o[d - 1] + sums.size] = sums
        return out

    def range_nodes(self, lo: int, hi: int) -> np.ndarray:
        """Canonical decomposition of the cells ``[lo, hi)``: the maximal nodes whose
        intervals lie inside it, left to right (int64 node indices).

        Their intervals partition ``[lo, hi)``, so the range count is the sum of their
        counts (Hay et al. 2010, sec. 3); at most ``2 (k - 1)`` nodes per level.  Where
        a node has a single child (pruned trees) the higher node is used.
        """
        n = self._n
        lo = _int(lo, "lo", minimum=0)
        hi = _int(hi, "hi", minimum=0)
        if not lo < hi <= n:
            raise ValueError(f"need 0 <= lo < hi <= n_leaves = {n}, got lo={lo}, hi={hi}")
        k, o = self._k, self._offsets
        left: list[np.ndarray] = []
        right: list[np.ndarray] = []
        l, r = lo, hi                                # node range [l, r) on level d
        for d in range(self._h, -1, -1):
            if d == 0:
                left.append(np.arange(l, r) + o[0])
                break
            c = self._nonempty[d]                    # nodes right of c count no cell
            L = -(-l // k)                           # first parent whose children are all in
            R = -(-r // k) if r == c else r // k     # the last parent may have < k children
            if L >= R:
                left.append(np.arange(l, r) + o[d])
                break
            left.append(np.arange(l, L * k) + o[d])
            right.append(np.arange(R * k, r) + o[d])
            l, r = L, R
        return np.concatenate(left + right[::-1]).astype(np.int64)

    def __repr__(self) -> str:
        layout = "" if self._layout == "cvxdp" else f", layout={self._layout!r}"
        return (f"Hierarchy(n_leaves={self._n}, branching={self._k}{layout}, height={self._h}, "
                f"n_nodes={self.n_nodes})")


def sqrt_tree(n: int) -> sp.csr_matrix:
    """The hierarchical strategy (HM) of Xiao, He, Zhang, Kifer's experiments (VLDB 2021,
    sec. 7; ``hb_strategy_matrix`` in their published code): the total, then
    ``k = floor(sqrt(n))`` blocks of ``k`` consecutive cells, then every cell:
    ``1 + k + n`` rows.  When ``k^2 < n`` the last ``n - k^2`` cells belong to no block, so
    the columns' squared norms are 3 and 2; calibrate to the largest (3, for ``n >= 1``).

    The paper describes HM as a tree with the optimal branching factor of Qardaji, Yang, Li
    (PVLDB 2013); its Tables 4 and 9 (PL-94, age pyramids) are reproduced with this tree,
    not with a complete k-ary :func:`hierarchy`."""
    n = _int(n, "n")
    k = math.isqrt(n)
    lo = np.concatenate([[0], k * np.arange(k), np.arange(n)]).astype(np.int64)
    hi = np.concatenate([[n], k * np.arange(1, k + 1), np.arange(1, n + 1)]).astype(np.int64)
    return _intervals_matrix(n, lo, hi)


def hierarchy(n_leaves: int, branching: int = 2, layout: str = "cvxdp") -> Hierarchy:
    """The hierarchical strategy over ``n_leaves`` cells with ``branching`` children
    per node (Hay et al., VLDB 2010); see :class:`Hierarchy`.

    ``layout="opendp"`` lays the nodes out as OpenDP's ``make_b_ary_tree(leaf_count=n_leaves,
    branching_factor=branching)`` releases them (row ``v`` of :attr:`Hierarchy.queries` is
    node ``v`` of OpenDP's vector), so that release is the ``answers`` of a
    :class:`cvxdp.Measurement` with these queries."""
    return Hierarchy(n_leaves, branching, layout)
