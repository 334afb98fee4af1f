# %% [markdown]
# # Tutorial 9: error bars for post-processed answers
#
# A post-processed release is still noisy: how far from the truth may each estimated count
# be?  After `prob.solve(method="cvxdp", ...)`,
#
#     eb = cvxdp.error_bars(prob, queries=None, level=0.9)
#
# returns each query's estimate, standard error and a 90% interval (`eb.lower`,
# `eb.upper`).  The model's noisy data and its noise are known from the
# `cvxdp.Measurement`s its losses were built from (`cvxdp.nll`), so nothing else is needed.
#
# * **Exact** (`method="exact"`): where the estimate is linear in the noisy answers
#   (squared losses, linear equalities, no inequality active: the GLS estimate), its
#   covariance follows from the sandwich formula; intervals `estimate +- 1.645 std_err` are
#   exact for Gaussian noise.
# * **Bootstrap** (`method="bootstrap"`): for everything else (`x >= 0`, L1 losses, the
#   local polytope): `draws` releases are simulated around the fitted answers with each
#   measurement's own noise, the model is re-solved for each, and the spread of the
#   re-estimates gives the intervals (`interval="percentile"`, `"basic"`, `"bc"` or
#   `"normal"`).
# * `method="auto"` (the default) takes the exact route where it applies.
#
# This tutorial puts both on tutorial 1's sparse hierarchical histogram, plots them
# against the truth and measures how often the truth is inside.  `benchmarks/error_bars.py`
# measures the same on more estimators and data.
#
# Run: `python tutorials/09_error_bars.py` (`CVXDP_TUTORIAL_FAST=1` for a few-second smoke
# run; figures go to `$CVXDP_TUTORIAL_OUT`, default `tutorials/figures/`).

# %%
import math
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import cvxpy as cp  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import cvxdp  # noqa: E402

