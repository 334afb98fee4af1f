# %% [markdown]
# # Tutorial 7: designing the noise for a marginal workload — each marginal its own accuracy
#
# A release of many marginals (here: every one- and two-way marginal of the Adult data, 105
# tables) rarely needs the same accuracy everywhere: the one-way tables are read alone and
# must be sharp, the two-way tables are read in aggregate and can be noisier.  The question is
# what noise to add so that **each marginal meets its own variance target at the least privacy
# cost** — the fitness-for-use problem of Xiao, He, Zhang and Kifer (VLDB 2021) on a workload
# whose query matrix is far too large to form.
#
# ResidualPlanner (Xiao, Wang, Ding, Kifer, NeurIPS 2023) shows that for marginals under
# Gaussian noise the optimal strategy measures each *residual* query `R_A` (every subset `A`
# of every workload clique) with its own variance `s_A`, and that the problem becomes
#
#     minimize  sum_A p_A / s_A     subject to   sum_{A in M} v_{M,A} s_A <= c_M  for every marginal M,
#
# a small convex program: `cvxdp.privacy_cost(W, s)` and `cvxdp.query_variance(W, s)` in cvxpy.
# `solver=cvxdp.NEWTON_CG` solves it exactly (certified gap, duals on every target); Clarabel
# solves the same model.  Then `cvxdp.mechanisms.residual_gaussian` measures and
# `cvxdp.reconstruct` returns unbiased marginals whose variances are the designed ones.
#
# Run: `python tutorials/07_designing_noise.py` (`CVXDP_TUTORIAL_FAST=1` for a smoke run;
# figures go to `$CVXDP_TUTORIAL_OUT`, default `tutorials/figures/`).

# %%
import itertools
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import cvxpy as cp  # noqa: E402

import cvxdp  # noqa: E402
from cvxdp.tour import adult_dir  # noqa: E402

FAST = os.environ.get("CVXDP_TUTORIAL_FAST", "") not in ("", "0")
OUT = Path(os.environ.get("CVXDP_TUTORIAL_OUT") or Path(__file__).resolve().parent / "figures")
OUT.mkdir(parents=True, exist_ok=True)
DRAWS = 5 if FAST else 50
rng = np.random.default_rng(0)

# %% [markdown]
# ## The data and the workload
#
# The Adult data (14 attributes, 48,842 records) when `../shared/data/adult` is present,
# otherwise synthetic records on a smaller domain.  The workload: every one-way marginal with
# a target variance per cell between 0.5 and 2, every two-way marginal with one between 5
# and 40 (drawn at random here; in practice, what each table's readers need).

# %%
where = adult_dir()
if where is not None and not FAST:
    dom = cvxdp.Domain.from_json(where / "adult-domain.json")
    import csv
    with open(where / "adult.csv") as fh:
        rows = list(csv.reader(fh))
    data = np.array(rows[1:], dtype=np.int64)[:, [rows[0].index(a) for a in dom.names]]
    print(f"Adult data: {data.shape[0]:,} records, {len(dom)} attributes")
else:
    dom = cvxdp.Domain({f"x{i}": n for i, n in enumerate([9, 5, 16, 7, 6, 2, 4, 12])})
    data = np.column_stack([rng.integers(0, n, 5000) for n in dom.sizes])
    print(f"synthetic data: {data.shape[0]:,} records, {len(dom)} attributes "
          f"({'FAST mode' if FAST else 'no Adult data found'})")
one_way = [(a,) for a in dom.names]
two_way = list(itertools.combinations(dom.names, 2))
W = cvxdp.workloads.marginal_workload(dom, one_way + two_way)
targets = np.concatenate([rng.uniform(0.5, 2.0, len(one_way)), rng.uniform(5.0, 40.0, len(two_way))])
print(W, "-- residuals:", W.residuals[:4], "...")

# %% [markdown]
# ## The design as a cvxpy model
#
# One variable per residual; the privacy cost is the design's squared L2 sensitivity, so the
# mechanism is `rho`-zCDP with `rho = cost / 2`.

# %%
s = cp.Variable(W.n_residuals, pos=True)
variance = cvxdp.query_variance(W, s)
prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [variance <= targets])
t0 = time.perf_counter()
prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
t_ours = time.perf_counter() - t0
stats = prob.solver_stats.extra_stats
print(f"cvxdp.NEWTON_CG: {prob.status}, privacy cost {prob.value:.8g} (rho = {prob.value / 2:.6g}) "
      f"in {t_ours:.3f} s; route {stats['info']['route']!r}, certified gap {stats['gap']:.1e}")
