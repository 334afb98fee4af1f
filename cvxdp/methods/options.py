"""The options contract: every cvxdp method declares its settings here, validated alike.

Each option has a type, an allowed range, a default and a one-line meaning.  A method's
:class:`OptionSet` is the shared options (same meaning in every method, the defaults of
``max_iters`` / ``eps_abs`` / ``eps_rel`` may differ per method) plus its own.  Parsing the
keyword arguments of ``prob.solve(method="cvxdp", ...)`` against it either returns a
read-only :class:`Settings` or raises ``ValueError`` naming the option, the value given and
what is allowed, before any work is done (as OSQP and SCS validate at their boundary).

Shared options:

``max_iters``
    iterations at most (the method's own unit: ADMM / mirror-descent iterations, Newton steps);
``eps_abs``
    largest constraint violation allowed in the returned point (absolute, in the units of the
    constraint; see :mod:`cvxdp.methods.certify` for the rounding floor at large magnitudes);
``eps_rel``
    largest certified relative gap ``(f - L) / max(1, |f|)``, ``L`` a lower bound on the
    optimum proved by the method's dual point;
``time_limit``
    seconds of solve time at most;
``warm_start``
    start from ``Variable.value`` and from the method's cached state;
``verbose``
    a per-iteration table on ``logging.getLogger("cvxdp")``;
``callback``
    ``callback(info) -> bool`` at every check; ``True`` stops with ``user_limit``;
``verify``
    a cvxpy solver that re-solves the problem and records the differences;
``fallback``
    a cvxpy solver used when no cvxdp method recognises the problem;
``duals``
    compute and write the constraints' dual values (``False``: none are written, and a method
    skips the work it does only to find exact multipliers; ``optimal`` still means a feasible
    point with a certified gap).  Many re-solves whose duals nobody reads (a bootstrap) use it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

__all__ = ["Option", "OptionSet", "Settings", "shared_options", "STOPPING"]

_NUMBER = "number"
_INTEGER = "integer"


@dataclass(frozen=True)
class Option:
    """One option: ``kind`` is ``"integer"``, ``"number"``, ``"bool"``, ``"choice"``,
    ``"callable"``, ``"solver"`` (a cvxpy solver name) or ``"array"`` (a finite real
    matrix).  Numbers lie in ``[low, high]`` (ends excluded where ``*_open``); ``None``
    is allowed where ``nullable`` (it then means "the method's automatic choice")."""

    name: str
    kind: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    nullable: bool = False

    def allowed(self) -> str:
        """The allowed values in words, for error messages and docs."""
        if self.kind in (_NUMBER, _INTEGER):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            left = "(" if self.low_open or self.low is None else "["
            right = ")" if self.high_open or self.high is None else "]"
            what = "an integer" if self.kind == _INTEGER else "a number"
            out = f"{what} in {left}{lo}, {hi}{right}"
        elif self.kind == "choice":
            out = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "bool":
            out = "True or False"
        elif self.kind == "callable":
            out = "a callable"
        elif self.kind == "solver":
            out = "a cvxpy solver name (a string)"
        else:
            out = "a finite real matrix"
        return out + (" or None" if self.nullable else "")

    def validate(self, method: str, value: Any) -> Any:
        """``value`` (not ``None``: that means the default) converted to the option's type,
        or ``ValueError``."""
        return getattr(self, "_as_" + self.kind)(method, value)

    def _fail(self, method: str, value: Any, why: str = "") -> None:
        shown = repr(value) if not isinstance(value, np.ndarray) else f"array of shape {value.shape}"
        raise ValueError(f"{method}: option {self.name}={shown} is not allowed{why}; "
                         f"expected {self.allowed()} ({self.doc})")

    def _as_number(self, method: str, value: Any) -> float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            self._fail(method, value)
        v = float(value)
        if math.isnan(v) or not self._in_range(v):
            self._fail(method, value)
        return v

    def _as_integer(self, method: str, value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            self._fail(method, value)
        v = float(value)
        if not (math.isfinite(v) and v.is_integer()) or not self._in_range(v):
            self._fail(method, value)
        return int(v)

    def _in_range(self, v: float) -> bool:
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return not (self.high is not None and (v > self.high or (self.high_open and v == self.high)))

    def _as_bool(self, method: str, value: Any) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            self._fail(method, value)
        return bool(value)

    def _as_choice(self, method: str, value: Any) -> Any:
        if value not in self.choices:
            self._fail(method, value)
        return value

    def _as_callable(self, method: str, value: Any) -> Callable:
        if not callable(value):
            self._fail(method, value)
        return value

    def _as_solver(self, method: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            self._fail(method, value)
        return value

    def _as_array(self, method: str, value: Any) -> np.ndarray:
        try:
            arr = np.array(value, dtype=float)      # a copy: the caller's array is never touched
        except (TypeError, ValueError):
            self._fail(method, value, " (not a real matrix)")
        if np.iscomplexobj(value) or arr.ndim != 2 or not np.all(np.isfinite(arr)):
            self._fail(method, value, " (it must be a 2-d array of finite real numbers)")
        return arr


def shared_options(*, max_iters: int, eps_abs: float, eps_rel: float) -> list[Option]:
    """The options every method takes, with that method's defaults for the three numbers."""
    return [
        Option("max_iters", _INTEGER, max_iters, "iterations at most", low=1),
        Option("eps_abs", _NUMBER, eps_abs,
               "largest constraint violation allowed in the returned point", low=0, low_open=True,
               high=math.inf, high_open=True),
        Option("eps_rel", _NUMBER, eps_rel,
               "largest certified relative gap (f - L) / max(1, |f|)", low=0, low_open=True,
               high=math.inf, high_open=True),
        Option("time_limit", _NUMBER, math.inf, "seconds of solve time at most", low=0,
               low_open=True),
        Option("warm_start", "bool", True,
               "start from Variable.value and the method's cached state"),
        Option("verbose", "bool", False, "log a per-iteration table to the 'cvxdp' logger"),
        Option("callback", "callable", None,
               "callback(info) -> bool at every check; True stops with status user_limit",
               nullable=True),
        Option("verify", "solver", None,
               "a cvxpy solver that re-solves the problem to compare", nullable=True),
        Option("fallback", "solver", None,
               "a cvxpy solver for problems no cvxdp method recognises", nullable=True),
        Option("duals", "bool", True,
               "compute and write dual values (False: none, and no work spent on exact "
               "multipliers; optimal still certifies feasibility and the gap)"),
    ]


