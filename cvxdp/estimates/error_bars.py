"""Standard errors and confidence intervals for post-processed answers.

After ``prob.solve(...)``, ``cvxdp.error_bars(prob, queries=...)`` quantifies the noise of
linear queries ``q^T x`` of the solution (default: every entry of the variables).  The
noisy data of the model and its noise are known from its :class:`cvxdp.Measurement`\\ s (or
named with ``noise=`` for plain spellings), so:

* ``method="exact"``: where the estimate is linear in the noisy answers (squared losses,
  linear equalities, no inequality active: the generalised least-squares estimate), each
  query's variance follows from the sandwich formula ``Var(q^T xhat) = g^T Sigma g`` with
  ``g`` the gradient of ``q^T xhat`` in the answers (:mod:`.exact_errors`); intervals are
  ``estimate +- z_{(1+level)/2} std_err``, exact for Gaussian noise.
* ``method="bootstrap"``: the parametric bootstrap for any model cvxdp solves (``x >= 0``,
  L1 losses, order constraints, the local polytope, pipelines through a callable query):
  ``draws`` releases are simulated from the fitted answers with each measurement's own noise
  family and scale, the model is re-solved for each (through :func:`cvxdp.solve_many`, on
  Dask when given ``client=`` / ``scheduler=`` / ``workers=``, warm-started), and the
  spread of the re-estimated queries gives the standard error; intervals are
  ``"percentile"`` (the draws' quantiles), ``"basic"`` (reflected about the estimate:
  ``2 estimate - quantiles``), ``"bc"`` (bias-corrected percentile, Efron 1981) or
  ``"normal"``.
* ``method="auto"``: exact when the model has no inequality at all and is linear, the
  bootstrap otherwise; the result's ``method`` says which ran.
* ``method="relaxed"``: for a squared-loss model whose inequalities bound the estimate (a
  non-negative GLS, ``0 <= x <= u``): the exact interval of its *relaxation*, the same model
  without the inequalities (the GLS of the same release: linear and unbiased), clipped to the
  range the variables' bounds allow each query.  Near a bound, where the estimate is biased
  and the bootstrap around it under-covers (0.53-0.60 of nominal 0.9 on small non-zero cells
  of a sparse hierarchy), these cover 0.89-0.91 (``benchmarks/error_bars.py``), at several
  times the width.

A :class:`cvxdp.histograms.GLSResult` (the national-hierarchy GLS, which already carries
exact variances) is accepted too: its cells' intervals.
"""
from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from scipy.special import ndtr, ndtri

from ..modelling.histograms import GLSResult
from ..names import NAMES, canonical
from .many import solve_many
from .exact_errors import NotLinear, active_inequalities, exact_variances, relaxed_intervals
from .noise import NoiseSource, find_noise, fit_sources, substitute
from .queries import QuerySet, query_set, stacked_values

__all__ = ["ErrorBars", "error_bars"]

_METHODS = ("auto", "exact", "bootstrap", "relaxed")
_INTERVALS = ("normal", "percentile", "basic", "bc")
_SNAP = 1e-9                   # relative: bootstrap values this near zero are zero
_BOOTSTRAP_EPS_REL = 1e-4       # the re-solves' eps_rel by a cvxdp method, unless given


@dataclass(frozen=True)
class ErrorBars:
    """Standard errors and ``level`` confidence intervals of queries of a solution.

    ``estimate``, ``std_err``, ``lower``, ``upper``: one entry per query (the variable's
    shape for ``queries=None`` on one variable); ``method`` ``"exact"`` or
    ``"bootstrap"``; ``interval`` the interval's construction; ``draws`` the bootstrap
    draws used (0 for exact) and ``failed`` those whose re-solve did not end optimal
    (excluded); ``samples`` the re-estimated queries ``(draws, queries)`` of the bootstrap;
    ``route`` how the exact variances were computed; ``center``, for ``"relaxed"``, the
    relaxation's estimate the intervals are centred on; ``wall_time`` in seconds."""

    estimate: np.ndarray
    std_err: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float
    method: str
    interval: str
    draws: int = 0
    failed: int = 0
    samples: np.ndarray | None = None
    route: str = ""
    wall_time: float = 0.0
    center: np.ndarray | None = None

    def __repr__(self) -> str:
        k = int(np.size(self.estimate))
        extra = f", {self.draws} draws ({self.failed} failed)" if self.method == "bootstrap" else \
            f", {self.route}"
        return (f"ErrorBars({k} queries, {self.method}{extra}, {self.interval} "
                f"{self.level:.0%} intervals, median std_err {np.median(self.std_err):.4g})")


