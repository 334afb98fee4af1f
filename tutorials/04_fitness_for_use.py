# %% [markdown]
# # Tutorial 4: fitness for use — meet every query's accuracy target at the least privacy cost
#
# A data publisher releases the answers to a workload of linear queries
# (marginals, cell counts, ranges) with Gaussian noise.  Each query `i` has its
# own accuracy target: a variance `c_i` its users can live with.  The matrix
# mechanism minimizes the *total* variance; that can leave some queries far
# more accurate than needed and others useless.  Xiao, He, Zhang and Kifer
# ("Optimizing fitness-for-use of differentially private linear queries",
# VLDB 2021) instead ask for the least privacy cost at which *every* target is
# met.  This tutorial:
#
# 1. states their Problem 1 and why it is convex;
# 2. writes it as a cvxpy model with `cvxdp.query_variance` and
#    `cvxdp.privacy_cost`, and solves it with cvxdp's NEWTON_CG, SCS and
#    Clarabel by changing one word;
# 3. works through the paper's identity + total example (section 5.1): the
#    total-variance optimum misses the total's target by a factor that grows
#    like sqrt(d) / 2, the fitness-for-use optimum meets every target;
# 4. turns a solution into what a publisher needs: the noise covariance, the
#    privacy cost, the exact (epsilon, delta), per-query variances and a seeded
#    release; and solves the privacy-first variant (Problem 2);
# 5. compares input perturbation, the hierarchical mechanism and the
#    total-variance matrix mechanism with fitness for use on the paper's PL-94
#    workload (section 7.3) at the same privacy cost.
#
# Run: `python tutorials/04_fitness_for_use.py`
# (`CVXDP_TUTORIAL_FAST=1` for a smaller, few-second run; figures go to
# `$CVXDP_TUTORIAL_OUT`, default `tutorials/figures/`).
#
# **BLAS threads.**  NEWTON_CG spends its time in many small dense matrix
# products.  On a machine with 2 cores shared with other jobs, OpenBLAS's
# default of one thread per core made them many times slower, so this
# script asks for one BLAS thread unless you set `OPENBLAS_NUM_THREADS` (or
# `MKL_NUM_THREADS`, `OMP_NUM_THREADS`) yourself.  It has to happen before
# numpy is imported.  (The solver itself already keeps to numpy's BLAS, so the
# two OpenBLAS copies of numpy and scipy no longer compete inside one solve;
# this setting is about other jobs sharing the cores.)

# %%
import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402
from pathlib import Path  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import cvxpy as cp  # noqa: E402

import cvxdp  # noqa: E402

