"""Recognise the noise design of a marginal workload in the residual basis.

Accepted::

    minimize    a * cvxdp.privacy_cost(W, s) (+ constant),          a > 0
    subject to  nonnegative affine maps of s <= constants           (per-marginal targets:
                                                                     cvxdp.query_variance(W, s) <= c,
                                                                     slices, sums, weights)

with ``s`` a vector Variable of ``W.n_residuals`` entries (``pos=True`` or ``nonneg=True``, or
no sign).  The output is what :mod:`cvxdp.solvers.residual.design` needs: ``p`` from the
workload, the stacked rows ``V`` (entries >= 0) and targets ``c`` of every constraint, and the
blocks that map the multipliers back to the user's constraints.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.constraints import Inequality, NonNeg, NonPos

from ..errors import NotRecognised
from ..modelling.marginal_workload import MarginalWorkload
from ..modelling.residual_atoms import ResidualPrivacyCost
from ..names import NEWTON_CG, short
from .affine import Linearizer
from .losses import scalar_scaling

__all__ = ["ResidualExtraction", "recognise"]

_NAME = short(NEWTON_CG)
_EXPECTED = ("minimize a positive multiple of cvxdp.privacy_cost(W, s) for a MarginalWorkload W "
             "and a vector Variable s (the residual variances), subject to nonnegative affine "
             "maps of s at most constants (cvxdp.query_variance(W, s) <= c, slices, sums)")


@dataclass
class ResidualExtraction:
    """The design problem as arrays, plus what maps the results back."""

    workload: MarginalWorkload
    s: cp.Variable
    scale: float                          # objective = scale * privacy cost + constant
    constant: float
    V: sp.csr_matrix                      # every constraint's rows, stacked
    c: np.ndarray
    blocks: list = field(default_factory=list)   # (constraint, row start, row stop)


def recognise(problem: cp.Problem) -> ResidualExtraction:
    if not isinstance(problem.objective, cp.Minimize):
        raise NotRecognised(_NAME, _EXPECTED, "a Maximize objective", claimed=_has_cost(problem))
    atom, scale, constant = _objective(problem.objective.expr)
    s = atom.args[0]
    if not isinstance(s, cp.Variable):
        raise NotRecognised(_NAME, _EXPECTED, f"privacy_cost of an expression "
                            f"({type(s).__name__}), not of a Variable")
    bad = [k for k in ("boolean", "integer", "nonpos", "neg", "complex", "imag", "bounds",
                       "sparsity") if s.attributes.get(k)]
    if bad:
        raise NotRecognised(_NAME, _EXPECTED, f"a strategy variable with attribute {bad[0]}")
    extra = [v for v in problem.variables() if v is not s]
    if extra:
        raise NotRecognised(_NAME, _EXPECTED, f"variable {extra[0].name()} besides s")
    lin = Linearizer([s])
    rows, targets, blocks, start = [], [], [], 0
    for con in problem.constraints:
        M, c = _rows(con, lin)
        rows.append(M)
        targets.append(c)
        blocks.append((con, start, start + M.shape[0]))
        start += M.shape[0]
    if not rows:
        raise NotRecognised(_NAME, _EXPECTED, "no variance target (the cost falls to 0 as the "
                            "variances grow: there is no optimum)")
    V = sp.vstack(rows).tocsr()
    return ResidualExtraction(atom.W, s, scale, constant, V, np.concatenate(targets), blocks)


def _has_cost(problem: cp.Problem) -> bool:
    stack = [problem.objective.expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ResidualPrivacyCost):
            return True
        stack.extend(e.args)
    return False


def _objective(expr) -> tuple[ResidualPrivacyCost, float, float]:
    """``(atom, a, constant)`` for ``a * privacy_cost(W, s) + constant``."""
    constant = 0.0
    if isinstance(expr, cp.atoms.affine.add_expr.AddExpression):
        consts = [a for a in expr.args if a.is_constant()]
        rest = [a for a in expr.args if not a.is_constant()]
        if len(rest) == 1 and all(a.size == 1 for a in consts):
            constant = float(sum(float(np.asarray(a.value).ravel()[0]) for a in consts))
            expr = rest[0]
    scale = 1.0
    while not isinstance(expr, ResidualPrivacyCost):
        found = scalar_scaling(expr)
        if found is None:
            claimed = any(isinstance(e, ResidualPrivacyCost) for e in _walk(expr))
            raise NotRecognised(_NAME, _EXPECTED, f"the objective {type(expr).__name__}",
                                claimed=claimed)
        a, expr = found
        scale *= a
    if not scale > 0:
        raise NotRecognised(_NAME, _EXPECTED, f"privacy_cost scaled by {scale:g} (must be > 0)")
    return expr, scale, constant


def _walk(expr):
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.args)


def _rows(con, lin: Linearizer) -> tuple[sp.csr_matrix, np.ndarray]:
    """``(M, c)`` with the constraint read as ``M s <= c``; ``M >= 0`` required."""
    if isinstance(con, Inequality):
        expr = con.args[0] - con.args[1]
    elif isinstance(con, NonPos):
        expr = con.args[0]
    elif isinstance(con, NonNeg):
        expr = -con.args[0]
    else:
        raise NotRecognised(_NAME, _EXPECTED, f"a constraint of type {type(con).__name__}")
    try:
        M, d = lin(expr)
    except (KeyError, ValueError) as exc:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} is not affine in s "
                            f"({exc})") from None
    M = sp.csr_matrix(M)
    if M.nnz and M.data.min() < 0:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} has a negative "
                            f"coefficient on s (a lower bound on a variance)")
    empty = np.flatnonzero(np.diff(M.indptr) == 0)
    if empty.size:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} has a row that does "
                            f"not read s")
    return M, -d
