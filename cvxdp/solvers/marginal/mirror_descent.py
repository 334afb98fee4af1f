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
``optimal_inaccurate``).  The active-set rule can cycle (on optima with most cells empty it
does, see :mod:`cvxdp.solvers.marginal.lp`); after the first attempt that does not certify, the
run hands over, once, to the exact QP on the local polytope solved by the interior point of
:mod:`cvxdp.solvers.marginal.lp` (certified by the same bound; if it fails, mirror descent goes on
and the active-set polish is retried as before).  ``on_polish_failure`` chooses: ``"exact"``
(that hand-over, the default), ``"stop"`` (end the run at once, ``optimal_inaccurate``: the
free-total solve uses it to hand over its whole program instead of one per total) or
``"retry"`` (only the retries).

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

``SolverResult.duals`` after an exact solve of :mod:`cvxdp.solvers.marginal.lp` (L1, mixed, or
the quadratic hand-over; count units): ``"local_nonneg"`` the multipliers ``s >= 0`` of the
junction-tree cells ``x >= 0`` (flat, ``tree.cliques`` order, C order within a clique),
``"local_consistency"`` the multipliers ``nu`` of ``E x = e`` (separator rows of
``tree.preorder[1:]``, child minus parent, then the total row), with ``s = P^T g - E^T nu``,
and ``"loss"`` the loss duals ``lam_t`` of the terms, concatenated (``g = sum_t A_t^T lam_t``).
Always (once a check has run): ``"bound"``, the loss duals behind the best certified lower
bound, concatenated the same way.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .. import result as R
from .._table import IterationTable
from .junction_tree import JunctionTree
from .loss import MarginalLoss
from .lp import LocalPolytopeLP, LPResult, lp_duals
from .polish import MAX_POLISH_CELLS, LocalPolytopeQP, PolishResult
from .gap import relative, within_tolerance

__all__ = ["MirrorSettings", "MarginalProblem", "solve", "ALGORITHMS"]

ALGORITHMS = ("accelerated", "mirror_descent", "dual_averaging")
ON_POLISH_FAILURE = ("exact", "stop", "retry")

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
    # quadratic losses, when an active-set polish attempt does not certify: "exact" hands over
    # (once) to the interior-point QP of lp.py, "stop" ends the run at once (status
    # optimal_inaccurate; the free-total solve then hands over its whole program), "retry"
    # only retries the polish later
    on_polish_failure: str = "exact"
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
        if self.on_polish_failure not in ON_POLISH_FAILURE:
            raise ValueError(f"on_polish_failure must be one of {ON_POLISH_FAILURE}, "
                             f"got {self.on_polish_failure!r}")
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
    run = _Run(problem, settings or MirrorSettings(), theta0)
    if run.settings.algorithm in ("mirror_descent", "accelerated"):
        status = run.mirror_descent(step0)
    else:
        status = run.dual_averaging()
    return run.result(status)


def _initial_tau(loss: MarginalLoss) -> float:
    """The first Huber width of the L1 terms: ``_TAU0`` times the median L1 noise scale
    ``1/w`` (``0`` for a smooth loss, which is not smoothed)."""
    if loss.smooth:
        return 0.0
    scales = np.concatenate([1.0 / t.w[t.w > 0] for t in loss.terms if t.kind == "l1"] or [np.ones(1)])
    return _TAU0 * float(np.median(scales))


def _first_polish(problem: MarginalProblem, s: MirrorSettings) -> int | None:
    """The iteration of the first polish attempt, or ``None`` for none: the active-set polish
    of a quadratic loss (not for dual averaging, nor above ``MAX_POLISH_CELLS`` junction-tree
    cells), the exact L1 / mixed solve for a loss with L1 terms (every algorithm)."""
    if problem.loss.smooth:
        return s.polish_start if (s.polish and s.algorithm != "dual_averaging"
                                  and sum(problem.tree.cells) <= MAX_POLISH_CELLS) else None
    return s.polish_start if s.polish else None


