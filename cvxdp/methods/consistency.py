"""``cvxdp.ADMM`` on the consistency family: recognise -> arrays -> the numerical layer -> back.

The family: L1 / squared / elastic-net losses of affine expressions under linear equalities,
bounds and order chains (:mod:`cvxdp.recognise.consistency`).  The numerical layer
(:func:`cvxdp.solvers.consistency.admm.solve`) takes one of these routes, reported as
``extra_stats["info"]["route"]``:

* ``"tree GLS (exact)"`` -- a histogram at every unit of a tree with squared losses and no
  bounds: the exact generalised least squares (two passes, no iterations);
* ``"tree ADMM (non-negative GLS)"`` / ``"tree ADMM (L1)"`` -- the same with ``X >= 0``
  (squared / absolute losses): an ADMM whose every step is an exact tree solve;
* ``"isotonic L1 (exact)"`` -- L1 losses under order chains: exact L1 isotonic regression;
* ``"ADMM lifted tree"`` -- a hierarchy's query matrix over the leaves: solved over the
  nodes, where the loss is separable and consistency is the tree projection;
* ``"ADMM separable/..."`` -- a separable loss and one constraint set, projected onto
  (``tree``: the two-pass projection; ``affine``: a cached factorisation; ``chains``: PAVA);
* ``"LP (HiGHS interior point)"`` (``"LP (HiGHS dual simplex)"`` for small LPs) /
  ``"QP (interior point)"`` -- any other loss matrix (the matrix mechanism), pure L1 /
  squared or elastic-net rows: the whole problem by HiGHS / by the interior point of
  :mod:`cvxdp.solvers.consistency.ipm`, certified like the
  ADMM's results (:mod:`cvxdp.solvers.consistency.general_exact`);
* ``"ADMM general"`` -- the same by the residual-split ADMM (``general_route="admm"``,
  ``polish=False`` or ``equality_split="penalty"``, or when the exact route does not certify).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import cvxpy as cp

from ..solvers.consistency import admm as admm_solver
from ..solvers.consistency import fixings, general_exact, histogram_tree, isotonic_l1
from ..solvers.tree.forest import distinct
from ..solvers.result import SOLUTION_PRESENT, INFEASIBLE

from ..names import ADMM
from ..recognise.consistency import Extraction, recognise
from ..recognise.shape import entrywise_losses, loss_kind, plain_consistency
from .base import Outcome
from .input_check import check_loss_scale, check_magnitudes, loss_factor, weighted_rows
from .options import STOPPING, Option, OptionSet, Settings

__all__ = ["ConsistencyADMM", "OPTIONS", "unstack"]

# problems with more unknowns are never small enough for the pre-recognition check
_SMALL_SCAN = 10_000
#: the cost model's two ADMM kinds on general equalities: targets mostly inside their bounds
#: or not (:func:`_pushed_share`)
_PUSHED_SHARE = 0.43

#: the options of ``cvxdp.ADMM``, for every family it solves
OPTIONS = OptionSet.build(ADMM, max_iters=admm_solver.ADMMSettings.max_iters,
                          eps_abs=admm_solver.ADMMSettings.eps_abs,
                          eps_rel=admm_solver.ADMMSettings.eps_rel, own=[
    Option("rho", "number", None, "initial penalty (default: from the loss weights)",
           low=0, low_open=True, high=math.inf, high_open=True, nullable=True),
    Option("alpha", "number", admm_solver.ADMMSettings.alpha, "over-relaxation",
           low=0, high=2, low_open=True, high_open=True),
    Option("adaptive_rho", "bool", None,
           "residual-balancing rho updates (default: on, except pure L1 on a tree and, on a "
           "LocalPolytope, above 10,000 cells or with squared losses alone)",
           nullable=True),
    Option("polish", "bool", True, "active-set polish for an exact final solution"),
    Option("dual_newton", "bool", True,
           "on a LocalPolytope whose loss measures every cell: a semismooth Newton method on "
           "the dual first (absolute rows: inside proximal point steps; the ADMM takes "
           "over if it stalls)"),
    Option("check_every", "integer", admm_solver.ADMMSettings.check_every,
           "iterations between convergence checks", low=1),
    Option("equality_split", "choice", "projection",
           "'projection' (project onto A x = b) or 'penalty' (Lee et al. Algorithm 1: "
           "A x - b as a residual block, x-update with A^T A + 2 I); a LocalPolytope is "
           "always projected onto exactly",
           choices=("projection", "penalty")),
    Option("general_route", "choice", "auto",
           "off the tree / separable structures (any loss matrix): 'auto' solves the LP "
           "(pure L1, HiGHS) or the QP (interior point) and certifies it, the "
           "ADMM taking over only if that fails; 'admm' runs the residual-split ADMM",
           choices=("auto", "admm")),
])


class ConsistencyADMM:
    """``cvxdp.ADMM`` on the consistency family (module docstring)."""

    name = ADMM
    family = "consistency"
    options = OPTIONS

    def recognise(self, problem: cp.Problem) -> Extraction:
        """The problem as arrays; data too large for float64 refused here
        (:mod:`cvxdp.methods.input_check`)."""
        ext = recognise(problem)
        check_magnitudes(problem, ADMM)
        d = ext.data
        factor = np.maximum(loss_factor("l1", d.w1), loss_factor("l2", d.w2))
        check_loss_scale(problem, ext.variables, weighted_rows(factor, d.M, d.y), ADMM)
        return ext

    def cost(self, ext: Extraction) -> tuple[str, int]:
        return _cost_family(ext.data), int(ext.data.n)

    def cost_candidates(self, ext: Extraction) -> tuple[tuple[str, ...], int] | None:
        """The families :meth:`cost` can return, from the loss kind and whether the loss
        reads the variables entrywise (:func:`_candidates`)."""
        found = _candidates(ext.data)
        return None if found is None else (found, int(ext.data.n))

    def cost_before_recognition(self, problem: cp.Problem) -> tuple[str, int] | None:
        """``("consistency_small", unknowns)`` for a problem that can only be one of this
        family's iterative kinds (:func:`cvxdp.recognise.shape.plain_consistency`), so that
        the cost model may hand a small one to the standard solver without recognising it;
        ``"consistency_small_separable"`` when its losses read the variables entrywise
        (:func:`~cvxdp.recognise.shape.entrywise_losses`: not the general path); either with
        the loss kind the objective's atoms show (``"consistency_small_separable/l1"``,
        :func:`~cvxdp.recognise.shape.loss_kind`), whose families alone are compared."""
        n = sum(v.size for v in problem.variables())
        if n > _SMALL_SCAN or not plain_consistency(problem):
            return None
        kind = "consistency_small_separable" if entrywise_losses(problem) else "consistency_small"
        loss = loss_kind(problem)
        return (kind if loss is None else f"{kind}/{loss}"), int(n)

    def solve(self, problem: cp.Problem, ext: Extraction, settings: Settings, *,
              cached: Any) -> Outcome:
        if ext.trivially_infeasible:
            return Outcome(status=INFEASIBLE, primal={}, objective=math.inf, iterations=0,
                           solve_time=0.0, setup_time=0.0, reason=ext.trivially_infeasible,
                           info={"route": "none (infeasible as read)"})
        solver_settings = admm_solver.ADMMSettings(**settings.pick(
            *STOPPING, "rho", "alpha", "adaptive_rho", "polish", "check_every", "equality_split",
            "general_route", "duals"))
        x0 = state = None
        if settings.warm_start:
            if all(v.value is not None for v in ext.variables):
                x0 = np.concatenate([np.asarray(v.value, dtype=float).ravel(order="F")
                                     for v in ext.variables])
            if isinstance(cached, admm_solver.ADMMState) and cached.z.size == ext.data.n:
                state = cached
        res = admm_solver.solve(ext.data, solver_settings, x0=x0, state=state)
        info = {"route": res.info.get("route"), "rho": res.info.get("rho"),
                "polish": res.info.get("polish"),
                "admm_primal_residual": res.info.get("admm_primal_residual"),
                "constraint_violation": res.info.get("violation"),
                "duals_source": res.info.get("duals_source"),
                "lifted_nodes": res.info.get("lifted_nodes")}
        for key in ("certificate", "reason"):
            if key in res.info:
                info["infeasibility_certificate" if key == "certificate" else key] = res.info[key]
        present = res.status in SOLUTION_PRESENT and res.x is not None
        certified = present and bool(res.duals) and res.info.get("duals_certified", False)
        return Outcome(status=res.status, primal=unstack(res.x, ext) if present else {},
                       objective=res.objective, iterations=res.iterations,
                       solve_time=res.solve_time, setup_time=res.setup_time,
                       lower_bound=res.lower_bound, dual_residual=res.dual_residual,
                       history=res.history, duals=_map_duals(ext, res.duals) if certified else {},
                       duals_certified=certified, state=res.state or None,
                       warm_started=x0 is not None or state is not None,
                       reason=str(res.info.get("reason", "")), info=info)


def _cost_family(data) -> str:
    """The cost model's family of a consistency problem: the route the solve will take and
    the loss kind (``l1``, ``l2`` or ``mixed``); routes with no iterations are exact."""
    loss = _loss_kind(data)
    if isotonic_l1.applies(data):
        return "exact_isotonic"
    tree = histogram_tree.detect(data, data.shape)
    if tree is not None:
        if not tree.l1 and not tree.nonneg:
            return "exact_gls"
        return f"histogram_tree/{loss}"
    if data.forest_hint is not None or (not data.has_chains and data.tree_queries() is not None):
        return f"admm_tree/{loss}"
    if data.forest_rows() is not None or fixings.find(data) is not None:
        return f"admm_tree/{loss}"
    if general_exact.applies(data, admm_solver.ADMMSettings()):
        return f"general_exact/{loss}"           # the LP (HiGHS) or the interior point
    if data.has_chains and not data.has_eq:
        return f"admm_order/{loss}"              # order chains: PAVA in the splitting
    if loss == "l2" and _pushed_share(data) < _PUSHED_SHARE:
        return "admm_general_inside/l2"          # few targets outside the bounds
    return f"admm_general/{loss}"


def _loss_kind(data) -> str:
    """``"l1"``, ``"l2"`` or ``"mixed"``: which loss weights are present (the cost families'
    suffix)."""
    l1, l2 = bool(np.any(data.w1 > 0)), bool(np.any(data.w2 > 0))
    return "mixed" if (l1 and l2) else ("l1" if l1 else "l2")


def _candidates(data) -> tuple[str, ...] | None:
    """The families :func:`_cost_family` can return for ``data``, read off the loss weights
    and ``M``'s pattern only (tens of microseconds, where the tree and fixing detections of
    a 1,341-node tree took 0.9 ms); ``None`` where an exact family is possible (order
    chains: the exact L1 path; a 2-D variable: the histogram tree's closed form)."""
    if data.has_chains or data.shape is not None:
        return None
    loss = _loss_kind(data)
    fams = [f"admm_tree/{loss}", f"admm_general/{loss}"]
    if loss == "l2":
        fams.append("admm_general_inside/l2")
    M = data.M.tocsr()
    entrywise = bool(np.all(np.diff(M.indptr) == 1)) and distinct(M.indices, data.n)
    if not entrywise:
        fams.append(f"general_exact/{loss}")
    return tuple(fams)


def _pushed_share(data) -> float:
    """The share of the loss's per-coordinate targets outside their bounds (``1`` when the
    loss is not separable): the coordinates the bounds will push.  The ADMM on general
    equalities needs several times the iterations when many are (measured on tables of two,
    three and four attributes with every cell measured, the one-way marginals known and
    ``x >= 0``: a share up to 0.40, 31-61 iterations; 0.46-0.48, 51-221).  Squared losses
    only: with absolute-value terms the same tables with few empty cells took longer, not
    shorter (calibration of 2026-12-06, ``benchmarks/results/cost_model.txt``)."""
    sep = data.separable_loss()
    if sep is None:
        return 1.0
    has_loss = (sep.w1 > 0) | (sep.w2 > 0)
    if not has_loss.any():
        return 0.0
    outside = (sep.y < sep.lower) | (sep.y > sep.upper)
    return float(np.mean(outside[has_loss]))


def _map_duals(ext: Extraction, duals: dict) -> dict[int, Any]:
    """Solver multipliers -> ``{constraint id: dual value}`` in cvxpy's conventions:
    equality ``y^T (lhs - rhs)``, inequality ``lam^T (lhs - rhs)`` with ``lam >= 0``."""
    out: dict[int, Any] = {}
    y = duals.get("eq")
    for con, start, stop in ext.eq_blocks:
        val = np.zeros(stop - start) if y is None else np.asarray(y[start:stop], dtype=float)
        out[con.id] = _shape_like(con, val)
    ineq_vals = [np.zeros(c.size) for c in ext.ineq_constraints]
    cids, rows, coefs = ext.bound_arrays()
    for key, src in (("lower", ext.lower_src), ("upper", ext.upper_src)):
        s = duals.get(key)
        if s is None or src is None:
            continue
        coords = np.flatnonzero(src >= 0)
        ids = src[coords]
        vals = np.asarray(s, dtype=float)[coords] / np.abs(coefs[ids])
        owner = cids[ids]
        for cid in np.unique(owner).tolist():
            mine = owner == cid
            ineq_vals[cid][rows[ids[mine]]] = vals[mine]
    order = duals.get("order")
    if order is not None and ext.data.chains is not None:
        for chain, mult in zip(ext.data.chains.chains, order):
            for pos in range(chain.size - 1):
                cid, row, coef, _ = ext.order_edges[int(chain[pos])]
                ineq_vals[cid][row] = float(mult[pos]) / coef
    for con, val in zip(ext.ineq_constraints, ineq_vals):
        out[con.id] = _shape_like(con, val)
    return out


def unstack(x: np.ndarray, ext: Extraction) -> dict[int, Any]:
    """Split the stacked vector into ``{variable id: value}`` (column-major)."""
    out = {}
    for v in ext.variables:
        off = ext.linearizer.offsets[v.id]
        val = np.asarray(x[off:off + v.size], dtype=float)
        out[v.id] = float(val[0]) if v.shape == () else val.reshape(v.shape, order="F")
    return out


def _shape_like(con, flat: np.ndarray):
    if con.shape == ():
        return float(flat[0])
    return np.asarray(flat).reshape(con.shape, order="F")
