"""Recognise the L1 / elastic-net / L2 consistency family in a cvxpy problem.

Accepted (Lee, Wang, Kifer 2015, eqs. 5, 7, 23)::

    minimize    sum_t  c_t * loss_t(aff_t)  (+ constant)
    subject to  affine == affine                      (tree consistency, known marginals ...)
                affine <= affine  rows of the form    x_j <= u, x_j >= l   (bounds)
                                                      x_i <= x_j           (order chains)
                Variable(nonneg=True / nonpos=True / bounds=...)

with ``loss_t`` one of ``norm1``, ``sum(abs(.))``, ``sum(multiply(w, abs(.)))``,
``w @ abs(.)``, ``abs`` (scalar), ``sum_squares``, ``quad_over_lin(., c)``,
``sum(square(.))``, ``sum(multiply(w, square(.)))``, ``norm2(.)**2`` and
nonnegative scalings of these (``cvxdp.nll`` and ``cvxdp.elastic_net`` build such
sums).  The output is a :class:`cvxdp.solvers.consistency.admm.ConsistencyData` and the maps that
send its solution and multipliers back to the user's variables and constraints.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.constraints import Equality, Inequality, NonNeg, NonPos, Zero

from ..solvers.consistency.admm import ConsistencyData
from ..solvers.consistency.isotonic import Chains

from ..errors import NotRecognised
from ..names import ADMM, short
from .affine import Linearizer
from .losses import collect

__all__ = ["recognise", "Extraction"]

_NAME = short(ADMM)

_EXPECTED = ("minimize a nonnegative combination of L1 losses (cvxdp.nll with Laplace noise, "
             "cp.norm1, cp.sum(cp.abs(.)), weighted by constants) and squared losses "
             "(cp.sum_squares, cp.quad_over_lin, cp.sum(cp.square(.))) of affine expressions, "
             "subject to linear equalities, bounds (x >= l, x <= u, nonneg variables) and order "
             "constraints (x[:-1] <= x[1:])")
_UNSUPPORTED_ATTRS = ("boolean", "integer", "PSD", "NSD", "symmetric", "diag", "hermitian",
                      "complex", "imag", "sparsity")


@dataclass
class Extraction:
    """The problem as arrays, plus what is needed to write results back."""

    data: ConsistencyData
    variables: list
    linearizer: Linearizer
    eq_blocks: list = field(default_factory=list)      # (constraint, row_start, row_stop)
    lower_src: np.ndarray | None = None                # per coordinate: source id of the active lower bound, -1 none
    upper_src: np.ndarray | None = None
    bound_sources: list = field(default_factory=list)  # chunks (constraint, rows, coefficients);
                                                       # source id = place in their concatenation
    order_edges: dict = field(default_factory=dict)    # lo coordinate -> (constraint, row, coefficient)
    ineq_constraints: list = field(default_factory=list)
    trivially_infeasible: str | None = None

    def add_bound_sources(self, cid: int, rows: np.ndarray, coefs: np.ndarray) -> np.ndarray:
        """Record bound rows ``rows`` of inequality ``cid`` (coefficients ``coefs``); their ids."""
        start = sum(r.size for _, r, _ in self.bound_sources)
        self.bound_sources.append((cid, np.asarray(rows), np.asarray(coefs, dtype=float)))
        return np.arange(start, start + len(rows))

    def bound_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(constraint, row, coefficient)`` per bound source id."""
        if not self.bound_sources:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return (np.concatenate([np.full(r.size, c, np.int64) for c, r, _ in self.bound_sources]),
                np.concatenate([r for _, r, _ in self.bound_sources]),
                np.concatenate([a for _, _, a in self.bound_sources]))


def recognise(problem: cp.Problem) -> Extraction:
    """Raise :class:`NotRecognised` unless ``problem`` belongs to the family."""
    obj = problem.objective
    if not isinstance(obj, cp.Minimize):
        raise NotRecognised(_NAME, _EXPECTED, "a Maximize objective")
    variables = _checked_variables(problem)
    lin = Linearizer(variables)
    n = lin.n
    terms, constant = collect(obj.expr, _NAME, _EXPECTED)
    if not terms:
        raise NotRecognised(_NAME, _EXPECTED, "an objective without a loss term")
    M, y, w1, w2, starts = _stack_losses(lin, terms)
    lower, upper = _attribute_bounds(variables, lin)
    ext = Extraction(data=None, variables=variables, linearizer=lin)  # type: ignore[arg-type]
    rows = _read_constraints(problem, lin, ext)
    _merge_bounds(ext, lower, upper, rows["lo_cand"], rows["hi_cand"])
    chains = _order_chains(rows["edges_lo"], rows["edges_hi"], n)
    A = sp.vstack(rows["A"]).tocsr() if rows["A"] else None
    b = np.concatenate(rows["b"]) if rows["b"] else None
    # A hierarchy written over the leaf counts (rows of M: indicators of a laminar family
    # of leaf sets, e.g. cvxdp.nll of a measurement through tree.queries): the solver
    # works in node space with the O(n) tree projection instead of factorizing M^T M.
    # (read lazily: a histogram tree over a 2-D variable is detected first and needs none)
    ext.data = ConsistencyData(n=n, M=M, y=y, w1=w1, w2=w2, lower=lower, upper=upper,
                               A=A, b=b, chains=chains, constant=constant,
                               lazy_lift=chains is None and M.nnz > M.shape[0],
                               loss_starts=starts,
                               shape=variables[0].shape if len(variables) == 1
                               and len(variables[0].shape) == 2 else None)
    return ext


