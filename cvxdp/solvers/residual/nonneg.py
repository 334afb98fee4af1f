"""The non-negative, consistent reconstruction of marginals from residual answers, certified.

Clique marginals ``mu_C`` agree on every shared attribute set exactly when they are built from
one set of *residual components* ``u_A`` (``A`` in the downward closure of the cliques,
``u_A`` in the range of ``P_A = (x)_{i in A} (I - 1 1^T / n_i)``, ``u_{}`` the total):

    mu_C = sum_{A in C} spread_C(u_A),     spread_C(u) = broadcast of u to C / prod_{i in C \\ A} n_i

(the orthogonal decomposition of a table; :mod:`.measure`).  In these coordinates the local
polytope of the cliques is ``{u : mu_C(u) >= 0 for every clique C}`` and the Gaussian
likelihood of residual answers (ReM, Mullins et al., NeurIPS 2024; GReM-LNN is this problem
solved by dual ascent without a certificate) is separable::

    minimize  f(u) = sum_A (w_A / 2) ||u_A - z_A||^2      subject to   B u >= 0,

``z_A = (x) Sub^+ y_A`` the answers of residual ``A`` in its own coordinates, ``w_A = 1 / s_A``,
``B`` the map ``u -> (mu_C)_C``.  Because the components of one clique are orthogonal,
``B^T B`` is diagonal in ``u``: ``d_A = sum_{C supset A} 1 / prod_{i in C \\ A} n_i``.  So an
ADMM on ``v = B u``, ``v >= 0`` has closed-form steps, each a few passes over the cells::

    u_A  = (w_A z_A + rho P_A B_A^T (v - lam / rho)) / (w_A + rho d_A)
    v    = max(0, B u + lam / rho),       lam += rho (B u - v)

**Certificate.**  For ``y >= 0``, ``min_u f(u) - y^T B u = -sum_A (||P_A B_A^T y||^2 / (2 w_A) +
(P_A B_A^T y)^T z_A)`` bounds the optimum from below (the ADMM gives ``y = max(0, -lam)``); a
feasible point comes from the iterate repaired set by set (:mod:`.repair`: each set's own
component mixed with a proportional fit of its table), then mixed with the uniform table
(``mu_C = N / cells``) just enough to be non-negative.  With the total known, ``u_{}`` is
held at it.  The minimiser of
that Lagrangian, ``u = z + P B^T y / w`` (``info["dual_components"]``), gives the local
polytope's multiplier in clique space: minus the loss's gradient there, whose Lagrangian bound
is at least this one (``B^T`` of that gradient is ``B^T y``, and ``y^T B t >= 0`` on the
polytope).
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import result as R
from .._table import IterationTable
from .repair import RepairSchedule, repair

__all__ = ["CliqueResiduals", "NonnegSettings", "solve", "ROUTE"]

#: what :func:`solve` reports as ``info["route"]``
ROUTE = "residual ADMM"
# conjugate-gradient steps of one polish (each two passes over the cells)
_POLISH_CG = 50
# the polish is tried only once the certified gap is below this (it costs about as much as
# 50 iterations and pays only near the end)
_POLISH_GAP = 1e-3
# the polish runs once fewer than this fraction of the cells changed between zero and not
# since the previous check (the face has settled)
_SETTLED = 1e-4
# residual balancing: rho changes when one residual is this many times the other
_BALANCE = 10.0
_RHO_RANGE = (1e-8, 1e8)
_COLUMNS = [("iter", "d"), ("objective", ".8e"), ("lower bnd", ".8e"), ("rel gap", ".2e"),
            ("pri res", ".2e"), ("rho", ".2e"), ("time [s]", ".2e")]


@dataclass
class NonnegSettings:
    """Stopping rules (``eps_rel``: the certified gap ``(f - L) / max(1, |f|)``; ``eps_abs``:
    the largest negative cell allowed) and the ADMM's parameters."""

    max_iters: int = 10000
    eps_abs: float = 1e-6
    eps_rel: float = 1e-6
    time_limit: float = math.inf
    rho: float | None = None
    alpha: float = 1.6
    check_every: int = 10
    adaptive_rho: bool = True        # residual balancing at every check
    polish: bool = True              # the face's least-squares point at every check (module)
    verbose: bool = False
    callback: Callable[[dict], bool] | None = None


