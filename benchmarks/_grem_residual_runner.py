"""Benchmark-only runner: GReM-LNN (Mullins, Miklau, Sheldon, NeurIPS 2024) on residual answers.

NOT part of cvxdp and never imports it.  It runs the published code of
bcmullins/efficient-marginal-reconstruction (package ``rem``; not vendored here) in its own
environment, set up as the docstring of ``benchmarks/_grem_runner.py`` says, and is called by
``benchmarks/marginal_workloads.py`` (section ``nonneg``)::

    /tmp/grem_env/bin/python benchmarks/_grem_residual_runner.py spec.npz out.npz

The input is one answer per residual of the workload's downward closure, already in ``rem``'s
residual basis (``rem.algebra.ResidualWorkload2``: on every attribute of ``A`` the contrast rows
``e_i - e_{i+1}``, the total on the others) with its noise scale: the release ``D_A (m_A + e)``,
``e ~ N(0, sigma_A^2 I)`` on the cells of the marginal ``m_A``, the noise model ``rem`` itself
assumes (covariance ``sigma_A^2 D_A D_A^T``; its own ``residualPlanner`` mechanism draws answers
this way).  The caller converts cvxdp's measurement (``marginal_workloads.grem_spec``).

Spec (``np.savez``): ``names``, ``sizes`` (the domain, in its order), ``cliques`` and
``residuals`` (JSON lists of attribute lists, each in domain order), ``ans_<j>`` (the answers of
residual ``j``, C order over its attributes; the total: one entry), ``sigmas`` (``sigma_A`` per
residual) and ``extra`` (JSON):

    variant      "published": ``gremLNN(target_marginals, residuals, res_answers, res_sigmas)``
                 as the repository's demo calls it (on ResidualPlanner's residuals: one answer per
                 residual).  Its dual ascent weights residual ``A`` by ``1 / (2^|A|)^2`` whatever
                 ``res_sigmas`` says (``gremLNN.__init__`` builds ``dualAscent`` with ``sigmas =
                 [2 ** len(tup) ...]``; ``res_sigmas`` is stored and not read).
                 "true-sigma": the same object with its optimizer's ``sigmas`` attribute (the
                 per-residual noise scales its dual ascent reads) set to the measurement's
                 ``sigma_A``: then its problem is the residual likelihood under local
                 non-negativity with a free total, cvxdp's ``nll`` + ``LocalPolytope(total=None)``.
    t, lam, t_div, early_stopping, reg_param
                 the dual ascent's arguments (defaults: the demo's ``t = 0.01``, the other
                 ``gremLNN.solve`` defaults -0.1, 10, 0.01, 1).
    rounds       the round limit passed to ``dualAscent.solveLooping`` (``gremLNN.solve`` passes
                 4001, its published limit; the default).
    time_limit   seconds (optional): three rounds are run first and timed, and the round limit
                 lowered to what fits in the rest of the time (the dual ascent has no time limit
                 of its own, and its iterate is only written out when ``solveLooping`` returns).
    mle          also return GReM-MLE's marginals (``gremMLE(...).getMarginals()``, its
                 unconstrained reconstruction) for the check against ``cvxdp.reconstruct``.
    threads      torch threads (default 1).

Its solver prints, every round, ``objective_main`` (the weighted residual misfit) and
``-sum_C lambda_C . mu_C`` (its "dual_gap_stats": the complementary-slackness term of the
Lagrangian at the current multipliers, not a bound on the suboptimality of anything), and at rounds
0, 100, 200, ... the minimum cell and the negative mass of every marginal.  Its stopping rules:
at a round ``i > 200`` with ``i % 100 == 0``, total negative mass above -1; at ``i > 400``,
``|lambda . mu| < early_stopping``; a NaN objective restarts it with ``t / t_div``.  The runner
reads those lines (it parses them; it does not change the solver) to count rounds and report the
last values.  GReM-LNN returns no certificate of optimality.

Output ``out.npz``: ``info`` (JSON: status, variant, setup_time, solve_time, total_time, rounds,
restarts, round_limit, seconds_per_round, stop, marginals_time (``getMarginals``), last_objective_main, last_lam_mu,
last_neg_mass_printed, min_cell, neg_mass, total, rss_peak_mb, torch_version, dtype, threads,
mle_time), ``mu_<i>`` (GReM-LNN's marginal on clique ``i``, float64 of its float32) and, with
``mle``, ``mle_<i>``.
"""
import contextlib
import json
import os
import resource
import sys
import time
import traceback

import numpy as np


class _Trace:
    """A stdout sink that reads the dual ascent's printed lines (module docstring)."""

    def __init__(self):
        self.buf = ""
        self.rounds = 0            # rounds of the current solve_regularization call
        self.rounds_total = 0
        self.restarts = 0
        self.last = (float("nan"), float("nan"))
        self.lists = 0             # list lines seen in the current call
        self.last_neg_mass = float("nan")
        self.times = []

    def write(self, s):
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._line(line.strip())
        return len(s)

    def flush(self):
        pass

    def _line(self, line):
        if not line:
            return
        if line.startswith("["):
            self.lists += 1
            if self.lists % 2 == 0:     # min-cell list, then negative-mass list
                vals = [float(v) for v in line.strip("[]").split(",") if v.strip()]
                self.last_neg_mass = float(np.sum(vals))
            return
        parts = line.split()
        if len(parts) == 2:
            try:
                a, b = float(parts[0]), float(parts[1])
            except ValueError:
                return
            self.rounds += 1
            self.rounds_total += 1
            self.times.append(time.perf_counter())
            self.last = (a, b)
            if np.isnan(a) or np.isnan(b):
                self.restarts += 1
                self.rounds = 0
                self.lists = 0


