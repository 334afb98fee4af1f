"""Estimation over the marginal polytope when the total is unknown: the total is optimised too.

Problem (``MarginalPolytope(..., total=None)``):

    minimize  L(mu)   over   mu in K = {N p : N >= 0, p in M(1)},

the cone over the marginal polytope of total one.  This is the maximum-likelihood estimate
of the marginals *and* the total, and the problem a standard solver gets from the junction
tree's local polytope without its total row.

Method.  ``v(N) = min_{p in M(1)} L(N p)`` is convex in ``N`` (a partial minimisation of a convex
function over a convex set), and by the envelope theorem ``v'(N) = <g, mu*> / N`` with ``g`` a
(sub)gradient of ``L`` at the optimum ``mu*`` of total ``N`` (for the exact L1 finish it is the
total row's multiplier ``nu[-1]`` of :mod:`cvxdp.solvers.marginal.lp`, the same number).  Starting
from McKenna et al.'s appendix-E.1 estimate (:func:`estimate_total`), a safeguarded secant
method on ``v'`` -- a Newton step with the curvature along the ray ``<p, H p>`` first, points kept
inside the bracket ``[lo, hi]`` of sign changes of ``v'``, bisection when a step leaves it or
``|v'|`` stalls -- moves ``N``; each inner solve is :func:`cvxdp.solvers.marginal.mirror_descent.solve` at
the fixed total, warm-started from the previous one (its exact polish makes ``v`` and ``v'``
exact for quadratic losses; once it has polished, the next totals are polished at once from
the same model, whose support is the right guess).  For quadratic losses, after the first
polished step the active-set polish is run once with the total row removed, from that step's
support: when its active set settles, that is the free-total optimum itself, certified, and the
secant stops (measured on Adult's 1- and 2-way marginals: 2.5 s -> 1.2 s); it does not always
settle (the primal-dual active-set rule can cycle), and the secant then goes on.

The exact program.  The whole problem over the cone is also a convex program on the junction
tree's local polytope with the total row removed (``LocalPolytopeLP(..., free_total=True)`` of
:mod:`cvxdp.solvers.marginal.lp`), solved in one go: an LP or interior-point QP for losses
with L1 terms (``v`` is then piecewise linear, and the secant's derivative only a
subgradient), the interior point for quadratic losses, followed there, when its certificate
misses the tolerance, by the free-total active-set polish from its support.

* With L1 terms it comes first, always (with ``polish`` on).
* For quadratic losses it comes first on programs of at most :data:`EXACT_FIRST_SIZE` columns
  (cells plus measured rows), where it is the faster route (Adult subsets, 940-6,800 columns:
  0.17-1.0 s against 0.41-1.1 s secant first); on larger ones the secant's first step and the
  active-set polishes above are faster when they settle (Adult, 1- and 2-way marginals,
  10,700-82,400 columns: 0.9-11 s against 3.3-43 s for the interior point first), so the
  secant runs first, its inner solves stop at their first active-set polish that does not
  certify (``on_polish_failure="stop"``), and the run then hands over to the exact program,
  once.  (A free-total polish that does not settle is no reason to: with exact inner solves
  the secant converges in a few steps.)

Why: with a free total each secant step is a whole mirror-descent solve, and on optima with most
cells empty (few records, much noise, a cyclic model) the active-set polish that makes those
solves exact cycles, leaving mirror descent to approach the face in the limit; measured on a
6-attribute cycle (30 records, sigma 30, 9 cliques) the secant stopped at 2,000 iterations with
a certified gap of 5.6e-2, the interior point certifies 3e-11 in 14 iterations.  The secant
alone remains for programs above :data:`cvxdp.solvers.marginal.lp.MAX_LP_SIZE` columns, a failed
exact solve, ``polish=False`` and dual averaging on a quadratic loss (which never polishes).

Certificate.  For any dual point ``lam`` (as in :mod:`cvxdp.solvers.marginal.loss`),
``L(mu') >= <g, mu'> + c(lam)`` for every ``mu'`` with ``g = sum_t A_t^T lam_t``; minimised over
``{N p : 0 <= N <= N_max, p in M(1)}`` the right side is

    c(lam) + min(0, m) N_max,      m = min_{p in M(1)} <g, p>   (one max-product pass),

a lower bound on the free-total optimum as soon as ``N_max`` bounds the optimal total
(:func:`total_bound`).  With ``lam`` the gradient at ``mu`` it reads
``L(mu) - <g, mu> + min(0, m) N_max``; at the optimum ``<g, mu*> = 0`` and ``m >= 0`` (the optimality
conditions over a cone), so the bound is tight up to rounding.

Bound on the total.  A term ``t`` *spans the total* when some ``v`` has ``A_t^T v = 1`` on one
factor's cells and ``0`` elsewhere (a measured whole marginal: ``v = 1``); then
``v^T r_t = N - v^T b_t`` and, at the optimum, the term is at most ``F - constant`` for any
feasible value ``F`` (the terms are nonnegative).  Cauchy-Schwarz gives
``|N* - v^T b| <= sqrt(2 (F - c) sum_i v_i^2 / w_i)`` for a squared term and Hoelder
``|N* - v^T b| <= (F - c) max_i |v_i| / w_i`` for an L1 term.  Without such a term the total is
not identified and :func:`solve` raises ``ValueError``.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from . import mirror_descent as md
from .. import result as R
from .._table import IterationTable
from .junction_tree import JunctionTree
from .loss import MarginalLoss
from .lp import LocalPolytopeLP, lp_duals
from .polish import LocalPolytopeQP
from .gap import relative, within_tolerance

__all__ = ["solve", "estimate_total", "total_bound", "spanning_terms", "free_lower_bound",
           "NOT_IDENTIFIED", "EXACT_FIRST_SIZE"]

#: the message when no loss term spans the total (the free total is then not identified)
NOT_IDENTIFIED = ("MarginalPolytope: total=None, but the total is not identified: no "
                  "measurement in the objective spans the total (a loss term whose rows sum a "
                  "whole marginal, with positive weights), so nothing bounds the optimal total; "
                  "pass total=<number of records>")

# outer (total) steps at most
_MAX_STEPS = 60
# inner solves stop at this fraction of the outer tolerances ...
_INNER_TOL = 0.25
# ... loosened by up to this factor while the total is still far off (inexact Newton: the
# first solve, then a tenth of the derivative's share of the gap)
_LOOSE = 20.0
# a secant step that does not halve |v'| over two steps is replaced by bisection
_STALL = 0.5
# dense least-norm solves for a general spanning term are skipped above this many rows
_MAX_DENSE_ROWS = 5000
#: quadratic losses: largest exact program (junction-tree cells + measured rows) solved before
#: the secant method rather than handed over to (module docstring)
EXACT_FIRST_SIZE = 8192


def spanning_terms(loss: MarginalLoss, offsets: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(t, v)`` for every term ``t`` and a ``v`` with ``A_t^T v`` the indicator of one factor's
    cells (``v = 1`` for a slice equal to a whole factor); at most one ``v`` per term."""
    out = []
    for ti, t in enumerate(loss.terms):
        if isinstance(t.A, slice):
            k = int(np.searchsorted(offsets, t.A.start, side="right")) - 1
            if 0 <= k < len(offsets) - 1 and t.A.start == offsets[k] and t.A.stop == offsets[k + 1]:
                out.append((ti, np.ones(t.b.size)))
            continue
        if t.A.shape[0] > _MAX_DENSE_ROWS:
            continue
        Ad = t.A.toarray()
        for k in range(len(offsets) - 1):
            a, b = int(offsets[k]), int(offsets[k + 1])
            if b == a or not np.any(Ad[:, a:b]):
                continue
            target = np.zeros(Ad.shape[1])
            target[a:b] = 1.0
            v, *_ = np.linalg.lstsq(Ad.T, target, rcond=None)
            if np.linalg.norm(Ad.T @ v - target) <= 1e-9 * math.sqrt(b - a):
                out.append((ti, v))
                break
    return out