def _checked(level, method, draws, interval) -> None:
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or \
            not (0.0 < float(level) < 1.0):
        raise ValueError(f"error_bars: level must lie strictly between 0 and 1, got {level!r}")
    if method not in _METHODS:
        raise ValueError(f"error_bars: method must be one of {_METHODS}, got {method!r}")
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 2:
        raise ValueError(f"error_bars: draws must be an integer >= 2, got {draws!r}")
    if interval is not None and interval not in _INTERVALS:
        raise ValueError(f"error_bars: interval must be one of {_INTERVALS}, got {interval!r}")


def error_bars(prob, queries=None, level: float = 0.9, method: str = "auto", draws: int = 200,
               rng=None, client=None, *, noise=None, interval: str | None = None,
               solver: str | None = None, scheduler=None, workers: int | None = None,
               **solve_options) -> ErrorBars:
    """Standard errors and confidence intervals of linear queries of ``prob``'s solution.

    Parameters
    ----------
    prob : a solved ``cp.Problem`` (or a :class:`cvxdp.histograms.GLSResult`).
    queries : ``None`` (every entry of the variables), a matrix over the variables' entries
        (C order, as ``x.value.ravel()``), an affine cvxpy expression, or (bootstrap only) a
        callable ``f(prob) -> array`` evaluated after each re-solve.
    level : nominal coverage of the intervals.
    method : ``"auto"``, ``"exact"``, ``"bootstrap"`` or ``"relaxed"`` (module docstring).
    draws, rng : the bootstrap's number of simulated releases and its random generator (or
        seed).
    client, scheduler, workers : run the bootstrap's re-solves on Dask
        (:func:`cvxdp.solve_many`).
    noise : the noisy data of a plain-spelling model and its noise:
        ``{y_parameter: ("laplace", b)}`` or ``[(y_array, cvxdp.Measurement(...)), ...]``;
        models built with :func:`cvxdp.nll` know theirs.
    interval : ``"normal"`` (exact's only), ``"percentile"`` (bootstrap default), ``"basic"``,
        ``"bc"``.
    solver, solve_options : how the bootstrap re-solves (default: the solver of the last
        solve, ``duals=False``, and for a cvxdp method ``eps_rel=1e-4``); e.g.
        ``solver=cvxdp.ADMM, eps_rel=1e-5``.

    Returns an :class:`ErrorBars`.  ``ValueError`` names a bad argument; ``method="exact"``
    on an estimate that is not linear in the data says why and suggests the bootstrap.
    """
    t0 = time.perf_counter()
    _checked(level, method, draws, interval)
    if isinstance(prob, GLSResult):
        return _from_gls(prob, queries, float(level), method, interval, t0)
    if not isinstance(prob, cp.Problem):
        raise TypeError(f"error_bars: prob must be a solved cvxpy Problem, got {type(prob).__name__}")
    if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise ValueError(f"error_bars: the problem's status is {prob.status!r}: solve it to "
                         "optimality first")
    variables = prob.variables()
    z = stacked_values(variables)
    _check_current(prob)
    qs = query_set(queries, variables)
    sources = find_noise(prob, noise)
    est = qs.values(prob, z)
    if method == "relaxed":
        return _relaxed(prob, sources, qs, est, float(level), interval, t0)
    if method != "bootstrap":
        done = _exact(prob, sources, qs, est, float(level), method, interval, t0)
        if done is not None:
            return done
    fit_sources(prob, sources)
    return _bootstrap(prob, sources, qs, est, float(level), int(draws), rng,
                      interval or "percentile", dict(client=client, scheduler=scheduler,
                                                     workers=workers), solver, solve_options, t0)


