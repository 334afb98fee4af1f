"""Benchmark: the local polytope with unmeasured cliques (issue 13), cvxdp against Clarabel.

Adult, all 91 two-way marginals in the model, every ``--every``-th of them (default 9: 10
pairs) left unmeasured -- in the polytope, with no loss term -- and the rest measured with
Gaussian noise sigma 10 or Laplace noise of scale 10, known total (the instances
``2way-gauss10`` and ``2way-laplace10`` of ``benchmarks/local_polytope.py``, same seed).
Each unmeasured pair overlaps the others in two single attributes, so cvxdp eliminates it
before the solve (:mod:`cvxdp.solvers.local.reduce`) and fills it in after; the rest is the
all-measured problem its dual Newton solves.

Per instance and method, one line: wall time of ``prob.solve`` (cvxpy's compile included),
status, loss, the certified gap (cvxdp), the relative difference to Clarabel's loss, the
largest violation of the returned point in the whole polytope (``LocalPolytope.residual``
for cvxdp; the hand-written constraints' for Clarabel) and, for cvxdp, how many cliques were
eliminated and whether the duals were written.  Both methods run in this one process, one
after the other.

Usage: ``python benchmarks/local_unmeasured.py [--every 9] [--seed 0] [--only cvxdp,clarabel]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from local_polytope import load_adult, local_polytope_model, loss_value, make_instance  # noqa: E402

INSTANCES = ("2way-gauss10", "2way-laplace10")


def unmeasured(inst: dict, every: int) -> dict:
    """``inst`` with every ``every``-th clique's noisy answer dropped."""
    drop = set(inst["cliques"][every - 1::every])
    return {**inst, "noisy": {c: y for c, y in inst["noisy"].items() if c not in drop},
            "dropped": len(drop)}


def run(inst: dict, method: str) -> dict:
    import cvxpy as cp
    import cvxdp
    dom = cvxdp.Domain(inst["sizes"])
    t0 = time.perf_counter()
    prob, xs = local_polytope_model(dom, inst["cliques"], inst["noisy"], inst["scale"],
                                    inst["kind"], total=inst["n"], use_cvxdp=method == "cvxdp")
    if method == "cvxdp":
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-4)
    else:
        prob.solve(solver=cp.CLARABEL)
    wall = time.perf_counter() - t0
    mus = {c: np.asarray(x.value, dtype=float) for c, x in xs.items()}
    out = {"wall": wall, "status": prob.status,
           "loss": loss_value(mus, list(inst["noisy"]), inst["noisy"], inst["scale"], inst["kind"])}
    if method == "cvxdp":
        st = prob.solver_stats.extra_stats
        out.update(gap=st["gap"], eliminated=st["info"]["eliminated"],
                   duals=st["duals_certified"], violation=prob.constraints[0].residual)
    else:
        out["violation"] = max(float(np.max(c.violation(), initial=0.0)) for c in prob.constraints)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="cvxdp,clarabel")
    args = ap.parse_args()
    adult = load_adult()
    methods = args.only.split(",")
    print(f"{'instance':16s} {'method':9s} {'status':18s} {'wall s':>7s} {'loss':>13s} "
          f"{'gap':>8s} {'vs clar':>8s} {'viol':>8s}  notes", flush=True)
    for name in INSTANCES:
        inst = unmeasured(make_instance(name, adult, False, args.seed), args.every)
        ref = None
        for method in sorted(methods, key=lambda m: m != "clarabel"):
            r = run(inst, method)
            if method == "clarabel":
                ref = r["loss"]
            vs = f"{(r['loss'] - ref) / ref:8.1e}" if ref else f"{'n/a':>8s}"
            gap = f"{r['gap']:8.1e}" if "gap" in r else f"{'n/a':>8s}"
            notes = (f"{r['eliminated']} of {inst['dropped']} unmeasured cliques eliminated, duals "
                     f"{'written' if r['duals'] else 'not written'}" if method == "cvxdp"
                     else f"{len(inst['cliques'])} cliques, {inst['dropped']} unmeasured")
            print(f"{name:16s} {method:9s} {r['status']:18s} {r['wall']:7.1f} {r['loss']:13.6f} "
                  f"{gap} {vs} {r['violation']:8.1e}  {notes}", flush=True)


if __name__ == "__main__":
    main()
