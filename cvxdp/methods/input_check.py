"""Refuse bad numbers before any work: NaN, inf or complex data anywhere in a problem.

A DP release is a vector of finite real numbers, and so is every bound, weight, matrix and
target built from it.  A NaN that reaches an iterative method spreads silently (a NaN
objective called ``optimal_inaccurate``, a NaN bound read as "no bound"), so every cvxdp
method calls :func:`check_problem_data` first.  It walks the objective and each constraint
and looks at every Constant and Parameter leaf, and at the array data custom atoms and
constraints keep outside the expression tree (``get_data()``, e.g. ``query_variance``'s
``L``), and names the term, the leaf and the first bad entry.  The walk is linear in the size
of the data.

**Finite data too large for float64.**  A noisy answer or a bound of 1e300 is finite, yet a
first-order method squares it: squared losses square the residuals, and every method's
stopping rule takes Euclidean norms (sums of squares) of residuals and iterates, which live at
the data's scale.  Such data came back ``optimal_inaccurate`` with an infinite or NaN
objective.  So the ADMM and mirror-descent families (and the residual reconstruction) refuse,
after recognising the problem and before any iteration (standard solvers are not affected):

* any constant, Parameter value or atom datum of magnitude above :data:`DATA_LIMIT` = 1e150
  (:func:`check_magnitudes`): its square, 1e300, leaves a factor 1.8e8 below float64's
  largest number 1.8e308, so sums of up to 10^8 squares of the data stay finite;
* a loss term whose *weighted* residual at the data exceeds the same limit
  (:func:`check_loss_scale`): ``w |r|`` and ``(w2 / 2) r^2 = (sqrt(w2 / 2) r)^2`` are what the
  objective adds up, so ``sum_squares(1e100 * (x - 1e100))`` is refused although each
  constant is below the limit.

NEWTON_CG's dense family is scale-free in its targets (targets of 1e300 are solved), so it is
checked on what overflows (:func:`check_fitness_scale`), measured on instances scaled by powers
of ten: results go wrong once the scale of the noise precision a target needs,
``|l_i|^2 / c_i``, or the squared norm of a basis column, ``|b_j|^2``, passes about 1e205
(1e204 is solved, 1e206 is not, however the scale is reached: by ``L``, ``B`` or ``c``; that
is where a 3/2 power of it overflows float64), so both must stay below the same 1e150.  Two
overflows of the results are refused too: the optimal squared privacy cost ``D^2`` is at least
``max_ij W_ij^2 / c_i`` (``W = L B``; by Cauchy-Schwarz ``(l_i^T b_j)^2 <= (l_i^T X^{-1}
l_i)(b_j^T X b_j) <= c_i D^2``), and the multipliers of the targets satisfy
``sum_i lambda_i c_i = D^2`` (the optimum is homogeneous of degree -1 in ``c``), so the
objective and ``D^2 / sum(c)`` must stay below 1e300.

NEWTON_CG on a marginal workload (the residual design) divides by the cubes of the variances
``s``, whose scale is that of the targets over the rows that read them, ``c_i / max_j V_ij``;
measured, results go wrong beyond 1e103 either way (a cube leaves float64's range 1e+-308), so
:func:`check_design_scale` keeps that scale within ``1e-100 .. 1e100`` (:data:`DESIGN_LIMIT`).
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterator

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.atoms.affine.add_expr import AddExpression
from cvxpy.constraints.constraint import Constraint
from cvxpy.expressions.leaf import Leaf

from ..recognise.affine import Linearizer
from ..recognise.losses import collect

__all__ = ["DATA_LIMIT", "DESIGN_LIMIT", "check_problem_data", "check_magnitudes",
           "check_marginal_data",
           "check_loss_scale", "loss_factor", "weighted_rows", "check_residual_scale",
           "check_fitness_scale", "check_design_scale"]

_SHOWN = 60      # characters of a term's text shown in an error

#: the largest magnitude of data (and of weighted loss data) the first-order methods accept;
#: its square leaves a factor 1.8e8 below float64's largest number (module docstring)
DATA_LIMIT = 1e150
#: the residual design's variances stay within 1 / DESIGN_LIMIT .. DESIGN_LIMIT: their cubes
#: then stay inside float64's normal range (module docstring)
DESIGN_LIMIT = 1e100


def check_problem_data(problem: cp.Problem) -> None:
    """Raise ``ValueError`` naming the first NaN, inf or complex number in ``problem``'s
    constants, Parameters and atom data, or a Parameter without a value."""
    found = _first_bad(problem, _bad_entry)
    if found:
        raise ValueError(f"cvxdp: {found}; cvxdp methods need finite real data")


def check_magnitudes(problem: cp.Problem, method: str, limit: float = DATA_LIMIT) -> None:
    """Raise ``ValueError`` naming the first constant, Parameter value or atom datum of
    magnitude above ``limit`` (the term, the leaf and the entry): ``method`` squares its data
    (module docstring)."""
    found = _first_bad(problem, lambda value: _too_large(value, limit))
    if found:
        raise ValueError(f"cvxdp: {found}, above {limit:g}: {_WHY.format(method=method)}")


_WHY = ("{method} squares its data (squared losses, the Euclidean norms of its stopping rule) and "
        "float64 overflows above 1.8e308; rescale the data (count in thousands, say) or solve "
        "with a standard solver")


def _first_bad(problem: cp.Problem, test: Callable[[Any], str | None]) -> str | None:
    """``"<term> (<text>) has <leaf> with <what test found>"`` for the first datum ``test``
    flags, terms in order (each summand of the objective on its own), or ``None``."""
    for label, term in _terms(problem):
        for what, value in _data_of(term):
            problem_text = test(value)
            if problem_text:
                return f"{label} ({_short(term)}) has {what} with {problem_text}"
    return None


def _short(term: Any) -> str:
    """A term's text on one line, cut to :data:`_SHOWN` characters."""
    text = " ".join(str(term).split())
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _terms(problem: cp.Problem) -> list[tuple[str, Any]]:
    """The objective's summands (a sum of ``cvxdp.nll`` terms: one per measurement) and the
    constraints, each with the label an error names it by."""
    expr = problem.objective.expr
    parts = list(expr.args) if isinstance(expr, AddExpression) else [expr]
    terms: list[tuple[str, Any]] = (
        [(f"term {k} of the objective", t) for k, t in enumerate(parts)] if len(parts) > 1
        else [("the objective", problem.objective)])
    return terms + [(f"constraint {i}", c) for i, c in enumerate(problem.constraints)]


