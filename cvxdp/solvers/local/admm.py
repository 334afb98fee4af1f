"""ADMM on the local polytope of any clique set, stopped by a certified duality gap.

Problem (module :mod:`cvxdp.solvers.local.region_graph` for the set ``L(N)``):

    minimize  L(t) = sum_i f_i(t_i) + sum_t phi_t(Q_t t - y_t)    subject to  t in L(N),

with ``f_i`` the one-cell rows (:mod:`cvxdp.solvers.local.loss`), ``phi_t`` the coupled rows,
``N`` given or free (``t`` in the cone ``union_N L(N)``).  Splitting (Boyd et al. 2011, section
5; the consistency set is handled exactly, like the tree projection of Lee, Wang & Kifer 2015):

    x in V_N (consistent tables, total N),   nu >= 0 = x,   r_t = Q_t x,

    x   <- argmin_{x in V_N} ||x - (nu - u)||^2 + ||Q x - (r - v)||^2   (projection; CG if Q)
    nu  <- prox_{(f + I_{>=0}) / rho}(x^ + u),   r <- prox_{phi / rho}(Q x^ + v)
    u   <- u + x^ - nu,   v <- v + Q x^ - r,     x^ = alpha x + (1 - alpha) (previous nu / r),

over-relaxed (``alpha``), with residual-balancing updates of ``rho`` (OSQP's rule).

Certificate.  *Primal*: the ``x`` iterate is consistent with total ``N`` to rounding; its few
negative cells are removed by mixing it with the uniform tables, ``(1 - s) x + s U`` with the
least ``s`` that makes it non-negative: a point of ``L(N)``.  *Dual*: for ``z_t`` in the domain
of ``phi_t^*`` and ``lam`` orthogonal to the consistent directions ``V_0`` (to ``V`` for a free
total), every ``t in L(N)`` has ``<lam, t> = <lam, U>`` and, with ``g = Q^T z + lam``,

    L(t) >= -sum_t (z_t^T y_t + phi_t^*(z_t)) - <lam, U>
            + sum_k [ min_{x in [0, N]^{C_k}} sum_{i in C_k} f_i(x_i) + (g_i - tau_k) x_i ] + N sum_k tau_k

for every ``tau`` (each clique's total is ``N``; Lagrange on it).  The inner minima are one-cell
closed forms, ``tau_k`` is found by bisection on the clique total (the bound is concave in
``tau_k``), and ``lam, z`` come from the scaled duals (``rho u`` is a subgradient of
``f + I_{>=0}`` at ``nu``, ``rho v`` of ``phi`` at ``r``): ``z = rho v`` (clipped into ``|z| <= w``
for absolute rows; the gradient at the point for squared rows) and
``lam = proj_{V_0^perp}(-rho u - Q^T z)``.  At a solution the bound is the
optimum (strong duality of the convex program), so the gap closes as the iterates converge.
For a free total the ``N`` term is ``min_{0 <= N <= N_max} N sum_k tau_k`` with ``N_max`` a proven
bound on the optimal total (or ``+inf``; the bisection then targets the current total and
``tau`` is shifted so that ``sum_k tau_k >= 0``).

Multipliers.  The loss gradient ``G`` (its subgradient, for absolute rows, chosen from the
ADMM duals) at the returned point, together with the same ``lam``, gives the *linearised*
bound ``-L^*(G) + min_{t in L(N)} <G, t>`` (``min`` over each clique's cells, as above); when it
certifies, ``-G`` is returned: the multipliers of ``marginal = table`` (cvxpy's sign).
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import result as R
from .._table import IterationTable
from . import newton as newton_steps
from . import proximal as proximal_steps
from . import reduce
from .polish import polish
from ..residual.repair import RepairSchedule
from .repair import MarginFitter, SetRepair, mix
from .tau import TAU_STEPS as _TAU_STEPS, per_cell as _per_cell, tau_bisect as _tau, \
    tau_root as _tau_root
from ..marginal.loss import MarginalLoss
from .exact import EXACT_MAX, active_set_finish, consistency_data, exact_multipliers
from .problem import LocalProblem, LocalSettings

__all__ = ["LocalSettings", "LocalProblem", "solve", "lower_bound"]

# free total: steps to bracket the common clique total, then secant steps on it
_BRACKET_STEPS = 12
_SECANT_STEPS = 20
# the face polish is tried only once the certified gap is below this (it costs up to
# 2 x _CG_STEPS projections and only pays near the end)
_POLISH_GAP = 1e-3
# relative rounding of a projected multiplier, allowed for in the bound
_ROUND = 1e-14
# adaptive rho is on by default (absolute losses only) up to this many cells
_ADAPTIVE_MAX_CELLS = 10000
# default rho: this multiple of the loss curvature
_RHO_CURVATURE = 10.0
# adaptive rho: update when the scaled residuals differ by more than this factor
_RHO_TOLERANCE = 5.0
_RHO_RANGE = (1e-6, 1e6)
_RHO_UPDATES = 20
# the certificate (one bisection pass) runs every this many convergence checks
_CERTIFY_EVERY = 5
# the key under which a result carries the bound multiplier's duals to :func:`solve`
_BOUND_DUALS = "marginals from the bound"
_UNIT = np.finfo(float).eps / 2
# iterations the multipliers may take beyond the certified gap, at least (measured on
# coupled rows: 20-190 more, about as many again as the gap took; 2x missed 7 of 12 tests)
_PURSUIT_ITERS = 300
# conjugate-gradient steps and relative tolerance of the x-update with coupled rows
_CG_STEPS = 50
_CG_TOL = 1e-14
# iterations that have not certified by this count try the exact solution on their point's
# active set (:meth:`_Run.active_set_finish`), and again at twice the count, and so on (one
# factorisation each).  Of the stress set's 1,196 certified solves at seeds 17 and 19, 39 took
# 500 iterations or more (at most 3,440, with coupled rows), 25 with this finish; those that
# stall at extreme scales ran to 10,000 (1.3-7.7 s on 4-56 cells)
_FINISH_AFTER = 250

_COLUMNS = [("iter", "d"), ("objective", ".6e"), ("lower bnd", ".6e"), ("rel gap", ".2e"),
            ("pri res", ".2e"), ("dua res", ".2e"), ("rho", ".2e"), ("time [s]", ".2f")]


def solve(problem: LocalProblem, settings: LocalSettings | None = None, *,
          state: dict | None = None) -> R.SolverResult:
    """Run the ADMM of the module docstring; ``state`` (from a previous result) warm-starts.
    Unmeasured cliques that :mod:`cvxdp.solvers.local.reduce` can eliminate are removed first
    and filled in after (``info["eliminated"]`` counts them, 0 when none)."""
    s = settings or LocalSettings()
    t0 = time.perf_counter()
    reduction = reduce.reduce(problem)
    if reduction is not None:
        note = (f"{len(reduction.filled)} unmeasured cliques eliminated (filled in after), "
                f"{len(problem.graph.cliques)} in the model")
        res = reduction.result(_solve(reduction.problem, s, state, t0, note))
    else:
        res = _solve(problem, s, state, t0)
        res.info["eliminated"] = 0
    # optimal without certified multipliers: a small problem's exact ones (:mod:`.exact`),
    # else those of the best bound's multiplier (:meth:`_Run._bound_multipliers`)
    res = exact_multipliers(problem, s, res, t0)
    fallback = res.duals.pop(_BOUND_DUALS, None)
    if fallback is not None and not res.info.get("duals_certified"):
        res.duals = {"marginals": fallback}
        res.info["duals_certified"] = True
        res.info["duals_source"] = "the best bound's multiplier"
    return res


def _solve(problem: LocalProblem, s: LocalSettings, state: dict | None, t0: float,
           note: str = "") -> R.SolverResult:
    run = _Run(problem, s, state, note)
    setup = time.perf_counter() - t0
    res = run.iterate(t0)
    res.setup_time = setup
    res.solve_time = time.perf_counter() - t0 - setup
    return res


class _Run:
    def __init__(self, p: LocalProblem, s: LocalSettings, state: dict | None,
                 note: str = "") -> None:
        """``note``: a line for the table's header."""
        self.p, self.s, self.note = p, s, note
        G = p.graph
        n, m = G.n, (p.Q.shape[0] if p.Q is not None else 0)
        self.table = IterationTable(_COLUMNS, s.verbose)
        est = p.total if p.total is not None else _total_guess(p)
        if state and state.get("n") == n and state.get("m") == m:
            self.nu, self.u = state["nu"].copy(), state["u"].copy()
            self.r, self.v = state["r"].copy(), state["v"].copy()
            self.rho = float(state["rho"]) if s.rho is None else s.rho
            self.warm = True
            self.newton_warm = state.get("newton")     # the dual Newton's end, if it certified
        else:
            self.nu = G.uniform(est)
            self.u = np.zeros(n)
            self.r = p.Q @ self.nu if m else np.zeros(0)
            self.v = np.zeros(m)
            self.rho = s.rho if s.rho is not None else _default_rho(p, est)
            self.warm = False
            self.newton_warm = None
        self.x = G.project(self.nu, p.total)
        # residual balancing pulls rho far below the curvature on large tables (measured on
        # Adult's pairs: 35x below and 5-7x slower with squared losses; with absolute losses
        # 1.3e-3 left after 10,000 iterations against 1e-4 in 2,100 with the fixed rho), so it
        # is opt-in; it still helps small problems with absolute rows, alone or beside squared
        # ones (with weights 1e3 the squared rows set rho 1e4 times what the absolute ones
        # need: 3 of 100 such stress instances were 0.2-100% off after 10,000 iterations)
        small = p.graph.n <= _ADAPTIVE_MAX_CELLS
        curved = bool(np.any(p.cells.A > 0)) or any(t.kind == "l2" for t in p.coupled.terms)
        absolute = bool(np.any(p.cells.w > 0)) or any(t.kind == "l1" for t in p.coupled.terms)
        self.adaptive = (small and (absolute or not curved)) if s.adaptive_rho is None \
            else bool(s.adaptive_rho)
        self.rho_updates, self.curved = 0, curved
        self.history: list[dict] = []
        self.best: tuple[float, np.ndarray] | None = None
        self.lower = -math.inf
        self.lam_best = self.lam_last = self.last_point = None
        self.z_last: list | None = None      # the coupled rows' duals at the last certificate
        self.y: np.ndarray | None = None     # the multipliers, once :meth:`pursue_duals` has them
        self.total_max = p.total
        self.polish_mu = None
        self.last_gap = math.inf
        self.fitter = MarginFitter(G)
        self.sets: SetRepair | None = None   # built at its first use
        self.it = 0
        self.schedule = RepairSchedule(time.perf_counter(), s.time_limit)
        self.polish_info = {"attempts": 0, "cg_steps": 0}
        self.route = ""                  # what ran: "dual Newton", "ADMM", ... (info["route"])
        self.newton_info: dict | None = None
        self.newton_face: np.ndarray | None = None
        self.newton_lam: np.ndarray | None = None
        self.newton_end: dict | None = None
        self.t0 = time.perf_counter()
        self.finish_at = _FINISH_AFTER
        self.exact_data = None           # p as the exact finish reads it, built at its first try

    # ------------------------------------------------------------------ iteration
    def x_update(self) -> None:
        p, G = self.p, self.p.graph
        a = self.nu - self.u
        if p.Q is None:
            self.x = G.project(a, p.total)
            return
        c = self.r - self.v
        x = G.project(self.x, p.total)            # feasible start: the previous x
        zero = 0.0 if p.total is not None else None

        def P0(z):
            return G.project(z, 0.0) if zero is not None else G.project(z, None)
        g = P0((x - a) + p.QT @ (p.Q @ x - c))
        d = -g
        gg = float(g @ g)
        tol = (_CG_TOL * max(1.0, float(np.linalg.norm(a)) + float(np.linalg.norm(c)))) ** 2
        for _ in range(_CG_STEPS):
            if gg <= tol:
                break
            Hd = P0(d + p.QT @ (p.Q @ d))
            step = gg / float(d @ Hd)
            x = x + step * d
            g = g + step * Hd
            gg_new = float(g @ g)
            d = -g + (gg_new / gg) * d
            gg = gg_new
        self.x = x

    def step(self) -> None:
        p, s = self.p, self.s
        self.x_update()
        xh = s.alpha * self.x + (1 - s.alpha) * self.nu
        self.nu_prev = self.nu
        self.nu = p.cells.prox(xh + self.u, self.rho)
        self.u += xh - self.nu
        if p.Q is not None:
            qx = p.Q @ self.x
            qh = s.alpha * qx + (1 - s.alpha) * self.r
            self.r_prev = self.r
            self.r = _prox_rows(p.coupled, qh + self.v, self.rho)
            self.v += qh - self.r

    def residuals(self) -> tuple[float, float, float, float]:
        """Primal and dual residuals and their scales (OSQP's)."""
        p = self.p
        rp = [self.x - self.nu]
        rd = [self.nu - self.nu_prev]
        if p.Q is not None:
            qx = p.Q @ self.x
            rp.append(qx - self.r)
            rd.append(p.QT @ (self.r - self.r_prev))
        r_p = max(float(np.max(np.abs(v), initial=0.0)) for v in rp)
        r_d = self.rho * max(float(np.max(np.abs(v), initial=0.0)) for v in rd)
        scale_p = max(float(np.max(np.abs(self.x))), float(np.max(np.abs(self.nu))), 1e-300)
        du = self.u if p.Q is None else self.u + p.QT @ self.v
        scale_d = max(self.rho * float(np.max(np.abs(du))), 1e-300)
        return r_p, r_d, scale_p, scale_d

    def adapt(self, r_p, r_d, scale_p, scale_d) -> None:
        # beside squared rows at most _RHO_UPDATES changes: residual balancing can cycle there
        # (measured: rho swinging between 5e-3 and 1e6 every 2,000 iterations on a 6-cell
        # elastic-net table)
        if self.curved and self.rho_updates >= _RHO_UPDATES:
            return
        ratio = math.sqrt((r_p / scale_p) / max(r_d / scale_d, 1e-300)) if r_p > 0 else 0.0
        if ratio > _RHO_TOLERANCE or 0 < ratio < 1 / _RHO_TOLERANCE:
            self.rho_updates += 1
            new = float(np.clip(self.rho * ratio, *_RHO_RANGE))
            self.u *= self.rho / new
            self.v *= self.rho / new
            self.rho = new

    def iterate(self, t0: float) -> R.SolverResult:
        p, s = self.p, self.s
        self.t0 = t0
        self.table.header(f"cvxdp ADMM on the local polytope: {len(p.graph.cliques)} cliques, "
                          f"{p.graph.n} cells, {len(p.graph.regions)} regions"
                          + (f"; {self.note}" if self.note else ""))
        # a warm start from the ADMM's own state goes on with the ADMM; from the Newton's,
        # with the Newton
        if s.dual_newton and (not self.warm or self.newton_warm is not None) and \
                (newton_steps.eligible(p) or proximal_steps.eligible(p)):
            proximal = not newton_steps.eligible(p)
            self.route = "proximal dual Newton" if proximal else "dual Newton"
            status, done = self.newton(t0, proximal=proximal)
            if status is None and self.active_set_finish():
                status = R.OPTIMAL         # its point's active set certified: no ADMM needed
            if status is not None:
                return self.result(status, done)
        self.route = self.route + " -> ADMM" if self.route else "ADMM"
        status, it, checks = None, 0, 0
        self.schedule.t0 = t0
        for it in range(1, s.max_iters + 1):
            self.step()
            if it % s.check_every and it < s.max_iters:
                continue
            checks += 1
            self.it = it
            r_p, r_d, sc_p, sc_d = self.residuals()
            elapsed = time.perf_counter() - t0
            if checks % _CERTIFY_EVERY == 0 or it == s.max_iters:
                self.certify()
            gap = self.gap()
            row = {"iter": it, "objective": self.best[0] if self.best else math.nan,
                   "lower bnd": self.lower, "rel gap": gap, "pri res": r_p, "dua res": r_d,
                   "rho": self.rho, "time [s]": elapsed}
            status = R.record_check(row, self.history, self.table, s)
            if status is not None:
                break
            if it >= self.finish_at:
                self.finish_at *= 2
                if self.active_set_finish():
                    status = R.OPTIMAL
                    break
            if self.adaptive:
                self.adapt(r_p, r_d, sc_p, sc_d)
        if status is None:
            status = R.OPTIMAL_INACCURATE
        if status == R.OPTIMAL_INACCURATE and self.best is not None:
            self.repair_by_sets(final=True)      # the last iterate, repaired, may still certify
            if self.gap() <= s.eps_rel or self.active_set_finish():
                status = R.OPTIMAL
        if status == R.OPTIMAL and s.duals:
            it = self.pursue_duals(t0, it)
        return self.result(status, it)

    def pursue_duals(self, t0: float, it: int) -> int:
        """The gap has certified; iterations go on, up to as many again or
        :data:`_PURSUIT_ITERS` (within ``max_iters`` and the time limit; ``duals=False``
        skips this), until the multipliers certify too (:meth:`multipliers`): the linearised
        bound needs the point's gradient, so it needs the point to about the square root of
        the gap's accuracy (measured on the stress set's coupled rows: 40 of 50 solves
        certified the gap, not the multipliers).  The iterations done are returned."""
        s = self.s
        if self.y is None:
            self.y = self.multipliers(R.OPTIMAL)
        limit = min(s.max_iters, it + max(it, _PURSUIT_ITERS))
        while self.y is None and it < limit and time.perf_counter() - t0 < s.time_limit:
            for _ in range(s.check_every):
                self.step()
            it += s.check_every
            self.certify()
            # the gradient at the latest point: the loss is flat to rounding near the
            # optimum, so the best point stops changing long before its gradient is exact
            for at in (self.last_point, None):
                if self.y is None:
                    self.y = self._multipliers_from(self.best[1], self.lam_last, at=at)
        return it

    def active_set_finish(self, point: np.ndarray | None = None) -> bool:
        """Iterations that do not certify (the bound's rounding at extreme scales): the
        exact solution on the active set of ``point`` (default: the best point;
        :func:`cvxdp.solvers.local.exact.active_set_finish`).  When it certifies, it becomes
        the point, its bound the lower bound, its multipliers the duals; ``True`` then."""
        if point is None and self.best is None:
            return False
        if self.exact_data is None and self.p.graph.n <= EXACT_MAX:
            self.exact_data = consistency_data(self.p)
        out = active_set_finish(self.p, self.s, self.best[1] if point is None else point,
                                self.exact_data)
        if out is None or self.best is not None and \
                out.objective > self.best[0] + self.s.eps_rel * max(1.0, abs(self.best[0])):
            return False
        self.best = (out.objective, out.x)
        self.lower = max(self.lower, out.lower_bound)
        self.y = out.duals["marginals"]
        self.route += ", then the active set of its point"
        return True

    def newton(self, t0: float, *, proximal: bool = False) -> tuple[str | None, int]:
        """The dual Newton of :mod:`cvxdp.solvers.local.newton` (``proximal``: its proximal
        point form for absolute rows, :mod:`cvxdp.solvers.local.proximal`): its best point and
        bound become the ADMM's; ``(status, steps)`` with the status to stop with, or ``None``
        (it did not certify ``eps_rel``: the ADMM goes on from the start)."""
        s = self.s

        def stop(row):
            return R.check_stop(row, eps_rel=s.eps_rel, callback=s.callback,
                                time_limit=s.time_limit, elapsed=time.perf_counter() - t0)
        opts = dict(eps_rel=s.eps_rel, max_iters=s.max_iters, deadline=t0 + s.time_limit,
                    log=self.table.row, stop=stop)
        warm = self.newton_warm or {}
        if proximal:
            # the proximal steps can crawl at extreme scales (a gap stuck at 3e-2 for 150 of
            # 238 steps, 1.5 s, while the best point was already on the optimum's face)
            out = proximal_steps.solve(self.p, bound=self.bound_at, z0=warm.get("z"),
                                       point0=warm.get("t"), finish=self.active_set_finish,
                                       **opts)
        else:
            out = newton_steps.solve(self.p, z0=warm.get("z"), **opts)
        self.newton_info = {"iterations": out.iterations, "cg_steps": out.cg_steps,
                            "seconds": out.seconds, "converged": out.converged}
        self.history.extend(out.history)
        if out.stopped == proximal_steps.FINISHED:       # best, bound and duals set by it
            self.table.footer(f"dual semismooth Newton (proximal steps): {out.iterations} steps, "
                              f"{out.cg_steps} CG steps, {out.seconds:.2f} s; the active set "
                              f"of its point certified a gap of {self.gap():.1e}")
            self.newton_end = {"z": out.z, "t": out.face}      # a warm start's
            return R.OPTIMAL, out.iterations
        if self.best is None or out.objective < self.best[0]:
            self.best = (out.objective, out.x)
        if out.lower > self.lower:
            self.lower, self.lam_best = out.lower, out.lam
        if not out.converged and out.stopped is None:
            # the ADMM's bound at the same multiplier: centred and with each clique's tau by
            # bisection, it keeps the digits that the dual value loses at large totals
            self.bound(_orthogonal(self.p, out.lam), [], float(np.max(np.abs(out.lam), initial=0.0)))
        self.table.footer(f"dual semismooth Newton{' (proximal steps)' if proximal else ''}: "
                          f"{out.iterations} steps, {out.cg_steps} CG "
                          f"steps, {out.seconds:.2f} s, certified gap {self.gap():.1e}"
                          + ("" if out.converged or out.stopped else "; the ADMM goes on"))
        if out.converged or self.gap() <= s.eps_rel:
            self.nu = out.face.copy()              # the face the multipliers' polish starts from
            self.newton_face, self.newton_lam = out.face, out.lam
            self.newton_end = {"z": out.z, "t": out.face}
            return R.OPTIMAL, out.iterations
        if out.stopped is not None or time.perf_counter() - t0 >= s.time_limit:
            return out.stopped or R.OPTIMAL_INACCURATE, out.iterations
        return None, out.iterations

    # ------------------------------------------------------------------ certificate
    def gap(self) -> float:
        return R.relative_gap(self.best[0], self.lower) if self.best else math.inf

    def certify(self) -> None:
        """A feasible point and a lower bound from the current iterates."""
        p = self.p
        pt = mix(p.graph, self.x, p.total)
        f = p.loss.value(pt)
        self.last_point = pt
        if self.best is None or f < self.best[0]:
            self.best = (f, pt)
        z = _row_duals(p.coupled, self.rho * self.v, p.Q @ self.best[1] if p.Q is not None else None)
        self.z_last = z if p.Q is not None else None
        qz = p.coupled.adjoint(z) if p.Q is not None else 0.0
        raw = -self.rho * self.u - qz
        self.bound(_orthogonal(p, raw), z, float(np.max(np.abs(raw), initial=0.0)))
        if self.gap() > self.s.eps_rel:
            # the proportional-fitting repair costs tens of projections: only when mixing
            # is not enough
            pt = self.fitter.fit(self.x, p.total)
            if pt is not None:
                f = p.loss.value(pt)
                if f < self.best[0]:
                    self.best = (f, pt)
            if self.gap() > self.s.eps_rel:
                self.repair_by_sets()
        gap = self.gap()
        # the face polish only when the certified gap is small and has stalled (it costs up to
        # 2 x 100 projections; measured on Adult's pairs it only added time while the gap was
        # still halving between certificates)
        if self.s.polish and p.Q is None and self.s.eps_rel < gap <= _POLISH_GAP \
                and gap > 0.5 * self.last_gap:
            self.try_polish()
        self.last_gap = gap

    def repair_by_sets(self, final: bool = False) -> None:
        """The iterate repaired set by set (:class:`~cvxdp.solvers.local.repair.SetRepair`)
        as a candidate point, when its
        :class:`~cvxdp.solvers.residual.repair.RepairSchedule` says so."""
        if not self.schedule.due(self.it, final):
            return
        started = time.perf_counter()
        if self.sets is None:
            self.sets = SetRepair(self.p.graph)
        pt = self.sets(self.x, self.p.total)
        if pt is not None:
            f = self.p.loss.value(pt)
            if f < self.best[0]:
                self.best = (f, pt)
        self.schedule.done(self.it, started)

    def bound_at(self, lam: np.ndarray, point: np.ndarray, value: float) -> float:
        """The lower bound at a per-cell multiplier (no coupled rows); for a free total, given
        a point of the polytope and its loss (the proven bound on the optimal total, and the
        total the root search aims at)."""
        p = self.p
        lam = _orthogonal(p, lam)
        if p.total is not None:
            total, total_max = p.total, p.total
        else:
            total, total_max = float(p.graph.totals(point)[0]), p.total_max(value)
            self.total_max = total_max
        return lower_bound(p, lam, [], total, total_max,
                           raw=float(np.max(np.abs(lam), initial=0.0)))

    def bound(self, lam: np.ndarray, z: list, raw: float) -> None:
        """Raise the lower bound with ``lam`` (computed from a vector of size ``raw``)."""
        p = self.p
        total = p.total if p.total is not None else float(p.graph.totals(self.best[1])[0])
        self.total_max = p.total_max(self.best[0]) if p.total is None else p.total
        lb = lower_bound(p, lam, z, total, self.total_max, raw=raw)
        self.lam_last = lam
        if lb > self.lower:
            self.lower, self.lam_best = lb, lam

    def try_polish(self) -> None:
        """The face program of :mod:`cvxdp.solvers.local.polish` on ``nu``'s face: its point,
        repaired, is a candidate, and its multiplier a ``lam`` for the bound."""
        p = self.p
        out = polish(p.graph, p.cells, self.nu, p.total, self.polish_mu)
        self.polish_info["attempts"] += 1
        if out is None:
            return
        x, mu, steps = out
        self.polish_info["cg_steps"] += steps
        self.polish_mu = mu
        pt = mix(p.graph, x, p.total)
        f = p.loss.value(pt)
        if f < self.best[0]:
            self.best = (f, pt)
        self.bound(mu, [], float(np.max(np.abs(mu), initial=0.0)))

    def result(self, status: str, it: int) -> R.SolverResult:
        p = self.p
        if self.best is None:
            self.certify()
        # (may polish, and so improve the point)
        y = self.y if self.y is not None else self.multipliers(status)
        # the last resort, after the exact finish (:func:`solve`); it may replace the point
        fallback = self._bound_multipliers() if y is None and status == R.OPTIMAL \
            and self.s.duals else None
        f, x = self.best
        info = {"route": self.route, "rho": self.rho, "regions": len(p.graph.regions), "coupled_rows":
                0 if p.Q is None else int(p.Q.shape[0]), "total": float(p.graph.totals(x)[0]),
                "polish": dict(self.polish_info), "dual_newton": self.newton_info}
        duals = {"marginals": y} if y is not None else {}
        info["duals_certified"] = y is not None
        if fallback is not None:
            duals[_BOUND_DUALS] = fallback
        r_p, r_d, _, _ = self.residuals() if hasattr(self, "nu_prev") else (math.nan,) * 4
        return R.SolverResult(
            x=x, status=status, objective=f, lower_bound=self.lower, gap=self.gap(), duals=duals,
            iterations=it, primal_residual=p.graph.residual(x, p.total), dual_residual=r_d,
            history=self.history, info=info,
            state={"n": p.graph.n, "m": 0 if p.Q is None else p.Q.shape[0], "nu": self.nu,
                   "u": self.u, "r": self.r, "v": self.v, "rho": self.rho,
                   "newton": self.newton_end})

    def multipliers(self, status: str) -> np.ndarray | None:
        """``-G`` (module docstring) if its linearised bound certifies the returned point;
        failing that, the gradient at the dual Newton's minimiser with the Newton's own
        multiplier, then, once, the face polish's exact multiplier (it certifies the duals of
        squared losses that the ADMM's multiplier leaves a little off)."""
        if status != R.OPTIMAL or self.lam_best is None or not self.s.duals:
            return None
        y = self._multipliers_from(self.best[1], self.lam_best)
        if y is None and self.newton_face is not None:
            # the dual Newton's minimiser: its gradient pairs with the multiplier it came with
            # (the returned point is that minimiser repaired, a little off the optimum).  Before
            # the polish: at the minimiser the gradient and the multiplier agree cell by cell,
            # so the linearised bound is the dual value itself (measured: on Adult's two-way
            # marginals this certifies and the polish, 0.3-0.45 s, does not)
            y = self._multipliers_from(self.best[1], self.newton_lam, at=self.newton_face)
        if y is None and self.newton_face is not None and self.route.startswith("proximal"):
            y = self.proximal_pursuit()
        if y is None and self.s.polish and self.p.Q is None:
            self.try_polish()
            for lam in (self.lam_best, self.polish_mu):
                if y is None and lam is not None:
                    y = self._multipliers_from(self.best[1], _orthogonal(self.p, lam))
        return y

    def _bound_multipliers(self) -> np.ndarray | None:
        """``-G`` at the minimiser of the best bound's Lagrangian (:func:`lower_bound` at
        ``lam_best`` with a known total, squared rows only): its multiplier per cell is
        ``s = lam - tau``, and ``-G_i = s_i`` where the minimiser ``x_i`` is positive,
        ``A_i c_i`` where it is zero (at most ``s_i``).  Then ``min_mu f(mu) - <G, mu>`` is
        that Lagrangian's minimum over the cells and ``min_{t in L(N)} <G, t> >= min <-s, t>``
        (``G + s >= 0``, zero where ``x_i > 0``): the Lagrangian bound of these duals is at
        least the bound, which certified the gap.  The linearised bound of the gradient
        recomputed from the point cannot show it at large totals (one clique of six cells,
        a total of 1e7 under weights of 1,000: the point's rounding, 3e-10, is 2e-6 of its
        residual, met by cells of 3e6; the stress set's seed 19).  The last resort, after the
        exact finish (:func:`solve`)."""
        p, c = self.p, self.p.cells
        if p.total is None or p.Q is not None or not c.smooth or self.lam_best is None:
            return None
        lam = _centred(p, self.lam_best)
        lb = lower_bound(p, lam, [], p.total, self.total_max,
                         raw=float(np.max(np.abs(self.lam_best), initial=0.0)))
        if R.relative_gap(self.best[0], lb) > self.s.eps_rel:
            return None
        s = lam - _per_cell(p, _tau_root(p, lam, p.total, p.total))
        x = c.argmin(c.A, c.C - s, p.total)
        if np.any(x >= p.total) and p.graph.n > 1:
            return None                          # a cell clipped at the total: not this case
        y = np.where(x <= 0.0, np.minimum(c.A * c.c, s), s)
        # ... with that minimiser, repaired into L(N), as the returned point when it is
        # certified too: the duals are then its own gradient, to the repair's move and the
        # rounding of the gradient (a point certified within eps_rel can be sqrt(eps_rel) off
        # the optimum, and its gradient with it: seed 19's instance 23, 2e-3)
        pt = mix(p.graph, p.graph.project(x, p.total), p.total)
        f = p.loss.value(pt)
        if R.relative_gap(f, lb) > self.s.eps_rel:
            return None
        # both to rounding: the minimiser consistent but for its rounding (the projection
        # sums cells up to the total: the multiplier is the optimal one as far as the
        # arithmetic can tell), the duals its gradient but for the move and the gradient's own
        rounding = 16.0 * _UNIT * (np.abs(pt) + np.abs(c.c))
        if np.any(np.abs(pt - x) > rounding + 16.0 * _UNIT * abs(p.total)) or \
                np.any(np.abs(y - c.A * (c.c - pt)) > c.A * (np.abs(pt - x) + rounding)):
            return None
        self.best = (f, pt)
        return y

    def proximal_pursuit(self) -> np.ndarray | None:
        """The proximal steps go on from where they stopped, to ``eps_rel * 1e-4``: a proximal
        point pairs its gradient with the multiplier of its own proximal problem, off the
        loss's by ``(x - x_prev) / sigma``, which the certified gap does not see (measured: 7
        of the stress set's 100 squared-loss models with an unmeasured cell certified a gap of
        1e-12 and a linearised bound 1.1e-6 short).  Its multipliers, if they certify, or
        ``None``; a better point or bound it finds is kept."""
        s = self.s
        out = proximal_steps.solve(self.p, bound=self.bound_at, z0=self.newton_end["z"],
                                   point0=self.newton_end["t"], eps_rel=max(s.eps_rel * 1e-4, 1e-15),
                                   max_iters=s.max_iters, deadline=self.t0 + s.time_limit)
        if out.objective < self.best[0]:
            self.best = (out.objective, out.x)
        if out.lower > self.lower:
            self.lower, self.lam_best = out.lower, out.lam
        y = self._multipliers_from(self.best[1], out.lam, at=out.face)
        return y if y is not None else self._multipliers_from(self.best[1], out.lam)

    def _multipliers_from(self, x: np.ndarray, lam: np.ndarray, *,
                          at: np.ndarray | None = None) -> np.ndarray | None:
        """``-G`` with ``G`` the loss gradient at ``at`` (default ``x``, the returned point),
        if the linearised bound of ``G`` and ``lam`` -- a valid bound for any ``G`` -- certifies
        ``x``."""
        p = self.p
        rows = None
        if self.z_last is not None:            # the ADMM's duals of the coupled rows
            rows = {i: (sub, z) for (i, sub), z in zip(p.coupled.origin, self.z_last)}
        lams = _gradient_duals(p.loss, x if at is None else at, -lam, rows)
        if lams is None:
            return None
        if p.total is None:
            lams = _level_free_total(p, lams, lam)
        g = p.loss.adjoint(lams)
        c = p.loss.dual_constant(lams)
        if c is None:
            return None
        total = p.total if p.total is not None else float(p.graph.totals(x)[0])
        lb = linear_bound(p, g, lam, c, total, self.total_max)
        if R.relative_gap(self.best[0], lb) > self.s.eps_rel:
            return None
        return -g


