"""Fitness-for-use mechanisms for the data publisher (Xiao, He, Zhang, Kifer, VLDB 2021).

:func:`fitness_problem` builds Problem 1 (meet every per-query variance target at the least
privacy cost) or Problem 2 (at a given privacy cost, scale all targets by the least common
factor) as a cvxpy model; :func:`mechanism` turns a solved precision ``X`` into what a
publisher needs: the noise covariance, the privacy cost, the exact ``(epsilon, delta)`` of the
correlated Gaussian mechanism, per-query variances, and a seeded release function.

Privacy (the paper's Theorem 3.2, Balle and Wang's exact Gaussian mechanism generalized to
correlated noise): the mechanism ``B x + N(0, Sigma)`` with ``X = Sigma^{-1}`` is
``(epsilon, delta)``-DP iff ``Phi(D/2 - epsilon/D) - e^epsilon Phi(-D/2 - epsilon/D) <= delta``
where ``D^2 = max_j b_j^T X b_j`` is the squared privacy cost.

Tie-breaking: Problem 1 asks for the optimum that is minimal under the refined privacy
ordering (the sorted vector of ``b_j^T X b_j``).  The soft-max solver tends towards it (the
soft max also penalizes the non-maximal terms), but this package does not certify the
tie-break; it certifies only the optimal privacy cost.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
import cvxpy as cp

from . import privacy
from .arrays import as_float_array, check_finite
from .atoms import privacy_cost, query_variance

__all__ = ["choose_basis", "fitness_problem", "FitnessModel", "Mechanism", "mechanism", "baseline_variances"]


def choose_basis(W) -> tuple[np.ndarray, np.ndarray]:
    """``W = L B`` with ``B`` linearly independent rows of ``W`` (pivoted QR) and ``L = W B^+``."""
    from ..solvers.fitness.newton_cg import choose_basis as _cb

    Wd = W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)
    if Wd.ndim != 2 or not np.all(np.isfinite(Wd)):
        raise ValueError(f"W must be a finite 2-D matrix, got shape {Wd.shape}")
    return _cb(Wd)


@dataclass
class FitnessModel:
    """A built fitness-for-use problem: ``problem`` is a plain cvxpy Problem over ``X``."""

    problem: cp.Problem
    X: cp.Variable
    L: np.ndarray
    B: np.ndarray
    c: np.ndarray
    s: cp.Variable | None = None

    def mechanism(self) -> "Mechanism":
        if self.X.value is None:
            raise ValueError("solve the problem first")
        return mechanism(self.X.value, self.L, self.B, self.c)


def fitness_problem(W, c, *, basis=None, privacy_bound: float | None = None) -> FitnessModel:
    """Problem 1 (``privacy_bound=None``): ``minimize privacy_cost(B, X)`` subject to
    ``query_variance(L, X) <= c``; Problem 2 (``privacy_bound=rho``, a squared privacy cost):
    ``minimize s`` subject to ``query_variance(L, X) <= s c`` and ``privacy_cost(B, X) <= rho``.

    ``W`` is the workload (m x n); ``basis`` an optional ``B`` with independent rows spanning
    ``W``'s row space (default: chosen from the rows of ``W``); ``c`` the variance targets (scalar
    or one per query, positive).
    """
    Wd = W.toarray().astype(float) if sp.issparse(W) else as_float_array(W, "W")
    if Wd.ndim != 2:
        raise ValueError(f"W must be a finite 2-D matrix, got shape {np.shape(Wd)}")
    check_finite(Wd, "W (the workload)")
    m = Wd.shape[0]
    if m == 0 or Wd.shape[1] == 0:
        raise ValueError(f"W (the workload) has no queries or no cells, shape {Wd.shape}")
    if not np.any(Wd):
        raise ValueError("W (the workload): every query is zero, so no noise level is optimal")
    c = as_float_array(c, "c (the variance targets)")
    c = np.broadcast_to(c, (m,)).copy() if c.ndim == 0 else c
    if c.shape != (m,):
        raise ValueError(f"c must be a scalar or have one target per query ({m},), got {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("c: variance targets must be positive and finite")
    if basis is None:
        L, B = choose_basis(Wd)
    else:
        B = basis.toarray() if sp.issparse(basis) else as_float_array(basis, "basis")
        if B.ndim != 2 or B.shape[1] != Wd.shape[1]:
            raise ValueError(f"basis must have {Wd.shape[1]} columns like W, got shape {B.shape}")
        check_finite(B, "basis (B)")         # before the rank's SVD, which fails on a NaN
        if np.linalg.matrix_rank(B) < B.shape[0]:
            raise ValueError("basis: the rows of B must be linearly independent")
        L = la.lstsq(B.T, Wd.T)[0].T
        if not np.allclose(L @ B, Wd, atol=1e-8 * max(1.0, np.abs(Wd).max())):
            raise ValueError("basis: the rows of W are not in the row space of B")
    k = B.shape[0]
    X = cp.Variable((k, k), PSD=True, name="X")
    if privacy_bound is None:
        prob = cp.Problem(cp.Minimize(privacy_cost(B, X)), [query_variance(L, X) <= c])
        return FitnessModel(prob, X, L, B, c)
    if not (np.isfinite(privacy_bound) and privacy_bound > 0):
        raise ValueError(f"privacy_bound must be positive and finite, got {privacy_bound!r}")
    s = cp.Variable(name="s")
    prob = cp.Problem(cp.Minimize(s), [query_variance(L, X) <= s * c,
                                       privacy_cost(B, X) <= privacy_bound])
    return FitnessModel(prob, X, L, B, c, s)


@dataclass
class Mechanism:
    """The correlated Gaussian mechanism ``W x + L N(0, Sigma)`` answering ``W = L B``."""

    precision: np.ndarray      # X
    covariance: np.ndarray     # Sigma = X^{-1}
    L: np.ndarray
    B: np.ndarray
    c: np.ndarray

    @property
    def squared_privacy_cost(self) -> float:
        return float(np.max(np.einsum("ij,ij->j", self.B, self.precision @ self.B)))

    @property
    def privacy_cost(self) -> float:
        """The Mahalanobis sensitivity ``max_j sqrt(b_j^T Sigma^{-1} b_j)``."""
        return float(np.sqrt(self.squared_privacy_cost))

    @property
    def variances(self) -> np.ndarray:
        """Per-query variance ``l_i^T Sigma l_i``."""
        return np.einsum("ij,ij->i", self.L @ self.covariance, self.L)

    @property
    def variance_ratios(self) -> np.ndarray:
        return self.variances / self.c

    def delta(self, epsilon: float) -> float:
        """Exact delta at ``epsilon`` (correlated Gaussian mechanism, Xiao et al. Thm 3.2)."""
        return privacy.gaussian_delta(1.0, epsilon, self.privacy_cost)

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon with ``delta(epsilon) <= delta``."""
        return privacy.gaussian_epsilon(1.0, delta, self.privacy_cost)

    def release(self, data, rng=None) -> np.ndarray:
        """Noisy workload answers ``L (B x + e)``, ``e ~ N(0, Sigma)`` drawn with a seeded rng."""
        x = np.asarray(data, dtype=float).ravel()
        if x.size != self.B.shape[1]:
            raise ValueError(f"data must have {self.B.shape[1]} cells, got {x.size}")
        rng = np.random.default_rng(rng)
        chol = la.cholesky((self.covariance + self.covariance.T) / 2, lower=True)
        e = chol @ rng.standard_normal(self.B.shape[0])
        return self.L @ (self.B @ x + e)


