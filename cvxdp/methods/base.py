"""What a cvxdp method interface declares, receives and returns.

A *family interface* (:class:`Family`) is one kind of problem a method solves: its
validated settings (an :class:`~cvxdp.methods.options.OptionSet`), ``recognise`` (problem ->
what the numerical layer needs, or ``NotRecognised``), ``solve`` (-> one :class:`Outcome`)
and, for ``solver=None``'s cost model, ``cost`` (the family and size it will work on) and
``cost_before_recognition``.  A *method* (:class:`Method`) is what users name with
``solver=``: the families registered under that name (:mod:`cvxdp.methods.registry`), tried
in order, with one option set.  :mod:`cvxdp.dispatch` does the rest the same way for every
method: input checks, option parsing, the warm-start cache, the certification of the
returned point (:mod:`cvxdp.methods.certify`), ``verify``, the ``extra_stats`` table
(:func:`extra_stats`) and the write-back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import cvxpy as cp

from ..errors import NotRecognised, most_relevant
from ..names import short
from .options import OptionSet, Settings

__all__ = ["Outcome", "Family", "Method", "Recognised", "EXTRA_STATS_KEYS", "extra_stats"]


@dataclass
class Outcome:
    """A method's result keyed by cvxpy variable and constraint ids.

    ``objective`` and ``lower_bound`` are in the units of the user's objective.  ``duals``
    holds only multipliers that certify (KKT to tolerance); ``duals_certified`` says whether
    the method wrote any.  ``state`` is what a warm start of the same data resumes from
    (kept by the shared cache); ``info`` is method specific and lands in
    ``extra_stats["info"]``.
    """

    status: str
    primal: dict[int, Any]
    objective: float
    iterations: int
    solve_time: float
    setup_time: float
    lower_bound: float = -math.inf
    dual_residual: float = math.nan
    history: list = field(default_factory=list)
    duals: dict[int, Any] = field(default_factory=dict)
    duals_certified: bool = False
    state: Any = None
    warm_started: bool = False
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class Family(Protocol):
    """One family's interface to a method (a class per module of :mod:`cvxdp.methods`)."""

    #: the method it is registered under (a name of :mod:`cvxdp.names`)
    name: str
    #: what it solves, e.g. ``"local_polytope"``
    family: str
    #: the method's options: every family of one method shares one option set
    options: OptionSet

    def recognise(self, problem: cp.Problem) -> Any:
        """What the numerical layer needs, or :class:`~cvxdp.NotRecognised`."""

    def solve(self, problem: cp.Problem, extraction: Any, settings: Settings, *,
              cached: Any) -> Outcome:
        """Solve the recognised problem; ``cached`` is the state a previous solve of the same
        data left (:mod:`cvxdp.methods.warm_start`), or ``None``."""

    def cost(self, extraction: Any) -> tuple[str, int]:
        """``(family/loss, size)`` for the cost model (:mod:`cvxdp.cost_model`): the
        structure the solve will exploit and the number of unknowns it works on."""

    def cost_before_recognition(self, problem: cp.Problem) -> tuple[str, int] | None:
        """The same read off the problem without recognising it (a constraint that states
        the family), or ``None``: then recognition runs first."""

    def cost_candidates(self, extraction: Any) -> tuple[tuple[str, ...], int] | None:
        """``(families, size)``: the families/losses :meth:`cost` can return for this
        extraction, read without its structure detections (cheap), or ``None``.  When the
        cost model expects the standard solver faster on every one, it hands the problem
        over without asking :meth:`cost` (whose detections then would be wasted)."""


@dataclass
class Recognised:
    """A problem some family of a method recognised: the family and what it extracted."""

    family: Family
    extraction: Any


class Method:
    """A cvxdp method as users name it (``solver=cvxdp.ADMM``): the families registered
    under its name, tried in order, and their one option set."""

    def __init__(self, name: str, families: list[Family]) -> None:
        if not families:
            raise ValueError(f"method {name}: no family is registered under it")
        if any(f.options is not families[0].options for f in families):
            raise ValueError(f"method {name}: its families must share one option set (options "
                             f"are validated before the problem is recognised)")
        self.name = name
        self.families = tuple(families)
        self.options = families[0].options

    def recognise(self, problem: cp.Problem) -> Recognised:
        """The first family that recognises ``problem``; when none does, the
        :class:`~cvxdp.NotRecognised` of the family the problem was meant for."""
        errors = []
        for family in self.families:
            try:
                return Recognised(family, family.recognise(problem))
            except NotRecognised as exc:
                errors.append(exc)
        raise most_relevant(errors, short(self.name))

    def solve(self, problem: cp.Problem, recognised: Recognised, settings: Settings, *,
              cached: Any) -> Outcome:
        return recognised.family.solve(problem, recognised.extraction, settings, cached=cached)

    def __repr__(self) -> str:
        return f"Method({self.name!r}, families={[f.family for f in self.families]})"


#: the keys of ``solver_stats.extra_stats`` after any cvxdp method, in this order
EXTRA_STATS_KEYS = ("method", "objective", "lower_bound", "gap", "primal_residual",
                    "dual_residual", "iterations", "setup_time", "solve_time", "history",
                    "duals_certified", "warm_started", "reason", "verify", "choice", "info")


def extra_stats(method: str, outcome: Outcome, *, objective: float, gap: float,
                primal_residual: float, reason: str, verify: dict | None,
                choice: dict | None = None) -> dict[str, Any]:
    """The one ``extra_stats`` table every method reports (same keys, same meanings);
    ``choice`` is what ``solver=None`` chose and why (:mod:`cvxdp.cost_model`)."""
    return {"method": method, "objective": objective, "lower_bound": outcome.lower_bound,
            "gap": gap, "primal_residual": primal_residual,
            "dual_residual": outcome.dual_residual, "iterations": outcome.iterations,
            "setup_time": outcome.setup_time, "solve_time": outcome.solve_time,
            "history": outcome.history, "duals_certified": outcome.duals_certified,
            "warm_started": outcome.warm_started, "reason": reason, "verify": verify,
            "choice": choice, "info": outcome.info}