# ---------------------------------------------------------------------- pieces
def _total_guess(p: LocalProblem) -> float:
    """A starting total for a free-total problem: the largest clique sum of the measured
    values read as a table (at least one)."""
    c = p.cells
    guess = np.where(c.A > 0, c.C / np.where(c.A > 0, c.A, 1.0), np.where(c.w > 0, c.b, 0.0))
    tot = np.add.reduceat(np.maximum(guess, 0.0), p.graph.offsets[:-1])
    return float(max(np.max(tot, initial=0.0), 1.0))


def _default_rho(p: LocalProblem, total: float) -> float:
    """Ten times the typical curvature of the loss (squared rows; measured on Adult's
    all-pairs marginals at two noise levels, 3-10x the curvature converges fastest, and 10x
    beats 1x by 5-7 times), or for absolute rows the weight over a typical cell count."""
    c = p.cells
    if np.any(c.A > 0):
        return _RHO_CURVATURE * float(np.median(c.A[c.A > 0]))
    weights = [t.w for t in p.coupled.terms if t.kind == "l2"]
    if weights:
        return _RHO_CURVATURE * float(np.median(np.concatenate(weights)))
    w = np.concatenate([c.w[c.w > 0]] + [t.w for t in p.coupled.terms])
    typical = total / max(float(np.mean(p.graph.cells)), 1.0)
    return float(np.median(w)) / max(typical, 1e-12) if w.size else 1.0


