"""Benchmark: fitness-for-use (Xiao, He, Zhang, Kifer, VLDB 2021), cvxdp.NEWTON_CG against
standard solvers, the reference SM-II code and the paper's baselines, in one run.

Sections:

A. Prefix workloads d = 2 .. 128 (unit targets): our time, squared privacy cost and certified
   gap; Clarabel (one matrix_frac per query) and SCS (same model) where they finish.
B. Random-range workloads, 2d ranges, d = 64 .. 1024, unit and random targets: our time and cost,
   the reference SM-II (cmla-psu/matrixqueries) on the same workload when available, and the
   maximum variance ratio of input perturbation (IP), the hierarchical mechanism (HM) and the
   total-variance matrix mechanism (CA) at our privacy cost.
C. PL-94 (2 x 2 x 63 cells, sec. 7.3) and age pyramids (2 x 116 cells, sec. 7.6): the same.
   The age pyramid in two readings: the paper's text (ranges ``age <= a`` and the voting age
   ``age >= 18``) and its published script ``4_age.py`` (ranges ``age >= a``, which contain
   ``age >= 18``), each for males, females and both.
D. The paper's Tables 4 (PL-94) and 9 (age): its baselines were calibrated to its own SM-II's
   squared cost p', which its IP column gives exactly (IP's max ratio is widest query / p').
   At p': IP, HM on the paper's two-level tree (``workloads.sqrt_tree``), HM on the best
   k-ary tree, and CA, beside the paper's values.

HM columns: "HM" is least squares on the best complete k-ary tree (k = 2..16), "HMsq" on the
two-level tree of the paper's experiments.

The reference code is never part of this repository: point ``CVXDP_SMII_DIR`` at a checkout of
its ``SM-II`` folder (it needs ``np.int``, which the runner below supplies).  Without it, the
reference columns are left empty.

    python benchmarks/fitness.py                 # everything (tens of minutes)
    python benchmarks/fitness.py --quick         # minutes
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.solvers.fitness import newton_cg as N

W = cvxdp.workloads


def ours(Wd: np.ndarray, c: np.ndarray, eps: float = 1e-6):
    t0 = time.perf_counter()
    L, B = N.choose_basis(Wd)
    res = N.solve(N.FitnessData(B, L, c), N.NewtonSettings(eps_rel=eps, max_iters=2000))
    return time.perf_counter() - t0, res


def standard(Wd: np.ndarray, c: np.ndarray, solver: str, limit: float):
    m = cvxdp.fitness_problem(Wd, c)
    t0 = time.perf_counter()
    opts = {"time_limit": limit} if solver == cp.CLARABEL else {"time_limit_secs": limit, "eps": 1e-8}
    try:
        m.problem.solve(solver=solver, **opts)
    except (cp.error.SolverError, MemoryError) as exc:
        return time.perf_counter() - t0, math.nan, type(exc).__name__
    return time.perf_counter() - t0, m.problem.value, m.problem.status


_RUNNER = textwrap.dedent("""
    import sys, time, json, numpy as np
    np.int = int; np.float = float          # the reference predates numpy 1.24
    sys.path.insert(0, sys.argv[1])
    work = np.load(sys.argv[2]); bound = np.load(sys.argv[3])
    sys.argv = sys.argv[:1]
    from softmax import configuration, workload, matrix_query
    args = configuration(); args.init_mat = 'id_index'; args.maxitercg = 5
    n = work.shape[1]
    basis = workload(n); index = work @ np.linalg.inv(basis)
    t = time.time(); opt = matrix_query(args, basis, index, bound); opt.optimize()
    cov = opt.cov / np.max(opt.f_var / bound); X = np.linalg.inv(cov)
    cost = float(np.max(np.einsum('ij,ij->j', basis, X @ basis)))
    print(json.dumps({"time": time.time() - t, "cost": cost}))
