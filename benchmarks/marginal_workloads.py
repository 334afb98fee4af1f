"""Marginal workloads in the residual basis: design, measure, reconstruct; cvxdp against
Clarabel and ResidualPlanner's published code, in one run.

* **design**: ``minimize privacy_cost(W, s)`` s.t. ``query_variance(W, s) <= c`` for all
  two-way and all three-way marginals of ``k`` attributes (sizes 2-100 drawn with a seed,
  per-marginal targets ``c`` uniform in [0.5, 2]): cvxdp end to end (workload, model,
  ``prob.solve(method="cvxdp")``), Clarabel's solve of the same cvxpy model (what cvxpy
  reports: compilation + solve), and ResidualPlanner's ``RPMaxVar`` (its coefficient build and
  its cvxpy solve) in its own environment (``benchmarks/_residualplanner_runner.py``;
  ``CVXDP_RP_PYTHON``, default ``/tmp/rp_env/bin/python``, and ``CVXDP_RP_SRC``, default
  ``/tmp/rp/src``).  Each run is a child process, so its peak memory is its own.
* **growth**: cvxdp's design time from 10 to 100 attributes (all three-way marginals).
* **non-negative reconstruction** on Adult (all two-way, then all three-way marginals, the
  design at 20 per cell): the LocalPolytope model with the residuals' likelihood by
  ``cvxdp.ADMM`` (residual coordinates), time to a certified gap, and the squared error of the
  workload against the unbiased reconstruction's.
* **measure + reconstruct** on the Adult data (``../shared/data/adult``; all 14 attributes,
  all 364 three-way marginals, targets uniform in [0.5, 2]): the design, the residual answers
  (numpy sampler) and the unbiased reconstruction of every workload marginal; time, peak
  memory, and the mean squared error of the reconstructed cells against the design's
  per-cell variance (over ``--draws`` draws).

Usage: ``python benchmarks/marginal_workloads.py [--fast] [--only design,growth,adult,nonneg]
[--out FILE]``.  ``--fast``: 30 attributes instead of 100, for a smoke run.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RP_PY = os.environ.get("CVXDP_RP_PYTHON", "/tmp/rp_env/bin/python")
RP_SRC = os.environ.get("CVXDP_RP_SRC", "/tmp/rp/src")
ADULT = Path(os.environ.get("CVXDP_ADULT_DIR", HERE.parent.parent / "shared" / "data" / "adult"))


def instance(k: int, r: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 101, k).tolist()
    cliques = list(itertools.combinations(range(k), r))
    targets = rng.uniform(0.5, 2.0, len(cliques))
    return sizes, cliques, targets


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------ child processes
def child_design(method: str, k: int, r: int) -> dict:
    import cvxpy as cp
    import cvxdp
    sizes, cliques, c = instance(k, r)
    t0 = time.perf_counter()
    W = cvxdp.workloads.marginal_workload(sizes, cliques)
    s = cp.Variable(W.n_residuals, pos=True)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c])
    t1 = time.perf_counter()
    if method == "cvxdp":
        prob.solve(method="cvxdp", eps_rel=1e-8)
        gap = prob.solver_stats.extra_stats["gap"]
        rel = prob.solver_stats.extra_stats["info"]["rel_gap"]
    else:
        prob.solve(solver=cp.CLARABEL)
        gap = rel = float("nan")
    t2 = time.perf_counter()
    viol = float(np.max((W.basis.V @ s.value - c) / c))
    return {"status": prob.status, "objective": float(prob.value), "build_time": t1 - t0,
            "solve_time": t2 - t1, "total_time": t2 - t0, "gap": gap, "rel_gap": rel,
            "max_violation": viol, "residuals": W.n_residuals, "marginals": len(cliques),
            "rss_peak_mb": rss_mb()}


def child_adult(draws: int) -> dict:
    import cvxpy as cp
    import cvxdp
    dom = cvxdp.Domain.from_json(ADULT / "adult-domain.json")
    import csv
    with open(ADULT / "adult.csv") as fh:
        rows = list(csv.reader(fh))
    header, data = rows[0], np.array(rows[1:], dtype=np.int64)
    data = data[:, [header.index(a) for a in dom.names]]
    cliques = list(itertools.combinations(dom.names, 3))
    c = np.random.default_rng(1).uniform(0.5, 2.0, len(cliques))
    t0 = time.perf_counter()
    W = cvxdp.workloads.marginal_workload(dom, cliques)
    s = cp.Variable(W.n_residuals, pos=True)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c])
    prob.solve(method="cvxdp", eps_rel=1e-8)
    t1 = time.perf_counter()
    truth = {q: dom.count(data, q) for q in cliques}
    t_measure, t_rec, ratios, means = [], [], [], []
    rng = np.random.default_rng(2)
    for _ in range(draws):
        a = time.perf_counter()
        m = cvxdp.mechanisms.residual_gaussian(W, s.value, data, rng=rng)
        b = time.perf_counter()
        out = cvxdp.reconstruct(W, m)
        est = {q: out[q] for q in cliques}
        t_measure.append(b - a)
        t_rec.append(time.perf_counter() - b)
        ratios.append([float(np.mean((est[q] - truth[q]) ** 2)) / out.variance(q) for q in cliques])
        means.append([float(np.mean(est[q] - truth[q])) for q in cliques])
    ratios = np.array(ratios).mean(axis=0)
    return {"status": prob.status, "design_time": t1 - t0, "measure_time": float(np.mean(t_measure)),
            "reconstruct_time": float(np.mean(t_rec)), "cells": int(sum(t.size for t in truth.values())),
            "residuals": W.n_residuals, "rho": m.rho, "mse_over_variance_min": float(ratios.min()),
            "mse_over_variance_max": float(ratios.max()), "mse_over_variance_mean": float(ratios.mean()),
            "mean_error_max": float(np.max(np.abs(np.mean(means, axis=0)))), "draws": draws,
            "rss_peak_mb": rss_mb()}


def _adult():
    import csv
    import cvxdp
    dom = cvxdp.Domain.from_json(ADULT / "adult-domain.json")
    with open(ADULT / "adult.csv") as fh:
        rows = list(csv.reader(fh))
    data = np.array(rows[1:], dtype=np.int64)[:, [rows[0].index(a) for a in dom.names]]
    return dom, data


def child_nonneg(r: int, target: float, eps_rel: float, time_limit: float) -> dict:
    """Adult, all ``r``-way marginals measured with the design at ``target`` per cell; the
    non-negative, consistent reconstruction (LocalPolytope with the residual likelihood) by
    cvxdp.ADMM, against the unbiased reconstruction's squared error."""
    import cvxpy as cp
    import cvxdp
    dom, data = _adult()
    cliques = list(itertools.combinations(dom.names, r))
    W = cvxdp.workloads.marginal_workload(dom, cliques)
    s = cp.Variable(W.n_residuals, pos=True)
    cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= target]
               ).solve(method="cvxdp")
    m = cvxdp.mechanisms.residual_gaussian(W, s.value, data, rng=0)
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    prob = cp.Problem(cp.Minimize(cvxdp.nll(m, mus)), [cvxdp.LocalPolytope(mus, dom, total=None)])
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=eps_rel, time_limit=time_limit)
    t1 = time.perf_counter()
    es = prob.solver_stats.extra_stats
    est = cvxdp.reconstruct(W, m)
    err_nn = err_ub = 0.0
    for q in cliques:
        truth = dom.count(data, q)
        err_nn += float(np.sum((mus[q].value - truth) ** 2))
        err_ub += float(np.sum((est[q] - truth) ** 2))
    return {"status": prob.status, "time": t1 - t0, "gap": es["gap"],
            "iterations": prob.solver_stats.num_iters, "duals_written": es["duals_certified"],
            "cells": int(sum(dom.size(q) for q in cliques)), "sq_error_nonneg": err_nn,
            "sq_error_unbiased": err_ub, "ratio": err_nn / err_ub, "rss_peak_mb": rss_mb()}


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True)
    if out.returncode != 0:
        return {"status": "error", "error": out.stderr[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_residualplanner(k: int, r: int, timeout: float) -> dict:
    if not (Path(RP_PY).exists() and Path(RP_SRC).exists()):
        return {"status": "missing", "error": f"no ResidualPlanner environment ({RP_PY}, {RP_SRC})"}
    sizes, cliques, c = instance(k, r)
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"src": RP_SRC, "sizes": sizes, "cliques": cliques,
                                    "targets": c.tolist()}))
        try:
            subprocess.run([RP_PY, str(HERE / "_residualplanner_runner.py"), str(spec), str(out)],
                           capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"over {timeout:.0f} s"}
        return json.loads(out.read_text()) if out.exists() else {"status": "error"}


