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
* **grem** (rows of the nonneg table): GReM-LNN (Mullins et al., NeurIPS 2024; the published code
  of bcmullins/efficient-marginal-reconstruction, package ``rem``) on the same draw, in its own
  environment (``benchmarks/_grem_residual_runner.py``; ``CVXDP_GREM_PYTHON``, default
  ``/tmp/grem_env/bin/python``, set up as ``benchmarks/_grem_runner.py`` says; absent: one
  line and no GReM rows).  Its input is cvxdp's residual answers in ``rem``'s residual basis
  with ``sigma_A = sqrt(s_A)`` (``grem_spec``).  Variants: ``published``, ``gremLNN`` as the
  repository's demo calls it (its dual ascent weights residual ``A`` by ``4^-|A|`` and does not
  read the scales it is given), and ``true-sigma``, the same solver with the measurement's
  scales, whose problem is cvxdp's.  Before the table, a check on five small attributes:
  GReM-MLE from these inputs equals ``cvxdp.reconstruct`` to float32, and GReM-LNN true-sigma
  run to its own stopping rule reaches cvxdp's certified optimum.  Reported beside cvxdp: wall
  time (its set-up, dual ascent and marginals; torch, one thread, float32), its peak RSS, rounds,
  ``nll`` (cvxdp's likelihood at its marginals), squared error over the unbiased one's, min cell
  and negative mass, and its own stopping quantities (negative mass, ``lambda . mu``); it has no
  certificate.  Its round limits (``--grem-rounds``, default ``2:301,3:10``) keep each run near
  15-20 minutes: 3-4 s a round on the two-way workload (round 300 is its first stopping test),
  45-65 s a round and 8 GB on the three-way one, plus about 6 minutes to form its marginals
  (its published limit, 4001 rounds, would be two to three days).
* **measure + reconstruct** on the Adult data (``../shared/data/adult``; all 14 attributes,
  all 364 three-way marginals, targets uniform in [0.5, 2]): the design, the residual answers
  (numpy sampler) and the unbiased reconstruction of every workload marginal; time, peak
  memory, and the mean squared error of the reconstructed cells against the design's
  per-cell variance (over ``--draws`` draws).

Usage: ``python benchmarks/marginal_workloads.py [--fast] [--only design,growth,adult,nonneg,grem]
[--out FILE]``.  ``--fast``: 30 attributes instead of 100, for a smoke run (the nonneg section:
two-way only, GReM-LNN 20 rounds).  ``--only grem`` runs the nonneg table with GReM's rows
(about an hour: two 16-minute two-way runs, a 15-minute three-way run, cvxdp's ten minutes).
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
GREM_PY = os.environ.get("CVXDP_GREM_PYTHON", "/tmp/grem_env/bin/python")


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


def nonneg_instance(r: int, target: float, attrs: tuple[str, ...] | None = None):
    """Adult (or its attributes ``attrs``), all ``r``-way marginals, the design at ``target``
    per cell and its residual answers (numpy sampler, seed 0): the draw every reconstruction
    of the nonneg section is given."""
    import cvxpy as cp
    import cvxdp
    dom, data = _adult()
    if attrs:
        data = data[:, [dom.index(a) for a in attrs]]
        dom = dom.project(attrs)
    cliques = list(itertools.combinations(dom.names, r))
    W = cvxdp.workloads.marginal_workload(dom, cliques)
    s = cp.Variable(W.n_residuals, pos=True)
    cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= target]
               ).solve(method="cvxdp")
    m = cvxdp.mechanisms.residual_gaussian(W, s.value, data, rng=0)
    return dom, data, cliques, W, m


def child_nonneg(r: int, target: float, eps_rel: float, time_limit: float) -> dict:
    """Adult, all ``r``-way marginals measured with the design at ``target`` per cell; the
    non-negative, consistent reconstruction (LocalPolytope with the residual likelihood) by
    cvxdp.ADMM, against the unbiased reconstruction's squared error."""
    import cvxpy as cp
    import cvxdp
    dom, data, cliques, W, m = nonneg_instance(r, target)
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
            "sq_error_unbiased": err_ub, "ratio": err_nn / err_ub, "objective": float(prob.value),
            "min_cell": float(min(mus[q].value.min() for q in cliques)),
            "neg_mass": float(sum(np.minimum(mus[q].value, 0).sum() for q in cliques)),
            "rss_peak_mb": rss_mb()}