FAST = os.environ.get("CVXDP_TUTORIAL_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("CVXDP_TUTORIAL_OUT") or Path(__file__).resolve().parent / "figures")
OUT.mkdir(parents=True, exist_ok=True)

SMALL_DOMAIN = (2, 2, 3)                       # parts 2 and 4: 2 races -> 3 race combinations
PL94_DOMAIN = (2, 2, 15) if FAST else (2, 2, 63)   # part 5: 4 races (FAST) or the real 6 races
ID_SUM_D = (2, 4, 8, 16) if FAST else (2, 4, 8, 16, 32, 64, 128)
N_RELEASES = 2000 if FAST else 20000           # Monte Carlo check of the release
T_START = time.perf_counter()
print(f"{'FAST' if FAST else 'FULL'} mode: PL-94 domain {PL94_DOMAIN}, identity+total d = {ID_SUM_D}, "
      f"BLAS threads OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, figures -> {OUT}")


# %% [markdown]
# ## 1. The problem
#
# The data is a vector `x` of `n` cell counts; the workload is an `m x n`
# matrix `W`, query `i` is the row `w_i`.  Write `W = L B` with `B` a
# `k x n` **basis** of linearly independent rows (any basis spanning `W`'s
# rows: the identity on the cells, or `k` independent rows of `W`).  The
# mechanism adds correlated Gaussian noise to the basis answers and maps them
# to the workload:
#
#     M(x) = L (B x + e),   e ~ N(0, Sigma),   so   M(x) = W x + L e   (unbiased).
#
# * **Variance of query i**: `l_i^T Sigma l_i`.
# * **Privacy**: neighbours differ by one in one cell `j`, which moves `B x` by
#   the column `b_j`.  Whitening the noise (`Sigma^{-1/2}`) is post-processing,
#   so the mechanism is exactly as private as the ordinary Gaussian mechanism
#   with L2 sensitivity `D = max_j sqrt(b_j^T Sigma^{-1} b_j)` and unit noise
#   (the paper's Theorem 3.2 / Corollary 3.2).  `D` is the **privacy cost**:
#   it alone fixes the whole (epsilon, delta) curve, through Balle and Wang's
#   exact formula `delta(eps) = Phi(D/2 - eps/D) - e^eps Phi(-D/2 - eps/D)`.
#
# Optimizing over the **precision** `X = Sigma^{-1}` makes the privacy side
# linear.  **Problem 1** (prioritizing accuracy):
#
#     minimize    privacy_cost(B, X)  = max_j  b_j^T X b_j          (= D^2)
#     subject to  query_variance(L, X)_i = l_i^T X^{-1} l_i <= c_i   for every query i
#                 X positive semidefinite
#
# and the released noise has covariance `Sigma = X^{-1}`.
#
# **Why it is convex.**  The objective is a maximum of linear functions of
# `X`.  Each constraint is a `matrix_frac`: `f(l, X) = l^T X^{-1} l`, which is
# convex (jointly in `l` and `X > 0`) because its epigraph is a linear matrix
# inequality (Schur complement):
#
#     l^T X^{-1} l <= t    <=>    [[X, l], [l^T, t]] is PSD     (X > 0).
#
# So `{X : l_i^T X^{-1} l_i <= c_i}` is the PSD cone cut by an LMI: convex.
# This is exactly how `cvxdp.query_variance` canonicalizes for SCS and
# Clarabel, one `(k+1) x (k+1)` LMI per query.  cvxdp's NEWTON_CG never forms
# them: it runs the paper's SM-II (soft-max smoothing of both maxima, Newton
# steps by conjugate gradient with the exact Hessian applied through Kronecker
# identities) and stops on a certified duality gap.
#
# **Problem 2** (prioritizing privacy): at a fixed privacy cost `rho`, minimize
# `s` subject to `query_variance(L, X) <= s c`.  The paper shows (end of its
# section 3.3) that a Problem 1 solution, rescaled, solves it, with
# `s = (Problem 1 optimum) / rho`.

# %%
W_ = cvxdp.workloads


def pl94_workload(domain):
    """The paper's PL-94 workload (sec. 7.3) on a voting-age x ethnicity x race domain:
    the three one-way marginals and every cell.  Returns the dense matrix and query groups."""
    n = int(np.prod(domain))
    blocks = {"voting-age marginal": W_.marginal(domain, (0,)),
              "ethnicity marginal": W_.marginal(domain, (1,)),
              "race marginal": W_.marginal(domain, (2,)),
              "cells": W_.identity(n)}
    groups, start = {}, 0
    for name, block in blocks.items():
        groups[name] = slice(start, start + block.shape[0])
        start += block.shape[0]
    return sp.vstack(list(blocks.values())).toarray(), groups


def max_ratio(variances, c):
    return float(np.max(np.asarray(variances) / np.asarray(c)))


# %% [markdown]
# ## 2. One model, three solvers
#
# A small PL-94-like table: voting age (2) x ethnicity (2) x race, with 2 race
# categories instead of the census's 6 (so 3 non-empty race combinations):
# 12 cells, and 19 queries (the three marginals, 7 counts, and the 12 cells).
# The marginals should be twice as accurate as single cells: targets
# `c = 1` on the 7 marginal counts and `c = 2` on the 12 cells, in units of
# `u` counts squared (part 4 takes `u = 25`, a standard deviation of 5 on the
# marginals).  Scaling every target by `u` scales the optimal `X` and the
# privacy cost by `1/u`, so the units do not change the problem, but they do
# change how well SCS converges (see the end of this part).  The noise goes on
# the cells (`B = I`, so `L = W`).
#
# The model uses cvxdp's two atoms; the solver is one word.  `X.value = None`
# before each solve, so nobody warm-starts.

# %%
W_small, groups_small = pl94_workload(SMALL_DOMAIN)
m_small, n_small = W_small.shape
c_small = np.where(np.arange(m_small) < groups_small["cells"].start, 1.0, 2.0)
UNIT = 25.0                                    # part 4: targets UNIT * c_small
B_small = np.eye(n_small)
print(f"small PL-94: {m_small} queries on {n_small} cells; groups "
      + ", ".join(f"{k} {v.stop - v.start}" for k, v in groups_small.items()))

X = cp.Variable((n_small, n_small), PSD=True)
prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(B_small, X)),
                  [cvxdp.query_variance(W_small, X) <= c_small])

