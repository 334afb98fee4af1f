"""Order constraints on disjoint chains and their projection by isotonic regression.

A chain ``c`` constrains ``x[c[0]] <= x[c[1]] <= ... <= x[c[-1]]`` (a sorted,
unattributed histogram or a degree sequence, Hay et al. VLDB 2010, sec. 4.1).
The Euclidean projection onto that cone is isotonic regression, computed by the
pool-adjacent-violators algorithm in O(length) (scipy's implementation of PAVA,
Busing 2022).
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

__all__ = ["Chains", "pava", "l1_isotonic", "chain_dual_lowest"]


def pava(v: np.ndarray, weights: np.ndarray | None = None, increasing: bool = True) -> np.ndarray:
    """Weighted isotonic regression ``argmin sum w (x - v)^2`` s.t. ``x`` monotone."""
    v = np.asarray(v, dtype=float)
    if v.size <= 1:
        return v.copy()
    return isotonic_regression(v, weights=weights, increasing=increasing).x


def l1_isotonic(y: np.ndarray, w: np.ndarray, segments: np.ndarray | None = None) -> np.ndarray:
    """Exact weighted L1 isotonic regression, ``argmin sum w |x - y|`` with ``x``
    non-decreasing within each segment (``segments``: start offsets of consecutive segments
    of ``y``; default one), by partitioning (Stout, "Isotonic regression via partitioning",
    Algorithmica 66, 2013): some optimum takes its values among the data's, and for two
    consecutive candidate values ``a < b`` the best non-decreasing ``{a, b}``-labelling of a
    segment -- a single switch point, found from prefix sums of ``w (|b - y| - |a - y|)`` --
    splits it into a part whose optimal values are ``<= a`` and one whose are ``>= b``.
    Halving the candidate range each time, every round is a few vectorised passes over all
    segments at once: ``O(n log n)``.  The switch is the first maximiser of the prefix sum
    (any optimal labelling gives a valid split)."""
    y = np.asarray(y, dtype=float)
    w = np.asarray(w, dtype=float)
    n = y.size
    x = np.empty(n)
    if n == 0:
        return x
    V = np.unique(y)
    starts = np.array([0] if segments is None else segments, dtype=np.int64)
    ends = np.r_[starts[1:], n]
    lo = np.zeros(starts.size, dtype=np.int64)
    hi = np.full(starts.size, V.size - 1, dtype=np.int64)
    keep = ends > starts
    starts, ends, lo, hi = starts[keep], ends[keep], lo[keep], hi[keep]
    while starts.size:
        done = lo == hi
        if done.any():
            ln = ends[done] - starts[done]
            at = np.repeat(starts[done] - np.r_[0, np.cumsum(ln)[:-1]], ln) + np.arange(ln.sum())
            x[at] = np.repeat(V[lo[done]], ln)
        starts, ends, lo, hi = starts[~done], ends[~done], lo[~done], hi[~done]
        if not starts.size:
            break
        s_new = _switch_points(y, w, V, starts, ends, (lo + hi) // 2)
        mid = (lo + hi) // 2
        left = s_new > starts
        right = s_new < ends
        starts = np.r_[starts[left], s_new[right]]
        ends = np.r_[s_new[left], ends[right]]
        lo, hi = np.r_[lo[left], mid[right] + 1], np.r_[mid[left], hi[right]]
        order = np.argsort(starts, kind="stable")
        starts, ends, lo, hi = starts[order], ends[order], lo[order], hi[order]
    return x


def _switch_points(y, w, V, starts, ends, mid):
    """Per segment, the switch ``s`` of the best labelling (``<= V[mid]`` before ``s``,
    ``>= V[mid + 1]`` from ``s`` on): the first maximiser over ``s in [start, end]`` of
    ``P(s) = sum_{start <= i < s} w_i (|b - y_i| - |a - y_i|)`` negated, i.e. of the
    savings of labelling the prefix low."""
    lengths = ends - starts
    idx = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths) + np.arange(lengths.sum())
    seg = np.repeat(np.arange(starts.size), lengths)
    a, b = V[mid][seg], V[mid + 1][seg]
    d = w[idx] * (np.abs(b - y[idx]) - np.abs(a - y[idx]))     # cost of high minus low
    c = np.cumsum(d)
    first = np.r_[0, np.cumsum(lengths)[:-1]]
    before = np.r_[0.0, c][first]
    P = c - np.repeat(before, lengths)                          # P(s) at s = position + 1
    # candidates s = start (P = 0) and s = start + 1 .. end (P above)
    best = np.maximum.reduceat(P, first)
    zero_better = best <= 0.0
    hit = P >= np.repeat(best, lengths)
    pos = np.where(hit, np.arange(P.size), P.size)
    arg = np.minimum.reduceat(pos, first) - first
    return np.where(zero_better, starts, starts + arg + 1)


class Chains:
    """Disjoint non-decreasing chains over the coordinates of ``x`` (length ``n``)."""

    def __init__(self, chains: list[np.ndarray], n: int) -> None:
        self.n = int(n)
        self.chains = [np.asarray(c, dtype=np.int64) for c in chains if len(c) > 1]
        if self.chains:
            allidx = np.concatenate(self.chains)
            if allidx.min() < 0 or allidx.max() >= n:
                raise ValueError("chain indices out of range")
            if np.unique(allidx).size != allidx.size:
                raise ValueError("chains must be disjoint")
        self.n_edges = sum(c.size - 1 for c in self.chains)

    @classmethod
    def from_edges(cls, lo: np.ndarray, hi: np.ndarray, n: int) -> "Chains | None":
        """Chains from edges ``x[lo[e]] <= x[hi[e]]``; ``None`` unless they form disjoint paths."""
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.asarray(hi, dtype=np.int64)
        if lo.size == 0:
            return cls([], n)
        if np.unique(lo).size != lo.size or np.unique(hi).size != hi.size or np.any(lo == hi):
            return None
        nxt = np.full(n, -1, dtype=np.int64)
        nxt[lo] = hi
        # List ranking by pointer doubling: p -> chain end, r -> distance to it.
        p = np.where(nxt >= 0, nxt, np.arange(n))
        r = (nxt >= 0).astype(np.int64)
        for _ in range(int(np.ceil(np.log2(max(n, 2)))) + 1):
            r = r + r[p]
            p = p[p]
        if np.any(nxt[p] >= 0):              # some walk never ended: a cycle
            return None
        members = np.union1d(lo, hi)
        key = np.lexsort((-r[members], p[members]))
        members = members[key]
        ends = p[members]
        cuts = np.flatnonzero(np.r_[True, ends[1:] != ends[:-1], True])
        chains = [members[cuts[i]:cuts[i + 1]] for i in range(cuts.size - 1)]
        return cls(chains, n)

    def project(self, v: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Euclidean (or weighted) projection onto the chains' order cone."""
        x = np.array(v, dtype=float, copy=True)
        for c in self.chains:
            w = None if weights is None else weights[c]
            x[c] = pava(x[c], w)
        return x

    def violation(self, x: np.ndarray) -> float:
        """``max_e (x[lo_e] - x[hi_e])_+``."""
        worst = 0.0
        for c in self.chains:
            d = x[c[:-1]] - x[c[1:]]
            if d.size:
                worst = max(worst, float(d.max()))
        return worst

    def multipliers(self, g: np.ndarray) -> list[np.ndarray]:
        """Edge multipliers ``o`` with ``D^T o = g`` per chain, where edge ``j`` is
        ``x[c_j] - x[c_{j+1}] <= 0``: ``(D^T o)_{c_j} = o_j - o_{j-1}`` gives the
        running sums ``o_j = sum_{i <= j} g[c_i]``."""
        return [np.cumsum(g[c])[:-1] for c in self.chains]


