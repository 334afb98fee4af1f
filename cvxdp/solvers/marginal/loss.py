"""Convex losses of clique marginals, with gradients, smoothing and dual lower bounds.

The marginals ``mu_1 .. mu_K`` of the measured cliques are stacked into one flat vector
``mu`` (each flattened in C order).  A loss is a sum of terms

    L(mu) = sum_t  sum_i  phi_t,i( (A_t mu - b_t)_i )

with ``phi(r) = w/2 r^2`` (``"l2"``: Gaussian log-likelihood, ``sum_squares``) or
``phi(r) = w |r|`` (``"l1"``: Laplace log-likelihood, ``norm1``); ``A_t`` is any sparse matrix
(the identity on one clique's slice is stored as a slice).  McKenna et al. (ICML 2019),
appendix C: the gradient is ``A^T phi'(A mu - b)``; unequal noise enters through ``w``.

Dual lower bound.  For any ``lam_t`` in the domain of ``phi_t^*``,
``phi_t(r) >= lam^T r - phi_t^*(lam)``, hence for every ``mu`` in the marginal polytope ``M``
(total ``N``)

    L(mu) >= min_{mu' in M} <sum_t A_t^T lam_t, mu'> - sum_t (lam_t^T b_t + phi_t^*(lam_t)),

and the minimum of a linear function over ``M`` is ``-N max_x sum_k (-G_k)(x_{C_k})``, one
max-product pass on the junction tree.  With ``lam = phi'(r)`` this is the Frank-Wolfe bound.

Smoothing.  ``|r|`` is replaced by the Huber function ``max_{|l|<=1} l r - tau l^2/2``, whose
gradient ``clip(r / tau, -1, 1)`` is always a valid dual point for the exact L1 loss, and which
is within ``tau/2`` of ``|r|``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["LossTerm", "MarginalLoss"]


@dataclass
class LossTerm:
    """``sum_i phi(w_i, (A mu - b)_i)`` with ``phi = w/2 r^2`` (``kind="l2"``) or ``w|r|`` (``"l1"``).

    ``A`` is a sparse matrix with as many columns as the flat marginal vector, or a ``slice``
    meaning the identity on that part of it.
    """

    kind: str
    A: sp.csr_matrix | slice
    b: np.ndarray
    w: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in ("l1", "l2"):
            raise ValueError(f"LossTerm.kind must be 'l1' or 'l2', got {self.kind!r}")
        self.b = np.asarray(self.b, dtype=float).ravel()
        m = self.b.size
        self.w = np.broadcast_to(np.asarray(self.w, dtype=float), (m,)).copy()
        if not np.all(np.isfinite(self.b)):
            raise ValueError("LossTerm.b must be finite")
        if not np.all(np.isfinite(self.w)) or np.any(self.w < 0):
            raise ValueError("LossTerm.w must be finite and nonnegative")
        if isinstance(self.A, slice):
            if self.A.stop - self.A.start != m:
                raise ValueError("LossTerm: slice length does not match b")
        else:
            self.A = sp.csr_matrix(self.A)
            self._AT = self.A.T.tocsr()
            if self.A.shape[0] != m:
                raise ValueError(f"LossTerm: A has {self.A.shape[0]} rows, b has {m}")

    def apply(self, mu: np.ndarray) -> np.ndarray:
        return mu[self.A] - self.b if isinstance(self.A, slice) else self.A @ mu - self.b

    def add_adjoint(self, lam: np.ndarray, out: np.ndarray) -> None:
        if isinstance(self.A, slice):
            out[self.A] += lam
        else:
            out += self._AT @ lam

    def column_norm_bound(self, offsets: np.ndarray) -> float:
        """``max_x ||A Q e_x||_2^2`` bound: Q maps a full-table point to the stacked marginals,
        so column ``x`` of ``A Q`` is the sum over cliques of one column of each block."""
        if isinstance(self.A, slice):
            return 1.0
        A = self.A.tocsc()
        colnorm = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).ravel())
        total = 0.0
        for a, b in zip(offsets[:-1], offsets[1:]):
            if b > a:
                total += float(colnorm[a:b].max(initial=0.0))
        return total ** 2


class MarginalLoss:
    """A sum of :class:`LossTerm` over a flat vector of ``n`` marginal cells."""

    def __init__(self, terms: list[LossTerm], n: int, constant: float = 0.0) -> None:
        self.terms = list(terms)
        self.n = int(n)
        self.constant = float(constant)
        for t in self.terms:
            cols = (t.A.stop if isinstance(t.A, slice) else t.A.shape[1])
            if isinstance(t.A, slice) and (t.A.start < 0 or t.A.stop > self.n):
                raise ValueError("LossTerm slice outside the marginal vector")
            if not isinstance(t.A, slice) and cols != self.n:
                raise ValueError(f"LossTerm.A has {cols} columns, the marginals have {self.n} cells")

    @property
    def smooth(self) -> bool:
        return all(t.kind == "l2" for t in self.terms)

    def value(self, mu: np.ndarray, tau: float = 0.0) -> float:
        """Exact loss (``tau = 0``) or its Huber smoothing of the L1 terms."""
        v = self.constant
        for t in self.terms:
            r = t.apply(mu)
            if t.kind == "l2":
                v += 0.5 * float(np.dot(t.w, r * r))
            elif tau <= 0:
                v += float(np.dot(t.w, np.abs(r)))
            else:
                a = np.abs(r)
                v += float(np.dot(t.w, np.where(a <= tau, 0.5 * a * a / tau, a - 0.5 * tau)))
        return v

    def value_grad(self, mu: np.ndarray, tau: float = 0.0):
        """``(L_tau(mu), grad, duals)``: the duals ``lam_t = phi_t'(r_t)`` build the lower bound."""
        g = np.zeros(self.n)
        v = self.constant
        lams = []
        for t in self.terms:
            r = t.apply(mu)
            if t.kind == "l2":
                lam = t.w * r
                v += 0.5 * float(np.dot(lam, r))
            else:
                a = np.abs(r)
                if tau > 0:
                    s = np.clip(r / tau, -1.0, 1.0)
                    v += float(np.dot(t.w, np.where(a <= tau, 0.5 * a * a / tau, a - 0.5 * tau)))
                else:
                    s = np.sign(r)
                    v += float(np.dot(t.w, a))
                lam = t.w * s
            t.add_adjoint(lam, g)
            lams.append(lam)
        return v, g, lams

    def dual_constant(self, lams: list[np.ndarray]) -> float | None:
        """``-sum_t (lam_t^T b_t + phi_t^*(lam_t)) + constant``; ``None`` if a ``lam`` is
        outside the conjugate's domain."""
        c = self.constant
        for t, lam in zip(self.terms, lams):
            c -= float(np.dot(lam, t.b))
            if t.kind == "l2":
                pos = t.w > 0
                if np.any(lam[~pos] != 0):
                    return None
                c -= 0.5 * float(np.dot(lam[pos], lam[pos] / t.w[pos]))
            elif np.any(np.abs(lam) > t.w * (1 + 1e-12)):
                return None
        return c

    def adjoint(self, lams: list[np.ndarray]) -> np.ndarray:
        g = np.zeros(self.n)
        for t, lam in zip(self.terms, lams):
            t.add_adjoint(lam, g)
        return g

    def lipschitz(self, offsets: np.ndarray, total: float, tau: float = 0.0) -> float:
        """A computed bound on the Lipschitz constant of the gradient in full-table space,
        from the l1 norm to the l-infinity norm: ``max_x sum_t max_i w_t,i ||A_t Q e_x||^2``
        (exact for marginals measured by the identity); Huber terms count with ``w / tau``.
        Multiplied by ``total`` it is the constant of Algorithm 2 for the entropy of the
        unnormalised marginals, which is ``1/total``-strongly convex in l1."""
        K = 0.0
        for t in self.terms:
            w = float(t.w.max(initial=0.0))
            if t.kind == "l1":
                if tau <= 0:
                    continue
                w /= tau
            K += w * t.column_norm_bound(offsets)
        return K * total
