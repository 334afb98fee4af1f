"""Numbers users pass in, read as float arrays with errors that name the argument and entry.

``np.array(value, dtype=float)`` says only "could not convert string to float: 'two'" and
a NaN reaches whatever factorises the array first (an SVD that "did not converge"); the
modelling objects read their data through these two functions instead, so the error names
the argument (``answers``, ``scale``, ``B``) and the first bad entry.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["as_float_array", "check_finite"]


def as_float_array(value: Any, name: str) -> np.ndarray:
    """``value`` as a new float array; ``ValueError`` naming ``name`` and the first entry
    that is not a real number (a string, ``None`` inside a list, an object)."""
    try:
        return np.array(value, dtype=float, copy=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be real numbers: {_first_non_number(value, exc)}") from None


def _first_non_number(value: Any, exc: Exception) -> str:
    """Where ``value`` stops being numbers, for the error (numpy's message as a last resort)."""
    try:
        items = np.asarray(value, dtype=object)
    except ValueError:                             # ragged nesting
        return f"{exc}"
    if items.ndim == 0:
        return f"got {items.item()!r}"
    for idx in np.ndindex(items.shape):
        try:
            float(items[idx])
        except (TypeError, ValueError):
            where = idx[0] if len(idx) == 1 else idx
            return f"entry {where} is {items[idx]!r}"
    return f"{exc}"


def check_finite(A: Any, name: str) -> None:
    """``ValueError`` naming ``name`` and the first NaN or inf entry of a dense or sparse
    float array (row and column for a matrix), so that it never reaches a factorisation."""
    if sp.issparse(A):
        coo = sp.coo_matrix(A)
        bad = np.flatnonzero(~np.isfinite(coo.data))
        if bad.size:
            j = int(bad[0])
            _raise(name, float(coo.data[j]), (int(coo.row[j]), int(coo.col[j])), bad.size)
        return
    arr = np.asarray(A, dtype=float)
    finite = np.isfinite(arr)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        _raise(name, float(arr[idx]), idx, int(arr.size - np.count_nonzero(finite)))


def _raise(name: str, x: float, idx: tuple[int, ...], count: int) -> None:
    kind = "NaN" if np.isnan(x) else ("+inf" if x > 0 else "-inf")
    where = (f"row {idx[0]}, column {idx[1]}" if len(idx) == 2
             else f"index {idx[0]}" if len(idx) == 1 else "its value")
    more = f" ({count} bad entries)" if count > 1 else ""
    raise ValueError(f"{name} contains {kind} at {where}{more}; it must be finite")
