"""AIM on Adult through OpenDP: mbi's mirror descent vs cvxdp as the estimator.

What it measures
----------------
OpenDP's AIM (``opendp.extras.mbi.AIM``, run through ``Context.contingency_table``) on the first
``K`` attributes of the Adult data set, once with OpenDP's default estimator (``estimator =
opendp.extras.mbi.mirror_descent``, i.e. ``mbi.estimation.mirror_descent`` with its default 1000
iterations, warm-started from the previous round's potentials) and once with cvxdp's
(``cvxdp.synth.with_cvxdp(AIM(...))``).  Everything else -- data, privacy budget, workload,
``max_size``, round cap -- is the same.  For each method it reports

* ``time``: wall time of the whole release (``.release()``: one-way marginals, every AIM round
  with its selection, measurement and estimation, the final fit), and the part of it spent in
  the estimator (``est.time``);
* ``calls``: estimator calls (the fit after the one-way marginals, then one per AIM round);
  ``meas``: measurements released in the end (``len(table.marginals.flatten())``, including the
  one-way marginals and OpenDP's zero-way total);
* ``cliques``: how many distinct cliques were measured, and the largest one's cell count;
* ``werr``: workload error, the average over the workload's marginals (all ``--queries``-way
  marginals of the ``K`` attributes, AIM's workload) of ``|| M_model - M_true ||_1 / N``, where
  ``M_model`` is the final model's marginal (in counts, at the model's own total) and
  ``M_true`` the true one, ``N`` the number of records.  No synthetic records are drawn: the
  model's marginals are what the synthetic data would follow, without the sampling/rounding noise.
* ``total``: the model's total (``N`` is printed in the header).

How to run
----------
Needs OpenDP 0.16 + mbi 1.1 + cvxdp (``pip install -e ".[test,mbi]"``), e.g.::

    python3 -m venv /tmp/venv-mbi && /tmp/venv-mbi/bin/pip install -e ".[test,mbi]"
    /tmp/venv-mbi/bin/python benchmarks/aim.py --attributes 6 --epsilon 1 --rounds 32 \\
        --only mbi --out /tmp/aim_mbi.txt        # then --only cvxdp (see Caveats)

Options: ``--attributes K`` (first K columns of Adult, default 6), ``--epsilon``/``--delta`` (the
(eps, delta)-DP budget, converted to zCDP ``rho`` -- OpenDP's AIM uses Gaussian noise under
zCDP -- by ``rho = (sqrt(eps + log(1/delta)) - sqrt(log(1/delta)))^2``; or give ``--rho``
directly), ``--rounds`` (AIM's cap ``T`` on the number of rounds; OpenDP's default is ``16 K``:
the per-round budget starts at ``rho / T``), ``--queries`` (workload degree), ``--max-size``
(AIM's model-size cap in MB), ``--rows`` (a seeded subsample of the records), ``--seed``,
``--only mbi,cvxdp``, ``--eps-rel`` (cvxdp's certified relative gap), ``--out``.

Caveats
-------
* Randomness: ``--seed`` fixes only the data handling (the optional subsample).  OpenDP draws its
  noise and the exponential-mechanism selections from its own cryptographically secure RNG,
  which cannot be seeded: the two runs see *different* noise and may select different cliques and
  a different number of rounds, so one run per method is one sample, not a paired comparison.
  Repeat the runs to see the spread before reading much into small differences in ``werr``.
* The estimators do not solve the same problem in detail: mbi's mirror descent stops after a fixed
  iteration count and fixes the total beforehand; cvxdp stops on a certified gap and fits the total
  (``cvxdp.synth``'s docstring).  The selection step of each round depends on the previous model,
  so the estimator also changes which cliques get measured.
* The Adult file is pre-encoded (integers ``0..size-1``, sizes from ``adult-domain.json``);
  every attribute is keyed with ``range(size)``, so OpenDP adds one null category per attribute
  (never occupied) and spends no ``delta`` on key discovery.
* Run one method per process (``--only mbi``, then ``--only cvxdp``) to compare whole-release
  times: with both in one process the first one also pays ~40-60 s of one-off import and JAX
  compilation (OpenDP's selection step projects the model with mbi's JAX code whichever estimator
  is used) that the second does not.  ``est.time`` is unaffected.
* With K=6 and ``--rounds 32`` a method takes 2-3 minutes here; OpenDP's default cap ``16 K``
  (96 for K=6) and larger K take several times longer.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

DATA = Path("/work/shared/data/adult")


def load(k: int, rows: int | None, seed: int):
    import polars as pl
    domain = json.loads((DATA / "adult-domain.json").read_text())
    df = pl.read_csv(DATA / "adult.csv")
    cols = list(domain)[:k]
    df = df.select(cols).cast(pl.Int64)
    if rows is not None and rows < df.height:
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(df.height, size=rows, replace=False))
        df = df[idx]
    sizes = {c: int(domain[c]) for c in cols}
    for c in cols:
        assert df[c].min() >= 0 and df[c].max() < sizes[c], c
    return df, sizes


def rho_of(eps: float, delta: float) -> float:
    L = math.log(1 / delta)
    return (math.sqrt(eps + L) - math.sqrt(L)) ** 2


def true_marginal(data: np.ndarray, cols: list[str], clique, shape) -> np.ndarray:
    idx = [cols.index(a) for a in clique]
    flat = np.ravel_multi_index(tuple(data[:, idx].T), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).astype(float)


def run(method: str, args, df, sizes, rho: float) -> dict:
    import opendp.prelude as dp
    import cvxdp.synth
    dp.enable_features("contrib")

    base = dp.mbi.AIM(queries=args.queries, rounds=args.rounds, max_size=args.max_size)
    alg = base if method == "mbi" else cvxdp.synth.with_cvxdp(base, eps_rel=args.eps_rel)
    inner = alg.estimator
    stats = {"calls": 0, "est_time": 0.0}

    def timed(domain, measurements, **kw):
        t = time.perf_counter()
        try:
            return inner(domain, measurements, **kw)
        finally:
            stats["calls"] += 1
            stats["est_time"] += time.perf_counter() - t
            print(f"  [{method}] estimator call {stats['calls']}: {len(measurements)} measurements, "
                  f"{time.perf_counter() - t:.2f}s", file=sys.stderr, flush=True)

    alg = replace(alg, estimator=timed)
    cols = list(sizes)
    keys = {c: list(range(sizes[c])) for c in cols}
    context = dp.Context.compositor(data=df.lazy(), privacy_unit=dp.unit_of(contributions=1),
                                    privacy_loss=dp.loss_of(rho=rho))
    t0 = time.perf_counter()
    table = (context.query(rho=rho).select(*cols)
             .contingency_table(keys=keys, algorithm=alg).release())
    wall = time.perf_counter() - t0

    model = table.model
    for c in cols:     # data value v is key index v; OpenDP appends the null category last
        assert table.keys[c].head(sizes[c]).to_list() == keys[c], c
    data = df.select(cols).to_numpy()
    n = data.shape[0]
    errs = []
    for clique in itertools.combinations(cols, min(args.queries, len(cols))):
        shape = tuple(int(model.domain.config[a]) for a in clique)
        truth = true_marginal(data, cols, clique, shape)
        est = np.asarray(model.project(list(clique)).datavector(), dtype=float)
        errs.append(float(np.abs(est - truth).sum()) / n)
    ms = table.marginals.flatten()
    cliques = list(dict.fromkeys(tuple(m.clique) for m in ms))
    largest = max(int(np.prod([model.domain.config[a] for a in cl])) if cl else 1 for cl in cliques)
    return dict(method=method, time=wall, est_time=stats["est_time"], calls=stats["calls"],
                meas=len(ms), cliques=len(cliques), largest=largest,
                werr=float(np.mean(errs)), werr_max=float(np.max(errs)),
                total=float(model.total), n_workload=len(errs))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attributes", type=int, default=6, help="first K attributes of Adult")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-9)
    p.add_argument("--rho", type=float, default=None, help="zCDP budget (overrides --epsilon)")
    p.add_argument("--rounds", type=int, default=None,
                   help="AIM's round cap T (OpenDP default 16 K)")
    p.add_argument("--queries", type=int, default=3, help="workload degree (AIM's queries)")
    p.add_argument("--max-size", type=float, default=80.0, help="AIM's model-size cap, MB")
    p.add_argument("--rows", type=int, default=None, help="seeded subsample of the records")
    p.add_argument("--seed", type=int, default=0, help="seed of the data handling only")
    p.add_argument("--eps-rel", type=float, default=1e-6, help="cvxdp's relative gap")
    p.add_argument("--only", default="mbi,cvxdp")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    methods = [m.strip() for m in args.only.split(",") if m.strip()]
    bad = set(methods) - {"mbi", "cvxdp"}
    if bad:
        p.error(f"unknown methods {sorted(bad)}")
    rho = args.rho if args.rho is not None else rho_of(args.epsilon, args.delta)
    df, sizes = load(args.attributes, args.rows, args.seed)
    budget = (f"rho={rho:.6g}" if args.rho is not None
              else f"epsilon={args.epsilon:g}, delta={args.delta:g} -> rho={rho:.6g}")
    head = [
        f"AIM on Adult (OpenDP {_version('opendp')}, mbi {_version('mbi')}): "
        f"N={df.height} records, K={len(sizes)} attributes {list(sizes)}",
        f"  domain sizes {list(sizes.values())}; {budget}; rounds cap T="
        f"{args.rounds or 16 * len(sizes)}; queries={args.queries}; max_size={args.max_size} MB; "
        f"cvxdp eps_rel={args.eps_rel:g}; data seed {args.seed} "
        f"(OpenDP's noise comes from its own unseedable RNG)",
    ]
    print("\n".join(head), flush=True)
    rows = []
    for m in methods:
        r = run(m, args, df, sizes, rho)
        rows.append(r)
        print(f"  {m}: {r['time']:.1f}s, werr {r['werr']:.4f}", flush=True)
    hdr = (f"{'method':<7} {'time[s]':>8} {'est.time':>9} {'calls':>6} {'meas':>5} {'cliques':>8} "
           f"{'largest':>8} {'werr':>8} {'werr.max':>9} {'total':>10}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r['method']:<7} {r['time']:8.1f} {r['est_time']:9.1f} {r['calls']:6d} "
                     f"{r['meas']:5d} {r['cliques']:8d} {r['largest']:8d} {r['werr']:8.4f} "
                     f"{r['werr_max']:9.4f} {r['total']:10.1f}")
    lines.append(f"werr: mean over the {rows[0]['n_workload'] if rows else 0} {args.queries}-way "
                 f"workload marginals of ||M_model - M_true||_1 / N (werr.max: the worst one)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        cmd = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"$ {cmd}\n\n" + "\n".join(head) + "\n\n" + text + "\n")
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version, PackageNotFoundError
    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())