def _check_current(prob: cp.Problem) -> None:
    """``ValueError`` if the variables no longer hold this problem's solution (another
    problem over the same variables was solved since): the error bars would be another
    estimate's."""
    now = prob.objective.value
    if prob.value is None or now is None:
        return
    now, then = float(now), float(prob.value)
    if not abs(now - then) <= 1e-6 * max(1.0, abs(then)):
        raise ValueError(f"error_bars: the variables no longer hold this problem's solution (its "
                         f"objective there is {now:.6g}, the solve reported {then:.6g}): another "
                         "problem over the same variables was solved since; solve this one again")


def _snap(a: np.ndarray) -> np.ndarray:
    """Entries within rounding of zero set to zero: a cell at its bound ``x >= 0`` comes back
    from a solver as 1e-11 or so, and an interval of such draws would exclude the bound."""
    scale = max(1.0, float(np.max(np.abs(a), initial=0.0)))
    return np.where(np.abs(a) <= _SNAP * scale, 0.0, a)


def _exact(prob, sources, qs, est, level, method, interval, t0) -> ErrorBars | None:
    """The exact error bars, or ``None`` when ``auto`` should take the bootstrap."""
    if interval not in (None, "normal"):
        if method == "exact":
            raise ValueError(f"error_bars: exact intervals are normal, got interval={interval!r}")
        return None
    if method == "auto" and active_inequalities(prob)[0] > 0:
        return None                 # not linear in the data away from this release
    if method == "auto" and any(s.family != "gaussian" for s in sources):
        return None                 # exact variances, but the normal interval is not exact
    try:
        var, route = exact_variances(prob, sources, qs)
    except NotLinear as err:
        if method == "exact":
            raise ValueError(f"error_bars: method='exact' does not apply: {err}") from None
        return None
    se = np.sqrt(np.maximum(var, 0.0))
    zq = float(ndtri(0.5 + level / 2.0))
    return ErrorBars(qs.shaped(est), qs.shaped(se), qs.shaped(est - zq * se),
                     qs.shaped(est + zq * se), level, "exact", "normal", route=route,
                     wall_time=time.perf_counter() - t0)


def _relaxed(prob, sources, qs, est, level, interval, t0) -> ErrorBars:
    """The relaxation's exact interval, clipped to each query's range under the bounds."""
    if interval not in (None, "normal"):
        raise ValueError(f"error_bars: relaxed intervals are normal, got interval={interval!r}")
    try:
        centre, var, low, high, route = relaxed_intervals(prob, sources, qs)
    except NotLinear as err:
        raise ValueError(f"error_bars: method='relaxed' does not apply: {err}") from None
    se = np.sqrt(np.maximum(var, 0.0))
    zq = float(ndtri(0.5 + level / 2.0))
    lo = np.clip(centre - zq * se, low, high)
    hi = np.clip(centre + zq * se, low, high)
    return ErrorBars(qs.shaped(est), qs.shaped(se), qs.shaped(lo), qs.shaped(hi), level,
                     "relaxed", "normal", route=f"relaxation without inequalities, {route}",
                     wall_time=time.perf_counter() - t0, center=qs.shaped(centre))


def _from_gls(res: GLSResult, queries, level, method, interval, t0) -> ErrorBars:
    if queries is not None:
        raise ValueError("error_bars: a GLSResult gives its cells' error bars (queries=None)")
    if method == "bootstrap" or interval not in (None, "normal"):
        raise ValueError("error_bars: a GLSResult has exact variances only (method 'exact' or "
                         "'auto', normal intervals)")
    if not np.all(np.isfinite(res.cell_variance)):
        raise ValueError("error_bars: the GLSResult was computed without variances "
                         "(cvxdp.histograms.gls(..., variances=True))")
    se = np.sqrt(np.maximum(res.cell_variance, 0.0))
    zq = float(ndtri(0.5 + level / 2.0))
    return ErrorBars(res.x.copy(), se, res.x - zq * se, res.x + zq * se, level, "exact", "normal",
                     route="tree GLS variances", wall_time=time.perf_counter() - t0)


def _default_solver(prob: cp.Problem, solver):
    if solver is not None:
        return solver
    name = getattr(prob.solver_stats, "solver_name", None) if prob.solver_stats else None
    if name in NAMES or name in cp.installed_solvers():
        return name
    return None