def _checked_variables(problem: cp.Problem) -> list:
    variables = problem.variables()
    if not variables:
        raise NotRecognised(_NAME, _EXPECTED, "a problem without variables")
    for v in variables:
        bad = [a for a in _UNSUPPORTED_ATTRS if v.attributes.get(a)]
        if bad:
            raise NotRecognised(_NAME, _EXPECTED, f"variable {v.name()} with attribute {bad[0]}")
    return variables


def _stack_losses(lin: Linearizer, terms):
    """``(M, y, w1, w2, starts)``: the loss rows stacked, terms on the same affine map
    merged (an L1 and a squared term of one residual make one elastic-net row); rows of
    zero weight dropped; ``starts`` the first row of each (merged) term."""
    groups: list[list] = []        # [M, y, w1, w2]
    for t in terms:
        try:
            M, c = lin(t.expr)
        except (KeyError, ValueError) as exc:
            raise NotRecognised(_NAME, _EXPECTED, f"a loss of an expression it cannot read ({exc})")
        y = -c
        w = np.broadcast_to(np.asarray(t.weight, dtype=float), (M.shape[0],)).copy()
        for g in groups:
            if g[0].shape == M.shape and np.array_equal(g[1], y) and (g[0] != M).nnz == 0:
                break
        else:
            g = [M, y, np.zeros(M.shape[0]), np.zeros(M.shape[0])]
            groups.append(g)
        g[2 if t.kind == "l1" else 3] += w
    M = sp.vstack([g[0] for g in groups]).tocsr() if len(groups) > 1 else groups[0][0]
    y = np.concatenate([g[1] for g in groups])
    w1 = np.concatenate([g[2] for g in groups])
    w2 = np.concatenate([g[3] for g in groups])
    keep = (w1 > 0) | (w2 > 0)
    sizes = np.array([g[0].shape[0] for g in groups])
    if not keep.all():
        M, y, w1, w2 = M[keep], y[keep], w1[keep], w2[keep]
        sizes = np.add.reduceat(keep.astype(np.int64), np.r_[0, np.cumsum(sizes)[:-1]]) \
            if keep.size else sizes
    starts = np.r_[0, np.cumsum(sizes)[:-1]][sizes > 0]
    return M.tocsr(), y, w1, w2, starts


def _attribute_bounds(variables, lin: Linearizer):
    """``(lower, upper)`` from the variables' attributes (nonneg, nonpos, bounds)."""
    lower = np.full(lin.n, -np.inf)
    upper = np.full(lin.n, np.inf)
    for v in variables:
        off = lin.offsets[v.id]
        sl = slice(off, off + v.size)
        if v.attributes.get("nonneg") or v.attributes.get("pos"):
            lower[sl] = np.maximum(lower[sl], 0.0)
        if v.attributes.get("nonpos") or v.attributes.get("neg"):
            upper[sl] = np.minimum(upper[sl], 0.0)
        bnds = v.attributes.get("bounds")
        if bnds is not None:
            lo, hi = bnds
            if lo is not None:
                lower[sl] = np.maximum(lower[sl], np.broadcast_to(np.asarray(_value(lo), float), v.shape).ravel(order="F"))
            if hi is not None:
                upper[sl] = np.minimum(upper[sl], np.broadcast_to(np.asarray(_value(hi), float), v.shape).ravel(order="F"))
    return lower, upper


def _read_constraints(problem: cp.Problem, lin: Linearizer, ext: Extraction) -> dict:
    """Equality rows (``A``, ``b``, recorded in ``ext.eq_blocks``), bound candidates
    ``(coords, values, source ids)`` and order edges of the constraints."""
    out = {"A": [], "b": [], "lo_cand": [], "hi_cand": [], "edges_lo": [], "edges_hi": []}
    row = 0
    for con in problem.constraints:
        if isinstance(con, (Equality, Zero)):
            expr = con.expr if isinstance(con, Equality) else con.args[0]
            M, c = _lin_constraint(lin, expr, con)
            out["A"].append(M)
            out["b"].append(-c)
            ext.eq_blocks.append((con, row, row + M.shape[0]))
            row += M.shape[0]
        elif isinstance(con, (Inequality, NonPos, NonNeg)):
            if isinstance(con, Inequality):
                expr, sign = con.expr, 1.0
            elif isinstance(con, NonPos):
                expr, sign = con.args[0], 1.0
            else:
                expr, sign = con.args[0], -1.0
            G, g = _lin_constraint(lin, expr, con)
            if sign < 0:
                G, g = -G, -g
            _classify_inequality(ext, con, G, g, out["lo_cand"], out["hi_cand"],
                                 out["edges_lo"], out["edges_hi"])
        else:
            raise NotRecognised(_NAME, _EXPECTED, f"a constraint of type {type(con).__name__}")
    return out


