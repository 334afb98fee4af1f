"""Benchmark: noisy marginals of any clique set on the local polytope (issue 13).

Instances (Adult, known total N = 48,842 unless ``--free-total``; seeded):

    2way-gauss10     all two-way marginals (91 cliques, 148,137 cells), Gaussian noise sigma 10
    2way-gauss100    the same, sigma 100
    2way-laplace10   the same, Laplace noise of scale 10 (L1 loss)
    3way-gauss10     all three-way marginals (364 cliques, 20.9 M cells), sigma 10

``--fast`` uses six attributes (``FAST_ATTRS``; ``--fast-attrs`` replaces them): seconds for
Clarabel and cvxdp, about 40 s per instance for mbi (its JIT compile), GReM skipped by estimate.

The model (``local_polytope_model``) is plain cvxpy: loss ``sum_C ||x_C - y_C||^2 / (2 sigma^2)``
(Gaussian) or ``sum_C ||x_C - y_C||_1 / b`` (Laplace) over one flat (C-order) variable per
clique, subject to either ``cvxdp.LocalPolytope({C: x_C}, domain, total)`` or the hand-written
local polytope (``x_C >= 0``; cliques agree on every nonempty intersection S, through sparse 0/1
marginalisation matrices ``M_{C,S}``, pairwise or through a variable per S; equal totals).

Columns, one row per instance and method, printed as each finishes:

    clarabel  hand-written local polytope, ``prob.solve(solver=cp.CLARABEL)``: wall time
              including cvxpy's compile, in a child process (its peak RSS is reported).
              Written with one variable per separator (``--clarabel-form separators``,
              default): the literal every-pair form (``pairs``) has 4.1 M nonzeros on all
              two-way Adult marginals, takes 85 s to compile and was still factorising at
              13 GB RSS after 4 minutes.  Where Clarabel's default static regularisation meets
              the redundant rows (NumericalError: three-way cliques) the run is retried with
              ``static_regularization_constant=1e-6``, said in the notes.  Instances estimated
              over 10 minutes (seconds per cell of the two-way run, at least linear) are skipped
    cvxdp     ``cvxdp.LocalPolytope`` + ``prob.solve(method="cvxdp", solver=cvxdp.ADMM,
              eps_rel=1e-4)``, child process: wall time to the certified gap, gap, peak RSS;
              "n/a" while ``cvxdp.LocalPolytope`` does not exist
    mbi       Private-PGM 2.x ``mbi.approximate_oracles.ApproxMirrorDescent`` (mirror descent
              with convex generalized belief propagation) in its own environment
              (``benchmarks/_mbi_local_runner.py``): loss at the end and the first time its
              pseudo-marginals reach ``loss <= opt (1 + 1e-4)``, opt = Clarabel's optimum
    grem      GReM-LNN (Mullins et al., NeurIPS 2024; bcmullins/efficient-marginal-reconstruction)
              in its own environment (``benchmarks/_grem_runner.py``), Gaussian instances only
    noisy     the noisy answers themselves (workload error reference)

"loss" is every method's output evaluated with the same numpy objective; "vs opt" is
``loss / opt - 1``.  Workload error "WE meas" is the mean over the measured cliques of
``||mu_hat_C - mu_true_C||_1 / N``; "WE 3-way" the same over 20 random unmeasured three-way
marginals (two-way instances; methods that leave a model or a reconstruction behind only:
cvxdp through ``constraint.model()``, a junction-tree fit, timed apart; GReM through its
residual reconstruction).

Environments (never cvxdp dependencies): ``CVXDP_MBI_PYTHON`` (default ``/tmp/mbi_env/bin/python``;
``python3 -m venv /tmp/mbi_env && /tmp/mbi_env/bin/pip install "mbi>=2,<3"``) and
``CVXDP_GREM_PYTHON`` (default ``/tmp/grem_env/bin/python``; a venv with torch (CPU),
linear_operator, tqdm, pandas, scipy and the ``rem`` package of
bcmullins/efficient-marginal-reconstruction installed from a checkout).  Absent: "n/a".

Usage: ``python benchmarks/local_polytope.py [--fast] [--out FILE] [--only clarabel,mbi,grem,cvxdp]
[--instances 2way-gauss10,...] [--skip 3way-gauss10:mbi,...] [--force]``; ``--help`` for the rest
(mbi iterations, step size, time limits).  The saved run, results/local_polytope_baselines.txt:
``--instances 2way-gauss10,3way-gauss10 --skip 3way-gauss10:mbi,3way-gauss10:cvxdp,3way-gauss10:grem``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
ADULT = Path(os.environ.get("CVXDP_ADULT_DIR", HERE.parent.parent / "shared" / "data" / "adult"))
MBI_PY = os.environ.get("CVXDP_MBI_PYTHON", "/tmp/mbi_env/bin/python")
GREM_PY = os.environ.get("CVXDP_GREM_PYTHON", "/tmp/grem_env/bin/python")
FAST_ATTRS = ("workclass", "education-num", "marital-status", "relationship", "race", "sex")
INSTANCES = {  # name: (clique order k, noise kind, sigma or Laplace scale)
    "2way-gauss10": (2, "gauss", 10.0),
    "2way-gauss100": (2, "gauss", 100.0),
    "2way-laplace10": (2, "laplace", 10.0),
    "3way-gauss10": (3, "gauss", 10.0),
}
METHODS = ("clarabel", "cvxdp", "mbi", "grem")
N_UNMEASURED = 20
# Clarabel on 2way-gauss10 (148,137 cells): seconds per cell, from
# results/local_polytope_baselines.txt; used to estimate instances too large to run when this
# invocation did not itself time a Clarabel run.  Interior-point cost grows at least linearly.
CLARABEL_S_PER_CELL = 2.3e-4
CLARABEL_MAX_EST = 600.0  # seconds: larger estimates are skipped
# GReM-LNN's dual ascent (rem.dual_ascent.solve_regularization) rebuilds its Kronecker operators
# in Python every round and tests its stopping rule only at rounds 300, 400, ... (gremLNN.solve
# allows 4001).  Seconds per round measured here with one torch thread (two threads: 3x slower
# on this 2-core machine): ("fast" | "full", k) -> s (fast: the 130 s run of the results file
# over >= 301 rounds; full: 2 rounds profiled).  Unmeasured sizes are not estimated.
GREM_ROUND_S = {("fast", 2): 0.43, ("full", 2): 10.0}
GREM_MIN_ROUNDS = 301
# ApproxMirrorDescent has a fixed step (no line search): scale * 2 / (L * total), mbi's initial
# MirrorDescent step.  Swept on the --fast instances (500-2000 iterations): Gaussian, 1 descends
# monotonically, 2 passes below the optimum (pseudo-marginals inconsistent by 1e-3 of the total),
# 4 diverges; Laplace, 1 barely moves (its gradient is 1/b, not r/sigma^2), 10 is best after
# 1,500 iterations (4% above the optimum), 30 and 100 stall at 1.7-5x, 1000 diverges.
MBI_STEPSIZE_SCALE = {"gauss": 1.0, "laplace": 10.0}


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------

def _sizes(domain):
    return dict(domain.items()) if hasattr(domain, "items") else dict(domain)


def marginalisation_matrix(sizes, clique, sub):
    """Sparse 0/1 matrix mapping the C-order flat table of ``clique`` to its marginal on ``sub``
    (attributes in ``sub``'s order, C-order flat)."""
    shape = tuple(sizes[a] for a in clique)
    n = int(np.prod(shape))
    idx = np.unravel_index(np.arange(n), shape)
    rows = np.ravel_multi_index([idx[clique.index(a)] for a in sub], [sizes[a] for a in sub]) \
        if sub else np.zeros(n, dtype=np.int64)
    m = int(np.prod([sizes[a] for a in sub])) if sub else 1
    return sp.csr_matrix((np.ones(n), (rows, np.arange(n))), shape=(m, n))


def local_polytope_constraints(sizes, xs, total=None, form="separators"):
    """The hand-written local polytope: ``x_C >= 0``; every two cliques with a nonempty
    intersection agree on it; one total (``total``, or free and equal across cliques).

    ``form="pairs"``: one constraint ``M_{C,S} x_C == M_{C',S} x_C'`` for every pair of cliques
    with intersection ``S`` (for all two-way Adult marginals: 1,092 constraints, 4.1 M nonzeros).
    ``form="separators"`` (default): the same set, written with one free variable ``m_S`` per
    distinct intersection ``S`` and ``M_{C,S} x_C == m_S`` for every clique containing ``S``
    (each clique's cells appear once per separator it contains, not once per neighbour)."""
    import cvxpy as cp
    cliques = list(xs)
    cons = [xs[c] >= 0 for c in cliques]
    if form == "pairs":
        for c1, c2 in itertools.combinations(cliques, 2):
            s = tuple(a for a in c1 if a in c2)
            if s:
                cons.append(marginalisation_matrix(sizes, c1, s) @ xs[c1]
                            == marginalisation_matrix(sizes, c2, s) @ xs[c2])
    elif form == "separators":
        seps = {}
        for c1, c2 in itertools.combinations(cliques, 2):
            s = tuple(a for a in c1 if a in c2)
            if s:
                seps.setdefault(frozenset(s), s)
        for s in seps.values():
            m = cp.Variable(int(np.prod([sizes[a] for a in s])), name="m_" + "_".join(s))
            for c in cliques:
                if set(s) <= set(c):
                    sub = tuple(a for a in c if a in s)  # s in c's order (domain order here)
                    mat = marginalisation_matrix(sizes, c, sub)
                    if sub != s:
                        mat = marginalisation_matrix(sizes, sub, s) @ mat  # reorder to s
                    cons.append(mat @ xs[c] == m)
    else:
        raise ValueError(f"unknown form {form!r}")
    if total is None:
        cons += [cp.sum(xs[c]) == cp.sum(xs[cliques[0]]) for c in cliques[1:]]
    else:
        cons += [cp.sum(xs[c]) == total for c in cliques]
    return cons


def local_polytope_model(domain, cliques, noisy, scale, kind, total=None, use_cvxdp=False,
                         form="separators"):
    """``(problem, variables)``: the noisy-marginal estimation problem on the local polytope.

    ``domain`` a ``cvxdp.Domain`` (or a mapping attribute -> size); ``cliques`` tuples of
    attribute names; ``noisy[C]`` the noisy marginal (any shape, C order over ``C``; a clique
    missing from ``noisy`` is unmeasured);
    ``scale`` sigma (``kind="gauss"``: loss ``||x - y||^2 / (2 sigma^2)``) or the Laplace scale
    b (``kind="laplace"``: ``||x - y||_1 / b``); ``total`` the known total, None = free.
    ``variables[C]`` is a flat cvxpy Variable; with ``use_cvxdp`` the only constraint,
    ``problem.constraints[0]``, is the ``cvxdp.LocalPolytope``; without, ``form`` is that of
    ``local_polytope_constraints``."""
    import cvxpy as cp
    sizes = _sizes(domain)
    xs = {c: cp.Variable(int(np.prod([sizes[a] for a in c])), name="x_" + "_".join(c))
          for c in cliques}
    # a clique without a noisy answer is in the polytope but unmeasured (no loss term)
    ys = {c: np.asarray(noisy[c], dtype=float).ravel() for c in cliques if c in noisy}
    if kind == "gauss":
        obj = sum(cp.sum_squares(xs[c] - ys[c]) for c in ys) / (2.0 * scale ** 2)
    elif kind == "laplace":
        obj = sum(cp.norm1(xs[c] - ys[c]) for c in ys) / scale
    else:
        raise ValueError(f"unknown noise kind {kind!r}")
    if use_cvxdp:
        import cvxdp
        if not hasattr(domain, "items") or not hasattr(domain, "project"):
            domain = cvxdp.Domain(sizes)
        cons = [cvxdp.LocalPolytope(xs, domain, total=total)]
    else:
        cons = local_polytope_constraints(sizes, xs, total, form)
    return cp.Problem(cp.Minimize(obj), cons), xs


def loss_value(mus, cliques, noisy, scale, kind):
    """The model's objective at tables ``mus[C]`` (numpy)."""
    r = [np.asarray(mus[c], float).ravel() - np.asarray(noisy[c], float).ravel() for c in cliques]
    if kind == "gauss":
        return sum(float(v @ v) for v in r) / (2.0 * scale ** 2)
    return sum(float(np.abs(v).sum()) for v in r) / scale


def workload_error(mus, truth, keys, n):
    return float(np.mean([np.abs(np.ravel(mus[c]) - np.ravel(truth[c])).sum() / n for c in keys]))


# ---------------------------------------------------------------------------------------------
# instances and the spec file shared by every runner
# ---------------------------------------------------------------------------------------------

def load_adult():
    names = list(json.loads((ADULT / "adult-domain.json").read_text()))
    sizes = json.loads((ADULT / "adult-domain.json").read_text())
    data = np.loadtxt(ADULT / "adult.csv", delimiter=",", skiprows=1, dtype=np.int64)
    return names, sizes, data


def count(data, names, sizes, clique):
    cols = [names.index(a) for a in clique]
    shape = [sizes[a] for a in clique]
    flat = np.ravel_multi_index(tuple(data[:, cols].T), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).astype(float)


def make_instance(name, adult, fast, seed):
    names, sizes, data = adult
    k, kind, scale = INSTANCES[name]
    attrs = [a for a in names if a in FAST_ATTRS] if fast else list(names)
    rng = np.random.default_rng([seed, list(INSTANCES).index(name)])
    cliques = list(itertools.combinations(attrs, k))  # domain order: C-order tables agree everywhere
    truth = {c: count(data, names, sizes, c) for c in cliques}
    if kind == "gauss":
        noisy = {c: truth[c] + rng.normal(0.0, scale, truth[c].shape) for c in cliques}
    else:
        noisy = {c: truth[c] + rng.laplace(0.0, scale, truth[c].shape) for c in cliques}
    targets = []
    if k == 2:
        triples = list(itertools.combinations(attrs, 3))
        pick = rng.choice(len(triples), min(N_UNMEASURED, len(triples)), replace=False)
        targets = [triples[i] for i in sorted(pick)]
    return {"name": name, "attrs": attrs, "sizes": {a: sizes[a] for a in attrs}, "kind": kind,
            "scale": scale, "cliques": cliques, "truth": truth, "noisy": noisy, "targets": targets,
            "target_truth": {t: count(data, names, sizes, t) for t in targets}, "n": float(len(data)),
            "cells": int(sum(truth[c].size for c in cliques))}


def write_spec(path, inst, total, **extra):
    arrays = {f"y_{i}": inst["noisy"][c] for i, c in enumerate(inst["cliques"])}
    np.savez(path, names=np.array(inst["attrs"]), sizes=np.array([inst["sizes"][a] for a in inst["attrs"]]),
             cliques=json.dumps([list(c) for c in inst["cliques"]]),
             targets=json.dumps([list(t) for t in inst["targets"]]), kind=inst["kind"],
             scale=float(inst["scale"]), total=np.nan if total is None else float(total),
             extra=json.dumps(extra), **arrays)


def read_spec(path):
    with np.load(path, allow_pickle=False) as z:
        names = [str(a) for a in z["names"]]
        cliques = [tuple(c) for c in json.loads(str(z["cliques"]))]
        total = float(z["total"])
        return {"sizes": dict(zip(names, (int(s) for s in z["sizes"]))), "cliques": cliques,
                "targets": [tuple(t) for t in json.loads(str(z["targets"]))], "kind": str(z["kind"]),
                "scale": float(z["scale"]), "total": None if math.isnan(total) else total,
                "noisy": {c: z[f"y_{i}"] for i, c in enumerate(cliques)},
                "extra": json.loads(str(z["extra"]))}


def read_result(path, cliques, targets):
    """``(info, mus, target_mus)`` from a runner's ``out.npz`` (``mu_i``, ``t_i`` arrays)."""
    with np.load(path, allow_pickle=False) as z:
        info = json.loads(str(z["info"]))
        mus = {c: z[f"mu_{i}"] for i, c in enumerate(cliques)} if "mu_0" in z.files else None
        tmus = {t: z[f"t_{i}"] for i, t in enumerate(targets) if f"t_{i}" in z.files}
    return info, mus, tmus


def write_result(path, info, mus=None, tmus=None):
    arrays = {f"mu_{i}": np.asarray(m, float).ravel() for i, m in enumerate(mus or [])}
    arrays.update({f"t_{i}": np.asarray(m, float).ravel() for i, m in enumerate(tmus or []) if m is not None})
    np.savez(path, info=json.dumps(info), **arrays)


def run_runner(cmd, out, timeout):
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        err = proc.stderr
    except subprocess.TimeoutExpired:
        return {"status": f"timeout ({timeout:.0f} s)", "wall": time.perf_counter() - t0}
    if not Path(out).exists():
        lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        return {"status": "error: " + (lines[-1][:200] if lines else "no output"),
                "wall": time.perf_counter() - t0}
    return None


# ---------------------------------------------------------------------------------------------
# the cvxpy child process (Clarabel on the hand-written polytope; cvxdp on LocalPolytope)
# ---------------------------------------------------------------------------------------------

def _maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _model_of(con):
    """``constraint.model`` (a property or a method), or None."""
    m = getattr(con, "model", None)
    if m is not None and callable(m) and not hasattr(m, "marginal"):
        try:
            m = m()
        except Exception:  # noqa: BLE001 - not available (yet): reported as n/a
            return None
    return m if hasattr(m, "marginal") else None


def child(method, spec_path, out_path):
    import cvxpy as cp
    import cvxdp
    spec = read_spec(spec_path)
    rss0 = _maxrss_mb()
    cliques, targets = spec["cliques"], spec["targets"]
    form = spec["extra"].get("form", "separators")
    info0 = {}
    t0 = time.perf_counter()
    domain = cvxdp.Domain(spec["sizes"])
    prob, xs = local_polytope_model(domain, cliques, spec["noisy"], spec["scale"], spec["kind"],
                                    spec["total"], use_cvxdp=(method == "cvxdp"), form=form)
    t_model = time.perf_counter() - t0
    if method == "clarabel":
        try:
            prob.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            # Clarabel's default static regularisation (1e-8) meets a singular KKT system on
            # redundant consistency rows (three-way cliques): NumericalError at the first
            # iteration.  Retry, rebuilt from scratch, with 1e-6; both times are reported.
            info0 = {"failed_default_s": time.perf_counter() - t0}
            t0 = time.perf_counter()
            prob, xs = local_polytope_model(domain, cliques, spec["noisy"], spec["scale"],
                                            spec["kind"], spec["total"], form=form)
            prob.solve(solver=cp.CLARABEL, static_regularization_constant=1e-6)
    elif method == "cvxdp":
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, **spec["extra"].get("solve_opts", {}))
    else:
        raise ValueError(method)
    wall = time.perf_counter() - t0
    st = prob.solver_stats
    extra = dict(getattr(st, "extra_stats", None) or {}) if method == "cvxdp" else {}
    info = {**info0, "status": prob.status, "wall": wall, "model_time": t_model, "objective": prob.value,
            "solve_time": st.solve_time, "setup_time": getattr(st, "setup_time", None),
            "iterations": st.num_iters, "rss_before_mb": rss0,
            **{k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else None)
               for k, v in extra.items() if k in ("gap", "lower_bound", "iterations", "solve_time",
                                                   "setup_time")}}
    tmus = []
    if method == "cvxdp" and targets:
        t1 = time.perf_counter()
        model = _model_of(prob.constraints[0])
        info["model_time"] = time.perf_counter() - t1
        lines = str(getattr(model, "info", "")).splitlines()
        info["model_info"] = lines[1] if len(lines) > 1 else (lines[0] if lines else None)
        for t in targets:
            try:
                tmus.append(None if model is None else np.asarray(model.marginal(t), float))
            except Exception:  # noqa: BLE001
                tmus.append(None)
    info["rss_peak_mb"] = _maxrss_mb()
    mus = [xs[c].value if xs[c].value is not None else np.full(xs[c].size, np.nan) for c in cliques]
    write_result(out_path, info, mus, tmus)


