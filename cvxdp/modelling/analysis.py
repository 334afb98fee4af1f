"""Data-independent error of answering a workload from a strategy (the matrix mechanism).

A *strategy* ``A`` is answered with i.i.d. noise of variance ``v`` per answer
(Laplace with scale ``Delta_1(A) / epsilon``: ``v = 2 (Delta_1 / epsilon)^2``; Gaussian:
``v = sigma^2``), the data vector is reconstructed by least squares,
``x_hat = (A^T A)^+ A^T y``, and the *workload* ``W`` is answered as ``W x_hat``.  The
expected squared error of query ``w`` is (Li, Hay, Rastogi, Miklau, McGregor, PODS 2010)

    E (w^T x_hat - w^T x)^2 = v * w^T (A^T A)^+ w,

and the total over the workload is ``v * trace(W (A^T A)^+ W^T) = v * <(A^T A)^+, W^T W>``,
so only the Gram matrices matter.  That is what makes large workloads cheap: all
``n(n+1)/2`` range queries have the closed-form Gram ``(W^T W)_ij = (min(i,j) + 1)(n - max(i,j))``
(0-based), and the all-range *strategy* likewise, so ``n = 2^12`` takes seconds.

Strategies of the lecture notes (seed 001): identity, answer every range, the
hierarchical k-ary tree (Hay et al. 2010), the Haar wavelet with Privlet weights
(Xiao, Wang, Gehrke), or any user matrix.  :func:`simulate_error` checks the closed
form by Monte Carlo.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from . import mechanisms
from . import privacy

__all__ = ["Implicit", "all_ranges_gram", "prefix_gram", "implicit_all_ranges", "implicit_prefix",
           "noise_variance", "sensitivity", "expected_error", "direct_error", "query_errors",
           "simulate_error"]


@dataclass(frozen=True)
class Implicit:
    """A query matrix known through its Gram matrix ``Q^T Q`` (and its sensitivities),
    for workloads or strategies too large to store, such as all ``n(n+1)/2`` ranges."""

    name: str
    n: int
    m: int
    gram: Callable[[], np.ndarray]      # cached by the factories: build once, reuse
    l1_sensitivity: float
    l2_sensitivity: float

    @property
    def shape(self) -> tuple[int, int]:
        return (self.m, self.n)


Matrix = Union[np.ndarray, sp.spmatrix, Implicit]


def all_ranges_gram(n: int) -> np.ndarray:
    """``W^T W`` for all ranges ``[i, j]``: the number of ranges covering cells ``a`` and ``b``,
    ``(min(a, b) + 1) * (n - max(a, b))``."""
    i = np.arange(n)
    lo = np.minimum.outer(i, i)
    hi = np.maximum.outer(i, i)
    return ((lo + 1) * (n - hi)).astype(float)


def prefix_gram(n: int) -> np.ndarray:
    """``W^T W`` for the prefix queries ``[0, i]``: ``n - max(a, b)``."""
    i = np.arange(n)
    return (n - np.maximum.outer(i, i)).astype(float)


def implicit_all_ranges(n: int) -> Implicit:
    """All ``n(n+1)/2`` range queries, implicitly.  A cell ``a`` lies in ``(a+1)(n-a)`` ranges."""
    _check_n(n)
    cover = (np.arange(n) + 1) * (n - np.arange(n))
    return Implicit("all ranges", n, n * (n + 1) // 2, functools.cache(lambda: all_ranges_gram(n)),
                    float(cover.max()), float(np.sqrt(cover.max())))


def implicit_prefix(n: int) -> Implicit:
    """The ``n`` prefix queries, implicitly (cell 0 lies in all of them)."""
    _check_n(n)
    return Implicit("prefix", n, n, functools.cache(lambda: prefix_gram(n)), float(n), float(np.sqrt(n)))


def _check_n(n: int) -> None:
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")


def _gram(Q: Matrix) -> np.ndarray:
    if isinstance(Q, Implicit):
        return Q.gram()
    if sp.issparse(Q):
        return np.asarray((Q.T @ Q).toarray(), dtype=float)
    Q = np.asarray(Q, dtype=float)
    if Q.ndim != 2:
        raise ValueError(f"expected a 2-D query matrix, got shape {Q.shape}")
    return Q.T @ Q


def _ncols(Q: Matrix) -> int:
    return Q.n if isinstance(Q, Implicit) else Q.shape[1]


def sensitivity(A: Matrix, norm: int = 1) -> float:
    """L1 (``norm=1``) or L2 (``norm=2``) sensitivity of a strategy: the largest column norm."""
    if norm not in (1, 2):
        raise ValueError(f"norm must be 1 or 2, got {norm!r}")
    if isinstance(A, Implicit):
        return A.l1_sensitivity if norm == 1 else A.l2_sensitivity
    return mechanisms.l1_sensitivity(A) if norm == 1 else mechanisms.l2_sensitivity(A)


def noise_variance(A: Matrix, *, noise: str = "laplace", epsilon: float | None = None,
                   delta: float | None = None, sigma: float | None = None) -> float:
    """Variance of the noise on each strategy answer.

    Laplace: ``2 (Delta_1(A) / epsilon)^2``.  Gaussian: ``sigma^2``, or calibrated to
    ``(epsilon, delta)`` with the analytic Gaussian mechanism (Balle and Wang 2018)
    at ``Delta_2(A)``.
    """
    if noise == "laplace":
        if epsilon is None or not epsilon > 0:
            raise ValueError(f"epsilon must be positive for Laplace noise, got {epsilon!r}")
        return 2.0 * (sensitivity(A, 1) / float(epsilon)) ** 2
    if noise == "gaussian":
        if sigma is not None:
            if not sigma > 0:
                raise ValueError(f"sigma must be positive, got {sigma!r}")
            return float(sigma) ** 2
        if epsilon is None or delta is None:
            raise ValueError("gaussian noise needs sigma, or epsilon and delta")
        return privacy.gaussian_sigma(epsilon, delta, sensitivity(A, 2)) ** 2
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")


class _GramInverse:
    """``(A^T A)^+`` through a Cholesky factor when ``A`` has full column rank,
    else through the eigendecomposition (pseudo-inverse)."""

    def __init__(self, G: np.ndarray) -> None:
        self.n = G.shape[0]
        try:
            self.chol = la.cho_factor(G, lower=True, check_finite=False)
            # a numerically singular Gram passes Cholesky with a tiny pivot: check it
            d = np.abs(np.diag(self.chol[0]))
            if d.min() <= 1e-7 * d.max():
                raise la.LinAlgError("ill conditioned")
            self.pinv = None
        except la.LinAlgError:
            self.chol = None
            evals, V = np.linalg.eigh(G)
            keep = evals > 1e-10 * max(float(evals.max()), 1e-300)
            self.pinv = (V[:, keep] / evals[keep]) @ V[:, keep].T

    def inverse(self) -> np.ndarray:
        """The (pseudo-)inverse itself; from the Cholesky factor by LAPACK's potri."""
        if self.chol is None:
            return self.pinv
        c, lower = self.chol
        inv, info = la.lapack.dpotri(c, lower=lower)
        if info != 0:
            return la.cho_solve(self.chol, np.eye(self.n), check_finite=False)
        return np.tril(inv) + np.tril(inv, -1).T if lower else np.triu(inv) + np.triu(inv, 1).T

    def solve(self, B: np.ndarray) -> np.ndarray:
        if self.chol is not None:
            return la.cho_solve(self.chol, B, check_finite=False)
        return self.pinv @ B


