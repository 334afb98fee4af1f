"""Exact standard errors where the estimate is linear in the noisy data.

The estimate of a model of the consistency family (squared losses, linear equalities; no
inequality active at the solution) is linear in the noisy answers.  To read that linear map
off the model, each noise source's leaves are replaced by a new variable ``a`` fixed by
``a == answers``: recognising that problem gives the loss rows over ``(x, a)``, i.e. ``M``
over ``x`` and ``-P`` over ``a`` (``y = P a + p``), and the equality rows over ``(x, a)``
(answers inside the constraints, e.g. ``sum(x) == sum(y)``).  Then
:class:`cvxdp.solvers.consistency.covariance.KKTVariances` gives each query's variance by
the sandwich formula, or, for every cell of a histogram tree with maximum-likelihood
weights, :func:`~cvxdp.solvers.consistency.covariance.tree_cell_variances` in two passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from ..errors import NotRecognised
from ..recognise.consistency import recognise
from ..solvers.consistency import histogram_tree
from ..solvers.consistency.covariance import KKTVariances, proportional_noise, tree_cell_variances
from ..solvers.consistency.problem import ConsistencyData
from .noise import NoiseSource, substitute
from .queries import QuerySet

__all__ = ["NotLinear", "exact_variances", "relaxed_intervals", "active_inequalities"]


class NotLinear(ValueError):
    """The estimate is not linear in the noisy data (exact error bars do not apply)."""


def active_inequalities(prob: cp.Problem, tol: float = 1e-7) -> tuple[int, int]:
    """``(inequality rows, active ones)`` at the current solution: constraints ``<=`` /
    ``>=`` and variable bounds (``nonneg=True``, ``bounds=``) within ``tol`` (relative) of
    equality."""
    rows = active = 0
    for c in prob.constraints:
        if isinstance(c, (cp.constraints.Inequality, cp.constraints.NonNeg,
                          cp.constraints.NonPos)):
            r = getattr(c, "expr", None)
            val = np.asarray(r.value if r is not None else c.args[0].value, dtype=float)
            if isinstance(c, cp.constraints.NonNeg):
                val = -val
            rows += val.size
            active += int(np.sum(val >= -tol * max(1.0, float(np.abs(val).max(initial=0)))))
    for v in prob.variables():
        val = np.asarray(v.value, dtype=float)
        scale = tol * max(1.0, float(np.abs(val).max(initial=0)))
        if v.attributes.get("nonneg") or v.attributes.get("pos"):
            rows += v.size
            active += int(np.sum(val <= scale))
        if v.attributes.get("nonpos") or v.attributes.get("neg"):
            rows += v.size
            active += int(np.sum(val >= -scale))
        b = v.attributes.get("bounds")
        if b is not None:
            for bound, sign in zip(b, (1.0, -1.0)):
                if bound is None:
                    continue
                bv = np.broadcast_to(np.asarray(getattr(bound, "value", bound), dtype=float), v.shape)
                fin = np.isfinite(bv)
                rows += int(fin.sum())
                active += int(np.sum(fin & (sign * (val - bv) <= scale)))
    return rows, active


def exact_variances(prob: cp.Problem, sources: list[NoiseSource], qs: QuerySet) -> tuple[np.ndarray, str]:
    """``(variances of the queries, route)``; :class:`NotLinear` when the model is not a
    linear estimate of its noisy data (not of the consistency family, an absolute loss,
    an active inequality, order constraints)."""
    if qs.func is not None:
        raise NotLinear("a callable query is not linear in the solution: use the bootstrap")
    rows, active = active_inequalities(prob)
    if active:
        raise NotLinear(f"{active} of {rows} inequality rows are active at the solution: the "
                        "estimate is not linear in the data there (use the bootstrap)")
    lin = _linear_model(prob, sources)
    if qs.identity:
        var = _tree_route(lin)
        if var is not None:
            return qs.Q @ var, "tree GLS variances"
    return lin.kkt().variances(qs.Q), "KKT factorisation"


def relaxed_intervals(prob: cp.Problem, sources: list[NoiseSource], qs: QuerySet
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """``(centre, variances, low, high, route)`` of the queries under the model's *relaxation*:
    the same squared loss and equalities without the inequalities (the generalised
    least-squares estimate of the same release, linear and unbiased), ``centre`` its query
    values, ``[low, high]`` the range the model's bounds on the variables allow each query
    (``-inf`` / ``inf`` where unbounded).  :class:`NotLinear` as :func:`exact_variances`, except
    that active inequalities are what the relaxation drops."""
    if qs.func is not None:
        raise NotLinear("a callable query is not linear in the solution: use the bootstrap")
    lin = _linear_model(prob, sources)
    var = _tree_route(lin) if qs.identity else None
    kkt = lin.kkt()
    route = "tree GLS variances" if var is not None else "KKT factorisation"
    var = qs.Q @ var if var is not None else kkt.variances(qs.Q)
    b = None if lin.Ax is None else lin.b - (lin.N @ lin.a if lin.N is not None else 0.0)
    try:
        z = kkt.estimate(lin.P @ lin.a + lin.data.y, b)
    except ValueError:
        raise NotLinear("without its inequalities the model leaves the estimate undetermined "
                        "(the loss and the equalities do not fix every coordinate)") from None
    low, high = _query_range(qs.Q, lin.data.lower[lin.xcol], lin.data.upper[lin.xcol])
    return qs.Q @ z + qs.c, var, low + qs.c, high + qs.c, route


def _query_range(Q, lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``min`` and ``max`` of each ``q^T x`` over the box ``lower <= x <= upper``."""
    Q = sp.csr_matrix(Q)
    pos, neg = Q.maximum(0), Q.minimum(0)
    lo_f, up_f = np.where(np.isfinite(lower), lower, 0.0), np.where(np.isfinite(upper), upper, 0.0)
    low = pos @ lo_f + neg @ up_f
    high = pos @ up_f + neg @ lo_f
    lo_inf, up_inf = (~np.isfinite(lower)).astype(float), (~np.isfinite(upper)).astype(float)
    low[(pos @ lo_inf - neg @ up_inf) > 0] = -np.inf
    high[(pos @ up_inf - neg @ lo_inf) > 0] = np.inf
    return low, high


