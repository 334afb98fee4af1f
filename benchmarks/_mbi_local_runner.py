"""Benchmark-only runner: Private-PGM (``mbi`` 2.x) ``ApproxMirrorDescent`` on any clique set.

NOT part of cvxdp and never imports it (nor numpy code from this repository): it runs in its own
environment (``python3 -m venv /tmp/mbi_env && /tmp/mbi_env/bin/pip install "mbi>=2,<3"``) and is
called by ``benchmarks/local_polytope.py``::

    /tmp/mbi_env/bin/python benchmarks/_mbi_local_runner.py spec.npz out.npz

Input ``spec.npz`` (written by ``local_polytope.write_spec``): ``names``, ``sizes``, ``cliques``
(JSON), ``y_<i>`` (noisy marginal of clique i, C order over its attributes), ``kind`` ("gauss" or
"laplace"), ``scale`` (sigma or Laplace b), ``total`` (NaN: free, mbi's own minimum-variance
estimate), ``extra`` (JSON: ``iters``, ``time_limit`` s, ``check_every``, ``target`` loss or
null, ``stepsize_scale``, ``oracle_iters``).

The estimator is ``mbi.approximate_oracles.ApproxMirrorDescent`` (mirror descent whose marginal
oracle is convex generalized belief propagation with counting numbers 1, messages warm-started
between steps; McKenna et al., "Relaxed marginal consistency", 2021), called through its own
``estimate``.  Loss: mbi's ``_l2_loss`` is ``sum 0.5 ||(mu - y) / stddev||^2`` and ``_l1_loss``
``sum ||(mu - y) / stddev||_1``; with ``stddev = scale`` these are exactly the benchmark's
``||x - y||^2 / (2 sigma^2)`` and ``||x - y||_1 / b``.  The step size is fixed (the class has no
line search): ``stepsize_scale * 2 / (L * total)``, the initial step mbi's exact ``MirrorDescent``
uses, L the Lipschitz constant mbi computes for the l2 loss with the same stddevs (for the L1
loss the same formula, as a scale).

Timing: ``total_time`` runs from building the domain and the loss function (Lipschitz constant
included) to the last iterate, JIT compilation included (the compilation cache is off: cold);
every ``check_every`` iterations (inside ``callback_fn``) the current pseudo-marginals are made
ready and their loss evaluated in numpy, and that evaluation time is excluded.  ``time_to_target``
is the first such time with ``loss <= target`` (the pseudo-marginals of one oracle iteration are
only approximately locally consistent: ``consistency_l1`` reports the largest disagreement
between two cliques' marginals on a shared attribute, L1, relative to the total).

Output ``out.npz``: ``info`` (JSON: status, total_time, setup_time, first_iter_time,
per_iter_time, iters, stepsize, loss, best_loss, time_to_target, iters_to_target,
loss_at_target, consistency_at_target, checkpoints [[it, s, loss, consistency_l1]],
consistency_l1, min_cell, rss_peak_mb, mbi_version, jax_version) and ``mu_<i>`` (the final
pseudo-marginal of clique i, C order over the clique's listed attributes).
"""
import json
import math
import resource
import sys
import time
import traceback

import numpy as np


class _Stop(Exception):
    pass


def _load(path):
    with np.load(path, allow_pickle=False) as z:
        names = [str(a) for a in z["names"]]
        sizes = [int(s) for s in z["sizes"]]
        cliques = [tuple(str(a) for a in c) for c in json.loads(str(z["cliques"]))]
        ys = [np.asarray(z[f"y_{i}"], float).ravel() for i in range(len(cliques))]
        total = float(z["total"])
        return {"names": names, "sizes": sizes, "cliques": cliques, "ys": ys, "kind": str(z["kind"]),
                "scale": float(z["scale"]), "total": None if math.isnan(total) else total,
                "extra": json.loads(str(z["extra"]))}


def _tables(mu, cliques):
    out = []
    for cl in cliques:
        f = mu.project(cl)
        if tuple(f.domain.attributes) != cl:
            f = f.transpose(cl)
        out.append(np.asarray(f.datavector(), dtype=float))
    return out


def _loss(tables, ys, scale, kind):
    if kind == "gauss":
        return sum(float(np.sum((t - y) ** 2)) for t, y in zip(tables, ys)) / (2.0 * scale * scale)
    return sum(float(np.sum(np.abs(t - y))) for t, y in zip(tables, ys)) / scale