def expected_error(W: Matrix, A: Matrix, *, noise: str = "laplace", epsilon: float | None = 1.0,
                   delta: float | None = None, sigma: float | None = None) -> float:
    """Expected total squared error ``v * trace(W (A^T A)^+ W^T)`` of answering ``W``
    from the noisy strategy ``A`` with least-squares reconstruction.

    ``W`` and ``A`` are matrices (dense or sparse) or :class:`Implicit` ones.  If the
    strategy does not determine every query of ``W`` (``W`` not in the row space of
    ``A``) the error is infinite.
    """
    n = _ncols(A)
    if _ncols(W) != n:
        raise ValueError(f"W has {_ncols(W)} columns and A has {n}: both act on the same cells")
    v = noise_variance(A, noise=noise, epsilon=epsilon, delta=delta, sigma=sigma)
    GA, GW = _gram(A), _gram(W)
    inv = _GramInverse(GA)
    if inv.pinv is not None and not _in_row_space(GA, GW, inv):
        return float("inf")
    # trace((A^T A)^+ W^T W) = <(A^T A)^+, W^T W>: one inverse, then an elementwise sum
    return float(v * np.sum(inv.inverse() * GW))


def _in_row_space(GA, GW, inv) -> bool:
    """``W`` is answerable iff ``W^T W`` lives in range(A^T A): P GW = GW for the projector P."""
    P = inv.pinv @ GA
    return bool(np.allclose(P @ GW, GW, atol=1e-8 * max(1.0, np.abs(GW).max())))


