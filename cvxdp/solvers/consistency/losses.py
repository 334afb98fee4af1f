"""Separable elastic-net losses, their proximal maps and conjugates.

Each coordinate carries ``phi_i(r) = w1_i |r| + (w2_i / 2) r^2`` of its residual
``r = x_i - y_i`` (``w1`` alone: Laplace MLE, ``w1 = 1/b``; ``w2`` alone: Gaussian
MLE, ``w2 = 1/sigma^2``; both: the elastic net of Lee et al. 2015, eq. 23) and
optional bounds ``lower_i <= x_i <= upper_i``.

* prox (Lee et al. eq. 13-14, plus bounds): for one coordinate
  ``argmin_x phi(x - y) + (rho/2)(x - v)^2`` is ``y + S_{w1/rho}(v - y) / (1 + w2/rho)``;
  a bound is a 1-D interval, so the bounded prox is that point clipped.
* conjugate ``f_i^*(s) = sup_{l <= x <= u} s x - phi_i(x - y_i)``: the concave
  maximand's free maximiser clipped to ``[l, u]``; ``+inf`` when it escapes to an
  infinite bound.  ``-sum f_i^*(-lam_i)`` is the dual function used to certify gaps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._linalg import dot as _dot

__all__ = ["SeparableLoss", "soft_threshold"]


# Relative slack accepted at the edge of the conjugate's domain.
_DOMAIN_RTOL = 1e-12


def soft_threshold(v: np.ndarray, t: np.ndarray | float) -> np.ndarray:
    """``S_t(v) = sign(v) max(|v| - t, 0)`` (Lee et al. eq. 13), computed as
    ``v - clip(v, -t, t)``: two passes over memory instead of four."""
    return v - np.clip(v, -t, t)


@dataclass
class SeparableLoss:
    """``f(x) = sum_i w1_i |x_i - y_i| + (w2_i/2)(x_i - y_i)^2 + I[lower <= x <= upper]``."""

    y: np.ndarray
    w1: np.ndarray
    w2: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def __post_init__(self) -> None:
        n = self.y.size
        for name in ("w1", "w2", "lower", "upper"):
            arr = np.asarray(getattr(self, name), dtype=float)
            if arr.shape != (n,):
                arr = np.broadcast_to(arr, (n,)).copy()
            setattr(self, name, arr)
        self.y = np.asarray(self.y, dtype=float)
        self.has_bounds = bool(np.any(np.isfinite(self.lower)) or np.any(np.isfinite(self.upper)))
        self.pure_l1 = self.w2 == 0
        self._l1_only = not np.any(self.w2)
        self._w1_vec = not (self.w1.size and np.all(self.w1 == self.w1[0]))
        self._w1_scalar = float(self.w1[0]) if self.w1.size else 0.0
        lo_fin, hi_fin = np.isfinite(self.lower), np.isfinite(self.upper)
        # clip against scalars when the bounds are uniform (x >= 0 everywhere)
        self._lo = float(self.lower[0]) if self.lower.size and np.all(self.lower == self.lower[0]) else self.lower
        self._hi = float(self.upper[0]) if self.upper.size and np.all(self.upper == self.upper[0]) else self.upper
        self._has_lo, self._has_hi = bool(lo_fin.any()), bool(hi_fin.any())
        self._nonneg_only = bool(np.all(self.lower == 0) and np.all(np.isinf(self.upper)))
        if self._nonneg_only:
            self._ypos = np.maximum(self.y, 0.0)
            self._wyneg = float(_dot(self.w1, np.maximum(-self.y, 0.0)))

    @property
    def n(self) -> int:
        return self.y.size

    def value(self, x: np.ndarray) -> float:
        """Loss at ``x`` (bounds are not charged; see :meth:`bound_violation`)."""
        r = x - self.y
        return float(_dot(self.w1, np.abs(r)) + 0.5 * _dot(self.w2, r * r))

    def bound_violation(self, x: np.ndarray) -> float:
        if not self.has_bounds:
            return 0.0
        return float(max(0.0, np.max(self.lower - x, initial=0.0), np.max(x - self.upper, initial=0.0)))

    def clip(self, x: np.ndarray) -> np.ndarray:
        if not self.has_bounds:
            return x
        if self._has_lo and not self._has_hi:
            return np.maximum(x, self._lo)
        if self._has_hi and not self._has_lo:
            return np.minimum(x, self._hi)
        return np.clip(x, self._lo, self._hi)

    def prox(self, v: np.ndarray, rho: float, out_of_place: bool = True) -> np.ndarray:
        """``argmin_x f(x) + (rho/2)||x - v||^2`` (computed in place on a copy of v)."""
        x = np.array(v, dtype=float, copy=True) if out_of_place else v
        if self._l1_only:
            # soft threshold towards y: x = v - clip(v - y, -t, t)
            t = self.w1 / rho if self._w1_vec else self._w1_scalar / rho
            d = np.subtract(x, self.y)
            np.clip(d, -t, t, out=d)
            x -= d
        else:
            r = x - self.y
            x = self.y + soft_threshold(r, self.w1 / rho) / (1.0 + self.w2 / rho)
        if self.has_bounds:
            if self._has_lo and not self._has_hi:
                np.maximum(x, self._lo, out=x)
            elif self._has_hi and not self._has_lo:
                np.minimum(x, self._hi, out=x)
            else:
                np.clip(x, self._lo, self._hi, out=x)
        return x

    def subgradient_at(self, x: np.ndarray, g: np.ndarray, tol: float = 0.0
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Split a total subgradient ``g in df(x)`` into the loss part and the
        bound multipliers, ``g = g_loss - s_lower + s_upper`` with ``s >= 0`` and
        ``s`` nonzero only where ``x`` is within ``tol`` of that bound.  Any other
        mismatch between ``g`` and the loss's subdifferential is a dual residual
        and is dropped.  Returns ``(s_lower, s_upper)``."""
        r = x - self.y
        kink = (self.w1 > 0) & (np.abs(r) <= tol)
        smooth = self.w2 * r + self.w1 * np.sign(r)
        lo = np.where(kink, self.w2 * r - self.w1, smooth)
        hi = np.where(kink, self.w2 * r + self.w1, smooth)
        s_lower = np.where(x <= self.lower + tol, np.maximum(lo - g, 0.0), 0.0)
        s_upper = np.where(x >= self.upper - tol, np.maximum(g - hi, 0.0), 0.0)
        return s_lower, s_upper

    def conjugate_sum(self, s: np.ndarray) -> float:
        """``sum_i f_i^*(s_i)`` (``inf`` outside the domain), with a one-pass fast
        path for pure L1 with ``x >= 0`` (the hierarchy case):
        ``f^*(s) = max(s, -w) y_+ - w y_-`` for ``s <= w``."""
        if self._l1_only and self._nonneg_only:
            # s may exceed w by rounding (1e-16 relative) after a repair; such a point is
            # counted as on the boundary (the bound moves by ~1e-12 of the objective).
            w = self.w1 if self._w1_vec else self._w1_scalar
            if np.any(s > w * (1.0 + _DOMAIN_RTOL) + _DOMAIN_RTOL * np.max(w)):
                return math.inf
            return float(_dot(np.maximum(s, -w), self._ypos)) - self._wyneg
        return float(np.sum(self.conjugate(s)))

    def conjugate(self, s: np.ndarray) -> np.ndarray:
        """Elementwise ``f_i^*(s_i)`` (``+inf`` outside the domain)."""
        s = np.asarray(s, dtype=float)
        w1, w2, y = self.w1, self.w2, self.y
        # free maximiser of s r - phi(r) over r = x - y
        with np.errstate(divide="ignore", invalid="ignore"):
            excess = np.abs(s) - w1
            r_free = np.where(w2 > 0, np.sign(s) * np.maximum(excess, 0.0) / np.where(w2 > 0, w2, 1.0), 0.0)
        escape = (w2 == 0) & (excess > 0)
        r_free = np.where(escape, np.where(s > 0, np.inf, -np.inf), r_free)
        x = np.clip(y + r_free, self.lower, self.upper)
        out = np.full(s.shape, np.inf)
        ok = np.isfinite(x)
        r = x[ok] - y[ok]
        out[ok] = s[ok] * x[ok] - w1[ok] * np.abs(r) - 0.5 * w2[ok] * r * r
        return out

    def dual_domain(self) -> tuple[np.ndarray, np.ndarray]:
        """Interval ``[lo, hi]`` per coordinate of the multipliers ``lam = -s`` for
        which ``f^*(s)`` is finite: a pure-L1 (or unmeasured) coordinate with no
        upper bound needs ``s <= w1``, with no lower bound ``s >= -w1``."""
        if getattr(self, "_domain", None) is None:
            flat = self.w2 == 0
            s_hi = np.where(flat & np.isinf(self.upper), self.w1, np.inf)
            s_lo = np.where(flat & np.isinf(self.lower), -self.w1, -np.inf)
            self._domain = (-s_hi, -s_lo)
        return self._domain

    def max_dual_scale(self, s: np.ndarray) -> float:
        """Largest ``theta in [0, 1]`` with ``f^*(theta s)`` finite."""
        w1, w2 = self.w1, self.w2
        esc_up = (w2 == 0) & (s > w1) & np.isinf(self.upper)
        esc_dn = (w2 == 0) & (-s > w1) & np.isinf(self.lower)
        theta = 1.0
        if esc_up.any():
            theta = min(theta, float(np.min(w1[esc_up] / s[esc_up])))
        if esc_dn.any():
            theta = min(theta, float(np.min(w1[esc_dn] / -s[esc_dn])))
        return theta