# ------------------------------------------------------------------ GReM-LNN on the same draw
def grem_spec(W, m, path, **extra) -> None:
    """The spec of ``_grem_residual_runner.py``: every residual's answer in ``rem``'s residual
    basis with its noise scale, from cvxdp's measurement (option (a) of issue 25).

    cvxdp releases ``y_A = (x) Sub (m_A + e)``, ``e ~ N(0, s_A)`` on every cell, and keeps
    ``z_A = (x) Sub^+ y_A = P_A (m_A + e)`` (``ResidualMeasurement.components``; ``P_A`` centres
    every axis).  ``rem``'s residual ``A`` (``ResidualWorkload2``) is ``(x) D`` on the marginal,
    ``D`` the contrast rows ``e_i - e_{i+1}`` (``D 1 = 0``, so ``D P = D``), and it models its
    answer as ``D_A (m_A + e)``, ``e ~ N(0, sigma_A^2 I)``.  So ``D_A z_A = D_A (m_A + e)`` is
    exactly the release ``rem`` expects, with ``sigma_A = sqrt(s_A)``: the same numbers and the
    same noise law (``y_A`` and ``D_A z_A`` are invertible maps of each other on the residual's
    space; the total is passed as it is).  Option (b) (the unbiased marginals through ``rem``'s
    ``decomposeIntoResiduals``) would hand it the same answers but one copy of ``A`` per workload
    marginal holding it, with scales of noisy marginals that were never released: GReM-LNN would
    then count the lower-order residuals once per copy (its ``2^|A|`` weights do not depend on
    the copy), a different problem from the measurement's likelihood.
    """
    arrays = {}
    for j, z in enumerate(m.components):
        z = np.asarray(z, dtype=float)
        for ax in range(z.ndim):
            z = -np.diff(z, axis=ax)             # rows e_i - e_{i+1}
        arrays[f"ans_{j}"] = z.ravel() if z.ndim else z.reshape(1)
    dom = W.domain
    np.savez(path, names=np.array(dom.names), sizes=np.array(dom.sizes),
             cliques=json.dumps([list(c) for c in W.cliques]),
             residuals=json.dumps([list(a) for a in W.residuals]),
             sigmas=np.sqrt(m.variances), extra=json.dumps(extra), **arrays)


def _grem_run(W, m, extra: dict, timeout: float):
    """Run the GReM runner on ``m``; ``(info, {clique: mu}, {clique: mle})`` or ``(error dict, ...)``."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "spec.npz", Path(tmp) / "out.npz"
        grem_spec(W, m, spec, **extra)
        try:
            proc = subprocess.run([GREM_PY, str(HERE / "_grem_residual_runner.py"), str(spec), str(out)],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"killed after {timeout:.0f} s"}, None, None
        if not out.exists():
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            return {"status": "error", "error": lines[-1] if lines else "no output"}, None, None
        with np.load(out, allow_pickle=False) as z:
            info = json.loads(str(z["info"]))
            mus = {c: z[f"mu_{i}"] for i, c in enumerate(W.cliques)}
            mle = {c: z[f"mle_{i}"] for i, c in enumerate(W.cliques) if f"mle_{i}" in z.files}
    return info, mus, mle


def _likelihood(m, dom, values: dict) -> float:
    """cvxdp's ``nll(m, .)`` at the given marginals (the objective the nonneg run minimises)."""
    import cvxpy as cp
    import cvxdp
    mus = {c: cp.Variable(dom.shape(c)) for c in values}
    for c, v in values.items():
        mus[c].value = np.asarray(v, dtype=float).reshape(dom.shape(c))
    return float(cvxdp.nll(m, mus).value)


def child_grem(r: int, target: float, variant: str, time_limit: float, t: float,
               rounds: int = 4001, timeout: float = 3600.0) -> dict:
    """GReM-LNN (its own environment) on the draw of ``child_nonneg(r, target, ...)``."""
    import cvxdp
    dom, data, cliques, W, m = nonneg_instance(r, target)
    extra = {"variant": variant, "t": t, "rounds": rounds}
    if time_limit > 0:
        extra["time_limit"] = time_limit
    info, mus, _ = _grem_run(W, m, extra, timeout=timeout)
    if mus is None:
        return info
    est = cvxdp.reconstruct(W, m)
    err_g = err_ub = 0.0
    for q in cliques:
        truth = dom.count(data, q)
        err_g += float(np.sum((mus[q].reshape(truth.shape) - truth) ** 2))
        err_ub += float(np.sum((est[q] - truth) ** 2))
    info.update(sq_error_grem=err_g, sq_error_unbiased=err_ub, ratio=err_g / err_ub,
                objective=_likelihood(m, dom, mus), cvxdp_rss_peak_mb=rss_mb())
    return info


