# %% [markdown]
# # Tutorial 0: which queries to ask (workload strategies for range queries)
#
# An analyst wants the answers to a *workload* `W` of linear queries over a
# histogram `x` (here: range counts `x_i + ... + x_j`).  The matrix mechanism
# (Li, Hay, Rastogi, Miklau, McGregor, PODS 2010) answers a different set of
# queries, the *strategy* `A`, and derives `W` from it:
#
#     y     = A x + e,     e_i ~ Laplace(Delta_1(A) / eps) i.i.d., variance v = 2 Delta_1(A)^2 / eps^2
#     x_hat = argmin_x ||A x - y||_2^2 = (A^T A)^+ A^T y        (least squares: post-processing, free)
#     E (w^T x_hat - w^T x)^2 = v * w^T (A^T A)^+ w             (for every query w in the row space of A)
#
# `Delta_1(A)` is the largest column L1 norm of `A`: how much all the strategy's
# answers move together when one record is added or removed.  A good strategy
# has a small sensitivity *and* rebuilds every workload query from a few of its
# answers.  The expected error depends on the data not at all and on `W` only
# through `W^T W`, so `cvxdp.analysis` evaluates it exactly, even for all
# `n (n+1) / 2 = 8.4 million` ranges over `n = 2^12` cells.
#
# The tutorial
#
# 1. works the lecture's 3-query example with the closed forms, a Monte Carlo
#    check, and the least-squares step as a cvxpy model solved by cvxdp's ADMM
#    and by Clarabel (one word apart);
# 2. compares the lecture's strategies for all range queries (identity, every
#    range, the binary tree of Hay et al. VLDB 2010, the Haar wavelet of Xiao et
#    al. ICDE 2010) as `n` grows, against the lecture's rates;
# 3. searches the tree's branching factor `k`.
#
# Errors are in units of `1 / eps^2` (everything is computed at `eps = 1`; the
# error of every strategy scales as `1 / eps^2`).
#
# Run: `python tutorials/00_workload_strategies.py` (`CVXDP_TUTORIAL_FAST=1`
# for a few-second smoke run; figures go to `$CVXDP_TUTORIAL_OUT`, default
# `tutorials/figures/`).

# %%
import dataclasses
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import cvxpy as cp  # noqa: E402

import cvxdp  # noqa: E402
from cvxdp.modelling import analysis  # noqa: E402

