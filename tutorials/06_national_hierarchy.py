# %% [markdown]
# # Tutorial 6: a national hierarchy — a histogram at every unit, consistent integers
#
# A statistical office releases, for every geographic unit (nation, states, counties,
# tracts), a histogram of its population (here 64 cells: think age group x sex x race),
# measured with Gaussian noise under zCDP.  What it publishes must add up: every unit's
# histogram is the sum of its children's, cell by cell, counts are non-negative integers,
# and some totals are known exactly (invariants).  Post-processing, in three steps:
#
# 1. **GLS**: the weighted least-squares estimate over the whole tree (the maximum-likelihood
#    estimate for Gaussian noise), with the variance of every cell;
# 2. **non-negativity**: the same loss with `X >= 0`;
# 3. **integers**: `cvxdp.round_consistent` rounds each entry to its floor or ceiling so
#    that every parent is still the sum of its children, at the least L1 distance.
#
# The model is ordinary cvxpy: one variable `X` with a row per unit and a column per cell,
# `cvxdp.HierarchicalHistogram(geo, X)` (which is `geo.consistency @ X == 0`), and one
# squared loss per level.  `cvxdp.ADMM` reads it as a tree of histograms and runs the exact
# two-pass GLS (Kalman filtering and smoothing on the tree) or an ADMM on top of it; Clarabel
# solves the same model.
#
# Run: `python tutorials/06_national_hierarchy.py` (`CVXDP_TUTORIAL_FAST=1` for a smoke run;
# figures go to `$CVXDP_TUTORIAL_OUT`, default `tutorials/figures/`).

# %%
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import cvxpy as cp  # noqa: E402

import cvxdp  # noqa: E402
from cvxdp.solvers.tree.gls import Block, TreeGLS  # noqa: E402

