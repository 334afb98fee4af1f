"""Dispatch: names, pass-through, recognition errors, options, statistics, write-back."""
import logging

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.methods.compat import PRIVATE_ATTRIBUTES
from conftest import sparse_counts


def small_tree_problem(seed=0, n_leaves=16):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(n_leaves, 2)
    y = cvxdp.mechanisms.laplace(tree.queries, sparse_counts(n_leaves, rng), epsilon=1.0, rng=seed)
    x = cp.Variable(tree.n_nodes)
    return cp.Problem(cp.Minimize(cvxdp.nll(y, x)), [cvxdp.consistent(tree, x), x >= 0]), x


def test_registered_and_callable_both_ways():
    assert "cvxdp" in cp.Problem.REGISTERED_SOLVE_METHODS
    p1, x1 = small_tree_problem()
    v1 = p1.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False)
    p2, x2 = small_tree_problem()
    v2 = cvxdp.solve(p2, solver=cvxdp.ADMM, warm_start=False)
    assert v1 == pytest.approx(v2, rel=2e-6)      # both certified within eps_rel = 1e-6
    assert p1.status == cp.OPTIMAL and v1 == pytest.approx(p1.value)


def test_solver_none_chooses_by_cost_and_names_are_case_insensitive():
    p, _ = small_tree_problem()
    p.solve(method="cvxdp")
    choice = p.solver_stats.extra_stats["choice"]
    assert p.solver_stats.solver_name == choice["solver"] in (cvxdp.ADMM, cp.CLARABEL)
    assert p.status == cp.OPTIMAL
    p.solve(method="cvxdp", solver="admm")
    assert p.solver_stats.solver_name == cvxdp.ADMM


@pytest.mark.parametrize("solver", [cp.CLARABEL, cp.SCS])
def test_cvxpy_solvers_pass_through(solver):
    p, _ = small_tree_problem()
    p.solve(method="cvxdp", solver=solver)
    assert p.solver_stats.solver_name == solver
    assert p.status == cp.OPTIMAL


def test_statistics_and_private_attributes_written_once():
    for attr in PRIVATE_ATTRIBUTES:
        assert hasattr(cp.Problem(cp.Minimize(0)), attr)
    p, _ = small_tree_problem()
    p.solve(method="cvxdp", solver=cvxdp.ADMM)
    st = p.solver_stats
    assert st.num_iters > 0 and st.solve_time > 0 and st.setup_time >= 0
    assert p.compilation_time is not None and p.compilation_time >= 0
    assert tuple(st.extra_stats) == cvxdp.methods.base.EXTRA_STATS_KEYS
    for key in ("route", "constraint_violation", "rho", "polish"):
        assert key in st.extra_stats["info"]
    assert st.extra_stats["gap"] <= 1e-6


def test_not_recognised_says_what_was_expected_and_found():
    x = cp.Variable(5)
    p = cp.Problem(cp.Minimize(cp.sum(cp.exp(x))), [x >= 0])
    with pytest.raises(cvxdp.NotRecognised) as err:
        p.solve(method="cvxdp", solver=cvxdp.ADMM)
    msg = str(err.value)
    assert "expected" in msg and "found" in msg and "exp" in msg
    q = cp.Problem(cp.Minimize(cp.norm1(x - 1)), [cp.sum(x) <= 3, x[0] + 2 * x[1] <= 1])
    with pytest.raises(cvxdp.NotRecognised, match="inequality"):
        q.solve(method="cvxdp", solver=cvxdp.ADMM)
    r = cp.Problem(cp.Maximize(-cp.norm1(x - 1)))
    with pytest.raises(cvxdp.NotRecognised, match="Maximize"):
        r.solve(method="cvxdp", solver=cvxdp.ADMM)


def test_fallback_is_opt_in():
    x = cp.Variable(3)
    p = cp.Problem(cp.Minimize(cp.sum(cp.exp(x)) + cp.norm1(x - 1)))
    p.solve(method="cvxdp", solver=cvxdp.ADMM, fallback=cp.CLARABEL)
    assert p.status == cp.OPTIMAL and p.solver_stats.solver_name == cp.CLARABEL