def estimate_total(loss: MarginalLoss, offsets: np.ndarray) -> tuple[float, float] | None:
    """McKenna et al. appendix E.1: each loss term whose rows span the total of one clique's
    marginal gives an unbiased estimate ``v^T y`` (for the identity: the sum of the noisy
    cells); estimates are combined by inverse variance (Gaussian ``phi = w/2 r^2``:
    variance ``1/w``; Laplace ``w|r|``: variance ``2/w^2``).  Returns ``(estimate, variance)``
    or ``None`` when no term spans a total.  Only the starting point of :func:`solve`."""
    ests, variances = [], []
    for ti, v in spanning_terms(loss, offsets):
        t = loss.terms[ti]
        used = v != 0
        with np.errstate(divide="ignore"):
            var = 1.0 / t.w[used] if t.kind == "l2" else 2.0 / t.w[used] ** 2
        if not np.all(np.isfinite(var)):
            continue
        ests.append(float(v @ t.b))
        variances.append(float(np.sum(v[used] ** 2 * var)))
    if not ests:
        return None
    iv = 1.0 / np.maximum(np.asarray(variances), 1e-300)
    return float(np.dot(iv, ests) / iv.sum()), float(1.0 / iv.sum())


def total_bound(loss: MarginalLoss, spans: list[tuple[int, np.ndarray]], upper: float) -> float | None:
    """A proven upper bound on the optimal total given a feasible loss value ``upper`` (module
    docstring), or ``None`` when no spanning term has positive weights on its rows."""
    excess = max(float(upper) - loss.constant, 0.0)
    best = None
    for ti, v in spans:
        t = loss.terms[ti]
        used = v != 0
        if np.any(t.w[used] <= 0):
            continue
        if t.kind == "l2":
            radius = math.sqrt(2.0 * excess * float(np.sum(v[used] ** 2 / t.w[used])))
        else:
            radius = excess * float(np.max(np.abs(v[used]) / t.w[used], initial=0.0))
        center = float(v @ t.b)
        # rounding allowance of the sums above
        hi = center + radius + 1e-12 * (abs(center) + radius + float(np.abs(v * t.b).sum()))
        best = hi if best is None else min(best, hi)
    return None if best is None else max(best, 0.0)


