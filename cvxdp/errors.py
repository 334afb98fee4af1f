"""Exceptions raised by cvxdp."""
from __future__ import annotations

__all__ = ["NotRecognised"]


class NotRecognised(ValueError):
    """A cvxdp method was asked to solve a problem outside the family it handles.

    Attributes
    ----------
    method : the cvxdp method name.
    expected : what the method accepts.
    found : what in the problem it could not accept.
    """

    def __init__(self, method: str, expected: str, found: str) -> None:
        self.method = method
        self.expected = expected
        self.found = found
        super().__init__(f"{method} does not recognise this problem.\n"
                         f"  expected: {expected}\n"
                         f"  found: {found}\n"
                         f"  Solve it with a standard solver (e.g. solver=cp.CLARABEL), or pass "
                         f"fallback=cp.CLARABEL to do so automatically.")