def _prox_rows(loss: MarginalLoss, z: np.ndarray, rho: float) -> np.ndarray:
    """Row-wise prox of ``phi_t(r - y_t) / rho`` of the coupled terms."""
    out, k = np.empty_like(z), 0
    for t in loss.terms:
        m = t.b.size
        v = z[k:k + m]
        if t.kind == "l2":
            out[k:k + m] = (t.w * t.b + rho * v) / (t.w + rho)
        else:
            d = v - t.b
            out[k:k + m] = t.b + np.sign(d) * np.maximum(np.abs(d) - t.w / rho, 0.0)
        k += m
    return out


def _row_duals(loss: MarginalLoss, z: np.ndarray, qx: np.ndarray | None) -> list[np.ndarray]:
    """Conjugate-domain duals of the coupled rows: the gradient at ``qx`` for squared rows,
    the ADMM dual clipped to ``|z| <= w`` for absolute rows."""
    out, k = [], 0
    for t in loss.terms:
        m = t.b.size
        if t.kind == "l2":
            out.append(t.w * (qx[k:k + m] - t.b))
        else:
            out.append(np.clip(z[k:k + m], -t.w, t.w))
        k += m
    return out


def _orthogonal(p: LocalProblem, g: np.ndarray) -> np.ndarray:
    """The part of ``g`` orthogonal to the consistent directions (``V_0``; ``V`` when free)."""
    return g - p.graph.project(g, 0.0 if p.total is not None else None)