GREM_CHECK_ATTRS = ("workclass", "marital-status", "relationship", "race", "sex")


def child_grem_check() -> dict:
    """The inputs check on a small domain (five Adult attributes, 9 x 7 x 6 x 5 x 2; all
    two-way, then all three-way marginals, the design at 20 per cell, seed 0): GReM-MLE (its
    unconstrained reconstruction) from the converted answers against ``cvxdp.reconstruct`` (the
    inputs are the same data iff these agree, to float32), and GReM-LNN with the measurement's
    scales (``true-sigma``) run to its own stopping rule against cvxdp.ADMM's certified optimum
    of ``nll`` over ``LocalPolytope(total=None)`` (the same problem iff the objectives agree)."""
    import cvxpy as cp
    import cvxdp
    out = {}
    for r in (2, 3):
        dom, data, cliques, W, m = nonneg_instance(r, 20.0, GREM_CHECK_ATTRS)
        info, lnn, mle = _grem_run(W, m, {"variant": "true-sigma", "mle": True}, 1800.0)
        if not mle:
            out[f"{r}way"] = info
            continue
        est = cvxdp.reconstruct(W, m)
        diff = max(float(np.max(np.abs(mle[q] - np.ravel(est[q])))) for q in cliques)
        scale = max(float(np.max(np.abs(est[q]))) for q in cliques)
        mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
        prob = cp.Problem(cp.Minimize(cvxdp.nll(m, mus)), [cvxdp.LocalPolytope(mus, dom, total=None)])
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-8)
        out[f"{r}way"] = {"marginals": len(cliques), "residuals": W.n_residuals,
                          "max_abs_diff": diff, "max_abs_cell": scale, "rel": diff / scale,
                          "lnn_objective": _likelihood(m, dom, lnn), "lnn_stop": info["stop"],
                          "lnn_rounds": info["rounds"], "lnn_time": info["total_time"],
                          "lnn_neg_mass": info["neg_mass"], "cvxdp_status": prob.status,
                          "cvxdp_objective": float(prob.value),
                          "cvxdp_gap": prob.solver_stats.extra_stats["gap"]}
    return out


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


def _grem_rounds(spec: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in (item.split(":") for item in spec.split(",") if item)}