def _consistency(tables, cliques, sizes, total):
    """Largest L1 disagreement of two cliques' marginals on one shared attribute, / total."""
    worst = 0.0
    by_attr = {}
    for t, cl in zip(tables, cliques):
        arr = t.reshape([sizes[a] for a in cl])
        for i, a in enumerate(cl):
            by_attr.setdefault(a, []).append(arr.sum(axis=tuple(j for j in range(len(cl)) if j != i)))
    for margs in by_attr.values():
        m = np.array(margs)
        for k in range(len(m) - 1):
            worst = max(worst, float(np.abs(m[k + 1:] - m[k]).sum(axis=1).max()))
    return worst / max(total, 1e-300)


def main(spec_path, out_path):
    spec = _load(spec_path)
    ex = spec["extra"]
    info = {"status": "error: unfinished"}
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp
    import mbi
    from mbi import approximate_oracles, estimation, marginal_loss
    from importlib.metadata import version
    info["mbi_version"], info["jax_version"] = version("mbi"), jax.__version__

    cliques, ys, scale, kind = spec["cliques"], spec["ys"], spec["scale"], spec["kind"]
    sizes = dict(zip(spec["names"], spec["sizes"]))
    iters, check, limit = int(ex["iters"]), int(ex.get("check_every", 10)), float(ex["time_limit"])
    target = ex.get("target")
    records, excluded, t0 = [], 0.0, None
    last = {"mu": None, "it": 0}

    def callback(mu):
        nonlocal excluded
        last["it"] += 1
        last["mu"] = mu
        if last["it"] == 1:
            jax.block_until_ready(mu)
            info["first_iter_time"] = time.perf_counter() - t0 - excluded
        if last["it"] % check and last["it"] != iters:
            return
        jax.block_until_ready(mu)
        t_ready = time.perf_counter()
        now = t_ready - t0 - excluded
        tables = _tables(mu, cliques)
        loss = _loss(tables, ys, scale, kind)
        viol = _consistency(tables, cliques, sizes, total)
        records.append([last["it"], now, loss, viol])
        if target is not None and info.get("time_to_target") is None and loss <= target:
            info.update(time_to_target=now, iters_to_target=last["it"], loss_at_target=loss,
                        consistency_at_target=viol)
        excluded += time.perf_counter() - t_ready
        if now > limit:
            raise _Stop

    t0 = time.perf_counter()
    domain = mbi.Domain(spec["names"], spec["sizes"])
    ms = [mbi.LinearMeasurement(jnp.asarray(y), cl, stddev=scale) for cl, y in zip(cliques, ys)]
    loss_fn = marginal_loss.from_linear_measurements(ms, domain, norm="l2" if kind == "gauss" else "l1")
    lip = loss_fn.lipschitz if kind == "gauss" else \
        marginal_loss.from_linear_measurements(ms, domain, norm="l2").lipschitz
    total = spec["total"] if spec["total"] is not None else estimation.minimum_variance_unbiased_total(ms)
    stepsize = float(ex.get("stepsize_scale", 1.0)) * 2.0 / (float(lip) * total)
    est = approximate_oracles.ApproxMirrorDescent(stepsize=stepsize,
                                                  oracle_iters=int(ex.get("oracle_iters", 1)))
    info["setup_time"] = time.perf_counter() - t0
    status = "ok"
    try:
        mu = est.estimate(domain, loss_fn, known_total=total, iters=iters, callback_fn=callback)
        jax.block_until_ready(mu)
    except _Stop:
        mu, status = last["mu"], f"time limit {limit:.0f} s"
    total_time = time.perf_counter() - t0 - excluded

    tables = _tables(mu, cliques)
    info.update(status=status, total_time=total_time, iters=last["it"], stepsize=stepsize,
                lipschitz=float(lip), total=float(total), loss=_loss(tables, ys, scale, kind),
                checkpoints=records, best_loss=min((r[2] for r in records), default=None),
                consistency_l1=_consistency(tables, cliques, sizes, total),
                min_cell=float(min(t.min() for t in tables)))
    if len(records) >= 2:
        (i0, s0), (i1, s1) = records[0][:2], records[-1][:2]
        info["per_iter_time"] = (s1 - s0) / max(i1 - i0, 1)
    info["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    arrays = {f"mu_{i}": t for i, t in enumerate(tables)}
    np.savez(out_path, info=json.dumps(info), **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        sys.exit(2)
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception:  # noqa: BLE001 - the parent reports the last stderr line
        traceback.print_exc()
        sys.exit(1)