def _centred(p: LocalProblem, lam: np.ndarray) -> np.ndarray:
    """``lam`` less each clique's mean.  A constant on one clique is orthogonal to the
    consistent directions with a fixed total, and for a free total ``lam`` has zero-sum means
    already: the bound is the same in exact arithmetic, but a large constant (the clique's
    total multiplier) would enter it as ``const * (x - U)``, rounding at ``1e-16 const N``."""
    means = np.add.reduceat(lam, p.graph.offsets[:-1]) / p.graph.cells
    return lam - _per_cell(p, means)


def lower_bound(p: LocalProblem, lam: np.ndarray, z: list[np.ndarray], total: float,
                total_max: float | None, *, raw: float = 0.0) -> float:
    """The dual bound of the module docstring for ``lam`` (orthogonal to the consistent
    directions) and coupled-row duals ``z``; ``total`` is the given total, or for a free
    total the bisection's target (any positive number gives a valid bound), ``total_max`` a
    proven bound on the optimal free total (``None``: none known).

    Rounding: ``lam`` comes from a vector of size ``raw`` (the ADMM dual, which carries each
    clique's total multiplier) through a projection and a centring, so each entry is off by
    about ``1e-16 raw``; that enters as ``<lam, x - U>`` and is subtracted,
    ``_ROUND * raw * sum|x - U|`` (``sum|x|`` for a free total), so that the bound stays a
    bound at any scale (measured: at totals 1e7 and unit noise it was 1.3e-6 above the
    optimum otherwise)."""
    c0 = p.coupled.dual_constant(z) if p.Q is not None else 0.0
    if c0 is None:
        return -math.inf
    lam = _centred(p, lam)
    qz = p.coupled.adjoint(z) if p.Q is not None else np.zeros(p.graph.n)
    g = lam + qz
    cells, G = p.cells, p.graph
    if p.total is not None:
        # the Lagrangian at the minimiser, summed without the large terms that cancel
        # (lam is orthogonal to the consistent directions: <lam, U> is <lam, any point>)
        tau = _tau_root(p, g, total, total)
        x = cells.argmin(cells.A, cells.C - g + _per_cell(p, tau), total)
        d = x - G.uniform(total)
        val = cells.K + c0 + float(cells.cell_values(x).sum()) + float(lam @ d) \
            + float(qz @ x) - float(tau @ (G.totals(x) - total)) \
            - _ROUND * max(raw, float(np.max(np.abs(lam), initial=0.0))) * float(np.abs(d).sum())
        return val if math.isfinite(val) else -math.inf
    upper = total_max if total_max is not None else math.inf
    best = -math.inf
    for tau in _free_taus(p, g, max(total, 1e-300), upper):
        # shifted to sum zero (the optimality of a free total): no N term is then lost
        for t in (tau, tau - tau.sum() / tau.size):
            x = cells.argmin(cells.A, cells.C - g + _per_cell(p, t), upper)
            s = float(t.sum())
            ntau = s * upper if s < 0 else 0.0      # min over 0 <= N <= upper of N sum(tau)
            with np.errstate(invalid="ignore"):
                val = cells.K + c0 + float(cells.cell_values(x).sum()) + float(g @ x) \
                    - float(t @ G.totals(x)) + ntau \
                    - _ROUND * max(raw, float(np.max(np.abs(g), initial=0.0))) * float(np.abs(x).sum())
            if math.isfinite(val):
                best = max(best, val)
    return best