def nonneg_table(fh, fast: bool, limit: float, grem: dict | None = None) -> None:
    emit(fh, "## Adult: the non-negative, consistent reconstruction (LocalPolytope, residual "
             "likelihood, cvxdp.ADMM), design at 20 per cell" + (
                 "; GReM-LNN on the same residual answers" if grem else ""))
    if not (ADULT / "adult.csv").exists():
        emit(fh, f"(no Adult data at {ADULT})")
        return
    if grem and not Path(GREM_PY).exists():
        emit(fh, f"(GReM-LNN skipped: no environment at {GREM_PY}; set CVXDP_GREM_PYTHON, see "
                 f"benchmarks/_grem_runner.py)")
        grem = None
    if grem:
        chk = run_child("grem-check")
        emit(fh, "check, GReM-MLE (unconstrained) from the converted answers vs cvxdp.reconstruct, "
                 f"attributes {', '.join(GREM_CHECK_ATTRS)}:")
        for key, res in chk.items():
            if "max_abs_diff" not in res:
                emit(fh, f"  {key}: {res.get('status')} {res.get('error', '')[:200]}")
                continue
            emit(fh, f"  {key}: {res['marginals']} marginals, {res['residuals']} residuals: max |diff| "
                     f"{res['max_abs_diff']:.2e} of cells up to {res['max_abs_cell']:.0f} "
                     f"({res['rel']:.1e} relative; float32 eps 1.2e-7)")
            if "lnn_objective" in res:
                emit(fh, f"  {key}: GReM-LNN true-sigma to its own stop ({res['lnn_stop']}; "
                         f"{res['lnn_rounds']} rounds, {res['lnn_time']:.0f} s): nll "
                         f"{res['lnn_objective']:.6f}, negative mass {res['lnn_neg_mass']:.2e}; "
                         f"cvxdp.ADMM {res['cvxdp_status']} nll {res['cvxdp_objective']:.6f} "
                         f"(certified gap {res['cvxdp_gap']:.1e})")
    emit(fh, f"{'workload':>9} {'method':>21} {'status':>18} {'time s':>8} {'MB':>6} {'iters':>6} "
             f"{'gap':>9} {'nll':>13} {'sq err / unbiased':>17} {'min cell':>9} {'neg mass':>11}")
    for r, eps, t in ((2, 1e-6, 600.0), (3, 1e-6, limit))[: 1 if fast else 2]:
        res = run_child("nonneg", str(r), "20", str(eps), str(t))
        if res.get("status") == "error":
            emit(fh, f"{r:>8}w error {res.get('error', '')[:200]}")
            continue
        emit(fh, f"{r:>8}w {'cvxdp ADMM':>21} {res['status']:>18} {res['time']:8.1f} "
                 f"{res['rss_peak_mb']:6.0f} {res['iterations']:>6} {res['gap']:9.1e} "
                 f"{res['objective']:13.6g} {res['ratio']:17.3f} {res['min_cell']:9.2g} "
                 f"{res['neg_mass']:11.3g}")
        for variant in (grem or {}).get("variants", {}).get(r, ()):
            rounds = grem["rounds"].get(r, 4001)
            g = run_child("grem", str(r), "20", variant, "0", str(grem["t"]), str(rounds),
                          str(grem["timeout"]))
            name = f"GReM-LNN {variant}"
            if g.get("status") != "ok":
                emit(fh, f"{r:>8}w {name:>21} {g.get('status', '?'):>18}  {g.get('error', '')[:200]}")
                continue
            status = "round limit" if g["stop"].startswith("round limit") else "its stop rule"
            rel = (g["objective"] - res["objective"]) / abs(res["objective"])
            emit(fh, f"{r:>8}w {name:>21} {status:>18} {g['total_time']:8.1f} {g['rss_peak_mb']:6.0f} "
                     f"{g['rounds']:>6} {'none':>9} {g['objective']:13.6g} {g['ratio']:17.3f} "
                     f"{g['min_cell']:9.2g} {g['neg_mass']:11.3g}")
            emit(fh, f"{'':>10}{g['stop']}; {g['seconds_per_round']:.2f} s/round, set-up "
                     f"{g['setup_time']:.1f} s, its marginals from the residuals "
                     f"{g['marginals_time']:.1f} s; at the end its negative mass {g['last_neg_mass_printed']:.4g} "
                     f"(rule > -1, tested at rounds 300, 400, ...), -lambda.mu {g['last_lam_mu']:.4g} "
                     f"(rule |.| < 0.01 after round 400), restarts {g['restarts']}; nll vs cvxdp's "
                     f"{rel:+.2e}")
    emit(fh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--only", default="design,growth,adult,nonneg,grem")
    ap.add_argument("--nonneg-time", type=float, default=600.0,
                    help="time limit of the three-way non-negative reconstruction (s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--rp-timeout", type=float, default=900.0)
    ap.add_argument("--grem-variants", default="published,true-sigma",
                    help="GReM-LNN variants run on the two-way workload (_grem_residual_runner.py)")
    ap.add_argument("--grem-variants-3way", default="published",
                    help="GReM-LNN variants run on the three-way workload")
    ap.add_argument("--grem-rounds", default=None,
                    help="GReM-LNN round limits, 'r:rounds,...' (default 2:301,3:10; fast 2:20)")
    ap.add_argument("--grem-t", type=float, default=0.01, help="GReM-LNN dual step (its demo's)")
    ap.add_argument("--grem-timeout", type=float, default=3600.0, help="s, per GReM-LNN run")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "design":
            res = child_design(rest[0], int(rest[1]), int(rest[2]))
        elif kind == "nonneg":
            res = child_nonneg(int(rest[0]), float(rest[1]), float(rest[2]), float(rest[3]))
        elif kind == "grem":
            res = child_grem(int(rest[0]), float(rest[1]), rest[2], float(rest[3]), float(rest[4]),
                             int(rest[5]), float(rest[6]))
        elif kind == "grem-check":
            res = child_grem_check()
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
    if "nonneg" in only or "grem" in only:
        grem = None
        if "grem" in only:
            grem = {"variants": {2: tuple(v for v in args.grem_variants.split(",") if v),
                                 3: tuple(v for v in args.grem_variants_3way.split(",") if v)},
                    "rounds": _grem_rounds(args.grem_rounds or ("2:20" if args.fast else "2:301,3:10")),
                    "t": args.grem_t, "timeout": args.grem_timeout}
        nonneg_table(fh, args.fast, args.nonneg_time, grem)


if __name__ == "__main__":
    main()