FAST = os.environ.get("CVXDP_TUTORIAL_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("CVXDP_TUTORIAL_OUT") or Path(__file__).resolve().parent / "figures")
OUT.mkdir(parents=True, exist_ok=True)

EPS = 1.0
LOG2_NS = range(2, 8) if FAST else range(2, 13)          # n = 4 .. 128 (fast) or 4 .. 4096
TRIALS = 20_000 if FAST else 400_000                    # Monte Carlo draws, 3-query example
ADMM_TRIALS = 50 if FAST else 600                       # releases solved by ADMM in the MC check
# branching factor search: (n, branching factors)
K_SEARCH = ([(2 ** 7, list(range(2, 17)))] if FAST else
            [(2 ** 10, list(range(2, 65))),
             (2 ** 12, list(range(2, 10)) + [12, 15, 16, 17, 32, 63, 64])])
print(f"{'FAST' if FAST else 'FULL'} mode: n = 2^{LOG2_NS[0]} .. 2^{LOG2_NS[-1]}, "
      f"{TRIALS:,} Monte Carlo draws, figures -> {OUT}")
T_START = time.perf_counter()


# %% [markdown]
# ## 1. The lecture's example: three queries over two cells
#
# The workload is `x1`, `x2` and `x1 + x2`.  Three ways to answer it:
#
# * **answer all three** with the Laplace mechanism: a record in cell 1 moves
#   `x1` and `x1 + x2`, so `Delta_1 = 2`, scale `2 / eps`, and each answer has
#   variance `2 (2/eps)^2 = 8 / eps^2`;
# * **answer `x1` and `x2`** (sensitivity 1, variance `2 / eps^2` each) and add
#   them for the third query: `2, 2, 4` (over `eps^2`);
# * **answer all three, then least squares** (beyond the lecture): the three
#   noisy answers disagree (`y3 != y1 + y2`); the least-squares fit
#   `x_hat = argmin ||A x - y||^2` averages the two ways of getting each query,
#   and every query's variance drops from 8 to `8 * 2/3 = 16/3`: better than
#   raw, still worse than strategy 2 on this workload.
#
# `noise_variance(A)` is `v`; `query_errors(W, A)` is `v * diag(W (A^T A)^+ W^T)`
# (least-squares reconstruction; when `A = W` is square and invertible, or for
# strategy 2, least squares is just inversion and changes nothing).

# %%
W3 = np.array([[1.0, 0.0],       # x1
               [0.0, 1.0],       # x2
               [1.0, 1.0]])      # x1 + x2
I2 = np.eye(2)
closed = {
    "answer all 3 (raw)": np.full(3, analysis.noise_variance(W3, epsilon=EPS)),
    "answer x1, x2 and add": analysis.query_errors(W3, I2, epsilon=EPS),
    "answer all 3 + least squares": analysis.query_errors(W3, W3, epsilon=EPS),
}
print(f"sensitivity of W: {analysis.sensitivity(W3)},  of the identity: {analysis.sensitivity(I2)}")

# %% [markdown]
# The Monte Carlo check draws the Laplace noise directly: `TRIALS` releases of
# each strategy, the estimate of each query, and its mean squared error.
# `analysis.simulate_error` does the same for the *total* error (sum over the
# three queries) of a least-squares strategy.

# %%
rng = np.random.default_rng(0)
x_true = np.array([30.0, 12.0])                           # any data: the error does not depend on it


def simulate_per_query(A, reconstruct, trials, rng):
    """Per-query MSE of ``W3`` answered from ``A x + Lap(Delta_1(A)/eps)``."""
    b = analysis.sensitivity(A) / EPS
    Y = A @ x_true + rng.laplace(scale=b, size=(trials, A.shape[0]))
    est = reconstruct(Y)                                  # trials x 3 answers to W3
    return np.mean((est - W3 @ x_true) ** 2, axis=0)


pinv = np.linalg.pinv(W3)                                 # least squares: x_hat = pinv @ y
mc = {
    "answer all 3 (raw)": simulate_per_query(W3, lambda Y: Y, TRIALS, rng),
    "answer x1, x2 and add": simulate_per_query(I2, lambda Y: Y @ W3.T, TRIALS, rng),
    "answer all 3 + least squares": simulate_per_query(W3, lambda Y: Y @ pinv.T @ W3.T,
                                                       TRIALS, rng),
}
print(f"\nexpected squared error per query, x 1/eps^2 (Monte Carlo: {TRIALS:,} releases)")
print(f"  {'strategy':<30}{'x1':>14}{'x2':>14}{'x1 + x2':>14}{'total':>14}")
for name in closed:
    print(f"  {name:<30}" + "".join(f"{c:>7.3f} ({m:5.2f})" for c, m in zip(closed[name], mc[name]))
          + f"{closed[name].sum():>7.3f} ({mc[name].sum():5.2f})")
for name, A in (("answer x1, x2 and add", I2), ("answer all 3 + least squares", W3)):
    total = analysis.expected_error(W3, A, epsilon=EPS)
    sim = analysis.simulate_error(W3, A, x_true, trials=TRIALS, epsilon=EPS, rng=1)
    print(f"  total, {name}: expected_error {total:.3f}, simulate_error {sim:.3f} "
          f"({sim / total - 1:+.1%})")
assert np.allclose(closed["answer all 3 (raw)"], 8 / EPS ** 2)
assert np.allclose(closed["answer x1, x2 and add"], np.array([2, 2, 4]) / EPS ** 2)
assert np.allclose(closed["answer all 3 + least squares"], 16 / (3 * EPS ** 2))


# %% [markdown]
# ### The least-squares step as a cvxpy model
#
# Release the three queries once (`cvxdp.mechanisms.laplace` computes the
# sensitivity 2 itself), write the reconstruction as an ordinary cvxpy problem
# and solve it with cvxdp's ADMM and with Clarabel: only `solver=` changes.
# Both must agree with the closed form `x_hat = (A^T A)^{-1} A^T y`, here
# `x1_hat = (2 y1 - y2 + y3) / 3`, `x2_hat = (2 y2 - y1 + y3) / 3`.

# %%
y = cvxdp.mechanisms.laplace(W3, x_true, epsilon=EPS, rng=2)
print(f"true answers {W3 @ x_true}, noisy answers {np.round(y.answers, 3)} "
      f"(scale b = {y.scale:g}); y1 + y2 - y3 = {y.answers[0] + y.answers[1] - y.answers[2]:.3f}")

x = cp.Variable(2)
prob = cp.Problem(cp.Minimize(cp.sum_squares(W3 @ x - y.answers)))
x_closed = np.linalg.solve(W3.T @ W3, W3.T @ y.answers)

solutions = {}
for name, solver in (("cvxdp.ADMM", cvxdp.ADMM), ("Clarabel", cp.CLARABEL)):
    x.value = None
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=solver)
    dt = time.perf_counter() - t0
    solutions[name] = (x.value.copy(), prob.value)
    stats = prob.solver_stats
    print(f"{name}: status {prob.status}, objective {prob.value:.10f}, x_hat {x.value}, "
          f"|x_hat - closed form| = {np.max(np.abs(x.value - x_closed)):.1e}, {dt:.3f} s "
          f"(solver_name={stats.solver_name!r}, num_iters={stats.num_iters})")