def _free_taus(p: LocalProblem, g: np.ndarray, total: float, upper: float):
    """Candidate ``tau`` for a free total.  The best has every clique's minimiser summing to a
    common ``N`` and ``sum(tau) = 0`` (the dual's optimality conditions): for a trial ``N`` each
    clique's maximisers form an interval ``[tau_k^-, tau_k^+]`` (:func:`_tau`); if a common
    shift clipped to them sums to zero that ``tau`` is optimal, else ``N`` moves (``tau``
    increases with ``N``) by bracketing, then bisection.  Every ``tau`` tried is a candidate
    (each gives a valid bound)."""
    def at(N):
        lo, hi = _tau(p, g, N, upper, strict=True), _tau(p, g, N, upper)
        hi = np.maximum(hi, lo)
        if lo.sum() <= 0 <= hi.sum():
            a, b = float(lo.min()), float(hi.max())
            for _ in range(_TAU_STEPS):
                c = 0.5 * (a + b)
                if np.clip(c, lo, hi).sum() > 0:
                    b = c
                else:
                    a = c
            return np.clip(a, lo, hi), 0
        return hi, (1 if lo.sum() > 0 else -1)
    tau, sign = at(total)
    yield tau
    if sign == 0:
        return
    # bracket the common total: sum(tau(N)) increases with N
    ends = {sign: (total, float(tau.sum()))}
    step = 1e-3 * total
    for _ in range(_BRACKET_STEPS):
        n = min(max(total - step if sign > 0 else total + step, 0.0), upper)
        tau, sn = at(n)
        yield tau
        if sn == 0 or n <= 0.0 or n >= upper:
            return
        ends[sn] = (n, float(tau.sum()))
        if len(ends) == 2:
            break
        step *= 4
    else:
        return
    # Illinois (regula falsi with halving) on N -> sum(tau(N))
    (lo_n, lo_s), (hi_n, hi_s) = ends[-1], ends[1]
    side = 0
    for _ in range(_SECANT_STEPS):
        n = (lo_n * hi_s - hi_n * lo_s) / (hi_s - lo_s) if hi_s != lo_s else 0.5 * (lo_n + hi_n)
        if not lo_n < n < hi_n:
            n = 0.5 * (lo_n + hi_n)
        tau, sn = at(n)
        yield tau
        if sn == 0:
            return
        if sn > 0:
            hi_n, hi_s = n, float(tau.sum())
            if side == 1:
                lo_s *= 0.5
            side = 1
        else:
            lo_n, lo_s = n, float(tau.sum())
            if side == -1:
                hi_s *= 0.5
            side = -1