def test_unknown_option_rejected_by_name():
    p, _ = small_tree_problem()
    with pytest.raises(ValueError, match="max_iter"):
        p.solve(method="cvxdp", solver=cvxdp.ADMM, max_iter=10)   # cvxdp spells it max_iters
    with pytest.raises(ValueError, match="eps_rel"):
        p.solve(method="cvxdp", solver=cvxdp.ADMM, eps_rel=-1)


def test_verify_records_gap_and_keeps_our_solution():
    p, x = small_tree_problem(3)
    p.solve(method="cvxdp", solver=cvxdp.ADMM, verify=cp.CLARABEL, warm_start=False)
    ver = p.solver_stats.extra_stats["verify"]
    assert ver["solver"] == cp.CLARABEL and ver["status"] == cp.OPTIMAL
    assert abs(ver["relative_objective_gap"]) <= 1e-6
    assert "max_abs_diff" in ver
    assert p.solver_stats.solver_name == cvxdp.ADMM
    # the variables hold ADMM's solution again, not the reference's
    assert p.objective.value == pytest.approx(p.solver_stats.extra_stats["objective"], rel=1e-12)


def test_verbose_prints_an_iteration_table(caplog):
    p, _ = small_tree_problem()
    with caplog.at_level(logging.INFO, logger="cvxdp"):
        p.solve(method="cvxdp", solver=cvxdp.ADMM, verbose=True, warm_start=False)
    text = caplog.text
    assert "iter" in text and "rel gap" in text and "status: optimal" in text


def test_limits_give_inaccurate_status_with_residuals():
    p, x = small_tree_problem(1, 64)
    p.solve(method="cvxdp", solver=cvxdp.ADMM, max_iters=3, warm_start=False, polish=False)
    assert p.status == cp.OPTIMAL_INACCURATE
    assert x.value is not None
    assert p.solver_stats.num_iters == 3
    assert np.isfinite(p.solver_stats.extra_stats["primal_residual"])
    p.solve(method="cvxdp", solver=cvxdp.ADMM, time_limit=1e-9, warm_start=False)
    assert p.status == cp.OPTIMAL_INACCURATE


def test_callback_stops_with_user_limit():
    p, x = small_tree_problem(2, 64)
    seen = []

    def cb(info):
        seen.append(info["iter"])
        return info["iter"] >= 10

    p.solve(method="cvxdp", solver=cvxdp.ADMM, callback=cb, warm_start=False)
    assert p.status == cp.USER_LIMIT and x.value is not None
    assert seen[-1] >= 10


def test_warm_start_needs_fewer_iterations():
    p, x = small_tree_problem(4, 64)
    p.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=False, polish=False)
    cold = p.solver_stats.num_iters
    p.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=True, polish=False)
    assert p.solver_stats.num_iters < cold


def test_solver_path():
    p, _ = small_tree_problem()
    p.solve(method="cvxdp", solver_path=[cvxdp.ADMM, cp.CLARABEL])
    assert p.status == cp.OPTIMAL and p.solver_stats.solver_name == cvxdp.ADMM


def test_constraint_duals_have_cvxpy_shapes():
    p, x = small_tree_problem()
    p.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert p.constraints[0].dual_value.shape == (p.constraints[0].size,)
    assert p.constraints[1].dual_value.shape == x.shape
    assert np.all(p.constraints[1].dual_value >= 0)


def test_warm_start_survives_a_change_of_noise_scale():
    """The cached ADMM state must not carry the old rho / multiplier scale into a solve
    whose loss weights changed (a Parameter noise scale)."""
    tree = cvxdp.workloads.hierarchy(n_leaves=256, branching=2)
    counts = np.random.default_rng(0).poisson(5, 256).astype(float)
    x = cp.Variable(tree.n_nodes)
    y = cp.Parameter(tree.n_nodes)
    b = cp.Parameter(pos=True)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y) / b), [cvxdp.consistent(tree, x)])
    for eps, seed in ((1.0, 100), (10.0, 0), (0.1, 3)):
        b.value = tree.sensitivity / eps
        y.value = tree.queries @ counts + np.random.default_rng(seed).laplace(0, b.value, tree.n_nodes)
        prob.solve(method="cvxdp", solver=cvxdp.ADMM, warm_start=True)
        assert prob.status == cp.OPTIMAL
        assert prob.solver_stats.num_iters < 2000
