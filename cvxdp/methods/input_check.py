"""Refuse bad numbers before any work: NaN, inf or complex data anywhere in a problem.

A DP release is a vector of finite real numbers, and so is every bound, weight, matrix and
target built from it.  A NaN that reaches an iterative method spreads silently (a NaN
objective called ``optimal_inaccurate``, a NaN bound read as "no bound"), so every cvxdp
method calls :func:`check_problem_data` first.  It walks the objective and each constraint
and looks at every Constant and Parameter leaf, and at the array data custom atoms and
constraints keep outside the expression tree (``get_data()``, e.g. ``query_variance``'s
``L``), and names the term, the leaf and the first bad entry.  The walk is linear in the size
of the data.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp
import cvxpy as cp
from cvxpy.constraints.constraint import Constraint
from cvxpy.expressions.leaf import Leaf

__all__ = ["check_problem_data"]

_SHOWN = 60      # characters of a term's text shown in an error


def check_problem_data(problem: cp.Problem) -> None:
    """Raise ``ValueError`` naming the first NaN, inf or complex number in ``problem``'s
    constants, Parameters and atom data, or a Parameter without a value."""
    terms: list[tuple[str, Any]] = [("the objective", problem.objective)]
    terms += [(f"constraint {i}", c) for i, c in enumerate(problem.constraints)]
    for label, term in terms:
        for what, value in _data_of(term):
            problem_text = _bad_entry(value)
            if problem_text:
                text = str(term)
                text = text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."
                raise ValueError(f"cvxdp: {label} ({text}) has {what} with {problem_text}; cvxdp "
                                 f"methods need finite real data")


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


def _kind(x: Any) -> str:
    x = float(x)
    return "NaN" if np.isnan(x) else ("+inf" if x > 0 else "-inf")
