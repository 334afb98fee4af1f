"""``MarginalPolytope``: clique marginals that come from one nonnegative table.

    mu_C = marginal on C of some table p >= 0 with sum(p) = N,   for every clique C.

(McKenna, Sheldon, Miklau, ICML 2019, section 3.)  The table itself is never formed.  For
standard solvers the constraint is written as the *local polytope of a junction tree* of the
cliques (Wainwright & Jordan 2008, prop. 2.1): one nonnegative marginal per junction-tree
clique, equal on the separators of neighbouring cliques, summing to ``N``, and each measured
marginal the sum of its home clique's marginal.  For a triangulated model this set *equals*
the marginal polytope, so the canonicalisation is exact.  ``solver=cvxdp.MIRROR_DESCENT``
instead solves over it by mirror descent with a belief-propagation oracle
(:mod:`cvxdp.solvers.mirror_descent`) and leaves the graphical model on ``constraint.model``.

A marginal variable is either shaped like its clique (``(n_a, n_b, ...)``, entry ``[i, j, ...]``
counts the records with ``a = i, b = j, ...``) or flat (``(n_a * n_b * ...,)``, C order).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint
from cvxpy.reductions.dcp2cone.canonicalizers import CANON_METHODS

from .solvers.junction_tree import DEFAULT_MAX_CELLS, JunctionTree, ModelTooLarge, marginalizer

from .domain import Domain

__all__ = ["MarginalPolytope", "ModelTooLarge"]

#: the local polytope for a standard solver is refused above this many junction-tree cells
STANDARD_SOLVER_MAX_CELLS = 2 ** 22


class MarginalPolytope(Constraint):
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
        :class:`ModelTooLarge` here, before any array is allocated.
    """

    def __init__(self, marginals: Mapping[Any, cp.Expression], domain: Domain | Mapping[str, int],
                 total: float | cp.Parameter | None = None, *, max_cells: int = DEFAULT_MAX_CELLS,
                 constr_id: int | None = None) -> None:
        if not isinstance(domain, Domain):
            if not isinstance(domain, Mapping):
                raise TypeError(f"MarginalPolytope: domain must be a cvxdp.Domain or a mapping "
                                f"name -> size, got {type(domain).__name__}")
            domain = Domain(domain)
        if not isinstance(marginals, Mapping) or not marginals:
            raise TypeError("MarginalPolytope: marginals must be a non-empty mapping from "
                            "attribute tuples to cvxpy expressions")
        cliques, exprs = [], []
        for key, expr in marginals.items():
            clique = domain.clique(key)
            if clique in cliques:
                raise ValueError(f"MarginalPolytope: clique {clique} appears twice")
            expr = cp.Expression.cast_to_const(expr) if not isinstance(expr, cp.Expression) else expr
            shape = domain.shape(clique)
            if tuple(expr.shape) not in (shape, (math.prod(shape),)) and not (
                    len(shape) == 1 and tuple(expr.shape) == shape):
                raise ValueError(f"MarginalPolytope: the marginal of {clique} must have shape "
                                 f"{shape} or ({math.prod(shape)},), got {tuple(expr.shape)}")
            if expr.is_complex():
                raise ValueError(f"MarginalPolytope: the marginal of {clique} must be real")
            cliques.append(clique)
            exprs.append(expr)
        if total is not None and not isinstance(total, cp.Parameter):
            try:
                total = float(total)
            except (TypeError, ValueError):
                raise TypeError(f"MarginalPolytope: total must be a number, a Parameter or None, "
                                f"got {total!r}") from None
            if not (math.isfinite(total) and total > 0):
                raise ValueError(f"MarginalPolytope: total must be positive and finite, got {total}")
        if isinstance(total, cp.Parameter) and total.size != 1:
            raise ValueError("MarginalPolytope: a total Parameter must be scalar")
        self.domain = domain
        self.cliques: list[tuple[str, ...]] = cliques
        self.total = total
        self.max_cells = int(max_cells)
        self.tree = JunctionTree(domain.sizes, [tuple(domain.index(a) for a in c) for c in cliques],
                                 max_cells=self.max_cells)
        #: the graphical model left by ``solver=cvxdp.MIRROR_DESCENT`` (a :class:`cvxdp.GraphicalModel`)
        self.model = None
        super().__init__(exprs, constr_id)

    # ---------------------------------------------------------------- cvxpy protocol
    def name(self) -> str:
        return f"MarginalPolytope({', '.join('(' + ', '.join(c) + ')' for c in self.cliques)})"

    def __repr__(self) -> str:
        return self.name()

    def __str__(self) -> str:
        return self.name()

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def is_dcp(self, dpp: bool = False) -> bool:
        if dpp:
            from cvxpy.utilities import scopes
            with scopes.dpp_scope():
                return all(a.is_affine() for a in self.args)
        return all(a.is_affine() for a in self.args)

    def is_dgp(self, dpp: bool = False) -> bool:
        return False

    def is_dqcp(self) -> bool:
        return self.is_dcp()

    def get_data(self) -> list:
        return [self.domain, self.total, self.max_cells, self.id]

    def copy(self, args=None, id_objects=None):
        args = self.args if args is None else args
        return type(self)(dict(zip(self.cliques, args)), self.domain, self.total,
                          max_cells=self.max_cells, constr_id=self.id)

    def summary(self):
        """Cliques, largest table and memory of the junction tree, before solving."""
        return self.tree.summary()

    def describe(self) -> str:
        names = self.domain.names
        return self.tree.summary().describe(names)

    @property
    def fitted_total(self) -> float | None:
        """The total of the current marginal values (the first marginal's sum; ``None``
        before a solve): the optimised total when ``total`` is ``None``."""
        tabs = self.tables()
        return None if tabs is None else float(tabs[0].sum())

    def known_total(self) -> float | None:
        if self.total is None:
            return None
        if isinstance(self.total, cp.Parameter):
            if self.total.value is None:
                raise ValueError("MarginalPolytope: the total Parameter has no value")
            v = float(self.total.value)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"MarginalPolytope: total must be positive and finite, got {v}")
            return v
        return float(self.total)

    # ---------------------------------------------------------------- values
    def tables(self) -> list[np.ndarray] | None:
        """Current values of the marginals as arrays shaped by their cliques."""
        out = []
        for c, a in zip(self.cliques, self.args):
            if a.value is None:
                return None
            out.append(np.asarray(a.value, dtype=float).reshape(self.domain.shape(c)))
        return out

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
                    viol = max(viol, float(np.max(np.abs(_project(tabs[i], self.cliques[i], shared)
                                                          - _project(tabs[j], self.cliques[j], shared)))))
        return viol

    def value(self, tolerance: float = 1e-8) -> bool:
        r = self.residual
        if r is None:
            raise ValueError("MarginalPolytope.value: a marginal has no value")
        scale = self.known_total() if self.total is not None else abs(self.fitted_total or 0.0)
        return bool(r <= tolerance * max(1.0, scale))

    def violation(self):
        return self.residual

    # ---------------------------------------------------------------- canonicalisation
    def flat(self, k: int, args=None) -> cp.Expression:
        """Marginal ``k`` as a flat C-order expression."""
        a = (self.args if args is None else args)[k]
        return cp.reshape(a, (a.size,), order="C") if a.ndim > 1 else a

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

    # ---------------------------------------------------------------- duals
    def save_dual_value(self, value) -> None:
        """Store the multipliers ``y_C`` of ``marginals[C] == (the table's marginal on C)``,
        given flat (all cliques stacked, each in C order) or as one array per clique.

        With cvxpy's sign (``y^T (lhs - rhs)``) and marginals that appear nowhere else,
        stationarity gives ``y_C = -grad_C loss``: the change of the optimal loss per unit
        added to a measured marginal.  ``dual_value`` is one array per clique shaped like its
        marginal (a single array for one clique)."""
        if isinstance(value, (list, tuple)):
            parts = [np.asarray(v, dtype=float) for v in value]
        else:
            flat = np.asarray(value, dtype=float).ravel()
            sizes = [a.size for a in self.args]
            if flat.size != sum(sizes):
                raise ValueError(f"MarginalPolytope: {flat.size} multipliers for {sum(sizes)} "
                                 f"marginal cells")
            parts = np.split(flat, np.cumsum(sizes)[:-1])
        for dv, a, part in zip(self.dual_variables, self.args, parts):
            dv.save_value(np.reshape(part, a.shape, order="C") if a.shape else float(part[0]))


def _marginal_polytope_canon(con: MarginalPolytope, args, solver_context=None):
    """Dcp2Cone canonicalizer: the local polytope of the junction tree (exact), so a plain
    ``prob.solve(solver=cp.CLARABEL)`` solves the same problem (unknown total: free).  The
    first constraint carries the dual cvxpy maps back to ``con`` (the stacked marginal
    definitions, see :meth:`MarginalPolytope.save_dual_value`)."""
    cons = con.local_polytope(con.total, args=args)
    return cons[0], cons[1:]


CANON_METHODS[MarginalPolytope] = _marginal_polytope_canon


def _project(table: np.ndarray, attrs: tuple[str, ...], keep: list[str]) -> np.ndarray:
    axes = tuple(i for i, a in enumerate(attrs) if a not in keep)
    m = table.sum(axis=axes) if axes else table
    order = [a for a in attrs if a in keep]
    return np.transpose(m, [order.index(a) for a in keep])
