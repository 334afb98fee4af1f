"""Points of the local polytope near a consistent table that has a few negative cells.

The ADMM's consistent iterate ``x`` (in ``V_N``: the tables agree on every region and sum to
``N``) converges to the optimum from outside the orthant: near the end it has many slightly
negative cells.  Two repairs make it a point of ``L(N)``:

* :func:`mix` -- ``(1 - s) x + s U`` with ``U`` the uniform tables and the least ``s`` making it
  non-negative.  Exact and cheap, but ``s`` is set by the worst cell relative to ``U``'s
  value there, which is small in large cliques: the loss can move a lot.
* :func:`fit_margins` -- iterative proportional fitting (Deming & Stephan 1940) of ``x^+ =
  max(x, 0)`` to ``x``'s own region marginals, which are consistent: each clique's table is
  scaled, region by region, to the target marginal on that region, all cliques at once (the
  ``j``-th region of every clique in one sparse product), then to the total.  Multiplicative
  updates keep zeros and signs, and the targets being consistent, the fitted tables agree
  once the sweeps converge; the exact projection onto ``V_N`` then moves them by what is left
  of the fitting error and :func:`mix` removes what that leaves below zero.  The loss moves by about the
  size of the negative part, not by ``s`` times the loss of ``U``.
* :class:`SetRepair` -- the residual family's set-by-set repair
  (:mod:`cvxdp.solvers.residual.repair`): ``x`` in residual coordinates (exact for consistent
  tables), each attribute set of the cliques' closure, smallest first, moves only its own
  component, toward a proportional fit of its table to its own lower marginals, which keeps
  every other table; then :func:`mix`.  Where the cliques overlap in more than single
  attributes (all three-way marginals) this is the repair that works: on Adult's 364 three-way
  marginals after 100 ADMM iterations its gap to the bound is 1.1e-3, against 0.74 for
  :func:`mix` and 0.96 for :func:`fit_margins` (``benchmarks/results/local_3way_repairs.txt``).
"""
from __future__ import annotations

import itertools

import numpy as np

from ..residual.nonneg import CliqueResiduals
from ..residual.repair import repair
from .region_graph import RegionGraph

__all__ = ["mix", "fit_margins", "MarginFitter", "SetRepair"]

# the set-by-set repair builds every table of the closure from its subsets' components: only
# up to this many sets (all three-way marginals of 100 attributes have 166,751)
_MAX_SETS = 200_000

# proportional-fitting sweeps at most, and the relative marginal error that ends them
_SWEEPS = 60
_FIT_TOL = 1e-10
# sweeps between two convergence checks
_CHECK_EVERY = 5
# the fitting stops when a check has not cut the marginal error below this fraction of the last
_STALL = 0.9


def mix(G: RegionGraph, x: np.ndarray, total: float | None) -> np.ndarray:
    """``(1 - s) x + s U`` with the least ``s`` making it non-negative: ``x`` consistent, ``U``
    the uniform tables with ``x``'s total (a free total that is not positive gives the zero
    tables)."""
    T = total if total is not None else float(np.mean(G.totals(x)))
    if not T > 0:
        return np.zeros(G.n)
    neg = x < 0
    if not np.any(neg):
        return x.copy()
    U = G.uniform(T)
    s = float(np.max(-x[neg] / (U[neg] - x[neg])))
    out = (1 - s) * x + s * U
    np.maximum(out, 0.0, out=out)            # rounding: -1e-17 cells
    return out


