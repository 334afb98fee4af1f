"""Estimation over the marginal polytope by entropic mirror descent with a junction-tree oracle.

Problem (McKenna, Sheldon, Miklau, ICML 2019, section 3.2):

    minimize  L(mu)   over   mu in M(C, N),

the clique marginals ``mu_k`` (cliques ``C_k``) of some nonnegative table with total ``N``
(a given total; with the total free, :mod:`cvxdp.solvers.marginal.free_total` calls this solver inside
a safeguarded secant method on ``N``).
With the Bregman divergence of the entropy, a mirror step is marginal inference:
``mu(theta - eta grad L(mu))`` (appendix A.1), computed exactly by belief propagation on a
junction tree (:mod:`cvxdp.solvers.marginal.junction_tree`).  Two algorithms:

* ``"mirror_descent"`` (Algorithm 1) with a backtracking line search on the Bregman
  upper model ``L(mu+) <= L(mu) + <g, mu+ - mu> + D(mu+, mu) / eta``.  ``D = N KL(p+ || p)`` is
  read off the log-partition functions, ``N KL = -eta <g, mu+> + N (log Z - log Z+)``, so a
  trial costs one oracle call.  The step grows 2x after each accepted step (Private-PGM grows
  it 1.01x, which is why it starts slowly).
* ``"accelerated"`` (default): the same step taken from an extrapolated point
  ``theta + k/(k+3) (theta - theta_prev)`` (Nesterov momentum in parameter space), restarted
  (``k = 0``) whenever the extrapolated point's loss exceeds the current one (O'Donoghue &
  Candes 2015).  No O(1/t^2) guarantee holds for the entropy (its Bregman divergence lacks
  the needed scaling property), but the certified gap guards the result; on Adult (14 one-way
  and 10 two-way marginals) it reaches Private-PGM's 1000-iteration loss in under 100
  iterations.
* ``"dual_averaging"`` (Algorithm 2, Nesterov / Xiao 2010) with the loss's Lipschitz constant
  computed by :meth:`MarginalLoss.lipschitz`.

Stopping rule: a certified duality gap.  Every ``check_every`` iterations the dual point
``lam = phi'(A mu - b)`` gives a lower bound through one max-product pass
(:mod:`cvxdp.solvers.marginal.loss`); the run is ``optimal`` when
``L(mu) - best_lower_bound <= eps_abs + eps_rel * |L(mu)|``.  L1 terms are Huber-smoothed with
a width ``tau`` that shrinks whenever the smoothing, not the optimisation, holds the gap up;
their bound is always for the exact L1 loss.

Polish.  Entropic steps keep every cell positive, so optima with many empty cells (the usual
case for sparse data) are approached only in the limit, and the Frank-Wolfe bound stays loose
near them.  For quadratic losses, at iteration ``polish_start`` (then at twice the iteration of
each failed attempt) :mod:`cvxdp.solvers.marginal.polish` takes the model's junction-tree beliefs,
finds the active set by primal-dual active-set rounds and returns the exact optimum; the
max-product bound at that point is tight, and the run stops.  The polished point is kept only
if its certified gap meets the tolerance (or the floor of double precision, then
``optimal_inaccurate``).

L1 tail.  With L1 (Laplace) terms the Huber-smoothed mirror descent and its Frank-Wolfe bound
close slowly (gaps of 1e-4 .. 1e-1 after thousands of iterations).  At iteration
``polish_start`` (every algorithm) :mod:`cvxdp.solvers.marginal.lp` solves the problem exactly
on the junction tree's local polytope instead: a linear program (HiGHS) for pure L1 losses, a
diagonal-Hessian QP (a primal-dual interior point) for mixes of L1 and L2 terms.  Its L1
multipliers, clipped into ``[-w, w]``, and the L2 gradient are the dual point of the
max-product bound above, so the result is certified by the same bound as mirror descent's own
iterates, never assumed.  The solve is tried once (it does not depend on the iterate);
above :data:`cvxdp.solvers.marginal.lp.MAX_LP_SIZE` columns, or if it fails, mirror descent
goes on and ends with its measured gap (``optimal_inaccurate`` when it misses ``eps``).

``SolverResult.duals`` after an exact L1 solve (count units; see
:mod:`cvxdp.solvers.marginal.lp`): ``"local_nonneg"`` the multipliers ``s >= 0`` of the
junction-tree cells ``x >= 0`` (flat, ``tree.cliques`` order, C order within a clique),
``"local_consistency"`` the multipliers ``nu`` of ``E x = e`` (separator rows of
``tree.preorder[1:]``, child minus parent, then the total row), with ``s = P^T g - E^T nu``,
and ``"loss"`` the loss duals ``lam_t`` of the terms, concatenated (``g = sum_t A_t^T lam_t``).
Empty otherwise.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import result as R
from .._table import IterationTable
from .junction_tree import JunctionTree
from .loss import MarginalLoss
from .lp import LocalPolytopeLP, LPResult
from .polish import MAX_POLISH_CELLS, LocalPolytopeQP, PolishResult

__all__ = ["MirrorSettings", "MarginalProblem", "solve", "ALGORITHMS"]

ALGORITHMS = ("accelerated", "mirror_descent", "dual_averaging")

_STEP_GROWTH = {"mirror_descent": 1.2, "accelerated": 1.5}   # after an accepted step (measured on Adult)
_STEP_SHRINK = 0.5        # after a rejected trial
_MAX_BACKTRACKS = 60
# the Huber width starts at this fraction of the median L1 noise scale 1/w ...
_TAU0 = 0.5
# ... and shrinks by this factor when the smoothing error dominates the certified gap
_TAU_SHRINK = 0.1
# A polished point is returned at a certified gap above eps only below this relative gap
# (the floor of double precision for these problems); otherwise mirror descent goes on.
_POLISH_FLOOR = 1e-8
# Cells below this fraction of the total start a polish in the zero set.
_POLISH_THRESHOLD = 1e-6
# Time allowed to polish attempts in all: this multiple of the mirror-descent time so far,
# and at least this many seconds (so a failing polish at most triples the run time).
_POLISH_TIME_RATIO = 2.0
_POLISH_MIN_SECONDS = 5.0
# The exact L1 / mixed solve is tried once (it does not depend on the iterate, so a retry
# would give the same answer) with at least this many seconds: mirror descent alone rarely
# certifies an L1 optimum, so this is usually the only way to status optimal.
_LP_MIN_SECONDS = 60.0


@dataclass
class MirrorSettings:
    """cvxpy-style options.  ``optimal`` means a certified gap ``<= eps_abs + eps_rel |L|``."""

    algorithm: str = "accelerated"
    # Private-PGM's default is 1000; the certificate of large boundary optima closes slowly,
    # so an uncapped run would mostly burn time at status optimal_inaccurate
    max_iters: int = 2000
    eps_abs: float = 1e-8
    eps_rel: float = 1e-4
    time_limit: float = math.inf
    check_every: int = 10
    step: float | None = None          # initial step; default 1 / Lipschitz bound
    # polish (all algorithms but dual_averaging for quadratic losses; every algorithm for
    # losses with L1 terms): first attempt at this iteration; the quadratic polish is
    # retried at twice the iteration of each failed attempt, the exact L1 solve is tried once
    polish: bool = True
    polish_start: int = 100
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        for name in ("eps_abs", "eps_rel"):
            if not (getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a nonnegative number")
        if int(self.max_iters) < 0 or int(self.check_every) < 1:
            raise ValueError("max_iters must be >= 0 and check_every >= 1")
        if int(self.polish_start) < 0:
            raise ValueError(f"polish_start must be >= 0, got {self.polish_start}")
        if self.step is not None and not (self.step > 0 and math.isfinite(self.step)):
            raise ValueError(f"step must be a positive finite number, got {self.step}")


@dataclass
class MarginalProblem:
    """``minimize loss(mu)`` over the marginals ``mu`` of the tree's factors with total ``total``."""

    tree: JunctionTree
    loss: MarginalLoss
    total: float

    def __post_init__(self) -> None:
        shapes = [self.tree.factor_shape(k) for k in range(len(self.tree.factors))]
        self.offsets = np.concatenate([[0], np.cumsum([math.prod(s) for s in shapes])]).astype(int)
        if self.offsets[-1] != self.loss.n:
            raise ValueError(f"the loss acts on {self.loss.n} cells, the factors have {self.offsets[-1]}")
        if not (self.total > 0 and math.isfinite(self.total)):
            raise ValueError(f"total must be a positive finite number, got {self.total}")
        self.shapes = shapes

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat[a:b].reshape(s) for a, b, s in zip(self.offsets[:-1], self.offsets[1:], self.shapes)]

    def oracle(self, theta_flat: np.ndarray):
        """``(mu_flat, log Z)`` of the graphical model with factor log-potentials ``theta``."""
        mus, _, log_z = self.tree.marginals(self.split(theta_flat), self.total)
        return np.concatenate([m.ravel() for m in mus]) if mus else np.zeros(0), log_z

    def linear_min(self, g_flat: np.ndarray) -> float:
        """``min_{mu in M} <g, mu> = -N max_x sum_k -g_k(x_{C_k})``."""
        return -self.total * self.tree.max_value([-a for a in self.split(g_flat)])

    def lower_bound(self, lams) -> float:
        c = self.loss.dual_constant(lams)
        if c is None:
            return -math.inf
        return self.linear_min(self.loss.adjoint(lams)) + c