def _merge_bounds(ext: Extraction, lower, upper, lo_cand, hi_cand) -> None:
    """Tighten ``lower``/``upper`` (in place) by the bound rows, remembering which row is
    the tightest per coordinate (it gets the dual) in ``ext.lower_src``/``upper_src``."""
    n = lower.size
    ext.lower_src = np.full(n, -1, dtype=np.int64)
    ext.upper_src = np.full(n, -1, dtype=np.int64)
    for cands, bound, src, better in ((lo_cand, lower, ext.lower_src, np.greater),
                                      (hi_cand, upper, ext.upper_src, np.less)):
        for coords, vals, ids in cands:
            order = np.argsort(-vals if better is np.greater else vals, kind="stable")
            coords_o, vals_o, ids_o = coords[order], vals[order], ids[order]
            first = np.unique(coords_o, return_index=True)[1]
            cc, vv, ii = coords_o[first], vals_o[first], ids_o[first]
            take = better(vv, bound[cc]) | ((vv == bound[cc]) & (src[cc] < 0))
            bound[cc[take]] = vv[take]
            src[cc[take]] = ii[take]
    if np.any(lower > upper):
        j = int(np.flatnonzero(lower > upper)[0])
        ext.trivially_infeasible = f"lower bound {lower[j]} exceeds upper bound {upper[j]} on coordinate {j}"


def _order_chains(edges_lo, edges_hi, n: int) -> Chains | None:
    if not edges_lo:
        return None
    chains = Chains.from_edges(np.concatenate(edges_lo), np.concatenate(edges_hi), n)
    if chains is None:
        raise NotRecognised(_NAME, _EXPECTED, "order constraints x_i <= x_j that do not form "
                            "disjoint chains")
    return chains


# ---------------------------------------------------------------------------
def _value(v):
    return v.value if hasattr(v, "value") else v


def _lin_constraint(lin: Linearizer, expr, con):
    try:
        return lin(expr)
    except (KeyError, ValueError) as exc:
        raise NotRecognised(_NAME, _EXPECTED, f"constraint {con} is not affine in the variables ({exc})")


def _classify_inequality(ext: Extraction, con, G, g, lo_cand, hi_cand, edges_lo, edges_hi):
    """Rows ``G x + g <= 0``: single entries are bounds, ``a (x_i - x_j) <= 0`` order edges."""
    G = sp.csr_matrix(G, copy=True)    # the linearizer's matrix may be shared
    G.eliminate_zeros()
    nnz = np.diff(G.indptr)
    rows = np.arange(G.shape[0])
    if np.any(nnz == 0):
        zero = nnz == 0
        if np.any(g[zero] > 0):
            ext.trivially_infeasible = f"constraint {con} is a false constant inequality"
    one = nnz == 1
    two = nnz == 2
    if np.any(~(one | two | (nnz == 0))):
        raise NotRecognised(_NAME, _EXPECTED, f"inequality {con} with rows that are neither bounds "
                            "nor order relations x_i <= x_j")
    cid = len(ext.ineq_constraints)
    ext.ineq_constraints.append(con)
    if one.any():
        r1 = rows[one]
        start = G.indptr[r1]
        coords = G.indices[start]
        a = G.data[start]
        val = -g[r1] / a
        src_ids = ext.add_bound_sources(cid, r1, a)
        up = a > 0
        if up.any():
            hi_cand.append((coords[up], val[up], src_ids[up]))
        if (~up).any():
            lo_cand.append((coords[~up], val[~up], src_ids[~up]))
    if two.any():
        r2 = rows[two]
        start = G.indptr[r2]
        c0, c1 = G.indices[start], G.indices[start + 1]
        a0, a1 = G.data[start], G.data[start + 1]
        ok = np.isclose(a0, -a1, rtol=1e-12, atol=0) & (g[r2] == 0)
        if not ok.all():
            raise NotRecognised(_NAME, _EXPECTED, f"inequality {con} with two-variable rows other "
                                "than x_i <= x_j")
        # a0 x_c0 + a1 x_c1 <= 0 with a1 = -a0: the smaller side is the one with positive coefficient
        lo_side = np.where(a0 > 0, c0, c1)
        hi_side = np.where(a0 > 0, c1, c0)
        coef = np.abs(a0)
        edges_lo.append(lo_side)
        edges_hi.append(hi_side)
        for k in range(r2.size):
            ext.order_edges[int(lo_side[k])] = (cid, int(r2[k]), float(coef[k]), int(hi_side[k]))