def _data_of(node: Any) -> Iterator[tuple[str, Any]]:
    """``(description, value)`` of every numeric datum below ``node`` (each leaf once)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, cp.Parameter):
            if cur.value is None:
                raise ValueError(f"cvxdp: Parameter {cur.name()!r} has no value; set "
                                 f"{cur.name()}.value before solving")
            yield f"Parameter {cur.name()!r}", cur.value
            continue
        if isinstance(cur, cp.Constant):
            yield "a constant" + (f" of shape {cur.shape}" if cur.shape else ""), cur.value
            continue
        if isinstance(cur, Leaf):            # a Variable
            continue
        if isinstance(cur, (cp.Expression, Constraint)) or hasattr(cur, "args"):
            for item in _array_data(cur):
                yield f"data of {type(cur).__name__}", item
            stack.extend(getattr(cur, "args", ()))


def _array_data(node: Any) -> Iterator[Any]:
    """Arrays and numbers an atom or constraint keeps in ``get_data()``."""
    try:
        data = node.get_data() or []
    except (AttributeError, TypeError, NotImplementedError):
        return
    if not isinstance(data, (list, tuple)):
        data = [data]
    for item in data:
        if isinstance(item, Constraint) or isinstance(item, cp.Expression):
            continue
        if sp.issparse(item) or isinstance(item, np.ndarray) or (
                isinstance(item, numbers.Number) and not isinstance(item, (bool, np.bool_))):
            yield item


def _bad_entry(value: Any) -> str | None:
    """``"NaN at index (3,)"``-style text for the first bad entry, or ``None``."""
    if sp.issparse(value):
        if _sparse_values_pass(value, lambda v: np.isfinite(v).all()):
            return None
        coo = value.tocoo()
        if np.iscomplexobj(coo.data):
            return "complex entries"
        bad = np.flatnonzero(~np.isfinite(coo.data))
        if bad.size:
            j = int(bad[0])
            return (f"{_kind(coo.data[j])} at index ({int(coo.row[j])}, {int(coo.col[j])}) "
                    f"({bad.size} bad entr{'y' if bad.size == 1 else 'ies'})")
        return None
    arr = np.asarray(value)
    if arr.dtype.kind == "c":
        return "complex entries"
    if arr.dtype.kind not in "biuf":
        return None
    finite = np.isfinite(arr)
    if finite.all():
        return None
    idx = tuple(int(i) for i in np.argwhere(~finite)[0])
    count = int(finite.size - np.count_nonzero(finite))
    return (f"{_kind(arr[idx] if idx else arr)} at index {idx} "
            f"({count} bad entr{'y' if count == 1 else 'ies'})")


def _sparse_values_pass(value: Any, test: Callable[[np.ndarray], bool]) -> bool:
    """``test`` on a sparse matrix's stored values without converting it (a real CSR, CSC or
    COO matrix); ``False`` sends the caller to the conversion that locates the entry."""
    data = getattr(value, "data", None)
    return (isinstance(data, np.ndarray) and data.dtype.kind in "biuf"
            and bool(test(data)))


def _kind(x: Any) -> str:
    x = float(x)
    return "NaN" if np.isnan(x) else ("+inf" if x > 0 else "-inf")


def _too_large(value: Any, limit: float) -> str | None:
    """``"magnitude 1e+300 at index (3,)"`` for the first entry above ``limit``, or ``None``
    (non-finite entries are :func:`check_problem_data`'s)."""
    if sp.issparse(value):
        if _sparse_values_pass(value, lambda v: np.abs(v).max(initial=0.0) <= limit):
            return None
        coo = value.tocoo()
        big = np.flatnonzero(np.abs(coo.data) > limit)
        if not big.size:
            return None
        j = int(big[0])
        return (f"magnitude {abs(float(coo.data[j])):.3g} at index "
                f"({int(coo.row[j])}, {int(coo.col[j])})")
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        return None
    big = np.abs(arr) > limit
    if not big.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(big)[0])
    return f"magnitude {abs(float(arr[idx])):.3g}" + (f" at index {idx}" if idx else "")


