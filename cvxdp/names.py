"""The names of cvxdp's methods, in one place: what ``solver=`` takes.

A leaf module (it imports nothing of cvxdp), so that any module that needs a method's name --
a constraint that fits a model after a solve, the cost model, the method interfaces, the
tour -- takes it from here, and nothing has to import the solve pipeline to name a method.
Which code runs under each name is the registry's business (:mod:`cvxdp.methods.registry`).
"""
from __future__ import annotations

__all__ = ["ADMM", "MIRROR_DESCENT", "NEWTON_CG", "NAMES", "canonical", "short"]

#: the consistency family, the local polytope and hierarchies of histograms (Lee, Wang,
#: Kifer, KDD 2015; the routes it takes are in ``extra_stats["info"]["route"]``)
ADMM = "CVXDP_ADMM"
#: the marginal polytope (McKenna, Sheldon, Miklau, ICML 2019)
MIRROR_DESCENT = "CVXDP_MIRROR_DESCENT"
#: fitness for use (SM-II; Xiao, He, Zhang, Kifer, VLDB 2021)
NEWTON_CG = "CVXDP_NEWTON_CG"

#: every method name, in the order ``solver=None`` tries them
NAMES = (ADMM, NEWTON_CG, MIRROR_DESCENT)

_PREFIX = "CVXDP_"


def canonical(name: object) -> str | None:
    """The method ``name`` stands for (``"admm"``, ``"ADMM"``, ``"CVXDP_ADMM"`` -> ``ADMM``),
    or ``None`` when it names no cvxdp method (a cvxpy solver, say)."""
    if not isinstance(name, str):
        return None
    key = name.upper()
    key = key if key.startswith(_PREFIX) else _PREFIX + key
    return key if key in NAMES else None


def short(name: str) -> str:
    """``"ADMM"`` for ``ADMM``: how messages name a method."""
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name