def _gradient_duals(loss: MarginalLoss, x: np.ndarray, target: np.ndarray,
                    rows: dict | None = None) -> list[np.ndarray] | None:
    """Per-term duals: the gradient for squared rows; for absolute rows a subgradient, with
    the rows' cells' residual freedom spent to bring ``sum_t A_t^T z_t`` close to ``target``:
    an absolute row on one cell (a slice, or a matrix row with one entry ``a``, as a weighted
    ``cp.multiply(w, mu - y)`` is read) at its kink takes ``clip(want / a, -w, w)``, a row of
    several cells at its kink the ADMM's dual, ``rows[i] = (row indices, duals)`` of term
    ``i`` if given (first: the one-cell rows' ``want`` counts it), the others ``w sign(r)``.
    (Measured on the stress set's elastic nets: with ``sign(0) = 0`` at the
    kinks of weighted rows the written multipliers missed ``eps_rel`` by 10%.)"""
    g2 = np.zeros(loss.n)
    lams: list = []
    for t in loss.terms:
        if t.kind == "l2":
            lam = t.w * t.apply(x)
            t.add_adjoint(lam, g2)
            lams.append(lam)
        else:
            lams.append(None)
    rows = rows or {}
    order = [i for i in rows if loss.terms[i].kind == "l1"] + \
        [i for i, t in enumerate(loss.terms) if t.kind == "l1" and i not in rows]
    for i in order:
        t = loss.terms[i]
        r = t.apply(x)
        lam = t.w * np.sign(r)
        free = np.abs(r) <= 1e-9 * (1.0 + np.abs(t.b))
        if i in rows:
            sub, z = rows[i]
            lam[sub] = np.where(free[sub], np.clip(z, -t.w[sub], t.w[sub]), lam[sub])
            free[sub] = False
        if isinstance(t.A, slice):
            want = target[t.A] - g2[t.A]
            lam = np.where(free, np.clip(want, -t.w, t.w), lam)
        elif np.any(free):
            one, col, coef = _one_cell_rows(t.A)
            pick = one[free[one]]
            if pick.size:
                want = (target - g2)[col[free[one]]] / coef[free[one]]
                lam[pick] = np.clip(want, -t.w[pick], t.w[pick])
        t.add_adjoint(lam, g2)
        lams[i] = lam
    return lams