# --------------------------------------------------------------------- weighted loss data
def check_loss_scale(problem: cp.Problem, variables: list, rows: np.ndarray, method: str,
                     limit: float = DATA_LIMIT) -> None:
    """``ValueError`` when a loss term's weighted residual at the data exceeds ``limit``.

    ``rows``: the family's own arrays read as one number per loss row
    (:func:`weighted_rows`), so the common case costs one pass; only when one exceeds
    ``limit`` are the terms linearised again, to name the term and the entry."""
    if rows.size == 0 or float(np.max(rows)) <= limit:
        return
    terms, _ = collect(problem.objective.expr, method, "")
    lin = Linearizer(variables)
    for k, term in enumerate(terms):
        M, c = lin(term.expr)
        w = loss_factor(term.kind, np.broadcast_to(np.asarray(term.weight, dtype=float), c.shape))
        scaled = weighted_rows(w, M, -c)
        if scaled.size and float(np.max(scaled)) > limit:
            i = int(np.argmax(scaled > limit))
            idx = np.unravel_index(i, term.expr.shape, order="F") if term.expr.shape else ()
            raise ValueError(
                f"cvxdp: loss term {k} of the objective ({term.kind} of {_short(term.expr)}) "
                f"weighs its residual at entry {tuple(int(j) for j in idx)} by {w[i]:.3g} where the data "
                f"reach {scaled[i] / w[i]:.3g}: the weighted residual {scaled[i]:.3g} is above "
                f"{limit:g}: {_WHY.format(method=method)}")
    raise ValueError(f"cvxdp: a loss term's weighted residual reaches {float(np.max(rows)):.3g}, "
                     f"above {limit:g}: {_WHY.format(method=method)}")