def chain_dual(chains: Chains, L: np.ndarray, U: np.ndarray, lam_ref: np.ndarray) -> np.ndarray | None:
    """A multiplier ``lam`` in the polar cone of the chains' order cone with
    ``L <= lam <= U``, close to ``lam_ref`` (used to certify duality gaps).

    On a chain ``c``, ``lam = D^T o`` with ``o >= 0``: ``lam[c_1] = o_1``,
    ``lam[c_j] = o_j - o_{j-1}``, ``lam[c_n] = -o_{n-1}`` (``o_0 = o_n = 0``).  Backwards,
    each ``o_j`` gets the interval that the rest of the chain allows; forwards, each
    is set to the value in its interval closest to the prefix sum of ``lam_ref``.
    Coordinates outside every chain get 0.  Returns None if no such ``lam`` exists.
    """
    lam = np.zeros(chains.n)
    span = float(np.max(np.abs(np.r_[L[np.isfinite(L)], U[np.isfinite(U)]]), initial=1.0))
    slack = 1e-9 * span
    for c in chains.chains:
        k = c.size
        Lc, Uc = L[c], U[c]
        oref = np.cumsum(lam_ref[c])
        lo = np.empty(k + 1)
        hi = np.empty(k + 1)
        lo[k], hi[k] = 0.0, 0.0                       # o_n = 0
        for j in range(k, 0, -1):                     # o_{j-1} = o_j - lam[c_j]
            lo[j - 1] = max(lo[j] - Uc[j - 1], 0.0)
            hi[j - 1] = hi[j] - Lc[j - 1]
            if lo[j - 1] > hi[j - 1] + slack:
                return None
        if lo[0] > slack:                             # o_0 = 0 must be allowed
            return None
        o_prev = 0.0
        out = np.empty(k)
        for j in range(1, k + 1):
            a = max(lo[j], o_prev + Lc[j - 1])
            b = min(hi[j], o_prev + Uc[j - 1])
            if b < a:
                b = a                                 # within slack
            o_j = 0.0 if j == k else min(max(oref[j - 1], a), b)
            out[j - 1] = o_j - o_prev
            o_prev = o_j
        lam[c] = out
    return lam