@dataclass
class _LinearModel:
    """The model read with its noise as fixed variables: loss rows ``Mx x - (P a + y)``
    (weights ``data.w2``), equalities ``Ax x = b - N a`` (``None`` without), noise variances
    ``s`` and answers ``a``; ``xcol`` the variables' columns in ``data``."""

    data: ConsistencyData
    xvars: list
    xcol: np.ndarray
    Mx: sp.csr_matrix
    P: sp.csr_matrix
    s: np.ndarray
    a: np.ndarray
    Ax: sp.csr_matrix | None
    N: sp.csr_matrix | None
    b: np.ndarray | None

    def kkt(self) -> KKTVariances:
        return KKTVariances(self.Mx, self.data.w2, self.P, self.s, self.Ax, self.N)


def _linear_model(prob: cp.Problem, sources: list[NoiseSource]) -> _LinearModel:
    """Recognise the model with each noise source's leaves replaced by a variable fixed by
    ``a == answers``; :class:`NotLinear` unless squared losses and linear equalities remain."""
    fixed = {id(lf): cp.Variable(s.shape, name=f"_noise{i}")
             for i, s in enumerate(sources) for lf in s.leaves}
    noise_vars, extra = [], []
    for s in sources:
        v = fixed[id(s.leaves[0])]
        for lf in s.leaves[1:]:
            fixed[id(lf)] = v
        noise_vars.append(v)
        extra.append(v == np.asarray(s.leaves[0].value, dtype=float))
    aug, _ = substitute(prob, fixed, extra)
    try:
        ext = recognise(aug)
    except NotRecognised as err:
        raise NotLinear(f"the model is not a least-squares estimate with linear constraints "
                        f"({err})") from None
    data = ext.data
    if np.any(data.w1 > 0):
        raise NotLinear("the model has an absolute (L1) loss: the estimate is not linear in the data")
    if data.has_chains:
        raise NotLinear("the model has order constraints: use the bootstrap")
    xvars = prob.variables()
    xcol, acol = _columns(ext, xvars), _columns(ext, noise_vars)
    fix_ids = {c.id for c in extra}
    M = data.M.tocsc()
    keep = np.ones(0 if data.A is None else data.A.shape[0], dtype=bool)
    for con, lo, hi in ext.eq_blocks:
        if con.id in fix_ids:
            keep[lo:hi] = False
    Ax = N = b = None
    if data.A is not None and keep.any():
        A = data.A.tocsr()[np.flatnonzero(keep)].tocsc()
        Ax, N, b = A[:, xcol].tocsr(), A[:, acol].tocsr(), data.b[keep]
    s = np.concatenate([np.asarray(src.variance, float).reshape(src.shape).ravel(order="F")
                        if src.shape else np.asarray(src.variance, float).ravel()
                        for src in sources])
    a = np.concatenate([np.asarray(src.leaves[0].value, float).ravel(order="F") for src in sources])
    return _LinearModel(data, xvars, xcol, M[:, xcol].tocsr(), -M[:, acol].tocsr(), s, a, Ax, N, b)


def _columns(ext, variables: list) -> np.ndarray:
    off = ext.linearizer.offsets
    return np.concatenate([off[v.id] + np.arange(v.size) for v in variables]) \
        if variables else np.zeros(0, dtype=np.int64)


def _tree_route(lin: _LinearModel):
    """Every coordinate's variance by the two tree passes, or ``None`` when the model is not
    a histogram tree with noise proportional to the inverse weights."""
    data, Mx, P, s, a, Ax, N, b = lin.data, lin.Mx, lin.P, lin.s, lin.a, lin.Ax, lin.N, lin.b
    if Ax is None or len(lin.xvars) != 1:
        return None
    c = proportional_noise(Mx, data.w2, P, s, N)
    if c is None:
        return None
    v = lin.xvars[0]
    shape = v.shape if len(v.shape) == 2 else (v.size, 1)
    n = Mx.shape[1]
    xdata = ConsistencyData(n=n, M=Mx, y=P @ a + data.y, w1=np.zeros(Mx.shape[0]), w2=data.w2,
                            lower=np.full(n, -np.inf), upper=np.full(n, np.inf), A=Ax,
                            b=b - (N @ a if N is not None else 0.0), loss_starts=data.loss_starts,
                            shape=shape)
    tree = histogram_tree.detect(xdata, shape)
    if tree is None or tree.nonneg or tree.l1:
        return None
    try:
        return tree_cell_variances(tree, c)
    except ValueError:          # a leaf not determined by its own subtree: the KKT route
        return None