def loss_factor(kind: str, w: np.ndarray) -> np.ndarray:
    """The factor a residual is weighted by: ``w`` in ``w |r|`` (``kind`` ``"l1"``),
    ``sqrt(w / 2)`` in ``(w / 2) r^2 = (sqrt(w / 2) r)^2`` (``"l2"``)."""
    w = np.abs(np.asarray(w, dtype=float))
    return np.sqrt(w / 2.0) if kind == "l2" else w


def weighted_rows(factor: np.ndarray, M: Any, y: np.ndarray) -> np.ndarray:
    """Per loss row ``r = M x - y``, the weighted residual's scale at the data:
    ``factor * max(|y_i|, max_j |M_ij|)``; ``M`` sparse, or a slice (an identity block)."""
    data = np.abs(np.asarray(y, dtype=float))
    rows = np.ones_like(data) if isinstance(M, slice) else _row_abs_max(sp.csr_matrix(M))
    return factor * np.maximum(data, rows)


def check_residual_scale(atom: Any, method: str, limit: float = DATA_LIMIT) -> None:
    """The same two checks for the likelihood of residual answers
    (:class:`~cvxdp.modelling.residual_likelihood.ResidualLikelihood`, whose answers are
    atom data the walk does not read): every answer, and every weighted residual answer
    ``sqrt(w_A / 2) z_A``, finite and at most ``limit``."""
    W = atom.measurement.workload
    for j in np.flatnonzero(atom.w > 0):
        for what, values, factor in (("answers", atom.measurement.answers[j], 1.0),
                                     ("weighted answers", atom.z[j],
                                      float(np.sqrt(atom.w[j] / 2.0)))):
            big = ~(factor * np.abs(np.asarray(values, dtype=float)) <= limit)   # NaN too
            if big.any():
                idx = tuple(int(i) for i in np.argwhere(big)[0])
                value = factor * abs(float(np.asarray(values, dtype=float)[idx]))
                raise ValueError(f"cvxdp: the {what} of residual {int(j)} "
                                 f"({W.basis.residual(j)}) of the measurement reach {value:.3g} "
                                 f"at index {idx}, above {limit:g}: {_WHY.format(method=method)}")


def _row_abs_max(M: sp.csr_matrix) -> np.ndarray:
    """``max_j |M_ij|`` per row (0 for an empty row)."""
    out = np.zeros(M.shape[0])
    full = np.diff(M.indptr) > 0
    if M.nnz:
        out[full] = np.maximum.reduceat(np.abs(M.data), M.indptr[:-1][full])
    return out


