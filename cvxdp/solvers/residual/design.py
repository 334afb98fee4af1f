"""The optimal noise design of a marginal workload: per-marginal variance targets at the least
privacy cost, certified.

Problem (ResidualPlanner, Xiao, Wang, Ding, Kifer, NeurIPS 2023, section 5; the residual form
of SM-II's Problem 1)::

    minimize    f(s) = sum_j p_j / s_j
    subject to  V s <= c,   s > 0,

with ``p >= 0``, ``V >= 0`` and ``c > 0`` (:mod:`.basis`: ``s_j`` the variance of residual
``j``, row ``i`` of ``V s`` the per-cell variance of marginal ``i``, ``c_i`` its target).

**Elimination.**  A column ``j`` with ``p_j > 0`` and a single nonzero, in row ``i``, is
*private* to that row (a maximal marginal's own residual).  Decreasing ``f`` wants ``s_j``
large, so row ``i`` is tight at the optimum, and its private columns share the slack
``r_i = c_i - sum_{j not private} V_ij s_j`` optimally: ``s_j = r_i sqrt(p_j / V_ij) /
sum_l sqrt(p_l V_il)``, worth ``w_i / r_i`` with ``w_i = (sum_j sqrt(p_j V_ij))^2``.  What is
left is a smooth convex problem in the other variances ``u``,

    F(u) = sum_j p_j / u_j + sum_{i eliminated} w_i / r_i(u)
           - mu sum_{i kept} log(c_i - (V u)_i),

whose last term, a log barrier with ``mu -> 0``, holds the rows that own no private column
(marginals inside others).  These rows are followed primal-dual (their multipliers ``z`` are
iterated with ``u``, Newton on ``grad F_0(u) + G^T z = 0``, ``z q = sigma mu``, ``q`` the
slacks): the step solves ``(H_0 + G^T diag(z / q) G) du = -(grad F_0 + sigma mu G^T (1 / q))``
with ``H_0 = diag(2 p / u^3) + A^T diag(2 w / r^3) A`` (``A``, ``G``: the eliminated and the
kept rows on ``u``), by conjugate gradients with the diagonal as preconditioner, never
forming the matrix.

**Certificate.**  For any ``lambda >= 0`` the Lagrange dual

    g(lambda) = 2 sum_j sqrt(p_j (V^T lambda)_j) - c^T lambda

bounds the optimum from below (``min_s p / s + a s = 2 sqrt(p a)``).  The iterate gives
``lambda_i = w_i / r_i^2`` (stationarity in the private columns) and ``z_i``; the solve stops
when ``(f - g) / f <= eps_rel``, and ``lambda`` are the duals of ``V s <= c``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .. import result as R
from .._table import IterationTable

__all__ = ["DesignSettings", "solve", "dual_value", "ROUTE"]

#: what :func:`solve` reports as ``info["route"]``
ROUTE = "residual Newton-CG"
# the centring parameter: each step aims at this fraction of the current complementarity
_SIGMA = 0.1
# fraction of the way to the boundary a step may go (keeps every variance and slack positive)
_TO_BOUNDARY = 0.99
_ARMIJO = 1e-4
_ROUNDOFF = 1e-15

_COLUMNS = [("iter", "d"), ("objective", ".8e"), ("lower bnd", ".8e"), ("rel gap", ".2e"),
            ("mu", ".2e"), ("cg iters", "d"), ("step", ".2e"), ("time [s]", ".2e")]


@dataclass
class DesignSettings:
    """Stopping rules (``eps_rel``: certified ``(f - g) / f``; ``eps_abs``: largest violation
    of a target allowed in the returned point) and the inner solver's limits."""

    max_iters: int = 200            # Newton steps in all
    eps_abs: float = 1e-9
    eps_rel: float = 1e-9
    time_limit: float = math.inf
    cg_max: int = 500               # conjugate-gradient steps per Newton step at most
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


def dual_value(p: np.ndarray, V: sp.csr_matrix, c: np.ndarray, lam: np.ndarray) -> float:
    """``g(lambda) = 2 sum_j sqrt(p_j (V^T lambda)_j) - c^T lambda`` (module docstring), a lower
    bound on the optimal cost for every ``lambda >= 0``."""
    a = V.T @ lam
    return float(2.0 * np.sum(np.sqrt(p * np.maximum(a, 0.0))) - c @ lam)