(xa, va), (xc, vc) = solutions["cvxdp.ADMM"], solutions["Clarabel"]
print(f"closed form x_hat {x_closed}; relative objective gap (ADMM - Clarabel) / |Clarabel| = "
      f"{(va - vc) / abs(vc):.2e}")
assert np.allclose(xa, x_closed, atol=1e-5) and np.allclose(xc, x_closed, atol=1e-5)

# %% [markdown]
# And the model *is* the estimator the closed form describes: re-solving it with
# ADMM for `ADMM_TRIALS` fresh releases (warm-started from the previous
# solution) gives the per-query error `16/3` up to Monte Carlo noise.

# %%
mc_rng = np.random.default_rng(3)
sq = np.zeros((ADMM_TRIALS, 3))                           # squared error of each query, each release
worst = 0.0                                               # largest distance to the closed form
t0 = time.perf_counter()
for t in range(ADMM_TRIALS):
    y = cvxdp.mechanisms.laplace(W3, x_true, epsilon=EPS, rng=mc_rng)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(W3 @ x - y.answers)))
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    worst = max(worst, np.max(np.abs(x.value - pinv @ y.answers)))
    sq[t] = (W3 @ x.value - W3 @ x_true) ** 2
se = sq.std(axis=0, ddof=1) / np.sqrt(ADMM_TRIALS)
print(f"{ADMM_TRIALS} releases solved by ADMM in {time.perf_counter() - t0:.1f} s: per-query MSE "
      + ", ".join(f"{m:.2f} +- {2 * e:.2f}" for m, e in zip(sq.mean(axis=0), se))
      + f" (2 standard errors; closed form {16 / 3:.3f} each); "
      f"largest |x_hat - closed form| {worst:.1e}")


