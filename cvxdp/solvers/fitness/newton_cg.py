"""SM-II: the fitness-for-use covariance problem by soft-max smoothing and Newton-CG.

Problem 1 of Xiao, He, Zhang, Kifer (VLDB 2021): for a workload ``W = L B`` (basis ``B``,
``k x n`` with independent rows; ``L`` is ``m x k``) and per-query variance targets ``c``,
choose the precision ``X = Sigma^{-1}`` (``k x k``, positive definite) of correlated Gaussian
noise on ``B x`` to

    minimize   max_j  p_j(X) = b_j^T X b_j              (squared privacy cost; b_j = columns of B)
    subject to q_i(X) = l_i^T X^{-1} l_i / c_i <= 1     (variance of query i over its target).

Both sides scale oppositely with ``X``, so the problem is equivalent to minimizing the
scale-free product ``max_j p_j * max_i q_i`` and rescaling; SM-II (section 6) minimizes
the sum of soft-maxes (Problem 4)

    F(X) = smax_beta(p) + smax_gamma(q),   smax_t(v) = log(sum exp(t v)) / t,

for increasing ``beta, gamma``, by Newton's method whose direction comes from conjugate
gradient with Hessian-vector products in O((n + m) k^2 + k^3), never forming the
``k^2 x k^2`` Hessian.  Unlike the reference code we use the exact Hessian (derived below),
a certified stopping rule, and three changes that cut the Newton and CG steps several-fold:

* **Start** at the ``beta, gamma -> 0`` end of the smoothing path, the minimizer of the mean
  privacy term plus the mean variance ratio: the matrix geometric mean ``P^{-1} # Q`` with
  uniform weights (closed form, two eigendecompositions), not at the workload strategy.
* **Exponential multipliers** (Tseng & Bertsekas, Math. Programming 60, 1993): each stage
  smooths with priors ``pi``, ``smax_t(v; pi) = log(sum pi_j exp(t v_j)) / t``, set to the
  previous stage's soft-max weights.  A fixed point has equal ``p_j`` on the support of ``pi``
  and satisfies the KKT conditions of Problem 1, so the iterates approach the optimum without
  ``beta`` having to grow to ``1/eps``; ``beta`` grows by 2 per stage, not 8, and the sharp,
  badly conditioned stages of plain continuation are never reached.
* **Inner stopping** on ``g^T K^{-1} g`` (``K`` the Sylvester part of the Hessian, below), an
  upper bound on the Newton decrement ``g^T H^{-1} g`` because ``H - K`` is positive
  semidefinite.  The decrement of a truncated CG direction under-estimates it and ended
  stages early, leaving the multiplier updates to stall.

Measured on random range workloads (2d ranges, unit and random targets, three seeds each):
d = 256 went from 33 s (unit) and 107 s (random targets) for seed 0 to 4.6-6.6 s for seeds 0-2,
with every run certified to 1e-6.

Linear algebra uses numpy's LAPACK only (see :func:`objective_parts`).

**Certificate.**  With ``mu`` in the simplex and ``lam >= 0`` the Lagrangian dual of Problem 1 is
``min_X <X, P> + <X^{-1}, Q> - lam^T c`` with ``P = B diag(mu) B^T``, ``Q = L^T diag(lam) L``;
the inner minimum is ``2 tr((P^{1/2} Q P^{1/2})^{1/2})`` and maximizing over the scale of
``lam`` gives the lower bound

    D(mu, lam) = tr((P^{1/2} Q P^{1/2})^{1/2})^2 / (lam^T c).

The soft-max weights ``mu = softmax(beta p)``, ``lam = softmax(gamma q) / c`` are exactly the
multipliers the smoothed problem produces, so every stage yields a certified gap.  The trace
is computed as the nuclear norm of ``diag(sqrt mu) B^T L^T diag(sqrt lam)`` (two QR
factorizations and a ``k x k`` SVD, :func:`dual_bound`): square roots of the eigenvalues of
``P^{1/2} Q P^{1/2}`` turn rounding-sized eigenvalues of a rank-deficient ``Q`` into errors of
``1e-8`` relative, which made the "bound" exceed the objective.

**Any workload** (:func:`solve`).  The data is validated (``ValueError`` naming the argument
when no optimum is attained) and reduced exactly by :mod:`cvxdp.solvers.fitness.reduce`:
zero rows dropped, parallel rows merged with the tightest target, ``L`` reduced to full
column rank by an SVD with the named relative tolerance ``NewtonSettings.rank_rtol``.  A
rank-one reduced problem (one query direction, ``k = 1``) has a closed form.  The reduced
answer is lifted to a positive definite ``X`` (``R^T X' R`` padded on the null space, at a
privacy cost of at most ``2%`` of ``eps_rel``), scaled until every variance computed by
Cholesky on the original data meets its target, and certified by the dual bound on the
original data with the lifted multipliers.  ``status`` is ``optimal`` only when the largest
violation is at most ``eps_abs`` and the gap ``(f - lower) / max(1, |f|)`` (and the relative
gap ``(f - lower) / f``, which the stages stop on) is at most ``eps_rel``.  Before this, a
rank-deficient ``L`` (random ranges over 64 cells, rank 63) drove the precision towards a
singular matrix: 7 s and a squared cost of 9.42 against the optimum 5.634, with a violated
target; now 0.2-0.3 s and the certified optimum.

**Hessian-vector product** (``D`` symmetric, ``Z = L X^{-1}`` with rows ``z_i``, ``w``/``u`` the
two soft-max weight vectors, ``dp_j = b_j^T D b_j``, ``e_i = z_i^T D z_i / c_i``,
``G1 = B diag(w) B^T``, ``S = Z^T diag(u / c) Z``)::

    H[D] = beta (B diag(w dp) B^T - (w.dp) G1)
         + X^{-1} D S + S D X^{-1} + gamma (Z^T diag(u e / c) Z - (u.e) S).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.linalg as la

from .. import result as R
from .._table import IterationTable
from .reduce import (RANK_RTOL, Reduction, exact_parts, fingerprint, lift_multipliers,
                     lift_precision, project_precision, reduce, validate)
from ..result import SolverResult, relative_gap

__all__ = ["FitnessData", "NewtonSettings", "solve", "solve_privacy_bound", "dual_bound",
           "objective_parts"]


@dataclass
class FitnessData:
    """``B`` (k x n), ``L`` (m x k), targets ``c`` (m,), and an optional weight ``eta`` of the
    total variance ``sum_i l_i^T X^{-1} l_i`` (the paper's hybrid objective, sec. 6.1)."""

    B: np.ndarray
    L: np.ndarray
    c: np.ndarray
    eta: float = 0.0

    def __post_init__(self) -> None:
        self.B = np.asarray(self.B, dtype=float)
        self.L = np.asarray(self.L, dtype=float)
        self.c = np.asarray(self.c, dtype=float).ravel()
        if self.L.ndim == 1:                    # a single query
            self.L = self.L[None, :]
        if self.B.ndim != 2 or self.L.ndim != 2:
            raise ValueError(f"B and L must be 2-D matrices, got shapes {self.B.shape}, {self.L.shape}")
        k = self.B.shape[0]
        if self.L.shape[1] != k:
            raise ValueError(f"L has {self.L.shape[1]} columns, B has {k} rows")
        if self.c.shape != (self.L.shape[0],):
            raise ValueError(f"c must have one target per row of L ({self.L.shape[0]}), got {self.c.shape}")

    @property
    def k(self) -> int:
        return self.B.shape[0]


@dataclass
class NewtonSettings:
    max_iters: int = 500            # Newton steps in all
    eps_rel: float = 1e-6           # certified relative gap on the squared privacy cost
    time_limit: float = math.inf
    beta0: float | None = None      # initial soft-max parameters (default: from the data)
    growth: float = 2.0             # factor by which beta, gamma grow per stage
    cg_max: int = 50
    eps_abs: float = 1e-8           # largest variance-target violation of an 'optimal' X
    rank_rtol: float = RANK_RTOL    # rank decision on the row-normalized workload (fitness_reduce)
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


def objective_parts(d: FitnessData, X: np.ndarray, chol: np.ndarray | None = None):
    """``p`` (n,), ``q`` (m,), ``Z = L X^{-1}``, the lower Cholesky factor of ``X`` and ``X^{-1}``.

    Raises ``numpy.linalg.LinAlgError`` when ``X`` is not positive definite.  Only numpy's
    LAPACK is used here and in the Newton loop: numpy and scipy wheels each bring their own
    OpenBLAS, and alternating between two multithreaded pools makes their idle threads spin
    against each other (measured: 1.5x slower at k = 254 on two cores)."""
    if chol is None:
        chol = np.linalg.cholesky(X)
    Xinv = np.linalg.inv(X)
    Xinv = (Xinv + Xinv.T) / 2
    Z = d.L @ Xinv                                               # rows z_i = X^{-1} l_i
    q = np.einsum("ij,ij->i", Z, d.L) / d.c
    p = np.einsum("ij,ij->j", d.B, X @ d.B)
    return p, q, Z, chol, Xinv


def _softmax(v: np.ndarray, t: float, prior: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """``log(sum_j pi_j exp(t v_j)) / t`` and its weights, for the log-prior ``log pi``."""
    z = t * v if prior is None else t * v + prior
    m = float(z.max())
    e = np.exp(z - m)
    s = float(e.sum())
    return (m + math.log(s)) / t, e / s


def dual_bound(d: FitnessData, mu: np.ndarray, lam: np.ndarray) -> float:
    """``tr((P^{1/2} Q P^{1/2})^{1/2})^2 / (lam^T c)``: a lower bound on the optimal squared
    privacy cost for any ``mu`` in the simplex and ``lam >= 0`` (see the module docstring).

    The trace is the nuclear norm of ``P^{1/2} Q^{1/2}``, whose singular values are those of
    ``G^T F`` with ``P = G G^T``, ``G = B diag(sqrt(mu))`` and ``Q = F F^T``,
    ``F = L^T diag(sqrt(lam))``; with ``G^T = Q_1 R_1`` and ``F^T = Q_2 R_2`` they are the
    singular values of ``R_1 R_2^T`` (``k x k`` at most).  Taking square roots of the
    eigenvalues of ``P^{1/2} Q P^{1/2}`` instead turns rounding-sized eigenvalues ``1e-17``
    of a rank-deficient ``Q`` into ``3e-9`` each, which overstated the bound."""
    mu = np.maximum(np.asarray(mu, dtype=float), 0.0)
    mu = mu / mu.sum()
    lam = np.maximum(np.asarray(lam, dtype=float), 0.0)
    denom = float(lam @ d.c)
    if not denom > 0:
        return 0.0
    R1 = np.linalg.qr((d.B * np.sqrt(mu)).T, mode="r")
    R2 = np.linalg.qr(d.L * np.sqrt(lam)[:, None], mode="r")
    T = float(np.sum(np.linalg.svd(R1 @ R2.T, compute_uv=False)))
    return T * T / denom


class _Smoothed:
    """F = smax_beta(p) + smax_gamma(q) (+ eta * total variance) at one point X.  The value
    is computed on construction; gradient and Hessian data on first use (line searches
    only need values)."""

    def __init__(self, d: FitnessData, X: np.ndarray, beta: float, gamma: float, chol=None,
                 priors: tuple[np.ndarray | None, np.ndarray | None] = (None, None)) -> None:
        self.d, self.X, self.beta, self.gamma = d, X, beta, gamma
        p, q, Z, chol, Xinv = objective_parts(d, X, chol)
        self.p, self.q, self.Z, self.chol, self.Xinv = p, q, Z, chol, Xinv
        fp, self.w = _softmax(p, beta, priors[0])
        fq, self.u = _softmax(q, gamma, priors[1])
        self.value = fp + fq
        if d.eta:
            self.value += d.eta * float(np.sum(q * d.c))
        self._ready = False

    def _prepare(self) -> None:
        if self._ready:
            return
        d, Z = self.d, self.Z
        self.G1 = (d.B * self.w) @ d.B.T
        self.Su = (Z.T * (self.u / d.c)) @ Z
        self.S = self.Su + d.eta * (Z.T @ Z) if d.eta else self.Su
        self._ready = True

    @property
    def grad(self) -> np.ndarray:
        self._prepare()
        return self.G1 - self.S

    def preconditioner(self) -> Callable[[np.ndarray], np.ndarray]:
        """Inverse of the Sylvester part ``K(D) = X^{-1} D S + S D X^{-1}`` (plus a small
        multiple of the log-det Hessian ``X^{-1} D X^{-1}`` so it is always invertible).
        With ``T^T X^{-1} T = I`` and ``T^T M T = diag(s)`` (generalized eigenvectors of
        ``M = S + tau X^{-1} / 2``), ``K^{-1}(R) = T [(T^T R T) / (s_a + s_b)] T^T``.
        From ``X = C C^T``: ``T = C W`` with ``W`` the eigenvectors of ``C^T M C``."""
        self._prepare()
        tau = 1e-8 * float(np.trace(self.S)) / max(float(np.trace(self.Xinv)), 1e-300)
        C = self.chol
        M = C.T @ self.S @ C
        s, W = np.linalg.eigh((M + M.T) / 2 + 0.5 * tau * np.eye(self.d.k))
        T = C @ W
        denom = s[:, None] + s[None, :]

        def apply(R: np.ndarray) -> np.ndarray:
            E = (T.T @ R @ T) / denom
            return T @ E @ T.T

        return apply

    def hvp(self, D: np.ndarray) -> np.ndarray:
        self._prepare()
        d = self.d
        BD = D @ d.B
        dp = np.einsum("ij,ij->j", d.B, BD)
        wdp = self.w * dp
        out = self.beta * ((d.B * wdp) @ d.B.T - wdp.sum() * self.G1)
        XDS = self.Xinv @ D @ self.S
        out += XDS + XDS.T
        ZD = self.Z @ D
        e = np.einsum("ij,ij->i", ZD, self.Z) / d.c
        ue = self.u * e
        out += self.gamma * ((self.Z.T * (ue / d.c)) @ self.Z - ue.sum() * self.Su)
        return out


def _cg(F: _Smoothed, g: np.ndarray, max_iter: int, rtol: float,
        Minv: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, int, float]:
    """Truncated preconditioned conjugate gradient on ``H d = -g`` over symmetric matrices
    (Frobenius inner product), preconditioned by ``Minv`` (the inverse Sylvester part ``K^{-1}``
    of the Hessian).  Returns the direction, the iterations and ``g^T K^{-1} g``, which bounds
    the Newton decrement ``g^T H^{-1} g`` from above because ``H - K`` is positive semidefinite."""
    x = np.zeros_like(g)
    r = -g.copy()
    zr = Minv(r)
    pdir = zr.copy()
    rz = rz0 = float(np.sum(r * zr))
    stop = rtol * math.sqrt(float(np.sum(r * r)))
    it = 0
    for it in range(1, max_iter + 1):
        Hp = F.hvp(pdir)
        curv = float(np.sum(pdir * Hp))
        if curv <= 0:                       # not positive definite along pdir (rounding): stop
            if it == 1:
                x = zr
            break
        a = rz / curv
        x += a * pdir
        r -= a * Hp
        if math.sqrt(float(np.sum(r * r))) <= stop:
            break
        zr = Minv(r)
        rz_new = float(np.sum(r * zr))
        pdir = zr + (rz_new / rz) * pdir
        rz = rz_new
    return (x + x.T) / 2, it, rz0


# Inner Newton iterations stop when g^T K^{-1} g (an upper bound on the Newton decrement) is
# below this fraction of the smoothing scale log(n)/beta + log(m)/gamma.
_INNER_TOL = 1e-6
# Log-priors of the exponential multipliers are floored here (weights below e^-600 are zero).
_LOG_FLOOR = -600.0
# Initial soft-max parameter, times log(max(n, m)) / (the start's balanced cost).
_BETA0 = 1.0
# Newton steps per stage at most.
_STAGE_NEWTON_MAX = 100
# Newton steps between refreshes of the preconditioner's eigendecomposition.
_PRECOND_REUSE = 3
# The solve stops (rounding limits it) when the gap has not halved while beta grew this much.
_STALL_GROWTH = 512.0
# Inexact Newton: CG stops at this relative residual (measured best of 0.5, 0.1, 0.01).
_CG_RTOL = 0.5
# Lifting a rank-reduced answer back may add this fraction of eps_rel to the privacy cost
# (fitness_reduce.lift_precision); the stages stop at (1 - 2 * it) * eps_rel to leave room.
_PAD_FRACTION = 0.02
# Singular values of the row-normalized workload below this multiple of eps_rel (relative to
# the largest) are first dropped too (an inexact reduction, kept only if certified).
_LOOSE_RANK = 1e-2

_COLUMNS = [("stage", "d"), ("newton", "d"), ("beta", ".1e"), ("sq. cost", ".8e"),
            ("lower bnd", ".8e"), ("rel gap", ".2e"), ("cg", "d"), ("time [s]", ".2e")]


def _scale_feasible(d: FitnessData, X: np.ndarray) -> tuple[np.ndarray, float]:
    """Rescale X so that max_i q_i = 1; return it and its squared privacy cost."""
    p, q, *_ = objective_parts(d, X)
    s = float(q.max())
    return X * s, float(p.max()) * s


def initial_point(d: FitnessData, A: np.ndarray | None = None) -> np.ndarray:
    """Initialization of sec. 6.3: independent noise on a strategy ``A`` (in the basis
    coordinates, ``A x = A_B B x``) gives the covariance ``(A_B^T A_B)^{-1}``, i.e. the precision
    ``X = A_B^T A_B``; the default strategy is the workload itself (``A_B = L``).  Scaled to
    balance privacy cost and variance."""
    AB = d.L if A is None else np.asarray(A, dtype=float)
    X = AB.T @ AB
    X = (X + X.T) / 2
    # a workload without full column rank in the basis would make X singular: regularize
    tr = float(np.trace(X)) / d.k
    X += 1e-8 * max(tr, 1e-300) * np.eye(d.k)
    p, q, *_ = objective_parts(d, X)
    t = math.sqrt(float(q.max()) / float(p.max()))
    return X * t


def uniform_weight_start(d: FitnessData) -> np.ndarray:
    """Minimizer of the mean privacy term plus the mean variance ratio, the beta, gamma -> 0
    end of the soft-max path: ``min <X, P> + <X^{-1}, Q>`` with ``P = B B^T / n`` and
    ``Q = L^T diag(1/c) L / m`` is the matrix geometric mean ``X = P^{-1} # Q``."""
    n, m = d.B.shape[1], d.L.shape[0]
    P = d.B @ d.B.T / n
    Q = (d.L.T / (m * d.c)) @ d.L
    Q = (Q + Q.T) / 2
    Q += 1e-8 * max(float(np.trace(Q)) / d.k, 1e-300) * np.eye(d.k)
    ev, V = np.linalg.eigh((P + P.T) / 2)
    ev = np.maximum(ev, 1e-14 * max(float(ev.max()), 1e-300))   # B has independent rows; rounding
    Ph = (V * np.sqrt(ev)) @ V.T
    Pmh = (V / np.sqrt(ev)) @ V.T
    M = Ph @ Q @ Ph
    e2, U = np.linalg.eigh((M + M.T) / 2)
    X = Pmh @ ((U * np.sqrt(np.maximum(e2, 0.0))) @ U.T) @ Pmh
    return (X + X.T) / 2


def _path_start(d: FitnessData, s: NewtonSettings, X: np.ndarray, resume: dict | None
                ) -> tuple[np.ndarray, float, float, tuple[np.ndarray | None, np.ndarray | None]]:
    """The first stage's point, soft-max parameters ``beta, gamma`` and log-priors.

    A resumed run continues from the previous run's final stage; otherwise ``beta = gamma =
    _BETA0 log(max(n, m)) / sqrt(max_j p_j max_i q_i)`` (or ``settings.beta0``) at ``X``,
    with no priors."""
    if resume is not None:
        return resume["X"], resume["beta"], resume["gamma"], resume["priors"]
    n, m = d.B.shape[1], d.L.shape[0]
    p, q, *_ = objective_parts(d, X)
    scale = math.sqrt(float(p.max()) * float(q.max()))
    beta = s.beta0 if s.beta0 is not None else _BETA0 * math.log(max(n, m, 2)) / scale
    return X, beta, beta, (None, None)


def _certified_resume(d: FitnessData, resume: dict, beta: float, eps_stop: float) -> dict | None:
    """The previous run's answer, unchanged and without a Newton step, when its certificate
    (the dual bound of its multipliers, recomputed) still meets ``eps_stop``; else ``None``."""
    best_X, best_cost = resume["best_X"], resume["best_cost"]
    bound = dual_bound(d, resume["mu"], resume["lam"])
    if (best_cost - bound) / best_cost <= eps_stop:
        return {"X": best_X, "cost": best_cost, "mu": resume["mu"], "lam": resume["lam"],
                "lower": bound, "status": R.OPTIMAL, "history": [], "newton": 0,
                "stages": 0, "cg": 0, "beta": beta, "resume": resume}
    return None


def _smoothing_scale(n: int, m: int, beta: float, gamma: float) -> float:
    """``log(n) / beta + log(m) / gamma`` (``m`` at least 2): how far the soft-maxes may
    lie above the maxima, the scale the inner Newton iterations are measured against."""
    return math.log(n) / beta + math.log(max(m, 2)) / gamma if n > 1 else \
        math.log(max(m, 2)) / gamma


def _descent(g: np.ndarray, direction: np.ndarray) -> tuple[np.ndarray, float]:
    """The Newton-CG direction and its slope ``<g, direction>``, or steepest descent ``-g``
    when rounding made the direction not a descent direction."""
    slope = float(np.sum(g * direction))
    if slope >= 0:
        direction, slope = -g, -float(np.sum(g * g))
    return direction, slope


def _backtrack(F: _Smoothed, direction: np.ndarray, slope: float, step: float,
               priors: tuple[np.ndarray | None, np.ndarray | None]
               ) -> tuple[float, _Smoothed] | None:
    """Backtracking from ``step``, halving: the first step whose point is positive definite
    (Cholesky) and gives the Armijo decrease ``F_new <= F + 1e-4 step slope``, with the
    smoothed function there; ``None`` after 60 halvings."""
    X = F.X
    for _ in range(60):
        Xn = X + step * direction
        try:
            chol = np.linalg.cholesky(Xn)
        except np.linalg.LinAlgError:
            step *= 0.5
            continue
        Fn = _Smoothed(F.d, Xn, F.beta, F.gamma, chol, priors=priors)
        if Fn.value <= F.value + 1e-4 * step * slope:
            return step, Fn
        step *= 0.5
    return None


def _exponential_multipliers(F: _Smoothed) -> tuple[np.ndarray, np.ndarray]:
    """Log-priors of the next stage: the logarithms of this stage's soft-max weights ``w``
    and ``u``, floored at ``_LOG_FLOOR``."""
    return (np.maximum(np.log(np.maximum(F.w, 1e-300)), _LOG_FLOOR),
            np.maximum(np.log(np.maximum(F.u, 1e-300)), _LOG_FLOOR))


class _Stages:
    """The SM-II stages of one run of :func:`_newton`: per stage, damped Newton-CG on the
    smoothed problem ``F`` (Problem 4), then a certificate from its multipliers; between
    stages ``beta, gamma`` grow and the priors move.  Holds the counters, the incumbent and
    the best certificate across stages."""

    def __init__(self, d: FitnessData, s: NewtonSettings, t0: float, table: IterationTable,
                 eps_stop: float, best_X: np.ndarray, best_cost: float) -> None:
        n, m = d.B.shape[1], d.L.shape[0]
        self.d, self.s, self.t0, self.table, self.eps_stop = d, s, t0, table, eps_stop
        self.best_X, self.best_cost = best_X, best_cost
        self.lower = 0.0
        self.history: list[dict] = []
        self.newton = self.stage = self.cg_total = 0
        self.gaps: list[float] = []
        self.mu = np.full(n, 1.0 / n)
        self.lam_hat = np.full(m, 1.0) / d.c
        self.stall_stages = max(2, math.ceil(math.log(_STALL_GROWTH) / math.log(s.growth)))

    def run(self, X: np.ndarray, beta: float, gamma: float,
            priors: tuple[np.ndarray | None, np.ndarray | None]) -> dict:
        """Stages from ``X`` until a status is decided (:meth:`_status`); the result dict of
        :func:`_newton`."""
        status = None
        X_before = None                       # the end of the stage before the previous one
        while status is None:
            self.stage += 1
            stage_priors = priors
            F = self._stage_start(X, X_before, beta, gamma, priors)
            X_end_previous = X
            F = self._minimize(F, priors)
            X = F.X
            status = self._status(self._certify(F, beta))
            if status is None:
                # Exponential multipliers (Tseng & Bertsekas 1993): the next stage smooths with
                # this stage's weights as priors, so its minimizer moves towards the KKT point
                # itself and not only towards it as beta grows.
                priors = _exponential_multipliers(F)
                beta *= self.s.growth
                gamma *= self.s.growth
                # the start is not on the path
                X_before = X_end_previous if self.stage > 1 else None
        return self._result(X, beta, gamma, stage_priors, status)

    def _stage_start(self, X: np.ndarray, X_before: np.ndarray | None, beta: float,
                     gamma: float, priors: tuple[np.ndarray | None, np.ndarray | None]
                     ) -> _Smoothed:
        """The smoothed function at the stage's first point: ``X``, or the predictor from the
        two previous stages' ends when its value is lower."""
        d = self.d
        F = _Smoothed(d, X, beta, gamma, priors=priors)
        if X_before is not None:
            # Predictor: along the smoothing path X(beta) ~ X* + C / beta, so the next
            # stage's optimum is near X + (X - X_before) / growth.
            try:
                Fp = _Smoothed(d, X + (X - X_before) / self.s.growth, beta, gamma, priors=priors)
                if Fp.value < F.value:
                    F = Fp
            except np.linalg.LinAlgError:
                pass
        return F

    def _minimize(self, F: _Smoothed, priors: tuple[np.ndarray | None, np.ndarray | None]
                  ) -> _Smoothed:
        """Damped Newton-CG on one stage's smoothed function from ``F``: at most
        ``_STAGE_NEWTON_MAX`` steps, until ``g^T K^{-1} g <= _INNER_TOL * smoothing scale``,
        the line search fails, or the step or time budget runs out.  Returns the last point's
        smoothed function."""
        d, s = self.d, self.s
        smoothing_scale = _smoothing_scale(d.B.shape[1], d.L.shape[0], F.beta, F.gamma)
        precond, steps_since_precond = None, 0
        last_step = 1.0
        for _ in range(_STAGE_NEWTON_MAX):
            g = F.grad
            # The preconditioner only needs to be close to the Hessian's Sylvester part:
            # its eigendecomposition (k^3) is refreshed every few Newton steps.
            if precond is None or steps_since_precond >= _PRECOND_REUSE:
                precond, steps_since_precond = F.preconditioner(), 0
            steps_since_precond += 1
            direction, cg_it, gKg = _cg(F, g, s.cg_max, _CG_RTOL, precond)
            self.cg_total += cg_it
            self.newton += 1
            direction, slope = _descent(g, direction)
            # a damped stage stays damped: skip hopeless trials
            accepted = _backtrack(F, direction, slope, min(1.0, 4.0 * last_step), priors)
            if accepted is None:
                break
            last_step, F = accepted
            # Smoothing only approximates the max to within the smoothing scale; solving much
            # more accurately is wasted work.  g^T K^{-1} g bounds the decrement from above
            # even when the truncated CG resolves only the stiff directions.
            if gKg <= _INNER_TOL * smoothing_scale or self.newton >= s.max_iters:
                break
            if time.perf_counter() - self.t0 > s.time_limit:
                break
        return F

    def _certify(self, F: _Smoothed, beta: float) -> dict:
        """The certificate from this stage's multipliers ``mu = w``, ``lam = u / c``: update
        the incumbent (``F.X`` rescaled to feasibility) and the best dual bound, record and
        print the history row, which it returns."""
        d = self.d
        Xs, cost = _scale_feasible(d, F.X)
        # a new best must be better beyond rounding, so a warm start at the optimum stays put
        if cost < self.best_cost * (1 - 1e-13):
            self.best_X, self.best_cost = Xs, cost
        bound = dual_bound(d, F.w, F.u / d.c)
        if bound >= self.lower:
            self.lam_hat, self.mu, self.lower = F.u / d.c, F.w, bound
        gap = (self.best_cost - self.lower) / self.best_cost
        row = {"stage": self.stage, "newton": self.newton, "beta": beta,
               "sq. cost": self.best_cost, "lower bnd": self.lower, "rel gap": gap,
               "cg": self.cg_total, "time [s]": time.perf_counter() - self.t0}
        self.history.append(row)
        self.table.row(row)
        self.gaps.append(gap)
        return row

    def _status(self, row: dict) -> str | None:
        """``optimal`` when the relative gap meets ``eps_stop``; ``optimal_inaccurate`` when
        it stalled (not halved over the last ``stall_stages`` stages) or the step or time
        budget is spent; ``user_limit`` when the callback says stop; ``None``: go on."""
        s, gap, gaps = self.s, row["rel gap"], self.gaps
        if gap <= self.eps_stop:
            return R.OPTIMAL
        if len(gaps) > self.stall_stages and gap > 0.5 * gaps[-1 - self.stall_stages]:
            return R.OPTIMAL_INACCURATE     # the gap stopped shrinking: rounding limits it
        if s.callback is not None and s.callback(dict(row, X=self.best_X)):
            return R.USER_LIMIT
        if self.newton >= s.max_iters or time.perf_counter() - self.t0 > s.time_limit:
            return R.OPTIMAL_INACCURATE
        return None

    def _result(self, X: np.ndarray, beta: float, gamma: float,
                priors: tuple[np.ndarray | None, np.ndarray | None], status: str) -> dict:
        """The result dict of :func:`_newton`, with the state that resumes the last stage
        (its end point ``X``, parameters and ``priors``)."""
        resume_state = {"X": X, "beta": beta, "gamma": gamma, "priors": priors,
                        "best_X": self.best_X, "best_cost": self.best_cost, "mu": self.mu,
                        "lam": self.lam_hat}
        return {"X": self.best_X, "cost": self.best_cost, "mu": self.mu, "lam": self.lam_hat,
                "lower": self.lower, "status": status, "history": self.history,
                "newton": self.newton, "stages": self.stage, "cg": self.cg_total,
                "beta": beta, "resume": resume_state}


def _newton(d: FitnessData, s: NewtonSettings, X: np.ndarray, t0: float, table: IterationTable,
            eps_stop: float, resume: dict | None = None) -> dict:
    """The SM-II stages on an instance whose ``L`` has full column rank (see :func:`solve`).

    Stops when the relative gap ``(f - D) / f`` is at most ``eps_stop`` (scale free: the
    targets' units never decide when to stop).  ``resume`` is a previous run's final stage
    (point, priors, soft-max parameters, best point): the run continues from there, so a warm
    start from a solved instance certifies at once instead of re-walking the smoothing path."""
    X, beta, gamma, priors = _path_start(d, s, X, resume)
    best_X, best_cost = _scale_feasible(d, X)
    if resume is not None and resume.get("best_cost", math.inf) <= best_cost:
        best_X, best_cost = resume["best_X"], resume["best_cost"]
        # the previous run's certificate, recomputed: if it already meets the tolerance the
        # previous answer is returned as it was, without a Newton step
        done = _certified_resume(d, resume, beta, eps_stop)
        if done is not None:
            return done
    return _Stages(d, s, t0, table, eps_stop, best_X, best_cost).run(X, beta, gamma, priors)


def _closed_form(d: FitnessData) -> dict:
    """Rank one (one query direction, or ``k = 1``): ``X = x`` is a scalar, ``q_i = l_i^2 /
    (x c_i)`` and ``p_j = x b_j^2``, so ``x = max_i l_i^2 / c_i`` and the cost is
    ``x max_j b_j^2``; the multipliers sit on the two maximizers (exact duality)."""
    lc = d.L[:, 0] ** 2 / d.c
    i = int(np.argmax(lc))
    b2 = d.B[0] ** 2
    j = int(np.argmax(b2))
    x = float(lc[i])
    cost = x * float(b2[j])
    mu = np.zeros(d.B.shape[1])
    mu[j] = 1.0
    lam = np.zeros(d.L.shape[0])
    lam[i] = 1.0 / d.c[i]
    return {"X": np.array([[x]]), "cost": cost, "mu": mu, "lam": lam, "lower": cost,
            "status": R.OPTIMAL, "history": [], "newton": 0, "stages": 0, "cg": 0,
            "beta": math.nan, "resume": None}


def _make_feasible(d: FitnessData, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale ``X`` (positive definite) so every variance meets its target on the original
    data, computed by Cholesky; a few ulps of rounding are removed by rescaling again."""
    p, v = exact_parts(d.B, d.L, X)
    for it in range(6):
        t = float(np.max(v / d.c))
        if t <= 1.0:
            break
        X = X * (t * (1.0 + 2.0 ** (it - 52)) if it else t)
        p, v = exact_parts(d.B, d.L, X)
    return X, p, v


def _violation(v: np.ndarray, c: np.ndarray) -> float:
    """Largest constraint violation ``max_i (v_i - c_i)_+`` in the constraints' units."""
    return float(max(0.0, np.max(v - c)))


def _attempt(d: FitnessData, red: Reduction, s: NewtonSettings, X: np.ndarray | None,
             t0: float, table: IterationTable, resume: dict | None,
             strategy: np.ndarray | None = None) -> dict:
    """Solve the reduced instance ``red`` from ``X`` (projected) and bring the answer back:
    lift to a positive definite ``k x k`` matrix, rescale to meet every target on the
    original data, certify with the original data's dual bound."""
    dr = FitnessData(red.B, red.L, red.c, d.eta)
    Xr = project_precision(red, X) if X is not None else None
    if Xr is None and strategy is not None:
        try:
            Xr = project_precision(red, initial_point(d, strategy))
        except (ValueError, np.linalg.LinAlgError):
            Xr = None
    if Xr is None:
        Xr = uniform_weight_start(dr)
    if red.rank == 1:
        core = _closed_form(dr)
    else:
        core = _newton(dr, s, Xr, t0, table, (1 - 2 * _PAD_FRACTION) * s.eps_rel, resume)
    pad = _PAD_FRACTION * s.eps_rel
    for attempt in range(4):
        Xfull, delta = lift_precision(red, core["X"], d.B, d.L, d.c, pad)
        try:
            Xout, p, v = _make_feasible(d, Xfull)
            break
        except np.linalg.LinAlgError:
            # rounding left the padded matrix numerically singular: pad more (the certificate
            # below reports what this costs)
            if attempt == 3:
                raise
            pad *= 100.0
    lam = lift_multipliers(red, core["lam"])
    return {"core": core, "X": Xout, "p": p, "v": v, "f": float(p.max()),
            "lower": dual_bound(d, core["mu"], lam), "lam": lam, "mu": core["mu"],
            "delta": delta, "red": red}


def _tiers(d: FitnessData, s: NewtonSettings) -> tuple[Reduction, list[Reduction]]:
    """The exact reduction and the reductions to solve, in order: the exact one, preceded by
    the inexact one that drops the directions whose singular values (row-normalized ``L``)
    lie between ``rank_rtol`` and ``_LOOSE_RANK * eps_rel`` of the largest, if there are any."""
    normalize = not d.eta
    red = reduce(d.B, d.L, d.c, s.rank_rtol, normalize=normalize)
    sv = red.singular_values
    loose = _LOOSE_RANK * s.eps_rel
    tiers = [red]
    if loose > s.rank_rtol and sv.size and np.any((sv > s.rank_rtol * sv[0]) & (sv <= loose * sv[0])):
        tiers.insert(0, reduce(d.B, d.L, d.c, loose, normalize=normalize))
    return red, tiers


def _resume_from_state(state: dict | None, fp: str, tiers: list[Reduction]
                       ) -> tuple[list[Reduction], dict | None, str]:
    """The tiers to solve, the resume data and the warm-start note: a previous result's
    ``state`` for the same data (fingerprint ``fp``) whose rank is one of the tiers resumes
    that tier's last stage, and only that tier is solved."""
    if isinstance(state, dict) and state.get("fingerprint") == fp and state.get("resume") is not None:
        match = [t for t in tiers if t.rank == state.get("rank")]
        if match:
            return match, state["resume"], "resumed from state"
    return tiers, None, "none"


def _warm_point(d: FitnessData, red: Reduction, X0: np.ndarray | None, resume: dict | None,
                warm: str) -> tuple[np.ndarray | None, str]:
    """``X0`` as a float matrix and the warm-start note: ``None`` (and a note saying why) when
    it is not a finite positive definite ``k x k`` matrix, i.e. when
    :func:`~cvxdp.solvers.fitness.reduce.project_precision` rejects it."""
    X = None
    if X0 is not None:
        try:
            X = np.array(X0, dtype=float)
        except (TypeError, ValueError):
            X = None
        if X is None or project_precision(red, X) is None:
            X = None
            warm = f"ignored: X0 is not a finite positive definite {d.k} x {d.k} matrix"
        elif resume is None:
            warm = "X0"
    return X, warm


class _Tally:
    """What the tiers of :func:`solve` add up to: the best answer (lowest privacy cost), the
    largest dual bound with its multipliers, Newton steps, stages, CG iterations, history
    rows (tagged with their tier's rank) and the last tier's inner status."""

    def __init__(self) -> None:
        self.best: dict | None = None
        self.lower, self.mu, self.lam = -math.inf, None, None
        self.newton = self.stages = self.cg = 0
        self.history: list[dict] = []
        self.inner_status = R.OPTIMAL

    def add(self, tier: Reduction, out: dict) -> None:
        """Count one tier's answer ``out`` (from :func:`_attempt`)."""
        core = out["core"]
        self.newton += core["newton"]
        self.stages += core["stages"]
        self.cg += core["cg"]
        self.history += [dict(row, rank=tier.rank) for row in core["history"]]
        self.inner_status = core["status"]
        if self.best is None or out["f"] < self.best["f"]:
            self.best = out
        if out["lower"] > self.lower:
            self.lower, self.mu, self.lam = out["lower"], out["mu"], out["lam"]

    def certified(self, s: NewtonSettings, c: np.ndarray) -> bool:
        """Whether the best answer meets ``eps_rel`` (relative gap) and ``eps_abs``."""
        f = self.best["f"]
        return (f - self.lower) / f <= s.eps_rel and _violation(self.best["v"], c) <= s.eps_abs


def _solve_tiers(d: FitnessData, s: NewtonSettings, tiers: list[Reduction],
                 X: np.ndarray | None, t0: float, table: IterationTable, resume: dict | None,
                 strategy: np.ndarray | None) -> _Tally:
    """Solve the tiers in order until the best answer is certified or the time or Newton
    step budget is spent; each tier after the first starts from the incumbent."""
    tally = _Tally()
    for tier in tiers:
        tally.add(tier, _attempt(d, tier, s, X, t0, table, resume, strategy))
        if tally.certified(s, d.c):
            break
        X = tally.best["X"]                         # the next tier starts from the incumbent
        if time.perf_counter() - t0 > s.time_limit or tally.newton >= s.max_iters:
            break
    return tally


def _final_status(s: NewtonSettings, residual: float, gap: float, rel: float,
                  inner_status: str) -> str:
    """``optimal`` when the violation is at most ``eps_abs`` and both gaps at most
    ``eps_rel``; otherwise ``user_limit`` if the callback stopped the stages, else
    ``optimal_inaccurate``."""
    if residual <= s.eps_abs and gap <= s.eps_rel and rel <= s.eps_rel:
        return R.OPTIMAL
    if inner_status == R.USER_LIMIT:
        return R.USER_LIMIT
    return R.OPTIMAL_INACCURATE


def _solver_result(d: FitnessData, s: NewtonSettings, red: Reduction, tally: _Tally, fp: str,
                   warm: str, setup_time: float, t0: float) -> SolverResult:
    """The result of :func:`solve` from the tiers' tally: the best point, the largest bound,
    the variance multipliers scaled by ``lower / (lam . c)``, status and the warm-start
    ``state``."""
    best, lower, mu, lam = tally.best, tally.lower, tally.mu, tally.lam
    Xout, p, v, f = best["X"], best["p"], best["v"], best["f"]
    residual = _violation(v, d.c)
    denom = float(lam @ d.c)
    multipliers = (lower / denom) * lam if denom > 0 else lam
    gap = relative_gap(f, lower)
    rel = (f - lower) / f if f > 0 else math.inf
    status = _final_status(s, residual, gap, rel, tally.inner_status)
    used = best["red"]
    new_state = {"fingerprint": fp, "rank": used.rank, "resume": best["core"]["resume"]}
    return SolverResult(x=Xout, status=status, objective=f, lower_bound=lower, gap=gap,
                        primal_residual=residual, iterations=tally.newton, history=tally.history,
                        setup_time=setup_time, solve_time=time.perf_counter() - t0,
                        duals={"variance": multipliers, "cost_weights": mu},
                        info={"stages": tally.stages, "cg_iterations": tally.cg,
                              "beta": best["core"]["beta"], "variance_ratio": v / d.c,
                              "privacy_terms": p, "relative_gap": rel, "rank": red.rank,
                              "rank_used": used.rank, "distinct_queries": int(red.L.shape[0]),
                              "zero_rows": red.zero_rows, "null_padding": best["delta"],
                              "closed_form": used.rank == 1, "warm_start": warm},
                        state=new_state)


def solve(d: FitnessData, settings: NewtonSettings | None = None,
          X0: np.ndarray | None = None, strategy: np.ndarray | None = None,
          state: dict | None = None) -> SolverResult:
    """Minimize the squared privacy cost subject to the variance targets (Problem 1).

    Any workload: the instance is first validated and reduced exactly
    (:mod:`cvxdp.solvers.fitness.reduce`: zero rows dropped, parallel rows merged keeping
    the tightest target, ``L`` reduced to full column rank ``r`` with the relative tolerance
    ``rank_rtol``); rank one has a closed form, otherwise stages of damped Newton-CG on the
    smoothed problem ``F`` (module docstring) run in ``r`` coordinates.  The reduced answer
    is lifted to a positive definite ``k x k`` ``X``, rescaled until every variance meets its
    target on the original data (computed by Cholesky), and certified with the original
    data's dual bound.  ``status`` is ``optimal`` only if the returned ``X`` violates no
    target by more than ``eps_abs`` and ``gap = (f - lower_bound) / max(1, |f|) <= eps_rel``;
    the stages themselves stop on the scale-free relative gap ``(f - lower_bound) / f``,
    which is at least as strict.

    Nearly rank-deficient workloads (singular values of the row-normalized ``L`` between
    ``rank_rtol`` and ``_LOOSE_RANK * eps_rel`` of the largest) make the optimal ``X`` nearly
    singular and Newton's method slow; they are first solved with those directions dropped
    too, which is no longer exact, so the answer is kept only if the certificate on the
    original data meets the tolerance; otherwise the exact reduction is solved from it and
    the better point and the larger bound of the two are returned.

    Warm starts: ``X0`` (projected to the reduced coordinates, see
    :func:`~cvxdp.solvers.fitness.reduce.project_precision`) is the first point and the first
    incumbent; one that is not a finite positive definite ``k x k`` matrix is ignored
    (``info["warm_start"]`` says why).  ``state`` (a previous result's ``state`` for the same
    data) resumes the last stage; when its certificate still meets the tolerance the previous
    answer is returned unchanged, with no Newton step.

    Raises ``ValueError`` (naming the argument) for data without an attained optimum: see
    :func:`~cvxdp.solvers.fitness.reduce.validate`."""
    s = settings or NewtonSettings()
    t0 = time.perf_counter()
    validate(d.B, d.L, d.c)
    fp = fingerprint(d.B, d.L, d.c, d.eta)
    red, tiers = _tiers(d, s)
    table = IterationTable(_COLUMNS, s.verbose)
    table.header(f"cvxdp NEWTON_CG (SM-II, exact Hessian), k = {d.k}, "
                 f"{d.B.shape[1]} basis columns, {d.L.shape[0]} queries; reduced to rank "
                 f"{' then '.join(str(t.rank) for t in tiers)} with {red.L.shape[0]} distinct queries")
    setup_time = time.perf_counter() - t0
    tiers, resume, warm = _resume_from_state(state, fp, tiers)
    X, warm = _warm_point(d, red, X0, resume, warm)
    tally = _solve_tiers(d, s, tiers, X, t0, table, resume, strategy)
    res = _solver_result(d, s, red, tally, fp, warm, setup_time, t0)
    table.footer(f"status: {res.status}, squared privacy cost {res.objective:.10g}, certified gap "
                 f"{res.gap:.2e}, {tally.newton} Newton steps, {tally.cg} CG iterations")
    return res


def solve_privacy_bound(d: FitnessData, rho: float, settings: NewtonSettings | None = None,
                        X0: np.ndarray | None = None, strategy: np.ndarray | None = None,
                        state: dict | None = None) -> SolverResult:
    """Problem 2: ``minimize s`` subject to ``l_i^T X^{-1} l_i <= s c_i`` and
    ``max_j b_j^T X b_j <= rho``.

    Scaling ``X`` trades privacy cost against every variance by the same factor, so with
    Problem 1's optimum ``f*`` (targets ``c``) ``s* = f* / rho`` at ``X = (rho / f*) X_1``.
    The result's ``objective`` is ``s`` at the returned ``X`` (rescaled until its privacy
    cost is at most ``rho`` on the data, ``s`` the exact largest variance ratio),
    ``lower_bound`` Problem 1's bound over ``rho``, ``gap = (s - lower_bound) / max(1, |s|)``,
    ``primal_residual`` the larger of ``max_i (v_i - s c_i)_+`` and ``(p - rho)_+``.
    ``duals["variance"]`` holds the multipliers of the variance constraints (they sum to 1
    against ``c``) and ``duals["privacy"]`` that of the privacy bound (KKT of Problem 2 from
    Problem 1's: ``lam_2 = lam_1 / (lam_1 . c)``, ``nu = 1 / (kappa^2 (lam_1 . c))``,
    ``kappa = rho / f``).  Raises ``ValueError`` unless ``rho`` is positive and finite."""
    s = settings or NewtonSettings()
    validate(d.B, d.L, d.c, rho=rho)
    rho = float(rho)
    r1 = solve(d, s, X0=X0, strategy=strategy, state=state)
    X = r1.x * (rho / r1.objective)
    p, v = exact_parts(d.B, d.L, X)
    for _ in range(4):
        if float(p.max()) <= rho:
            break
        X = X * (rho / float(p.max())) * (1 - 4e-16 * (_ + 1))
        p, v = exact_parts(d.B, d.L, X)
    sval = float(np.max(v / d.c))
    residual = max(0.0, float(p.max()) - rho, float(np.max(v - sval * d.c)))
    lower = r1.lower_bound / rho
    gap = relative_gap(sval, lower)
    rel = (sval - lower) / sval
    lam1 = r1.duals["variance"]
    a = float(lam1 @ d.c)
    kappa = rho / r1.objective
    status = _final_status(s, residual, gap, rel, r1.status)
    info = dict(r1.info, problem=2, rho=rho, problem1_objective=r1.objective, relative_gap=rel,
                variance_ratio=v / d.c, privacy_terms=p)
    return SolverResult(x=X, status=status, objective=sval, lower_bound=lower, gap=gap,
                        primal_residual=residual, iterations=r1.iterations, history=r1.history,
                        setup_time=r1.setup_time, solve_time=r1.solve_time,
                        duals={"variance": lam1 / a if a > 0 else lam1,
                               "privacy": 1.0 / (kappa ** 2 * a) if a > 0 else 0.0,
                               "cost_weights": r1.duals["cost_weights"]},
                        info=info, state=r1.state)


def choose_basis(W: np.ndarray, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """``W = L B`` with ``B`` a set of linearly independent rows of ``W`` (pivoted QR on
    ``W^T``) and ``L = W B^+``.  The rows of ``B`` span the row space of ``W``, so ``B``
    has independent rows as Problem 1 requires and ``L`` reproduces ``W`` exactly."""
    W = np.asarray(W, dtype=float)
    _, Rq, piv = la.qr(W.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(Rq))
    rank = int(np.sum(diag > tol * max(diag[0], 1e-300))) if diag.size else 0
    rows = np.sort(piv[:rank])
    B = W[rows]
    L = la.lstsq(B.T, W.T)[0].T
    L[np.abs(L) < 1e-12 * max(1.0, float(np.abs(L).max(initial=0.0)))] = 0.0
    L[rows] = np.eye(rank)                  # the basis rows reproduce themselves exactly
    return L, B
