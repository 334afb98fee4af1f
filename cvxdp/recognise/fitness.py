"""Recognise the fitness-for-use problems (Xiao, He, Zhang, Kifer, VLDB 2021).

Problem 1 (prioritizing accuracy)::

    minimize    privacy_cost(B, X)            or  cp.max(cp.diag(B.T @ X @ B))   (times a > 0)
    subject to  query_variance(L, X) <= c     or  cp.matrix_frac(l_i, X) <= c_i, one per row
                X PSD (attribute, or X >> 0)

Problem 2 (prioritizing privacy)::

    minimize    s
    subject to  query_variance(L, X) <= s * c,   privacy_cost(B, X) <= rho,   X PSD

A model of this form whose data has no attained optimum raises ``ValueError`` naming the
argument, before any solve (:func:`cvxdp.solvers.fitness.reduce.validate`): no queries or
only zero queries (``L``), non-positive or non-finite targets (``c``), a basis ``B`` with
dependent rows, and in Problem 2 a privacy bound ``rho`` that is not positive and finite
(``rho <= 0`` admits no positive definite ``X``; ``rho = inf`` lets ``s`` tend to 0 unattained).
Rank-deficient, repeated and partly zero workloads are fine: the solver reduces them exactly.
Targets that are not one per query (a vector ``c`` against one ``matrix_frac``, a column ``c``
that cvxpy broadcasts against ``query_variance``) are a ``ValueError`` naming the constraint
and both lengths.  One cell (``d = 1``) is read in every spelling: cvxpy writes ``cp.diag`` of
a ``1 x 1`` matrix as ``diag_vec(reshape(.))``, which is read as the diagonal too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.atoms.affine.binary_operators import MulExpression, multiply
from cvxpy.atoms.affine.diag import diag_mat, diag_vec
from cvxpy.atoms.affine.reshape import reshape
from cvxpy.atoms.matrix_frac import MatrixFrac
from cvxpy.atoms.max import max as cp_max
from cvxpy.constraints import PSD, Inequality

from ..modelling.atoms import PrivacyCost, QueryVariance
from ..errors import NotRecognised
from ..names import NEWTON_CG, short
from ..solvers.fitness.reduce import validate
from .affine import constant_value

__all__ = ["FitnessExtraction", "recognise"]

_NAME = short(NEWTON_CG)

_EXPECTED = ("minimize cvxdp.privacy_cost(B, X) (or cp.max(cp.diag(B.T @ X @ B))) subject to "
             "cvxdp.query_variance(L, X) <= c (or cp.matrix_frac(l_i, X) <= c_i per row) with X "
             "PSD; or minimize s subject to query_variance(L, X) <= s * c and privacy_cost(B, X) <= rho")


@dataclass
class FitnessExtraction:
    X: cp.Variable
    B: np.ndarray
    L: np.ndarray
    c: np.ndarray
    scale: float = 1.0                      # objective = scale * privacy cost (Problem 1)
    problem: int = 1
    s: cp.Variable | None = None           # Problem 2's scaling variable
    rho: float | None = None               # Problem 2's privacy bound
    variance_constraints: list = field(default_factory=list)   # (constraint, row indices)
    cost_constraint: object = None
    psd_constraints: list = field(default_factory=list)


def _privacy_B(expr, X) -> np.ndarray | None:
    """``B`` from privacy_cost(B, X) or cp.max(cp.diag(B.T @ X @ B))."""
    if isinstance(expr, PrivacyCost) and expr.args[0] is X:
        return expr.B
    if isinstance(expr, cp_max) and expr.axis is None:
        inner = _diagonal_of(expr.args[0])
        if type(inner) is MulExpression:
            left, right = inner.args
            if right.is_constant() and type(left) is MulExpression:
                lc, mid = left.args
                if mid is X and lc.is_constant():
                    B = np.asarray(constant_value(right), dtype=float)
                    BT = np.asarray(constant_value(lc), dtype=float)
                    if B.ndim == 2 and BT.shape == B.T.shape and np.allclose(BT, B.T):
                        return B
    return None


def _diagonal_of(expr):
    """``M`` for ``cp.diag(M)`` of a matrix ``M``, else ``None``.  cvxpy reads a 1 x 1 ``M``
    (``d = 1`` with one basis column) as a vector and builds ``diag_vec(reshape(M, (1,)))``,
    a 1 x 1 matrix holding the same entry, so at ``d = 1`` that spelling is the diagonal too."""
    if getattr(expr, "k", 0) != 0:
        return None
    if isinstance(expr, diag_mat):
        return expr.args[0]
    if isinstance(expr, diag_vec) and isinstance(expr.args[0], reshape) \
            and expr.args[0].args[0].shape == (1, 1):
        return expr.args[0].args[0]
    return None


def _scaled(expr):
    """``(a, inner)`` for ``a * inner`` with a scalar constant ``a > 0`` (else ``(1, expr)``)."""
    if isinstance(expr, (multiply, MulExpression)):
        a, b = expr.args
        for const, other in ((a, b), (b, a)):
            if const.is_constant() and const.size == 1 and not other.is_constant():
                return float(np.asarray(constant_value(const)).ravel()[0]), other
    return 1.0, expr


def recognise(problem: cp.Problem) -> FitnessExtraction:
    if not isinstance(problem.objective, cp.Minimize):
        raise NotRecognised(_NAME, _EXPECTED, "a Maximize objective")
    variables = problem.variables()
    mats = [v for v in variables if v.ndim == 2 and v.shape[0] == v.shape[1]]
    if len(mats) != 1:
        raise NotRecognised(_NAME, _EXPECTED, f"{len(mats)} square matrix variables (need one, X)",
                            claimed=bool(mats))
    X = mats[0]
    others = [v for v in variables if v is not X]
    if len(others) > 1 or (others and others[0].size != 1):
        raise NotRecognised(_NAME, _EXPECTED, "variables other than X and one scalar")
    s = others[0] if others else None
    psd = bool(X.attributes.get("PSD"))
    obj = problem.objective.expr
    ext = None
    if s is None:
        a, inner = _scaled(obj)
        B = _privacy_B(inner, X)
        if B is None or a <= 0:
            raise NotRecognised(_NAME, _EXPECTED, f"the objective {type(obj).__name__}")
        ext = FitnessExtraction(X=X, B=B, L=np.zeros((0, B.shape[0])), c=np.zeros(0), scale=a)
    else:
        if obj is not s:
            raise NotRecognised(_NAME, _EXPECTED, "an objective other than the scaling variable s")
        ext = FitnessExtraction(X=X, B=np.zeros((X.shape[0], 0)), L=np.zeros((0, X.shape[0])),
                                c=np.zeros(0), problem=2, s=s)
    rows_L, rows_c = [], []
    for index, con in enumerate(problem.constraints):
        if isinstance(con, PSD):
            if _is_X(con.args[0], X):
                psd = True
                ext.psd_constraints.append(con)
                continue
            raise NotRecognised(_NAME, _EXPECTED, "a PSD constraint on something other than X")
        if not isinstance(con, Inequality):
            raise NotRecognised(_NAME, _EXPECTED, f"a constraint of type {type(con).__name__}")
        lhs, rhs = con.args
        start = sum(r.shape[0] for r in rows_L)
        if isinstance(lhs, QueryVariance) and lhs.args[0] is X:
            L = lhs.L
            _check_target_count(con, index, L.shape[0])
            cvec = _targets(rhs, L.shape[0], s, con)
            rows_L.append(L)
            rows_c.append(cvec)
            ext.variance_constraints.append((con, np.arange(start, start + L.shape[0])))
        elif isinstance(lhs, MatrixFrac) and lhs.args[1] is X and lhs.args[0].is_constant():
            l = np.asarray(constant_value(lhs.args[0]), dtype=float).ravel()
            _check_target_count(con, index, 1)
            rows_L.append(l[None, :])
            rows_c.append(_targets(rhs, 1, s, con))
            ext.variance_constraints.append((con, np.arange(start, start + 1)))
        elif ext.problem == 2 and _privacy_B(lhs, X) is not None and rhs.is_constant():
            if ext.cost_constraint is not None:
                raise NotRecognised(_NAME, _EXPECTED, "two privacy-cost constraints")
            ext.B = _privacy_B(lhs, X)
            rho = np.asarray(constant_value(rhs), dtype=float).ravel()
            if rho.size != 1:
                raise NotRecognised(_NAME, _EXPECTED, "a privacy bound that is not a scalar")
            ext.rho = float(rho[0])
            ext.cost_constraint = con
        else:
            raise NotRecognised(_NAME, _EXPECTED, f"the constraint {con}")
    if not psd:
        raise NotRecognised(_NAME, _EXPECTED, "X without PSD=True or an X >> 0 constraint")
    if not rows_L:
        raise NotRecognised(_NAME, _EXPECTED, "no variance constraints")
    ext.L = np.vstack(rows_L)
    ext.c = np.concatenate(rows_c)
    if ext.problem == 2 and ext.cost_constraint is None:
        raise NotRecognised(_NAME, _EXPECTED, "Problem 2 without a privacy-cost constraint")
    k = X.shape[0]
    if ext.B.shape[0] != k or ext.L.shape[1] != k:
        raise NotRecognised(_NAME, _EXPECTED, "B, L and X of inconsistent sizes")
    # The model is of the right form; data without an attained optimum (no or only zero
    # queries, dependent rows of B, rho <= 0, inf or nan) is refused here, before any solve.
    validate(ext.B, ext.L, ext.c, rho=ext.rho if ext.problem == 2 else None)
    return ext


def _is_X(expr, X) -> bool:
    """``expr`` is ``X`` itself, possibly as ``X - 0`` (what ``X >> 0`` builds)."""
    if expr is X:
        return True
    if expr.variables() != [X] or expr.shape != X.shape:
        return False
    from .affine import Linearizer

    M, c = Linearizer([X])(expr)
    return (M != sp.identity(X.size)).nnz == 0 and not np.any(c)


def _check_target_count(con, index: int, m: int) -> None:
    """``ValueError`` unless the targets give one value per query or one for all: cvxpy
    broadcasts ``query_variance(L, X) <= c`` with ``c`` of shape ``(m, 1)`` to ``m x m``
    constraints, and ``cp.matrix_frac(l, X) <= c`` with a vector ``c`` to one constraint per
    entry of ``c``; neither is a target per query, and the targets would be misread."""
    lhs, rhs = con.args
    if con.size == m and rhs.size in (1, m):
        return
    what = (f"query_variance(L, X) has {m} entr{'y' if m == 1 else 'ies'} (one per row of L)"
            if isinstance(lhs, QueryVariance) else "cp.matrix_frac(l, X) is 1 query's variance")
    spread = f" (cvxpy broadcasts them to {con.size} constraints)" if rhs.size == m else ""
    raise ValueError(f"c (the variance targets) of constraint {index}: {what}, but c has "
                     f"{rhs.size} entr{'y' if rhs.size == 1 else 'ies'} of shape {rhs.shape}"
                     f"{spread}; give {'a scalar' if m == 1 else f'one per query, shape ({m},),'}"
                     f"{'' if m == 1 else ' or a scalar'}")


def _targets(rhs, m: int, s, con) -> np.ndarray:
    """Targets c from ``rhs`` = c (Problem 1) or ``s * c`` (Problem 2)."""
    if s is None:
        if not rhs.is_constant():
            raise NotRecognised(_NAME, _EXPECTED, f"non-constant variance targets in {con}")
        c = np.broadcast_to(np.asarray(constant_value(rhs), dtype=float).ravel(), (m,)).copy()
    else:
        from cvxpy.atoms.affine.promote import Promote

        def unwrap(e):
            return e.args[0] if isinstance(e, Promote) else e

        a, inner = _scaled(rhs)
        if unwrap(inner) is s:
            c = np.full(m, a)
        elif isinstance(rhs, (multiply, MulExpression)):
            x, y = rhs.args
            const, other = (x, y) if x.is_constant() else (y, x)
            if unwrap(other) is not s or not const.is_constant():
                raise NotRecognised(_NAME, _EXPECTED, f"targets other than s * c in {con}")
            c = np.broadcast_to(np.asarray(constant_value(const), dtype=float).ravel(), (m,)).copy()
        else:
            raise NotRecognised(_NAME, _EXPECTED, f"targets other than s * c in {con}")
    if np.any(~np.isfinite(c)) or np.any(c <= 0):
        raise ValueError(f"c: variance targets must be positive and finite, got {c}")
    return c
