"""What the local-polytope ADMM solves and how: the problem's arrays and the settings.

``minimize loss(t)`` over the local polytope of a region graph (:mod:`.region_graph`): the
loss split into its cell-wise part and its coupled rows (:func:`.loss.split_loss`) once, here,
for every step that reads them (the ADMM, the dual Newton method, the elimination of
unmeasured cliques).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import scipy.sparse as sp

from ..marginal.free_total import spanning_terms, total_bound
from ..marginal.loss import MarginalLoss
from .loss import split_loss
from .region_graph import RegionGraph

__all__ = ["LocalProblem", "LocalSettings"]


@dataclass
class LocalSettings:
    """Stopping rules (``eps_rel`` the certified relative gap, ``eps_abs`` the largest
    violation of the returned point) and ADMM parameters."""

    max_iters: int = 10000
    eps_abs: float = 1e-6
    eps_rel: float = 1e-6
    time_limit: float = math.inf
    rho: float | None = None
    alpha: float = 1.6
    adaptive_rho: bool | None = None      # None: on for small problems without a squared row
    check_every: int = 10
    polish: bool = True
    dual_newton: bool = True              # semismooth Newton on the dual first, where it applies
    duals: bool = True                    # multipliers wanted (iterations go on for them)
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


@dataclass
class LocalProblem:
    """``minimize loss(t)`` over the local polytope of ``graph`` with ``total`` (``None``:
    free; a proven bound on the optimal total then comes from the loss terms that span a
    clique's total, :func:`cvxdp.solvers.marginal.free_total.total_bound`)."""

    graph: RegionGraph
    loss: MarginalLoss
    total: float | None

    def __post_init__(self) -> None:
        if self.loss.n != self.graph.n:
            raise ValueError(f"LocalProblem: the loss has {self.loss.n} cells, the cliques {self.graph.n}")
        if self.total is not None and not (math.isfinite(self.total) and self.total > 0):
            raise ValueError(f"LocalProblem: total must be positive and finite, got {self.total}")
        self.cells, self.coupled = split_loss(self.loss)
        terms = self.coupled.terms
        self.Q = sp.vstack([t.A for t in terms]).tocsr() if terms else None
        self.QT = self.Q.T.tocsr() if terms else None
        self.spans = spanning_terms(self.loss, self.graph.offsets) if self.total is None else []

    def total_max(self, upper: float) -> float | None:
        """A proven bound on the optimal free total given a feasible loss value ``upper``."""
        return total_bound(self.loss, self.spans, upper) if self.spans else None
