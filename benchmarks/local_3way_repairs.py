"""Probe: why the all-three-way Adult local polytope gets no certificate (issue 13's 3-way target).

The instance of ``benchmarks/local_polytope.py`` named ``3way-gauss10`` (all 364 three-way
marginals of Adult, 20.9 million cells, Gaussian noise sigma 10, known total), solved on arrays
(``cvxdp.solvers.local_admm``, no cvxpy) for ``--iters`` ADMM iterations; then, from the saved
iterates, each way of turning them into a point of the local polytope is timed and its loss
compared with the ADMM's dual lower bound:

    mix       the consistent iterate mixed with the uniform tables (the certificate's default)
    fit       proportional fitting of ``max(x, 0)`` to ``x``'s region marginals, projected, mixed
    altproj   ``--altproj`` rounds of alternating projection (orthant, consistent set), mixed
    polish    the face polish on the non-negative iterate's support (conjugate gradients)

Prints one line per ADMM check (residuals, time) and one per repair (time, loss, gap to the
bound).  About 10-15 minutes at the defaults on the 2-core machine.

Usage: ``python benchmarks/local_3way_repairs.py [--iters 100] [--altproj 50]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from local_polytope import load_adult, make_instance  # noqa: E402

from cvxdp.solvers import local_admm as LA  # noqa: E402
from cvxdp.solvers.local_polish import polish  # noqa: E402
from cvxdp.solvers.local_repair import MarginFitter, mix  # noqa: E402
from cvxdp.solvers.marginal_loss import LossTerm, MarginalLoss  # noqa: E402
from cvxdp.solvers.region_graph import RegionGraph  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--altproj", type=int, default=50)
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


if __name__ == "__main__":
    main()
