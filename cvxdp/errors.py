"""Exceptions raised by cvxdp."""
from __future__ import annotations

__all__ = ["NotRecognised", "most_relevant"]


class NotRecognised(ValueError):
    """A cvxdp method was asked to solve a problem outside the family it handles.

    Attributes
    ----------
    method : the cvxdp method name.
    expected : what the method accepts.
    found : what in the problem it could not accept.
    claimed : whether the problem was meant for this family (it has the family's mark, e.g. a
        ``LocalPolytope``); ``False`` when the mark is missing altogether, so that where several
        families answer to one method the error that says something is the one raised
        (:func:`most_relevant`).
    """

    def __init__(self, method: str, expected: str, found: str, *, claimed: bool = True) -> None:
        self.method = method
        self.expected = expected
        self.found = found
        self.claimed = claimed
        super().__init__(f"{method} does not recognise this problem.\n"
                         f"  expected: {expected}\n"
                         f"  found: {found}\n"
                         f"  Solve it with a standard solver (e.g. solver=cp.CLARABEL), or pass "
                         f"fallback=cp.CLARABEL to do so automatically.")


def most_relevant(errors: list[NotRecognised], method: str) -> NotRecognised:
    """One error for several families that all refused a problem: the one whose family the
    problem was meant for, else (none or several were) all of them joined under ``method``."""
    claimed = [e for e in errors if e.claimed]
    pick = claimed or errors
    if len(pick) == 1:
        return pick[0]
    return NotRecognised(method, "; or ".join(e.expected for e in pick),
                         "; ".join(e.found for e in pick))