FAST = os.environ.get("CVXDP_TUTORIAL_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("CVXDP_TUTORIAL_OUT") or Path(__file__).resolve().parent / "figures")
OUT.mkdir(parents=True, exist_ok=True)
SIZES = (3, 30, 300) if FAST else (10, 300, 6000)     # states, counties, tracts
K, GROUPS, RHO = 64, 8, 1.0
LEVELS = ("nation", "state", "county", "tract")
rng = np.random.default_rng(0)

# %% [markdown]
# ## A geography is any tree of named units
#
# A nested mapping, a `{unit: parent}` mapping or a parent array; units need not have the
# same number of children.

# %%
tiny = cvxdp.workloads.geography({"US": {"PA": ["Centre", "Erie"], "NY": ["Kings", "Queens", "Bronx"]}})
print(tiny, tiny.names)
print("consistency matrix (a row per inner unit: parent minus children):")
print(tiny.consistency.toarray().astype(int))

# %% [markdown]
# ## A synthetic country
#
# Counties per state and tracts per county from Dirichlet-multinomials (uneven, as real ones
# are); each tract's population is heavy-tailed and spread sparsely over the 64 cells.  Each
# level is measured with the Gaussian mechanism: the cells and an 8-group marginal of them,
# zCDP `rho` split over the four levels (one record changes one cell and one group: L2
# sensitivity squared 2, so `sigma = sqrt(2 / (2 rho_level))`).

# %%
states, counties, tracts = SIZES
c_per_s = rng.multinomial(counties - states, rng.dirichlet(np.full(states, 2.0))) + 1
t_per_c = rng.multinomial(tracts - counties, rng.dirichlet(np.full(counties, 1.0))) + 1
parent = [-1] + [0] * states
for s, c in enumerate(c_per_s):
    parent += [1 + s] * int(c)
first = 1 + states
for c, t in enumerate(t_per_c):
    parent += [first + c] * int(t)
geo = cvxdp.workloads.geography(np.array(parent))
leaves = rng.poisson(rng.gamma(0.6, 2500.0, (geo.leaves.size, 1)) * rng.dirichlet(np.full(K, 0.15), geo.leaves.size))
truth = geo.aggregate(leaves.astype(float))
Qg = np.kron(np.eye(GROUPS), np.ones((1, K // GROUPS)))
sigma = np.sqrt(2.0 / (2.0 * RHO / 4))
noisy = truth + rng.normal(0, sigma, truth.shape)
noisy_groups = truth @ Qg.T + rng.normal(0, sigma, (geo.n_nodes, GROUPS))
print(f"{geo}: {geo.n_nodes * K:,} unknowns, population {truth[0].sum():,.0f}, sigma {sigma:.2f}")

# %% [markdown]
# ## The model, solved twice
#
# $$\min_X \sum_v \frac{\|X_v - y_v\|^2 + \|Q X_v - g_v\|^2}{2\sigma^2}
#   \quad\text{s.t.}\quad X_p = \sum_{c \in \mathrm{children}(p)} X_c,\;\; [X \ge 0]$$

# %%
X = cp.Variable((geo.n_nodes, K))
loss = (cp.sum_squares(X - noisy) + cp.sum_squares(X @ Qg.T - noisy_groups)) / (2 * sigma ** 2)
gls = cp.Problem(cp.Minimize(loss), [cvxdp.HierarchicalHistogram(geo, X)])
t = time.perf_counter()
gls.solve(method="cvxdp", solver=cvxdp.ADMM)
t_ours, f_ours, x_gls = time.perf_counter() - t, gls.value, X.value
print(f"GLS, cvxdp.ADMM: {t_ours:.2f} s, {gls.solver_stats.extra_stats['info']['route']}")
t = time.perf_counter()
gls.solve(solver=cp.CLARABEL)
print(f"GLS, Clarabel:   {time.perf_counter() - t:.2f} s; relative objective gap "
      f"{(f_ours - gls.value) / abs(gls.value):+.1e}")

nonneg = cp.Problem(cp.Minimize(loss), [cvxdp.HierarchicalHistogram(geo, X), X >= 0])
t = time.perf_counter()
nonneg.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=1e-5)
x_nn = X.value
print(f"GLS with X >= 0, cvxdp.ADMM: {time.perf_counter() - t:.2f} s, {nonneg.status}, certified gap "
      f"{nonneg.solver_stats.extra_stats['gap']:.1e}")

# %% [markdown]
# ## Integers that add up
#
# Each entry goes to its floor or ceiling; which ones go up is decided bottom-up so that every
# parent equals the sum of its children exactly (the tree's constraints are totally
# unimodular, so such a rounding always exists; `round_consistent` finds the one closest in L1
# without a MIP solver).  Entries that are already integers stay; `invariants={unit: value}`
# would keep known totals too.

# %%
t = time.perf_counter()
x_int = cvxdp.round_consistent(geo, np.maximum(x_nn, 0.0))
print(f"round_consistent: {time.perf_counter() - t:.2f} s; every parent = sum of children: "
      f"{np.array_equal(geo.consistency @ x_int, np.zeros((geo.internal.size, K)))}; "
      f"largest move {np.abs(x_int - x_nn).max():.3f}")

# %% [markdown]
# ## Error by level
#
# GLS pools every level's measurements (each cell's variance comes with it); non-negativity
# removes most of the error of the many empty tract cells; rounding costs little.

# %%
# each cell's GLS variance, from the numerical layer (the same two passes)
cells_var, _ = TreeGLS(geo.forest, K, [Block(np.arange(geo.n_nodes), np.eye(K), 1 / sigma ** 2, noisy),
                                       Block(np.arange(geo.n_nodes), Qg, 1 / sigma ** 2, noisy_groups)]).variances()
rows = {}
for name, est in (("noisy", noisy), ("GLS", x_gls), ("GLS, X >= 0", x_nn), ("integers", x_int)):
    rows[name] = [np.abs(est[u] - truth[u]).mean() for u in geo.levels]
    print(f"{name:12s} " + "  ".join(f"{lv} {e:6.3f}" for lv, e in zip(LEVELS, rows[name])))
print("GLS standard deviation per cell (from the variances): " +
      "  ".join(f"{lv} {np.sqrt(cells_var[u]).mean():.3f}" for lv, u in zip(LEVELS, geo.levels)))

fig, ax = plt.subplots(figsize=(6.5, 4))
pos = np.arange(len(LEVELS))
for i, (name, errs) in enumerate(rows.items()):
    ax.bar(pos + (i - 1.5) * 0.2, errs, width=0.2, label=name)
ax.set_xticks(pos, LEVELS)
ax.set_ylabel("mean absolute error per cell")
ax.set_title(f"{geo.n_nodes:,} units x {K} cells, zCDP rho = {RHO}")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "national_error_by_level.png", dpi=120)
print(f"wrote {OUT / 'national_error_by_level.png'}")
