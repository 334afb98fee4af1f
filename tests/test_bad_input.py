"""Bad input fails early and clearly; infeasibility is a status, never garbage."""
import numpy as np
import pytest
import cvxpy as cp

import cvxdp


def test_measurement_validation_names_the_argument():
    Q = np.eye(3)
    with pytest.raises(ValueError, match="answers.*NaN"):
        cvxdp.Measurement(Q, [1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="answers.*inf"):
        cvxdp.Measurement(Q, [1.0, np.inf, 2.0])
    with pytest.raises(ValueError, match="scale"):
        cvxdp.Measurement(Q, [1.0, 2.0, 3.0], "laplace", 0.0)
    with pytest.raises(ValueError, match="scale"):
        cvxdp.Measurement(Q, [1.0, 2.0, 3.0], "gaussian", [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match=r"answers must have shape \(3,\)"):
        cvxdp.Measurement(Q, [1.0, 2.0])
    with pytest.raises(ValueError, match="noise"):
        cvxdp.Measurement(Q, [1.0, 2.0, 3.0], "cauchy")


def test_nll_shape_mismatch():
    m = cvxdp.Measurement(np.ones((2, 4)), [1.0, 2.0])
    with pytest.raises(ValueError, match="x has 3 entries"):
        cvxdp.nll(m, cp.Variable(3))
    with pytest.raises(TypeError, match="Measurement"):
        cvxdp.nll([m, "not a measurement"], cp.Variable(4))


def test_consistent_checks_size():
    tree = cvxdp.workloads.hierarchy(8, 2)
    with pytest.raises(ValueError, match="one entry per node"):
        cvxdp.consistent(tree, cp.Variable(8))


def test_callers_arrays_are_not_mutated():
    rng = np.random.default_rng(0)
    tree = cvxdp.workloads.hierarchy(16, 2)
    answers = rng.normal(size=tree.n_nodes) * 10
    keep = answers.copy()
    Q = tree.queries.copy()
    m = cvxdp.Measurement(tree.queries, answers, "laplace", 2.0)
    answers[0] = 1e6                      # the Measurement took a copy
    assert m.answers[0] == keep[0]
    answers[0] = keep[0]
    x = cp.Variable(tree.n_nodes)
    cp.Problem(cp.Minimize(cvxdp.nll(m, x)), [cvxdp.consistent(tree, x), x >= 0]).solve(
        method="cvxdp", solver=cvxdp.ADMM)
    np.testing.assert_array_equal(answers, keep)
    assert (tree.queries != Q).nnz == 0


def contradicting_marginals():
    """Two known marginals of a 3 x 4 table whose totals differ: no table has both."""
    Q1 = cvxdp.workloads.marginal((3, 4), (0,))
    Q2 = cvxdp.workloads.marginal((3, 4), (1,))
    z = cp.Variable(12)
    noisy = np.arange(12.0)
    return cp.Problem(cp.Minimize(cp.norm1(z - noisy)),
                      [Q1 @ z == [5, 5, 5], Q2 @ z == [4, 4, 4, 4], z >= 0])


@pytest.mark.parametrize("make", ["marginals", "negative"])
def test_infeasible_constraints_are_reported_infeasible(make):
    if make == "marginals":
        prob = contradicting_marginals()
    else:
        # a known marginal that contradicts non-negativity
        Q1 = cvxdp.workloads.marginal((3, 4), (0,))
        z = cp.Variable(12)
        prob = cp.Problem(cp.Minimize(cp.norm1(z - 1)), [Q1 @ z == [5, -2, 5], z >= 0])
    prob.solve(solver=cp.CLARABEL)
    assert prob.status == cp.INFEASIBLE
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.INFEASIBLE
    assert prob.value == np.inf
    assert all(v.value is None for v in prob.variables())


def test_tree_root_fixed_negative_is_infeasible():
    tree = cvxdp.workloads.hierarchy(8, 2)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - 1)),
                      [cvxdp.consistent(tree, x), x >= 0, x[0] == -3])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.INFEASIBLE


def test_inconsistent_bounds_are_infeasible():
    x = cp.Variable(3)
    prob = cp.Problem(cp.Minimize(cp.norm1(x)), [x >= 2, x <= 1])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.INFEASIBLE
