"""What ``MarginalPolytope`` and ``LocalPolytope`` share: clique marginals as a cvxpy constraint.

Both constrain a set of clique marginals ``marginals[C]`` (cvxpy expressions shaped by the
clique's domain sizes, ``(n_a, n_b, ...)`` with entry ``[i, j, ...]`` counting the records with
``a = i, b = j, ...``, or flat in C order) to be consistent, non-negative and to share one
total; they differ in how much consistency they ask for (one table behind all of them, or
agreement on every shared attribute set) and in how they canonicalise.  This base class holds
argument checking, the cvxpy ``Constraint`` protocol, current values and the dual: the
multipliers ``y_C`` of ``marginals[C] == (the table's marginal on C)``, one array per clique.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint

from .domain import Domain

__all__ = ["CliqueMarginals"]


class CliqueMarginals(Constraint):
    """Base of :class:`cvxdp.MarginalPolytope` and :class:`cvxdp.LocalPolytope` (module
    docstring); ``total`` is a positive number, a scalar Parameter, or ``None`` (free)."""

    def __init__(self, marginals: Mapping[Any, cp.Expression], domain: Domain | Mapping[str, int],
                 total: float | cp.Parameter | None = None, *,
                 constr_id: int | None = None) -> None:
        label = type(self).__name__
        if not isinstance(domain, Domain):
            if not isinstance(domain, Mapping):
                raise TypeError(f"{label}: domain must be a cvxdp.Domain or a mapping "
                                f"name -> size, got {type(domain).__name__}")
            domain = Domain(domain)
        if not isinstance(marginals, Mapping) or not marginals:
            raise TypeError(f"{label}: marginals must be a non-empty mapping from "
                            "attribute tuples to cvxpy expressions")
        cliques, exprs = [], []
        for key, expr in marginals.items():
            clique = domain.clique(key)
            if clique in cliques:
                raise ValueError(f"{label}: clique {clique} appears twice")
            expr = cp.Expression.cast_to_const(expr) if not isinstance(expr, cp.Expression) else expr
            shape = domain.shape(clique)
            if tuple(expr.shape) not in (shape, (math.prod(shape),)):
                raise ValueError(f"{label}: the marginal of {clique} must have shape "
                                 f"{shape} or ({math.prod(shape)},), got {tuple(expr.shape)}")
            if expr.is_complex():
                raise ValueError(f"{label}: the marginal of {clique} must be real")
            cliques.append(clique)
            exprs.append(expr)
        if total is not None and not isinstance(total, cp.Parameter):
            try:
                total = float(total)
            except (TypeError, ValueError):
                raise TypeError(f"{label}: total must be a number, a Parameter or None, "
                                f"got {total!r}") from None
            if not (math.isfinite(total) and total > 0):
                raise ValueError(f"{label}: total must be positive and finite, got {total}")
        if isinstance(total, cp.Parameter) and total.size != 1:
            raise ValueError(f"{label}: a total Parameter must be scalar")
        self.domain = domain
        self.cliques: list[tuple[str, ...]] = cliques
        self.total = total
        super().__init__(exprs, constr_id)

    # ---------------------------------------------------------------- cvxpy protocol
    def name(self) -> str:
        return f"{type(self).__name__}({', '.join('(' + ', '.join(c) + ')' for c in self.cliques)})"

    def __repr__(self) -> str:
        return self.name()

    def __str__(self) -> str:
        return self.name()

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def is_dcp(self, dpp: bool = False) -> bool:
        if dpp:
            from cvxpy.utilities import scopes
            with scopes.dpp_scope():
                return all(a.is_affine() for a in self.args)
        return all(a.is_affine() for a in self.args)

    def is_dgp(self, dpp: bool = False) -> bool:
        return False

    def is_dqcp(self) -> bool:
        return self.is_dcp()

    def _options(self) -> dict[str, Any]:
        """Keyword arguments a copy needs besides marginals, domain and total."""
        return {}

    def get_data(self) -> list:
        return [self.domain, self.total, self._options(), self.id]

    def parameters(self) -> list[cp.Parameter]:
        """The marginals' Parameters, and the total when it is one: it is not an argument,
        but a new value is new data -- cvxpy's ``Problem.parameters()`` and so the warm-start
        cache's fingerprint and the input checks must see it (they did not: a state computed
        for one total was reused for another)."""
        params = super().parameters()
        if isinstance(self.total, cp.Parameter) and not any(p is self.total for p in params):
            params = params + [self.total]
        return params

    def copy(self, args=None, id_objects=None):
        args = self.args if args is None else args
        return type(self)(dict(zip(self.cliques, args)), self.domain, self.total,
                          constr_id=self.id, **self._options())

    # ---------------------------------------------------------------- values
    @property
    def fitted_total(self) -> float | None:
        """The total of the current marginal values (the first marginal's sum; ``None``
        before a solve): the optimised total when ``total`` is ``None``."""
        tabs = self.tables()
        return None if tabs is None else float(tabs[0].sum())

    def known_total(self) -> float | None:
        label = type(self).__name__
        if self.total is None:
            return None
        if isinstance(self.total, cp.Parameter):
            if self.total.value is None:
                raise ValueError(f"{label}: the total Parameter has no value")
            v = float(self.total.value)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{label}: total must be positive and finite, got {v}")
            return v
        return float(self.total)

    def tables(self) -> list[np.ndarray] | None:
        """Current values of the marginals as arrays shaped by their cliques."""
        out = []
        for c, a in zip(self.cliques, self.args):
            if a.value is None:
                return None
            out.append(np.asarray(a.value, dtype=float).reshape(self.domain.shape(c)))
        return out

    @property
    def residual(self) -> float | None:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    def value(self, tolerance: float = 1e-8) -> bool:
        r = self.residual
        if r is None:
            raise ValueError(f"{type(self).__name__}.value: a marginal has no value")
        scale = self.known_total() if self.total is not None else abs(self.fitted_total or 0.0)
        return bool(r <= tolerance * max(1.0, scale))

    def violation(self):
        return self.residual

    def flat(self, k: int, args=None) -> cp.Expression:
        """Marginal ``k`` as a flat C-order expression."""
        a = (self.args if args is None else args)[k]
        return cp.reshape(a, (a.size,), order="C") if a.ndim > 1 else a

    # ---------------------------------------------------------------- duals
    def save_dual_value(self, value) -> None:
        """Store the multipliers ``y_C`` of ``marginals[C] == (the table's marginal on C)``,
        given flat (all cliques stacked, each in C order) or as one array per clique.

        With cvxpy's sign (``y^T (lhs - rhs)``) and marginals that appear nowhere else,
        stationarity gives ``y_C = -grad_C loss``: the change of the optimal loss per unit
        added to a measured marginal.  ``dual_value`` is one array per clique shaped like its
        marginal (a single array for one clique)."""
        if isinstance(value, (list, tuple)):
            parts = [np.asarray(v, dtype=float) for v in value]
        else:
            flat = np.asarray(value, dtype=float).ravel()
            sizes = [a.size for a in self.args]
            if flat.size != sum(sizes):
                raise ValueError(f"{type(self).__name__}: {flat.size} multipliers for "
                                 f"{sum(sizes)} marginal cells")
            parts = np.split(flat, np.cumsum(sizes)[:-1])
        for dv, a, part in zip(self.dual_variables, self.args, parts):
            dv.save_value(np.reshape(part, a.shape, order="C") if a.shape else float(part[0]))


def project(table: np.ndarray, attrs: tuple[str, ...], keep: list[str]) -> np.ndarray:
    """Marginal of ``table`` (axes ``attrs``) on ``keep``, axes in ``keep``'s order."""
    axes = tuple(i for i, a in enumerate(attrs) if a not in keep)
    m = table.sum(axis=axes) if axes else table
    order = [a for a in attrs if a in keep]
    return np.transpose(m, [order.index(a) for a in keep])
