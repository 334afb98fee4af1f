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


# ---------------------------------------------------------------- non-numbers name the entry
@pytest.mark.parametrize("args,match", [
    ((np.eye(3), [1.0, 2.0, 3.0], "laplace", "two"), r"scale must be real numbers: got 'two'"),
    ((np.eye(3), ["1", "a", "3"]), r"answers must be real numbers: entry 1 is 'a'"),
    (([["a", 1.0]], [1.0]), r"queries must be real numbers: entry \(0, 0\) is 'a'"),
    ((np.eye(3), [1.0, 2.0, 3.0], "gaussian", [1.0, "x", 2.0]), r"scale .* entry 1 is 'x'"),
    ((np.eye(3), [1.0, 2.0, 3.0], "gaussian", [1.0, -1.0, 2.0]),
     r"scale must be positive and finite, entry 1 is -1.0"),
    ((np.eye(3), [1.0, np.nan, 3.0]), r"answers contains NaN at index 1"),
])
def test_measurement_non_numbers_name_the_argument_and_entry(args, match):
    with pytest.raises(ValueError, match=match):
        cvxdp.Measurement(*args)


# ---------------------------------------------------------------- data too large for float64
def _tree_measurements(big_at: int):
    """Three measurements of a hierarchy's nodes; the second has one answer of 1e300."""
    tree = cvxdp.workloads.hierarchy(8, 2)
    ys = [np.arange(tree.n_nodes, dtype=float) for _ in range(3)]
    ys[1][big_at] = 1e300
    x = cp.Variable(tree.n_nodes)
    ms = [cvxdp.Measurement(tree.queries, y, noise, 1.0)
          for y, noise in zip(ys, ("laplace", "gaussian", "laplace"))]
    return cp.Problem(cp.Minimize(cvxdp.nll(ms, x)), [cvxdp.consistent(tree, x), x >= 0])


def _marginals(y_scale: float = 1.0, weight: float = 1.0, local: bool = False):
    dom = cvxdp.Domain({"a": 2, "b": 3})
    mus = {("a", "b"): cp.Variable((2, 3)), ("b",): cp.Variable(3)}
    y = np.arange(6.0).reshape(2, 3)
    y[1, 2] *= y_scale
    obj = cp.sum_squares(weight * (mus[("a", "b")] - weight * y)) + cp.norm1(mus[("b",)] - 2.0)
    cls = cvxdp.LocalPolytope if local else cvxdp.MarginalPolytope
    return cp.Problem(cp.Minimize(obj), [cls(mus, dom, total=15.0)])


def _bound_1e300():
    x = cp.Variable(4)
    return cp.Problem(cp.Minimize(cp.norm1(x - np.arange(4.0))), [x >= 0, x <= 1e300])


@pytest.mark.parametrize("make,method,match", [
    (lambda: _tree_measurements(3), cvxdp.ADMM,
     r"term 1 of the objective .* magnitude 1e\+300 at index \(3,\), above 1e\+150"),
    (_bound_1e300, cvxdp.ADMM, r"constraint 1 \(.*\) has a constant with magnitude 1e\+300"),
    (lambda: _marginals(1e300), cvxdp.MIRROR_DESCENT,
     r"term 0 of the objective .* magnitude 5e\+300 at index \(1, 2\)"),
    (lambda: _marginals(1e300, local=True), cvxdp.ADMM, r"magnitude 5e\+300 at index \(1, 2\)"),
    (lambda: _marginals(1.0, 1e100), cvxdp.MIRROR_DESCENT,
     r"loss term 0 of the objective .* entry \(1, 0\) .* weighted residual 3e\+200"),
])
def test_data_that_overflow_are_refused_naming_the_term(make, method, match):
    """A noisy answer or a bound of 1e300 (solved to ``optimal_inaccurate`` with an infinite
    objective before), and weighted data whose product overflows."""
    prob = make()
    with pytest.raises(ValueError, match=match):
        prob.solve(method="cvxdp", solver=method)
    with pytest.raises(ValueError, match="above 1e"):
        prob.solve(method="cvxdp", solver=method)       # no partial state left behind


def test_weighted_data_that_overflow_are_refused_by_admm():
    x = cp.Variable(5)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(cp.multiply(1e100, x - 1e100))), [x >= 0])
    with pytest.raises(ValueError, match=r"loss term 0 of the objective .* entry \(0,\) .* "
                                         r"weighted residual 1e\+200 is above 1e\+150"):
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)


def test_standard_solvers_are_not_refused_large_data():
    """Only the cvxdp methods refuse: the same model goes to Clarabel untouched."""
    prob = _bound_1e300()
    prob.solve(method="cvxdp", solver=cp.CLARABEL)
    assert prob.status == cp.OPTIMAL and prob.value == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("scale", [1e50, 1e100, 1e140])
def test_large_data_below_the_limit_are_solved(scale):
    """Counts up to 1e140 solve to the closed form ``x = max(y, 0)`` (no equality: the
    separable loss), with the objective that of the negative entries."""
    y = np.array([3.0, -1.0, 2.0, -0.5, 4.0]) * scale
    x = cp.Variable(5)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x >= 0])
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert prob.status == cp.OPTIMAL
    assert prob.value == pytest.approx(float(np.sum(np.minimum(y, 0.0) ** 2)), rel=1e-9)
    np.testing.assert_allclose(x.value, np.maximum(y, 0.0), rtol=1e-9, atol=1e-9 * scale)


