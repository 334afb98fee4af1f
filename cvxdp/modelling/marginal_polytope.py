"""``MarginalPolytope``: clique marginals that come from one nonnegative table.

    mu_C = marginal on C of some table p >= 0 with sum(p) = N,   for every clique C.

(McKenna, Sheldon, Miklau, ICML 2019, section 3.)  The table itself is never formed.  For
standard solvers the constraint is written as the *local polytope of a junction tree* of the
cliques (Wainwright & Jordan 2008, prop. 2.1): one nonnegative marginal per junction-tree
clique, equal on the separators of neighbouring cliques, summing to ``N``, and each measured
marginal the sum of its home clique's marginal.  For a triangulated model this set *equals*
the marginal polytope, so the canonicalisation is exact.  ``solver=cvxdp.MIRROR_DESCENT``
instead solves over it by mirror descent with a belief-propagation oracle
(:mod:`cvxdp.solvers.marginal.mirror_descent`) and leaves the graphical model on ``constraint.model``.

A marginal variable is either shaped like its clique (``(n_a, n_b, ...)``, entry ``[i, j, ...]``
counts the records with ``a = i, b = j, ...``) or flat (``(n_a * n_b * ...,)``, C order).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS

from ..names import MIRROR_DESCENT
from ..solvers.marginal.junction_tree import DEFAULT_MAX_CELLS, JunctionTree, ModelTooLarge, marginalizer

from .clique_marginals import CliqueMarginals, project
from .domain import Domain

__all__ = ["MarginalPolytope", "ModelTooLarge"]


def _digest(tables: list[np.ndarray]) -> bytes:
    """A fingerprint of the marginal values (so a model is checked against them once)."""
    h = hashlib.blake2b(digest_size=16)
    for t in tables:
        h.update(np.ascontiguousarray(t, dtype=float).tobytes())
    return h.digest()

#: the local polytope for a standard solver is refused above this many junction-tree cells
STANDARD_SOLVER_MAX_CELLS = 2 ** 22
#: a model answers the marginal values when every cell is within this fraction of the total
#: (mirror descent's own model matches its returned marginals to roundoff)
_MODEL_MATCH = 1e-6
#: certified relative gap of the fit that builds a model for a standard solver's marginals
_MODEL_FIT_EPS = 1e-8


class MarginalPolytope(CliqueMarginals):
    """The clique marginals ``marginals[C]`` are the marginals of one table with total ``total``.

    Parameters
    ----------
    marginals : mapping from attribute tuples (cliques; a single name is a 1-tuple) to cvxpy
        expressions shaped by the clique's domain sizes or flattened (C order).
    domain : a :class:`cvxdp.Domain` or a mapping ``name -> size``.
    total : the number of records, a positive number, a cvxpy Parameter, or ``None`` (unknown:
        the total is free, optimised jointly with the marginals -- the maximum-likelihood
        total -- by every solver path; the fitted total is the sum of any returned marginal).
    max_cells : largest junction-tree clique accepted (cells); a larger one raises
        :class:`ModelTooLarge` here, before any array is allocated (use
        :class:`cvxdp.LocalPolytope` then: the same arguments, no junction tree).
    """

    def __init__(self, marginals: Mapping[Any, cp.Expression], domain: Domain | Mapping[str, int],
                 total: float | cp.Parameter | None = None, *, max_cells: int = DEFAULT_MAX_CELLS,
                 constr_id: int | None = None) -> None:
        super().__init__(marginals, domain, total, constr_id=constr_id)
        self.max_cells = int(max_cells)
        try:
            self.tree = JunctionTree(self.domain.sizes,
                                     [tuple(self.domain.index(a) for a in c) for c in self.cliques],
                                     max_cells=self.max_cells)
        except ModelTooLarge as exc:
            raise ModelTooLarge(f"MarginalPolytope: {exc} Or use cvxdp.LocalPolytope with the "
                                f"same arguments: the local-polytope relaxation needs no "
                                f"junction tree (consistent marginals, exact on a junction "
                                f"tree).") from None
        self._model = None
        self._model_for: bytes | None = None     # digest of the values the model was checked on

    @property
    def model(self):
        """The graphical model (a :class:`cvxdp.GraphicalModel`) of the current marginal values.

        ``solver=cvxdp.MIRROR_DESCENT`` leaves its own.  A standard solver (named, or chosen
        by ``solver=None`` for a small problem) leaves only the marginals: on first access a
        model is then fitted to them -- an L2 mirror-descent fit over this constraint's
        junction tree, whose optimum is the marginals themselves (they are consistent), so
        the model answers the measured cliques as solved, to 1e-8.  A model whose marginals
        no longer match the values (another solve since) is refitted the same way.  ``None``
        before a solve and for the zero table."""
        tabs = self.tables()
        if tabs is None:
            return self._model
        total = float(tabs[0].sum())
        if not total > 0:
            return None
        digest = _digest(tabs)
        if digest == self._model_for:      # checked against these values already
            return self._model
        if self._model is None or not self._model_matches(tabs, total):
            self._model = self._fit_model(tabs, total)
        self._model_for = digest
        return self._model

    @model.setter
    def model(self, value) -> None:
        self._model = value
        self._model_for = None

    def _model_matches(self, tabs: list[np.ndarray], total: float) -> bool:
        tol = _MODEL_MATCH * total
        return all(float(np.max(np.abs(self._model.marginal(c) - t), initial=0.0)) <= tol
                   for c, t in zip(self.cliques, tabs))

    def _fit_model(self, tabs: list[np.ndarray], total: float):
        x = {c: cp.Variable(self.domain.shape(c)) for c in self.cliques}
        fit = MarginalPolytope(x, self.domain, total=total, max_cells=self.max_cells)
        loss = sum(cp.sum_squares(x[c] - np.maximum(t, 0.0)) for c, t in zip(self.cliques, tabs))
        cp.Problem(cp.Minimize(loss / total), [fit]).solve(
            method="cvxdp", solver=MIRROR_DESCENT, eps_rel=_MODEL_FIT_EPS)
        return fit._model

    def _options(self) -> dict[str, Any]:
        return {"max_cells": self.max_cells}

    def summary(self):
        """Cliques, largest table and memory of the junction tree, before solving."""
        return self.tree.summary()

    def describe(self) -> str:
        names = self.domain.names
        return self.tree.summary().describe(names)

    @property
    def residual(self) -> float | None:
        """Largest violation of the necessary conditions checked without a full table:
        negativity, unequal totals (and ``total`` if known), and disagreement of any two
        marginals on their shared attributes (exact membership for a tree-structured
        clique set, e.g. disjoint or chained cliques)."""
        tabs = self.tables()
        if tabs is None:
            return None
        viol = max(float(np.max(-t, initial=0.0)) for t in tabs)
        totals = [float(t.sum()) for t in tabs]
        ref = totals[0] if self.total is None else self.known_total()
        viol = max(viol, max(abs(s - ref) for s in totals))
        for i in range(len(tabs)):
            for j in range(i + 1, len(tabs)):
                shared = [a for a in self.cliques[i] if a in self.cliques[j]]
                if shared:
                    viol = max(viol, float(np.max(np.abs(project(tabs[i], self.cliques[i], shared)
                                                          - project(tabs[j], self.cliques[j], shared)))))
        return viol

    # ---------------------------------------------------------------- canonicalisation
    def local_polytope(self, total: float | cp.Expression | None = None, *,
                       max_cells: int = STANDARD_SOLVER_MAX_CELLS, args=None) -> list[Constraint]:
        """The junction tree's local polytope as plain cvxpy constraints (new nonnegative
        variables, one per junction-tree clique); for a standard solver.

        ``total`` overrides the constraint's own (``None`` here and there: the total is free).
        """
        tree = self.tree
        big = max(tree.cells)
        if big > max_cells:
            raise ModelTooLarge(
                f"MarginalPolytope: the local polytope for a standard solver needs a junction-tree "
                f"clique of {big:,} cells (above max_cells={max_cells:,}); {self.describe()}. "
                f"Use solver=cvxdp.MIRROR_DESCENT, or pass a larger max_cells.")
        if total is None:
            total = self.total
        mus = [cp.Variable(tree.cells[i], nonneg=True, name=f"jt_clique_{i}") for i in range(len(tree.cliques))]
        # First (its dual is the constraint's dual, see save_dual_value): every measured
        # marginal is its junction-tree clique's marginal, stacked into one equality.
        defs = [self.flat(k, args) - marginalizer(tree.sizes, tree.cliques[tree.home[k]],
                                                  tree.factors[k]) @ mus[tree.home[k]]
                for k in range(len(self.cliques))]
        cons: list[Constraint] = [(cp.hstack(defs) if len(defs) > 1 else defs[0]) == 0]
        for i in tree.preorder[1:]:
            p = tree.parent[i]
            sep = tree.separators[i]
            cons.append(marginalizer(tree.sizes, tree.cliques[i], sep) @ mus[i]
                        == marginalizer(tree.sizes, tree.cliques[p], sep) @ mus[p])
        if total is not None:
            cons.append(cp.sum(mus[tree.preorder[0]]) == total)
        return cons


def _marginal_polytope_canon(con: MarginalPolytope, args, solver_context=None):
    """Dcp2Cone canonicalizer: the local polytope of the junction tree (exact), so a plain
    ``prob.solve(solver=cp.CLARABEL)`` solves the same problem (unknown total: free).  The
    first constraint carries the dual cvxpy maps back to ``con`` (the stacked marginal
    definitions, see :meth:`MarginalPolytope.save_dual_value`)."""
    cons = con.local_polytope(con.total, args=args)
    return cons[0], cons[1:]


CANON_METHODS[MarginalPolytope] = _marginal_polytope_canon
