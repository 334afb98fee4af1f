"""Every cvxdp method and the families it solves: the one list ``solver=`` is resolved against.

A *family interface* (:class:`~cvxdp.methods.base.Family`, one module of
:mod:`cvxdp.methods` each) recognises one kind of problem, solves it through the numerical
layer and tells the cost model its family and size.  A *method*
(:class:`~cvxdp.methods.base.Method`) is what users name with ``solver=``: the families
registered under that name, tried in the order below, with one option set.

Adding a family is its interface module and one line in :data:`FAMILIES`
(``docs/development.md`` says how, step by step).
"""
from __future__ import annotations

from ..names import NAMES, canonical
from .base import Family, Method
from .consistency import ConsistencyADMM
from .fitness import FitnessNewtonCG
from .local_polytope import LocalPolytopeADMM
from .marginal_polytope import MarginalMirrorDescent
from .residual import ResidualDesign
from .residual_reconstruction import ResidualReconstruction

__all__ = ["FAMILIES", "METHODS", "method_for"]

#: every family interface.  ``solver=name`` tries those registered under ``name`` in this
#: order; ``solver=None`` tries every method in the order of :data:`cvxdp.names.NAMES`
FAMILIES: tuple[Family, ...] = (
    ResidualReconstruction(),
    LocalPolytopeADMM(),
    ConsistencyADMM(),
    FitnessNewtonCG(),
    ResidualDesign(),
    MarginalMirrorDescent(),
)

#: the methods by name, in the order ``solver=None`` tries them
METHODS: dict[str, Method] = {name: Method(name, [f for f in FAMILIES if f.name == name])
                              for name in NAMES}


def method_for(solver: object) -> Method | None:
    """The method ``solver`` names (any spelling :func:`cvxdp.names.canonical` accepts), or
    ``None`` (a cvxpy solver name, or ``None``)."""
    key = canonical(solver)
    return METHODS.get(key) if key else None
