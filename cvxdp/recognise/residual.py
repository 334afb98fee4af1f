"""Recognise the noise design of a marginal workload in the residual basis.

Accepted::

    minimize    a * cvxdp.privacy_cost(W, s) (+ constant),          a > 0
    subject to  nonnegative affine maps of s <= constants           (per-marginal targets:
                                                                     cvxdp.query_variance(W, s) <= c,
                                                                     slices, sums, weights)

with ``s`` a vector Variable of ``W.n_residuals`` entries (``pos=True`` or ``nonneg=True``, or
no sign); or Problem 2 of SM-II (privacy first)::

    minimize    a * t                                               a > 0, t a scalar Variable
    subject to  nonnegative maps of s <= t * c,   cvxdp.privacy_cost(W, s) <= budget

which is Problem 1 with targets ``c`` scaled: ``t* = f* / budget``, ``s* = t* s_1``.  The output is what :mod:`cvxdp.solvers.residual.design` needs: ``p`` from the
workload, the stacked rows ``V`` (entries >= 0) and targets ``c`` of every constraint, and the
blocks that map the multipliers back to the user's constraints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.constraints import Inequality, NonNeg, NonPos

from ..errors import NotRecognised
from ..modelling.local_polytope import LocalPolytope
from ..modelling.marginal_workload import MarginalWorkload
from ..modelling.residual_atoms import ResidualPrivacyCost
from ..modelling.residual_likelihood import ResidualLikelihood
from ..names import ADMM, NEWTON_CG, short
from .affine import Linearizer
from .losses import scalar_scaling

__all__ = ["ResidualExtraction", "recognise", "ReconstructionExtraction",
           "recognise_reconstruction"]

_NAME = short(NEWTON_CG)
_EXPECTED = ("minimize a positive multiple of cvxdp.privacy_cost(W, s) for a MarginalWorkload W "
             "and a vector Variable s (the residual variances), subject to nonnegative affine "
             "maps of s at most constants (cvxdp.query_variance(W, s) <= c, slices, sums); or "
             "minimize t subject to query_variance(W, s) <= t * c and privacy_cost(W, s) <= budget")


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
    t: cp.Variable | None = None          # Problem 2: the scaling variable (the objective)
    budget: float = math.nan              # ... and the privacy-cost bound
    cost_constraint: object = None        # ... its constraint


def recognise(problem: cp.Problem) -> ResidualExtraction:
    if not isinstance(problem.objective, cp.Minimize):
        raise NotRecognised(_NAME, _EXPECTED, "a Maximize objective", claimed=_has_cost(problem))
    if not _has_cost(problem.objective.expr) and _has_cost(problem):
        return _privacy_first(problem)
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


def _has_cost(where) -> bool:
    """Whether a residual privacy cost occurs in an expression, or anywhere in a problem."""
    if isinstance(where, cp.Problem):
        return any(_has_cost(e) for e in [where.objective.expr]
                   + [a for c in where.constraints for a in c.args])
    return any(isinstance(e, ResidualPrivacyCost) for e in _walk(where))


def _privacy_first(problem: cp.Problem) -> ResidualExtraction:
    """Problem 2: ``minimize a t`` s.t. ``maps of s <= t c``, ``privacy_cost(W, s) <= budget``."""
    obj = problem.objective.expr
    scale, t = 1.0, obj
    while not isinstance(t, cp.Variable):
        found = scalar_scaling(t)
        if found is None:
            raise NotRecognised(_NAME, _EXPECTED, f"the objective {type(obj).__name__}")
        a, t = found
        scale *= a
    if t.size != 1 or not scale > 0:
        raise NotRecognised(_NAME, _EXPECTED, "an objective other than a positive multiple of "
                            "a scalar variable t")
    costs = [c for c in problem.constraints if isinstance(c, Inequality)
             and isinstance(c.args[0], ResidualPrivacyCost) and c.args[1].is_constant()]
    if len(costs) != 1:
        raise NotRecognised(_NAME, _EXPECTED, f"{len(costs)} constraints privacy_cost(W, s) <= "
                            f"budget (need one)")
    atom, budget = costs[0].args[0], float(np.asarray(costs[0].args[1].value).ravel()[0])
    s = atom.args[0]
    if not isinstance(s, cp.Variable) or {v.id for v in problem.variables()} != {s.id, t.id}:
        raise NotRecognised(_NAME, _EXPECTED, "variables other than s and t")
    if not (math.isfinite(budget) and budget > 0):
        raise NotRecognised(_NAME, _EXPECTED, f"a privacy budget of {budget!r} (must be > 0)")
    lin = Linearizer([s, t])
    rows, targets, blocks, start = [], [], [], 0
    for con in problem.constraints:
        if con is costs[0]:
            continue
        M, c = _rows(con, lin, scaled=True)
        rows.append(M)
        targets.append(c)
        blocks.append((con, start, start + M.shape[0]))
        start += M.shape[0]
    if not rows:
        raise NotRecognised(_NAME, _EXPECTED, "no variance target")
    return ResidualExtraction(atom.W, s, scale, 0.0, sp.vstack(rows).tocsr(),
                              np.concatenate(targets), blocks, t=t, budget=budget,
                              cost_constraint=costs[0])


def _objective(expr) -> tuple[ResidualPrivacyCost, float, float]:
    """``(atom, a, constant)`` for ``a * privacy_cost(W, s) + constant``."""
    return _scaled_atom(expr, ResidualPrivacyCost, _NAME, _EXPECTED)


def _scaled_atom(expr, cls: type, name: str, expected: str):
    """``(atom, a, constant)`` for ``a * atom + constant`` with ``atom`` of type ``cls`` and
    ``a > 0``; ``NotRecognised`` (claimed when such an atom occurs at all) otherwise."""
    expr, constant = _split_constant(expr)
    scale = 1.0
    while not isinstance(expr, cls):
        found = scalar_scaling(expr)
        if found is None:
            claimed = any(isinstance(e, cls) for e in _walk(expr))
            raise NotRecognised(name, expected, f"the objective {type(expr).__name__}",
                                claimed=claimed)
        a, expr = found
        scale *= a
    if not scale > 0:
        raise NotRecognised(name, expected, f"{cls.__name__} scaled by {scale:g} (must be > 0)")
    return expr, scale, constant


def _walk(expr):
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.args)


def _rows(con, lin: Linearizer, scaled: bool = False) -> tuple[sp.csr_matrix, np.ndarray]:
    """``(M, c)`` with the constraint read as ``M s <= c`` (``scaled``: as ``M s <= t c``, the
    linearizer's last column ``t``); ``M >= 0`` required."""
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
    if scaled:
        if np.any(d != 0):
            raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} has a constant "
                                f"term (targets must be t * c)")
        d = M[:, -1].toarray().ravel()
        M = M[:, :-1].tocsr()
        if np.any(d >= 0):
            raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} is not "
                                f"'... <= t * c' with c > 0")
    if M.nnz and M.data.min() < 0:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} has a negative "
                            f"coefficient on s (a lower bound on a variance)")
    empty = np.flatnonzero(np.diff(M.indptr) == 0)
    if empty.size:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {str(con)[:60]} has a row that does "
                            f"not read s")
    return M, -d


