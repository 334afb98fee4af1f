"""Residual answers from records, and the unbiased reconstruction of marginals from them.

For a residual ``A`` with variance ``s_A`` (:mod:`.basis`), the designed Gaussian mechanism
releases ``y_A = R_A x + e_A`` with ``e_A ~ N(0, s_A (x)_{i in A} Sub_i Sub_i^T)``.  Since
``R_A x = (x)_{i in A} Sub_i m_A`` (``m_A`` the marginal on ``A``), the release is

    y_A = (x)_{i in A} Sub_i (m_A + z_A),     z_A ~ N(0, s_A) on every cell of ``m_A``:

ordinary Gaussian noise on the marginal, followed by differences along each axis.  Only
``y_A`` is released (``m_A + z_A`` itself would cost ``1 / s_A`` instead of ``p_A / s_A``).
Marginals are counted from the records of each workload clique once and summed down to its
subsets: no table over the whole domain.

The unbiased reconstruction of the marginal on ``M`` (ResidualPlanner's; ReM's for Gaussian
noise) adds, for every ``A`` inside ``M``, ``(x)_{i in A} Sub_i^+ y_A`` spread evenly over the
attributes of ``M \\ A``; ``Sub^+ = Sub^T (Sub Sub^T)^{-1}`` with ``(Sub Sub^T)^{-1} = I - 1 1^T
/ n``, so each factor is ``O(cells)``.  Its per-cell variance is ``sum_{A in M} v_{M,A} s_A``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["marginal_counts", "sub", "sub_pinv", "residual_answers", "reconstruct_marginal"]


def marginal_counts(codes: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """The contingency table of ``codes`` (records x attributes, integer codes) over
    ``sizes``, shaped by them."""
    shape = tuple(int(n) for n in sizes)
    if codes.shape[1] == 0:
        return np.array(float(codes.shape[0]))
    flat = np.ravel_multi_index(tuple(codes.T), shape) if codes.shape[0] else np.zeros(0, int)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape).astype(float)


def sub(T: np.ndarray) -> np.ndarray:
    """``(x)_axes Sub`` applied to the table ``T`` (``Sub v = v[0] - v[1:]`` on every axis)."""
    for ax in range(T.ndim):
        first = np.take(T, [0], axis=ax)
        T = first - np.take(T, np.arange(1, T.shape[ax]), axis=ax)
    return T


def sub_pinv(Y: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """``(x)_axes Sub^+`` applied to ``Y`` (axis ``i`` of length ``sizes[i] - 1``):
    ``w = y - sum(y) / n``, then ``Sub^T w = (sum w, -w)`` on every axis."""
    for ax, n in enumerate(sizes):
        w = Y - Y.sum(axis=ax, keepdims=True) / n
        Y = np.concatenate([w.sum(axis=ax, keepdims=True), -w], axis=ax)
    return Y


def residual_answers(tables: Sequence[np.ndarray], variances: np.ndarray,
                     gaussian: Callable[[np.ndarray, float], np.ndarray]) -> list[np.ndarray]:
    """``y_A`` for every residual: ``gaussian(table, s_A)`` (the table plus ``N(0, s_A)`` on
    every cell, from the caller's sampler), then ``(x) Sub``."""
    return [sub(np.asarray(gaussian(t, float(s)), dtype=float).reshape(t.shape))
            for t, s in zip(tables, variances)]


def reconstruct_marginal(target: Sequence[int], sizes: Sequence[int],
                         parts: Sequence[tuple[Sequence[int], np.ndarray]]) -> np.ndarray:
    """The unbiased marginal on ``target`` (attribute indices, ascending; ``sizes`` theirs)
    from ``parts``: ``(A, z_A)`` for every residual ``A`` inside it, ``z_A = (x) Sub^+ y_A``
    its answers in its own coordinates (module docstring)."""
    shape = tuple(int(n) for n in sizes)
    out = np.zeros(shape)
    pos = {a: j for j, a in enumerate(target)}
    for A, y in parts:
        axes = [pos[a] for a in A]
        u = np.asarray(y, dtype=float)
        view = [1] * len(shape)
        for j, n in zip(axes, u.shape):
            view[j] = n
        spread = float(np.prod([shape[j] for j in range(len(shape)) if j not in axes]))
        out += u.reshape(view) / spread
    return out
