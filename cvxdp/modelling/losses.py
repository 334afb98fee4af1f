"""Negative log-likelihoods of noisy measurements as cvxpy expressions.

For a measurement ``y = Q x + e`` (Lee, Wang, Kifer 2015, sec. 4.1):

* Laplace noise of scale ``b``:  ``-log p(y | x) = sum_i |Q_i x - y_i| / b_i + const``
* Gaussian noise of std ``sigma``: ``sum_i (Q_i x - y_i)^2 / (2 sigma_i^2) + const``

Several measurements add up, each weighted by its own scale, so a group
measured with twice the noise counts half as much (L1) or a quarter (L2).
The elastic net of eq. 23, ``alpha * L1 + (1 - alpha) * L2``, is defined here on
*noise-standardised* residuals ``(Q x - y) / scale``: on raw counts the quadratic
dominates as soon as a residual exceeds ``alpha / (1 - alpha)`` counts, whatever
the noise level, and the mix stops meaning what alpha says.

The expressions are plain cvxpy atoms (``norm1``, ``sum_squares``, ``multiply``),
so any solver accepts them and the ADMM recogniser reads them back.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable, Sequence

import cvxpy as cp
import numpy as np

from .measurement import Measurement
from .residual_likelihood import residual_likelihood
from .residual_measurement import ResidualMeasurement

__all__ = ["nll", "elastic_net", "laplace", "gaussian", "residual"]


def _as_list(measurements) -> list[Measurement]:
    if isinstance(measurements, Measurement):
        return [measurements]
    if isinstance(measurements, (list, tuple)):
        out = list(measurements)
        for i, m in enumerate(out):
            if not isinstance(m, Measurement):
                raise TypeError(f"measurements[{i}] must be a cvxdp.Measurement, got {type(m).__name__}")
        if not out:
            raise ValueError("measurements must not be empty")
        return out
    raise TypeError("measurements must be a cvxdp.Measurement or a list of them, "
                    f"got {type(measurements).__name__}")


def _flat(x: cp.Expression) -> cp.Expression:
    """A table-shaped ``x`` is read in C order (``x.value.ravel()``, numpy's convention), so a
    measurement of a contingency table's cells lists them as ``table.ravel()`` does."""
    x = cp.Expression.cast_to_const(x) if not isinstance(x, cp.Expression) else x
    if x.ndim <= 1:
        return x
    return cp.vec(x, order="C")


def residual(m: Measurement, x: cp.Expression, space: str | None = None) -> cp.Expression:
    """``Q @ x - y`` when ``x`` is the data vector (``x.size == Q.shape[1]``), or
    ``x - y`` when ``x`` holds the answers themselves (``x.size == Q.shape[0]``,
    e.g. the node counts of a hierarchy).  A square ``Q`` is ambiguous: ``x`` is
    taken as data unless ``space="answers"``."""
    x = _flat(x)
    mq, nq = m.queries.shape
    if space not in (None, "data", "answers"):
        raise ValueError(f"space must be None, 'data' or 'answers', got {space!r}")
    if space is None:
        if x.size == nq:
            space = "data"
        elif x.size == mq:
            space = "answers"
        else:
            raise ValueError(f"x has {x.size} entries; the measurement's queries have shape "
                             f"{m.queries.shape}: x must have {nq} (data) or {mq} (answers) entries")
    if space == "data":
        if x.size != nq:
            raise ValueError(f"x has {x.size} entries, queries have {nq} columns")
        return m.queries @ x - noisy_answers(m)
    if x.size != mq:
        raise ValueError(f"x has {x.size} entries, the measurement has {mq} answers")
    return x - noisy_answers(m)


#: the attribute of a cvxpy ``Constant`` of noisy answers that holds its ``Measurement``
NOISE_TAG = "_cvxdp_measurement"


def noisy_answers(m: Measurement) -> cp.Constant:
    """The answers as a cvxpy ``Constant`` that remembers their measurement (its noise family
    and scale), so that ``cvxdp.error_bars`` can find the noisy data of a model and re-draw
    it; the solvers read it as any other constant."""
    c = cp.Constant(m.answers)
    setattr(c, NOISE_TAG, m)
    return c


def laplace(r: cp.Expression, scale) -> cp.Expression:
    """``sum |r_i| / b_i`` (Laplace negative log-likelihood up to a constant)."""
    s = np.asarray(scale, dtype=float)
    if np.any(~np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"laplace: scale must be positive and finite, got {scale!r}")
    if s.ndim == 0:
        return cp.norm1(r) / float(s)
    return cp.sum(cp.multiply(1.0 / s, cp.abs(r)))


def gaussian(r: cp.Expression, sigma) -> cp.Expression:
    """``sum r_i^2 / (2 sigma_i^2)`` (Gaussian negative log-likelihood up to a constant)."""
    s = np.asarray(sigma, dtype=float)
    if np.any(~np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"gaussian: sigma must be positive and finite, got {sigma!r}")
    if s.ndim == 0:
        return cp.sum_squares(r) / (2.0 * float(s) ** 2)
    return cp.sum(cp.multiply(1.0 / (2.0 * s * s), cp.square(r)))


def nll(measurements: Measurement | Sequence[Measurement] | ResidualMeasurement,
        x: cp.Expression | Mapping, *, space: str | None = None) -> cp.Expression:
    """Negative log-likelihood of ``measurements`` given ``x``, up to a constant.

    Laplace measurements contribute ``|Q x - y|_1 / b``, Gaussian ones
    ``|Q x - y|_2^2 / (2 sigma^2)``.  See :func:`residual` for ``space``.  Residual answers of
    a marginal workload (``cvxdp.mechanisms.residual_gaussian``) take ``x`` as a mapping
    ``clique -> marginal`` (:mod:`cvxdp.modelling.residual_likelihood`).
    """
    if isinstance(measurements, ResidualMeasurement):
        if space is not None:
            raise ValueError("nll: space does not apply to residual answers")
        return residual_likelihood(measurements, x)
    terms = []
    for m in _as_list(measurements):
        r = residual(m, x, space)
        scale = m.scale if np.ndim(m.scale) == 0 else m.scales
        terms.append(laplace(r, scale) if m.noise == "laplace" else gaussian(r, scale))
    return _add(terms)


def elastic_net(measurements: Measurement | Sequence[Measurement], x: cp.Expression,
                alpha: float = 0.9, *, space: str | None = None) -> cp.Expression:
    """``alpha * sum |z| + (1 - alpha) * sum z^2`` of standardised residuals
    ``z = (Q x - y) / scale`` (Lee et al. eq. 23; see the module note)."""
    if not (0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"elastic_net: alpha must lie in [0, 1], got {alpha!r}")
    alpha = float(alpha)
    terms = []
    for m in _as_list(measurements):
        r = residual(m, x, space)
        s = m.scale if np.ndim(m.scale) == 0 else m.scales
        if alpha > 0:
            terms.append(alpha * laplace(r, s))
        if alpha < 1:
            terms.append((1.0 - alpha) * 2.0 * gaussian(r, s))   # 2 * r^2/(2 s^2) = (r/s)^2
    return _add(terms)


def _add(terms: Iterable[cp.Expression]) -> cp.Expression:
    terms = list(terms)
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out