results = {}
for name, solver in (("cvxdp.NEWTON_CG", cvxdp.NEWTON_CG), ("SCS", cp.SCS), ("Clarabel", cp.CLARABEL)):
    X.value = None
    t0 = time.perf_counter()
    prob.solve(method="cvxdp", solver=solver)
    wall = time.perf_counter() - t0
    Xv = np.array(X.value)
    worst = max_ratio(cvxdp.query_variance(W_small, cp.Constant((Xv + Xv.T) / 2)).value, c_small)
    results[name] = dict(value=prob.value, time=wall, X=Xv)
    st = prob.solver_stats
    print(f"\n{name}: status {prob.status}, objective (squared privacy cost) {prob.value:.8f}, "
          f"wall time {wall:.3f} s, max variance / target of the returned X {worst:.7f}")
    print(f"  solver_stats: solver_name={st.solver_name!r} num_iters={st.num_iters} "
          f"solve_time={st.solve_time} setup_time={st.setup_time}")
    if st.solver_name == cvxdp.NEWTON_CG:
        es = st.extra_stats
        print(f"  extra_stats: gap={es['gap']:.2e} lower_bound={es['lower_bound']:.8f} "
              f"stages={es['info']['stages']} cg_iterations={es['info']['cg_iterations']}")

ours = results["cvxdp.NEWTON_CG"]
for ref in ("SCS", "Clarabel"):
    r = results[ref]
    print(f"relative objective gap (NEWTON_CG - {ref}) / |{ref}| = "
          f"{(ours['value'] - r['value']) / abs(r['value']):.2e}; time NEWTON_CG {ours['time']:.3f} s "
          f"vs {ref} {r['time']:.3f} s; max |X - X_{ref}| = {np.max(np.abs(ours['X'] - r['X'])):.1e}")

# %% [markdown]
# NEWTON_CG's `gap` is certified: `lower_bound` comes from a dual point built
# from its soft-max weights, so the optimum lies in
# `[lower_bound, objective]`.  SCS and Clarabel stop on their own tolerances
# (residuals); their `X` can violate the variance targets slightly, which is
# why the feasibility of every returned `X` is printed above.
#
# The same problem comes from `cvxdp.fitness_problem(W, c, basis=B)`, and the
# plain cvxpy spellings (one `cp.matrix_frac` per query, `cp.max(cp.diag(...))`)
# are recognised too:

# %%
model = cvxdp.fitness_problem(W_small, c_small, basis=B_small)
model.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
Xp = cp.Variable((n_small, n_small), symmetric=True)
plain = cp.Problem(cp.Minimize(cp.max(cp.diag(B_small.T @ Xp @ B_small))),
                   [cp.matrix_frac(W_small[i], Xp) <= c_small[i] for i in range(m_small)] + [Xp >> 0])
plain.solve(method="cvxdp")                         # solver=None: NEWTON_CG or Clarabel, by cost
print(f"fitness_problem: {model.problem.value:.8f}; plain spelling: {plain.value:.8f} "
      f"(solved by {plain.solver_stats.solver_name})")

# %% [markdown]
# **Scaling.**  NEWTON_CG measures every variance against its target (and
# sets its smoothing from the starting point's scale), so the units of `c` do
# not matter to it; SCS is a first-order method whose iteration count depends
# on the data's magnitudes.  In FULL mode the script also gives both the same
# problem with the targets in counts squared (`UNIT * c`):

# %%
if not FAST:
    scaled = cvxdp.fitness_problem(W_small, UNIT * c_small, basis=B_small)
    for name, solver in (("cvxdp.NEWTON_CG", cvxdp.NEWTON_CG), ("SCS", cp.SCS)):
        t0 = time.perf_counter()
        scaled.problem.solve(method="cvxdp", solver=solver)
        print(f"targets x {UNIT:g}, {name}: objective {scaled.problem.value:.8f} "
              f"(x {UNIT:g} = {UNIT * scaled.problem.value:.8f}), {scaled.problem.solver_stats.num_iters} "
              f"iterations, {time.perf_counter() - t0:.2f} s")