def _level_free_total(p: LocalProblem, lams: list, lam: np.ndarray) -> list:
    """For a free total, ``lams`` with the cone direction's slope ``sum_k min_i (G + lam')_i``
    (:func:`linear_bound`) raised to zero when it is negative: the gradient ``G`` of a point
    certified to ``1e-10`` still has a slope of ``-1e-7`` relative, which leaves the written
    multipliers' Lagrangian unbounded below (measured: 33 of 50 of the stress set's free
    totals).  On one clique, the cells below its minimum plus ``kappa = -slope`` are raised to
    it through the duals of one-cell rows on them (a squared row's dual moves freely, the
    conjugate term accounting for it; an absolute row's within ``[-w, w]``), which raises the
    clique's minimum by ``kappa``; the bound stays a bound and loses about ``kappa N`` (the
    caller keeps the multipliers only if it still certifies).  Cliques whose low cells lack
    such a row, or room in it, are passed over."""
    G = p.graph
    h = p.loss.adjoint(lams) + _centred(p, lam)
    mins = np.minimum.reduceat(h, G.offsets[:-1])
    slope = float(mins.sum())
    if slope >= 0:
        return lams
    kappa = -slope + 8 * np.finfo(float).eps * float(np.abs(h).max()) * len(G.cliques)
    term, row, coef, room = _one_cell_room(p, lams)
    for k in range(len(G.cliques)):
        a, b = G.offsets[k], G.offsets[k + 1]
        need = np.maximum(mins[k] + kappa - h[a:b], 0.0)
        low = np.flatnonzero(need > 0)
        if low.size and np.all(room[a + low] >= need[low]):
            out = list(lams)
            for i in np.unique(term[a + low]):
                mine = low[term[a + low] == i]
                out[i] = out[i].copy()
                out[i][row[a + mine]] += need[mine] / coef[a + mine]
            return out
    return lams


