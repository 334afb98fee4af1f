"""The one contract, checked the same way for every cvxdp method.

Every method: validated options (bad values and unknown names are a ValueError naming the
option), the same shared options and ``extra_stats`` keys, true statuses (``optimal`` only
with a feasible point and a certified gap), the shared warm-start cache, callbacks, limits,
verify, verbose, no mutation of the caller's arrays, and bad data refused before any work.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import scipy.sparse as sp
import cvxpy as cp

import cvxdp
from cvxdp.methods.base import EXTRA_STATS_KEYS
from cvxdp.methods.certify import ROUNDING
from cvxdp.methods.warm_start import CACHE, WarmStartCache


# ----------------------------------------------------------------- one instance per method
def admm_instance(seed: int = 0):
    rng = np.random.default_rng(seed)
    tree = cvxdp.workloads.hierarchy(16, 2)
    y = tree.queries @ rng.poisson(5, 16) + rng.laplace(0, 2, tree.n_nodes)
    x = cp.Variable(tree.n_nodes)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y)), [cvxdp.consistent(tree, x), x >= 0])
    return prob, {"y": y}


def md_instance(seed: int = 0):
    rng = np.random.default_rng(seed)
    dom = cvxdp.Domain({"a": 3, "b": 2, "c": 4})
    data = np.column_stack([rng.integers(0, s, 100) for s in (3, 2, 4)])
    cliques = [("a", "b"), ("b", "c")]
    mus = {c: cp.Variable(dom.shape(c)) for c in cliques}
    ys = {c: dom.count(data, c) + rng.normal(0, 1.0, dom.shape(c)) for c in cliques}
    obj = sum(cp.sum_squares(mus[c] - ys[c]) for c in cliques)
    prob = cp.Problem(cp.Minimize(obj), [cvxdp.MarginalPolytope(mus, dom, total=100.0)])
    return prob, {f"y{i}": y for i, y in enumerate(ys.values())}


def newton_instance(seed: int = 0):
    W = np.tril(np.ones((5, 5)))
    c = np.linspace(1.0, 2.0, 5)
    m = cvxdp.fitness_problem(W, c)
    return m.problem, {"W": W, "c": c}


INSTANCES = {cvxdp.ADMM: admm_instance, cvxdp.MIRROR_DESCENT: md_instance,
             cvxdp.NEWTON_CG: newton_instance}
METHODS = list(INSTANCES)


def assert_status_is_true(prob: cp.Problem, eps_abs: float, eps_rel: float) -> None:
    """``optimal`` only with a feasible point and a certified gap (checked independently)."""
    es = prob.solver_stats.extra_stats
    if prob.status == cp.OPTIMAL:
        assert es["gap"] <= eps_rel
        assert es["primal_residual"] <= eps_abs + ROUNDING * 1e6
        for c in prob.constraints:
            assert float(np.max(np.atleast_1d(c.violation()))) <= eps_abs + 1e-9
        f = prob.objective.value
        assert (f - es["lower_bound"]) / max(1.0, abs(f)) <= eps_rel * (1 + 1e-9)


# ----------------------------------------------------------------- options
BAD_OPTIONS = [
    ("max_iters", 0), ("max_iters", -3), ("max_iters", 2.5), ("max_iters", "10"),
    ("eps_abs", 0.0), ("eps_abs", -1e-6), ("eps_abs", math.nan), ("eps_abs", math.inf),
    ("eps_rel", 0.0), ("eps_rel", math.inf), ("eps_rel", True),
    ("time_limit", 0.0), ("time_limit", -1.0), ("warm_start", "yes"), ("verbose", 1),
    ("callback", 3), ("verify", 3), ("duals", "no"), ("duals", 0),
]
OWN_BAD = {
    cvxdp.ADMM: [("rho", -1.0), ("rho", 0.0), ("rho", math.inf), ("alpha", 2.5), ("alpha", 0.0),
                 ("check_every", 0), ("equality_split", "magic"), ("polish", "no")],
    cvxdp.MIRROR_DESCENT: [("algorithm", "newton"), ("check_every", 0), ("step", 0.0),
                           ("step", -1.0), ("polish_start", -1), ("polish", 1)],
    cvxdp.NEWTON_CG: [("growth", 0.5), ("growth", 1.0), ("growth", math.inf), ("cg_max", 0),
                      ("total_variance_weight", -1.0), ("strategy", [[math.nan]]),
                      ("strategy", np.ones(3))],
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name,value", BAD_OPTIONS)
def test_bad_shared_option_values_name_the_option(method, name, value):
    prob, _ = INSTANCES[method]()
    with pytest.raises(ValueError, match=f"option {name}="):
        prob.solve(method="cvxdp", solver=method, **{name: value})
    assert prob.status is None                   # refused before any work


@pytest.mark.parametrize("method,name,value",
                         [(m, n, v) for m, bad in OWN_BAD.items() for n, v in bad])
def test_bad_method_option_values_name_the_option(method, name, value):
    prob, _ = INSTANCES[method]()
    with pytest.raises(ValueError, match=f"option {name}=.*expected"):
        prob.solve(method="cvxdp", solver=method, **{name: value})


@pytest.mark.parametrize("method", METHODS)
def test_unknown_options_list_the_known_ones(method):
    prob, _ = INSTANCES[method]()
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['rhoo'\]; known options: .*eps_abs"):
        prob.solve(method="cvxdp", solver=method, rhoo=1.0)
    other = {cvxdp.ADMM: "growth", cvxdp.MIRROR_DESCENT: "rho", cvxdp.NEWTON_CG: "algorithm"}[method]
    with pytest.raises(ValueError, match="unknown option"):
        prob.solve(method="cvxdp", solver=method, **{other: 1})


@pytest.mark.parametrize("method", METHODS)
def test_options_describe_every_shared_option(method):
    text = cvxdp.METHODS[method].options.describe()
    for name in cvxdp.dispatch.SHARED_OPTIONS:
        assert text.count(f"\n{name} (") + text.startswith(f"{name} (") == 1


# ----------------------------------------------------------------- results
@pytest.mark.parametrize("method", METHODS)
def test_same_extra_stats_keys_and_true_status(method):
    prob, _ = INSTANCES[method]()
    prob.solve(method="cvxdp", solver=method, eps_rel=1e-7)
    es = prob.solver_stats.extra_stats
    assert tuple(es) == EXTRA_STATS_KEYS
    assert prob.status == cp.OPTIMAL
    assert es["method"] == method == prob.solver_stats.solver_name
    assert es["objective"] == pytest.approx(prob.value, rel=1e-12)
    assert es["iterations"] == prob.solver_stats.num_iters
    assert isinstance(es["history"], list) and isinstance(es["info"], dict)
    assert_status_is_true(prob, 1e-6, 1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_the_answer_matches_clarabel(method):
    prob, _ = INSTANCES[method]()
    ours = prob.solve(method="cvxdp", solver=method, eps_rel=1e-8)
    ref = prob.solve(solver=cp.CLARABEL) if method != cvxdp.NEWTON_CG else \
        prob.solve(solver=cp.CLARABEL, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert ours == pytest.approx(ref, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_iteration_and_time_limits_never_claim_optimal_falsely(method):
    prob, _ = INSTANCES[method]()
    prob.solve(method="cvxdp", solver=method, max_iters=1, polish=False, warm_start=False) \
        if method != cvxdp.NEWTON_CG else \
        prob.solve(method="cvxdp", solver=method, max_iters=1, warm_start=False)
    assert prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)
    assert_status_is_true(prob, 1e-6, cvxdp.METHODS[method].options.options["eps_rel"].default)
    if prob.status == cp.OPTIMAL_INACCURATE:
        assert prob.solver_stats.extra_stats["gap"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_a_time_limit_gives_a_true_status(method):
    prob, _ = INSTANCES[method]()
    prob.solve(method="cvxdp", solver=method, time_limit=1e-9, warm_start=False, eps_rel=1e-12)
    assert prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE)
    assert_status_is_true(prob, 1e-6, 1e-12)
    assert prob.value is not None and np.isfinite(prob.value)


@pytest.mark.parametrize("method", METHODS)
def test_fallback_is_used_only_when_nothing_recognises(method):
    prob, _ = INSTANCES[method]()
    prob.solve(method="cvxdp", solver=method, fallback=cp.CLARABEL)
    assert prob.solver_stats.solver_name == method
    x = cp.Variable(2)
    other = cp.Problem(cp.Minimize(cp.sum(cp.exp(x))), [x >= -1])
    with pytest.raises(cvxdp.NotRecognised):
        other.solve(method="cvxdp", solver=method)
    other.solve(method="cvxdp", solver=method, fallback=cp.CLARABEL)
    assert other.status == cp.OPTIMAL and other.value == pytest.approx(2 * math.exp(-1), rel=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_callback_stops_with_user_limit(method):
    prob, _ = INSTANCES[method]()
    seen = []

    def stop(info):
        seen.append(dict(info))
        return True

    prob.solve(method="cvxdp", solver=method, callback=stop, warm_start=False, eps_rel=1e-12)
    assert seen, "the callback was never called"
    assert prob.status in (cp.USER_LIMIT, cp.OPTIMAL)
    assert_status_is_true(prob, 1e-6, 1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_verify_records_the_reference(method):
    prob, _ = INSTANCES[method]()
    prob.solve(method="cvxdp", solver=method, verify=cp.CLARABEL, eps_rel=1e-8)
    ver = prob.solver_stats.extra_stats["verify"]
    assert ver["solver"] == cp.CLARABEL and ver["status"] == cp.OPTIMAL
    assert abs(ver["relative_objective_gap"]) < 1e-5
    assert prob.solver_stats.solver_name == method          # our solution is kept


@pytest.mark.parametrize("method", METHODS)
def test_verbose_logs_a_table(method, caplog):
    prob, _ = INSTANCES[method]()
    with caplog.at_level(logging.INFO, logger="cvxdp"):
        prob.solve(method="cvxdp", solver=method, verbose=True)
    assert "recognised the problem" in caplog.text and "status optimal" in caplog.text


@pytest.mark.parametrize("method", METHODS)
def test_warm_start_reproduces_the_cold_answer(method):
    prob, _ = INSTANCES[method]()
    cold = prob.solve(method="cvxdp", solver=method, warm_start=False, eps_rel=1e-9)
    cold_x = {v.id: np.array(v.value, copy=True) for v in prob.variables()}
    assert not prob.solver_stats.extra_stats["warm_started"]
    warm = prob.solve(method="cvxdp", solver=method, warm_start=True, eps_rel=1e-9)
    assert prob.solver_stats.extra_stats["warm_started"]
    assert prob.status == cp.OPTIMAL
    assert warm == pytest.approx(cold, rel=1e-8, abs=1e-8)
    if method != cvxdp.ADMM:          # the L1 optimum need not be unique
        for v in prob.variables():
            np.testing.assert_allclose(v.value, cold_x[v.id], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_callers_arrays_are_not_mutated(method):
    prob, arrays = INSTANCES[method]()
    before = {k: np.array(v, copy=True) for k, v in arrays.items()}
    prob.solve(method="cvxdp", solver=method)
    prob.solve(method="cvxdp", solver=method, warm_start=True)
    for k, v in arrays.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_stale_duals_are_not_left_behind():
    prob, _ = admm_instance()
    prob.solve(solver=cp.CLARABEL)
    assert prob.constraints[0].dual_value is not None
    prob.solve(method="cvxdp", solver=cvxdp.ADMM, max_iters=1, polish=False, warm_start=False)
    if not prob.solver_stats.extra_stats["duals_certified"]:
        assert all(c.dual_value is None for c in prob.constraints)


@pytest.mark.parametrize("method", METHODS)
def test_duals_false_writes_none_and_keeps_a_true_status(method):
    prob, _ = INSTANCES[method]()
    with_duals = prob.solve(method="cvxdp", solver=method, eps_rel=1e-6)
    assert prob.solver_stats.extra_stats["duals_certified"]
    assert any(c.dual_value is not None for c in prob.constraints)
    value = prob.solve(method="cvxdp", solver=method, eps_rel=1e-6, duals=False, warm_start=False)
    assert prob.status == cp.OPTIMAL
    assert_status_is_true(prob, 1e-6, 1e-6)
    assert value == pytest.approx(with_duals, rel=2e-6, abs=1e-6)
    assert all(dv.value is None for c in prob.constraints for dv in c.dual_variables)
    assert not prob.solver_stats.extra_stats["duals_certified"]


@pytest.mark.parametrize("how", ["standard", "cost_model"])
def test_duals_false_holds_for_a_standard_solver_too(how):
    prob, _ = admm_instance()
    if how == "standard":
        prob.solve(method="cvxdp", solver=cp.CLARABEL, duals=False)
    else:                             # what solver=None chooses, a standard solver included
        prob.solve(method="cvxdp", duals=False)
    assert prob.status == cp.OPTIMAL
    assert all(dv.value is None for c in prob.constraints for dv in c.dual_variables)
    with pytest.raises(ValueError, match="duals="):
        prob.solve(method="cvxdp", solver=cp.CLARABEL, duals="no")


# ----------------------------------------------------------------- the warm-start cache
def test_cache_is_keyed_by_problem_and_method_and_dropped_on_new_data():
    cache = WarmStartCache()
    p = cp.Parameter(3, value=np.ones(3))
    x = cp.Variable(3)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - p)), [x >= 0])
    other = cp.Problem(cp.Minimize(cp.norm1(x - p)), [x >= 0])
    cache.put(prob, "A", "state-a")
    assert cache.get(prob, "A") == "state-a"
    assert cache.get(prob, "B") is None and cache.get(other, "A") is None
    p.value = np.array([1.0, 2.0, 3.0])
    assert cache.get(prob, "A") is None              # Parameter changed: data changed
    cache.put(prob, "A", "state-b")
    assert cache.get(prob, "A") == "state-b"
    cache.put(prob, "A", None)
    assert cache.get(prob, "A") is None


def test_the_dispatcher_uses_the_shared_cache():
    prob, _ = admm_instance()
    CACHE.clear(prob)
    prob.solve(method="cvxdp", solver=cvxdp.ADMM)
    assert CACHE.get(prob, cvxdp.ADMM) is not None
    del prob                                          # weak keys: nothing keeps it alive


# ----------------------------------------------------------------- bad data, every family
def _admm_with(y=None, hi=None, rhs=None, w=None):
    x = cp.Variable(4)
    y = np.array([1.0, 2.0, 3.0, 4.0]) if y is None else y
    w = np.ones(4) if w is None else w
    cons = [x >= 0]
    if hi is not None:
        cons.append(x <= hi)
    if rhs is not None:
        cons.append(cp.sum(x) == rhs)
    return cp.Problem(cp.Minimize(cp.norm1(cp.multiply(w, x - y))), cons)


BAD_DATA = [
    ("NaN in the data", lambda: _admm_with(y=np.array([1.0, np.nan, 3.0, 4.0])), cvxdp.ADMM,
     r"the objective .* NaN at index \(1,\)"),
    ("inf in the data", lambda: _admm_with(y=np.array([1.0, 2.0, np.inf, 4.0])), cvxdp.ADMM,
     r"\+inf at index \(2,\)"),
    ("NaN upper bound", lambda: _admm_with(hi=np.array([5.0, np.nan, 5.0, 5.0])), cvxdp.ADMM,
     r"constraint 1 .* NaN"),
    ("NaN right-hand side", lambda: _admm_with(rhs=np.nan), cvxdp.ADMM, r"constraint 1 .* NaN"),
    ("inf weight", lambda: _admm_with(w=np.array([1.0, np.inf, 1.0, 1.0])), cvxdp.ADMM,
     r"the objective .* \+inf"),
    ("complex data", lambda: _admm_with(y=np.array([1.0, 2.0j, 3.0, 4.0])), cvxdp.ADMM,
     "complex"),
]


@pytest.mark.parametrize("label,build,method,match", BAD_DATA, ids=[b[0] for b in BAD_DATA])
def test_bad_data_is_refused_with_the_term_and_entry(label, build, method, match):
    prob = build()
    with pytest.raises(ValueError, match=match):
        prob.solve(method="cvxdp", solver=method)
    assert prob.status is None


@pytest.mark.parametrize("method", [cvxdp.ADMM, None])
def test_bad_parameter_values_are_refused(method):
    y = cp.Parameter(4, name="y")
    x = cp.Variable(4)
    prob = cp.Problem(cp.Minimize(cp.norm1(x - y)), [x >= 0])
    with pytest.raises(ValueError, match="Parameter 'y' has no value"):
        prob.solve(method="cvxdp", solver=method)
    y.value = np.array([1.0, 2.0, np.inf, 0.0])        # cvxpy itself refuses NaN values
    with pytest.raises(ValueError, match=r"Parameter 'y' with \+inf at index \(2,\)"):
        prob.solve(method="cvxdp", solver=method)
    y.value = np.array([1.0, 2.0, 3.0, 0.0])
    assert prob.solve(method="cvxdp", solver=method) == pytest.approx(0.0, abs=1e-6)


def test_bad_marginal_measurements_are_refused():
    prob, _ = md_instance()
    dom = cvxdp.Domain({"a": 2, "b": 2})
    mus = {("a", "b"): cp.Variable((2, 2))}
    y = np.array([[1.0, 2.0], [np.inf, 1.0]])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(mus[("a", "b")] - y)),
                      [cvxdp.MarginalPolytope(mus, dom, total=4.0)])
    with pytest.raises(ValueError, match=r"\+inf at index \(1, 0\)"):
        prob.solve(method="cvxdp", solver=cvxdp.MIRROR_DESCENT)


def test_bad_fitness_data_is_refused():
    X = cp.Variable((3, 3), PSD=True)
    L = np.eye(3)
    L[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(np.eye(3), X)),
                          [cvxdp.query_variance(L, X) <= 1.0])
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)
    prob = cp.Problem(cp.Minimize(cvxdp.privacy_cost(np.eye(3), X)),
                      [cvxdp.query_variance(np.eye(3), X) <= np.array([1.0, np.nan, 1.0])])
    with pytest.raises(ValueError, match=r"constraint 0 .* NaN at index \(1,\)"):
        prob.solve(method="cvxdp", solver=cvxdp.NEWTON_CG)


def test_sparse_constants_are_checked_too():
    A = sp.csr_matrix(np.array([[1.0, 0.0], [np.nan, 1.0]]))
    x = cp.Variable(2)
    prob = cp.Problem(cp.Minimize(cp.norm1(A @ x - np.ones(2))), [x >= 0])
    with pytest.raises(ValueError, match=r"NaN at index \(1, 0\)"):
        prob.solve(method="cvxdp", solver=cvxdp.ADMM)


@pytest.mark.parametrize("bad", [np.eye(2) * 1j, np.zeros((0, 3))])
def test_complex_or_empty_measurements_are_refused(bad):
    with pytest.raises(ValueError, match="complex|at least one row"):
        cvxdp.Measurement(bad, np.ones(bad.shape[0]))


def test_a_bound_above_the_objective_is_no_certificate():
    """``optimal`` needs ``-max(eps_rel, UNDERCUT) <= gap <= eps_rel``: a lower bound far above
    a feasible point's objective was spoiled (rounding at extreme scales) and certifies
    nothing; a little above it is a point undercutting the optimum within ``eps_abs``."""
    from cvxdp.methods.certify import PointCheck, decide
    point = PointCheck(objective=4.231561849319234, violation=3.7e-9, excess=0.0, worst="",
                       finite=True)
    status, gap, why = decide("optimal", point, 248.06164952907582, eps_abs=1e-6, eps_rel=1e-6)
    assert status == "optimal_inaccurate" and gap < -57 and "above the objective" in why
    status, gap, _ = decide("optimal", point, 4.231561849319234 + 1e-7, eps_abs=1e-6, eps_rel=1e-6)
    assert status == "optimal" and -1e-6 <= gap < 0
    status, gap, _ = decide("optimal", point, 4.231561849319234 * (1 + 2.5e-8), eps_abs=1e-6,
                            eps_rel=1e-9)
    assert status == "optimal" and gap < -1e-9            # undercut within eps_abs: allowed
    status, _, _ = decide("optimal", point, 4.231561849319234 * 1.004, eps_abs=1e-6, eps_rel=1e-6)
    assert status == "optimal_inaccurate"
    status, _, why = decide("optimal", point, 4.0, eps_abs=1e-6, eps_rel=1e-6)
    assert status == "optimal_inaccurate" and "> eps_rel" in why
    status, _, _ = decide("optimal_inaccurate", point, 248.0, eps_abs=1e-6, eps_rel=1e-6)
    assert status == "optimal_inaccurate"
