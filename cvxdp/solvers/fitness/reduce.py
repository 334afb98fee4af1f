"""Exact reduction of a fitness-for-use instance to a well-posed one, and the way back.

Problem 1 (see :mod:`cvxdp.solvers.fitness.newton_cg`): minimize ``max_j b_j^T X b_j`` subject to
``l_i^T X^{-1} l_i <= c_i`` over positive definite ``X`` (``k x k``).  The Newton-CG method
needs a workload matrix ``L`` of full column rank and one constraint per direction; real
workloads have neither (random ranges leave adjacent cells no query separates, workloads
repeat queries).  This module

* **validates** the data, raising ``ValueError`` naming the argument for what has no
  attained optimum or no meaning (:func:`validate`);
* **drops zero rows** of ``L`` (their constraint ``0 <= c_i`` always holds);
* **normalizes rows** (``l_i / |l_i|`` with target ``c_i / |l_i|^2``, the same constraint)
  and **merges parallel rows** (``l`` and ``-2 l`` are one constraint): the tightest target
  of a group is kept;
* **reduces the rank**: with the SVD of the normalized rows ``L_n = U S V^T`` and
  ``r = #{s_a > rank_rtol * s_1}``, ``R = V_r^T`` (orthonormal rows) and the problem in
  ``r`` coordinates has ``L' = L_n R^T``, ``B' = R B``.

Why the reduction is exact.  For a feasible ``X`` of the original problem,
``X' = (R X^{-1} R^T)^{-1}`` is feasible for the reduced one with equal variances
(``l_i = R^T R l_i`` for rows in the row space of ``R``) and no larger privacy cost, since
``R^T (R X^{-1} R^T)^{-1} R <= X`` (``X^{-1/2} R^T (R X^{-1} R^T)^{-1} R X^{-1/2}`` is an
orthogonal projector).  Conversely a reduced ``X'`` maps to ``R^T X' R`` with the same
privacy cost and ``l_i^T (R^T X' R)^+ l_i = l'_i^T X'^{-1} l'_i``.  So both optima agree.

**Returned point: positive definite, not singular.**  ``R^T X' R`` is singular: it puts
infinite noise on the directions no query sees.  We return instead
``X = R^T X' R + delta N^T N`` (``N`` an orthonormal basis of the null space of ``R``):

* the variance atoms need a positive definite ``X``: ``cvxdp.query_variance`` factors it by
  Cholesky and ``cp.matrix_frac(l, X).value`` inverts it, and both raise ``LinAlgError`` on a
  singular ``X`` even for ``l`` in its range (checked with cvxpy 1.9); ``cvxdp.fitness.mechanism``
  inverts it to draw the noise, which is impossible with infinite variance;
* the extra privacy cost is ``delta max_j |N b_j|^2``, and ``delta`` is chosen (in
  :func:`lift_precision`) so that this is ``pad_fraction`` times the reduced cost, a small
  fraction of the tolerance ``eps_rel``; the extra variance ``|N l_i|^2 / delta`` is zero in
  exact arithmetic and rounding-sized otherwise.  The caller then rescales ``X`` to meet
  every target exactly, evaluates the objective on the original data and certifies it with
  the original data's dual bound, so the reported numbers never rely on this argument.

The rank decision uses the named relative tolerance ``rank_rtol`` (default
:data:`RANK_RTOL`) on the singular values of the row-normalized ``L``; dropping a
singular value ``s`` perturbs a normalized row by at most ``s`` in norm, and the final
certificate on the original data accounts for it.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg as la

__all__ = ["RANK_RTOL", "Reduction", "validate", "reduce", "lift_precision", "project_precision",
           "lift_multipliers", "exact_parts", "fingerprint"]

#: singular values of the row-normalized workload below this fraction of the largest are zero
RANK_RTOL = 1e-10
# normalized rows equal after rounding to this grid (and sign) are one constraint
_DUP_GRID = 1e-13


def validate(B, L, c, rho: float | None = None) -> None:
    """Raise ``ValueError`` naming the argument when the instance has no attained optimum.

    * ``B`` must be a finite ``k x n`` matrix with ``n >= 1`` and linearly independent rows
      (otherwise noise along a direction no column of ``B`` sees is free and the infimum
      is not attained);
    * ``L`` a finite ``m x k`` matrix with ``m >= 1`` and at least one nonzero row (with
      every query zero the infimum 0 needs infinite noise);
    * ``c`` one positive, finite target per row of ``L``;
    * ``rho`` (Problem 2's privacy bound) positive and finite: a privacy cost is never
      negative, ``rho = 0`` admits no positive definite ``X``, and ``rho = inf`` lets the
      variance scale go to 0 without being attained.
    """
    B = np.asarray(B, dtype=float)
    L = np.asarray(L, dtype=float)
    c = np.asarray(c, dtype=float)
    if B.ndim != 2 or B.shape[0] < 1 or B.shape[1] < 1:
        raise ValueError(f"B (the basis) must be a nonempty 2-D matrix, got shape {B.shape}")
    if not np.all(np.isfinite(B)):
        raise ValueError("B (the basis) contains NaN or inf")
    k = B.shape[0]
    if L.ndim != 2 or L.shape[1] != k:
        raise ValueError(f"L (the workload in the basis) must have {k} columns, got shape {L.shape}")
    if L.shape[0] == 0:
        raise ValueError("L (the workload) has no rows: there is no query to answer")
    if not np.all(np.isfinite(L)):
        raise ValueError("L (the workload) contains NaN or inf")
    if not np.any(L):
        raise ValueError("L (the workload): every query is zero, so no noise level is optimal "
                         "(the privacy cost tends to 0 only with infinite noise)")
    if c.shape != (L.shape[0],):
        raise ValueError(f"c (the variance targets) must have one entry per query ({L.shape[0]}), "
                         f"got shape {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError("c (the variance targets) must be positive and finite")
    s = np.linalg.svd(B, compute_uv=False)
    if s.size < k or s[-1] <= RANK_RTOL * s[0]:
        raise ValueError("B (the basis): its rows must be linearly independent")
    if rho is not None:
        if not (math.isfinite(rho) and rho > 0):
            raise ValueError(f"rho (the privacy bound) must be positive and finite, got {rho!r}")


def fingerprint(B: np.ndarray, L: np.ndarray, c: np.ndarray, eta: float) -> str:
    """Digest of the instance, so a warm-start state is only reused for the same data."""
    h = hashlib.blake2b(digest_size=16)
    for a in (B, L, c):
        a = np.ascontiguousarray(a, dtype=float)
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    h.update(repr(float(eta)).encode())
    return h.hexdigest()


@dataclass
class Reduction:
    """The reduced instance ``(B', L', c')`` and what maps its answers back.

    Reduced row ``a`` is original row ``rows[a]`` divided by ``norms[a]`` (rotated by ``R``
    when ``R`` is not ``None``); ``groups[a]`` lists every original row it stands for."""

    B: np.ndarray                 # r x n
    L: np.ndarray                 # m' x r
    c: np.ndarray                 # m'
    rows: np.ndarray              # m': original index of each reduced row
    norms: np.ndarray             # m': |l_rows[a]| (1 when rows are not normalized)
    groups: list                  # m' arrays of original indices
    R: np.ndarray | None          # r x k, orthonormal rows (None: no rotation, r = k)
    N: np.ndarray | None          # (k - r) x k, orthonormal basis of the null space of R
    rank: int
    k: int
    m: int
    zero_rows: np.ndarray         # original indices of zero rows
    singular_values: np.ndarray

    @property
    def reduced(self) -> bool:
        return self.R is not None


def reduce(B: np.ndarray, L: np.ndarray, c: np.ndarray, rank_rtol: float = RANK_RTOL,
           normalize: bool = True) -> Reduction:
    """Drop zero rows, merge parallel rows (``normalize``) and reduce to full column rank.

    ``normalize=False`` keeps every nonzero row as it is (the hybrid objective's total
    variance counts each query); the rank reduction is exact either way."""
    B = np.asarray(B, dtype=float)
    L = np.asarray(L, dtype=float)
    c = np.asarray(c, dtype=float)
    m, k = L.shape
    norms_all = np.sqrt(np.einsum("ij,ij->i", L, L))
    nz = np.flatnonzero(norms_all > 0)
    zero_rows = np.flatnonzero(norms_all == 0)
    Ln = L[nz] / norms_all[nz, None]
    if normalize:
        cn = c[nz] / norms_all[nz] ** 2
        # sign: the entry of largest magnitude positive, then group equal rows
        piv = np.argmax(np.abs(Ln), axis=1)
        sgn = np.sign(Ln[np.arange(len(nz)), piv])
        key = np.round(Ln * sgn[:, None] / _DUP_GRID)
        _, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = np.asarray(inverse).ravel()
        n_groups = int(inverse.max()) + 1
        groups = [[] for _ in range(n_groups)]
        for pos, g in enumerate(inverse):
            groups[g].append(pos)
        # keep the tightest target of every group, in the order of first appearance
        order = sorted(range(n_groups), key=lambda g: groups[g][0])
        keep = []
        for g in order:
            members = groups[g]
            keep.append(min(members, key=lambda pos: (cn[pos], pos)))
        keep = np.asarray(keep, dtype=int)
        Lk, ck = Ln[keep], cn[keep]
        rows, norms = nz[keep], norms_all[nz[keep]]
        grp = [nz[np.asarray(groups[g])] for g in order]
        Lfull = Lk
    else:
        Lk, ck = L[nz], c[nz]
        rows, norms = nz, np.ones(len(nz))
        grp = [np.array([i]) for i in nz]
        Lfull = Ln
    # rank decision on unit rows (scale free), with the named relative tolerance
    _, s, Vt = np.linalg.svd(Lfull, full_matrices=True)
    r = int(np.sum(s > rank_rtol * s[0])) if s.size else 0
    if r == k:
        return Reduction(B, Lk, ck, rows, norms, grp, None, None, k, k, m, zero_rows, s)
    R, N = Vt[:r], Vt[r:]
    return Reduction(R @ B, Lk @ R.T, ck, rows, norms, grp, R, N, r, k, m, zero_rows, s)


def project_precision(red: Reduction, X0: np.ndarray) -> np.ndarray | None:
    """``(R X0^{-1} R^T)^{-1}``: a warm start in reduced coordinates with the same variances and
    no larger privacy cost; ``None`` when ``X0`` is not a finite positive definite ``k x k``
    matrix (the caller then starts cold)."""
    try:
        X0 = np.array(X0, dtype=float)
    except (TypeError, ValueError):
        return None
    if X0.shape != (red.k, red.k) or not np.all(np.isfinite(X0)):
        return None
    X0 = (X0 + X0.T) / 2
    try:
        C = np.linalg.cholesky(X0)
    except np.linalg.LinAlgError:
        return None
    if red.R is None:
        return X0
    Y = la.solve_triangular(C, red.R.T, lower=True)          # C^{-1} R^T
    M = Y.T @ Y
    M = (M + M.T) / 2
    try:
        Cm = np.linalg.cholesky(M)
        Minv = la.cho_solve((Cm, True), np.eye(red.rank))
    except (np.linalg.LinAlgError, la.LinAlgError):
        return None
    Minv = (Minv + Minv.T) / 2
    if not np.all(np.isfinite(Minv)):
        return None
    return Minv


def lift_precision(red: Reduction, Xr: np.ndarray, B: np.ndarray, L: np.ndarray, c: np.ndarray,
                   pad_fraction: float) -> tuple[np.ndarray, float]:
    """``X = R^T X' R + delta N^T N`` (positive definite) and ``delta``.

    With ``a = max_j |N b_j|^2 / f'`` (``f'`` the reduced squared cost) the padding adds
    ``delta a`` to the relative privacy cost and ``e / delta`` to the relative variance,
    ``e = max_i |N l_i|^2 / c_i``.  ``delta = pad_fraction / (2 a)`` keeps the first at half
    the budget; when rounding makes ``e`` so large that the second exceeds the other half,
    ``delta = sqrt(e / a)`` minimizes the total ``2 sqrt(a e)`` instead."""
    if red.R is None:
        return (Xr + Xr.T) / 2, 0.0
    R, N = red.R, red.N
    X = R.T @ Xr @ R
    pr = np.einsum("ij,ij->j", red.B, Xr @ red.B)
    f = float(pr.max())
    NB = N @ B
    a_abs = float(np.max(np.einsum("ij,ij->j", NB, NB)))
    NL = L @ N.T
    e = float(np.max(np.einsum("ij,ij->i", NL, NL) / c))
    if a_abs <= 0 or f <= 0:
        # no basis column sees the null space (impossible with independent rows of B)
        delta = max(float(np.trace(Xr)) / red.rank, 1e-300)
    else:
        a = a_abs / f
        delta = pad_fraction / (2 * a)
        if e / delta > pad_fraction / 2:
            delta = math.sqrt(e / a)
    X = X + delta * (N.T @ N)
    return (X + X.T) / 2, delta


def lift_multipliers(red: Reduction, lam_r: np.ndarray) -> np.ndarray:
    """Multipliers of the original constraints ``l_i^T X^{-1} l_i <= c_i``: the reduced
    constraint ``a`` is original row ``rows[a]`` divided by ``norms[a]``, so its multiplier is
    divided by ``norms[a]^2``; zero rows and the looser members of a group get 0."""
    lam = np.zeros(red.m)
    lam[red.rows] = np.asarray(lam_r, dtype=float) / red.norms ** 2
    return lam


def exact_parts(B: np.ndarray, L: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Privacy terms ``b_j^T X b_j`` and variances ``l_i^T X^{-1} l_i`` of a positive definite
    ``X`` on the original data (Cholesky; raises ``LinAlgError`` if ``X`` is not PD)."""
    C = np.linalg.cholesky(X)
    Y = la.solve_triangular(C, L.T, lower=True)
    v = np.einsum("ij,ij->j", Y, Y)
    p = np.einsum("ij,ij->j", B, X @ B)
    return p, v