class MarginFitter:
    """:func:`fit_margins` for one region graph: each clique's regions in a fixed order."""

    def __init__(self, G: RegionGraph) -> None:
        self.G = G
        self.pairs = [p for reg in G.regions for p in reg.pairs]
        self.slots = self._slots() if G.matrix_mode else None

    def _slots(self) -> list:
        """With the stored marginalisers: the ``j``-th region of every clique in one sparse
        product (rows, matrix, transpose, cells no ``j``-th region touches)."""
        G = self.G
        slot_rows: dict[int, list[np.ndarray]] = {}
        count = np.zeros(len(G.cliques), dtype=np.int64)
        for i, reg in enumerate(G.regions):
            size = int(np.prod(reg.shape))
            start = G.region_rows(i).start
            for j, k in enumerate(reg.members):
                slot_rows.setdefault(int(count[k]), []).append(
                    np.arange(start + j * size, start + (j + 1) * size))
                count[k] += 1
        out = []
        for j in sorted(slot_rows):
            rows = np.concatenate(slot_rows[j])
            Mj = G.M[rows].tocsr()
            touched = np.asarray(Mj.sum(axis=0)).ravel() > 0
            out.append((rows, Mj, Mj.T.tocsr(), ~touched))
        return out

    def _sweep_matrix(self, y: np.ndarray, target: np.ndarray) -> None:
        for rows, Mj, MjT, untouched in self.slots:
            cur = Mj @ y
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(cur > 0, target[rows] / cur, 1.0)
            y *= MjT @ ratio + untouched

    def _sweep_blocks(self, y: np.ndarray, targets: list) -> None:
        G = self.G
        for p, t in zip(self.pairs, targets):
            cur = G.pair_marginal(y, p)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(cur > 0, t / cur, 1.0)
            G.block(y, p.k)[...] *= G.pair_spread(ratio, p)

    def _error(self, y: np.ndarray, targets) -> float:
        G = self.G
        if self.slots is not None:
            return float(np.max(np.abs(G.M @ y - targets), initial=0.0))
        return max((float(np.max(np.abs(G.pair_marginal(y, p) - t), initial=0.0))
                    for p, t in zip(self.pairs, targets)), default=0.0)

    def fit(self, x: np.ndarray, total: float | None) -> np.ndarray | None:
        """``x^+`` fitted to ``x``'s region marginals and total (module docstring) by at most
        ``_SWEEPS`` sweeps, projected onto the consistent tables and mixed into the polytope
        (``None`` for a total that is not positive)."""
        G = self.G
        T = total if total is not None else float(np.mean(G.totals(x)))
        if not T > 0:
            return None
        # a region marginal of x below zero cannot be met by a non-negative table: aim at
        # zero there (the targets are then only nearly consistent; the projection and the
        # mixing below absorb the difference)
        if self.slots is not None:
            targets = np.maximum(G.M @ x, 0.0)
        else:
            targets = [np.maximum(G.pair_marginal(x, p), 0.0) for p in self.pairs]
        y = np.maximum(x, 0.0)
        scale = max(T, 1.0)
        last = np.inf
        for sweep in range(1, _SWEEPS + 1):
            if self.slots is not None:
                self._sweep_matrix(y, targets)
            else:
                self._sweep_blocks(y, targets)
            s = G.totals(y)
            y *= np.repeat(np.where(s > 0, T / np.where(s > 0, s, 1.0), 1.0), G.cells)
            if sweep % _CHECK_EVERY == 0:
                err = self._error(y, targets)
                # stalled: the targets cannot be met with the zeros of x^+ (measured on Adult's
                # three-way cliques: the error sat at 90-280 counts from the fifth sweep on)
                if err <= _FIT_TOL * scale or err > _STALL * last:
                    break
                last = err
        self.sweeps = sweep
        return mix(G, G.project(y, total), total)


def fit_margins(G: RegionGraph, x: np.ndarray, total: float | None) -> np.ndarray | None:
    """One-off :meth:`MarginFitter.fit`."""
    return MarginFitter(G).fit(x, total)


class SetRepair:
    """:func:`repair` by sets (module docstring) for one region graph: the closure of its
    cliques, each clique's axes sorted (residual coordinates need one order per set)."""

    def __init__(self, G: RegionGraph) -> None:
        self.G = G
        self.cliques = [tuple(sorted(c)) for c in G.cliques]
        self.order = [np.argsort(c) for c in G.cliques]      # graph axes -> sorted axes
        closure = {A for C in self.cliques for r in range(len(C) + 1)
                   for A in itertools.combinations(C, r)} \
            if sum(2 ** len(C) for C in self.cliques) <= _MAX_SETS else None
        self.st = None if closure is None else CliqueResiduals(
            G.sizes, self.cliques, sorted(closure, key=lambda A: (len(A), A)))

    def __call__(self, x: np.ndarray, total: float | None) -> np.ndarray | None:
        """``x`` (consistent tables) repaired by sets, projected and mixed into the polytope
        (``None`` for a total that is not positive, or cliques too large for it)."""
        G, st = self.G, self.st
        T = total if total is not None else float(np.mean(G.totals(x)))
        if st is None or not T > 0:
            return None
        tables = [np.transpose(x[int(G.offsets[k]):int(G.offsets[k + 1])].reshape(shape), o)
                  for k, (shape, o) in enumerate(zip(G.shapes, self.order))]
        u = [cj / st.d[j] for j, cj in enumerate(st.contract(tables))]
        if total is not None:
            u[st.index[()]] = np.asarray(float(total))
        out = [np.transpose(t, np.argsort(o)).ravel()
               for t, o in zip(st.expand(repair(st, u, T)), self.order)]
        return mix(G, G.project(np.concatenate(out), total), total)