# ------------------------------------------------------------------ report
def emit(fh, line: str = "") -> None:
    print(line)
    if fh is not None:
        fh.write(line + "\n")
        fh.flush()


def design_table(fh, k: int, timeout: float) -> None:
    emit(fh, f"## design: all two-way and three-way marginals of {k} attributes (sizes 2-100, "
             f"targets U[0.5, 2])")
    emit(fh, f"{'workload':>9} {'method':>16} {'status':>9} {'build s':>8} {'solve s':>8} "
             f"{'total s':>8} {'ratio':>7} {'objective':>16} {'rel gap':>9} {'viol':>9} {'MB':>6}")
    for r in (2, 3):
        ours = run_child("design", "cvxdp", str(k), str(r))
        rows = [("cvxdp NEWTON_CG", ours), ("Clarabel", run_child("design", "clarabel", str(k), str(r))),
                ("ResidualPlanner", run_residualplanner(k, r, timeout))]
        for name, res in rows:
            if res.get("status") in ("error", "missing", "timeout"):
                emit(fh, f"{r:>8}w {name:>16} {res['status']:>9}  {res.get('error', '')[:120]}")
                continue
            total = res.get("total_time", res.get("build_time", 0) + res.get("solve_time", 0))
            ratio = total / ours["total_time"] if ours.get("total_time") else float("nan")
            rel = (res["objective"] - ours["objective"]) / ours["objective"]
            emit(fh, f"{r:>8}w {name:>16} {res['status']:>9} {res['build_time']:8.2f} "
                     f"{res['solve_time']:8.2f} {total:8.2f} {ratio:6.1f}x {res['objective']:16.10g} "
                     f"{res.get('rel_gap', float('nan')):9.1e} {res['max_violation']:9.1e} "
                     f"{res['rss_peak_mb']:6.0f}" + ("" if name.startswith("cvxdp") else
                                                     f"   objective vs cvxdp {rel:+.1e}"))
    emit(fh)