class _Anchor(NamedTuple):
    """The point a mirror step is taken from: log-potentials ``theta``, their marginals ``mu``
    and log-partition function ``log_z``, the (smoothed) loss ``f`` and its gradient ``g``."""

    theta: np.ndarray
    mu: np.ndarray
    log_z: float
    f: float
    g: np.ndarray


class _Run:
    """One run of :func:`solve`: the iterate, the certificate (best lower bound, verbose table,
    history) and the polish bookkeeping, with the steps of the algorithms as methods.

    ``theta`` is the model's log-potentials: the mirror iterate, or for dual averaging the
    model of its averaged gradient (``model_theta`` of Algorithm 2)."""

    # set by mirror_descent(): the iterate's (smoothed) loss, gradient and loss duals, the
    # previous iterate and the momentum counter
    f: float
    g: np.ndarray
    lams: list[np.ndarray]
    theta_prev: np.ndarray
    k_mom: int

    def __init__(self, problem: MarginalProblem, settings: MirrorSettings,
                 theta0: np.ndarray | None) -> None:
        s = self.settings = settings
        self.t_start = time.perf_counter()
        self.problem, self.loss, self.total = problem, problem.loss, problem.total
        self.tau = _initial_tau(self.loss)
        self.table = IterationTable([("iter", "d"), ("loss", ".6e"), ("lower bd", ".6e"),
                                     ("rel gap", ".2e"), ("step", ".2e"), ("tau", ".1e"),
                                     ("time", ".2f")], s.verbose)
        self.table.header(f"cvxdp {s.algorithm} over the marginal polytope: "
                          f"{len(problem.tree.factors)} cliques, {self.loss.n:,} marginal cells; "
                          f"{problem.tree.summary()}")
        self.theta = np.zeros(self.loss.n) if theta0 is None else np.array(theta0, dtype=float)
        self.mu, self.log_z = problem.oracle(self.theta)
        self.best_lb = -math.inf
        self.history: list[dict] = []
        self.lip = self.loss.lipschitz(problem.offsets, self.total, self.tau)
        self.setup_time = time.perf_counter() - self.t_start
        self.it = 0
        self.eta: float | None = None         # the step (mirror descent and accelerated)
        self.polished: PolishResult | LPResult | None = None
        self.qp: LocalPolytopeQP | None = None
        self.polish_at = _first_polish(problem, s)
        self.polish_log: list[dict] = []
        self.duals: dict[str, np.ndarray] = {}
        self.lp_fallback: list[tuple[float, LPResult]] = []
        self.exact_tried = False              # the exact program of lp.py (tried once)

    # ---------------------------------------------------------------- the certificate
    def converged(self, f_exact: float, gap: float) -> bool:
        """The stopping test on the certified gap ``gap`` at the exact loss ``f_exact``."""
        s = self.settings
        return within_tolerance(f_exact, gap, s.eps_abs, s.eps_rel)

    def check_due(self) -> bool:
        """A convergence check every ``check_every`` iterations and at the last one."""
        return self.it % self.settings.check_every == 0 or self.it == self.settings.max_iters

    def out_of_budget(self) -> bool:
        """``max_iters`` iterations run, or ``time_limit`` seconds spent."""
        s = self.settings
        return self.it >= s.max_iters or time.perf_counter() - self.t_start >= s.time_limit

    def user_stop(self, row: dict) -> bool:
        """The user's callback, given the table row and ``x``, asks to stop."""
        cb = self.settings.callback
        return cb is not None and bool(cb(dict(row, x=self.mu)))

    def check(self, f_smooth: float, lams, step: float) -> tuple[dict, float, float]:
        """Certify the current ``mu`` (exact loss, best lower bound), log a table row;
        returns ``(row, exact loss, certified gap)``."""
        f_exact = f_smooth if self.tau == 0 else self.loss.value(self.mu)
        lb = self.problem.lower_bound(lams)
        if lb > self.best_lb:
            # the loss duals behind the best bound (Huber slopes: valid for the exact L1 too),
            # a candidate for the constraint's multipliers when the point's own gradient is not
            self.best_lb = lb
            self.duals["bound"] = np.concatenate([np.asarray(v, dtype=float) for v in lams])
        gap = f_exact - self.best_lb
        row = dict(iter=self.it, loss=f_exact, **{"lower bd": self.best_lb,
                   "rel gap": relative(gap, f_exact)}, step=step, tau=self.tau,
                   time=time.perf_counter() - self.t_start)
        self.history.append(row)
        self.table.row(row)
        return row, f_exact, gap

    def certify(self, f_smooth: float, lams, step: float) -> tuple[str | None, dict, float]:
        """A convergence check: :meth:`check`, then, when it is due, a polish attempt
        (:meth:`try_polish` for a quadratic loss, then as ``on_polish_failure`` says when it
        fails; :meth:`try_lp_polish` at once with L1 terms).
        Returns ``(status to stop with or None, row, certified gap)``."""
        row, f_exact, gap = self.check(f_smooth, lams, step)
        if self.converged(f_exact, gap):
            return R.OPTIMAL, row, gap
        if self.polish_at is not None and self.it >= self.polish_at:
            status = self.try_polish(self.theta) if self.loss.smooth else None
            then = self.settings.on_polish_failure if self.loss.smooth else "exact"
            if status is None and then == "stop":
                status = R.OPTIMAL_INACCURATE
            elif status is None and then == "exact" and not self.exact_tried:
                status = self.try_lp_polish()
            if status is not None:
                return status, row, gap
        return None, row, gap

    # ---------------------------------------------------------------- mirror descent
    def mirror_descent(self, step0: float | None) -> str:
        """Algorithm 1 with the backtracking line search, or its accelerated variant (module
        docstring); returns the status."""
        s, loss = self.settings, self.loss
        self.eta = step0 or s.step or (1.0 / self.lip if self.lip > 0 else 1.0)
        self.f, self.g, self.lams = loss.value_grad(self.mu, self.tau)
        self.theta_prev, self.k_mom = self.theta, 0
        growth = _STEP_GROWTH[s.algorithm]
        while True:
            if self.check_due():
                status = self.mirror_check()
                if status is not None:
                    return status
            if self.out_of_budget():
                return R.OPTIMAL_INACCURATE
            y = self.extrapolate()
            step = self.backtrack(y)
            if step is None:                          # no step passes: roundoff level reached
                return self.roundoff_status()
            self.accept(step, growth)

    def mirror_check(self) -> str | None:
        """The convergence check of mirror descent: :meth:`certify`, then a sharper Huber
        width when the smoothing, not the optimisation, holds the gap up, then the user's
        callback.  Returns the status to stop with, or ``None``."""
        status, row, gap = self.certify(self.f, self.lams, self.eta)
        if status is not None:
            return status
        if self.tau > 0 and (self.f - self.best_lb) < 0.25 * gap:
            # smoothing error dominates: sharpen, and shrink the step with the curvature
            self.tau *= _TAU_SHRINK
            self.eta *= _TAU_SHRINK
            self.f, self.g, self.lams = self.loss.value_grad(self.mu, self.tau)
        if self.user_stop(row):
            return R.USER_LIMIT
        return None

    def roundoff_status(self) -> str:
        """The status when no step passes the line search (roundoff level reached): optimal
        if the current point is certified, else optimal_inaccurate."""
        f_exact = self.f if self.tau == 0 else self.loss.value(self.mu)   # judge the exact, not the smoothed, loss
        return R.OPTIMAL if self.converged(f_exact, f_exact - self.best_lb) else R.OPTIMAL_INACCURATE

    def extrapolate(self) -> _Anchor:
        """The point the next step starts from: the iterate, or (accelerated) the extrapolated
        point ``theta + k/(k+3) (theta - theta_prev)`` unless its loss exceeds the iterate's."""
        y = _Anchor(self.theta, self.mu, self.log_z, self.f, self.g)
        if self.settings.algorithm == "accelerated" and self.k_mom > 0:
            theta_y = self.theta + (self.k_mom / (self.k_mom + 3.0)) * (self.theta - self.theta_prev)
            mu_y, lz_y = self.problem.oracle(theta_y)
            f_y, g_y, _ = self.loss.value_grad(mu_y, self.tau)
            if f_y > self.f:                          # adaptive restart: drop the momentum
                self.k_mom = 0
            else:
                y = _Anchor(theta_y, mu_y, lz_y, f_y, g_y)
        return y

    def backtrack(self, y: _Anchor) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The mirror step ``theta+ = y - eta g``, ``eta`` halved from the current one until
        the step passes the Bregman upper model
        ``L(mu+) <= L(mu) + <g, mu+ - mu> + D(mu+, mu) / eta``, ``D = N KL`` read off the
        log-partition functions; ``(theta+, mu+, log Z+)``, or ``None`` when no trial passes."""
        loss, N = self.loss, self.total
        gmu = float(np.dot(y.g, y.mu))
        for _ in range(_MAX_BACKTRACKS):
            theta_new = y.theta - self.eta * y.g
            mu_new, log_z_new = self.problem.oracle(theta_new)
            f_new = loss.value(mu_new, self.tau)
            g_new_mu = float(np.dot(y.g, mu_new))
            bregman = max(0.0, -self.eta * g_new_mu + N * (y.log_z - log_z_new))
            # roundoff allowance on the scale of the terms compared
            slack = 1e-12 * (abs(y.f) + abs(gmu) + abs(g_new_mu))
            if f_new <= y.f + g_new_mu - gmu + bregman / self.eta + slack:
                return theta_new, mu_new, log_z_new
            self.eta *= _STEP_SHRINK
        return None

    def accept(self, step: tuple[np.ndarray, np.ndarray, float], growth: float) -> None:
        """Move to the accepted step, grow the step size, update the momentum counter."""
        self.theta_prev = self.theta
        f_old = self.f
        self.theta, self.mu, self.log_z = step
        self.f, self.g, self.lams = self.loss.value_grad(self.mu, self.tau)
        self.eta *= growth
        self.k_mom = self.k_mom + 1 if self.f <= f_old else 0    # function restart (O'Donoghue & Candes)
        self.it += 1

    # ---------------------------------------------------------------- dual averaging
    def dual_averaging(self) -> str:
        """Algorithm 2 (Nesterov / Xiao 2010) with the loss's Lipschitz constant; returns the
        status."""
        loss, lip = self.loss, self.lip
        gbar = np.zeros(loss.n)
        nu = self.mu.copy()
        f_mu, g_mu, lams = loss.value_grad(self.mu, self.tau)
        while True:
            if self.check_due():
                status, row, _ = self.certify(f_mu, lams, 1.0 / lip)   # polish: L1 terms only
                if status is not None:
                    return status
                if self.user_stop(row):
                    return R.USER_LIMIT
            if self.out_of_budget():
                return R.OPTIMAL_INACCURATE
            t = self.it + 1
            c = 2.0 / (t + 1)
            omega = (1 - c) * self.mu + c * nu
            _, g_om, _ = loss.value_grad(omega, self.tau)
            gbar = (1 - c) * gbar + c * g_om
            self.theta = -t * (t + 1) / (4.0 * lip) * gbar
            nu, self.log_z = self.problem.oracle(self.theta)
            self.mu = (1 - c) * self.mu + c * nu
            self.it += 1
            if self.check_due():
                f_mu, g_mu, lams = loss.value_grad(self.mu, self.tau)

    # ---------------------------------------------------------------- polish
    def try_polish(self, theta_now: np.ndarray) -> str | None:
        """Active-set polish from the model at ``theta_now``: the status to stop with, or
        ``None`` (then mirror descent goes on; the bound it found is kept)."""
        loss, P, s = self.loss, self.problem, self.settings
        t0 = time.perf_counter()
        self.polish_at = 2 * max(self.it, 1)
        spent = sum(e["seconds"] for e in self.polish_log)
        budget = max(_POLISH_MIN_SECONDS, _POLISH_TIME_RATIO * (t0 - self.t_start - spent)) - spent
        if budget <= 0:
            return None
        if self.qp is None:
            self.qp = LocalPolytopeQP(P.tree, loss, self.total)
        _, probs, _ = P.tree.marginals(P.split(theta_now), 1.0)
        pol = self.qp.polish(np.concatenate([b.ravel() for b in probs]), threshold=_POLISH_THRESHOLD,
                             deadline=min(t0 + budget, self.t_start + s.time_limit))
        entry = dict(iter=self.it, seconds=time.perf_counter() - t0, rounds=None, gap=None)
        self.polish_log.append(entry)
        if pol is None:
            self.table.footer(f"polish at iteration {self.it}: the active set did not settle "
                              f"({entry['seconds']:.2f} s); mirror descent continues")
            return None
        f_p, _, lams_p = loss.value_grad(pol.mu)
        self.best_lb = max(self.best_lb, P.lower_bound(lams_p))
        gap_p = f_p - self.best_lb
        entry.update(rounds=pol.rounds, gap=relative(gap_p, f_p), support=pol.support)
        ok = self.converged(f_p, gap_p)
        if not ok and gap_p > _POLISH_FLOOR * abs(f_p):
            self.table.footer(f"polish at iteration {self.it}: certified gap {entry['gap']:.1e} "
                              f"after {pol.rounds} rounds; mirror descent continues")
            return None
        self.polished, self.mu = pol, pol.mu
        return self.finish(f_p, entry["gap"], ok,
                           f"polish at iteration {self.it}: {pol.rounds} active-set rounds, "
                           f"{pol.support:,} cells in the support, consistency residual "
                           f"{pol.residual:.1e}")

    def try_lp_polish(self) -> str | None:
        """The exact solve of the loss on the local polytope (:mod:`cvxdp.solvers.marginal.lp`:
        an LP / interior-point QP with L1 terms, the interior point for a quadratic loss whose
        active-set polish failed), once: the status to stop with, or ``None`` (mirror descent
        goes on; a bound found is kept).  With L1 terms it is the only finish, so it gets at
        least ``_LP_MIN_SECONDS``; a quadratic loss keeps its active-set retries, and the
        interior point gets the polish budget (``_POLISH_MIN_SECONDS``, or twice the time so
        far)."""
        loss, P, it = self.loss, self.problem, self.it
        self.exact_tried = True
        what, kind = ("exact QP solve", "ipm") if loss.smooth else ("exact L1 solve", "lp")
        if not loss.smooth:
            self.polish_at = None
        t0 = time.perf_counter()
        floor = _POLISH_MIN_SECONDS if loss.smooth else _LP_MIN_SECONDS
        budget = max(floor, _POLISH_TIME_RATIO * (t0 - self.t_start))
        entry = dict(iter=it, seconds=0.0, rounds=None, gap=None, kind=kind)
        self.polish_log.append(entry)
        try:
            lp = LocalPolytopeLP(P.tree, loss, self.total)
        except ValueError as exc:                      # above MAX_LP_SIZE
            entry.update(seconds=time.perf_counter() - t0, skipped=str(exc))
            self.table.footer(f"{what} skipped: {exc}; mirror descent continues")
            return None
        pol = lp.solve(deadline=min(t0 + budget, self.t_start + self.settings.time_limit))
        entry["seconds"] = time.perf_counter() - t0
        if pol is None:
            self.table.footer(f"{what} at iteration {it} failed ({entry['seconds']:.2f} s); "
                              f"mirror descent continues")
            return None
        f_p = loss.value(pol.mu)
        lb_p = P.lower_bound(pol.lams)
        if pol.alt_lams is not None:
            lb_p = max(lb_p, P.lower_bound(pol.alt_lams))
        self.best_lb = max(self.best_lb, lb_p)
        gap_p = f_p - self.best_lb
        entry.update(rounds=pol.iterations, gap=relative(gap_p, f_p), method=pol.method,
                     support=int(sum(int(np.count_nonzero(t)) for t in pol.x)),
                     solver_bound=pol.dual_bound, certified_bound=lb_p, repaired=pol.repaired)
        ok = self.converged(f_p, gap_p)
        if not ok and gap_p > _POLISH_FLOOR * abs(f_p):
            self.table.footer(f"{what} ({pol.method}) at iteration {it}: certified gap "
                              f"{entry['gap']:.1e}; mirror descent continues")
            self.lp_fallback.append((f_p, pol))        # returned if mirror descent ends worse
            return None
        self.keep_lp(pol)
        return self.finish(f_p, entry["gap"], ok,
                           f"{what} ({pol.method}) at iteration {it}: {pol.iterations} "
                           f"iterations, {entry['seconds']:.2f} s, consistency residual "
                           f"{pol.residual:.1e}")

    def keep_lp(self, pol: LPResult) -> None:
        """Take the exact solve's point and its multipliers as the result."""
        self.polished, self.mu = pol, pol.mu
        self.duals.update(lp_duals(pol))

    def finish(self, f_p: float, rel_gap: float, ok: bool, note: str) -> str:
        """Log an accepted exact finish (``mu`` already set) and return its status."""
        row = dict(iter=self.it, loss=f_p, **{"lower bd": self.best_lb, "rel gap": rel_gap},
                   time=time.perf_counter() - self.t_start)
        self.history.append(dict(row, polished=True))
        self.table.row(row)
        self.table.footer(note)
        if self.settings.callback is not None:
            self.settings.callback(dict(row, x=self.mu))
        return R.OPTIMAL if ok else R.OPTIMAL_INACCURATE

    # ---------------------------------------------------------------- the result
    def result(self, status: str) -> R.SolverResult:
        """The exact L1 fallback if it beats the last iterate, the final footer and the
        :class:`SolverResult` (``info["theta"]`` is ``None`` after an exact finish)."""
        s, loss = self.settings, self.loss
        if (self.polished is None and self.lp_fallback and status != R.OPTIMAL
                and self.lp_fallback[0][0] < loss.value(self.mu)):
            self.keep_lp(self.lp_fallback[0][1])   # an uncertified exact solve beats the last iterate
            self.table.footer("the exact solve's point has the lower loss: it is returned")
        polished = self.polished
        model_theta = None if polished is not None else self.theta
        f_final = loss.value(self.mu)
        gap = f_final - self.best_lb
        self.table.footer(f"status {status}: loss {f_final:.8e}, certified lower bound "
                          f"{self.best_lb:.8e}, {self.it} iterations, "
                          f"{time.perf_counter() - self.t_start:.2f} s")
        return R.SolverResult(
            x=self.mu, status=status, objective=f_final, lower_bound=self.best_lb,
            gap=gap / max(abs(f_final), 1.0), iterations=self.it, duals=self.duals,
            setup_time=self.setup_time,
            solve_time=time.perf_counter() - self.t_start - self.setup_time,
            history=self.history,
            primal_residual=0.0 if polished is None else polished.residual,
            info=dict(algorithm=s.algorithm, theta=model_theta, lipschitz=self.lip, tau=self.tau,
                      abs_gap=gap, clique_tables=None if polished is None else polished.x,
                      polish=self.polish_log),
            state=dict(theta=self.theta if s.algorithm != "dual_averaging" else model_theta,
                       step=self.eta))
