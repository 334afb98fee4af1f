"""The curvature every cvxdp atom shares: convex, not concave, and never increasing."""
from __future__ import annotations

from cvxpy.atoms.atom import Atom

__all__ = ["ConvexAtom"]


class ConvexAtom(Atom):
    """A convex atom of one argument; ``decreasing`` says whether it decreases in it (else it
    is neither increasing nor decreasing)."""

    decreasing = False

    def is_atom_convex(self) -> bool:
        return True

    def is_atom_concave(self) -> bool:
        return False

    def is_incr(self, idx) -> bool:
        return False

    def is_decr(self, idx) -> bool:
        return self.decreasing
