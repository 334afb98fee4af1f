"""Benchmark-only runner for the reference implementation Private-PGM (``mbi`` 2.x).

This script is NOT part of cvxdp and must never import it.  It runs in its own
environment (a separate venv with ``pip install "mbi>=2,<3" numpy``, e.g.
``/tmp/mbi_env``) and is called by the benchmark as a subprocess::

    /tmp/mbi_env/bin/python benchmarks/_mbi_runner.py spec.npz out.json

Input ``spec.npz``:

    names        str array      attribute names
    sizes        int array      domain size of each attribute
    cliques      str (0-d)      JSON list of lists of attribute names, one per measurement
    y_<k>        float array    noisy marginal of measurement k, flattened C-order over
                                its clique's attributes in the listed order
    sigma        float array    noise standard deviation of each measurement
    total        float          the known number of records
    iters        int            iterations of the estimator
    algorithm    str            "MD" mirror descent (default; Armijo line search),
                                "DA" regularized dual averaging, "IG" interior gradient,
                                "LBFGS", "UAM" universal accelerated method
    checkpoints  int array      (optional) iteration counts at which to record the loss
    time_limit   float          (optional) seconds for the whole child process
    warm         bool           (optional) also time a second, warm estimate in the
                                same process (reported as warm_total_time, warm_loss)

Output ``out.json``:

    status         "ok" | "timeout" | "error: ..."
    total_time     s, end to end: domain + measurements + loss function (incl. mbi's
                   Lipschitz constant) + estimator init + JIT compile + iterations +
                   finalisation (excludes importing jax/mbi, reported as import_time,
                   and the time spent evaluating checkpoint losses)
    setup_time     s, building the domain, measurements and loss function
    per_iter_time  s, from the block timings after the first (compiled) block
    compile_time   s, first block minus setup minus its iterations at per_iter_time:
                   estimator init (mbi runs it eagerly, op by op: for Adult ~half of
                   this) + tracing + XLA compile of the fused block; an estimate
    loss           sum_k ||mu_k - y_k||^2 / (2 sigma_k^2) at the final estimate
    mbi_loss       the same objective as evaluated by mbi itself (a cross-check)
    iters          iterations actually run (mbi runs whole blocks; see ``block``)
    block          iterations per fused (jax.lax.scan) block
    block_times    cumulative s at the end of each block (same clock as total_time)
    checkpoints    [{"iters": t, "time": cumulative s, "loss": L}, ...]
    model_total    sum of the model's marginal on the first clique (should equal total)
    mbi_version, jax_version, algorithm, import_time

Objective.  mbi 2.x's l2 loss (``marginal_loss._l2_loss``) is
``sum_k 0.5 * ||(Q_k mu_k - y_k) / stddev_k||^2``: per measurement the squared
residual divided by stddev squared, times one half.  With the identity query
(``DatavectorQuery``) and ``stddev = sigma_k`` this is exactly this project's
``sum_k ||mu_k - y_k||^2 / (2 sigma_k^2)``, so measurements are passed unscaled.
The known total is passed as ``known_total`` so both optimise over the same set
(marginals of a distribution scaled to ``total``).  ``mbi_loss`` reports mbi's
own value of the objective at the returned model as a check.

Checkpoints and timing.  mbi's ``Estimator.estimate`` runs the iterations in
fused blocks of ``mbi.estimation.CALLBACK_EVERY`` (50) steps and calls
``callback_fn`` after each block.  The runner sets the block size to
gcd(50, iters, *checkpoints), records the wall time at the end of every block in
the callback (after ``jax.block_until_ready``, since JAX dispatch is
asynchronous) and, at checkpoint blocks, evaluates the loss of the current
iterate in a single run (no re-runs); the time spent evaluating it is excluded
from all reported times.  To give the callback the *current* iterate (for MD the
first state field holds the marginals at the start of the block's last step),
the estimator's ``_callback_value`` hook is overridden to return the state
lazily: MD computes the marginals of the current potentials, the others use
mbi's own ``_callback_value``.  For DA/IG/UAM, mbi's ``estimate`` would finish by
fitting potentials to the final iterate with a 1000-iteration L-BFGS MLE (only
needed for synthetic data, and minutes long); the runner's ``_finalize`` returns
the iterate's marginals instead, so ``loss`` is at the iterate, as for MD.

Time limit.  The parent process (which imports neither jax nor mbi) runs the
estimate in a child process (this script with ``--child``) and kills it after
``time_limit`` seconds, reporting "timeout" with the checkpoints reached so far.
"""
import json
import math
import os
import subprocess
import sys
import time
import traceback

import numpy as np

DEFAULT_BLOCK = 50


