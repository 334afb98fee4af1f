"""A noisy release of linear queries: the unit every likelihood is built from."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .arrays import as_float_array, check_finite

__all__ = ["Measurement", "NOISE_FAMILIES"]

NOISE_FAMILIES = ("laplace", "gaussian")


@dataclass(frozen=True, eq=False)
class Measurement:
    """Noisy answers ``answers = queries @ data + noise`` of one noise family.

    Parameters
    ----------
    queries : (m, n) array or scipy sparse matrix, the query matrix ``Q``.
    answers : (m,) noisy answers ``y``.
    noise : ``"laplace"`` (scale ``b``: density ``exp(-|e|/b) / 2b``) or
        ``"gaussian"`` (scale = standard deviation ``sigma``).
    scale : positive scalar, or one positive value per query.

    The arrays are copied on construction (the caller's arrays are never
    aliased or mutated); ``queries`` is stored as CSR.  Entries that are not real numbers
    (``scale="two"``, a string among the answers), NaN, inf or complex numbers raise
    ``ValueError`` naming the argument and the first bad entry.
    """

    queries: sp.csr_matrix
    answers: np.ndarray
    noise: str = "laplace"
    scale: float | np.ndarray = 1.0

    def __post_init__(self) -> None:
        for name in ("queries", "answers", "scale"):
            if _is_complex(getattr(self, name)):
                raise ValueError(f"Measurement: {name} are complex; DP releases are real numbers")
        Q = self.queries
        if sp.issparse(Q):
            Q = sp.csr_matrix(Q, dtype=float, copy=True)
        else:
            Q = as_float_array(Q, "Measurement: queries")
            if Q.ndim == 1:
                Q = Q[None, :]
            if Q.ndim != 2:
                raise ValueError(f"Measurement: queries must be a 2-D matrix, got shape {Q.shape}")
            Q = sp.csr_matrix(Q)
        if Q.shape[0] == 0 or Q.shape[1] == 0:
            raise ValueError(f"Measurement: queries must have at least one row and one column "
                             f"(one per cell), got shape {Q.shape}")
        check_finite(Q, "Measurement: queries")
        m = Q.shape[0]
        y = as_float_array(self.answers, "Measurement: answers")
        if y.ndim == 0:
            y = y.reshape(1)
        if y.ndim != 1 or y.size != m:
            raise ValueError(f"Measurement: answers must have shape ({m},) to match queries "
                             f"of shape {Q.shape}, got {np.shape(self.answers)}")
        check_finite(y, "Measurement: answers")
        noise = str(self.noise).lower()
        if noise not in NOISE_FAMILIES:
            raise ValueError(f"Measurement: noise must be one of {NOISE_FAMILIES}, got {self.noise!r}")
        s = as_float_array(self.scale, "Measurement: scale")
        if s.ndim == 0:
            scale: float | np.ndarray = float(s)
        elif s.shape == (m,):
            scale = s
        else:
            raise ValueError(f"Measurement: scale must be a scalar or have shape ({m},), got {s.shape}")
        bad = np.flatnonzero(~(np.isfinite(s) & (s > 0)).ravel())
        if bad.size:
            got = (f"got {float(s)!r}" if s.ndim == 0
                   else f"entry {int(bad[0])} is {float(s[bad[0]])!r}")
            raise ValueError(f"Measurement: scale must be positive and finite, {got}")
        y.setflags(write=False)
        if isinstance(scale, np.ndarray):
            scale.setflags(write=False)
        object.__setattr__(self, "queries", Q)
        object.__setattr__(self, "answers", y)
        object.__setattr__(self, "noise", noise)
        object.__setattr__(self, "scale", scale)

    @property
    def shape(self) -> tuple[int, int]:
        """Shape ``(m, n)`` of the query matrix."""
        return self.queries.shape

    @property
    def scales(self) -> np.ndarray:
        """The scale of every query as an ``(m,)`` array."""
        return np.broadcast_to(np.asarray(self.scale, dtype=float), (self.queries.shape[0],)).copy()

    @property
    def variance(self) -> np.ndarray:
        """Per-query noise variance: ``2 b^2`` (Laplace) or ``sigma^2`` (Gaussian)."""
        s = self.scales
        return 2.0 * s * s if self.noise == "laplace" else s * s

    def __repr__(self) -> str:
        m, n = self.queries.shape
        sc = self.scale if np.ndim(self.scale) == 0 else f"array({m})"
        return f"Measurement({m} queries on {n} cells, noise={self.noise!r}, scale={sc})"


def _is_complex(value) -> bool:
    """Whether ``value`` holds complex numbers (ragged or non-numeric input is left to the
    conversion, whose error names the entry)."""
    try:
        return (value.data if sp.issparse(value) else np.asarray(value)).dtype.kind == "c"
    except ValueError:
        return False