def growth_table(fh, ks: list[int]) -> None:
    emit(fh, "## growth: cvxdp's design, all three-way marginals")
    emit(fh, f"{'k':>4} {'marginals':>10} {'residuals':>10} {'build s':>8} {'solve s':>8} "
             f"{'rel gap':>9} {'MB':>6}")
    for k in ks:
        res = run_child("design", "cvxdp", str(k), "3")
        emit(fh, f"{k:>4} {res['marginals']:>10,} {res['residuals']:>10,} {res['build_time']:8.2f} "
                 f"{res['solve_time']:8.2f} {res['rel_gap']:9.1e} {res['rss_peak_mb']:6.0f}")
    emit(fh)


def adult_table(fh, draws: int) -> None:
    emit(fh, "## Adult, all 364 three-way marginals: design, measure (numpy sampler), unbiased "
             "reconstruction")
    if not (ADULT / "adult.csv").exists():
        emit(fh, f"(no Adult data at {ADULT})")
        return
    res = run_child("adult", str(draws))
    emit(fh, json.dumps(res, indent=1))
    emit(fh)


def nonneg_table(fh, fast: bool, limit: float) -> None:
    emit(fh, "## Adult: the non-negative, consistent reconstruction (LocalPolytope, residual "
             "likelihood, cvxdp.ADMM), design at 20 per cell")
    if not (ADULT / "adult.csv").exists():
        emit(fh, f"(no Adult data at {ADULT})")
        return
    emit(fh, f"{'workload':>9} {'status':>18} {'time s':>8} {'iters':>6} {'gap':>9} {'cells':>11} "
             f"{'sq err nonneg / unbiased':>25} {'MB':>6}")
    for r, eps, t in ((2, 1e-6, 600.0), (3, 1e-6, limit))[: 1 if fast else 2]:
        res = run_child("nonneg", str(r), "20", str(eps), str(t))
        if res.get("status") == "error":
            emit(fh, f"{r:>8}w error {res.get('error', '')[:200]}")
            continue
        emit(fh, f"{r:>8}w {res['status']:>18} {res['time']:8.1f} {res['iterations']:>6} "
                 f"{res['gap']:9.1e} {res['cells']:>11,} {res['ratio']:25.3f} "
                 f"{res['rss_peak_mb']:6.0f}")
    emit(fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--only", default="design,growth,adult,nonneg")
    ap.add_argument("--nonneg-time", type=float, default=600.0,
                    help="time limit of the three-way non-negative reconstruction (s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--rp-timeout", type=float, default=900.0)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "design":
            res = child_design(rest[0], int(rest[1]), int(rest[2]))
        elif kind == "nonneg":
            res = child_nonneg(int(rest[0]), float(rest[1]), float(rest[2]), float(rest[3]))
        else:
            res = child_adult(int(rest[0]))
        print(json.dumps(res))
        return
    only = set(args.only.split(","))
    fh = open(args.out, "w") if args.out else None
    import cvxdp
    emit(fh, f"# benchmarks/marginal_workloads.py {'--fast ' if args.fast else ''}(cvxdp "
             f"{cvxdp.__version__}; {os.cpu_count()} cores)")
    k = 30 if args.fast else 100
    if "design" in only:
        design_table(fh, k, args.rp_timeout)
    if "growth" in only:
        growth_table(fh, [10, 20, 30] if args.fast else [10, 20, 50, 100])
    if "adult" in only:
        adult_table(fh, 1 if args.fast else args.draws)
    if "nonneg" in only:
        nonneg_table(fh, args.fast, args.nonneg_time)


if __name__ == "__main__":
    main()