SHARED_NAMES = tuple(o.name for o in shared_options(max_iters=1, eps_abs=1.0, eps_rel=1.0))
#: the shared options every numerical solver's settings take under the same names
STOPPING = ("max_iters", "eps_abs", "eps_rel", "time_limit", "verbose", "callback")


class Settings(Mapping[str, Any]):
    """Validated, read-only settings of one solve: ``settings.rho`` or ``settings["rho"]``."""

    def __init__(self, method: str, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_method", method)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._method} has no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._method}, {self._values!r})"

    def pick(self, *names: str) -> dict[str, Any]:
        """``{name: value}`` of the options named, to build a numerical solver's settings
        (``MySettings(**settings.pick(*STOPPING, "rho"))``)."""
        return {n: self._values[n] for n in names}


@dataclass
class OptionSet:
    """All options of one method: the shared ones and its own."""

    method: str
    options: dict[str, Option] = field(default_factory=dict)

    @classmethod
    def build(cls, method: str, *, max_iters: int, eps_abs: float, eps_rel: float,
              own: list[Option]) -> "OptionSet":
        opts = {o.name: o for o in shared_options(max_iters=max_iters, eps_abs=eps_abs,
                                                   eps_rel=eps_rel)}
        for o in own:
            if o.name in opts:
                raise ValueError(f"{method}: option {o.name} is shared and cannot be redeclared")
            opts[o.name] = o
        return cls(method, opts)

    @property
    def own(self) -> dict[str, Option]:
        return {k: o for k, o in self.options.items() if k not in SHARED_NAMES}

    def parse(self, given: Mapping[str, Any]) -> Settings:
        """Validate ``given`` (unset or ``None`` shared numbers take the defaults)."""
        unknown = sorted(k for k in given if k not in self.options)
        if unknown:
            raise ValueError(f"{self.method}: unknown option(s) {unknown}; known options: "
                             f"{sorted(self.options)}")
        values = {}
        for name, opt in self.options.items():
            raw = given.get(name)
            values[name] = opt.default if raw is None else opt.validate(self.method, raw)
        return Settings(self.method, values)

    def describe(self) -> str:
        """One line per option: name, default, allowed values, meaning."""
        return "\n".join(f"{o.name} (default {o.default!r}; {o.allowed()}): {o.doc}"
                         for o in self.options.values())
