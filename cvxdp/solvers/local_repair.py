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
  once the sweeps converge; the exact projection onto ``V_N`` then moves them by rounding
  only and :func:`mix` removes what that leaves below zero.  The loss moves by about the
  size of the negative part, not by ``s`` times the loss of ``U``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .region_graph import RegionGraph

__all__ = ["mix", "fit_margins", "MarginFitter"]

# proportional-fitting sweeps at most, and the relative marginal error that ends them
_SWEEPS = 200
_FIT_TOL = 1e-10
# sweeps between two convergence checks
_CHECK_EVERY = 5


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
    """The slot matrices of :func:`fit_margins` for one region graph (built once)."""

    def __init__(self, G: RegionGraph) -> None:
        self.G = G
        slot_rows: dict[int, list[np.ndarray]] = {}
        count = np.zeros(len(G.cliques), dtype=np.int64)
        for reg in G.regions:
            size = int(np.prod(reg.shape))
            for j, k in enumerate(reg.members):
                rows = np.arange(reg.rows.start + j * size, reg.rows.start + (j + 1) * size)
                slot_rows.setdefault(int(count[k]), []).append(rows)
                count[k] += 1
        self.slots = []
        for j in sorted(slot_rows):
            rows = np.concatenate(slot_rows[j])
            Mj = G.M[rows]
            touched = np.asarray(Mj.sum(axis=0)).ravel() > 0
            self.slots.append((rows, Mj.tocsr(), Mj.T.tocsr(), ~touched))

    def fit(self, x: np.ndarray, total: float | None) -> np.ndarray | None:
        """``x^+`` fitted to ``x``'s region marginals and total (module docstring), projected
        onto the consistent tables; ``None`` when the fit does not converge."""
        G = self.G
        T = total if total is not None else float(np.mean(G.totals(x)))
        if not T > 0:
            return None
        target = G.M @ x
        if np.any(target < 0):
            return None
        y = np.maximum(x, 0.0)
        scale = max(T, 1.0)
        sweep = 0
        for _ in range(_SWEEPS):
            for rows, Mj, MjT, untouched in self.slots:
                cur = Mj @ y
                t = target[rows]
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(cur > 0, t / cur, 1.0)
                y *= MjT @ ratio + untouched
            s = G.totals(y)
            y *= np.repeat(np.where(s > 0, T / np.where(s > 0, s, 1.0), 1.0), G.cells)
            sweep += 1
            if sweep % _CHECK_EVERY == 0 and \
                    float(np.max(np.abs(G.M @ y - target), initial=0.0)) <= _FIT_TOL * scale:
                break
        else:
            return None
        return mix(G, G.project(y, total), total)


def fit_margins(G: RegionGraph, x: np.ndarray, total: float | None) -> np.ndarray | None:
    """One-off :meth:`MarginFitter.fit`."""
    return MarginFitter(G).fit(x, total)
