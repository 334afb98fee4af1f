"""The Gaussian likelihood of residual answers, as a loss of clique marginals.

``cvxdp.nll(measurement, marginals)`` for a
:class:`~cvxdp.modelling.residual_measurement.ResidualMeasurement` and a mapping ``clique ->
marginal expression`` (the workload's cliques, or cliques of its downward closure that hold
every residual) is the negative log-likelihood, up to a constant,

    sum_A  1 / (2 s_A) || P_A marg_A(mu_{C(A)}) - z_A ||^2,

``z_A = (x) Sub^+ y_A`` the answers of residual ``A`` in its own coordinates, ``P_A = (x)_{i in
A} (I - 1 1^T / n_i)``, ``C(A)`` the first given clique holding ``A``: for consistent marginals
this is ``(P_A marg_A - z_A)^T (s_A (x) Sub Sub^T)^{+} (...)`` of the release ``y_A =
(x) Sub m_A + noise`` exactly, the residual's likelihood.  With the marginals under
:class:`cvxdp.LocalPolytope` the problem is the non-negative, consistent reconstruction
(GReM-LNN's problem, Mullins et al., NeurIPS 2024); ``solver=cvxdp.ADMM`` solves it in residual
coordinates with a certified gap (:mod:`cvxdp.solvers.residual.nonneg`).

For standard solvers the loss canonicalises without a dense matrix: every marginal of a home
clique on a subset ``B`` of a residual gets an auxiliary variable (``q_B = marg_B(mu_C)``),
``P_A m_A = sum_{B in A} (-1)^{|A \\ B|} broadcast_A(q_B) / prod_{i in A \\ B} n_i``, and the
squared norm is one second-order cone.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS

from .convex_atom import ConvexAtom
from .residual_measurement import ResidualMeasurement

__all__ = ["ResidualLikelihood", "residual_likelihood"]


class ResidualLikelihood(ConvexAtom):
    """The loss of the module docstring; ``ResidualLikelihood(*marginals, measurement,
    cliques)`` (use :func:`residual_likelihood`)."""

    def __init__(self, *items) -> None:
        *marginals, measurement, cliques = items
        if not isinstance(measurement, ResidualMeasurement):
            raise TypeError(f"nll: expected a ResidualMeasurement, got {type(measurement).__name__}")
        self.measurement = measurement
        self.cliques = tuple(tuple(c) for c in cliques)
        W = measurement.workload
        dom = W.domain
        self.order = [tuple(dom.index(a) for a in c) for c in self.cliques]
        self.home = _homes(W, self.order)
        self.z = measurement.components
        self.w = np.where(W.basis.p > 0, 1.0 / measurement.variances, 0.0)
        super().__init__(*marginals)
        for c, a in zip(self.cliques, self.args):
            if a.size != dom.size(c):
                raise ValueError(f"nll: the marginal of {c} has {a.size} entries, its clique "
                                 f"{dom.size(c)}")

    def get_data(self):
        return [self.measurement, self.cliques]

    def shape_from_args(self):
        return ()

    def sign_from_args(self):
        return (True, False)

    def residuals(self, values) -> list[tuple[int, np.ndarray]]:
        """``(j, P_A m_A - z_A)`` for every residual with queries, ``m_A`` read from its home."""
        W = self.measurement.workload
        sizes = W.domain.sizes
        out = []
        for j in np.flatnonzero(self.w > 0):
            k = self.home[j]
            table = _in_domain_order(np.asarray(values[k], dtype=float), self.order[k], sizes)
            A = W.basis.residual(j)
            keep = sorted(self.order[k])
            drop = tuple(i for i, a in enumerate(keep) if a not in A)
            m = table.sum(axis=drop) if drop else table
            for ax in range(m.ndim):
                m = m - m.mean(axis=ax, keepdims=True)
            out.append((int(j), m - self.z[j]))
        return out

    def numeric(self, values):
        return float(sum(0.5 * self.w[j] * np.sum(r * r) for j, r in self.residuals(values)))

    def gradients(self, values) -> list[np.ndarray]:
        """The gradient with respect to every marginal, shaped like it: ``sum_{A at C}
        broadcast_C(w_A (P_A m_A - z_A))`` (``P_A`` keeps the residual in its range)."""
        W = self.measurement.workload
        sizes = W.domain.sizes
        out = [np.zeros(tuple(sizes[a] for a in sorted(o))) for o in self.order]
        for j, r in self.residuals(values):
            k = self.home[j]
            keep = sorted(self.order[k])
            A = W.basis.residual(j)
            view = [sizes[a] if a in A else 1 for a in keep]
            out[k] = out[k] + self.w[j] * np.reshape(r, view)
        return [np.transpose(g, [sorted(o).index(a) for a in o]).reshape(a.shape, order="C")
                for g, o, a in zip(out, self.order, self.args)]

    def _grad(self, values):
        return [sp.csc_array(np.asarray(g, dtype=float).ravel(order="F")[:, None])
                for g in self.gradients(values)]

    def name(self) -> str:
        return f"nll({self.measurement!r}, {len(self.cliques)} marginals)"

    __repr__ = name


def residual_likelihood(measurement: ResidualMeasurement,
                        marginals: Mapping) -> ResidualLikelihood:
    """``cvxdp.nll`` of residual answers: the loss of the module docstring."""
    if not isinstance(marginals, Mapping) or not marginals:
        raise ValueError("nll: the marginals must be a mapping clique -> expression")
    dom = measurement.workload.domain
    cliques = [dom.clique(c) for c in marginals]
    exprs = [e if isinstance(e, cp.Expression) else cp.Constant(e) for e in marginals.values()]
    return ResidualLikelihood(*exprs, measurement, cliques)


def _homes(W, order) -> np.ndarray:
    """For every residual, the first given clique that holds it; ``ValueError`` if none does."""
    home = np.full(W.n_residuals, -1)
    sets = [set(c) for c in order]
    for j in range(W.n_residuals):
        A = set(W.basis.residual(j))
        for k, s in enumerate(sets):
            if A <= s:
                home[j] = k
                break
        else:
            raise ValueError(f"nll: no marginal holds the residual {W.residuals[j]}; give the "
                             f"marginals of every workload clique")
    return home


def _in_domain_order(table: np.ndarray, order: tuple[int, ...], sizes) -> np.ndarray:
    """A clique's table (flat or shaped, axes in the clique's order) with axes in domain order."""
    T = table.reshape(tuple(sizes[a] for a in order))
    return np.transpose(T, np.argsort(order))


def _marginal_matrix(order: tuple[int, ...], sizes, B: tuple[int, ...]) -> sp.csr_matrix:
    """``marg_B`` on the flat (C order) table of a clique with axes ``order``: rows the cells of
    ``B`` (domain order), one entry per column."""
    shape = tuple(sizes[a] for a in order)
    idx = np.indices(shape).reshape(len(shape), -1)
    cells = idx.shape[1]
    if not B:
        return sp.csr_matrix(np.ones((1, cells)))
    rows = np.ravel_multi_index(tuple(idx[order.index(b)] for b in B), tuple(sizes[b] for b in B))
    return sp.csr_matrix((np.ones(cells), (rows, np.arange(cells))),
                         shape=(int(np.prod([sizes[b] for b in B])), cells))


def _broadcast_matrix(A: tuple[int, ...], B: tuple[int, ...], sizes) -> sp.csr_matrix:
    """``broadcast_A``: the cells of ``B`` (a subset of ``A``) repeated over ``A``'s."""
    shape = tuple(sizes[a] for a in A)
    idx = np.indices(shape).reshape(len(shape), -1) if A else np.zeros((0, 1), int)
    cells = idx.shape[1]
    cols = (np.ravel_multi_index(tuple(idx[A.index(b)] for b in B), tuple(sizes[b] for b in B))
            if B else np.zeros(cells, int))
    return sp.csr_matrix((np.ones(cells), (np.arange(cells), cols)),
                         shape=(cells, int(np.prod([sizes[b] for b in B])) if B else 1))