_RECONSTRUCT_NAME = short(ADMM)
_RECONSTRUCT_EXPECTED = ("minimize a positive multiple of cvxdp.nll(measurement, marginals) for "
                         "residual answers (cvxdp.mechanisms.residual_gaussian) subject to one "
                         "cvxdp.LocalPolytope over the same marginal variables")


@dataclass
class ReconstructionExtraction:
    """The non-negative reconstruction as arrays: the polytope, the loss atom, its scale."""

    constraint: LocalPolytope
    atom: ResidualLikelihood
    variables: list
    scale: float
    constant: float


def recognise_reconstruction(problem: cp.Problem) -> ReconstructionExtraction:
    """``minimize a nll(measurement, marginals) + constant s.t. LocalPolytope(marginals, ...)``
    (:mod:`cvxdp.modelling.residual_likelihood`) for ``cvxdp.ADMM``."""
    name, expected = _RECONSTRUCT_NAME, _RECONSTRUCT_EXPECTED
    if not isinstance(problem.objective, cp.Minimize):
        raise NotRecognised(name, expected, "a Maximize objective", claimed=False)
    expr, scale, constant = _scaled_atom(problem.objective.expr, ResidualLikelihood, name,
                                         expected)
    polytopes = [c for c in problem.constraints if isinstance(c, LocalPolytope)]
    if len(problem.constraints) != 1 or len(polytopes) != 1:
        raise NotRecognised(name, expected, f"{len(problem.constraints)} constraints (need one "
                            f"LocalPolytope)")
    lp = polytopes[0]
    if len(lp.args) != len(expr.args) or any(a is not b for a, b in zip(lp.args, expr.args)) \
            or any(lp.domain.clique(c) != c2 for c, c2 in zip(lp.cliques, expr.cliques)):
        raise NotRecognised(name, expected, "a LocalPolytope over other marginals than the loss")
    if any(not isinstance(a, cp.Variable) for a in lp.args) or \
            len({a.id for a in lp.args}) != len(lp.args):
        raise NotRecognised(name, expected, "marginals that are not distinct Variables")
    return ReconstructionExtraction(lp, expr, list(lp.args), scale, constant)


def _split_constant(expr) -> tuple[cp.Expression, float]:
    """``(rest, constant)`` of ``rest + constant`` (scalar constants)."""
    if isinstance(expr, cp.atoms.affine.add_expr.AddExpression):
        consts = [a for a in expr.args if a.is_constant()]
        rest = [a for a in expr.args if not a.is_constant()]
        if len(rest) == 1 and all(a.size == 1 for a in consts):
            return rest[0], float(sum(float(np.asarray(a.value).ravel()[0]) for a in consts))
    return expr, 0.0
