"""Measurements of a histogram at every unit of a geography, and their exact GLS with variances.

``HistogramMeasurement(units, queries, answers, scale)`` says: at each of ``units`` the
queries ``Q`` (one row per query, one column per histogram cell) were answered with
independent Gaussian noise of standard deviation ``scale`` (a number or one per query).
:func:`gls` returns the weighted least-squares estimate of every unit's histogram under
consistency (every unit the sum of its children) and exact invariants, with the variance of
every cell and of every measured query -- the two-pass algorithm of
:mod:`cvxdp.solvers.tree.gls`, ``O(units k^2)`` after ``O(k^3)`` per distinct matrix.  The same
estimate is what ``cvxdp.ADMM`` returns for the cvxpy model with
``cvxdp.HierarchicalHistogram``; this function adds the variances.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..solvers.tree.gls import Block, Invariant, TreeGLS

__all__ = ["HistogramMeasurement", "GLSResult", "gls"]


class HistogramMeasurement:
    """Noisy answers ``answers[i] = queries @ x_{units[i]} + noise`` (Gaussian, standard
    deviation ``scale``, a number or one per query).  Arrays are validated and copied."""

    def __init__(self, units, queries, answers, scale) -> None:
        units = np.asarray(units)
        if units.ndim != 1 or units.size == 0 or not np.issubdtype(units.dtype, np.integer):
            raise ValueError("HistogramMeasurement: units must be a non-empty 1-D integer array")
        Q = np.atleast_2d(np.asarray(queries.toarray() if hasattr(queries, "toarray") else queries))
        if np.iscomplexobj(Q) or not np.all(np.isfinite(Q.astype(float))):
            raise ValueError("HistogramMeasurement: queries must be real and finite")
        Y = np.asarray(answers)
        if np.iscomplexobj(Y):
            raise ValueError("HistogramMeasurement: answers must be real")
        Y = Y.astype(float).reshape(units.size, -1) if Y.size == units.size * Q.shape[0] else None
        if Y is None:
            raise ValueError(f"HistogramMeasurement: answers must be ({units.size}, {Q.shape[0]}) "
                             f"(one row per unit, one column per query), got shape {np.shape(answers)}")
        bad = ~np.isfinite(Y)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ValueError(f"HistogramMeasurement: answer {j} of unit {units[i]} is not finite")
        sc = np.broadcast_to(np.asarray(scale, dtype=float), (Q.shape[0],)).copy()
        if not np.all(np.isfinite(sc)) or np.any(sc <= 0):
            raise ValueError("HistogramMeasurement: scale must be positive and finite")
        self.units = units.astype(np.int64)
        self.queries = Q.astype(float)
        self.answers = Y
        self.scale = sc

    def block(self) -> Block:
        """The numerical layer's form (weights ``1 / scale^2``)."""
        return Block(self.units, self.queries, 1.0 / self.scale ** 2, self.answers)


@dataclass
class GLSResult:
    """``x`` the estimate (one row per unit), ``cell_variance`` each cell's variance, and
    ``query_variance`` one array per measurement (units x queries)."""

    x: np.ndarray
    cell_variance: np.ndarray
    query_variance: list[np.ndarray]


def gls(geography, measurements: Sequence[HistogramMeasurement], *,
        invariants: dict | None = None, variances: bool = True) -> GLSResult:
    """The exact GLS of the module docstring.

    ``invariants``: ``{unit: (E, e)}`` exact facts ``E @ x_unit = e`` (``E`` one row per fact;
    a unit's whole histogram: ``(np.eye(k), values)``).  Every leaf must be measured on all its
    cells (``ValueError`` naming it otherwise); contradicting invariants raise
    ``ValueError``."""
    forest, ms, k = checked_inputs("gls", geography, measurements)
    invs = []
    for unit, (E, e) in (invariants or {}).items():
        E = np.atleast_2d(np.asarray(E, dtype=float))
        invs.append(Invariant([int(unit)], E, np.asarray(e, dtype=float).reshape(1, E.shape[0])))
    g = TreeGLS(forest, k, [m.block() for m in ms], invs)
    x = g.solve()
    if not variances:
        return GLSResult(x, np.full(x.shape, np.nan), [])
    cells, queries = g.variances()
    return GLSResult(x, cells, queries)


def checked_inputs(caller: str, geography, measurements):
    """``(forest, measurements as a list, cells per unit)`` after the checks every estimator
    over a geography makes: a geography (or hierarchy), at least one measurement, one number
    of cells, units inside the geography.  Errors name ``caller``."""
    forest = getattr(geography, "forest", None)
    if forest is None:
        raise TypeError(f"{caller}: geography must be a cvxdp geography or hierarchy")
    ms = list(measurements)
    if not ms:
        raise ValueError(f"{caller}: no measurements")
    k = ms[0].queries.shape[1]
    for m in ms:
        if m.queries.shape[1] != k:
            raise ValueError(f"{caller}: measurements disagree on the number of cells ({k} and "
                             f"{m.queries.shape[1]})")
        if m.units.min() < 0 or m.units.max() >= forest.n:
            raise ValueError(f"{caller}: a measurement names a unit outside the geography "
                             f"(0 .. {forest.n - 1})")
    return forest, ms, k
