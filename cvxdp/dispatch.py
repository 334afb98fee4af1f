"""``prob.solve(method="cvxdp", solver=...)``: recognise -> extract -> solve -> write back.

``solver`` is a cvxdp method name (:data:`ADMM`) or any cvxpy solver name, which
is passed straight to ``Problem.solve``.  ``solver=None`` takes the first cvxdp
method that recognises the problem, then :mod:`cvxdp.cost_model` decides between it and
Clarabel by their expected times (small problems go to Clarabel); the choice and why are in
``solver_stats.extra_stats["choice"]``.  A problem the chosen method does not
recognise raises :class:`cvxdp.NotRecognised`; ``fallback=cp.CLARABEL`` opts in
to solving it with a standard solver instead.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import numpy as np
import cvxpy as cp

from . import cost_model
from .errors import NotRecognised
from .methods import certify
from .methods.base import Method, Outcome, Recognised, extra_stats
from .methods.certify import check_point
from .methods.compat import annotate_extra_stats, set_status, write_solution
from .methods.input_check import check_problem_data
from .methods.options import SHARED_NAMES
from .methods.registry import METHODS, method_for
from .methods.warm_start import CACHE, fingerprint
from .names import ADMM, MIRROR_DESCENT, NEWTON_CG
from .solvers.result import SOLUTION_PRESENT

__all__ = ["solve", "ADMM", "NEWTON_CG", "MIRROR_DESCENT", "METHODS"]

LOGGER = logging.getLogger("cvxdp")

#: options every cvxdp method understands
SHARED_OPTIONS = SHARED_NAMES
# cvxpy's own Problem.solve keywords that make sense only for its solvers
_CVXPY_ONLY = ("gp", "qcp", "requires_grad", "enforce_dpp", "ignore_dpp", "canon_backend")


def solve(problem: cp.Problem, solver: str | None = None, *, fallback: str | None = None,
          verify: str | None = None, warm_start: bool = True, verbose: bool = False,
          max_iters: int | None = None, eps_abs: float | None = None,
          eps_rel: float | None = None, time_limit: float | None = None,
          callback: Callable[[dict], bool] | None = None, duals: bool = True,
          **kwargs: Any) -> float:
    """Solve ``problem`` with a cvxdp method or a standard cvxpy solver.

    Parameters
    ----------
    solver : ``cvxdp.ADMM``, ``cvxdp.MIRROR_DESCENT``, ``cvxdp.NEWTON_CG``, any cvxpy solver
        name, or ``None``: the first cvxdp method that recognises the problem, or Clarabel
        where the cost model (:mod:`cvxdp.cost_model`) expects it to be faster (small
        problems).  A method's own options, ``callback`` or ``verify`` keep the cvxdp method.
    fallback : a cvxpy solver to use when no cvxdp method recognises the problem.
    verify : a cvxpy solver that re-solves the problem after a cvxdp method; the
        objective gap and the largest difference in variable values are recorded
        in ``problem.solver_stats.extra_stats["verify"]``.
    warm_start : start from ``Variable.value`` and the method's cached state (kept per
        problem and method, and dropped when a Parameter's value changes).
    verbose : log a per-iteration table to ``logging.getLogger("cvxdp")``.
    max_iters, eps_abs, eps_rel, time_limit : stopping rules; ``None`` takes the method's
        default.  ``eps_abs`` is the largest constraint violation allowed in the returned
        point, ``eps_rel`` the largest certified gap ``(f - L) / max(1, |f|)``: status
        ``optimal`` means both hold (checked on the point by cvxpy itself).
    callback : ``callback(info) -> bool`` called at every convergence check;
        returning True stops with status ``user_limit``.
    duals : ``False``: no dual values are written (every constraint's ``dual_value`` is
        ``None``, whichever solver ran) and a cvxdp method skips the work it does only for
        exact multipliers; ``optimal`` still certifies the point and the gap.
    kwargs : method-specific options (``cvxdp.METHODS[name].options.describe()`` lists
        them), or, for a cvxpy solver, anything ``Problem.solve`` accepts.

    Returns the optimal value, like ``Problem.solve``.  Unknown or out-of-range options
    raise ``ValueError`` naming the option; NaN, inf or complex data raise ``ValueError``
    naming the term, before any work.
    """
    if not isinstance(problem, cp.Problem):
        raise TypeError(f"solve: problem must be a cvxpy Problem, got {type(problem).__name__}")
    method = method_for(solver)
    shared = dict(max_iters=max_iters, eps_abs=eps_abs, eps_rel=eps_rel, time_limit=time_limit)
    if not isinstance(duals, (bool, np.bool_)):
        raise ValueError(f"solve: option duals={duals!r} is not allowed; expected True or False")
    if solver is not None and method is None:
        return _without_duals(problem, duals, _passthrough(problem, solver, warm_start, verbose,
                                                            kwargs, **shared))
    given = _validated(method, kwargs, shared, warm_start=warm_start, verbose=verbose,
                       callback=callback, verify=verify, fallback=fallback, duals=bool(duals))
    t0 = time.perf_counter()
    check_problem_data(problem)
    value, early = _standard_first(problem, solver, given, kwargs, callback, verify,
                                   warm_start, verbose, shared)
    if value is not None:
        return value
    chosen, recognised = _recognise(problem, method, fallback, verbose)
    if chosen is None:
        return _without_duals(problem, duals, _passthrough(problem, fallback, warm_start, verbose,
                                                            _strip_cvxdp(kwargs)))
    settings = chosen.options.parse(given)
    choice = early or _choose(solver, chosen, recognised, kwargs, callback, verify)
    compile_time = time.perf_counter() - t0
    if verbose:
        _ensure_handler()
        LOGGER.info("cvxdp: %s recognised the problem (%.3f s); %s: %s", chosen.name,
                    compile_time, choice["solver"] or chosen.name, choice["reason"])
    if choice["solver"] not in (chosen.name, None):
        value = _solve_standard(problem, choice, warm_start, verbose, settings.eps_abs, **shared)
        if problem.status not in _HAND_BACK:
            return _without_duals(problem, duals, value)
        choice = _instead(choice, problem.status)
    return _run(problem, chosen, recognised, settings, compile_time,
                {**choice, "solver": choice["solver"] or chosen.name})


def _validated(method: Method | None, kwargs: dict, shared: dict, **options) -> dict:
    """The options of a cvxdp solve, checked before any work: cvxpy's own solver keywords
    refused, and, when a method is named, every option validated by its option set."""
    bad = [k for k in kwargs if k in _CVXPY_ONLY and kwargs[k]]
    if bad:
        raise ValueError(f"option(s) {bad} apply to cvxpy's own solvers, not to cvxdp methods")
    given = {k: v for k, v in kwargs.items() if k not in _CVXPY_ONLY}
    given.update(shared, **options)
    if method is not None:
        method.options.parse(given)           # bad options fail before any work
    return given


def _standard_first(problem: cp.Problem, solver, given: dict, kwargs: dict, callback, verify,
                    warm_start: bool, verbose: bool, shared: dict) -> tuple[float | None, dict | None]:
    """``solver=None`` on a problem the cost model hands to the standard solver before
    recognition (:func:`_early_standard`): ``(value, None)`` when that solve stands;
    otherwise ``(None, choice)``, the choice to record (``None``: recognition decides)."""
    early = _early_standard(problem, solver, given, kwargs, callback, verify)
    if early is None:
        return None, None
    if verbose:
        _ensure_handler()
        LOGGER.info("cvxdp: %s: %s", early["solver"], early["reason"])
    limit = early.pop("eps_abs")
    value = _solve_standard(problem, early, warm_start, verbose, limit, **shared)
    if problem.status not in _HAND_BACK:
        return _without_duals(problem, given["duals"], value), None
    return None, _instead(early, problem.status)


def _run(problem: cp.Problem, chosen: Method, recognised: Recognised, settings,
         compile_time: float, choice: dict) -> float:
    """The cvxdp method's solve, from the warm-start cache's state for this data, certified
    and written back (:func:`_finish`)."""
    digest = fingerprint(problem)           # Parameter values are hashed once per solve
    cached = CACHE.get(problem, chosen.name, digest) if settings.warm_start else None
    outcome = chosen.solve(problem, recognised, settings, cached=cached)
    CACHE.put(problem, chosen.name, outcome.state, digest)
    _finish(problem, chosen.name, outcome, settings, compile_time, choice)
    if settings.verbose:
        LOGGER.info("cvxdp: status %s, objective %.10g", problem.status, problem.value)
    return problem.value


def _recognise(problem: cp.Problem, method: Method | None, fallback,
               verbose) -> tuple[Method | None, Recognised | None]:
    """The first method that recognises ``problem`` and what it recognised; ``(None, None)``
    when none does and a fallback solver was given."""
    errors = []
    for m in [method] if method is not None else list(METHODS.values()):
        try:
            return m, m.recognise(problem)
        except NotRecognised as exc:
            errors.append(exc)
    if fallback is not None:
        if verbose:
            _ensure_handler()
            LOGGER.info("cvxdp: no method recognises the problem; solving with %s", fallback)
        return None, None
    if len(errors) == 1:
        raise errors[0]
    raise NotRecognised("cvxdp", "; or ".join(e.expected for e in errors),
                        "; ".join(e.found for e in errors))


def _choose(solver, chosen: Method, recognised: Recognised, kwargs: dict, callback,
            verify) -> dict:
    """``extra_stats["choice"]``: a named method is never second-guessed; for ``solver=None``
    the cost model decides, unless an option only the cvxdp method understands was given."""
    if solver is not None:
        return {"solver": chosen.name, "reason": f"solver={solver!r} given"}
    pinned = _pinned(chosen, kwargs, callback, verify)
    return cost_model.choose(chosen.name, recognised, pinned=pinned).as_dict()


def _pinned(method: Method, kwargs: dict, callback, verify) -> str | None:
    """Why the user's options need the cvxdp method (``None``: nothing does)."""
    own = sorted(k for k in kwargs if k in method.options.own)
    return (f"option(s) {own} of {method.name} given" if own
            else "callback given" if callback is not None
            else f"verify={verify!r} given" if verify is not None else None)