def _residual_likelihood_canon(expr: ResidualLikelihood, args, solver_context=None):
    """``t >= sum_A (w_A / 2) ||P_A m_A - z_A||^2`` with the auxiliary marginals of the module
    docstring and one second-order cone."""
    W = expr.measurement.workload
    sizes = W.domain.sizes
    flat = [cp.reshape(a, (a.size,), order="C") if a.ndim > 1 else a for a in args]
    aux: dict[tuple[int, tuple[int, ...]], cp.Variable] = {}
    cons, parts = [], []
    for j in np.flatnonzero(expr.w > 0):
        k, A = int(expr.home[j]), W.basis.residual(j)
        centred = 0
        for r in range(len(A) + 1):
            for B in itertools.combinations(A, r):
                if (k, B) not in aux:
                    q = cp.Variable(int(np.prod([sizes[b] for b in B])) if B else 1)
                    cons.append(q == _marginal_matrix(expr.order[k], sizes, B) @ flat[k])
                    aux[(k, B)] = q
                scale = (-1.0) ** (len(A) - r) / float(np.prod([sizes[a] for a in A if a not in B]))
                centred = centred + scale * (_broadcast_matrix(A, B, sizes) @ aux[(k, B)])
        parts.append(np.sqrt(expr.w[j] / 2.0) * (centred - expr.z[j].ravel()))
    if not parts:
        return cp.Constant(0.0), cons
    x = cp.hstack(parts)
    t = cp.Variable()
    return t, cons + [cp.SOC(t + 1.0, cp.hstack([t - 1.0, 2.0 * x]))]


CANON_METHODS[ResidualLikelihood] = _residual_likelihood_canon