def _load_spec(path):
    with np.load(path, allow_pickle=False) as z:
        spec = {key: z[key] for key in z.files}
    names = [str(a) for a in spec["names"]]
    sizes = [int(n) for n in spec["sizes"]]
    cliques = [tuple(str(a) for a in cl) for cl in json.loads(str(spec["cliques"]))]
    sigma = np.asarray(spec["sigma"], dtype=float).ravel()
    if len(sigma) != len(cliques):
        raise ValueError(f"{len(cliques)} cliques but {len(sigma)} sigmas")
    config = dict(zip(names, sizes))
    ys = []
    for k, cl in enumerate(cliques):
        y = np.asarray(spec[f"y_{k}"], dtype=float).ravel()
        if len(set(cl)) != len(cl) or not set(cl) <= set(names):
            raise ValueError(f"bad clique {cl}")
        expected = int(np.prod([config[a] for a in cl]))
        if y.size != expected:
            raise ValueError(f"y_{k} has {y.size} entries, clique {cl} has {expected}")
        ys.append(y)
    checkpoints = sorted({int(t) for t in np.ravel(spec.get("checkpoints", []))})
    return {
        "names": names,
        "sizes": sizes,
        "cliques": cliques,
        "ys": ys,
        "sigma": sigma,
        "total": float(spec["total"]),
        "iters": int(spec["iters"]),
        "algorithm": str(spec["algorithm"]) if "algorithm" in spec else "MD",
        "checkpoints": checkpoints,
        "time_limit": float(spec["time_limit"]) if "time_limit" in spec else None,
        "warm": bool(spec["warm"]) if "warm" in spec else False,
    }


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _our_loss(marginals, cliques, ys, sigma):
    """sum_k ||mu_k - y_k||^2 / (2 sigma_k^2), mu_k in the clique's listed attribute order."""
    loss = 0.0
    for cl, y, s in zip(cliques, ys, sigma):
        f = marginals.project(cl)
        if tuple(f.domain.attributes) != cl:  # mbi may order a clique's axes differently
            f = f.transpose(cl)
        mu = np.asarray(f.datavector(), dtype=float)
        loss += float(np.sum((mu - y) ** 2)) / (2.0 * s * s)
    return loss