ours, design = prob.value, s.value.copy()
lam = prob.constraints[0].dual_value
t0 = time.perf_counter()
prob.solve(solver=cp.CLARABEL)
t_ref = time.perf_counter() - t0
print(f"Clarabel on the same model: {prob.value:.8g} in {t_ref:.3f} s; relative objective gap "
      f"{(ours - prob.value) / prob.value:+.1e}")

# %% [markdown]
# The duals say what each target costs: `lambda_M` is the privacy cost saved per unit of
# variance that marginal `M` gives up.  Only the marginals whose target binds have a positive
# dual; a one-way marginal inside a two-way one is often met for free.

# %%
reached = W.basis.V @ design
binding = reached >= targets * (1 - 1e-6)
print(f"targets that bind: {binding.sum()} of {len(targets)}; one-way: "
      f"{binding[:len(one_way)].sum()} of {len(one_way)}")
top = np.argsort(-lam)[:3]
for m in top:
    print(f"  most expensive target: {W.cliques[m]} (target {targets[m]:g}): dual {lam[m]:.3g}")

# %% [markdown]
# ## Against the strategies people use
#
# * **identity**: measure every workload marginal directly, each with Gaussian noise of its
#   own target variance: cost `sum_M 1 / c_M`;
# * **equal variances**: the residual strategy with one variance for every residual, scaled
#   until every target holds.

# %%
cost_identity = float(np.sum(1.0 / targets))
t = float(np.min(targets / (W.basis.V @ np.ones(W.n_residuals))))
cost_equal = float(cvxdp.privacy_cost(W, t * np.ones(W.n_residuals)).value)
for name, cost in (("optimal design", ours), ("equal variances", cost_equal), ("identity", cost_identity)):
    print(f"  {name:>16}: privacy cost {cost:10.4f}  ({cost / ours:5.2f}x the optimum)")

fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
ax[0].scatter(targets[:len(one_way)], reached[:len(one_way)], label="one-way", s=25)
ax[0].scatter(targets[len(one_way):], reached[len(one_way):], label="two-way", s=8, alpha=0.6)
lim = [0.3, 60]
ax[0].plot(lim, lim, "k--", lw=0.8)
ax[0].set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="target variance per cell",
          ylabel="variance reached", title="every target met; the binding ones exactly")
ax[0].legend()
ax[1].bar(["optimal", "equal\nvariances", "identity"], [ours, cost_equal, cost_identity],
          color=["tab:green", "tab:orange", "tab:gray"])
ax[1].set(ylabel="privacy cost (= 2 rho)", title="privacy cost at the same targets")
fig.tight_layout()
path = OUT / "designing_noise_targets.png"
fig.savefig(path, dpi=120)
print(f"saved {path}")

# %% [markdown]
# ## Measure and reconstruct
#
# For a release, fix the privacy budget: `scale_to_rho` rescales the design to `rho`, and
# every variance (so every target met) scales with it.  `residual_gaussian` adds the noise
# (numpy's sampler: for simulation; `sampler="opendp"` samples exactly for a real release),
# and `cvxdp.reconstruct` returns the unbiased marginals.  Their mean squared error, over
# repeated releases, is the designed variance.

# %%
rho = 1.0
release = cvxdp.mechanisms.scale_to_rho(W, design, rho)
factor = release[0] / design[0]
print(f"at rho = {rho}: every variance x {factor:.3g}")
truth = {q: dom.count(data, q) for q in W.cliques}
errors = np.zeros(len(W.cliques))
for _ in range(DRAWS):
    m = cvxdp.mechanisms.residual_gaussian(W, release, data, rng=rng)
    est = cvxdp.reconstruct(W, m)
    errors += [np.mean((est[q] - truth[q]) ** 2) for q in W.cliques]
errors /= DRAWS
designed = W.basis.V @ release
print(f"over {DRAWS} releases: mean squared error / designed variance, per marginal: "
      f"median {np.median(errors / designed):.3f}, range {np.min(errors / designed):.2f} - "
      f"{np.max(errors / designed):.2f}")
