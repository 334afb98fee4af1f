"""An exact finish for separable losses under order chains: PAVA on blocks, then multipliers.

Problem: ``min f(x)  s.t.  x[c_0] <= x[c_1] <= ...`` on disjoint chains, ``f`` separable
(``w1_i |x_i - y_i| + (w2_i / 2)(x_i - y_i)^2`` plus ``lower_i <= x_i <= upper_i``).  On a
chain an optimum is piecewise constant: blocks ``B`` of consecutive coordinates sharing
the value ``v_B = argmin_{l_B <= v <= u_B} sum_{i in B} f_i(v)`` (``l_B = max lower``,
``u_B = min upper``), the block values non-decreasing along the chain; the
pool-adjacent-violators algorithm with this exact block solver finds it for any
separable convex loss (Best & Chakravarti, Math. Programming 47, 1990).

ADMM's point is within ``eps`` of the optimum, so its blocks (runs of equal values of its
projection) are nearly right but its values are not, and then no multiplier fits the
subdifferential at it: there the order multipliers of a block are running sums of
``-g_i``, ``g_i in df_i(x_i)``, and they close (sum to zero) only at the block's exact
value.  :func:`exact_chain_point` pools the ADMM blocks to the exact optimum;
:func:`chain_multipliers` then finds ``lam = D^T o`` (``o >= 0``, zero between blocks) with
``-lam`` in the subdifferential, by :func:`cvxdp.solvers.consistency.isotonic.chain_dual`
on the blocks.
"""
from __future__ import annotations

import numpy as np

from .isotonic import Chains, chain_dual
from .losses import SeparableLoss

__all__ = ["exact_chain_point", "chain_multipliers", "block_argmin"]

# Up to this many coordinates the pooling is retried from single coordinates when the
# ADMM blocks were pooled too far (each merge re-solves a block: quadratic at worst).
_SINGLETON_RETRY_N = 5000


def block_argmin(y: np.ndarray, w1: np.ndarray, w2: np.ndarray, lo: float, hi: float,
                 fallback: float) -> float:
    """``argmin_{lo <= v <= hi} sum_i w1_i |v - y_i| + (w2_i / 2)(v - y_i)^2``, exactly.

    The derivative ``g(v) = W2 v - sum w2 y + sum w1 sign(v - y)`` is non-decreasing and
    piecewise linear with jumps ``2 w1`` at the data.  At the first datum ``p_k`` where the
    right derivative ``G+(p_k) >= 0``: if the left one ``G-(p_k) <= 0`` the minimiser is
    ``p_k``; otherwise it lies in the open piece before ``p_k``, where ``sum w1 sign`` is
    ``below_k - above_k`` and ``v = (sum w2 y - below_k + above_k) / W2``.  Clipping to
    ``[lo, hi]`` gives the bounded minimiser (1-D convex).  Without any weight every ``v`` is
    optimal: ``fallback`` clipped."""
    W2 = float(w2.sum())
    T = float(w1.sum())
    if W2 == 0.0 and T == 0.0:
        return float(min(max(fallback, lo), hi))
    S2 = float(w2 @ y)
    p, inv = np.unique(y, return_inverse=True)
    w1g = np.bincount(inv, weights=w1, minlength=p.size)
    below = np.r_[0.0, np.cumsum(w1g)[:-1]]                   # w1 strictly below p_k
    above = T - below - w1g                                   # w1 strictly above p_k
    g_minus = W2 * p - S2 + below - w1g - above
    g_plus = W2 * p - S2 + below + w1g - above
    k = int(np.searchsorted(g_plus >= 0.0, True)) if np.any(g_plus >= 0.0) else p.size
    if k < p.size and g_minus[k] <= 0.0:
        v = float(p[k])
    else:
        b = float(below[k]) if k < p.size else T
        v = (S2 - b + (T - b)) / W2 if W2 > 0 else float(p[min(k, p.size - 1)])
    return float(min(max(v, lo), hi))


