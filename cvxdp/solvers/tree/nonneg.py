"""Non-negative GLS over a tree of histograms: ADMM with the exact tree solve, certified gap.

Problem (:mod:`cvxdp.solvers.tree.gls` for the model):

    minimize  f(x) = sum_blocks sum_v 1/2 (Q x_v - y_v)^T diag(w) (Q x_v - y_v)
    subject to x consistent (every parent the sum of its children),  x_leaf >= 0.

Non-negative leaves make every unit non-negative.  Splitting ``z = x_leaf`` (Boyd et al. 2011,
section 5; the consistency is handled exactly inside the ``x`` step, as Lee, Wang & Kifer 2015
do for scalar trees):

    x <- argmin_{x consistent} f(x) + rho/2 ||x_leaf - (z - u)||^2     (one TreeGLS solve)
    z <- max(0, alpha x_leaf + (1 - alpha) z + u)
    u <- u + alpha x_leaf + (1 - alpha) z_old - z

with one factorisation for the whole run (the proximal term is the same at every leaf).

Certificate.  *Primal*: the leaves ``z`` summed up the tree are consistent and non-negative:
a feasible point, ``f`` evaluated on it.  *Dual*: for ``lam >= 0``, weak duality gives

    f* >= min_{x consistent} f(x) - lam^T x_leaf,

one unconstrained GLS solve with ``lam`` added to the leaves' linear terms;
``lam = max(0, -rho u)`` (at a solution ``grad f = lam`` on the leaves and ``u = -lam / rho``).
The run stops when ``(f(z) - bound) / max(1, f(z)) <= eps_rel``.  The best bound's ``lam`` is
returned (``duals["nonneg"]``, leaves in ascending order) with its minimiser
(``info["bound_point"]``), at which the Lagrangian is stationary: the caller reads the
consistency multipliers off it.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import result as R
from .._table import IterationTable
from .forest import Forest
from .gls import Block, Invariant, TreeGLS

__all__ = ["NonnegSettings", "solve_nonneg", "objective"]

_COLUMNS = [("iter", "d"), ("objective", ".8e"), ("lower bnd", ".8e"), ("rel gap", ".2e"),
            ("pri res", ".2e"), ("rho", ".2e"), ("time [s]", ".2f")]


@dataclass
class NonnegSettings:
    max_iters: int = 5000
    eps_rel: float = 1e-6
    eps_abs: float = 1e-6
    time_limit: float = math.inf
    rho: float | None = None           # default: the leaves' typical curvature
    alpha: float = 1.6
    check_every: int = 10
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


def objective(blocks: Sequence[Block], x: np.ndarray) -> float:
    """``f(x)`` from the residuals (not the expanded quadratic, which cancels)."""
    total = 0.0
    for b in blocks:
        r = x[b.nodes] @ b.Q.T - b.y
        total += 0.5 * float(np.sum(r * r * b.w))
    return total


def solve_nonneg(forest: Forest, k: int, blocks: Sequence[Block],
                 settings: NonnegSettings | None = None, *, state: dict | None = None,
                 fixed_roots: Invariant | None = None,
                 invariants: Sequence[Invariant] = ()) -> R.SolverResult:
    """The ADMM of the module docstring; ``state`` (a previous result's) warm-starts.

    ``fixed_roots``: whole root histograms known exactly (an :class:`Invariant` with
    ``E = I`` at roots, non-negative values) -- the children problem of a top-down estimate,
    where the parent's estimate is fixed.  The ADMM's solves then meet them, and the primal
    point scales the leaves below each fixed root, cell by cell, to its value.

    ``invariants``: exact sums of groups of cells at any units (``E`` with 0/1 rows), all
    groups from one partition of the cells (totals everywhere, or one marginal's groups, or
    single cells), non-negative values: the primal point distributes each group's value top
    down (:class:`_InvariantRepair`).  Other invariants raise ``ValueError``."""
    s = settings or NonnegSettings()
    t0 = time.perf_counter()
    invs = _check_fixed_roots(forest, k, fixed_roots) + list(invariants)
    exact = TreeGLS(forest, k, blocks, invs)
    leaves = forest.leaves
    rho = s.rho if s.rho is not None else exact.leaf_curvature()
    if state and state.get("shape") == (leaves.size, k) and state.get("rho") is not None:
        z, u = state["z"].copy(), state["u"].copy()
        rho = float(state["rho"]) if s.rho is None else rho
    else:
        z = np.maximum(exact.solve()[leaves], 0.0)
        u = np.zeros_like(z)
    prox = TreeGLS(forest, k, blocks, invs, prox=rho)
    rescale = _InvariantRepair(forest, k, invs) if invs else None
    b0 = exact.rhs()
    setup = time.perf_counter() - t0
    table = IterationTable(_COLUMNS, s.verbose)
    table.header(f"cvxdp ADMM, non-negative GLS on a tree: {forest.n} units x {k} cells, "
                 f"{leaves.size} leaves, rho {rho:.3g}")
    best_f, best_z, lower, history = math.inf, z, -math.inf, []
    best_dual = None
    status, it = None, 0
    for it in range(1, s.max_iters + 1):
        b = b0.copy()
        b[leaves] += rho * (z - u)
        x = prox.solve(b)
        xl = x[leaves]
        xh = s.alpha * xl + (1 - s.alpha) * z
        z_new = np.maximum(xh + u, 0.0)
        u += xh - z_new
        r_p = float(np.max(np.abs(xl - z_new), initial=0.0))
        z = z_new
        if it % s.check_every and it < s.max_iters:
            continue
        zf = z if rescale is None else rescale(z)
        f = objective(blocks, _aggregate(forest, zf, k))
        if f < best_f:
            best_f, best_z = f, zf
        lam = np.maximum(-rho * u, 0.0)
        bound, x_lam = _bound(exact, blocks, b0, leaves, lam)
        if bound > lower:
            lower, best_dual = bound, (lam, x_lam)
        gap = R.relative_gap(best_f, lower)
        row = {"iter": it, "objective": best_f, "lower bnd": lower, "rel gap": gap, "pri res": r_p,
               "rho": rho, "time [s]": time.perf_counter() - t0}
        status = R.record_check(row, history, table, s)
        if status is not None:
            break
    status = status or R.OPTIMAL_INACCURATE
    x = _aggregate(forest, best_z, k)
    table.footer(f"status {status}: objective {best_f:.8e}, certified lower bound {lower:.8e}, "
                 f"{it} iterations, {time.perf_counter() - t0:.2f} s")
    return R.SolverResult(
        x=x, status=status, objective=best_f, lower_bound=lower, gap=R.relative_gap(best_f, lower),
        duals={} if best_dual is None else {"nonneg": best_dual[0]}, iterations=it,
        primal_residual=0.0, setup_time=setup, solve_time=time.perf_counter() - t0 - setup,
        history=history, info={"rho": rho, "bound_point": None if best_dual is None else best_dual[1]},
        state={"shape": (leaves.size, k), "z": z, "u": u, "rho": rho})


def _check_fixed_roots(forest: Forest, k: int, fixed: Invariant | None) -> list[Invariant]:
    if fixed is None:
        return []
    if not np.array_equal(fixed.E, np.eye(k)):
        raise ValueError("solve_nonneg: fixed_roots must fix whole histograms (E = I)")
    if np.any(forest.parent[fixed.nodes] >= 0):
        raise ValueError("solve_nonneg: fixed_roots must be roots")
    if np.any(fixed.e < 0):
        raise ValueError("solve_nonneg: a fixed root histogram is negative: no non-negative "
                         "leaves add up to it")
    return [fixed]


class _InvariantRepair:
    """Non-negative leaves -> a point meeting every invariant: for each group ``g`` of the
    partition the invariants' rows come from, the group totals are set top down (an invariant
    unit takes its value; the others share what their parent's total leaves after its
    invariant children, in proportion to their own totals, evenly when those are all zero),
    and each leaf's cells in ``g`` are scaled to its total (spread evenly if they are zero).
    Consistent by construction; exact on every invariant."""

    def __init__(self, forest: Forest, k: int, invs: Sequence[Invariant]) -> None:
        rows = np.vstack([inv.E for inv in invs])
        if not np.all((rows == 0) | (rows == 1)):
            raise ValueError("solve_nonneg: invariants must sum groups of cells (0/1 rows)")
        groups = np.unique(rows, axis=0)
        if np.any(groups.sum(axis=0) > 1):
            raise ValueError("solve_nonneg: the invariants' groups of cells must not overlap "
                             "(one partition: totals, one marginal's groups, or single cells)")
        self.forest, self.k, self.groups = forest, k, groups.astype(bool)
        self.target = np.full((forest.n, groups.shape[0]), np.nan)
        for inv in invs:
            gid = np.array([int(np.flatnonzero((groups == r).all(axis=1))[0]) for r in inv.E])
            if np.any(inv.e < 0):
                raise ValueError("solve_nonneg: an invariant is negative: no non-negative "
                                 "estimate meets it")
            self.target[inv.nodes[:, None], gid[None, :]] = inv.e

    def __call__(self, z: np.ndarray) -> np.ndarray:
        f = self.forest
        x = _aggregate(f, z, self.k)
        cur = x @ self.groups.T.astype(float)                    # (units, groups)
        want = np.where(np.isnan(self.target), cur, self.target)
        for d in range(1, f.n_levels):
            lo, hi = f.level_bounds[d], f.level_bounds[d + 1]
            parents_pos, starts, sizes = f.level_children(d)
            kids = f.order[lo:hi]
            fixed = ~np.isnan(self.target[kids])
            par = f.order[parents_pos]
            fixed_sum = np.add.reduceat(np.where(fixed, self.target[kids], 0.0), starts, axis=0)
            free_cur = np.add.reduceat(np.where(fixed, 0.0, cur[kids]), starts, axis=0)
            free_n = np.add.reduceat((~fixed).astype(float), starts, axis=0)
            left = want[par] - fixed_sum
            if np.any(left < -1e-9 * np.maximum(1.0, np.abs(want[par]))) or \
                    np.any((free_n == 0) & (np.abs(left) > 1e-9 * np.maximum(1.0, np.abs(want[par])))):
                raise ValueError("solve_nonneg: the invariants contradict each other (a unit's "
                                 "value is not what its children's add up to)")
            left = np.maximum(left, 0.0)
            rep = lambda a: np.repeat(a, sizes, axis=0)         # noqa: E731
            share = np.where(rep(free_cur) > 0, cur[kids] / np.where(rep(free_cur) > 0, rep(free_cur), 1.0),
                             1.0 / np.maximum(rep(free_n), 1.0))
            want[kids] = np.where(fixed, self.target[kids], rep(left) * share)
        leaves = f.leaves
        out = z.copy()
        for g, cells in enumerate(self.groups):
            have = cur[leaves, g]
            ratio = np.where(have > 0, want[leaves, g] / np.where(have > 0, have, 1.0), 0.0)
            even = np.where(have > 0, 0.0, want[leaves, g] / cells.sum())
            out[:, cells] = z[:, cells] * ratio[:, None] + even[:, None]
        return out


def _aggregate(forest: Forest, z: np.ndarray, k: int) -> np.ndarray:
    """The consistent tree of the leaves ``z`` (leaves in ascending index order)."""
    out = np.zeros((forest.n, k))
    out[forest.leaves] = z
    for d in range(forest.n_levels - 1, 0, -1):
        lo, hi = forest.level_bounds[d], forest.level_bounds[d + 1]
        parents, starts, _ = forest.level_children(d)
        out[forest.order[parents]] += np.add.reduceat(out[forest.order[lo:hi]], starts, axis=0)
    return out


def _bound(exact: TreeGLS, blocks: Sequence[Block], b0: np.ndarray, leaves: np.ndarray,
           lam: np.ndarray) -> tuple[float, np.ndarray]:
    """``min_{x consistent} f(x) - lam^T x_leaf`` (module docstring) and its minimiser."""
    b = b0.copy()
    b[leaves] += lam
    x = exact.solve(b)
    return objective(blocks, x) - float(np.sum(lam * x[leaves])), x