def free_lower_bound(problem: md.MarginalProblem, loss: MarginalLoss, lams) -> tuple[float, float] | None:
    """``(c(lam), m)`` of the module docstring's bound ``c + min(0, m) N_max`` (``None`` when
    ``lam`` is outside the conjugates' domain); ``m`` costs one max-product pass."""
    c = loss.dual_constant(lams)
    if c is None:
        return None
    g = loss.adjoint(lams)
    m = -problem.tree.max_value([-a for a in problem.split(g)])
    return c, m


def lams_of(loss: MarginalLoss, flat: np.ndarray) -> list[np.ndarray]:
    out, k = [], 0
    for t in loss.terms:
        out.append(flat[k:k + t.b.size])
        k += t.b.size
    return out


def _ray_curvature(loss: MarginalLoss, p: np.ndarray) -> float:
    """``<p, H p>`` of the squared terms: the second derivative of ``L(N p)`` in ``N``, an upper
    bound on ``v''`` (for a first Newton step)."""
    c = 0.0
    for t in loss.terms:
        if t.kind == "l2":
            ap = p[t.A] if isinstance(t.A, slice) else t.A @ p
            c += float(np.dot(t.w, ap * ap))
    return c


def _free_polish(tree: JunctionTree, loss: MarginalLoss, N: float, tables: list[np.ndarray],
                 keep, add, log: list[dict], *, deadline: float) -> None:
    """Quadratic losses: the active-set polish of :mod:`cvxdp.solvers.marginal.polish` with the
    total row removed, from the support of the model polished at total ``N``.  Near the optimal
    total that support is the optimal one up to a few cells, so one polish usually lands on the
    free-total optimum at once (the secant then has nothing left to do); its point is a
    candidate and its gradient a dual point, both certified by the caller."""
    t0 = time.perf_counter()
    entry = dict(iter=0, seconds=0.0, kind="qp_free_total", total=N)
    log.append(entry)
    x0 = np.concatenate([np.asarray(t, dtype=float).ravel() for t in tables]) / N
    pol = LocalPolytopeQP(tree, loss, N, free_total=True).polish(x0, deadline=deadline)
    entry["seconds"] = time.perf_counter() - t0
    if pol is None:
        return
    f, _, lams = loss.value_grad(pol.mu)
    add(lams)
    keep(f, pol.mu, float(pol.x[tree.preorder[0]].sum()), None, pol.x, "qp")
    entry.update(rounds=pol.rounds, support=pol.support, residual=pol.residual)