# ---------------------------------------------------------------------------------------------
# the parent: one function per method, each returning (info, mus, target_mus)
# ---------------------------------------------------------------------------------------------

def run_cvxpy_child(method, spec, tmp, timeout):
    out = Path(tmp) / f"{method}.npz"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", method, str(spec), str(out)]
    bad = run_runner(cmd, out, timeout)
    return bad, out


def run_external(py, script, spec, tmp, name, timeout):
    if not Path(py).exists():
        return {"status": f"n/a (no {py})"}, None
    out = Path(tmp) / f"{name}.npz"
    bad = run_runner([py, str(HERE / script), str(spec), str(out)], out, timeout)
    return bad, out


def fmt(x, spec=".3g"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


HEADER = (f"{'instance':<15} {'method':<9} {'status':<18} {'wall s':>8} {'loss':>12} {'vs opt':>9} "
          f"{'gap':>8} {'peak MB':>8} {'t@1e-4 s':>9} {'WE meas':>8} {'WE 3way':>8}  notes")


def row(inst, method, status, wall=None, loss=None, opt=None, gap=None, mem=None, t_hit=None,
        we=None, we3=None, notes=""):
    vs = None if loss is None or not opt else loss / opt - 1.0
    return (f"{inst:<15} {method:<9} {status[:18]:<18} {fmt(wall, '.1f'):>8} {fmt(loss, '.6g'):>12} "
            f"{fmt(vs, '.1e'):>9} {fmt(gap, '.1e'):>8} {fmt(mem, '.0f'):>8} {fmt(t_hit, '.1f'):>9} "
            f"{fmt(we, '.5f'):>8} {fmt(we3, '.5f'):>8}  {notes}").rstrip()


def inst_k(name):
    return INSTANCES[name][0]


def run_instance(name, adult, args, emit, state):
    import cvxdp
    inst = make_instance(name, adult, args.fast, args.seed)
    cliques, targets, n = inst["cliques"], inst["targets"], inst["n"]
    kind, scale = inst["kind"], inst["scale"]
    total = None if args.free_total else n
    label = name
    loss = lambda mus: loss_value(mus, cliques, inst["noisy"], scale, kind)  # noqa: E731
    we = lambda mus: workload_error(mus, inst["truth"], cliques, n)  # noqa: E731

    def we3(tmus):
        return workload_error(tmus, inst["target_truth"], targets, n) \
            if targets and tmus and all(t in tmus for t in targets) else None

    emit(row(label, "noisy", "-", we=we(inst["noisy"]),
             notes=f"{len(cliques)} cliques, {inst['cells']:,} cells, {len(targets)} unmeasured 3-way"))
    opt = None
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.npz"
        write_spec(spec, inst, total, solve_opts={"eps_rel": args.eps_rel}, form=args.clarabel_form)

        skip = {m for (i, m) in args.skip if i == name}
        for m in sorted(skip & args.only):
            emit(row(label, m, "skipped", notes="skipped (--skip)"))
        only = args.only - skip

        if "clarabel" in only:
            est = inst["cells"] * state.get("clarabel_s_per_cell", CLARABEL_S_PER_CELL)
            if est > CLARABEL_MAX_EST and not args.force:
                emit(row(label, "clarabel", "skipped", notes=f"skipped (estimated {est / 60:.0f} min "
                         f"at {state.get('clarabel_s_per_cell', CLARABEL_S_PER_CELL):.2g} s/cell, "
                         f"at least linear in the cells)"))
            else:
                bad, out = run_cvxpy_child("clarabel", spec, tmp, args.timeout)
                if bad:
                    emit(row(label, "clarabel", bad["status"], wall=bad.get("wall")))
                else:
                    info, mus, _ = read_result(out, cliques, targets)
                    opt = loss(mus)
                    state["clarabel_s_per_cell"] = info["wall"] / inst["cells"]
                    emit(row(label, "clarabel", info["status"], info["wall"], opt, opt, None,
                             info["rss_peak_mb"], None, we(mus), None,
                             f"{args.clarabel_form} form; solver {info['solve_time']:.1f} s, cvxpy model+compile "
                             f"{info['wall'] - info['solve_time']:.1f} s; prob.value {info['objective']:.6g}"
                             + ("" if "failed_default_s" not in info else
                                f"; default settings failed (NumericalError, {info['failed_default_s']:.1f} s), "
                                "time is the retry with static_regularization_constant=1e-6")))

        cvx_opt = None
        if "cvxdp" in only:
            if getattr(cvxdp, "LocalPolytope", None) is None:
                emit(row(label, "cvxdp", "n/a", notes="cvxdp.LocalPolytope not available yet"))
            else:
                bad, out = run_cvxpy_child("cvxdp", spec, tmp, args.timeout)
                if bad:
                    emit(row(label, "cvxdp", bad["status"], wall=bad.get("wall")))
                else:
                    info, mus, tmus = read_result(out, cliques, targets)
                    cvx_opt = loss(mus)
                    lb = info.get("lower_bound")
                    emit(row(label, "cvxdp", info["status"], info["wall"], cvx_opt, opt, info.get("gap"),
                             info["rss_peak_mb"], None, we(mus), we3(tmus),
                             f"{fmt(info.get('iterations'), '.0f')} it, setup {fmt(info.get('setup_time'), '.1f')} s, "
                             f"solve {fmt(info.get('solve_time'), '.1f')} s, lower bound {fmt(lb, '.6g')}, "
                             f"rss before solve {info['rss_before_mb']:.0f} MB"
                             + ("" if info.get("model_info") is None else
                                f"; WE 3way from .model() ({info['model_time']:.1f} s, not in wall): "
                                f"{info['model_info']}")))
        ref = opt if opt is not None else cvx_opt

        if "mbi" in only:
            target = ref * (1 + 1e-4) if ref else None
            write_spec(spec, inst, total, iters=args.mbi_iters, time_limit=args.mbi_time,
                       check_every=args.mbi_check, target=target,
                       stepsize_scale=args.mbi_stepsize_scale or MBI_STEPSIZE_SCALE[kind],
                       oracle_iters=args.mbi_oracle_iters)
            bad, out = run_external(MBI_PY, "_mbi_local_runner.py", spec, tmp, "mbi", args.mbi_time + 300)
            if bad:
                emit(row(label, "mbi AMD", bad["status"], wall=bad.get("wall")))
            else:
                info, mus, _ = read_result(out, cliques, targets)
                t_hit = info.get("time_to_target")
                emit(row(label, "mbi AMD", info["status"], info["total_time"], loss(mus), ref, None,
                         info.get("rss_peak_mb"), t_hit, we(mus), None,
                         f"{info['iters']} it, stepsize {info['stepsize']:.3g}, "
                         f"{fmt(info.get('per_iter_time'), '.3f')} s/it, first it (jit) {fmt(info.get('first_iter_time'), '.1f')} s; "
                         f"consistency viol {fmt(info.get('consistency_l1'), '.1e')}, "
                         f"min cell {fmt(info.get('min_cell'), '.2g')}"
                         + ("" if t_hit is None else
                            f"; at t@1e-4: it {info.get('iters_to_target')}, loss {info.get('loss_at_target'):.6g}, "
                            f"consistency viol {fmt(info.get('consistency_at_target'), '.1e')}")
                         + ("" if t_hit is not None or target is None
                            else f"; 1e-4 not reached (best {fmt(info.get('best_loss'), '.6g')})")))
                cps = info.get("checkpoints") or []
                if cps and ref:
                    picks = sorted({min(len(cps) - 1, int(round(x))) for x in
                                    np.geomspace(1, len(cps), 8) - 1})
                    emit(f"{'':15} {'':9} trajectory (it: s, loss/opt-1, consistency viol): " + "; ".join(
                        f"{cps[j][0]}: {cps[j][1]:.1f}, {cps[j][2] / ref - 1:.1e}, {cps[j][3]:.0e}" for j in picks))

        if "grem" in only:
            per_round = GREM_ROUND_S.get(("fast" if args.fast else "full", inst_k(name)))
            est = None if per_round is None else GREM_MIN_ROUNDS * per_round
            if kind != "gauss":
                emit(row(label, "grem LNN", "n/a", notes="GReM-LNN: Gaussian noise only"))
            elif not args.force and (est is None or est > args.grem_time):
                emit(row(label, "grem LNN", "skipped", notes=(
                    f"skipped (estimated >= {est / 60:.0f} min: >= {GREM_MIN_ROUNDS} dual-ascent rounds "
                    f"x {per_round:g} s measured; limit {args.grem_time:.0f} s)" if est is not None else
                    "skipped (time per round not measured at this size; --force to run)")))
            else:
                write_spec(spec, inst, total, t=args.grem_t)
                bad, out = run_external(GREM_PY, "_grem_runner.py", spec, tmp, "grem", args.grem_time)
                if bad:
                    emit(row(label, "grem LNN", bad["status"], wall=bad.get("wall")))
                else:
                    info, mus, tmus = read_result(out, cliques, targets)
                    emit(row(label, "grem LNN", info["status"], info["total_time"], loss(mus), ref, None,
                             info.get("rss_peak_mb"), None, we(mus), we3(tmus),
                             f"solve {info['solve_time']:.1f} s, decompose {info['setup_time']:.1f} s; "
                             f"total {info['total']:.6g} (free), min cell {info['min_cell']:.3g}, "
                             f"negative mass {info['neg_mass']:.3g}, {info['dtype']}"
                             + ("" if info.get("target_neg_mass") is None else
                                f"; unmeasured 3-way answers (residuals above 2-way set to 0, no "
                                f"non-negativity): negative mass {info['target_neg_mass']:.4g}")))


def main() -> None:
    global FAST_ATTRS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help=f"six attributes {FAST_ATTRS}")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--only", default=",".join(METHODS), help="comma list of " + ",".join(METHODS))
    ap.add_argument("--instances", default=",".join(INSTANCES), help="comma list of " + ",".join(INSTANCES))
    ap.add_argument("--skip", default="", help="comma list of INSTANCE:METHOD pairs not to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--free-total", action="store_true", help="total=None (mbi: its own estimate)")
    ap.add_argument("--eps-rel", type=float, default=1e-4, help="cvxdp's certified relative gap")
    ap.add_argument("--timeout", type=float, default=None, help="s per cvxpy child (default 1800; fast 120)")
    ap.add_argument("--clarabel-form", choices=("separators", "pairs"), default="separators",
                    help="hand-written local polytope for Clarabel (see local_polytope_constraints)")
    ap.add_argument("--force", action="store_true", help="run Clarabel / GReM even where estimated over their limits")
    ap.add_argument("--mbi-iters", type=int, default=None, help="default 3000 (fast 500)")
    ap.add_argument("--mbi-time", type=float, default=None, help="s for mbi's iterations (default 900; fast 60)")
    ap.add_argument("--mbi-check", type=int, default=10, help="evaluate mbi's loss every N iterations")
    ap.add_argument("--mbi-stepsize-scale", type=float, default=None,
                    help="ApproxMirrorDescent stepsize = scale * 2 / (L * total), L the l2 loss's Lipschitz "
                         f"constant (default {MBI_STEPSIZE_SCALE})")
    ap.add_argument("--mbi-oracle-iters", type=int, default=1)
    ap.add_argument("--grem-t", type=float, default=0.01, help="GReM-LNN dual step (its demo: 0.01)")
    ap.add_argument("--grem-time", type=float, default=None, help="s (default 1800; fast 120)")
    ap.add_argument("--fast-attrs", default=None, help="comma list replacing FAST_ATTRS (with --fast)")
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    args.only = {m.strip() for m in args.only.split(",") if m.strip()}
    if args.only - set(METHODS):
        ap.error(f"unknown methods {sorted(args.only - set(METHODS))}")
    args.skip = [tuple(p.strip().split(":", 1)) for p in args.skip.split(",") if p.strip()]
    if any(len(p) != 2 or p[0] not in INSTANCES or p[1] not in METHODS for p in args.skip):
        ap.error(f"--skip wants INSTANCE:METHOD pairs, got {args.skip}")
    names = [s.strip() for s in args.instances.split(",") if s.strip()]
    if set(names) - set(INSTANCES):
        ap.error(f"unknown instances {sorted(set(names) - set(INSTANCES))}")
    if args.fast_attrs:
        FAST_ATTRS = tuple(a.strip() for a in args.fast_attrs.split(",") if a.strip())
    args.timeout = args.timeout or (120.0 if args.fast else 1800.0)
    args.mbi_iters = args.mbi_iters or (500 if args.fast else 3000)
    args.mbi_time = args.mbi_time or (60.0 if args.fast else 900.0)
    args.grem_time = args.grem_time or (120.0 if args.fast else 1800.0)

    import cvxpy as cp
    import cvxdp
    lines = []

    def emit(line):
        lines.append(line)
        print(line, flush=True)

    emit(f"cvxdp {cvxdp.__version__}, cvxpy {cp.__version__}, numpy {np.__version__}; "
         f"LocalPolytope: {'yes' if getattr(cvxdp, 'LocalPolytope', None) else 'absent'}; "
         f"mbi: {MBI_PY if Path(MBI_PY).exists() else 'absent'}; grem: {GREM_PY if Path(GREM_PY).exists() else 'absent'}")
    emit(f"Adult{' (fast: ' + ', '.join(FAST_ATTRS) + ')' if args.fast else ''}, seed {args.seed}, "
         f"total {'free' if args.free_total else 'known'}; methods {','.join(m for m in METHODS if m in args.only)}; "
         f"mbi {args.mbi_iters} it / {args.mbi_time:.0f} s, stepsize scale "
         f"{args.mbi_stepsize_scale or MBI_STEPSIZE_SCALE}")
    emit(HEADER)
    adult = load_adult()
    state = {}
    for name in names:
        run_instance(name, adult, args, emit, state)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