# %% [markdown]
# ## 3. Per-query targets vs total error: the identity + total workload
#
# The paper's section 5.1: `d` cells, the workload is the `d` cell counts plus
# their total, every target `c = 1`.  By symmetry (permuting the cells maps
# either problem to itself, and both are convex) both optima have noise
# covariance `Sigma = a I + b 1 1^T` on the cells, and both reduce to two
# scalar unknowns.  The paper solves both in closed form (sections 5.1.1 -
# 5.1.3); the forms below are re-derived for this tutorial and checked
# numerically:
#
# * **fitness for use**: both kinds of query exactly at target,
#   `a + b = 1` (a cell) and `d (a + d b) = 1` (the total), so
#   `Sigma = (d+1)/d I - 1/d 1 1^T` and the squared privacy cost is
#   `diag(Sigma^{-1}) = 2d / (d+1)`;
# * **minimum total variance** at the same privacy cost `p = 2d/(d+1)`: with
#   `X = Sigma^{-1}` having eigenvalue `u` off the all-ones direction and `v`
#   on it, the total variance is `(d-1)/u + (d+1)/v` and the privacy cost
#   `((d-1) u + v) / d`.  Lagrange gives `v = sqrt(d+1) u`, so
#   `u = p d / (d - 1 + sqrt(d+1))`, and
#
#       total's variance / target = sqrt(d+1) (d - 1 + sqrt(d+1)) / (2d)          ~ sqrt(d) / 2
#       a cell's variance / target = (d+1)(d - 1 + sqrt(d+1))(d - 1 + 1/sqrt(d+1)) / (2 d^3)   -> 1/2
#
# The total-variance mechanism gives every cell more accuracy than asked for
# (up to twice: its variance tends to half the target) and pays for it on the
# total, which misses its target by a factor growing like `sqrt(d)`.
# Numerically: fitness for use by NEWTON_CG, the total-variance optimum by
# `cvxdp.fitness.baseline_variances(W, p, "CA")` (Yuan et al.'s matrix
# mechanism, `min tr(W^T W X^{-1}) s.t. diag(X) <= 1`, SCS), both at the same
# privacy cost.

# %%
def identity_total(d):
    return np.vstack([np.eye(d), np.ones((1, d))])


def closed_forms(d):
    p = 2 * d / (d + 1)
    r = np.sqrt(d + 1)
    return dict(cost=p, a=(d + 1) / d, b=-1 / d,
                sse_total=r * (d - 1 + r) / (2 * d),
                sse_cell=(d + 1) * (d - 1 + r) * (d - 1 + 1 / r) / (2 * d ** 3),
                sse_sum_of_variances=(d + 1) * (d - 1 + r) ** 2 / (2 * d ** 2))


rows = []
print(f"{'d':>4} {'cost (ours)':>12} {'2d/(d+1)':>10} {'|Sigma - closed|':>16} {'FFU max ratio':>13} "
      f"{'CA total':>9} {'closed':>8} {'CA cell':>8} {'closed':>8} {'CA sum var':>10} {'closed':>8} "
      f"{'time [s]':>8}")
for d in ID_SUM_D:
    W = identity_total(d)
    cf = closed_forms(d)
    t0 = time.perf_counter()
    fm = cvxdp.fitness_problem(W, 1.0, basis=np.eye(d))
    fm.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    mech = fm.mechanism()
    cost = fm.problem.value
    sigma_closed = cf["a"] * np.eye(d) + cf["b"] * np.ones((d, d))
    ca = cvxdp.fitness.baseline_variances(W, cost, "CA", solver=cp.SCS, eps=1e-9)
    rows.append(dict(d=d, cost=cost, ffu=mech.variance_ratios, ca_total=ca[-1], ca_cell=ca[:-1].max(),
                     ca_sum=ca.sum()))
    print(f"{d:>4} {cost:>12.8f} {cf['cost']:>10.8f} {np.max(np.abs(mech.covariance - sigma_closed)):>16.1e} "
          f"{mech.variance_ratios.max():>13.7f} {ca[-1]:>9.5f} {cf['sse_total']:>8.5f} {ca[:-1].max():>8.5f} "
          f"{cf['sse_cell']:>8.5f} {ca.sum():>10.4f} {cf['sse_sum_of_variances']:>8.4f} "
          f"{time.perf_counter() - t0:>8.2f}")
print("(FFU: fitness for use, every query's variance / target; CA: the total-variance optimum at the "
      "same privacy cost; 'sum var' = the sum of all d+1 variances, d+1 for FFU)")

# %% [markdown]
# The total-variance problem is also a two-atom cvxpy model: minimize
# `cp.sum(cvxdp.query_variance(W, X))` subject to `cvxdp.privacy_cost(I, X) <= p`.
# It is outside NEWTON_CG's family (the method says so), so a standard solver
# takes it:

