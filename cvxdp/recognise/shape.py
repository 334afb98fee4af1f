"""What a problem looks like before it is recognised: a check that costs microseconds.

``solver=None`` hands small problems to the standard solver; recognising them first (reading
the loss rows, the constraint matrices) cost 1.5-2 ms, a third of the standard solver's own
time at those sizes.  :func:`plain_consistency` says, from the expression tree's node types
alone, that a problem can only be one of the consistency family's *iterative* kinds (so the
cost model's small-size verdict applies to it) -- never a kind solved exactly (an order chain,
the closed-form GLS), never another family's (polytopes, fitness for use, PSD variables).
"""
from __future__ import annotations

import cvxpy as cp
from cvxpy.atoms.affine.index import index, special_index
from cvxpy.constraints import Equality, Inequality, NonNeg, NonPos, Zero

__all__ = ["plain_consistency"]

# non-affine atoms of the consistency family's losses (their affine arguments are not read)
_LOSS_ATOMS = {"norm1", "abs", "quad_over_lin", "power", "Pnorm", "AddExpression",
               "MulExpression", "multiply", "Sum", "NegExpression", "DivExpression"}
_ATTRIBUTES_OK = {"nonneg", "bounds"}


def plain_consistency(problem: cp.Problem) -> bool:
    """``True`` when the problem has only equalities (any), bounds (a variable or a slice of
    one against a constant) and at least one bound or absolute loss, its objective is built
    from absolute and squared losses of affine expressions, and its variables carry no
    attribute beyond ``nonneg`` / ``bounds``."""
    for v in problem.variables():
        if any(val for key, val in v.attributes.items() if key not in _ATTRIBUTES_OK):
            return False
    bounds = 0
    for c in problem.constraints:
        if isinstance(c, (Equality, Zero)):
            continue
        if isinstance(c, (Inequality, NonNeg, NonPos)) and _is_bound(c):
            bounds += 1
            continue
        return False
    bounds += sum(1 for v in problem.variables()
                  if v.attributes.get("nonneg") or v.attributes.get("bounds") is not None)
    l1 = _loss_atoms(problem.objective.expr)
    return l1 is not None and (bounds > 0 or l1)


def _is_bound(c) -> bool:
    """One side a variable (or a slice of one), the other free of variables."""
    sides = c.args
    with_vars = [s for s in sides if s.variables()]
    if len(with_vars) != 1:
        return False
    s = with_vars[0]
    return isinstance(s, cp.Variable) or (isinstance(s, (index, special_index))
                                          and isinstance(s.args[0], cp.Variable))


def _p(expr) -> float:
    p = expr.p
    return float(getattr(p, "value", p))


def _loss_atoms(expr) -> bool | None:
    """``None`` if a node outside the losses' atoms appears; else whether an absolute loss
    does."""
    if expr.is_affine():
        return False
    name = type(expr).__name__
    if name not in _LOSS_ATOMS or (name in ("power", "Pnorm") and _p(expr) != (2.0 if name == "power" else 1.0)) \
            or (name == "quad_over_lin" and expr.args[1].variables()):
        return None
    l1 = name in ("norm1", "abs", "Pnorm")
    for arg in expr.args:
        sub = _loss_atoms(arg)
        if sub is None:
            return None
        l1 = l1 or sub
    return l1