def test_residual_answers_that_overflow_are_refused():
    dom = cvxdp.Domain({"a": 2, "b": 3})
    W = cvxdp.workloads.marginal_workload(dom, [("a", "b")])
    recs = np.column_stack([np.arange(12) % 2, np.arange(12) % 3])
    m = cvxdp.mechanisms.residual_gaussian(W, np.ones(W.n_residuals), recs, rng=0)
    j = int(np.flatnonzero(W.basis.p > 0)[-1])
    answers = [np.array(a, dtype=float) for a in m.answers]
    answers[j].flat[1] = 1e300
    big = type(m)(W, m.variances, answers, m.sampler)
    mus = {("a", "b"): cp.Variable((2, 3))}
    prob = cp.Problem(cp.Minimize(cvxdp.nll(big, mus)), [cvxdp.LocalPolytope(mus, dom, total=12.0)])
    with pytest.raises(ValueError, match=rf"answers of residual {j} .* reach 1e\+300"):
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)


# ---------------------------------------------------------------- NEWTON_CG's scales
@pytest.mark.parametrize("target,match", [
    (1e-200, r"target c = 1e-200 of constraint 0, entry 0 needs a noise precision of scale"),
    (1e-300, r"target c = 1e-300 of constraint 0, entry 0"),
])
def test_fitness_targets_whose_precision_overflows_are_refused(target, match):
    m = cvxdp.fitness_problem(np.tril(np.ones((4, 4))), target)
    with pytest.raises(ValueError, match=match):
        m.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)


def test_fitness_basis_too_large_is_refused_and_large_targets_solved():
    X = cp.Variable((3, 3), PSD=True)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(np.eye(3) * 1e110, X)),
                      [cvxdp.query_variance(np.eye(3), X) <= 1.0])
    with pytest.raises(ValueError, match=r"column 0 of B \(the basis\) has squared norm 1e\+220"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    W = np.tril(np.ones((4, 4)))
    ref = cvxdp.fitness_problem(W, 1.0).problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    big = cvxdp.fitness_problem(W, 1e200)            # homogeneous: the optimum / 1e200
    assert big.problem.solve(method="cvxdp", solver=cvxdp.NEWTON_CG) * 1e200 == \
        pytest.approx(ref, rel=1e-6)


def test_residual_design_targets_out_of_range_are_refused():
    W = cvxdp.workloads.marginal_workload(cvxdp.Domain({"a": 2, "b": 3, "c": 2}),
                                          [("a", "b"), ("b", "c")])
    s = cp.Variable(W.n_residuals, pos=True)
    c = cp.Parameter(2, pos=True)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c])
    c.value = np.ones(2)
    ref = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    for t in (1e-150, 1e150):
        c.value = np.array([1.0, 2.0]) * t
        with pytest.raises(ValueError, match=r"target c = .* of constraint 0, entry 0, sets "
                                             r"variances of scale"):
            prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    c.value = np.ones(2) * 1e-50
    value = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    assert value * 1e-50 == pytest.approx(ref, rel=1e-6)          # homogeneous in c


# ---------------------------------------------------------------- NEWTON_CG's targets, basis
def test_fitness_targets_of_the_wrong_length_name_both_lengths():
    L = np.tril(np.ones((4, 4)))
    X, s = cp.Variable((4, 4), PSD=True), cp.Variable()
    B = np.eye(4)
    rows = [cp.matrix_frac(L[i], X) <= np.ones(3) for i in range(4)]
    with pytest.raises(ValueError, match=r"c \(the variance targets\) of constraint 0: "
                                         r"cp.matrix_frac\(l, X\) is 1 query's variance, but c "
                                         r"has 3 entries of shape \(3,\)"):
        cp.Problem(cp.Minimize(cvxdp.privacy_cost(B, X)), rows).solve(
            method="cvxdp", solver=cvxdp.NEWTON_CG)
    column = cvxdp.query_variance(L, X) <= np.arange(1.0, 5.0).reshape(4, 1)
    with pytest.raises(ValueError, match=r"query_variance\(L, X\) has 4 entries .* shape "
                                         r"\(4, 1\) \(cvxpy broadcasts them to 16 constraints\)"):
        cp.Problem(cp.Minimize(cvxdp.privacy_cost(B, X)), [column]).solve(
            method="cvxdp", solver=cvxdp.NEWTON_CG)
    scaled = [cp.matrix_frac(L[i], X) <= s * np.ones(3) for i in range(4)]
    with pytest.raises(ValueError, match=r"c has 3 entries"):
        cp.Problem(cp.Minimize(s), scaled + [cvxdp.privacy_cost(B, X) <= 1.0]).solve(
            method="cvxdp", solver=cvxdp.NEWTON_CG)
    with pytest.raises(ValueError, match=r"\(4,\) .* \(3,\)"):     # cvxpy's own, when built
        cvxdp.query_variance(L, X) <= np.ones(3)


def test_a_nan_basis_names_the_entry():
    B = np.eye(3)
    B[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"privacy_cost: B contains NaN at row 1, column 2"):
        cvxdp.privacy_cost(B, cp.Variable((3, 3), PSD=True))
    with pytest.raises(ValueError, match=r"basis \(B\) contains NaN at row 1, column 2"):
        cvxdp.fitness_problem(np.tril(np.ones((3, 3))), 1.0, basis=B)
    with pytest.raises(ValueError, match=r"query_variance: L contains \+inf at row 0, column 1"):
        cvxdp.query_variance(np.array([[1.0, np.inf]]), cp.Variable((2, 2)))