def _child(spec_path, out_path):
    spec = _load_spec(spec_path)
    progress_path = out_path + ".progress"
    result = {"status": "error: unfinished", "algorithm": spec["algorithm"]}

    t_imp = time.perf_counter()
    import jax
    jax.config.update("jax_enable_x64", True)  # float64, as the project's solvers
    jax.config.update("jax_enable_compilation_cache", False)  # every run is cold
    import jax.numpy as jnp
    import mbi
    from mbi import estimation, marginal_loss
    from importlib.metadata import version
    result["import_time"] = time.perf_counter() - t_imp
    result["mbi_version"] = version("mbi")
    result["jax_version"] = jax.__version__

    estimators = {
        "MD": estimation.MirrorDescent,
        "DA": estimation.DualAveraging,
        "IG": estimation.InteriorGradient,
        "LBFGS": estimation.LBFGS,
        "UAM": estimation.UniversalAcceleratedMethod,
    }
    alg = spec["algorithm"].upper()
    if alg not in estimators:
        raise ValueError(f"unknown algorithm {spec['algorithm']!r}; one of {sorted(estimators)}")
    base = estimators[alg]
    iters, checkpoints = spec["iters"], spec["checkpoints"]
    block = math.gcd(DEFAULT_BLOCK, iters, *checkpoints)
    estimation.CALLBACK_EVERY = block  # read when _multi_step is traced and by estimate()
    nblocks = -(-iters // block)
    result["block"] = block
    result["iters"] = nblocks * block

    # Lazy callback value: the state itself plus a thunk giving the current iterate's
    # marginals, evaluated only at checkpoints (see the module docstring).
    if base is estimation.MirrorDescent:
        def _callback_value(self, state, known_total, constraints=()):
            p = state.potentials
            oracle = self._oracle(p.cliques, p.domain, constraints=constraints)
            return state, lambda: oracle(p, known_total)
    else:
        def _callback_value(self, state, known_total, constraints=()):
            return state, lambda: base._callback_value(self, state, known_total, constraints)
    overrides = {"_callback_value": _callback_value}
    if base in (estimation.DualAveraging, estimation.InteriorGradient,
                estimation.UniversalAcceleratedMethod):
        # mbi's _finalize for these fits potentials to the iterate by an L-BFGS MLE
        # (1000 iterations; minutes even for the 100-attribute chain) only to return a
        # MarkovRandomField.  The estimate of the marginals is the iterate itself, which
        # mbi's own _callback_value returns (DA: w, IG: x, UAM: x * total); return that.
        def _finalize(self, state, known_total, constraints=()):
            return base._callback_value(self, state, known_total, constraints)
        overrides["_finalize"] = _finalize
    estimator_cls = type("Timed" + base.__name__, (base,), overrides)

    cliques, ys, sigma, total = spec["cliques"], spec["ys"], spec["sigma"], spec["total"]
    block_times, records = [], []
    excluded = 0.0  # time spent in checkpoint loss evaluation, excluded from timings

    def callback(value):
        nonlocal excluded
        state, marginals_fn = value
        jax.block_until_ready(state)
        t_ready = time.perf_counter()
        block_times.append(t_ready - t0 - excluded)
        done = len(block_times) * block
        if done in checkpoints:
            loss = _our_loss(marginals_fn(), cliques, ys, sigma)
            records.append({"iters": done, "time": block_times[-1], "loss": loss})
            _write_json(progress_path, {"checkpoints": records, "block_times": block_times})
        excluded += time.perf_counter() - t_ready

    # ---- timed region -------------------------------------------------------------
    t0 = time.perf_counter()
    domain = mbi.Domain(spec["names"], spec["sizes"])
    measurements = [
        mbi.LinearMeasurement(jnp.asarray(y), cl, stddev=float(s))
        for cl, y, s in zip(cliques, ys, sigma)
    ]
    loss_fn = marginal_loss.from_linear_measurements(measurements, domain)
    estimator = estimator_cls()
    setup_time = time.perf_counter() - t0
    model = estimator.estimate(domain, loss_fn, known_total=total, iters=iters,
                               callback_fn=callback)
    marginals = getattr(model, "marginals", model)  # MarkovRandomField or CliqueVector
    jax.block_until_ready(marginals)
    total_time = time.perf_counter() - t0 - excluded
    # ---- end of timed region ------------------------------------------------------

    result["status"] = "ok"
    result["total_time"] = total_time
    result["setup_time"] = setup_time
    if len(block_times) >= 2:
        per_iter = (block_times[-1] - block_times[0]) / ((len(block_times) - 1) * block)
        result["per_iter_time"] = per_iter
        result["compile_time"] = max(0.0, block_times[0] - setup_time - block * per_iter)
    else:
        result["per_iter_time"] = None
        result["compile_time"] = None
    result["block_times"] = block_times
    result["loss"] = _our_loss(model, cliques, ys, sigma)
    result["mbi_loss"] = float(loss_fn(marginals))
    result["model_total"] = float(np.sum(np.asarray(model.project(cliques[0]).datavector())))
    result["checkpoints"] = records

    if spec["warm"]:
        # Same estimate again in this process: everything is compiled and cached now,
        # so this is the cost of the iterations (+ eager init/finalise) without JIT.
        t1 = time.perf_counter()
        warm_model = estimator.estimate(domain, loss_fn, known_total=total, iters=iters)
        jax.block_until_ready(getattr(warm_model, "marginals", warm_model))
        result["warm_total_time"] = time.perf_counter() - t1
        result["warm_loss"] = _our_loss(warm_model, cliques, ys, sigma)
    _write_json(out_path, result)


def _parent(spec_path, out_path):
    t_start = time.perf_counter()
    try:
        time_limit = _load_spec(spec_path)["time_limit"]
    except Exception as exc:  # noqa: BLE001 - report any spec problem in the JSON
        _write_json(out_path, {"status": f"error: bad spec: {exc!r}"})
        return 1
    progress_path = out_path + ".progress"
    for p in (out_path, progress_path):
        if os.path.exists(p):
            os.remove(p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", spec_path, out_path]
    try:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True,
                              timeout=time_limit if time_limit and time_limit > 0 else None)
        sys.stderr.write(proc.stderr)
        if proc.returncode == 0 and os.path.exists(out_path):
            result = None
        else:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            msg = lines[-1] if lines else f"exit code {proc.returncode}"
            result = {"status": f"error: {msg}"}
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
        if exc.stderr:
            sys.stderr.write(exc.stderr if isinstance(exc.stderr, str) else exc.stderr.decode())
        result = {"status": "timeout", "time_limit": time_limit}
    if result is not None:
        result["wall_time"] = time.perf_counter() - t_start
        if os.path.exists(progress_path):
            with open(progress_path) as f:
                result.update(json.load(f))
        _write_json(out_path, result)
    if os.path.exists(progress_path):
        os.remove(progress_path)
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--child":
        try:
            _child(argv[2], argv[3])
        except Exception:  # noqa: BLE001 - the parent reports the last stderr line as "error: ..."
            traceback.print_exc()
            return 1
        return 0
    if len(argv) != 3:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    return _parent(argv[1], argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
