"""What a cvxdp method interface provides and returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import cvxpy as cp


@dataclass
class Outcome:
    """A method's result keyed by cvxpy variable and constraint ids, ready to write back."""

    status: str
    primal: dict[int, Any]
    objective: float
    iterations: int
    solve_time: float
    setup_time: float
    extra: dict[str, Any] = field(default_factory=dict)
    duals: dict[int, Any] = field(default_factory=dict)


class Method(Protocol):
    """A structure-exploiting method: ``recognise`` raises ``NotRecognised`` or
    returns what ``solve`` needs; ``solve`` returns an :class:`Outcome`."""

    name: str
    extra_options: dict[str, str]

    def recognise(self, problem: cp.Problem) -> Any: ...

    def solve(self, problem: cp.Problem, extraction: Any, opts: dict[str, Any]) -> Outcome: ...
