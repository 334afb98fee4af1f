"""Parse a cvxpy objective into weighted L1 and squared loss terms.

Shared by the recognisers of the consistency family (ADMM) and of the marginal
polytope (mirror descent).  An objective is accepted when it is a nonnegative
combination (plus a constant) of

* L1 losses ``w_i |r_i|``: ``norm1(r)``, ``abs(r)`` (scalar), ``sum(abs(r))``,
  ``sum(multiply(w, abs(r)))``, ``w @ abs(r)``;
* squared losses ``(w2_i / 2) r_i^2``: ``sum_squares(r)``, ``quad_over_lin(r, c)``
  (``w2 = 2 / c``), ``sum(square(r))``, ``norm2(r)**2``, ``r**2`` (scalar), weighted
  as above,

of affine expressions ``r``.  A squared term ``c * sum(r^2)`` therefore gets the
weight ``w2 = 2 c`` so that ``phi(r) = (w2 / 2) r^2`` is the same function.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import cvxpy as cp
from cvxpy.atoms.affine.add_expr import AddExpression
from cvxpy.atoms.affine.binary_operators import DivExpression, MulExpression, multiply
from cvxpy.atoms.affine.sum import Sum
from cvxpy.atoms.affine.unary_operators import NegExpression
from cvxpy.atoms.elementwise.abs import abs as cp_abs
from cvxpy.atoms.elementwise.power import Power
from cvxpy.atoms.norm1 import norm1
from cvxpy.atoms.pnorm import Pnorm
from cvxpy.atoms.quad_over_lin import quad_over_lin

from ..errors import NotRecognised
from .affine import constant_value

__all__ = ["Term", "collect", "scalar_scaling", "elementwise_loss", "describe", "has_l1"]


@dataclass
class Term:
    """One loss term ``sum_i phi_i(r_i)`` of the affine argument ``r = vec(expr)``."""

    expr: cp.Expression       # the affine argument
    kind: str                 # "l1" (phi = w |r|) or "l2" (phi = w/2 r^2)
    weight: np.ndarray        # per entry of vec(expr), or a scalar


def collect(expr, method: str, expected: str) -> tuple[list[Term], float]:
    """The loss terms and the constant of ``expr``; raises :class:`NotRecognised`
    naming ``method`` and ``expected`` for anything outside the family."""
    parser = _Parser(method, expected)
    parser.add(expr, 1.0)
    return parser.terms, parser.constant


class _Parser:
    """Walks the expression tree, accumulating ``coef * term`` into ``terms``."""

    def __init__(self, method: str, expected: str) -> None:
        self.method = method
        self.expected = expected
        self.terms: list[Term] = []
        self.constant = 0.0

    def reject(self, found: str) -> NotRecognised:
        return NotRecognised(self.method, self.expected, found)

    def add(self, expr, coef: float) -> None:
        """Split ``coef * expr`` into loss terms and a constant."""
        if expr.is_constant():
            self.constant += coef * float(np.sum(constant_value(expr)))
            return
        if isinstance(expr, AddExpression):
            for a in expr.args:
                self.add(a, coef)
            return
        scal = scalar_scaling(expr)
        if scal is not None:
            c, inner = scal
            if c < 0:
                raise self.reject("a loss with a negative coefficient")
            if c > 0:
                self.add(inner, coef * c)
            return
        term = _norm_term(expr, coef)
        if term is None:
            term = _summed_term(expr, coef)
        if term is None:
            raise self.reject(f"the objective term {describe(expr)}")
        self.terms.append(term)


def _no_axis(expr) -> bool:
    return getattr(expr, "axis", None) is None


def _norm_term(expr, coef: float) -> Term | None:
    """``norm1(r)``, ``abs(r)`` (scalar), ``quad_over_lin(r, c)``, ``norm2(r)**2`` and
    ``r**2`` (scalar, or written by cvxpy as ``abs(r)**2`` / ``norm1(r)**2``)."""
    if isinstance(expr, norm1) and _no_axis(expr):
        return Term(expr.args[0], "l1", np.asarray(coef))
    if isinstance(expr, cp_abs) and expr.size == 1:
        return Term(expr.args[0], "l1", np.asarray(coef))
    if isinstance(expr, quad_over_lin) and _no_axis(expr):
        den = constant_value(expr.args[1]) if expr.args[1].is_constant() else None
        if den is not None and float(np.asarray(den).ravel()[0]) > 0:
            return Term(expr.args[0], "l2", np.asarray(2.0 * coef / float(np.asarray(den).ravel()[0])))
        return None
    if isinstance(expr, Power) and _exponent(expr) == 2:
        base = expr.args[0]
        if isinstance(base, Pnorm) and float(base.p) == 2 and _no_axis(base):
            return Term(base.args[0], "l2", np.asarray(2.0 * coef))
        if base.is_affine() and base.size == 1:
            return Term(base, "l2", np.asarray(2.0 * coef))
        # cvxpy writes the norm of a one-entry argument as norm1 or abs: |r|^2 = r^2
        if (isinstance(base, (norm1, cp_abs, Pnorm)) and _no_axis(base)
                and base.args[0].size == 1 and base.args[0].is_affine()):
            return Term(base.args[0], "l2", np.asarray(2.0 * coef))
    return None


def _summed_term(expr, coef: float) -> Term | None:
    """``sum(w * abs(r))`` / ``sum(w * square(r))`` and ``w @ abs(r)`` / ``w @ square(r)``."""
    if isinstance(expr, Sum) and expr.axis is None:
        parsed = elementwise_loss(expr.args[0])
        if parsed is not None:
            return _weighted(parsed, coef)
    if type(expr) is MulExpression:
        a, b = expr.args
        for const, other in ((a, b), (b, a)):
            if const.is_constant() and not other.is_constant() and other.ndim <= 1:
                w = np.asarray(constant_value(const), dtype=float).ravel()
                parsed = elementwise_loss(other)
                if parsed is not None and w.size == other.size and np.all(w >= 0):
                    return _weighted(parsed, coef * w)
    return None


def _weighted(parsed, coef) -> Term:
    """The term of ``coef * sum(w * loss(aff))``, weights in column-major order (vec)."""
    kind, w, aff = parsed
    w = np.broadcast_to(w, aff.shape).ravel(order="F") if aff.ndim else np.asarray(w)
    return Term(aff, kind, coef * w * (2.0 if kind == "l2" else 1.0))


def _exponent(expr) -> float:
    return float(expr.p.value if hasattr(expr.p, "value") else expr.p)


def scalar_scaling(expr):
    """``(c, inner)`` if ``expr`` is ``-inner``, ``c * inner`` or ``inner / c`` for a
    scalar constant ``c`` (or a constant array with one distinct value as divisor)."""
    if isinstance(expr, NegExpression):
        return -1.0, expr.args[0]
    if isinstance(expr, (multiply, MulExpression)):
        a, b = expr.args
        for const, other in ((a, b), (b, a)):
            if const.is_constant() and const.size == 1 and not other.is_constant():
                return float(np.asarray(constant_value(const)).ravel()[0]), other
    if isinstance(expr, DivExpression):
        num, den = expr.args
        if den.is_constant() and (den.size == 1 or np.unique(np.asarray(constant_value(den))).size == 1):
            d = float(np.asarray(constant_value(den)).ravel()[0])
            if d > 0 and num.size == expr.size:
                return 1.0 / d, num
    return None


def elementwise_loss(e):
    """``(kind, weight, aff)`` for ``w * abs(aff)`` or ``w * square(aff)`` (elementwise,
    ``w >= 0`` a product of constant factors and divisors), else ``None``."""
    w = np.asarray(1.0)
    while True:
        if isinstance(e, cp_abs):
            return ("l1", w, e.args[0]) if np.all(w >= 0) else None
        if isinstance(e, Power) and _exponent(e) == 2 and e.args[0].is_affine():
            return ("l2", w, e.args[0]) if np.all(w >= 0) else None
        if type(e) is multiply:
            a, b = e.args
            if a.is_constant() and not b.is_constant():
                w, e = w * np.asarray(constant_value(a), dtype=float), b
                continue
            if b.is_constant() and not a.is_constant():
                w, e = w * np.asarray(constant_value(b), dtype=float), a
                continue
            return None
        if isinstance(e, DivExpression) and e.args[1].is_constant():
            w = w / np.asarray(constant_value(e.args[1]), dtype=float)
            e = e.args[0]
            continue
        return None


def describe(expr) -> str:
    """``Type: text`` of an expression, the text cut to 80 characters."""
    s = str(expr)
    if len(s) > 80:
        s = s[:77] + "..."
    return f"{type(expr).__name__}: {s}"


def has_l1(expr) -> bool:
    """Whether an absolute-value atom (``abs``, ``norm1``, a 1-norm) occurs in ``expr``: the
    loss kind read without parsing the loss (for the cost model's look before recognition)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, (cp_abs, norm1)) or (isinstance(e, Pnorm) and float(e.p) == 1.0):
            return True
        stack.extend(e.args)
    return False