# %%
d = 8
W, cf = identity_total(d), closed_forms(d)
Xs = cp.Variable((d, d), PSD=True)
sse = cp.Problem(cp.Minimize(cp.sum(cvxdp.query_variance(W, Xs))),
                 [cvxdp.privacy_cost(np.eye(d), Xs) <= cf["cost"]])
try:
    sse.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
except cvxdp.NotRecognised as exc:
    print(f"NEWTON_CG raised NotRecognised; found: {exc.found}")
sse.solve(method="cvxdp", solver=cp.CLARABEL)
v = cvxdp.query_variance(W, cp.Constant(Xs.value)).value
print(f"d = {d}, Clarabel: sum of variances {sse.value:.6f} (closed form {cf['sse_sum_of_variances']:.6f}); "
      f"total's variance {v[-1]:.5f} (closed form {cf['sse_total']:.5f}), cells' {v[:-1].max():.5f} "
      f"(closed form {cf['sse_cell']:.5f})")

# %%
ds = np.array([r["d"] for r in rows])
dd = np.unique(np.geomspace(2, 1024, 200).round().astype(int))
cfs = [closed_forms(int(k)) for k in dd]
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.loglog(dd, [c["sse_total"] for c in cfs], color="C3", label="total-variance optimum: the total")
ax.loglog(dd, [c["sse_cell"] for c in cfs], color="C0", label="total-variance optimum: each cell")
ax.loglog(ds, [r["ca_total"] for r in rows], "o", color="C3", mfc="none",
          label="  markers: computed (CA by SCS)")
ax.loglog(ds, [r["ca_cell"] for r in rows], "o", color="C0", mfc="none")
ax.loglog(ds, [r["ffu"].max() for r in rows], "s", color="k", ms=5,
          label="fitness for use (NEWTON_CG): every query")
ax.axhline(1.0, color="k", lw=0.6)
ax.set_xscale("log", base=2)
ax.set_xlabel("number of cells d")
ax.set_ylabel("variance / target (same privacy cost)")
ax.set_title("Identity + total workload (Xiao et al., sec. 5.1): lines closed form, markers computed",
             fontsize=9)
