"""Recognise ``minimize loss(marginals) s.t. MarginalPolytope(marginals, domain, total)`` (and
the same with ``LocalPolytope``, for ``cvxdp.ADMM``: :func:`recognise_local`).

Accepted losses: nonnegative sums of L1 and squared losses of affine expressions of the
marginal variables (``cvxdp.nll`` of Laplace / Gaussian measurements, ``cp.norm1``,
``cp.sum(cp.abs(.))``, ``cp.sum_squares``, weighted), as parsed for ADMM.  The output is a
:class:`cvxdp.solvers.marginal.mirror_descent.MarginalProblem` on the flat C-order vector of all marginals.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

from ..solvers.marginal.free_total import estimate_total
from ..solvers.marginal.loss import LossTerm, MarginalLoss

from ..errors import NotRecognised
from ..names import ADMM, MIRROR_DESCENT, short
from ..modelling.clique_marginals import CliqueMarginals
from ..modelling.local_polytope import LocalPolytope
from ..modelling.marginal_polytope import MarginalPolytope
from .affine import Linearizer
from .losses import collect

__all__ = ["recognise", "recognise_local", "MarginalExtraction", "estimate_total", "the_polytope"]

_NAME = short(MIRROR_DESCENT)
_EXPECTED = ("minimize a nonnegative sum of L1 / squared losses (cvxdp.nll, cp.norm1, "
             "cp.sum_squares, weighted) of affine expressions of clique-marginal variables, subject "
             "to exactly one cvxdp.MarginalPolytope whose marginals are distinct cvxpy Variables")
_LOCAL_NAME = short(ADMM)
_LOCAL_EXPECTED = _EXPECTED.replace("MarginalPolytope", "LocalPolytope")


@dataclass
class MarginalExtraction:
    constraint: CliqueMarginals
    variables: list                 # the marginal variables, in the constraint's order
    loss: MarginalLoss
    offsets: np.ndarray             # flat C-order offsets of the marginals


def _c_order(v: cp.Expression) -> np.ndarray:
    """``f[c]``: position in cvxpy's column-major vec of the C-order flat index ``c``."""
    n = v.size
    if v.ndim <= 1:
        return np.arange(n)
    return np.ravel_multi_index(np.unravel_index(np.arange(n), v.shape, order="C"), v.shape, order="F")


def the_polytope(problem: cp.Problem) -> CliqueMarginals | None:
    """The problem's one ``MarginalPolytope`` or ``LocalPolytope`` constraint, read without
    recognising the rest (for the cost model's look before recognition); ``None`` when it
    has none or several."""
    cons = [c for c in problem.constraints if isinstance(c, CliqueMarginals)]
    return cons[0] if len(cons) == 1 else None


def recognise(problem: cp.Problem) -> MarginalExtraction:
    """``minimize loss s.t. MarginalPolytope(...)`` for ``cvxdp.MIRROR_DESCENT``."""
    return _recognise(problem, MarginalPolytope, _NAME, _EXPECTED)


def recognise_local(problem: cp.Problem) -> MarginalExtraction:
    """``minimize loss s.t. LocalPolytope(...)`` for ``cvxdp.ADMM``."""
    return _recognise(problem, LocalPolytope, _LOCAL_NAME, _LOCAL_EXPECTED)


def _recognise(problem: cp.Problem, cls: type, name: str, expected: str) -> MarginalExtraction:
    if not isinstance(problem.objective, cp.Minimize):
        raise NotRecognised(name, expected, "a Maximize objective")
    mps = [c for c in problem.constraints if isinstance(c, cls)]
    others = [c for c in problem.constraints if not isinstance(c, cls)]
    if len(mps) != 1:
        raise NotRecognised(name, expected, f"{len(mps)} {cls.__name__} constraints",
                            claimed=bool(mps))
    if others:
        raise NotRecognised(name, expected, f"another constraint, {type(others[0]).__name__}: "
                            f"{str(others[0])[:60]}")
    mp = mps[0]
    variables = []
    for clique, a in zip(mp.cliques, mp.args):
        if not isinstance(a, cp.Variable):
            raise NotRecognised(name, expected, f"the marginal of {clique} is an expression "
                                f"({type(a).__name__}), not a Variable")
        bad = [k for k in ("boolean", "integer", "PSD", "NSD", "symmetric", "complex", "imag",
                           "nonpos", "diag", "hermitian", "sparsity", "bounds") if a.attributes.get(k)]
        if bad:
            raise NotRecognised(name, expected, f"a marginal variable with attribute {bad[0]}")
        if any(a is v for v in variables):
            raise NotRecognised(name, expected, "the same variable for two cliques")
        variables.append(a)
    extra = [v for v in problem.variables() if not any(v is u for u in variables)]
    if extra:
        raise NotRecognised(name, expected, f"variable {extra[0].name()} that is not a marginal")
    lin = Linearizer(variables)
    perm = np.concatenate([lin.offsets[v.id] + _c_order(v) for v in variables])
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size)       # cvxpy column -> C-order column
    offsets = np.concatenate([[0], np.cumsum([v.size for v in variables])]).astype(int)
    terms, constant = collect(problem.objective.expr, name, expected)
    if not terms:
        raise NotRecognised(name, expected, "an objective without a loss term")
    out = []
    for t in terms:
        try:
            M, c = lin(t.expr)
        except (KeyError, ValueError) as exc:
            raise NotRecognised(name, expected, f"a loss of an expression it cannot read ({exc})")
        M = sp.csr_matrix(M)                   # columns in C order per clique (O(nnz), no slicing)
        # new arrays: sort_indices permutes them in place, and the linearizer's are not ours
        M = sp.csr_matrix((M.data.copy(), inv[M.indices], M.indptr.copy()), shape=M.shape)
        M.sort_indices()
        w = np.broadcast_to(np.asarray(t.weight, dtype=float), (M.shape[0],))
        b = -c
        if t.expr.ndim > 1:                    # rows in C order too (the loss ignores row order),
            rows = _c_order(t.expr)            # so a marginal minus its table reads as a slice
            M, b, w = M[rows], b[rows], w[rows]
        out.append(LossTerm(t.kind, _as_slice(M) or M, b, w))
    return MarginalExtraction(mp, variables, MarginalLoss(out, int(offsets[-1]), constant), offsets)


def _as_slice(M: sp.csr_matrix) -> slice | None:
    """``slice(a, a+m)`` if ``M`` is the identity on columns ``a .. a+m-1``."""
    m = M.shape[0]
    if M.nnz != m or m == 0:
        return None
    M = M.tocsr()
    M.sort_indices()
    if not np.array_equal(np.diff(M.indptr), np.ones(m, dtype=M.indptr.dtype)):
        return None
    if not np.all(M.data == 1.0):
        return None
    a = int(M.indices[0])
    if not np.array_equal(M.indices, np.arange(a, a + m)):
        return None
    return slice(a, a + m)
