"""Benchmark: estimation over the marginal polytope, cvxdp.MIRROR_DESCENT vs Private-PGM and Clarabel.

One run prints, side by side:

(a) Adult, all 14 one-way + 10 random two-way marginals, Gaussian noise sigma = 10, known
    total, three seeds: Private-PGM (``mbi`` 2.x) mirror descent for 1000 iterations, cold, end
    to end; cvxdp's wall time (model building + recognition + solve) to reach mbi's
    1000-iteration loss, and to a 1e-4 relative gap from the optimum (Clarabel on the local
    polytope, through the same cvxpy model).
(b) five Adult attributes, all one- and two-way marginals: the same against Clarabel's
    optimum (full-table size 10,080; the junction tree is the full table here).
(c) chains of 3-way cliques, domain 10 per attribute, 10 .. 1000 attributes: setup time and
    time per iteration, both packages.
(d) workload error: the average over the measured cliques of ||mu_hat - mu_true||_1 / N, for
    the noisy measurements and for the estimate.

mbi runs in its own environment through ``benchmarks/_mbi_runner.py`` (never a cvxdp
dependency): set ``CVXDP_MBI_PYTHON`` to its interpreter (default ``/tmp/mbi_env/bin/python``;
create it with ``python3 -m venv /tmp/mbi_env && /tmp/mbi_env/bin/pip install "mbi>=2,<3"``).
Without it the mbi columns read "n/a".

Marginals of any clique set (all two- and three-way marginals, ``cvxdp.LocalPolytope``) are
benchmarked in ``benchmarks/local_polytope.py``; L1 against Gaussian losses on the marginal
polytope in ``benchmarks/marginal_l1.py``.

Usage: ``python benchmarks/marginals.py [--fast] [--seeds 0 1 2] [--out FILE]``
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import cvxpy as cp

import cvxdp

HERE = Path(__file__).resolve().parent
ADULT = Path(os.environ.get("CVXDP_ADULT_DIR", HERE.parent.parent / "shared" / "data" / "adult"))
MBI_PY = os.environ.get("CVXDP_MBI_PYTHON", "/tmp/mbi_env/bin/python")
FIVE = ("workclass", "education-num", "marital-status", "race", "sex")


def load_adult():
    dom = cvxdp.Domain.from_json(ADULT / "adult-domain.json")
    data = np.loadtxt(ADULT / "adult.csv", delimiter=",", skiprows=1, dtype=np.int64)
    return dom, data


def adult_workload(dom, rng, n_pairs=10, attrs=None):
    names = list(attrs or dom.names)
    pairs = list(itertools.combinations(names, 2))
    if n_pairs is None:
        chosen = pairs
    else:
        chosen = [pairs[i] for i in rng.choice(len(pairs), n_pairs, replace=False)]
    return [(a,) for a in names] + chosen


def measure(dom, data, cliques, sigma, rng):
    truth = {c: dom.count(data, c) for c in cliques}
    noisy = {c: truth[c] + rng.normal(0, sigma, truth[c].shape) for c in cliques}
    return truth, noisy


def build_problem(dom, cliques, noisy, sigma, total):
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    obj = sum(cp.sum_squares(mus[c] - noisy[c]) for c in cliques) / (2 * sigma ** 2)
    mp = cvxdp.MarginalPolytope(mus, dom.project(sorted({a for c in cliques for a in c},
                                                        key=dom.names.index)), total=total)
    return cp.Problem(cp.Minimize(obj), [mp]), mus, mp


def loss_of(mus_vals, cliques, noisy, sigma):
    return sum(float(np.sum((mus_vals[c] - noisy[c]) ** 2)) for c in cliques) / (2 * sigma ** 2)


def run_mbi(dom, cliques, noisy, sigma, total, iters, time_limit, algorithm="MD"):
    if not Path(MBI_PY).exists():
        return {"status": "n/a (no mbi environment)"}
    names = sorted({a for c in cliques for a in c}, key=dom.names.index)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.npz"
        out = Path(tmp) / "out.json"
        arrays = {f"y_{k}": noisy[c].ravel() for k, c in enumerate(cliques)}
        np.savez(spec, names=np.array(names), sizes=np.array([dom[a] for a in names]),
                 cliques=json.dumps([list(c) for c in cliques]), sigma=np.full(len(cliques), sigma),
                 total=float(total), iters=int(iters), algorithm=algorithm,
                 time_limit=float(time_limit), **arrays)
        t0 = time.perf_counter()
        subprocess.run([MBI_PY, str(HERE / "_mbi_runner.py"), str(spec), str(out)],
                       capture_output=True, text=True, timeout=time_limit + 120)
        wall = time.perf_counter() - t0
        res = json.loads(out.read_text()) if out.exists() else {"status": "error: no output"}
        res["wall"] = wall
        return res


def time_to_loss(dom, cliques, noisy, sigma, total, targets, time_limit, **opts):
    """cvxdp wall time, model building included, to reach each target loss (None: not reached)."""
    hits = {t: None for t in targets}
    t0 = time.perf_counter()

    def cb(info):
        now = time.perf_counter() - t0
        for t in targets:
            if hits[t] is None and info["loss"] <= t:
                hits[t] = now
        return all(v is not None for v in hits.values())

    prob, mus, mp = build_problem(dom, cliques, noisy, sigma, total)
    prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, callback=cb, time_limit=time_limit,
               max_iters=10 ** 6, eps_rel=1e-12, check_every=opts.pop("check_every", 5), **opts)
    return hits, time.perf_counter() - t0, prob, mus, mp


def reference_optimum(dom, cliques, noisy, sigma, total):
    prob, mus, mp = build_problem(dom, cliques, noisy, sigma, total)
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    return prob.value, time.perf_counter() - t0, prob.status


def workload_error(vals, truth, cliques, total):
    return float(np.mean([np.abs(vals[c] - truth[c]).sum() / total for c in cliques]))


def fmt(x, spec=".2f"):
    return "n/a" if x is None else format(x, spec)


def section_adult(dom, data, seeds, fast, lines):
    lines.append("(a) Adult: 14 one-way + 10 random two-way marginals, sigma 10, known total")
    lines.append(f"{'seed':>4} {'mbi MD 1000 it':>15} {'mbi loss':>11} {'ours to mbi loss':>17} {'ratio':>6} "
                 f"{'optimum (Clarabel)':>19} {'Clarabel s':>10} {'ours to 1e-4':>12} {'ours loss@end':>13} "
                 f"{'cert. gap':>9} {'WE noisy':>9} {'WE ours':>8}")
    for seed in seeds:
        rng = np.random.default_rng(seed)
        cliques = adult_workload(dom, rng)
        truth, noisy = measure(dom, data, cliques, 10.0, rng)
        total = float(len(data))
        mbi = run_mbi(dom, cliques, noisy, 10.0, total, 200 if fast else 1000, 300)
        l_mbi = mbi.get("loss")
        opt, t_clar, st = reference_optimum(dom, cliques, noisy, 10.0, total)
        targets = [t for t in (l_mbi, opt * (1 + 1e-4)) if t is not None]
        hits, wall, prob, mus, mp = time_to_loss(dom, cliques, noisy, 10.0, total, targets,
                                                 30 if fast else 120)
        vals = {c: mus[c].value for c in cliques}
        we_noisy = workload_error(noisy, truth, cliques, total)
        we_ours = workload_error(vals, truth, cliques, total)
        t_mbi = mbi.get("total_time")
        ratio = (t_mbi / hits[l_mbi]) if (l_mbi is not None and hits.get(l_mbi) and t_mbi) else None
        lines.append(f"{seed:>4} {fmt(t_mbi):>15} {fmt(l_mbi, '.2f'):>11} {fmt(hits.get(l_mbi)):>17} "
                     f"{fmt(ratio, '.1f'):>6} {opt:>19.4f} {t_clar:>10.1f} {fmt(hits[opt * (1 + 1e-4)]):>12} "
                     f"{prob.value:>13.4f} {prob.solver_stats.extra_stats['gap']:>9.1e} {we_noisy:>9.5f} {we_ours:>8.5f}")
        print(lines[-1], flush=True)


def section_five(dom, data, seeds, fast, lines):
    lines.append("")
    lines.append(f"(b) five attributes {FIVE}: all one- and two-way marginals, sigma 10, known total")
    lines.append(f"{'seed':>4} {'optimum':>12} {'Clarabel s':>10} {'ours to 1e-4 s':>14} {'ours its':>8} "
                 f"{'ours loss@end':>13} {'cert. gap':>9} {'mbi MD 1000 loss':>16} {'mbi above opt':>13} {'mbi s':>7}")
    for seed in seeds:
        rng = np.random.default_rng(100 + seed)
        cliques = adult_workload(dom, rng, n_pairs=None, attrs=FIVE)
        truth, noisy = measure(dom, data, cliques, 10.0, rng)
        total = float(len(data))
        opt, t_clar, st = reference_optimum(dom, cliques, noisy, 10.0, total)
        hits, wall, prob, mus, mp = time_to_loss(dom, cliques, noisy, 10.0, total, [opt * (1 + 1e-4)],
                                                 30 if fast else 60)
        mbi = run_mbi(dom, cliques, noisy, 10.0, total, 1000, 300)
        l_mbi = mbi.get("loss")
        above = None if l_mbi is None else l_mbi / opt - 1
        lines.append(f"{seed:>4} {opt:>12.4f} {t_clar:>10.2f} {fmt(hits[opt * (1 + 1e-4)]):>14} "
                     f"{prob.solver_stats.num_iters:>8} {prob.value:>13.4f} {prob.solver_stats.extra_stats['gap']:>9.1e} "
                     f"{fmt(l_mbi, '.3f'):>16} {fmt(above, '.2%'):>13} "
                     f"{fmt(mbi.get('total_time')):>7}")
        print(lines[-1], flush=True)


def section_chain(sizes_list, fast, lines):
    lines.append("")
    lines.append("(c) chains of 3-way cliques (i, i+1, i+2), domain 10 per attribute, 10,000 records, sigma 10")
    lines.append(f"{'attrs':>6} {'ours setup s':>12} {'ours s/iter':>11} {'100 it s':>9} {'mbi setup+compile s':>19} "
                 f"{'mbi s/iter':>10} {'mbi status':>12}")
    for d in sizes_list:
        rng = np.random.default_rng(d)
        dom = cvxdp.Domain({f"x{i}": 10 for i in range(d)})
        walk = np.cumsum(rng.integers(0, 3, size=(10000, d)), axis=1) % 10
        cliques = [(f"x{i}", f"x{i + 1}", f"x{i + 2}") for i in range(d - 2)]
        truth, noisy = measure(dom, walk, cliques, 10.0, rng)
        t0 = time.perf_counter()
        prob, mus, mp = build_problem(dom, cliques, noisy, 10.0, 10000.0)
        iters = 10 if fast else 100
        # iteration speed only: no polish attempt at the last check
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT, max_iters=iters, check_every=iters,
                   polish=False)
        wall = time.perf_counter() - t0
        st = prob.solver_stats
        per = st.solve_time / max(st.num_iters, 1)
        setup = wall - st.solve_time
        mbi = run_mbi(dom, cliques, noisy, 10.0, 10000.0, 100, 180) if not fast or d <= 100 else {"status": "skipped"}
        mbi_setup = None
        if mbi.get("total_time") is not None and mbi.get("per_iter_time") is not None:
            mbi_setup = mbi["total_time"] - mbi["per_iter_time"] * mbi.get("iters", 100)
        lines.append(f"{d:>6} {setup:>12.2f} {per:>11.4f} {st.solve_time:>9.2f} {fmt(mbi_setup):>19} "
                     f"{fmt(mbi.get('per_iter_time'), '.4f'):>10} {mbi.get('status', '')[:12]:>12}")
        print(lines[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="small smoke run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sections", default="abc")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"cvxdp {cvxdp.__version__}, cvxpy {cp.__version__}, numpy {np.__version__}; "
             f"mbi python: {MBI_PY if Path(MBI_PY).exists() else 'absent'}"]
    print(lines[0], flush=True)
    if "a" in args.sections or "b" in args.sections:
        dom, data = load_adult()
    if "a" in args.sections:
        section_adult(dom, data, args.seeds[:1] if args.fast else args.seeds, args.fast, lines)
    if "b" in args.sections:
        section_five(dom, data, args.seeds[:1] if args.fast else args.seeds, args.fast, lines)
    if "c" in args.sections:
        section_chain([10, 100] if args.fast else [10, 100, 300, 1000], args.fast, lines)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