# %% [markdown]
# ## 2. All range queries: strategies against `n`
#
# The workload is every range `[i, j]` of `n` cells, `n (n+1) / 2` queries,
# given implicitly (`analysis.implicit_all_ranges(n)`: its Gram matrix has the
# closed form `(min(a,b) + 1) (n - max(a,b))`).  Strategies, as in the lecture:
#
# | strategy | `Delta_1` | lecture's total error |
# |---|---|---|
# | identity: the `n` cells | 1 | `O(n^3)`: a range of length `L` sums `L` noisy cells |
# | every range (`implicit_all_ranges` as the strategy) | `~ n^2/4` | `O(n^4)` |
# | binary tree (`hierarchy(n, 2).queries`) | `log2 n + 1` | `O(n^2 log^3 n)`: a range is `<= 2 log n` nodes |
# | Haar wavelet with Privlet weights (`wavelet(n)`) | `log2 n + 1` | same as the tree |
#
# Every strategy is reconstructed by least squares, which for the tree is Hay et
# al.'s consistency projection.  For "every range" we also print the raw error
# (`v` per query, no reconstruction).
#
# One correction to the lecture: answering every range has sensitivity
# `~ n^2 / 4` (the middle cell lies in `~ n^2 / 4` ranges), so each answer has
# variance `~ n^4 / 8`: `n^4` is the error *per query*.  Summed over the
# `~ n^2 / 2` ranges the raw total is `~ n^6 / 16`, and least squares brings it
# to exactly `v * n ~ n^5 / 8` (`trace(W (W^T W)^{-1} W^T) = n`).  The table
# and the figure show both.
#
# `expected_error` rebuilds an implicit Gram matrix at every call (0.9 s at
# `n = 2^12`); `cached` keeps one copy for the loops below.

# %%
def cached(imp: analysis.Implicit) -> analysis.Implicit:
    G = imp.gram()
    return dataclasses.replace(imp, gram=lambda: G)


STRATEGIES = {
    "identity": lambda n: sp.identity(n, format="csr"),
    "every range": lambda n: None,                        # the workload itself, see below
    "binary tree": lambda n: cvxdp.workloads.hierarchy(n, 2).queries,
    "Haar wavelet": lambda n: cvxdp.workloads.wavelet(n),
}
ns = np.array([2 ** j for j in LOG2_NS])
total = {s: np.zeros(len(ns)) for s in list(STRATEGIES) + ["every range, raw"]}
n_queries = ns * (ns + 1) / 2
t0 = time.perf_counter()
for i, n in enumerate(ns):
    W = cached(analysis.implicit_all_ranges(int(n)))
    for name, make in STRATEGIES.items():
        A = W if name == "every range" else make(int(n))
        total[name][i] = analysis.expected_error(W, A, epsilon=EPS)
    total["every range, raw"][i] = analysis.noise_variance(W, epsilon=EPS) * W.m