def _one_cell_room(p: LocalProblem, lams: list):
    """Per cell, the one-cell row whose dual may raise ``G`` there the most: ``(term, row,
    coef, room)``, ``room`` the largest rise (``inf`` for a squared row, what ``[-w, w]``
    leaves for an absolute one, ``-1`` where no such row is)."""
    n = p.graph.n
    term, row = np.full(n, -1), np.zeros(n, dtype=np.int64)
    coef, room = np.ones(n), np.full(n, -1.0)
    for i, t in enumerate(p.loss.terms):
        if isinstance(t.A, slice):
            rows = np.arange(t.b.size)
            col, a = np.arange(t.A.start, t.A.stop), np.ones(t.b.size)
        else:
            rows, col, a = _one_cell_rows(t.A)
        keep = t.w[rows] > 0
        rows, col, a = rows[keep], col[keep], a[keep]
        if t.kind == "l2":
            r = np.full(rows.size, np.inf)
        else:                       # lam + d / a within [-w, w], d >= 0
            cur = np.asarray(lams[i], dtype=float)[rows]
            r = np.where(a > 0, (t.w[rows] - cur) * a, (cur + t.w[rows]) * -a)
        better = r > room[col]
        col, rows, a, r = col[better], rows[better], a[better], r[better]
        term[col], row[col], coef[col], room[col] = i, rows, a, r
    return term, row, coef, room


def _one_cell_rows(A) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, column, entry)`` of the rows of ``A`` (CSR) with one nonzero, in a column
    that no other such row uses (two rows on one cell share its freedom: left to ``sign``)."""
    nnz = np.diff(A.indptr)
    rows = np.flatnonzero(nnz == 1)
    col = A.indices[A.indptr[rows]]
    coef = A.data[A.indptr[rows]]
    keep = (coef != 0) & (np.bincount(col, minlength=A.shape[1])[col] == 1)
    return rows[keep], col[keep], coef[keep]


def linear_bound(p: LocalProblem, g: np.ndarray, lam: np.ndarray, c: float, total: float,
                 total_max: float | None) -> float:
    """``c + min_{t in L(N)} <g, t>`` bounded through ``lam``: ``sum_k N min_i (g - lam')_i
    + <lam', U>`` with ``lam' = -lam`` (orthogonal to the consistent directions)."""
    G = p.graph
    lam = _centred(p, lam)
    h = g + lam
    mins = np.minimum.reduceat(h, G.offsets[:-1])
    if p.total is not None:
        return c + total * float(mins.sum()) + float((-lam) @ G.uniform(total))
    # free total: over the whole cone a negative direction makes the Lagrangian unbounded;
    # but the optimum's total is at most the proven bound ``total_max``, so a slope of
    # rounding size costs only ``slope * total_max`` (measured on the stress set's free
    # totals: a slope of -1e-17 at points certified to 1e-13 left 33 of 50 without duals)
    # free total: the Lagrangian of the written multipliers is over the whole cone (a bound
    # on the optimal total is not a constraint of the problem), so any negative direction
    # makes it unbounded (:func:`_level_free_total` removes one of rounding size)
    return c if float(mins.sum()) >= 0 else -math.inf