def main(spec_path, out_path):
    with np.load(spec_path, allow_pickle=False) as z:
        names = [str(a) for a in z["names"]]
        sizes = [int(s) for s in z["sizes"]]
        cliques = [tuple(str(a) for a in c) for c in json.loads(str(z["cliques"]))]
        res_tups = [tuple(str(a) for a in c) for c in json.loads(str(z["residuals"]))]
        answers = [np.asarray(z[f"ans_{j}"], float).ravel() for j in range(len(res_tups))]
        sigmas = [float(s) for s in z["sigmas"]]
        extra = json.loads(str(z["extra"]))
    import torch
    from rem.algebra import MarginalWorkload, ResidualWorkload2, VStack
    from rem.domain import Domain
    from rem.reconstruction import gremLNN, gremMLE

    torch.set_num_threads(int(extra.get("threads", 1)))
    variant = extra.get("variant", "published")
    if variant not in ("published", "true-sigma"):
        raise ValueError(f"variant {variant!r}")
    kw = {"lam": float(extra.get("lam", -0.1)), "t": float(extra.get("t", 0.01)),
          "t_div": float(extra.get("t_div", 10)),
          "early_stopping": float(extra.get("early_stopping", 0.01)),
          "reg_param": float(extra.get("reg_param", 1))}
    rounds = int(extra.get("rounds", 4001))
    time_limit = extra.get("time_limit")
    info = {"torch_version": torch.__version__, "dtype": "float32", "threads": torch.get_num_threads(),
            "variant": variant, "solver_args": kw}
    t0 = time.perf_counter()
    domain = Domain(names, sizes)
    for cl in cliques + res_tups:   # Kronecker factors follow the domain's order
        assert list(cl) == sorted(cl, key=names.index), cl
    targets = VStack([MarginalWorkload(cl, domain) for cl in cliques])
    residuals = VStack([ResidualWorkload2(cl, domain) for cl in res_tups])
    y = [torch.tensor(v, dtype=torch.float32) for v in answers]
    trace = _Trace()
    arrays = {}
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        if extra.get("mle"):
            a = time.perf_counter()
            with contextlib.redirect_stdout(null):
                mle = gremMLE(target_marginals=targets, residuals=residuals, res_answers=y,
                              res_sigmas=sigmas).getMarginals()
            arrays.update({f"mle_{i}": np.asarray(m.detach().numpy(), float).ravel()
                           for i, m in enumerate(mle)})
            info["mle_time"] = time.perf_counter() - a
            t0 += info["mle_time"]             # not part of GReM-LNN's time
        glnn = gremLNN(target_marginals=targets, residuals=residuals, res_answers=y, res_sigmas=sigmas)
        if variant == "true-sigma":
            glnn.optimizer.sigmas = list(sigmas)
        t1 = time.perf_counter()
        with contextlib.redirect_stdout(trace):
            if time_limit is not None and rounds > 3:
                glnn.optimizer.solveLooping(rounds=3, **kw)    # three timed rounds
                probe = time.perf_counter() - t1
                per = (trace.times[-1] - trace.times[0]) / 2 if len(trace.times) == 3 else probe / 3
                fixed = max(probe - 3 * per, 0.0)           # its per-call set-up and final stats
                info.update(probe_time=probe, probe_seconds_per_round=per, probe_fixed=fixed)
                rounds = int(max(1, min(rounds, (float(time_limit) - probe - fixed) // per)))
                trace.rounds_total = trace.rounds = trace.restarts = trace.lists = 0
                trace.times = []
            t2 = time.perf_counter()
            glnn.optimizer.solveLooping(rounds=rounds, **kw)
            glnn.running_time = glnn.optimizer.running_time
        t3 = time.perf_counter()
        mus = [np.asarray(m.detach().numpy(), float).ravel() for m in glnn.getMarginals()]
        t4 = time.perf_counter()
    done = trace.rounds
    if done >= rounds:
        stop = f"round limit {rounds}"
    elif (done - 1) % 100 == 0 and done - 1 > 200 and trace.last_neg_mass > -1:
        stop = f"its rule: negative mass {trace.last_neg_mass:.3g} > -1 at round {done - 1}"
    else:
        stop = f"its rule: |lambda.mu| = {abs(trace.last[1]):.3g} < {kw['early_stopping']} at round {done - 1}"
    spr = float(np.mean(np.diff([t2] + trace.times))) if trace.times else float("nan")
    solve = (t3 - t2) + (t4 - t3)      # the timed probe round (time_limit) is not counted
    info.update(status="ok", setup_time=t1 - t0, solve_time=solve, total_time=(t1 - t0) + solve,
                rounds=trace.rounds_total, rounds_last_call=done, restarts=trace.restarts,
                round_limit=rounds, seconds_per_round=spr, stop=stop, marginals_time=t4 - t3,
                last_objective_main=trace.last[0], last_lam_mu=trace.last[1],
                last_neg_mass_printed=trace.last_neg_mass,
                total=float(np.mean([m.sum() for m in mus])), min_cell=float(min(m.min() for m in mus)),
                neg_mass=float(sum(np.minimum(m, 0).sum() for m in mus)),
                rss_peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    arrays.update({f"mu_{i}": m for i, m in enumerate(mus)})
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