print(f"{len(ns)} domain sizes x {len(STRATEGIES)} strategies in {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# A Monte Carlo check of the closed forms at a small `n`, with the explicit
# workload matrix (`cvxdp.workloads.all_ranges(64)`, 2,080 ranges).

# %%
n_mc = 64
W_mc = cvxdp.workloads.all_ranges(n_mc)
x_mc = np.random.default_rng(4).poisson(20, n_mc).astype(float)
print(f"\nMonte Carlo check, n = {n_mc}, {TRIALS // 20:,} releases each: total error on all ranges")
for name in ("identity", "binary tree", "Haar wavelet"):
    A = STRATEGIES[name](n_mc)
    c = analysis.expected_error(W_mc, A, epsilon=EPS)
    s = analysis.simulate_error(W_mc, A, x_mc, trials=TRIALS // 20, epsilon=EPS, rng=5)
    print(f"  {name:<14} expected_error {c:>12,.0f}   simulate_error {s:>12,.0f}  ({s / c - 1:+.1%})")

# %% [markdown]
# ### Rates and constants
#
# The table gives the total error and the mean error per range query.  The
# fitted slope is that of `log(total)` against `log(n)` over the last three
# sizes: 3 for the identity, and for `n^2 log^3 n` the local slope
# `2 + 3 / ln n` (2.36 at `n = 2^12`), not yet 2.

# %%
ORDER = ["identity", "every range, raw", "every range", "binary tree", "Haar wavelet"]
print("\ntotal expected squared error on all ranges (x 1/eps^2); mean per query in brackets")
print(f"  {'n':>6}" + "".join(f"{s:>27}" for s in ORDER))
for i, n in enumerate(ns):
    print(f"  {n:>6}" + "".join(f"{total[s][i]:>14.3e} ({total[s][i] / n_queries[i]:>9.3g})"
                                for s in ORDER))
slopes = {s: np.polyfit(np.log(ns[-3:]), np.log(total[s][-3:]), 1)[0] for s in ORDER}
print("  slope " + "".join(f"{slopes[s]:>27.2f}" for s in ORDER))
print(f"  reference: n^2 log^3 n has local slope {2 + 3 / np.log(ns[-1]):.2f} at n = {ns[-1]}")

tree_vs_id = total["binary tree"] / total["identity"]
wav_vs_id = total["Haar wavelet"] / total["identity"]
print("\nratio to the identity's total error:")
print(f"  {'n':>6}{'binary tree':>14}{'Haar wavelet':>14}")
for i, n in enumerate(ns):
    print(f"  {n:>6}{tree_vs_id[i]:>14.3f}{wav_vs_id[i]:>14.3f}")


def first_below_one(ratio):
    below = np.flatnonzero(ratio < 1)
    return f"n = {ns[below[0]]}" if below.size and np.all(ratio[below[0]:] < 1) else "not in range"


print(f"the binary tree beats the identity from {first_below_one(tree_vs_id)}, "
      f"the wavelet from {first_below_one(wav_vs_id)}")

# %% [markdown]
# Why the crossover is late: every node of the binary tree gets noise of
# variance `2 (log2 n + 1)^2`, `(log2 n + 1)^2` times the identity's (169 times
# at `n = 2^12`).  The tree wins only once ranges are long enough that summing
# `(n + 2) / 3` cells on average (identity) costs more than the few nodes of a
# range plus least squares (tree); `log^3 n` against `n` has a large constant.
# The Privlet weights keep the wavelet 0.78-0.88x the tree's error at every `n`
# here, so it crosses one size earlier.
#
# The figure: total error (left) and mean error per query (middle) with the
# lecture's rates drawn as reference slopes (each constant fitted at the
# largest `n`), and the tree's and wavelet's total error divided by the
# identity's (right).

# %%
styles = {"identity": dict(color="C0", marker="o"),
          "every range, raw": dict(color="C3", marker="x", ls=":"),
          "every range": dict(color="C3", marker="s"),
          "binary tree": dict(color="C2", marker="^"),
          "Haar wavelet": dict(color="C1", marker="v", ls="--")}
labels = {"every range": "every range + least squares"}
L = np.log2(ns)
fig, (ax_t, ax_q, ax_r) = plt.subplots(1, 3, figsize=(16, 5.2))
for s in ORDER:
    ax_t.loglog(ns, total[s], label=labels.get(s, s), ms=5, **styles[s])
    ax_q.loglog(ns, total[s] / n_queries, label=labels.get(s, s), ms=5, **styles[s])


REF_STYLES = iter([(0, (1, 2)), (0, (4, 2)), (0, (6, 2, 1, 2))] * 2)


def reference(ax, curve, shape, text):
    """Draw ``c * shape`` with ``c`` fitted to ``curve`` at the largest ``n``."""
    ax.loglog(ns, shape * curve[-1] / shape[-1], color="k", lw=1, alpha=0.6, ls=next(REF_STYLES),
              label=text)


reference(ax_t, total["identity"], ns ** 3.0, "∝ n³ (lecture: identity)")
reference(ax_t, total["binary tree"], ns ** 2.0 * L ** 3, "∝ n² log³n (lecture: tree)")
reference(ax_t, total["every range"], ns ** 4.0, "∝ n⁴ (lecture: every range)")
reference(ax_q, total["identity"] / n_queries, ns * 1.0, "∝ n")
reference(ax_q, total["binary tree"] / n_queries, L ** 3, "∝ log³n")
reference(ax_q, total["every range, raw"] / n_queries, ns ** 4.0, "∝ n⁴")
ax_t.set_title("total error on all n(n+1)/2 ranges")
ax_q.set_title("mean error per range query")
for s in ("binary tree", "Haar wavelet"):
    ax_r.loglog(ns, total[s] / total["identity"], label=labels.get(s, s), ms=5, **styles[s])
ax_r.axhline(1.0, color="C0", lw=1)
ax_r.set_title("total error / identity's total error")
for ax in (ax_t, ax_q, ax_r):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (cells)")
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlim(ns[0] / 1.4, ns[-1] * 1.4)
ax_t.set_ylabel("expected squared error × ε²")
ax_t.legend(loc="upper left", fontsize=8)
ax_q.legend(loc="upper left", fontsize=8)
ax_r.legend(loc="lower left", fontsize=8)
fig.suptitle("Answering all range queries from a strategy (Laplace noise, least squares; "
             "black lines: rate × constant fitted at the largest n)", fontsize=10)
fig.tight_layout()
path = OUT / "strategies_error_vs_n.png"
fig.savefig(path, dpi=120)
plt.close(fig)
print(f"saved {path}")


# %% [markdown]
# ## 3. The tree's branching factor
#
# A `k`-ary tree has height `h = ceil(log_k n)`, so sensitivity `h + 1` drops
# as `k` grows, but a range then needs up to `2 (k - 1)` nodes per level.
# Qardaji, Yang and Li (PVLDB 2013) report an optimal branching factor of about
# 16 for large domains.  Here is the exact least-squares error on all ranges for
# each `k` (`hierarchy(n, k)` prunes the complete tree over `k^h >= n` cells, so
# most `k` give a ragged tree).  Every `k = 2 .. 64` at `n = 2^10`; at
# `n = 2^12` each `k` costs about 2.5 s (a dense `n x n` solve), so the search
# there takes 15 values (all up to 9, the others on both sides of the points
# where the height changes).  `n = 2^16` would need a `65,536 x 65,536` dense Gram
# matrix (34 GB): skipped.

# %%
search = {}
for n, ks in K_SEARCH:
    W = cached(analysis.implicit_all_ranges(n))
    t0 = time.perf_counter()
    err = np.array([analysis.expected_error(W, cvxdp.workloads.hierarchy(n, k).queries,
                                            epsilon=EPS) for k in ks]) / W.m
    heights = np.array([cvxdp.workloads.hierarchy(n, k).height for k in ks])
    search[n] = (np.array(ks), err, heights)
    best = int(np.argmin(err))
    print(f"\nn = {n}: {len(ks)} branching factors in {time.perf_counter() - t0:.1f} s; "
          f"mean error per range query (x 1/eps^2)")
    print(f"  best k = {ks[best]} (height {heights[best]}): {err[best]:.1f};  "
          f"k = 2: {err[0]:.1f} ({err[0] / err[best]:.2f}x the best)"
          + (f";  k = 16: {err[ks.index(16)]:.1f} ({err[ks.index(16)] / err[best]:.2f}x)"
             if 16 in ks else ""))
    order = np.argsort(err)[:5]
    print("  five best: " + ", ".join(f"k = {ks[j]} ({err[j]:.1f}, h = {heights[j]})" for j in order))
    print("  best k for each height: " + ", ".join(
        f"h = {h}: k = {ks[np.flatnonzero(heights == h)[np.argmin(err[heights == h])]]} "
        f"({err[heights == h].min():.1f})" for h in sorted(set(heights), reverse=True)))

# %% [markdown]
# The error is a saw-tooth in `k`: for a fixed height it grows with `k` (wider
# nodes, more of them per range, same sensitivity) and it drops whenever `k`
# is just large enough to remove a level (`k = ceil(n^(1/h))`).  The best
# trees are the smallest `k` of some height.  Complete trees (`k^h = n`) are
# marked with open circles.

# %%
fig, ax = plt.subplots(figsize=(9, 5))
for c, (n, (ks, err, heights)) in enumerate(search.items()):
    color = f"C{c}"
    ax.plot(ks, err, color=color, marker=".", ms=4, lw=1, label=f"n = {n} (2^{int(np.log2(n))})")
    full = ks.astype(float) ** heights == n                 # complete trees: k^h = n
    ax.plot(ks[full], err[full], "o", color=color, ms=7, mfc="none")
    best = int(np.argmin(err))
    ax.plot(ks[best], err[best], "*", color=color, ms=14, mec="k",
            label=f"best for n = {n}: k = {ks[best]}")
ax.set_xscale("log", base=2)
ax.set_xticks([2, 4, 8, 16, 32, 64])
ax.set_xticklabels(["2", "4", "8", "16", "32", "64"])
ax.set_xlabel("branching factor k")
ax.set_ylabel("mean squared error per range query × ε²")
ax.set_title("k-ary tree strategy, all range queries, least squares (open circles: complete trees)",
             fontsize=10)
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
path = OUT / "strategies_branching_factor.png"
fig.savefig(path, dpi=120)
plt.close(fig)
print(f"saved {path}")
print(f"\ntotal run time {time.perf_counter() - T_START:.1f} s")


# %% [markdown]
# ## What the run shows
#
# Full mode (one run; the closed forms are exact, the Monte Carlo figures move
# a little with the seeds).  Errors in units of `1 / eps^2`.
#
# * **The 3-query example.**  Closed forms 8 / 8 / 8 (answer all three),
#   2 / 2 / 4 (answer `x1`, `x2`, add), 16/3 = 5.333 each (answer all three,
#   least squares); 400,000 simulated releases give 8.02 / 8.06 / 7.98,
#   2.00 / 2.00 / 3.99 and 5.32 / 5.32 / 5.32, and `simulate_error` gives
#   totals 7.998 (closed 8) and 15.990 (closed 16).  The cvxpy model: ADMM and
#   Clarabel return the same objective to 10 digits and `x_hat` within 1e-14 of
#   the closed form; 600 releases re-solved by ADMM give per-query MSE
#   5.64-5.88, +-0.8-0.9 at two standard errors (closed form 5.33): the model
#   is the closed-form estimator (largest difference 4e-14), the gap is
#   Monte Carlo noise.
# * **All ranges, n = 2^12** (8.4 million ranges), mean error per range:
#   identity 2,731, binary tree 778, Haar wavelet 685, every range + least
#   squares 1.7e10, every range raw 3.5e13.  Fitted slopes of the totals
#   against `n` (last three sizes): 3.00, 2.35, 2.37, 5.00, 6.00; the local
#   slope of `n^2 log^3 n` there is 2.36.  So the lecture's `n^3` and
#   `n^2 log^3 n` hold, and its `n^4` for "every range" is the per-query error
#   (total: `n^6` raw, `n^5` after least squares).
# * **Crossover.**  The binary tree's total is 4.0x the identity's at
#   n = 16, 1.05x at 512, 0.70x at 1,024 and 0.29x at 4,096: it overtakes the
#   identity at n = 2^10.  The wavelet (0.89x at 512) overtakes it at 2^9.
#   Closed forms agree with `simulate_error` at n = 64 within 0.2-0.7%.
# * **Branching factor.**  n = 2^10, every k = 2..64: best k = 11 (a height-3
#   tree, 243 per range), against 476 for k = 2 and 315 for k = 16.
#   n = 2^12, 15 values of k: best k = 8 (height 4, 381), then k = 16 (height 3,
#   391, 1.02x), against 778 for k = 2.  The optimum is the smallest k of some
#   height; here 8-16 for n = 2^12 and 11 for n = 2^10, in the range of the
#   literature's "about 16" but not equal to it at these sizes.