def _pool_chain(f: SeparableLoss, c: np.ndarray, x: np.ndarray, starts: list[int]) -> np.ndarray:
    """The exact values on chain ``c`` by PAVA over the initial blocks ``starts`` (block
    start positions along the chain): a block is pooled with its predecessor while their
    exact values are out of order."""
    ends = starts[1:] + [c.size]
    stack: list[list] = []                   # [start, end, value]
    for s, e in zip(starts, ends):
        stack.append([s, e, _value(f, c[s:e], x)])
        while len(stack) >= 2 and stack[-2][2] > stack[-1][2]:
            top = stack.pop()
            stack[-1][1] = top[1]
            stack[-1][2] = _value(f, c[stack[-1][0]:top[1]], x)
    out = np.empty(c.size)
    for s, e, v in stack:
        out[s:e] = v
    return out


def _value(f: SeparableLoss, idx: np.ndarray, x: np.ndarray) -> float:
    """The exact block value of the coordinates ``idx`` (:func:`block_argmin`)."""
    return block_argmin(f.y[idx], f.w1[idx], f.w2[idx], float(np.max(f.lower[idx])),
                        float(np.min(f.upper[idx])), float(np.mean(x[idx])))


def exact_chain_point(f: SeparableLoss, chains: Chains, x: np.ndarray,
                      singletons: bool = False) -> np.ndarray:
    """The optimum of ``f`` under the chains, pooled from the blocks of ``x`` (runs of equal
    values along each chain; ``singletons``: from single coordinates, always exact).
    Coordinates outside every chain take their own minimiser, ``y`` clipped to the box."""
    out = np.clip(np.where(f.w1 + f.w2 > 0, f.y, x), f.lower, f.upper)
    for c in chains.chains:
        xc = x[c]
        starts = list(range(c.size)) if singletons else \
            np.flatnonzero(np.r_[True, xc[1:] != xc[:-1]]).tolist()
        out[c] = _pool_chain(f, c, x, starts)
    return out


def _block_chains(chains: Chains, x: np.ndarray) -> Chains:
    """The blocks of ``x`` (runs of equal values) on each chain, as chains of their own."""
    blocks = []
    for c in chains.chains:
        xc = x[c]
        cuts = np.flatnonzero(np.r_[True, xc[1:] != xc[:-1], True])
        blocks += [c[cuts[i]:cuts[i + 1]] for i in range(cuts.size - 1) if cuts[i + 1] - cuts[i] > 1]
    return Chains(blocks, chains.n)


def chain_multipliers(f: SeparableLoss, chains: Chains, x: np.ndarray, L: np.ndarray,
                      U: np.ndarray, lam_ref: np.ndarray) -> np.ndarray | None:
    """``lam`` in the polar cone of the chains with ``L <= lam <= U`` (``-lam`` in the
    subdifferential of ``f`` at ``x``) and complementary: ``lam = D^T o`` with ``o = 0`` on
    every edge between two blocks of ``x``, i.e. :func:`chain_dual` on the blocks (each
    block's running sums start and end at zero).  ``None`` if there is none (``x`` not
    optimal)."""
    return chain_dual(_block_chains(chains, x), L, U, lam_ref)


def polish_chain_point(f: SeparableLoss, chains: Chains, x: np.ndarray, lam_ref: np.ndarray,
                       box) -> tuple[np.ndarray, np.ndarray] | None:
    """``(x*, lam)``: the exact optimum pooled from ``x``'s blocks and its multiplier, retried
    from single coordinates on small problems when those blocks were pooled too far;
    ``box(x)`` gives the interval ``[L, U]`` of ``lam`` at a point.  ``None`` if neither
    certifies."""
    for singletons in (False, True):
        if singletons and x.size > _SINGLETON_RETRY_N:
            break
        xs = exact_chain_point(f, chains, x, singletons)
        L, U = box(xs)
        lam = chain_multipliers(f, chains, xs, L, U, lam_ref)
        if lam is not None:
            return xs, lam
    return None
