"""What a cvxdp method interface declares, receives and returns.

A method is three things (see :class:`Method`): an :class:`~cvxdp.methods.options.OptionSet`
(its validated settings), ``recognise`` (problem -> what the numerical layer needs, or
``NotRecognised``) and ``solve`` (-> one :class:`Outcome`).  :mod:`cvxdp.dispatch` does the
rest the same way for every method: input checks, option parsing, the warm-start cache,
the certification of the returned point (:mod:`cvxdp.methods.certify`), ``verify``, the
``extra_stats`` table (:func:`extra_stats`) and the write-back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import cvxpy as cp

from .options import OptionSet, Settings

__all__ = ["Outcome", "Method", "EXTRA_STATS_KEYS", "extra_stats"]


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


class Method(Protocol):
    """A structure-exploiting method."""

    name: str
    options: OptionSet

    def recognise(self, problem: cp.Problem) -> Any: ...

    def solve(self, problem: cp.Problem, extraction: Any, settings: Settings, *,
              cached: Any) -> Outcome: ...


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