""")


def reference(Wd: np.ndarray, c: np.ndarray, timeout: float):
    """The reference SM-II on the same workload (subprocess; None if unavailable)."""
    ref = os.environ.get("CVXDP_SMII_DIR")
    if not ref or not os.path.exists(os.path.join(ref, "softmax.py")):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        wpath, cpath, rpath = (os.path.join(tmp, f) for f in ("w.npy", "c.npy", "run.py"))
        np.save(wpath, Wd)
        np.save(cpath, c)
        with open(rpath, "w") as fh:
            fh.write(_RUNNER)
        try:
            out = subprocess.run([sys.executable, rpath, ref, wpath, cpath], capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"time": math.inf, "cost": math.nan}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def range_workload(d: int, seed: int = 0) -> np.ndarray:
    """2d random ranges [lo, hi] with endpoints uniform on the domain (sec. 7.4)."""
    rng = np.random.RandomState(seed)
    Wd = np.zeros((2 * d, d))
    for i in range(2 * d):
        a, b = rng.randint(d), rng.randint(d)
        Wd[i, min(a, b): max(a, b) + 1] = 1
    return Wd


def pl94() -> np.ndarray:
    dom = (2, 2, 63)
    return sp.vstack([W.marginal(dom, (0,)), W.marginal(dom, (1,)), W.marginal(dom, (2,)),
                      W.identity(252)]).toarray()


def age_pyramid() -> np.ndarray:
    """Prefix age ranges (0..a for every a) and the voting-age count (18+), for males, females
    and everybody, over 2 genders x 116 ages (sec. 7.6)."""
    ages = 116
    pre = np.tril(np.ones((ages, ages)))
    vote = np.zeros((1, ages))
    vote[0, 18:] = 1
    per_gender = np.vstack([pre, vote])
    blocks = [np.kron(np.array([[1.0, 0.0]]), per_gender), np.kron(np.array([[0.0, 1.0]]), per_gender),
              np.kron(np.array([[1.0, 1.0]]), per_gender)]
    return np.vstack(blocks)


def age_pyramid_script() -> np.ndarray:
    """The age-pyramid workload of the paper's published script (``4_age.py``): the ranges
    ``age >= a`` for every a (so ``age >= 18`` is one of them), for males, females and both."""
    ages = 116
    suffix = np.triu(np.ones((ages, ages)))
    return np.vstack([np.kron(np.eye(2), suffix), np.kron(np.ones((1, 2)), suffix)])


# Xiao et al. 2021, Table 4 (PL94 row) and Table 9 (AGE row), quoted
PAPER_TABLES = {"PL-94": {"IP": 36.56, "HM": 13.93, "CA": 3.99},
                "age (script)": {"IP": 32.49, "HM": 6.2, "CA": 1.58}}


def baselines(Wd, c, cost, skip_ca: bool):
    out = {}
    for meth in ("IP", "HM", "HMsq") + (() if skip_ca else ("CA",)):
        opts = dict(strategy=W.sqrt_tree(Wd.shape[1])) if meth == "HMsq" else {}
        try:
            v = cvxdp.fitness.baseline_variances(Wd, cost, meth[:2], c, **opts)
            out[meth] = float(np.max(v / c))
        except Exception as exc:      # a baseline that fails is reported, not fatal
            out[meth] = f"{type(exc).__name__}"
    return out


def fmt(v, spec=".2f"):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-d", type=int, help="largest range-workload d (default 1024; quick 256)")
    ap.add_argument("--ref-timeout", type=float, help="seconds per reference run (default 1800; quick 600)")
    ap.add_argument("--std-limit", type=float, help="Clarabel/SCS time limit in s (default 120; quick 30)")
    ap.add_argument("--ca-max-d", type=int, help="largest d for the CA baseline (default 256; quick 128)")
    ap.add_argument("--sections", default="ABCD", help="which sections to run (default ABCD)")
    args = ap.parse_args(argv)
    # --quick changes the defaults only: an option given explicitly wins
    defaults = dict(max_d=256, ref_timeout=600.0, std_limit=30.0, ca_max_d=128) if args.quick else \
        dict(max_d=1024, ref_timeout=1800.0, std_limit=120.0, ca_max_d=256)
    if not args.sections or set(args.sections) - set("ABCD"):
        ap.error(f"--sections takes letters from ABCD, got {args.sections!r}")
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    print(f"cvxdp {cvxdp.__version__}, cvxpy {cp.__version__}, numpy {np.__version__}; "
          f"reference SM-II: {os.environ.get('CVXDP_SMII_DIR') or 'not available'}\n")

    if "A" in args.sections:
        section_a(args)
    if "B" in args.sections:
        section_b(args)
    if "C" in args.sections or "D" in args.sections:
        section_cd(args)
    return 0


def section_a(args) -> None:
    print("A. Prefix workloads, unit targets: squared privacy cost and time")
    print(f"{'d':>5s} {'cost':>12s} {'cert gap':>9s} {'ours [s]':>9s} {'Clarabel':>12s} {'[s]':>7s} "
          f"{'SCS':>12s} {'[s]':>7s}")
    for d in (2, 4, 8, 16, 32, 64, 128):
        Wd = np.tril(np.ones((d, d)))
        c = np.ones(d)
        t, res = ours(Wd, c, eps=1e-8)
        tc, vc, _ = standard(Wd, c, cp.CLARABEL, args.std_limit) if d <= 32 else (math.nan, math.nan, "")
        ts, vs, _ = standard(Wd, c, cp.SCS, args.std_limit) if d <= 64 else (math.nan, math.nan, "")
        print(f"{d:>5d} {res.objective:>12.7f} {res.gap:>9.1e} {t:>9.2f} {fmt(vc, '.7f'):>12s} "
              f"{fmt(tc):>7s} {fmt(vs, '.7f'):>12s} {fmt(ts):>7s}", flush=True)


def section_b(args) -> None:
    print("\nB. Random ranges (2d queries): time, squared cost, max variance ratio of the baselines "
          "at our cost")
    print(f"{'d':>5s} {'targets':>8s} {'ours [s]':>9s} {'cost':>10s} {'gap':>8s} {'ref [s]':>9s} "
          f"{'ref cost':>10s} {'speed-up':>8s} {'IP':>7s} {'HM':>7s} {'HMsq':>7s} {'CA':>7s}")
    d = 64
    while d <= args.max_d:
        for targets in ("unit", "random"):
            Wd = range_workload(d, seed=0)
            c = np.ones(2 * d) if targets == "unit" else np.random.RandomState(1).uniform(1, 10, 2 * d)
            t, res = ours(Wd, c)
            ref = reference(Wd, c, args.ref_timeout) if targets == "unit" else None
            base = baselines(Wd, c, res.objective, skip_ca=d > args.ca_max_d)
            speed = ref["time"] / t if ref else math.nan
            print(f"{d:>5d} {targets:>8s} {t:>9.2f} {res.objective:>10.5f} {res.gap:>8.1e} "
                  f"{fmt(ref['time'] if ref else None):>9s} {fmt(ref['cost'] if ref else None, '.5f'):>10s} "
                  f"{fmt(speed, '.1f'):>8s} {fmt(base.get('IP')):>7s} {fmt(base.get('HM')):>7s} "
                  f"{fmt(base.get('HMsq')):>7s} {fmt(base.get('CA')):>7s}", flush=True)
        d *= 2


def section_cd(args) -> None:
    found = {}
    if "C" in args.sections:
        print("\nC. PL-94 and age pyramids (unit targets)")
    for name, Wd in (("PL-94", pl94()), ("age (text)", age_pyramid()),
                     ("age (script)", age_pyramid_script())):
        if "C" not in args.sections and name not in PAPER_TABLES:
            continue
        c = np.ones(Wd.shape[0])
        t, res = ours(Wd, c)
        found[name] = (Wd, res.objective, None)
        if "C" not in args.sections:
            continue
        ref = reference(Wd, c, args.ref_timeout)
        base = baselines(Wd, c, res.objective, skip_ca=False)
        found[name] = (Wd, res.objective, base)
        print(f"{name:>12s}: {Wd.shape[0]} queries on {Wd.shape[1]} cells; ours {t:.2f} s, squared "
              f"cost {res.objective:.5f} (gap {res.gap:.1e}); reference "
              f"{fmt(ref['time'] if ref else None)} s, cost {fmt(ref['cost'] if ref else None, '.5f')}; "
              f"max variance ratio at our cost: IP {fmt(base.get('IP'))}, HM {fmt(base.get('HM'))}, "
              f"HMsq {fmt(base.get('HMsq'))}, CA {fmt(base.get('CA'))}", flush=True)
    if "D" not in args.sections:
        return
    print("\nD. The paper's Tables 4 and 9 at the paper's squared cost p' = widest query / its IP "
          "ratio (this run -> paper)")
    for name, paper in PAPER_TABLES.items():
        Wd, p, base = found[name]
        p_paper = float(Wd.sum(axis=1).max()) / paper["IP"]
        if base is None:
            base = baselines(Wd, np.ones(Wd.shape[0]), p_paper, skip_ca=False)
        else:       # every baseline's variances scale like 1 / cost
            base = {k: v * p / p_paper if isinstance(v, float) else v for k, v in base.items()}
        print(f"{name:>12s}: p' = {p_paper:.5f} = {p_paper / p:.4f} x our certified optimum; "
              f"IP {fmt(base['IP'])} -> {paper['IP']}, HMsq {fmt(base['HMsq'])} -> {paper['HM']} "
              f"(HM best k-ary {fmt(base['HM'])}), CA {fmt(base['CA'], '.3f')} -> {paper['CA']}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
