"""Atoms of the fitness-for-use problem (Xiao, He, Zhang, Kifer, VLDB 2021, Problem 1).

On a marginal workload (``W = cvxdp.workloads.marginal_workload(...)``, a first argument that
is a :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload`) both functions take the
residual variances ``s`` instead and build the residual-basis forms of
:mod:`cvxdp.modelling.residual_atoms`.  The dense forms below:

``X`` is the precision (inverse covariance) of correlated Gaussian noise added to the basis
answers ``B x``; the workload is ``W = L B``.

* ``query_variance(L, X)``: the vector ``v_i = l_i^T X^{-1} l_i``, the variance of every
  workload query (convex in ``X > 0``: a ``matrix_frac`` per row).
* ``privacy_cost(B, X)``: ``max_j b_j^T X b_j`` over the columns ``b_j`` of ``B``, the squared
  Mahalanobis sensitivity that fixes the privacy of the mechanism (affine inside a max).

For standard solvers they canonicalize to one ``matrix_frac`` LMI per query and to a max of
affine functions.  cvxdp's NEWTON_CG recognises them (and the plain spellings
``cp.matrix_frac(l_i, X) <= c_i``, ``cp.max(cp.diag(B.T @ X @ B))``).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.linalg as la
import cvxpy as cp
import cvxpy.atoms as cp_atoms
from cvxpy.constraints.constraint import Constraint
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS
from cvxpy.reductions.dcp2cone.canonicalizers.matrix_frac_canon import matrix_frac_canon

from .arrays import as_float_array, check_finite
from .convex_atom import ConvexAtom
from .marginal_workload import MarginalWorkload
from .residual_atoms import ResidualPrivacyCost, residual_privacy_cost, residual_variance

__all__ = ["QueryVariance", "PrivacyCost", "ResidualPrivacyCost", "query_variance",
           "privacy_cost"]


def _dense(M, name: str) -> np.ndarray:
    """``M`` as a finite 2-D float array; a NaN or inf is refused here, naming the entry,
    before anything factorises it (an SVD of a NaN "did not converge")."""
    A = M.toarray().astype(float) if sp.issparse(M) else as_float_array(M, name)
    if A.ndim == 1:
        A = A[None, :]
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {A.shape}")
    check_finite(A, name)
    return A


def _check_X(X, k: int, atom: str) -> cp.Expression:
    X = X if isinstance(X, cp.Expression) else cp.Constant(X)
    if X.shape != (k, k):
        raise ValueError(f"{atom}: X must have shape ({k}, {k}) to match the matrix, got {X.shape}")
    return X


class QueryVariance(ConvexAtom):
    """``[l_i^T X^{-1} l_i for each row l_i of L]`` (convex in positive definite ``X``)."""

    def __init__(self, X, L) -> None:
        self.L = _dense(L, "query_variance: L")
        super().__init__(_check_X(X, self.L.shape[1], "query_variance"))

    def get_data(self):
        return [self.L]

    def numeric(self, values):
        """The variances; ``+inf`` each where ``X`` is not numerically positive definite
        (outside the atom's domain: its convex extension, as a standard solver's inaccurate
        ``X`` may be, rather than LAPACK's error from ``.value``)."""
        X = np.asarray(values[0], dtype=float)
        try:
            c = la.cho_factor((X + X.T) / 2, lower=True)
        except la.LinAlgError:
            return np.full(self.L.shape[0], np.inf)
        Z = la.cho_solve(c, self.L.T)
        return np.einsum("ij,ji->i", self.L, Z)

    def shape_from_args(self):
        return (self.L.shape[0],)

    def sign_from_args(self):
        return (True, False)


    def _domain(self) -> list[Constraint]:
        return [self.args[0] >> 0]

    def _grad(self, values):
        X = np.asarray(values[0], dtype=float)
        try:
            Xi = np.linalg.inv(X)
        except np.linalg.LinAlgError:
            return [None]
        Z = self.L @ Xi                     # rows z_i = (X^{-1} l_i)^T
        # d v_i / d X = -z_i z_i^T, one column per output, vectorised in column-major order
        cols = [(-np.outer(z, z)).ravel(order="F") for z in Z]
        return [sp.csc_array(np.column_stack(cols))]

    def name(self) -> str:
        return f"query_variance(L[{self.L.shape[0]}x{self.L.shape[1]}], {self.args[0].name()})"

    __repr__ = name


class PrivacyCost(ConvexAtom):
    """``max_j b_j^T X b_j`` over the columns of ``B`` (convex: a max of affine functions)."""

    def __init__(self, X, B) -> None:
        self.B = _dense(B, "privacy_cost: B")
        super().__init__(_check_X(X, self.B.shape[0], "privacy_cost"))

    def get_data(self):
        return [self.B]

    def numeric(self, values):
        X = np.asarray(values[0], dtype=float)
        return float(np.max(np.einsum("ij,ij->j", self.B, X @ self.B)))

    def shape_from_args(self):
        return ()

    def sign_from_args(self):
        return (False, False)


    def _grad(self, values):
        X = np.asarray(values[0], dtype=float)
        p = np.einsum("ij,ij->j", self.B, X @ self.B)
        b = self.B[:, int(np.argmax(p))]
        return [sp.csc_array(np.outer(b, b).ravel(order="F")[:, None])]

    def expression(self) -> cp.Expression:
        """The same function as a plain cvxpy expression."""
        B = self.B
        return cp.max(cp.diag(B.T @ self.args[0] @ B))

    def name(self) -> str:
        return f"privacy_cost(B[{self.B.shape[0]}x{self.B.shape[1]}], {self.args[0].name()})"

    __repr__ = name


def query_variance(L, X) -> QueryVariance | cp.Expression:
    """Variance ``l_i^T X^{-1} l_i`` of every workload query ``i`` under noise of precision ``X``.

    With a :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload` ``W`` and residual
    variances ``s``, ``query_variance(W, s)``: the variance of every cell of each workload
    marginal, ``V s`` (affine; :mod:`cvxdp.modelling.residual_atoms`)."""
    if isinstance(L, MarginalWorkload):
        return residual_variance(L, X)
    return QueryVariance(X, L)


def privacy_cost(B, X) -> PrivacyCost | ResidualPrivacyCost:
    """Squared privacy cost ``max_j b_j^T X b_j`` of noise of precision ``X`` on ``B x``.

    With a :class:`~cvxdp.modelling.marginal_workload.MarginalWorkload` ``W`` and residual
    variances ``s``, ``privacy_cost(W, s) = sum_A p_A / s_A`` (convex;
    :mod:`cvxdp.modelling.residual_atoms`), the same squared sensitivity as the dense atom's."""
    if isinstance(B, MarginalWorkload):
        return residual_privacy_cost(B, X)
    return PrivacyCost(X, B)


# --- canonicalization for standard solvers ---------------------------------------------
def _query_variance_canon(expr: QueryVariance, args, solver_context=None):
    """One ``matrix_frac`` LMI per row: ``[[X, l_i], [l_i^T, t_i]] >= 0``."""
    X = args[0]
    ts, cons = [], []
    for row in expr.L:
        # cvxpy's own matrix_frac canonicalizer reads only its arguments (x, P)
        t, c = matrix_frac_canon(None, [cp.Constant(row), X], solver_context=solver_context)
        ts.append(t)
        cons += c
    return cp.hstack(ts), cons


def _privacy_cost_canon(expr: PrivacyCost, args, solver_context=None):
    """``t`` with ``diag(B^T X B) <= t``."""
    X = args[0]
    t = cp.Variable()
    return t, [cp.diag(expr.B.T @ X @ expr.B) <= t]


CANON_METHODS[QueryVariance] = _query_variance_canon
CANON_METHODS[PrivacyCost] = _privacy_cost_canon
if QueryVariance not in cp_atoms.PSD_ATOMS:
    cp_atoms.PSD_ATOMS.append(QueryVariance)    # tells cvxpy the problem needs a PSD cone
