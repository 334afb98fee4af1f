"""Pool-adjacent-violators against cvxpy, and chains read from order edges."""
import cvxpy as cp
import numpy as np
import pytest

from cvxdp.solvers.consistency.isotonic import Chains, pava


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


# ------------------------------------------------------------------ exact L1 isotonic regression
def _l1_reference(y, w, segs):
    import cvxpy as cp
    n = y.size
    X = cp.Variable(n)
    ends = np.r_[segs[1:], n]
    cons = [X[a:b - 1] <= X[a + 1:b] for a, b in zip(segs, ends) if b - a > 1]
    prob = cp.Problem(cp.Minimize(cp.sum(cp.multiply(w, cp.abs(X - y)))), cons)
    prob.solve(solver=cp.HIGHS)
    return prob.value


@pytest.mark.parametrize("seed", range(60))
def test_l1_isotonic_matches_highs(seed):
    from cvxdp.solvers.consistency.isotonic import l1_isotonic
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    y = np.round(rng.normal(size=n) * 3 + np.arange(n) * rng.uniform(-0.5, 0.5), int(rng.integers(0, 3)))
    w = rng.uniform(0.1, 3, n) if seed % 2 else np.ones(n)
    segs = np.unique(np.r_[0, rng.integers(0, n, int(rng.integers(0, 4)))]) if n > 1 else np.array([0])
    x = l1_isotonic(y, w, segs)
    ends = np.r_[segs[1:], n]
    for a, b in zip(segs, ends):
        assert np.all(np.diff(x[a:b]) >= 0)
    assert np.all(np.isin(x, y))                   # values among the data's
    ref = _l1_reference(y, w, segs)
    assert float(np.sum(w * np.abs(x - y))) == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_l1_isotonic_known_answers():
    from cvxdp.solvers.consistency.isotonic import l1_isotonic
    np.testing.assert_array_equal(l1_isotonic(np.array([3.0, 1.0, 2.0]), np.ones(3)), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(l1_isotonic(np.array([1.0, 2.0, 3.0]), np.ones(3)), [1.0, 2.0, 3.0])
    # a heavy point pulls its block to its value
    np.testing.assert_array_equal(l1_isotonic(np.array([5.0, 1.0]), np.array([10.0, 1.0])), [5.0, 5.0])
    assert l1_isotonic(np.zeros(0), np.zeros(0)).size == 0


@pytest.mark.parametrize("seed", range(200))
def test_vectorised_chain_dual_is_feasible_when_the_sequential_one_is(seed):
    from cvxdp.solvers.consistency.isotonic import Chains, chain_dual, chain_dual_lowest
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    L = rng.normal(size=n)
    U = L + np.abs(rng.normal(size=n)) * (rng.random(n) < 0.7)
    L[rng.random(n) < 0.1] = -np.inf
    U[rng.random(n) < 0.1] = np.inf
    ch = Chains([np.arange(n)], n)
    a, b = chain_dual(ch, L, U, np.zeros(n)), chain_dual_lowest(ch, L, U)
    assert (a is None) == (b is None)
    if b is not None:
        o = np.cumsum(b)[:-1]
        assert np.all(b >= L - 1e-9) and np.all(b <= U + 1e-9) and np.all(o >= -1e-9)
        assert abs(b.sum()) <= 1e-9


@pytest.mark.parametrize("n", [2, 3, 50, 3000])
def test_l1_under_order_solves_exactly_through_cvxpy(n):
    import cvxpy as cp
    import cvxdp
    rng = np.random.default_rng(n)
    y = rng.laplace(0, 10, n) + np.sort(rng.uniform(-20, 100, n))
    x = cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y)), [cvxdp.ordered(x), x >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == "optimal"
    assert prob.solver_stats.extra_stats["info"]["route"] == "isotonic L1 (exact)"
    assert prob.solver_stats.extra_stats["duals_certified"]
    ours = prob.value
    prob.solve(solver=cp.HIGHS)
    assert ours == pytest.approx(prob.value, rel=1e-9, abs=1e-9)