def _early_standard(problem: cp.Problem, solver, given: dict, kwargs: dict, callback,
                    verify) -> dict | None:
    """``solver=None`` on a polytope problem the cost model hands to the standard solver,
    decided before recognition (:func:`cvxdp.cost_model.quick`): the choice, or ``None``
    (then recognition runs and decides as usual).  Options are validated first."""
    if solver is not None:
        return None
    found = cost_model.quick(problem)
    if found is None:
        return None
    name, choice = found
    m = METHODS[name]
    settings = m.options.parse(given)
    if choice.solver == name or _pinned(m, kwargs, callback, verify):
        return None
    return {**choice.as_dict(), "eps_abs": settings.eps_abs}


def _solve_standard(problem: cp.Problem, choice: dict, warm_start: bool, verbose: bool,
                    limit: float, **shared) -> float:
    """``solver=None`` chose a standard solver: cvxpy's own solve with the shared options in
    that solver's names; its statistics are cvxpy's, plus ``extra_stats["choice"]``, and its
    status is cvxpy's, held to cvxdp's ``optimal``: the point is checked by cvxpy like a cvxdp
    method's (``check_point``), and a violation beyond ``eps_abs`` (the method's default when
    not given; a standard solver's feasibility tolerance is relative to the data's norms)
    makes it ``optimal_inaccurate``, with ``extra_stats["violation"]`` and ``["reason"]``
    (``limit``: the ``eps_abs`` in force, given or the method's default)."""
    value = problem.solve(solver=choice["solver"], warm_start=warm_start, verbose=verbose,
                          **cost_model.standard_options(**shared))
    extra: dict[str, Any] = {"choice": choice}
    if problem.status == cp.OPTIMAL:
        chk = check_point(problem, {v.id: v.value for v in problem.variables()}, objective=False)
        extra["violation"] = chk.violation
        if chk.excess > limit:
            set_status(problem, cp.OPTIMAL_INACCURATE)
            extra["reason"] = (f"{choice['solver']}'s point violates {chk.worst} by "
                               f"{chk.excess:.3g} more than eps_abs {limit:.3g} allows")
    annotate_extra_stats(problem, extra)
    return value


