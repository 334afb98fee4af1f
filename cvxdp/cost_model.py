"""``solver=None``: the cvxdp method or a standard solver, whichever is expected to be faster.

At small sizes an interior-point solver (Clarabel) beats the custom methods: their certified
stopping rule, dual repair and recognition cost a fixed few milliseconds, and an interior point
needs few iterations on a small problem.  At large sizes the custom methods win by orders of
magnitude.  The crossover depends on the family, so the model is per family: ``log t = a + b
log size`` for the cvxdp method and for Clarabel, fitted to measurements on this kind of
machine (2 cores) by ``benchmarks/cost_model.py`` (its output:
``benchmarks/results/cost_model.txt``).  Sizes are the number of unknowns the method works on:
variables for ADMM, table cells for the polytopes, the domain size for fitness for use.

Families solved exactly in closed form or with no iteration (the exact L1 isotonic path) always
take the cvxdp method.  The choice and the two estimates are recorded in
``solver_stats.extra_stats["choice"]`` and logged when ``verbose``; ``solver=cvxdp.ADMM`` (any
explicit method) is never second-guessed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cvxpy as cp

from .methods.base import Recognised
from .methods.registry import FAMILIES, method_for

__all__ = ["Choice", "choose", "quick", "size_of", "standard_options", "estimates", "small_limit",
           "FITS", "MARGIN", "STANDARD", "SMALL", "SMALL_SEPARABLE", "RECOGNITION"]

#: family/loss -> (a, b) of ``log t = a + b log size`` (seconds, whole ``prob.solve`` calls)
#: for the cvxdp method, then (c, d) for Clarabel, measured on a 2-core machine
#: (``benchmarks/results/cost_model.txt``); or the measured points ``(size, t_cvxdp,
#: t_clarabel), ...`` themselves, interpolated linearly in log-log (:func:`estimates`)
FITS: dict[str, tuple] = {
    # the tree, general and histogram-tree families refitted 2026-12-06 on a quiet machine
    # ... the L1 trees refitted 2026-12-07 after the polish's candidate order (crossover
    # near 840 nodes, was 1,380; three calibrations of that day put it at 840-1,010)
    "admm_tree/l1": (-6.667, 0.48, -9.763, 0.94),
    "admm_tree/l2": (-7.572, 0.463, -10.139, 0.928),
    "admm_tree/mixed": (-8.26, 0.765, -10.309, 1.022),
    "admm_general/l1": (-4.519, 0.291, -9.5, 0.872),
    "admm_general/l2": (-5.918, 0.5, -9.436, 0.852),
    "admm_general/mixed": (-5.081, 0.388, -9.258, 0.895),
    # ... squared losses whose targets are mostly inside the bounds (few pushed to them: the
    # ADMM needs a fraction of the iterations; cvxdp.methods.consistency._pushed_share):
    # two-way tables with 30 % empty cells, 2026-12-06 (third session)
    "admm_general_inside/l2": (-6.285, 0.489, -7.714, 0.69),
    # order chains without equalities (PAVA in the splitting; L1 alone is exact_isotonic):
    # calibrated on degree sequences, 2026-12-06
    "admm_order/l2": (-6.646, 0.466, -9.744, 0.938),
    "admm_order/mixed": (-7.402, 0.661, -10.898, 1.207),
    # any loss matrix (not separable, no tree): the LP (HiGHS) / the interior point.  Its
    # times are not a straight line in log-log (the interior point's factorisation switches
    # from sparse to dense), so the measured points themselves (size, cvxdp, Clarabel);
    # remeasured 2026-12-06 (third session) after the small problems' dense Newton matrices
    "general_exact/l1": ((100, 0.0199, 0.0162), (300, 0.057, 0.1492), (1000, 0.2099, 1.0979),
                         (3000, 1.1084, 6.4068)),
    "general_exact/l2": ((100, 0.0159, 0.0106), (300, 0.081, 0.0866), (1000, 0.2982, 0.4293),
                         (3000, 1.8992, 2.6562)),
    "general_exact/mixed": ((100, 0.0179, 0.0188), (300, 0.0794, 0.1934), (1000, 0.3561, 0.7334),
                            (3000, 2.495, 4.0354)),
    "histogram_tree/l1": (-6.085, 0.522, -12.336, 1.16),
    "histogram_tree/l2": (-8.557, 0.523, -11.784, 1.07),
    "marginal_polytope/l1": (-4.487, 0.192, -8.291, 0.711),
    "marginal_polytope/l2": (-5.487, 0.355, -7.683, 0.626),
    "local_polytope/l1": (-2.474, -0.094, -6.668, 0.541),    # stop 21: proximal Newton
    "local_polytope/l2": (-5.903, 0.225, -7.086, 0.587),     # stop 21: the dual Newton
    "newton_cg": (-4.326, -0.017, -7.747, 2.544),
}
#: families the cvxdp method solves directly (no iterations): always the cvxdp method
EXACT = ("exact_isotonic", "exact_gls")
#: what ``cvxdp.ADMM`` says of a problem before recognising it (its bounds, equalities and
#: loss atoms only: one of the consistency family's iterative kinds, which one unknown)
SMALL = "consistency_small"
#: ... and of one whose losses read the variables entrywise (not the general path); either
#: may carry the loss kind its objective's atoms show (``"consistency_small/l1"``): then only
#: that kind's families are compared (an L1 model with entrywise losses is not held to the
#: squared loss's limit, about 390 unknowns; its own is about 920)
SMALL_SEPARABLE = "consistency_small_separable"
#: the families :data:`SMALL` stands for (:data:`SMALL_SEPARABLE`: all but the general path)
_CONSISTENCY = ("admm_tree/", "admm_general/", "admm_general_inside/", "admm_order/", "general_exact/",
                "histogram_tree/")
#: seconds that recognising a small consistency model costs before either solver runs (1.5-2
#: ms measured at 100-400 unknowns): handing it over unrecognised wins unless the method is
#: expected faster by more than this
RECOGNITION = 0.0015
#: the cvxdp method must be expected this much slower before a standard solver is chosen
#: (1: whichever is expected faster; near the crossover both take about the same time)
MARGIN = 1.0
#: the standard solver ``solver=None`` hands problems to
STANDARD = cp.CLARABEL


@dataclass
class Choice:
    """What ``solver=None`` chose: ``solver`` (a cvxdp method or a cvxpy solver name), the
    ``family`` and ``size`` it read, the two estimated times and why."""

    solver: str
    family: str
    size: int
    estimate_cvxdp: float
    estimate_standard: float
    reason: str

    def as_dict(self) -> dict:
        return {"solver": self.solver, "family": self.family, "size": self.size,
                "estimate_cvxdp": self.estimate_cvxdp, "estimate_standard": self.estimate_standard,
                "standard": STANDARD, "reason": self.reason}


def choose(method_name: str, recognised: Recognised, *, pinned: str | None = None) -> Choice:
    """The choice for a problem ``method_name`` recognised (``recognised``: the family that
    did and its extraction; the family says what it will work on).  ``pinned`` (why the
    user's options need the cvxdp method, e.g. one of its own options was given) keeps the
    cvxdp method whatever the estimates say."""
    if not pinned:
        found = recognised.family.cost_candidates(recognised.extraction)
        if found is not None:
            early = _standard_on_every(method_name, *found)
            if early is not None:
                return early
    family, size = recognised.family.cost(recognised.extraction)
    return _choose(method_name, family, size, pinned)


def _standard_on_every(method_name: str, families: tuple, size: int) -> Choice | None:
    """The standard solver when every family the problem can be (``families``, each
    measured) expects it faster at ``size``: the family need not be told apart (its
    detections cost up to a millisecond, paid for nothing when the standard solver runs).
    ``None`` otherwise."""
    if not families or any(f not in FITS for f in families):
        return None
    est = {f: estimates(f, size) for f in families}
    if any(t_c <= MARGIN * t_s for t_c, t_s in est.values()):
        return None
    closest = min(est, key=lambda f: est[f][0] / est[f][1])
    t_c, t_s = est[closest]
    return Choice(STANDARD, " | ".join(families), size, t_c, t_s,
                  f"one of {', '.join(families)} at size {size:,}: {STANDARD} expected faster "
                  f"on each (closest: {closest}, {t_s:.3g} s against {method_name}'s {t_c:.3g} s)")


def quick(problem: cp.Problem) -> tuple[str, Choice] | None:
    """``(method, choice)`` before recognition, for the families a cvxdp constraint states
    (one :class:`cvxdp.MarginalPolytope` or :class:`cvxdp.LocalPolytope`: each family is asked,
    ``cost_before_recognition``), so that a problem handed to the standard solver does not pay
    for the method's recognition (at the sizes where that happens, it is a sizeable part of
    the standard solver's time).  ``None`` otherwise."""
    for family in FAMILIES:
        found = family.cost_before_recognition(problem)
        if found is not None:
            return family.name, _choose(family.name, found[0], found[1], None)
    return None


def estimates(family: str, size: float) -> tuple[float, float]:
    """The expected seconds of the cvxdp method and of Clarabel on ``family`` at ``size``."""
    fit = FITS[family]
    logn = math.log(max(size, 1.0))
    if isinstance(fit[0], tuple):           # measured points: piecewise linear in log-log
        pts = sorted(fit)
        k = 1
        while k < len(pts) - 1 and pts[k][0] < size:
            k += 1
        (n0, c0, s0), (n1, c1, s1) = pts[k - 1], pts[k]
        u = (logn - math.log(n0)) / (math.log(n1) - math.log(n0))
        return (math.exp(math.log(c0) + u * (math.log(c1) - math.log(c0))),
                math.exp(math.log(s0) + u * (math.log(s1) - math.log(s0))))
    a, b, c, d = fit
    return math.exp(a + b * logn), math.exp(c + d * logn)


def small_limit(separable: bool = False, overhead: float = RECOGNITION, loss: str | None = None) -> float:
    """The unknowns below which handing a consistency model to the standard solver
    unrecognised is expected no slower on *every* family of :data:`_CONSISTENCY` (but the
    general path if ``separable``; only those of loss kind ``loss``, ``"l1"``, ``"l2"`` or
    ``"mixed"``, when the objective's atoms showed it): the smallest size (on a grid of ratio
    1.1 from 64, the smallest calibrated size, to 10^5) at which one of them expects the
    cvxdp method faster by ``overhead`` seconds, the recognition the hand-over saves (``0``
    when one does at 64; below the calibrated sizes the standard solver's lead only grows)."""
    families = tuple(key for key in FITS if key.startswith(_CONSISTENCY)
                     and not (separable and key.startswith("general_exact/"))
                     and (loss is None or key.endswith("/" + loss)))
    # the same fits give the same limit: asked before every small solve, the grid search took
    # 0.6 ms of them (the key holds the fits themselves, so a changed FITS is searched anew)
    key = (families, tuple(FITS[f] for f in families), overhead)
    if key not in _LIMITS:
        _LIMITS[key] = _search_limit(families, overhead)
    return _LIMITS[key]


_LIMITS: dict = {}


def _search_limit(families: tuple, overhead: float) -> float:
    n = 64.0
    while n < 1e5:
        if any(t_c + overhead <= t_s for t_c, t_s in (estimates(f, n) for f in families)):
            return 0.0 if n == 64.0 else n
        n *= 1.1
    return n


def _choose(method_name: str, family: str, size: int, pinned: str | None) -> Choice:
    base, _, loss = family.partition("/")
    if base in (SMALL, SMALL_SEPARABLE):
        limit = small_limit(separable=base == SMALL_SEPARABLE, loss=loss or None)
        if size < limit and not pinned:
            return Choice(STANDARD, family, size, math.nan, math.nan,
                          f"{size:,} unknowns, a consistency model: {STANDARD} expected faster "
                          f"than {method_name} on every consistency family"
                          f"{f' with {loss} losses' if loss else ''} below {limit:,.0f}")
        return Choice(method_name, family, size, math.nan, math.nan, "recognition decides")
    if family in EXACT:
        return Choice(method_name, family, size, math.nan, math.nan,
                      f"{family}: solved exactly by {method_name}, no iterations")
    if family not in FITS:
        return Choice(method_name, family, size, math.nan, math.nan,
                      f"{family}: no measurements; {method_name} kept")
    t_c, t_s = estimates(family, size)
    if pinned:
        return Choice(method_name, family, size, t_c, t_s, pinned)
    if t_c > MARGIN * t_s:
        return Choice(STANDARD, family, size, t_c, t_s,
                      f"{family} at size {size:,}: {STANDARD} expected {t_s:.3g} s against "
                      f"{method_name}'s {t_c:.3g} s")
    return Choice(method_name, family, size, t_c, t_s,
                  f"{family} at size {size:,}: {method_name} expected {t_c:.3g} s against "
                  f"{STANDARD}'s {t_s:.3g} s")


def standard_options(*, max_iters: int | None, eps_abs: float | None, eps_rel: float | None,
                     time_limit: float | None) -> dict:
    """The shared options in Clarabel's names.  ``eps_rel`` bounds ``(f - L) / max(1, |f|)``:
    Clarabel stops when the absolute gap is below ``tol_gap_abs`` or the relative one below
    ``tol_gap_rel``, so both take ``eps_rel``; ``eps_abs`` (the constraint violation) is its
    ``tol_feas`` (relative to the data's norms in Clarabel).  ``None`` keeps Clarabel's
    defaults (1e-8)."""
    out: dict = {}
    if max_iters is not None:
        out["max_iter"] = int(max_iters)
    if time_limit is not None and math.isfinite(time_limit):
        out["time_limit"] = float(time_limit)
    if eps_rel is not None:
        out["tol_gap_abs"] = out["tol_gap_rel"] = float(eps_rel)
    if eps_abs is not None:
        out["tol_feas"] = float(eps_abs)
    return out


def size_of(method_name: str, problem: cp.Problem) -> tuple[str, int]:
    """The family and size the model reads for ``problem`` under ``method_name``."""
    recognised = method_for(method_name).recognise(problem)
    return recognised.family.cost(recognised.extraction)