def solve(tree: JunctionTree, loss: MarginalLoss, settings: md.MirrorSettings | None = None, *,
          theta0: np.ndarray | None = None, step0: float | None = None,
          total0: float | None = None) -> R.SolverResult:
    """Minimise ``loss`` over the cone of the marginal polytope (module docstring).

    ``total0`` is the starting total (default: the appendix-E.1 estimate).  The result's
    ``info`` has ``total`` (the total of ``x``), ``total_start``, ``total_bound`` (the proven
    ``N_max`` of the certificate), ``total_steps`` (inner solves) and ``route`` (``"lp"``: the
    free-total L1 / mixed program, ``"ipm"``: the free-total quadratic program by the interior
    point, ``"qp"``: the free-total active-set polish of a quadratic loss, ``"secant"``: the 1-D
    method, ``"zero"``: ``mu = 0``), besides
    mirror descent's ``theta`` / ``clique_tables`` for the graphical model.  Raises
    ``ValueError`` (:data:`NOT_IDENTIFIED`) when no loss term bounds the total."""
    run = _FreeTotalRun(tree, loss, settings or md.MirrorSettings(), theta0, step0)
    # the best point so far is mu = 0 (feasible): it may already be certified
    status = R.OPTIMAL if run.converged(run.best["f"], run.lower()) else None
    N = run.start_total(total0)
    # the exact free-total program first (module docstring); else it may be handed over to
    if status is None and run.exact_first() and N > 0:
        status, N = run.exact_free_total(N)
    if status is None:
        status = run.secant(N)
    return run.result(status)