ax.grid(True, which="major", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
path = OUT / "fitness_identity_total.png"
fig.savefig(path, dpi=120)
plt.close(fig)
print(f"saved {path}")


# %% [markdown]
# ## 4. What the publisher gets
#
# The table of part 2 with the targets in counts squared: variance 25 on the
# marginal counts, 50 on the cells.  `model.mechanism()` (or
# `cvxdp.fitness.mechanism(X, L, B, c)`) packages the solution: the noise
# covariance `Sigma = X^{-1}` on the cells, the privacy cost `D`, the exact
# `(epsilon, delta)` pairs, per-query variances, and `release(data, rng)`,
# which draws `W x + L e` with a seeded generator.

# %%
model = cvxdp.fitness_problem(W_small, UNIT * c_small, basis=B_small)
model.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
print(f"targets {UNIT:g} / {2 * UNIT:g}: squared privacy cost {model.problem.value:.8f} "
      f"= part 2's / {results['cvxdp.NEWTON_CG']['value'] / model.problem.value:.6f}")
mech = model.mechanism()
np.set_printoptions(precision=3, suppress=True, linewidth=140)
print("noise covariance Sigma on the 12 cells (cell order: voting age, ethnicity, race combination):")
print(mech.covariance)
profile = np.einsum("ij,ij->j", mech.B, mech.precision @ mech.B)
print(f"privacy profile b_j^T X b_j per cell: {np.array2string(profile, precision=6)} "
      f"(max = squared privacy cost)")
D = mech.privacy_cost
print(f"privacy cost D = {D:.6f} (D^2 = {mech.squared_privacy_cost:.6f}); the same as the Gaussian mechanism "
      f"with L2 sensitivity 1 and sigma = 1/D = {1 / D:.4f}")
for delta in (1e-6, 1e-9):
    print(f"  exact epsilon at delta = {delta:g}: {mech.epsilon(delta):.6f}")
print(f"  exact delta at epsilon = 1: {mech.delta(1.0):.3e}")
print(f"  zCDP rho = D^2 / 2 = {cvxdp.privacy.zcdp_rho(1.0, D):.6f}")

print(f"\n{'query':<22}{'target':>8}{'variance':>10}{'ratio':>8}")
labels = (["voting age < 18", "voting age 18+", "not Hispanic", "Hispanic",
           "race A only", "race B only", "races A and B"]
          + [f"cell {i}" for i in range(n_small)])
for lab, ci, vi in zip(labels, mech.c, mech.variances):
    print(f"{lab:<22}{ci:>8.1f}{vi:>10.5f}{vi / ci:>8.5f}")

rng = np.random.default_rng(7)
x_true = rng.poisson(40, n_small).astype(float)
a1, a2 = mech.release(x_true, rng=2021), mech.release(x_true, rng=2021)
print(f"\nseeded release (rng=2021), the 7 marginal counts: true {W_small[:7] @ x_true}, "
      f"noisy {np.round(a1[:7], 2)}; same seed, same answers: {np.array_equal(a1, a2)}")
draws = np.array([mech.release(x_true, rng=s) for s in range(N_RELEASES)])
emp = draws.var(axis=0)
print(f"{N_RELEASES} releases: empirical / exact variance per query in "
      f"[{np.min(emp / mech.variances):.3f}, {np.max(emp / mech.variances):.3f}]; largest |mean - truth| "
      f"{np.max(np.abs(draws.mean(axis=0) - W_small @ x_true)):.3f}")

# %% [markdown]
# **Privacy first (Problem 2).**  Fix `(epsilon, delta) = (1, 1e-6)`.  The
# largest privacy cost allowed is `1 / sigma`, with `sigma` the exact Gaussian
# calibration at sensitivity 1 (`cvxdp.privacy.gaussian_sigma`); then
# `fitness_problem(..., privacy_bound=D^2)` finds the smallest common factor
# `s` by which the targets must be relaxed (`s < 1`: every target beaten).

# %%
eps_goal, delta_goal = 1.0, 1e-6
D_max = 1.0 / cvxdp.privacy.gaussian_sigma(eps_goal, delta_goal)
p2 = cvxdp.fitness_problem(W_small, UNIT * c_small, basis=B_small, privacy_bound=D_max ** 2)
p2.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
mech2 = p2.mechanism()
print(f"(epsilon, delta) = ({eps_goal}, {delta_goal:g}): largest privacy cost D = {D_max:.6f}; "
      f"Problem 2: s = {p2.s.value:.6f}, Problem 1 optimum / D^2 = {model.problem.value / D_max ** 2:.6f}")
print(f"  the mechanism's exact epsilon at delta = {delta_goal:g}: {mech2.epsilon(delta_goal):.6f}; "
      f"variance / target in [{mech2.variance_ratios.min():.4f}, {mech2.variance_ratios.max():.4f}]")


# %% [markdown]
# ## 5. PL-94: fitness for use against the baselines
#
# The paper's section 7.3: the 2010 PL94-171 table, voting age (2) x
# ethnicity (2) x race (63 non-empty combinations of 6 races) = 252 cells;
# the workload is the three one-way marginals and all cells (319 queries),
# every target 1.  (`FAST` uses 4 races, 15 combinations, 60 cells.)
#
# NEWTON_CG finds the least privacy cost `p` meeting every target.  Then each
# baseline is calibrated to the same `p` (`cvxdp.fitness.baseline_variances`)
# and we report its largest variance / target, i.e. by how much it misses the
# worst-served query; fitness for use is 1 by construction:
#
# * **IP**, input perturbation: i.i.d. noise on the cells, `sigma^2 = 1/p`;
# * **HM**, the hierarchical mechanism: i.i.d. noise on the nodes of a k-ary
#   tree over the cells, least squares, the best `k` in 2..16 (the paper's own
#   tree comes below);
# * **CA**, the matrix mechanism minimizing total variance, solved by SCS.
#   (With equal targets its weighted variants wCA-I and wCA-II are the same
#   problem.)

# %%
W_pl, groups_pl = pl94_workload(PL94_DOMAIN)
m_pl, n_pl = W_pl.shape
c_pl = np.ones(m_pl)
print(f"PL-94 {PL94_DOMAIN}: {m_pl} queries on {n_pl} cells")
t0 = time.perf_counter()
pl = cvxdp.fitness_problem(W_pl, c_pl)
pl.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
t_pl = time.perf_counter() - t0
es = pl.problem.solver_stats.extra_stats
mech_pl = pl.mechanism()
p = pl.problem.value
print(f"NEWTON_CG: status {pl.problem.status}, squared privacy cost p = {p:.6f} "
      f"(certified gap {es['gap']:.1e}, lower bound {es['lower_bound']:.6f}), "
      f"{pl.problem.solver_stats.num_iters} Newton steps, {t_pl:.2f} s including the model "
      f"(basis B: {pl.B.shape[0]} rows of W)")
print(f"  check: max variance / target {mech_pl.variance_ratios.max():.7f}; "
      f"exact epsilon at delta = 1e-6: {mech_pl.epsilon(1e-6):.4f}")

variances = {"fitness for use": mech_pl.variances}
times = {}
for meth in ("IP", "HM", "CA"):
    t0 = time.perf_counter()
    variances[meth] = cvxdp.fitness.baseline_variances(W_pl, p, meth, c_pl)
    times[meth] = time.perf_counter() - t0
hm_by_k = {k: max_ratio(cvxdp.fitness.baseline_variances(W_pl, p, "HM", c_pl, branching=k), c_pl)
           for k in range(2, 17)}
best_k = min(hm_by_k, key=hm_by_k.get)
widest = int(W_pl.sum(axis=1).max())

print(f"\n{'mechanism':<17}{'max ratio':>10}" + "".join(f"{g:>21}" for g in groups_pl)
      + f"{'sum of variances':>18}{'time [s]':>9}")
for name, v in variances.items():
    r = v / c_pl
    print(f"{name:<17}{r.max():>10.3f}" + "".join(f"{r[s].max():>21.3f}" for s in groups_pl.values())
          + f"{v.sum():>18.1f}{times.get(name, t_pl):>9.2f}")
print("(per group: the largest variance / target among that group's queries)")
print(f"IP's ratio is (cells in the widest query) / p = {widest} / {p:.4f} = {widest / p:.3f}")
print("HM by branching factor k: " + ", ".join(f"{k}: {r:.2f}" for k, r in hm_by_k.items())
      + f"; best k = {best_k}")
sum_ratio = variances["fitness for use"].sum() / variances["CA"].sum()
print(f"sum of variances, fitness for use / CA = {sum_ratio:.3f}")

# %% [markdown]
# **Against the paper's Table 4** (PL94 row, quoted: IP 36.56, HM 13.93,
# CA 3.99, wCA-I/II 3.99, SM-II 1.00; its SM-II's sum of variances is 2.07x
# CA's).  Every baseline's variances scale like `1/p`, and IP's worst ratio
# is exactly `126 / p`, so the paper's IP value tells which squared cost its
# baselines were calibrated to.  The full run prints that cost and the
# baselines recomputed there.  The paper's HM is not a complete k-ary tree:
# its published code uses a two-level tree, the total, `floor(sqrt(n))`
# blocks of `floor(sqrt(n))` cells and the cells, with the noise calibrated
# to three levels.  `cvxdp.workloads.sqrt_tree(n)` builds it, and
# `baseline_variances(..., "HM", strategy=...)` evaluates HM on any tree.

# %%
PAPER_TABLE4 = {"IP": 36.56, "HM": 13.93, "CA": 3.99}      # Xiao et al. 2021, Table 4, PL94 (quoted)
if PL94_DOMAIN == (2, 2, 63):
    p_paper = widest / PAPER_TABLE4["IP"]
    print(f"the paper's IP ratio {PAPER_TABLE4['IP']} = {widest} / p' gives p' = {p_paper:.4f}, "
          f"{p_paper / p:.3f} x the squared cost certified here (lower bound {es['lower_bound']:.6f})")
    print("baselines recomputed at p' (this run -> paper): "
          + ", ".join(f"{k} {max_ratio(variances[k], c_pl) * p / p_paper:.2f} -> {PAPER_TABLE4[k]}"
                      for k in ("IP", "HM", "CA"))
          + f", HM with binary tree {hm_by_k[2] * p / p_paper:.2f}")
    hm_paper_tree = cvxdp.fitness.baseline_variances(W_pl, p_paper, "HM", c_pl,
                                                     strategy=cvxdp.workloads.sqrt_tree(n_pl))
    print(f"HM on the paper's two-level tree (cvxdp.workloads.sqrt_tree) at p': "
          f"{max_ratio(hm_paper_tree, c_pl):.2f} -> {PAPER_TABLE4['HM']}")
else:
    print("(FAST mode: the comparison with the paper's Table 4 needs the full 252-cell domain)")

# %%
names = ["IP", "HM", "CA", "fitness for use"]
colors = ["0.55", "C0", "C2", "C3"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw=dict(width_ratios=[2, 3]))
vals = [max_ratio(variances[k], c_pl) for k in names]
bars = ax1.bar(names, vals, color=colors)
for b, val in zip(bars, vals):
    ax1.annotate(f"{val:.2f}", (b.get_x() + b.get_width() / 2, val), ha="center", va="bottom", fontsize=9)
ax1.set_yscale("log")
ax1.set_ylim(bottom=0.5)
ax1.axhline(1.0, color="k", lw=0.6)
ax1.set_ylabel("max variance / target (same privacy cost)")
ax1.set_title("worst-served query", fontsize=10)
width = 0.2
gnames = list(groups_pl)
for j, (k, col) in enumerate(zip(names, colors)):
    r = variances[k] / c_pl
    ax2.bar(np.arange(len(gnames)) + (j - 1.5) * width, [r[s].max() for s in groups_pl.values()],
            width, color=col, label=k)
ax2.set_xticks(np.arange(len(gnames)), gnames)
ax2.set_yscale("log")
ax2.axhline(1.0, color="k", lw=0.6)
ax2.set_ylabel("largest variance / target in the group")
ax2.set_title("by query group", fontsize=10)
ax2.legend(fontsize=8)
for ax in (ax1, ax2):
    ax.grid(True, axis="y", which="major", alpha=0.3)
fig.suptitle(f"PL-94 workload, {m_pl} queries on {n_pl} cells {PL94_DOMAIN}, every target 1, "
             f"all mechanisms at squared privacy cost {p:.4f} (eps = {mech_pl.epsilon(1e-6):.2f} "
             f"at delta = 1e-6)", fontsize=10)
fig.tight_layout()
path = OUT / "fitness_variance_ratios.png"
fig.savefig(path, dpi=120)
plt.close(fig)
print(f"saved {path}")
print(f"total run time {time.perf_counter() - T_START:.1f} s")


# %% [markdown]
# ## What the run shows
#
# The numbers are in the run's output (and, for one full run, in
# `tutorials/README.md`); here is how to read them.
#
# * **Solvers.**  NEWTON_CG, SCS and Clarabel reach the same squared privacy
#   cost (relative objective gaps printed).  NEWTON_CG's answer carries a
#   certificate (its gap and lower bound) and meets every target; a standard
#   solver's `X` may overshoot a target by its tolerance.  SCS and Clarabel
#   see one LMI of size `k + 1` per query, which is why the comparison uses a
#   12-cell table; the FULL run also shows SCS's iteration count when the
#   same problem is stated in counts squared.
# * **Identity + total.**  The computed optima match the closed forms to the
#   printed digits: the fitness-for-use cost `2d/(d+1)` and covariance
#   `(d+1)/d I - 1/d 1 1^T`; the total-variance optimum's cells at about half
#   their target and its total at `sqrt(d+1)(d-1+sqrt(d+1))/(2d)` times its
#   target, a miss that grows without bound.  Its sum of variances is lower,
#   as it must be: that is what it minimizes.
# * **The publisher's output** is one privacy cost `D`, from which every exact
#   `(epsilon, delta)` pair follows.  The Monte Carlo variance ratios near 1
#   and the small mean error check the release.  Problem 2's `s` equals
#   Problem 1's optimum divided by the privacy budget (the paper's section
#   3.3).  In this example every query ends up exactly at its target and
#   every cell has the same personalized privacy cost (the printed profile).
# * **PL-94.**  At the same privacy cost every baseline misses some target:
#   input perturbation on the wide marginals (its ratio is exactly the
#   marginal's number of cells over `p`), the hierarchical mechanism (at its
#   best branching factor) on the marginals, the total-variance matrix
#   mechanism on the voting-age and ethnicity marginals while giving the
#   cells and the race marginal more accuracy than asked for (see the
#   per-group columns and the right panel of the figure).
#   Fitness for use meets every target, at a larger sum of variances than CA.
# * **The paper's Table 4.**  The ordering IP > HM > CA > SM-II is the same.
#   Recomputed at the cost implied by the paper's IP ratio, IP, CA and HM on
#   the paper's two-level tree give the paper's three values to the printed
#   digits.  So the paper's baselines were calibrated to a squared cost above
#   the optimum certified here (the printed factor): its SM-II had stopped
#   short of the optimum.  HM on the best complete k-ary tree does far better
#   than the paper's tree on this workload, but still misses the targets.