def _bootstrap(prob, sources: list[NoiseSource], qs: QuerySet, est, level, draws, rng, interval,
               where: dict, solver, solve_options, t0) -> ErrorBars:
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    params = {id(lf): cp.Parameter(s.shape, name=f"noisy{i}")
              for i, s in enumerate(sources) for lf in s.leaves[:1]}
    for s in sources:
        for lf in s.leaves[1:]:
            params[id(lf)] = params[id(s.leaves[0])]
    template, _ = substitute(prob, params)
    values = [{params[id(s.leaves[0])]: s.draw(gen) for s in sources} for _ in range(draws)]
    opts = dict(solve_options)
    chosen = _default_solver(prob, solver)
    if chosen is not None:
        opts["solver"] = chosen
    if canonical(chosen) is not None:
        # a certified gap of 1e-4 moves an estimate by far less than its standard error, and
        # takes about half the iterations of the default 1e-6 (measured on hierarchies)
        opts.setdefault("eps_rel", _BOOTSTRAP_EPS_REL)
    # nobody reads a draw's duals: their exact multipliers (an LP, a polish pursued for them)
    # were 60% of a draw's time on a 2^14-leaf L1 hierarchy
    opts.setdefault("duals", False)
    samples, failed = _solve_draws(prob, template, values, qs, where, opts)
    if samples.shape[0] < 2:
        raise ValueError(f"error_bars: only {samples.shape[0]} of {draws} bootstrap re-solves "
                         "ended optimal")
    samples, est = _snap(samples), _snap(est)
    se = samples.std(axis=0, ddof=1)
    lo, hi = _interval(samples, est, se, level, interval)
    return ErrorBars(qs.shaped(est), qs.shaped(se), qs.shaped(lo), qs.shaped(hi), level,
                     "bootstrap", interval, draws=samples.shape[0], failed=failed,
                     samples=samples, wall_time=time.perf_counter() - t0)


def _solve_draws(prob, template, values, qs: QuerySet, where: dict, opts) -> tuple[np.ndarray, int]:
    """The queries at each draw's re-solve ``(ok draws, k)`` and the number that failed
    (:func:`cvxdp.solve_many`: the template and the caller's problem are left as they were;
    a callable query reads the variables, whose values are restored afterwards)."""
    variables = prob.variables()
    res = solve_many(template, parameters=values, **{k: v for k, v in where.items() if v is not None},
                     **opts)
    rows, failed = [], 0
    saved = [v.value for v in variables]
    try:
        for o in res:
            if o.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
                failed += 1
                continue
            if qs.func is not None:
                for v in variables:
                    v.value = o.value_of(v)
            z = np.concatenate([np.asarray(o.value_of(v), dtype=float).ravel(order="F")
                                for v in variables]) if variables else np.zeros(0)
            rows.append(qs.values(prob, z))
    finally:
        for v, val in zip(variables, saved):
            v.value = val
    k = rows[0].size if rows else 0
    return (np.vstack(rows) if rows else np.zeros((0, k))), failed


def _interval(samples: np.ndarray, est: np.ndarray, se: np.ndarray, level: float, kind: str):
    a = (1.0 - level) / 2.0
    if kind == "normal":
        zq = float(ndtri(1.0 - a))
        return est - zq * se, est + zq * se
    if kind == "percentile":
        return np.quantile(samples, a, axis=0), np.quantile(samples, 1.0 - a, axis=0)
    if kind == "basic":
        return (2.0 * est - np.quantile(samples, 1.0 - a, axis=0),
                2.0 * est - np.quantile(samples, a, axis=0))
    B = samples.shape[0]                         # "bc": Efron's bias-corrected percentile
    below = (np.sum(samples < est, axis=0) + 0.5 * np.sum(samples == est, axis=0)) / B
    z0 = ndtri(np.clip(below, 0.5 / B, 1.0 - 0.5 / B))
    lo_p, hi_p = ndtr(2.0 * z0 + ndtri(a)), ndtr(2.0 * z0 + ndtri(1.0 - a))
    srt = np.sort(samples, axis=0)
    cols = np.arange(samples.shape[1])
    lo_i = np.clip(np.floor(lo_p * (B - 1)).astype(int), 0, B - 1)
    hi_i = np.clip(np.ceil(hi_p * (B - 1)).astype(int), 0, B - 1)
    return srt[lo_i, cols], srt[hi_i, cols]