#: statuses of the standard solver ``solver=None`` chose after which the cvxdp method solves
#: the problem after all: claims about the problem that nothing checks (measured: Clarabel
#: 0.11 says ``infeasible`` on a feasible 16-leaf tree problem with counts of 1e7 and 1e8).
#: A limit reached (``optimal_inaccurate``, ``user_limit``) stands: the user's limits hold
_HAND_BACK = (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE, cp.UNBOUNDED, cp.UNBOUNDED_INACCURATE)


def _instead(choice: dict, status: str) -> dict:
    """The choice after the standard solver ``solver=None`` chose returned ``status`` (one of
    :data:`_HAND_BACK`): the cvxdp method solves the problem after all, under its own
    contract (an infeasible problem gets its certificate there)."""
    return {**choice, "solver": None,
            "reason": f"{choice['solver']} returned {status!r}; the cvxdp method solves it "
                      f"instead (the cost model: {choice['reason']})"}


def _finish(problem: cp.Problem, name: str, outcome: Outcome, settings, compile_time,
            choice: dict) -> None:
    """Certify the outcome in cvxpy's terms (:mod:`cvxdp.methods.certify`), then write
    it back with the shared ``extra_stats``."""
    present = outcome.status in SOLUTION_PRESENT and bool(outcome.primal)
    check = certify.check_point(problem, outcome.primal) if present else None
    if check is not None and not check.finite:
        raise cp.error.SolverError(
            f"{name} produced a point with NaN or inf values (status {outcome.status}). "
            f"Please report this; pass fallback=cp.CLARABEL or solve with a standard solver.")
    status, gap, why = certify.decide(outcome.status, check, outcome.lower_bound,
                                      eps_abs=settings.eps_abs, eps_rel=settings.eps_rel)
    wanted = status == "optimal" and outcome.duals_certified and settings.duals
    duals = outcome.duals if wanted else {}
    outcome.duals_certified = bool(duals)
    objective = check.objective if check is not None else _opt_val(outcome)
    verify = None
    if settings.verify is not None and present:
        verify = _verify(problem, settings.verify, outcome.primal, objective)
    extra = extra_stats(name, outcome, objective=objective, gap=gap,
                        primal_residual=check.violation if check is not None else math.inf,
                        reason=why or outcome.reason, verify=verify, choice=choice)
    write_solution(problem, status=status, opt_val=objective, primal_vars=outcome.primal,
                   dual_vars=duals, solver_name=name, solve_time=outcome.solve_time,
                   setup_time=outcome.setup_time, num_iters=outcome.iterations,
                   extra_stats=extra, compilation_time=compile_time)


