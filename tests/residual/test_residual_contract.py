"""The one contract for NEWTON_CG's residual family (tests/test_contract.py checks the other
families the same way): validated options, the shared extra_stats keys, true statuses under
every limit, callbacks, verify, verbose, warm starts, no mutation of the caller's arrays."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import cvxpy as cp

import cvxdp
from cvxdp.methods.base import EXTRA_STATS_KEYS


def instance():
    W = cvxdp.workloads.marginal_workload({"a": 3, "b": 4, "c": 2, "d": 5},
                                          [("a", "b"), ("b", "c"), ("c", "d"), ("a", "d"), ("b",)])
    c = np.array([1.0, 2.0, 0.5, 3.0, 0.1])
    s = cp.Variable(W.n_residuals, pos=True)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)), [cvxdp.query_variance(W, s) <= c])
    return prob, W, c


def assert_true_status(prob, eps_abs=1e-6, eps_rel=1e-6):
    """``optimal`` only with every target met to ``eps_abs`` and the gap, recomputed from the
    reported lower bound, certified to ``eps_rel`` relative to the cost."""
    es = prob.solver_stats.extra_stats
    if prob.status == cp.OPTIMAL:
        assert max(float(np.max(np.atleast_1d(c.violation()))) for c in prob.constraints) <= eps_abs
        f = prob.objective.value
        assert (f - es["lower_bound"]) / abs(f) <= eps_rel * (1 + 1e-9)
        assert es["info"]["rel_gap"] == pytest.approx((f - es["lower_bound"]) / f, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize("name,value", [("max_iters", 0), ("eps_rel", 0.0), ("eps_abs", math.nan),
                                        ("time_limit", -1.0), ("callback", 3), ("cg_max", 0),
                                        ("growth", 1.0)])
def test_bad_options_name_the_option(name, value):
    prob, _, _ = instance()
    with pytest.raises(ValueError, match=name):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, **{name: value})
    with pytest.raises(ValueError, match="unknown option"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, rhoo=1)


def test_extra_stats_keys_and_a_true_optimal():
    prob, W, c = instance()
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    es = prob.solver_stats.extra_stats
    assert tuple(es) == EXTRA_STATS_KEYS
    assert es["method"] == cvxdp.NEWTON_CG and es["duals_certified"]
    assert prob.status == cp.OPTIMAL
    assert_true_status(prob)


@pytest.mark.parametrize("limit", [dict(max_iters=1), dict(time_limit=1e-9)])
def test_limits_give_a_true_status(limit):
    prob, _, _ = instance()
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, warm_start=False, eps_rel=1e-14, **limit)
    assert prob.status == cp.OPTIMAL_INACCURATE
    if "max_iters" in limit:
        assert prob.solver_stats.num_iters == 1
    es = prob.solver_stats.extra_stats
    assert es["lower_bound"] <= prob.value and np.isfinite(es["lower_bound"])
    assert max(float(np.max(np.atleast_1d(c.violation()))) for c in prob.constraints) <= 1e-9


def test_callback_stops_with_user_limit_and_sees_the_rows():
    prob, _, _ = instance()
    seen = []

    def stop(info):
        seen.append(dict(info))
        return len(seen) >= 2
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, callback=stop, eps_rel=1e-14,
               warm_start=False)
    assert prob.status == cp.USER_LIMIT and len(seen) == 2
    assert {"iter", "objective", "lower bnd", "rel gap"} <= set(seen[0])


def test_verify_verbose_and_warm_start(caplog):
    prob, _, _ = instance()
    with caplog.at_level(logging.INFO, logger="cvxdp"):
        cold = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, verify=cp.CLARABEL, verbose=True,
                          eps_rel=1e-9, warm_start=False)
    assert "residual design" in caplog.text
    v = prob.solver_stats.extra_stats["verify"]
    assert v["status"] == cp.OPTIMAL and abs(v["relative_objective_gap"]) <= 1e-6
    assert not prob.solver_stats.extra_stats["warm_started"]
    warm = prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG, eps_rel=1e-9)
    assert prob.solver_stats.extra_stats["warm_started"]
    assert warm == pytest.approx(cold, rel=1e-8)


def test_the_callers_arrays_are_not_touched_and_bad_data_is_refused():
    prob, W, c = instance()
    before_c, before_V = c.copy(), W.basis.V.copy()
    prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    np.testing.assert_array_equal(c, before_c)
    assert (W.basis.V != before_V).nnz == 0
    s = prob.variables()[0]
    for bad in (np.inf, np.nan):
        cc = c.copy()
        cc[1] = bad
        with pytest.raises(ValueError):
            cp.Problem(cp.Minimize(cvxdp.privacy_cost(W, s)),
                       [cvxdp.query_variance(W, s) <= cc]).solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