def direct_error(W: Matrix, *, noise: str = "laplace", epsilon: float | None = 1.0,
                 delta: float | None = None, sigma: float | None = None) -> float:
    """Total expected squared error of answering the workload as it is (strategy = W, no
    reconstruction): the noise variance at W's own sensitivity times the number of queries."""
    return noise_variance(W, noise=noise, epsilon=epsilon, delta=delta, sigma=sigma) * W.shape[0]


def query_errors(W: np.ndarray | sp.spmatrix, A: Matrix, *, noise: str = "laplace",
                 epsilon: float | None = 1.0, delta: float | None = None,
                 sigma: float | None = None) -> np.ndarray:
    """Expected squared error of every query (row) of an explicit workload ``W``:
    ``v * diag(W (A^T A)^+ W^T)``."""
    if isinstance(W, Implicit):
        raise TypeError("query_errors needs an explicit workload matrix (one row per query)")
    n = _ncols(A)
    Wd = W.toarray() if sp.issparse(W) else np.atleast_2d(np.asarray(W, dtype=float))
    if Wd.shape[1] != n:
        raise ValueError(f"W has {Wd.shape[1]} columns and A has {n}")
    v = noise_variance(A, noise=noise, epsilon=epsilon, delta=delta, sigma=sigma)
    inv = _GramInverse(_gram(A))
    return v * np.einsum("ij,ji->i", Wd, inv.solve(Wd.T))


def simulate_error(W: Matrix, A: np.ndarray | sp.spmatrix, x: np.ndarray, *, trials: int = 1000,
                   noise: str = "laplace", epsilon: float | None = 1.0, delta: float | None = None,
                   sigma: float | None = None, rng=None, per_query: bool = False):
    """Monte-Carlo estimate of the total squared error: release ``A x + noise``,
    reconstruct ``x_hat`` by least squares and average ``|W (x_hat - x)|^2 =
    (x_hat - x)^T W^T W (x_hat - x)`` over ``trials`` releases.  With
    ``per_query=True`` (explicit ``W``), the mean squared error of each query instead."""
    if isinstance(A, Implicit):
        raise TypeError("simulate_error needs an explicit strategy matrix")
    rng = np.random.default_rng(rng)
    Ad = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=float)
    x = np.asarray(x, dtype=float)
    if x.shape != (Ad.shape[1],):
        raise ValueError(f"x must have shape ({Ad.shape[1]},), got {x.shape}")
    v = noise_variance(A, noise=noise, epsilon=epsilon, delta=delta, sigma=sigma)
    inv = _GramInverse(Ad.T @ Ad)
    GW = _gram(W)
    m = Ad.shape[0]
    if noise == "laplace":
        E = rng.laplace(scale=np.sqrt(v / 2.0), size=(trials, m))
    else:
        E = rng.normal(scale=np.sqrt(v), size=(trials, m))
    # x_hat - x = (A^T A)^+ A^T e for each noise draw e (rows of E)
    D = inv.solve(Ad.T @ E.T)            # n x trials
    if per_query:
        if isinstance(W, Implicit):
            raise TypeError("per_query=True needs an explicit workload matrix")
        Wd = W.toarray() if sp.issparse(W) else np.atleast_2d(np.asarray(W, dtype=float))
        return np.mean((Wd @ D) ** 2, axis=1)
    return float(np.mean(np.einsum("it,ij,jt->t", D, GW, D)))