# --------------------------------------------------------------------- fitness for use
def check_fitness_scale(problem: cp.Problem, ext: Any, limit: float = DATA_LIMIT) -> None:
    """``ValueError`` when the scale of the noise precision a target needs, ``|l_i|^2 / c_i``,
    or the squared norm of a basis column ``|b_j|^2`` is above ``limit``, or when the optimum
    or its multipliers certainly overflow (module docstring).  ``ext``: a
    :class:`~cvxdp.recognise.fitness.FitnessExtraction` (``B``, ``L``, ``c``, ``scale``,
    ``problem`` 1 or 2, ``rho``, ``variance_constraints``)."""
    need = np.hypot.reduce(ext.L, axis=1) / np.sqrt(ext.c)      # |l_i| / sqrt(c_i), no overflow
    i = int(np.argmax(need))
    if float(need[i]) ** 2 > limit:
        raise ValueError(f"cvxdp: the variance target c = {ext.c[i]:.3g} of "
                         f"{_query(problem, ext, i)} needs a noise precision of scale |l|^2 / c "
                         f"= {float(need[i]) ** 2:.3g}, above {limit:g}: {_FITNESS_WHY}")
    width = np.hypot.reduce(ext.B, axis=0)
    j = int(np.argmax(width))
    if float(width[j]) ** 2 > limit:
        raise ValueError(f"cvxdp: column {j} of B (the basis) has squared norm "
                         f"{float(width[j]) ** 2:.3g}, above {limit:g}: {_FITNESS_WHY}")
    W = ext.L @ ext.B
    root = np.abs(W) / np.sqrt(ext.c)[:, None]
    i, j = (int(a) for a in np.unravel_index(int(np.argmax(root)), root.shape))
    low = float(root[i, j]) ** 2
    results = ([ext.scale * low, ext.scale * low / float(np.sum(ext.c))] if ext.problem == 1
               else [low / ext.rho, low / (ext.rho * ext.rho)])
    if not max(results) <= limit * limit:
        raise ValueError(f"cvxdp: the variance target c = {ext.c[i]:.3g} of "
                         f"{_query(problem, ext, i)} makes the optimal squared privacy cost at "
                         f"least W[{i}, {j}]^2 / c = {low:.3g} (W = L B), so the objective or its "
                         f"multipliers reach {max(results):.3g}, above {limit * limit:g} "
                         f"(float64 overflows above 1.8e308); rescale the targets, the workload "
                         f"or the privacy bound")


_FITNESS_WHY = ("NEWTON_CG's results go wrong from about 1e205 (where a 3/2 power of this scale "
                "overflows float64); rescale the targets, the workload or the basis")


def _query(problem: cp.Problem, ext: Any, row: int) -> str:
    """``"constraint 2, entry 1"``: where query ``row`` of the stacked workload was written."""
    for con, rows in ext.variance_constraints:
        hit = np.flatnonzero(rows == row)
        if hit.size:
            index = next(k for k, c in enumerate(problem.constraints) if c is con)
            return f"constraint {index}" + (f", entry {int(hit[0])}" if rows.size > 1 else "")
    return f"query {row}"


# --------------------------------------------------------------------- the residual design
def check_design_scale(problem: cp.Problem, ext: Any, limit: float = DESIGN_LIMIT) -> None:
    """``ValueError`` naming the positive target whose variance scale ``c_i / max_j V_ij``
    lies outside ``1 / limit .. limit`` (module docstring; a target ``<= 0`` is the solver's:
    infeasible).  ``ext``: a
    :class:`~cvxdp.recognise.residual.ResidualExtraction` (``V``, ``c``, ``blocks``)."""
    scale = ext.c / _row_abs_max(sp.csr_matrix(ext.V))
    bad = np.flatnonzero((ext.c > 0) & ((scale < 1.0 / limit) | (scale > limit)))
    if not bad.size:
        return
    i = int(bad[0])
    con, a, _ = next(block for block in ext.blocks if block[1] <= i < block[2])
    index = next(k for k, c in enumerate(problem.constraints) if c is con)
    raise ValueError(f"cvxdp: the variance target c = {ext.c[i]:.3g} of constraint {index}, "
                     f"entry {i - a}, sets variances of scale {scale[i]:.3g} (c over the "
                     f"largest coefficient of its row), outside {1.0 / limit:g} .. {limit:g}: "
                     f"NEWTON_CG divides by their cubes, which leave float64's range beyond "
                     f"about 1e103; rescale the targets (variances in other units)")


def check_marginal_data(problem: cp.Problem, variables: list, terms: list, method: str) -> None:
    """:func:`check_magnitudes` and :func:`check_loss_scale` for a marginal loss's ``terms``
    (``kind``, ``w``, ``A``, ``b`` each): the checks of the clique-marginal families."""
    check_magnitudes(problem, method)
    rows = [weighted_rows(loss_factor(t.kind, t.w), t.A, t.b) for t in terms]
    check_loss_scale(problem, variables, np.concatenate(rows), method)
