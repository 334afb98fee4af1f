"""``duals=False`` on every ADMM route: the same certified optimum as Clarabel, no duals written,
and the work done only for exact multipliers skipped (the bootstrap's re-solves use it)."""
from __future__ import annotations

import numpy as np
import pytest
import cvxpy as cp

import cvxdp

from tests.consistency.test_general_route import TIGHT, instance


def _tree(seed: int, loss: str):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(37, 3)
    y = tree.queries @ rng.poisson(3, 37) + rng.laplace(0, 2, tree.n_nodes)
    x = cp.Variable(tree.n_nodes)
    obj = cp.norm1(x - y) if loss == "l1" else cp.sum_squares(x - y)
    return cp.Problem(cp.Minimize(obj), [cvxdp.consistent(tree, x), x >= 0])


def _chain(seed: int, loss: str):
    rng = np.random.default_rng(seed)
    y = np.sort(rng.normal(size=60) * 3) + rng.laplace(size=60)
    x = cp.Variable(60)
    obj = cp.norm1(x - y) if loss == "l1" else cp.sum_squares(x - y)
    return cp.Problem(cp.Minimize(obj), [x[:-1] <= x[1:], x >= 0, x <= 5])


def _general(seed: int, loss: str):
    return instance(30, loss, "nonneg", seed, dup=True)[0]


@pytest.mark.parametrize("build", [_tree, _chain, _general], ids=["tree", "chain", "general"])
@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_duals_false_same_optimum_no_duals(build, loss):
    prob = build(7, loss)
    ref = prob.solve(solver=cp.CLARABEL, **TIGHT)
    val = prob.solve(method="cvxdp", solver=cvxdp.ADMM, duals=False, warm_start=False)
    es = prob.solver_stats.extra_stats
    assert prob.status == cp.OPTIMAL
    assert abs(val - ref) <= 2e-6 * max(1.0, abs(ref))
    assert es["gap"] <= 1e-6 and not es["duals_certified"]
    assert all(dv.value is None for c in prob.constraints for dv in c.dual_variables)
    for con in prob.constraints:
        assert float(np.max(np.atleast_1d(con.violation()))) <= 1e-6
