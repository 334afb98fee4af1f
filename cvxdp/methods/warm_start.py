"""One warm-start cache for every cvxdp method.

A method's state after a solve (ADMM's iterates and rho, mirror descent's parameters and
step, ...) is kept per problem object and method, together with a fingerprint of the data it
was computed for: the values of every Parameter of the problem and the sizes of its
variables.  Constants cannot change inside a ``cp.Problem``, so those two say whether the
data changed.  A lookup with another fingerprint finds nothing: state from other data (a
factorisation, multipliers of other measurements) is never reused.  The primal warm start
from ``Variable.value`` is separate and always allowed (as in cvxpy).

Entries die with their problem (weak keys), so the cache never keeps a model alive.
"""
from __future__ import annotations

import hashlib
import weakref
from typing import Any

import numpy as np
import cvxpy as cp

__all__ = ["WarmStartCache", "fingerprint", "CACHE"]


def fingerprint(problem: cp.Problem) -> str:
    """A digest of what the problem's numbers can change through: Parameter values and
    variable shapes (in the problem's own order)."""
    h = hashlib.blake2b(digest_size=16)
    for v in problem.variables():
        h.update(repr((v.id, v.shape)).encode())
    for p in problem.parameters():
        h.update(repr((p.id, p.shape)).encode())
        val = p.value
        if val is not None:
            arr = np.ascontiguousarray(val.toarray() if hasattr(val, "toarray") else val,
                                       dtype=float)
            h.update(arr.tobytes())
    return h.hexdigest()


class WarmStartCache:
    """``{(problem, method name): (fingerprint, state)}`` with weak problem keys."""

    def __init__(self) -> None:
        self._store: "weakref.WeakKeyDictionary[cp.Problem, dict[str, tuple[str, Any]]]" = \
            weakref.WeakKeyDictionary()

    def get(self, problem: cp.Problem, method: str, digest: str | None = None) -> Any | None:
        """The cached state for this problem and method if its data is unchanged
        (``digest``: the problem's :func:`fingerprint`, if the caller has it already)."""
        entry = self._store.get(problem, {}).get(method)
        if entry is None or entry[0] != (digest or fingerprint(problem)):
            return None
        return entry[1]

    def put(self, problem: cp.Problem, method: str, state: Any,
            digest: str | None = None) -> None:
        """Remember ``state`` (``None`` forgets) for the problem's current data."""
        per_problem = self._store.setdefault(problem, {})
        if state is None:
            per_problem.pop(method, None)
        else:
            per_problem[method] = (digest or fingerprint(problem), state)

    def clear(self, problem: cp.Problem | None = None) -> None:
        """Forget everything (or everything about ``problem``)."""
        if problem is None:
            self._store.clear()
        else:
            self._store.pop(problem, None)


#: the process-wide cache used by :func:`cvxdp.solve`
CACHE = WarmStartCache()
