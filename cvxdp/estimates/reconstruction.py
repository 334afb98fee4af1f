"""``cvxdp.reconstruct``: the unbiased marginals of a residual measurement, on demand.

From the residual answers ``y_A`` of a :class:`~cvxdp.modelling.residual_measurement.
ResidualMeasurement`, the marginal on any attribute set ``M`` of the workload's downward closure
is estimated without bias by adding, for every residual ``A`` inside ``M``, its answers mapped
back to ``M``'s cells (``Sub^+`` on ``A``'s attributes, spread evenly over the others;
:mod:`cvxdp.solvers.residual.measure`).  This is ResidualPlanner's reconstruction (Xiao, Wang,
Ding, Kifer, NeurIPS 2023) and ReM's least-squares estimate for Gaussian noise (Mullins et al.,
NeurIPS 2024); every cell of ``M`` has variance ``sum_{A in M} v_{M,A} s_A``, which the design
held at or below each workload marginal's target.

The estimates are consistent (marginals of one another agree) but may be negative; the
non-negative, consistent estimate is a :class:`cvxdp.LocalPolytope` model.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from ..modelling.marginal_workload import MarginalWorkload
from ..modelling.residual_measurement import ResidualMeasurement
from ..solvers.residual.measure import reconstruct_marginal

__all__ = ["Reconstruction", "reconstruct"]


class Reconstruction(Mapping):
    """The unbiased marginals of a residual measurement: ``out[clique]`` (computed on first
    access, then kept) for the workload's cliques and any attribute set of its downward
    closure, axes in the order asked; ``out.variance(clique)`` its per-cell variance.
    Iterating gives the workload's cliques."""

    def __init__(self, measurement: ResidualMeasurement) -> None:
        self.measurement = measurement
        self.workload: MarginalWorkload = measurement.workload
        self._done: dict[tuple[str, ...], np.ndarray] = {}

    def _key(self, attrs: Sequence[str] | str) -> tuple[str, ...]:
        dom = self.workload.domain
        attrs = dom.clique(attrs)
        return tuple(sorted(attrs, key=dom.index))

    def _subsets(self, key: tuple[str, ...]) -> list[int]:
        """The residuals inside ``key``; ``KeyError`` when ``key`` is outside the closure."""
        W = self.workload
        W.residual_index(key)
        return [W.residual_index(sub) for r in range(len(key) + 1)
                for sub in itertools.combinations(key, r)]

    def __getitem__(self, attrs: Sequence[str] | str) -> np.ndarray:
        key = self._key(attrs)
        if key not in self._done:
            W, m = self.workload, self.measurement
            idx = [W.domain.index(a) for a in key]
            parts = [(list(W.basis.residual(j)), m.components[j]) for j in self._subsets(key)]
            self._done[key] = reconstruct_marginal(idx, [W.domain[a] for a in key], parts)
        order = [key.index(a) for a in ((attrs,) if isinstance(attrs, str) else tuple(attrs))]
        return np.transpose(self._done[key], order)

    def variance(self, attrs: Sequence[str] | str) -> float:
        """The variance of every cell of the estimate on ``attrs``."""
        key = self._key(attrs)
        W, s = self.workload, self.measurement.variances
        n = {a: W.domain[a] for a in key}
        total = 0.0
        for j in self._subsets(key):
            A = W.residuals[j]
            total += float(W.basis.p[j] * np.prod([n[a] ** -2.0 for a in key if a not in A])
                           * s[j]) if W.basis.p[j] > 0 else 0.0
        return total

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return iter(dict.fromkeys(self.workload.cliques))

    def __len__(self) -> int:
        return len(dict.fromkeys(self.workload.cliques))

    def __repr__(self) -> str:
        return f"Reconstruction({self.workload!r})"


def reconstruct(W: MarginalWorkload, measurement: ResidualMeasurement) -> Reconstruction:
    """The unbiased marginals of ``measurement`` (residual answers of the workload ``W``), as
    a mapping that computes ``out[clique]`` on demand (module docstring)."""
    if not isinstance(measurement, ResidualMeasurement):
        raise TypeError(f"reconstruct: measurement must be a ResidualMeasurement (from "
                        f"cvxdp.mechanisms.residual_gaussian), got {type(measurement).__name__}")
    if not isinstance(W, MarginalWorkload) or W != measurement.workload:
        raise ValueError("reconstruct: W is not the workload the measurement was taken of")
    return Reconstruction(measurement)
