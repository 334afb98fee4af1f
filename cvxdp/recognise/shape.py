"""What a problem looks like before it is recognised: a check that costs microseconds.

``solver=None`` hands small problems to the standard solver; recognising them first (reading
the loss rows, the constraint matrices) cost 1.5-2 ms, a third of the standard solver's own
time at those sizes.  :func:`plain_consistency` says, from the expression tree's node types
alone, that a problem can only be one of the consistency family's *iterative* kinds (so the
cost model's small-size verdict applies to it) -- never a kind solved exactly (an order chain
with absolute losses alone, the closed-form GLS), never another family's (polytopes, fitness
for use, PSD variables).
"""
from __future__ import annotations

import cvxpy as cp
from cvxpy.atoms.affine.index import index, special_index
from cvxpy.atoms.elementwise.power import Power
from cvxpy.constraints import Equality, Inequality, NonNeg, NonPos, Zero

__all__ = ["plain_consistency", "entrywise_losses", "loss_kind"]

# non-affine atoms of the consistency family's losses (their affine arguments are not read)
_LOSS_ATOMS = {"norm1", "abs", "quad_over_lin", "power", "Pnorm", "AddExpression",
               "MulExpression", "multiply", "Sum", "NegExpression", "DivExpression"}
_ATTRIBUTES_OK = {"nonneg", "bounds"}


def plain_consistency(problem: cp.Problem) -> bool:
    """``True`` when the problem has only equalities (any), bounds (a variable or a slice of
    one against a constant) and at least one bound or absolute loss, its objective is built
    from absolute and squared losses of affine expressions, and its variables carry no
    attribute beyond ``nonneg`` / ``bounds``; or, squared losses alone, bounds and order
    chains (one slice of a variable against another, no equalities: the ADMM with the
    pool-adjacent projection; chains under absolute losses alone are solved exactly, and
    chains with equalities take the general path)."""
    for v in problem.variables():
        if any(val for key, val in v.attributes.items() if key not in _ATTRIBUTES_OK):
            return False
    bounds = chains = equalities = 0
    for c in problem.constraints:
        if isinstance(c, (Equality, Zero)):
            equalities += 1
            continue
        if isinstance(c, (Inequality, NonNeg, NonPos)) and _is_bound(c):
            bounds += 1
            continue
        if isinstance(c, Inequality) and _is_order(c):
            chains += 1
            continue
        return False
    bounds += sum(1 for v in problem.variables()
                  if v.attributes.get("nonneg") or v.attributes.get("bounds") is not None)
    kinds = _loss_atoms(problem.objective.expr)
    if kinds is None:
        return False
    l1 = "l1" in kinds
    if chains and (l1 or equalities):
        return False
    return bounds > 0 or chains > 0 or l1


def entrywise_losses(problem: cp.Problem) -> bool:
    """``True`` when every loss reads its variables entrywise (``x - y``, a slice, a scalar or
    elementwise constant times them; no matrix product) and no variable is read by two
    different loss arguments (``0.9 norm1(r) + 0.1 sum_squares(r)`` reads one ``r``): the
    loss is then separable, one row per coordinate, and the general path (a loss matrix) is
    not the one the problem takes."""
    args: dict[int, set[int]] = {}
    if not _collect_args(problem.objective.expr, args):
        return False
    return all(len(ids) == 1 for ids in args.values())


def _collect_args(expr, args: dict) -> bool:
    """The affine arguments of the loss atoms, by variable; ``False`` if one is not entrywise."""
    if expr.is_affine():
        return not expr.variables()
    name = _name(expr)
    if name in ("norm1", "abs", "quad_over_lin", "power", "Pnorm"):
        arg = expr.args[0]
        if not _entrywise(arg):
            return False
        for v in arg.variables():
            args.setdefault(v.id, set()).add(id(arg))
        return True
    return all(_collect_args(a, args) for a in expr.args)


def _entrywise(expr) -> bool:
    if not expr.variables() or isinstance(expr, cp.Variable):
        return True
    name = type(expr).__name__
    if isinstance(expr, (index, special_index)):
        return isinstance(expr.args[0], cp.Variable)
    if name in ("AddExpression", "NegExpression"):
        return all(_entrywise(a) for a in expr.args)
    if name in ("multiply", "MulExpression", "DivExpression"):
        const = [a for a in expr.args if not a.variables()]
        var = [a for a in expr.args if a.variables()]
        if len(var) != 1 or (name == "DivExpression" and expr.args[0] is not var[0]):
            return False
        return (name == "multiply" or const[0].is_scalar()) and _entrywise(var[0])
    return False


def _is_bound(c) -> bool:
    """One side a variable (or a slice of one), the other free of variables."""
    sides = c.args
    with_vars = [s for s in sides if s.variables()]
    if len(with_vars) != 1:
        return False
    s = with_vars[0]
    return isinstance(s, cp.Variable) or (isinstance(s, (index, special_index))
                                          and isinstance(s.args[0], cp.Variable))


def _is_order(c) -> bool:
    """Both sides slices of one variable (``x[:-1] <= x[1:]``)."""
    sides = c.args
    if not all(isinstance(t, (index, special_index)) and isinstance(t.args[0], cp.Variable)
               for t in sides):
        return False
    return sides[0].args[0].id == sides[1].args[0].id


def _name(expr) -> str:
    """The atom's name as the sets above spell it: any :class:`Power` is ``"power"``
    (newer cvxpy builds ``cp.square`` as its subclass ``PowerApprox``)."""
    return "power" if isinstance(expr, Power) else type(expr).__name__


def _p(expr) -> float:
    p = expr.p
    return float(getattr(p, "value", p))


def _loss_atoms(expr) -> frozenset | None:
    """``None`` if a node outside the losses' atoms appears; else the loss kinds present:
    ``"l1"`` (an absolute loss), ``"l2"`` (a squared one)."""
    if expr.is_affine():
        return frozenset()
    name = _name(expr)
    if name not in _LOSS_ATOMS or (name in ("power", "Pnorm") and _p(expr) != (2.0 if name == "power" else 1.0)) \
            or (name == "quad_over_lin" and expr.args[1].variables()):
        return None
    kinds = {"l1"} if name in ("norm1", "abs", "Pnorm") else {"l2"} if name in ("power", "quad_over_lin") \
        else set()
    for arg in expr.args:
        sub = _loss_atoms(arg)
        if sub is None:
            return None
        kinds |= sub
    return frozenset(kinds)


def loss_kind(problem: cp.Problem) -> str | None:
    """``"l1"``, ``"l2"`` or ``"mixed"``: the kinds of loss atom in the objective (the cost
    model's family suffix, read before recognition: the loss weights themselves may still
    zero a term), ``None`` when the objective is not built from them."""
    kinds = _loss_atoms(problem.objective.expr)
    if not kinds:
        return None
    return "mixed" if len(kinds) == 2 else next(iter(kinds))