def _without_duals(problem: cp.Problem, duals: bool, value: float) -> float:
    """``duals=False`` after a standard solver: the duals it wrote are dropped, so that the
    option means the same whichever solver ran."""
    if not duals:
        for c in problem.constraints:
            for dv in c.dual_variables:
                dv.save_value(None)
    return value


def _opt_val(outcome) -> float:
    if outcome.status in ("infeasible", "infeasible_inaccurate"):
        return math.inf
    return float(outcome.objective)


def _strip_cvxdp(kwargs: dict) -> dict:
    extra = set()
    for m in METHODS.values():
        extra |= set(m.options.own)
    return {k: v for k, v in kwargs.items() if k not in extra}


def _passthrough(problem, solver, warm_start, verbose, kwargs, **shared) -> float:
    """Hand the problem to cvxpy's own solve; shared options are forwarded as given.
    ``MarginalPolytope`` canonicalises itself (its junction tree's local polytope), so this
    is exactly ``problem.solve(solver=...)``."""
    fwd = dict(kwargs)
    for k, v in shared.items():
        if v is not None:
            fwd[k] = v
    return problem.solve(solver=solver, warm_start=warm_start, verbose=verbose, **fwd)


def _verify(problem: cp.Problem, solver: str, primal: dict[int, Any],
            ours: float) -> dict[str, Any]:
    """Re-solve with a reference solver; report the objective gap and max |x - x_ref|."""
    ref = cp.Problem(problem.objective, problem.constraints)
    t0 = time.perf_counter()
    try:
        ref.solve(solver=solver)
    except cp.error.SolverError as exc:
        return {"solver": solver, "status": "solver_error", "error": str(exc)}
    elapsed = time.perf_counter() - t0
    out: dict[str, Any] = {"solver": solver, "status": ref.status, "time": elapsed,
                           "objective": ref.value}
    if ref.status in ("optimal", "optimal_inaccurate") and primal:
        diffs = [float(np.max(np.abs(np.asarray(v.value, dtype=float)
                                     - np.asarray(primal[v.id], dtype=float)), initial=0.0))
                 for v in ref.variables() if v.id in primal]
        out["max_abs_diff"] = max(diffs) if diffs else 0.0
        out["objective_gap"] = ours - float(ref.value)
        out["relative_objective_gap"] = (ours - float(ref.value)) / max(1.0, abs(float(ref.value)))
    return out


def _ensure_handler() -> None:
    """Like cvxpy: verbose output goes to stderr unless the user configured logging."""
    real = [h for h in LOGGER.handlers if not isinstance(h, logging.NullHandler)]
    if not real and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOGGER.addHandler(handler)
    if LOGGER.level == logging.NOTSET or LOGGER.level > logging.INFO:
        LOGGER.setLevel(logging.INFO)
