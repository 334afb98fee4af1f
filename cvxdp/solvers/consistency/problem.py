"""The consistency problem as arrays, the ADMM options and the warm-start state.

Problem (Lee, Wang, Kifer, KDD 2015, eqs. 7, 23 and 5)::

    minimize    sum_i  w1_i |(M x - y)_i| + (w2_i / 2) (M x - y)_i^2  +  constant
    subject to  A x = b,   lower <= x <= upper,   x monotone along given chains
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from .._linalg import dot as _dot
from .isotonic import Chains
from .losses import SeparableLoss
from ..tree.forest import distinct, forest_from_queries, forest_from_rows

__all__ = ["ConsistencyData", "ADMMSettings", "ADMMState"]


@dataclass
class ConsistencyData:
    """Arrays of the problem above.  ``M`` is ``m x n`` sparse; ``A``/``b`` may be
    ``None``; ``chains`` may be ``None``; ``constant`` is added to the objective."""

    n: int
    M: sp.csr_matrix
    y: np.ndarray
    w1: np.ndarray
    w2: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    A: sp.csr_matrix | None = None
    b: np.ndarray | None = None
    chains: Chains | None = None
    constant: float = 0.0
    forest_hint: Any = None          # (Forest, row_parent, row_scale) when known
    lift: Any = None                 # tree.TreeQueries when M is a hierarchy's query matrix
    lazy_lift: bool = False          # ... or read it from M when first asked (tree_queries)
    shape: tuple | None = None       # (units, cells) when x is one (n, k) variable
    loss_starts: np.ndarray | None = None  # first row of each loss term in M (a hint for
                                           # structure detection: rows of one term are alike)
    _separable: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def objective(self, x: np.ndarray) -> float:
        r = self.M @ x - self.y
        return float(_dot(self.w1, np.abs(r)) + 0.5 * _dot(self.w2, r * r)) + self.constant

    def empty_rows_constant(self) -> float:
        """The loss of the rows of ``M`` without an entry (``phi(-y)``, a constant): the
        separable splitting keeps only rows with an entry, so it adds this."""
        empty = np.diff(self.M.tocsr().indptr) == 0
        y = self.y[empty]
        return float(_dot(self.w1[empty], np.abs(y)) + 0.5 * _dot(self.w2[empty], y * y))

    @property
    def has_eq(self) -> bool:
        return self.A is not None and self.A.shape[0] > 0

    @property
    def has_chains(self) -> bool:
        return self.chains is not None and bool(self.chains.chains)

    def forest_rows(self):
        """``A x = b`` as forest consistency (:func:`tree.forest_from_rows`), or ``None``;
        searched once per problem (the cost model and the projection both ask)."""
        if not self.has_eq:
            return None
        return memoised(self, "forest_rows", lambda d: forest_from_rows(d.A, d.b))

    def tree_queries(self):
        """``M`` as a hierarchy's query matrix over the leaves (:class:`tree.TreeQueries`),
        or ``None``; with ``lazy_lift`` read from ``M`` once, when a path needs it (a
        histogram tree, detected first, never does)."""
        if self.lift is not None or not self.lazy_lift:
            return self.lift
        return memoised(self, "lift", lambda d: forest_from_queries(d.M))

    def separable_loss(self) -> SeparableLoss | None:
        """The loss per coordinate if every row of ``M`` has one entry and no column
        two, else ``None``; computed once (again only if the arrays are replaced)."""
        key = (id(self.M), id(self.y), id(self.w1), id(self.w2), id(self.lower), id(self.upper))
        if self._separable is None or self._separable[0] != key:
            self._separable = (key, _separable_loss(self))
        return self._separable[1]


def memoised(data: ConsistencyData, name: str, compute):
    """``compute(data)`` once per ``name`` while the arrays stay the same objects (the
    structure detections that both :mod:`cvxdp.cost_model` and the solver read)."""
    key = (id(data.M), id(data.y), id(data.w1), id(data.w2), id(data.lower), id(data.upper),
           id(data.A), id(data.b), id(data.chains), data.shape)
    hit = data._memo.get(name)
    if hit is None or hit[0] != key:
        hit = data._memo[name] = (key, compute(data))
    return hit[1]


def _separable_loss(data: ConsistencyData) -> SeparableLoss | None:
    """``phi(a x - y) = |a| w1 |x - y/a| + a^2 w2/2 (x - y/a)^2`` per column."""
    M = data.M.tocsr()
    nnz_row = np.diff(M.indptr)
    if np.any(nnz_row > 1):
        return None
    cols = M.indices
    if not distinct(cols, data.n):
        return None
    a = M.data
    rows = np.flatnonzero(nnz_row == 1)
    y, w1, w2 = np.zeros(data.n), np.zeros(data.n), np.zeros(data.n)
    y[cols] = data.y[rows] / a
    w1[cols] = data.w1[rows] * np.abs(a)
    w2[cols] = data.w2[rows] * a * a
    return SeparableLoss(y, w1, w2, data.lower, data.upper)


@dataclass
class ADMMSettings:
    """Options (cvxpy-style names).  Tolerances: the result is *optimal* only when the
    returned point violates no constraint by more than ``eps_abs`` (absolute, in units
    of x) and its certified relative gap ``(f - L) / max(1, |f|)`` lies in
    ``[-eps_rel, eps_rel]`` (a point below the bound is gaining from its violation).
    OSQP-style residual convergence only stops the iteration; without a certificate
    (from the ADMM dual, the polish, or an LP over the multipliers) the status is
    ``optimal_inaccurate``.  Returned multipliers always pass a KKT check at the
    returned point (else ``duals = {}`` and ``info["duals_certified"] = False``)."""

    max_iters: int = 10000
    eps_abs: float = 1e-6
    eps_rel: float = 1e-6
    time_limit: float = math.inf
    rho: float | None = None
    adaptive_rho: bool | None = None   # None: automatic (see admm_separable)
    adaptive_rho_interval: int = 20
    adaptive_rho_tolerance: float = 5.0
    alpha: float = 1.6
    check_every: int = 10
    polish: bool = True
    polish_gap: float = 1e-2          # try polishing once the gap is below this
    equality_split: str = "projection"  # or "penalty": A x = b as a residual block (Alg. 1)
    general_route: str = "auto"         # or "admm": the general case by the residual split
    duals: bool = True                  # False: no multipliers sought (no LP, no pursuit polish)
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


@dataclass
class ADMMState:
    """What a warm start resumes from."""

    shape: str
    rho: float
    z: np.ndarray
    u: np.ndarray
    extra: dict = field(default_factory=dict)
