"""Benchmark-only runner: ResidualPlanner's published design code (Xiao, Wang, Ding, Kifer,
NeurIPS 2023; dkifer/ResidualPlanner, GPL: run, never copied) on a marginal workload.

NOT part of cvxdp and never imports it.  It runs ``residual_planner/selection_only/
class_maxvar.py`` (``RPMaxVar``: per-marginal variance bounds, the max-variance design) from a
checkout of that repository in its own environment, e.g.::

    git clone https://github.com/dkifer/ResidualPlanner /tmp/rp/src
    python3 -m venv /tmp/rp_env && /tmp/rp_env/bin/pip install numpy scipy cvxpy

and is called by ``benchmarks/marginal_workloads.py``::

    /tmp/rp_env/bin/python benchmarks/_residualplanner_runner.py spec.json out.json

Input ``spec.json``: ``src`` (the checkout), ``sizes``, ``cliques`` (attribute index lists),
``targets`` (one variance bound per clique).  The pipeline is the repository's: one
``input_mech(clique, bound)`` per clique (the coefficients, built in Python loops), then
``get_noise_level(solver="cvxpy")`` (cvxpy's default solver on ``min sum p / x`` s.t. ``A x <=
b``, ``x >= 0``).  The module imports ``gurobipy`` for its other path; without it installed an
empty stand-in module is registered first, so that cvxpy's default is the open-source solver
it picks for this cone program (with ``gurobipy`` installed cvxpy picks Gurobi, whose
size-limited licence fails at these sizes).  Output ``out.json``: ``build_time``, ``solve_time``, ``objective``,
``max_violation`` (of ``A x <= b``, relative to ``b``), ``rss_peak_mb``, ``status``.
"""
import json
import resource
import sys
import time
import traceback
import types

import numpy as np


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    out = {"status": "error"}
    try:
        sys.path.insert(0, spec["src"] + "/residual_planner/selection_only")
        import cvxpy  # noqa: F401  (first: it lists the installed solvers on import)
        try:
            import gurobipy  # noqa: F401
        except ImportError:
            stand_in = types.ModuleType("gurobipy")
            stand_in.GRB = types.SimpleNamespace()
            sys.modules["gurobipy"] = stand_in
        from class_maxvar import RPMaxVar
        if sys.modules.get("gurobipy") is not None and not hasattr(sys.modules["gurobipy"], "Model"):
            del sys.modules["gurobipy"]
        t0 = time.perf_counter()
        system = RPMaxVar(list(spec["sizes"]))
        for att, bound in zip(spec["cliques"], spec["targets"]):
            system.input_mech(tuple(att), float(bound))
        t1 = time.perf_counter()
        obj = system.get_noise_level(solver="cvxpy")
        t2 = time.perf_counter()
        coeff, A, b = system.output_coeff()
        viol = float(np.max((A @ system.var - b) / b))
        out = {"status": "ok", "build_time": t1 - t0, "solve_time": t2 - t1,
               "objective": float(obj), "max_violation": viol}
    except Exception:
        out["error"] = traceback.format_exc()[-2000:]
    out["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
