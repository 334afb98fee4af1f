"""``LocalPolytope``: clique marginals that agree wherever they overlap -- for any set of cliques.

    mu_C >= 0,   sum(mu_C) = N,   marg_S(mu_C) = marg_S(mu_D)  for all cliques C, D, S = C & D.

This is the *local polytope* (Wainwright & Jordan 2008, section 4.1.1), a relaxation of
:class:`cvxdp.MarginalPolytope`: every set of marginals of one table is in it, and for cliques
that form a junction tree (chains, trees, disjoint cliques, a decomposable model) the two are
equal, so the optimum is ``MarginalPolytope``'s.  Unlike the marginal polytope it needs no
junction tree: "all two-way marginals" of 14 attributes is 91 small tables here, while its
junction tree is the whole table.  The regions (attribute sets shared by two or more cliques,
all subsets of their intersections) are those of
:class:`cvxdp.solvers.local.region_graph.RegionGraph`.

Standard solvers get it as plain cvxpy constraints (:meth:`LocalPolytope.local_polytope`):
one non-negative table per clique, the measured marginals equal to them (the first
constraint, whose multiplier is this constraint's dual), their marginals on every region
equal to the first clique's holding it, and the totals.  ``solver=cvxdp.ADMM`` (also the pick
of ``solver=None``) solves it by ADMM with an exact projection onto the consistency set
(:mod:`cvxdp.solvers.local.admm`), stopped by a certified duality gap.  A clique in no loss
term whose overlaps with the others form an acyclic family (an unmeasured pair among two-way
marginals) is eliminated before that solve and filled in after with the decomposable table of
its overlaps' marginals (:mod:`cvxdp.solvers.local.reduce`): exact, as any consistent
marginals on such a family extend to a non-negative table.

After a solve, :meth:`LocalPolytope.marginal` answers any marginal over attributes inside one
clique (exact: all cliques holding them agree), and :meth:`LocalPolytope.model` fits a
graphical model for everything else (an approximation; see there).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS

from ..estimates.local_model import fit_model
from ..solvers.local.region_graph import RegionGraph

from .clique_marginals import CliqueMarginals
from .domain import Domain

__all__ = ["LocalPolytope"]


class LocalPolytope(CliqueMarginals):
    """The clique marginals ``marginals[C]`` are non-negative, sum to ``total`` and agree on
    every attribute set two cliques share (module docstring).

    Parameters
    ----------
    marginals : mapping from attribute tuples (cliques; a single name is a 1-tuple) to cvxpy
        expressions shaped by the clique's domain sizes or flattened (C order).  A clique
        inside another is allowed (e.g. a one-way marginal measured next to a two-way one).
    domain : a :class:`cvxdp.Domain` or a mapping ``name -> size``.
    total : the number of records, a positive number, a cvxpy Parameter, or ``None`` (unknown:
        the total is free, optimised with the marginals, as for ``MarginalPolytope``).
    """

    def __init__(self, marginals: Mapping[Any, cp.Expression], domain: Domain | Mapping[str, int],
                 total: float | cp.Parameter | None = None, *, constr_id: int | None = None) -> None:
        super().__init__(marginals, domain, total, constr_id=constr_id)
        self.graph = RegionGraph(self.domain.sizes,
                                 [tuple(self.domain.index(a) for a in c) for c in self.cliques])

    def describe(self) -> str:
        g = self.graph
        return (f"{len(self.cliques)} cliques, {g.n:,} cells (largest {int(g.cells.max()):,}), "
                f"{len(g.regions)} shared attribute sets")

    # ---------------------------------------------------------------- values
    def _stacked(self) -> np.ndarray | None:
        tabs = self.tables()
        return None if tabs is None else np.concatenate([t.ravel() for t in tabs])

    @property
    def residual(self) -> float | None:
        """Largest violation: a negative cell, two cliques' marginals disagreeing on a shared
        attribute set, or a total off ``total`` (off the first clique's when free)."""
        t = self._stacked()
        if t is None:
            return None
        neg = float(np.max(-t, initial=0.0))
        return max(neg, self.graph.residual(t, self.known_total()))

    def marginal(self, attrs: str | Sequence[str]) -> np.ndarray:
        """The current marginal on ``attrs`` (axes in the order given), read from the smallest
        clique holding them all; exact, as every clique holding them agrees (to the solve's
        tolerance).  Attribute sets in no single clique: use :meth:`model`."""
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        for a in attrs:
            self.domain.index(a)
        if len(set(attrs)) != len(attrs):
            raise ValueError(f"LocalPolytope.marginal: repeated attribute in {attrs}")
        holders = [k for k, c in enumerate(self.cliques) if set(attrs) <= set(c)]
        if not holders:
            raise ValueError(f"LocalPolytope.marginal: no clique holds all of {attrs}; the "
                             f"local polytope says nothing exact about them (use .model() for "
                             f"an approximation)")
        t = self._stacked()
        if t is None:
            raise ValueError("LocalPolytope.marginal: a marginal has no value (solve first)")
        k = min(holders, key=lambda j: self.graph.cells[j])
        idx = [self.domain.index(a) for a in attrs]
        return self.graph.marginal(t, k, idx)

    def model(self, *, max_cells: int = 2 ** 20, cliques: Sequence[Sequence[str]] | None = None,
              method: str = "decomposable", score: str = "bic") -> Any:
        """A junction-tree :class:`cvxdp.GraphicalModel` fitted to the current marginals, for
        marginals spanning cliques and synthetic records: exact on the cliques it keeps,
        approximate elsewhere; what was kept, dropped and how far off is on ``.info``
        (:func:`cvxdp.estimates.local_model.fit_model`)."""
        return fit_model(self, max_cells=max_cells, cliques=cliques, method=method, score=score)

    # ---------------------------------------------------------------- canonicalisation
    def local_polytope(self, total: float | cp.Expression | None = None, *, args=None) -> list[Constraint]:
        """The local polytope as plain cvxpy constraints on new non-negative tables, one per
        clique; the first (the measured marginals equal the tables) carries the dual.
        ``total`` overrides the constraint's own (``None`` here and there: free)."""
        g = self.graph
        if total is None:
            total = self.total
        tabs = [cp.Variable(int(g.cells[k]), nonneg=True, name=f"lp_clique_{k}")
                for k in range(len(self.cliques))]
        defs = [self.flat(k, args) - tabs[k] for k in range(len(self.cliques))]
        cons: list[Constraint] = [(cp.hstack(defs) if len(defs) > 1 else defs[0]) == 0]
        M = g.M
        for i, reg in enumerate(g.regions):
            rows = M[g.region_rows(i)]
            size = rows.shape[0] // reg.members.size
            ref = reg.members[0]
            first = rows[:size][:, g.offsets[ref]:g.offsets[ref + 1]] @ tabs[ref]
            for j, k in enumerate(reg.members[1:], start=1):
                block = rows[j * size:(j + 1) * size][:, g.offsets[k]:g.offsets[k + 1]]
                cons.append(block @ tabs[k] == first)
        sums = [cp.sum(t) for t in tabs]
        if total is not None:
            cons.append(cp.hstack(sums) == total)
        elif len(sums) > 1:
            cons.append(cp.hstack(sums[1:]) == sums[0])
        return cons


def _local_polytope_canon(con: LocalPolytope, args, solver_context=None):
    """Dcp2Cone canonicaliser: the local polytope as plain constraints, so a plain
    ``prob.solve(solver=cp.CLARABEL)`` solves the same problem (unknown total: free)."""
    cons = con.local_polytope(con.total, args=args)
    return cons[0], cons[1:]


CANON_METHODS[LocalPolytope] = _local_polytope_canon
