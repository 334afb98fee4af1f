"""Pool-adjacent-violators against cvxpy, and chains read from order edges."""
import cvxpy as cp
import numpy as np
import pytest

from cvxdp.solvers.isotonic import Chains, pava


@pytest.mark.parametrize("seed", range(4))
def test_weighted_pava_matches_cvxpy(seed):
    rng = np.random.default_rng(seed)
    v = np.cumsum(rng.normal(size=30)) + rng.normal(scale=3, size=30)
    w = rng.uniform(0.2, 2.0, 30)
    x = cp.Variable(30)
    cp.Problem(cp.Minimize(cp.sum(cp.multiply(w, cp.square(x - v)))), [x[:-1] <= x[1:]]).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12)
    np.testing.assert_allclose(pava(v, w), x.value, atol=1e-6)
    np.testing.assert_allclose(pava(pava(v, w), w), pava(v, w), atol=1e-14)   # idempotent


def test_chains_from_edges():
    c = Chains.from_edges(np.array([5, 3, 0]), np.array([3, 1, 2]), 7)
    assert sorted(tuple(ch) for ch in c.chains) == [(0, 2), (5, 3, 1)]
    assert Chains.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3) is None   # cycle
    assert Chains.from_edges(np.array([0, 0]), np.array([1, 2]), 3) is None         # branching


def test_chain_projection_and_multipliers():
    rng = np.random.default_rng(1)
    v = rng.normal(size=12)
    chains = Chains([np.array([0, 4, 8, 2]), np.array([11, 1, 6])], 12)
    x = chains.project(v)
    assert chains.violation(x) <= 1e-12
    untouched = np.setdiff1d(np.arange(12), [0, 4, 8, 2, 11, 1, 6])
    np.testing.assert_array_equal(x[untouched], v[untouched])
    # v - x is in the normal cone: D^T o = v - x with o >= 0 on every edge
    for o in chains.multipliers(v - x):
        assert np.all(o >= -1e-12)
