"""Constraints that say what is known to hold: tree consistency and sorted order.

Both are ordinary cvxpy constraints: every standard solver accepts them, and
the cvxdp recogniser reads them as the structure its fast methods exploit.
"""
from __future__ import annotations

import cvxpy as cp
from cvxpy.constraints import Equality, Inequality

__all__ = ["HierarchicalHistogram", "TreeConsistent", "consistent", "ordered"]


class TreeConsistent(Equality):
    """``C x == 0`` where ``C`` is a hierarchy's consistency matrix: every internal
    node equals the sum of its children (Hay et al. 2010; Lee et al. 2015, eq. 4).

    A subclass of :class:`cvxpy.constraints.Equality`, so standard solvers see the
    sparse equality ``C x == 0`` and its dual is one multiplier per internal node
    (cvxpy's sign convention).  ``hierarchy`` is kept for the fast method.
    """

    def __init__(self, lhs, rhs, hierarchy=None, constr_id=None) -> None:
        cast = cp.Expression.cast_to_const
        super().__init__(cast(lhs), cast(rhs), constr_id)
        self.hierarchy = hierarchy

    def get_data(self):
        # cvxpy rebuilds constraints as type(self)(*args, *get_data()): the id goes last.
        return [self.hierarchy, self.id]

    def __repr__(self) -> str:
        return f"TreeConsistent({self.args[0]!r} == 0)"


class HierarchicalHistogram(Equality):
    """A histogram at every unit of a geography, each the sum of its children's:
    ``HierarchicalHistogram(geography, X)`` with ``X`` of shape ``(n_units, k)`` (one row per
    unit, one column per cell; ``(n_units,)`` for one count per unit) is ``C @ X == 0``,
    ``C = geography.consistency`` acting on every cell column.

    An ordinary :class:`cvxpy.constraints.Equality` (standard solvers see the sparse
    equality; its dual has one multiplier per inner unit and cell, cvxpy's sign), and the
    plain spelling ``geography.consistency @ X == 0`` is recognised the same way by
    ``cvxdp.ADMM``: with squared losses whose rows each read one unit's cells, exact
    invariants and ``X >= 0`` it runs the exact tree GLS or the tree ADMM
    (:mod:`cvxdp.solvers.consistency.histogram_tree`).
    """

    def __init__(self, geography, X, *args, constr_id=None) -> None:
        if hasattr(geography, "consistency"):          # HierarchicalHistogram(geography, X)
            geo = geography
            C = geo.consistency
            X = X if isinstance(X, cp.Expression) else cp.Constant(X)
            n = C.shape[1]
            if X.ndim not in (1, 2) or X.shape[0] != n:
                raise ValueError(f"HierarchicalHistogram: X must have one row per unit ({n}), "
                                 f"got shape {X.shape}")
            lhs, rhs = C @ X, cp.Constant(0.0)
        else:                                          # cvxpy rebuilding (lhs, rhs, geo, id)
            lhs, rhs = geography, X
            geo = args[0] if args else None
            constr_id = args[1] if len(args) > 1 else constr_id
        cast = cp.Expression.cast_to_const
        super().__init__(cast(lhs), cast(rhs), constr_id)
        self.geography = geo

    def get_data(self):
        return [self.geography, self.id]

    def __repr__(self) -> str:
        return f"HierarchicalHistogram({self.args[0]!r} == 0)"


def consistent(hierarchy, x: cp.Expression) -> TreeConsistent:
    """The constraint that node values ``x`` (breadth-first, one per node of
    ``hierarchy``) are consistent: ``hierarchy.consistency @ x == 0``."""
    C = getattr(hierarchy, "consistency", None)
    if C is None:
        raise TypeError(f"consistent: expected a cvxdp.workloads.Hierarchy, got {type(hierarchy).__name__}")
    x = x if isinstance(x, cp.Expression) else cp.Constant(x)
    if x.ndim > 1 or x.size != C.shape[1]:
        raise ValueError(f"consistent: x must be a vector with one entry per node "
                         f"({C.shape[1]}), got shape {x.shape}")
    return TreeConsistent(C @ x, 0, hierarchy)


def ordered(x: cp.Expression, decreasing: bool = False) -> Inequality:
    """``x[0] <= x[1] <= ... <= x[-1]`` (or ``>=`` with ``decreasing=True``): the
    order constraint of sorted, unattributed histograms and degree sequences
    (Hay et al. 2010, sec. 4.1).  Spelled exactly as ``x[:-1] <= x[1:]``."""
    x = x if isinstance(x, cp.Expression) else cp.Constant(x)
    if x.ndim > 1:
        raise ValueError(f"ordered: x must be a vector, got shape {x.shape}")
    if x.size < 2:
        raise ValueError("ordered: x needs at least two entries")
    return x[1:] <= x[:-1] if decreasing else x[:-1] <= x[1:]
