"""The certified gap as mirror descent (:mod:`.mirror_descent`) and the free-total solve
(:mod:`.free_total`) use it: their stopping test and the relative gap of their verbose tables."""
from __future__ import annotations

__all__ = ["within_tolerance", "relative"]


def within_tolerance(f: float, gap: float, eps_abs: float, eps_rel: float) -> bool:
    """The stopping test ``gap <= eps_abs + eps_rel |f|`` of a certified gap ``gap`` at the
    loss value ``f``."""
    return gap <= eps_abs + eps_rel * abs(f)


def relative(gap: float, f: float) -> float:
    """``gap / |f|``, the ``"rel gap"`` of the verbose tables (``|f|`` floored at ``1e-300``,
    so a zero loss gives a number, not a division by zero)."""
    return gap / max(abs(f), 1e-300)