class _FreeTotalRun:
    """One run of :func:`solve`: the certificate (the ``(c, m)`` of every dual point seen, the
    proven bound ``n_max`` on the optimal total), the best point, the bracket and iterates of
    the secant method on ``v'(N)``, the verbose table; the steps of the method as methods."""

    total_start: float                 # set by start_total()
    # set by secant(): the bracket of sign changes of v', the (N, v'(N)) of the previous
    # steps, the polish_start of the next inner solve, the loosening of its tolerance, and
    # whether the free-total polish was tried
    lo: float
    hi: float
    pts: list[tuple[float, float]]
    polish_start: int
    loose: float
    free_polished: bool

    def __init__(self, tree: JunctionTree, loss: MarginalLoss, settings: md.MirrorSettings,
                 theta0: np.ndarray | None, step0: float | None) -> None:
        s = self.settings = settings
        self.t_start = time.perf_counter()
        self.tree, self.loss = tree, loss
        self.unit = md.MarginalProblem(tree, loss, 1.0)          # for split / max-product (total one)
        self.spans = spanning_terms(loss, self.unit.offsets)
        zero = np.zeros(loss.n)
        f_zero, _, lams_zero = loss.value_grad(zero)
        self.f_up = f_zero                                       # mu = 0 is feasible
        n_max = total_bound(loss, self.spans, self.f_up)
        if n_max is None:
            raise ValueError(NOT_IDENTIFIED)
        self.n_max: float = n_max
        self.est = estimate_total(loss, self.unit.offsets)
        self.table = IterationTable([("step", "d"), ("total", ".8e"), ("loss", ".6e"),
                                     ("lower bd", ".6e"), ("rel gap", ".2e"), ("dv/dN", ".2e"),
                                     ("iters", "d"), ("time", ".2f")], s.verbose)
        self.table.header(f"cvxdp: the total is free (total=None); appendix-E.1 start "
                          f"{'none' if self.est is None else format(self.est[0], '.6g')}, "
                          f"proven bound {n_max:.6g}")
        self.cands: list[tuple[float, float]] = []          # (c, m) of every dual point seen
        self.history: list[dict] = []
        self.polish_log: list[dict] = []
        self.add(lams_zero)
        # best point: (loss, mu, total, theta of the model, clique tables)
        self.best = dict(f=f_zero, mu=zero, total=0.0, theta=None, tables=None)
        self.route, self.steps, self.iters = "zero", 0, 0
        self.duals: dict[str, np.ndarray] = {}            # of the exact free-total program
        self.lp_tried = False
        self.theta, self.step = theta0, step0              # the warm start of the next inner solve
        self.last: R.SolverResult | None = None            # the last inner solve

    # ---------------------------------------------------------------- the certificate
    def lower(self) -> float:
        """The best certified lower bound ``max c + min(0, m) N_max`` over the dual points."""
        return max((c + min(0.0, m) * self.n_max for c, m in self.cands), default=-math.inf)

    def add(self, lams) -> None:
        """Add the dual point ``lams`` to the certificate (when in the conjugates' domain)."""
        cm = free_lower_bound(self.unit, self.loss, lams)
        if cm is not None:
            self.cands.append(cm)

    def converged(self, f: float, lb: float) -> bool:
        """The stopping test on the certified gap ``f - lb``."""
        s = self.settings
        return within_tolerance(f, f - lb, s.eps_abs, s.eps_rel)

    def out_of_time(self) -> bool:
        """``time_limit`` seconds spent."""
        return time.perf_counter() - self.t_start >= self.settings.time_limit

    def keep(self, f: float, mu: np.ndarray, total: float, theta: np.ndarray | None,
             tables: list[np.ndarray] | None, how: str) -> None:
        """A feasible point: kept if its loss is the best so far (``how`` the route to it);
        its loss tightens the proven bound on the optimal total."""
        if f < self.best["f"]:
            self.best.update(f=f, mu=mu, total=total, theta=theta, tables=tables)
            self.route = how
        self.f_up = min(self.f_up, f)
        self.n_max = min(self.n_max, total_bound(self.loss, self.spans, self.f_up))

    def log_row(self, step: int, total: float, f: float, lb: float, iters: int, route: str,
                d: float | None = None) -> None:
        """A row of the verbose table and the history (``d``: ``v'(N)`` of a secant step)."""
        f_best = self.best["f"]
        row = dict(step=step, total=total, loss=f, **{"lower bd": lb,
                   "rel gap": relative(f_best - lb, f_best)})
        if d is not None:
            row["dv/dN"] = d
        row.update(iters=iters, time=time.perf_counter() - self.t_start, route=route)
        self.history.append(row)
        self.table.row(row)

    # ---------------------------------------------------------------- the start
    def start_total(self, total0: float | None) -> float:
        """The first total: ``total0`` if positive, else the appendix-E.1 estimate if
        positive, else half the proven bound; never above the bound."""
        est = self.est
        start = est[0] if est is not None and est[0] > 0 else 0.5 * self.n_max
        if total0 is not None and total0 > 0:
            start = float(total0)
        self.total_start = min(start, self.n_max) if self.n_max > 0 else 0.0
        return self.total_start

    def exact_allowed(self) -> bool:
        """Whether the exact free-total program may run at all: with the polish on, for every
        algorithm with L1 terms, and but for dual averaging (which never polishes a quadratic
        loss) for quadratic losses."""
        s = self.settings
        return s.polish and (not self.loss.smooth or s.algorithm != "dual_averaging")

    def exact_first(self) -> bool:
        """Whether the exact program runs before the secant method: with L1 terms, or a
        quadratic loss whose program has at most :data:`EXACT_FIRST_SIZE` columns."""
        loss = self.loss
        size = sum(self.tree.cells) + sum(int(np.count_nonzero(t.w)) for t in loss.terms)
        return self.exact_allowed() and (not loss.smooth or size <= EXACT_FIRST_SIZE)

    def handover_pending(self) -> bool:
        """Whether the secant method may still hand over to the exact program (quadratic
        losses: it has not run yet)."""
        return self.loss.smooth and not self.lp_tried and self.exact_allowed()

    def exact_free_total(self, N: float) -> tuple[str | None, float]:
        """The exact program with the total row removed (``LocalPolytopeLP(...,
        free_total=True)``), in one solve, then (quadratic losses, certificate not closed) the
        free-total active-set polish from its support.  Returns the status to stop with (or
        ``None``) and the total the secant method starts from (the fitted one)."""
        loss, s = self.loss, self.settings
        self.lp_tried = True
        how = "ipm" if loss.smooth else "lp"
        t0 = time.perf_counter()
        entry = dict(iter=0, seconds=0.0, kind=f"{how}_free_total")
        self.polish_log.append(entry)
        try:
            lp = LocalPolytopeLP(self.tree, loss, N, free_total=True)
        except ValueError as exc:
            lp, entry["skipped"] = None, str(exc)
        pol = lp.solve(deadline=self.t_start + s.time_limit) if lp is not None else None
        entry["seconds"] = time.perf_counter() - t0
        if pol is not None:
            self.add(pol.lams)
            if pol.alt_lams is not None:
                self.add(pol.alt_lams)
            fitted = float(pol.x[self.tree.preorder[0]].sum())
            self.keep(loss.value(pol.mu), pol.mu, fitted, None, pol.x, how)
            entry.update(method=pol.method, iterations=pol.iterations, residual=pol.residual)
            self.duals = lp_duals(pol)
            if fitted > 0:
                N = min(fitted, self.n_max)
                if loss.smooth and not self.converged(self.best["f"], self.lower()):
                    _free_polish(self.tree, loss, fitted, pol.x, self.keep, self.add,
                                 self.polish_log, deadline=self.t_start + s.time_limit)
        lb = self.lower()
        self.log_row(self.steps, self.best["total"], self.best["f"], lb, self.iters, self.route)
        return (R.OPTIMAL if self.converged(self.best["f"], lb) else None), N

    # ---------------------------------------------------------------- the secant method
    def secant(self, N: float) -> str:
        """The secant loop on ``v'(N)``, mirror descent (with its exact polish) inside; returns
        the status."""
        self.lo, self.hi = 0.0, self.n_max
        self.pts = []
        self.polish_start = self.settings.polish_start
        self.loose = _LOOSE
        self.free_polished = False
        while True:
            if N <= 0 or self.hi <= 0:
                return R.OPTIMAL if self.converged(self.best["f"], self.lower()) else R.OPTIMAL_INACCURATE
            res = self.inner_solve(N)
            # the inner active-set polish failed (the inner solve stopped there, if pending)
            failed = bool(res.info.get("polish")) and res.info.get("clique_tables") is None
            if res.info.get("clique_tables") is not None:
                self.polish_start = 0     # the next total polishes at once, from this model's support
                if self.loss.smooth and not self.free_polished and self.free_polish(res, N):
                    return R.OPTIMAL
            f, d, lb = self.secant_point(res, N)
            status = self.stop_after(res, lb)
            if status in (None, R.OPTIMAL_INACCURATE) and failed and self.handover_pending() \
                    and not self.out_of_time():
                status = self.exact_free_total(N)[0] or status
            if status is not None:
                return status
            self.narrow(N, f, d)
            if self.hi - self.lo <= 1e-13 * max(self.hi, 1e-300):
                return R.OPTIMAL_INACCURATE                 # N pinned down to rounding
            nxt = self.next_total(N, d, res.x)
            self.pts.append((N, d))
            N = nxt

    def inner_solve(self, N: float) -> R.SolverResult:
        """Mirror descent at the fixed total ``N``, warm-started from the previous solve, to
        a tolerance loosened by ``loose`` while the total is still far off; stopped at its
        first active-set polish that fails while the exact program may still be handed over
        to, never handing over to the fixed-total one (one exact program, not one per total)."""
        s = self.settings
        inner = dataclasses.replace(
            s, eps_abs=_INNER_TOL * self.loose * s.eps_abs, eps_rel=_INNER_TOL * self.loose * s.eps_rel,
            max_iters=max(s.max_iters - self.iters, 0),
            time_limit=max(s.time_limit - (time.perf_counter() - self.t_start), 0.0),
            polish=s.polish and not (self.lp_tried and not self.loss.smooth),
            polish_start=self.polish_start,
            on_polish_failure="stop" if self.handover_pending() else "retry")
        res = md.solve(md.MarginalProblem(self.tree, self.loss, N), inner, theta0=self.theta,
                       step0=self.step)
        self.last = res
        self.steps += 1
        self.iters += res.iterations
        self.polish_log.extend(dict(e, total=N) for e in res.info.get("polish", []))
        self.theta, self.step = res.state.get("theta"), res.state.get("step")
        return res

    def free_polish(self, res: R.SolverResult, N: float) -> bool:
        """Quadratic losses, once, after the first polished inner solve: :func:`_free_polish`
        from its support.  True when the certificate then closes (the run is optimal)."""
        self.free_polished = True
        _free_polish(self.tree, self.loss, N, res.info["clique_tables"], self.keep, self.add,
                     self.polish_log, deadline=self.t_start + self.settings.time_limit)
        lb = self.lower()
        if not self.converged(self.best["f"], lb):
            return False
        self.log_row(self.steps, self.best["total"], self.best["f"], lb, self.iters, "qp")
        return True

    def secant_point(self, res: R.SolverResult, N: float) -> tuple[float, float, float]:
        """The inner solution's dual points added to the certificate, the point kept if best,
        its row logged; returns its loss, ``v'(N)`` (the envelope theorem) and the lower
        bound."""
        loss = self.loss
        mu = res.x
        f, g, lams = loss.value_grad(mu, res.info.get("tau", 0.0) if not loss.smooth else 0.0)
        self.add(lams)
        if res.duals.get("loss") is not None and res.duals["loss"].size:
            lp_lams = lams_of(loss, res.duals["loss"])
            self.add(lp_lams)
            g = loss.adjoint(lp_lams)
        f = loss.value(mu)
        d = float(np.dot(g, mu)) / N                     # v'(N), the envelope theorem
        self.keep(f, mu, N, res.info.get("theta"), res.info.get("clique_tables"), "secant")
        self.hi = min(self.hi, self.n_max)
        lb = self.lower()
        self.log_row(self.steps, N, f, lb, self.iters, "secant", d)
        return f, d, lb

    def stop_after(self, res: R.SolverResult, lb: float) -> str | None:
        """The status to stop with after a secant step (certified, stopped by the user's
        callback, out of steps, iterations or time), or ``None``."""
        if self.converged(self.best["f"], lb):
            return R.OPTIMAL
        if res.status == R.USER_LIMIT:
            return R.USER_LIMIT
        if self.steps >= _MAX_STEPS or self.iters >= self.settings.max_iters or self.out_of_time():
            return R.OPTIMAL_INACCURATE
        return None

    def narrow(self, N: float, f: float, d: float) -> None:
        """Shrink the bracket ``[lo, hi]`` by the sign of ``v'(N) = d``; set the next inner
        tolerance from the derivative's share of the gap."""
        if d > 0:
            self.hi = min(self.hi, N)
        else:
            self.lo = max(self.lo, N)
        # the derivative's share of the certified gap, relative: the next inner solve need
        # not be much more accurate than that
        share = (N * d if d > 0 else (self.n_max - N) * -d) / max(abs(f), 1.0)
        tight = _INNER_TOL * max(self.settings.eps_rel, 1e-300)
        self.loose = min(max(0.1 * share / tight, 1.0), _LOOSE)

    def next_total(self, N: float, d: float, mu: np.ndarray) -> float:
        """The next total: secant, Newton with the ray curvature at first, bisection as guard
        (a step out of the bracket, or ``|v'|`` not halved over two steps)."""
        lo, hi, pts = self.lo, self.hi, self.pts
        nxt = math.nan
        if pts and pts[-1][1] != d:
            n1, d1 = pts[-1]
            nxt = N - d * (N - n1) / (d - d1)
        elif self.loss.smooth:
            curv = _ray_curvature(self.loss, mu / N)
            if curv > 0:
                nxt = N - d / curv
        else:
            nxt = N * (2.0 if d < 0 else 0.5)
        stalled = len(pts) >= 2 and abs(d) > _STALL * abs(pts[-2][1])
        if not (lo < nxt < hi) or stalled or not math.isfinite(nxt):
            nxt = 0.5 * (lo + hi)
        return nxt

    # ---------------------------------------------------------------- the result
    def result(self, status: str) -> R.SolverResult:
        """The final footer and the :class:`SolverResult` of the best point."""
        s, best, last = self.settings, self.best, self.last
        lb = self.lower()
        f_best = best["f"]
        self.table.footer(f"status {status}: loss {f_best:.8e}, certified lower bound {lb:.8e}, "
                          f"total {best['total']:.8g} (proven bound {self.n_max:.6g}), "
                          f"{self.steps} total steps, {self.iters} iterations, "
                          f"{time.perf_counter() - self.t_start:.2f} s")
        info = dict(algorithm=s.algorithm, theta=best["theta"], clique_tables=best["tables"],
                    total=best["total"], total_start=self.total_start, total_bound=self.n_max,
                    total_steps=self.steps, route=self.route, abs_gap=f_best - lb,
                    polish=self.polish_log,
                    lipschitz=last.info["lipschitz"] if last is not None else math.nan,
                    tau=last.info.get("tau", 0.0) if last is not None else 0.0)
        return R.SolverResult(
            x=best["mu"], status=status, objective=f_best, lower_bound=lb,
            gap=(f_best - lb) / max(abs(f_best), 1.0), iterations=self.iters,
            duals=self.duals if self.route in ("lp", "ipm") else {},
            setup_time=0.0, solve_time=time.perf_counter() - self.t_start, history=self.history,
            primal_residual=0.0, info=info,
            state=dict(theta=self.theta, step=self.step))