class CliqueResiduals:
    """Cliques (attribute index tuples, ascending) over ``sizes`` and the residual sets of
    their downward closure (``residuals``, index tuples): the maps ``B`` (components -> clique
    tables) and ``B^T`` (tables -> components, projected on each component's range)."""

    def __init__(self, sizes, cliques, residuals) -> None:
        self.sizes = [int(n) for n in sizes]
        self.cliques = [tuple(int(a) for a in c) for c in cliques]
        self.residuals = [tuple(int(a) for a in A) for A in residuals]
        self.index = index = {A: j for j, A in enumerate(self.residuals)}
        self.shapes = [tuple(self.sizes[a] for a in A) for A in self.residuals]
        self.table_shapes = [tuple(self.sizes[a] for a in C) for C in self.cliques]
        self.parts: list[list[tuple[int, tuple[int, ...], float]]] = []
        self.d = np.zeros(len(self.residuals))
        for C in self.cliques:
            mine = []
            for r in range(len(C) + 1):
                for A in itertools.combinations(C, r):
                    if A not in index:
                        raise ValueError(f"residuals: the closure lacks {A}, a subset of clique {C}")
                    spread = float(np.prod([self.sizes[a] for a in C if a not in A]))
                    mine.append((index[A], tuple(C.index(a) for a in A), spread))
                    self.d[index[A]] += 1.0 / spread
            self.parts.append(mine)

    def center(self, j: int, T: np.ndarray) -> np.ndarray:
        """``P_A T``: the mean removed along every axis of residual ``j``."""
        for ax in range(T.ndim):
            T = T - T.mean(axis=ax, keepdims=True)
        return T

    def expand(self, u: list[np.ndarray]) -> list[np.ndarray]:
        """``B u``: every clique's table."""
        out = []
        for shape, mine in zip(self.table_shapes, self.parts):
            T = np.zeros(shape)
            for j, axes, spread in mine:
                view = [1] * len(shape)
                for ax, n in zip(axes, self.shapes[j]):
                    view[ax] = n
                T += np.reshape(u[j], view) / spread
            out.append(T)
        return out

    def contract(self, tables: list[np.ndarray]) -> list[np.ndarray]:
        """``P B^T x``: for every residual, the sum over the cliques holding it of the table's
        marginal on it divided by the spread, projected on the residual's range."""
        out = [np.zeros(s) for s in self.shapes]
        for T, mine in zip(tables, self.parts):
            for j, axes, spread in mine:
                drop = tuple(ax for ax in range(T.ndim) if ax not in axes)
                out[j] += (T.sum(axis=drop) if drop else T) / spread
        return [self.center(j, v) for j, v in enumerate(out)]

    def gradient_tables(self, g: list[np.ndarray], home: np.ndarray) -> list[np.ndarray]:
        """``M^T g`` with each residual's component read from its ``home`` clique: the
        gradient in clique space of a loss whose residual ``A`` reads ``P_A marg(mu_home)``."""
        out = [np.zeros(s) for s in self.table_shapes]
        for k, (shape, mine) in enumerate(zip(self.table_shapes, self.parts)):
            for j, axes, _ in mine:
                if home[j] != k:
                    continue
                view = [1] * len(shape)
                for ax, n in zip(axes, self.shapes[j]):
                    view[ax] = n
                out[k] = out[k] + np.reshape(g[j], view)
        return out


def solve(struct: CliqueResiduals, z: list[np.ndarray], w: np.ndarray, total: float | None,
          settings: NonnegSettings | None = None, *, state: dict | None = None) -> R.SolverResult:
    """The reconstruction of the module docstring: ``z`` the answers per residual (in its own
    coordinates: ``(x) Sub^+ y``), ``w = 1 / s`` their weights, ``total`` the known total or
    ``None`` (free, estimated with the rest).  ``x`` of the result: the cliques' tables,
    flat, C order, stacked; ``info["components"]`` the ``u_A``."""
    s = settings or NonnegSettings()
    t0 = time.perf_counter()
    run = _Run(struct, [np.asarray(a, dtype=float) for a in z], np.asarray(w, dtype=float),
               total, s, state)
    status, it = run.iterate(t0)
    return run.result(status, it, t0)