class _Reduced:
    """The problem after the elimination (module docstring): the private columns of each
    eliminated row, the remaining variances ``u`` and the kept rows."""

    def __init__(self, p: np.ndarray, V: sp.csr_matrix, c: np.ndarray) -> None:
        self.p, self.V, self.c = p, V, c
        csc = V.tocsc()
        nnz = np.diff(csc.indptr)
        private = (nnz == 1) & (p > 0)
        owner = np.full(V.shape[1], -1)
        owner[private] = csc.indices[csc.indptr[:-1][private]]
        self.private = np.flatnonzero(private)
        self.owner = owner[self.private]                       # each private column's row
        v_own = np.asarray(csc[:, self.private].sum(axis=0)).ravel()
        self.v_own = v_own
        root = np.sqrt(p[self.private] * v_own)
        self.sum_root = np.bincount(self.owner, weights=root, minlength=V.shape[0])
        self.elim = np.flatnonzero(self.sum_root > 0)
        self.kept = np.setdiff1d(np.arange(V.shape[0]), self.elim)
        self.w = self.sum_root[self.elim] ** 2
        self.free = np.flatnonzero((p > 0) & ~private)         # the variances u
        self.pu = p[self.free]
        self.A = V[self.elim][:, self.free].tocsr()
        self.G = V[self.kept][:, self.free].tocsr()
        self.AT, self.GT = self.A.T.tocsr(), self.G.T.tocsr()
        self.A2T = self.A.multiply(self.A).T.tocsr()
        self.G2T = self.G.multiply(self.G).T.tocsr()

    def start(self) -> np.ndarray:
        """A strictly feasible ``u``: every row's budget split equally over its entries, half
        of it used (so every slack is at least half its target)."""
        V = self.V[:, self.free].tocsc()
        counts = np.diff(self.V.tocsr().indptr).astype(float)
        share = self.c[V.indices] / (2.0 * counts[V.indices] * V.data)
        u = np.full(self.free.size, np.inf)
        np.minimum.at(u, np.repeat(np.arange(self.free.size), np.diff(V.indptr)), share)
        return u

    def slacks(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.c[self.elim] - self.A @ u, self.c[self.kept] - self.G @ u

    def feasible(self, u: np.ndarray) -> bool:
        r, q = self.slacks(u)
        return bool(np.all(u > 0) and np.all(r > 0) and np.all(q > 0))

    def phi(self, u: np.ndarray, mu: float) -> float:
        """``F(u)`` (``inf`` outside the domain)."""
        r, q = self.slacks(u)
        if not (np.all(u > 0) and np.all(r > 0) and np.all(q > 0)):
            return math.inf
        return float(np.sum(self.pu / u) + np.sum(self.w / r) - mu * np.sum(np.log(q)))

    def cost(self, u: np.ndarray) -> float:
        """``f(s)`` at the full point of ``u`` (the eliminated rows tight)."""
        r, _ = self.slacks(u)
        return float(np.sum(self.pu / u) + np.sum(self.w / r))

    def derivatives(self, u: np.ndarray, z: np.ndarray, mu: float):
        """At ``u``: the gradient of ``F_0 - mu sum log q`` and the product with, and the
        diagonal of, the primal-dual matrix ``H_0 + G^T diag(z / q) G`` (module docstring)."""
        r, q = self.slacks(u)
        w1, w2 = self.w / r ** 2, mu / q
        g = -self.pu / u ** 2 + self.AT @ w1 + self.GT @ w2
        d0, h1, h2 = 2.0 * self.pu / u ** 3, 2.0 * self.w / r ** 3, z / q
        diag = d0 + self.A2T @ h1 + self.G2T @ h2

        def hessp(v: np.ndarray) -> np.ndarray:
            return d0 * v + self.AT @ (h1 * (self.A @ v)) + self.GT @ (h2 * (self.G @ v))
        return g, hessp, diag

    def multipliers(self, u: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``lambda`` of every row: ``w_i / r_i^2`` where eliminated, ``z`` where kept."""
        r, _ = self.slacks(u)
        lam = np.zeros(self.V.shape[0])
        lam[self.elim] = self.w / r ** 2
        lam[self.kept] = z
        return lam

    def full(self, u: np.ndarray) -> np.ndarray:
        """``s``: ``u``, the private columns from their rows' slacks, ``1`` where ``p_j = 0``
        (a residual with no queries: its variance is never used)."""
        s = np.ones(self.p.size)
        s[self.free] = u
        r_all = np.zeros(self.V.shape[0])
        r_all[self.elim], _ = self.slacks(u)
        rows = self.owner
        s[self.private] = (r_all[rows] * np.sqrt(self.p[self.private] / self.v_own)
                           / self.sum_root[rows])
        return s


def solve(p, V, c, settings: DesignSettings | None = None, *,
          state: dict | None = None) -> R.SolverResult:
    """Solve the design problem of the module docstring; ``state`` (a previous result's, same
    sizes) warm-starts.  ``duals["variance"]`` holds the multipliers of ``V s <= c``."""
    s = settings or DesignSettings()
    t0 = time.perf_counter()
    p, V, c = _checked(p, V, c)
    bad = np.flatnonzero(c <= 0)
    if bad.size:
        return R.SolverResult(
            x=None, status=R.INFEASIBLE, objective=math.inf, setup_time=time.perf_counter() - t0,
            info={"route": ROUTE, "reason": f"target {bad[0]} is {c[bad[0]]:g}: a variance of "
                  f"a Gaussian answer cannot be at most 0", "certificate": int(bad[0])})
    red = _Reduced(p, V, c)
    start, warm = _warm(red, state)
    setup = time.perf_counter() - t0
    run = _Newton(red, s, t0)
    res = run.result(*run.iterate(start), setup)
    res.info["warm_start"] = warm
    return res


def _checked(p, V, c) -> tuple[np.ndarray, sp.csr_matrix, np.ndarray]:
    """Copies as float arrays; ``ValueError`` naming the argument for bad shapes, NaN or
    negative weights."""
    p = np.array(p, dtype=float).ravel()
    V = sp.csr_matrix(V, dtype=float, copy=True)
    c = np.array(c, dtype=float).ravel()
    if V.shape != (c.size, p.size):
        raise ValueError(f"design: V has shape {V.shape}; expected ({c.size}, {p.size}) from c "
                         f"and p")
    for name, arr in (("p", p), ("V", V.data), ("c", c)):
        if np.any(np.isnan(arr)) or (name != "c" and np.any(~np.isfinite(arr))):
            raise ValueError(f"design: {name} has NaN or inf entries")
        if np.any(arr < 0) and name != "c":
            raise ValueError(f"design: {name} has negative entries")
    zero = np.flatnonzero((p > 0) & (np.diff(V.tocsc().indptr) == 0))
    if zero.size:
        raise ValueError(f"design: residual {zero[0]} has a privacy weight but no variance "
                         f"coefficient (its optimum is unbounded: s -> inf)")
    return p, V, c


def _warm(red: _Reduced, state: dict | None) -> tuple[tuple[np.ndarray, np.ndarray], bool]:
    """``((u, z), warm)``: the starting ``u`` and kept rows' multipliers ``z``, the state's when
    they fit and are feasible (``warm``), else :meth:`_Reduced.start` and ``z`` centred
    (``z q`` equal, summing to ``f``)."""
    if state and state.get("n") == red.p.size and state.get("m") == red.c.size:
        u = np.asarray(state.get("u"), dtype=float)
        z = np.asarray(state.get("z"), dtype=float)
        if u.shape == red.free.shape and z.shape == red.kept.shape and red.feasible(u) \
                and np.all(z > 0):
            return (u, z), True
    u = red.start()
    _, q = red.slacks(u)
    return (u, red.cost(u) / max(red.kept.size, 1) / q), False


class _Newton:
    """The primal-dual Newton iteration (module docstring), stopped by the certified gap."""

    def __init__(self, red: _Reduced, s: DesignSettings, t0: float) -> None:
        self.red, self.s, self.t0 = red, s, t0
        self.table = IterationTable(_COLUMNS, s.verbose)
        self.history: list[dict] = []
        self.best: tuple[float, np.ndarray] | None = None      # (lower bound, lambda)
        self.cg_total = 0

    def iterate(self, start: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, str, int]:
        red, s = self.red, self.s
        u, z = start
        self.table.header(f"cvxdp residual design: {red.p.size} residuals ({red.free.size} after "
                          f"eliminating {red.private.size}), {red.c.size} targets "
                          f"({red.kept.size} followed primal-dual)")
        status, it = None, 0
        for it in range(1, s.max_iters + 1):
            u, z, step, cg = self.step(u, z)
            status = self.check(u, z, it, cg, step)
            if status is not None:
                break
        return u, z, status or R.OPTIMAL_INACCURATE, it

    def step(self, u: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int]:
        """One damped primal-dual Newton step: ``(u, z, primal step length, CG steps)``."""
        red = self.red
        _, q = red.slacks(u)
        # the target complementarity, floored where its whole barrier gap (rows x mu) is a
        # hundredth of the gap asked for: below that the slacks of the active rows underflow
        # and the step stalls, with nothing to gain
        floor = 0.01 * self.s.eps_rel * red.cost(u) / max(z.size, 1)
        mu = max(_SIGMA * float(z @ q) / z.size, floor) if z.size else 0.0
        g, hessp, diag = red.derivatives(u, z, mu)
        d, cg = _pcg(hessp, -g, 1.0 / diag, self.s.cg_max)
        self.cg_total += cg
        slope = float(g @ d)
        t = _to_boundary(red, u, d) if slope < 0 else 0.0
        f0 = red.phi(u, mu)
        # Armijo, with room for the roundoff of f itself (near the optimum the decrease is
        # below it, and a test without it rejects every step there)
        room = _ROUNDOFF * abs(f0)
        while t > 1e-16 and red.phi(u + t * d, mu) > f0 + _ARMIJO * t * slope + room:
            t /= 2.0
        t = t if t > 1e-16 else 0.0
        if z.size:
            Gd = red.G @ d
            dz = mu / q - z + z * Gd / q
            neg = dz < 0
            tz = min(1.0, _TO_BOUNDARY * float(np.min(-z[neg] / dz[neg]))) if np.any(neg) else 1.0
            z = z + tz * dz
        return u + t * d, z, t, cg

    def check(self, u: np.ndarray, z: np.ndarray, it: int, cg: int, step: float) -> str | None:
        red = self.red
        lam = red.multipliers(u, z)
        low = dual_value(red.p, red.V, red.c, lam)
        if self.best is None or low > self.best[0]:
            self.best = (low, lam)
        f = red.cost(u)
        _, q = red.slacks(u)
        row = {"iter": it, "objective": f, "lower bnd": self.best[0],
               "rel gap": (f - self.best[0]) / abs(f),
               "mu": float(z @ q) / z.size if z.size else 0.0, "cg iters": cg, "step": step,
               "time [s]": time.perf_counter() - self.t0}
        return R.record_check(row, self.history, self.table, self.s)

    def result(self, u: np.ndarray, z: np.ndarray, status: str, it: int,
               setup: float) -> R.SolverResult:
        red = self.red
        x = red.full(u)
        f = float(np.sum(red.p[red.p > 0] / x[red.p > 0]))
        low, lam = self.best
        viol = float(np.max(red.V @ x - red.c, initial=0.0))
        self.table.footer(f"status {status}: privacy cost {f:.10e}, certified lower bound "
                          f"{low:.10e}, {it} Newton steps, {self.cg_total} CG steps")
        return R.SolverResult(
            x=x, status=status, objective=f, lower_bound=low, gap=R.relative_gap(f, low),
            duals={"variance": lam}, iterations=it, primal_residual=viol, setup_time=setup,
            solve_time=time.perf_counter() - self.t0 - setup, history=self.history,
            info={"route": ROUTE, "eliminated": int(red.elim.size), "interior_rows":
                  int(red.kept.size), "reduced_variables": int(red.free.size),
                  "cg_iterations": self.cg_total,
                  "rel_gap": (f - low) / abs(f) if f else 0.0},
            state={"n": red.p.size, "m": red.c.size, "u": u.copy(), "z": z.copy()})


def _to_boundary(red: _Reduced, u: np.ndarray, d: np.ndarray) -> float:
    """The largest step in ``[0, 1]`` that keeps ``u``, the eliminated rows' slacks and the
    kept rows' slacks positive (``_TO_BOUNDARY`` of the way to the nearest boundary)."""
    r, q = red.slacks(u)
    dr, dq = -(red.A @ d), -(red.G @ d)
    t = 1.0
    for x, dx in ((u, d), (r, dr), (q, dq)):
        neg = dx < 0
        if np.any(neg):
            t = min(t, _TO_BOUNDARY * float(np.min(-x[neg] / dx[neg])))
    return t


def _pcg(hessp, b: np.ndarray, minv: np.ndarray, maxiter: int) -> tuple[np.ndarray, int]:
    """Preconditioned conjugate gradients for ``H x = b`` (``minv``: the inverse diagonal),
    stopped at a relative residual ``min(0.1, sqrt(|b|_M))`` of the forcing sequence's kind
    (inexact Newton: loose far from the optimum, tight near it)."""
    x = np.zeros_like(b)
    r = b.copy()
    z = minv * r
    d = z.copy()
    rz = float(r @ z)
    tol = min(0.1, math.sqrt(math.sqrt(rz))) * math.sqrt(rz)
    k = 0
    for k in range(1, maxiter + 1):
        Hd = hessp(d)
        dHd = float(d @ Hd)
        if not dHd > 0:
            break
        a = rz / dHd
        x += a * d
        r -= a * Hd
        z = minv * r
        rz_new = float(r @ z)
        if math.sqrt(max(rz_new, 0.0)) <= tol:
            break
        d = z + (rz_new / rz) * d
        rz = rz_new
    return x, k