def solve(problem: MarginalProblem, settings: MirrorSettings | None = None, *,
          theta0: np.ndarray | None = None, step0: float | None = None) -> R.SolverResult:
    """Minimise ``problem.loss`` over the marginal polytope; see the module docstring."""
    s = settings or MirrorSettings()
    t_start = time.perf_counter()
    P, loss, N = problem, problem.loss, problem.total
    tau = 0.0
    if not loss.smooth:
        scales = np.concatenate([1.0 / t.w[t.w > 0] for t in loss.terms if t.kind == "l1"] or [np.ones(1)])
        tau = _TAU0 * float(np.median(scales))
    table = IterationTable([("iter", "d"), ("loss", ".6e"), ("lower bd", ".6e"), ("rel gap", ".2e"),
                            ("step", ".2e"), ("tau", ".1e"), ("time", ".2f")], s.verbose)
    table.header(f"cvxdp {s.algorithm} over the marginal polytope: {len(P.tree.factors)} cliques, "
                 f"{loss.n:,} marginal cells; {P.tree.summary()}")
    theta = np.zeros(loss.n) if theta0 is None else np.array(theta0, dtype=float)
    mu, log_z = P.oracle(theta)
    best_lb, status, history = -math.inf, None, []
    lip = loss.lipschitz(P.offsets, N, tau)
    setup_time = time.perf_counter() - t_start
    it = 0

    def check(f_smooth, lams, step):
        """Certify the current ``mu`` (exact loss, best lower bound), log a table row;
        returns ``(row, exact loss, certified gap)``."""
        nonlocal best_lb
        f_exact = f_smooth if tau == 0 else loss.value(mu)
        best_lb = max(best_lb, P.lower_bound(lams))
        gap = f_exact - best_lb
        row = dict(iter=it, loss=f_exact, **{"lower bd": best_lb,
                   "rel gap": gap / max(abs(f_exact), 1e-300)}, step=step, tau=tau,
                   time=time.perf_counter() - t_start)
        history.append(row)
        table.row(row)
        return row, f_exact, gap

    def converged(f_exact, gap):
        return gap <= s.eps_abs + s.eps_rel * abs(f_exact)

    def user_stop(row):
        return s.callback is not None and bool(s.callback(dict(row, x=mu)))

    def out_of_budget():
        return it >= s.max_iters or time.perf_counter() - t_start >= s.time_limit

    polished: PolishResult | LPResult | None = None
    qp: LocalPolytopeQP | None = None
    if loss.smooth:
        polish_at = s.polish_start if (s.polish and s.algorithm != "dual_averaging"
                                       and sum(P.tree.cells) <= MAX_POLISH_CELLS) else None
    else:
        polish_at = s.polish_start if s.polish else None
    polish_log: list[dict] = []
    duals: dict[str, np.ndarray] = {}
    lp_fallback: list[tuple[float, LPResult]] = []

    def keep_lp(pol: LPResult) -> None:
        nonlocal polished, mu
        polished, mu = pol, pol.mu
        duals.update(local_nonneg=pol.s, local_consistency=pol.nu,
                     loss=np.concatenate(pol.lams) if pol.lams else np.zeros(0))

    def try_lp_polish():
        """The exact solve of an L1 / mixed loss (:mod:`cvxdp.solvers.marginal.lp`), once:
        the status to stop with, or ``None`` (mirror descent goes on; a bound found is kept)."""
        nonlocal best_lb, polished, mu, polish_at
        polish_at = None
        t0 = time.perf_counter()
        budget = max(_LP_MIN_SECONDS, _POLISH_TIME_RATIO * (t0 - t_start))
        entry = dict(iter=it, seconds=0.0, rounds=None, gap=None, kind="lp")
        polish_log.append(entry)
        try:
            lp = LocalPolytopeLP(P.tree, loss, N)
        except ValueError as exc:                      # above MAX_LP_SIZE
            entry.update(seconds=time.perf_counter() - t0, skipped=str(exc))
            table.footer(f"exact L1 solve skipped: {exc}; mirror descent continues")
            return None
        pol = lp.solve(deadline=min(t0 + budget, t_start + s.time_limit))
        entry["seconds"] = time.perf_counter() - t0
        if pol is None:
            table.footer(f"exact L1 solve at iteration {it} failed ({entry['seconds']:.2f} s); "
                         f"mirror descent continues")
            return None
        f_p = loss.value(pol.mu)
        lb_p = P.lower_bound(pol.lams)
        if pol.alt_lams is not None:
            lb_p = max(lb_p, P.lower_bound(pol.alt_lams))
        best_lb = max(best_lb, lb_p)
        gap_p = f_p - best_lb
        entry.update(rounds=pol.iterations, gap=gap_p / max(abs(f_p), 1e-300), method=pol.method,
                     support=int(sum(int(np.count_nonzero(t)) for t in pol.x)),
                     solver_bound=pol.dual_bound, certified_bound=lb_p, repaired=pol.repaired)
        ok = converged(f_p, gap_p)
        if not ok and gap_p > _POLISH_FLOOR * abs(f_p):
            table.footer(f"exact L1 solve ({pol.method}) at iteration {it}: certified gap "
                         f"{entry['gap']:.1e}; mirror descent continues")
            lp_fallback.append((f_p, pol))             # returned if mirror descent ends worse
            return None
        keep_lp(pol)
        return finish(f_p, entry["gap"], ok,
                      f"exact L1 solve ({pol.method}) at iteration {it}: {pol.iterations} "
                      f"iterations, {entry['seconds']:.2f} s, consistency residual "
                      f"{pol.residual:.1e}")

    def finish(f_p, rel_gap, ok, note):
        """Log an accepted exact finish (``mu`` already set) and return its status."""
        row = dict(iter=it, loss=f_p, **{"lower bd": best_lb, "rel gap": rel_gap},
                   time=time.perf_counter() - t_start)
        history.append(dict(row, polished=True))
        table.row(row)
        table.footer(note)
        if s.callback is not None:
            s.callback(dict(row, x=mu))
        return R.OPTIMAL if ok else R.OPTIMAL_INACCURATE

    def try_polish(theta_now):
        """Active-set polish from the model at ``theta_now``: the status to stop with, or
        ``None`` (then mirror descent goes on; the bound it found is kept)."""
        nonlocal qp, best_lb, polished, mu, polish_at
        t0 = time.perf_counter()
        polish_at = 2 * max(it, 1)
        spent = sum(e["seconds"] for e in polish_log)
        budget = max(_POLISH_MIN_SECONDS, _POLISH_TIME_RATIO * (t0 - t_start - spent)) - spent
        if budget <= 0:
            return None
        if qp is None:
            qp = LocalPolytopeQP(P.tree, loss, N)
        _, probs, _ = P.tree.marginals(P.split(theta_now), 1.0)
        pol = qp.polish(np.concatenate([b.ravel() for b in probs]), threshold=_POLISH_THRESHOLD,
                        deadline=min(t0 + budget, t_start + s.time_limit))
        entry = dict(iter=it, seconds=time.perf_counter() - t0, rounds=None, gap=None)
        polish_log.append(entry)
        if pol is None:
            table.footer(f"polish at iteration {it}: the active set did not settle "
                         f"({entry['seconds']:.2f} s); mirror descent continues")
            return None
        f_p, _, lams_p = loss.value_grad(pol.mu)
        best_lb = max(best_lb, P.lower_bound(lams_p))
        gap_p = f_p - best_lb
        entry.update(rounds=pol.rounds, gap=gap_p / max(abs(f_p), 1e-300), support=pol.support)
        ok = converged(f_p, gap_p)
        if not ok and gap_p > _POLISH_FLOOR * abs(f_p):
            table.footer(f"polish at iteration {it}: certified gap {entry['gap']:.1e} after "
                         f"{pol.rounds} rounds; mirror descent continues")
            return None
        polished, mu = pol, pol.mu
        return finish(f_p, entry["gap"], ok,
                      f"polish at iteration {it}: {pol.rounds} active-set rounds, "
                      f"{pol.support:,} cells in the support, consistency residual "
                      f"{pol.residual:.1e}")

    if s.algorithm in ("mirror_descent", "accelerated"):
        eta = step0 or s.step or (1.0 / lip if lip > 0 else 1.0)
        f, g, lams = loss.value_grad(mu, tau)
        theta_prev, k_mom = theta, 0
        growth = _STEP_GROWTH[s.algorithm]
        while True:
            if it % s.check_every == 0 or it == s.max_iters:
                row, f_exact, gap = check(f, lams, eta)
                if converged(f_exact, gap):
                    status = R.OPTIMAL
                    break
                if polish_at is not None and it >= polish_at:
                    status = try_polish(theta) if loss.smooth else try_lp_polish()
                    if status is not None:
                        break
                if tau > 0 and (f - best_lb) < 0.25 * gap:
                    # smoothing error dominates: sharpen, and shrink the step with the curvature
                    tau *= _TAU_SHRINK
                    eta *= _TAU_SHRINK
                    f, g, lams = loss.value_grad(mu, tau)
                if user_stop(row):
                    status = R.USER_LIMIT
                    break
            if out_of_budget():
                status = R.OPTIMAL_INACCURATE
                break
            y, mu_y, lz_y, f_y, g_y = theta, mu, log_z, f, g
            if s.algorithm == "accelerated" and k_mom > 0:
                y = theta + (k_mom / (k_mom + 3.0)) * (theta - theta_prev)
                mu_y, lz_y = P.oracle(y)
                f_y, g_y, _ = loss.value_grad(mu_y, tau)
                if f_y > f:                           # adaptive restart: drop the momentum
                    y, mu_y, lz_y, f_y, g_y, k_mom = theta, mu, log_z, f, g, 0
            gmu = float(np.dot(g_y, mu_y))
            for _ in range(_MAX_BACKTRACKS):
                theta_new = y - eta * g_y
                mu_new, log_z_new = P.oracle(theta_new)
                f_new = loss.value(mu_new, tau)
                g_new_mu = float(np.dot(g_y, mu_new))
                bregman = max(0.0, -eta * g_new_mu + N * (lz_y - log_z_new))
                # roundoff allowance on the scale of the terms compared
                slack = 1e-12 * (abs(f_y) + abs(gmu) + abs(g_new_mu))
                if f_new <= f_y + g_new_mu - gmu + bregman / eta + slack:
                    break
                eta *= _STEP_SHRINK
            else:                                     # no step passes: roundoff level reached
                f_exact = f if tau == 0 else loss.value(mu)   # judge the exact, not the smoothed, loss
                status = R.OPTIMAL if converged(f_exact, f_exact - best_lb) else R.OPTIMAL_INACCURATE
                break
            theta_prev = theta
            f_old = f
            theta, mu, log_z = theta_new, mu_new, log_z_new
            f, g, lams = loss.value_grad(mu, tau)
            eta *= growth
            k_mom = k_mom + 1 if f <= f_old else 0    # function restart (O'Donoghue & Candes)
            it += 1
        model_theta = theta
    else:
        gbar = np.zeros(loss.n)
        nu = mu.copy()
        model_theta = theta
        f_mu, g_mu, lams = loss.value_grad(mu, tau)
        while True:
            if it % s.check_every == 0 or it == s.max_iters:
                row, f_exact, gap = check(f_mu, lams, 1.0 / lip)
                if converged(f_exact, gap):
                    status = R.OPTIMAL
                    break
                if polish_at is not None and it >= polish_at:    # L1 terms only (see above)
                    status = try_lp_polish()
                    if status is not None:
                        break
                if user_stop(row):
                    status = R.USER_LIMIT
                    break
            if out_of_budget():
                status = R.OPTIMAL_INACCURATE
                break
            t = it + 1
            c = 2.0 / (t + 1)
            omega = (1 - c) * mu + c * nu
            _, g_om, _ = loss.value_grad(omega, tau)
            gbar = (1 - c) * gbar + c * g_om
            model_theta = -t * (t + 1) / (4.0 * lip) * gbar
            nu, log_z = P.oracle(model_theta)
            mu = (1 - c) * mu + c * nu
            it += 1
            if it % s.check_every == 0 or it == s.max_iters:
                f_mu, g_mu, lams = loss.value_grad(mu, tau)
    if polished is None and lp_fallback and status != R.OPTIMAL and lp_fallback[0][0] < loss.value(mu):
        keep_lp(lp_fallback[0][1])           # an uncertified exact solve beats the last iterate
        table.footer("the exact L1 solve's point has the lower loss: it is returned")
    if polished is not None:
        model_theta = None
    f_final = loss.value(mu)
    gap = f_final - best_lb
    table.footer(f"status {status}: loss {f_final:.8e}, certified lower bound {best_lb:.8e}, "
                 f"{it} iterations, {time.perf_counter() - t_start:.2f} s")
    return R.SolverResult(
        x=mu, status=status, objective=f_final, lower_bound=best_lb,
        gap=gap / max(abs(f_final), 1.0), iterations=it, duals=duals,
        setup_time=setup_time, solve_time=time.perf_counter() - t_start - setup_time,
        history=history,
        primal_residual=0.0 if polished is None else polished.residual,
        info=dict(algorithm=s.algorithm, theta=model_theta, lipschitz=lip, tau=tau, abs_gap=gap,
                  clique_tables=None if polished is None else polished.x, polish=polish_log),
        state=dict(theta=theta if s.algorithm != "dual_averaging" else model_theta,
                   step=eta if s.algorithm != "dual_averaging" else None))