FAST = os.environ.get("CVXDP_TUTORIAL_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("CVXDP_TUTORIAL_OUT") or Path(__file__).resolve().parent / "figures")
OUT.mkdir(parents=True, exist_ok=True)

H = 5 if FAST else 7                   # tree height: n = 2^H leaves
DRAWS = 20 if FAST else 100            # bootstrap draws
TRIALS = 1 if FAST else 5              # releases for the coverage check
# the bootstrap's re-solves: cvxdp.ADMM; the smoke run's 63-node models are faster on Clarabel
BOOT = cp.CLARABEL if FAST else cvxdp.ADMM
EPS = 1.0
n = 2 ** H
print(f"{'FAST' if FAST else 'FULL'} mode: n = 2^{H} = {n} cells, {DRAWS} bootstrap draws, "
      f"{TRIALS} releases for the coverage check; figures -> {OUT}")


# %% [markdown]
# ## The data and two releases
#
# As in tutorial 1: 90% empty cells, the others `floor(10 * Pareto(1.5)) + 1`.  Every node
# of the binary tree is measured twice over, once with Gaussian noise and once with
# Laplace noise (scale `b = (H + 1) / epsilon`); the Gaussian `sigma = b sqrt(2)` gives both
# the same variance.

# %%
def streams(seed: int):
    data_ss, noise_ss = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(data_ss), np.random.default_rng(noise_ss)


def sparse_histogram(n: int, rng: np.random.Generator, zero_frac: float = 0.9):
    counts = np.zeros(n)
    nonzero = rng.random(n) >= zero_frac
    counts[nonzero] = np.floor(10 * rng.pareto(1.5, nonzero.sum())) + 1
    return counts


tree = cvxdp.workloads.hierarchy(n_leaves=n, branching=2)
b = tree.sensitivity / EPS
sigma = b * math.sqrt(2.0)
leaves = np.arange(tree.n_nodes)[tree.leaves]
# the queries: the leaf cells, as a matrix over the node variable's entries
cells = sp.csr_matrix((np.ones(n), (np.arange(n), leaves)), shape=(n, tree.n_nodes))


def release(seed: int):
    data_rng, noise_rng = streams(seed)
    counts = sparse_histogram(n, data_rng)
    gauss = cvxdp.mechanisms.gaussian(tree.queries, counts, sigma=sigma, rng=noise_rng)
    lap = cvxdp.mechanisms.laplace(tree.queries, counts, epsilon=EPS, rng=noise_rng)
    return counts, gauss, lap, noise_rng


counts, gauss, lap, noise_rng = release(0)
print(tree)
print(f"{int(counts.sum())} records, {np.mean(counts == 0):.0%} empty cells; Laplace b = {b:g}, "
      f"Gaussian sigma = {sigma:.2f}")


# %% [markdown]
# ## Exact error bars: the GLS estimate
#
# The least-squares estimate under consistency (`cvxdp.nll` of a Gaussian measurement is
# `||x - y||^2 / (2 sigma^2)`) is linear in the noisy answers, so `error_bars` computes
# its standard errors exactly (for a histogram tree in two passes over the tree:
# `eb.route`).

# %%
x = cp.Variable(tree.n_nodes)
gls = cp.Problem(cp.Minimize(cvxdp.nll(gauss, x)), [cvxdp.consistent(tree, x)])
gls.solve(method="cvxdp")
eb_gls = cvxdp.error_bars(gls, queries=cells)
print(eb_gls)
print(f"  method {eb_gls.method!r}, route {eb_gls.route!r}, {eb_gls.wall_time:.3f} s; every "
      f"cell's std_err {np.median(eb_gls.std_err):.3f} (noise sigma {sigma:.2f} per node)")

# %% [markdown]
# The GLS estimate of an empty cell is as often negative as positive: unbiased, with the
# same standard error in every cell, and intervals that are wide compared with the many
# small counts.
#
# ## Bootstrap error bars: the non-negative L1 estimate
#
# The Laplace MLE with `x >= 0` (tutorial 1's best estimator) is not linear in the data:
# `method="auto"` takes the parametric bootstrap.  Each draw re-solves the model
# (warm-started; `solver=` picks the solver, by default the last solve's: `cvxdp.ADMM`
# here); `rng` makes it reproducible.  First, the same
# model on `cvxdp.ADMM` and on Clarabel:

# %%
l1 = cp.Problem(cp.Minimize(cvxdp.nll(lap, x)), [cvxdp.consistent(tree, x), x >= 0])
objs = {}
for name, solver in (("Clarabel", cp.CLARABEL), ("cvxdp.ADMM", cvxdp.ADMM)):
    x.value = None
    t0 = time.perf_counter()
    l1.solve(method="cvxdp", solver=solver)
    objs[name] = (l1.value, time.perf_counter() - t0)
    print(f"{name}: {l1.status}, objective {l1.value:.6f}, {objs[name][1]:.3f} s")
(v_admm, _), (v_ref, _) = objs["cvxdp.ADMM"], objs["Clarabel"]
print(f"relative objective gap (ADMM - Clarabel) / |Clarabel| = {(v_admm - v_ref) / abs(v_ref):.2e}")

t0 = time.perf_counter()
eb_l1 = cvxdp.error_bars(l1, queries=cells, draws=DRAWS, rng=1, solver=BOOT)
print(eb_l1)
print(f"  {eb_l1.draws} re-solves in {time.perf_counter() - t0:.1f} s ({eb_l1.failed} failed); "
      f"median std_err: empty cells {np.median(eb_l1.std_err[counts == 0]):.3f}, non-empty "
      f"{np.median(eb_l1.std_err[counts > 0]):.3f}")

# %% [markdown]
# Non-negativity shrinks the intervals of the empty cells to a sliver above zero, and
# leaves the non-empty cells' intervals about as wide as the noise.  The other interval
# kinds come from the same draws: `eb_l1.samples` holds the re-estimates
# `(draws, queries)`, and `interval=` picks the construction:

# %%
for kind in ("percentile", "basic", "bc", "normal"):
    e = eb_l1 if kind == "percentile" else cvxdp.error_bars(l1, queries=cells, draws=DRAWS, rng=1, solver=BOOT, interval=kind)
    inside = (e.lower - 1e-6 <= counts) & (counts <= e.upper + 1e-6)
    print(f"  {kind:10s}: truth inside for {inside[counts == 0].mean():.0%} of empty cells, "
          f"{inside[counts > 0].mean():.0%} of non-empty ones; mean width {np.mean(e.upper - e.lower):.2f}")

# %% [markdown]
# ## Plain spellings: name the noise
#
# A model written without `cvxdp.nll` (`cp.norm1(A @ x - y) / b`) does not know which data
# is noisy: say so with `noise=[(y, ("laplace", b))]` (or a `cvxdp.Measurement`, or
# `{y_parameter: (...)}`).  The same model, so the same error bars up to the L1 optimum's
# non-uniqueness (the two solves may land on different optimal `x`):

# %%
y = lap.answers
plain = cp.Problem(cp.Minimize(cp.norm1(x - y) / b), [cvxdp.consistent(tree, x), x >= 0])
plain.solve(method="cvxdp", solver=cvxdp.ADMM)
eb_plain = cvxdp.error_bars(plain, queries=cells, draws=DRAWS, rng=1, solver=BOOT,
                            noise=[(y, ("laplace", b))])
print(f"noise= spelling: {eb_plain}")
print(f"  nll model: {eb_l1}")

# %% [markdown]
# ## The picture
#
# The first 48 cells: the truth (black), each estimate with its 90% interval.

# %%
show = np.arange(min(n, 48))
fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
for ax, eb, title in ((axes[0], eb_gls, "GLS (Gaussian noise): exact intervals"),
                      (axes[1], eb_l1, f"L1 + x>=0 (Laplace noise): bootstrap, {DRAWS} draws, percentile")):
    est = np.asarray(eb.estimate)
    # a percentile interval need not contain its estimate: draw the interval, then the point
    ax.vlines(show, eb.lower[show], eb.upper[show], color="tab:blue", lw=2, alpha=0.6,
              label="90% interval")
    ax.plot(show, est[show], "o", ms=3, color="tab:blue", label="estimate")
    ax.plot(show, counts[show], "k_", ms=10, mew=2, label="truth")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("count")
axes[0].legend(fontsize=8, loc="upper right")
axes[1].set_xlabel("cell")
fig.tight_layout()
fig.savefig(OUT / "error_bars_intervals.png", dpi=110)
plt.close(fig)
print(f"wrote {OUT / 'error_bars_intervals.png'}")

# %% [markdown]
# ## Coverage: is the truth inside 90% of the time?
#
# Over `TRIALS` fresh releases (new data, new noise), the fraction of cells whose interval
# holds the truth, for empty and non-empty cells apart (within `1e-6`: a solver returns a
# cell at the bound as about 1e-10, not 0).

# %%
hits = {k: {True: [], False: []} for k in ("GLS exact", "L1 percentile", "L1 basic", "L1 normal",
                                          "GLS+ relaxed")}
for trial in range(TRIALS):
    c, g, lp, rng = release(100 + trial)
    p_g = cp.Problem(cp.Minimize(cvxdp.nll(g, x)), [cvxdp.consistent(tree, x)])
    p_g.solve(method="cvxdp")
    # error bars right after the solve: they read the solution from the variables' values,
    # which the next solve (of a problem sharing `x`) overwrites (error_bars then refuses)
    eb = cvxdp.error_bars(p_g, queries=cells)
    found = {"GLS exact": (eb.lower, eb.upper)}
    p_l = cp.Problem(cp.Minimize(cvxdp.nll(lp, x)), [cvxdp.consistent(tree, x), x >= 0])
    p_l.solve(method="cvxdp", solver=cvxdp.ADMM)
    eb = cvxdp.error_bars(p_l, queries=cells, draws=DRAWS, rng=rng, solver=BOOT)
    a = 0.05
    q_lo, q_hi = np.quantile(eb.samples, a, axis=0), np.quantile(eb.samples, 1 - a, axis=0)
    found["L1 percentile"] = (q_lo, q_hi)
    found["L1 basic"] = (2 * eb.estimate - q_hi, 2 * eb.estimate - q_lo)
    found["L1 normal"] = (eb.estimate - 1.6449 * eb.std_err, eb.estimate + 1.6449 * eb.std_err)
    # the non-negative GLS of the Gaussian release with method="relaxed": the exact interval
    # of the same model without x >= 0, clipped to x >= 0
    p_n = cp.Problem(cp.Minimize(cvxdp.nll(g, x)), [cvxdp.consistent(tree, x), x >= 0])
    p_n.solve(method="cvxdp")
    eb = cvxdp.error_bars(p_n, queries=cells, method="relaxed")
    found["GLS+ relaxed"] = (eb.lower, eb.upper)
    for k, (lo, hi) in found.items():
        inside = (lo - 1e-6 <= c) & (c <= hi + 1e-6)
        hits[k][True] += list(inside[c == 0])
        hits[k][False] += list(inside[c > 0])
print(f"coverage of the nominal 90% intervals over {TRIALS} releases x {n} cells:")
for k, h in hits.items():
    z, nz = np.array(h[True]), np.array(h[False])
    print(f"  {k:14s}: empty cells {z.mean():.3f} (n = {z.size}), non-empty {nz.mean():.3f} "
          f"(n = {nz.size}), all {np.r_[z, nz].mean():.3f}")

# %% [markdown]
# The exact GLS intervals hold the truth 90% of the time, empty or not: the estimate is
# unbiased and Gaussian.  The non-negative L1 estimate is biased: upwards on the empty cells
# (it cannot go below zero) and towards zero on the small non-empty ones (the shrinkage that
# makes it accurate).  Its intervals therefore over-cover the empty cells and under-cover the
# non-empty ones (full run, 5 releases of 128 cells: percentile 1.00 / 0.51, normal
# 0.97 / 0.57, basic 0.94 / 0.37: reflecting about a biased estimate moves the interval the
# wrong way).  The bootstrap cannot see this bias: its simulated world is centred on the
# shrunk estimate.
#
# Where the coverage of small counts matters, use the exact GLS interval of the same
# release cut at zero: for a squared-loss model, `cvxdp.error_bars(prob, method="relaxed")`
# (the row "GLS+ relaxed": the non-negative GLS's model without `x >= 0`, its exact
# interval clipped to the bounds; the truth is never negative, so it holds the truth as
# often as the GLS interval, 90%), at the price of a wider interval than the non-negative
# estimate's.  `benchmarks/error_bars.py` and the user guide's page
# on error bars measure this over more releases, for the non-negative GLS and the local
# polytope too.
