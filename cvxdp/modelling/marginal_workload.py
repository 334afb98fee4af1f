"""``MarginalWorkload``: the marginals a release asks for, in the residual basis.

``W = cvxdp.workloads.marginal_workload(domain, cliques)`` holds the attribute sets whose
marginals are wanted and their *downward closure*: every subset of every clique, the empty set
(the total) included.  Each set ``A`` of the closure is a *residual* (ResidualPlanner, Xiao,
Wang, Ding, Kifer, NeurIPS 2023): the noise design gives each its own variance ``s_A``, the
entries of a strategy variable ``s = cp.Variable(W.n_residuals, pos=True)`` in the order of
``W.residuals``.  Then (:mod:`cvxdp.solvers.residual.basis` has the derivation)

* ``cvxdp.privacy_cost(W, s) = sum_A p_A / s_A``, ``p_A = prod_{i in A} (n_i - 1) / n_i``: the
  squared L2 sensitivity of the Gaussian mechanism the strategy defines, so that it is
  ``rho``-zCDP with ``rho = privacy_cost / 2`` (:mod:`cvxdp.privacy` converts to
  ``(epsilon, delta)``);
* ``cvxdp.query_variance(W, s)[m] = sum_{A subset of M} v_{M,A} s_A``: the variance of every
  cell of the ``m``-th workload marginal ``M``, ``v_{M,A} = prod_{i in A} (n_i - 1) / n_i
  prod_{i in M \\ A} n_i^{-2}``.

No matrix over the full domain is ever formed: a workload of all three-way marginals of 100
attributes is 161,700 cliques and 166,751 residuals.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..solvers.residual.basis import ResidualBasis, closure
from .domain import Domain

__all__ = ["MarginalWorkload", "marginal_workload"]


class MarginalWorkload:
    """Marginals on ``cliques`` of ``domain``, with their downward closure (module docstring).

    Attributes
    ----------
    domain : the :class:`cvxdp.Domain`.
    cliques : the workload's marginals, attribute tuples in the order given (a clique may
        appear twice: two targets for one marginal).
    residuals : the downward closure, attribute tuples (each in domain order), by size then
        lexicographically (in domain order): the order of the strategy's entries.
    basis : the arrays (:class:`cvxdp.solvers.residual.basis.ResidualBasis`): ``p``, ``V``, ...
    """

    def __init__(self, domain: Domain, cliques: Sequence[tuple[int, ...]]) -> None:
        """``cliques``: attribute *indices* of ``domain`` (use :func:`marginal_workload`,
        which takes names)."""
        self.domain = domain
        self.basis: ResidualBasis = closure(np.asarray(domain.sizes, dtype=np.int64), cliques)
        self._cliques: tuple[tuple[str, ...], ...] | None = None
        self._residuals: tuple[tuple[str, ...], ...] | None = None

    @property
    def cliques(self) -> tuple[tuple[str, ...], ...]:
        """The workload's marginals, attribute tuples in domain order, as given."""
        if self._cliques is None:
            names = self.domain.names
            self._cliques = tuple(tuple(names[a] for a in c) for c in self.basis.cliques)
        return self._cliques

    @property
    def residuals(self) -> tuple[tuple[str, ...], ...]:
        """The downward closure: attribute tuples in domain order, by size then
        lexicographically (in domain order), the order of the strategy's entries."""
        if self._residuals is None:
            names = np.asarray(self.domain.names, dtype=object)
            rows = self.basis.residuals
            self._residuals = tuple(tuple(names[row[:k]]) for row, k in
                                    zip(rows, self.basis.residual_size.tolist()))
        return self._residuals

    @property
    def n_residuals(self) -> int:
        """The number of residuals (entries of the strategy variable)."""
        return self.basis.n_residuals

    @property
    def n_marginals(self) -> int:
        """The number of workload marginals (entries of ``query_variance(W, s)``)."""
        return len(self.cliques)

    @property
    def privacy_weights(self) -> np.ndarray:
        """``p_A`` per residual (a copy)."""
        return self.basis.p.copy()

    @property
    def variance_matrix(self) -> sp.csr_matrix:
        """``V`` with ``V[m, A] = v_{M,A}`` (a copy): ``query_variance(W, s) = V @ s``."""
        return self.basis.V.copy()

    def cells(self) -> np.ndarray:
        """The number of cells of each workload marginal."""
        n = np.asarray(self.domain.sizes, dtype=float)
        return np.array([float(np.prod(n[[self.domain.index(a) for a in c]])) for c in self.cliques])

    def residual_index(self, attrs: Sequence[str] | str) -> int:
        """The position of the residual on ``attrs`` (any order) among :attr:`residuals`."""
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        key = tuple(sorted(attrs, key=self.domain.index))
        try:
            return self._positions()[key]
        except KeyError:
            raise KeyError(f"{attrs} is not in the workload's downward closure") from None

    def _positions(self) -> dict[tuple[str, ...], int]:
        if not hasattr(self, "_pos"):
            self._pos = {r: j for j, r in enumerate(self.residuals)}
        return self._pos

    def __repr__(self) -> str:
        return (f"MarginalWorkload({len(self.domain)} attributes, {self.n_marginals} marginals, "
                f"{self.n_residuals} residuals)")

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, MarginalWorkload) and self.domain == other.domain
                and self.basis.cliques == other.basis.cliques)

    __hash__ = None  # type: ignore[assignment]


def marginal_workload(domain: Domain | Mapping[str, int] | Sequence[int],
                      cliques: Sequence[Sequence[Any] | Any]) -> MarginalWorkload:
    """The marginals on ``cliques`` of ``domain``, in the residual basis (module docstring).

    Parameters
    ----------
    domain : a :class:`cvxdp.Domain`, a mapping ``name -> size``, or a list of sizes (the
        attributes are then named ``"0" .. "k-1"`` and cliques may give them as integers).
    cliques : attribute tuples (a single name is a 1-tuple; an attribute may also be given by
        its position, an integer), at least one; a clique is put in domain order.

    ``ValueError`` / ``KeyError`` name the bad argument (an unknown or repeated attribute, an
    empty workload or clique).
    """
    if isinstance(domain, Domain):
        dom = domain
    elif isinstance(domain, Mapping):
        dom = Domain(domain)
    else:
        sizes = list(domain)
        dom = Domain([str(i) for i in range(len(sizes))], sizes)
    if isinstance(cliques, (str, bytes)) or not isinstance(cliques, Sequence):
        raise ValueError(f"marginal_workload: cliques must be a list of attribute tuples, got "
                         f"{cliques!r}")
    if len(cliques) == 0:
        raise ValueError("marginal_workload: the workload has no cliques")
    lookup: dict = dict(zip(dom.names, range(len(dom))))
    lookup.update({i: i for i in range(len(dom))})          # attributes by position too
    out = []
    for c in cliques:
        c = (c,) if isinstance(c, (str, int, np.integer)) else tuple(c)
        try:
            idx = sorted(lookup[a] for a in c)
        except (KeyError, TypeError):
            dom.clique(tuple(a for a in c if a not in lookup))    # raises, naming the attribute
            raise
        if not idx or any(x == y for x, y in zip(idx, idx[1:])):
            dom.clique(tuple(dom.names[i] for i in idx) if idx else ())   # names the error
        out.append(tuple(idx))
    return MarginalWorkload(dom, out)
