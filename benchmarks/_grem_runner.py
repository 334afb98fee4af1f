"""Benchmark-only runner: GReM-LNN (Mullins, Miklau, Sheldon, NeurIPS 2024) on noisy marginals.

NOT part of cvxdp and never imports it.  It runs the published code of
bcmullins/efficient-marginal-reconstruction (package ``rem``; not vendored here) in its own
environment, e.g.::

    python3 -m venv /tmp/grem_env
    /tmp/grem_env/bin/pip install torch            # the CPU build (about 0.75 GB installed)
    /tmp/grem_env/bin/pip install linear_operator tqdm pandas scipy numpy
    /tmp/grem_env/bin/pip install --no-deps <a checkout of that repository>

and is called by ``benchmarks/local_polytope.py``::

    /tmp/grem_env/bin/python benchmarks/_grem_runner.py spec.npz out.npz

Input: the spec of ``local_polytope.write_spec`` (``names``, ``sizes``, ``cliques``, ``y_<i>``,
``scale`` = sigma; ``extra``: ``t``, the dual ascent's initial step; ``threads``, torch threads,
default 1).  The pipeline is the
repository's demo for measured marginals: ``VStack(MarginalWorkload).decomposeIntoResiduals(y,
sigma)`` then ``gremLNN(target_marginals, residuals, res_answers, res_sigmas).solve(t=t)`` and
``getMarginals()`` (its dual ascent on the local non-negativity constraints; the total is free;
torch float32, as published).  The unmeasured ``targets`` are answered by the same
reconstruction, ``(VStack(MarginalWorkload(targets)) @ residuals_all.pinv()) @ z``, with the
residuals the method did not estimate set to zero.  Its per-round printing goes to /dev/null.

Output ``out.npz``: ``info`` (JSON: status, total_time, setup_time (decomposition), solve_time,
total, min_cell, neg_mass, target_neg_mass (of the unmeasured answers), dtype, threads,
rss_peak_mb, torch_version) and ``mu_<i>``, ``t_<i>``.
"""
import contextlib
import json
import os
import resource
import sys
import time
import traceback

import numpy as np


def main(spec_path, out_path):
    with np.load(spec_path, allow_pickle=False) as z:
        names = [str(a) for a in z["names"]]
        sizes = [int(s) for s in z["sizes"]]
        cliques = [tuple(str(a) for a in c) for c in json.loads(str(z["cliques"]))]
        targets = [tuple(str(a) for a in c) for c in json.loads(str(z["targets"]))]
        ys = [np.asarray(z[f"y_{i}"], float).ravel() for i in range(len(cliques))]
        sigma = float(z["scale"])
        extra = json.loads(str(z["extra"]))
    import torch
    from rem.algebra import MarginalWorkload, VStack
    from rem.domain import Domain
    from rem.reconstruction import gremLNN

    torch.set_num_threads(int(extra.get("threads", 1)))  # 2 threads: 3x slower on 2 cores
    info = {"torch_version": torch.__version__, "dtype": "float32", "threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    domain = Domain(names, sizes)
    # Kronecker factors follow the domain's order: cliques must list attributes in that order
    for cl in cliques + targets:
        assert list(cl) == sorted(cl, key=names.index), cl
    marginals = VStack([MarginalWorkload(cl, domain) for cl in cliques])
    y = [torch.tensor(v, dtype=torch.float32) for v in ys]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        residuals, res_answers, res_sigmas = marginals.decomposeIntoResiduals(y=y, sigma=[sigma] * len(y))
        t1 = time.perf_counter()
        glnn = gremLNN(target_marginals=marginals, residuals=residuals, res_answers=res_answers,
                       res_sigmas=res_sigmas)
        glnn.solve(t=float(extra.get("t", 0.01)))
        mus = [np.asarray(m.detach().numpy(), float).ravel() for m in glnn.getMarginals()]
        t2 = time.perf_counter()
        tmus = []
        if targets:
            tw = VStack([MarginalWorkload(t, domain) for t in targets])
            tmus = [np.asarray(m.detach().numpy(), float).ravel()
                    for m in (tw @ glnn.optimizer.residuals_all.pinv()) @ glnn.z]
    info.update(status="ok", total_time=t2 - t0, setup_time=t1 - t0, solve_time=t2 - t1,
                total=float(np.mean([m.sum() for m in mus])), min_cell=float(min(m.min() for m in mus)),
                neg_mass=float(sum(np.minimum(m, 0).sum() for m in mus)),
                target_neg_mass=float(sum(np.minimum(m, 0).sum() for m in tmus)),
                rss_peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    arrays = {f"mu_{i}": m for i, m in enumerate(mus)}
    arrays.update({f"t_{i}": m for i, m in enumerate(tmus)})
    np.savez(out_path, info=json.dumps(info), **arrays)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__.split("\n\n")[2] + "\n")
        sys.exit(2)
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception:  # noqa: BLE001 - the parent reports the last stderr line
        traceback.print_exc()
        sys.exit(1)