def chain_dual_lowest(chains: Chains, L: np.ndarray, U: np.ndarray) -> np.ndarray | None:
    """:func:`chain_dual` without a reference point, vectorised: on each chain the lowest
    running sums ``o_j`` the box allows.  The backward bounds are closed forms -- ``hi`` a
    reverse cumulative sum of ``-L``, ``lo`` the Lindley recursion
    ``lo_{j-1} = max(lo_j - U_{j-1}, 0)``, i.e. ``lo_j = max(0, R_j - min_{t > j} R_t)`` with
    ``R`` the reverse cumulative sum of ``-U`` -- and the forward choice
    ``o_j = max(lo_j, o_{j-1} + L_{j-1})`` is a running maximum of ``lo_t - CL_t`` shifted by
    ``CL_j``, ``CL`` the cumulative sum of ``L``.  ``None`` if no multiplier fits the box."""
    lam = np.zeros(chains.n)
    span = float(np.max(np.abs(np.r_[L[np.isfinite(L)], U[np.isfinite(U)]]), initial=1.0))
    slack = 1e-9 * span
    for c in chains.chains:
        Lc, Uc = L[c], U[c]
        # an infinite side of the box (a bound's multiplier can absorb anything) acts like one
        # larger than every finite sum: it resets lo to 0 and puts hi out of reach
        fin = np.r_[Lc[np.isfinite(Lc)], Uc[np.isfinite(Uc)]]
        big = 2.0 * (1.0 + float(np.abs(fin).sum()))
        Lc = np.where(np.isfinite(Lc), Lc, -big)
        Uc = np.where(np.isfinite(Uc), Uc, big)
        R = np.r_[np.cumsum((-Uc)[::-1])[::-1], 0.0]            # R_j, j = 0 .. k
        tail_min = np.minimum.accumulate(R[::-1])[::-1]          # min_{t >= j} R_t
        lo = np.maximum(0.0, R[:-1] - tail_min[1:])              # j = 0 .. k-1
        hi = np.cumsum((-Lc)[::-1])[::-1]                        # j = 0 .. k-1
        if np.any(lo > hi + slack) or lo[0] > slack:
            return None
        CL = np.r_[0.0, np.cumsum(Lc)[:-1]]                      # CL_j, j = 0 .. k-1
        start = lo.copy()
        start[0] = 0.0                                           # o_0 = 0
        o = CL + np.maximum.accumulate(start - CL)
        o = np.r_[o, 0.0]                                        # o_k = 0
        lam[c] = np.diff(o)
    return lam