def mechanism(X, L, B, c) -> Mechanism:
    """Package a precision matrix ``X`` as a :class:`Mechanism`."""
    X = np.asarray(X, dtype=float)
    X = (X + X.T) / 2
    cov = la.cho_solve(la.cho_factor(X, lower=True), np.eye(X.shape[0]))
    return Mechanism(X, (cov + cov.T) / 2, np.asarray(L, dtype=float), np.asarray(B, dtype=float),
                     np.asarray(c, dtype=float))


# --- baselines (Xiao et al. sec. 7): other Gaussian mechanisms at the same privacy cost ----
def baseline_variances(W, squared_cost: float, method: str, c=None, *, branching=None,
                       strategy=None, solver: str = "SCS", **solver_opts) -> np.ndarray:
    """Per-query variances of a baseline mechanism calibrated to the squared privacy cost
    ``squared_cost`` (the Mahalanobis sensitivity squared, as for :class:`Mechanism`).

    * ``"IP"`` input perturbation: i.i.d. noise on the cells, ``sigma^2 = 1 / cost``.
    * ``"HM"`` hierarchical mechanism (Hay et al.; Qardaji et al.): i.i.d. noise on the nodes
      of a k-ary tree over the cells, least squares; every cell lies in ``h + 1`` nodes, so
      ``sigma^2 = (h + 1) / cost``.  ``branching`` fixes k; by default the k in 2..16 with the
      smallest maximum variance ratio is used.  ``strategy`` (a query matrix over the cells,
      e.g. :func:`cvxdp.workloads.sqrt_tree`, the tree of the paper's experiments) replaces
      the k-ary tree: least squares on its answers, ``sigma^2 = Delta_2(strategy)^2 / cost``.
    * ``"CA"`` the matrix mechanism minimizing total variance (Yuan et al. 2016):
      ``X = argmin tr(W^T W X^{-1}) s.t. diag(X) <= 1`` (written with ``cp.matrix_frac``, solved
      by ``solver``), ``sigma^2 = 1 / cost``.  ``"wCA-I"`` / ``"wCA-II"`` weight query ``i`` by
      ``1 / c_i`` / ``1 / sqrt(c_i)`` in the total.
    """
    from . import analysis
    from . import workloads

    Wd = W.toarray() if sp.issparse(W) else np.asarray(W, dtype=float)
    m, n = Wd.shape
    if not squared_cost > 0:
        raise ValueError(f"squared_cost must be positive, got {squared_cost!r}")
    if strategy is not None and method != "HM":
        raise ValueError(f"strategy= is an HM option; method is {method!r}")
    if method == "IP":
        return np.sum(Wd * Wd, axis=1) / squared_cost
    if method == "HM" and strategy is not None:
        if branching is not None:
            raise ValueError("HM takes branching= or strategy=, not both")
        A = strategy.toarray() if sp.issparse(strategy) else np.asarray(strategy, dtype=float)
        if A.ndim != 2 or A.shape[1] != n:
            raise ValueError(f"strategy must be a query matrix with {n} columns (W's cells), "
                             f"got shape {A.shape}")
        if not np.all(np.isfinite(A)):
            raise ValueError("strategy contains NaN or inf")
        if np.linalg.matrix_rank(A) < n:
            raise ValueError("strategy must have full column rank (every cell estimable)")
        sigma = analysis.sensitivity(A, 2) / np.sqrt(squared_cost)
        return analysis.query_errors(Wd, A, noise="gaussian", sigma=sigma)
    if method == "HM":
        ks = [branching] if branching else list(range(2, 17))
        best = None
        for k in ks:
            tree = workloads.hierarchy(n, k)
            A = tree.queries.toarray()
            G = A.T @ A
            var = (tree.height + 1) / squared_cost * np.einsum("ij,ji->i", Wd, np.linalg.solve(G, Wd.T))
            ratio = np.max(var / (1.0 if c is None else np.asarray(c)))
            if best is None or ratio < best[0]:
                best = (ratio, var)
        return best[1]
    if method in ("CA", "wCA-I", "wCA-II"):
        weights = np.ones(m)
        if method != "CA":
            if c is None:
                raise ValueError(f"{method} needs the variance targets c")
            cc = np.broadcast_to(np.asarray(c, dtype=float), (m,))
            weights = 1.0 / cc if method == "wCA-I" else 1.0 / np.sqrt(cc)
        G = (Wd.T * weights) @ Wd
        evals, V = np.linalg.eigh((G + G.T) / 2)
        R = V * np.sqrt(np.maximum(evals, 0.0))          # G = R R^T
        X = cp.Variable((n, n), PSD=True)
        prob = cp.Problem(cp.Minimize(cp.matrix_frac(R, X)), [cp.diag(X) <= 1])
        prob.solve(solver=solver, **solver_opts)
        if X.value is None:
            raise RuntimeError(f"{method}: {solver} returned status {prob.status}")
        Xv = (X.value + X.value.T) / 2
        return np.einsum("ij,ji->i", Wd, np.linalg.solve(Xv, Wd.T)) / squared_cost
    raise ValueError(f"method must be one of IP, HM, CA, wCA-I, wCA-II; got {method!r}")
