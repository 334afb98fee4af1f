"""Probe: why the all-three-way Adult local polytope gets no certificate (issue 13's 3-way target).

The instance of ``benchmarks/local_polytope.py`` named ``3way-gauss10`` (all 364 three-way
marginals of Adult, 20.9 million cells, Gaussian noise sigma 10, known total), solved on arrays
(``cvxdp.solvers.local.admm``, no cvxpy) for ``--iters`` ADMM iterations; then, from the saved
iterates, each way of turning them into a point of the local polytope is timed and its loss
compared with the ADMM's dual lower bound:

    mix       the consistent iterate mixed with the uniform tables (the certificate's default)
    fit       proportional fitting of ``max(x, 0)`` to ``x``'s region marginals, projected, mixed
    altproj   ``--altproj`` rounds of alternating projection (orthant, consistent set), mixed
    polish    the face polish on the non-negative iterate's support (conjugate gradients)
    sets      the set-by-set repair (``cvxdp.solvers.local.repair.SetRepair``, now one of the
              ADMM's certificate points): the iterate in residual coordinates, each attribute
              set's own component mixed with a proportional fit of its table (every other
              table kept), then mixed
    seps      ``--separators`` semismooth Newton steps on the problem with the iterate's region
              marginals fixed (mixed with the uniform ones to be non-negative): given
              consistent separators the cliques decouple, and each is a three-way table with
              fixed two-way margins; its dual value is an *upper* bound on how good a point
              those separators allow (the restricted optimum), its minimiser is repaired
    masked    ``--masked`` steps of the dual Newton with every cell under a region cell whose
              iterate marginal is at most ``--mask-tau`` forced to zero (the rest of the
              problem as it is; its dual value is again the restricted problem's), then the
              dual at the final multiplier without the mask, and its minimiser repaired
              (projected and mixed; and on its face first)

Prints one line per ADMM check (residuals, time) and one per repair (time, loss, gap to the
bound).  About 10-15 minutes at the defaults on the 2-core machine.

Usage: ``python benchmarks/local_3way_repairs.py [--iters 100] [--altproj 50] [--separators 0]
[--masked 0] [--mask-tau 0.05]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from local_polytope import load_adult, make_instance  # noqa: E402

from cvxdp.solvers.local import admm as LA  # noqa: E402
from cvxdp.solvers.local import newton as LN  # noqa: E402
from cvxdp.solvers.local.polish import polish  # noqa: E402
from cvxdp.solvers.local.repair import MarginFitter, SetRepair, mix  # noqa: E402
from cvxdp.solvers.marginal.loss import LossTerm, MarginalLoss  # noqa: E402
from cvxdp.solvers.local.region_graph import RegionGraph  # noqa: E402


def build(seed: int):
    inst = make_instance("3way-gauss10", load_adult(), False, seed)
    names = inst["attrs"]
    sizes = [inst["sizes"][a] for a in names]
    cliques = [tuple(names.index(a) for a in c) for c in inst["cliques"]]
    G = RegionGraph(sizes, cliques)
    w = 1.0 / inst["scale"] ** 2
    terms = [LossTerm("l2", slice(int(G.offsets[i]), int(G.offsets[i + 1])), inst["noisy"][c], w)
             for i, c in enumerate(inst["cliques"])]
    return G, LA.LocalProblem(G, MarginalLoss(terms, G.n), inst["n"]), inst["n"]


def fixed_separators(G, x: np.ndarray, N: float) -> list[np.ndarray]:
    """The consistent region marginals of ``x`` mixed with the uniform ones (the least share
    making them non-negative)."""
    m = [r[0] for r in G.region_marginals(x)]
    U = [np.full(reg.shape, N / np.prod(reg.shape)) for reg in G.regions]
    s = max((float(np.max(-mi[mi < 0] / (ui[mi < 0] - mi[mi < 0])))
             for mi, ui in zip(m, U) if np.any(mi < 0)), default=0.0)
    print(f"separators mixed with the uniform ones: share {s:.2e}", flush=True)
    return [(1 - s) * mi + s * ui for mi, ui in zip(m, U)]


class _FixedDual(LN._Dual):
    """The dual of the problem with every member's region marginal fixed to ``m``: no
    projection (members' multipliers are free), gradient ``M t - m``."""

    def __init__(self, p, m: list[np.ndarray]) -> None:
        super().__init__(p)
        self.target = np.concatenate(
            [np.broadcast_to(mi, (r.members.size,) + r.shape).ravel() for r, mi in zip(self.G.regions, m)]
            + [np.full(len(self.G.cliques), float(p.total))])

    def project(self, z):
        return z

    def evaluate(self, z):
        s = self.cells_of(z)
        t = np.maximum(self.c - s * self.inv_A, 0.0)
        e = t - self.c
        g = float((self.half_A * e * e).sum()) + self.r_sum + float(s @ t) + self.p.cells.K \
            - float(z @ self.target)
        return g, t, self.rows_of(t) - self.target


def separator_newton(G, p, x: np.ndarray, N: float, steps: int, lb: float) -> None:
    """``steps`` damped semismooth Newton steps on the fixed-separator problem (the Newton of
    :mod:`cvxdp.solvers.local.newton` without the consensus projection), printing the dual
    value, the residual and every third step the repaired point's gap to ``lb``."""
    t0 = time.perf_counter()
    d = _FixedDual(p, fixed_separators(G, x, N))
    z = np.zeros(d.n_dual)
    g, t, grad = d.evaluate(z)
    boost = 0.0
    for k in range(steps):
        Ma = d.active_matrix(t)
        MaT = Ma.T.tocsr()
        gn = float(np.linalg.norm(grad))
        diag = LN._floored_diagonal(Ma)
        mu = max(boost, 1e-2 * min(1.0, gn))
        dirn, cg = LN._cg(lambda v: Ma @ (MaT @ v) + mu * diag * v, grad, 1.0 / ((1 + mu) * diag),
                          d, min(0.1, gn ** 0.5) * gn)
        slope, step = float(grad @ dirn), 1.0
        while True:
            new = d.evaluate(z + step * dirn)
            if new[0] >= g + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        boost = LN.damping(boost, step)
        res = float(np.abs(grad).max())
        z = z + step * dirn
        g, t, grad = new
        print(f"seps {k:3d} {time.perf_counter() - t0:6.1f} s  res {res:.2e}  active {Ma.shape[1]:,}  "
              f"CG {cg:3d}  step {step:.3g}  restricted dual {g:.7e}", flush=True)
        if k % 3 == 2:
            f = p.loss.value(mix(G, G.project(t, N), N))
            print(f"seps     repaired: loss {f:.7e}  gap {(f - lb) / f:.2e}", flush=True)


def zero_fibre_mask(G, x: np.ndarray, tau: float) -> np.ndarray:
    """``False`` on every cell under a region cell where ``x``'s (consistent) marginal is at
    most ``tau``."""
    ms = G.region_marginals(x)
    mask = np.ones(G.n, dtype=bool)
    for k, c in enumerate(G.cliques):
        blk = G.block(mask, k)
        for i, reg in enumerate(G.regions):
            if not set(reg.attrs) <= set(c):
                continue
            zero = ms[i][0] <= tau
            if zero.any():
                order = sorted(range(len(reg.attrs)), key=lambda j: c.index(reg.attrs[j]))
                shape = [G.sizes[a] if a in reg.attrs else 1 for a in c]
                blk &= ~np.broadcast_to(np.transpose(zero, order).reshape(shape), blk.shape)
    return mask


class _MaskedDual(LN._Dual):
    """The dual with the cells outside ``mask`` held at zero."""

    def __init__(self, p, mask: np.ndarray) -> None:
        super().__init__(p)
        self.mask = mask

    def evaluate(self, z):
        s = self.cells_of(z)
        x = np.maximum(self.c - s * self.inv_A, 0.0) * self.mask
        e = x - self.c
        tau = z[self.base[-1]:]
        N = float(self.p.total)
        g = float((self.half_A * e * e).sum()) + self.r_sum + float(s @ x) - N * float(tau.sum()) \
            + self.p.cells.K
        grad = self.rows_of(x)
        grad[self.base[-1]:] -= N
        return g, x, self.project(grad)


def masked_newton(G, p, x: np.ndarray, N: float, steps: int, tau: float, lb: float) -> None:
    """``steps`` Newton steps of :mod:`cvxdp.solvers.local.newton` on the masked dual, then
    the unmasked dual value at the final multiplier and the repaired minimisers' gaps."""
    t0 = time.perf_counter()
    mask = zero_fibre_mask(G, x, tau)
    print(f"masked: cells free {int(mask.sum()):,} of {G.n:,}", flush=True)
    d = _MaskedDual(p, mask)
    z = LN._start(d)
    g, t, grad = d.evaluate(z)
    boost = 0.0
    for k in range(steps):
        res = float(np.abs(grad).max())
        (z, g, t, grad), step, cg = LN._step(d, z, g, t, grad, boost)
        boost = LN.damping(boost, step)
        print(f"masked {k:3d} {time.perf_counter() - t0:6.1f} s  res {res:.2e}  active {int((t > 0).sum()):,}  "
              f"CG {cg:3d}  step {step:.3g}  restricted dual {g:.7e}", flush=True)
    full = LN._Dual(p).evaluate(z)[0]
    print(f"masked   the dual without the mask at the final multiplier: {full:.7e}", flush=True)
    for name, pt in (("mixed", t), ("face", LN._face_repair(d, t, grad))):
        f = p.loss.value(mix(G, G.project(pt, N), N))
        print(f"masked   repaired ({name}): loss {f:.7e}  gap {(f - lb) / f:.2e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--altproj", type=int, default=50)
    ap.add_argument("--separators", type=int, default=0)
    ap.add_argument("--masked", type=int, default=0)
    ap.add_argument("--mask-tau", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    G, p, N = build(args.seed)
    print(f"setup {time.perf_counter() - t0:.1f} s: {G.n:,} cells, {len(G.regions)} regions", flush=True)
    run = LA._Run(p, LA.LocalSettings(), None)
    t0 = time.perf_counter()
    for it in range(1, args.iters + 1):
        run.step()
        if it % 10 == 0:
            r_p, r_d, _, _ = run.residuals()
            print(f"iter {it:4d}  {time.perf_counter() - t0:6.1f} s  primal res {r_p:.2e}  dual res "
                  f"{r_d:.2e}  loss(x) {p.loss.value(run.x):.7e}  min x {run.x.min():.2e}", flush=True)
    raw = -run.rho * run.u
    t = time.perf_counter()
    lb = LA.lower_bound(p, LA._orthogonal(p, raw), [], N, N, raw=float(np.max(np.abs(raw))))
    print(f"lower bound {lb:.7e} ({time.perf_counter() - t:.1f} s)", flush=True)

    def report(name, t, pt):
        f = p.loss.value(pt)
        print(f"{name:8s} {time.perf_counter() - t:6.1f} s  loss {f:.7e}  gap {(f - lb) / f:.2e}", flush=True)

    if args.separators:
        separator_newton(G, p, run.x, N, args.separators, lb)
    if args.masked:
        masked_newton(G, p, run.x, N, args.masked, args.mask_tau, lb)
    t = time.perf_counter()
    report("mix", t, mix(G, run.x, N))
    t = time.perf_counter()
    report("fit", t, MarginFitter(G).fit(run.x, N))
    t = time.perf_counter()
    y = run.x.copy()
    for _ in range(args.altproj):
        y = G.project(np.maximum(y, 0.0), N)
    report("altproj", t, mix(G, y, N))
    t = time.perf_counter()
    out = polish(G, p.cells, run.nu, N)
    if out is None:
        print("polish   not applicable", flush=True)
    else:
        report("polish", t, mix(G, out[0], N))
    t = time.perf_counter()
    report("sets", t, SetRepair(G)(run.x, N))


if __name__ == "__main__":
    main()
