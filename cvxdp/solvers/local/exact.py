"""Exact multipliers for a small local-polytope answer whose own did not certify.

The local polytope is linear: clique tables ``t >= 0`` whose marginals agree on every shared
region, ``M_{r,j} t = M_{r,1} t`` for the members ``j`` of region ``r`` (the stacked 0/1
marginalisers of :class:`~cvxdp.solvers.local.region_graph.RegionGraph`), and whose totals
equal ``N`` (or each other, for a free total).  The loss is a sum of weighted absolute and
squared rows ``(A_t t - b_t)_i``.  That is the consistency family's problem (``min sum_i
w1_i |r_i| + (w2_i / 2) r_i^2``, ``r = M x - y``, ``A x = b``, ``x >= 0``), which
:mod:`cvxdp.solvers.consistency.general_exact` solves exactly (the LP, or the interior point
and its active-set polish) with certified multipliers ``(y_A, s)`` of the equalities and the
bounds.

The constraint's dual that cvxdp writes (the multipliers of "measured marginal = table",
:mod:`.admm`) is minus the loss gradient at the optimum, ``-G``; stationarity of the
consistency problem, ``G + A^T y_A - s_lo + s_up = 0``, gives it from certified multipliers as
``A^T y_A - s_lo + s_up``: exactly the subgradient with which the linearised loss is minimal
over the polytope at the returned point, so its Lagrangian bound equals the optimum.

Used where the iterations certified the gap but not the multipliers (the stress set: free
totals whose cone slope stays at rounding level, and linearised bounds short of ``eps_rel`` at
extreme scales; 7 of 600 instances at seed 11), up to :data:`EXACT_MAX` cells.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .. import result as R
from ..consistency import general_exact
from ..consistency.kkt import constraint_gradient
from ..consistency.problem import ADMMSettings, ConsistencyData
from .problem import LocalProblem, LocalSettings

__all__ = ["consistency_data", "exact_multipliers", "active_set_finish", "EXACT_MAX"]

#: the exact finish runs on problems of at most this many cells (the interior point's dense
#: Newton matrices; the iterations' answer stays as it is above)
EXACT_MAX = 5000


def consistency_data(p: LocalProblem) -> ConsistencyData:
    """``p`` as a consistency problem over the stacked clique tables (module docstring)."""
    n = p.graph.n
    rows, y, w1, w2 = [], [], [], []
    for t in p.loss.terms:
        if isinstance(t.A, slice):
            m = t.A.stop - t.A.start
            rows.append(sp.csr_matrix((np.ones(m), (np.arange(m), t.A.start + np.arange(m))),
                                      shape=(m, n)))
        else:
            rows.append(sp.csr_matrix(t.A))
        y.append(t.b)
        w1.append(t.w if t.kind == "l1" else np.zeros(t.b.size))
        w2.append(t.w if t.kind == "l2" else np.zeros(t.b.size))
    M = sp.vstack(rows).tocsr() if rows else sp.csr_matrix((0, n))
    A, b = _constraints(p)
    return ConsistencyData(n=n, M=M, y=_cat(y), w1=_cat(w1), w2=_cat(w2), lower=np.zeros(n),
                           upper=np.full(n, np.inf), A=A, b=b, constant=p.loss.constant)


def _cat(parts: list) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def _constraints(p: LocalProblem) -> tuple[sp.csr_matrix, np.ndarray]:
    """``A t = b``: each region's members agree with its first, the totals equal ``N`` (or
    the first clique's total when free).  Rows implied by others are kept: the exact routes
    take rank-deficient equalities."""
    G, n = p.graph, p.graph.n
    blocks = []
    for reg, rows in zip(G.regions, (G.region_rows(i) for i in range(len(G.regions)))):
        k = reg.members.size
        size = (rows.stop - rows.start) // k
        R_ = G.M[rows]
        first = R_[:size]
        blocks += [R_[j * size:(j + 1) * size] - first for j in range(1, k)]
    K = len(G.cliques)
    T = sp.csr_matrix((np.ones(n), (np.repeat(np.arange(K), G.cells), np.arange(n))), shape=(K, n))
    if p.total is not None:
        blocks.append(T)
        rhs_tot = np.full(K, float(p.total))
    elif K > 1:
        first = sp.csr_matrix((-np.ones(K - 1), (np.arange(K - 1), np.zeros(K - 1, dtype=int))),
                              shape=(K - 1, K))
        blocks.append((first + sp.eye(K - 1, K, k=1)) @ T)      # total k minus total 0
        rhs_tot = np.zeros(K - 1)
    else:
        rhs_tot = np.zeros(0)
    if not blocks:
        return sp.csr_matrix((0, n)), np.zeros(0)
    A = sp.vstack(blocks).tocsr()
    b = np.r_[np.zeros(A.shape[0] - rhs_tot.size), rhs_tot]
    return A, b


def _settings(s: LocalSettings) -> ADMMSettings:
    return ADMMSettings(eps_abs=s.eps_abs, eps_rel=s.eps_rel, time_limit=s.time_limit,
                        verbose=s.verbose)


def exact_multipliers(p: LocalProblem, s: LocalSettings, res: R.SolverResult,
                      t0: float) -> R.SolverResult:
    """``res`` when it has certified multipliers (or none are wanted, or ``p`` is larger than
    :data:`EXACT_MAX` cells, or the exact route does not certify); else the exact route's
    certified point, objective, bound and the constraint's dual ``-G`` (module docstring),
    its route named after the iterations'.  The active set of the iterations' point is
    tried first (:func:`~cvxdp.solvers.consistency.general_exact.from_point`)."""
    if not (res.status == R.OPTIMAL and s.duals and not res.info.get("duals_certified")
            and p.graph.n <= EXACT_MAX):
        return res
    data = consistency_data(p)
    out = general_exact.certified_rerun(data, _settings(s), t0, res.x)
    if out is None or out.objective > res.objective + s.eps_rel * max(1.0, abs(res.objective)):
        return res
    res.x = out.x
    res.objective = out.objective
    res.lower_bound = max(res.lower_bound, out.lower_bound)
    res.gap = R.relative_gap(res.objective, res.lower_bound)
    res.primal_residual = p.graph.residual(out.x, p.total)
    res.duals = {"marginals": constraint_gradient(data, out.duals)}
    res.info["duals_certified"] = True
    res.info["route"] = f"{res.info.get('route')}, then {out.info.get('route')} for exact multipliers"
    res.iterations += out.iterations
    res.solve_time = time.perf_counter() - t0 - res.setup_time
    return res


def active_set_finish(p: LocalProblem, s: LocalSettings, x: np.ndarray,
                      data: ConsistencyData | None = None) -> R.SolverResult | None:
    """The certified exact solution on the active set that ``x`` points at
    (:func:`~cvxdp.solvers.consistency.general_exact.from_point`), its constraint's dual
    ``-G`` in ``duals["marginals"]``; ``None`` when it does not certify (or ``p`` has more
    than :data:`EXACT_MAX` cells).  How iterations that stall short of the certified gap end
    (:class:`cvxdp.solvers.local.admm`): at extreme scales (cells of 1e6 under a total of
    1e7, an objective of 3-30) the bound's rounding keeps the gap above ``eps_rel`` for
    10,000 iterations while the point's kinks and bounds are already exact.  ``data``: ``p``
    as :func:`consistency_data` gives it, when the caller keeps it across tries."""
    if p.graph.n > EXACT_MAX:
        return None
    data = consistency_data(p) if data is None else data
    out = general_exact.from_point(data, x, _settings(s))
    if out is None:
        return None
    out.duals = {"marginals": constraint_gradient(data, out.duals)}
    return out