class _Run:
    def __init__(self, st: CliqueResiduals, z, w, total, s: NonnegSettings, state) -> None:
        self.st, self.z, self.w, self.total, self.s = st, z, w, total, s
        self.empty = st.residuals.index(())
        self.u = [zj.copy() for zj in z]
        if total is not None:
            self.u[self.empty] = np.asarray(float(total))
        self.u = [st.center(j, uj) if uj.ndim else uj for j, uj in enumerate(self.u)]
        v = st.expand(self.u)
        self.v = [np.maximum(t, 0.0) for t in v]
        self.lam = [np.zeros_like(t) for t in v]
        self.rho = s.rho or float(np.median(self.w / st.d))
        if state and _fits(state, self.v):
            self.u, self.v, self.lam, self.rho = state["u"], state["v"], state["lam"], state["rho"]
        self.best: tuple[float, list] | None = None
        self.lower = -math.inf
        self.dual_point: list | None = None      # the Lagrangian's minimiser at the best bound
        self.masks: list | None = None           # the cells held at zero at the last check
        self.history: list[dict] = []
        self.table = IterationTable(_COLUMNS, s.verbose)
        self.schedule = RepairSchedule(time.perf_counter(), s.time_limit)

    def objective(self, u) -> float:
        return float(sum(0.5 * wj * np.sum((uj - zj) ** 2) for uj, zj, wj in zip(u, self.z, self.w)))

    def step(self) -> tuple[float, float]:
        """One ADMM step; ``(primal residual, dual residual)`` (largest cell of ``B u - v``
        and of ``rho (v - v_previous)``)."""
        st, rho, a = self.st, self.rho, self.s.alpha
        target = st.contract([vk - lk / rho for vk, lk in zip(self.v, self.lam)])
        for j in range(len(self.u)):
            if j == self.empty and self.total is not None:
                continue
            self.u[j] = (self.w[j] * self.z[j] + rho * target[j]) / (self.w[j] + rho * st.d[j])
        Bu = st.expand(self.u)
        r_p = r_d = 0.0
        for k, T in enumerate(Bu):
            Th = a * T + (1 - a) * self.v[k]
            v_new = np.maximum(Th + self.lam[k] / rho, 0.0)
            self.lam[k] += rho * (Th - v_new)
            r_p = max(r_p, float(np.max(np.abs(T - v_new), initial=0.0)))
            r_d = max(r_d, rho * float(np.max(np.abs(v_new - self.v[k]), initial=0.0)))
            self.v[k] = v_new
        return r_p, r_d

    def adapt(self, r_p: float, r_d: float) -> None:
        """Residual balancing: ``rho`` doubles while the primal residual is ``_BALANCE``
        times the dual one, halves in the opposite case (``lam`` is kept unscaled, so nothing
        else changes)."""
        if r_p > _BALANCE * r_d and self.rho < _RHO_RANGE[1]:
            self.rho *= 2.0
        elif r_d > _BALANCE * r_p and self.rho > _RHO_RANGE[0]:
            self.rho /= 2.0

    def feasible(self, u: list[np.ndarray]) -> None:
        """``u`` mixed with the uniform table just enough to be non-negative (kept if best)."""
        N = float(u[self.empty]) if self.total is None else float(self.total)
        if N > 0:
            self.mix_uniform(u, N)

    def repair(self, it: int, final: bool = False) -> None:
        """The iterate repaired set by set (:mod:`.repair`), then mixed, when its
        :class:`~.repair.RepairSchedule` says so (the uniform mixture is tried at every
        check)."""
        N = float(self.u[self.empty]) if self.total is None else float(self.total)
        if not (N > 0 and self.schedule.due(it, final)):
            return
        started = time.perf_counter()
        self.mix_uniform(repair(self.st, self.u, N), N)
        self.schedule.done(it, started)

    def mix_uniform(self, u: list[np.ndarray], N: float) -> None:
        """``u`` mixed with the uniform table (``mu_C = N / cells``) just enough to be
        non-negative, kept if it is the best feasible point so far."""
        theta = 0.0
        for T in self.st.expand(u):
            neg = T < 0
            if np.any(neg):
                theta = max(theta, float(np.max(-T[neg] / (N / T.size - T[neg]))))
        point = [(1 - theta) * uj for uj in u]
        point[self.empty] = np.asarray(N)
        f = self.objective(point)
        if self.best is None or f < self.best[0]:
            self.best = (f, point)

    def certify(self, it: int) -> None:
        """The best feasible point (the iterate, the Lagrangian's minimiser and the polish,
        mixed; the iterate repaired when due) and the best dual bound (at ``y = max(0, -lam)``
        and the polish's ``y``)."""
        self.feasible(self.u)
        self.bound([np.maximum(-lk, 0.0) for lk in self.lam])
        if R.relative_gap(self.best[0] if self.best else math.inf, self.lower) > self.s.eps_rel:
            self.repair(it)
        masks = [vk <= 0 for vk in self.v]
        changed = sum(int(np.count_nonzero(a != b)) for a, b in zip(masks, self.masks)) \
            if self.masks is not None else len(masks)
        self.masks = masks
        cells = sum(mk.size for mk in masks)
        gap = R.relative_gap(self.best[0], self.lower) if self.best is not None else math.inf
        if self.s.polish and changed <= _SETTLED * cells and self.s.eps_rel < gap <= _POLISH_GAP:
            self.polish(masks)

    def bound(self, y_tables: list[np.ndarray]) -> None:
        """The Lagrange dual at ``y >= 0`` (cell multipliers of ``B u >= 0``) and its
        minimiser, which is also tried as a feasible point."""
        y = self.st.contract(y_tables)
        N = None if self.total is None else float(self.total)
        low, argmin = 0.0, []       # the minimiser: z + y / w, the total held where known
        for j, (yj, zj, wj) in enumerate(zip(y, self.z, self.w)):
            if j == self.empty and N is not None:
                low += 0.5 * wj * float((N - zj) ** 2) - float(yj) * N
                argmin.append(np.asarray(N))
            elif wj > 0:
                low -= float(np.sum(yj * yj)) / (2 * wj) + float(np.sum(yj * zj))
                argmin.append(zj + yj / wj)
            else:
                argmin.append(np.zeros_like(zj))
        if low > self.lower:
            self.lower, self.dual_point = low, argmin
        self.feasible(argmin)

    def polish(self, masks: list[np.ndarray]) -> None:
        """The least-squares point on the guessed face: ``min f(u)`` s.t. ``(B u)_S = 0`` for
        the cells ``S`` the ADMM holds at zero, by conjugate gradients on its multipliers
        (``u = z + P B_S^T eta / w``, ``B_S P W^{-1} B_S^T eta = -B_S z``); its point and
        ``max(0, eta)`` are tried for the certificate."""
        st, fixed = self.st, self.total is not None
        inv_w = np.where(self.w > 0, 1.0 / np.maximum(self.w, 1e-300), 0.0)
        if fixed:
            inv_w[self.empty] = 0.0
        base = [zj.copy() for zj in self.z]
        if fixed:
            base[self.empty] = np.asarray(float(self.total))

        def lift(eta):
            c = st.contract([np.where(mk, e, 0.0) for mk, e in zip(masks, eta)])
            return [cj * inv_w[j] for j, cj in enumerate(c)]

        def op(eta):
            return [np.where(mk, T, 0.0) for mk, T in zip(masks, st.expand(lift(eta)))]
        rhs = [-np.where(mk, T, 0.0) for mk, T in zip(masks, st.expand(base))]
        eta0 = [np.where(mk, np.maximum(-lk, 0.0), 0.0) for mk, lk in zip(masks, self.lam)]
        eta = _cg(op, rhs, eta0, _POLISH_CG)
        u = [bj + dj for bj, dj in zip(base, lift(eta))]
        self.feasible(u)
        self.bound([np.maximum(e, 0.0) for e in eta])

    def iterate(self, t0: float) -> tuple[str, int]:
        s = self.s
        st = self.st
        self.table.header(f"cvxdp residual ADMM: {len(st.cliques)} cliques, "
                          f"{sum(int(np.prod(x)) for x in st.table_shapes):,} cells, "
                          f"{len(st.residuals)} residuals")
        status, it, r_p = None, 0, math.nan
        for it in range(1, s.max_iters + 1):
            r_p, r_d = self.step()
            if it % s.check_every and it < s.max_iters:
                continue
            if s.adaptive_rho:
                self.adapt(r_p, r_d)
            self.certify(it)
            status = R.record_check(self.row(it, r_p, t0), self.history, self.table, s)
            if status is not None:
                break
        if status == R.OPTIMAL_INACCURATE or status is None:
            before = self.best[0] if self.best else None
            self.repair(it, final=True)      # the last iterate, repaired, may still certify
            row = self.row(it, r_p, t0)
            if self.best and self.best[0] != before:
                self.history.append(row)
                self.table.row(row)
            status = R.OPTIMAL if row["rel gap"] <= s.eps_rel else R.OPTIMAL_INACCURATE
        return status, it

    def row(self, it: int, r_p: float, t0: float) -> dict:
        f = self.best[0] if self.best else math.inf
        return {"iter": it, "objective": f, "lower bnd": self.lower,
                "rel gap": R.relative_gap(f, self.lower), "pri res": r_p, "rho": self.rho,
                "time [s]": time.perf_counter() - t0}

    def result(self, status: str, it: int, t0: float) -> R.SolverResult:
        if self.best is None:
            self.certify(it)
        f, u = self.best if self.best else (math.inf, self.u)
        tables = self.st.expand(u)
        x = np.concatenate([t.ravel() for t in tables])
        neg = float(np.max(-x, initial=0.0))
        self.table.footer(f"status {status}: objective {f:.10e}, lower bound {self.lower:.10e}, "
                          f"{it} iterations")
        return R.SolverResult(
            x=x, status=status, objective=f, lower_bound=self.lower,
            gap=R.relative_gap(f, self.lower), iterations=it, primal_residual=neg,
            solve_time=time.perf_counter() - t0, history=self.history,
            info={"route": ROUTE, "rho": self.rho, "components": u,
                  "total": float(u[self.empty]), "dual_components": self.dual_point},
            state={"u": [a.copy() for a in self.u], "v": [a.copy() for a in self.v],
                   "lam": [a.copy() for a in self.lam], "rho": self.rho})


def _cg(op, b: list[np.ndarray], x0: list[np.ndarray], steps: int) -> list[np.ndarray]:
    """Conjugate gradients on a list of arrays (the polish's multipliers, one per clique)."""
    def dot(a, c):
        return float(sum(np.sum(ai * ci) for ai, ci in zip(a, c)))
    x = [xi.copy() for xi in x0]
    r = [bi - ai for bi, ai in zip(b, op(x))]
    d = [ri.copy() for ri in r]
    rr = dot(r, r)
    tol = 1e-24 * max(dot(b, b), 1e-300)
    for _ in range(steps):
        if rr <= tol:
            break
        Ad = op(d)
        dAd = dot(d, Ad)
        if not dAd > 0:
            break
        a = rr / dAd
        x = [xi + a * di for xi, di in zip(x, d)]
        r = [ri - a * ai for ri, ai in zip(r, Ad)]
        rr_new = dot(r, r)
        d = [ri + (rr_new / rr) * di for ri, di in zip(r, d)]
        rr = rr_new
    return x


def _fits(state: dict, v: list[np.ndarray]) -> bool:
    return (isinstance(state.get("v"), list) and len(state["v"]) == len(v)
            and all(np.shape(a) == np.shape(b) for a, b in zip(state["v"], v)))
